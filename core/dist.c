/* core/dist.c: the world of ranks over a communication plugin (tessera/comm.h) and its
 * collectives (tessera/dist.h); gradient averaging for data parallelism (ts_ddp) is
 * core/ddp.c. libtessera links no communication
 * library: the plugin (comm_mpi.so) is dlopen'ed under the device plugins' trust rules, and
 * only when asked for ([dist] backend) or when a launcher's environment says this process is
 * one rank of several, so a single process never loads MPI.
 *
 * Every collective holds the world's lock, so the communication thread of ts_ddp and the
 * caller's thread never call the plugin at once (the plugin needs MPI_THREAD_SERIALIZED,
 * not MULTIPLE). */
#include <dirent.h>
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <tessera/comm.h>
#include <tessera/dist.h>

#include "internal.h"

typedef struct world {
    void *handle;
    char *path;
    ts_comm_desc vt;
    ts_comm_host host;
    void *ctx;
    int rank, size;
    ts_device *dev; /* TS_COMM_DEVICE_BUFFERS: the device the collectives take memory of */
    char name[72];
    /* the hierarchical all-reduce (host-buffer backends with split): this rank's machine
     * (local) and its peers of the same local rank on the other machines (rail) */
    void *local, *rail;
    int nodes, per_node;
    void *scratch; /* a shard of a buffer being summed; grows, never shrinks */
    size_t scratch_bytes;
    int shard; /* [dist] shard_optimizer */
} world;

static world W = {.size = 1, .name = "none"};
static int joined;
static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t comm_lock = PTHREAD_MUTEX_INITIALIZER;

static ts_status setup_hierarchy(const ts_config *cfg);
static void free_hierarchy(void);
static ts_status staged(int op, const void *in, size_t nin, void *out, size_t nout,
                        size_t count, int32_t dtype, int root);

static ts_status chost_fail(const ts_comm_host *h, ts_status code, const char *fmt, ...)
{
    (void)h;
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ts__fail(code, "comm plugin '%s', rank %d: %s", W.name, W.rank, msg);
}

static void chost_log(const ts_comm_host *h, int level, const char *fmt, ...)
{
    (void)h;
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* comm.h: 0 debug .. 3 error; the core's levels run the other way */
    ts__log(level >= 3 ? TS_LOG_ERROR : level == 2 ? TS_LOG_WARN : level == 1 ? TS_LOG_INFO
                                                                               : TS_LOG_DEBUG,
            "comm plugin '%s': %s", W.name, msg);
}

