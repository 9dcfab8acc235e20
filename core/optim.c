/* core/optim.c: SGD, Adam and AdamW. State (momentum buffers, moments) is created lazily on
 * each parameter's device; an update is one fused kernel when the plugin has it and the same
 * arithmetic composed from elementwise ops otherwise, always with grad mode off. Also
 * gradient clipping, learning-rate schedules, and state in checkpoints. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

typedef enum optim_kind { O_SGD, O_ADAM, O_ADAMW } optim_kind;
static const char *const kind_names[] = {"sgd", "adam", "adamw"};

typedef struct slot {
    char name[96];
    ts_tensor *param;     /* owned reference */
    ts_tensor *state[2];  /* sgd: momentum buffer; adam: first and second moments */
    int own_decay;        /* weight_decay below replaces the optimizer's (a parameter group) */
    double weight_decay;
} slot;

struct ts_optim {
    int kind;
    ts_sgd_options sgd;
    ts_adam_options adam;
    int64_t steps;
    int fused; /* use the plugin's fused kernel when it has one */
    int scheduled; /* sched sets lr before every step */
    ts_lr_schedule sched;
    size_t n;
    slot *slots;
};

static const char *const state_names[2][2] = {{"momentum_buffer", NULL},
                                              {"exp_avg", "exp_avg_sq"}};

static ts_status optim_new(int kind, const ts_named_tensor *params, size_t n, ts_optim **out)
{
    if (!out)
        return ts__fail(TS_EINVAL, "optimizer: out is NULL");
    *out = NULL;
    if (n && !params)
        return ts__fail(TS_EINVAL, "optimizer: params is NULL");
    for (size_t i = 0; i < n; i++) {
        if (!params[i].tensor || !ts_tensor_requires_grad(params[i].tensor))
            return ts__fail(TS_EINVAL, "optimizer: parameter '%s' does not require grad",
                            params[i].name);
        for (size_t j = 0; j < i; j++)
            if (strcmp(params[i].name, params[j].name) == 0)
                return ts__fail(TS_EINVAL, "optimizer: two parameters named '%s'",
                                params[i].name);
    }
    ts_optim *o = ts__calloc(1, sizeof *o);
    slot *s = ts__calloc(n ? n : 1, sizeof *s);
    if (!o || !s) {
        free(o);
        free(s);
        return ts__fail(TS_ENOMEM, "optimizer: out of host memory");
    }
    o->kind = kind;
    o->fused = 1;
    o->n = n;
    o->slots = s;
    for (size_t i = 0; i < n; i++) {
        snprintf(s[i].name, sizeof s[i].name, "%s", params[i].name);
        s[i].param = ts_tensor_ref(params[i].tensor);
    }
    *out = o;
    return TS_OK;
}

/* A hyper-parameter that may be 0 but not negative, NaN or infinite. */
static int nonneg(double v)
{
    return v >= 0 && isfinite(v);
}

TS_API ts_status ts_optim_sgd(const ts_named_tensor *params, size_t n, const ts_sgd_options *opt,
                              ts_optim **out)
{
    if (out)
        *out = NULL;
    if (!opt)
        return ts__fail(TS_EINVAL, "sgd: options are NULL");
    if (!nonneg(opt->lr) || !nonneg(opt->momentum) || !nonneg(opt->weight_decay) ||
        !(opt->dampening >= 0 && opt->dampening <= 1))
        return ts__fail(TS_EINVAL, "sgd: lr %g, momentum %g and weight_decay %g must be finite "
                        "and >= 0, dampening %g in [0, 1]",
                        opt->lr, opt->momentum, opt->weight_decay, opt->dampening);
    if (opt->nesterov && (opt->momentum <= 0 || opt->dampening != 0))
        return ts__fail(TS_EINVAL, "sgd: Nesterov needs momentum > 0 and dampening 0");
    ts_status s = optim_new(O_SGD, params, n, out);
    if (s == TS_OK)
        (*out)->sgd = *opt;
    return s;
}

static ts_status adam_new(int kind, const ts_named_tensor *params, size_t n,
                          const ts_adam_options *opt, ts_optim **out)
{
    if (out)
        *out = NULL;
    if (!opt)
        return ts__fail(TS_EINVAL, "%s: options are NULL", kind_names[kind]);
    if (!nonneg(opt->lr) || !(opt->beta1 >= 0 && opt->beta1 < 1) ||
        !(opt->beta2 >= 0 && opt->beta2 < 1) || !(opt->eps > 0 && isfinite(opt->eps)) ||
        !nonneg(opt->weight_decay))
        return ts__fail(TS_EINVAL, "%s: need finite values: lr %g >= 0, betas %g, %g in [0, 1), "
                        "eps %g > 0, weight_decay %g >= 0", kind_names[kind], opt->lr,
                        opt->beta1, opt->beta2, opt->eps, opt->weight_decay);
    ts_status s = optim_new(kind, params, n, out);
    if (s == TS_OK)
        (*out)->adam = *opt;
    return s;
}

TS_API ts_status ts_optim_adam(const ts_named_tensor *params, size_t n, const ts_adam_options *o,
                               ts_optim **out)
{
    return adam_new(O_ADAM, params, n, o, out);
}

