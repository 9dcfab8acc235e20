/* kernels/host/hostkern.h: the host-kernel library: kernels on host memory, one file per
 * family, written against the plugin ABI only. Built in two flavours from the same sources
 * (Makefile.am): threaded (OpenMP) into the CPU plugins, and the reference flavour (one
 * thread) into libtessera for the reference kernels (refkern.h); the operand checks
 * (opcheck.c) once, for both and for the cuda plugin. Names are hk_ (hidden in every binary
 * that links them: -fvisibility=hidden); nothing here is public API.
 * Each family Each family function handles the ops of its family and returns TS_ENOTSUP (with no
 * message) for anything else; hk_run tries them in turn. Operands may have any
 * strides (0 for broadcast dims); dtypes per op as plugin.h documents. Large loops run on
 * hd->threads OpenMP threads. Errors go through hd->host->fail. */
#ifndef TESSERA_KERNELS_HOST_HOSTKERN_H
#define TESSERA_KERNELS_HOST_HOSTKERN_H

#include "hostdev.h"

/* The hot loops of the CPU plugins' flavour (HK_VECTOR_CLONES, Makefile.am) are compiled
 * three times, for baseline x86-64 (SSE2), AVX2 and AVX-512, and the loader's ifunc
 * resolver picks one per CPU at load time (GCC's target_clones): exp, tanh and GELU run 2-4x
 * faster on 8 or 16 lanes than on 4. The project builds in ISO C mode, where GCC does not
 * contract a * b + c into an FMA (-ffp-contract=off), so an elementwise result is the same
 * bits on every clone; only the lane count of a vectorized sum (softmax's) differs, as it
 * does between any two vector widths. The reference flavour (libtessera) stays one plain
 * build. */
#if defined(HK_VECTOR_CLONES) && defined(__x86_64__) && defined(__GNUC__) && \
    !defined(__clang__) && defined(__ELF__)
#define HK_CLONES __attribute__((target_clones("default", "avx2", "avx512f")))
#else
#define HK_CLONES
#endif

/* Non-zero if the shared host kernels implement op for the output dtype. */
int hk_supports(int32_t op, int32_t dtype);

/* Runs op if the shared host kernels implement it; TS_ENOTSUP (no message) otherwise. */
ts_status hk_run(hk_dev *hd, const ts_kernel_call *call);

/* Converts src into dst (one shape, any dtypes and strides) with the cast loops; hd is the
 * hk_dev (hk_via_float32's convert). */
ts_status hk_convert(void *hd, const ts_operand *dst, const ts_operand *src);

/* Families (elementwise.c, reduce.c, index.c, pool2d.c, loss.c). Same contract as hk_run. */
int hk_elementwise_supports(int32_t op, int32_t dtype);
ts_status hk_elementwise(hk_dev *hd, const ts_kernel_call *call);
int hk_reduce_supports(int32_t op, int32_t dtype);
ts_status hk_reduce(hk_dev *hd, const ts_kernel_call *call);
int hk_index_supports(int32_t op, int32_t dtype);
ts_status hk_index(hk_dev *hd, const ts_kernel_call *call);
int hk_pool2d_supports(int32_t op, int32_t dtype);
ts_status hk_pool2d(hk_dev *hd, const ts_kernel_call *call);
int hk_loss_supports(int32_t op, int32_t dtype);
ts_status hk_loss(hk_dev *hd, const ts_kernel_call *call);
int hk_optimizer_supports(int32_t op, int32_t dtype);
ts_status hk_optimizer(hk_dev *hd, const ts_kernel_call *call);
int hk_norm_supports(int32_t op, int32_t dtype);
ts_status hk_norm(hk_dev *hd, const ts_kernel_call *call);
int hk_attention_supports(int32_t op, int32_t dtype);
ts_status hk_attention(hk_dev *hd, const ts_kernel_call *call);

/* The default claim set: the output dtypes for which the ABI defines op (every dtype for
 * copies, casts, fills, selects, binary ops and gathers; all but uint8 for unary functions;
 * the numeric ones for reductions; the float ones for every other op; the 16-bit floats for
 * what hk_half_claim allows: they run through float32). A plugin claims
 * (op, dtype) where it runs op and this says the pair exists: the host kernels' families and
 * cuda do, so that a new dtype enters every claim here. */