/* Loads comm_<backend>.so and checks its descriptor. */
static ts_status load(const ts_config *cfg, const char *backend, world *w)
{
    char file[80];
    if (strlen(backend) > 64 || strspn(backend, "abcdefghijklmnopqrstuvwxyz0123456789_") !=
                                    strlen(backend) || !backend[0])
        return ts__fail(TS_ECONFIG, "[dist] backend = '%s': not a backend name (lower-case "
                        "letters, digits, '_': 'mpi', or 'none' for a single process)", backend);
    snprintf(file, sizeof file, "comm_%s", backend);
    char *path = NULL;
    ts_status s = ts_plugin_find(cfg, file, &path);
    if (s) {
        char why[768]; /* ts__fail writes the buffer ts_last_error reads */
        snprintf(why, sizeof why, "%s", ts_last_error());
        return ts__fail(s, "communication backend '%s': %s%s", backend, why,
                        !strcmp(backend, "mpi") ? " (tessera builds comm_mpi when Open MPI is "
                        "installed: Debian package libopenmpi-dev)" : "");
    }
    void *h = NULL;
    if ((s = ts__plugin_dlopen(cfg, file, path, &h))) {
        free(path);
        return s;
    }
    ts_comm_entry_fn entry;
    *(void **)&entry = dlsym(h, TS_COMM_ENTRY_SYMBOL);
    const ts_comm_desc *d = entry ? entry(TS_COMM_ABI_MAJOR, TS_COMM_ABI_MINOR) : NULL;
    size_t min = offsetof(ts_comm_desc, shutdown) + sizeof d->shutdown;
    if (!entry)
        s = ts__fail(TS_EPLUGIN, "%s is not a communication plugin: it does not export '%s'",
                     path, TS_COMM_ENTRY_SYMBOL);
    else if (!d)
        s = ts__fail(TS_EPLUGIN, "%s refused this tessera's communication ABI %d.%d", path,
                     TS_COMM_ABI_MAJOR, TS_COMM_ABI_MINOR);
    else if (d->abi_major != TS_COMM_ABI_MAJOR)
        s = ts__fail(TS_EPLUGIN, "%s was built for communication ABI %u.%u, but this tessera "
                     "speaks %d.%d; rebuild it against this tessera's headers", path,
                     (unsigned)d->abi_major, (unsigned)d->abi_minor, TS_COMM_ABI_MAJOR,
                     TS_COMM_ABI_MINOR);
    else if (d->struct_size < min)
        s = ts__fail(TS_EPLUGIN, "%s: descriptor of %u bytes, smaller than ABI %d.0's %zu",
                     path, (unsigned)d->struct_size, TS_COMM_ABI_MAJOR, min);
    else if (!d->name || strcmp(d->name, backend))
        s = ts__fail(TS_EPLUGIN, "%s calls itself '%s', not '%s'", path,
                     d->name ? d->name : "(null)", backend);
    else if (!d->init || !d->rank || !d->size || !d->allreduce || !d->broadcast ||
             !d->allgather || !d->barrier || !d->abort || !d->shutdown)
        s = ts__fail(TS_EPLUGIN, "%s leaves a required member of its descriptor NULL", path);
    else if ((d->flags & (TS_COMM_HOST_BUFFERS | TS_COMM_DEVICE_BUFFERS)) !=
                 TS_COMM_HOST_BUFFERS &&
             (d->flags & (TS_COMM_HOST_BUFFERS | TS_COMM_DEVICE_BUFFERS)) !=
                 TS_COMM_DEVICE_BUFFERS)
        s = ts__fail(TS_EPLUGIN, "%s sets flags 0x%x: exactly one of TS_COMM_HOST_BUFFERS and "
                     "TS_COMM_DEVICE_BUFFERS must be set", path, (unsigned)d->flags);
    else if ((d->flags & TS_COMM_DEVICE_BUFFERS) &&
             (d->struct_size < offsetof(ts_comm_desc, device) + sizeof d->device || !d->device))
        s = ts__fail(TS_EPLUGIN, "%s takes device buffers but does not name its device (the "
                     "'device' member of communication ABI %d.1)", path, TS_COMM_ABI_MAJOR);
    if (s) {
        dlclose(h);
        free(path);
        return s;
    }
    memset(&w->vt, 0, sizeof w->vt);
    memcpy(&w->vt, d, d->struct_size < sizeof w->vt ? d->struct_size : sizeof w->vt);
    w->handle = h;
    w->path = path;
    snprintf(w->name, sizeof w->name, "%s", backend);
    return TS_OK;
}

/* A launcher's environment: mpirun (Open MPI, MPICH's hydra), Slurm's srun, PMIx. */
static int under_launcher(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK",
                                       "MPI_LOCALNRANKS", "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (ts__getenv(vars[i]))
            return 1;
    return 0;
}

