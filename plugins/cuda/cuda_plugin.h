/* plugins/cuda/cuda_plugin.h: the cuda plugin's C side: its context (one device, one stream,
 * one cuBLAS handle, the pool, pinned staging buffers), the checked-call macros and the op
 * entry points shared by cuda.c (descriptor, memory, copies), ops.c (every op but matmul and
 * conv) and gemm.c (matmul and conv through cuBLAS). */
#ifndef TESSERA_PLUGINS_CUDA_PLUGIN_H
#define TESSERA_PLUGINS_CUDA_PLUGIN_H

#include <pthread.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "hostkern.h" /* kernels/host */
#include "kernels.h"

#define CUDA_ALIGN 256
/* Pinned staging buffers for host <-> device copies: CUDA_NSTAGE of CUDA_STAGE_BYTES,
 * allocated on first use, reused round robin; each has an event recorded after the copy
 * that last used it. */
#define CUDA_NSTAGE 4
#define CUDA_STAGE_BYTES ((size_t)4 << 20)
/* Events naming the asynchronous uploads in flight (copy_h2d_async tickets). */
#define CUDA_NUPLOAD 16
/* cuBLAS workspace, set once so cuBLAS never allocates behind the pool's back. */
#define CUDA_CUBLAS_WS_BYTES ((size_t)32 << 20)

typedef struct cuda_stage {
    void *buf;      /* cudaHostAlloc'd, CUDA_STAGE_BYTES */
    cudaEvent_t ev; /* recorded after the last copy that read or wrote buf */
    int pending;    /* ev has been recorded */
} cuda_stage;

typedef struct cuda_graph cuda_graph;

typedef struct cuda_ctx {
    const ts_host *host;
    int device;
    cudaStream_t stream;
    cublasHandle_t blas;
    void *blas_ws;                /* raw cudaMalloc: outside the pool's statistics */
    unsigned long long *d_flag;   /* device word for range checks (raw cudaMalloc) */
    unsigned long long *h_flag;   /* pinned host word it is copied back into */
    pthread_mutex_t stage_lock;   /* the staging ring and h_flag */
    pthread_mutex_t flag_lock;    /* d_flag, from cuda_flag_begin to cuda_flag_end */
    cuda_stage stage[CUDA_NSTAGE];
    int stage_next;
    /* Asynchronous uploads from pinned memory: ticket t's completion event is
     * up_ev[t % CUDA_NUPLOAD] until ticket t + CUDA_NUPLOAD reuses the slot (after waiting
     * for it). up_done: every ticket up to it is known complete. */
    pthread_mutex_t up_lock;
    cudaEvent_t up_ev[CUDA_NUPLOAD];
    uint64_t up_next, up_done;
    cuda_graph *rec;   /* the graph being recorded (graph.c), or NULL */
    size_t vm_granule; /* expandable segment (vm.c): the commit unit, 0 before asked */
    char *vm_base;     /* the pool's reserved range, mapped granule by granule ... */
    size_t vm_mapped;  /* ... from vm_base up to here */
} cuda_ctx;

/* Fails with the CUDA call's name and error text (cudaGetErrorString), code TS_EKERNEL. */
#define CU_CHECK(c, call)                                                                   \
    do {                                                                                    \
        cudaError_t e_ = (call);                                                            \
        if (e_ != cudaSuccess)                                                              \
            return cuda_fail_cu((c), #call, e_);                                            \
    } while (0)

/* The same for a cuBLAS call (cublasGetStatusString). */
#define CUBLAS_CHECK(c, call)                                                               \
    do {                                                                                    \
        cublasStatus_t e_ = (call);                                                         \
        if (e_ != CUBLAS_STATUS_SUCCESS)                                                    \
            return cuda_fail_blas((c), #call, e_);                                          \
    } while (0)

ts_status cuda_fail_cu(cuda_ctx *c, const char *call, cudaError_t e);
ts_status cuda_fail_blas(cuda_ctx *c, const char *call, cublasStatus_t e);

/* Pool scratch (device memory, freed with cuda_scratch_free: reuse by later work on the same
 * stream is ordered after every use queued before the free). */
ts_status cuda_scratch(cuda_ctx *c, size_t nbytes, const char *tag, void **p);
void cuda_scratch_free(cuda_ctx *c, void *p);

/* Range checks on device data: cuda_flag_begin takes the instance's flag (c->d_flag: one per
 * instance, so a second thread running an index-checked op waits here rather than resetting or
 * reading the flag under the first one's kernel) and resets it; the caller queues its check
 * kernel on c->d_flag; cuda_flag_end (after begin succeeded, whatever happened in between)
 * reads it back when status is TS_OK, synchronizing the stream (the only kernel path that
 * does: the result decides the call's status), releases the flag and returns status or the
 * read's failure. *pos: the first bad position, or -1 if none. */
ts_status cuda_flag_begin(cuda_ctx *c);
ts_status cuda_flag_end(cuda_ctx *c, ts_status status, int64_t *pos);

/* A strided copy of src into dst (same shape and dtype) on the stream. */
ts_status cuda_copy_strided(cuda_ctx *c, const ts_operand *dst, const ts_operand *src);

/* t = beta * t on the stream (beta 0 writes zeros). */
ts_status cuda_scale_inplace(cuda_ctx *c, const ts_operand *t, double beta);

/* Op families: each returns TS_ENOTSUP (no message) for ops it does not handle. */
int cuda_ops_supports(int32_t op, int32_t dtype);
ts_status cuda_ops_run(cuda_ctx *c, const ts_kernel_call *call);
int cuda_gemm_supports(int32_t op, int32_t dtype);
ts_status cuda_gemm_run(cuda_ctx *c, const ts_kernel_call *call);

/* The vm_* slots (vm.c): the pool's expandable segment through CUDA's virtual memory
 * management; cuda_vm_granularity answers 0 where the driver or device cannot. */
size_t cuda_vm_granularity(void *ctx);
ts_status cuda_vm_reserve(void *ctx, size_t nbytes, void **base);
void cuda_vm_release(void *ctx, void *base, size_t nbytes);
ts_status cuda_vm_commit(void *ctx, void *addr, size_t nbytes);
void cuda_vm_decommit(void *ctx, void *addr, size_t nbytes);

/* The graph_* slots (graph.c), and the upload from host memory while recording. */
ts_status cuda_graph_begin(void *ctx);
ts_status cuda_graph_end(void *ctx, void **graph);
ts_status cuda_graph_launch(void *ctx, void *graph);
void cuda_graph_free(void *ctx, void *graph);
ts_status cuda_graph_h2d(cuda_ctx *c, void *dst, const void *src, size_t n);

/* Bytes per element; 0 for an unknown dtype. */
/* Device pointer to op's element 0. */
static inline char *cuda_elem0(const ts_operand *op)
{
    return (char *)op->data + op->offset * (int64_t)ts_plugin_dtype_size(op->dtype);
}

#endif /* TESSERA_PLUGINS_CUDA_PLUGIN_H */