TS_API ts_status ts_optim_adamw(const ts_named_tensor *params, size_t n,
                                const ts_adam_options *o, ts_optim **out)
{
    return adam_new(O_ADAMW, params, n, o, out);
}

TS_API void ts_optim_free(ts_optim *o)
{
    if (!o)
        return;
    for (size_t i = 0; i < o->n; i++) {
        ts_tensor_unref(o->slots[i].param);
        ts_tensor_unref(o->slots[i].state[0]);
        ts_tensor_unref(o->slots[i].state[1]);
    }
    free(o->slots);
    free(o);
}

TS_API double ts_optim_lr(const ts_optim *o)
{
    return o->kind == O_SGD ? o->sgd.lr : o->adam.lr;
}

static void set_lr(ts_optim *o, double lr)
{
    if (o->kind == O_SGD)
        o->sgd.lr = lr;
    else
        o->adam.lr = lr;
}

TS_API ts_status ts_optim_set_lr(ts_optim *o, double lr)
{
    if (!o)
        return ts__fail(TS_EINVAL, "optim set_lr: optimizer is NULL");
    if (!nonneg(lr))
        return ts__fail(TS_EINVAL, "optim set_lr: lr %g must be finite and >= 0", lr);
    set_lr(o, lr);
    return TS_OK;
}

static const char *const lr_kind_names[] = {"constant", "step", "cosine"};

/* The schedule's values checked, with a message naming the bad one. */
static ts_status check_schedule(const ts_lr_schedule *s, ts_status code, const char *who)
{
    if (s->kind < TS_LR_CONSTANT || s->kind > TS_LR_COSINE)
        return ts__fail(code, "%s: unknown schedule kind %d (constant 0, step 1, cosine 2)", who,
                        (int)s->kind);
    if (!nonneg(s->base_lr))
        return ts__fail(code, "%s: base_lr %g must be finite and >= 0", who, s->base_lr);
    if (s->warmup_steps < 0 || s->warmup_steps > ((int64_t)1 << 53))
        return ts__fail(code, "%s: warmup_steps %lld must be in [0, 2^53]", who,
                        (long long)s->warmup_steps);
    if (s->kind == TS_LR_STEP &&
        (s->step_size < 1 || s->step_size > ((int64_t)1 << 53) || !(s->gamma > 0) ||
         !isfinite(s->gamma)))
        return ts__fail(code, "%s: a step schedule needs step_size >= 1 (got %lld) and a finite "
                        "gamma > 0 (got %g)", who, (long long)s->step_size, s->gamma);
    if (s->kind == TS_LR_COSINE &&
        (s->total_steps < s->warmup_steps || s->total_steps > ((int64_t)1 << 53) ||
         !nonneg(s->min_lr) || s->min_lr > s->base_lr))
        return ts__fail(code, "%s: a cosine schedule needs total_steps >= warmup_steps (got %lld "
                        "and %lld) and 0 <= min_lr <= base_lr (got %g and %g)", who,
                        (long long)s->total_steps, (long long)s->warmup_steps, s->min_lr,
                        s->base_lr);
    return TS_OK;
}

TS_API ts_status ts_optim_set_schedule(ts_optim *o, const ts_lr_schedule *sch)
{
    if (!o)
        return ts__fail(TS_EINVAL, "optim set_schedule: optimizer is NULL");
    if (!sch) {
        o->scheduled = 0;
        return TS_OK;
    }
    ts_status s = check_schedule(sch, TS_EINVAL, "optim set_schedule");
    if (s)
        return s;
    o->sched = *sch;
    o->scheduled = 1;
    set_lr(o, ts_lr_at(sch, o->steps)); /* what the next step uses, as ts_optim_lr says */
    return TS_OK;
}

TS_API int ts_optim_get_schedule(const ts_optim *o, ts_lr_schedule *out)
{
    if (!o || !o->scheduled)
        return 0;
    if (out)
        *out = o->sched;
    return 1;
}

TS_API ts_status ts_optim_set_param_weight_decay(ts_optim *o, const char *name, double wd)
{
    if (!o || !name)
        return ts__fail(TS_EINVAL, "optim set_param_weight_decay: NULL argument");
    if (!nonneg(wd))
        return ts__fail(TS_EINVAL, "optim set_param_weight_decay: weight decay %g of '%s' must "
                        "be finite and >= 0", wd, name);
    for (size_t i = 0; i < o->n; i++)
        if (strcmp(o->slots[i].name, name) == 0) {
            o->slots[i].own_decay = 1;
            o->slots[i].weight_decay = wd;
            return TS_OK;
        }
    return ts__fail(TS_EINVAL, "optim set_param_weight_decay: this optimizer has no parameter "
                    "'%s'", name);
}

TS_API size_t ts_optim_decay_matrices_only(ts_optim *o)
{
    size_t n = 0;
    for (size_t i = 0; o && i < o->n; i++)
        if (ts_tensor_ndim(o->slots[i].param) < 2) {
            o->slots[i].own_decay = 1;
            o->slots[i].weight_decay = 0;
            n++;
        }
    return n;
}

