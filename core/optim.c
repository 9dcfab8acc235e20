/* core/optim.c: SGD, Adam and AdamW. State (momentum buffers, moments) is created lazily on
 * each parameter's device; an update is one fused kernel when the plugin has it and the same
 * arithmetic composed from elementwise ops otherwise, always with grad mode off. Also
 * gradient clipping and learning-rate schedules. The state in checkpoints is
 * core/optim_state.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optim_impl.h"

const char *const ts__optim_kind_names[3] = {"sgd", "adam", "adamw"};



const char *const ts__optim_state_names[2][2] = {{"momentum_buffer", NULL},
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
        return ts__fail(TS_EINVAL, "%s: options are NULL", ts__optim_kind_names[kind]);
    if (!nonneg(opt->lr) || !(opt->beta1 >= 0 && opt->beta1 < 1) ||
        !(opt->beta2 >= 0 && opt->beta2 < 1) || !(opt->eps > 0 && isfinite(opt->eps)) ||
        !nonneg(opt->weight_decay))
        return ts__fail(TS_EINVAL, "%s: need finite values: lr %g >= 0, betas %g, %g in [0, 1), "
                        "eps %g > 0, weight_decay %g >= 0", ts__optim_kind_names[kind], opt->lr,
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
    ts__zero_free(o);
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

const char *const ts__lr_kind_names[3] = {"constant", "step", "cosine"};

/* The schedule's values checked, with a message naming the bad one. */
ts_status ts__check_schedule(const ts_lr_schedule *s, ts_status code, const char *who)
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
    ts_status s = ts__check_schedule(sch, TS_EINVAL, "optim set_schedule");
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
    return ts__optim_kind_names[o->kind];
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

/* p -= lr d, where d = g + wd p, through the momentum buffer: buf = momentum buf +
 * (1 - dampening) d (d itself at the first step), then d = buf, or d + momentum buf with
 * Nesterov. */
static ts_status sgd_composed(const ts_sgd_options *o, slot *sl, ts_tensor *g, int first)
{
    ts_scope *sc = ts_scope_begin();
    ts_tensor *d = g, *buf = sl->state[0];
    if (o->weight_decay != 0)
        d = ts_s_add(d, ts_s_mul_scalar(sl->param, o->weight_decay));
    if (o->momentum != 0) {
        if (first)
            ts_s_copy_(buf, d);
        else
            ts_s_add_(ts_s_mul_scalar_(buf, o->momentum), ts_s_mul_scalar(d, 1 - o->dampening));
        d = o->nesterov ? ts_s_add(d, ts_s_mul_scalar(buf, o->momentum)) : buf;
    }
    ts_s_sub_(sl->param, ts_s_mul_scalar(d, o->lr));
    return ts_scope_end(sc);
}

/* m = beta1 m + (1 - beta1) g; v = beta2 v + (1 - beta2) g^2;
 * p -= lr / (1 - beta1^t) m / (sqrt(v) / sqrt(1 - beta2^t) + eps), with weight decay added to
 * g (Adam) or taken from p first (AdamW, decoupled). */
static ts_status adam_composed(const ts_adam_options *o, int decoupled, int64_t step, slot *sl,
                               ts_tensor *g)
{
    ts_scope *sc = ts_scope_begin();
    ts_tensor *m = sl->state[0], *v = sl->state[1], *gw = g;
    if (decoupled)
        ts_s_mul_scalar_(sl->param, 1 - o->lr * o->weight_decay);
    else if (o->weight_decay != 0)
        gw = ts_s_add(gw, ts_s_mul_scalar(sl->param, o->weight_decay));
    ts_s_add_(ts_s_mul_scalar_(m, o->beta1), ts_s_mul_scalar(gw, 1 - o->beta1));
    ts_s_add_(ts_s_mul_scalar_(v, o->beta2), ts_s_mul_scalar(ts_s_mul(gw, gw), 1 - o->beta2));
    double inv_bc2 = 1 / sqrt(1 - pow(o->beta2, (double)step));
    double step_size = o->lr / (1 - pow(o->beta1, (double)step));
    ts_tensor *den = ts_s_add_scalar(ts_s_mul_scalar(ts_s_sqrt(v), inv_bc2), o->eps);
    ts_s_sub_(sl->param, ts_s_mul_scalar(ts_s_div(m, den), step_size));
    return ts_scope_end(sc);
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
        ts_tensor_set_role(sl->state[k], TS_ROLE_OPTIMIZER);
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
        ts__fail_prefix(s, "%s step of '%s': ", ts__optim_kind_names[o->kind], sl->name);
    return s;
}

TS_API ts_status ts_optim_step(ts_optim *o)
{
    if (!o)
        return ts__fail(TS_EINVAL, "optimizer step: optimizer is NULL");
    if (o->zero)
        return ts__zero_step(o);
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

/* The gradient of tensor i of a list: params[i].tensor's, or the i-th step tensor of an
 * optimizer. */
typedef struct grad_list {
    const ts_named_tensor *params;
    const ts_optim *opt;
    size_t n;
    int across; /* a sharded optimizer's pieces: the sum of squares is summed over the ranks */
} grad_list;

static ts_tensor *grad_at(const grad_list *l, size_t i)
{
    return ts_tensor_grad(l->params ? l->params[i].tensor : ts__optim_step_tensor(l->opt, i));
}

static ts_status clip(const grad_list *l, double max_norm, double *total_norm, const char *who)
{
    if (!(max_norm > 0))
        return ts__fail(TS_EINVAL, "%s: max_norm must be > 0, got %g", who, max_norm);
    double total = 0;
    ts_status s = TS_OK;
    ts_no_grad_enter();
    for (size_t i = 0; i < l->n && s == TS_OK; i++) {
        ts_tensor *g = grad_at(l, i), *sq = NULL, *sum = NULL, *d = NULL;
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
    if (s == TS_OK && l->across) /* every rank then decides alike */
        s = ts_dist_allreduce_sum(&total, 1, TS_F64);
    total = sqrt(total);
    if (s == TS_OK && !isfinite(total)) {
        ts_no_grad_exit();
        if (total_norm)
            *total_norm = total;
        return ts__fail(TS_EINVAL, "%s: the gradients' norm is %g: a gradient holds NaN or "
                        "infinity; nothing was scaled (lower the learning rate, or find the op "
                        "that overflows)", who, total);
    }
    if (s == TS_OK && total > max_norm) {
        double scale = max_norm / (total + 1e-6);
        for (size_t i = 0; i < l->n && s == TS_OK; i++) {
            ts_tensor *g = grad_at(l, i);
            if (g)
                s = ts_mul_scalar_(g, scale);
        }
    }
    ts_no_grad_exit();
    if (s == TS_OK && total_norm)
        *total_norm = total;
    return s;
}

TS_API ts_status ts_clip_grad_norm(const ts_named_tensor *params, size_t n, double max_norm,
                                   double *total_norm)
{
    if (n && !params)
        return ts__fail(TS_EINVAL, "clip_grad_norm: params is NULL");
    grad_list l = {params, NULL, n, 0};
    return clip(&l, max_norm, total_norm, "clip_grad_norm");
}

TS_API ts_status ts_optim_clip_grad_norm(ts_optim *o, double max_norm, double *total_norm)
{
    if (!o)
        return ts__fail(TS_EINVAL, "ts_optim_clip_grad_norm: optimizer is NULL");
    int sharded;
    size_t n = ts__optim_nstep(o, &sharded);
    grad_list l = {NULL, o, n, sharded};
    return clip(&l, max_norm, total_norm, "ts_optim_clip_grad_norm");
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