TS_API ts_status ts_dist_init(const ts_config *cfg)
{
    pthread_mutex_lock(&init_lock);
    if (joined) {
        pthread_mutex_unlock(&init_lock);
        return TS_OK;
    }
    if (!cfg)
        cfg = ts_runtime_config();
    const char *backend = ts_config_get(cfg, "dist", "backend");
    ts_status s = TS_OK;
    world w = {.size = 1, .name = "none"};
    if (backend && !strcmp(backend, "none")) {
        /* a single process, whatever the environment says */
    } else if (backend && strcmp(backend, "auto")) {
        s = load(cfg, backend, &w);
    } else if (under_launcher()) {
        /* auto: the MPI plugin is the one launcher-started backend shipped; a failure to
         * load it is an error (the ranks would each train alone) */
        s = load(cfg, "mpi", &w);
        if (s == TS_OK && w.vt.launched && !w.vt.launched()) {
            dlclose(w.handle);
            free(w.path);
            w = (world){.size = 1, .name = "none"};
        }
    }
    if (s == TS_OK && w.handle) {
        int32_t shard = 0;
        const char *sh = ts_config_get(cfg, "dist", "shard_optimizer");
        if (sh)
            ts__config_bool(sh, &shard); /* checked when the file was read */
        w.shard = shard != 0;
        W = w; /* the host's messages name the backend */
        W.host = (ts_comm_host){.struct_size = sizeof(ts_comm_host),
                                .abi_major = TS_COMM_ABI_MAJOR,
                                .abi_minor = TS_COMM_ABI_MINOR,
                                .fail = chost_fail,
                                .log = chost_log};
        ts_clear_error();
        s = W.vt.init(&W.host, &W.ctx);
        if (s == TS_OK) {
            W.rank = W.vt.rank(W.ctx);
            W.size = W.vt.size(W.ctx);
            if (W.size < 1 || W.rank < 0 || W.rank >= W.size) {
                s = ts__fail(TS_EPLUGIN, "comm plugin '%s': rank %d of %d is not a rank",
                             W.name, W.rank, W.size);
                W.vt.shutdown(W.ctx);
            } else if (W.vt.flags & TS_COMM_DEVICE_BUFFERS) {
                const char *dn = W.vt.device(W.ctx);
                char why[768] = "";
                if (!dn || !*dn)
                    snprintf(why, sizeof why, "it names no device");
                else if (ts_device_get(dn, &W.dev))
                    snprintf(why, sizeof why, "%s", ts_last_error());
                if (why[0]) {
                    s = ts__fail(TS_EPLUGIN, "comm plugin '%s' communicates from device '%s', "
                                 "which cannot be opened: %s", W.name, dn ? dn : "", why);
                    /* the other ranks may have opened theirs and gone on: end the job */
                    if (W.size > 1)
                        W.vt.abort(W.ctx, 1, ts_last_error());
                    W.vt.shutdown(W.ctx);
                } else if (W.size > 1) {
                    /* One sum through the device now: a rank whose device and communicator
                     * disagree (another GPU) stops the job here, not in the first step. */
                    int64_t one = 1;
                    s = staged(0, &one, sizeof one, &one, sizeof one, 1, TS_I64, 0);
                    if (s == TS_OK && one != W.size)
                        s = ts__fail(TS_EPLUGIN, "comm plugin '%s': the sum of 1 over %d ranks "
                                     "came out %lld", W.name, W.size, (long long)one);
                    if (s)
                        W.vt.abort(W.ctx, 1, ts_last_error());
                }
            }
        } else if (!ts_last_error()[0]) {
            ts__fail(s, "comm plugin '%s': init failed with no message", W.name);
        }
        if (s == TS_OK && (s = setup_hierarchy(cfg))) {
            /* every rank took the same path here: leave the job together */
            free_hierarchy();
            W.vt.shutdown(W.ctx);
        }
        if (s) {
            dlclose(W.handle);
            free(W.path);
            W = (world){.size = 1, .name = "none"};
        }
    }
    joined = s == TS_OK;
    pthread_mutex_unlock(&init_lock);
    return s;
}

/* Hierarchical all-reduce: the machines of the job from [dist] ranks_per_node (consecutive
 * ranks) or from the host names, then a sub-communicator per machine and one per local rank
 * across machines. Every rank decides alike (the inputs are gathered, and the ranks' settings
 * compared): a split is a collective. */
