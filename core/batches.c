/* core/batches.c: the mini-batch loader of tessera/data.h: zero-copy views in order, or one
 * index_select per batch into reused buffers along a Philox permutation of (seed, epoch);
 * optionally each batch uploaded to another device through (pinned) staging buffers.
 * docs/data.md describes the design and the measured figures. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "philox.h"

/* ---- the batch loader ------------------------------------------------------------------- */

struct ts_loader {
    ts_tensor *data, *labels; /* owned references; labels may be NULL */
    ts_device *dev;
    int64_t n, batch_size, nbatches;
    int shuffle, drop_last;
    uint64_t seed;
    uint64_t epoch; /* the current epoch */
    int64_t batch;  /* the next batch of it */
    /* shuffled only */
    int64_t *perm; /* host permutation of 0..n-1 for perm_epoch; also the index
                    * staging buffer: a batch uploads a slice of it */
    uint64_t perm_epoch;
    int perm_valid;
    ts_tensor *idx;         /* device int64 (cap) */
    ts_tensor *xbuf, *ybuf; /* (cap, ...) gather targets, reused every batch */
    int64_t cap;            /* min(batch_size, n) */
    /* ts_loader_set_device: batches go to target through two slots used in turn, each a
     * (cap, ...) tensor on target per stream (x, y) and a host staging buffer (pinned memory
     * of target, or malloc'd), with the ticket of the upload that last read the buffer. */
    ts_device *target;
    int pinned, slot;
    struct {
        ts_tensor *t[2];  /* x, y on target */
        void *host[2];    /* their staging buffers */
        size_t bytes[2];  /* staging bytes */
        uint64_t ticket;  /* the last upload from host[] (pinned only) */
    } up[2];
};

