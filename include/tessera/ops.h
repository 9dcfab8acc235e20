/* tessera/ops.h: operations on tensors (forward; autograd records them in a later layer).
 *
 * The core checks and resolves everything (shapes and NumPy broadcasting, dtypes, devices,
 * overlap between outputs and inputs) and hands the plugin one kernel over strided operands.
 * Mismatches are errors naming both shapes / dtypes / devices, never a crash or garbage.
 * There is no implicit dtype promotion: cast with ts_cast.
 *
 * Forms: `ts_add(a, b, &out)` returns a new tensor (transfer full) on a's device;
 * `ts_add_(a, b)` writes into a (b broadcast to a's shape) and bumps a's version;
 * `ts_add_out(a, b, out)` writes into an existing tensor of the result's shape and dtype.
 * Inputs are borrowed (transfer none). */
#ifndef TESSERA_OPS_H
#define TESSERA_OPS_H

#include <tessera/plugin.h>
#include <tessera/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- elementwise ------------------------------------------------------------------------- */

/* fn is a ts_binary_fn; comparisons give a TS_U8 mask. Shapes broadcast NumPy-style. */
ts_status ts_binary(int fn, const ts_tensor *a, const ts_tensor *b, ts_tensor **out);
ts_status ts_binary_out(int fn, const ts_tensor *a, const ts_tensor *b, ts_tensor *out);
ts_status ts_binary_(int fn, ts_tensor *a, const ts_tensor *b);
/* fn(x, scalar), or fn(scalar, x) with scalar_first. */
ts_status ts_binary_scalar(int fn, const ts_tensor *x, double scalar, int scalar_first,
                           ts_tensor **out);
ts_status ts_binary_scalar_(int fn, ts_tensor *x, double scalar);
/* fn is a ts_unary_fn. */
ts_status ts_unary(int fn, const ts_tensor *x, ts_tensor **out);
ts_status ts_unary_out(int fn, const ts_tensor *x, ts_tensor *out);
ts_status ts_unary_(int fn, ts_tensor *x);

ts_status ts_add(const ts_tensor *a, const ts_tensor *b, ts_tensor **out);
ts_status ts_sub(const ts_tensor *a, const ts_tensor *b, ts_tensor **out);
ts_status ts_mul(const ts_tensor *a, const ts_tensor *b, ts_tensor **out);
ts_status ts_div(const ts_tensor *a, const ts_tensor *b, ts_tensor **out);
ts_status ts_pow(const ts_tensor *a, const ts_tensor *b, ts_tensor **out);
ts_status ts_maximum(const ts_tensor *a, const ts_tensor *b, ts_tensor **out);
ts_status ts_minimum(const ts_tensor *a, const ts_tensor *b, ts_tensor **out);
ts_status ts_eq(const ts_tensor *a, const ts_tensor *b, ts_tensor **out);
ts_status ts_ne(const ts_tensor *a, const ts_tensor *b, ts_tensor **out);
ts_status ts_lt(const ts_tensor *a, const ts_tensor *b, ts_tensor **out);
ts_status ts_le(const ts_tensor *a, const ts_tensor *b, ts_tensor **out);
ts_status ts_gt(const ts_tensor *a, const ts_tensor *b, ts_tensor **out);
ts_status ts_ge(const ts_tensor *a, const ts_tensor *b, ts_tensor **out);
ts_status ts_add_(ts_tensor *a, const ts_tensor *b);
ts_status ts_sub_(ts_tensor *a, const ts_tensor *b);
ts_status ts_mul_(ts_tensor *a, const ts_tensor *b);
ts_status ts_div_(ts_tensor *a, const ts_tensor *b);
ts_status ts_add_out(const ts_tensor *a, const ts_tensor *b, ts_tensor *out);
ts_status ts_mul_out(const ts_tensor *a, const ts_tensor *b, ts_tensor *out);

