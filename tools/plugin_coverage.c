/* tools/plugin_coverage.c: `tessera plugin-check --coverage PLUGIN`: every (op, output dtype)
 * a built-in model needs for training (SGD and Adam, fused and composed updates) and for
 * evaluation that the plugin does not claim, listed at once instead of one failed run per
 * missing op. The needs are recorded, not tabulated: each model runs two training steps and
 * an evaluation pass on a small synthetic batch on a device that runs every op (the plugin
 * itself when it has host memory, else cpu_blas or cpu_onednn), with the kernel profile on. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define MAX_NEEDS 256

typedef struct need {
    int32_t op, fn, dtype;
    unsigned models;   /* bit i: models[i] needs it */
    int training, eval;
    int optional;      /* a fused op the core composes when the plugin does not claim it */
} need;

static const char *const models[] = {"mlp", "lenet5", "cnn"};

typedef struct needs {
    need v[MAX_NEEDS];
    int n;
} needs;

/* Adds the profile's entries (fills aside: raw bytes, the plugin's fill slot) to ns. */
static void collect(needs *ns, int model, int eval)
{
    ts_profile_entry e[MAX_NEEDS];
    size_t n = ts_profile_read(e, MAX_NEEDS);
    if (n > MAX_NEEDS)
        n = MAX_NEEDS;
    for (size_t i = 0; i < n; i++) {
        if (e[i].dtype < 0)
            continue;
        int j = 0;
        while (j < ns->n && !(ns->v[j].op == e[i].op && ns->v[j].fn == e[i].fn &&
                              ns->v[j].dtype == e[i].dtype))
            j++;
        if (j == ns->n) {
            if (ns->n == MAX_NEEDS)
                continue;
            ns->v[ns->n++] = (need){e[i].op, e[i].fn, e[i].dtype, 0, 0, 0,
                                    e[i].op == TS_OP_RELU_BACKWARD ||
                                        e[i].op == TS_OP_SGD_STEP ||
                                        e[i].op == TS_OP_ADAM_STEP};
        }
        ns->v[j].models |= 1u << model;
        if (eval)
            ns->v[j].eval = 1;
        else
            ns->v[j].training = 1;
    }
    ts_profile_reset();
}

/* Two training steps of model on dev with the optimizer (adam or sgd), fused updates or not;
 * then an evaluation pass (forward without the graph, accuracy and loss read back). */
static ts_status run_model(ts_device *dev, const char *name, int model, int adam, int fused,
                           needs *ns)
{
    cli_fixed f;
    ts_status s = cli_fixed_setup(name, adam ? "adam" : "sgd", adam ? 1e-3 : 0.01, dev, 11, 8,
                                  &f);
    if (s)
        return s;
    ts_optim_use_fused(f.opt, fused);
    ts_profile_reset();
    ts_profile_enable(1);
    for (int i = 0; i < 2 && !s; i++) {
        ts_tensor *logits = NULL, *loss = NULL;
        if (!(s = ts_module_forward(f.model, f.x, &logits)) &&
            !(s = ts_cross_entropy(logits, f.y, TS_REDUCTION_MEAN, &loss)) &&
            !(s = ts_backward(loss, NULL, 0)) && !(s = ts_optim_step(f.opt)))
            ts_optim_zero_grad(f.opt);
        ts_tensor_unref(logits);
        ts_tensor_unref(loss);
    }
    if (!s)
        collect(ns, model, 0);
    if (!s) {
        ts_tensor *logits = NULL, *loss = NULL, *d = NULL;
        int64_t correct = 0;
        double lv;
        ts_no_grad_enter();
        if (!(s = ts_module_forward(f.model, f.x, &logits)) &&
            !(s = ts_cross_entropy(logits, f.y, TS_REDUCTION_MEAN, &loss)) &&
            !(s = cli_count_correct(logits, f.y, &correct)) && !(s = ts_cast(loss, TS_F64, &d)))
            s = ts_tensor_to_host(d, &lv, sizeof lv);
        ts_no_grad_exit();
        ts_tensor_unref(logits);
        ts_tensor_unref(loss);
        ts_tensor_unref(d);
        if (!s)
            collect(ns, model, 1);
    }
    ts_profile_enable(0);
    ts_profile_reset();
    cli_fixed_free(&f);
    return s;
}