TS_API double ts_optim_param_weight_decay(const ts_optim *o, const char *name)
{
    for (size_t i = 0; o && name && i < o->n; i++)
        if (strcmp(o->slots[i].name, name) == 0)
            return o->slots[i].own_decay ? o->slots[i].weight_decay
                   : o->kind == O_SGD    ? o->sgd.weight_decay
                                         : o->adam.weight_decay;
    return NAN;
}

TS_API int64_t ts_optim_steps(const ts_optim *o)
{
    return o->steps;
}

TS_API const char *ts_optim_name(const ts_optim *o)
{
    return kind_names[o->kind];
}

TS_API void ts_optim_use_fused(ts_optim *o, int fused)
{
    o->fused = fused != 0;
}

TS_API void ts_optim_zero_grad(ts_optim *o)
{
    for (size_t i = 0; o && i < o->n; i++)
        ts_tensor_zero_grad(o->slots[i].param);
}

/* ---- the updates, composed --------------------------------------------------------------- */

#define TRY(expr)                                                                           \
    do {                                                                                    \
        if ((s = (expr)))                                                                   \
            goto out;                                                                       \
    } while (0)

static ts_status sgd_composed(const ts_sgd_options *o, slot *sl, ts_tensor *g, int first)
{
    ts_tensor *d = ts_tensor_ref(g), *t = NULL;
    ts_status s = TS_OK;
    if (o->weight_decay != 0) {
        TRY(ts_mul_scalar(sl->param, o->weight_decay, &t));
        ts_tensor *d2;
        TRY(ts_add(d, t, &d2));
        ts_tensor_unref(d);
        d = d2;
        ts_tensor_unref(t);
        t = NULL;
    }
    if (o->momentum != 0) {
        ts_tensor *buf = sl->state[0];
        if (first) {
            TRY(ts_copy_(buf, d));
        } else {
            TRY(ts_mul_scalar_(buf, o->momentum));
            TRY(ts_mul_scalar(d, 1 - o->dampening, &t));
            TRY(ts_add_(buf, t));
            ts_tensor_unref(t);
            t = NULL;
        }
        if (o->nesterov) {
            TRY(ts_mul_scalar(buf, o->momentum, &t));
            ts_tensor *d2;
            TRY(ts_add(d, t, &d2));
            ts_tensor_unref(d);
            d = d2;
            ts_tensor_unref(t);
            t = NULL;
        } else {
            ts_tensor_unref(d);
            d = ts_tensor_ref(buf);
        }
    }
    TRY(ts_mul_scalar(d, o->lr, &t));
    s = ts_sub_(sl->param, t);
out:
    ts_tensor_unref(d);
    ts_tensor_unref(t);
    return s;
}

static ts_status adam_composed(const ts_adam_options *o, int decoupled, int64_t step, slot *sl,
                               ts_tensor *g)
{
    ts_tensor *gw = ts_tensor_ref(g), *t = NULL, *d = NULL;
    ts_tensor *m = sl->state[0], *v = sl->state[1];
    ts_status s = TS_OK;
    if (decoupled) {
        TRY(ts_mul_scalar_(sl->param, 1 - o->lr * o->weight_decay));
    } else if (o->weight_decay != 0) {
        TRY(ts_mul_scalar(sl->param, o->weight_decay, &t));
        ts_tensor *g2;
        TRY(ts_add(gw, t, &g2));
        ts_tensor_unref(gw);
        gw = g2;
        ts_tensor_unref(t);
        t = NULL;
    }
    TRY(ts_mul_scalar_(m, o->beta1));
    TRY(ts_mul_scalar(gw, 1 - o->beta1, &t));
    TRY(ts_add_(m, t));
    ts_tensor_unref(t);
    t = NULL;
    TRY(ts_mul_scalar_(v, o->beta2));
    TRY(ts_mul(gw, gw, &t));
    TRY(ts_mul_scalar_(t, 1 - o->beta2));
    TRY(ts_add_(v, t));
    ts_tensor_unref(t);
    t = NULL;
    double inv_bc2 = 1 / sqrt(1 - pow(o->beta2, (double)step));
    double step_size = o->lr / (1 - pow(o->beta1, (double)step));
    TRY(ts_sqrt(v, &d));
    TRY(ts_mul_scalar_(d, inv_bc2));
    TRY(ts_add_scalar_(d, o->eps));
    TRY(ts_div(m, d, &t));
    TRY(ts_mul_scalar_(t, step_size));
    s = ts_sub_(sl->param, t);
out:
    ts_tensor_unref(gw);
    ts_tensor_unref(t);
    ts_tensor_unref(d);
    return s;
}

/* ---- step -------------------------------------------------------------------------------- */

static ts_status ensure_state(ts_optim *o, slot *sl, int *first)
{
    int nstate = o->kind == O_SGD ? (o->sgd.momentum != 0) : 2;
    *first = 0;
    for (int k = 0; k < nstate; k++) {
        if (sl->state[k])
            continue;
        *first = 1;
        ts_status s = ts_tensor_zeros(ts_tensor_device(sl->param), ts_tensor_dtype(sl->param),
                                      ts_tensor_ndim(sl->param), ts_tensor_shape(sl->param),
                                      &sl->state[k]);
        if (s)
            return s;
    }
    return TS_OK;
}

