/* core/view.c: views. Each builds new metadata over the same storage (one more reference on
 * it) and never touches device memory, except reshape/flatten, which copy when, and only
 * when, the strides cannot express the new shape. Their backward (one formula for every kind
 * of view) is at the end. */
#include <stdatomic.h>
#include <string.h>

#include "grad_fns.h"

/* Records the view for autograd once it exists; drops it if recording fails. */
static ts_status recorded(ts_status s, int kind, const ts_tensor *t, ts_tensor **out,
                          const int64_t *params, int nparams)
{
    if (s)
        return s;
    if ((s = ts__ag_view(kind, t, *out, params, nparams))) {
        ts_tensor_unref(*out);
        *out = NULL;
    }
    return s;
}

#define CHECK_ARGS(name)                                                                    \
    do {                                                                                    \
        if (!out)                                                                           \
            return ts__fail(TS_EINVAL, name ": out is NULL");                               \
        *out = NULL;                                                                        \
        if (!t)                                                                             \
            return ts__fail(TS_EINVAL, name ": tensor is NULL");                            \
    } while (0)

static ts_status bad_dim(const char *what, int dim, const ts_tensor *t)
{
    char b[160];
    return ts__fail(TS_EINVAL, "%s: dim %d is out of range for a %d-d tensor %s", what, dim,
                    t->ndim, ts__shape_str(t->ndim, t->shape, b, sizeof b));
}

/* Resolves one -1 in shape against numel; checks the count matches. */
static ts_status infer_shape(const char *what, const ts_tensor *t, int ndim, const int64_t *in,
                             int64_t *shape)
{
    char b1[160], b2[160];
    if (ndim < 0 || ndim > TS_MAX_DIMS || (ndim > 0 && !in))
        return ts__fail(TS_EINVAL, "%s: %d dims; tensors have 0 to %d", what, ndim, TS_MAX_DIMS);
    int64_t known = 1, numel = ts_tensor_numel(t);
    int infer = -1;
    for (int d = 0; d < ndim; d++) {
        shape[d] = in[d];
        if (in[d] == -1) {
            if (infer >= 0)
                return ts__fail(TS_EINVAL, "%s: only one size may be -1", what);
            infer = d;
            shape[d] = 1; /* bounded below with the others */
        } else if (in[d] < 0) {
            return ts__fail(TS_EINVAL, "%s: negative size in %s", what,
                            ts__shape_str(ndim, in, b1, sizeof b1));
        }
    }
    ts_status s = ts__shape_bound(what, ndim, shape, &known);
    if (s) {
        ts__fail(s, "%s: shape %s is too large: the product of its sizes (zeros left out) "
                 "exceeds 2^59 elements", what, ts__shape_str(ndim, in, b1, sizeof b1));
        return s;
    }
    if (infer >= 0) {
        if (known == 0 || numel % known)
            return ts__fail(TS_ESHAPE, "%s: cannot infer -1 in %s for %lld elements", what,
                            ts__shape_str(ndim, in, b1, sizeof b1), (long long)numel);
        shape[infer] = numel / known;
        known *= shape[infer];
    }
    if (known != numel)
        return ts__fail(TS_ESHAPE, "%s: shape %s has %lld elements, the tensor %s has %lld", what,
                        ts__shape_str(ndim, shape, b1, sizeof b1), (long long)known,
                        ts__shape_str(t->ndim, t->shape, b2, sizeof b2), (long long)numel);
    return TS_OK;
}

/* Strides that express t's elements in shape without a copy (the chunk rule: dims of t that
 * are contiguous with each other form chunks a new shape may split or merge), or 0 if none. */
