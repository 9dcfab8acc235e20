/* plugins/cuda/cuda.c: the GPU backend's descriptor, device selection and memory: cudaMalloc
 * segments (256-byte aligned) under the host's caching pool, host <-> device copies through a ring of
 * pinned staging buffers, everything queued on one stream per device. It loads on machines
 * without a GPU and reports zero devices with the CUDA error, so that the configured fallback
 * takes over. The kernels are in ops.c / gemm.c (C side) and *.cu (device code).
 *
 * Ordering: every kernel, cuBLAS call and copy goes on c->stream, so work runs in the order
 * it was queued. A block freed to the pool while kernels that use it are still queued can be
 * handed out again at once: whatever the next owner queues lands behind them on the same
 * stream. Only the raw allocator's cudaFree (rare: cache trimming, empty_cache, shutdown)
 * waits for the stream first. The host blocks only in device -> host copies, synchronize,
 * and the range checks of indices (whose result decides the call's status). */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_plugin.h"

static const ts_config_key keys[] = {
    {"device_index", TS_SETTING_INT, "-1", -1, 1023,
     "which GPU this instance drives; -1: the launcher's local rank modulo the GPUs (0 "
     "without a launcher)"},
    {"memory_fraction", TS_SETTING_FRACTION, "0.8", 0, 0,
     "most bytes the pool may reserve, as a share of the GPU's memory"},
    {"cache_limit", TS_SETTING_SIZE, "4G", 0, 0, "most bytes kept in the pool's free lists"},
    {"expandable_segments", TS_SETTING_BOOL, "false", 0, 0,
     "blocks over 1 MiB share one reserved address range mapped 2 MiB at a time "
     "(cuMemAddressReserve / cuMemCreate / cuMemMap), so freed neighbours always merge"},
    {NULL, 0, NULL, 0, 0, NULL},
};

ts_status cuda_fail_cu(cuda_ctx *c, const char *call, cudaError_t e)
{
    ts_status code = e == cudaErrorMemoryAllocation ? TS_ENOMEM : TS_EKERNEL;
    return c->host->fail(c->host, code, "%s failed on device %d: %s (%s)", call, c->device,
                         cudaGetErrorString(e), cudaGetErrorName(e));
}

ts_status cuda_fail_blas(cuda_ctx *c, const char *call, cublasStatus_t e)
{
    return c->host->fail(c->host, e == CUBLAS_STATUS_ALLOC_FAILED ? TS_ENOMEM : TS_EKERNEL,
                         "%s failed on device %d: %s (%s)", call, c->device,
                         cublasGetStatusString(e), cublasGetStatusName(e));
}

/* ---- raw memory under the host's pool --------------------------------------------------- */

static ts_status cuda_mem_alloc(void *ctx, size_t nbytes, void **ptr)
{
    cuda_ctx *c = ctx;
    if (cudaSetDevice(c->device) != cudaSuccess) {
        cudaGetLastError();
        return TS_ENOMEM;
    }
    cudaError_t e = cudaMalloc(ptr, nbytes);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* an allocation failure is not sticky: clear it */
        *ptr = NULL;
        return TS_ENOMEM; /* the pool empties its cache, retries, then reports its figures */
    }
    return TS_OK;
}

static void cuda_mem_free(void *ctx, void *ptr, size_t nbytes)
{
    (void)nbytes;
    cuda_ctx *c = ctx;
    cudaError_t e;
    /* While a graph is recorded nothing runs on the stream (graph_begin waited for it), and
     * waiting on a capturing stream would break the recording. */
    if ((e = cudaSetDevice(c->device)) != cudaSuccess ||
        (c->stream && !c->rec && (e = cudaStreamSynchronize(c->stream)) != cudaSuccess) ||
        (e = cudaFree(ptr)) != cudaSuccess)
        c->host->log(c->host, TS_LOG_ERROR, "cudaFree of a pool segment failed: %s (%s)",
                     cudaGetErrorString(e), cudaGetErrorName(e));
}

ts_status cuda_scratch(cuda_ctx *c, size_t nbytes, const char *tag, void **p)
{
    return c->host->scratch_alloc(c->host, nbytes, tag, p);
}

void cuda_scratch_free(cuda_ctx *c, void *p)
{
    c->host->scratch_free(c->host, p);
}

/* ---- range-check flag ------------------------------------------------------------------ */

