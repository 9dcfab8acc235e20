/* core/autograd.c: the graph and the engine: grad mode, recycled nodes with strong one-way
 * edges (released iteratively, so a 100,000-node chain cannot overflow the stack), recording,
 * backward in reverse topological order with in-place-modification checks, hooks, and
 * gradient checkpointing. The per-op backward formulas live beside each op's front end
 * (core/op_*.c, view.c, losses.c; grad_fns.c for the elementwise ops). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grad_fns.h"
#include "internal.h"

/* ---- grad mode ------------------------------------------------------------------------- */

/* A small stack of explicit modes (backward pushes "off", checkpoint recompute "on") over a
 * count of no_grad scopes. */
static _Thread_local int no_grad_depth;
static _Thread_local int mode_stack[16];
static _Thread_local int mode_depth;

TS_API void ts_no_grad_enter(void)
{
    no_grad_depth++;
}

TS_API void ts_no_grad_exit(void)
{
    if (no_grad_depth > 0)
        no_grad_depth--;
}

TS_API int ts_grad_enabled(void)
{
    if (mode_depth > 0)
        return mode_stack[mode_depth - 1] && no_grad_depth == 0;
    return no_grad_depth == 0;
}

void ts__grad_push(int enabled)
{
    TS_ASSERT(mode_depth < 16);
    mode_stack[mode_depth++] = enabled;
}

void ts__grad_pop(void)
{
    TS_ASSERT(mode_depth > 0);
    mode_depth--;
}

/* ---- nodes ----------------------------------------------------------------------------- */

/* Recycled nodes hide use-after-free from AddressSanitizer: recycle none under it. */
#if defined(__SANITIZE_ADDRESS__)
#define NODE_FREELIST_CAP 0
#else
#define NODE_FREELIST_CAP 8192
#endif

static pthread_mutex_t node_lock = PTHREAD_MUTEX_INITIALIZER;
static ts_node *node_free; /* linked through next[0] */
static size_t node_nfree;
static _Atomic uint64_t live_nodes;

TS_API uint64_t ts_autograd_live_nodes(void)
{
    return atomic_load(&live_nodes);
}

static ts_node *node_new(void)
{
    pthread_mutex_lock(&node_lock);
    ts_node *n = node_free;
    if (n) {
        node_free = n->next[0];
        node_nfree--;
    }
    pthread_mutex_unlock(&node_lock);
    if (!n)
        n = ts__malloc(sizeof *n);
    if (!n)
        return NULL;
    memset(n, 0, sizeof *n);
    atomic_init(&n->refcount, 1);
    atomic_fetch_add(&live_nodes, 1);
    return n;
}

__attribute__((destructor)) static void drain_nodes(void)
{
    pthread_mutex_lock(&node_lock);
    while (node_free) {
        ts_node *n = node_free;
        node_free = n->next[0];
        free(n);
    }
    node_nfree = 0;
    pthread_mutex_unlock(&node_lock);
}

/* Drops what a node owns except its edges to other nodes, which it moves to *pending. */
static void node_clear(ts_node *n)
{
    for (int i = 0; i < n->nsaved; i++) {
        ts_tensor_unref(n->saved[i]);
        n->saved[i] = NULL;
    }
    n->nsaved = 0;
    for (int i = 0; i < n->nin; i++) {
        ts_tensor_unref(n->leaf[i]);
        n->leaf[i] = NULL;
    }
    ts_tensor_unref(n->gacc);
    n->gacc = NULL;
}


/* Releases a node whose count reached zero, and every upstream node that dies with it,
 * with an explicit worklist instead of recursion. */
void ts__node_unref(ts_node *n)
{
    if (!n || atomic_fetch_sub_explicit(&n->refcount, 1, memory_order_acq_rel) != 1)
        return;
    ts_node *work = n; /* dead nodes, linked through p.i[0] while waiting */
    n->p.i[0] = 0;
    while (work) {
        ts_node *d = work;
        work = (ts_node *)(intptr_t)d->p.i[0];
        node_clear(d);
        for (int i = 0; i < d->nin; i++) {
            ts_node *up = d->next[i];
            d->next[i] = NULL;
            if (up && atomic_fetch_sub_explicit(&up->refcount, 1, memory_order_acq_rel) == 1) {
                up->p.i[0] = (int64_t)(intptr_t)work;
                work = up;
            }
        }
        atomic_fetch_sub(&live_nodes, 1);
        pthread_mutex_lock(&node_lock);
        if (node_nfree < NODE_FREELIST_CAP) {
            d->next[0] = node_free;
            node_free = d;
            node_nfree++;
            d = NULL;
        }
        pthread_mutex_unlock(&node_lock);
        free(d);
    }
}

