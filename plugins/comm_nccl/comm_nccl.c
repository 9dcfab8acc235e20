/* plugins/comm_nccl/comm_nccl.c: the NCCL communication backend (tessera/comm.h) for CUDA
 * GPUs. The launcher (mpirun, srun) starts the ranks and MPI bootstraps the job: rank 0
 * creates NCCL's unique id and broadcasts it, then every rank joins one NCCL communicator on
 * its GPU. Collectives take device memory of that GPU (TS_COMM_DEVICE_BUFFERS), run on a
 * stream of the plugin's own and return when complete; the host stages its host-memory
 * collectives through the device and synchronises the device before handing over a buffer
 * that kernels wrote.
 *
 * The GPU: the launcher's local rank modulo the GPUs (ts_launcher_local_rank), the rule the
 * cuda plugin follows with device_index = -1, so a rank's tensors and its communicator live
 * on the same GPU; a buffer on another GPU is refused with a message saying so.
 *
 * Never a silent hang: a failure only this rank sees once the others may be waiting in NCCL
 * (its communicator cannot be created, a buffer on the wrong GPU) ends the whole job with the
 * reason (MPI_Abort); while a collective runs, the plugin polls the stream and NCCL's
 * asynchronous error state (network failures), and a collective that makes no progress for
 * COMM_NCCL_TIMEOUT_S (a rank that stopped taking part) is aborted and reported. A rank that
 * dies outright makes the launcher end the others. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <tessera/comm.h>
#include <tessera/plugin.h> /* ts_dtype values, ts_launcher_local_rank */

/* A collective that has not finished after this long is taken for a hang. Generous: a
 * multi-gigabyte all-reduce on a slow network takes seconds, not minutes. */
#define COMM_NCCL_TIMEOUT_S 600

#define STR2(x) #x
#define STR(x) STR2(x)

typedef struct nccl_ctx {
    const ts_comm_host *host;
    MPI_Comm mpi; /* bootstrap, and the barrier */
    ncclComm_t comm;
    cudaStream_t stream;
    int rank, size, gpu;
    int we_initialised; /* MPI */
    char device[16];
} nccl_ctx;

static int launched(void)
{
    return ts_comm_launcher_present();
}

