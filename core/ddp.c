/* core/ddp.c: gradient averaging for data parallelism (ts_ddp, tessera/dist.h): parameters in
 * buckets whose sums start on a communication thread as soon as their last gradient arrives,
 * over the world of core/dist.c. */
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <tessera/comm.h>
#include <tessera/dist.h>

#include "internal.h"

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
    size_t padded; /* numel rounded up to a multiple of the ranks: shards of padded / size */
    ts_tensor *shard; /* sharded: this rank's shard of the sum (its averaged gradients) */
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
    int deferred; /* ts_ddp_no_sync: backward's gradients are summed at a later backward */
    int sharded;  /* each bucket reduce-scattered into its shard (a sharded optimizer's) */
    int agreed;   /* the ranks compared `sharded` before their first sum */
    int last_failed;  /* the last ts_ddp_sync failed: its gradients are not to be stepped */
    uint64_t good_syncs; /* ts_ddp_sync calls that succeeded */
    int sharding_ranks; /* how many of them shard: 0 or all, or every sum fails */
    struct ts_optim *zero_opt; /* that optimizer, told when this ts_ddp goes */
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
    /* One rank sharding alone would reduce-scatter where the others all-reduce (a hang):
     * before their first sum the ranks count the sharding ones, and if some shard and some
     * do not, every rank's sums fail alike (no collective meets a different one). */
    if (!d->agreed) {
        float n = d->sharded ? 1.0f : 0.0f;
        ts_status s = ts_dist_allreduce_sum(&n, 1, TS_F32);
        if (s)
            return s;
        d->agreed = 1;
        d->sharding_ranks = (int)n;
    }
    if (d->sharding_ranks != 0 && d->sharding_ranks != ts_dist_size())
        return ts__fail(TS_ESTATE, "ts_ddp_sync: %d of the %d ranks sharded their optimizer "
                        "over this ts_ddp (ts_optim_shard) and the others did not; call "
                        "ts_optim_shard on every rank or on none, before the first backward",
                        d->sharding_ranks, ts_dist_size());
    if (d->sharded) /* the bucket's padding is zeros */
        return ts__dist_reduce_scatter_mem(b->buf, ts__data(b->shard),
                                           b->padded / (size_t)ts_dist_size(), b->dtype);
    if (!d->devmode)
        return ts_dist_allreduce_sum(b->buf, b->numel, b->dtype);
    ts_status s = ts__dist_allreduce_in_place(b->buf, b->numel, b->dtype);
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
    ts_status s = d->devmode ? ts_device_synchronize(ts_dist_device()) : TS_OK;
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
    if (d->deferred) /* a micro-batch before the last: its gradient stays in .grad */
        return TS_OK;
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
    int views = dev && (ts_dist_device() ? dev == ts_dist_device() : ts__device_is_host_memory(dev));
    for (size_t i = 0; i < n && views; i++)
        views = d->p[i].t && d->p[i].t->storage->dev == dev;
    d->devmode = views && ts_dist_device();
    d->st.in_place = views;
    d->st.on_device = d->devmode;
    const size_t world = (size_t)ts_dist_size();
    for (size_t k = 0; k < d->nb && s == TS_OK; k++) {
        bucket *b = &d->b[k];
        b->remaining = b->nparams;
        /* room for equal shards (zeros past the gradients); the all-reduce sums numel */
        b->padded = (b->numel + world - 1) / world * world;
        if (views) {
            int64_t ne = (int64_t)b->padded;
            if ((s = ts_tensor_zeros(dev, b->dtype, 1, &ne, &b->bt)) == TS_OK) {
                ts_tensor_set_role(b->bt, TS_ROLE_GRADIENT); /* the gradients are its views */
                b->buf = (char *)b->bt->storage->data +
                         b->bt->offset * (int64_t)ts_dtype_size(b->dtype);
            }
        } else if (!(b->buf = calloc(b->padded * ts_dtype_size(b->dtype) + 1, 1))) {
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
    if (s == TS_OK && ts_dist_size() > 1) {
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
    if (ts_dist_size() == 1)
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
            s = ts_device_synchronize(ts_dist_device());
        for (size_t k = 0; k < d->nb; k++) { /* every rank joins every sum */
            ts_status r = bucket_sum(d, &d->b[k]);
            s = s ? s : r;
        }
        d->restage = 0;
    }
    /* Bucket by bucket as the sums finish (the communication thread goes on with the next):
     * the average, written into each parameter's .grad in one pass. */
    const double inv = 1.0 / (double)ts_dist_size();
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
        if (d->sharded) { /* this rank's shard averaged; the rest is the optimizer's peers' */
            if (s == TS_OK)
                s = ts_mul_scalar_(b->shard, inv);
            continue;
        }
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
    d->good_syncs += s == TS_OK;
    d->last_failed = s != TS_OK;
    return s;
}

TS_API void ts_ddp_no_sync(ts_ddp *d, int on)
{
    if (d)
        d->deferred = on != 0;
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
    if (d->zero_opt)
        ts__optim_ddp_gone(d->zero_opt);
    for (size_t k = 0; d->b && k < d->nb; k++) {
        ts_tensor_unref(d->b[k].shard);
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

/* ---- for the sharded optimizer (core/zero.c) ---------------------------------------------- */

ts_status ts__ddp_shard(ts_ddp *d, struct ts_optim *opt)
{
    if (d->zero_opt)
        return ts__fail(TS_ESTATE, "ts_optim_shard: this ts_ddp shards another optimizer's "
                        "state already (one sharded optimizer per ts_ddp)");
    if (d->agreed) /* the ranks compared sharding once, before the first sum */
        return ts__fail(TS_ESTATE, "ts_optim_shard: this ts_ddp has summed gradients already; "
                        "shard before the first backward, on every rank alike (or make a new "
                        "ts_ddp)");
    if (ts_dist_size() > 1 && !d->st.in_place)
        return ts__fail(TS_EINVAL, "ts_optim_shard: the parameters must all live on one "
                        "device whose memory the comm backend takes: a host-memory device "
                        "(cpu_blas, cpu_onednn) under a host-buffer backend (mpi), or the "
                        "backend's own device under a device-buffer one (nccl); here they are "
                        "on several devices or on another: keep the optimizer unsharded");
    if (ts_dist_size() > 1 && !ts__dist_device_reduce_scatter())
        return ts__fail(TS_EPLUGIN, "ts_optim_shard: the comm backend '%s' has no "
                        "reduce-scatter (communication ABI 1.2): keep the optimizer unsharded",
                        ts_dist_backend());
    const size_t world = (size_t)ts_dist_size();
    ts_status s = TS_OK;
    for (size_t k = 0; k < d->nb && s == TS_OK; k++) {
        bucket *b = &d->b[k];
        if (b->shard)
            continue;
        int64_t ne = (int64_t)(b->padded / world);
        if ((s = ts_tensor_zeros(d->p[d->order[b->first]].t->storage->dev, b->dtype, 1, &ne,
                                 &b->shard)) == TS_OK)
            ts_tensor_set_role(b->shard, TS_ROLE_GRADIENT);
    }
    if (s == TS_OK) {
        d->sharded = world > 1;
        d->zero_opt = opt;
    }
    return s;
}

void ts__ddp_unshard(ts_ddp *d)
{
    d->sharded = 0;
    d->zero_opt = NULL;
}

size_t ts__ddp_buckets(const ts_ddp *d)
{
    return d->nb;
}

void ts__ddp_bucket(const ts_ddp *d, size_t k, size_t *padded, int32_t *dtype,
                    ts_tensor **shard)
{
    *padded = d->b[k].padded;
    *dtype = d->b[k].dtype;
    *shard = d->b[k].shard;
}

int ts__ddp_locate(const ts_ddp *d, const ts_tensor *t, size_t *bk, size_t *off)
{
    for (size_t i = 0; i < d->n; i++)
        if (d->p[i].t == t) {
            *bk = d->p[i].bucket;
            *off = d->p[i].off;
            return 1;
        }
    return 0;
}

size_t ts__ddp_nparams(const ts_ddp *d)
{
    return d->n;
}

const ts_tensor *ts__ddp_param(const ts_ddp *d, size_t i)
{
    return d->p[i].t;
}

uint64_t ts__ddp_syncs(const ts_ddp *d)
{
    return d->good_syncs;
}

int ts__ddp_last_sync_failed(const ts_ddp *d)
{
    return d->last_failed;
}

int ts__ddp_pending(ts_ddp *d)
{
    int pending = 0;
    pthread_mutex_lock(&d->mu);
    for (size_t k = 0; k < d->nb && !pending; k++)
        pending = d->b[k].state != B_IDLE;
    pthread_mutex_unlock(&d->mu);
    return pending;
}