ts_status cuda_flag_begin(cuda_ctx *c)
{
    pthread_mutex_lock(&c->flag_lock);
    /* 0x7f in every byte: a position no tensor reaches, so "no bad element". */
    cudaError_t e = cudaMemsetAsync(c->d_flag, 0x7f, sizeof *c->d_flag, c->stream);
    if (e != cudaSuccess) {
        pthread_mutex_unlock(&c->flag_lock);
        return cuda_fail_cu(c, "cudaMemsetAsync(range-check flag)", e);
    }
    return TS_OK;
}

ts_status cuda_flag_end(cuda_ctx *c, ts_status status, int64_t *pos)
{
    *pos = -1;
    if (status != TS_OK || c->rec) { /* while recording, nothing has run to check */
        pthread_mutex_unlock(&c->flag_lock);
        return status;
    }
    pthread_mutex_lock(&c->stage_lock);
    cudaError_t e = cudaMemcpyAsync(c->h_flag, c->d_flag, sizeof *c->d_flag,
                                    cudaMemcpyDeviceToHost, c->stream);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(c->stream);
    unsigned long long v = *c->h_flag;
    pthread_mutex_unlock(&c->stage_lock);
    pthread_mutex_unlock(&c->flag_lock);
    if (e != cudaSuccess)
        return cuda_fail_cu(c, "cudaMemcpyAsync(range-check flag) / cudaStreamSynchronize", e);
    *pos = v == 0x7f7f7f7f7f7f7f7full ? -1 : (int64_t)v;
    return TS_OK;
}

/* ---- init / shutdown ------------------------------------------------------------------- */

static void cuda_shutdown(void *ctx)
{
    cuda_ctx *c = ctx;
    cudaSetDevice(c->device);
    if (c->stream)
        cudaStreamSynchronize(c->stream);
    for (int i = 0; i < CUDA_NSTAGE; i++) {
        if (c->stage[i].ev)
            cudaEventDestroy(c->stage[i].ev);
        if (c->stage[i].buf)
            cudaFreeHost(c->stage[i].buf);
    }
    if (c->blas)
        cublasDestroy(c->blas);
    if (c->blas_ws)
        cudaFree(c->blas_ws);
    if (c->d_flag)
        cudaFree(c->d_flag);
    if (c->h_flag)
        cudaFreeHost(c->h_flag);
    if (c->stream)
        cudaStreamDestroy(c->stream);
    for (int i = 0; i < CUDA_NUPLOAD; i++)
        if (c->up_ev[i])
            cudaEventDestroy(c->up_ev[i]);
    pthread_mutex_destroy(&c->stage_lock);
    pthread_mutex_destroy(&c->flag_lock);
    pthread_mutex_destroy(&c->up_lock);
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
        cudaGetLastError();
        return host->fail(host, TS_ENODEV, "%s (%s: %s)", hint, cudaGetErrorName(e),
                          cudaGetErrorString(e));
    }
    if (count == 0)
        return host->fail(host, TS_ENODEV, "0 CUDA devices");
    const ts_setting *idx = ts_setting_find(settings, nsettings, "device_index");
    int device = idx ? (int)idx->v.i : -1;
    if (device < 0) { /* one GPU per rank of a job, as comm_nccl picks it */
        int lr = ts_launcher_local_rank();
        device = lr >= 0 ? lr % count : 0;
    }
    if (device >= count)
        return host->fail(host, TS_ENODEV,
                          "device_index = %d but only %d CUDA device(s) exist (0..%d)", device,
                          count, count - 1);
    cuda_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return host->fail(host, TS_ENOMEM, "out of memory creating the plugin context");
    c->host = host;
    c->device = device;
    pthread_mutex_init(&c->stage_lock, NULL);
    pthread_mutex_init(&c->flag_lock, NULL);
    pthread_mutex_init(&c->up_lock, NULL);
    ts_status s;
    size_t free_b = 0, total_b = 0;
    const char *what = "cudaSetDevice";
    if ((e = cudaSetDevice(device)) != cudaSuccess ||
        (what = "cudaStreamCreateWithFlags",
         e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess ||
        (what = "cudaMemGetInfo", e = cudaMemGetInfo(&free_b, &total_b)) != cudaSuccess ||
        (what = "cudaMalloc(cuBLAS workspace)",
         e = cudaMalloc(&c->blas_ws, CUDA_CUBLAS_WS_BYTES)) != cudaSuccess ||
        (what = "cudaMalloc(range-check flag)",
         e = cudaMalloc((void **)&c->d_flag, sizeof *c->d_flag)) != cudaSuccess ||
        (what = "cudaHostAlloc(range-check flag)",
         e = cudaHostAlloc((void **)&c->h_flag, sizeof *c->h_flag, cudaHostAllocDefault)) !=
            cudaSuccess) {
        cudaGetLastError();
        s = host->fail(host, TS_ENODEV, "cannot start CUDA device %d: %s failed: %s (%s)",
                       device, what, cudaGetErrorString(e), cudaGetErrorName(e));
        goto fail;
    }
    cublasStatus_t b;
    what = "cublasCreate";
    if ((b = cublasCreate(&c->blas)) != CUBLAS_STATUS_SUCCESS ||
        (what = "cublasSetStream", b = cublasSetStream(c->blas, c->stream)) !=
            CUBLAS_STATUS_SUCCESS ||
        (what = "cublasSetWorkspace",
         b = cublasSetWorkspace(c->blas, c->blas_ws, CUDA_CUBLAS_WS_BYTES)) !=
            CUBLAS_STATUS_SUCCESS ||
        /* Full float32 GEMMs (no TF32), so results match the CPU backends. */
        (what = "cublasSetMathMode", b = cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH)) !=
            CUBLAS_STATUS_SUCCESS) {
        s = host->fail(host, TS_ENODEV, "cannot start cuBLAS on device %d: %s failed: %s (%s)",
                       device, what, cublasGetStatusString(b), cublasGetStatusName(b));
        goto fail;
    }
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

