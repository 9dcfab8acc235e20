/* core/zero.c: an optimizer's state sharded over the ranks of a data-parallel job (ZeRO stage
 * 1; ts_optim_shard, tessera/dist.h). Each bucket of the job's ts_ddp is cut into one equal
 * shard per rank; ts_ddp_sync reduce-scatters the bucket, so this rank holds the averaged
 * gradients of its shard only; the optimizer steps the pieces of the parameters that fall in
 * its shards (views of the parameters, with their state 1/N of the whole) through an inner
 * optimizer of the same kind; then every bucket's updated shards are all-gathered into the
 * parameters. The arithmetic of an update is elementwise, so a piece steps as its parameter
 * would. The whole state is gathered on one rank only to be saved
 * (ts_optim_consolidate_state), and a loaded one is cut into the pieces again. Host memory
 * under MPI or the backend's device under NCCL alike: the copies are the device's, the
 * collectives the backend's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optim_impl.h"

/* What one round of the parameters' all-gather moves in all, the size of its buffer (plus a
 * 1/N part sent), whatever the buckets' (25 MiB by default): an eighth of the parameters'
 * bytes, from 64 KiB to 1 MiB (small against the state saved, large enough for the wire). */
enum { GATHER_MIN = 64 << 10, GATHER_MAX = 1 << 20 };

typedef struct zparam {
    size_t bucket, off, numel; /* where the parameter lies in its ts_ddp bucket (elements) */
} zparam;

typedef struct zpiece {
    size_t slot;    /* the optimizer's parameter */
    size_t lo, len; /* its elements [lo, lo + len) */
    size_t bucket, at; /* at `at` in this rank's shard of that bucket */
} zpiece;

typedef struct zbucket {
    size_t padded, shard; /* elements: the bucket with its padding, and one rank's share */
    int32_t dtype;
} zbucket;

struct ts__zero {
    ts_ddp *ddp; /* NULL once it is freed */
    ts_optim *in; /* the pieces' optimizer: slot j is piece j */
    zpiece *pc;
    zparam *par; /* by the optimizer's slot */
    zbucket *b;
    size_t nb;
    int rank, world;
    ts_tensor *send, *gather; /* a round's part of one shard and of every rank's (host
                               * memory, zeros at first) */
    size_t chunk; /* bytes of a shard that one round gathers */
    unsigned char *has_state; /* by slot: the parameter's state exists (alike on every rank) */
    int64_t consolidated; /* the step count the whole state in the slots is of; -1: none */
    uint64_t synced_at; /* the ts_ddp's sync count its gradients were last stepped at */
    int stepped;
};

static int nstate_of(const ts_optim *o)
{
    return o->kind == O_SGD ? (o->sgd.momentum != 0) : 2;
}

/* The whole state gathered for a save is dropped: from here on only the pieces hold it. */
static void drop_whole(ts_optim *o)
{
    for (size_t i = 0; i < o->n; i++)
        for (int k = 0; k < 2; k++) {
            ts_tensor_unref(o->slots[i].state[k]);
            o->slots[i].state[k] = NULL;
        }
    if (o->zero)
        o->zero->consolidated = -1;
}

/* The slots' whole state (loaded, or from steps before sharding) cut into the pieces: built
 * aside, so that a failure (out of memory) leaves the pieces and the slots as they were. */
