/* plugins/cuda/kernels.h: the boundary between the cuda plugin's C side (validation, planning,
 * cuBLAS calls: cuda.c, ops.c, gemm.c) and its CUDA kernels (*.cu, compiled by nvcc). Every
 * launcher enqueues work on the given stream and returns the launch's cudaError_t; none
 * synchronizes. Pointers are device pointers already advanced to the operand's element 0
 * (offset applied); strides and sizes are in elements, 64-bit throughout. Launchers clamp
 * their grids and every kernel walks its index space with a grid-stride loop, so no size
 * overflows a grid dimension. */
#ifndef TESSERA_PLUGINS_CUDA_KERNELS_H
#define TESSERA_PLUGINS_CUDA_KERNELS_H

#include <stdint.h>

#include <cuda_runtime.h>

#include <tessera/plugin.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CU_EW_MAX_OPS 4 /* out + up to 3 inputs (where) */

/* An elementwise iteration space: operand 0 is the output, the rest inputs, all of the
 * output's shape after collapsing (size-1 dims dropped, dims contiguous in every operand
 * merged). */
typedef struct cu_ew_arg {
    int32_t nops, ndim; /* ndim >= 1 */
    int64_t n;          /* elements */
    int64_t shape[TS_MAX_DIMS];
    int64_t strides[CU_EW_MAX_OPS][TS_MAX_DIMS];
    char *base[CU_EW_MAX_OPS];
} cu_ew_arg;

/* out = (out dtype) in; the same dtype copies bits. nops 2. */
cudaError_t cu_ew_cast(cudaStream_t st, const cu_ew_arg *a, int32_t out_dtype, int32_t in_dtype);
/* out[...] = value converted like TS_OP_CAST from float64. nops 1. */
cudaError_t cu_ew_fill(cudaStream_t st, const cu_ew_arg *a, int32_t dtype, double value);
/* out = fn(in). nops 2. */
cudaError_t cu_ew_unary(cudaStream_t st, const cu_ew_arg *a, int32_t dtype, int32_t fn);
/* out = fn(x, y) on in_dtype. scalar_pos 0: x and y are operands 1 and 2 (nops 3); 1: x is
 * the scalar, y operand 1; 2: x is operand 1, y the scalar (nops 2). */
cudaError_t cu_ew_binary(cudaStream_t st, const cu_ew_arg *a, int32_t in_dtype, int32_t fn,
                         int scalar_pos, double scalar);
/* out = mask ? x : y; nops 4 (out, mask u8, x, y). */
cudaError_t cu_ew_where(cudaStream_t st, const cu_ew_arg *a, int32_t dtype);
/* Operand 0 of a (nops 1, TS_I32 or TS_I64): *flag = min(*flag, first i) where element i is
 * zero (kind 0) or negative (kind 1). */
cudaError_t cu_ew_find_bad_int(cudaStream_t st, const cu_ew_arg *a, int32_t dtype, int kind,
                               unsigned long long *flag);
/* Writes nbytes at dst by repeating an 1, 2, 4 or 8-byte pattern. */
cudaError_t cu_fill_pattern(cudaStream_t st, void *dst, size_t nbytes, uint64_t pattern,
                            int pattern_size);

/* Index values (TS_I32 / TS_I64) of a strided operand of up to 4 dims: *flag = min(*flag,
 * position of the first value outside [0, hi)) in row-major order. */
typedef struct cu_idx_view {
    const void *data; /* at element 0 */
    int32_t dtype, ndim;
    int64_t shape[4], strides[4];
} cu_idx_view;
cudaError_t cu_find_out_of_range(cudaStream_t st, const cu_idx_view *v, int64_t hi,
                                 unsigned long long *flag);

/* Reductions. Floats accumulate in double, integers in wrapping 64-bit; max/min/arg* keep
 * the first NaN and, on ties, the first index. */
typedef struct cu_rd_arg {
    int32_t fn, dtype; /* ts_reduce_fn, the input's dtype */
    int32_t nkeep, nred;
    int64_t keep_shape[TS_MAX_DIMS], keep_in[TS_MAX_DIMS], keep_out[TS_MAX_DIMS];
    int64_t red_shape[TS_MAX_DIMS], red_in[TS_MAX_DIMS];
    int64_t nout, nslice;
    const char *in;
    char *out;
} cu_rd_arg;
/* Bytes of scratch cu_reduce needs for nparts partial results per output. */
size_t cu_reduce_scratch(int64_t nout, int nparts);
/* nparts > 1 splits each slice among nparts blocks and needs cu_reduce_scratch bytes. */
cudaError_t cu_reduce(cudaStream_t st, const cu_rd_arg *a, int nparts, void *scratch);

/* Softmax / log-softmax along one dim: slices are the odometer over the other dims. */
typedef struct cu_sm_arg {
    int32_t dtype, log_form, nouter;
    int64_t oshape[TS_MAX_DIMS], ostr_in[TS_MAX_DIMS], ostr_out[TS_MAX_DIMS];
    int64_t nslices, len, sx, sy;
    const char *in;
    char *out;
} cu_sm_arg;
cudaError_t cu_softmax(cudaStream_t st, const cu_sm_arg *a);

/* Cross entropy (bwd 0: loss (N)) or its gradient (bwd 1: glogits (N, C)). */
typedef struct cu_xent_arg {
    int32_t dtype, tdtype, bwd;
    int64_t N, C;
    const char *x;
    int64_t xs0, xs1;
    const char *t;
    int64_t ts;
    const char *gl; /* bwd only */
    int64_t gls;
    char *out;
    int64_t os0, os1;
} cu_xent_arg;
cudaError_t cu_cross_entropy(cudaStream_t st, const cu_xent_arg *a);

