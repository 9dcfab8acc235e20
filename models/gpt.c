/* models/gpt.c: the GPT of tessera/models.h, from public modules of one's own: a block is a
 * custom module whose forward adds the attention and MLP branches to the residual stream. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tessera/tessera.h>

#include "../core/internal.h" /* TS_API */

typedef struct gpt_state {
    ts_gpt_config cfg;
    ts_rng *rng;
    ts_tensor *mask;      /* (context, context): 0 on and below the diagonal, -inf above */
    ts_tensor *positions; /* (context) int64: 0, 1, ..., context - 1 */
} gpt_state;

static void free_state(void *u)
{
    gpt_state *st = u;
    if (st) {
        ts_tensor_unref(st->mask);
        ts_tensor_unref(st->positions);
    }
    free(st);
}


static ts_module *child(ts_module *m, const char *name)
{
    return ts_module_child(m, name);
}

/* ---- attention ------------------------------------------------------------------------- */

/* (B, T, C) -> (B, H, T, C/H): the heads as a batch dim. */
static ts_tensor *heads(ts_tensor *t, int64_t H)
{
    const int64_t *sh = t ? ts_tensor_shape(t) : NULL;
    return sh ? ts_s_transpose(ts_s_view(t, 4, (const int64_t[]){sh[0], sh[1], H, sh[2] / H}), 1, 2)
              : NULL;
}

static ts_status attn_forward(ts_module *m, ts_tensor *x, ts_tensor **y)
{
    const gpt_state *st = ts_module_user(m);
    const int64_t B = ts_tensor_shape(x)[0], T = ts_tensor_shape(x)[1], C = st->cfg.embd;
    const int64_t H = st->cfg.heads;
    ts_scope *sc = ts_scope_begin();
    ts_tensor *qkv = ts_s_forward(child(m, "c_attn"), x);
    ts_tensor *q = heads(ts_s_narrow(qkv, 2, 0, C), H), *k = heads(ts_s_narrow(qkv, 2, C, C), H);
    ts_tensor *v = heads(ts_s_narrow(qkv, 2, 2 * C, C), H);
    ts_tensor *o;
    if (st->cfg.dropout == 0 || !ts_module_is_training(child(m, "attn_dropout"))) {
        /* ts_attention: one fused pass (no T x T matrix) where it pays, else composed as
         * below (in a 16-bit dtype with the softmax in that dtype) */
        o = ts_s_attention(q, k, v, 1, 1 / sqrt(C / H));
        o = ts_s_contiguous(ts_s_transpose(o, 1, 2)); /* (B, T, H, C/H) */
        o = ts_s_forward(child(m, "c_proj"), ts_s_view(o, 3, (const int64_t[]){B, T, C}));
        return ts_scope_return(sc, ts_s_forward(child(m, "resid_dropout"), o), y);
    }
    /* composed (and so with dropout on the attention weights), the mask kept on the device */
    ts_tensor *att = ts_s_mul_scalar(ts_s_matmul(q, ts_s_transpose(k, 2, 3)), 1 / sqrt(C / H));
    /* causal: -inf above the diagonal, in the model's dtype (float64 after to_dtype) */
    ts_tensor *mask = ts_s_cast(st->mask, att ? ts_tensor_dtype(att) : TS_F32);
    att = ts_s_add(att, ts_s_narrow(ts_s_narrow(mask, 0, 0, T), 1, 0, T));
    att = ts_s_forward(child(m, "attn_dropout"), ts_s_softmax(att, 3));
    o = ts_s_contiguous(ts_s_transpose(ts_s_matmul(att, v), 1, 2)); /* (B, T, H, C/H) */
    o = ts_s_forward(child(m, "c_proj"), ts_s_view(o, 3, (const int64_t[]){B, T, C}));
    return ts_scope_return(sc, ts_s_forward(child(m, "resid_dropout"), o), y);
}

/* ---- a block: x + attn(ln_1(x)), then + mlp(ln_2(x)) --------------------------------------- */

static ts_status block_forward(ts_module *m, ts_tensor *x, ts_tensor **y)
{
    ts_scope *sc = ts_scope_begin();
    x = ts_s_add(x, ts_s_forward(child(m, "attn"), ts_s_forward(child(m, "ln_1"), x)));
    x = ts_s_add(x, ts_s_forward(child(m, "mlp"), ts_s_forward(child(m, "ln_2"), x)));
    return ts_scope_return(sc, x, y);
}