static ts_status take_state(ts_optim *o)
{
    struct ts__zero *z = o->zero;
    const int ns = nstate_of(o);
    const size_t np = z->in->n;
    ts_tensor **fresh = ts__calloc(2 * np + 1, sizeof *fresh);
    if (!fresh)
        return ts__fail(TS_ENOMEM, "sharded optimizer: out of host memory");
    ts_status s = TS_OK;
    for (size_t j = 0; j < np && s == TS_OK; j++) {
        const zpiece *p = &z->pc[j];
        for (int k = 0; k < ns && s == TS_OK && o->slots[p->slot].state[0]; k++) {
            const ts_tensor *whole = o->slots[p->slot].state[k];
            int64_t ne = (int64_t)p->len;
            size_t es = ts_dtype_size(whole->dtype);
            if ((s = ts_tensor_empty(ts_tensor_device(whole), whole->dtype, 1, &ne,
                                     &fresh[2 * j + k])) == TS_OK) {
                ts_tensor_set_role(fresh[2 * j + k], TS_ROLE_OPTIMIZER);
                s = ts_device_copy_device(ts_tensor_device(whole), ts__data(fresh[2 * j + k]),
                                          (const char *)ts__data(whole) + p->lo * es,
                                          p->len * es);
            }
        }
    }
    if (s == TS_OK) {
        for (size_t i = 0; i < o->n; i++)
            z->has_state[i] = ns > 0 && o->slots[i].state[0] != NULL;
        for (size_t j = 0; j < np; j++)
            for (int k = 0; k < 2; k++) {
                ts_tensor_unref(z->in->slots[j].state[k]);
                z->in->slots[j].state[k] = fresh[2 * j + k];
                fresh[2 * j + k] = NULL;
            }
        drop_whole(o);
    }
    for (size_t j = 0; j < 2 * np; j++)
        ts_tensor_unref(fresh[j]);
    free(fresh);
    return s;
}

static void zero_free(struct ts__zero *z)
{
    if (!z)
        return;
    ts_optim_free(z->in);
    ts_tensor_unref(z->send);
    ts_tensor_unref(z->gather);
    free(z->pc);
    free(z->par);
    free(z->b);
    free(z->has_state);
    free(z);
}

void ts__optim_ddp_gone(ts_optim *o)
{
    if (o && o->zero)
        o->zero->ddp = NULL;
}

void ts__zero_free(ts_optim *o)
{
    if (!o->zero)
        return;
    if (o->zero->ddp)
        ts__ddp_unshard(o->zero->ddp);
    zero_free(o->zero);
    o->zero = NULL;
}