static ts_status setup_hierarchy(const ts_config *cfg)
{
    const char *mode = ts_config_get(cfg, "dist", "hierarchical");
    const char *rpn = ts_config_get(cfg, "dist", "ranks_per_node");
    if (W.size < 2 || W.dev)
        return TS_OK;
    /* First, with no condition, every rank's settings and the plugin's means, compared with
     * rank 0's: from here on every rank takes the same branches (a split, an all-gather of
     * host names), so a disagreement cannot leave one rank waiting in a collective. */
    enum { NSET = 5 };
    int64_t mine[NSET] = {mode && !strcmp(mode, "on") ? 2 : mode && !strcmp(mode, "off") ? 0 : 1,
                          rpn ? atoi(rpn) : 0, W.vt.split && W.vt.free_sub,
                          W.vt.reduce_scatter != NULL, W.shard};
    int64_t *rec = ts__calloc((size_t)W.size, sizeof mine);
    if (!rec)
        ts_dist_abort(1, "rank %d of %d: out of host memory joining the job", W.rank, W.size);
    ts_status s = W.vt.allgather(W.ctx, mine, rec, sizeof mine);
    int differ = -1;
    for (int r = 1; s == TS_OK && r < W.size && differ < 0; r++)
        if (memcmp(rec + NSET * r, rec, sizeof mine))
            differ = r;
    free(rec);
    if (s)
        return s;
    if (differ >= 0)
        return ts__fail(TS_ECONFIG, "ranks 0 and %d disagree on [dist] hierarchical, "
                        "ranks_per_node or shard_optimizer, or run different builds of comm "
                        "plugin '%s' (give every rank the same configuration and plugin)",
                        differ, W.name);
    const int want = (int)mine[0];
    if (!want || !mine[2] || !mine[3])
        return TS_OK;
    int L = 0, node = 0, lrank = 0, nodes = 0;
    if (mine[1]) {
        L = (int)mine[1];
        if (W.size % L == 0)
            node = W.rank / L, lrank = W.rank % L, nodes = W.size / L;
        else
            L = 0; /* uneven: flat */
    } else {
        char host[64] = {0}, *all = ts__calloc((size_t)W.size, sizeof host);
        if (!all)
            ts_dist_abort(1, "rank %d of %d: out of host memory for the host names", W.rank,
                          W.size);
        gethostname(host, sizeof host - 1);
        if ((s = W.vt.allgather(W.ctx, host, all, sizeof host))) {
            free(all);
            return s;
        }
        /* machines in order of their first rank; L the ranks of each, all alike or none */
        L = -1;
        for (int r = 0; r < W.size; r++) {
            int first = r, count = 0, ord = 0;
            for (int q = 0; q < W.size; q++) {
                int same = !strncmp(all + (size_t)q * sizeof host, all + (size_t)r * sizeof host,
                                    sizeof host);
                if (same && q < first)
                    first = q;
                count += same;
            }
            if (first == r) {
                nodes++;
                L = L < 0 || L == count ? count : 0;
            }
            if (r == W.rank) {
                for (int q = 0; q < r; q++)
                    lrank += !strncmp(all + (size_t)q * sizeof host, host, sizeof host);
                for (int q = 0; q < first; q++) { /* machines that start before this one */
                    int f = q;
                    for (int p = 0; p < q; p++)
                        if (!strncmp(all + (size_t)p * sizeof host, all + (size_t)q * sizeof host,
                                     sizeof host))
                            f = p;
                    ord += f == q;
                }
                node = ord;
            }
        }
        free(all);
        L = L < 0 ? 0 : L;
    }
    /* auto: across machines from 8 ranks, where a flat ring's 2 (N - 1) latencies start to
     * weigh; on: whenever there are several machines of several ranks each. The inputs are
     * the same on every rank, and so is the decision. */
    if (!(L > 1 && nodes > 1 && (want == 2 || W.size >= 8)))
        return TS_OK;
    if ((s = W.vt.split(W.ctx, node, W.rank, &W.local)) ||
        (s = W.vt.split(W.ctx, lrank, W.rank, &W.rail)))
        return s;
    if (!W.local || !W.rail || W.vt.size(W.local) != L || W.vt.size(W.rail) != nodes)
        return ts__fail(TS_EPLUGIN, "comm plugin '%s': its sub-communicators do not have %d "
                        "and %d ranks", W.name, L, nodes);
    W.nodes = nodes;
    W.per_node = L;
    ts__log(TS_LOG_INFO, "dist: hierarchical all-reduce over %d machines of %d ranks", nodes, L);
    return TS_OK;
}

static void free_hierarchy(void)
{
    if (W.local)
        W.vt.free_sub(W.local);
    if (W.rail)
        W.vt.free_sub(W.rail);
    free(W.scratch);
    W.local = W.rail = W.scratch = NULL;
    W.scratch_bytes = 0;
    W.nodes = W.per_node = 0;
}

/* buf's sum over the ranks, under comm_lock: flat, or a reduce-scatter within each machine,
 * the all-reduce of each shard across machines, an all-gather within each machine (and a flat
 * all-reduce of the elements past the last whole shard). */