static ts_status step_one(ts_optim *o, slot *sl)
{
    ts_tensor *g = ts_tensor_grad(sl->param);
    if (!g)
        return TS_OK; /* no gradient reached it this step */
    int first;
    ts_status s = ensure_state(o, sl, &first);
    if (s)
        return s;
    ts_device *dev = ts_tensor_device(sl->param);
    ts_tensor *gc = NULL;
    if ((s = ts_tensor_contiguous(g, &gc)))
        return s;
    int32_t op = o->kind == O_SGD ? TS_OP_SGD_STEP : TS_OP_ADAM_STEP;
    /* This parameter's group: its own weight decay, or the optimizer's. */
    ts_sgd_options sgd = o->sgd;
    ts_adam_options adam = o->adam;
    if (sl->own_decay)
        sgd.weight_decay = adam.weight_decay = sl->weight_decay;
    if (o->fused && ts_tensor_is_contiguous(sl->param) && ts_device_supports(dev, op, g->dtype)) {
        ts_operand in, outs[3];
        ts__operand(gc, &in);
        ts__operand(sl->param, &outs[0]);
        int nout = 1;
        for (int k = 0; k < 2; k++)
            if (sl->state[k])
                ts__operand(sl->state[k], &outs[nout++]);
        if (o->kind == O_SGD) {
            ts_sgd_params p = {sgd.lr, sgd.momentum, sgd.dampening, sgd.weight_decay,
                               sgd.nesterov, first};
            s = ts__run(dev, op, &in, 1, outs, nout, &p, sizeof p);
        } else {
            ts_adam_params p = {adam.lr, adam.beta1, adam.beta2, adam.eps, adam.weight_decay,
                                o->kind == O_ADAMW, o->steps + 1};
            s = ts__run(dev, op, &in, 1, outs, nout, &p, sizeof p);
        }
        if (s == TS_OK) {
            ts__bump_version(sl->param);
            for (int k = 0; k < 2; k++)
                if (sl->state[k])
                    ts__bump_version(sl->state[k]);
        }
    } else if (o->kind == O_SGD) {
        s = sgd_composed(&sgd, sl, gc, first);
    } else {
        s = adam_composed(&adam, o->kind == O_ADAMW, o->steps + 1, sl, gc);
    }
    ts_tensor_unref(gc);
    if (s)
        ts__fail_prefix(s, "%s step of '%s': ", kind_names[o->kind], sl->name);
    return s;
}

TS_API ts_status ts_optim_step(ts_optim *o)
{
    if (!o)
        return ts__fail(TS_EINVAL, "optimizer step: optimizer is NULL");
    if (o->scheduled)
        set_lr(o, ts_lr_at(&o->sched, o->steps));
    ts_no_grad_enter();
    ts_status s = TS_OK;
    for (size_t i = 0; i < o->n && s == TS_OK; i++)
        s = step_one(o, &o->slots[i]);
    ts_no_grad_exit();
    if (s == TS_OK)
        o->steps++;
    return s;
}

/* ---- clipping and schedules -------------------------------------------------------------- */

TS_API ts_status ts_clip_grad_norm(const ts_named_tensor *params, size_t n, double max_norm,
                                   double *total_norm)
{
    if (n && !params)
        return ts__fail(TS_EINVAL, "clip_grad_norm: params is NULL");
    if (!(max_norm > 0))
        return ts__fail(TS_EINVAL, "clip_grad_norm: max_norm must be > 0, got %g", max_norm);
    double total = 0;
    ts_status s = TS_OK;
    ts_no_grad_enter();
    for (size_t i = 0; i < n && s == TS_OK; i++) {
        ts_tensor *g = ts_tensor_grad(params[i].tensor), *sq = NULL, *sum = NULL, *d = NULL;
        if (!g)
            continue;
        double v = 0;
        if ((s = ts_mul(g, g, &sq)) == TS_OK && (s = ts_sum(sq, 0, NULL, 0, &sum)) == TS_OK &&
            (s = ts_cast(sum, TS_F64, &d)) == TS_OK)
            s = ts_tensor_to_host(d, &v, sizeof v);
        total += v;
        ts_tensor_unref(sq);
        ts_tensor_unref(sum);
        ts_tensor_unref(d);
    }
    total = sqrt(total);
    if (s == TS_OK && !isfinite(total)) {
        ts_no_grad_exit();
        if (total_norm)
            *total_norm = total;
        return ts__fail(TS_EINVAL, "clip_grad_norm: the gradients' norm is %g: a gradient holds "
                        "NaN or infinity; nothing was scaled (lower the learning rate, or find "
                        "the op that overflows)", total);
    }
    if (s == TS_OK && total > max_norm) {
        double scale = max_norm / (total + 1e-6);
        for (size_t i = 0; i < n && s == TS_OK; i++) {
            ts_tensor *g = ts_tensor_grad(params[i].tensor);
            if (g)
                s = ts_mul_scalar_(g, scale);
        }
    }
    ts_no_grad_exit();
    if (s == TS_OK && total_norm)
        *total_norm = total;
    return s;
}

