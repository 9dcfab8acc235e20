/* core/scope.c: scoped tensors (tessera/scope.h). Each thread has a stack of scopes; a scope
 * is a list of the tensors made in it and a sticky status. The lists keep their memory when
 * a scope ends, so a steady step that opens the same scopes allocates nothing; a thread's
 * stack is freed when the thread exits. */
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define MAX_DEPTH 64

struct ts_scope {
    ts_tensor **items;
    size_t n, cap;
    ts_status status;
    char msg[600]; /* the first failure's message */
};

typedef struct scope_stack {
    struct ts_scope s[MAX_DEPTH];
    int depth;
} scope_stack;

static _Thread_local scope_stack *stack;
static pthread_key_t stack_key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;

/* At thread exit: the tensors of scopes left open are released, then the lists. */
static void stack_free(void *p)
{
    scope_stack *st = p;
    if (!st)
        return;
    while (st->depth > 0) {
        ts_scope *sc = &st->s[--st->depth];
        while (sc->n)
            ts_tensor_unref(sc->items[--sc->n]);
    }
    for (int i = 0; i < MAX_DEPTH; i++)
        free(st->s[i].items);
    free(st);
    stack = NULL;
}

static void key_make(void)
{
    pthread_key_create(&stack_key, stack_free);
}

static scope_stack *this_stack(void)
{
    if (!stack) {
        pthread_once(&key_once, key_make);
        stack = calloc(1, sizeof *stack);
        if (stack)
            pthread_setspecific(stack_key, stack);
    }
    return stack;
}

static ts_scope *top(void)
{
    return stack && stack->depth ? &stack->s[stack->depth - 1] : NULL;
}

/* Records the first failure of sc with the current message. */
static void record(ts_scope *sc, ts_status s)
{
    if (sc->status)
        return;
    sc->status = s;
    snprintf(sc->msg, sizeof sc->msg, "%s", ts_last_error());
}

TS_API ts_scope *ts_scope_begin(void)
{
    scope_stack *st = this_stack();
    if (!st || st->depth == MAX_DEPTH) {
        ts_status s = ts__fail(st ? TS_ESTATE : TS_ENOMEM,
                               st ? "ts_scope_begin: %d scopes are open on this thread: end one "
                                    "first"
                                  : "ts_scope_begin: out of host memory",
                               MAX_DEPTH);
        if (st) /* what was to run in the new scope must not run in the one below */
            record(&st->s[MAX_DEPTH - 1], s);
        return NULL;
    }
    ts_scope *sc = &st->s[st->depth++];
    sc->n = 0;
    sc->status = TS_OK;
    sc->msg[0] = 0;
    return sc;
}

TS_API ts_status ts_scope_status(const ts_scope *sc)
{
    return sc ? sc->status : TS_ESTATE;
}

TS_API ts_status ts_scope_end(ts_scope *sc)
{
    if (!sc)
        return ts__fail(TS_ESTATE, "ts_scope_end: no scope (ts_scope_begin failed: %s)",
                        ts_last_error());
    scope_stack *st = stack;
    int at = st ? (int)(sc - st->s) : -1;
    if (at < 0 || at >= (st ? st->depth : 0))
        return ts__fail(TS_ESTATE, "ts_scope_end: the scope is not open on this thread");
    ts_status s = TS_OK;
    char msg[sizeof sc->msg];
    msg[0] = 0;
    while (st->depth > at) { /* inner ones first */
        ts_scope *in = &st->s[--st->depth];
        while (in->n)
            ts_tensor_unref(in->items[--in->n]);
        if (in->status) { /* the outermost failure among them wins: the earliest recorded */
            s = in->status;
            memcpy(msg, in->msg, sizeof msg);
        }
    }
    return s ? ts__fail(s, "%s", msg) : TS_OK;
}

TS_API ts_tensor *ts_scope_keep(ts_tensor *t)
{
    return t ? ts_tensor_ref(t) : NULL;
}

