/* tessera/comm.h: the communication-plugin ABI. A communication backend (MPI, NCCL) is a
 * shared object exporting one symbol, tessera_comm_entry, that returns a descriptor of plain
 * data and function pointers, as device plugins do (plugin.h); libtessera links no
 * communication library. The host loads it with the same trust rules as device plugins, from
 * the same search path, when [dist] backend names it or when the process runs under a
 * launcher the plugin recognises (mpirun, srun).
 *
 * One process is one rank. Collectives are blocking, called by every rank in the same order
 * with the same sizes; the host serialises its calls (never two at once from two threads),
 * so a plugin needs no thread support beyond being called from one thread at a time, not
 * always the same one. Buffers are host memory for TS_COMM_HOST_BUFFERS plugins (MPI) and
 * device memory of the plugin's device for TS_COMM_DEVICE_BUFFERS ones (NCCL): such a plugin
 * names that device (`device`, a tessera device name such as "cuda"), the host opens it and
 * stages its own host-memory collectives (ts_dist_allreduce_sum and friends) through it.
 * Device-buffer collectives run on the plugin's own stream and return when they are complete;
 * the host synchronises the device before it hands over a buffer that kernels wrote, so the
 * plugin never needs to see the device plugin's stream.
 *
 * Versioning as in plugin.h: the major changes when anything existing changes, the minor when
 * members are appended (struct_size says how many bytes the plugin filled). */
#ifndef TESSERA_COMM_H
#define TESSERA_COMM_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <tessera/status.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TS_COMM_ABI_MAJOR 1
#define TS_COMM_ABI_MINOR 2

/* Reductions. Values are ABI: append only. */
typedef enum ts_comm_reduce {
    TS_COMM_SUM = 0,
    TS_COMM_COUNT
} ts_comm_reduce;

/* Element types of reductions: plugin.h's ts_dtype values (TS_F32 = 0, TS_F64 = 1, TS_I32 = 2,
 * TS_I64 = 3, TS_U8 = 4); a plugin reduces at least float32, float64 and int64. */

/* Descriptor flags. */
#define TS_COMM_HOST_BUFFERS 1u   /* collectives take host memory */
#define TS_COMM_DEVICE_BUFFERS 2u /* collectives take the plugin's device memory */

/* What the host gives a plugin at init. */
typedef struct ts_comm_host {
    uint32_t struct_size;
    uint16_t abi_major, abi_minor; /* the host's TS_COMM_ABI_* */
    /* Records an error message for the calling thread and returns status. */
    ts_status (*fail)(const struct ts_comm_host *h, ts_status status, const char *fmt, ...)
#if defined(__GNUC__)
        __attribute__((format(printf, 3, 4)))
#endif
        ;
    /* Logs a line through the host's log handler; level 0 debug .. 3 error. */
    void (*log)(const struct ts_comm_host *h, int level, const char *fmt, ...)
#if defined(__GNUC__)
        __attribute__((format(printf, 3, 4)))
#endif
        ;
} ts_comm_host;