/* ---- copies ---------------------------------------------------------------------------- */

/* The staging buffer st, allocated on first use and free of any copy still in flight.
 * Returns 0 with *ok = 0 when pinned memory cannot be had (the caller copies directly). */
static ts_status stage_get(cuda_ctx *c, cuda_stage *st, int *ok)
{
    *ok = 1;
    if (!st->buf) {
        if (cudaHostAlloc(&st->buf, CUDA_STAGE_BYTES, cudaHostAllocDefault) != cudaSuccess) {
            cudaGetLastError();
            st->buf = NULL;
            *ok = 0;
            return TS_OK;
        }
        cudaError_t e = cudaEventCreateWithFlags(&st->ev, cudaEventDisableTiming);
        if (e != cudaSuccess) {
            cudaFreeHost(st->buf);
            st->buf = NULL;
            return cuda_fail_cu(c, "cudaEventCreateWithFlags", e);
        }
    }
    if (st->pending) {
        CU_CHECK(c, cudaEventSynchronize(st->ev));
        st->pending = 0;
    }
    return TS_OK;
}

/* Host -> device: each chunk is copied into a pinned buffer and queued; the call returns
 * without waiting (the caller's buffer is already consumed). */
static ts_status h2d_locked(cuda_ctx *c, char *dst, const char *src, size_t n)
{
    for (size_t off = 0; off < n; off += CUDA_STAGE_BYTES) {
        size_t len = n - off < CUDA_STAGE_BYTES ? n - off : CUDA_STAGE_BYTES;
        cuda_stage *st = &c->stage[c->stage_next];
        c->stage_next = (c->stage_next + 1) % CUDA_NSTAGE;
        int ok;
        ts_status s = stage_get(c, st, &ok);
        if (s)
            return s;
        if (!ok) { /* no pinned memory: a pageable copy, complete before returning */
            CU_CHECK(c, cudaMemcpyAsync(dst + off, src + off, n - off, cudaMemcpyHostToDevice,
                                        c->stream));
            CU_CHECK(c, cudaStreamSynchronize(c->stream));
            return TS_OK;
        }
        memcpy(st->buf, src + off, len);
        CU_CHECK(c, cudaMemcpyAsync(dst + off, st->buf, len, cudaMemcpyHostToDevice, c->stream));
        CU_CHECK(c, cudaEventRecord(st->ev, c->stream));
        st->pending = 1;
    }
    return TS_OK;
}

/* Device -> host: up to CUDA_NSTAGE chunks in flight; each is copied out of its pinned buffer
 * once its event completes. Returns when all of dst is written. */
