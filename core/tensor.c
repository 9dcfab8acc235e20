/* core/tensor.c: storages and tensors: their lifetimes (atomic refcounts, recycled structs
 * so a steady training step calls no malloc for them), creation, metadata, and copies between
 * host and devices. Views are in view.c, operations in ops*.c. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grad_fns.h"
#include "device.h"
#include "memtrace.h"

/* The bound on elements, and on the product of a shape's non-zero sizes: 2^59 - 1, so a byte
 * count (x 8) and every stride fit in int64_t with room to spare. */
#define TS_MAX_NUMEL (INT64_MAX / 16)

/* ---- recycled structs ---------------------------------------------------------------- */

/* Freed tensor and storage structs wait here for reuse; a cap bounds what is kept. */
/* Recycling hides use-after-free from AddressSanitizer: recycle none under it. */
#if defined(__SANITIZE_ADDRESS__)
#define FREELIST_CAP 0
#else
#define FREELIST_CAP 4096
#endif

typedef struct freelist {
    pthread_mutex_t lock;
    void *head; /* each free struct's first word links to the next */
    size_t n;
} freelist;

static freelist tensor_fl = {PTHREAD_MUTEX_INITIALIZER, NULL, 0};
static freelist storage_fl = {PTHREAD_MUTEX_INITIALIZER, NULL, 0};
static _Atomic uint64_t live_tensors, live_storages;

static void *fl_get(freelist *fl, size_t size)
{
    /* A recycled struct counts as an allocation too, so every build fails the same calls. */
    if (ts__fault_hit(TS_FAULT_HOST))
        return NULL;
    pthread_mutex_lock(&fl->lock);
    void *p = fl->head;
    if (p) {
        fl->head = *(void **)p;
        fl->n--;
    }
    pthread_mutex_unlock(&fl->lock);
    if (!p)
        p = malloc(size);
    if (p)
        memset(p, 0, size);
    return p;
}

static void fl_put(freelist *fl, void *p)
{
    pthread_mutex_lock(&fl->lock);
    if (fl->n < FREELIST_CAP) {
        *(void **)p = fl->head;
        fl->head = p;
        fl->n++;
        p = NULL;
    }
    pthread_mutex_unlock(&fl->lock);
    free(p);
}

static void fl_drain(freelist *fl)
{
    pthread_mutex_lock(&fl->lock);
    while (fl->head) {
        void *p = fl->head;
        fl->head = *(void **)p;
        free(p);
    }
    fl->n = 0;
    pthread_mutex_unlock(&fl->lock);
}

/* Runs when libtessera is unloaded or the process exits: valgrind sees no leftovers. */
__attribute__((destructor)) static void drain_freelists(void)
{
    fl_drain(&tensor_fl);
    fl_drain(&storage_fl);
}

TS_API uint64_t ts_tensor_live_count(void)
{
    return atomic_load(&live_tensors);
}

TS_API uint64_t ts_storage_live_count(void)
{
    return atomic_load(&live_storages);
}

/* ---- storages ---------------------------------------------------------------------------- */

/* The device's bytes by role changed: a memory trace records the new counts. */
static void roles_changed(ts_device *dev)
{
    if (!(atomic_load_explicit(&ts__mem_hooks, memory_order_relaxed) & TS__MEM_TRACE))
        return;
    uint64_t b[TS_ROLE_COUNT];
    for (int r = 0; r < TS_ROLE_COUNT; r++)
        b[r] = atomic_load_explicit(&dev->role_bytes[r], memory_order_relaxed);
    ts__memtrace_roles(dev->name, b);
}

static void role_add(ts_device *dev, int role, size_t nbytes, int sign)
{
    if (sign > 0)
        atomic_fetch_add_explicit(&dev->role_bytes[role], nbytes, memory_order_relaxed);
    else
        atomic_fetch_sub_explicit(&dev->role_bytes[role], nbytes, memory_order_relaxed);
}