int hk_op_defined(int32_t op, int32_t dtype);

/* The 16-bit floats run through float32 (opcheck.c, for the host kernels and the cuda
 * plugin): ops a plugin that runs an op in float32 can also claim for bfloat16 and float16
 * (all but the optimizer steps, whose state stays float32). */
int hk_half_claim(int32_t op);
/* Non-zero if call has a bfloat16 or float16 operand and is not a copy, cast or fill (the ops
 * that take them natively everywhere). */
int hk_call_has_half(const ts_kernel_call *call);
/* Non-zero for the ops the host kernels run on 16-bit floats themselves (the elementwise
 * ops: float32 loops on chunks converted on the way, no scratch); hk_via_float32 for the
 * others. */
int hk_half_native(int32_t op);
/* hk_half_native for one call of the host kernels' families: also a float sum or mean (the
 * bias gradients' sums over rows read their 16-bit input as it is; the other layouts convert
 * it inside hk_reduce). */
int hk_half_native_call(const ts_kernel_call *call);
/* The longest 16-bit softmax row (and softmax gradient row) the host kernels run natively;
 * longer ones, and rows that are not dense, go through float32 copies. */
enum { HK_HALF_ROW = 4096 };
/* Dense 16-bit <-> float32 runs (dt TS_BF16 or TS_F16), plugin.h's rounding. */
void hk_widen_half(float *d, const void *s, int64_t n, int32_t dt);
void hk_narrow_half(void *d, const float *s, int64_t n, int32_t dt);
/* Runs call with every 16-bit float operand in a float32 scratch copy of its distinct
 * elements (a broadcast dim stays stride 0): inputs widened (exact), and outputs too where
 * the op reads them (index_add, a matmul with beta); run called on the float32 call; each
 * 16-bit float output narrowed from its float32 result, rounded once. Every float operand
 * must have one dtype (TS_EINVAL otherwise, as the ABI says); dev as for hk_check_operand.
 * convert(cctx, dst, src) converts between two operands of one shape (any dtypes and
 * strides), as a TS_OP_CAST does. An output may alias an input: both are copies here. */
typedef ts_status (*hk_convert_fn)(void *cctx, const ts_operand *dst, const ts_operand *src);
typedef ts_status (*hk_run_fn)(void *rctx, const ts_kernel_call *call);
ts_status hk_via_float32(const ts_host *h, int dev, const ts_kernel_call *call,
                         hk_convert_fn convert, void *cctx, hk_run_fn run, void *rctx);

/* Non-zero if the elements of a and b may share a byte (their address ranges intersect; an
 * empty operand overlaps nothing). Used to route an output that aliases an input through
 * scratch. */
int hk_overlaps(const ts_operand *a, const ts_operand *b);
/* A dense row-major operand with op's dtype and shape over buf. */
ts_operand hk_dense_like(const ts_operand *op, void *buf);

/* Shapes shared by the forward and backward convolutions. */
typedef struct hk_conv_dims {
    int64_t N, C, H, W; /* x / gx */
    int64_t K, R, S;    /* w / gw: (K, C/G, R, S) */
    int64_t P, Q;       /* y / gy: (N, K, P, Q) */
    int64_t G;
} hk_conv_dims;

/* Checks the params, dtypes and shapes of x (N, C, H, W), w (K, C/groups, R, S), y (N, K, P, Q)
 * and bias (K) or NULL; for the backward ops x, w and y are gx or x, gw or w, and gy (yname
 * says which). Fills d. */
ts_status hk_conv_check(const ts_host *h, const char *name, const ts_conv2d_params *p,
                            const ts_operand *x, const ts_operand *w, const ts_operand *y,
                            const ts_operand *bias, const char *yname, hk_conv_dims *d);

/* Shapes of a matmul: A (batch..., M, K) @ B (batch..., K, N) -> C (batch..., M, N). */
typedef struct hk_matmul_dims {
    int nd;
    int64_t M, K, N, nbatch;
} hk_matmul_dims;