static ts_status d2h_locked(cuda_ctx *c, char *dst, const char *src, size_t n)
{
    size_t nchunks = (n + CUDA_STAGE_BYTES - 1) / CUDA_STAGE_BYTES, issued = 0, done = 0;
    int first = c->stage_next;
#define STAGE_OF(k) (&c->stage[(first + (int)((k) % CUDA_NSTAGE)) % CUDA_NSTAGE])
#define CHUNK_LEN(k) (n - (k)*CUDA_STAGE_BYTES < CUDA_STAGE_BYTES ? n - (k)*CUDA_STAGE_BYTES \
                                                                  : CUDA_STAGE_BYTES)
    while (done < nchunks) {
        while (issued < nchunks && issued - done < CUDA_NSTAGE) {
            cuda_stage *st = STAGE_OF(issued);
            size_t off = issued * CUDA_STAGE_BYTES;
            int ok;
            ts_status s = stage_get(c, st, &ok);
            if (s)
                return s;
            if (!ok) { /* no pinned memory: retire what is queued, copy the rest directly */
                for (; done < issued; done++) {
                    CU_CHECK(c, cudaEventSynchronize(STAGE_OF(done)->ev));
                    STAGE_OF(done)->pending = 0;
                    memcpy(dst + done * CUDA_STAGE_BYTES, STAGE_OF(done)->buf, CHUNK_LEN(done));
                }
                CU_CHECK(c, cudaMemcpyAsync(dst + off, src + off, n - off,
                                            cudaMemcpyDeviceToHost, c->stream));
                CU_CHECK(c, cudaStreamSynchronize(c->stream));
                c->stage_next = (first + (int)(issued % CUDA_NSTAGE)) % CUDA_NSTAGE;
                return TS_OK;
            }
            CU_CHECK(c, cudaMemcpyAsync(st->buf, src + off, CHUNK_LEN(issued),
                                        cudaMemcpyDeviceToHost, c->stream));
            CU_CHECK(c, cudaEventRecord(st->ev, c->stream));
            st->pending = 1;
            issued++;
        }
        cuda_stage *st = STAGE_OF(done);
        CU_CHECK(c, cudaEventSynchronize(st->ev));
        st->pending = 0;
        memcpy(dst + done * CUDA_STAGE_BYTES, st->buf, CHUNK_LEN(done));
        done++;
    }
#undef STAGE_OF
#undef CHUNK_LEN
    c->stage_next = (first + (int)(nchunks % CUDA_NSTAGE)) % CUDA_NSTAGE;
    return TS_OK;
}

static ts_status cuda_h2d(void *ctx, void *dst, const void *src, size_t n)
{
    cuda_ctx *c = ctx;
    CU_CHECK(c, cudaSetDevice(c->device));
    if (c->rec)
        return cuda_graph_h2d(c, dst, src, n);
    pthread_mutex_lock(&c->stage_lock);
    ts_status s = h2d_locked(c, dst, src, n);
    pthread_mutex_unlock(&c->stage_lock);
    return s;
}

static ts_status recording(cuda_ctx *c, const char *what)
{
    return c->host->fail(c->host, TS_ESTATE, "%s while a graph is being recorded: the data "
                         "exists only once the graph is replayed; end the recording first",
                         what);
}

static ts_status cuda_d2h(void *ctx, void *dst, const void *src, size_t n)
{
    cuda_ctx *c = ctx;
    if (c->rec)
        return recording(c, "a copy to host memory");
    CU_CHECK(c, cudaSetDevice(c->device));
    pthread_mutex_lock(&c->stage_lock);
    ts_status s = d2h_locked(c, dst, src, n);
    pthread_mutex_unlock(&c->stage_lock);
    return s;
}

static ts_status cuda_d2d(void *ctx, void *dst, const void *src, size_t n)
{
    cuda_ctx *c = ctx;
    CU_CHECK(c, cudaSetDevice(c->device));
    CU_CHECK(c, cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, c->stream));
    return TS_OK;
}