TS_API const char *ts_memory_role_name(int role)
{
    static const char *const names[TS_ROLE_COUNT] = {"other", "parameter", "gradient",
                                                     "optimizer", "activation", "data"};
    return role >= 0 && role < TS_ROLE_COUNT ? names[role] : "unknown";
}

TS_API void ts_tensor_set_role(ts_tensor *t, ts_memory_role role)
{
    if (!t || !t->storage || (int)role < 0 || role >= TS_ROLE_COUNT)
        return;
    ts_storage *st = t->storage;
    int old = atomic_exchange(&st->role, (int)role);
    if (old == (int)role)
        return;
    role_add(st->dev, old, st->nbytes, -1);
    role_add(st->dev, (int)role, st->nbytes, 1);
    roles_changed(st->dev);
}

TS_API void ts_device_memory_by_role(ts_device *dev, uint64_t *out)
{
    for (int r = 0; out && r < TS_ROLE_COUNT; r++)
        out[r] = dev ? atomic_load_explicit(&dev->role_bytes[r], memory_order_relaxed) : 0;
}

static ts_status storage_new(ts_device *dev, size_t nbytes, const char *tag, ts_storage **out)
{
    ts_storage *st = fl_get(&storage_fl, sizeof *st);
    if (!st)
        return ts__fail(TS_ENOMEM, "out of host memory for a storage");
    ts_status s = ts_device_alloc(dev, nbytes, tag, &st->data);
    if (s) {
        fl_put(&storage_fl, st);
        return s;
    }
    atomic_init(&st->refcount, 1);
    atomic_init(&st->version, 0);
    st->dev = dev;
    st->nbytes = nbytes;
    /* made while gradients are recorded: an activation until the library says otherwise */
    int role = ts_grad_enabled() ? TS_ROLE_ACTIVATION : TS_ROLE_OTHER;
    atomic_init(&st->role, role);
    role_add(dev, role, nbytes, 1);
    roles_changed(dev);
    atomic_fetch_add(&live_storages, 1);
    *out = st;
    return TS_OK;
}

static void storage_unref(ts_storage *st)
{
    if (st && atomic_fetch_sub_explicit(&st->refcount, 1, memory_order_acq_rel) == 1) {
        role_add(st->dev, atomic_load(&st->role), st->nbytes, -1);
        ts_device_free(st->dev, st->data);
        roles_changed(st->dev);
        fl_put(&storage_fl, st);
        atomic_fetch_sub(&live_storages, 1);
    }
}

/* ---- tensors ----------------------------------------------------------------------------- */

void ts__contiguous_strides(int ndim, const int64_t *shape, int64_t *strides)
{
    int64_t acc = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        strides[d] = acc;
        acc *= shape[d] > 1 ? shape[d] : 1;
    }
}

ts_status ts__tensor_wrap(ts_storage *st, int32_t dtype, int ndim, const int64_t *shape,
                          const int64_t *strides, int64_t offset, ts_tensor **out)
{
    ts_tensor *t = fl_get(&tensor_fl, sizeof *t);
    if (!t)
        return ts__fail(TS_ENOMEM, "out of host memory for a tensor");
    atomic_init(&t->refcount, 1);
    atomic_fetch_add(&st->refcount, 1);
    t->storage = st;
    t->dtype = dtype;
    t->ndim = ndim;
    for (int d = 0; d < ndim; d++) {
        t->shape[d] = shape[d];
        t->strides[d] = strides[d];
    }
    t->offset = offset;
    atomic_fetch_add(&live_tensors, 1);
    *out = t;
    return TS_OK;
}

ts_status ts__view(const ts_tensor *t, int ndim, const int64_t *shape, const int64_t *strides,
                   int64_t offset, ts_tensor **out)
{
    return ts__tensor_wrap(t->storage, t->dtype, ndim, shape, strides, offset, out);
}

TS_API ts_tensor *ts_tensor_ref(ts_tensor *t)
{
    if (t)
        atomic_fetch_add_explicit(&t->refcount, 1, memory_order_relaxed);
    return t;
}