static ts_status cuda_fail(const ts_comm_host *h, cudaError_t e, const char *what)
{
    cudaGetLastError(); /* a non-sticky error must not fail the next call */
    return h->fail(h, e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ? TS_ENODEV
                                                                                 : TS_EIO,
                   "%s failed: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

static ts_status nccl_fail(const ts_comm_host *h, ncclResult_t r, const char *what)
{
    return h->fail(h, r == ncclSystemError || r == ncclRemoteError ? TS_EIO : TS_EPLUGIN,
                   "%s failed: %s", what, ncclGetErrorString(r));
}

static ts_status nccl_init(const ts_comm_host *host, void **out)
{
    *out = NULL;
    nccl_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return host->fail(host, TS_ENOMEM, "out of host memory");
    c->host = host;
    c->mpi = MPI_COMM_NULL;
    ts_status s = TS_OK;
    int inited = 0, provided = 0, rc, count = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
        if (rc != MPI_SUCCESS) {
            free(c);
            return host->fail(host, TS_EIO, "MPI_Init_thread failed (error %d): is this "
                              "process started by mpirun or srun?", rc);
        }
        c->we_initialised = 1;
    } else {
        MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_SERIALIZED) {
        s = host->fail(host, TS_ENOTSUP, "the MPI library provides thread level %d, below "
                       "MPI_THREAD_SERIALIZED (%d) that tessera needs", provided,
                       MPI_THREAD_SERIALIZED);
        goto fail;
    }
    if (MPI_Comm_dup(MPI_COMM_WORLD, &c->mpi) != MPI_SUCCESS) {
        s = host->fail(host, TS_EIO, "MPI_Comm_dup failed");
        goto fail;
    }
    MPI_Comm_set_errhandler(c->mpi, MPI_ERRORS_RETURN);
    MPI_Comm_rank(c->mpi, &c->rank);
    MPI_Comm_size(c->mpi, &c->size);

    /* Every rank learns whether every other found a GPU before any waits in NCCL. */
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        cudaGetLastError();
        s = host->fail(host, TS_ENODEV, "this rank has no usable GPU (%s); NCCL needs one a "
                       "rank: on CPUs use [dist] backend = mpi",
                       e != cudaSuccess ? cudaGetErrorString(e) : "0 CUDA devices");
        count = 0;
    }
    int lr = ts_launcher_local_rank();
    c->gpu = count ? (lr >= 0 ? lr % count : 0) : -1;
    if (!s && (e = cudaSetDevice(c->gpu)) != cudaSuccess)
        s = cuda_fail(host, e, "cudaSetDevice");
    if (!s && (e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess)
        s = cuda_fail(host, e, "cudaStreamCreateWithFlags");
    int bad = s != TS_OK, anybad = 0;
    if (MPI_Allreduce(&bad, &anybad, 1, MPI_INT, MPI_SUM, c->mpi) != MPI_SUCCESS && !s)
        s = host->fail(host, TS_EIO, "MPI_Allreduce (checking every rank's GPU) failed");
    if (!s && anybad)
        s = host->fail(host, TS_ENODEV, "%d of %d ranks have no usable GPU (their own "
                       "messages say why)", anybad, c->size);
    if (s)
        goto fail;

    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    ncclResult_t r = ncclSuccess;
    if (c->rank == 0)
        r = ncclGetUniqueId(&id);
    /* rank 0's failure reaches the others as an all-zero id with the verdict */
    int idbad = r != ncclSuccess, anyidbad = 0;
    if (MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, c->mpi) != MPI_SUCCESS ||
        MPI_Allreduce(&idbad, &anyidbad, 1, MPI_INT, MPI_SUM, c->mpi) != MPI_SUCCESS) {
        s = host->fail(host, TS_EIO, "handing out NCCL's unique id over MPI failed");
        goto fail;
    }
    if (anyidbad) {
        s = r != ncclSuccess ? nccl_fail(host, r, "ncclGetUniqueId")
                             : host->fail(host, TS_EIO, "rank 0 could not create NCCL's "
                                          "unique id (its message says why)");
        goto fail;
    }
    if ((r = ncclCommInitRank(&c->comm, c->size, id, c->rank)) != ncclSuccess) {
        /* the others may be waiting inside their own ncclCommInitRank: end the job */
        s = nccl_fail(host, r, "ncclCommInitRank");
        host->log(host, 3, "rank %d of %d: aborting the job: ncclCommInitRank failed: %s "
                  "(GPU %d; two ranks on one GPU is a common cause: start one rank a GPU)",
                  c->rank, c->size, ncclGetErrorString(r), c->gpu);
        MPI_Abort(c->mpi, 1);
        c->comm = NULL;
        goto fail;
    }
    snprintf(c->device, sizeof c->device, "cuda");
    host->log(host, 1, "rank %d of %d on GPU %d (local rank %d)", c->rank, c->size, c->gpu,
              lr);
    *out = c;
    return TS_OK;
fail:
    if (c->stream)
        cudaStreamDestroy(c->stream);
    if (c->mpi != MPI_COMM_NULL)
        MPI_Comm_free(&c->mpi);
    if (c->we_initialised)
        MPI_Finalize();
    free(c);
    return s;
}

static int nccl_rank(void *ctx)
{
    return ((nccl_ctx *)ctx)->rank;
}

static int nccl_size(void *ctx)
{
    return ((nccl_ctx *)ctx)->size;
}

static const char *nccl_device(void *ctx)
{
    return ((nccl_ctx *)ctx)->device;
}

static ts_status check_buffer_here(nccl_ctx *c, const void *p, const char *what);

/* A buffer of the caller's must be memory of this rank's GPU. The other ranks are entering
 * the same collective: refusing here alone would leave them waiting, so with several ranks a
 * refusal ends the job with the reason. */
static ts_status check_buffer(nccl_ctx *c, const void *p, const char *what)
{
    ts_status s = check_buffer_here(c, p, what);
    if (s && c->size > 1) {
        c->host->log(c->host, 3, "rank %d of %d: aborting the job: %s: the buffer is not "
                     "memory of this rank's GPU %d (its tensors and its communicator must "
                     "share a GPU: [plugin.cuda] device_index = -1)", c->rank, c->size, what,
                     c->gpu);
        MPI_Abort(c->mpi, 1);
    }
    return s;
}

