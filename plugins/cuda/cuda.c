/* plugins/cuda/cuda.c: the GPU backend's descriptor, device selection and memory: the shared
 * pool component over cudaMalloc (256-byte blocks), copies on one stream per device. It
 * loads on machines without a GPU and reports zero devices with the CUDA error, so that the
 * configured fallback takes over. Kernels arrive with the cuda issue. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include <tessera/plugin.h>

#define CUDA_ALIGN 256

typedef struct cuda_ctx {
    const ts_host *host;
    int device;
    cudaStream_t stream;
    ts_pool *pool;
} cuda_ctx;

/* Fails with the CUDA call's name and error text. */
#define CU_CHECK(c, call)                                                                   \
    do {                                                                                    \
        cudaError_t e_ = (call);                                                            \
        if (e_ != cudaSuccess)                                                              \
            return (c)->host->fail((c)->host, TS_EKERNEL, "%s failed: %s (%s)", #call,       \
                                   cudaGetErrorString(e_), cudaGetErrorName(e_));            \
    } while (0)

static const ts_config_key keys[] = {
    {"device_index", TS_SETTING_INT, "0", 0, 1023, "which GPU this instance drives"},
    {"memory_fraction", TS_SETTING_FRACTION, "0.8", 0, 0,
     "most bytes the pool may reserve, as a share of the GPU's memory"},
    {"cache_limit", TS_SETTING_SIZE, "4G", 0, 0, "most bytes kept in the pool's free lists"},
    {NULL, 0, NULL, 0, 0, NULL},
};

static ts_status raw_alloc(void *user, size_t nbytes, void **ptr)
{
    cuda_ctx *c = user;
    cudaSetDevice(c->device);
    cudaError_t e = cudaMalloc(ptr, nbytes ? nbytes : CUDA_ALIGN);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky-free error state */
        return TS_ENOMEM;
    }
    return TS_OK;
}

static void raw_free(void *user, void *ptr, size_t nbytes)
{
    (void)nbytes;
    cuda_ctx *c = user;
    cudaSetDevice(c->device);
    cudaFree(ptr);
}

static void cuda_shutdown(void *ctx)
{
    cuda_ctx *c = ctx;
    if (c->pool)
        c->host->pool->destroy(c->pool);
    if (c->stream)
        cudaStreamDestroy(c->stream);
    free(c);
}

static ts_status cuda_init(const ts_host *host, const ts_setting *settings, size_t nsettings,
                           void **ctx)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        const char *hint = e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice
                               ? "no CUDA driver or GPU found"
                               : "cannot query CUDA devices";
        return host->fail(host, TS_ENODEV, "%s (%s: %s)", hint, cudaGetErrorName(e),
                          cudaGetErrorString(e));
    }
    if (count == 0)
        return host->fail(host, TS_ENODEV, "0 CUDA devices");
    const ts_setting *idx = ts_setting_find(settings, nsettings, "device_index");
    int device = idx ? (int)idx->v.i : 0;
    if (device >= count)
        return host->fail(host, TS_ENODEV,
                          "device_index = %d but only %d CUDA device(s) exist (0..%d)", device,
                          count, count - 1);
    cuda_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return host->fail(host, TS_ENOMEM, "out of memory creating the plugin context");
    c->host = host;
    c->device = device;
    ts_status s;
    size_t free_b = 0, total_b = 0;
    if ((e = cudaSetDevice(device)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaMemGetInfo(&free_b, &total_b)) != cudaSuccess) {
        s = host->fail(host, TS_ENODEV, "cannot start CUDA device %d: %s (%s)", device,
                       cudaGetErrorString(e), cudaGetErrorName(e));
        goto fail;
    }
    const ts_setting *frac = ts_setting_find(settings, nsettings, "memory_fraction");
    const ts_setting *cache = ts_setting_find(settings, nsettings, "cache_limit");
    const ts_setting *caching = ts_setting_find(settings, nsettings, "caching");
    ts_pool_options opts = {
        .struct_size = sizeof opts,
        .name = "cuda",
        .alignment = CUDA_ALIGN,
        .reserve_limit = (uint64_t)((double)total_b * (frac ? frac->v.fraction : 0.8)),
        .cache_limit = cache ? cache->v.size : (4ull << 30),
        .caching = caching ? caching->v.boolean : 1,
    };
    ts_raw_allocator raw = {.user = c, .alloc = raw_alloc, .free = raw_free};
    if ((s = host->pool->create(&opts, &raw, &c->pool)))
        goto fail;
    *ctx = c;
    return TS_OK;
fail:
    cuda_shutdown(c);
    return s;
}