ts_status ts_add_scalar(const ts_tensor *x, double s, ts_tensor **out);
ts_status ts_mul_scalar(const ts_tensor *x, double s, ts_tensor **out);
ts_status ts_pow_scalar(const ts_tensor *x, double s, ts_tensor **out);
ts_status ts_add_scalar_(ts_tensor *x, double s);
ts_status ts_mul_scalar_(ts_tensor *x, double s);

ts_status ts_neg(const ts_tensor *x, ts_tensor **out);
ts_status ts_abs(const ts_tensor *x, ts_tensor **out);
ts_status ts_exp(const ts_tensor *x, ts_tensor **out);
ts_status ts_log(const ts_tensor *x, ts_tensor **out);
ts_status ts_sqrt(const ts_tensor *x, ts_tensor **out);
ts_status ts_rsqrt(const ts_tensor *x, ts_tensor **out);
ts_status ts_tanh(const ts_tensor *x, ts_tensor **out);
ts_status ts_sigmoid(const ts_tensor *x, ts_tensor **out);
ts_status ts_relu(const ts_tensor *x, ts_tensor **out);
ts_status ts_gelu(const ts_tensor *x, ts_tensor **out);
/* GELU's tanh approximation, as GPT-2 trains with it. */
ts_status ts_gelu_tanh(const ts_tensor *x, ts_tensor **out);
/* SiLU (swish): x sigmoid(x), the activation of LLaMA-style gated MLPs. */
ts_status ts_silu(const ts_tensor *x, ts_tensor **out);
/* Layer norm over the last ndim dims of x (float): y = (x - mean) / sqrt(var + eps) * weight +
 * bias, with weight and bias (both or neither) of the trailing dims' shape. One fused kernel
 * each way where the device runs TS_OP_LAYER_NORM and its backward, the same arithmetic
 * composed from plain ops elsewhere. (transfer full) on *out. */
ts_status ts_layer_norm(const ts_tensor *x, const ts_tensor *weight, const ts_tensor *bias,
                        int ndim, double eps, ts_tensor **out);
/* RMS norm over the last ndim dims of x (float), as LLaMA's: y = x / sqrt(mean(x^2) + eps) *
 * weight, the weight (NULL: none) of the trailing dims' shape. Composed from plain ops, so
 * every device runs it forward and backward. (transfer full) on *out. */
ts_status ts_rms_norm(const ts_tensor *x, const ts_tensor *weight, int ndim, double eps,
                      ts_tensor **out);

/* Scaled dot-product attention: softmax(scale q k^T + mask) v over the last two dims, q
 * (..., Tq, D), k (..., Tk, D), v (..., Tk, Dv) with the same leading dims (for a GPT: batch
 * and heads), out (..., Tq, Dv). causal 1: query i sees keys j <= i + Tk - Tq (with Tq == Tk
 * the usual lower triangle; Tq <= Tk); 0: every key. scale 0 means 1 / sqrt(D). Float
 * dtypes, all three the same; under autocast it runs in the low dtype. Where the device runs
 * TS_OP_ATTENTION and its backward, one fused pass each way (the online softmax of
 * FlashAttention: no Tq x Tk matrix is stored, only q, k, v, the output and one float per
 * row for the backward); elsewhere the same arithmetic composed from matmul and softmax.
 * (transfer full) on *out. */
ts_status ts_attention(const ts_tensor *q, const ts_tensor *k, const ts_tensor *v, int causal,
                       double scale, ts_tensor **out);
/* How ts_attention chooses, for the whole process: TS_ATTENTION_FUSED wherever the device
 * runs the fused kernel, TS_ATTENTION_COMPOSED never, TS_ATTENTION_AUTO (the default) where it
 * was measured to be faster: on a CPU plugin from 512 keys on (below that its BLAS GEMMs
 * win), on a GPU below 512 keys (above, cuBLAS's GEMMs win). The fused pass always saves the
 * score matrices: choose TS_ATTENTION_FUSED when memory is what limits. Any other value only
 * asks. Returns the mode before the call. The results agree to rounding either way. */
