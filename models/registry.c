/* models/registry.c: the one list of built-in models, and each configuration's defaults,
 * checks, description and checkpoint metadata (model.* keys, read as strictly as they are
 * checked; checkpoints from before those keys carry train.model and train.arch, the model's
 * options as text, which are read as strictly). */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tessera/tessera.h>
#include <tessera/models.h>

#include "../core/internal.h" /* TS_API */
#include "models.h"

static const struct {
    const char *name, *summary;
} models[] = {
    {"mlp", "a multilayer perceptron on 28x28 images: hidden linear layers with ReLU (256,128)"},
    {"lenet5", "LeNet-5 on 28x28 images: two 5x5 convolutions with pooling, three linear layers"},
    {"cnn", "a convolutional net on 28x28 images: 3x3 conv + pool blocks (32,64), then linear"},
    {"gpt", "a GPT-2 style language model over bytes: pre-norm blocks, tied output head"},
};
#define NMODELS (sizeof models / sizeof models[0])

static const char *const init_names[] = {"kaiming-uniform", "kaiming-normal", "xavier-uniform",
                                         "normal"};

static int is(const ts_model_config *c, const char *name)
{
    return strcmp(c->name, name) == 0;
}

static int known(const char *name)
{
    for (size_t i = 0; i < NMODELS; i++)
        if (strcmp(models[i].name, name) == 0)
            return 1;
    return 0;
}

TS_API size_t ts_model_list(const char **names, const char **summaries, size_t cap)
{
    for (size_t i = 0; i < NMODELS && i < cap; i++) {
        if (names)
            names[i] = models[i].name;
        if (summaries)
            summaries[i] = models[i].summary;
    }
    return NMODELS;
}

TS_API ts_status ts_model_defaults(const char *name, ts_model_config *out)
{
    if (!out)
        return ts_fail(TS_EINVAL, "ts_model_defaults: out is NULL");
    memset(out, 0, sizeof *out);
    if (!name || !known(name))
        return ts_fail(TS_EINVAL, "unknown model '%s': the models are mlp, lenet5, cnn and gpt",
                       name ? name : "(null)");
    snprintf(out->name, sizeof out->name, "%s", name);
    out->init = TS_INIT_KAIMING_UNIFORM;
    if (is(out, "mlp")) { /* 784-256-128-10 */
        out->nhidden = 2;
        out->hidden[0] = 256, out->hidden[1] = 128;
    } else if (is(out, "cnn")) {
        out->nchannels = 2;
        out->channels[0] = 32, out->channels[1] = 64;
    } else if (is(out, "gpt")) {
        out->gpt = (ts_gpt_config){256, 128, 4, 4, 128, 0, 0};
    }
    return TS_OK;
}