static ts_status allreduce_locked(void *buf, size_t count, int32_t dtype)
{
    if (!W.local)
        return W.vt.allreduce(W.ctx, buf, count, dtype, TS_COMM_SUM);
    const size_t es = ts_dtype_size(dtype), L = (size_t)W.per_node;
    if (!es)
        return W.vt.allreduce(W.ctx, buf, count, dtype, TS_COMM_SUM); /* the plugin refuses */
    /* windows whose shards stay within what one MPI call takes (int counts and bytes) */
    const size_t wshard = (size_t)INT_MAX / es, window = wshard * L;
    ts_status s = TS_OK;
    for (size_t at = 0; at < count && s == TS_OK; at += window) {
        const size_t n = count - at < window ? count - at : window, per = n / L;
        char *b = (char *)buf + at * es;
        if (per) {
            if (W.scratch_bytes < per * es) {
                void *nb = ts__realloc(W.scratch, per * es);
                if (!nb) /* the machine's other ranks are in the reduce-scatter already */
                    ts_dist_abort(1, "rank %d of %d: no host memory for a shard of %zu bytes "
                                  "of the hierarchical all-reduce", W.rank, W.size, per * es);
                W.scratch = nb;
                W.scratch_bytes = per * es;
            }
            if ((s = W.vt.reduce_scatter(W.local, b, W.scratch, per, dtype, TS_COMM_SUM)) ||
                (s = W.vt.allreduce(W.rail, W.scratch, per, dtype, TS_COMM_SUM)) ||
                (s = W.vt.allgather(W.local, W.scratch, b, per * es)))
                break;
        }
        if (n > per * L)
            s = W.vt.allreduce(W.ctx, b + per * L * es, n - per * L, dtype, TS_COMM_SUM);
    }
    return s;
}

int ts__dist_shard_optimizer(void)
{
    return W.shard;
}

TS_API int ts_dist_hierarchy(int *nodes, int *ranks_per_node)
{
    if (nodes)
        *nodes = W.local ? W.nodes : 0;
    if (ranks_per_node)
        *ranks_per_node = W.local ? W.per_node : 0;
    return W.local != NULL;
}

TS_API int ts_dist_rank(void)
{
    return W.rank;
}

TS_API int ts_dist_size(void)
{
    return W.size;
}

TS_API const char *ts_dist_backend(void)
{
    return W.name;
}

TS_API ts_device *ts_dist_device(void)
{
    return W.dev;
}

/* A device-buffer backend's collective on host memory: in (nin bytes) copied to a device
 * buffer, the collective run there (op 0: allreduce in place of count elements of dtype, 1:
 * broadcast in place from root, 2: allgather of nin bytes a rank into the nout bytes after
 * them, 3: reduce-scatter of the nin bytes into the nout bytes after them, count elements a
 * rank), and the result (nout bytes) copied back to out. The other ranks are already in the
 * collective or about to be: a rank that cannot stage its part (out of device memory) cannot
 * leave them waiting, so it ends the job with the reason. */
static ts_status staged(int op, const void *in, size_t nin, void *out, size_t nout,
                        size_t count, int32_t dtype, int root)
{
    ts_tensor *t = NULL;
    const size_t at = op >= 2 ? nin : 0; /* where the result lies in the device buffer */
    int64_t n = (int64_t)(at + nout);
    ts_status s = ts_tensor_empty(W.dev, TS_U8, 1, &n, &t);
    if (s == TS_OK)
        s = ts_device_copy_from_host(W.dev, ts_tensor_data(t), in, nin);
    if (s == TS_OK)
        s = ts_device_synchronize(W.dev);
    if (s)
        ts_dist_abort(1, "rank %d of %d cannot stage a collective on device '%s': %s", W.rank,
                      W.size, ts_device_name(W.dev), ts_last_error());
    char *buf = ts_tensor_data(t);
    pthread_mutex_lock(&comm_lock);
    s = op == 0   ? W.vt.allreduce(W.ctx, buf, count, dtype, TS_COMM_SUM)
        : op == 1 ? W.vt.broadcast(W.ctx, buf, nout, root)
        : op == 2 ? W.vt.allgather(W.ctx, buf, buf + at, nin)
                  : W.vt.reduce_scatter(W.ctx, buf, buf + at, count, dtype, TS_COMM_SUM);
    pthread_mutex_unlock(&comm_lock);
    if (s == TS_OK)
        s = ts_device_copy_to_host(W.dev, out, buf + at, nout);
    ts_tensor_unref(t);
    return s;
}