TS_API ts_tensor *ts_scope_adopt(ts_status status, ts_tensor **tp)
{
    ts_tensor *t = tp ? *tp : NULL;
    if (tp)
        *tp = NULL;
    ts_scope *sc = top();
    if (!sc) {
        ts_tensor_unref(t);
        ts__fail(TS_ESTATE, "a scoped call outside any scope: call ts_scope_begin first");
        return NULL;
    }
    if (!status && !tp)
        return NULL; /* a call that makes no tensor, and succeeded */
    if (status || !t) {
        ts_tensor_unref(t);
        record(sc, status ? status
                          : ts__fail(TS_EINVAL, "ts_scope_adopt: the call succeeded but made no "
                                     "tensor (pass NULL for a call that makes none)"));
        return NULL;
    }
    if (sc->n == sc->cap) {
        size_t cap = sc->cap ? 2 * sc->cap : 32;
        ts_tensor **items = realloc(sc->items, cap * sizeof *items);
        if (!items) {
            ts_tensor_unref(t);
            ts__fail(TS_ENOMEM, "out of host memory for a scope's list of tensors");
            record(sc, TS_ENOMEM);
            return NULL;
        }
        sc->items = items;
        sc->cap = cap;
    }
    sc->items[sc->n++] = t;
    return t;
}

TS_API ts_status ts_scope_return(ts_scope *sc, ts_tensor *r, ts_tensor **out)
{
    if (out)
        *out = NULL;
    if (!out) {
        ts_scope_end(sc);
        return ts__fail(TS_EINVAL, "ts_scope_return: out is NULL");
    }
    ts_tensor *kept = sc && !sc->status && r ? ts_tensor_ref(r) : NULL;
    if (sc && !sc->status && !r)
        record(sc, ts__fail(TS_EINVAL, "ts_scope_return: the result is NULL"));
    ts_status s = ts_scope_end(sc);
    if (s) {
        ts_tensor_unref(kept);
        return s;
    }
    *out = kept;
    return TS_OK;
}

/* Whether a scoped op may run: a scope is open and has not failed, and no input is NULL (a
 * NULL input that is not an earlier failure's is recorded as one). */
static int may_run(const char *fn, int n, ...)
{
    ts_scope *sc = top();
    if (!sc) {
        ts__fail(TS_ESTATE, "%s outside any scope: call ts_scope_begin first", fn);
        return 0;
    }
    if (sc->status)
        return 0;
    va_list ap;
    va_start(ap, n);
    int ok = 1;
    for (int i = 0; i < n && ok; i++)
        ok = va_arg(ap, const ts_tensor *) != NULL;
    va_end(ap);
    if (!ok)
        record(sc, ts__fail(TS_EINVAL, "%s: an input is NULL", fn));
    return ok;
}

#define RUN(call) ts_tensor *o_ = NULL; return ts_scope_adopt(call, &o_)
#define IN1(a) if (!may_run(__func__, 1, a)) return NULL
#define IN2(a, b) if (!may_run(__func__, 2, a, b)) return NULL
#define IN3(a, b, c) if (!may_run(__func__, 3, a, b, c)) return NULL

