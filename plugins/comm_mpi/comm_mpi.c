/* plugins/comm_mpi/comm_mpi.c: the MPI communication backend (tessera/comm.h) on Open MPI or
 * any MPI-3 library. The world communicator is duplicated, so tessera's collectives never
 * mix with an application's own MPI traffic, and errors return to the caller
 * (MPI_ERRORS_RETURN) with the library's message instead of aborting inside MPI. Host buffers
 * only. MPI is initialised here unless the application already did it; then it is left for
 * the application to finalise. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include <malloc.h>
#include <mpi.h>

#include <tessera/comm.h>
#include <tessera/plugin.h> /* ts_dtype values */

#define STR2(x) #x
#define STR(x) STR2(x)
#if defined(OPEN_MPI)
#define MPI_LIB "Open MPI " STR(OMPI_MAJOR_VERSION) "." STR(OMPI_MINOR_VERSION) "." STR(OMPI_RELEASE_VERSION)
#else
#define MPI_LIB "MPI " STR(MPI_VERSION) "." STR(MPI_SUBVERSION)
#endif

typedef struct mpi_ctx {
    const ts_comm_host *host;
    MPI_Comm comm;
    int rank, size;
    int we_initialised;
} mpi_ctx;

static int launched(void)
{
    return ts_comm_launcher_present();
}

/* The failure of an MPI call rc as the host's error. */
static ts_status mpi_fail(const ts_comm_host *h, int rc, const char *what)
{
    char msg[MPI_MAX_ERROR_STRING + 1];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS)
        len = 0;
    msg[len] = 0;
    return h->fail(h, TS_EIO, "%s failed: %s", what, len ? msg : "unknown MPI error");
}

/* Open MPI's collectives allocate temporaries as large as the message on every call (a
 * reduce-scatter: the whole send buffer). glibc serves blocks above its mmap threshold with
 * mmap and returns them with munmap, and trims the heap's top, so every call page-faults its
 * temporary in again: a 16 MiB reduce-scatter took 9.2 ms instead of 2.4, the hierarchical
 * all-reduce of 1 MiB 1.18 ms instead of 0.42 (2 cores, loopback). Blocks up to 32 MiB (the
 * 25 MiB gradient buckets) stay in the heap, and 256 MiB of free heap top before a trim,
 * unless the user tuned malloc through the environment. */
static void keep_temporaries(void)
{
#ifdef M_MMAP_THRESHOLD
    const char *tun = getenv("GLIBC_TUNABLES");
    if (getenv("MALLOC_MMAP_THRESHOLD_") || getenv("MALLOC_TRIM_THRESHOLD_") ||
        (tun && (strstr(tun, "mmap_threshold") || strstr(tun, "trim_threshold"))))
        return;
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 256 << 20);
#endif
}

static ts_status mpi_init(const ts_comm_host *host, void **out)
{
    *out = NULL;
    mpi_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return host->fail(host, TS_ENOMEM, "out of host memory");
    c->host = host;
    int inited = 0, provided = 0, rc;
    MPI_Initialized(&inited);
    if (!inited) {
        /* The host serialises its calls but may make them from more than one thread. */
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
        ts_status s = host->fail(host, TS_ENOTSUP, "the MPI library provides thread level %d, "
                                 "below MPI_THREAD_SERIALIZED (%d) that tessera needs",
                                 provided, MPI_THREAD_SERIALIZED);
        if (c->we_initialised)
            MPI_Finalize();
        free(c);
        return s;
    }
    if ((rc = MPI_Comm_dup(MPI_COMM_WORLD, &c->comm)) != MPI_SUCCESS) {
        ts_status s = mpi_fail(host, rc, "MPI_Comm_dup");
        if (c->we_initialised)
            MPI_Finalize();
        free(c);
        return s;
    }
    MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(c->comm, &c->rank);
    MPI_Comm_size(c->comm, &c->size);
    if (c->size > 1)
        keep_temporaries();
    *out = c;
    return TS_OK;
}

static int mpi_rank(void *ctx)
{
    return ((mpi_ctx *)ctx)->rank;
}