static int view_strides(const ts_tensor *t, int ndim, const int64_t *shape, int64_t *strides)
{
    int64_t numel = ts_tensor_numel(t);
    if (numel == 0 || t->ndim == 0) {
        ts__contiguous_strides(ndim, shape, strides);
        return 1;
    }
    int vd = ndim - 1;
    int64_t chunk_stride = t->strides[t->ndim - 1];
    int64_t tensor_numel = 1, view_numel = 1;
    for (int td = t->ndim - 1; td >= 0; td--) {
        tensor_numel *= t->shape[td];
        if (td == 0 ||
            (t->shape[td - 1] != 1 && t->strides[td - 1] != tensor_numel * chunk_stride)) {
            while (vd >= 0 && (view_numel < tensor_numel || shape[vd] == 1)) {
                strides[vd] = view_numel * chunk_stride;
                view_numel *= shape[vd];
                vd--;
            }
            if (view_numel != tensor_numel)
                return 0;
            if (td > 0) {
                chunk_stride = t->strides[td - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    return vd == -1;
}

TS_API ts_status ts_tensor_view(ts_tensor *t, int ndim, const int64_t *in, ts_tensor **out)
{
    CHECK_ARGS("view");
    int64_t shape[TS_MAX_DIMS], strides[TS_MAX_DIMS];
    ts_status s = infer_shape("view", t, ndim, in, shape);
    if (s)
        return s;
    if (!view_strides(t, ndim, shape, strides)) {
        char b1[160], b2[160], b3[160];
        return ts__fail(TS_ESHAPE,
                        "view: a tensor %s with strides %s cannot be viewed as %s without a "
                        "copy; use ts_tensor_reshape (copies) or ts_tensor_contiguous first",
                        ts__shape_str(t->ndim, t->shape, b1, sizeof b1),
                        ts__shape_str(t->ndim, t->strides, b2, sizeof b2),
                        ts__shape_str(ndim, shape, b3, sizeof b3));
    }
    return recorded(ts__view(t, ndim, shape, strides, t->offset, out), TS__VIEW_RESHAPE, t, out,
                    NULL, 0);
}

TS_API ts_status ts_tensor_reshape(ts_tensor *t, int ndim, const int64_t *in, ts_tensor **out)
{
    CHECK_ARGS("reshape");
    int64_t shape[TS_MAX_DIMS], strides[TS_MAX_DIMS];
    ts_status s = infer_shape("reshape", t, ndim, in, shape);
    if (s)
        return s;
    if (view_strides(t, ndim, shape, strides))
        return recorded(ts__view(t, ndim, shape, strides, t->offset, out), TS__VIEW_RESHAPE, t,
                        out, NULL, 0);
    ts_tensor *c;
    if ((s = ts_tensor_clone(t, &c)))
        return s;
    ts__contiguous_strides(ndim, shape, strides);
    s = recorded(ts__view(c, ndim, shape, strides, c->offset, out), TS__VIEW_RESHAPE, c, out,
                 NULL, 0);
    ts_tensor_unref(c);
    return s;
}

TS_API ts_status ts_tensor_slice(ts_tensor *t, int dim, int64_t start, int64_t stop,
                                 int64_t step, ts_tensor **out)
{
    CHECK_ARGS("slice");
    int d = ts__dim(dim, t->ndim);
    if (d < 0 || t->ndim == 0)
        return bad_dim("slice", dim, t);
    if (step < 1)
        return ts__fail(TS_EINVAL, "slice: step must be >= 1, got %lld", (long long)step);
    int64_t n = t->shape[d];
    if (start < 0)
        start += n;
    if (stop < 0)
        stop += n;
    start = start < 0 ? 0 : start > n ? n : start;
    stop = stop < start ? start : stop > n ? n : stop;
    int64_t shape[TS_MAX_DIMS], strides[TS_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    memcpy(strides, t->strides, sizeof strides);
    shape[d] = (stop - start + step - 1) / step;
    strides[d] = t->strides[d] * step;
    const int64_t p[4] = {d, start, stop, step};
    return recorded(ts__view(t, t->ndim, shape, strides, t->offset + start * t->strides[d], out),
                    TS__VIEW_SLICE, t, out, p, 4);
}

TS_API ts_status ts_tensor_narrow(ts_tensor *t, int dim, int64_t start, int64_t length,
                                  ts_tensor **out)
{
    CHECK_ARGS("narrow");
    int d = ts__dim(dim, t->ndim);
    if (d < 0 || t->ndim == 0)
        return bad_dim("narrow", dim, t);
    if (start < 0 || length < 0 || start + length > t->shape[d])
        return ts__fail(TS_EINVAL, "narrow: [%lld, %lld) is outside dim %d of size %lld",
                        (long long)start, (long long)(start + length), d,
                        (long long)t->shape[d]);
    return ts_tensor_slice(t, d, start, start + length, 1, out);
}

TS_API ts_status ts_tensor_select(ts_tensor *t, int dim, int64_t index, ts_tensor **out)
{
    CHECK_ARGS("select");
    int d = ts__dim(dim, t->ndim);
    if (d < 0 || t->ndim == 0)
        return bad_dim("select", dim, t);
    int64_t n = t->shape[d];
    if (index < -n || index >= n)
        return ts__fail(TS_EINVAL, "select: index %lld is out of range for dim %d of size %lld",
                        (long long)index, d, (long long)n);
    if (index < 0)
        index += n;
    int64_t shape[TS_MAX_DIMS], strides[TS_MAX_DIMS];
    for (int i = 0, j = 0; i < t->ndim; i++) {
        if (i == d)
            continue;
        shape[j] = t->shape[i];
        strides[j++] = t->strides[i];
    }
    const int64_t p[2] = {d, index};
    return recorded(ts__view(t, t->ndim - 1, shape, strides, t->offset + index * t->strides[d],
                             out),
                    TS__VIEW_SELECT, t, out, p, 2);
}

TS_API ts_status ts_tensor_permute(ts_tensor *t, const int *dims, ts_tensor **out)
{
    CHECK_ARGS("permute");
    if (t->ndim > 0 && !dims)
        return ts__fail(TS_EINVAL, "permute: dims is NULL");
    int64_t shape[TS_MAX_DIMS], strides[TS_MAX_DIMS];
    int seen[TS_MAX_DIMS] = {0};
    int64_t packed = 0; /* dims, 4 bits each, for backward */
    for (int i = 0; i < t->ndim; i++) {
        int d = ts__dim(dims[i], t->ndim);
        if (d < 0 || seen[d])
            return ts__fail(TS_EINVAL, "permute: dims are not a permutation of 0..%d",
                            t->ndim - 1);
        seen[d] = 1;
        shape[i] = t->shape[d];
        strides[i] = t->strides[d];
        packed |= (int64_t)d << (4 * i);
    }
    return recorded(ts__view(t, t->ndim, shape, strides, t->offset, out), TS__VIEW_PERMUTE, t,
                    out, &packed, 1);
}

TS_API ts_status ts_tensor_transpose(ts_tensor *t, int dim0, int dim1, ts_tensor **out)
{
    CHECK_ARGS("transpose");
    int a = ts__dim(dim0, t->ndim), b = ts__dim(dim1, t->ndim);
    if (a < 0 || b < 0 || t->ndim == 0)
        return bad_dim("transpose", a < 0 ? dim0 : dim1, t);
    int dims[TS_MAX_DIMS];
    for (int i = 0; i < t->ndim; i++)
        dims[i] = i;
    dims[a] = b;
    dims[b] = a;
    return ts_tensor_permute(t, dims, out);
}

TS_API ts_status ts_tensor_expand(ts_tensor *t, int ndim, const int64_t *want, ts_tensor **out)
{
    CHECK_ARGS("expand");
    char b1[160], b2[160];
    if (ndim < t->ndim || ndim > TS_MAX_DIMS || (ndim > 0 && !want))
        return ts__fail(TS_ESHAPE, "expand: cannot expand %s to %d dims",
                        ts__shape_str(t->ndim, t->shape, b1, sizeof b1), ndim);
    int64_t shape[TS_MAX_DIMS], strides[TS_MAX_DIMS];
    int lead = ndim - t->ndim;
    for (int d = 0; d < ndim; d++) {
        int sd = d - lead;
        int64_t have = sd >= 0 ? t->shape[sd] : 1;
        int64_t w = want[d] == -1 && sd >= 0 ? have : want[d];
        if (w < 0 || (have != w && have != 1))
            return ts__fail(TS_ESHAPE, "expand: cannot expand %s to %s (only size-1 dims grow)",
                            ts__shape_str(t->ndim, t->shape, b1, sizeof b1),
                            ts__shape_str(ndim, want, b2, sizeof b2));
        shape[d] = w;
        strides[d] = sd >= 0 && have == w ? t->strides[sd] : 0;
    }
    int64_t numel;
    ts_status s = ts__shape_bound("expand", ndim, shape, &numel);
    if (s)
        return s;
    return recorded(ts__view(t, ndim, shape, strides, t->offset, out), TS__VIEW_EXPAND, t, out,
                    NULL, 0);
}

TS_API ts_status ts_tensor_squeeze(ts_tensor *t, int dim, ts_tensor **out)
{
    CHECK_ARGS("squeeze");
    int only = -1;
    if (dim != TS_ALL_DIMS) {
        only = ts__dim(dim, t->ndim);
        if (only < 0)
            return bad_dim("squeeze", dim, t);
    }
    int64_t shape[TS_MAX_DIMS], strides[TS_MAX_DIMS];
    int n = 0;
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] == 1 && (only < 0 || only == d))
            continue;
        shape[n] = t->shape[d];
        strides[n++] = t->strides[d];
    }
    return recorded(ts__view(t, n, shape, strides, t->offset, out), TS__VIEW_RESHAPE, t, out,
                    NULL, 0);
}

TS_API ts_status ts_tensor_unsqueeze(ts_tensor *t, int dim, ts_tensor **out)
{
    CHECK_ARGS("unsqueeze");
    if (t->ndim == TS_MAX_DIMS)
        return ts__fail(TS_EINVAL, "unsqueeze: tensor already has %d dims", TS_MAX_DIMS);
    int d = dim < 0 ? dim + t->ndim + 1 : dim;
    if (d < 0 || d > t->ndim)
        return bad_dim("unsqueeze", dim, t);
    int64_t shape[TS_MAX_DIMS], strides[TS_MAX_DIMS];
    for (int i = 0, j = 0; i <= t->ndim; i++) {
        if (i == d) {
            shape[i] = 1;
            strides[i] = d < t->ndim ? t->shape[d] * t->strides[d] : 1;
        } else {
            shape[i] = t->shape[j];
            strides[i] = t->strides[j++];
        }
    }
    return recorded(ts__view(t, t->ndim + 1, shape, strides, t->offset, out), TS__VIEW_RESHAPE, t,
                    out, NULL, 0);
}

TS_API ts_status ts_tensor_flatten(ts_tensor *t, int start_dim, int end_dim, ts_tensor **out)
{
    CHECK_ARGS("flatten");
    if (t->ndim == 0)
        return ts_tensor_reshape(t, 1, (const int64_t[]){1}, out);
    int a = ts__dim(start_dim, t->ndim), b = ts__dim(end_dim, t->ndim);
    if (a < 0 || b < 0 || a > b)
        return ts__fail(TS_EINVAL, "flatten: dims %d..%d are not a range of a %d-d tensor",
                        start_dim, end_dim, t->ndim);
    int64_t shape[TS_MAX_DIMS];
    int n = 0;
    for (int d = 0; d < a; d++)
        shape[n++] = t->shape[d];
    int64_t m = 1;
    for (int d = a; d <= b; d++)
        m *= t->shape[d];
    shape[n++] = m;
    for (int d = b + 1; d < t->ndim; d++)
        shape[n++] = t->shape[d];
    return ts_tensor_reshape(t, n, shape, out);
}

/* ---- views ----------------------------------------------------------------------------- */

static ts_status view_backward(ts_node *n, ts_tensor *g, ts_tensor **gin)
{
    int kind = (int)n->p.i[0];
    ts_status s;
    switch (kind) {
    case TS__VIEW_RESHAPE:
        return ts_tensor_reshape(g, n->in_ndim[0], n->in_shape[0], &gin[0]);
    case TS__VIEW_PERMUTE: {
        int inv[TS_MAX_DIMS];
        for (int d = 0; d < n->in_ndim[0]; d++)
            inv[(int)((n->p.i[1] >> (4 * d)) & 15)] = d;
        return ts_tensor_permute(g, inv, &gin[0]);
    }
    case TS__VIEW_EXPAND:
        return ts__sum_to(g, n->in_ndim[0], n->in_shape[0], &gin[0]);
    case TS__VIEW_SLICE:
    case TS__VIEW_SELECT: {
        /* Scatter: zeros of the input's shape, the same view of them, g copied in. */
        ts_tensor *gx, *part;
        s = ts_tensor_zeros(n->in_device[0], n->in_dtype[0], n->in_ndim[0], n->in_shape[0], &gx);
        if (s)
            return s;
        if (kind == TS__VIEW_SLICE)
            s = ts_tensor_slice(gx, (int)n->p.i[1], n->p.i[2], n->p.i[3], n->p.i[4], &part);
        else
            s = ts_tensor_select(gx, (int)n->p.i[1], n->p.i[2], &part);
        if (s == TS_OK) {
            s = ts_copy_(part, g);
            ts_tensor_unref(part);
        }
        if (s) {
            ts_tensor_unref(gx);
            return s;
        }
        gin[0] = gx;
        return TS_OK;
    }
    }
    return ts__fail(TS_ESTATE, "backward: unknown view kind %d", kind);
}

int ts__view_backward_into(ts_node *n, ts_tensor *g, ts_tensor *acc, ts_status *s)
{
    int kind = (int)n->p.i[0];
    if (n->backward != view_backward || (kind != TS__VIEW_SLICE && kind != TS__VIEW_SELECT) ||
        !acc || !g || acc->dtype != g->dtype || acc->storage->dev != g->storage->dev ||
        acc->requires_grad || atomic_load(&acc->refcount) != 1 ||
        atomic_load(&acc->storage->refcount) != 1 || !ts_tensor_is_contiguous(acc) ||
        acc->ndim != n->in_ndim[0])
        return 0; /* shared, broadcast (an expanded view) or another layout: the usual way */
    for (int d = 0; d < acc->ndim; d++)
        if (acc->shape[d] != n->in_shape[0][d])
            return 0;
    ts_tensor *part = NULL;
    *s = kind == TS__VIEW_SLICE
             ? ts_tensor_slice(acc, (int)n->p.i[1], n->p.i[2], n->p.i[3], n->p.i[4], &part)
             : ts_tensor_select(acc, (int)n->p.i[1], n->p.i[2], &part);
    if (*s == TS_OK)
        *s = ts_add_(part, g);
    ts_tensor_unref(part);
    return 1;
}

ts_status ts__ag_view(int kind, const ts_tensor *x, ts_tensor *out, const int64_t *params,
                      int nparams)
{
    static const char *const names[] = {"view", "permute", "expand", "slice", "select"};
    const ts_tensor *in[1] = {x};
    if (!ts__grad_needed(1, in))
        return TS_OK;
    int64_t p[8] = {kind};
    for (int i = 0; i < nparams && i < 7; i++)
        p[i + 1] = params[i];
    return ts__record(names[kind], view_backward, out, 1, in, 0, NULL, p, sizeof p, NULL);
}