TS_API ts_status ts_model_check(const ts_model_config *c)
{
    if (!c)
        return ts_fail(TS_EINVAL, "ts_model_check: NULL configuration");
    if (!memchr(c->name, 0, sizeof c->name) || !known(c->name))
        return ts_fail(TS_EINVAL, "unknown model '%.*s': the models are mlp, lenet5, cnn and "
                       "gpt", (int)sizeof c->name, c->name);
    int gpt = is(c, "gpt"), mlp = is(c, "mlp"), cnn = is(c, "cnn");
    if (c->nhidden && !mlp && !cnn)
        return ts_fail(TS_EINVAL, "%s: hidden layers apply to mlp and cnn, not %s", c->name,
                       c->name);
    if (c->nchannels && !cnn)
        return ts_fail(TS_EINVAL, "%s: conv blocks (channels) apply to cnn, not %s", c->name,
                       c->name);
    if (c->nhidden < 0 || c->nhidden > TS_MODEL_MAX_LAYERS)
        return ts_fail(TS_EINVAL, "%s: %d hidden layers: at most %d", c->name, c->nhidden,
                       TS_MODEL_MAX_LAYERS);
    /* Each block halves 28x28 (rounding down): 14, 7, 3, 1, then nothing is left. */
    if (c->nchannels < 0 || c->nchannels > 4)
        return ts_fail(TS_EINVAL, "%s: %d conv blocks: at most 4 (each 2x2 pool halves the "
                       "28x28 image: 14, 7, 3, 1)", c->name, c->nchannels);
    for (int i = 0; i < c->nhidden; i++)
        if (c->hidden[i] < 1 || c->hidden[i] > 1 << 16)
            return ts_fail(TS_EINVAL, "%s: hidden layer %d has %lld features: each must be "
                           "1..65536", c->name, i + 1, (long long)c->hidden[i]);
    for (int i = 0; i < c->nchannels; i++)
        if (c->channels[i] < 1 || c->channels[i] > 4096)
            return ts_fail(TS_EINVAL, "%s: conv block %d has %lld channels: each must be "
                           "1..4096", c->name, i + 1, (long long)c->channels[i]);
    if (!gpt && (c->init < 0 || c->init > TS_INIT_NORMAL))
        return ts_fail(TS_EINVAL, "%s: unknown initialisation %d", c->name, (int)c->init);
    if (!gpt && c->init == TS_INIT_NORMAL && !(c->init_std > 0 && c->init_std <= 1e6))
        return ts_fail(TS_EINVAL, "%s: the normal initialisation's standard deviation %g must "
                       "be > 0 and at most 1e6", c->name, c->init_std);
    if (!gpt)
        return TS_OK;
    const ts_gpt_config *g = &c->gpt;
    if (g->vocab < 1 || g->vocab > 1 << 24 || g->context < 1 || g->context > TS_GPT_MAX_CONTEXT ||
        g->layers < 1 || g->layers > TS_GPT_MAX_LAYERS || g->heads < 1 ||
        g->heads > TS_GPT_MAX_HEADS || g->embd < 1 || g->embd > TS_GPT_MAX_EMBD ||
        !(g->dropout >= 0 && g->dropout <= 0.99))
        return ts_fail(TS_EINVAL, "gpt: vocab %lld, context %lld, layers %lld, heads %lld, embd "
                       "%lld, dropout %g: need vocab 1..16777216, context 1..%d, layers 1..%d, "
                       "heads 1..%d, embd 1..%d, dropout in [0, 0.99]",
                       (long long)g->vocab, (long long)g->context, (long long)g->layers,
                       (long long)g->heads, (long long)g->embd, g->dropout, TS_GPT_MAX_CONTEXT,
                       TS_GPT_MAX_LAYERS, TS_GPT_MAX_HEADS, TS_GPT_MAX_EMBD);
    if (g->embd % g->heads)
        return ts_fail(TS_EINVAL, "gpt: embd %lld is not a multiple of heads %lld",
                       (long long)g->embd, (long long)g->heads);
    return TS_OK;
}

TS_API ts_status ts_model_new(const ts_model_config *c, ts_device *dev, ts_rng *rng,
                              ts_module **out)
{
    if (!out)
        return ts_fail(TS_EINVAL, "ts_model_new: out is NULL");
    *out = NULL;
    if (!rng)
        return ts_fail(TS_EINVAL, "ts_model_new: rng is NULL");
    ts_status s = ts_model_check(c);
    if (s)
        return s;
    if (!dev)
        dev = ts_default_device();
    if (is(c, "gpt"))
        return ts_gpt_new(&c->gpt, dev, rng, out);
    return ts__classifier_new(c, dev, rng, out);
}

TS_API double ts_model_params(const ts_model_config *c)
{
    if (ts_model_check(c) != TS_OK)
        return -1;
    if (is(c, "gpt"))
        return ts_gpt_params(&c->gpt);
    if (is(c, "lenet5")) /* conv1 156, conv2 2,416, fc 48,120 + 10,164 + 850 */
        return 61706;
    double n = 0, ch = 1, hw = 28;
    for (int i = 0; i < c->nchannels; i++) { /* 3x3 convolutions with bias */
        n += ch * (double)c->channels[i] * 9 + (double)c->channels[i];
        ch = (double)c->channels[i];
        hw = floor(hw / 2);
    }
    double feat = ch * hw * hw;
    for (int i = 0; i <= c->nhidden; i++) { /* linear layers with bias */
        double o = i < c->nhidden ? (double)c->hidden[i] : 10;
        n += feat * o + o;
        feat = o;
    }
    return n;
}

/* " OPT 1,2,3" appended to buf. */
static void put_list(char *buf, size_t len, const char *opt, const int64_t *v, int n)
{
    size_t at = strlen(buf);
    at += (size_t)snprintf(buf + at, at < len ? len - at : 0, "%s%s%s", opt ? " " : "",
                           opt ? opt : "", opt ? " " : "");
    for (int i = 0; i < n && at < len; i++)
        at += (size_t)snprintf(buf + at, len - at, "%s%lld", i ? "," : "", (long long)v[i]);
}