/* ---- per-tensor state ------------------------------------------------------------------ */

TS_API ts_status ts_tensor_set_requires_grad(ts_tensor *t, int requires_grad)
{
    if (!t)
        return ts__fail(TS_EINVAL, "set_requires_grad: tensor is NULL");
    if (t->grad_fn)
        return ts__fail(TS_ESTATE, "set_requires_grad: the tensor was made by '%s' and is not "
                        "a leaf; use ts_tensor_detach to get one",
                        t->grad_fn->name);
    if (requires_grad && !ts__dtype_is_float(t->dtype))
        return ts__fail(TS_EDTYPE, "set_requires_grad: %s tensors have no gradient; only "
                        "float32, float64, bfloat16 and float16", ts_dtype_name(t->dtype));
    t->requires_grad = requires_grad != 0;
    return TS_OK;
}

TS_API int ts_tensor_requires_grad(const ts_tensor *t)
{
    return t && t->requires_grad;
}

TS_API int ts_tensor_is_leaf(const ts_tensor *t)
{
    return t && !t->grad_fn;
}

TS_API ts_tensor *ts_tensor_grad(const ts_tensor *t)
{
    return t ? t->grad : NULL;
}

TS_API void ts_tensor_zero_grad(ts_tensor *t)
{
    if (t) {
        ts_tensor_unref(t->grad);
        t->grad = NULL;
    }
}

TS_API ts_status ts_tensor_set_grad(ts_tensor *t, ts_tensor *grad)
{
    if (!t)
        return ts__fail(TS_EINVAL, "set_grad: tensor is NULL");
    if (grad) {
        int same = grad->ndim == t->ndim && grad->dtype == t->dtype &&
                   grad->storage->dev == t->storage->dev;
        for (int d = 0; same && d < t->ndim; d++)
            same = grad->shape[d] == t->shape[d];
        if (!same) {
            char a[64], b[64];
            return ts__fail(TS_ESHAPE, "set_grad: gradient %s does not match the tensor %s",
                            ts_tensor_describe(grad, a, sizeof a), ts_tensor_describe(t, b, sizeof b));
        }
    }
    ts_tensor_ref(grad);
    ts_tensor_unref(t->grad);
    t->grad = grad;
    return TS_OK;
}

TS_API const char *ts_tensor_grad_fn_name(const ts_tensor *t)
{
    return t && t->grad_fn ? t->grad_fn->name : NULL;
}

TS_API ts_status ts_tensor_detach(ts_tensor *t, ts_tensor **out)
{
    if (!out)
        return ts__fail(TS_EINVAL, "detach: out is NULL");
    *out = NULL;
    if (!t)
        return ts__fail(TS_EINVAL, "detach: tensor is NULL");
    return ts__view(t, t->ndim, t->shape, t->strides, t->offset, out);
}

TS_API ts_status ts_tensor_register_hook(ts_tensor *t, ts_grad_hook fn, void *user)
{
    if (!t)
        return ts__fail(TS_EINVAL, "register_hook: tensor is NULL");
    if (!t->requires_grad)
        return ts__fail(TS_ESTATE, "register_hook: the tensor does not require grad, so no "
                        "gradient will reach the hook");
    if (t->grad_fn) {
        t->grad_fn->hook = fn;
        t->grad_fn->hook_user = user;
    } else {
        t->hook = fn;
        t->hook_user = user;
    }
    return TS_OK;
}

TS_API ts_status ts_tensor_register_post_accumulate_hook(ts_tensor *t, ts_grad_ready_hook fn,
                                                         void *user)
{
    if (!t)
        return ts__fail(TS_EINVAL, "register_post_accumulate_hook: tensor is NULL");
    if (!t->requires_grad || t->grad_fn)
        return ts__fail(TS_ESTATE, "register_post_accumulate_hook: the tensor is not a leaf "
                        "that requires grad (a parameter), so nothing accumulates into it");
    t->ready = fn;
    t->ready_user = user;
    return TS_OK;
}

