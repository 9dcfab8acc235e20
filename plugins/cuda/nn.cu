/* plugins/cuda/nn.cu: index_select / index_add (atomics), index range checks, max/avg
 * pooling forward and backward, im2col / col2im / bias for the cuBLAS convolution, and the
 * fused SGD / Adam(W) updates. One thread per element, grid-stride loops, 64-bit indices. */
#include "common.cuh"

namespace {

/* ---- atomics ------------------------------------------------------------------------- */

__device__ __forceinline__ void atomic_add(float *p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(double *p, double v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(int32_t *p, int32_t v)
{
    atomicAdd((unsigned int *)p, (unsigned int)v); /* wraps like the host's int32 */
}
__device__ __forceinline__ void atomic_add(int64_t *p, int64_t v)
{
    atomicAdd((unsigned long long *)p, (unsigned long long)v);
}
/* A byte: compare-and-swap on the aligned 32-bit word holding it (pool blocks are 256-byte
 * aligned and sized, so the word lies inside the allocation). */
__device__ __forceinline__ void atomic_add(uint8_t *p, uint8_t v)
{
    uintptr_t a = (uintptr_t)p;
    unsigned int *w = (unsigned int *)(a & ~(uintptr_t)3);
    unsigned int shift = (unsigned int)(a & 3) * 8u, old = *w, assumed;
    do {
        assumed = old;
        unsigned int b = ((assumed >> shift) + v) & 0xffu;
        old = atomicCAS(w, assumed, (assumed & ~(0xffu << shift)) | (b << shift));
    } while (assumed != old);
}

/* ---- index --------------------------------------------------------------------------- */

__device__ __forceinline__ int64_t load_index(const void *p, int32_t dtype, int64_t off)
{
    return dtype == TS_I64 ? ((const int64_t *)p)[off] : (int64_t)((const int32_t *)p)[off];
}

__global__ void k_out_of_range(cu_idx_view v, int64_t n, int64_t hi, unsigned long long *flag)
{
    CU_GRID_LOOP(e, n)
    {
        int64_t off = 0, rem = e;
        for (int d = v.ndim - 1; d >= 0; d--) {
            off += rem % v.shape[d] * v.strides[d];
            rem /= v.shape[d];
        }
        int64_t x = load_index(v.data, v.dtype, off);
        if (x < 0 || x >= hi)
            atomicMin(flag, (unsigned long long)e);
    }
}

template <typename T> __global__ void k_index(cu_index_arg a, int64_t n)
{
    CU_GRID_LOOP(e, n)
    {
        int64_t rem = e, doff = 0, soff = 0, i = 0;
        for (int d = a.ndim - 1; d >= 0; d--) {
            int64_t c = rem % a.shape[d];
            rem /= a.shape[d];
            if (d == a.dim) {
                i = c;
                continue;
            }
            doff += c * a.dst_strides[d];
            soff += c * a.src_strides[d];
        }
        int64_t j = load_index(a.ix, a.ix_dtype, i * a.ix_stride);
        if (j < 0 || j >= a.bound)
            continue;
        if (a.add)
            atomic_add((T *)a.dst + doff + j * a.dst_strides[a.dim],
                       ((const T *)a.src)[soff + i * a.src_strides[a.dim]]);
        else
            ((T *)a.dst)[doff + i * a.dst_strides[a.dim]] =
                ((const T *)a.src)[soff + j * a.src_strides[a.dim]];
    }
}

/* ---- pooling ------------------------------------------------------------------------- */

__device__ __forceinline__ void unravel4(int64_t e, const int64_t *n, int64_t *c)
{
    c[3] = e % n[3];
    e /= n[3];
    c[2] = e % n[2];
    e /= n[2];
    c[1] = e % n[1];
    c[0] = e / n[1];
}

__device__ __forceinline__ int64_t off4(const cu_t4 &t, int64_t a, int64_t b, int64_t c, int64_t d)
{
    return a * t.s[0] + b * t.s[1] + c * t.s[2] + d * t.s[3];
}

template <typename T>
__global__ void k_pool(cu_t4 x, cu_t4 y, cu_t4 ix, ts_pool2d_params p, int is_max, int64_t n)
{
    const T *xd = (const T *)x.p;
    int64_t H = x.n[2], W = x.n[3];
    CU_GRID_LOOP(e, n)
    {
        int64_t c[4];
        unravel4(e, y.n, c);
        int64_t h0 = c[2] * p.stride_h - p.pad_h, h1 = h0 + p.kernel_h;
        int64_t w0 = c[3] * p.stride_w - p.pad_w, w1 = w0 + p.kernel_w;
        int64_t hs = h0 < 0 ? 0 : h0, he = h1 > H ? H : h1;
        int64_t ws = w0 < 0 ? 0 : w0, we = w1 > W ? W : w1;
        const T *xp = xd + c[0] * x.s[0] + c[1] * x.s[1];
        T out;
        if (is_max) {
            T best = (T)-INFINITY;
            int64_t arg = hs * W + ws;
            for (int64_t hh = hs; hh < he; hh++)
                for (int64_t ww = ws; ww < we; ww++) {
                    T v = xp[hh * x.s[2] + ww * x.s[3]];
                    if (v > best || (v != v && best == best)) {
                        best = v;
                        arg = hh * W + ww;
                    }
                }
            out = best;
            if (ix.p)
                ((int64_t *)ix.p)[off4(ix, c[0], c[1], c[2], c[3])] = arg;
        } else {
            double sum = 0.0;
            for (int64_t hh = hs; hh < he; hh++)
                for (int64_t ww = ws; ww < we; ww++)
                    sum += (double)xp[hh * x.s[2] + ww * x.s[3]];
            int64_t cnt = p.count_include_pad ? (int64_t)p.kernel_h * p.kernel_w
                                              : (he - hs) * (we - ws);
            out = (T)(sum / (double)cnt);
        }
        ((T *)y.p)[off4(y, c[0], c[1], c[2], c[3])] = out;
    }
}

/* Max backward: gy scattered to the (range-checked) indices; gx zeroed by the caller. */
template <typename T> __global__ void k_maxpool_bwd(cu_t4 gy, cu_t4 ix, cu_t4 gx, int64_t n)
{
    int64_t W = gx.n[3];
    CU_GRID_LOOP(e, n)
    {
        int64_t c[4];
        unravel4(e, gy.n, c);
        int64_t a = ((const int64_t *)ix.p)[off4(ix, c[0], c[1], c[2], c[3])];
        atomic_add((T *)gx.p + off4(gx, c[0], c[1], a / W, a % W),
                   ((const T *)gy.p)[off4(gy, c[0], c[1], c[2], c[3])]);
    }
}

/* First window index p with p * stride - pad + kernel > h, i.e. covering h from below. */
__device__ __forceinline__ int64_t first_cover(int64_t h, int pad, int kernel, int stride)
{
    int64_t t = h + pad - kernel + 1;
    return t <= 0 ? 0 : (t + stride - 1) / stride;
}

/* Avg backward as a gather: each gx element sums the shares of the windows covering it. */
template <typename T>
__global__ void k_avgpool_bwd(cu_t4 gy, cu_t4 gx, ts_pool2d_params p, int64_t n)
{
    int64_t H = gx.n[2], W = gx.n[3], P = gy.n[2], Q = gy.n[3];
    CU_GRID_LOOP(e, n)
    {
        int64_t c[4];
        unravel4(e, gx.n, c);
        int64_t ps = first_cover(c[2], p.pad_h, p.kernel_h, p.stride_h);
        int64_t pe = (c[2] + p.pad_h) / p.stride_h;
        int64_t qs = first_cover(c[3], p.pad_w, p.kernel_w, p.stride_w);
        int64_t qe = (c[3] + p.pad_w) / p.stride_w;
        if (pe > P - 1)
            pe = P - 1;
        if (qe > Q - 1)
            qe = Q - 1;
        double acc = 0.0;
        for (int64_t pp = ps; pp <= pe; pp++) {
            int64_t h0 = pp * p.stride_h - p.pad_h, h1 = h0 + p.kernel_h;
            int64_t hs = h0 < 0 ? 0 : h0, he = h1 > H ? H : h1;
            for (int64_t q = qs; q <= qe; q++) {
                int64_t w0 = q * p.stride_w - p.pad_w, w1 = w0 + p.kernel_w;
                int64_t ws = w0 < 0 ? 0 : w0, we = w1 > W ? W : w1;
                int64_t cnt = p.count_include_pad ? (int64_t)p.kernel_h * p.kernel_w
                                                  : (he - hs) * (we - ws);
                T g = ((const T *)gy.p)[off4(gy, c[0], c[1], pp, q)];
                acc += (double)(T)((double)g / (double)cnt);
            }
        }
        ((T *)gx.p)[off4(gx, c[0], c[1], c[2], c[3])] = (T)acc;
    }
}

/* ---- convolution helpers ------------------------------------------------------------- */

template <typename T>
__global__ void k_im2col(cu_t4 x, int64_t n0, ts_conv2d_params p, cu_col_layout l, T *col,
                         int64_t n)
{
    int64_t C = x.n[1], H = x.n[2], W = x.n[3], PQ = l.P * l.Q, RS = l.R * l.S;
    CU_GRID_LOOP(e, n)
    {
        int64_t pq = e % PQ, row = e / PQ % (C * RS), j = e / (PQ * C * RS);
        int64_t c = row / RS, r = row / l.S % l.R, s = row % l.S;
        int64_t h = pq / l.Q * p.stride_h - p.pad_h + r * p.dilation_h;
        int64_t w = pq % l.Q * p.stride_w - p.pad_w + s * p.dilation_w;
        T v = (T)0;
        if (h >= 0 && h < H && w >= 0 && w < W)
            v = ((const T *)x.p)[off4(x, n0 + j, c, h, w)];
        col[j * l.img_stride + row * l.row_stride + pq] = v;
    }
}

template <typename T>
__global__ void k_col2im(const T *col, cu_col_layout l, ts_conv2d_params p, cu_t4 gx, int64_t n0,
                         int64_t n)
{
    int64_t C = gx.n[1], H = gx.n[2], W = gx.n[3];
    CU_GRID_LOOP(e, n)
    {
        int64_t w = e % W, h = e / W % H, c = e / (W * H) % C, j = e / (W * H * C);
        double acc = 0.0;
        for (int64_t r = 0; r < l.R; r++) {
            int64_t th = h + p.pad_h - r * p.dilation_h;
            if (th < 0 || th % p.stride_h)
                continue;
            int64_t pp = th / p.stride_h;
            if (pp >= l.P)
                continue;
            for (int64_t s = 0; s < l.S; s++) {
                int64_t tw = w + p.pad_w - s * p.dilation_w;
                if (tw < 0 || tw % p.stride_w)
                    continue;
                int64_t q = tw / p.stride_w;
                if (q >= l.Q)
                    continue;
                acc += (double)col[j * l.img_stride + ((c * l.R + r) * l.S + s) * l.row_stride +
                                   pp * l.Q + q];
            }
        }
        ((T *)gx.p)[off4(gx, n0 + j, c, h, w)] = (T)acc;
    }
}

template <typename T>
__global__ void k_bias_out(const T *src, int src_dense, const T *bias, int64_t bs, cu_t4 y,
                           int64_t n0, int64_t n)
{
    int64_t K = y.n[1], P = y.n[2], Q = y.n[3];
    CU_GRID_LOOP(e, n)
    {
        int64_t q = e % Q, pp = e / Q % P, k = e / (Q * P) % K, j = e / (Q * P * K);
        int64_t yo = off4(y, n0 + j, k, pp, q);
        T v = src_dense ? src[e] : ((const T *)y.p)[yo];
        if (bias)
            v += bias[k * bs];
        ((T *)y.p)[yo] = v;
    }
}

/* ---- optimizers ---------------------------------------------------------------------- */

template <typename T>
__global__ void k_sgd(int64_t n, const T *g, T *p, T *buf, T lr, T mu, T damp, T wd, int nesterov,
                      int first)
{
    CU_GRID_LOOP(i, n)
    {
        T d = wd != 0 ? g[i] + wd * p[i] : g[i];
        if (buf) {
            buf[i] = first ? d : mu * buf[i] + damp * d;
            d = nesterov ? d + mu * buf[i] : buf[i];
        }
        p[i] -= lr * d;
    }
}

__device__ __forceinline__ float sq(float x) { return sqrtf(x); }
__device__ __forceinline__ double sq(double x) { return sqrt(x); }

template <typename T>
__global__ void k_adam(int64_t n, const T *g, T *p, T *m, T *v, T b1, T b2, T ob1, T ob2, T eps,
                       T wd, T decay, T inv_bc2, T step, int decoupled)
{
    CU_GRID_LOOP(i, n)
    {
        T gi = g[i];
        if (decoupled)
            p[i] *= decay;
        else if (wd != 0)
            gi += wd * p[i];
        m[i] = b1 * m[i] + ob1 * gi;
        v[i] = b2 * v[i] + ob2 * gi * gi;
        p[i] -= step * m[i] / (sq(v[i]) * inv_bc2 + eps);
    }
}

template <typename T>
cudaError_t launch_sgd(cudaStream_t st, int64_t n, const void *g, void *p, void *buf,
                       const ts_sgd_params *P)
{
    k_sgd<T><<<cu_blocks(n, CU_THREADS), CU_THREADS, 0, st>>>(
        n, (const T *)g, (T *)p, (T *)buf, (T)P->lr, (T)P->momentum, (T)(1 - P->dampening),
        (T)P->weight_decay, P->nesterov, P->first_step);
    return cu_launched();
}

template <typename T>
cudaError_t launch_adam(cudaStream_t st, int64_t n, const void *g, void *p, void *m, void *v,
                        const ts_adam_params *P)
{
    T inv_bc2 = (T)(1 / sqrt(1 - pow(P->beta2, (double)P->step)));
    T step = (T)(P->lr / (1 - pow(P->beta1, (double)P->step)));
    k_adam<T><<<cu_blocks(n, CU_THREADS), CU_THREADS, 0, st>>>(
        n, (const T *)g, (T *)p, (T *)m, (T *)v, (T)P->beta1, (T)P->beta2, (T)(1 - P->beta1),
        (T)(1 - P->beta2), (T)P->eps, (T)P->weight_decay, (T)(1 - P->lr * P->weight_decay),
        inv_bc2, step, P->decoupled);
    return cu_launched();
}

int64_t numel4(const int64_t *n)
{
    return n[0] * n[1] * n[2] * n[3];
}

} // namespace

extern "C" cudaError_t cu_find_out_of_range(cudaStream_t st, const cu_idx_view *v, int64_t hi,
                                            unsigned long long *flag)
{
    int64_t n = 1;
    for (int d = 0; d < v->ndim; d++)
        n *= v->shape[d];
    if (n == 0)
        return cudaSuccess;
    if (v->ndim < 0 || v->ndim > 4 || (v->dtype != TS_I32 && v->dtype != TS_I64))
        return cudaErrorInvalidValue;
    k_out_of_range<<<cu_blocks(n, CU_THREADS), CU_THREADS, 0, st>>>(*v, n, hi, flag);
    return cu_launched();
}

extern "C" cudaError_t cu_index(cudaStream_t st, const cu_index_arg *a)
{
    int64_t n = 1;
    for (int d = 0; d < a->ndim; d++)
        n *= a->shape[d];
    if (n == 0)
        return cudaSuccess;
    unsigned b = cu_blocks(n, CU_THREADS);
    switch (a->dtype) {
    case TS_F32: k_index<float><<<b, CU_THREADS, 0, st>>>(*a, n); break;
    case TS_F64: k_index<double><<<b, CU_THREADS, 0, st>>>(*a, n); break;
    case TS_I32: k_index<int32_t><<<b, CU_THREADS, 0, st>>>(*a, n); break;
    case TS_I64: k_index<int64_t><<<b, CU_THREADS, 0, st>>>(*a, n); break;
    case TS_U8: k_index<uint8_t><<<b, CU_THREADS, 0, st>>>(*a, n); break;
    default: return cudaErrorInvalidValue;
    }
    return cu_launched();
}

extern "C" cudaError_t cu_pool2d(cudaStream_t st, int32_t dtype, int is_max,
                                 const ts_pool2d_params *p, const cu_t4 *x, const cu_t4 *y,
                                 const cu_t4 *ix)
{
    int64_t n = numel4(y->n);
    if (n == 0)
        return cudaSuccess;
    cu_t4 none = {};
    unsigned b = cu_blocks(n, CU_THREADS);
    if (dtype == TS_F32)
        k_pool<float><<<b, CU_THREADS, 0, st>>>(*x, *y, ix ? *ix : none, *p, is_max, n);
    else if (dtype == TS_F64)
        k_pool<double><<<b, CU_THREADS, 0, st>>>(*x, *y, ix ? *ix : none, *p, is_max, n);
    else
        return cudaErrorInvalidValue;
    return cu_launched();
}

extern "C" cudaError_t cu_pool2d_bwd(cudaStream_t st, int32_t dtype, const ts_pool2d_params *p,
                                     const cu_t4 *gy, const cu_t4 *ix, const cu_t4 *gx)
{
    if (ix) {
        int64_t n = numel4(gy->n);
        if (n == 0)
            return cudaSuccess;
        unsigned b = cu_blocks(n, CU_THREADS);
        if (dtype == TS_F32)
            k_maxpool_bwd<float><<<b, CU_THREADS, 0, st>>>(*gy, *ix, *gx, n);
        else if (dtype == TS_F64)
            k_maxpool_bwd<double><<<b, CU_THREADS, 0, st>>>(*gy, *ix, *gx, n);
        else
            return cudaErrorInvalidValue;
        return cu_launched();
    }
    int64_t n = numel4(gx->n);
    if (n == 0)
        return cudaSuccess;
    unsigned b = cu_blocks(n, CU_THREADS);
    if (dtype == TS_F32)
        k_avgpool_bwd<float><<<b, CU_THREADS, 0, st>>>(*gy, *gx, *p, n);
    else if (dtype == TS_F64)
        k_avgpool_bwd<double><<<b, CU_THREADS, 0, st>>>(*gy, *gx, *p, n);
    else
        return cudaErrorInvalidValue;
    return cu_launched();
}

extern "C" cudaError_t cu_im2col(cudaStream_t st, int32_t dtype, const cu_t4 *x, int64_t n0,
                                 int64_t nb, const ts_conv2d_params *p, const cu_col_layout *l,
                                 void *col)
{
    int64_t n = nb * x->n[1] * l->R * l->S * l->P * l->Q;
    if (n == 0)
        return cudaSuccess;
    unsigned b = cu_blocks(n, CU_THREADS);
    if (dtype == TS_F32)
        k_im2col<float><<<b, CU_THREADS, 0, st>>>(*x, n0, *p, *l, (float *)col, n);
    else if (dtype == TS_F64)
        k_im2col<double><<<b, CU_THREADS, 0, st>>>(*x, n0, *p, *l, (double *)col, n);
    else
        return cudaErrorInvalidValue;
    return cu_launched();
}

extern "C" cudaError_t cu_col2im(cudaStream_t st, int32_t dtype, const void *col,
                                 const cu_col_layout *l, const ts_conv2d_params *p,
                                 const cu_t4 *gx, int64_t n0, int64_t nb)
{
    int64_t n = nb * gx->n[1] * gx->n[2] * gx->n[3];
    if (n == 0)
        return cudaSuccess;
    unsigned b = cu_blocks(n, CU_THREADS);
    if (dtype == TS_F32)
        k_col2im<float><<<b, CU_THREADS, 0, st>>>((const float *)col, *l, *p, *gx, n0, n);
    else if (dtype == TS_F64)
        k_col2im<double><<<b, CU_THREADS, 0, st>>>((const double *)col, *l, *p, *gx, n0, n);
    else
        return cudaErrorInvalidValue;
    return cu_launched();
}

extern "C" cudaError_t cu_bias_out(cudaStream_t st, int32_t dtype, const void *src,
                                   int src_dense, const void *bias, int64_t bs, const cu_t4 *y,
                                   int64_t n0, int64_t nb)
{
    int64_t n = nb * y->n[1] * y->n[2] * y->n[3];
    if (n == 0)
        return cudaSuccess;
    unsigned b = cu_blocks(n, CU_THREADS);
    if (dtype == TS_F32)
        k_bias_out<float><<<b, CU_THREADS, 0, st>>>((const float *)src, src_dense,
                                                    (const float *)bias, bs, *y, n0, n);
    else if (dtype == TS_F64)
        k_bias_out<double><<<b, CU_THREADS, 0, st>>>((const double *)src, src_dense,
                                                     (const double *)bias, bs, *y, n0, n);
    else
        return cudaErrorInvalidValue;
    return cu_launched();
}

extern "C" cudaError_t cu_sgd(cudaStream_t st, int32_t dtype, int64_t n, const void *g, void *p,
                              void *buf, const ts_sgd_params *P)
{
    if (n == 0)
        return cudaSuccess;
    if (dtype == TS_F32)
        return launch_sgd<float>(st, n, g, p, buf, P);
    if (dtype == TS_F64)
        return launch_sgd<double>(st, n, g, p, buf, P);
    return cudaErrorInvalidValue;
}

extern "C" cudaError_t cu_adam(cudaStream_t st, int32_t dtype, int64_t n, const void *g, void *p,
                               void *m, void *v, const ts_adam_params *P)
{
    if (n == 0)
        return cudaSuccess;
    if (dtype == TS_F32)
        return launch_adam<float>(st, n, g, p, m, v, P);
    if (dtype == TS_F64)
        return launch_adam<double>(st, n, g, p, m, v, P);
    return cudaErrorInvalidValue;
}

/* ---- layer norm ------------------------------------------------------------------------ */

/* One block per row (grid-stride over rows): the mean, then the variance around it, both
 * summed in double across the block; y = (x - mean) rstd w + b in T, as the host kernels. */
template <typename T>
__global__ void k_ln_fwd(const T *x, const T *w, const T *b, T *y, T *mean, T *rstd, int64_t R,
                         int64_t D, double eps)
{
    __shared__ double sh[32];
    for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
        const T *xr = x + r * D;
        T *yr = y + r * D;
        double s = 0;
        for (int64_t j = threadIdx.x; j < D; j += blockDim.x)
            s += (double)xr[j];
        const double mu = cu_block_sum(s, sh) / (double)D;
        double v = 0;
        for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
            double d = (double)xr[j] - mu;
            v += d * d;
        }
        const double rs = 1.0 / sqrt(cu_block_sum(v, sh) / (double)D + eps);
        if (threadIdx.x == 0) {
            mean[r] = (T)mu;
            rstd[r] = (T)rs;
        }
        const T m_ = (T)mu, s_ = (T)rs;
        for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
            T t = (xr[j] - m_) * s_;
            yr[j] = w ? t * w[j] + b[j] : t;
        }
    }
}