/* ---- the whole model ------------------------------------------------------------------- */

/* The head's (C, V) operand: wte transposed, under autocast cast before it is transposed (as
 * the linears do: a dense cast, and its gradient back in wte's layout). */
static ts_tensor *head_weight(ts_module *gpt)
{
    ts_tensor *w = ts_module_param(gpt, "lm_head_weight");
    const int32_t ac = ts_autocast_dtype();
    if (w && ac != TS_F32 && ts_tensor_dtype(w) == TS_F32)
        w = ts_s_cast(w, ac);
    return ts_s_transpose(w, 0, 1);
}

static ts_status gpt_forward(ts_module *m, ts_tensor *idx, ts_tensor **y)
{
    const gpt_state *st = ts_module_user(m);
    ts_module *tr = child(m, "transformer");
    if (ts_tensor_ndim(idx) != 2 || ts_tensor_shape(idx)[1] > st->cfg.context ||
        ts_tensor_shape(idx)[1] < 1) {
        char b[96];
        return ts_fail(TS_ESHAPE, "token ids %s: need (batch, T) with 1 <= T <= %lld, the "
                       "context", ts_tensor_describe(idx, b, sizeof b),
                       (long long)st->cfg.context);
    }
    ts_scope *sc = ts_scope_begin();
    ts_tensor *positions = ts_s_narrow(st->positions, 0, 0, ts_tensor_shape(idx)[1]);
    ts_tensor *tok = ts_s_forward(child(tr, "wte"), idx);
    ts_tensor *h = ts_s_add(tok, ts_s_forward(child(tr, "wpe"), positions));
    h = ts_s_forward(child(tr, "h"), ts_s_forward(child(tr, "drop"), h));
    h = ts_s_forward(child(tr, "ln_f"), h);
    /* the head tied to wte: (B, T, C) @ (C, V) */
    return ts_scope_return(sc, ts_s_matmul(h, head_weight(m)), y);
}

static ts_status linear(ts_device *dev, int64_t in, int64_t out, double std, ts_rng *rng,
                        ts_module **m)
{
    ts_weight_init init = {TS_INIT_NORMAL, std, rng};
    return ts_nn_linear(dev, in, out, 1, &init, m);
}

static ts_status dropout(double p, ts_rng *rng, ts_module **m)
{
    return ts_nn_dropout(p, rng, m);
}

/* A child made by expr, added to parent under name (parent owns it either way). */
#define ADD(parent, name, expr)                                                             \
    do {                                                                                    \
        ts_module *c_ = NULL;                                                               \
        if ((s = (expr)) || (s = ts_module_add_child(parent, name, c_)))                    \
            goto fail;                                                                      \
    } while (0)

static ts_status no_forward(ts_module *m, ts_tensor *x, ts_tensor **y)
{
    (void)m, (void)x, (void)y;
    return ts_fail(TS_ESTATE, "a container of named parts: the model's forward runs them");
}

static const ts_module_def gpt_def = {"gpt", gpt_forward, free_state};
static const ts_module_def container_def = {"gpt_transformer", no_forward, NULL};
static const ts_module_def block_def = {"gpt_block", block_forward, NULL};
static const ts_module_def attn_def = {"gpt_attention", attn_forward, NULL};

