/* plugins/cuda/attention.cu: scaled dot-product attention (TS_OP_ATTENTION and its backward),
 * the host kernels' algorithm on the GPU with a warp per row: a row's features are spread
 * over the 32 lanes (feature d on lane d % 32), a dot product is the lanes' partial sums
 * reduced with five shuffles, and the eight warps of a block share the tile of keys (or
 * queries) staged in shared memory. The forward walks each query row's keys with the online
 * softmax (running maximum, running sum, output rescaled when the maximum grows) and writes
 * o and the row's log-sum-exp. The backward recomputes the probabilities: one pass with a
 * warp per key (its k, v and their gradients in registers, the queries in tiles), one with a
 * warp per query (q, go and gq in registers, the keys in tiles), so every output element has
 * one writer: no atomics, deterministic. Float32 accumulates in float32, float64 in float64;
 * the 16-bit dtypes arrive as float32 (ops.c). A lane holds up to 8 features of a row (256
 * in all); wider heads are declined and the core composes the attention. */
#include "common.cuh"

namespace {

constexpr int WARPS = 8; /* rows per block: a warp each */

/* Rows per shared-memory tile: as many as fit 32 KiB of `width` features (at least 1). */
template <typename T> int tile_rows(int64_t width)
{
    int64_t per = width * (int64_t)sizeof(T);
    int64_t n = per > 0 ? 32768 / per : 64;
    return (int)(n < 1 ? 1 : n > 64 ? 64 : n);
}

/* Loads rows [r0, r0 + n) of width W of src into dst (n x W) with the whole block. */
template <typename T>
__device__ __forceinline__ void load_tile(const T *src, int64_t r0, int n, int W, T *dst)
{
    for (int e = threadIdx.x; e < n * W; e += blockDim.x)
        dst[e] = src[(r0 + e / W) * W + e % W];
}

/* The key and value rows [j0, j0 + n) into the block's tiles, once every warp is done with
 * the previous ones. */
template <typename T>
__device__ __forceinline__ void load_kv(const T *k, const T *v, int64_t j0, int n, int D, int Dv,
                                        T *ks, T *vs)
{
    __syncthreads();
    load_tile(k, j0, n, D, ks);
    load_tile(v, j0, n, Dv, vs);
    __syncthreads();
}

/* The keys that the block's rows [row0, row0 + WARPS) see: [0, the result). */
__device__ __forceinline__ int64_t block_keys(int64_t row0, int64_t Tq, int64_t Tk, int causal)
{
    const int64_t last = row0 + WARPS - 1 < Tq - 1 ? row0 + WARPS - 1 : Tq - 1;
    return causal && last + Tk - Tq + 1 < Tk ? last + Tk - Tq + 1 : Tk;
}

/* The warp's sum of v, on every lane (butterfly: the same order on every lane). */
template <typename T> __device__ __forceinline__ T warp_sum(T v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Lane `lane`'s features of a row of width W: row[lane + 32 c] (0 past the end). */
template <typename T, int C>
__device__ __forceinline__ void load_lane(const T *row, int W, int lane, T (&x)[C])
{
#pragma unroll
    for (int c = 0; c < C; c++)
        x[c] = lane + 32 * c < W ? row[lane + 32 * c] : T(0);
}

/* acc[c] += a row[lane + 32 c], the lane's features of a row of width W. */
template <typename T, int C>
__device__ __forceinline__ void axpy_lane(T (&acc)[C], T a, const T *row, int W, int lane)
{
#pragma unroll
    for (int c = 0; c < C; c++)
        if (lane + 32 * c < W)
            acc[c] += a * row[lane + 32 * c];
}

/* row[lane + 32 c] = x[c] * scale, the lane's features of a row of width W. */
template <typename T, int C>
__device__ __forceinline__ void store_lane(T *row, const T (&x)[C], T scale, int W, int lane)
{
#pragma unroll
    for (int c = 0; c < C; c++)
        if (lane + 32 * c < W)
            row[lane + 32 * c] = x[c] * scale;
}

template <typename T, int C>
__device__ __forceinline__ T dot_lane(const T (&x)[C], const T *row, int W, int lane)
{
    T s = 0;
#pragma unroll
    for (int c = 0; c < C; c++)
        if (lane + 32 * c < W)
            s += x[c] * row[lane + 32 * c];
    return warp_sum(s);
}

template <typename T, int C>
__global__ void k_att_fwd(const T *__restrict__ q, const T *__restrict__ k,
                          const T *__restrict__ v, T *__restrict__ o, T *__restrict__ lse,
                          int64_t Tq, int64_t Tk, int D, int Dv, T scale, int causal, int BK)
{
    extern __shared__ unsigned char cu_smem[];
    T *ks = (T *)cu_smem, *vs = ks + (size_t)BK * D;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int64_t b = blockIdx.y, row0 = (int64_t)blockIdx.x * WARPS;
    const int64_t i = row0 + warp, off = Tk - Tq;
    const bool active = i < Tq;
    q += b * Tq * D, k += b * Tk * D, v += b * Tk * Dv, o += b * Tq * Dv, lse += b * Tq;
    T qr[C], acc[C];
    load_lane(q + (active ? i : 0) * D, active ? D : 0, lane, qr);
#pragma unroll
    for (int c = 0; c < C; c++)
        acc[c] = 0;
    T m = -INFINITY, l = 0;
    const int64_t jend = block_keys(row0, Tq, Tk, causal);
    const int64_t jlim = causal ? i + off + 1 : Tk; /* this row's keys: [0, jlim) */
    for (int64_t j0 = 0; j0 < jend; j0 += BK) {
        const int n = (int)(jend - j0 < BK ? jend - j0 : BK);
        load_kv(k, v, j0, n, D, Dv, ks, vs);
        if (!active)
            continue;
        for (int jj = 0; jj < n && j0 + jj < jlim; jj++) {
            const T s = dot_lane(qr, ks + (size_t)jj * D, D, lane) * scale;
            if (s > m) {
                const T c = exp(m - s);
                l *= c;
#pragma unroll
                for (int e = 0; e < C; e++)
                    acc[e] *= c;
                m = s;
            }
            const T p = exp(s - m);
            l += p;
            axpy_lane(acc, p, vs + (size_t)jj * Dv, Dv, lane);
        }
    }
    if (!active)
        return;
    store_lane(o + i * Dv, acc, T(1) / l, Dv, lane);
    if (lane == 0)
        lse[i] = m + log(l);
}

/* delta_i = go_i . o_i */
template <typename T>
__global__ void k_att_delta(const T *go, const T *o, T *delta, int64_t rows, int Dv)
{
    CU_GRID_LOOP(i, rows)
    {
        T acc = 0;
        for (int e = 0; e < Dv; e++)
            acc += go[i * Dv + e] * o[i * Dv + e];
        delta[i] = acc;
    }
}

/* A warp per key j: gk_j = scale sum_i gs_ij q_i, gv_j = sum_i P_ij go_i over the queries
 * that see it, the queries in tiles of BQ rows (q, go, lse, delta). */
template <typename T, int C>
__global__ void k_att_bwd_kv(const T *__restrict__ go, const T *__restrict__ q,
                             const T *__restrict__ k, const T *__restrict__ v,
                             const T *__restrict__ lse, const T *__restrict__ delta,
                             T *__restrict__ gk, T *__restrict__ gv, int64_t Tq, int64_t Tk,
                             int D, int Dv, T scale, int causal, int BQ)
{
    extern __shared__ unsigned char cu_smem[];
    T *qs = (T *)cu_smem, *gos = qs + (size_t)BQ * D, *ls = gos + (size_t)BQ * Dv,
      *ds = ls + BQ;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int64_t b = blockIdx.y, col0 = (int64_t)blockIdx.x * WARPS;
    const int64_t j = col0 + warp, off = Tk - Tq;
    const bool active = j < Tk;
    go += b * Tq * Dv, q += b * Tq * D, k += b * Tk * D, v += b * Tk * Dv;
    lse += b * Tq, delta += b * Tq, gk += b * Tk * D, gv += b * Tk * Dv;
    T kr[C], vr[C], gkr[C], gvr[C];
    load_lane(k + (active ? j : 0) * D, active ? D : 0, lane, kr);
    load_lane(v + (active ? j : 0) * Dv, active ? Dv : 0, lane, vr);
#pragma unroll
    for (int c = 0; c < C; c++)
        gkr[c] = gvr[c] = 0;
    /* the first query that sees key col0 is col0 - off */
    const int64_t istart = causal && col0 - off > 0 ? col0 - off : 0;
    for (int64_t i0 = istart; i0 < Tq; i0 += BQ) {
        const int n = (int)(Tq - i0 < BQ ? Tq - i0 : BQ);
        __syncthreads();
        load_tile(q, i0, n, D, qs);
        load_tile(go, i0, n, Dv, gos);
        for (int e = threadIdx.x; e < n; e += blockDim.x) {
            ls[e] = lse[i0 + e];
            ds[e] = delta[i0 + e];
        }
        __syncthreads();
        if (!active)
            continue;
        for (int ii = 0; ii < n; ii++) {
            if (causal && j > i0 + ii + off)
                continue;
            const T *qi = qs + (size_t)ii * D, *goi = gos + (size_t)ii * Dv;
            const T s = dot_lane(kr, qi, D, lane), dp = dot_lane(vr, goi, Dv, lane);
            const T p = exp(s * scale - ls[ii]);
            const T gs = scale * p * (dp - ds[ii]);
            axpy_lane(gvr, p, goi, Dv, lane);
            axpy_lane(gkr, gs, qi, D, lane);
        }
    }
    if (!active)
        return;
    store_lane(gk + j * D, gkr, T(1), D, lane);
    store_lane(gv + j * Dv, gvr, T(1), Dv, lane);
}

/* A warp per query i: gq_i = scale sum_j gs_ij k_j over the keys it sees, the keys in tiles
 * of BK rows (k, v). */
template <typename T, int C>
__global__ void k_att_bwd_q(const T *__restrict__ go, const T *__restrict__ q,
                            const T *__restrict__ k, const T *__restrict__ v,
                            const T *__restrict__ lse, const T *__restrict__ delta,
                            T *__restrict__ gq, int64_t Tq, int64_t Tk, int D, int Dv, T scale,
                            int causal, int BK)
{
    extern __shared__ unsigned char cu_smem[];
    T *ks = (T *)cu_smem, *vs = ks + (size_t)BK * D;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int64_t b = blockIdx.y, row0 = (int64_t)blockIdx.x * WARPS;
    const int64_t i = row0 + warp, off = Tk - Tq;
    const bool active = i < Tq;
    go += b * Tq * Dv, q += b * Tq * D, k += b * Tk * D, v += b * Tk * Dv;
    lse += b * Tq, delta += b * Tq, gq += b * Tq * D;
    T qr[C], gor[C], gqr[C];
    load_lane(q + (active ? i : 0) * D, active ? D : 0, lane, qr);
    load_lane(go + (active ? i : 0) * Dv, active ? Dv : 0, lane, gor);
#pragma unroll
    for (int c = 0; c < C; c++)
        gqr[c] = 0;
    const T li = active ? lse[i] : T(0), di = active ? delta[i] : T(0);
    const int64_t jend = block_keys(row0, Tq, Tk, causal);
    const int64_t jlim = causal ? i + off + 1 : Tk;
    for (int64_t j0 = 0; j0 < jend; j0 += BK) {
        const int n = (int)(jend - j0 < BK ? jend - j0 : BK);
        load_kv(k, v, j0, n, D, Dv, ks, vs);
        if (!active)
            continue;
        for (int jj = 0; jj < n && j0 + jj < jlim; jj++) {
            const T *kj = ks + (size_t)jj * D, *vj = vs + (size_t)jj * Dv;
            const T s = dot_lane(qr, kj, D, lane), dp = dot_lane(gor, vj, Dv, lane);
            const T gs = scale * exp(s * scale - li) * (dp - di);
            axpy_lane(gqr, gs, kj, D, lane);
        }
    }
    if (!active)
        return;
    store_lane(gq + i * D, gqr, T(1), D, lane);
}

template <typename T, int C>
cudaError_t fwd(cudaStream_t st, const cu_att_arg *a)
{
    const int BK = tile_rows<T>(a->D + a->Dv);
    const size_t sh = (size_t)BK * (a->D + a->Dv) * sizeof(T);
    const dim3 grid((unsigned)((a->Tq + WARPS - 1) / WARPS), (unsigned)a->B);
    k_att_fwd<T, C><<<grid, 32 * WARPS, sh, st>>>(
        (const T *)a->q, (const T *)a->k, (const T *)a->v, (T *)a->o, (T *)a->lse, a->Tq, a->Tk,
        (int)a->D, (int)a->Dv, (T)a->scale, a->causal, BK);
    return cu_launched();
}

template <typename T, int C>
cudaError_t bwd(cudaStream_t st, const cu_att_arg *a, void *delta)
{
    const int64_t rows = a->B * a->Tq;
    k_att_delta<T><<<cu_blocks(rows, CU_THREADS), CU_THREADS, 0, st>>>(
        (const T *)a->go, (const T *)a->o, (T *)delta, rows, (int)a->Dv);
    cudaError_t e = cu_launched();
    if (e != cudaSuccess)
        return e;
    /* the query tile carries lse and delta too: two more features per row */
    const int BQ = tile_rows<T>(a->D + a->Dv + 2);
    const size_t shq = (size_t)BQ * (a->D + a->Dv + 2) * sizeof(T);
    const dim3 gkv((unsigned)((a->Tk + WARPS - 1) / WARPS), (unsigned)a->B);
    k_att_bwd_kv<T, C><<<gkv, 32 * WARPS, shq, st>>>(
        (const T *)a->go, (const T *)a->q, (const T *)a->k, (const T *)a->v,
        (const T *)a->lse, (const T *)delta, (T *)a->gk, (T *)a->gv, a->Tq, a->Tk, (int)a->D,
        (int)a->Dv, (T)a->scale, a->causal, BQ);
    if ((e = cu_launched()) != cudaSuccess)
        return e;
    const int BK = tile_rows<T>(a->D + a->Dv);
    const size_t shk = (size_t)BK * (a->D + a->Dv) * sizeof(T);
    const dim3 gq((unsigned)((a->Tq + WARPS - 1) / WARPS), (unsigned)a->B);
    k_att_bwd_q<T, C><<<gq, 32 * WARPS, shk, st>>>(
        (const T *)a->go, (const T *)a->q, (const T *)a->k, (const T *)a->v,
        (const T *)a->lse, (const T *)delta, (T *)a->gq, a->Tq, a->Tk, (int)a->D, (int)a->Dv,
        (T)a->scale, a->causal, BK);
    return cu_launched();
}

/* The kernels for C features per lane, float32 or float64. */
template <int C> cudaError_t run(cudaStream_t st, const cu_att_arg *a, void *delta)
{
    if (a->dtype == TS_F32)
        return a->backward ? bwd<float, C>(st, a, delta) : fwd<float, C>(st, a);
    return a->backward ? bwd<double, C>(st, a, delta) : fwd<double, C>(st, a);
}

} // namespace

extern "C" int cu_attention_fits(int64_t D, int64_t Dv)
{
    return D <= CU_ATT_MAX_FEATURES && Dv <= CU_ATT_MAX_FEATURES;
}

extern "C" size_t cu_attention_scratch(const cu_att_arg *a)
{
    return a->backward ? (size_t)(a->B * a->Tq) * (a->dtype == TS_F64 ? 8 : 4) : 0;
}

extern "C" cudaError_t cu_attention(cudaStream_t st, const cu_att_arg *a, void *scratch)
{
    if ((a->dtype != TS_F32 && a->dtype != TS_F64) || !cu_attention_fits(a->D, a->Dv) ||
        a->B > 65535)
        return cudaErrorInvalidValue;
    if (a->B == 0 || a->Tq == 0)
        return cudaSuccess;
    const int64_t m = a->D > a->Dv ? a->D : a->Dv;
    if (m <= 32)
        return run<1>(st, a, scratch);
    if (m <= 64)
        return run<2>(st, a, scratch);
    if (m <= 128)
        return run<4>(st, a, scratch);
    return run<8>(st, a, scratch);
}