static int mpi_size(void *ctx)
{
    return ((mpi_ctx *)ctx)->size;
}

static MPI_Datatype mpi_type(int32_t dtype)
{
    switch (dtype) {
    case TS_F32: return MPI_FLOAT;
    case TS_F64: return MPI_DOUBLE;
    case TS_I32: return MPI_INT32_T;
    case TS_I64: return MPI_INT64_T;
    case TS_U8: return MPI_UINT8_T;
    default: return MPI_DATATYPE_NULL;
    }
}

static size_t type_size(int32_t dtype)
{
    return dtype == TS_F64 || dtype == TS_I64 ? 8 : dtype == TS_U8 ? 1 : 4;
}

/* MPI counts are int: large buffers go in chunks of at most 2^30 elements. */
#define CHUNK ((size_t)1 << 30)

static ts_status mpi_allreduce(void *ctx, void *buf, size_t count, int32_t dtype, int32_t op)
{
    mpi_ctx *c = ctx;
    MPI_Datatype t = mpi_type(dtype);
    if (t == MPI_DATATYPE_NULL || op != TS_COMM_SUM)
        return c->host->fail(c->host, TS_EINVAL, "allreduce: dtype %d or reduction %d not "
                             "supported", (int)dtype, (int)op);
    for (size_t at = 0; at < count; at += CHUNK) {
        size_t n = count - at < CHUNK ? count - at : CHUNK;
        int rc = MPI_Allreduce(MPI_IN_PLACE, (char *)buf + at * type_size(dtype), (int)n, t,
                               MPI_SUM, c->comm);
        if (rc != MPI_SUCCESS)
            return mpi_fail(c->host, rc, "MPI_Allreduce");
    }
    return TS_OK;
}

static ts_status mpi_broadcast(void *ctx, void *buf, size_t nbytes, int root)
{
    mpi_ctx *c = ctx;
    for (size_t at = 0; at < nbytes; at += CHUNK) {
        size_t n = nbytes - at < CHUNK ? nbytes - at : CHUNK;
        int rc = MPI_Bcast((char *)buf + at, (int)n, MPI_BYTE, root, c->comm);
        if (rc != MPI_SUCCESS)
            return mpi_fail(c->host, rc, "MPI_Bcast");
    }
    return TS_OK;
}

static ts_status mpi_allgather(void *ctx, const void *send, void *recv, size_t nbytes)
{
    mpi_ctx *c = ctx;
    if (nbytes > INT_MAX)
        return c->host->fail(c->host, TS_EINVAL, "allgather: %zu bytes per rank, above the "
                             "%d MPI takes at once", nbytes, INT_MAX);
    int rc = MPI_Allgather(send, (int)nbytes, MPI_BYTE, recv, (int)nbytes, MPI_BYTE, c->comm);
    return rc == MPI_SUCCESS ? TS_OK : mpi_fail(c->host, rc, "MPI_Allgather");
}

static ts_status mpi_reduce_scatter(void *ctx, const void *send, void *recv, size_t count,
                                    int32_t dtype, int32_t op)
{
    mpi_ctx *c = ctx;
    MPI_Datatype t = mpi_type(dtype);
    if (t == MPI_DATATYPE_NULL || op != TS_COMM_SUM)
        return c->host->fail(c->host, TS_EINVAL, "reduce_scatter: dtype %d or reduction %d "
                             "not supported", (int)dtype, (int)op);
    if (count > INT_MAX)
        return c->host->fail(c->host, TS_EINVAL, "reduce_scatter: %zu elements per rank, "
                             "above the %d MPI takes at once", count, INT_MAX);
    int rc = MPI_Reduce_scatter_block(send, recv, (int)count, t, MPI_SUM, c->comm);
    return rc == MPI_SUCCESS ? TS_OK : mpi_fail(c->host, rc, "MPI_Reduce_scatter_block");
}