/* ---- recording ------------------------------------------------------------------------- */

int ts__grad_needed(int n, const ts_tensor *const *in)
{
    if (!ts_grad_enabled())
        return 0;
    for (int i = 0; i < n; i++)
        if (in[i] && in[i]->requires_grad)
            return 1;
    return 0;
}

ts_status ts__check_inplace(const char *op, const ts_tensor *t)
{
    if (t->requires_grad && ts_grad_enabled())
        return ts__fail(TS_ESTATE,
                        "%s: writing in place into a tensor that requires grad would corrupt "
                        "its gradient; use the out-of-place form, or do it inside "
                        "ts_no_grad_enter()/ts_no_grad_exit() (as optimizers do)",
                        op);
    return TS_OK;
}

ts_status ts__record(const char *name, ts_backward_fn bw, ts_tensor *out, int nin,
                     const ts_tensor *const *in, int nsave, const ts_tensor *const *save,
                     const void *params, size_t params_size, ts_node **node)
{
    if (node)
        *node = NULL;
    if (!ts__grad_needed(nin, in) || !ts__dtype_is_float(out->dtype))
        return TS_OK;
    TS_ASSERT(nin <= TS_NODE_MAX_IN && nsave <= TS_NODE_MAX_SAVED);
    TS_ASSERT(params_size <= sizeof(((ts_node *)0)->p));
    ts_node *n = node_new();
    if (!n)
        return ts__fail(TS_ENOMEM, "%s: out of host memory recording the graph", name);
    n->name = name;
    n->backward = bw;
    n->nin = nin;
    for (int i = 0; i < nin; i++) {
        const ts_tensor *t = in[i];
        if (!t)
            continue;
        n->in_ndim[i] = t->ndim;
        memcpy(n->in_shape[i], t->shape, sizeof(int64_t) * (size_t)t->ndim);
        n->in_dtype[i] = t->dtype;
        n->in_device[i] = t->storage->dev;
        if (!t->requires_grad)
            continue;
        n->needs[i] = 1;
        if (t->grad_fn) {
            atomic_fetch_add(&t->grad_fn->refcount, 1);
            n->next[i] = t->grad_fn;
        } else {
            n->leaf[i] = ts_tensor_ref((ts_tensor *)t);
        }
    }
    ts_status s = TS_OK;
    for (int i = 0; i < nsave && s == TS_OK; i++) {
        /* A detached alias: the same storage, no grad_fn, so saving an op's own output
         * cannot make a cycle. */
        s = ts_tensor_detach((ts_tensor *)save[i], &n->saved[i]);
        if (s == TS_OK) {
            n->saved_version[i] = ts_tensor_version(save[i]);
            n->nsaved = i + 1;
        }
    }
    if (s) {
        ts__node_unref(n);
        return s;
    }
    if (params_size)
        memcpy(&n->p, params, params_size);
    TS_ASSERT(!out->grad_fn);
    out->grad_fn = n;
    out->requires_grad = 1;
    if (node)
        *node = n;
    return TS_OK;
}

/* ---- reductions to a shape ------------------------------------------------------------- */

ts_status ts__sum_to(const ts_tensor *g, int ndim, const int64_t *shape, ts_tensor **out)
{
    int lead = g->ndim - ndim;
    TS_ASSERT(lead >= 0);
    int dims[TS_MAX_DIMS], nd = 0;
    for (int d = 0; d < g->ndim; d++)
        if (d < lead || (shape[d - lead] == 1 && g->shape[d] != 1))
            dims[nd++] = d;
    if (nd == 0 && lead == 0)
        return ts_tensor_detach((ts_tensor *)g, out);
    ts_tensor *s;
    ts_status st = ts_sum(g, nd, dims, 1, &s);
    if (st)
        return st;
    st = ts_tensor_view(s, ndim, shape, out);
    ts_tensor_unref(s);
    return st;
}

/* ---- backward -------------------------------------------------------------------------- */

static _Atomic uint64_t epoch_counter = 1;

typedef struct vec {
    ts_node **v;
    size_t n, cap;
} vec;