typedef struct ts_comm_desc {
    uint32_t struct_size; /* sizeof(ts_comm_desc) as the plugin was compiled */
    uint16_t abi_major;   /* TS_COMM_ABI_MAJOR the plugin was built with */
    uint16_t abi_minor;
    const char *name;        /* [a-z0-9_]+, e.g. "mpi" for comm_mpi.so */
    const char *description; /* one line: library and version */
    uint32_t flags;          /* TS_COMM_* */

    /* Whether this process was started by a launcher the plugin serves (mpirun sets
     * OMPI_COMM_WORLD_SIZE, Slurm's srun PMI_SIZE or PMIX_RANK): the host then loads it
     * without being told. Reads the environment only. */
    int (*launched)(void);
    /* Joins the job the launcher started (the world: every rank it started). *ctx: the
     * plugin's state. A rank that cannot join fails with a message; it must not hang. */
    ts_status (*init)(const ts_comm_host *host, void **ctx);
    int (*rank)(void *ctx);
    int (*size)(void *ctx);
    /* buf (count elements of dtype) = the reduction over every rank's buf, in place. */
    ts_status (*allreduce)(void *ctx, void *buf, size_t count, int32_t dtype, int32_t op);
    /* buf (nbytes) from rank root to every other rank. */
    ts_status (*broadcast)(void *ctx, void *buf, size_t nbytes, int root);
    /* recv (size x nbytes) = every rank's send (nbytes), in rank order. */
    ts_status (*allgather)(void *ctx, const void *send, void *recv, size_t nbytes);
    ts_status (*barrier)(void *ctx);
    /* Ends every rank of the job at once, reason printed by the calling rank. Does not
     * return. */
    void (*abort)(void *ctx, int code, const char *reason);
    /* Leaves the job (every rank calls it); frees ctx. */
    void (*shutdown)(void *ctx);

    /* ---- 1.1 ---- */
    /* TS_COMM_DEVICE_BUFFERS plugins (required there, NULL otherwise): the tessera device
     * whose memory the collectives take, as ts_device_get names it ("cuda"). A rank's plugin
     * and that device must drive the same GPU: both pick it from the launcher's local rank
     * (the cuda plugin's device_index = -1, its default). Valid after init. */
    const char *(*device)(void *ctx);

    /* ---- 1.2 ---- */
    /* recv (count elements of dtype) = the reduction over every rank of this rank's chunk of
     * send: send holds size x count elements, rank r's chunk at [r count, (r + 1) count);
     * send and recv do not overlap. Optional (NULL, or a 1.0/1.1 plugin): the host runs an
     * all-reduce of a copy of send and keeps this rank's chunk (the same sums, twice the
     * bytes on the wire). */
    ts_status (*reduce_scatter)(void *ctx, const void *send, void *recv, size_t count,
                                int32_t dtype, int32_t op);
    /* Sub-communicators (every rank calls it, as a collective): the ranks that give the same
     * color >= 0 form one, ordered by key then rank; *sub is its ctx, which rank, size,
     * allreduce, broadcast, allgather, reduce_scatter and barrier take (rank and size within
     * it). color < 0: this rank joins none (*sub NULL). free_sub frees one; it is collective
     * over the sub-communicator's ranks, and the host calls it before shutdown. Optional
     * (both NULL): the host then keeps its all-reduce flat. The host uses them for its
     * hierarchical all-reduce (within each machine, then across machines). */
    ts_status (*split)(void *ctx, int color, int key, void **sub);
    void (*free_sub)(void *sub);
} ts_comm_desc;

/* Whether a launcher started this process as one rank of a job: mpirun sets
 * OMPI_COMM_WORLD_SIZE, MPICH's hydra PMI_SIZE or MPI_LOCALNRANKS, PMIx PMIX_RANK, Slurm's
 * srun SLURM_PROCID. The usual body of a plugin's `launched`. */
static inline int ts_comm_launcher_present(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK",
                                       "MPI_LOCALNRANKS", "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i]))
            return 1;
    return 0;
}

#define TS_COMM_ENTRY_SYMBOL "tessera_comm_entry"

typedef const ts_comm_desc *(*ts_comm_entry_fn)(uint32_t host_abi_major,
                                                uint32_t host_abi_minor);

#if defined(__GNUC__)
#define TS_COMM_EXPORT __attribute__((visibility("default")))
#else
#define TS_COMM_EXPORT
#endif

/* Defines the entry symbol returning &desc. */
#define TS_COMM_DEFINE(desc)                                                                \
    TS_COMM_EXPORT const ts_comm_desc *tessera_comm_entry(uint32_t host_abi_major,          \
                                                          uint32_t host_abi_minor);         \
    TS_COMM_EXPORT const ts_comm_desc *tessera_comm_entry(uint32_t host_abi_major,          \
                                                          uint32_t host_abi_minor)          \
    {                                                                                       \
        (void)host_abi_major;                                                               \
        (void)host_abi_minor;                                                               \
        return &(desc);                                                                     \
    }

#ifdef __cplusplus
}
#endif
#endif /* TESSERA_COMM_H */
