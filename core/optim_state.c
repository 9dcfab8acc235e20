/* core/optim_state.c: an optimizer's state in checkpoints: its kind, hyperparameters, step
 * count and schedule as metadata, and each parameter's state tensors, checked on load (names,
 * shapes, finite and, where it must be, non-negative values) before anything is replaced. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optim_impl.h"

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
    if (!ts__zero_saveable(o))
        return ts__fail(TS_ESTATE, "optim save_state: the optimizer's state is sharded over the "
                        "ranks; call ts_optim_consolidate_state(opt, root) on every rank first, "
                        "then save on root (before the next step)");
    char v[64];
    ts_status s = ts_checkpoint_set_meta(ck, "optim.kind", ts__optim_kind_names[o->kind]);
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
        s = ts_checkpoint_set_meta(ck, "optim.schedule", ts__lr_kind_names[sc->kind]);
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
            snprintf(name, sizeof name, "optim.%s.%s", o->slots[i].name, ts__optim_state_names[kslot][k]);
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
    while (k < 3 && strcmp(kind, ts__lr_kind_names[k]) != 0)
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
    return ts__check_schedule(out, TS_ECORRUPT, "optimizer state");
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
        snprintf(name, sizeof name, "optim.%s.%s", sl->name, ts__optim_state_names[kslot][k]);
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
        snprintf(name, sizeof name, "optim.%s.%s", sl->name, ts__optim_state_names[kslot][k]);
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
    if (!kind || strcmp(kind, ts__optim_kind_names[o->kind]) != 0)
        return ts__fail(TS_EINVAL, "optimizer state is for '%s', this optimizer is '%s'",
                        kind ? kind : "(none)", ts__optim_kind_names[o->kind]);
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
            snprintf(name, sizeof name, "optim.%s.%s", o->slots[i].name, ts__optim_state_names[kslot][k]);
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
    if (s == TS_OK) /* sharded: this rank keeps its pieces of it */
        s = ts__zero_loaded(o);
    return s;
}