/* clang-format off */
TS_API ts_tensor *ts_s_add(const ts_tensor *a, const ts_tensor *b) { IN2(a, b); RUN(ts_add(a, b, &o_)); }
TS_API ts_tensor *ts_s_sub(const ts_tensor *a, const ts_tensor *b) { IN2(a, b); RUN(ts_sub(a, b, &o_)); }
TS_API ts_tensor *ts_s_mul(const ts_tensor *a, const ts_tensor *b) { IN2(a, b); RUN(ts_mul(a, b, &o_)); }
TS_API ts_tensor *ts_s_div(const ts_tensor *a, const ts_tensor *b) { IN2(a, b); RUN(ts_div(a, b, &o_)); }
TS_API ts_tensor *ts_s_pow(const ts_tensor *a, const ts_tensor *b) { IN2(a, b); RUN(ts_pow(a, b, &o_)); }
TS_API ts_tensor *ts_s_add_scalar(const ts_tensor *x, double s) { IN1(x); RUN(ts_add_scalar(x, s, &o_)); }
TS_API ts_tensor *ts_s_mul_scalar(const ts_tensor *x, double s) { IN1(x); RUN(ts_mul_scalar(x, s, &o_)); }
TS_API ts_tensor *ts_s_pow_scalar(const ts_tensor *x, double s) { IN1(x); RUN(ts_pow_scalar(x, s, &o_)); }
TS_API ts_tensor *ts_s_neg(const ts_tensor *x) { IN1(x); RUN(ts_neg(x, &o_)); }
TS_API ts_tensor *ts_s_abs(const ts_tensor *x) { IN1(x); RUN(ts_abs(x, &o_)); }
TS_API ts_tensor *ts_s_exp(const ts_tensor *x) { IN1(x); RUN(ts_exp(x, &o_)); }
TS_API ts_tensor *ts_s_log(const ts_tensor *x) { IN1(x); RUN(ts_log(x, &o_)); }
TS_API ts_tensor *ts_s_sqrt(const ts_tensor *x) { IN1(x); RUN(ts_sqrt(x, &o_)); }
TS_API ts_tensor *ts_s_rsqrt(const ts_tensor *x) { IN1(x); RUN(ts_rsqrt(x, &o_)); }
TS_API ts_tensor *ts_s_tanh(const ts_tensor *x) { IN1(x); RUN(ts_tanh(x, &o_)); }
TS_API ts_tensor *ts_s_sigmoid(const ts_tensor *x) { IN1(x); RUN(ts_sigmoid(x, &o_)); }
TS_API ts_tensor *ts_s_relu(const ts_tensor *x) { IN1(x); RUN(ts_relu(x, &o_)); }
TS_API ts_tensor *ts_s_gelu_tanh(const ts_tensor *x) { IN1(x); RUN(ts_gelu_tanh(x, &o_)); }
TS_API ts_tensor *ts_s_silu(const ts_tensor *x) { IN1(x); RUN(ts_silu(x, &o_)); }
TS_API ts_tensor *ts_s_unary(int fn, const ts_tensor *x) { IN1(x); RUN(ts_unary(fn, x, &o_)); }
TS_API ts_tensor *ts_s_binary_scalar(int fn, const ts_tensor *x, double s, int first) { IN1(x); RUN(ts_binary_scalar(fn, x, s, first, &o_)); }
TS_API ts_tensor *ts_s_sum(const ts_tensor *x, int nd, const int *dims, int keep) { IN1(x); RUN(ts_sum(x, nd, dims, keep, &o_)); }
TS_API ts_tensor *ts_s_mean(const ts_tensor *x, int nd, const int *dims, int keep) { IN1(x); RUN(ts_mean(x, nd, dims, keep, &o_)); }
TS_API ts_tensor *ts_s_matmul(const ts_tensor *a, const ts_tensor *b) { IN2(a, b); RUN(ts_matmul(a, b, &o_)); }
TS_API ts_tensor *ts_s_softmax(const ts_tensor *x, int dim) { IN1(x); RUN(ts_softmax(x, dim, &o_)); }
TS_API ts_tensor *ts_s_attention(const ts_tensor *q, const ts_tensor *k, const ts_tensor *v, int c, double sc) { IN3(q, k, v); RUN(ts_attention(q, k, v, c, sc, &o_)); }
TS_API ts_tensor *ts_s_log_softmax(const ts_tensor *x, int dim) { IN1(x); RUN(ts_log_softmax(x, dim, &o_)); }
TS_API ts_tensor *ts_s_embedding(const ts_tensor *w, const ts_tensor *i) { IN2(w, i); RUN(ts_embedding(w, i, &o_)); }
TS_API ts_tensor *ts_s_layer_norm(const ts_tensor *x, const ts_tensor *w, const ts_tensor *b, int nd, double eps) { IN1(x); RUN(ts_layer_norm(x, w, b, nd, eps, &o_)); }
TS_API ts_tensor *ts_s_rms_norm(const ts_tensor *x, const ts_tensor *w, int nd, double eps) { IN1(x); RUN(ts_rms_norm(x, w, nd, eps, &o_)); }
TS_API ts_tensor *ts_s_cross_entropy(const ts_tensor *l, const ts_tensor *t, int r) { IN2(l, t); RUN(ts_cross_entropy(l, t, r, &o_)); }
TS_API ts_tensor *ts_s_mse_loss(const ts_tensor *i, const ts_tensor *t, int r) { IN2(i, t); RUN(ts_mse_loss(i, t, r, &o_)); }
TS_API ts_tensor *ts_s_view(ts_tensor *t, int nd, const int64_t *shape) { IN1(t); RUN(ts_tensor_view(t, nd, shape, &o_)); }
TS_API ts_tensor *ts_s_reshape(ts_tensor *t, int nd, const int64_t *shape) { IN1(t); RUN(ts_tensor_reshape(t, nd, shape, &o_)); }
TS_API ts_tensor *ts_s_narrow(ts_tensor *t, int dim, int64_t start, int64_t len) { IN1(t); RUN(ts_tensor_narrow(t, dim, start, len, &o_)); }
TS_API ts_tensor *ts_s_transpose(ts_tensor *t, int d0, int d1) { IN1(t); RUN(ts_tensor_transpose(t, d0, d1, &o_)); }
TS_API ts_tensor *ts_s_permute(ts_tensor *t, const int *dims) { IN1(t); RUN(ts_tensor_permute(t, dims, &o_)); }
TS_API ts_tensor *ts_s_contiguous(ts_tensor *t) { IN1(t); RUN(ts_tensor_contiguous(t, &o_)); }
TS_API ts_tensor *ts_s_unsqueeze(ts_tensor *t, int dim) { IN1(t); RUN(ts_tensor_unsqueeze(t, dim, &o_)); }
TS_API ts_tensor *ts_s_expand(ts_tensor *t, int nd, const int64_t *shape) { IN1(t); RUN(ts_tensor_expand(t, nd, shape, &o_)); }
TS_API ts_tensor *ts_s_forward(ts_module *m, ts_tensor *x) { IN1(x); RUN(ts_module_forward(m, x, &o_)); }
/* clang-format on */

