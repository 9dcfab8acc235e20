/* core/dist.c: the world of ranks over a communication plugin (tessera/comm.h), and gradient
 * averaging for data parallelism (tessera/dist.h). libtessera links no communication
 * library: the plugin (comm_mpi.so) is dlopen'ed under the device plugins' trust rules, and
 * only when asked for ([dist] backend) or when a launcher's environment says this process is
 * one rank of several, so a single process never loads MPI.
 *
 * Every collective holds the world's lock, so the communication thread of ts_ddp and the
 * caller's thread never call the plugin at once (the plugin needs MPI_THREAD_SERIALIZED,
 * not MULTIPLE). */
#include <dirent.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
} world;

static world W = {.size = 1, .name = "none"};
static int joined;
static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t comm_lock = PTHREAD_MUTEX_INITIALIZER;

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
 * them), and the result (nout bytes) copied back to out. The other ranks are already in the
 * collective or about to be: a rank that cannot stage its part (out of device memory) cannot
 * leave them waiting, so it ends the job with the reason. */
static ts_status staged(int op, const void *in, size_t nin, void *out, size_t nout,
                        size_t count, int32_t dtype, int root)
{
    ts_tensor *t = NULL;
    const size_t at = op == 2 ? nin : 0; /* where the result lies in the device buffer */
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
                  : W.vt.allgather(W.ctx, buf, buf + at, nin);
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
    ts_status s = W.vt.allreduce(W.ctx, buf, count, dtype, TS_COMM_SUM);
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
        W.vt.shutdown(W.ctx);
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

/* ---- data parallelism ------------------------------------------------------------------ */

typedef struct ddp_param {
    struct ts_ddp *d;
    ts_tensor *t; /* a reference of the ddp's own */
    ts_tensor *home; /* host memory: its slot in the bucket, the .grad between syncs */
    size_t bucket, off; /* elements into the bucket's buffer */
    size_t numel;
    uint64_t copied; /* the step whose gradient is in the buffer, + 1 */
} ddp_param;

enum { B_IDLE, B_QUEUED, B_DONE };

typedef struct bucket {
    int32_t dtype;
    size_t numel, nparams, remaining;
    size_t first; /* its parameters: order[first .. first + nparams) */
    ts_tensor *bt; /* host memory: the bucket as a device tensor (buf is its data) */
    void *buf;
    int state;
    int early; /* queued before ts_ddp_sync */
} bucket;

struct ts_ddp {
    ddp_param *p;
    size_t n;
    size_t *order; /* parameter indices grouped by bucket */
    bucket *b;
    size_t nb;
    pthread_t thread;
    int have_thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    size_t *queue, qhead, qtail; /* bucket indices, at most nb queued per step */
    int stop, in_sync;
    int restage; /* a gradient changed after its bucket was staged: redo the sums at sync */
    int twice;   /* in place: a second backward added into a bucket being summed */
    int devmode; /* buckets on the device-buffer backend's device, summed there */
    ts_status err;
    char errmsg[512];
    uint64_t step;
    ts_ddp_stats st;
};

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* A bucket's sum over ranks, in place: on the device for a device-buffer backend (the
 * bucket's contents complete: the device was synchronised when it was queued). */
static ts_status bucket_sum(ts_ddp *d, bucket *b)
{
    if (!d->devmode)
        return ts_dist_allreduce_sum(b->buf, b->numel, b->dtype);
    pthread_mutex_lock(&comm_lock);
    ts_status s = W.vt.allreduce(W.ctx, b->buf, b->numel, b->dtype, TS_COMM_SUM);
    pthread_mutex_unlock(&comm_lock);
    return s;
}

static void *comm_thread(void *arg)
{
    ts_ddp *d = arg;
    pthread_mutex_lock(&d->mu);
    for (;;) {
        while (!d->stop && d->qhead == d->qtail)
            pthread_cond_wait(&d->cv, &d->mu);
        if (d->stop)
            break;
        size_t k = d->queue[d->qhead++ % d->nb];
        bucket *b = &d->b[k];
        pthread_mutex_unlock(&d->mu);
        double t0 = now_s();
        ts_status s = bucket_sum(d, b);
        double dt = now_s() - t0;
        pthread_mutex_lock(&d->mu);
        if (s && !d->err) {
            d->err = s;
            snprintf(d->errmsg, sizeof d->errmsg, "%s", ts_last_error());
        }
        d->st.reduce_seconds += dt;
        d->st.finished_early += b->early && !d->in_sync;
        b->state = B_DONE;
        pthread_cond_broadcast(&d->cv);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

/* Copies p's gradient (zeros without one) into its bucket's buffer. Caller's thread. */
static ts_status stage(ts_ddp *d, ddp_param *p)
{
    bucket *b = &d->b[p->bucket];
    size_t es = ts_dtype_size(b->dtype);
    char *dst = (char *)b->buf + p->off * es;
    ts_status s = TS_OK;
    p->copied = d->step + 1;
    if (p->home && p->t->grad == p->home)
        return TS_OK; /* the gradient already lives in the bucket */
    if (d->devmode) /* device memory: written by the device's own kernels */
        s = p->t->grad ? ts_copy_(p->home, p->t->grad) : ts_zero_(p->home);
    else if (p->t->grad)
        s = ts_tensor_to_host(p->t->grad, dst, p->numel * es);
    else
        memset(dst, 0, p->numel * es);
    if (s == TS_OK && p->home) { /* from now on the gradient is its slot in the bucket */
        ts_tensor_unref(p->t->grad);
        p->t->grad = ts_tensor_ref(p->home);
        ts__bump_version(p->home);
    }
    return s;
}

/* p's .grad = its bucket's sum times inv (1 / ranks): on host memory in one pass over the
 * gradient's own memory, elsewhere scaled in the bucket and copied to the device. */
static ts_status unstage(ts_ddp *d, ddp_param *p, double inv)
{
    bucket *b = &d->b[p->bucket];
    ts_tensor *t = p->t;
    size_t es = ts_dtype_size(b->dtype);
    ts_status s = TS_OK;
    if (d->devmode) { /* the bucket is scaled already; a .grad replaced since is refilled */
        if (t->grad == p->home) {
            ts__bump_version(t->grad);
            return TS_OK;
        }
        if (!t->grad) {
            t->grad = ts_tensor_ref(p->home);
            return TS_OK;
        }
        return ts_copy_(t->grad, p->home);
    }
    if (p->home && t->grad == p->home) { /* scale in place */
        if (b->dtype == TS_F32) {
            float *x = (float *)((char *)b->buf + p->off * es);
            const float f = (float)inv;
            for (size_t i = 0; i < p->numel; i++)
                x[i] *= f;
        } else {
            double *x = (double *)((char *)b->buf + p->off * es);
            for (size_t i = 0; i < p->numel; i++)
                x[i] *= inv;
        }
        ts__bump_version(t->grad);
        return TS_OK;
    }
    if (!t->grad && (s = ts_tensor_zeros(t->storage->dev, t->dtype, t->ndim, t->shape, &t->grad)))
        return s;
    if (!ts_tensor_is_contiguous(t->grad))
        return ts__fail(TS_ESTATE, "ts_ddp_sync: a gradient is not contiguous");
    char *src = (char *)b->buf + p->off * es;
    char *dst = (char *)t->grad->storage->data + t->grad->offset * (int64_t)es;
    ts_device *dev = t->grad->storage->dev;
    int direct = ts__device_is_host_memory(dev);
    if (b->dtype == TS_F32) {
        float *x = (float *)src, *y = direct ? (float *)dst : x;
        const float f = (float)inv;
        for (size_t i = 0; i < p->numel; i++)
            y[i] = x[i] * f;
    } else {
        double *x = (double *)src, *y = direct ? (double *)dst : x;
        for (size_t i = 0; i < p->numel; i++)
            y[i] = x[i] * inv;
    }
    if (!direct)
        s = ts_device_copy_from_host(dev, dst, src, p->numel * es);
    if (s == TS_OK)
        ts__bump_version(t->grad);
    return s;
}

/* Queues bucket k's sum. On a device the kernels that wrote the bucket finish first (the
 * backend's collectives run on a stream of its own). Queued even after a failure: the other
 * ranks wait for this sum; the failure is returned. */
static ts_status enqueue(ts_ddp *d, size_t k)
{
    ts_status s = d->devmode ? ts_device_synchronize(W.dev) : TS_OK;
    pthread_mutex_lock(&d->mu);
    d->b[k].state = B_QUEUED;
    d->b[k].early = !d->in_sync;
    d->st.started_early += !d->in_sync;
    d->queue[d->qtail++ % d->nb] = k;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
    return s;
}

static ts_status on_ready(ts_tensor *t, void *user)
{
    (void)t;
    ddp_param *p = user;
    ts_ddp *d = p->d;
    if (p->copied == d->step + 1) { /* a second backward before the sync */
        if (d->st.in_place) /* it added into the bucket, maybe while it was being summed */
            d->twice = 1;
        else
            d->restage = 1;
        return TS_OK;
    }
    ts_status s = stage(d, p);
    if (s == TS_OK && --d->b[p->bucket].remaining == 0)
        s = enqueue(d, p->bucket);
    return s;
}

TS_API ts_status ts_ddp_new(const ts_named_tensor *params, size_t n, size_t bucket_bytes,
                            ts_ddp **out)
{
    if (!out || (n && !params))
        return ts__fail(TS_EINVAL, "ts_ddp_new: NULL argument");
    *out = NULL;
    if (!bucket_bytes)
        bucket_bytes = (size_t)25 << 20;
    ts_ddp *d = ts__calloc(1, sizeof *d);
    if (!d)
        return ts__fail(TS_ENOMEM, "out of host memory");
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv, NULL);
    d->p = ts__calloc(n + 1, sizeof *d->p);
    d->b = ts__calloc(n + 1, sizeof *d->b);
    ts_status s = d->p && d->b ? TS_OK : ts__fail(TS_ENOMEM, "out of host memory");
    d->n = d->p ? n : 0; /* entries not filled (on an error) have no tensor */
    /* Buckets from the last parameter back: their gradients are ready first. */
    for (size_t j = 0; j < n && s == TS_OK; j++) {
        size_t i = n - 1 - j;
        ts_tensor *t = params[i].tensor;
        if (!t || !t->requires_grad || t->grad_fn) {
            s = ts__fail(TS_EINVAL, "ts_ddp_new: '%s' is not a parameter (a leaf that "
                         "requires grad)", params[i].name);
            break;
        }
        if (t->dtype != TS_F32 && t->dtype != TS_F64) {
            s = ts__fail(TS_EDTYPE, "ts_ddp_new: '%s' is %s; gradients are averaged in float32 "
                         "or float64", params[i].name, ts_dtype_name(t->dtype));
            break;
        }
        size_t numel = (size_t)ts_tensor_numel(t), es = ts_dtype_size(t->dtype);
        bucket *b = d->nb ? &d->b[d->nb - 1] : NULL;
        if (!b || b->dtype != t->dtype || (b->numel + numel) * es > bucket_bytes) {
            if (!b || b->numel) /* a parameter bigger than a bucket gets one of its own */
                b = &d->b[d->nb++];
            b->dtype = t->dtype;
        }
        d->p[i] = (ddp_param){.d = d, .t = ts_tensor_ref(t), .bucket = (size_t)(b - d->b),
                              .off = b->numel, .numel = numel};
        b->numel += numel;
        b->nparams++;
    }
    if (s == TS_OK && !(d->order = ts__calloc(n + 1, sizeof *d->order)))
        s = ts__fail(TS_ENOMEM, "out of host memory");
    for (size_t k = 0, at = 0; k < d->nb && s == TS_OK; k++) {
        d->b[k].first = at;
        for (size_t j = 0; j < n; j++) /* the bucket's parameters, last first */
            if (d->p[n - 1 - j].t && d->p[n - 1 - j].bucket == k)
                d->order[at++] = n - 1 - j;
    }
    /* On one host-memory device under a host-buffer backend, or on a device-buffer backend's
     * own device, the buckets are device tensors and each gradient, once staged, is a view of
     * its slot (as PyTorch's gradient_as_bucket_view): the sums run on the gradients' own
     * memory and nothing is copied back. */
    ts_device *dev = n && d->p[0].t ? d->p[0].t->storage->dev : NULL;
    int views = dev && (W.dev ? dev == W.dev : ts__device_is_host_memory(dev));
    for (size_t i = 0; i < n && views; i++)
        views = d->p[i].t && d->p[i].t->storage->dev == dev;
    d->devmode = views && W.dev;
    d->st.in_place = views;
    d->st.on_device = d->devmode;
    for (size_t k = 0; k < d->nb && s == TS_OK; k++) {
        bucket *b = &d->b[k];
        b->remaining = b->nparams;
        if (views) {
            int64_t ne = (int64_t)b->numel;
            if ((s = ts_tensor_zeros(dev, b->dtype, 1, &ne, &b->bt)) == TS_OK)
                b->buf = (char *)b->bt->storage->data +
                         b->bt->offset * (int64_t)ts_dtype_size(b->dtype);
        } else if (!(b->buf = malloc(b->numel * ts_dtype_size(b->dtype) + 1))) {
            s = ts__fail(TS_ENOMEM, "out of host memory for a gradient bucket of %zu elements",
                         b->numel);
        }
    }
    for (size_t i = 0; i < n && s == TS_OK && views; i++) {
        ddp_param *p = &d->p[i];
        int64_t strides[TS_MAX_DIMS];
        ts__contiguous_strides(p->t->ndim, p->t->shape, strides);
        s = ts__view(d->b[p->bucket].bt, p->t->ndim, p->t->shape, strides,
                     d->b[p->bucket].bt->offset + (int64_t)p->off, &p->home);
    }
    d->st.nbuckets = d->nb;
    if (s == TS_OK && W.size > 1) {
        if (!(d->queue = ts__calloc(d->nb + 1, sizeof *d->queue)))
            s = ts__fail(TS_ENOMEM, "out of host memory");
        for (size_t i = 0; i < n && s == TS_OK; i++)
            s = ts_tensor_register_post_accumulate_hook(d->p[i].t, on_ready, &d->p[i]);
        if (s == TS_OK && pthread_create(&d->thread, NULL, comm_thread, d) != 0)
            s = ts__fail(TS_ENOMEM, "cannot start the communication thread");
        d->have_thread = s == TS_OK;
    }
    if (s) {
        ts_ddp_free(d);
        return s;
    }
    *out = d;
    return TS_OK;
}

TS_API ts_status ts_ddp_sync(ts_ddp *d)
{
    if (!d)
        return ts__fail(TS_EINVAL, "ts_ddp_sync: NULL");
    d->st.steps++;
    if (W.size == 1)
        return TS_OK;
    ts_status s = TS_OK;
    pthread_mutex_lock(&d->mu);
    d->in_sync = 1;
    pthread_mutex_unlock(&d->mu);
    /* Buckets backward did not finish (parameters without a gradient this step, or whose
     * gradient came outside backward): staged now, in bucket order, as on every rank. */
    for (size_t k = 0; k < d->nb; k++) {
        if (d->b[k].state != B_IDLE)
            continue;
        for (size_t j = 0; j < d->b[k].nparams && s == TS_OK; j++) {
            ddp_param *p = &d->p[d->order[d->b[k].first + j]];
            if (p->copied != d->step + 1)
                s = stage(d, p);
        }
        ts_status e = enqueue(d, k); /* even after a failure: the others wait for it */
        s = s ? s : e;
    }
    if (d->restage) { /* several backwards since the last sync: redo every sum */
        pthread_mutex_lock(&d->mu);
        for (size_t k = 0; k < d->nb; k++)
            while (d->b[k].state != B_DONE)
                pthread_cond_wait(&d->cv, &d->mu);
        pthread_mutex_unlock(&d->mu);
        for (size_t i = 0; i < d->n && s == TS_OK; i++)
            s = stage(d, &d->p[i]);
        if (s == TS_OK && d->devmode)
            s = ts_device_synchronize(W.dev);
        for (size_t k = 0; k < d->nb; k++) { /* every rank joins every sum */
            ts_status r = bucket_sum(d, &d->b[k]);
            s = s ? s : r;
        }
        d->restage = 0;
    }
    /* Bucket by bucket as the sums finish (the communication thread goes on with the next):
     * the average, written into each parameter's .grad in one pass. */
    const double inv = 1.0 / (double)W.size;
    for (size_t k = 0; k < d->nb; k++) {
        bucket *b = &d->b[k];
        pthread_mutex_lock(&d->mu);
        while (b->state != B_DONE)
            pthread_cond_wait(&d->cv, &d->mu);
        if (s == TS_OK && d->err)
            s = ts__fail(d->err, "%s", d->errmsg);
        pthread_mutex_unlock(&d->mu);
        b->state = B_IDLE;
        b->remaining = b->nparams;
        if (d->devmode && s == TS_OK) /* one kernel scales the whole bucket */
            s = ts_mul_scalar_(b->bt, inv);
        for (size_t j = 0; j < b->nparams && s == TS_OK; j++)
            s = unstage(d, &d->p[d->order[b->first + j]], inv);
    }
    if (s == TS_OK && d->twice)
        s = ts__fail(TS_ESTATE, "ts_ddp_sync: a parameter's gradient came from a second "
                     "backward since the last sync; with gradients as views of the buckets "
                     "(summed in place as soon as backward finishes them) one backward per "
                     "sync is needed: add the losses and call ts_backward once, then zero the "
                     "gradients before the next step");
    d->twice = 0;
    pthread_mutex_lock(&d->mu);
    d->err = TS_OK;
    d->in_sync = 0;
    d->qhead = d->qtail = 0;
    pthread_mutex_unlock(&d->mu);
    d->st.buckets += d->nb;
    d->step++;
    return s;
}

TS_API void ts_ddp_get_stats(const ts_ddp *d, ts_ddp_stats *st)
{
    if (!st)
        return;
    memset(st, 0, sizeof *st);
    if (!d)
        return;
    pthread_mutex_lock((pthread_mutex_t *)&d->mu);
    *st = d->st;
    pthread_mutex_unlock((pthread_mutex_t *)&d->mu);
}

TS_API void ts_ddp_free(ts_ddp *d)
{
    if (!d)
        return;
    if (d->have_thread) {
        pthread_mutex_lock(&d->mu);
        d->stop = 1;
        pthread_cond_broadcast(&d->cv);
        pthread_mutex_unlock(&d->mu);
        pthread_join(d->thread, NULL);
    }
    for (size_t i = 0; d->p && i < d->n; i++) {
        if (d->p[i].t && d->p[i].t->ready == on_ready)
            ts_tensor_register_post_accumulate_hook(d->p[i].t, NULL, NULL);
        ts_tensor_unref(d->p[i].t);
    }
    for (size_t i = 0; d->p && i < d->n; i++)
        ts_tensor_unref(d->p[i].home);
    for (size_t k = 0; d->b && k < d->nb; k++) {
        if (d->b[k].bt)
            ts_tensor_unref(d->b[k].bt);
        else
            free(d->b[k].buf);
    }
    free(d->p);
    free(d->order);
    free(d->b);
    free(d->queue);
    pthread_cond_destroy(&d->cv);
    pthread_mutex_destroy(&d->mu);
    free(d);
}
