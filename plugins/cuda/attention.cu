/* plugins/cuda/attention.cu: scaled dot-product attention (TS_OP_ATTENTION and its backward),
 * the host kernels' algorithm on the GPU: one thread per query row in the forward, walking
 * the keys in tiles staged in shared memory with the online softmax (running maximum, running
 * sum, output rescaled when the maximum grows), its row's q and output in registers; it
 * writes o and the row's log-sum-exp. The backward recomputes the probabilities: one pass
 * with a thread per key (its k, v and their gradients in registers, the queries in tiles),
 * one with a thread per query (q, go and gq in registers, the keys in tiles), so every
 * output element has one writer: no atomics, deterministic. Float32 accumulates in float32,
 * float64 in float64; the 16-bit dtypes arrive as float32 (ops.c). The registers hold up to
 * 256 features (D and Dv); wider heads are declined and the core composes the attention. */
#include "common.cuh"

namespace {

/* Keys (or queries) per shared-memory tile: as many as fit 32 KiB of (D + Dv) features. */
template <typename T> int tile_rows(int D, int Dv)
{
    int64_t per = (int64_t)(D + Dv) * (int64_t)sizeof(T);
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

template <typename T, int DM>
__global__ void k_att_fwd(const T *__restrict__ q, const T *__restrict__ k,
                          const T *__restrict__ v, T *__restrict__ o, T *__restrict__ lse,
                          int64_t Tq, int64_t Tk, int D, int Dv, T scale, int causal, int BK)
{
    extern __shared__ unsigned char cu_smem[];
    T *ks = (T *)cu_smem, *vs = ks + (size_t)BK * D;
    const int64_t b = blockIdx.y, row0 = (int64_t)blockIdx.x * blockDim.x;
    const int64_t i = row0 + threadIdx.x, off = Tk - Tq;
    const bool active = i < Tq;
    q += b * Tq * D, k += b * Tk * D, v += b * Tk * Dv, o += b * Tq * Dv, lse += b * Tq;
    T qr[DM], acc[DM];
    for (int d = 0; d < DM; d++) {
        qr[d] = active && d < D ? q[i * D + d] : T(0);
        acc[d] = 0;
    }
    T m = -INFINITY, l = 0;
    const int64_t last = row0 + blockDim.x - 1 < Tq - 1 ? row0 + blockDim.x - 1 : Tq - 1;
    const int64_t jend = causal ? (last + off + 1 < Tk ? last + off + 1 : Tk) : Tk;
    const int64_t jlim = causal ? i + off + 1 : Tk; /* this row's keys: [0, jlim) */
    for (int64_t j0 = 0; j0 < jend; j0 += BK) {
        const int n = (int)(jend - j0 < BK ? jend - j0 : BK);
        __syncthreads();
        load_tile(k, j0, n, D, ks);
        load_tile(v, j0, n, Dv, vs);
        __syncthreads();
        if (!active)
            continue;
        for (int jj = 0; jj < n && j0 + jj < jlim; jj++) {
            const T *kj = ks + (size_t)jj * D, *vj = vs + (size_t)jj * Dv;
            T s = 0;
#pragma unroll
            for (int d = 0; d < DM; d++)
                if (d < D)
                    s += qr[d] * kj[d];
            s *= scale;
            if (s > m) {
                const T c = exp(m - s);
                l *= c;
#pragma unroll
                for (int e = 0; e < DM; e++)
                    acc[e] *= c;
                m = s;
            }
            const T p = exp(s - m);
            l += p;
#pragma unroll
            for (int e = 0; e < DM; e++)
                if (e < Dv)
                    acc[e] += p * vj[e];
        }
    }
    if (!active)
        return;
    const T inv = T(1) / l;
    for (int e = 0; e < Dv && e < DM; e++)
        o[i * Dv + e] = acc[e] * inv;
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

/* A thread per key j: gk_j = scale sum_i gs_ij q_i, gv_j = sum_i P_ij go_i over the queries
 * that see it, the queries in tiles of BQ rows (q, go, lse, delta). */
template <typename T, int DM>
__global__ void k_att_bwd_kv(const T *__restrict__ go, const T *__restrict__ q,
                             const T *__restrict__ k, const T *__restrict__ v,
                             const T *__restrict__ lse, const T *__restrict__ delta,
                             T *__restrict__ gk, T *__restrict__ gv, int64_t Tq, int64_t Tk,
                             int D, int Dv, T scale, int causal, int BQ)
{
    extern __shared__ unsigned char cu_smem[];
    T *qs = (T *)cu_smem, *gos = qs + (size_t)BQ * D, *ls = gos + (size_t)BQ * Dv,
      *ds = ls + BQ;
    const int64_t b = blockIdx.y, col0 = (int64_t)blockIdx.x * blockDim.x;
    const int64_t j = col0 + threadIdx.x, off = Tk - Tq;
    const bool active = j < Tk;
    go += b * Tq * Dv, q += b * Tq * D, k += b * Tk * D, v += b * Tk * Dv;
    lse += b * Tq, delta += b * Tq, gk += b * Tk * D, gv += b * Tk * Dv;
    T kr[DM], vr[DM], gkr[DM], gvr[DM];
    for (int d = 0; d < DM; d++) {
        kr[d] = active && d < D ? k[j * D + d] : T(0);
        vr[d] = active && d < Dv ? v[j * Dv + d] : T(0);
        gkr[d] = gvr[d] = 0;
    }
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
            T s = 0, dp = 0;
#pragma unroll
            for (int d = 0; d < DM; d++) {
                if (d < D)
                    s += qi[d] * kr[d];
                if (d < Dv)
                    dp += goi[d] * vr[d];
            }
            const T p = exp(s * scale - ls[ii]);
            const T gs = scale * p * (dp - ds[ii]);
#pragma unroll
            for (int d = 0; d < DM; d++) {
                if (d < Dv)
                    gvr[d] += p * goi[d];
                if (d < D)
                    gkr[d] += gs * qi[d];
            }
        }
    }
    if (!active)
        return;
    for (int d = 0; d < D && d < DM; d++)
        gk[j * D + d] = gkr[d];
    for (int d = 0; d < Dv && d < DM; d++)
        gv[j * Dv + d] = gvr[d];
}

/* A thread per query i: gq_i = scale sum_j gs_ij k_j over the keys it sees, the keys in tiles
 * of BK rows (k, v). */
template <typename T, int DM>
__global__ void k_att_bwd_q(const T *__restrict__ go, const T *__restrict__ q,
                            const T *__restrict__ k, const T *__restrict__ v,
                            const T *__restrict__ lse, const T *__restrict__ delta,
                            T *__restrict__ gq, int64_t Tq, int64_t Tk, int D, int Dv, T scale,
                            int causal, int BK)
{
    extern __shared__ unsigned char cu_smem[];
    T *ks = (T *)cu_smem, *vs = ks + (size_t)BK * D;
    const int64_t b = blockIdx.y, row0 = (int64_t)blockIdx.x * blockDim.x;
    const int64_t i = row0 + threadIdx.x, off = Tk - Tq;
    const bool active = i < Tq;
    go += b * Tq * Dv, q += b * Tq * D, k += b * Tk * D, v += b * Tk * Dv;
    lse += b * Tq, delta += b * Tq, gq += b * Tq * D;
    T qr[DM], gor[DM], gqr[DM];
    for (int d = 0; d < DM; d++) {
        qr[d] = active && d < D ? q[i * D + d] : T(0);
        gor[d] = active && d < Dv ? go[i * Dv + d] : T(0);
        gqr[d] = 0;
    }
    const T li = active ? lse[i] : T(0), di = active ? delta[i] : T(0);
    const int64_t last = row0 + blockDim.x - 1 < Tq - 1 ? row0 + blockDim.x - 1 : Tq - 1;
    const int64_t jend = causal ? (last + off + 1 < Tk ? last + off + 1 : Tk) : Tk;
    const int64_t jlim = causal ? i + off + 1 : Tk;
    for (int64_t j0 = 0; j0 < jend; j0 += BK) {
        const int n = (int)(jend - j0 < BK ? jend - j0 : BK);
        __syncthreads();
        load_tile(k, j0, n, D, ks);
        load_tile(v, j0, n, Dv, vs);
        __syncthreads();
        if (!active)
            continue;
        for (int jj = 0; jj < n && j0 + jj < jlim; jj++) {
            const T *kj = ks + (size_t)jj * D, *vj = vs + (size_t)jj * Dv;
            T s = 0, dp = 0;
#pragma unroll
            for (int d = 0; d < DM; d++) {
                if (d < D)
                    s += qr[d] * kj[d];
                if (d < Dv)
                    dp += gor[d] * vj[d];
            }
            const T gs = scale * exp(s * scale - li) * (dp - di);
#pragma unroll
            for (int d = 0; d < DM; d++)
                if (d < D)
                    gqr[d] += gs * kj[d];
        }
    }
    if (!active)
        return;
    for (int d = 0; d < D && d < DM; d++)
        gq[i * D + d] = gqr[d];
}

constexpr int ROWS_PER_BLOCK = 64;

template <typename T, int DM>
cudaError_t fwd(cudaStream_t st, const cu_att_arg *a)
{
    const int BK = tile_rows<T>(a->D, a->Dv);
    const size_t sh = (size_t)BK * (a->D + a->Dv) * sizeof(T);
    const dim3 grid((unsigned)((a->Tq + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK), (unsigned)a->B);
    k_att_fwd<T, DM><<<grid, ROWS_PER_BLOCK, sh, st>>>(
        (const T *)a->q, (const T *)a->k, (const T *)a->v, (T *)a->o, (T *)a->lse, a->Tq, a->Tk,
        a->D, a->Dv, (T)a->scale, a->causal, BK);
    return cu_launched();
}

template <typename T, int DM>
cudaError_t bwd(cudaStream_t st, const cu_att_arg *a, void *delta)
{
    const int64_t rows = a->B * a->Tq;
    k_att_delta<T><<<cu_blocks(rows, CU_THREADS), CU_THREADS, 0, st>>>(
        (const T *)a->go, (const T *)a->o, (T *)delta, rows, a->Dv);
    cudaError_t e = cu_launched();
    if (e != cudaSuccess)
        return e;
    /* the query tile carries lse and delta too: two more features per row */
    const int BQ = tile_rows<T>(a->D, a->Dv + 2);
    const size_t shq = (size_t)BQ * (a->D + a->Dv + 2) * sizeof(T);
    const dim3 gkv((unsigned)((a->Tk + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK), (unsigned)a->B);
    k_att_bwd_kv<T, DM><<<gkv, ROWS_PER_BLOCK, shq, st>>>(
        (const T *)a->go, (const T *)a->q, (const T *)a->k, (const T *)a->v,
        (const T *)a->lse, (const T *)delta, (T *)a->gk, (T *)a->gv, a->Tq, a->Tk, a->D, a->Dv,
        (T)a->scale, a->causal, BQ);
    if ((e = cu_launched()) != cudaSuccess)
        return e;
    const int BK = tile_rows<T>(a->D, a->Dv);
    const size_t shk = (size_t)BK * (a->D + a->Dv) * sizeof(T);
    const dim3 gq((unsigned)((a->Tq + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK), (unsigned)a->B);
    k_att_bwd_q<T, DM><<<gq, ROWS_PER_BLOCK, shk, st>>>(
        (const T *)a->go, (const T *)a->q, (const T *)a->k, (const T *)a->v,
        (const T *)a->lse, (const T *)delta, (T *)a->gq, a->Tq, a->Tk, a->D, a->Dv,
        (T)a->scale, a->causal, BK);
    return cu_launched();
}

/* The kernels for features up to DM, float32 or float64. */
template <int DM> cudaError_t run(cudaStream_t st, const cu_att_arg *a, void *delta)
{
    if (a->dtype == TS_F32)
        return a->backward ? bwd<float, DM>(st, a, delta) : fwd<float, DM>(st, a);
    return a->backward ? bwd<double, DM>(st, a, delta) : fwd<double, DM>(st, a);
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
    if (m <= 16)
        return run<16>(st, a, scratch);
    if (m <= 32)
        return run<32>(st, a, scratch);
    if (m <= 64)
        return run<64>(st, a, scratch);
    if (m <= 128)
        return run<128>(st, a, scratch);
    return run<256>(st, a, scratch);
}