TS_API double ts_lr_at(const ts_lr_schedule *sch, int64_t step)
{
    if (!sch)
        return 0;
    if (step < 0)
        step = 0;
    if (step < sch->warmup_steps)
        return sch->base_lr * (double)(step + 1) / (double)sch->warmup_steps;
    int64_t t = step - sch->warmup_steps;
    switch (sch->kind) {
    case TS_LR_STEP:
        return sch->step_size > 0 ? sch->base_lr * pow(sch->gamma, (double)(t / sch->step_size))
                                  : sch->base_lr;
    case TS_LR_COSINE: {
        int64_t span = sch->total_steps - sch->warmup_steps;
        if (span <= 0 || t >= span)
            return sch->min_lr;
        return sch->min_lr + 0.5 * (sch->base_lr - sch->min_lr) *
                                 (1 + cos(3.141592653589793 * (double)t / (double)span));
    }
    default:
        return sch->base_lr;
    }
}

/* ---- state in checkpoints ---------------------------------------------------------------- */

static void fmt_double(char *buf, size_t len, double v)
{
    snprintf(buf, len, "%.17g", v);
}

/* How many state tensors each parameter has once updated: SGD one if it has momentum. */
static int state_count(int kind, const ts_sgd_options *sgd)
{
    return kind == O_SGD ? (sgd->momentum != 0) : 2;
}

TS_API ts_status ts_optim_save_state(const ts_optim *o, ts_checkpoint *ck)
{
    if (!o || !ck)
        return ts__fail(TS_EINVAL, "optim save_state: NULL argument");
    char v[64];
    ts_status s = ts_checkpoint_set_meta(ck, "optim.kind", kind_names[o->kind]);
    snprintf(v, sizeof v, "%lld", (long long)o->steps);
    if (s == TS_OK)
        s = ts_checkpoint_set_meta(ck, "optim.steps", v);
    const double *hp;
    static const char *const sgd_keys[] = {"lr", "momentum", "dampening", "weight_decay"};
    static const char *const adam_keys[] = {"lr", "beta1", "beta2", "eps", "weight_decay"};
    double sgd_vals[4] = {o->sgd.lr, o->sgd.momentum, o->sgd.dampening, o->sgd.weight_decay};
    double adam_vals[5] = {o->adam.lr, o->adam.beta1, o->adam.beta2, o->adam.eps,
                           o->adam.weight_decay};
    int nk = o->kind == O_SGD ? 4 : 5;
    hp = o->kind == O_SGD ? sgd_vals : adam_vals;
    for (int k = 0; k < nk && s == TS_OK; k++) {
        char key[64];
        snprintf(key, sizeof key, "optim.%s", o->kind == O_SGD ? sgd_keys[k] : adam_keys[k]);
        fmt_double(v, sizeof v, hp[k]);
        s = ts_checkpoint_set_meta(ck, key, v);
    }
    if (s == TS_OK && o->kind == O_SGD)
        s = ts_checkpoint_set_meta(ck, "optim.nesterov", o->sgd.nesterov ? "1" : "0");
    if (s == TS_OK && o->scheduled) {
        const ts_lr_schedule *sc = &o->sched;
        const char *keys[] = {"base_lr", "warmup_steps", "step_size", "gamma", "total_steps",
                              "min_lr"};
        double vals[] = {sc->base_lr, (double)sc->warmup_steps, (double)sc->step_size, sc->gamma,
                         (double)sc->total_steps, sc->min_lr};
        s = ts_checkpoint_set_meta(ck, "optim.schedule", lr_kind_names[sc->kind]);
        for (size_t k = 0; k < sizeof keys / sizeof keys[0] && s == TS_OK; k++) {
            char key[64];
            snprintf(key, sizeof key, "optim.schedule.%s", keys[k]);
            fmt_double(v, sizeof v, vals[k]);
            s = ts_checkpoint_set_meta(ck, key, v);
        }
    }
    for (size_t i = 0; i < o->n && s == TS_OK; i++) {
        if (!o->slots[i].own_decay)
            continue;
        char key[160];
        snprintf(key, sizeof key, "optim.%s.weight_decay", o->slots[i].name);
        fmt_double(v, sizeof v, o->slots[i].weight_decay);
        s = ts_checkpoint_set_meta(ck, key, v);
    }
    int kslot = o->kind == O_SGD ? 0 : 1, nstate = state_count(o->kind, &o->sgd);
    for (size_t i = 0; i < o->n && s == TS_OK; i++) {
        /* A parameter without state (no gradient has reached it yet) says so, so that a load
         * can tell it from a tensor missing from the file. */
        if (nstate && !o->slots[i].state[0]) {
            char key[160];
            snprintf(key, sizeof key, "optim.%s.state", o->slots[i].name);
            s = ts_checkpoint_set_meta(ck, key, "none");
            continue;
        }
        for (int k = 0; k < 2 && s == TS_OK; k++) {
            if (!o->slots[i].state[k])
                continue;
            char name[160];
            snprintf(name, sizeof name, "optim.%s.%s", o->slots[i].name, state_names[kslot][k]);
            s = ts_checkpoint_add(ck, name, o->slots[i].state[k]);
        }
    }
    return s;
}