static int vec_push(vec *a, ts_node *n)
{
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 256;
        ts_node **v = ts__realloc(a->v, cap * sizeof *v);
        if (!v)
            return 0;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = n;
    return 1;
}

/* Per-thread work arrays, one pair per nesting level (a checkpoint's backward runs inside
 * another), kept between calls so a steady step does not allocate them. */
#define MAX_NESTING 8
static _Thread_local vec visited_bufs[MAX_NESTING], ready_bufs[MAX_NESTING];
static _Thread_local int nesting;

/* Adds g into *acc (taking g when *acc is empty). (g: transfer full) */
static ts_status accumulate(ts_tensor **acc, ts_tensor *g)
{
    if (!*acc) {
        *acc = g;
        return TS_OK;
    }
    ts_tensor *sum;
    ts_status s = ts_add(*acc, g, &sum);
    ts_tensor_unref(g);
    if (s)
        return s;
    ts_tensor_unref(*acc);
    *acc = sum;
    return TS_OK;
}

/* Runs a gradient hook, which may change the gradient in place: on one that aliases nothing,
 * copied first when shared (an add hands its inputs the same values, a cast to the same
 * dtype or the root the caller's own tensor), so that the change reaches this gradient only.
 * (*g: transfer full; replaced by the copy) */
static ts_status run_hook(ts_grad_hook fn, void *user, ts_tensor **g)
{
    if (atomic_load(&(*g)->refcount) > 1 || atomic_load(&(*g)->storage->refcount) > 1) {
        ts_tensor *c = NULL;
        ts_status s = ts_tensor_clone(*g, &c);
        if (s)
            return s;
        ts_tensor_unref(*g);
        *g = c;
    }
    return fn(*g, user);
}

/* Accumulates g into a leaf's .grad, running its hook first. (g: transfer full) */
static ts_status accumulate_leaf(ts_tensor *leaf, ts_tensor *g)
{
    ts_status s = TS_OK;
    if (leaf->hook && (s = run_hook(leaf->hook, leaf->hook_user, &g))) {
        ts_tensor_unref(g);
        return s;
    }
    if (!leaf->grad) {
        /* Own a contiguous gradient that aliases nothing else: optimizers update it in place. */
        ts_tensor *c = NULL;
        if (ts_tensor_is_contiguous(g) && atomic_load(&g->storage->refcount) == 1 &&
            atomic_load(&g->refcount) == 1) {
            c = g;
            g = NULL;
        } else {
            s = ts_tensor_clone(g, &c);
        }
        ts_tensor_unref(g);
        if (s == TS_OK) {
            leaf->grad = c;
            ts_tensor_set_role(c, TS_ROLE_GRADIENT);
        }
        return s;
    }
    s = ts_add_(leaf->grad, g);
    ts_tensor_unref(g);
    return s;
}

static ts_status check_saved(const ts_node *n)
{
    for (int i = 0; i < n->nsaved; i++) {
        uint64_t v = ts_tensor_version(n->saved[i]);
        if (v != n->saved_version[i])
            return ts__fail(TS_ESTATE,
                            "backward: a tensor saved by '%s' was modified in place after it "
                            "was saved (version %llu, now %llu); compute it out of place or "
                            "clone it before the in-place op",
                            n->name, (unsigned long long)n->saved_version[i],
                            (unsigned long long)v);
    }
    return TS_OK;
}

