/* tessera/dist.h: data-parallel training over a communication plugin (tessera/comm.h: MPI
 * for CPUs). One process per rank, started by the launcher (`mpirun -np N prog`); a single
 * process needs none of it and pays nothing: with no launcher and no [dist] backend, the world
 * is one rank and every call below returns at once.
 *
 *     ts_dist_init(cfg);                        // joins the job (or a world of one)
 *     ts_dist_broadcast_module(model, 0);       // every rank starts from rank 0's weights
 *     ts_ddp *ddp; ts_ddp_new(params, n, 0, &ddp);
 *     for each step: forward on this rank's slice of the global batch, ts_backward,
 *                    ts_ddp_sync(ddp) (gradients now averaged over ranks), ts_optim_step
 *     ts_ddp_free(ddp); ts_dist_shutdown();
 */
#ifndef TESSERA_DIST_H
#define TESSERA_DIST_H

#include <stddef.h>
#include <stdint.h>
#include <tessera/config.h>
#include <tessera/nn.h>
#include <tessera/optim.h>
#include <tessera/status.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Joins the job: the backend named by [dist] backend (a comm_NAME.so on the plugin search
 * path: "mpi"; "none" for a single process), or, when unset or "auto", the first
 * communication plugin whose launcher started this process (mpirun, srun). Without either, a
 * world of one rank. Idempotent. cfg may be NULL (the runtime's configuration). */
ts_status ts_dist_init(const ts_config *cfg);
/* This rank (0 .. size-1) and the number of ranks; 0 and 1 before ts_dist_init. */
int ts_dist_rank(void);
int ts_dist_size(void);
/* The backend's name ("mpi"), or "none" for a world of one. (transfer none) */
const char *ts_dist_backend(void);
/* The device a device-buffer backend (NCCL) communicates from, opened by ts_dist_init: train
 * on it, and ts_ddp sums the gradients in place in device memory. NULL for host-buffer
 * backends (MPI) and a world of one. (transfer none) */
ts_device *ts_dist_device(void);
/* Every rank's buf (count elements of dtype, host memory) replaced by their sum. */
ts_status ts_dist_allreduce_sum(void *buf, size_t count, int32_t dtype);
/* root's buf (nbytes of host memory) to every rank. */
ts_status ts_dist_broadcast(void *buf, size_t nbytes, int root);
/* recv (size x nbytes) = every rank's send, in rank order. */
ts_status ts_dist_allgather(const void *send, void *recv, size_t nbytes);
/* recv (count elements of dtype, host memory) = the sum over ranks of this rank's chunk of
 * send (size x count elements; rank r's chunk at [r count, (r + 1) count)): the first half of
 * an all-reduce, each rank left with its shard (ZeRO's gradient step). send and recv must not
 * overlap. The backend's reduce-scatter (MPI_Reduce_scatter_block, ncclReduceScatter), or an
 * all-reduce of a copy where the backend has none. */
ts_status ts_dist_reduce_scatter_sum(const void *send, void *recv, size_t count,
                                     int32_t dtype);
ts_status ts_dist_barrier(void);
/* Whether the all-reduce is hierarchical, and over how many machines of how many ranks:
 * [dist] hierarchical = auto (the default: when the job spans several machines of several
 * ranks each and has 8 ranks or more), on (several machines of several ranks), off; the
 * machines from the host names, or [dist] ranks_per_node consecutive ranks each. Each sum
 * is then a reduce-scatter within every machine, an all-reduce of each shard across the
 * machines (one rank per machine and shard), and an all-gather within every machine: the
 * same bytes leave each machine as in a flat ring over the machines alone. Needs a
 * host-buffer backend with sub-communicators (MPI; NCCL builds its own hierarchy). */
int ts_dist_hierarchy(int *nodes, int *ranks_per_node);
/* Ends every rank of the job now, this rank's reason printed; exits with code in a world of
 * one. Does not return. */
void ts_dist_abort(int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3), noreturn))
#endif
    ;
/* Leaves the job (every rank calls it, after its last collective). */
void ts_dist_shutdown(void);
/* Calls fn for every communication plugin (comm_NAME.so) on the plugin search path, first one
 * of each name: its backend name and file, and either its description (it loads and speaks
 * this tessera's ABI) or why it cannot be used. Loads each to look, joins nothing. */
void ts_dist_scan(const ts_config *cfg,
                  void (*fn)(const char *name, const char *path, const char *description,
                             const char *error, void *user),
                  void *user);