TS_API ts_status ts_dist_allreduce_sum(void *buf, size_t count, int32_t dtype)
{
    if (!buf && count)
        return ts__fail(TS_EINVAL, "ts_dist_allreduce_sum: buffer is NULL");
    if (W.size == 1 || !count)
        return TS_OK;
    if (W.dev) {
        size_t es = dtype >= 0 && dtype < TS_DTYPE_COUNT ? ts_dtype_size(dtype) : 0;
        if (!es || count > SIZE_MAX / es)
            return ts__fail(TS_EINVAL, "ts_dist_allreduce_sum: dtype %d or %zu elements "
                            "invalid", (int)dtype, count);
        return staged(0, buf, count * es, buf, count * es, count, dtype, 0);
    }
    pthread_mutex_lock(&comm_lock);
    ts_status s = allreduce_locked(buf, count, dtype);
    pthread_mutex_unlock(&comm_lock);
    return s;
}

TS_API ts_status ts_dist_broadcast(void *buf, size_t nbytes, int root)
{
    if (root < 0 || root >= W.size)
        return ts__fail(TS_EINVAL, "ts_dist_broadcast: root %d is not a rank of %d", root,
                        W.size);
    if (W.size == 1 || !nbytes)
        return TS_OK;
    if (W.dev)
        return staged(1, buf, nbytes, buf, nbytes, 0, 0, root);
    pthread_mutex_lock(&comm_lock);
    ts_status s = W.vt.broadcast(W.ctx, buf, nbytes, root);
    pthread_mutex_unlock(&comm_lock);
    return s;
}

TS_API ts_status ts_dist_allgather(const void *send, void *recv, size_t nbytes)
{
    if (W.size == 1) {
        if (nbytes)
            memmove(recv, send, nbytes);
        return TS_OK;
    }
    if (W.dev && nbytes) {
        if (nbytes > SIZE_MAX / ((size_t)W.size + 1))
            return ts__fail(TS_EINVAL, "ts_dist_allgather: %zu bytes a rank is too many",
                            nbytes);
        return staged(2, send, nbytes, recv, nbytes * (size_t)W.size, 0, 0, 0);
    }
    pthread_mutex_lock(&comm_lock);
    ts_status s = W.vt.allgather(W.ctx, send, recv, nbytes);
    pthread_mutex_unlock(&comm_lock);
    return s;
}

TS_API ts_status ts_dist_reduce_scatter_sum(const void *send, void *recv, size_t count,
                                            int32_t dtype)
{
    size_t es = dtype >= 0 && dtype < TS_DTYPE_COUNT ? ts_dtype_size(dtype) : 0;
    if (!es || count > SIZE_MAX / es / (size_t)(W.size + 1))
        return ts__fail(TS_EINVAL, "ts_dist_reduce_scatter_sum: dtype %d or %zu elements a rank "
                        "invalid", (int)dtype, count);
    const size_t chunk = count * es, total = chunk * (size_t)W.size;
    if (count && (!send || !recv))
        return ts__fail(TS_EINVAL, "ts_dist_reduce_scatter_sum: a buffer is NULL");
    if (count && (const char *)send < (char *)recv + chunk &&
        (char *)recv < (const char *)send + total)
        return ts__fail(TS_EINVAL, "ts_dist_reduce_scatter_sum: send and recv overlap");
    if (W.size == 1 || !count) {
        if (count)
            memcpy(recv, send, chunk);
        return TS_OK;
    }
    if (!W.vt.reduce_scatter) { /* an older backend: the whole sum, this rank's chunk of it */
        char *all = ts__malloc(total);
        if (!all) /* the other ranks go on into the sum: end the job rather than hang it */
            ts_dist_abort(1, "rank %d of %d: no host memory for a copy of %zu bytes "
                          "(ts_dist_reduce_scatter_sum)", W.rank, W.size, total);
        memcpy(all, send, total);
        ts_status s = ts_dist_allreduce_sum(all, count * (size_t)W.size, dtype);
        if (s == TS_OK)
            memcpy(recv, all + chunk * (size_t)W.rank, chunk);
        free(all);
        return s;
    }
    if (W.dev)
        return staged(3, send, total, recv, chunk, count, dtype, 0);
    pthread_mutex_lock(&comm_lock);
    ts_status s = W.vt.reduce_scatter(W.ctx, send, recv, count, dtype, TS_COMM_SUM);
    pthread_mutex_unlock(&comm_lock);
    return s;
}