static ts_status run_backward(ts_node *root, ts_tensor *gout, int retain, vec *visited,
                              vec *ready)
{
    uint64_t epoch = atomic_fetch_add(&epoch_counter, 1);
    visited->n = ready->n = 0;
    /* Count, for every reachable node, the edges into it from reachable nodes. */
    /* Every visited node is held for the whole walk: dropping edges below may release
     * nodes that are still listed here. */
    root->epoch = epoch;
    root->deps = 0;
    if (!vec_push(visited, root))
        return ts__fail(TS_ENOMEM, "backward: out of host memory");
    atomic_fetch_add(&root->refcount, 1);
    ts_status s = TS_OK;
    for (size_t k = 0; k < visited->n && s == TS_OK; k++) {
        ts_node *n = visited->v[k];
        if (n->released) {
            s = ts__fail(TS_ESTATE,
                         "backward: the graph through '%s' was already freed by an earlier "
                         "backward; pass retain_graph to back-propagate twice",
                         n->name);
            break;
        }
        for (int i = 0; i < n->nin && s == TS_OK; i++) {
            ts_node *up = n->next[i];
            ts_tensor *leaf = up ? NULL : n->leaf[i];
            if (leaf && n->needs[i] && leaf->ready) { /* one more gradient to arrive */
                if (leaf->pend_epoch != epoch) {
                    leaf->pend_epoch = epoch;
                    leaf->pending = 0;
                }
                leaf->pending++;
            }
            if (!up)
                continue;
            if (up->epoch != epoch) {
                up->epoch = epoch;
                up->deps = 0;
                if (!vec_push(visited, up)) {
                    s = ts__fail(TS_ENOMEM, "backward: out of host memory");
                    break;
                }
                atomic_fetch_add(&up->refcount, 1);
            }
            up->deps++;
        }
    }
    if (s == TS_OK) {
        root->gacc = ts_tensor_ref(gout);
        if (!vec_push(ready, root))
            s = ts__fail(TS_ENOMEM, "backward: out of host memory");
    }
    while (ready->n > 0 && s == TS_OK) {
        ts_node *n = ready->v[--ready->n];
        ts_tensor *g = n->gacc;
        n->gacc = NULL;
        ts_tensor *gin[TS_NODE_MAX_IN] = {NULL};
        if (n->hook)
            s = run_hook(n->hook, n->hook_user, &g);
        if (s == TS_OK)
            s = check_saved(n);
        /* A slice's gradient straight into the part of its input's gradient so far, when
         * that is this pass's own buffer: no zeroed whole per slice to be summed after. */
        ts_node *up0 = n->nin == 1 && n->needs[0] ? n->next[0] : NULL;
        if (s == TS_OK && up0 && up0->gacc && ts__view_backward_into(n, g, up0->gacc, &s)) {
            ts_tensor_unref(g);
            if (s == TS_OK && --up0->deps == 0 && !vec_push(ready, up0))
                s = ts__fail(TS_ENOMEM, "backward: out of host memory");
            if (!retain) {
                node_clear(n);
                n->released = 1;
            }
            continue;
        }
        if (s == TS_OK)
            s = n->backward(n, g, gin);
        ts_tensor_unref(g);
        for (int i = 0; i < n->nin; i++) {
            if (s == TS_OK && n->needs[i] && !gin[i])
                s = ts__fail(TS_ESTATE, "backward of '%s' gave no gradient for input %d",
                             n->name, i);
            if (s != TS_OK) {
                ts_tensor_unref(gin[i]);
                continue;
            }
            if (!gin[i])
                continue;
            if (n->next[i]) {
                ts_node *up = n->next[i];
                s = accumulate(&up->gacc, gin[i]);
                if (s == TS_OK && --up->deps == 0 && !vec_push(ready, up))
                    s = ts__fail(TS_ENOMEM, "backward: out of host memory");
            } else if (n->leaf[i]) {
                ts_tensor *leaf = n->leaf[i];
                s = accumulate_leaf(leaf, gin[i]);
                if (s == TS_OK && leaf->ready && leaf->pend_epoch == epoch &&
                    --leaf->pending == 0)
                    s = leaf->ready(leaf, leaf->ready_user);
            } else {
                ts_tensor_unref(gin[i]);
            }
        }
        if (!retain) {
            /* Free as we go: saved activations now, upstream nodes once unreferenced. */
            node_clear(n);
            n->released = 1;
        }
    }
    /* On an error, drop gradients still waiting in nodes that did not run. */
    for (size_t k = 0; k < visited->n; k++) {
        ts_tensor_unref(visited->v[k]->gacc);
        visited->v[k]->gacc = NULL;
    }
    if (s == TS_OK && !retain) {
        /* Edges of nodes that ran: drop them now that no one walks them again. */
        for (size_t k = 0; k < visited->n; k++) {
            ts_node *n = visited->v[k];
            if (!n->released)
                continue;
            for (int i = 0; i < n->nin; i++) {
                ts_node *up = n->next[i];
                n->next[i] = NULL;
                ts__node_unref(up);
            }
        }
    }
    for (size_t k = 0; k < visited->n; k++)
        ts__node_unref(visited->v[k]);
    visited->n = 0;
    return s;
}