TS_API const char *ts_model_describe(const ts_model_config *c, char *buf, size_t len)
{
    if (!buf || !len)
        return buf;
    buf[0] = 0;
    if (!c)
        return buf;
    if (is(c, "gpt")) {
        const ts_gpt_config *g = &c->gpt;
        char p[32]; /* the fewest digits that read back as the value: 0.1, not 0.1000...01 */
        for (int prec = 1; prec <= 17; prec++) {
            snprintf(p, sizeof p, "%.*g", prec, g->dropout);
            if (strtod(p, NULL) == g->dropout)
                break;
        }
        snprintf(buf, len, "gpt --context %lld --layers %lld --heads %lld --embd %lld "
                 "--dropout %s", (long long)g->context, (long long)g->layers,
                 (long long)g->heads, (long long)g->embd, p);
        return buf;
    }
    snprintf(buf, len, "%.*s", (int)sizeof c->name, c->name);
    if (is(c, "cnn"))
        put_list(buf, len, "--channels", c->channels, c->nchannels);
    if (c->nhidden > 0)
        put_list(buf, len, "--hidden", c->hidden, c->nhidden);
    size_t at = strlen(buf);
    if (c->init == TS_INIT_NORMAL && at < len)
        snprintf(buf + at, len - at, " --init normal:%g", c->init_std);
    else if (c->init != TS_INIT_KAIMING_UNIFORM && at < len)
        snprintf(buf + at, len - at, " --init %s",
                 c->init == TS_INIT_KAIMING_NORMAL ? "kaiming-normal" : "xavier");
    return buf;
}

/* ---- checkpoint metadata ------------------------------------------------------------- */

static ts_status set_i64(ts_checkpoint *ck, const char *key, int64_t v)
{
    char b[32];
    snprintf(b, sizeof b, "%lld", (long long)v);
    return ts_checkpoint_set_meta(ck, key, b);
}

static ts_status set_f64(ts_checkpoint *ck, const char *key, double v)
{
    char b[40];
    snprintf(b, sizeof b, "%.17g", v);
    return ts_checkpoint_set_meta(ck, key, b);
}

TS_API ts_status ts_model_save_config(const ts_model_config *c, ts_checkpoint *ck)
{
    if (!ck)
        return ts_fail(TS_EINVAL, "ts_model_save_config: NULL checkpoint");
    ts_status s = ts_model_check(c);
    if (s || (s = ts_checkpoint_set_meta(ck, "model.name", c->name)))
        return s;
    if (is(c, "gpt")) {
        const ts_gpt_config *g = &c->gpt;
        if ((s = set_i64(ck, "model.vocab", g->vocab)) ||
            (s = set_i64(ck, "model.context", g->context)) ||
            (s = set_i64(ck, "model.layers", g->layers)) ||
            (s = set_i64(ck, "model.heads", g->heads)) ||
            (s = set_i64(ck, "model.embd", g->embd)))
            return s;
        return set_f64(ck, "model.dropout", g->dropout);
    }
    char list[TS_MODEL_MAX_LAYERS * 24] = "";
    if (is(c, "mlp") || is(c, "cnn")) {
        put_list(list, sizeof list, NULL, c->hidden, c->nhidden);
        if ((s = ts_checkpoint_set_meta(ck, "model.hidden", list)))
            return s;
    }
    if (is(c, "cnn")) {
        list[0] = 0;
        put_list(list, sizeof list, NULL, c->channels, c->nchannels);
        if ((s = ts_checkpoint_set_meta(ck, "model.channels", list)))
            return s;
    }
    if ((s = ts_checkpoint_set_meta(ck, "model.init", init_names[c->init])))
        return s;
    return c->init == TS_INIT_NORMAL ? set_f64(ck, "model.init_std", c->init_std) : TS_OK;
}

/* A whole decimal number in [lo, hi]: digits only (no sign, space or exponent). */
static int parse_i64(const char *t, int64_t lo, int64_t hi, int64_t *out)
{
    size_t n = t ? strlen(t) : 0;
    if (!n || n > 18 || strspn(t, "0123456789") != n)
        return 0;
    long long v = strtoll(t, NULL, 10);
    if (v < lo || v > hi)
        return 0;
    *out = v;
    return 1;
}

/* A finite decimal number as %.17g writes it (no hex, inf or nan, nothing after it). */
static int parse_f64(const char *t, double *out)
{
    if (!t || !*t || strspn(t, "0123456789.eE+-") != strlen(t))
        return 0;
    char *end;
    errno = 0;
    double v = strtod(t, &end);
    if (*end || errno || !isfinite(v))
        return 0;
    *out = v;
    return 1;
}