TS_API ts_status ts_gpt_new(const ts_gpt_config *cfg, ts_device *dev, ts_rng *rng,
                          ts_module **out)
{
    *out = NULL;
    if (!cfg || cfg->vocab < 1 || cfg->context < 1 || cfg->layers < 1 || cfg->heads < 1 ||
        cfg->embd < 1 || cfg->embd % cfg->heads || !(cfg->dropout >= 0 && cfg->dropout < 1))
        return ts_fail(TS_EINVAL, "gpt: need vocab, context, layers, heads, embd >= 1, embd a "
                       "multiple of heads and dropout in [0, 1)");
    const int64_t C = cfg->embd, T = cfg->context;
    const double std = 0.02, proj_std = 0.02 / sqrt(2.0 * (double)cfg->layers);
    gpt_state *st = calloc(1, sizeof *st);
    if (!st)
        return ts_fail(TS_ENOMEM, "gpt: out of host memory");
    st->cfg = *cfg;
    st->rng = rng;
    float *mask = malloc(sizeof *mask * (size_t)(T * T));
    ts_status s = mask ? TS_OK : ts_fail(TS_ENOMEM, "gpt: out of host memory");
    for (int64_t i = 0; mask && i < T; i++)
        for (int64_t j = 0; j < T; j++)
            mask[i * T + j] = j <= i ? 0.0f : -INFINITY;
    if (!s)
        s = ts_tensor_from_host(dev, TS_F32, 2, (const int64_t[]){T, T}, mask, &st->mask);
    free(mask);
    if (!s)
        s = ts_tensor_arange(dev, TS_I64, 0, (double)T, 1, &st->positions);
    ts_module *gpt = NULL, *tr = NULL, *blocks = NULL;
    if (s) {
        free_state(st);
        return s;
    }
    if ((s = ts_module_custom(&gpt_def, st, &gpt)))
        return s; /* it freed st through free_state */
    if ((s = ts_module_custom(&container_def, NULL, &tr)) ||
        (s = ts_module_add_child(gpt, "transformer", tr)))
        goto fail;
    ts_weight_init emb = {TS_INIT_NORMAL, std, rng};
    ADD(tr, "wte", ts_nn_embedding(dev, cfg->vocab, C, &emb, &c_));
    ADD(tr, "wpe", ts_nn_embedding(dev, T, C, &emb, &c_));
    ADD(tr, "drop", dropout(cfg->dropout, rng, &c_));
    if ((s = ts_nn_sequential(&blocks)) || (s = ts_module_add_child(tr, "h", blocks)) ||
        (s = ts_nn_sequential_checkpoint(blocks, rng, cfg->checkpoint)))
        goto fail;
    for (int64_t l = 0; l < cfg->layers; l++) {
        ts_module *blk = NULL, *attn = NULL, *mlp = NULL;
        char name[24];
        snprintf(name, sizeof name, "%lld", (long long)l);
        if ((s = ts_module_custom(&block_def, NULL, &blk)) ||
            (s = ts_nn_sequential_add(blocks, name, blk)))
            goto fail;
        ADD(blk, "ln_1", ts_nn_layernorm(dev, 1, &C, 1e-5, &c_));
        /* the attention reads the model's sizes and mask (st, owned by the model) */
        if ((s = ts_module_custom(&attn_def, st, &attn)) ||
            (s = ts_module_add_child(blk, "attn", attn)))
            goto fail;
        ADD(attn, "c_attn", linear(dev, C, 3 * C, std, rng, &c_));
        ADD(attn, "c_proj", linear(dev, C, C, proj_std, rng, &c_));
        ADD(attn, "attn_dropout", dropout(cfg->dropout, rng, &c_));
        ADD(attn, "resid_dropout", dropout(cfg->dropout, rng, &c_));
        ADD(blk, "ln_2", ts_nn_layernorm(dev, 1, &C, 1e-5, &c_));
        if ((s = ts_nn_sequential(&mlp)) || (s = ts_module_add_child(blk, "mlp", mlp)))
            goto fail;
        ADD(mlp, "c_fc", linear(dev, C, 4 * C, std, rng, &c_));
        ADD(mlp, "gelu", ts_nn_gelu_tanh(&c_));
        ADD(mlp, "c_proj", linear(dev, 4 * C, C, proj_std, rng, &c_));
        ADD(mlp, "dropout", dropout(cfg->dropout, rng, &c_));
    }
    ADD(tr, "ln_f", ts_nn_layernorm(dev, 1, &C, 1e-5, &c_));
    /* The head: wte's weight, shared (one tensor, one gradient, listed once). */
    ts_named_tensor w[1];
    if (ts_module_parameters(ts_module_child(tr, "wte"), w, 1) != 1 ||
        (s = ts_module_add_shared_param(gpt, "lm_head_weight", w[0].tensor)))
        goto fail;
    *out = gpt;
    return TS_OK;
fail:
    ts_module_free(gpt);
    return s ? s : TS_ESTATE;
}

TS_API ts_status ts_gpt_loss(ts_tensor *logits, ts_tensor *targets, ts_tensor **loss)
{
    const int64_t *sh = ts_tensor_shape(logits);
    ts_tensor *l2 = NULL, *t1 = NULL;
    ts_status s = ts_tensor_reshape(logits, 2, (const int64_t[]){sh[0] * sh[1], sh[2]}, &l2);
    if (!s)
        s = ts_tensor_reshape(targets, 1, (const int64_t[]){sh[0] * sh[1]}, &t1);
    if (!s)
        s = ts_cross_entropy(l2, t1, TS_REDUCTION_MEAN, loss);
    ts_tensor_unref(l2);
    ts_tensor_unref(t1);
    return s;
}

