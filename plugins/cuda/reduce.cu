/* plugins/cuda/reduce.cu: reductions (one block per output element, or per part of one when
 * there are few outputs and long slices, the parts then combined in a second kernel),
 * softmax / log-softmax and the fused cross entropy (one block per row), all with
 * warp-shuffle trees. Float sums accumulate in double like the host kernels; max/min and
 * arg* keep the first NaN and, on ties, the first index, so the result does not depend on
 * the order the tree combines in. */
#include "common.cuh"

namespace {

/* A partial result: f the float sum / best value, i the integer one (sums wrap), at the
 * slice index of the best (-1: empty). */
struct part {
    double f;
    int64_t i;
    int64_t at;
};

__device__ __forceinline__ part part_empty()
{
    part p;
    p.f = 0;
    p.i = 0;
    p.at = -1;
    return p;
}

/* q folded into p. SUM/MEAN add; the others keep the better of the two by value, then by
 * the smaller index. */
template <bool FLOAT>
__device__ __forceinline__ part combine(int fn, part p, part q)
{
    if (fn == TS_REDUCE_SUM || fn == TS_REDUCE_MEAN) {
        p.f += q.f;
        p.i = (int64_t)((uint64_t)p.i + (uint64_t)q.i);
        return p;
    }
    if (q.at < 0)
        return p;
    if (p.at < 0)
        return q;
    bool maxish = fn == TS_REDUCE_MAX || fn == TS_REDUCE_ARGMAX;
    bool take;
    if (FLOAT) {
        bool pn = p.f != p.f, qn = q.f != q.f;
        if (pn || qn)
            take = pn && qn ? q.at < p.at : qn;
        else if (q.f == p.f)
            take = q.at < p.at;
        else
            take = maxish ? q.f > p.f : q.f < p.f;
    } else {
        if (q.i == p.i)
            take = q.at < p.at;
        else
            take = maxish ? q.i > p.i : q.i < p.i;
    }
    return take ? q : p;
}

template <bool FLOAT> __device__ __forceinline__ part shfl_down(part p, int o)
{
    part q;
    q.f = __shfl_down_sync(0xffffffffu, p.f, o);
    q.i = __shfl_down_sync(0xffffffffu, (long long)p.i, o);
    q.at = __shfl_down_sync(0xffffffffu, (long long)p.at, o);
    return q;
}

/* The block's combined result, valid in thread 0. sh: 32 parts of shared memory. */
template <bool FLOAT> __device__ __forceinline__ part block_combine(int fn, part r, part *sh)
{
    for (int o = 16; o > 0; o >>= 1)
        r = combine<FLOAT>(fn, r, shfl_down<FLOAT>(r, o));
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
    __syncthreads();
    if (lane == 0)
        sh[warp] = r;
    __syncthreads();
    if (warp == 0) {
        r = lane < nw ? sh[lane] : part_empty();
        for (int o = 16; o > 0; o >>= 1)
            r = combine<FLOAT>(fn, r, shfl_down<FLOAT>(r, o));
    }
    return r;
}

template <typename T> __device__ __forceinline__ part part_of(T v, int64_t at)
{
    part p;
    if (std::is_floating_point<T>::value) {
        p.f = (double)v;
        p.i = 0;
    } else {
        p.f = 0;
        p.i = (int64_t)v;
    }
    p.at = at;
    return p;
}

template <typename T>
__device__ __forceinline__ void store(const cu_rd_arg &a, const part &r, int64_t oo)
{
    switch (a.fn) {
    case TS_REDUCE_ARGMAX:
    case TS_REDUCE_ARGMIN:
        ((int64_t *)a.out)[oo] = r.at < 0 ? 0 : r.at;
        return;
    case TS_REDUCE_MEAN:
        ((T *)a.out)[oo] = (T)(r.f / (double)a.nslice); /* 0 / 0: NaN for an empty slice */
        return;
    default:
        break;
    }
    if constexpr (std::is_floating_point<T>::value)
        ((T *)a.out)[oo] = (T)r.f;
    else
        ((T *)a.out)[oo] = (T)(typename std::make_unsigned<T>::type)(uint64_t)r.i;
}

__device__ __forceinline__ void locate(const cu_rd_arg &a, int64_t j, int64_t *io, int64_t *oo)
{
    int64_t i = 0, o = 0;
    for (int d = a.nkeep - 1; d >= 0; d--) {
        int64_t c = j % a.keep_shape[d];
        j /= a.keep_shape[d];
        i += c * a.keep_in[d];
        o += c * a.keep_out[d];
    }
    *io = i;
    *oo = o;
}

template <typename T> __global__ void k_reduce(cu_rd_arg a, int nparts, part *parts)
{
    __shared__ part sh[32];
    constexpr bool FL = std::is_floating_point<T>::value;
    int64_t total = a.nout * nparts;
    const T *in = (const T *)a.in;
    for (int64_t blk = blockIdx.x; blk < total; blk += gridDim.x) {
        int64_t j = blk / nparts, pt = blk % nparts;
        int64_t lo = a.nslice / nparts * pt + (pt < a.nslice % nparts ? pt : a.nslice % nparts);
        int64_t hi = lo + a.nslice / nparts + (pt < a.nslice % nparts ? 1 : 0);
        int64_t io, oo;
        locate(a, j, &io, &oo);
        part r = part_empty();
        for (int64_t e = lo + threadIdx.x; e < hi; e += blockDim.x) {
            int64_t off = io, rem = e;
            for (int d = a.nred - 1; d >= 0; d--) {
                off += rem % a.red_shape[d] * a.red_in[d];
                rem /= a.red_shape[d];
            }
            r = combine<FL>(a.fn, r, part_of<T>(in[off], e));
        }
        r = block_combine<FL>(a.fn, r, sh);
        if (threadIdx.x == 0) {
            if (nparts == 1)
                store<T>(a, r, oo);
            else
                parts[blk] = r;
        }
    }
}

template <typename T> __global__ void k_reduce_finish(cu_rd_arg a, int nparts, const part *parts)
{
    constexpr bool FL = std::is_floating_point<T>::value;
    CU_GRID_LOOP(j, a.nout)
    {
        part r = parts[j * nparts];
        for (int p = 1; p < nparts; p++)
            r = combine<FL>(a.fn, r, parts[j * nparts + p]);
        int64_t io, oo;
        locate(a, j, &io, &oo);
        store<T>(a, r, oo);
    }
}

template <typename T> cudaError_t launch_reduce(cudaStream_t st, const cu_rd_arg *a, int nparts,
                                                void *scratch)
{
    int threads = cu_row_threads(a->nslice / nparts);
    int64_t blocks = a->nout * nparts;
    k_reduce<T><<<(unsigned)(blocks > CU_MAX_BLOCKS ? CU_MAX_BLOCKS : blocks), threads, 0, st>>>(
        *a, nparts, (part *)scratch);
    cudaError_t e = cu_launched();
    if (e != cudaSuccess || nparts == 1)
        return e;
    k_reduce_finish<T><<<cu_blocks(a->nout, CU_THREADS), CU_THREADS, 0, st>>>(
        *a, nparts, (const part *)scratch);
    return cu_launched();
}

/* ---- softmax ------------------------------------------------------------------------- */

__device__ __forceinline__ float ex(float x) { return expf(x); }
__device__ __forceinline__ double ex(double x) { return exp(x); }

template <typename T> __global__ void k_softmax(cu_sm_arg a)
{
    __shared__ double sh[32];
    for (int64_t j = blockIdx.x; j < a.nslices; j += gridDim.x) {
        int64_t rem = j, xo = 0, yo = 0;
        for (int d = a.nouter - 1; d >= 0; d--) {
            int64_t c = rem % a.oshape[d];
            rem /= a.oshape[d];
            xo += c * a.ostr_in[d];
            yo += c * a.ostr_out[d];
        }
        const T *x = (const T *)a.in + xo;
        T *y = (T *)a.out + yo;
        double m = -INFINITY;
        for (int64_t e = threadIdx.x; e < a.len; e += blockDim.x)
            m = cu_nanmax(m, (double)x[e * a.sx]);
        T mt = (T)cu_block_max(m, sh);
        double s = 0;
        for (int64_t e = threadIdx.x; e < a.len; e += blockDim.x)
            s += (double)ex((T)(x[e * a.sx] - mt));
        s = cu_block_sum(s, sh); /* its barriers also end every read of the pass above */
        if (a.log_form) {
            T lse = (T)log(s);
            for (int64_t e = threadIdx.x; e < a.len; e += blockDim.x)
                y[e * a.sy] = x[e * a.sx] - mt - lse;
        } else {
            T inv = (T)(1.0 / s);
            for (int64_t e = threadIdx.x; e < a.len; e += blockDim.x)
                y[e * a.sy] = ex((T)(x[e * a.sx] - mt)) * inv;
        }
        __syncthreads(); /* sh is reused by the next slice */
    }
}

/* ---- cross entropy ------------------------------------------------------------------- */

template <typename T> __global__ void k_xent(cu_xent_arg a)
{
    __shared__ double sh[32];
    const T *x = (const T *)a.x;
    for (int64_t i = blockIdx.x; i < a.N; i += gridDim.x) {
        const T *xr = x + i * a.xs0;
        int64_t ti = a.tdtype == TS_I64 ? ((const int64_t *)a.t)[i * a.ts]
                                        : (int64_t)((const int32_t *)a.t)[i * a.ts];
        /* Read before anything is written: glogits may be the logits themselves. */
        double g = a.bwd ? (double)((const T *)a.gl)[i * a.gls] : 0.0;
        double xt = (double)xr[ti * a.xs1];
        double m = -INFINITY;
        for (int64_t j = threadIdx.x; j < a.C; j += blockDim.x)
            m = cu_nanmax(m, (double)xr[j * a.xs1]);
        m = cu_block_max(m, sh);
        double s = 0;
        for (int64_t j = threadIdx.x; j < a.C; j += blockDim.x)
            s += exp((double)xr[j * a.xs1] - m);
        s = cu_block_sum(s, sh);
        double lse = m + log(s);
        T *o = (T *)a.out + i * a.os0;
        if (!a.bwd) {
            if (threadIdx.x == 0)
                o[0] = (T)(lse - xt);
        } else {
            for (int64_t j = threadIdx.x; j < a.C; j += blockDim.x) {
                double sm = exp((double)xr[j * a.xs1] - lse);
                o[j * a.os1] = (T)(g * (sm - (j == ti ? 1.0 : 0.0)));
            }
        }
        __syncthreads();
    }
}

} // namespace