TS_API ts_status ts_dist_barrier(void)
{
    if (W.size == 1)
        return TS_OK;
    pthread_mutex_lock(&comm_lock);
    ts_status s = W.vt.barrier(W.ctx);
    pthread_mutex_unlock(&comm_lock);
    return s;
}

TS_API void ts_dist_abort(int code, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (W.size > 1)
        W.vt.abort(W.ctx, code, msg); /* does not return */
    fprintf(stderr, "tessera: %s\n", msg);
    exit(code ? code : 1);
}

TS_API void ts_dist_shutdown(void)
{
    pthread_mutex_lock(&init_lock);
    if (joined && W.handle) {
        pthread_mutex_lock(&comm_lock); /* a communication thread may still be in a sum */
        free_hierarchy();
        W.vt.shutdown(W.ctx);
        pthread_mutex_unlock(&comm_lock);
        dlclose(W.handle);
        free(W.path);
    }
    W = (world){.size = 1, .name = "none"};
    joined = 0;
    pthread_mutex_unlock(&init_lock);
}

typedef struct comm_scan {
    char names[32][72];
    int n;
} comm_scan;

static void scan_comm_dir(const char *dir, void *user)
{
    comm_scan *cs = user;
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d)) && cs->n < 32) {
        size_t len = strlen(de->d_name);
        if (len <= 8 || strncmp(de->d_name, "comm_", 5) || strcmp(de->d_name + len - 3, ".so") ||
            len - 8 >= sizeof cs->names[0])
            continue;
        char name[72];
        snprintf(name, sizeof name, "%.*s", (int)(len - 8), de->d_name + 5);
        int dup = 0;
        for (int i = 0; i < cs->n; i++)
            dup |= !strcmp(cs->names[i], name);
        if (!dup)
            snprintf(cs->names[cs->n++], sizeof cs->names[0], "%s", name);
    }
    if (d)
        closedir(d);
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(a, b);
}

TS_API void ts_dist_scan(const ts_config *cfg,
                         void (*fn)(const char *name, const char *path, const char *description,
                                    const char *error, void *user),
                         void *user)
{
    if (!fn)
        return;
    if (!cfg)
        cfg = ts_runtime_config();
    comm_scan cs = {.n = 0};
    ts_plugin_search_path(cfg, scan_comm_dir, &cs);
    qsort(cs.names, (size_t)cs.n, sizeof cs.names[0], cmp_names);
    for (int i = 0; i < cs.n; i++) {
        world w = {.size = 1};
        char file[80], *path = NULL;
        snprintf(file, sizeof file, "comm_%s", cs.names[i]);
        if (ts_plugin_find(cfg, file, &path) != TS_OK)
            continue;
        if (load(cfg, cs.names[i], &w) == TS_OK) {
            fn(cs.names[i], w.path, w.vt.description ? w.vt.description : "", NULL, user);
            dlclose(w.handle);
            free(w.path);
        } else {
            fn(cs.names[i], path, NULL, ts_last_error(), user);
        }
        free(path);
    }
}

/* ---- modules --------------------------------------------------------------------------- */

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h = (h ^ ((const unsigned char *)p)[i]) * 0x100000001b3ull;
    return h;
}