TS_API void ts_gpt_decay_groups(ts_optim *opt)
{
    ts_optim_decay_matrices_only(opt);
    ts_optim_set_param_weight_decay(opt, "transformer.wte.weight", 0);
    ts_optim_set_param_weight_decay(opt, "transformer.wpe.weight", 0);
}

/* ---- generation with a key/value cache ------------------------------------------------- */

struct ts_gpt_cache {
    int64_t pos;          /* positions fed so far */
    int64_t layers;
    ts_tensor **k, **v;   /* per layer: (context, embd) */
};

TS_API const ts_gpt_config *ts_gpt_config_of(const ts_module *gpt)
{
    const gpt_state *st = ts_module_user(gpt);
    return st ? &st->cfg : NULL;
}

TS_API void ts_gpt_cache_free(ts_gpt_cache *c)
{
    if (!c)
        return;
    for (int64_t l = 0; l < c->layers; l++) {
        ts_tensor_unref(c->k ? c->k[l] : NULL);
        ts_tensor_unref(c->v ? c->v[l] : NULL);
    }
    free(c->k);
    free(c->v);
    free(c);
}

TS_API ts_status ts_gpt_cache_new(ts_module *gpt, ts_gpt_cache **out)
{
    *out = NULL;
    const ts_gpt_config *cfg = ts_gpt_config_of(gpt);
    if (!cfg)
        return ts_fail(TS_EINVAL, "gpt cache: not a model from ts_gpt_new");
    ts_gpt_cache *c = calloc(1, sizeof *c);
    if (!c)
        return ts_fail(TS_ENOMEM, "gpt cache: out of host memory");
    c->layers = cfg->layers;
    c->k = calloc((size_t)cfg->layers, sizeof *c->k);
    c->v = calloc((size_t)cfg->layers, sizeof *c->v);
    ts_status s = c->k && c->v ? TS_OK : ts_fail(TS_ENOMEM, "gpt cache: out of host memory");
    const ts_tensor *wte = ts_module_param(gpt, "lm_head_weight");
    ts_device *dev = ts_tensor_device(wte);
    const int32_t dt = ts_tensor_dtype(wte);
    const int64_t shape[2] = {cfg->context, cfg->embd};
    for (int64_t l = 0; l < cfg->layers && !s; l++)
        if (!(s = ts_tensor_zeros(dev, dt, 2, shape, &c->k[l])))
            s = ts_tensor_zeros(dev, dt, 2, shape, &c->v[l]);
    if (s) {
        ts_gpt_cache_free(c);
        return s;
    }
    *out = c;
    return TS_OK;
}

/* One position of attention for layer l: x (1, C) -> (1, C), the key and value of this
 * position stored in the cache first. */
/* One position of one layer's attention: its key and value into the cache, then attention of
 * its query over the n positions cached so far (no mask: there is nothing after it). */
static ts_status attn_step(ts_module *attn, const ts_gpt_config *cfg, ts_gpt_cache *c,
                           int64_t l, ts_tensor *x, ts_tensor **y)
{
    const int64_t C = cfg->embd, H = cfg->heads, hd = C / H, n = c->pos + 1;
    ts_scope *sc = ts_scope_begin();
    ts_tensor *qkv = ts_s_forward(ts_module_child(attn, "c_attn"), x);
    ts_tensor *q = ts_s_narrow(qkv, 1, 0, C), *k = ts_s_narrow(qkv, 1, C, C);
    ts_tensor *v = ts_s_narrow(qkv, 1, 2 * C, C);
    ts_tensor *krow = ts_s_narrow(c->k[l], 0, c->pos, 1), *vrow = ts_s_narrow(c->v[l], 0, c->pos, 1);
    ts_s_copy_(krow, k); /* this position's key and value into the cache */
    ts_s_copy_(vrow, v);
    ts_tensor *keys = ts_s_view(ts_s_narrow(c->k[l], 0, 0, n), 3, (const int64_t[]){n, H, hd});
    ts_tensor *vals = ts_s_view(ts_s_narrow(c->v[l], 0, 0, n), 3, (const int64_t[]){n, H, hd});
    ts_tensor *kt = ts_s_permute(keys, (const int[]){1, 2, 0}), *vt = ts_s_transpose(vals, 0, 1);
    ts_tensor *qh = ts_s_view(q, 3, (const int64_t[]){H, 1, hd});
    ts_tensor *att = ts_s_mul_scalar(ts_s_matmul(qh, kt), 1.0 / sqrt((double)hd)); /* (H, 1, n) */
    ts_tensor *o = ts_s_transpose(ts_s_matmul(ts_s_softmax(att, 2), vt), 0, 1);    /* (1, H, hd) */
    o = ts_s_view(ts_s_contiguous(o), 2, (const int64_t[]){1, C});
    return ts_scope_return(sc, ts_s_forward(ts_module_child(attn, "c_proj"), o), y);
}