/* gx = rstd (g w - mean_j(g w) - xhat mean_j(g w xhat)), one block per row. */
template <typename T>
__global__ void k_ln_bwd_x(const T *gy, const T *x, const T *mean, const T *rstd, const T *w,
                           T *gx, int64_t R, int64_t D)
{
    __shared__ double sh[32];
    for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
        const T *g = gy + r * D, *xr = x + r * D;
        const double mu = (double)mean[r], rs = (double)rstd[r];
        double a1 = 0, a2 = 0;
        for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
            double gw = (double)g[j] * (w ? (double)w[j] : 1.0);
            a1 += gw;
            a2 += gw * ((double)xr[j] - mu) * rs;
        }
        a1 = cu_block_sum(a1, sh) / (double)D;
        a2 = cu_block_sum(a2, sh) / (double)D;
        for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
            double gw = (double)g[j] * (w ? (double)w[j] : 1.0);
            double xh = ((double)xr[j] - mu) * rs;
            gx[r * D + j] = (T)(rs * (gw - a1 - xh * a2));
        }
    }
}

/* gw[j] = sum over rows of g xhat, gb[j] = sum of g. */
template <typename T>
__global__ void k_ln_bwd_w(const T *gy, const T *x, const T *mean, const T *rstd, T *gw, T *gb,
                           int64_t R, int64_t D)
{
    /* 32 columns per block, 32 row lanes per column: lane ty sums rows ty, ty + 32, ...; the
     * lanes' sums are then added in lane order (deterministic). Reads of a row's 32 adjacent
     * columns coalesce. */
    __shared__ double sw[32][33], sb[32][33];
    const int tx = threadIdx.x, ty = threadIdx.y;
    for (int64_t j0 = (int64_t)blockIdx.x * 32; j0 < D; j0 += (int64_t)gridDim.x * 32) {
        const int64_t j = j0 + tx;
        double aw = 0, ab = 0;
        if (j < D)
            for (int64_t r = ty; r < R; r += 32) {
                double g = (double)gy[r * D + j];
                aw += g * ((double)x[r * D + j] - (double)mean[r]) * (double)rstd[r];
                ab += g;
            }
        sw[ty][tx] = aw;
        sb[ty][tx] = ab;
        __syncthreads();
        if (ty == 0 && j < D) {
            double tw = 0, tb = 0;
            for (int k = 0; k < 32; k++) {
                tw += sw[k][tx];
                tb += sb[k][tx];
            }
            gw[j] = (T)tw;
            gb[j] = (T)tb;
        }
        __syncthreads();
    }
}