TS_API void ts_tensor_unref(ts_tensor *t)
{
    if (!t)
        return;
    long before = atomic_fetch_sub_explicit(&t->refcount, 1, memory_order_acq_rel);
    TS_ASSERT(before >= 1);
    if (before == 1) {
        ts_tensor_unref(t->grad);
        ts__node_unref(t->grad_fn);
        storage_unref(t->storage);
        fl_put(&tensor_fl, t);
        atomic_fetch_sub(&live_tensors, 1);
    }
}

void ts__tensor_adopt(ts_tensor *t, ts_tensor *src)
{
    atomic_fetch_add_explicit(&src->storage->refcount, 1, memory_order_relaxed);
    storage_unref(t->storage);
    t->storage = src->storage;
    t->dtype = src->dtype;
    memcpy(t->strides, src->strides, sizeof t->strides);
    t->offset = src->offset;
    ts_tensor_unref(t->grad);
    t->grad = NULL;
}

int ts__dim(int dim, int ndim)
{
    int n = ndim > 0 ? ndim : 1;
    if (dim < -n || dim >= n)
        return -1;
    return dim < 0 ? dim + n : dim;
}

const char *ts__shape_str(int ndim, const int64_t *shape, char *buf, size_t len)
{
    size_t at = 0;
    at += (size_t)snprintf(buf, len, "(");
    for (int d = 0; d < ndim && at < len; d++)
        at += (size_t)snprintf(buf + at, len - at, "%s%lld", d ? ", " : "",
                               (long long)shape[d]);
    if (at < len)
        snprintf(buf + at, len - at, ")");
    return buf;
}

ts_status ts__pick_device(ts_device *dev, ts_device **out)
{
    *out = dev ? dev : ts_default_device();
    if (!*out)
        return ts__fail(TS_ESTATE, "no device given and no default device: call ts_init "
                                   "first or pass a device");
    return TS_OK;
}

void ts__bump_version(ts_tensor *t)
{
    atomic_fetch_add_explicit(&t->storage->version, 1, memory_order_relaxed);
}

void ts__operand(const ts_tensor *t, ts_operand *op)
{
    memset(op, 0, sizeof *op);
    op->data = t->storage->data;
    op->offset = t->offset;
    op->dtype = t->dtype;
    op->ndim = t->ndim;
    for (int d = 0; d < t->ndim; d++) {
        op->shape[d] = t->shape[d];
        op->strides[d] = t->strides[d];
    }
}

ts_status ts__run(ts_device *dev, int32_t op, const ts_operand *in, int nin,
                  const ts_operand *out, int nout, const void *params, size_t params_size)
{
    ts_kernel_call call = {
        .struct_size = sizeof call,
        .op = op,
        .ninputs = nin,
        .noutputs = nout,
        .inputs = in,
        .outputs = out,
        .params = params,
        .params_size = (uint32_t)params_size,
    };
    return ts__device_run(dev, &call);
}

/* Saturating, NaN to 0, truncating toward zero: plugin.h's ts_plugin_store_scalar, which the
 * host kernels apply too, so ts_tensor_full and ts_fill_ store the same element for the same
 * double. */
void ts__scalar_bytes(int32_t dtype, double v, void *buf)
{
    ts_plugin_store_scalar(dtype, v, buf);
}

/* ---- creation ---------------------------------------------------------------------------- */

ts_status ts__shape_bound(const char *what, int ndim, const int64_t *shape, int64_t *numel)
{
    /* Bound the product of the non-zero sizes, not just numel: a zero in front of huge sizes
     * makes numel 0, but the strides are still products of those sizes and would overflow. */
    int64_t nonzero = 1;
    int empty = 0;
    for (int d = 0; d < ndim; d++) {
        char b[160];
        if (shape[d] < 0)
            return ts__fail(TS_EINVAL, "%s: negative size in shape %s", what,
                            ts__shape_str(ndim, shape, b, sizeof b));
        if (shape[d] == 0) {
            empty = 1;
            continue;
        }
        if (nonzero > TS_MAX_NUMEL / shape[d])
            return ts__fail(TS_EINVAL, "%s: shape %s is too large: the product of its sizes "
                            "(zeros left out) exceeds 2^59 elements",
                            what, ts__shape_str(ndim, shape, b, sizeof b));
        nonzero *= shape[d];
    }
    *numel = empty ? 0 : nonzero;
    return TS_OK;
}

