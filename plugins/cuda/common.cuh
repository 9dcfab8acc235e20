/* plugins/cuda/common.cuh: what the cuda plugin's .cu files share: grid sizing for
 * grid-stride loops, strided offsets, block-wide reductions with warp shuffles. */
#ifndef TESSERA_PLUGINS_CUDA_COMMON_CUH
#define TESSERA_PLUGINS_CUDA_COMMON_CUH

#include <math.h>
#include <stdint.h>

#include <type_traits>

#include "kernels.h"

#define CU_THREADS 256
/* Blocks of a grid-stride launch: enough to fill any current GPU several times over, never
 * more than the elements need. gridDim.x stays far below its 2^31 - 1 limit. */
#define CU_MAX_BLOCKS 65535

static inline unsigned cu_blocks(int64_t n, int threads)
{
    int64_t b = (n + threads - 1) / threads;
    if (b < 1)
        b = 1;
    return (unsigned)(b > CU_MAX_BLOCKS ? CU_MAX_BLOCKS : b);
}

/* The launch's error (a bad configuration shows up here, not at the next call). */
static inline cudaError_t cu_launched(void)
{
    return cudaGetLastError();
}

#define CU_GRID_LOOP(i, n)                                                                  \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                \
         i += (int64_t)blockDim.x * gridDim.x)

/* Float -> int conversions: plugin.h's ts_plugin_sat_i32/_i64 (the one rule, compiled for
 * the device too through TS_PLUGIN_INLINE). */
#define cu_sat_i32 ts_plugin_sat_i32
#define cu_sat_i64 ts_plugin_sat_i64

/* Sum of v over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
 * sh: 32 doubles of shared memory. */
__device__ __forceinline__ double cu_block_sum(double v, double *sh)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
    __syncthreads(); /* sh may still be read by a previous call */
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Max over the block with NaN winning; every thread gets it. */
__device__ __forceinline__ double cu_nanmax(double a, double b)
{
    return a != a ? a : b != b ? b : (a > b ? a : b);
}

__device__ __forceinline__ double cu_block_max(double v, double *sh)
{
    for (int o = 16; o > 0; o >>= 1)
        v = cu_nanmax(v, __shfl_xor_sync(0xffffffffu, v, o));
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
    __syncthreads();
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : -INFINITY;
    for (int o = 16; o > 0; o >>= 1)
        v = cu_nanmax(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Threads per block for work of `len` elements per block: 32 to 256, a multiple of 32. */
static inline int cu_row_threads(int64_t len)
{
    return len >= 256 ? 256 : len >= 128 ? 128 : len >= 64 ? 64 : 32;
}

#endif /* TESSERA_PLUGINS_CUDA_COMMON_CUH */