#define CORRUPT_META(key, text, why)                                                        \
    ts__fail(TS_ECORRUPT, "optimizer state: metadata '%s' = '%s' %s", key, text, why)

/* A metadata number as the save writes it (%.17g): digits, sign, point and exponent only, so
 * no hex, "nan", "inf" or spaces; finite; within [lo, hi] (lo_open / hi_open: excluded). */
static ts_status meta_double(const ts_checkpoint *ck, const char *key, double lo, int lo_open,
                             double hi, int hi_open, const char *range, double *v)
{
    const char *t = ts_checkpoint_meta(ck, key);
    char *end;
    if (!t)
        return ts__fail(TS_ECORRUPT, "optimizer state: metadata '%s' is missing", key);
    if (!*t || strspn(t, "0123456789+-.eE") != strlen(t))
        return CORRUPT_META(key, t, "is not a decimal number");
    *v = strtod(t, &end);
    if (end == t || *end)
        return CORRUPT_META(key, t, "is not a number");
    if (!isfinite(*v) || *v < lo || (lo_open && *v == lo) || *v > hi || (hi_open && *v == hi))
        return ts__fail(TS_ECORRUPT, "optimizer state: metadata '%s' = '%s' is out of range: "
                        "need %s",
                        key, t, range);
    return TS_OK;
}

/* optim.steps: a decimal integer in [0, 2^53] (a count of updates, exact as a double). */
static ts_status meta_steps(const ts_checkpoint *ck, int64_t *steps)
{
    const char *key = "optim.steps", *t = ts_checkpoint_meta(ck, key);
    if (!t)
        return ts__fail(TS_ECORRUPT, "optimizer state: metadata '%s' is missing", key);
    size_t n = strlen(t);
    if (n == 0 || strspn(t, "0123456789") != n)
        return CORRUPT_META(key, t, "is not a non-negative decimal integer");
    if (n > 16)
        return CORRUPT_META(key, t, "is out of range: at most 2^53 steps");
    int64_t v = 0;
    for (size_t i = 0; i < n; i++)
        v = v * 10 + (t[i] - '0');
    if (v > (int64_t)1 << 53)
        return CORRUPT_META(key, t, "is out of range: at most 2^53 steps");
    *steps = v;
    return TS_OK;
}

/* The hyper-parameters in ck, checked as the constructors check them, into *sgd / *adam. */
static ts_status load_hyper(const ts_optim *o, const ts_checkpoint *ck, ts_sgd_options *sgd,
                            ts_adam_options *adam)
{
    ts_status s;
    const double big = INFINITY;
    if (o->kind == O_SGD) {
        double nest = 0;
        *sgd = o->sgd;
        if ((s = meta_double(ck, "optim.lr", 0, 0, big, 1, "a finite lr >= 0", &sgd->lr)) ||
            (s = meta_double(ck, "optim.momentum", 0, 0, big, 1, "a finite momentum >= 0",
                             &sgd->momentum)) ||
            (s = meta_double(ck, "optim.dampening", 0, 0, 1, 0, "dampening in [0, 1]",
                             &sgd->dampening)) ||
            (s = meta_double(ck, "optim.weight_decay", 0, 0, big, 1,
                             "a finite weight_decay >= 0", &sgd->weight_decay)) ||
            (s = meta_double(ck, "optim.nesterov", 0, 0, 1, 0, "0 or 1", &nest)))
            return s;
        if (nest != 0 && nest != 1)
            return CORRUPT_META("optim.nesterov", ts_checkpoint_meta(ck, "optim.nesterov"),
                                "is out of range: need 0 or 1");
        sgd->nesterov = nest != 0;
        if (sgd->nesterov && (sgd->momentum <= 0 || sgd->dampening != 0))
            return ts__fail(TS_ECORRUPT, "optimizer state: metadata 'optim.nesterov' = 1 needs "
                            "momentum > 0 and dampening 0");
        return TS_OK;
    }
    *adam = o->adam;
    if ((s = meta_double(ck, "optim.lr", 0, 0, big, 1, "a finite lr >= 0", &adam->lr)) ||
        (s = meta_double(ck, "optim.beta1", 0, 0, 1, 1, "beta1 in [0, 1)", &adam->beta1)) ||
        (s = meta_double(ck, "optim.beta2", 0, 0, 1, 1, "beta2 in [0, 1)", &adam->beta2)) ||
        (s = meta_double(ck, "optim.eps", 0, 1, big, 1, "a finite eps > 0", &adam->eps)) ||
        (s = meta_double(ck, "optim.weight_decay", 0, 0, big, 1, "a finite weight_decay >= 0",
                         &adam->weight_decay)))
        return s;
    return TS_OK;
}

/* The learning-rate schedule in ck (optim.schedule and its values), checked as
 * ts_optim_set_schedule checks one; *present 0 when the file has none (an optimizer without a
 * schedule, or a file from before schedules were saved). */