TS_API ts_status ts_gpt_cache_step(ts_module *gpt, ts_gpt_cache *c, int64_t token,
                                   ts_tensor **logits)
{
    *logits = NULL;
    const ts_gpt_config *cfg = ts_gpt_config_of(gpt);
    if (!cfg || !c)
        return ts_fail(TS_EINVAL, "gpt step: no model or cache");
    if (c->pos >= cfg->context)
        return ts_fail(TS_ESHAPE, "gpt step: the cache holds the whole context of %lld "
                       "positions", (long long)cfg->context);
    if (token < 0 || token >= cfg->vocab)
        return ts_fail(TS_EINVAL, "gpt step: token %lld is outside the vocabulary of %lld",
                       (long long)token, (long long)cfg->vocab);
    ts_module *tr = child(gpt, "transformer"), *h = child(tr, "h");
    ts_device *dev = ts_tensor_device(ts_module_param(gpt, "lm_head_weight"));
    ts_module_train(gpt, 0);
    ts_no_grad_enter();
    ts_scope *sc = ts_scope_begin();
    ts_tensor *t;
    ts_tensor *tok_id = TS_SCOPED(ts_tensor_from_host(dev, TS_I64, 1, (const int64_t[]){1}, &token,
                                                   &t), t);
    ts_tensor *pos_id = TS_SCOPED(ts_tensor_from_host(dev, TS_I64, 1, (const int64_t[]){1},
                                                   &c->pos, &t), t);
    ts_tensor *te = ts_s_forward(child(tr, "wte"), tok_id); /* (1, C) */
    ts_tensor *x = ts_s_add(te, ts_s_forward(child(tr, "wpe"), pos_id));
    for (int64_t l = 0; l < cfg->layers; l++) {
        char name[24];
        snprintf(name, sizeof name, "%lld", (long long)l);
        ts_module *blk = child(h, name);
        ts_tensor *a = ts_s_forward(child(blk, "ln_1"), x), *b = NULL;
        if (a)
            b = TS_SCOPED(attn_step(child(blk, "attn"), cfg, c, l, a, &t), t);
        x = ts_s_add(x, b);
        x = ts_s_add(x, ts_s_forward(child(blk, "mlp"), ts_s_forward(child(blk, "ln_2"), x)));
    }
    x = ts_s_forward(child(tr, "ln_f"), x);
    ts_status s = ts_scope_return(sc, ts_s_matmul(x, head_weight(gpt)), logits); /* (1, vocab) */
    if (s == TS_OK)
        c->pos++;
    ts_no_grad_exit();
    return s;
}

TS_API double ts_gpt_params(const ts_gpt_config *c)
{
    double E = (double)c->embd;
    return (double)c->vocab * E + (double)c->context * E +
           (double)c->layers * (12 * E * E + 13 * E) + 2 * E;
}

TS_API double ts_gpt_bytes(const ts_gpt_config *c, int64_t batch, int training)
{
    double P = ts_gpt_params(c), E = (double)c->embd, T = (double)c->context;
    double L = (double)c->layers, H = (double)c->heads, B = (double)batch;
    if (!training) /* the weights and a key/value cache of one sequence */
        return 4 * (P + 2 * L * T * E);
    /* weights, gradients, AdamW's two moments; per layer and token at least the residual
     * stream, q/k/v, the MLP's 4E in and out, and the attention's scores and weights */
    double block = 12 * E + 2 * H * T; /* a block's activations per token */
    if (c->checkpoint) /* every block's input, and one block's inside while it is recomputed */
        return 4 * (4 * P + B * T * (L * E + block + 2 * (double)c->vocab));
    return 4 * (4 * P + B * T * (L * block + 2 * (double)c->vocab));
}