/* Checks a TS_OP_MATMUL call's operand counts, dtypes and shapes (with messages) and fills md. */
ts_status hk_matmul_check(const ts_host *h, const ts_kernel_call *call,
                                   hk_matmul_dims *md);

/* Operand validation shared by the host kernels and the cuda plugin, so that both report a bad
 * call with the same words: everything an op checks before it computes (counts, params,
 * operands, dtypes, shapes), messages through h->fail. dev is non-zero for a device plugin: its
 * operands must also have a non-negative offset and a data pointer (unless empty), and a few
 * checks the host kernels leave to their own code or word differently are made its way. */
/* nin inputs and nout outputs, both arrays present. */
ts_status hk_check_counts(const ts_host *h, int dev, const ts_kernel_call *call,
                                   const char *what, int nin, int nout);
/* A known dtype, 0..TS_MAX_DIMS dims, no negative size or stride; with ref, ref's shape. */
ts_status hk_check_operand(const ts_host *h, int dev, const char *what,
                                    const char *role, const ts_operand *op,
                                    const ts_operand *ref);
/* A dim in [-ndim, ndim) as an index; a 0-d tensor accepts 0 and -1. -1 if out of range. */
int hk_norm_dim(int32_t dim, int ndim);
/* copy, cast, fill, unary, binary, binary_scalar, where; *params: the op's params (NULL for
 * copy, cast and where). TS_ENOTSUP (no message) for any other op. */
ts_status hk_ew_check(const ts_host *h, int dev, const ts_kernel_call *call,
                               const void **params);
/* Binary fn and dtypes: b (NULL for a scalar) like a; out like a, or uint8 for comparisons. */
ts_status hk_binary_dtype_check(const ts_host *h, const char *what, int32_t fn,
                                         const ts_operand *out, const ts_operand *a,
                                         const ts_operand *b);
/* TS_OP_REDUCE: *dim the reduced dim of argmax / argmin, else -1. */
ts_status hk_reduce_check(const ts_host *h, int dev, const ts_kernel_call *call,
                                   int *dim);
/* TS_OP_SOFTMAX / TS_OP_LOG_SOFTMAX / TS_OP_SOFTMAX_BWD: *dim the normalized dim. */
ts_status hk_softmax_check(const ts_host *h, int dev, const ts_kernel_call *call,
                                    int *dim);
/* TS_OP_INDEX_SELECT / TS_OP_INDEX_ADD (not the index values): *dim the normalized dim. */
ts_status hk_index_check(const ts_host *h, int dev, const ts_kernel_call *call,
                                  int *dim);
/* The four pooling ops (not the indices' values of the backward max pool). */
ts_status hk_pool2d_check(const ts_host *h, int dev, const ts_kernel_call *call);
/* TS_OP_LAYER_NORM (bwd 0) / _BWD (bwd 1): counts, params, dtypes, contiguity and element
 * counts; *affine whether weight (and bias) take part, *rows and *cols (D) the row layout. */
ts_status hk_norm_check(const ts_host *h, const ts_kernel_call *call, int bwd, int *affine,
                        int64_t *rows, int64_t *cols);
/* The sizes of an attention call: q (B, Tq, D), k (B, Tk, D), v (B, Tk, Dv). */
typedef struct hk_attention_dims {
    int64_t B, Tq, Tk, D, Dv;
} hk_attention_dims;
/* TS_OP_ATTENTION / _BWD: counts, params, dtypes (lse float32, or float64 with float64 q),
 * contiguity and shapes; fills *a. */
ts_status hk_attention_check(const ts_host *h, int dev, const ts_kernel_call *call,
                             hk_attention_dims *a);
/* The element count of o. */
int64_t hk_attention_numel(const ts_operand *o);
/* Non-zero if operand i (inputs first, then outputs) of call is an attention call's row
 * statistics (lse): float32 beside 16-bit q, k and v. */
int hk_attention_stats(const ts_kernel_call *call, int i);
/* TS_OP_SGD_STEP / TS_OP_ADAM_STEP. */
ts_status hk_optimizer_check(const ts_host *h, int dev, const ts_kernel_call *call);

#endif /* TESSERA_KERNELS_HOST_HOSTKERN_H */