static ts_status check_shape(const char *what, int32_t dtype, int ndim, const int64_t *shape,
                             int64_t *numel)
{
    if (ts_dtype_size(dtype) == 0)
        return ts__fail(TS_EDTYPE, "%s: unknown dtype %d", what, (int)dtype);
    if (ndim < 0 || ndim > TS_MAX_DIMS)
        return ts__fail(TS_EINVAL, "%s: %d dims; tensors have 0 to %d", what, ndim, TS_MAX_DIMS);
    if (ndim > 0 && !shape)
        return ts__fail(TS_EINVAL, "%s: shape is NULL", what);
    return ts__shape_bound(what, ndim, shape, numel);
}

TS_API ts_status ts_tensor_empty(ts_device *dev, int32_t dtype, int ndim, const int64_t *shape,
                                 ts_tensor **out)
{
    if (!out)
        return ts__fail(TS_EINVAL, "ts_tensor_empty: out is NULL");
    *out = NULL;
    int64_t numel;
    ts_status s = check_shape("ts_tensor_empty", dtype, ndim, shape, &numel);
    if (s || (s = ts__pick_device(dev, &dev)))
        return s;
    ts_storage *st = NULL;
    if ((s = storage_new(dev, (size_t)numel * ts_dtype_size(dtype), "tensor", &st)))
        return s;
    if (ts__mem_debug_on()) { /* for leak reports: "tensor (64, 10) float32" */
        char dims[256], name[320];
        snprintf(name, sizeof name, "tensor %s %s", ts__shape_str(ndim, shape, dims,
                 sizeof dims), ts_dtype_name(dtype));
        ts__device_name_block(dev, st->data, name);
    }
    int64_t strides[TS_MAX_DIMS] = {0};
    ts__contiguous_strides(ndim, shape, strides);
    s = ts__tensor_wrap(st, dtype, ndim, shape, strides, 0, out);
    storage_unref(st); /* the tensor holds the only reference */
    return s;
}

TS_API ts_status ts_tensor_full(ts_device *dev, int32_t dtype, int ndim, const int64_t *shape,
                                double value, ts_tensor **out)
{
    ts_status s = ts_tensor_empty(dev, dtype, ndim, shape, out);
    if (s)
        return s;
    unsigned char pat[8];
    ts__scalar_bytes(dtype, value, pat);
    ts_tensor *t = *out;
    s = ts__device_fill(t->storage->dev, t->storage->data, t->storage->nbytes, pat,
                        ts_dtype_size(dtype));
    if (s) {
        ts_tensor_unref(t);
        *out = NULL;
    }
    return s;
}

TS_API ts_status ts_tensor_zeros(ts_device *dev, int32_t dtype, int ndim, const int64_t *shape,
                                 ts_tensor **out)
{
    return ts_tensor_full(dev, dtype, ndim, shape, 0.0, out);
}

TS_API ts_status ts_tensor_ones(ts_device *dev, int32_t dtype, int ndim, const int64_t *shape,
                                ts_tensor **out)
{
    return ts_tensor_full(dev, dtype, ndim, shape, 1.0, out);
}

/* Builds numel elements on the host with fill(i) and uploads them. */
static ts_status from_host_fn(ts_device *dev, int32_t dtype, int ndim, const int64_t *shape,
                              double (*fill)(int64_t i, const void *ctx), const void *ctx,
                              ts_tensor **out)
{
    int64_t numel;
    ts_status s = check_shape("tensor", dtype, ndim, shape, &numel);
    if (s)
        return s;
    size_t es = ts_dtype_size(dtype);
    /* small tensors (an attention mask's row of positions) staged on the stack: no malloc */
    _Alignas(16) unsigned char small[4096];
    unsigned char *buf = (size_t)numel * es <= sizeof small ? small
                                                            : ts__malloc((size_t)numel * es + 1);
    if (!buf)
        return ts__fail(TS_ENOMEM, "out of host memory for %lld elements", (long long)numel);
    for (int64_t i = 0; i < numel; i++)
        ts__scalar_bytes(dtype, fill(i, ctx), buf + (size_t)i * es);
    s = ts_tensor_from_host(dev, dtype, ndim, shape, buf, out);
    if (buf != small)
        free(buf);
    return s;
}