/* A contiguous tensor shaped like t with dim 0 of size rows. (transfer full) */
static ts_status rows_like(const ts_tensor *t, int64_t rows, ts_tensor **out)
{
    int64_t shape[TS_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    shape[0] = rows;
    return ts_tensor_empty(t->storage->dev, t->dtype, t->ndim, shape, out);
}

TS_API ts_status ts_loader_new(ts_tensor *data, ts_tensor *labels, int64_t batch_size, int shuffle,
                               uint64_t seed, int drop_last, ts_loader **out)
{
    if (!out)
        return ts__fail(TS_EINVAL, "ts_loader_new: out is NULL");
    *out = NULL;
    if (!data)
        return ts__fail(TS_EINVAL, "ts_loader_new: data is NULL");
    if (batch_size < 1)
        return ts__fail(TS_EINVAL, "ts_loader_new: batch_size is %lld; it must be >= 1",
                        (long long)batch_size);
    if (data->ndim < 1)
        return ts__fail(TS_ESHAPE, "ts_loader_new: data is 0-d; batches run over dim 0");
    if (labels) {
        ts_status s = ts__check_pair("ts_loader_new", data, labels, 0);
        if (s)
            return s;
        if (labels->ndim < 1 || labels->shape[0] != data->shape[0]) {
            char b1[160], b2[160];
            return ts__fail(TS_ESHAPE, "ts_loader_new: data %s and labels %s differ in dim 0",
                            ts__shape_str(data->ndim, data->shape, b1, sizeof b1),
                            ts__shape_str(labels->ndim, labels->shape, b2, sizeof b2));
        }
    }
    ts_loader *l = ts__calloc(1, sizeof *l);
    if (!l)
        return ts__fail(TS_ENOMEM, "ts_loader_new: out of host memory");
    l->data = ts_tensor_ref(data);
    l->labels = ts_tensor_ref(labels);
    l->dev = data->storage->dev;
    l->n = data->shape[0];
    l->batch_size = batch_size;
    l->shuffle = shuffle != 0;
    l->drop_last = drop_last != 0;
    l->seed = seed;
    l->nbatches = drop_last ? l->n / batch_size : l->n / batch_size + (l->n % batch_size != 0);
    if (l->nbatches == 0) {
        ts_status s = l->n == 0
                          ? ts__fail(TS_EINVAL, "ts_loader_new: the data has 0 samples: an epoch "
                                     "would take no step")
                          : ts__fail(TS_EINVAL, "ts_loader_new: no batch: %lld samples, batch "
                                     "size %lld and drop_last leave no whole batch",
                                     (long long)l->n, (long long)batch_size);
        ts_loader_free(l);
        return s;
    }
    l->cap = batch_size < l->n ? batch_size : l->n;
    ts_status s = TS_OK;
    if (l->shuffle && l->cap > 0) {
        l->perm = ts__malloc((size_t)l->n * sizeof *l->perm);
        if (!l->perm) {
            s = ts__fail(TS_ENOMEM,
                         "ts_loader_new: out of host memory for a permutation of "
                         "%lld",
                         (long long)l->n);
            goto fail;
        }
        if ((s = ts_tensor_empty(l->dev, TS_I64, 1, &l->cap, &l->idx)) ||
            (s = rows_like(data, l->cap, &l->xbuf)) ||
            (labels && (s = rows_like(labels, l->cap, &l->ybuf))))
            goto fail;
        ts_tensor_set_role(l->idx, TS_ROLE_DATA);
        ts_tensor_set_role(l->xbuf, TS_ROLE_DATA);
        ts_tensor_set_role(l->ybuf, TS_ROLE_DATA);
    }
    *out = l;
    return TS_OK;
fail:
    ts_loader_free(l);
    return s;
}

static ts_status buf_rows(const ts_tensor *buf, int64_t len, ts_tensor **out);
static long storage_refs(const ts_tensor *t);

/* Frees the upload slots (waiting for uploads in flight first). */
static void upload_free(ts_loader *l)
{
    for (int k = 0; k < 2; k++) {
        if (l->pinned)
            ts_device_wait_copy(l->target, l->up[k].ticket);
        for (int j = 0; j < 2; j++) {
            ts_tensor_unref(l->up[k].t[j]);
            if (l->pinned)
                ts_device_pinned_free(l->target, l->up[k].host[j]);
            else
                free(l->up[k].host[j]);
        }
    }
    memset(l->up, 0, sizeof l->up);
    l->target = NULL;
    l->pinned = 0;
}

TS_API ts_status ts_loader_set_device(ts_loader *l, ts_device *dev, int pinned)
{
    if (!l)
        return ts__fail(TS_EINVAL, "ts_loader_set_device: loader is NULL");
    upload_free(l);
    if (!dev || dev == l->dev)
        return TS_OK; /* batches stay where the data is */
    l->target = dev;
    l->pinned = pinned != 0;
    l->slot = 0;
    ts_status s = TS_OK;
    for (int k = 0; k < 2 && !s; k++) {
        for (int j = 0; j < 2 && !s; j++) {
            ts_tensor *src = j ? l->labels : l->data;
            if (!src)
                continue;
            int64_t shape[TS_MAX_DIMS];
            memcpy(shape, src->shape, sizeof shape);
            shape[0] = l->cap;
            size_t bytes = (size_t)ts_tensor_numel(src) / (size_t)l->n * (size_t)l->cap *
                           ts_dtype_size(src->dtype);
            l->up[k].bytes[j] = bytes;
            if ((s = ts_tensor_empty(dev, src->dtype, src->ndim, shape, &l->up[k].t[j])))
                break;
            ts_tensor_set_role(l->up[k].t[j], TS_ROLE_DATA);
            if (l->pinned)
                s = ts_device_pinned_alloc(dev, bytes ? bytes : 1, "loader staging",
                                           &l->up[k].host[j]);
            else if (!(l->up[k].host[j] = ts__malloc(bytes ? bytes : 1)))
                s = ts__fail(TS_ENOMEM, "out of host memory for a %zu-byte staging buffer",
                             bytes);
        }
    }
    if (s) {
        upload_free(l);
        return ts__fail_prefix(s, "ts_loader_set_device: ");
    }
    return TS_OK;
}

/* Sends the host-side batch (bx, by) of len rows to the target through the next slot and
 * replaces them with views of the slot's tensors. */
static ts_status upload(ts_loader *l, ts_tensor **bx, ts_tensor **by, int64_t len)
{
    int k = l->slot;
    for (int j = 0; j < 2; j++) {
        long r = storage_refs(l->up[k].t[j]);
        if (r > 1)
            return ts__fail(TS_ESTATE,
                            "ts_loader_next: the batch before the previous one is still "
                            "referenced (%ld extra references): release each batch with "
                            "ts_tensor_unref before asking for the one after the next; the "
                            "loader uploads into two buffers used in turn",
                            r - 1);
    }
    ts_status s;
    if (l->pinned && (s = ts_device_wait_copy(l->target, l->up[k].ticket)))
        return s;
    l->up[k].ticket = 0;
    for (int j = 0; j < 2; j++) {
        ts_tensor **b = j ? by : bx, *dst = l->up[k].t[j], *view;
        if (!*b || !dst)
            continue;
        size_t nbytes = (size_t)ts_tensor_numel(*b) * ts_dtype_size((*b)->dtype);
        void *host = l->up[k].host[j], *dev_ptr = ts_tensor_data(dst);
        uint64_t ticket = 0;
        if ((s = ts_tensor_to_host(*b, host, nbytes)) ||
            (s = l->pinned ? ts_device_copy_from_pinned(l->target, dev_ptr, host, nbytes, &ticket)
                           : ts_device_copy_from_host(l->target, dev_ptr, host, nbytes)) ||
            (s = buf_rows(dst, len, &view)))
            return s;
        if (ticket)
            l->up[k].ticket = ticket;
        ts__bump_version(dst);
        ts_tensor_unref(*b);
        *b = view;
    }
    l->slot ^= 1;
    return TS_OK;
}

TS_API void ts_loader_free(ts_loader *l)
{
    if (!l)
        return;
    upload_free(l);
    ts_tensor_unref(l->data);
    ts_tensor_unref(l->labels);
    ts_tensor_unref(l->idx);
    ts_tensor_unref(l->xbuf);
    ts_tensor_unref(l->ybuf);
    free(l->perm);
    free(l);
}

TS_API int64_t ts_loader_batches(const ts_loader *l)
{
    return l ? l->nbatches : 0;
}

TS_API void ts_loader_position(const ts_loader *l, uint64_t *epoch, int64_t *batch)
{
    if (epoch)
        *epoch = l ? l->epoch : 0;
    if (batch)
        *batch = l ? l->batch : 0;
}

TS_API ts_status ts_loader_start_epoch(ts_loader *l, uint64_t epoch)
{
    return ts_loader_seek(l, epoch, 0);
}

TS_API ts_status ts_loader_seek(ts_loader *l, uint64_t epoch, int64_t batch)
{
    if (!l)
        return ts__fail(TS_EINVAL, "ts_loader_seek: loader is NULL");
    if (batch < 0 || batch > l->nbatches)
        return ts__fail(TS_EINVAL,
                        "ts_loader_seek: batch %lld is outside 0..%lld (the batches "
                        "of an epoch)",
                        (long long)batch, (long long)l->nbatches);
    l->epoch = epoch;
    l->batch = batch;
    return TS_OK;
}

/* Fisher-Yates over 0..n-1. Step i (from n-1 down to 1) swaps i with j uniform in [0, i], drawn
 * from Philox block (key = seed, counter = (epoch, i)): its first 64 bits, rejected (in favour
 * of the next 64) when below 2^64 mod (i + 1), which makes j exactly uniform unless both draws
 * fall there (probability below (n / 2^64)^2); then the modulo bias is at most n / 2^64. */
static void make_perm(ts_loader *l)
{
    int64_t *p = l->perm;
    for (int64_t i = 0; i < l->n; i++)
        p[i] = i;
    uint32_t key[2] = {(uint32_t)l->seed, (uint32_t)(l->seed >> 32)};
    for (int64_t i = l->n - 1; i > 0; i--) {
        uint32_t ctr[4] = {(uint32_t)l->epoch, (uint32_t)(l->epoch >> 32), (uint32_t)i,
                           (uint32_t)((uint64_t)i >> 32)};
        uint32_t r[4];
        ts__philox4x32_10(ctr, key, r);
        uint64_t range = (uint64_t)i + 1;
        uint64_t below = (0 - range) % range; /* 2^64 mod range */
        uint64_t v = (uint64_t)r[0] | (uint64_t)r[1] << 32;
        if (v < below)
            v = (uint64_t)r[2] | (uint64_t)r[3] << 32;
        int64_t j = (int64_t)(v % range);
        int64_t t = p[i];
        p[i] = p[j];
        p[j] = t;
    }
    l->perm_epoch = l->epoch;
    l->perm_valid = 1;
}

/* The rows [start, start + len) of buf as a new tensor: buf's layout (a fresh struct, so the
 * caller's tensor is never the loader's own). (transfer full) */
static ts_status buf_rows(const ts_tensor *buf, int64_t len, ts_tensor **out)
{
    int64_t shape[TS_MAX_DIMS];
    memcpy(shape, buf->shape, sizeof shape);
    shape[0] = len;
    return ts__view(buf, buf->ndim, shape, buf->strides, buf->offset, out);
}

/* t's operand; when each dim-0 row of t is contiguous, as (rows, row elements): the gather
 * then copies whole rows in one pass instead of walking every inner dim per index. */
static void row_operand(const ts_tensor *t, ts_operand *op)
{
    ts__operand(t, op);
    int64_t row = 1;
    for (int d = t->ndim - 1; d >= 1; d--) {
        if (t->shape[d] != 1 && t->strides[d] != row)
            return; /* not contiguous: the kernel walks the strides */
        row *= t->shape[d];
    }
    if (t->ndim >= 2) {
        op->ndim = 2;
        op->shape[1] = row;
        op->strides[1] = 1;
        for (int d = 2; d < TS_MAX_DIMS; d++)
            op->shape[d] = op->strides[d] = 0;
    }
}

/* Gathers src rows at idx[0..len) into the first len rows of buf with one kernel. */
static ts_status gather(ts_loader *l, const ts_tensor *src, ts_tensor *buf, int64_t len)
{
    ts_operand in[2], op;
    row_operand(src, &in[0]);
    ts__operand(l->idx, &in[1]);
    in[1].shape[0] = len;
    row_operand(buf, &op);
    op.shape[0] = len;
    if (in[0].ndim != op.ndim) { /* src rows are strided: both at full rank */
        ts__operand(src, &in[0]);
        ts__operand(buf, &op);
        op.shape[0] = len;
    }
    ts_dim_params p = {0};
    ts_status s = ts__run(l->dev, TS_OP_INDEX_SELECT, in, 2, &op, 1, &p, sizeof p);
    if (s == TS_OK)
        ts__bump_version(buf);
    return s;
}

static long storage_refs(const ts_tensor *t)
{
    return t ? atomic_load(&t->storage->refcount) : 1;
}

TS_API ts_status ts_loader_next(ts_loader *l, ts_tensor **x, ts_tensor **y)
{
    if (x)
        *x = NULL;
    if (y)
        *y = NULL;
    if (!l || !x)
        return ts__fail(TS_EINVAL, "ts_loader_next: loader or x is NULL");
    if (l->batch >= l->nbatches)
        return TS_OK; /* the end of the epoch */
    int64_t start = l->batch * l->batch_size;
    int64_t len = l->n - start < l->batch_size ? l->n - start : l->batch_size;
    ts_status s;
    ts_tensor *bx = NULL, *by = NULL;
    if (!l->shuffle) {
        ts_no_grad_enter(); /* views of data that requires grad must not join its graph */
        s = ts_tensor_narrow(l->data, 0, start, len, &bx);
        if (s == TS_OK && l->labels)
            s = ts_tensor_narrow(l->labels, 0, start, len, &by);
        ts_no_grad_exit();
        if (s)
            goto fail;
    } else {
        long rx = storage_refs(l->xbuf), ry = storage_refs(l->ybuf);
        if (rx > 1 || ry > 1)
            return ts__fail(TS_ESTATE,
                            "ts_loader_next: the previous shuffled batch is still "
                            "referenced (%ld extra references to its buffers); "
                            "release it with ts_tensor_unref first: shuffled batches "
                            "are gathered into buffers the loader reuses",
                            (rx - 1) + (ry - 1));
        if (!l->perm_valid || l->perm_epoch != l->epoch)
            make_perm(l);
        if ((s = ts_device_copy_from_host(l->dev, l->idx->storage->data, l->perm + start,
                                          (size_t)len * sizeof *l->perm)) ||
            (s = gather(l, l->data, l->xbuf, len)) ||
            (l->labels && (s = gather(l, l->labels, l->ybuf, len))))
            return ts__fail_prefix(s,
                                   "ts_loader_next: gathering batch %lld: ", (long long)l->batch);
        if ((s = buf_rows(l->xbuf, len, &bx)) || (l->labels && (s = buf_rows(l->ybuf, len, &by))))
            goto fail;
    }
    if (l->target && (s = upload(l, &bx, &by, len)))
        goto fail;
    l->batch++;
    *x = bx;
    if (y)
        *y = by;
    else
        ts_tensor_unref(by);
    return TS_OK;
fail:
    ts_tensor_unref(bx);
    ts_tensor_unref(by);
    return s;
}