TS_API ts_status ts_optim_shard(ts_optim *o, ts_ddp *d)
{
    if (!o || !d)
        return ts__fail(TS_EINVAL, "ts_optim_shard: optimizer or ts_ddp is NULL");
    if (o->zero)
        return ts__fail(TS_ESTATE, "ts_optim_shard: the optimizer is sharded already");
    const int world = ts_dist_size(), rank = ts_dist_rank();
    if (world == 1)
        return TS_OK; /* one rank holds everything: nothing to shard */
    struct ts__zero *z = ts__calloc(1, sizeof *z);
    if (!z || !(z->par = ts__calloc(o->n + 1, sizeof *z->par)) ||
        !(z->has_state = ts__calloc(o->n + 1, 1))) {
        zero_free(z);
        return ts__fail(TS_ENOMEM, "ts_optim_shard: out of host memory");
    }
    z->rank = rank;
    z->world = world;
    z->consolidated = -1;
    ts_status s = TS_OK;
    /* the same parameters: one the optimizer lacks would keep each rank's own gradient */
    for (size_t i = 0; i < ts__ddp_nparams(d) && s == TS_OK; i++) {
        const ts_tensor *t = ts__ddp_param(d, i);
        size_t j = 0;
        while (j < o->n && o->slots[j].param != t)
            j++;
        if (j == o->n)
            s = ts__fail(TS_EINVAL, "ts_optim_shard: the ts_ddp averages a parameter this "
                         "optimizer does not have (its gradient would stay this rank's own): "
                         "give both the same parameters");
    }
    for (size_t i = 0; i < o->n && s == TS_OK; i++) {
        ts_tensor *p = o->slots[i].param;
        for (size_t j = 0; j < i && s == TS_OK; j++)
            if (o->slots[j].param == p)
                s = ts__fail(TS_EINVAL, "ts_optim_shard: '%s' and '%s' are the same tensor",
                             o->slots[j].name, o->slots[i].name);
        if (s == TS_OK && !ts__ddp_locate(d, p, &z->par[i].bucket, &z->par[i].off))
            s = ts__fail(TS_EINVAL, "ts_optim_shard: parameter '%s' is not one of the ts_ddp's "
                         "(give both the same parameters)", o->slots[i].name);
        else if (s == TS_OK && !ts_tensor_is_contiguous(p))
            s = ts__fail(TS_EINVAL, "ts_optim_shard: parameter '%s' is not contiguous",
                         o->slots[i].name);
        z->par[i].numel = (size_t)ts_tensor_numel(p);
    }
    if (s == TS_OK)
        s = ts__ddp_shard(d, o); /* checks the devices; the shards of the gradients */
    if (s) {
        zero_free(z);
        return s;
    }
    z->ddp = d;
    z->synced_at = ts__ddp_syncs(d); /* a step needs a sync after this */
    o->zero = z;
    z->nb = ts__ddp_buckets(d);
    size_t npc = 0, most_shard = 0, total = 0;
    if (!(z->b = ts__calloc(z->nb + 1, sizeof *z->b)))
        s = ts__fail(TS_ENOMEM, "ts_optim_shard: out of host memory");
    ts_tensor **shards = s ? NULL : ts__calloc(z->nb + 1, sizeof *shards);
    if (s == TS_OK && !shards)
        s = ts__fail(TS_ENOMEM, "ts_optim_shard: out of host memory");
    for (size_t k = 0; k < z->nb && s == TS_OK; k++) {
        ts__ddp_bucket(d, k, &z->b[k].padded, &z->b[k].dtype, &shards[k]);
        z->b[k].shard = z->b[k].padded / (size_t)world;
        total += z->b[k].padded * ts_dtype_size(z->b[k].dtype);
        if (z->b[k].shard * ts_dtype_size(z->b[k].dtype) > most_shard)
            most_shard = z->b[k].shard * ts_dtype_size(z->b[k].dtype);
    }
    /* The pieces: each parameter's part of this rank's shard of its bucket, bucket by bucket. */
    if (s == TS_OK && !(z->pc = ts__calloc(o->n + 1, sizeof *z->pc)))
        s = ts__fail(TS_ENOMEM, "ts_optim_shard: out of host memory");
    for (size_t k = 0; k < z->nb && s == TS_OK; k++) {
        const size_t first = (size_t)rank * z->b[k].shard, end = first + z->b[k].shard;
        for (size_t i = 0; i < o->n; i++) {
            const zparam *q = &z->par[i];
            size_t lo = q->off > first ? q->off : first;
            size_t hi = q->off + q->numel < end ? q->off + q->numel : end;
            if (q->bucket == k && lo < hi)
                z->pc[npc++] = (zpiece){i, lo - q->off, hi - lo, k, lo - first};
        }
    }
    /* Their optimizer: the same kind; hyper-parameters, step count and weight decays are the
     * outer optimizer's, copied before each step. */
    if (s == TS_OK && !(z->in = ts__calloc(1, sizeof *z->in)))
        s = ts__fail(TS_ENOMEM, "ts_optim_shard: out of host memory");
    if (s == TS_OK && !(z->in->slots = ts__calloc(npc + 1, sizeof *z->in->slots)))
        s = ts__fail(TS_ENOMEM, "ts_optim_shard: out of host memory");
    if (s == TS_OK) {
        z->in->kind = o->kind;
        z->in->fused = o->fused;
    }
    for (size_t j = 0; j < npc && s == TS_OK; j++) {
        const zpiece *p = &z->pc[j];
        ts_tensor *param = o->slots[p->slot].param, *g = NULL;
        slot *ps = &z->in->slots[z->in->n];
        const int64_t ne = (int64_t)p->len, one = 1;
        snprintf(ps->name, sizeof ps->name, "%.60s[%zu:%zu]", o->slots[p->slot].name, p->lo,
                 p->lo + p->len);
        if ((s = ts__view(param, 1, &ne, &one, param->offset + (int64_t)p->lo, &ps->param)))
            break;
        z->in->n++;
        if ((s = ts__view(shards[p->bucket], 1, &ne, &one,
                          shards[p->bucket]->offset + (int64_t)p->at, &g)) == TS_OK)
            ps->param->grad = g; /* the averaged gradient, written by every ts_ddp_sync */
    }
    free(shards);
    /* A round gathers that much over all ranks (whole elements of float64) */
    size_t round = total / 8 < GATHER_MIN ? GATHER_MIN : total / 8;
    z->chunk = (round < GATHER_MAX ? round : GATHER_MAX) / (size_t)world / 8 * 8;
    if (z->chunk < 8)
        z->chunk = 8;
    if (z->chunk > (most_shard + 7) / 8 * 8)
        z->chunk = (most_shard + 7) / 8 * 8;
    ts_device *dev = o->n ? ts_tensor_device(o->slots[0].param) : NULL;
    const int64_t ns = (int64_t)z->chunk, nb = (int64_t)(z->chunk * (size_t)world);
    if (s == TS_OK && dev && (s = ts_tensor_zeros(dev, TS_U8, 1, &ns, &z->send)) == TS_OK &&
        (s = ts_tensor_zeros(dev, TS_U8, 1, &nb, &z->gather)) == TS_OK) {
        ts_tensor_set_role(z->send, TS_ROLE_OPTIMIZER);
        ts_tensor_set_role(z->gather, TS_ROLE_OPTIMIZER);
    }
    if (s == TS_OK)
        s = take_state(o); /* state from steps taken before, or loaded */
    if (s)
        ts__zero_free(o);
    return s;
}