/* index_select (add 0): dst[.., i, ..] = src[.., ix[i], ..]; index_add (add 1):
 * dst[.., ix[i], ..] += src[.., i, ..] with atomics. Iterates over the picked operand
 * (dst for select, src for add), whose shape is `shape`. */
typedef struct cu_index_arg {
    int32_t dtype, add, dim, ndim;
    int64_t shape[TS_MAX_DIMS];
    int64_t dst_strides[TS_MAX_DIMS], src_strides[TS_MAX_DIMS];
    char *dst;
    const char *src;
    const char *ix;
    int32_t ix_dtype;
    int64_t ix_stride;
    int64_t bound; /* the indexed dim's size: an index outside [0, bound) is skipped (the host
                    * checks first, except in a recorded graph, where nothing may be read) */
} cu_index_arg;
cudaError_t cu_index(cudaStream_t st, const cu_index_arg *a);

/* A 4-D (N, C, H, W) strided operand. */
typedef struct cu_t4 {
    char *p; /* element 0 */
    int64_t n[4], s[4];
} cu_t4;

/* Pooling forward (ix.p may be NULL) and backward (gather: each gx element sums the windows
 * that cover it; ix.p non-NULL selects the max form). */
cudaError_t cu_pool2d(cudaStream_t st, int32_t dtype, int is_max, const ts_pool2d_params *p,
                      const cu_t4 *x, const cu_t4 *y, const cu_t4 *ix);
cudaError_t cu_pool2d_bwd(cudaStream_t st, int32_t dtype, const ts_pool2d_params *p,
                          const cu_t4 *gy, const cu_t4 *ix, const cu_t4 *gx);

/* im2col of images [n0, n0 + nb) of x into col: element (image j, row, pq) at
 * j * img_stride + row * row_stride + pq, row = (c * R + r) * S + s over all C channels. */
typedef struct cu_col_layout {
    int64_t R, S, P, Q, img_stride, row_stride;
} cu_col_layout;
cudaError_t cu_im2col(cudaStream_t st, int32_t dtype, const cu_t4 *x, int64_t n0, int64_t nb,
                      const ts_conv2d_params *p, const cu_col_layout *l, void *col);
/* The adjoint: images [n0, n0 + nb) of gx overwritten with the col entries summed back. */
cudaError_t cu_col2im(cudaStream_t st, int32_t dtype, const void *col, const cu_col_layout *l,
                      const ts_conv2d_params *p, const cu_t4 *gx, int64_t n0, int64_t nb);
/* y images [n0, n0 + nb) = src + bias[k]; src (dense (nb, K, P, Q) when src_dense, else y
 * itself), bias may be NULL (bias_stride then unused). */
cudaError_t cu_bias_out(cudaStream_t st, int32_t dtype, const void *src, int src_dense,
                        const void *bias, int64_t bias_stride, const cu_t4 *y, int64_t n0,
                        int64_t nb);

/* Fused optimizer updates over n dense elements (plugin.h's formulas). */
cudaError_t cu_sgd(cudaStream_t st, int32_t dtype, int64_t n, const void *g, void *p, void *buf,
                   const ts_sgd_params *P);
cudaError_t cu_adam(cudaStream_t st, int32_t dtype, int64_t n, const void *g, void *p, void *m,
                    void *v, const ts_adam_params *P);

/* Layer norm over rows of D dense elements (plugin.h, TS_OP_LAYER_NORM): one block per row,
 * statistics in double. w and b both NULL or both given. */
cudaError_t cu_layer_norm(cudaStream_t st, int32_t dtype, const void *x, const void *w,
                          const void *b, void *y, void *mean, void *rstd, int64_t rows,
                          int64_t D, double eps);
/* Its gradient: gx from gy, x and the forward's mean and rstd (w may be NULL); with gw and gb
 * (both or neither), the weight and bias gradients, sums over the rows. */
cudaError_t cu_layer_norm_bwd(cudaStream_t st, int32_t dtype, const void *gy, const void *x,
                              const void *mean, const void *rstd, const void *w, void *gx,
                              void *gw, void *gb, int64_t rows, int64_t D);

/* Attention (plugin.h, TS_OP_ATTENTION and its backward) on dense (B, T, D) operands, float32
 * or float64 (lse in the same dtype here: ops.c hands 16-bit calls over as float32). The
 * forward reads q, k, v and writes o, lse; the backward reads go, q, k, v, o, lse and writes
 * gq, gk, gv, with cu_attention_scratch bytes of scratch. */
#define CU_ATT_MAX_FEATURES 256
typedef struct cu_att_arg {
    int32_t dtype, backward, causal;
    int64_t B, Tq, Tk, D, Dv;
    double scale;
    const void *q, *k, *v, *go;
    void *o, *lse, *gq, *gk, *gv; /* o and lse inputs of the backward */
} cu_att_arg;
/* Non-zero if the kernels take heads of D and Dv features (their registers hold 256). */
int cu_attention_fits(int64_t D, int64_t Dv);
size_t cu_attention_scratch(const cu_att_arg *a);
cudaError_t cu_attention(cudaStream_t st, const cu_att_arg *a, void *scratch);

#ifdef __cplusplus
}
#endif
#endif /* TESSERA_PLUGINS_CUDA_KERNELS_H */
