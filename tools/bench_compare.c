/* tools/bench_compare.c: `tessera bench compare`: the same work on several backends in one
 * run (default cpu_blas and cpu_onednn): conv2d forward + backward at LeNet-5's shapes and at
 * a larger one, matmul, a whole LeNet-5 training step, elementwise functions and softmax, with
 * the winner of each. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"

static const char usage[] =
    "usage: tessera bench compare [--devices A,B,...] [--reps N] [--only TEXT] [--cpu-time]\n"
    "                            [--json]\n"
    "\n"
    "Times on each device (default cpu_blas,cpu_onednn), median of --reps runs (default 5):\n"
    "  conv2d forward+backward: LeNet-5 conv1 (64x1x28x28, 6 5x5 pad 2), conv2 (64x6x14x14,\n"
    "  16 5x5) and a larger layer (64x64x56x56, 64 3x3 pad 1); matmul 512x512x512; one\n"
    "  LeNet-5 training step at batch 64 (forward, cross-entropy, backward, Adam); unary\n"
    "  functions (exp at several sizes, tanh, sigmoid, sqrt, log, relu at 1M elements) and\n"
    "  softmax / log_softmax along the rows (64x10 to 1M elements, several row lengths).\n"
    "  --only TEXT  run only the works whose name contains TEXT (e.g. --only exp)\n"
    "  --cpu-time   time the process's CPU time (all threads) instead of wall time: steadier\n"
    "               on a busy machine when the devices run one thread each (threads = 1)\n";

/* CLOCK_MONOTONIC, or with --cpu-time the process's CPU time (all threads), which a loaded
 * machine inflates far less than wall time when the plugins run one thread each. */
static clockid_t bench_clock = CLOCK_MONOTONIC;

typedef struct work {
    const char *name;
    int kind; /* 0 conv, 1 matmul, 2 lenet5 step, 3 unary fn r on n elements, 4 softmax
               * (r = 0) or log_softmax (r = 1) of (n, c) along dim 1 */
    int64_t n, c, h, w, k, r;
    int pad;
} work;

static const work works[] = {
    {"conv2d fwd+bwd lenet5 conv1", 0, 64, 1, 28, 28, 6, 5, 2},
    {"conv2d fwd+bwd lenet5 conv2", 0, 64, 6, 14, 14, 16, 5, 0},
    {"conv2d fwd+bwd 64x64x56x56 3x3", 0, 64, 64, 56, 56, 64, 3, 1},
    {"matmul 512", 1, 512, 0, 0, 0, 0, 0, 0},
    {"lenet5 training step, batch 64", 2, 64, 0, 0, 0, 0, 0, 0},
    {"exp 1024", 3, 1024, 0, 0, 0, 0, TS_UNARY_EXP, 0},
    {"exp 4096", 3, 4096, 0, 0, 0, 0, TS_UNARY_EXP, 0},
    {"exp 65536", 3, 65536, 0, 0, 0, 0, TS_UNARY_EXP, 0},
    {"exp 1M", 3, 1 << 20, 0, 0, 0, 0, TS_UNARY_EXP, 0},
    {"tanh 1M", 3, 1 << 20, 0, 0, 0, 0, TS_UNARY_TANH, 0},
    {"sigmoid 1M", 3, 1 << 20, 0, 0, 0, 0, TS_UNARY_SIGMOID, 0},
    {"sqrt 1M", 3, 1 << 20, 0, 0, 0, 0, TS_UNARY_SQRT, 0},
    {"log 1M", 3, 1 << 20, 0, 0, 0, 0, TS_UNARY_LOG, 0},
    {"relu 1M", 3, 1 << 20, 0, 0, 0, 0, TS_UNARY_RELU, 0},
    {"softmax 64x10", 4, 64, 10, 0, 0, 0, 0, 0},
    {"softmax 256x1000", 4, 256, 1000, 0, 0, 0, 0, 0},
    {"log_softmax 256x1000", 4, 256, 1000, 0, 0, 0, 1, 0},
    {"softmax 16x65536", 4, 16, 65536, 0, 0, 0, 0, 0},
    {"softmax 256x1024", 4, 256, 1024, 0, 0, 0, 0, 0},
    {"softmax 1024x1000", 4, 1024, 1000, 0, 0, 0, 0, 0},
    {"softmax 256x4000", 4, 256, 4000, 0, 0, 0, 0, 0},
    {"softmax 65536x16", 4, 65536, 16, 0, 0, 0, 0, 0},
};
#define NWORK (sizeof works / sizeof works[0])