static void describe(const need *e, char *buf, size_t len)
{
    const char *fn = ts_fn_name(e->op, e->fn);
    snprintf(buf, len, "%s%s%s -> %s", ts_op_name(e->op), fn ? " " : "", fn ? fn : "",
             ts_dtype_name(e->dtype));
}

static const char *where(const need *e, char *buf, size_t len)
{
    size_t n = (size_t)snprintf(buf, len, "%s%s%s;", e->training ? "training" : "",
                                e->training && e->eval ? " and " : "",
                                e->eval ? "evaluation" : "");
    for (int i = 0; i < 3 && n < len; i++)
        if (e->models & (1u << i))
            n += (size_t)snprintf(buf + n, len - n, " %s", models[i]);
    return buf;
}

int cli_plugin_coverage(ts_device *target)
{
    const int host = (ts_device_desc(target)->flags & TS_PLUGIN_HOST_MEMORY) != 0;
    ts_device *rec = host ? target : NULL;
    static const char *const recorders[] = {"cpu_blas", "cpu_onednn"};
    for (size_t i = 0; !rec && i < sizeof recorders / sizeof recorders[0]; i++)
        if (ts_device_get(recorders[i], &rec) != TS_OK)
            rec = NULL;
    if (!rec) {
        fprintf(stderr, "tessera: error: plugin-check --coverage runs the models on a device "
                "that runs every op: %s has no host memory and neither cpu_blas nor cpu_onednn "
                "loads here (%s)\n", ts_device_name(target), ts_last_error());
        return 2;
    }
    needs *ns = calloc(1, sizeof *ns);
    if (!ns)
        return cli_fail(TS_ENOMEM, "plugin-check --coverage");
    for (int m = 0; m < 3; m++)
        for (int adam = 0; adam < 2; adam++)
            for (int fused = 0; fused < 2; fused++) {
                ts_status s = run_model(rec, models[m], m, adam, fused, ns);
                if (s) {
                    free(ns);
                    return cli_fail(s, "plugin-check --coverage: running the models");
                }
            }
    /* The composed ReLU gradient is not recorded when the recorder claims the fused one:
     * what it is composed of (plugin.h, TS_OP_RELU_BACKWARD) is needed too when the target
     * does not claim the fused op. */
    if (!ts_device_supports(target, TS_OP_RELU_BACKWARD, TS_F32)) {
        static const int32_t comp[][3] = {{TS_OP_BINARY_SCALAR, TS_BINARY_GT, TS_U8},
                                          {TS_OP_CAST, -1, TS_F32},
                                          {TS_OP_BINARY, TS_BINARY_MUL, TS_F32}};
        for (size_t k = 0; k < 3 && ns->n < MAX_NEEDS; k++) {
            int seen = 0;
            for (int i = 0; i < ns->n; i++)
                seen |= ns->v[i].op == comp[k][0] && ns->v[i].fn == comp[k][1] &&
                        ns->v[i].dtype == comp[k][2];
            if (!seen)
                ns->v[ns->n++] = (need){comp[k][0], comp[k][1], comp[k][2], 7, 1, 0, 0};
        }
    }
    printf("coverage of %s for the built-in models (mlp, lenet5, cnn; training with SGD and "
           "Adam, and evaluation), recorded on %s:\n", ts_device_name(target),
           ts_device_name(rec));
    int missing = 0, claimed = 0, optional = 0;
    char what[128], at[128];
    for (int i = 0; i < ns->n; i++) {
        const need *e = &ns->v[i];
        describe(e, what, sizeof what);
        if (ts_device_supports(target, e->op, e->dtype)) {
            claimed++;
            continue;
        }
        if (e->optional) {
            optional++;
            printf("  optional  %-40s not claimed: the core composes it from plain ops (%s)\n",
                   what, where(e, at, sizeof at));
            continue;
        }
        missing++;
        printf("  MISSING   %-40s %s\n", what, where(e, at, sizeof at));
    }
    printf("plugin-check --coverage %s: %d (op, function, dtype) used, %d claimed, %d missing, "
           "%d optional not claimed%s\n", ts_device_name(target), ns->n, claimed, missing,
           optional,
           missing && host ? "; the plugin has host memory: tessera's reference kernels run "
                             "the missing ones (single-threaded)"
                           : "");
    free(ns);
    return missing && !host ? 1 : 0;
}