typedef struct arange_ctx {
    double start, step;
} arange_ctx;

static double arange_at(int64_t i, const void *ctx)
{
    const arange_ctx *a = ctx;
    return a->start + (double)i * a->step;
}

TS_API ts_status ts_tensor_arange(ts_device *dev, int32_t dtype, double start, double stop,
                                  double step, ts_tensor **out)
{
    if (!out)
        return ts__fail(TS_EINVAL, "ts_tensor_arange: out is NULL");
    *out = NULL;
    if (step == 0 || !isfinite(step) || !isfinite(start) || !isfinite(stop))
        return ts__fail(TS_EINVAL, "arange: start, stop and a non-zero step must be finite");
    double n = ceil((stop - start) / step);
    if (!(n <= (double)TS_MAX_NUMEL))
        return ts__fail(TS_EINVAL, "arange: [%g, %g) in steps of %g is %g elements, too large "
                        "for a tensor", start, stop, step, n);
    int64_t shape[1] = {n > 0 ? (int64_t)n : 0};
    arange_ctx a = {start, step};
    return from_host_fn(dev, dtype, 1, shape, arange_at, &a, out);
}

TS_API ts_status ts_tensor_from_host(ts_device *dev, int32_t dtype, int ndim,
                                     const int64_t *shape, const void *data, ts_tensor **out)
{
    ts_status s = ts_tensor_empty(dev, dtype, ndim, shape, out);
    if (s)
        return s;
    ts_tensor *t = *out;
    size_t nbytes = (size_t)ts_tensor_numel(t) * ts_dtype_size(dtype);
    if (nbytes && !data) {
        s = ts__fail(TS_EINVAL, "ts_tensor_from_host: data is NULL");
    } else {
        s = ts_device_copy_from_host(t->storage->dev, t->storage->data, data, nbytes);
    }
    if (s) {
        ts_tensor_unref(t);
        *out = NULL;
    }
    return s;
}

TS_API ts_status ts_tensor_clone(const ts_tensor *t, ts_tensor **out)
{
    if (!out || !t)
        return ts__fail(TS_EINVAL, "ts_tensor_clone: NULL argument");
    *out = NULL;
    ts_status s = ts_tensor_empty(t->storage->dev, t->dtype, t->ndim, t->shape, out);
    if (s)
        return s;
    ts_operand in, o;
    ts__operand(t, &in);
    ts__operand(*out, &o);
    if ((s = ts__run(t->storage->dev, TS_OP_COPY, &in, 1, &o, 1, NULL, 0)) ||
        (s = ts__ag_identity("clone", t, *out))) {
        ts_tensor_unref(*out);
        *out = NULL;
    }
    return s;
}

TS_API ts_status ts_tensor_contiguous(ts_tensor *t, ts_tensor **out)
{
    if (!out || !t)
        return ts__fail(TS_EINVAL, "ts_tensor_contiguous: NULL argument");
    if (ts_tensor_is_contiguous(t)) {
        *out = ts_tensor_ref(t);
        return TS_OK;
    }
    return ts_tensor_clone(t, out);
}