TS_API ts_status ts_dist_broadcast_module(ts_module *m, int root)
{
    if (!m)
        return ts__fail(TS_EINVAL, "ts_dist_broadcast_module: module is NULL");
    if (root < 0 || root >= W.size)
        return ts__fail(TS_EINVAL, "ts_dist_broadcast_module: root %d is not a rank of %d",
                        root, W.size);
    if (W.size == 1)
        return TS_OK;
    size_t np = ts_module_parameters(m, NULL, 0), nb = ts_module_buffers(m, NULL, 0);
    ts_named_tensor *all = ts__calloc(np + nb + 1, sizeof *all);
    uint64_t *sigs = ts__calloc((size_t)W.size, sizeof *sigs);
    ts_status s = all && sigs ? TS_OK : ts__fail(TS_ENOMEM, "out of host memory");
    if (s)
        goto out;
    ts_module_parameters(m, all, np);
    ts_module_buffers(m, all + np, nb);
    /* The model's signature: names, dtypes and shapes, compared across ranks first, so a rank
     * with another model is refused on every rank instead of deadlocking in a broadcast. */
    uint64_t sig = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < np + nb; i++) {
        const ts_tensor *t = all[i].tensor;
        sig = fnv(sig, all[i].name, strlen(all[i].name) + 1);
        sig = fnv(sig, &t->dtype, sizeof t->dtype);
        sig = fnv(sig, &t->ndim, sizeof t->ndim);
        sig = fnv(sig, t->shape, sizeof t->shape[0] * (size_t)t->ndim);
    }
    if ((s = ts_dist_allgather(&sig, sigs, sizeof sig)))
        goto out;
    for (int r = 0; r < W.size; r++)
        if (sigs[r] != sigs[root]) {
            s = ts__fail(TS_ESHAPE, "rank %d's model differs from rank %d's (other parameter "
                         "names, shapes or dtypes: %zu parameters and %zu buffers here); start "
                         "every rank with the same model", r, root, np, nb);
            goto out;
        }
    for (size_t i = 0; i < np + nb && s == TS_OK; i++) {
        ts_tensor *t = all[i].tensor;
        size_t bytes = (size_t)ts_tensor_numel(t) * ts_dtype_size(t->dtype);
        void *buf = malloc(bytes ? bytes : 1);
        if (!buf) {
            s = ts__fail(TS_ENOMEM, "out of host memory broadcasting '%s'", all[i].name);
            break; /* the other ranks fail in the same place: same sizes */
        }
        if (W.rank == root)
            s = ts_tensor_to_host(t, buf, bytes);
        /* every rank joins the broadcast even after a local failure, so none waits forever */
        ts_status b = ts_dist_broadcast(buf, bytes, root);
        if (s == TS_OK)
            s = b;
        if (s == TS_OK && W.rank != root) {
            if (!ts_tensor_is_contiguous(t))
                s = ts__fail(TS_ESTATE, "ts_dist_broadcast_module: '%s' is not contiguous",
                             all[i].name);
            else
                s = ts_device_copy_from_host(t->storage->dev,
                                             (char *)t->storage->data +
                                                 t->offset * (int64_t)ts_dtype_size(t->dtype),
                                             buf, bytes);
            if (s == TS_OK)
                ts__bump_version(t);
        }
        free(buf);
    }
out:
    free(all);
    free(sigs);
    return s;
}

/* The plugin's all-reduce (sum) of buf as it lies, under the world's lock (ts_ddp's buckets:
 * device memory on a device-buffer backend). */
ts_status ts__dist_reduce_scatter_mem(const void *send, void *recv, size_t count,
                                      int32_t dtype)
{
    if (!W.dev)
        return ts_dist_reduce_scatter_sum(send, recv, count, dtype);
    if (!W.vt.reduce_scatter)
        return ts__fail(TS_EPLUGIN, "comm plugin '%s' has no reduce-scatter (communication ABI "
                        "1.2): a sharded optimizer cannot use it", W.name);
    pthread_mutex_lock(&comm_lock);
    ts_status s = W.vt.reduce_scatter(W.ctx, send, recv, count, dtype, TS_COMM_SUM);
    pthread_mutex_unlock(&comm_lock);
    return s;
}

ts_status ts__dist_allgather_mem(const void *send, void *recv, size_t nbytes)
{
    if (!W.dev || W.size == 1)
        return ts_dist_allgather(send, recv, nbytes);
    pthread_mutex_lock(&comm_lock);
    ts_status s = W.vt.allgather(W.ctx, send, recv, nbytes);
    pthread_mutex_unlock(&comm_lock);
    return s;
}

int ts__dist_device_reduce_scatter(void)
{
    return !W.dev || W.vt.reduce_scatter != NULL;
}

ts_status ts__dist_allreduce_in_place(void *buf, size_t count, int32_t dtype)
{
    pthread_mutex_lock(&comm_lock);
    ts_status s = W.dev ? W.vt.allreduce(W.ctx, buf, count, dtype, TS_COMM_SUM)
                        : allreduce_locked(buf, count, dtype);
    pthread_mutex_unlock(&comm_lock);
    return s;
}