extern "C" size_t cu_reduce_scratch(int64_t nout, int nparts)
{
    return (size_t)nout * (size_t)nparts * sizeof(part);
}

extern "C" cudaError_t cu_reduce(cudaStream_t st, const cu_rd_arg *a, int nparts, void *scratch)
{
    if (a->nout == 0)
        return cudaSuccess;
    if (nparts < 1 || (nparts > 1 && !scratch))
        return cudaErrorInvalidValue;
    switch (a->dtype) {
    case TS_F32: return launch_reduce<float>(st, a, nparts, scratch);
    case TS_F64: return launch_reduce<double>(st, a, nparts, scratch);
    case TS_I32: return launch_reduce<int32_t>(st, a, nparts, scratch);
    case TS_I64: return launch_reduce<int64_t>(st, a, nparts, scratch);
    }
    return cudaErrorInvalidValue;
}

extern "C" cudaError_t cu_softmax(cudaStream_t st, const cu_sm_arg *a)
{
    if (a->nslices == 0 || a->len == 0)
        return cudaSuccess;
    int threads = cu_row_threads(a->len);
    unsigned blocks = (unsigned)(a->nslices > CU_MAX_BLOCKS ? CU_MAX_BLOCKS : a->nslices);
    if (a->dtype == TS_F32)
        k_softmax<float><<<blocks, threads, 0, st>>>(*a);
    else if (a->dtype == TS_F64)
        k_softmax<double><<<blocks, threads, 0, st>>>(*a);
    else
        return cudaErrorInvalidValue;
    return cu_launched();
}

extern "C" cudaError_t cu_cross_entropy(cudaStream_t st, const cu_xent_arg *a)
{
    if (a->N == 0)
        return cudaSuccess;
    int threads = cu_row_threads(a->C);
    unsigned blocks = (unsigned)(a->N > CU_MAX_BLOCKS ? CU_MAX_BLOCKS : a->N);
    if (a->dtype == TS_F32)
        k_xent<float><<<blocks, threads, 0, st>>>(*a);
    else if (a->dtype == TS_F64)
        k_xent<double><<<blocks, threads, 0, st>>>(*a);
    else
        return cudaErrorInvalidValue;
    return cu_launched();
}