/* "256,128" (or "" for none) into v and *n. */
static int parse_list(const char *t, int64_t max, int64_t *v, int32_t *n)
{
    *n = 0;
    if (!t)
        return 0;
    if (!*t)
        return 1;
    for (const char *p = t;;) {
        size_t len = strcspn(p, ",");
        char item[24];
        if (!len || len >= sizeof item || *n == TS_MODEL_MAX_LAYERS)
            return 0;
        memcpy(item, p, len);
        item[len] = 0;
        if (!parse_i64(item, 1, max, &v[*n]))
            return 0;
        (*n)++;
        if (!p[len])
            return 1;
        p += len + 1;
    }
}

/* Text from a file, safe to print: control characters and bytes over 0x7e as \xNN (a
 * hostile checkpoint must not send a terminal escape sequences), cut after max bytes. */
static const char *shown(const char *t, size_t max, char *buf, size_t len)
{
    size_t at = 0, i = 0;
    for (; t[i] && i < max && at + 8 < len; i++) {
        unsigned char c = (unsigned char)t[i];
        at += (size_t)snprintf(buf + at, len - at, c < 0x20 || c > 0x7e ? "\\x%02x" : "%c", c);
    }
    snprintf(buf + at, len - at, "%s", t[i] ? "..." : "");
    return buf;
}

static ts_status corrupt(const char *key, const char *value, const char *why)
{
    char k[512], v[512];
    return ts_fail(TS_ECORRUPT, "model configuration: metadata '%s' = '%s': %s",
                   shown(key, 80, k, sizeof k), value ? shown(value, 80, v, sizeof v) : "(missing)",
                   why);
}

/* The keys of each model, besides model.name. */
static const char *const gpt_keys[] = {"model.vocab", "model.context", "model.layers",
                                       "model.heads", "model.embd", "model.dropout", NULL};
static const char *const mlp_keys[] = {"model.hidden", "model.init", "model.init_std", NULL};
static const char *const cnn_keys[] = {"model.hidden", "model.channels", "model.init",
                                       "model.init_std", NULL};
static const char *const lenet_keys[] = {"model.init", "model.init_std", NULL};

static ts_status load_keys(const ts_checkpoint *ck, ts_model_config *c)
{
    const char *const *keys = is(c, "gpt")   ? gpt_keys
                              : is(c, "mlp") ? mlp_keys
                              : is(c, "cnn") ? cnn_keys
                                             : lenet_keys;
    /* Another model's key (model.layers in an mlp) means the file was edited or damaged. */
    for (size_t i = 0; i < ts_checkpoint_meta_count(ck); i++) {
        const char *k = ts_checkpoint_meta_key(ck, i);
        if (strncmp(k, "model.", 6) || !strcmp(k, "model.name"))
            continue;
        int ok = 0;
        for (int j = 0; keys[j] && !ok; j++)
            ok = !strcmp(k, keys[j]);
        if (!ok)
            return corrupt(k, ts_checkpoint_meta(ck, k), "no such key for this model");
    }
#define META(key) ts_checkpoint_meta(ck, key)
    if (is(c, "gpt")) {
        ts_gpt_config *g = &c->gpt;
        int64_t *dst[] = {&g->vocab, &g->context, &g->layers, &g->heads, &g->embd};
        const int64_t hi[] = {1 << 24, TS_GPT_MAX_CONTEXT, TS_GPT_MAX_LAYERS, TS_GPT_MAX_HEADS,
                              TS_GPT_MAX_EMBD};
        for (int j = 0; j < 5; j++)
            if (!parse_i64(META(gpt_keys[j]), 1, hi[j], dst[j]))
                return corrupt(gpt_keys[j], META(gpt_keys[j]), "not a whole number in range");
        if (!parse_f64(META("model.dropout"), &g->dropout) ||
            !(g->dropout >= 0 && g->dropout <= 0.99))
            return corrupt("model.dropout", META("model.dropout"), "not a number in [0, 0.99]");
        return TS_OK;
    }
    if ((is(c, "mlp") || is(c, "cnn")) &&
        !parse_list(META("model.hidden"), 1 << 16, c->hidden, &c->nhidden))
        return corrupt("model.hidden", META("model.hidden"),
                       "not a list of sizes 1..65536 like 256,128");
    if (is(c, "cnn") && !parse_list(META("model.channels"), 4096, c->channels, &c->nchannels))
        return corrupt("model.channels", META("model.channels"),
                       "not a list of sizes 1..4096 like 32,64");
    const char *init = META("model.init");
    c->init = -1;
    for (int j = 0; j < 4 && init; j++)
        if (!strcmp(init, init_names[j]))
            c->init = j;
    if (c->init < 0)
        return corrupt("model.init", init,
                       "not kaiming-uniform, kaiming-normal, xavier-uniform or normal");
    if (c->init == TS_INIT_NORMAL && !parse_f64(META("model.init_std"), &c->init_std))
        return corrupt("model.init_std", META("model.init_std"), "not a number");
    if (c->init != TS_INIT_NORMAL && META("model.init_std"))
        return corrupt("model.init_std", META("model.init_std"),
                       "set, but model.init is not normal");
#undef META
    return TS_OK;
}