/* One run of w on dev; *secs gets its time. */
static ts_status run_once(const work *w, ts_device *dev, ts_rng *rng, void **state, double *secs)
{
    ts_status s = TS_OK;
    if (w->kind == 0) {
        ts_tensor *x = NULL, *wt = NULL, *y = NULL, *l = NULL;
        ts_conv2d_params p = {1, 1, w->pad, w->pad, 1, 1, 1};
        if ((s = ts_tensor_randn(dev, TS_F32, 4, (const int64_t[]){w->n, w->c, w->h, w->w}, 0, 1,
                                 rng, &x)) ||
            (s = ts_tensor_randn(dev, TS_F32, 4, (const int64_t[]){w->k, w->c, w->r, w->r}, 0,
                                 0.1, rng, &wt)))
            goto conv_out;
        ts_tensor_set_requires_grad(x, 1);
        ts_tensor_set_requires_grad(wt, 1);
        double t = cli_seconds(bench_clock);
        if ((s = ts_conv2d(x, wt, NULL, &p, &y)) == TS_OK &&
            (s = ts_sum(y, 0, NULL, 0, &l)) == TS_OK && (s = ts_backward(l, NULL, 0)) == TS_OK)
            s = ts_device_synchronize(dev);
        *secs = cli_seconds(bench_clock) - t;
    conv_out:
        ts_tensor_unref(x), ts_tensor_unref(wt), ts_tensor_unref(y), ts_tensor_unref(l);
        return s;
    }
    if (w->kind == 1) {
        ts_tensor *a = NULL, *b = NULL, *c = NULL;
        const int64_t sh[2] = {w->n, w->n};
        if ((s = ts_tensor_randn(dev, TS_F32, 2, sh, 0, 1, rng, &a)) == TS_OK &&
            (s = ts_tensor_randn(dev, TS_F32, 2, sh, 0, 1, rng, &b)) == TS_OK &&
            (s = ts_tensor_empty(dev, TS_F32, 2, sh, &c)) == TS_OK) {
            double t = cli_seconds(bench_clock);
            s = ts_matmul_out(a, b, c);
            if (s == TS_OK)
                s = ts_device_synchronize(dev);
            *secs = cli_seconds(bench_clock) - t;
        }
        ts_tensor_unref(a), ts_tensor_unref(b), ts_tensor_unref(c);
        return s;
    }
    if (w->kind == 3 || w->kind == 4) {
        ts_tensor *x = NULL, *y = NULL;
        int nd = w->kind == 3 ? 1 : 2;
        const int64_t sh[2] = {w->n, w->c};
        /* sqrt and log get positive inputs */
        double lo = w->kind == 3 && (w->r == TS_UNARY_SQRT || w->r == TS_UNARY_LOG) ? 0.5 : -4;
        if ((s = ts_tensor_rand(dev, TS_F32, nd, sh, lo, 4, rng, &x)) == TS_OK &&
            (w->kind == 4 || (s = ts_tensor_empty(dev, TS_F32, nd, sh, &y)) == TS_OK)) {
            double t = cli_seconds(bench_clock);
            if (w->kind == 3)
                s = ts_unary_out((int)w->r, x, y);
            else
                s = w->r ? ts_log_softmax(x, 1, &y) : ts_softmax(x, 1, &y);
            if (s == TS_OK)
                s = ts_device_synchronize(dev);
            *secs = cli_seconds(bench_clock) - t;
        }
        ts_tensor_unref(x), ts_tensor_unref(y);
        return s;
    }
    /* A LeNet-5 step; the model and optimizer live in *state across runs. */
    struct step_state {
        ts_module *m;
        ts_optim *o;
        ts_named_tensor p[16];
        ts_tensor *x, *y;
    } *st = *state;
    if (!st) {
        st = calloc(1, sizeof *st);
        if (!st)
            return TS_ENOMEM;
        *state = st;
        ts_adam_options ao = {1e-3, 0.9, 0.999, 1e-8, 0};
        int64_t labels[64];
        for (int i = 0; i < 64; i++)
            labels[i] = i % 10;
        size_t np;
        if ((s = cli_build_model("lenet5", dev, rng, &st->m)) ||
            (np = ts_module_parameters(st->m, st->p, 16), 0) ||
            (s = ts_optim_adam(st->p, np, &ao, &st->o)) ||
            (s = ts_tensor_rand(dev, TS_F32, 4, (const int64_t[]){64, 1, 28, 28}, 0, 1, rng,
                                &st->x)) ||
            (s = ts_tensor_from_host(dev, TS_I64, 1, (const int64_t[]){64}, labels, &st->y)))
            return s;
    }
    ts_tensor *logits = NULL, *loss = NULL;
    double t = cli_seconds(bench_clock);
    if ((s = ts_module_forward(st->m, st->x, &logits)) == TS_OK &&
        (s = ts_cross_entropy(logits, st->y, TS_REDUCTION_MEAN, &loss)) == TS_OK &&
        (s = ts_backward(loss, NULL, 0)) == TS_OK && (s = ts_optim_step(st->o)) == TS_OK)
        s = ts_device_synchronize(dev);
    ts_optim_zero_grad(st->o);
    *secs = cli_seconds(bench_clock) - t;
    ts_tensor_unref(logits), ts_tensor_unref(loss);
    return s;
}