static ts_status load_schedule(const ts_checkpoint *ck, int *present, ts_lr_schedule *out)
{
    const char *kind = ts_checkpoint_meta(ck, "optim.schedule");
    *present = kind != NULL;
    if (!kind)
        return TS_OK;
    memset(out, 0, sizeof *out);
    int k = 0;
    while (k < 3 && strcmp(kind, lr_kind_names[k]) != 0)
        k++;
    if (k == 3)
        return CORRUPT_META("optim.schedule", kind, "is not constant, step or cosine");
    out->kind = k;
    const double two53 = 9007199254740992.0;
    double warm, size, total;
    ts_status s;
    if ((s = meta_double(ck, "optim.schedule.base_lr", 0, 0, INFINITY, 1, "a finite lr >= 0",
                         &out->base_lr)) ||
        (s = meta_double(ck, "optim.schedule.warmup_steps", 0, 0, two53, 0,
                         "a whole number in [0, 2^53]", &warm)) ||
        (s = meta_double(ck, "optim.schedule.step_size", 0, 0, two53, 0,
                         "a whole number in [0, 2^53]", &size)) ||
        (s = meta_double(ck, "optim.schedule.gamma", 0, 0, INFINITY, 1, "a finite gamma >= 0",
                         &out->gamma)) ||
        (s = meta_double(ck, "optim.schedule.total_steps", 0, 0, two53, 0,
                         "a whole number in [0, 2^53]", &total)) ||
        (s = meta_double(ck, "optim.schedule.min_lr", 0, 0, INFINITY, 1, "a finite lr >= 0",
                         &out->min_lr)))
        return s;
    if (warm != floor(warm) || size != floor(size) || total != floor(total))
        return ts__fail(TS_ECORRUPT, "optimizer state: the schedule's step counts (%g, %g, %g) "
                        "are not whole numbers", warm, size, total);
    out->warmup_steps = (int64_t)warm;
    out->step_size = (int64_t)size;
    out->total_steps = (int64_t)total;
    return check_schedule(out, TS_ECORRUPT, "optimizer state");
}

/* Which of slot sl's state tensors ck holds (present[k]), checked against the parameter and
 * against the "optim.<param>.state" = "none" marker the save writes for a parameter without
 * state. Nothing is read. */
static ts_status check_slot(const slot *sl, const ts_checkpoint *ck, int kslot, int nstate,
                            int64_t steps, int present[2])
{
    char key[160];
    snprintf(key, sizeof key, "optim.%s.state", sl->name);
    const char *marker = ts_checkpoint_meta(ck, key);
    if (marker && strcmp(marker, "none") != 0)
        return ts__fail(TS_ECORRUPT, "optimizer state: metadata '%s' = '%s': the only value "
                        "is 'none'", key, marker);
    int n = 0;
    for (int k = 0; k < nstate; k++) {
        char name[160];
        snprintf(name, sizeof name, "optim.%s.%s", sl->name, state_names[kslot][k]);
        int32_t dtype;
        int ndim;
        int64_t shape[TS_MAX_DIMS];
        present[k] = ts_checkpoint_tensor_info(ck, name, &dtype, &ndim, shape) == TS_OK;
        if (!present[k])
            continue;
        n++;
        char a[200], b[200], sh[160];
        snprintf(a, sizeof a, "%s%s", ts_dtype_name(dtype), ts__shape_str(ndim, shape, sh,
                                                                        sizeof sh));
        ts_tensor_describe(sl->param, b, sizeof b);
        int same = ndim == ts_tensor_ndim(sl->param);
        for (int d = 0; same && d < ndim; d++)
            same = shape[d] == ts_tensor_shape(sl->param)[d];
        if (dtype != ts_tensor_dtype(sl->param) || !same)
            return ts__fail(dtype != ts_tensor_dtype(sl->param) ? TS_EDTYPE : TS_ESHAPE,
                            "optimizer state: tensor '%s' is %s but parameter '%s' is %s", name,
                            a, sl->name, b);
    }
    for (int k = 0; k < nstate; k++) {
        if (present[k] && !marker)
            continue;
        char name[160];
        snprintf(name, sizeof name, "optim.%s.%s", sl->name, state_names[kslot][k]);
        if (present[k])
            return ts__fail(TS_ECORRUPT, "optimizer state: tensor '%s' is there but metadata "
                            "'%s' says the parameter has no state", name, key);
        /* A partial set, or none after steps were taken without the marker, is a file that
         * lost tensors: continuing from zeros would silently change the training. */
        if (n > 0 || (steps > 0 && !marker))
            return ts__fail(TS_ECORRUPT, "optimizer state: tensor '%s' is missing (%lld steps "
                            "were taken; a parameter no gradient reached is marked '%s' = "
                            "'none')",
                            name, (long long)steps, key);
    }
    return TS_OK;
}

/* A restored state tensor must be one a run could have written: finite, >= 0 for a second
 * moment (a mean of squares), and all zero when no step was taken (state is only ever written
 * by a step). Read on the host once, at load. */
