/* tools/cli_checkpoint.c: restoring a model from a checkpoint, the one way train --resume,
 * eval and generate all do it: every parameter and buffer the model has must be there with
 * its shape and dtype, nothing else but optimizer state may be (a tensor no parameter takes
 * means the checkpoint holds another model than its metadata says), and every restored
 * floating-point value must be finite. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tessera/models.h>

#include "cli.h"

static int cmp_name(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The first element of t (float32 or float64, contiguous) that is not finite, or -1. */
static int64_t first_non_finite(ts_tensor *t, void *buf, size_t cap, ts_status *s)
{
    int32_t dt = ts_tensor_dtype(t);
    size_t es = dt == TS_F32 ? sizeof(float) : dt == TS_F64 ? sizeof(double) : 0;
    if (!es)
        return -1;
    size_t n = (size_t)ts_tensor_numel(t);
    if (n * es > cap) {
        *s = TS_ENOMEM;
        return -1;
    }
    if ((*s = ts_tensor_to_host(t, buf, n * es)))
        return -1;
    for (size_t i = 0; i < n; i++)
        if (es == sizeof(float) ? !isfinite(((float *)buf)[i]) : !isfinite(((double *)buf)[i]))
            return (int64_t)i;
    return -1;
}

int cli_restore_model(const ts_checkpoint *ck, const char *path, const ts_named_tensor *params,
                      size_t np, const ts_named_tensor *buffers, size_t nb)
{
    size_t n = np + nb, big = 0;
    const char **names = malloc((n + 1) * sizeof *names);
    if (!names)
        return cli_fail(TS_ENOMEM, "--resume");
    for (size_t i = 0; i < n; i++) {
        ts_tensor *t = i < np ? params[i].tensor : buffers[i - np].tensor;
        names[i] = i < np ? params[i].name : buffers[i - np].name;
        size_t bytes = (size_t)ts_tensor_numel(t) * sizeof(double);
        big = bytes > big ? bytes : big;
    }
    size_t nck = ts_checkpoint_count(ck);
    const char **have = malloc((nck + 1) * sizeof *have);
    if (!have) {
        free(names);
        return cli_fail(TS_ENOMEM, "--resume");
    }
    for (size_t i = 0; i < nck; i++)
        have[i] = ts_checkpoint_name(ck, i);
    qsort(names, n, sizeof *names, cmp_name);
    qsort(have, nck, sizeof *have, cmp_name);
    int rc = 0;
    char shown[400];
    /* Every tensor of the model... */
    for (size_t i = 0; i < n && !rc; i++)
        if (!bsearch(&names[i], have, nck, sizeof *have, cmp_name)) {
            fprintf(stderr, "tessera: error: %s: the checkpoint has no tensor '%s', which this "
                            "model needs: it holds another model than its metadata says "
                            "(edited or damaged)\n", path, names[i]);
            rc = 1;
        }
    /* ...and nothing but the model's tensors and the optimizer's state ("optim." names). */
    for (size_t i = 0; i < nck && !rc; i++)
        if (strncmp(have[i], "optim.", 6) &&
            !bsearch(&have[i], names, n, sizeof *names, cmp_name)) {
            fprintf(stderr, "tessera: error: %s: the checkpoint holds a tensor '%s' that this "
                            "model has no parameter for: it holds another model than its "
                            "metadata says (edited or damaged)\n",
                    path, cli_printable(have[i], 120, shown, sizeof shown));
            rc = 1;
        }
    free(names);
    free(have);
    if (rc)
        return rc;
    void *buf = malloc(big ? big : 1);
    if (!buf)
        return cli_fail(TS_ENOMEM, "--resume");
    for (size_t i = 0; i < n && !rc; i++) {
        const ts_named_tensor *p = i < np ? &params[i] : &buffers[i - np];
        ts_status s = ts_checkpoint_restore(ck, p->name, p->tensor);
        if (s) {
            rc = cli_fail(s, "--resume");
            break;
        }
        int64_t at = first_non_finite(p->tensor, buf, big, &s);
        if (s) {
            rc = cli_fail(s, "--resume");
        } else if (at >= 0) {
            fprintf(stderr, "tessera: error: %s: '%s' holds a value that is not finite (NaN or "
                            "infinite) at element %lld: the checkpoint is damaged, or the run "
                            "that wrote it diverged; resume from an earlier checkpoint\n",
                    path, p->name, (long long)at);
            rc = 1;
        }
    }
    free(buf);
    return rc;
}

int cli_model_matches_tensors(const ts_checkpoint *ck, const char *path,
                              const ts_model_config *cfg)
{
    double stored = 0;
    for (size_t i = 0; i < ts_checkpoint_count(ck); i++) {
        const char *name = ts_checkpoint_name(ck, i);
        int32_t dtype;
        int ndim;
        int64_t shape[TS_MAX_DIMS];
        if (!strncmp(name, "optim.", 6) ||
            ts_checkpoint_tensor_info(ck, name, &dtype, &ndim, shape) != TS_OK)
            continue;
        double n = 1;
        for (int d = 0; d < ndim; d++)
            n *= (double)shape[d];
        stored += n;
    }
    double want = ts_model_params(cfg);
    if (want == stored)
        return 0;
    char arch[512];
    fprintf(stderr, "tessera: error: %s: its model configuration ('%s') has %.0f parameters, "
                    "but the checkpoint holds %.0f: it was edited or is damaged (nothing was "
                    "built)\n", path, ts_model_describe(cfg, arch, sizeof arch), want, stored);
    return 1;
}

/* ---- the GPT's checkpoints ---------------------------------------------------------- */

