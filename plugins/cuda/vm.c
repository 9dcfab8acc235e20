/* plugins/cuda/vm.c: the vm_* slots (the pool's expandable segment) through CUDA's virtual
 * memory management: cuMemAddressReserve for the range, and per granule (cuMemGetAllocation-
 * Granularity, 2 MiB on current GPUs) one cuMemCreate'd physical allocation mapped with
 * cuMemMap and made accessible with cuMemSetAccess. One allocation per granule, because
 * cuMemUnmap takes back whole mappings only, and the pool decommits any granule-aligned tail.
 *
 * The driver API is reached through cudaGetDriverEntryPointByVersion, so the plugin still
 * links only the runtime and loads on machines without a driver. When the driver lacks a
 * function or the device cannot (no virtual memory management), vm_granularity answers 0 and
 * the pool keeps to cudaMalloc. */
#include "config.h"

#include <cuda.h>

#include "cuda_plugin.h"

#define DRV(name) __typeof__(name) *name##_p
typedef struct cuda_vm_api {
    DRV(cuMemAddressReserve);
    DRV(cuMemAddressFree);
    DRV(cuMemCreate);
    DRV(cuMemRelease);
    DRV(cuMemMap);
    DRV(cuMemUnmap);
    DRV(cuMemSetAccess);
    DRV(cuMemGetAllocationGranularity);
    DRV(cuGetErrorString);
    DRV(cuDeviceGet);
    DRV(cuDeviceGetAttribute);
} cuda_vm_api;
#undef DRV

static cuda_vm_api api;
static int api_state; /* 0 not tried, 1 loaded, -1 unavailable */
static pthread_once_t api_once = PTHREAD_ONCE_INIT;

static void api_load(void)
{
    struct {
        const char *name;
        void **slot;
    } fn[] = {
        {"cuMemAddressReserve", (void **)&api.cuMemAddressReserve_p},
        {"cuMemAddressFree", (void **)&api.cuMemAddressFree_p},
        {"cuMemCreate", (void **)&api.cuMemCreate_p},
        {"cuMemRelease", (void **)&api.cuMemRelease_p},
        {"cuMemMap", (void **)&api.cuMemMap_p},
        {"cuMemUnmap", (void **)&api.cuMemUnmap_p},
        {"cuMemSetAccess", (void **)&api.cuMemSetAccess_p},
        {"cuMemGetAllocationGranularity", (void **)&api.cuMemGetAllocationGranularity_p},
        {"cuGetErrorString", (void **)&api.cuGetErrorString_p},
        {"cuDeviceGet", (void **)&api.cuDeviceGet_p},
        {"cuDeviceGetAttribute", (void **)&api.cuDeviceGetAttribute_p},
    };
    api_state = 1;
    for (size_t i = 0; i < sizeof fn / sizeof fn[0]; i++) {
        enum cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion(fn[i].name, fn[i].slot, 11000, cudaEnableDefault,
                                             &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess || !*fn[i].slot) {
            cudaGetLastError();
            api_state = -1;
        }
    }
}

static const char *cu_err(CUresult r)
{
    const char *s = NULL;
    if (api.cuGetErrorString_p)
        api.cuGetErrorString_p(r, &s);
    return s ? s : "unknown driver error";
}

static CUmemAllocationProp vm_prop(const cuda_ctx *c)
{
    CUmemAllocationProp p = {0};
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = c->device;
    return p;
}

size_t cuda_vm_granularity(void *ctx)
{
    cuda_ctx *c = ctx;
    pthread_once(&api_once, api_load);
    if (api_state != 1)
        return 0;
    CUdevice dev;
    int supported = 0;
    if (api.cuDeviceGet_p(&dev, c->device) != CUDA_SUCCESS ||
        api.cuDeviceGetAttribute_p(&supported,
                                   CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                   dev) != CUDA_SUCCESS ||
        !supported)
        return 0;
    CUmemAllocationProp p = vm_prop(c);
    size_t g = 0;
    if (api.cuMemGetAllocationGranularity_p(&g, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) !=
            CUDA_SUCCESS ||
        g < CUDA_ALIGN || (g & (g - 1)))
        return 0;
    c->vm_granule = g;
    return g;
}