TS_API int ts_optim_sharded(const ts_optim *o)
{
    return o && o->zero != NULL;
}

/* Every bucket's shards of the updated parameters (which = -1) or of state tensor `which` of
 * the pieces, all-gathered and copied into the parameters, or (on root only) into the slots'
 * whole state tensors. A bucket goes in rounds of `chunk` elements of each shard, so the
 * buffers stay small whatever the bucket's size. */
static ts_status gather(ts_optim *o, int which, int root)
{
    struct ts__zero *z = o->zero;
    char *send = o->n ? ts__data(z->send) : NULL, *all = o->n ? ts__data(z->gather) : NULL;
    ts_device *dev = o->n ? ts_tensor_device(z->send) : NULL;
    const size_t W = (size_t)z->world;
    /* s: the collectives'; err: this rank's own failure (a copy, the root's allocation),
     * after which it still joins every round, so that no other rank waits for it in vain */
    ts_status s = TS_OK, err = TS_OK;
    for (size_t k = 0; k < z->nb && s == TS_OK; k++) {
        const size_t es = ts_dtype_size(z->b[k].dtype), S = z->b[k].shard;
        for (size_t i = 0; i < o->n && !err; i++) { /* the root's whole state, once */
            slot *sl = &o->slots[i];
            if (which < 0 || z->par[i].bucket != k || z->rank != root || !z->has_state[i] ||
                sl->state[which])
                continue;
            if ((err = ts_tensor_empty(ts_tensor_device(sl->param), ts_tensor_dtype(sl->param),
                                       ts_tensor_ndim(sl->param), ts_tensor_shape(sl->param),
                                       &sl->state[which])) == TS_OK)
                ts_tensor_set_role(sl->state[which], TS_ROLE_OPTIMIZER);
        }
        for (size_t c0 = 0; c0 < S && s == TS_OK; c0 += z->chunk / es) {
            const size_t c1 = c0 + z->chunk / es < S ? c0 + z->chunk / es : S, cl = c1 - c0;
            for (size_t j = 0; j < z->in->n && !err; j++) { /* this rank's pieces in [c0, c1) */
                const zpiece *p = &z->pc[j];
                const ts_tensor *src = which < 0 ? z->in->slots[j].param
                                                 : z->in->slots[j].state[which];
                size_t a = p->at > c0 ? p->at : c0;
                size_t b = p->at + p->len < c1 ? p->at + p->len : c1;
                if (p->bucket == k && src && a < b)
                    err = ts_device_copy_device(dev, send + (a - c0) * es,
                                                (const char *)ts__data(src) + (a - p->at) * es,
                                                (b - a) * es);
            }
            /* the copies (and the step before them) done before the collective reads */
            if (!err)
                err = ts_device_synchronize(dev);
            if ((s = ts__dist_allgather_mem(send, all, cl * es)))
                break;
            /* rank r's part: bucket elements [r S + c0, r S + c1), at r cl in `all` */
            for (size_t i = 0; i < o->n && !err; i++) {
                const zparam *q = &z->par[i];
                ts_tensor *dst = which < 0 ? o->slots[i].param : o->slots[i].state[which];
                if (q->bucket != k || !dst ||
                    (which >= 0 && (z->rank != root || !z->has_state[i])))
                    continue;
                for (size_t r = 0; r < W && !err; r++) {
                    size_t a = q->off > r * S + c0 ? q->off : r * S + c0;
                    size_t b = q->off + q->numel < r * S + c1 ? q->off + q->numel : r * S + c1;
                    if (a < b)
                        err = ts_device_copy_device(dev, (char *)ts__data(dst) + (a - q->off) * es,
                                                    all + (r * cl + a - r * S - c0) * es,
                                                    (b - a) * es);
                }
            }
            /* the buffer is overwritten by the next round's copies */
            if (!err)
                err = ts_device_synchronize(dev);
        }
        for (size_t i = 0; i < o->n && which < 0; i++)
            if (z->par[i].bucket == k)
                ts__bump_version(o->slots[i].param);
    }
    return err ? err : s;
}