static void free_state(void *state)
{
    struct {
        ts_module *m;
        ts_optim *o;
        ts_named_tensor p[16];
        ts_tensor *x, *y;
    } *st = state;
    if (!st)
        return;
    ts_optim_free(st->o);
    ts_module_free(st->m);
    ts_tensor_unref(st->x);
    ts_tensor_unref(st->y);
    free(st);
}

int cli_bench_compare(int argc, char **argv, const cli_common *common)
{
    int json = common->json, reps = 5;
    char devlist[256] = "cpu_blas,cpu_onednn";
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            json = 1;
        else if (!strcmp(argv[i], "--devices") && i + 1 < argc)
            snprintf(devlist, sizeof devlist, "%s", argv[++i]);
        else if (!strcmp(argv[i], "--cpu-time"))
            bench_clock = CLOCK_PROCESS_CPUTIME_ID;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc)
            only = argv[++i];
        else if (!strcmp(argv[i], "--reps")) {
            int64_t n;
            if (cli_parse_i64("bench compare", "--reps", i + 1 < argc ? argv[i + 1] : NULL, 1,
                              1000000, &n))
                return 2;
            reps = (int)n, i++;
        }
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help"))
            return fputs(usage, stdout), 0;
        else
            return cli_usage_error("bench compare", "unexpected argument '%s'", argv[i]);
    }
    ts_status s = ts_init(common->config);
    if (s)
        return cli_fail(s, "cannot start tessera");
    ts_device *devs[8];
    const char *names[8];
    int nd = 0, rc = 0;
    for (char *tok = strtok(devlist, ","); tok && nd < 8; tok = strtok(NULL, ",")) {
        if ((s = ts_device_get(tok, &devs[nd]))) {
            rc = cli_fail(s, "bench compare");
            goto out;
        }
        names[nd++] = tok;
    }
    double ms[NWORK][8];
    int run[NWORK], nrun = 0;
    for (size_t k = 0; k < NWORK; k++)
        nrun += run[k] = !only || strstr(works[k].name, only) != NULL;
    if (nrun == 0) {
        rc = cli_usage_error("bench compare", "no work matches --only '%s'", only);
        goto out;
    }
    for (size_t k = 0; k < NWORK && s == TS_OK; k++)
        for (int d = 0; d < nd && s == TS_OK && run[k]; d++) {
            ts_rng rng;
            ts_rng_init(&rng, 1);
            void *state = NULL;
            double t[64], warm;
            if ((s = run_once(&works[k], devs[d], &rng, &state, &warm)) == TS_OK)
                for (int r = 0; r < reps && r < 64 && s == TS_OK; r++)
                    s = run_once(&works[k], devs[d], &rng, &state, &t[r]);
            free_state(state);
            if (s)
                break;
            int n = reps < 64 ? reps : 64;
            qsort(t, (size_t)n, sizeof *t, cli_cmp_double);
            ms[k][d] = t[n / 2] * 1e3;
        }
    if (s) {
        rc = cli_fail(s, "bench compare");
        goto out;
    }
    if (json) {
        printf("{\"reps\": %d, \"clock\": \"%s\", \"results\": [", reps,
               bench_clock == CLOCK_MONOTONIC ? "wall" : "cpu");
        for (size_t k = 0, first = 1; k < NWORK; k++) {
            if (!run[k])
                continue;
            printf("%s\n  {\"name\": \"%s\"", first ? "" : ",", works[k].name);
            first = 0;
            for (int d = 0; d < nd; d++)
                printf(", \"%s_ms\": %.3f", names[d], ms[k][d]);
            printf("}");
        }
        printf("\n]}\n");
    } else {
        printf("tessera bench compare (median of %d, %s milliseconds)\n  %-34s", reps,
               bench_clock == CLOCK_MONOTONIC ? "wall" : "CPU", "work");
        for (int d = 0; d < nd; d++)
            printf(" %12s", names[d]);
        printf("  fastest\n");
        for (size_t k = 0; k < NWORK; k++) {
            int best = 0;
            if (!run[k])
                continue;
            printf("  %-34s", works[k].name);
            for (int d = 0; d < nd; d++) {
                printf(" %12.2f", ms[k][d]);
                if (ms[k][d] < ms[k][best])
                    best = d;
            }
            printf("  %s\n", names[best]);
        }
    }
out:
    ts_shutdown();
    return rc;
}