/* train.arch as tessera train wrote it before the model.* keys: "mlp --hidden 500 --init
 * normal:0.01", "gpt --context 128 --layers 4 --heads 4 --embd 128 --dropout 0". */
static ts_status load_legacy(const char *model, const char *arch, ts_model_config *c)
{
    ts_status s = ts_model_defaults(model, c);
    if (s)
        return corrupt("train.model", model, "not a model tessera writes");
    if (!arch)
        return TS_OK; /* older still: the model's defaults */
    char *copy = strlen(arch) < 512 ? strdup(arch) : NULL;
    if (!copy)
        return corrupt("train.arch", arch, "too long");
    char *save = NULL, *t = strtok_r(copy, " ", &save);
    int ok = t && !strcmp(t, model);
    if (is(c, "gpt")) /* every option once, in this order */
        c->gpt.layers = c->gpt.heads = c->gpt.embd = c->gpt.context = 0;
    while (ok && (t = strtok_r(NULL, " ", &save))) {
        const char *v = strtok_r(NULL, " ", &save);
        int64_t *gv = !strcmp(t, "--context")  ? &c->gpt.context
                      : !strcmp(t, "--layers") ? &c->gpt.layers
                      : !strcmp(t, "--heads")  ? &c->gpt.heads
                      : !strcmp(t, "--embd")   ? &c->gpt.embd
                                               : NULL;
        if (!v) {
            ok = 0;
        } else if (is(c, "gpt")) {
            ok = gv ? parse_i64(v, 1, 1 << 24, gv)
                    : !strcmp(t, "--dropout") && parse_f64(v, &c->gpt.dropout);
        } else if (!strcmp(t, "--hidden")) {
            ok = parse_list(v, 1 << 16, c->hidden, &c->nhidden);
        } else if (!strcmp(t, "--channels")) {
            ok = parse_list(v, 4096, c->channels, &c->nchannels);
        } else if (!strcmp(t, "--init")) {
            c->init = !strcmp(v, "kaiming")          ? TS_INIT_KAIMING_UNIFORM
                      : !strcmp(v, "kaiming-normal") ? TS_INIT_KAIMING_NORMAL
                      : !strcmp(v, "xavier")         ? TS_INIT_XAVIER_UNIFORM
                      : !strncmp(v, "normal:", 7)    ? TS_INIT_NORMAL
                                                     : -1;
            ok = c->init >= 0 && (c->init != TS_INIT_NORMAL || parse_f64(v + 7, &c->init_std));
        } else {
            ok = 0;
        }
    }
    free(copy);
    if (!ok)
        return corrupt("train.arch", arch, "not a model description tessera writes");
    return TS_OK;
}

TS_API ts_status ts_model_load_config(const ts_checkpoint *ck, ts_model_config *out)
{
    if (!ck || !out)
        return ts_fail(TS_EINVAL, "ts_model_load_config: NULL argument");
    const char *name = ts_checkpoint_meta(ck, "model.name");
    const char *legacy = ts_checkpoint_meta(ck, "train.model");
    ts_status s;
    if (!name && !legacy)
        return ts_fail(TS_EINVAL, "the checkpoint names no model (no metadata 'model.name'): "
                       "it was not written by tessera train or ts_model_save_config");
    if (name) {
        if ((s = ts_model_defaults(name, out)) != TS_OK)
            return corrupt("model.name", name, "not a model tessera knows (mlp, lenet5, cnn, "
                           "gpt)");
        out->nhidden = out->nchannels = 0;
        s = load_keys(ck, out);
    } else {
        s = load_legacy(legacy, ts_checkpoint_meta(ck, "train.arch"), out);
    }
    if (s)
        return s;
    if ((s = ts_model_check(out)) != TS_OK)
        return ts_fail(TS_ECORRUPT, "model configuration: %s", ts_last_error());
    return TS_OK;
}