static unsigned row_blocks(int64_t rows)
{
    return (unsigned)(rows < CU_MAX_BLOCKS ? rows : CU_MAX_BLOCKS);
}

extern "C" cudaError_t cu_layer_norm(cudaStream_t st, int32_t dtype, const void *x, const void *w,
                                     const void *b, void *y, void *mean, void *rstd,
                                     int64_t rows, int64_t D, double eps)
{
    if (rows == 0 || D == 0)
        return cudaSuccess;
    const unsigned blocks = row_blocks(rows);
    const int threads = cu_row_threads(D);
    if (dtype == TS_F32)
        k_ln_fwd<float><<<blocks, threads, 0, st>>>((const float *)x, (const float *)w,
                                                    (const float *)b, (float *)y, (float *)mean,
                                                    (float *)rstd, rows, D, eps);
    else if (dtype == TS_F64)
        k_ln_fwd<double><<<blocks, threads, 0, st>>>((const double *)x, (const double *)w,
                                                     (const double *)b, (double *)y,
                                                     (double *)mean, (double *)rstd, rows, D,
                                                     eps);
    else
        return cudaErrorInvalidValue;
    return cu_launched();
}

extern "C" cudaError_t cu_layer_norm_bwd(cudaStream_t st, int32_t dtype, const void *gy,
                                         const void *x, const void *mean, const void *rstd,
                                         const void *w, void *gx, void *gw, void *gb,
                                         int64_t rows, int64_t D)
{
    if (D == 0)
        return cudaSuccess;
    if (rows == 0) { /* gradients of nothing: zero */
        if (!gw)
            return cudaSuccess;
        const size_t nb = (size_t)D * (dtype == TS_F32 ? 4 : 8);
        cudaError_t e = cudaMemsetAsync(gw, 0, nb, st);
        return e != cudaSuccess ? e : cudaMemsetAsync(gb, 0, nb, st);
    }
    const unsigned blocks = row_blocks(rows);
    const unsigned wblocks = (unsigned)((D + 31) / 32 < CU_MAX_BLOCKS ? (D + 31) / 32 : CU_MAX_BLOCKS);
    const dim3 wthreads(32, 32);
    const int threads = cu_row_threads(D);
    if (dtype == TS_F32) {
        k_ln_bwd_x<float><<<blocks, threads, 0, st>>>(
            (const float *)gy, (const float *)x, (const float *)mean, (const float *)rstd,
            (const float *)w, (float *)gx, rows, D);
        if (gw)
            k_ln_bwd_w<float><<<wblocks, wthreads, 0, st>>>(
                (const float *)gy, (const float *)x, (const float *)mean, (const float *)rstd,
                (float *)gw, (float *)gb, rows, D);
    } else if (dtype == TS_F64) {
        k_ln_bwd_x<double><<<blocks, threads, 0, st>>>(
            (const double *)gy, (const double *)x, (const double *)mean, (const double *)rstd,
            (const double *)w, (double *)gx, rows, D);
        if (gw)
            k_ln_bwd_w<double><<<wblocks, wthreads, 0, st>>>(
                (const double *)gy, (const double *)x, (const double *)mean,
                (const double *)rstd, (double *)gw, (double *)gb, rows, D);
    } else {
        return cudaErrorInvalidValue;
    }
    return cu_launched();
}