TS_API ts_status ts_tensor_to_host(const ts_tensor *t, void *data, size_t nbytes)
{
    if (!t || (nbytes && !data))
        return ts__fail(TS_EINVAL, "ts_tensor_to_host: NULL argument");
    size_t want = (size_t)ts_tensor_numel(t) * ts_dtype_size(t->dtype);
    if (nbytes != want) {
        char b[160];
        return ts__fail(TS_EINVAL, "ts_tensor_to_host: %s %s needs %zu bytes, got %zu",
                        ts_dtype_name(t->dtype), ts__shape_str(t->ndim, t->shape, b, sizeof b),
                        want, nbytes);
    }
    if (want == 0)
        return TS_OK;
    ts_tensor *c;
    ts_status s = ts_tensor_contiguous((ts_tensor *)t, &c);
    if (s)
        return s;
    s = ts_device_copy_to_host(c->storage->dev, data,
                               (char *)c->storage->data + c->offset * (int64_t)ts_dtype_size(c->dtype),
                               want);
    ts_tensor_unref(c);
    return s;
}

TS_API ts_status ts_tensor_to(const ts_tensor *t, ts_device *dev, ts_tensor **out)
{
    if (!out || !t)
        return ts__fail(TS_EINVAL, "ts_tensor_to: NULL argument");
    *out = NULL;
    ts_status s = ts__pick_device(dev, &dev);
    if (s)
        return s;
    if (dev == t->storage->dev) {
        *out = ts_tensor_ref((ts_tensor *)t);
        return TS_OK;
    }
    size_t nbytes = (size_t)ts_tensor_numel(t) * ts_dtype_size(t->dtype);
    void *buf = ts__malloc(nbytes ? nbytes : 1);
    if (!buf)
        return ts__fail(TS_ENOMEM, "out of host memory staging %zu bytes", nbytes);
    if (!(s = ts_tensor_to_host(t, buf, nbytes)))
        s = ts_tensor_from_host(dev, t->dtype, t->ndim, t->shape, buf, out);
    free(buf);
    if (s == TS_OK && (s = ts__ag_to(t, *out))) {
        ts_tensor_unref(*out);
        *out = NULL;
    }
    return s;
}

/* ---- metadata ---------------------------------------------------------------------------- */

TS_API int ts_tensor_ndim(const ts_tensor *t)
{
    return t->ndim;
}

TS_API const int64_t *ts_tensor_shape(const ts_tensor *t)
{
    return t->shape;
}

TS_API const int64_t *ts_tensor_strides(const ts_tensor *t)
{
    return t->strides;
}

TS_API int64_t ts_tensor_size(const ts_tensor *t, int dim)
{
    int d = ts__dim(dim, t->ndim);
    return d < 0 || t->ndim == 0 ? -1 : t->shape[d];
}

TS_API int64_t ts_tensor_offset(const ts_tensor *t)
{
    return t->offset;
}

TS_API int32_t ts_tensor_dtype(const ts_tensor *t)
{
    return t->dtype;
}

TS_API ts_device *ts_tensor_device(const ts_tensor *t)
{
    return t->storage->dev;
}

TS_API int64_t ts_tensor_numel(const ts_tensor *t)
{
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        n *= t->shape[d];
    return n;
}

TS_API int ts_tensor_is_contiguous(const ts_tensor *t)
{
    int64_t acc = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] == 0)
            return 1;
        if (t->shape[d] != 1 && t->strides[d] != acc)
            return 0;
        acc *= t->shape[d];
    }
    return 1;
}

TS_API void *ts_tensor_data(const ts_tensor *t)
{
    return (char *)t->storage->data + t->offset * (int64_t)ts_dtype_size(t->dtype);
}

TS_API size_t ts_tensor_storage_nbytes(const ts_tensor *t)
{
    return t->storage->nbytes;
}

TS_API int ts_tensor_shares_storage(const ts_tensor *a, const ts_tensor *b)
{
    return a && b && a->storage == b->storage;
}

TS_API uint64_t ts_tensor_version(const ts_tensor *t)
{
    return atomic_load_explicit(&t->storage->version, memory_order_relaxed);
}

TS_API const char *ts_tensor_describe(const ts_tensor *t, char *buf, size_t len)
{
    char s[160];
    snprintf(buf, len, "%s%s", ts_dtype_name(t->dtype), ts__shape_str(t->ndim, t->shape, s, sizeof s));
    return buf;
}