static void note_work_arrays(void);

TS_API ts_status ts_backward(ts_tensor *loss, const ts_tensor *grad, int retain_graph)
{
    if (!loss)
        return ts__fail(TS_EINVAL, "backward: loss is NULL");
    if (!loss->requires_grad)
        return ts__fail(TS_ESTATE, "backward: the loss does not require grad: none of its "
                        "inputs requires grad, or it was computed under no_grad");
    char a[64], b[64];
    ts_tensor *g = NULL;
    ts_status s;
    if (grad) {
        int same = grad->ndim == loss->ndim && grad->dtype == loss->dtype &&
                   grad->storage->dev == loss->storage->dev;
        for (int d = 0; same && d < loss->ndim; d++)
            same = grad->shape[d] == loss->shape[d];
        if (!same)
            return ts__fail(TS_ESHAPE, "backward: gradient %s does not match the loss %s",
                            ts_tensor_describe(grad, a, sizeof a),
                            ts_tensor_describe(loss, b, sizeof b));
        g = ts_tensor_ref((ts_tensor *)grad);
    } else {
        if (ts_tensor_numel(loss) != 1)
            return ts__fail(TS_ESHAPE, "backward: the loss %s has more than one element; pass "
                            "its gradient",
                            ts_tensor_describe(loss, a, sizeof a));
        if ((s = ts_tensor_ones(loss->storage->dev, loss->dtype, loss->ndim, loss->shape, &g)))
            return s;
    }
    if (nesting >= MAX_NESTING) {
        ts_tensor_unref(g);
        return ts__fail(TS_ESTATE, "backward: nested %d deep (checkpoints inside checkpoints)",
                        nesting);
    }
    note_work_arrays();
    if ((s = ts__autocast_push(TS_F32))) { /* the backward ops run in their forward's dtypes */
        ts_tensor_unref(g);
        return s;
    }
    ts__grad_push(0);
    if (!loss->grad_fn) {
        s = accumulate_leaf(loss, g); /* a leaf loss: its own gradient */
    } else {
        int level = nesting++;
        s = run_backward(loss->grad_fn, g, retain_graph, &visited_bufs[level],
                         &ready_bufs[level]);
        nesting--;
        ts_tensor_unref(g);
    }
    ts__grad_pop();
    ts_autocast_end();
    return s;
}

/* The work arrays of a thread are freed when it exits (a key destructor) and the main
 * thread's at unload, so valgrind sees nothing left behind by a thread that trained. */
static pthread_key_t work_key;
static pthread_once_t work_once = PTHREAD_ONCE_INIT;

static void free_work_arrays(void *unused)
{
    (void)unused;
    for (int i = 0; i < MAX_NESTING; i++) {
        free(visited_bufs[i].v);
        free(ready_bufs[i].v);
        visited_bufs[i] = ready_bufs[i] = (vec){0};
    }
}

static void make_work_key(void)
{
    pthread_key_create(&work_key, free_work_arrays);
}

static void note_work_arrays(void)
{
    pthread_once(&work_once, make_work_key);
    if (!pthread_getspecific(work_key))
        pthread_setspecific(work_key, (void *)1);
}

__attribute__((destructor)) static void drain_work_arrays(void)
{
    free_work_arrays(NULL);
}

/* ---- checkpointing --------------------------------------------------------------------- */

