/* core/op_index.c: index_select, embedding and index_add_, and index_select's backward
 * (index_add of the gradient). */
#include <math.h>
#include <string.h>

#include "grad_fns.h"

/* ---- indexing -------------------------------------------------------------------------- */

static ts_status check_index(const char *name, const ts_tensor *x, const ts_tensor *index,
                             int dim, int *d)
{
    ts_status s = ts__check_pair(name, x, index, 0);
    if (s)
        return s;
    if (index->dtype != TS_I64 && index->dtype != TS_I32)
        return ts__fail(TS_EDTYPE, "%s: index is %s; it must be int64 or int32", name,
                        ts_dtype_name(index->dtype));
    if (index->ndim != 1) {
        char b[160];
        return ts__fail(TS_ESHAPE, "%s: index must be 1-D, got %s", name,
                        ts__shape_str(index->ndim, index->shape, b, sizeof b));
    }
    *d = ts__dim(dim, x->ndim);
    if (*d < 0 || x->ndim == 0)
        return ts__fail(TS_EINVAL, "%s: dim %d is out of range for a %d-d tensor", name, dim,
                        x->ndim);
    return TS_OK;
}

TS_API ts_status ts_index_select(const ts_tensor *x, int dim, const ts_tensor *index,
                                 ts_tensor **out)
{
    if (!out)
        return ts__fail(TS_EINVAL, "index_select: out is NULL");
    *out = NULL;
    if (!x || !index)
        return ts__fail(TS_EINVAL, "index_select: tensor is NULL");
    int d;
    ts_status s = check_index("index_select", x, index, dim, &d);
    if (s)
        return s;
    int64_t shape[TS_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[d] = index->shape[0];
    ts_tensor *o;
    if ((s = ts__new(x->storage->dev, x->dtype, x->ndim, shape, &o)))
        return s;
    ts_operand in[2], op;
    ts__operand(x, &in[0]);
    ts__operand(index, &in[1]);
    ts__operand(o, &op);
    ts_dim_params p = {d};
    if ((s = ts__run(o->storage->dev, TS_OP_INDEX_SELECT, in, 2, &op, 1, &p, sizeof p))) {
        ts_tensor_unref(o);
        return s;
    }
    TS__RECORD(ts__ag_index_select(x, d, index, o), o);
    *out = o;
    return TS_OK;
}

TS_API ts_status ts_embedding(const ts_tensor *weight, const ts_tensor *index, ts_tensor **out)
{
    if (!out)
        return ts__fail(TS_EINVAL, "embedding: out is NULL");
    *out = NULL;
    if (!weight || !index)
        return ts__fail(TS_EINVAL, "embedding: tensor is NULL");
    if (index->ndim + weight->ndim - 1 > TS_MAX_DIMS)
        return ts__fail(TS_ESHAPE, "embedding: too many dims");
    ts_tensor *flat, *rows;
    int64_t n = ts_tensor_numel(index);
    ts_status s = ts_tensor_reshape((ts_tensor *)index, 1, &n, &flat);
    if (s)
        return s;
    s = ts_index_select(weight, 0, flat, &rows);
    ts_tensor_unref(flat);
    if (s)
        return s;
    int64_t shape[TS_MAX_DIMS];
    int nd = 0;
    for (int d = 0; d < index->ndim; d++)
        shape[nd++] = index->shape[d];
    for (int d = 1; d < weight->ndim; d++)
        shape[nd++] = weight->shape[d];
    s = ts_tensor_view(rows, nd, shape, out);
    ts_tensor_unref(rows);
    return s;
}

TS_API ts_status ts_index_add_(ts_tensor *x, int dim, const ts_tensor *index,
                               const ts_tensor *src)
{
    if (!x || !index || !src)
        return ts__fail(TS_EINVAL, "index_add_: tensor is NULL");
    int d;
    ts_status s = check_index("index_add_", x, index, dim, &d);
    if (s || (s = ts__check_pair("index_add_", x, src, 1)))
        return s;
    int same = src->ndim == x->ndim;
    for (int i = 0; same && i < x->ndim; i++)
        same = src->shape[i] == (i == d ? index->shape[0] : x->shape[i]);
    if (!same) {
        char b1[160], b2[160];
        return ts__fail(TS_ESHAPE, "index_add_: source %s must be %s with dim %d of size %lld",
                        ts__shape_str(src->ndim, src->shape, b1, sizeof b1),
                        ts__shape_str(x->ndim, x->shape, b2, sizeof b2), d,
                        (long long)index->shape[0]);
    }
    if ((s = ts__check_inplace("index_add_", x)))
        return s;
    if (ts__grad_needed(1, &src))
        return ts__fail(TS_ESTATE, "index_add_: the source requires grad, but the in-place form "
                        "records no gradient; use ts_no_grad_enter()");
    ts_tensor *safe_src, *safe_idx;
    if ((s = ts__guard_input(src, x, 0, &safe_src)))
        return s;
    if ((s = ts__guard_input(index, x, 0, &safe_idx))) {
        ts_tensor_unref(safe_src);
        return s;
    }
    ts_operand in[2], op;
    ts__operand(safe_src ? safe_src : src, &in[0]);
    ts__operand(safe_idx ? safe_idx : index, &in[1]);
    ts__operand(x, &op);
    ts_dim_params p = {d};
    s = ts__run(x->storage->dev, TS_OP_INDEX_ADD, in, 2, &op, 1, &p, sizeof p);
    if (s == TS_OK)
        ts__bump_version(x);
    ts_tensor_unref(safe_src);
    ts_tensor_unref(safe_idx);
    return s;
}

/* ---- indexing -------------------------------------------------------------------------- */

static ts_status index_select_backward(ts_node *n, ts_tensor *g, ts_tensor **gin)
{
    ts_tensor *gx;
    ts_status s = ts_tensor_zeros(n->in_device[0], n->in_dtype[0], n->in_ndim[0], n->in_shape[0],
                                  &gx);
    if (s)
        return s;
    if ((s = ts_index_add_(gx, (int)n->p.i[0], n->saved[0], g))) {
        ts_tensor_unref(gx);
        return s;
    }
    gin[0] = gx;
    return TS_OK;
}

ts_status ts__ag_index_select(const ts_tensor *x, int dim, const ts_tensor *index,
                              ts_tensor *out)
{
    const ts_tensor *in[2] = {x, index};
    if (!ts__grad_needed(1, in))
        return TS_OK;
    const ts_tensor *save[1] = {index};
    int64_t p = dim;
    return ts__record("index_select", index_select_backward, out, 2, in, 1, save, &p, sizeof p,
                      NULL);
}
