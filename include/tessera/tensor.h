/* tessera/tensor.h: storages, tensors and views.
 *
 * A storage is a refcounted block from one device's pool. A tensor is refcounted metadata
 * (dtype, shape, strides in elements, offset in elements) holding exactly one reference on
 * its storage. A view is a tensor over the same storage: it references the storage, never its
 * parent tensor, so the parent may be released first and chains of views keep nothing else
 * alive. Creating a view never allocates device memory. The storage returns its block to the
 * device's pool when the last tensor over it is released.
 *
 * Conventions: every function returning a tensor through `out` sets *out to NULL on entry and
 * hands over a new reference on success (transfer full): release it with ts_tensor_unref.
 * Tensor arguments are borrowed (transfer none). Dims may be negative (-1 is the last).
 * Reference counting is atomic: tensors may be shared between threads, but writing a tensor's
 * data while another thread reads it is the caller's business. */
#ifndef TESSERA_TENSOR_H
#define TESSERA_TENSOR_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>
#include <tessera/device.h>
#include <tessera/plugin.h>
#include <tessera/status.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ts_tensor ts_tensor;

/* ---- dtypes and ops by name ------------------------------------------------------------ */

/* Bytes per element; 0 for an unknown dtype. */
size_t ts_dtype_size(int32_t dtype);
/* "float32", "float64", "int32", "int64", "uint8"; "unknown". (transfer none, static) */
const char *ts_dtype_name(int32_t dtype);
/* "add", "matmul", ... for a ts_op; "unknown". (transfer none, static) */
const char *ts_op_name(int32_t op);
/* The name of function fn of TS_OP_UNARY ("relu"), TS_OP_BINARY and TS_OP_BINARY_SCALAR
 * ("mul") or TS_OP_REDUCE ("sum"); NULL for another op or an unknown fn. (static) */
const char *ts_fn_name(int32_t op, int32_t fn);

/* ---- lifetime ---------------------------------------------------------------------------- */

/* Adds a reference; returns t. NULL is passed through. */
ts_tensor *ts_tensor_ref(ts_tensor *t);
/* Drops a reference; the last one frees the tensor and its storage reference. NULL: no-op. */
void ts_tensor_unref(ts_tensor *t);

/* Tensors and storages alive in the process: leak tests assert they return to their start. */
uint64_t ts_tensor_live_count(void);
uint64_t ts_storage_live_count(void);

/* ---- creation (dev NULL: the runtime's default device) ----------------------------------- */

/* Uninitialised contents. ndim 0..TS_MAX_DIMS, every size >= 0. TS_EINVAL for a bad shape or
 * dtype, TS_ENOMEM from the pool (with its figures). */
ts_status ts_tensor_empty(ts_device *dev, int32_t dtype, int ndim, const int64_t *shape,
                          ts_tensor **out);
ts_status ts_tensor_zeros(ts_device *dev, int32_t dtype, int ndim, const int64_t *shape,
                          ts_tensor **out);
ts_status ts_tensor_ones(ts_device *dev, int32_t dtype, int ndim, const int64_t *shape,
                         ts_tensor **out);
ts_status ts_tensor_full(ts_device *dev, int32_t dtype, int ndim, const int64_t *shape,
                         double value, ts_tensor **out);
/* 1-D: start, start + step, ... while < stop (> stop for a negative step). */
ts_status ts_tensor_arange(ts_device *dev, int32_t dtype, double start, double stop,
                           double step, ts_tensor **out);
/* Copies numel * dtype_size bytes, row-major, from host memory. */
ts_status ts_tensor_from_host(ts_device *dev, int32_t dtype, int ndim, const int64_t *shape,
                              const void *data, ts_tensor **out);
/* Copies the tensor's elements, row-major (any strides), into host memory of nbytes; nbytes
 * must be exactly numel * dtype_size (TS_EINVAL otherwise). */
ts_status ts_tensor_to_host(const ts_tensor *t, void *data, size_t nbytes);
/* The value of a one-element tensor (any shape of one element, any dtype) as a double; a
 * tensor of more elements is TS_ESHAPE naming its shape. Like PyTorch's .item(). */
ts_status ts_tensor_item(const ts_tensor *t, double *value);
/* Prints t to f as PyTorch does: tensor([[0.1000, -2.0000], ...], dtype=float32,
 * device=cpu_blas), one width for every value; more than 1000 elements are elided to the
 * first and last 3 of each dimension (with the shape added). */
ts_status ts_tensor_print(const ts_tensor *t, FILE *f);
/* A new contiguous tensor with the same values on the same device. */
ts_status ts_tensor_clone(const ts_tensor *t, ts_tensor **out);
/* The same values on another device (through host memory between plugins). */
ts_status ts_tensor_to(const ts_tensor *t, ts_device *dev, ts_tensor **out);
/* t itself (a new reference) if contiguous, else a contiguous copy. */
ts_status ts_tensor_contiguous(ts_tensor *t, ts_tensor **out);

/* ---- random numbers ---------------------------------------------------------------------- */