static ts_status check_state(const ts_tensor *t, const char *name, int64_t steps, int nonneg)
{
    int32_t dt = ts_tensor_dtype(t);
    size_t n = (size_t)ts_tensor_numel(t);
    size_t es = dt == TS_F64 ? sizeof(double) : dt == TS_F32 ? sizeof(float) : 0;
    if (!es || !n)
        return TS_OK;
    void *buf = ts__malloc(n * es);
    if (!buf)
        return ts__fail(TS_ENOMEM, "optimizer state: out of host memory checking '%s'", name);
    ts_status s = ts_tensor_to_host(t, buf, n * es);
    for (size_t i = 0; i < n && s == TS_OK; i++) {
        double v = es == sizeof(double) ? ((double *)buf)[i] : ((float *)buf)[i];
        if (!isfinite(v))
            s = ts__fail(TS_ECORRUPT, "optimizer state: tensor '%s' holds a value that is not "
                         "finite (NaN or infinite) at element %zu", name, i);
        else if (nonneg && v < 0)
            s = ts__fail(TS_ECORRUPT, "optimizer state: tensor '%s' holds %g at element %zu, "
                         "but a second moment is a mean of squares, never negative", name, v, i);
        else if (steps == 0 && v != 0)
            s = ts__fail(TS_ECORRUPT, "optimizer state: tensor '%s' holds %g at element %zu, "
                         "but metadata 'optim.steps' = 0 says no step wrote it", name, v, i);
    }
    free(buf);
    return s;
}

TS_API ts_status ts_optim_load_state(ts_optim *o, const ts_checkpoint *ck)
{
    if (!o || !ck)
        return ts__fail(TS_EINVAL, "optim load_state: NULL argument");
    const char *kind = ts_checkpoint_meta(ck, "optim.kind");
    if (!kind || strcmp(kind, kind_names[o->kind]) != 0)
        return ts__fail(TS_EINVAL, "optimizer state is for '%s', this optimizer is '%s'",
                        kind ? kind : "(none)", kind_names[o->kind]);
    /* Everything is checked first and the new state built aside, so a refused or failed load
     * leaves the optimizer as it was. Hyper-parameters come back too: a resumed run continues
     * exactly. */
    int64_t steps = 0;
    ts_sgd_options sgd;
    ts_adam_options adam;
    ts_status s;
    ts_lr_schedule sched;
    int scheduled = 0;
    if ((s = meta_steps(ck, &steps)) || (s = load_hyper(o, ck, &sgd, &adam)) ||
        (s = load_schedule(ck, &scheduled, &sched)))
        return s;
    /* Parameter groups: a weight decay of a parameter's own. */
    double *decay = ts__calloc(o->n ? o->n : 1, sizeof *decay);
    int *own = ts__calloc(o->n ? o->n : 1, sizeof *own);
    if (!decay || !own) {
        free(decay);
        free(own);
        return ts__fail(TS_ENOMEM, "optimizer state: out of host memory");
    }
    for (size_t i = 0; i < o->n && s == TS_OK; i++) {
        char key[160];
        snprintf(key, sizeof key, "optim.%s.weight_decay", o->slots[i].name);
        if ((own[i] = ts_checkpoint_meta(ck, key) != NULL))
            s = meta_double(ck, key, 0, 0, INFINITY, 1, "a finite weight_decay >= 0", &decay[i]);
    }
    if (s) {
        free(decay);
        free(own);
        return s;
    }
    int kslot = o->kind == O_SGD ? 0 : 1, nstate = state_count(o->kind, &sgd);
    ts_tensor **fresh = ts__calloc(o->n ? 2 * o->n : 1, sizeof *fresh);
    if (!fresh) {
        free(decay);
        free(own);
        return ts__fail(TS_ENOMEM, "optimizer state: out of host memory");
    }
    for (size_t i = 0; i < o->n && s == TS_OK; i++) {
        int present[2] = {0, 0};
        s = check_slot(&o->slots[i], ck, kslot, nstate, steps, present);
        for (int k = 0; k < nstate && s == TS_OK; k++) {
            if (!present[k])
                continue;
            const ts_tensor *p = o->slots[i].param;
            char name[160];
            snprintf(name, sizeof name, "optim.%s.%s", o->slots[i].name, state_names[kslot][k]);
            s = ts_tensor_empty(ts_tensor_device(p), ts_tensor_dtype(p), ts_tensor_ndim(p),
                                ts_tensor_shape(p), &fresh[2 * i + k]);
            if (s == TS_OK)
                s = ts_checkpoint_restore(ck, name, fresh[2 * i + k]);
            if (s == TS_OK)
                s = check_state(fresh[2 * i + k], name, steps, kslot == 1 && k == 1);
        }
    }
    if (s == TS_OK) {
        for (size_t i = 0; i < o->n; i++)
            for (int k = 0; k < 2; k++) {
                ts_tensor_unref(o->slots[i].state[k]);
                o->slots[i].state[k] = fresh[2 * i + k];
                fresh[2 * i + k] = NULL;
            }
        if (o->kind == O_SGD)
            o->sgd = sgd;
        else
            o->adam = adam;
        o->steps = steps;
        o->scheduled = scheduled;
        if (scheduled)
            o->sched = sched;
        for (size_t i = 0; i < o->n; i++) {
            o->slots[i].own_decay = own[i];
            o->slots[i].weight_decay = own[i] ? decay[i] : 0;
        }
    }
    free(decay);
    free(own);
    for (size_t i = 0; i < 2 * o->n; i++)
        ts_tensor_unref(fresh[i]);
    free(fresh);
    return s;
}