static ts_status cuda_fill(void *ctx, void *dst, size_t nbytes, const void *pattern,
                           size_t pattern_size)
{
    cuda_ctx *c = ctx;
    const unsigned char *p = pattern;
    if ((pattern_size != 1 && pattern_size != 2 && pattern_size != 4 && pattern_size != 8) ||
        nbytes % pattern_size)
        return c->host->fail(c->host, TS_EINVAL,
                             "fill: a pattern of %zu bytes (1, 2, 4 or 8) does not tile %zu",
                             pattern_size, nbytes);
    CU_CHECK(c, cudaSetDevice(c->device));
    int uniform = 1;
    for (size_t i = 1; i < pattern_size; i++)
        uniform &= p[i] == p[0];
    if (uniform) {
        CU_CHECK(c, cudaMemsetAsync(dst, p[0], nbytes, c->stream));
        return TS_OK;
    }
    if ((uintptr_t)dst % pattern_size)
        return c->host->fail(c->host, TS_EINVAL,
                             "fill: destination %p is not aligned to the %zu-byte pattern", dst,
                             pattern_size);
    uint64_t v = 0;
    memcpy(&v, pattern, pattern_size); /* little-endian: the low bytes are the pattern */
    CU_CHECK(c, cu_fill_pattern(c->stream, dst, nbytes, v, (int)pattern_size));
    return TS_OK;
}

static ts_status cuda_sync(void *ctx)
{
    cuda_ctx *c = ctx;
    if (c->rec)
        return recording(c, "synchronize");
    CU_CHECK(c, cudaSetDevice(c->device));
    CU_CHECK(c, cudaStreamSynchronize(c->stream));
    return TS_OK;
}

/* ---- pinned memory and asynchronous uploads ---------------------------------------------- */

static ts_status cuda_host_alloc(void *ctx, size_t nbytes, void **ptr)
{
    cuda_ctx *c = ctx;
    if (cudaSetDevice(c->device) != cudaSuccess ||
        cudaHostAlloc(ptr, nbytes, cudaHostAllocPortable) != cudaSuccess) {
        cudaGetLastError();
        *ptr = NULL;
        return TS_ENOMEM; /* the pool trims its cache, retries, then reports its figures */
    }
    return TS_OK;
}

static void cuda_host_free(void *ctx, void *ptr, size_t nbytes)
{
    (void)nbytes;
    cuda_ctx *c = ctx;
    cudaError_t e;
    if ((e = cudaSetDevice(c->device)) != cudaSuccess ||
        (!c->rec && (e = cudaStreamSynchronize(c->stream)) != cudaSuccess) ||
        (e = cudaFreeHost(ptr)))
        c->host->log(c->host, TS_LOG_ERROR, "cudaFreeHost of pinned memory failed: %s (%s)",
                     cudaGetErrorString(e), cudaGetErrorName(e));
}

static ts_status cuda_h2d_async(void *ctx, void *dst, const void *src, size_t n,
                                uint64_t *ticket)
{
    cuda_ctx *c = ctx;
    if (c->rec)
        return recording(c, "an asynchronous upload");
    CU_CHECK(c, cudaSetDevice(c->device));
    pthread_mutex_lock(&c->up_lock);
    uint64_t t = c->up_next + 1;
    cudaEvent_t *ev = &c->up_ev[t % CUDA_NUPLOAD];
    cudaError_t e = cudaSuccess;
    const char *what = "cudaEventCreateWithFlags";
    if (!*ev)
        e = cudaEventCreateWithFlags(ev, cudaEventDisableTiming);
    else if (t > CUDA_NUPLOAD && t - CUDA_NUPLOAD > c->up_done) {
        /* The slot's previous ticket: complete before its event is recorded again. */
        what = "cudaEventSynchronize";
        if ((e = cudaEventSynchronize(*ev)) == cudaSuccess)
            c->up_done = t - CUDA_NUPLOAD;
    }
    if (e == cudaSuccess) {
        what = "cudaMemcpyAsync";
        e = cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, c->stream);
    }
    if (e == cudaSuccess) {
        what = "cudaEventRecord";
        e = cudaEventRecord(*ev, c->stream);
    }
    if (e == cudaSuccess)
        c->up_next = *ticket = t;
    pthread_mutex_unlock(&c->up_lock);
    return e == cudaSuccess ? TS_OK : cuda_fail_cu(c, what, e);
}