static ts_status check_buffer_here(nccl_ctx *c, const void *p, const char *what)
{
    struct cudaPointerAttributes a;
    cudaError_t e = cudaPointerGetAttributes(&a, p);
    if (e != cudaSuccess)
        return cuda_fail(c->host, e, "cudaPointerGetAttributes");
    if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)
        return c->host->fail(c->host, TS_EINVAL, "%s: the buffer is not GPU memory (this "
                             "backend takes device buffers of the 'cuda' device)", what);
    if (a.device != c->gpu)
        return c->host->fail(c->host, TS_EINVAL, "%s: the buffer is on GPU %d but this rank "
                             "communicates from GPU %d; leave [plugin.cuda] device_index at "
                             "-1 so that both follow the local rank", what, a.device, c->gpu);
    return TS_OK;
}

/* Waits for the stream, watching NCCL's error state: a communicator in error is aborted and
 * the collective fails instead of waiting forever. */
static ts_status finish(nccl_ctx *c, const char *what)
{
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (unsigned spins = 0;; spins++) {
        cudaError_t e = cudaStreamQuery(c->stream);
        if (e == cudaSuccess)
            return TS_OK;
        if (e != cudaErrorNotReady)
            return cuda_fail(c->host, e, what);
        ncclResult_t async = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(c->comm, &async);
        if (r != ncclSuccess || async != ncclSuccess) {
            ncclResult_t why = r != ncclSuccess ? r : async;
            ncclCommAbort(c->comm);
            c->comm = NULL;
            return c->host->fail(c->host, TS_EIO, "%s: NCCL reported %s (a rank died or the "
                                 "network failed); the communicator is aborted", what,
                                 ncclGetErrorString(why));
        }
        if (spins > 1000) { /* past the first millisecond or so, sleep between polls */
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
            clock_gettime(CLOCK_MONOTONIC, &now);
            if (now.tv_sec - t0.tv_sec > COMM_NCCL_TIMEOUT_S) {
                ncclCommAbort(c->comm);
                c->comm = NULL;
                return c->host->fail(c->host, TS_EIO, "%s: no progress in %d s: a rank "
                                     "stopped taking part (it failed or runs another step); "
                                     "the communicator is aborted", what,
                                     COMM_NCCL_TIMEOUT_S);
            }
        }
    }
}

static ncclDataType_t nccl_type(int32_t dtype, int *ok)
{
    *ok = 1;
    switch (dtype) {
    case TS_F32: return ncclFloat32;
    case TS_F64: return ncclFloat64;
    case TS_I32: return ncclInt32;
    case TS_I64: return ncclInt64;
    case TS_U8: return ncclUint8;
    default: *ok = 0; return ncclUint8;
    }
}

static ts_status ready(nccl_ctx *c, const char *what)
{
    if (!c->comm)
        return c->host->fail(c->host, TS_ESTATE, "%s: the NCCL communicator was aborted "
                             "after an earlier failure; the job must restart", what);
    cudaError_t e = cudaSetDevice(c->gpu); /* the host may call from any of its threads */
    return e == cudaSuccess ? TS_OK : cuda_fail(c->host, e, "cudaSetDevice");
}

/* A sum's NCCL type in *t, or TS_EINVAL naming what for another dtype or reduction. */
static ts_status sum_type(const nccl_ctx *c, int32_t dtype, int32_t op, const char *what,
                          ncclDataType_t *t)
{
    int ok;
    *t = nccl_type(dtype, &ok);
    if (!ok || op != TS_COMM_SUM)
        return c->host->fail(c->host, TS_EINVAL, "%s: dtype %d or reduction %d not supported",
                             what, (int)dtype, (int)op);
    return TS_OK;
}

/* What an NCCL call returned r: its failure, or the wait for its completion. */
static ts_status issued(nccl_ctx *c, ncclResult_t r, const char *what)
{
    return r != ncclSuccess ? nccl_fail(c->host, r, what) : finish(c, what);
}

static ts_status nccl_allreduce(void *ctx, void *buf, size_t count, int32_t dtype, int32_t op)
{
    nccl_ctx *c = ctx;
    ncclDataType_t t;
    ts_status s = sum_type(c, dtype, op, "allreduce", &t);
    if (s)
        return s;
    s = ready(c, "ncclAllReduce");
    if (!s && count)
        s = check_buffer(c, buf, "allreduce");
    if (s || !count)
        return s;
    return issued(c, ncclAllReduce(buf, buf, count, t, ncclSum, c->comm, c->stream),
                    "ncclAllReduce");
}