/* Every parameter and buffer of m from rank root to the other ranks, so that all start alike
 * whatever seed each used. TS_ESHAPE, on every rank, when a rank's model has other names,
 * shapes or dtypes than root's (a rank started with another model). */
ts_status ts_dist_broadcast_module(ts_module *m, int root);

/* Gradient averaging for data parallelism, as PyTorch's DistributedDataParallel does it: the
 * parameters are grouped in buckets of about bucket_bytes (0: 25 MiB), the last parameters
 * first (their gradients are ready first); as backward finishes each bucket's gradients
 * (ts_tensor_register_post_accumulate_hook), the bucket's sum over ranks starts on a
 * communication thread while backward goes on. ts_ddp_sync waits for the rest and leaves
 * every parameter's .grad the average over ranks. The parameters must be the same on every
 * rank, in the same order. Every gradient becomes a view of its slot in a bucket tensor
 * (summed in place, nothing copied back) when the parameters live on a host-memory device
 * under a host-buffer backend (MPI), or on ts_dist_device() under a device-buffer backend
 * (NCCL); elsewhere gradients are copied through host buffers. */
typedef struct ts_ddp ts_ddp;
ts_status ts_ddp_new(const ts_named_tensor *params, size_t n, size_t bucket_bytes,
                     ts_ddp **out);
/* After ts_backward (every rank calls it once per step): gradients averaged. A parameter
 * without a gradient on this rank counts as zeros. */
ts_status ts_ddp_sync(ts_ddp *d);
/* Gradient accumulation (PyTorch's no_sync): with on, the backwards that follow leave their
 * gradients in .grad without starting any sum; turn it off before the last micro-batch's
 * backward, whose buckets then carry the accumulated gradients. */
void ts_ddp_no_sync(ts_ddp *d, int on);
typedef struct ts_ddp_stats {
    uint64_t steps;            /* ts_ddp_sync calls */
    uint64_t buckets;          /* bucket reductions, in all */
    uint64_t started_early;    /* ... started before ts_ddp_sync was called */
    uint64_t finished_early;   /* ... finished before ts_ddp_sync was called */
    size_t nbuckets;           /* buckets per step */
    double reduce_seconds;     /* time in the sums, on the communication thread */
    int in_place;              /* gradients are views of their buckets: no copies */
    int on_device;             /* ... in the device-buffer backend's device memory */
} ts_ddp_stats;
void ts_ddp_get_stats(const ts_ddp *d, ts_ddp_stats *st);
void ts_ddp_free(ts_ddp *d);

/* Sharded optimizer state (ZeRO stage 1, as PyTorch's ZeroRedundancyOptimizer): opt's state
 * (AdamW's two moments, SGD's momentum) is cut into one share per rank, each rank keeping and
 * updating 1/N of it. The parameters are those of d, on one device whose memory the backend
 * takes (a host-memory device such as cpu_blas under mpi, the backend's own device under
 * nccl); every rank calls it alike, after ts_ddp_new and before the first backward (if some
 * ranks do and others not, every rank's first ts_ddp_sync fails with TS_ESTATE rather than
 * hang: the ranks compare before their first sum; after a sum TS_ESTATE; a step after a
 * failed sync is refused). From then on each step is
 *     ts_backward(loss); ts_ddp_sync(d); ts_optim_step(opt); ts_optim_zero_grad(opt);
 * where ts_ddp_sync reduce-scatters each bucket (this rank receives the averaged gradients of
 * its share only; the parameters' .grad keep this rank's own), ts_optim_step updates this
 * rank's share of every parameter and all-gathers the parameters: the same bytes on the wire
 * as the all-reduce, the same arithmetic as the unsharded optimizer. Clip with
 * ts_optim_clip_grad_norm, which sums the norm over the ranks. To save: every rank calls
 * ts_optim_consolidate_state(opt, root), then root calls ts_optim_save_state; the file is the
 * one an unsharded optimizer writes, and ts_optim_load_state (on every rank) loads either
 * kind, keeping this rank's share. With one rank it does nothing. TS_EINVAL unless opt and d
 * hold the same parameters, or for devices it cannot shard on; TS_EPLUGIN for a
 * device-buffer backend without reduce-scatter. The state already taken (a resumed
 * optimizer) is cut into shares. The sharding lasts as long as opt: once d is freed (also by
 * ts_trainer_free, for a trainer's) the next step fails, so free opt with it. */
ts_status ts_optim_shard(ts_optim *opt, ts_ddp *d);
/* Whether opt's state is sharded over the ranks. */
int ts_optim_sharded(const ts_optim *opt);

#ifdef __cplusplus
}
#endif
#endif /* TESSERA_DIST_H */