static ts_status cuda_wait_copy(void *ctx, uint64_t ticket)
{
    cuda_ctx *c = ctx;
    pthread_mutex_lock(&c->up_lock);
    cudaError_t e = cudaSuccess;
    if (ticket > c->up_next) {
        pthread_mutex_unlock(&c->up_lock);
        return c->host->fail(c->host, TS_EINVAL, "wait_copy: ticket %llu was never issued "
                             "(the last is %llu)", (unsigned long long)ticket,
                             (unsigned long long)c->up_next);
    }
    if (ticket > c->up_done && (e = cudaSetDevice(c->device)) == cudaSuccess) {
        /* Tickets older than the ring were waited for when their slot was reused. */
        if (c->up_next - ticket < CUDA_NUPLOAD)
            e = cudaEventSynchronize(c->up_ev[ticket % CUDA_NUPLOAD]);
        if (e == cudaSuccess)
            c->up_done = ticket;
    }
    pthread_mutex_unlock(&c->up_lock);
    return e == cudaSuccess ? TS_OK : cuda_fail_cu(c, "cudaEventSynchronize", e);
}

/* ---- kernels --------------------------------------------------------------------------- */

static int cuda_supports(void *ctx, int32_t op, int32_t dtype)
{
    (void)ctx;
    return cuda_ops_supports(op, dtype) || cuda_gemm_supports(op, dtype);
}

static ts_status cuda_convert(void *ctx, const ts_operand *dst, const ts_operand *src)
{
    return cuda_copy_strided(ctx, dst, src);
}

static ts_status cuda_run_f32(void *ctx, const ts_kernel_call *call)
{
    cuda_ctx *c = ctx;
    int32_t dtype = call->noutputs > 0 ? call->outputs[0].dtype : TS_F32;
    if (cuda_gemm_supports(call->op, dtype))
        return cuda_gemm_run(c, call);
    if (cuda_ops_supports(call->op, dtype))
        return cuda_ops_run(c, call);
    return c->host->fail(c->host, TS_ENOTSUP, "op %d is not implemented for dtype %d",
                         (int)call->op, (int)dtype);
}

static ts_status cuda_run(void *ctx, const ts_kernel_call *call)
{
    cuda_ctx *c = ctx;
    if (!call || (call->ninputs > 0 && !call->inputs) || (call->noutputs > 0 && !call->outputs) ||
        call->ninputs < 0 || call->noutputs < 0)
        return c->host->fail(c->host, TS_EINVAL, "run: malformed kernel call");
    CU_CHECK(c, cudaSetDevice(c->device));
    /* the 16-bit floats: elementwise kernels of their own (computed in float32) and
     * cublasGemmEx's matmul (float32 accumulation); every other op on float32 copies in the
     * pool, converted on the device */
    if (!hk_half_native(call->op) && call->op != TS_OP_MATMUL && hk_call_has_half(call))
        return hk_via_float32(c->host, 1, call, cuda_convert, c, cuda_run_f32, c);
    return cuda_run_f32(c, call);
}

static const ts_plugin_desc desc = {
    .abi_major = TS_PLUGIN_ABI_MAJOR,
    .abi_minor = TS_PLUGIN_ABI_MINOR,
    .struct_size = sizeof(ts_plugin_desc),
    .name = "cuda",
    .version = PACKAGE_VERSION,
    .description = "NVIDIA GPUs through the CUDA runtime and cuBLAS; bfloat16 and float16 "
                   "matmuls native on cublasGemmEx (float32 accumulation), the other ops "
                   "computed in float32",
    .config_keys = keys,
    .alignment = CUDA_ALIGN,
    .init = cuda_init,
    .shutdown = cuda_shutdown,
    .device_info = cuda_device_info,
    .mem_alloc = cuda_mem_alloc,
    .mem_free = cuda_mem_free,
    .copy_h2d = cuda_h2d,
    .copy_d2h = cuda_d2h,
    .copy_d2d = cuda_d2d,
    .fill = cuda_fill,
    .synchronize = cuda_sync,
    .supports = cuda_supports,
    .run = cuda_run,
    .vm_granularity = cuda_vm_granularity,
    .vm_reserve = cuda_vm_reserve,
    .vm_release = cuda_vm_release,
    .vm_commit = cuda_vm_commit,
    .vm_decommit = cuda_vm_decommit,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .copy_h2d_async = cuda_h2d_async,
    .wait_copy = cuda_wait_copy,
    .graph_begin = cuda_graph_begin,
    .graph_end = cuda_graph_end,
    .graph_launch = cuda_graph_launch,
    .graph_free = cuda_graph_free,
};

TS_PLUGIN_DEFINE(desc)