ts_status cuda_vm_reserve(void *ctx, size_t nbytes, void **base)
{
    cuda_ctx *c = ctx;
    CUdeviceptr p = 0;
    CUresult r = api.cuMemAddressReserve_p(&p, nbytes, c->vm_granule, 0, 0);
    if (r != CUDA_SUCCESS)
        return c->host->fail(c->host, TS_ENOMEM,
                             "cuMemAddressReserve of %zu bytes failed on device %d: %s", nbytes,
                             c->device, cu_err(r));
    *base = (void *)(uintptr_t)p;
    if (!c->vm_base) { /* the pool reserves one range per instance: its mapped prefix */
        c->vm_base = *base;
        c->vm_mapped = 0;
    }
    return TS_OK;
}

/* Unmaps [addr, addr + nbytes), granule by granule, after the stream has finished with it:
 * queued kernels may still read the tail the pool gives back. */
static void unmap_range(cuda_ctx *c, char *addr, size_t nbytes)
{
    cudaSetDevice(c->device);
    if (c->stream && !c->rec) /* recording: nothing runs (graph_begin waited) */
        cudaStreamSynchronize(c->stream);
    for (size_t off = 0; off < nbytes; off += c->vm_granule) {
        CUresult r = api.cuMemUnmap_p((CUdeviceptr)(uintptr_t)(addr + off), c->vm_granule);
        if (r != CUDA_SUCCESS)
            c->host->log(c->host, TS_LOG_ERROR, "cuMemUnmap of a pool granule failed: %s",
                         cu_err(r));
    }
}

void cuda_vm_decommit(void *ctx, void *addr, size_t nbytes)
{
    cuda_ctx *c = ctx;
    unmap_range(c, addr, nbytes);
    if ((char *)addr >= c->vm_base && (char *)addr + nbytes == c->vm_base + c->vm_mapped)
        c->vm_mapped = (size_t)((char *)addr - c->vm_base);
}

void cuda_vm_release(void *ctx, void *base, size_t nbytes)
{
    cuda_ctx *c = ctx;
    /* The pool releases its reservation whole, backed part included. */
    if ((char *)base == c->vm_base) {
        unmap_range(c, base, c->vm_mapped);
        c->vm_base = NULL;
        c->vm_mapped = 0;
    }
    CUresult r = api.cuMemAddressFree_p((CUdeviceptr)(uintptr_t)base, nbytes);
    if (r != CUDA_SUCCESS)
        c->host->log(c->host, TS_LOG_ERROR, "cuMemAddressFree of the pool's range failed: %s",
                     cu_err(r));
}

ts_status cuda_vm_commit(void *ctx, void *addr, size_t nbytes)
{
    cuda_ctx *c = ctx;
    CUmemAllocationProp p = vm_prop(c);
    CUmemAccessDesc access = {0};
    access.location = p.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    size_t done = 0;
    while (done < nbytes) {
        CUdeviceptr at = (CUdeviceptr)(uintptr_t)((char *)addr + done);
        CUmemGenericAllocationHandle h;
        CUresult r = api.cuMemCreate_p(&h, c->vm_granule, &p, 0);
        if (r != CUDA_SUCCESS)
            goto fail;
        r = api.cuMemMap_p(at, c->vm_granule, 0, h, 0);
        api.cuMemRelease_p(h); /* the mapping keeps the memory until it is unmapped */
        if (r != CUDA_SUCCESS)
            goto fail;
        done += c->vm_granule;
        r = api.cuMemSetAccess_p(at, c->vm_granule, &access, 1);
        if (r != CUDA_SUCCESS)
            goto fail;
        if ((char *)addr + done == c->vm_base + c->vm_mapped + c->vm_granule)
            c->vm_mapped += c->vm_granule;
        continue;
    fail:
        if (done)
            cuda_vm_decommit(c, addr, done);
        /* Out of memory is the pool's to report (it trims its cache and tries again). */
        if (r == CUDA_ERROR_OUT_OF_MEMORY)
            return TS_ENOMEM;
        return c->host->fail(c->host, TS_ENOMEM,
                             "mapping %zu bytes of the pool's range failed on device %d: %s",
                             nbytes, c->device, cu_err(r));
    }
    return TS_OK;
}