static ts_status mpi_split(void *ctx, int color, int key, void **sub)
{
    mpi_ctx *c = ctx;
    *sub = NULL;
    MPI_Comm nc = MPI_COMM_NULL;
    int rc = MPI_Comm_split(c->comm, color < 0 ? MPI_UNDEFINED : color, key, &nc);
    if (rc != MPI_SUCCESS)
        return mpi_fail(c->host, rc, "MPI_Comm_split");
    if (nc == MPI_COMM_NULL)
        return TS_OK;
    mpi_ctx *n = calloc(1, sizeof *n);
    if (!n) {
        MPI_Comm_free(&nc);
        return c->host->fail(c->host, TS_ENOMEM, "split: out of memory");
    }
    n->host = c->host;
    n->comm = nc;
    MPI_Comm_rank(nc, &n->rank);
    MPI_Comm_size(nc, &n->size);
    *sub = n;
    return TS_OK;
}

static void mpi_free_sub(void *sub)
{
    mpi_ctx *n = sub;
    if (!n)
        return;
    MPI_Comm_free(&n->comm);
    free(n);
}

static ts_status mpi_barrier(void *ctx)
{
    mpi_ctx *c = ctx;
    int rc = MPI_Barrier(c->comm);
    return rc == MPI_SUCCESS ? TS_OK : mpi_fail(c->host, rc, "MPI_Barrier");
}

static void mpi_abort(void *ctx, int code, const char *reason)
{
    mpi_ctx *c = ctx;
    if (reason)
        c->host->log(c->host, 3, "rank %d of %d: aborting the job: %s", c->rank, c->size,
                     reason);
    MPI_Abort(c ? c->comm : MPI_COMM_WORLD, code ? code : 1);
    abort(); /* MPI_Abort does not return */
}

static void mpi_shutdown(void *ctx)
{
    mpi_ctx *c = ctx;
    if (!c)
        return;
    MPI_Comm_free(&c->comm);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (c->we_initialised && !finalized)
        MPI_Finalize();
    free(c);
}

#ifdef COMM_MPI_DEVICE_TEST
/* tests/dist's comm_devtest.so: this plugin posing as a device-buffer backend on a
 * host-memory device ($TS_DEVTEST_DEVICE, default cpu_blas), so that the host's device-buffer
 * paths (staged host collectives, buckets summed in device memory) run under mpirun on a
 * machine without a GPU. Never installed. */
static const char *devtest_device(void *ctx)
{
    (void)ctx;
    const char *d = getenv("TS_DEVTEST_DEVICE");
    return d && *d ? d : "cpu_blas";
}
#define COMM_NAME "devtest"
#define COMM_FLAGS TS_COMM_DEVICE_BUFFERS
#elif defined(COMM_MPI_V11_TEST)
/* tests/dist's comm_v11test.so: this plugin as a communication ABI 1.1 build (its descriptor
 * that long, no reduce_scatter), so that the host's way around an older backend runs under
 * mpirun. Never installed. */
#define COMM_NAME "v11test"
#define COMM_FLAGS TS_COMM_HOST_BUFFERS
#else
#define COMM_NAME "mpi"
#define COMM_FLAGS TS_COMM_HOST_BUFFERS
#endif

static const ts_comm_desc desc = {
#ifdef COMM_MPI_V11_TEST
    .struct_size = offsetof(ts_comm_desc, reduce_scatter),
    .abi_major = TS_COMM_ABI_MAJOR,
    .abi_minor = 1,
#else
    .struct_size = sizeof(ts_comm_desc),
    .abi_major = TS_COMM_ABI_MAJOR,
    .abi_minor = TS_COMM_ABI_MINOR,
#endif
    .name = COMM_NAME,
    .description = MPI_LIB,
    .flags = COMM_FLAGS,
    .launched = launched,
    .init = mpi_init,
    .rank = mpi_rank,
    .size = mpi_size,
    .allreduce = mpi_allreduce,
    .broadcast = mpi_broadcast,
    .allgather = mpi_allgather,
#ifndef COMM_MPI_V11_TEST
    .reduce_scatter = mpi_reduce_scatter,
    .split = mpi_split,
    .free_sub = mpi_free_sub,
#endif
    .barrier = mpi_barrier,
    .abort = mpi_abort,
    .shutdown = mpi_shutdown,
#ifdef COMM_MPI_DEVICE_TEST
    .device = devtest_device,
#endif
};

TS_COMM_DEFINE(desc)