static ts_status cuda_device_info(void *ctx, ts_device_info *info)
{
    cuda_ctx *c = ctx;
    struct cudaDeviceProp prop;
    size_t free_b, total_b;
    CU_CHECK(c, cudaSetDevice(c->device));
    CU_CHECK(c, cudaGetDeviceCount(&info->count));
    CU_CHECK(c, cudaGetDeviceProperties(&prop, c->device));
    CU_CHECK(c, cudaMemGetInfo(&free_b, &total_b));
    info->index = c->device;
    snprintf(info->name, sizeof info->name, "%.100s (sm_%d%d)", prop.name, prop.major, prop.minor);
    info->total_bytes = total_b;
    info->free_bytes = free_b;
    info->valid = TS_DEVINFO_TOTAL | TS_DEVINFO_FREE;
    return TS_OK;
}

static ts_status cuda_alloc(void *ctx, size_t nbytes, const char *tag, void **ptr)
{
    cuda_ctx *c = ctx;
    return c->host->pool->alloc(c->pool, nbytes, tag, ptr);
}

static void cuda_free(void *ctx, void *ptr)
{
    cuda_ctx *c = ctx;
    c->host->pool->free(c->pool, ptr);
}

static ts_status copy(cuda_ctx *c, void *dst, const void *src, size_t n, enum cudaMemcpyKind k)
{
    CU_CHECK(c, cudaMemcpyAsync(dst, src, n, k, c->stream));
    /* Host buffers are pageable and the caller may reuse them at once. */
    if (k != cudaMemcpyDeviceToDevice)
        CU_CHECK(c, cudaStreamSynchronize(c->stream));
    return TS_OK;
}

static ts_status cuda_h2d(void *ctx, void *dst, const void *src, size_t n)
{
    return copy(ctx, dst, src, n, cudaMemcpyHostToDevice);
}

static ts_status cuda_d2h(void *ctx, void *dst, const void *src, size_t n)
{
    return copy(ctx, dst, src, n, cudaMemcpyDeviceToHost);
}

static ts_status cuda_d2d(void *ctx, void *dst, const void *src, size_t n)
{
    return copy(ctx, dst, src, n, cudaMemcpyDeviceToDevice);
}

static ts_status cuda_fill(void *ctx, void *dst, size_t nbytes, const void *pattern,
                           size_t pattern_size)
{
    cuda_ctx *c = ctx;
    const unsigned char *p = pattern;
    if (pattern_size == 0 || pattern_size > 8 || nbytes % pattern_size)
        return c->host->fail(c->host, TS_EINVAL, "fill: pattern of %zu bytes does not tile %zu",
                             pattern_size, nbytes);
    for (size_t i = 1; i < pattern_size; i++)
        if (p[i] != p[0])
            return c->host->fail(c->host, TS_ENOTSUP,
                                 "fill with a non-uniform %zu-byte pattern needs the fill kernel, "
                                 "which this build of the cuda plugin does not have yet",
                                 pattern_size);
    CU_CHECK(c, cudaMemsetAsync(dst, p[0], nbytes, c->stream));
    return TS_OK;
}

static ts_status cuda_sync(void *ctx)
{
    cuda_ctx *c = ctx;
    CU_CHECK(c, cudaStreamSynchronize(c->stream));
    return TS_OK;
}

static void cuda_stats(void *ctx, ts_memory_stats *s)
{
    cuda_ctx *c = ctx;
    c->host->pool->stats(c->pool, s);
}

static void cuda_reset_peak(void *ctx)
{
    cuda_ctx *c = ctx;
    c->host->pool->reset_peak(c->pool);
}

static void cuda_empty_cache(void *ctx)
{
    cuda_ctx *c = ctx;
    cudaStreamSynchronize(c->stream);
    c->host->pool->empty_cache(c->pool);
}

static ts_status cuda_set_limits(void *ctx, uint64_t reserve_limit, uint64_t cache_limit)
{
    cuda_ctx *c = ctx;
    return c->host->pool->set_limits(c->pool, reserve_limit, cache_limit);
}

static const ts_plugin_desc desc = {
    .abi_major = TS_PLUGIN_ABI_MAJOR,
    .abi_minor = TS_PLUGIN_ABI_MINOR,
    .struct_size = sizeof(ts_plugin_desc),
    .name = "cuda",
    .version = PACKAGE_VERSION,
    .description = "NVIDIA GPUs through the CUDA runtime and cuBLAS",
    .config_keys = keys,
    .init = cuda_init,
    .shutdown = cuda_shutdown,
    .device_info = cuda_device_info,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .copy_h2d = cuda_h2d,
    .copy_d2h = cuda_d2h,
    .copy_d2d = cuda_d2d,
    .fill = cuda_fill,
    .synchronize = cuda_sync,
    .memory_stats = cuda_stats,
    .reset_peak = cuda_reset_peak,
    .empty_cache = cuda_empty_cache,
    .set_limits = cuda_set_limits,
    .supports = NULL,
    .run = NULL,
};

TS_PLUGIN_DEFINE(desc)