enum { TS_ATTENTION_COMPOSED = 0, TS_ATTENTION_FUSED = 1, TS_ATTENTION_AUTO = 2 };
int ts_attention_fused(int mode);
/* 1 if ts_attention(q, k, ...) would run the fused kernel now (the mode, the device, the
 * dtype under autocast, the number of keys), else 0: a model with a composed path of its own
 * (a causal mask it keeps on the device) takes that one instead. */
int ts_attention_fuses(const ts_tensor *q, const ts_tensor *k);

/* cond (TS_U8) ? a : b, all three broadcast together. */
ts_status ts_where(const ts_tensor *cond, const ts_tensor *a, const ts_tensor *b,
                   ts_tensor **out);
/* The same values as dtype (float -> int truncates, anything -> uint8 is != 0). */
ts_status ts_cast(const ts_tensor *x, int32_t dtype, ts_tensor **out);
/* Writes value into every element of t (any strides). */
ts_status ts_fill_(ts_tensor *t, double value);
ts_status ts_zero_(ts_tensor *t);
/* dst[...] = src broadcast to dst's shape; dtypes may differ (cast), devices may differ. */
ts_status ts_copy_(ts_tensor *dst, const ts_tensor *src);

/* ---- reductions -------------------------------------------------------------------------- */

/* Over the ndims dims listed (ndims 0: all dims). keepdim keeps them with size 1. */
ts_status ts_sum(const ts_tensor *x, int ndims, const int *dims, int keepdim, ts_tensor **out);
ts_status ts_mean(const ts_tensor *x, int ndims, const int *dims, int keepdim, ts_tensor **out);
ts_status ts_max(const ts_tensor *x, int ndims, const int *dims, int keepdim, ts_tensor **out);
ts_status ts_min(const ts_tensor *x, int ndims, const int *dims, int keepdim, ts_tensor **out);
/* TS_I64 index of the first maximum / minimum along dim. */
ts_status ts_argmax(const ts_tensor *x, int dim, int keepdim, ts_tensor **out);
ts_status ts_argmin(const ts_tensor *x, int dim, int keepdim, ts_tensor **out);

/* ---- linear algebra and nn ----------------------------------------------------------------- */

/* NumPy matmul: 1-D operands are promoted (and the added dim removed), batch dims broadcast.
 * Float dtypes. TS_ESHAPE names both shapes when the inner dims differ. */
ts_status ts_matmul(const ts_tensor *a, const ts_tensor *b, ts_tensor **out);
ts_status ts_matmul_out(const ts_tensor *a, const ts_tensor *b, ts_tensor *out);
/* Numerically stable, along dim. */
ts_status ts_softmax(const ts_tensor *x, int dim, ts_tensor **out);
ts_status ts_log_softmax(const ts_tensor *x, int dim, ts_tensor **out);
/* Rows of x along dim at the 1-D TS_I64/TS_I32 index (range-checked). */
ts_status ts_index_select(const ts_tensor *x, int dim, const ts_tensor *index, ts_tensor **out);
/* weight (V, D...) rows at index of any shape: out index.shape + (D...). */
ts_status ts_embedding(const ts_tensor *weight, const ts_tensor *index, ts_tensor **out);
/* x.select(dim, index[i]) += src.select(dim, i): the scatter-add that embedding backward uses.
 * Duplicate indices accumulate. */
ts_status ts_index_add_(ts_tensor *x, int dim, const ts_tensor *index, const ts_tensor *src);
/* x (N, C, H, W), w (K, C/groups, R, S), bias (K) or NULL -> (N, K, P, Q). */
ts_status ts_conv2d(const ts_tensor *x, const ts_tensor *w, const ts_tensor *bias,
                    const ts_conv2d_params *p, ts_tensor **out);
/* x (N, C, H, W) -> (N, C, P, Q); indices (TS_I64, flat within each H*W plane) if non-NULL. */
ts_status ts_max_pool2d(const ts_tensor *x, const ts_pool2d_params *p, ts_tensor **out,
                        ts_tensor **indices);
ts_status ts_avg_pool2d(const ts_tensor *x, const ts_pool2d_params *p, ts_tensor **out);

#ifdef __cplusplus
}
#endif
#endif /* TESSERA_OPS_H */