static ts_status nccl_reduce_scatter(void *ctx, const void *send, void *recv, size_t count,
                                     int32_t dtype, int32_t op)
{
    nccl_ctx *c = ctx;
    ncclDataType_t t;
    ts_status s = sum_type(c, dtype, op, "reduce_scatter", &t);
    if (s)
        return s;
    s = ready(c, "ncclReduceScatter");
    if (!s && count && !(s = check_buffer(c, send, "reduce_scatter (send)")))
        s = check_buffer(c, recv, "reduce_scatter (receive)");
    if (s || !count)
        return s;
    return issued(c, ncclReduceScatter(send, recv, count, t, ncclSum, c->comm, c->stream),
                    "ncclReduceScatter");
}

static ts_status nccl_broadcast(void *ctx, void *buf, size_t nbytes, int root)
{
    nccl_ctx *c = ctx;
    ts_status s = ready(c, "ncclBroadcast");
    if (!s && nbytes)
        s = check_buffer(c, buf, "broadcast");
    if (s || !nbytes)
        return s;
    return issued(c, ncclBroadcast(buf, buf, nbytes, ncclUint8, root, c->comm, c->stream),
                    "ncclBroadcast");
}

static ts_status nccl_allgather(void *ctx, const void *send, void *recv, size_t nbytes)
{
    nccl_ctx *c = ctx;
    ts_status s = ready(c, "ncclAllGather");
    if (!s && nbytes && !(s = check_buffer(c, send, "allgather (send)")))
        s = check_buffer(c, recv, "allgather (receive)");
    if (s || !nbytes)
        return s;
    return issued(c, ncclAllGather(send, recv, nbytes, ncclUint8, c->comm, c->stream),
                    "ncclAllGather");
}

static ts_status nccl_barrier(void *ctx)
{
    nccl_ctx *c = ctx;
    int rc = MPI_Barrier(c->mpi);
    return rc == MPI_SUCCESS ? TS_OK : c->host->fail(c->host, TS_EIO, "MPI_Barrier failed");
}

static void nccl_abort(void *ctx, int code, const char *reason)
{
    nccl_ctx *c = ctx;
    if (reason)
        c->host->log(c->host, 3, "rank %d of %d: aborting the job: %s", c->rank, c->size,
                     reason);
    /* No ncclCommAbort here: the communication thread may be using the communicator;
     * MPI_Abort ends every process, and NCCL with them. */
    MPI_Abort(c->mpi != MPI_COMM_NULL ? c->mpi : MPI_COMM_WORLD, code ? code : 1);
    abort(); /* MPI_Abort does not return */
}

static void nccl_shutdown(void *ctx)
{
    nccl_ctx *c = ctx;
    if (!c)
        return;
    if (c->comm) {
        cudaSetDevice(c->gpu);
        ncclCommDestroy(c->comm);
    }
    if (c->stream)
        cudaStreamDestroy(c->stream);
    MPI_Comm_free(&c->mpi);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (c->we_initialised && !finalized)
        MPI_Finalize();
    free(c);
}

static const ts_comm_desc desc = {
    .struct_size = sizeof(ts_comm_desc),
    .abi_major = TS_COMM_ABI_MAJOR,
    .abi_minor = TS_COMM_ABI_MINOR,
    .name = "nccl",
    .description = "NCCL " STR(NCCL_MAJOR) "." STR(NCCL_MINOR) "." STR(NCCL_PATCH)
                   " (bootstrap over MPI)",
    .flags = TS_COMM_DEVICE_BUFFERS,
    .launched = launched,
    .init = nccl_init,
    .rank = nccl_rank,
    .size = nccl_size,
    .allreduce = nccl_allreduce,
    .broadcast = nccl_broadcast,
    .allgather = nccl_allgather,
    .barrier = nccl_barrier,
    .abort = nccl_abort,
    .shutdown = nccl_shutdown,
    .device = nccl_device,
    .reduce_scatter = nccl_reduce_scatter,
};

TS_COMM_DEFINE(desc)