/* An in-place op: its target, or NULL with the failure recorded. */
static ts_tensor *in_place(ts_status s, ts_tensor *target)
{
    ts_scope_adopt(s, NULL);
    return s ? NULL : target;
}

TS_API ts_tensor *ts_s_copy_(ts_tensor *dst, const ts_tensor *src)
{
    IN2(dst, src);
    return in_place(ts_copy_(dst, src), dst);
}

TS_API ts_tensor *ts_s_add_(ts_tensor *a, const ts_tensor *b)
{
    IN2(a, b);
    return in_place(ts_add_(a, b), a);
}

TS_API ts_tensor *ts_s_sub_(ts_tensor *a, const ts_tensor *b)
{
    IN2(a, b);
    return in_place(ts_sub_(a, b), a);
}

TS_API ts_tensor *ts_s_mul_scalar_(ts_tensor *x, double s)
{
    IN1(x);
    return in_place(ts_mul_scalar_(x, s), x);
}

TS_API ts_tensor *ts_s_cast(const ts_tensor *x, int32_t dtype)
{
    IN1(x);
    if (ts_tensor_dtype(x) == dtype)
    {
        ts_tensor *same = ts_tensor_ref((ts_tensor *)x);
        return ts_scope_adopt(TS_OK, &same);
    }
    RUN(ts_cast(x, dtype, &o_));
}