static ts_status checkpoint_backward(ts_node *n, ts_tensor *gout, ts_tensor **gin)
{
    ts_tensor *d[TS_NODE_MAX_IN] = {NULL}, *out = NULL;
    ts_status s = TS_OK;
    for (int i = 0; i < n->nin && s == TS_OK; i++) {
        s = ts_tensor_detach(n->saved[i], &d[i]);
        if (s == TS_OK && n->needs[i])
            d[i]->requires_grad = 1;
    }
    if (s == TS_OK) {
        ts_rng *rng = n->p.seg.rng;
        uint64_t now = rng ? rng->offset : 0;
        if (rng) /* the forward's draws again (dropout's masks) */
            rng->offset = n->p.seg.offset;
        ts__grad_push(1); /* record the recomputation, in the forward's precision */
        if ((s = ts__autocast_push(n->p.seg.autocast)) == TS_OK) {
            s = n->p.seg.fn(n->p.seg.user, n->nin, d, &out);
            ts_autocast_end();
        }
        ts__grad_pop();
        if (rng)
            rng->offset = now;
    }
    if (s == TS_OK && out->requires_grad)
        s = ts_backward(out, gout, 0);
    for (int i = 0; i < n->nin; i++) {
        if (s == TS_OK && n->needs[i]) {
            gin[i] = d[i]->grad;
            d[i]->grad = NULL;
            if (!gin[i]) /* the segment did not use this input */
                s = ts_tensor_zeros(n->in_device[i], n->in_dtype[i], n->in_ndim[i],
                                    n->in_shape[i], &gin[i]);
        }
        ts_tensor_unref(d[i]);
    }
    ts_tensor_unref(out);
    return s;
}

static ts_status checkpoint(ts_segment_fn fn, void *user, ts_rng *rng, int nin,
                            ts_tensor *const *inputs, ts_tensor **out)
{
    if (!out)
        return ts__fail(TS_EINVAL, "checkpoint: out is NULL");
    *out = NULL;
    if (!fn || nin < 0 || nin > TS_NODE_MAX_IN || (nin && !inputs))
        return ts__fail(TS_EINVAL, "checkpoint: a segment function and 0 to %d inputs",
                        TS_NODE_MAX_IN);
    int record = ts_grad_enabled();
    const uint64_t offset = rng ? rng->offset : 0;
    ts__grad_push(0); /* keep nothing from inside the segment */
    ts_tensor *o = NULL;
    ts_status s = fn(user, nin, inputs, &o);
    ts__grad_pop();
    if (s)
        return s;
    if (record) {
        /* Weights captured in user may require grad even if no input does: always record. */
        ts_node *n = NULL;
        struct {
            ts_segment_fn fn;
            void *user;
            ts_rng *rng;
            uint64_t offset;
            int32_t autocast;
        } seg = {fn, user, rng, offset, ts_autocast_dtype()};
        int any = 0;
        for (int i = 0; i < nin; i++)
            any |= inputs[i]->requires_grad;
        if (!any && ts__dtype_is_float(o->dtype)) {
            /* No input requires grad: the node has no edges but still recomputes the
             * segment so captured weights get their gradients. */
            n = node_new();
            if (!n) {
                ts_tensor_unref(o);
                return ts__fail(TS_ENOMEM, "checkpoint: out of host memory");
            }
            n->name = "checkpoint";
            n->backward = checkpoint_backward;
            n->nin = nin;
            for (int i = 0; i < nin && s == TS_OK; i++) {
                n->in_ndim[i] = inputs[i]->ndim;
                memcpy(n->in_shape[i], inputs[i]->shape, sizeof(int64_t) * TS_MAX_DIMS);
                n->in_dtype[i] = inputs[i]->dtype;
                n->in_device[i] = inputs[i]->storage->dev;
                if ((s = ts_tensor_detach(inputs[i], &n->saved[i])) == TS_OK) {
                    n->saved_version[i] = ts_tensor_version(inputs[i]);
                    n->nsaved = i + 1;
                }
            }
            memcpy(&n->p, &seg, sizeof seg);
            o->grad_fn = n;
            o->requires_grad = 1;
        } else {
            s = ts__record("checkpoint", checkpoint_backward, o, nin,
                           (const ts_tensor *const *)inputs, nin,
                           (const ts_tensor *const *)inputs, &seg, sizeof seg, &n);
        }
        if (s) {
            ts_tensor_unref(o);
            return s;
        }
    }
    *out = o;
    return TS_OK;
}

TS_API ts_status ts_grad_checkpoint(ts_segment_fn fn, void *user, int nin,
                                    ts_tensor *const *inputs, ts_tensor **out)
{
    return checkpoint(fn, user, NULL, nin, inputs, out);
}

TS_API ts_status ts_grad_checkpoint_rng(ts_segment_fn fn, void *user, ts_rng *rng, int nin,
                                        ts_tensor *const *inputs, ts_tensor **out)
{
    return checkpoint(fn, user, rng, nin, inputs, out);
}
