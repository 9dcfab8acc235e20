/* core/internal.h: what core files share. Never installed. Names are ts__ (double underscore)
 * and hidden from the library's exported symbols by -fvisibility=hidden. */
#ifndef TESSERA_CORE_INTERNAL_H
#define TESSERA_CORE_INTERNAL_H

#include "config.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include <tessera/fault.h>
#include <tessera/tessera.h>

#include "pool.h"

#define TS_API __attribute__((visibility("default")))

/* Broken internal invariant: abort with file:line in every build. Never for user input. */
#define TS_ASSERT(cond)                                                                     \
    do {                                                                                    \
        if (!(cond))                                                                        \
            ts__assert_fail(#cond, __FILE__, __LINE__);                                     \
    } while (0)
_Noreturn void ts__assert_fail(const char *cond, const char *file, int line);

/* ---- profile.c ------------------------------------------------------------------------- */

/* 0 when the profile is off; else pass it to ts__profile_end* after the call, which return
 * the end stamp (0 when not timed). */
uint64_t ts__profile_begin(void);
uint64_t ts__profile_end(uint64_t t0, int32_t op, int32_t fn, int32_t dtype);
/* Where a kernel call ran: the plugin, the reference kernels for an op the plugin does not
 * run (unclaimed, or a function newer than its ABI), or for a call it declined. */
enum { TS__RAN_PLUGIN, TS__RAN_REFERENCE, TS__RAN_DECLINED };
uint64_t ts__profile_end_call(uint64_t t0, const ts_kernel_call *call, int where);
/* Atomic, link-safe saves (core/fileio.c; see checkpoint.h): body writes the file's bytes
 * to fd with ts__save_write and returns TS_OK, TS__SAVE_IO for a failed write (errno set:
 * the saver words the message) or another ts_status with its message set; the temporary
 * file becomes path only when it returned TS_OK. what names the file in messages ("the
 * checkpoint"). */
#define TS__SAVE_IO 1 /* no ts_status: those are 0 and negative */
typedef struct ts__saver ts__saver;
typedef int (*ts__save_body)(ts__saver *sv, int fd, void *user);
ts_status ts__save_atomic(const char *path, const char *what, ts__save_body body, void *user);
int ts__save_write(ts__saver *sv, int fd, const void *buf, size_t n);
/* The path a save writes (with its directory resolved), for a body's messages. */
const char *ts__save_path(const ts__saver *sv);
/* A file written as a stream over a long time (a memory trace): the same rule as a save
 * (refuses links, special files and another user's file; the file is new and the caller's,
 * created exclusively next to path), but renamed into place at once, so readers see it grow.
 * new_only: path must not exist (a name from the environment, which a root shell may have
 * kept from another user, must not replace root's files): created there exclusively.
 * (transfer full) on *fd_out: close() it. TS_EIO with the reason. */
ts_status ts__create_output(const char *path, const char *what, int new_only, int *fd_out);
/* The name of the kernel call: its function ("mul", "sum") or its op ("matmul"). */
const char *ts__call_name(const ts_kernel_call *call);

/* ---- status.c -------------------------------------------------------------------------- */

/* Records a printf-formatted message as this thread's last error and returns code. */
/* The dtypes with gradients and float arithmetic: float32, float64, bfloat16, float16. */
static inline int ts__dtype_is_float(int32_t dtype)
{
    return ts_plugin_dtype_is_float(dtype) || ts_plugin_dtype_is_half(dtype);
}

ts_status ts__fail(ts_status code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
ts_status ts__vfail(ts_status code, const char *fmt, va_list ap);
/* Prepends "prefix" to the current last error (adding context at an outer level), returns code. */
ts_status ts__fail_prefix(ts_status code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- log.c ----------------------------------------------------------------------------- */
void ts__log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ts__vlog(int level, const char *fmt, va_list ap);
/* "warn" -> TS_LOG_WARN; -1 if not a level name. */
int ts__log_level_parse(const char *name);

/* ---- config.c -------------------------------------------------------------------------- */

/* Resolves the settings of [plugin.NAME] against the plugin's declared keys plus the common
 * ones, validating unknown keys and values with file:line messages (TS_ECONFIG).
 * (transfer full) on *out: ts__settings_free. */
ts_status ts__config_plugin_settings(const ts_config *cfg, const char *name,
                                     const ts_config_key *keys, ts_setting **out, size_t *n);
void ts__settings_free(ts_setting *s, size_t n);
/* Logs each [plugin.NAME] section of cfg (with keys or not) whose NAME is no plugin on the
 * search path: a warning naming the plugins found and the closest ("did you mean" when NAME is
 * within two edits of one); info only for a plugin tessera ships that this build lacks. */
void ts__config_check_plugin_sections(const ts_config *cfg);
/* 1 and the closest plugin name found on cfg's search path in out when name is a likely
 * misspelling of one (within two edits); 0 otherwise. */
int ts__config_plugin_guess(const ts_config *cfg, const char *name, char *out, size_t len);
/* The smallest pool limit memory_fraction may give (1 MiB). */
#define TS_MIN_RESERVE_BYTES ((uint64_t)1 << 20)
/* TS_ECONFIG, naming the file and line, when the memory_fraction in settings s gives a pool
 * limit under TS_MIN_RESERVE_BYTES of a device of total_bytes; TS_OK otherwise (and when
 * total_bytes is 0, unknown). The message gives the limit and the smallest fraction accepted. */
ts_status ts__config_check_reserve(const ts_config *cfg, const char *name, const ts_setting *s,
                                   size_t n, uint64_t total_bytes);
/* The directory of the config file, or NULL for defaults/in-memory text. (transfer none) */
/* The directory of the file that set section.key (relative paths in it resolve there), or
 * NULL when no file set it or the text had no directory. */
const char *ts__config_dir_of(const ts_config *cfg, const char *section, const char *key);

/* ---- hostmem.c ------------------------------------------------------------------------- */
ts_status ts__host_memory(uint64_t *total, uint64_t *available);

/* ---- hostref.c ------------------------------------------------------------------------- */
/* Non-zero if the reference host kernels implement op for dtype. */
int ts__hostref_supports(int32_t op, int32_t dtype);
/* Runs a kernel on host operands with the reference kernels; scratch and errors through
 * host (a device's table: scratch from its pool). */
ts_status ts__hostref_run(const ts_host *host, const ts_kernel_call *call);
/* ---- loader.c: runs a kernel on dev, on the reference kernels when dev has host memory and
 * does not implement the op itself (else exactly ts_device_run). */
ts_status ts__device_run(ts_device *dev, const ts_kernel_call *call);
/* Whether ts__device_run runs op for dtype on dev: the plugin claims it, or the core's
 * reference kernels stand in (host-memory plugins). */
int ts__device_runs(ts_device *dev, int32_t op, int32_t dtype);
/* Whether dev's memory is host memory (TS_PLUGIN_HOST_MEMORY): its pointers can be read and
 * written by the host directly. */
int ts__device_is_host_memory(const ts_device *dev);
/* dlopens the plugin file at path (found for name) under the trust rules of device plugins:
 * the file and every directory above it owned by root or the user and not writable by
 * others, opened once and loaded through its descriptor. */
ts_status ts__plugin_dlopen(const ts_config *cfg, const char *name, const char *path,
                           void **handle);
/* Whether TS_OP_UNARY function fn runs on dev for dtype: claimed by a plugin that knows fn
 * (built for the minor ABI that added it), or on the reference kernels (host memory). */
int ts__device_runs_unary(ts_device *dev, int32_t fn, int32_t dtype);

/* ---- tensor.c ---------------------------------------------------------------------------- */

/* A refcounted block of one device's memory. Every tensor over it holds one reference. */
typedef struct ts_storage {
    _Atomic long refcount;
    ts_device *dev;
    void *data;    /* device pointer from the device's pool */
    size_t nbytes;
    _Atomic int role; /* ts_memory_role, counted in dev->role_bytes */
    _Atomic uint64_t version; /* bumped by every in-place write through any view */
} ts_storage;

typedef struct ts_node ts_node;

struct ts_tensor {
    _Atomic long refcount;
    ts_storage *storage; /* one reference, owned */
    int32_t dtype;       /* ts_dtype */
    int32_t ndim;
    int64_t shape[TS_MAX_DIMS];
    int64_t strides[TS_MAX_DIMS]; /* elements */
    int64_t offset;               /* elements from storage->data */
    /* autograd (autograd.c) */
    int32_t requires_grad;
    ts_tensor *grad;     /* owned, or NULL */
    ts_node *grad_fn;    /* owned reference, NULL for leaves */
    ts_grad_hook hook;   /* leaves: called before accumulation */
    void *hook_user;
    ts_grad_ready_hook ready; /* leaves: called when backward's last gradient arrived */
    void *ready_user;
    uint64_t pend_epoch;      /* the backward pending counts */
    int64_t pending;          /* gradients still to arrive in that backward */
};

/* t's first element in its storage (host-memory devices: a pointer to read and write). */
static inline void *ts__data(const ts_tensor *t)
{
    return (char *)t->storage->data + t->offset * (int64_t)ts_dtype_size(t->dtype);
}


/* A new tensor struct over storage (takes a new reference on it), with the given layout.
 * (transfer full) */
ts_status ts__tensor_wrap(ts_storage *st, int32_t dtype, int ndim, const int64_t *shape,
                          const int64_t *strides, int64_t offset, ts_tensor **out);
/* t takes src's storage, dtype and layout (same shape), keeping its identity and autograd
 * flags; its gradient is dropped. For leaves only (module parameters changing dtype). */
void ts__tensor_adopt(ts_tensor *t, ts_tensor *src);
/* A view of t with another layout: same storage, dtype. (transfer full) */
ts_status ts__view(const ts_tensor *t, int ndim, const int64_t *shape, const int64_t *strides,
                   int64_t offset, ts_tensor **out);
/* TS_EINVAL naming what unless every size is >= 0 and the product of the non-zero sizes is
 * at most 2^59 (so strides and byte counts cannot overflow); *numel gets the element count. */
ts_status ts__shape_bound(const char *what, int ndim, const int64_t *shape, int64_t *numel);
/* Row-major strides for shape. */
void ts__contiguous_strides(int ndim, const int64_t *shape, int64_t *strides);
/* Normalises a possibly negative dim against ndim; -1 if out of range. */
int ts__dim(int dim, int ndim);
/* "(2, 3)" into buf. */
const char *ts__shape_str(int ndim, const int64_t *shape, char *buf, size_t len);
/* The device for a creation call: dev, or the runtime's default (TS_ESTATE if none). */
ts_status ts__pick_device(ts_device *dev, ts_device **out);
/* Marks an in-place write to t's storage. */
void ts__bump_version(ts_tensor *t);
/* Fills an operand descriptor from t. */
void ts__operand(const ts_tensor *t, ts_operand *op);
/* Runs one kernel (checks the plugin supports it; messages name the op). */
ts_status ts__run(ts_device *dev, int32_t op, const ts_operand *in, int nin,
                  const ts_operand *out, int nout, const void *params, size_t params_size);
/* Converts a double to one element of dtype in buf (8 bytes suffice). */
void ts__scalar_bytes(int32_t dtype, double v, void *buf);
/* Fills a contiguous byte range of a device with a dtype pattern (loader.c). */
ts_status ts__device_fill(ts_device *dev, void *dst, size_t nbytes, const void *pattern,
                          size_t pattern_size);

/* ---- ops.c -------------------------------------------------------------------------------- */

/* Same device (TS_EDEVICE) and, if same_dtype, same dtype (TS_EDTYPE); messages name both. */
ts_status ts__check_pair(const char *op, const ts_tensor *a, const ts_tensor *b, int same_dtype);
/* NumPy broadcast shape of n tensors; TS_ESHAPE naming the shapes. */
ts_status ts__broadcast(const char *op, int n, const ts_tensor *const *ts, int *nd,
                        int64_t *shape);
/* t's operand broadcast to (nd, shape): new leading dims and expanded dims get stride 0. */
void ts__operand_bcast(const ts_tensor *t, int nd, const int64_t *shape, ts_operand *op);
/* If in shares storage with out (and, for elementwise ops, is not exactly out), *safe gets a
 * copy of in to read instead; else NULL. (transfer full) on *safe. */
ts_status ts__guard_input(const ts_tensor *in, const ts_tensor *out, int elementwise,
                          ts_tensor **safe);
/* A new contiguous output tensor. (transfer full) */
ts_status ts__new(ts_device *dev, int32_t dtype, int nd, const int64_t *shape, ts_tensor **out);

/* ---- autograd.c --------------------------------------------------------------------------- */

#define TS_NODE_MAX_IN 4
#define TS_NODE_MAX_SAVED 6

/* Computes the gradients of a node's inputs from the gradient of its output. gin[i] must be
 * set (transfer full) for every input with n->needs[i]; others may stay NULL. Runs with
 * grad mode off. */
typedef ts_status (*ts_backward_fn)(ts_node *n, ts_tensor *gout, ts_tensor **gin);

struct ts_node {
    _Atomic long refcount;
    const char *name;            /* the op, for messages */
    ts_backward_fn backward;
    int32_t nin;
    int32_t needs[TS_NODE_MAX_IN];       /* input i needs a gradient */
    ts_node *next[TS_NODE_MAX_IN];       /* owned: grad_fn of a non-leaf input */
    ts_tensor *leaf[TS_NODE_MAX_IN];     /* owned: a leaf input that accumulates */
    int32_t in_ndim[TS_NODE_MAX_IN];     /* input shapes and dtypes (broadcast reduction) */
    int64_t in_shape[TS_NODE_MAX_IN][TS_MAX_DIMS];
    int32_t in_dtype[TS_NODE_MAX_IN];
    ts_device *in_device[TS_NODE_MAX_IN];
    int32_t nsaved;
    ts_tensor *saved[TS_NODE_MAX_SAVED]; /* owned detached aliases */
    uint64_t saved_version[TS_NODE_MAX_SAVED];
    union {                              /* op parameters */
        int64_t i[8];
        double d[4];
        ts_conv2d_params conv;
        ts_pool2d_params pool;
        struct {
            ts_segment_fn fn;
            void *user;
            ts_rng *rng;     /* replayed from offset in the recomputation (NULL: none) */
            uint64_t offset;
            int32_t autocast; /* the forward's ts_autocast_dtype, again in the recompute */
        } seg;
    } p;
    int32_t released;                    /* backward ran without retain_graph */
    ts_grad_hook hook;                   /* non-leaf output's hook */
    void *hook_user;
    /* backward traversal */
    uint64_t epoch;
    int64_t deps;
    ts_tensor *gacc;
};

/* Drops a reference on a node; the last one releases it and every upstream node that dies
 * with it (iteratively). NULL: no-op. */
void ts__node_unref(ts_node *n);
/* Non-zero if grad mode is on and one of the n inputs requires grad. */
int ts__grad_needed(int n, const ts_tensor *const *in);
/* Records a node for out = name(in...): edges to the inputs, detached aliases of the nsave
 * tensors in save (with their versions), params copied into node->p. Sets out's grad_fn and
 * requires_grad. No-op (TS_OK, *node NULL) when no gradient is needed or out is not float.
 * node may be NULL. */
ts_status ts__record(const char *name, ts_backward_fn bw, ts_tensor *out, int nin,
                     const ts_tensor *const *in, int nsave, const ts_tensor *const *save,
                     const void *params, size_t params_size, ts_node **node);
/* TS_ESTATE if writing into t in place would corrupt a gradient: t requires grad while grad
 * mode is on. */
ts_status ts__check_inplace(const char *op, const ts_tensor *t);
/* Sums g over the dims broadcast to reach it from (ndim, shape) and views it as that shape.
 * (transfer full) */
ts_status ts__sum_to(const ts_tensor *g, int ndim, const int64_t *shape, ts_tensor **out);
/* Grad mode push/pop for backward (off) and checkpoint recompute (on). */
void ts__grad_push(int enabled);
void ts__grad_pop(void);

/* ---- fault.c ----------------------------------------------------------------------------- */
/* Non-zero if the armed fault (tessera/fault.h) falls on this call at site (a ts_fault_site);
 * the caller then fails as it would for real. */
int ts__fault_hit(unsigned site);
/* malloc, calloc, realloc that TS_FAULT_HOST can fail: every core file allocates with these
 * (pool.c's bookkeeping excepted: its public alloc entry has the TS_FAULT_POOL hook). */
void *ts__malloc(size_t n);
void *ts__calloc(size_t n, size_t size);
void *ts__realloc(void *p, size_t n);
/* Test-only: NULL in every real run. When set, loader.c's open_plugin calls it with the
 * resolved path between the trust check and the open, so a test linked against libtscore
 * (tests/unit/test-plugin-trust.c) can swap another file in there and see the swap refused.
 * Not exported from libtessera. */
extern void (*ts__loader_after_check_hook)(const char *real);

/* ---- config.c ---------------------------------------------------------------------------- */
/* A configuration boolean (true/yes/on/1, false/no/off/0, any case) into *out: 1, or 0 when
 * text is none of those. */
int ts__config_bool(const char *t, int32_t *out);

/* ---- fileio.c ---------------------------------------------------------------------------- */
/* Opens a user-named input file for reading (O_CLOEXEC). Refuses, with a message naming what
 * ("configuration file", "checkpoint", ...) and the path, anything that is not a regular file:
 * a directory, FIFO, device or socket is never opened for reading and never blocks. st_out
 * (may be NULL) gets the descriptor's fstat. TS_EIO (TS_ENOMEM) on failure. */
struct stat;
ts_status ts__open_input(const char *path, const char *what, int *fd_out, struct stat *st_out);
/* The same as a stdio stream ("rb"). (transfer full) on *out: fclose(). */
ts_status ts__fopen_input(const char *path, const char *what, FILE **out, struct stat *st_out);
/* "a directory", "a FIFO (named pipe)", ... for a stat mode. */
const char *ts__file_kind(mode_t mode);
/* Who may own a file that decides what code runs (a plugin, a configuration file) or a
 * directory above it: root or the effective user. */
int ts__trusted_owner(uid_t uid);
/* The trust rule, in the manner of OpenSSH's StrictModes, on a resolved path real (no
 * symbolic link left in it): a regular file owned by a trusted owner and writable by neither
 * group nor others; every directory from its own up to '/' likewise, unless it is sticky (as
 * /tmp is: no one else can rename or remove an entry of ours there). *st gets the file's
 * lstat. Returns 0 when trusted, 1 when not, -1 when it cannot tell (errno set); why gets
 * the reason in both failing cases ("the file '/x' is writable by its group"). */
int ts__trust_check(const char *real, struct stat *st, char *why, size_t len);
/* The directory part of the rule: every directory from real's own up to '/'. */
int ts__trust_dirs(const char *real, char *why, size_t len);
/* The directory path made absolute with every symbolic link resolved, like realpath, but
 * following only links owned by root or the effective user (one another user planted in a
 * directory they can write would steer the path anywhere). Every component must exist and
 * be a directory (ENOTDIR otherwise). Returns 0 with
 * *real (transfer full), 1 when an untrusted link is met, -1 on another failure (errno);
 * why gets the reason. */
int ts__resolve_trusted(const char *path, char **real, char *why, size_t len);

/* ---- util ------------------------------------------------------------------------------ */
/* getenv, but NULL in setuid/setgid programs (secure_getenv) where the platform has it. */
const char *ts__getenv(const char *name);
char *ts__strdup(const char *s);
char *ts__asprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The communication plugin's all-reduce (sum) of buf as it lies, under the world's lock
 * (core/dist.c, for core/ddp.c). */
ts_status ts__dist_allreduce_in_place(void *buf, size_t count, int32_t dtype);
/* The sharded optimizer's collectives on the memory its buffers live in: the backend's
 * device memory under a device-buffer backend (NCCL), host memory otherwise (where they are
 * ts_dist_reduce_scatter_sum and ts_dist_allgather). device_reduce_scatter: whether a
 * device-buffer backend has a reduce-scatter (1 under a host-buffer one). */
ts_status ts__dist_reduce_scatter_mem(const void *send, void *recv, size_t count,
                                      int32_t dtype);
ts_status ts__dist_allgather_mem(const void *send, void *recv, size_t nbytes);
int ts__dist_device_reduce_scatter(void);
/* [dist] shard_optimizer, as every rank agreed on it at ts_dist_init. */
int ts__dist_shard_optimizer(void);

/* ts_ddp for the sharded optimizer (core/ddp.c, core/zero.c). ddp_shard: from now on each
 * bucket is reduce-scattered into this rank's shard of it (a tensor of padded / ranks
 * elements: the averaged gradients of bucket elements [rank, rank + 1) x that), which opt
 * steps; the parameters' .grad keep this rank's own gradients. One optimizer per ts_ddp; the
 * parameters on one device whose memory the backend takes (host memory under MPI, the
 * backend's device under NCCL). ddp_unshard: back to
 * all-reducing (the optimizer is going). When the ts_ddp goes first it calls
 * ts__optim_ddp_gone(opt). locate: bucket and offset (elements) of parameter t, 0 if t is
 * not one of the ts_ddp's. */
struct ts_optim;
ts_status ts__ddp_shard(ts_ddp *d, struct ts_optim *opt);
void ts__ddp_unshard(ts_ddp *d);
size_t ts__ddp_buckets(const ts_ddp *d);
void ts__ddp_bucket(const ts_ddp *d, size_t k, size_t *padded, int32_t *dtype,
                    ts_tensor **shard);
int ts__ddp_locate(const ts_ddp *d, const ts_tensor *t, size_t *bucket, size_t *off);
size_t ts__ddp_nparams(const ts_ddp *d);
/* ts_ddp_sync calls that succeeded so far; whether the last one failed; whether a backward
 * queued bucket sums no sync has collected. */
uint64_t ts__ddp_syncs(const ts_ddp *d);
int ts__ddp_last_sync_failed(const ts_ddp *d);
int ts__ddp_pending(ts_ddp *d);
const ts_tensor *ts__ddp_param(const ts_ddp *d, size_t i);
void ts__optim_ddp_gone(struct ts_optim *opt);
/* The tensors ts_optim_step reads .grad of: how many (nstep) and the i-th. *sharded: they
 * are this rank's pieces of a sharded optimizer's parameters, so a sum over them is to be
 * summed over the ranks as well. */
size_t ts__optim_nstep(const struct ts_optim *o, int *sharded);
ts_tensor *ts__optim_step_tensor(const struct ts_optim *o, size_t i);

#endif /* TESSERA_CORE_INTERNAL_H */