ts_status ts__zero_step(ts_optim *o)
{
    struct ts__zero *z = o->zero;
    if (!z->ddp)
        return ts__fail(TS_ESTATE, "optimizer step: the ts_ddp this optimizer is sharded over "
                        "was freed, so no gradients reach its shards");
    /* The step all-gathers: gradient sums still queued from a backward would meet it in the
     * middle (a hang), and a step without a new sync would apply spent gradients again. */
    if (ts__ddp_last_sync_failed(z->ddp))
        return ts__fail(TS_ESTATE, "optimizer step: the last ts_ddp_sync failed, so this rank's "
                        "share of the gradients is not averaged and the others may not step: "
                        "see that sync's error");
    if (ts__ddp_pending(z->ddp) || ts__ddp_syncs(z->ddp) == z->synced_at)
        return ts__fail(TS_ESTATE, "optimizer step: a sharded optimizer steps on the gradients "
                        "ts_ddp_sync averaged, and there has been no ts_ddp_sync since %s; call "
                        "ts_backward, ts_ddp_sync, then ts_optim_step",
                        z->stepped ? "its last step" : "it was sharded");
    drop_whole(o);
    if (o->scheduled) {
        double lr = ts_lr_at(&o->sched, o->steps);
        if (o->kind == O_SGD)
            o->sgd.lr = lr;
        else
            o->adam.lr = lr;
    }
    ts_optim *in = z->in;
    in->sgd = o->sgd;
    in->adam = o->adam;
    in->steps = o->steps;
    in->fused = o->fused;
    for (size_t j = 0; j < in->n; j++) {
        in->slots[j].own_decay = o->slots[z->pc[j].slot].own_decay;
        in->slots[j].weight_decay = o->slots[z->pc[j].slot].weight_decay;
    }
    ts_status s = ts_optim_step(in);
    if (s) /* the others wait in the all-gather: this rank's failure ends the job */
        return s;
    o->steps = in->steps;
    z->synced_at = ts__ddp_syncs(z->ddp);
    z->stepped = 1;
    const int ns = nstate_of(o);
    for (size_t i = 0; i < o->n; i++)
        z->has_state[i] = ns > 0;
    ts_no_grad_enter();
    s = gather(o, -1, 0);
    ts_no_grad_exit();
    return s;
}

TS_API ts_status ts_optim_consolidate_state(ts_optim *o, int root)
{
    if (!o)
        return ts__fail(TS_EINVAL, "ts_optim_consolidate_state: optimizer is NULL");
    if (!o->zero)
        return TS_OK; /* the state is whole already */
    struct ts__zero *z = o->zero;
    if (root < 0 || root >= z->world)
        return ts__fail(TS_EINVAL, "ts_optim_consolidate_state: root %d is not a rank of %d",
                        root, z->world);
    drop_whole(o);
    ts_status s = TS_OK;
    for (int k = 0; k < nstate_of(o) && s == TS_OK; k++)
        s = gather(o, k, root);
    if (s) {
        drop_whole(o);
        return s;
    }
    if (z->rank == root) /* only the root holds it, until the next step */
        z->consolidated = o->steps;
    return TS_OK;
}

int ts__zero_saveable(const ts_optim *o)
{
    return !o->zero || o->zero->consolidated == o->steps;
}

ts_status ts__zero_loaded(ts_optim *o)
{
    return o->zero ? take_state(o) : TS_OK;
}

size_t ts__optim_nstep(const ts_optim *o, int *sharded)
{
    *sharded = o->zero != NULL;
    return o->zero ? o->zero->in->n : o->n;
}

ts_tensor *ts__optim_step_tensor(const ts_optim *o, size_t i)
{
    return (o->zero ? o->zero->in : o)->slots[i].param;
}