const char *cli_gpt_describe(const ts_gpt_config *g, char *buf, size_t len)
{
    ts_model_config c;
    ts_model_defaults("gpt", &c);
    c.gpt = *g;
    return ts_model_describe(&c, buf, len);
}

int cli_gpt_open(const char *path, ts_device *dev, ts_checkpoint **out, ts_gpt_config *cfg)
{
    *out = NULL;
    ts_checkpoint *ck;
    ts_status s = ts_checkpoint_load(path, dev, &ck);
    if (s)
        return cli_fail(s, "--resume");
    ts_model_config mc;
    const char *format = ts_checkpoint_meta(ck, "train.format");
    char b[400];
    cli_printable(format ? format : "(none)", 60, b, sizeof b);
    if ((s = ts_model_load_config(ck, &mc)) != TS_OK)
        fprintf(stderr, "tessera: error: %s: %s\n", path, ts_last_error());
    else if (strcmp(mc.name, "gpt") != 0)
        fprintf(stderr, "tessera: error: %s holds a '%s' model, not a GPT (metadata "
                        "model.name)\n", path, mc.name);
    else if (!format || strcmp(format, CLI_GPT_FORMAT) != 0)
        fprintf(stderr, "tessera: error: %s: metadata 'train.format' = '%s': this tessera reads "
                        "GPT checkpoints of format '%s' only (a newer tessera wrote it, or it "
                        "is damaged)\n", path, b, CLI_GPT_FORMAT);
    else if (cli_model_matches_tensors(ck, path, &mc))
        ; /* said why */
    else {
        *cfg = mc.gpt;
        *out = ck;
        return 0;
    }
    ts_checkpoint_free(ck);
    return 1;
}

int cli_gpt_too_big(const ts_gpt_config *c, int64_t batch, int training, ts_device *dev)
{
    ts_memory_stats st = {.struct_size = sizeof st};
    double need = ts_gpt_bytes(c, batch, training);
    if (ts_device_memory_stats(dev, &st) != TS_OK || !st.reserve_limit ||
        need <= (double)st.reserve_limit)
        return 0;
    char arch[256];
    fprintf(stderr, "tessera: error: the model '%s'%s needs at least %.3g GiB (%.3g million "
                    "parameters%s), more than the %.3g GiB the pool of %s may reserve; choose a "
                    "smaller model%s, or raise memory_fraction in [plugin.%s]\n",
            cli_gpt_describe(c, arch, sizeof arch), training ? " at this --batch-size" : "",
            need / 1073741824.0, ts_gpt_params(c) / 1e6,
            training ? ", their gradients, AdamW's moments and the activations" : "",
            (double)st.reserve_limit / 1073741824.0, ts_device_name(dev),
            training ? " or batch" : "", ts_device_name(dev));
    return 1;
}

void cli_meta_set_u64(ts_checkpoint *ck, const char *key, uint64_t v)
{
    char b[32];
    snprintf(b, sizeof b, "%llu", (unsigned long long)v);
    ts_checkpoint_set_meta(ck, key, b);
}

void cli_save_loss_scale(ts_checkpoint *ck, const ts_trainer *tr, const char *precision)
{
    if (!tr || strcmp(precision, "fp16")) /* only a float16 trainer's scale means anything */
        return;
    double scale;
    int64_t clean;
    ts_trainer_loss_scale(tr, &scale, &clean);
    char b[40];
    snprintf(b, sizeof b, "%.17g", scale); /* a power of two: exact */
    ts_checkpoint_set_meta(ck, "train.loss_scale", b);
    cli_meta_set_u64(ck, "train.loss_scale_clean", (uint64_t)clean);
}

int cli_read_loss_scale(const ts_checkpoint *ck, const char *path, cli_loss_scale *ls)
{
    *ls = (cli_loss_scale){1, 0, 0};
    const char *t = ts_checkpoint_meta(ck, "train.loss_scale");
    if (!t) /* an older tessera's, or none written */
        return 0;
    if (cli_strict_double(t, 0, 1, 1e30, &ls->scale)) {
        char shown[200];
        fprintf(stderr, "tessera: error: %s: metadata 'train.loss_scale' = '%s' is not a loss "
                        "scale in (0, 1e30]; the checkpoint is damaged or was edited\n", path,
                cli_printable(t, 60, shown, sizeof shown));
        return 1;
    }
    if (cli_meta_u64(ck, path, "train.loss_scale_clean", (uint64_t)1 << 53, &ls->clean))
        return 1; /* it said why */
    ls->have = 1;
    return 0;
}

int cli_apply_loss_scale(const cli_loss_scale *ls, ts_trainer *tr, const char *precision)
{
    if (!ls->have || strcmp(precision, "fp16")) /* another precision: its own scale, 1 */
        return 0;
    ts_status s = ts_trainer_set_loss_scale(tr, ls->scale, (int64_t)ls->clean);
    return s ? cli_fail(s, "--resume") : 0;
}

int cli_meta_u64(const ts_checkpoint *ck, const char *path, const char *key, uint64_t max,
                 uint64_t *v)
{
    const char *txt = ts_checkpoint_meta(ck, key);
    if (!txt) {
        fprintf(stderr, "tessera: error: %s: not a tessera training checkpoint (no '%s')\n",
                path, key);
        return 1;
    }
    if (cli_strict_u64(txt, 0, max, v) != 0) {
        char shown[200];
        fprintf(stderr, "tessera: error: %s: metadata '%s' = '%s' is not a whole number in [0, "
                        "%llu]: the checkpoint is damaged or was not written by tessera\n",
                path, key, cli_printable(txt, 60, shown, sizeof shown), (unsigned long long)max);
        return 1;
    }
    return 0;
}