/* A counter-based generator (Philox4x32-10): the numbers depend only on (seed, offset), are
 * made on the host by the core, and are the same on every backend. The offset advances by
 * what each call consumes, so saving (seed, offset) saves the stream. Caller-owned. */
typedef struct ts_rng {
    uint64_t seed;
    uint64_t offset; /* 128-bit Philox blocks consumed so far */
} ts_rng;

void ts_rng_init(ts_rng *rng, uint64_t seed);
/* The same as an initialiser: ts_rng rng = TS_RNG(42); */
#define TS_RNG(seed) {(uint64_t)(seed), 0}
/* Uniform in [low, high). Float dtypes. */
ts_status ts_tensor_rand(ts_device *dev, int32_t dtype, int ndim, const int64_t *shape,
                         double low, double high, ts_rng *rng, ts_tensor **out);
/* Normal(mean, std) by Box-Muller. Float dtypes. */
ts_status ts_tensor_randn(ts_device *dev, int32_t dtype, int ndim, const int64_t *shape,
                          double mean, double std, ts_rng *rng, ts_tensor **out);

/* ---- metadata (transfer none) ------------------------------------------------------------ */

int ts_tensor_ndim(const ts_tensor *t);
/* Arrays of ndim elements, valid while t lives. */
const int64_t *ts_tensor_shape(const ts_tensor *t);
const int64_t *ts_tensor_strides(const ts_tensor *t);
/* Size of dim (negative allowed); -1 if out of range. */
int64_t ts_tensor_size(const ts_tensor *t, int dim);
int64_t ts_tensor_offset(const ts_tensor *t);
int32_t ts_tensor_dtype(const ts_tensor *t);
ts_device *ts_tensor_device(const ts_tensor *t);
int64_t ts_tensor_numel(const ts_tensor *t);
int ts_tensor_is_contiguous(const ts_tensor *t);
/* Device pointer to element [0, ..., 0]. For CPU plugins it is host memory the caller may
 * read and write directly. */
void *ts_tensor_data(const ts_tensor *t);
/* Bytes of the storage under t (all views of it share it). */
size_t ts_tensor_storage_nbytes(const ts_tensor *t);
/* Non-zero if a and b are views of the same storage. */
int ts_tensor_shares_storage(const ts_tensor *a, const ts_tensor *b);
/* The version of t's storage: every in-place write bumps it (autograd checks it). */
uint64_t ts_tensor_version(const ts_tensor *t);
/* Writes "float32(2, 3)" into buf; returns buf. */
const char *ts_tensor_describe(const ts_tensor *t, char *buf, size_t len);

/* ---- views: zero-copy, new tensor over the same storage ---------------------------------- */

/* The same elements with another shape; one size may be -1 (inferred). TS_ESHAPE if the
 * element count differs or the strides cannot express it without a copy (use reshape). */
ts_status ts_tensor_view(ts_tensor *t, int ndim, const int64_t *shape, ts_tensor **out);
/* Like view, but copies (into a new contiguous tensor) when a view is impossible: only then. */
ts_status ts_tensor_reshape(ts_tensor *t, int ndim, const int64_t *shape, ts_tensor **out);
/* Elements start, start+step, ... < stop along dim. Negative start/stop count from the end;
 * both are clamped to [0, size] like Python slices. step >= 1. */
ts_status ts_tensor_slice(ts_tensor *t, int dim, int64_t start, int64_t stop, int64_t step,
                          ts_tensor **out);
/* length elements from start along dim (no clamping: out of range is TS_EINVAL). */
ts_status ts_tensor_narrow(ts_tensor *t, int dim, int64_t start, int64_t length,
                           ts_tensor **out);
/* Index `index` of dim, which disappears (ndim - 1). */
ts_status ts_tensor_select(ts_tensor *t, int dim, int64_t index, ts_tensor **out);
ts_status ts_tensor_transpose(ts_tensor *t, int dim0, int dim1, ts_tensor **out);
/* dims: a permutation of 0..ndim-1. */
ts_status ts_tensor_permute(ts_tensor *t, const int *dims, ts_tensor **out);
/* Broadcasts size-1 dims (and new leading dims) to shape with stride 0; -1 keeps a size. */
ts_status ts_tensor_expand(ts_tensor *t, int ndim, const int64_t *shape, ts_tensor **out);
/* Removes dim if its size is 1 (else the same shape); TS_ALL_DIMS removes every size-1 dim. */
#define TS_ALL_DIMS (-1000)
ts_status ts_tensor_squeeze(ts_tensor *t, int dim, ts_tensor **out);
/* Inserts a size-1 dim at position dim (0..ndim; negative counts from ndim+1). */
ts_status ts_tensor_unsqueeze(ts_tensor *t, int dim, ts_tensor **out);
/* Merges dims start..end (inclusive) into one; a view when their strides allow, else a copy. */
ts_status ts_tensor_flatten(ts_tensor *t, int start_dim, int end_dim, ts_tensor **out);

#ifdef __cplusplus
}
#endif
#endif /* TESSERA_TENSOR_H */
