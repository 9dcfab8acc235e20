/* tests/dist/dist-check.c: run by tests/cli/test-dist.sh under `mpirun -np 2` (and alone, as a
 * world of one). Not forked per test like the TAP programs: an MPI rank joins its job once.
 * Every rank runs every check; rank 0 prints TAP lines; a check fails if it fails on any rank
 * (the ranks' verdicts are summed), and the exit status says so on every rank.
 *
 *   dist-check collectives   rank and size, sums of float32/float64/int64, broadcast,
 *                            allgather, reduce-scatter, barrier, broadcast of a module's
 *                            weights
 *   dist-check ddp           gradients averaged by ts_ddp over ranks, each rank holding its
 *                            shard of a global batch, against the full batch's gradient
 *                            computed in the same process (float64: the two differ only in
 *                            summation order), and buckets reduced while backward ran
 *   dist-check steps         30 SGD and 30 Adam steps data-parallel against the same steps on
 *                            the full batch in one process: the losses agree (float64)
 *   dist-check mismatch      rank 1 builds another model: broadcast_module refuses on every
 *                            rank with a message naming both ranks
 *   dist-check zero DIR      the sharded optimizer (ts_optim_shard): SGD with momentum and
 *                            AdamW sharded equal unsharded over 30 steps, the optimizer's bytes
 *                            per rank 1/N plus one bucket, checkpoints (written in DIR) of
 *                            either kind resumed by the other
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tessera/tessera.h>

static int ntest, nfailed, rank_, size_;

/* One check: ok on this rank; the verdict is the sum over ranks. */
static void check(int ok, const char *what, const char *detail)
{
    int64_t bad = !ok;
    if (ts_dist_allreduce_sum(&bad, 1, TS_I64) != TS_OK) {
        fprintf(stderr, "rank %d: the verdict's sum failed: %s\n", rank_, ts_last_error());
        exit(3);
    }
    ntest++;
    if (bad)
        nfailed++;
    if (!ok)
        fprintf(stderr, "rank %d: %s: %s\n", rank_, what, detail ? detail : "");
    if (rank_ == 0)
        printf("%s %d - %s%s\n", bad ? "not ok" : "ok", ntest, what,
               bad ? " (failed on some rank, see stderr)" : "");
    fflush(stdout);
}

#define OK(expr)                                                                            \
    do {                                                                                    \
        ts_status s_ = (expr);                                                              \
        if (s_ != TS_OK) {                                                                  \
            fprintf(stderr, "rank %d: %s:%d: %s: %s\n", rank_, __FILE__, __LINE__, #expr,   \
                    ts_last_error());                                                       \
            ts_dist_abort(2, "dist-check: %s failed", #expr);                               \
        }                                                                                   \
    } while (0)

static void collectives(void)
{
    char d[256];
    snprintf(d, sizeof d, "rank %d of %d on '%s'", rank_, size_, ts_dist_backend());
    check(rank_ >= 0 && rank_ < size_ && size_ >= 1, "rank and size", d);
    if (rank_ == 0 && ts_dist_device())
        printf("# '%s' takes device buffers of '%s'\n", ts_dist_backend(),
               ts_device_name(ts_dist_device()));
    float f[3] = {1.5f * (float)(rank_ + 1), -2.0f, 0.25f};
    double g[2] = {0x1p-996 * (rank_ + 1), (double)rank_}; /* tiny, and exact in any order */
    int64_t k[2] = {(int64_t)1 << 40, rank_};
    OK(ts_dist_allreduce_sum(f, 3, TS_F32));
    OK(ts_dist_allreduce_sum(g, 2, TS_F64));
    OK(ts_dist_allreduce_sum(k, 2, TS_I64));
    double n = size_, tri = n * (n + 1) / 2;
    check(f[0] == (float)(1.5 * tri) && f[1] == (float)(-2.0 * n) && f[2] == (float)(0.25 * n),
          "float32 sum", NULL);
    check(g[0] == 0x1p-996 * tri && g[1] == tri - n, "float64 sum", NULL);
    check(k[0] == ((int64_t)1 << 40) * size_ && k[1] == (int64_t)(tri - n), "int64 sum", NULL);
    char msg[32] = {0};
    if (rank_ == size_ - 1)
        snprintf(msg, sizeof msg, "from the last rank");
    OK(ts_dist_broadcast(msg, sizeof msg, size_ - 1));
    check(!strcmp(msg, "from the last rank"), "broadcast from the last rank", msg);
    int32_t mine = 100 + rank_, all[64];
    OK(ts_dist_allgather(&mine, all, sizeof mine));
    int good = 1;
    for (int r = 0; r < size_; r++)
        good &= all[r] == 100 + r;
    check(good, "allgather in rank order", NULL);
    /* reduce-scatter: rank q sends chunk r = {q 1000 + r 10 + i}; rank r gets their sums */
    enum { RS = 5 };
    double *rs_send = malloc(sizeof(double) * RS * (size_t)size_), rs[RS];
    for (int r = 0; r < size_; r++)
        for (int i = 0; i < RS; i++)
            rs_send[r * RS + i] = rank_ * 1000.0 + r * 10.0 + i;
    OK(ts_dist_reduce_scatter_sum(rs_send, rs, RS, TS_F64));
    good = 1;
    for (int i = 0; i < RS; i++)
        good &= rs[i] == 1000.0 * (tri - n) + n * (rank_ * 10.0 + i);
    check(good, "reduce-scatter: this rank's chunk of the sum", NULL);
    /* a longer sum (the hierarchical all-reduce's shards and the tail past the last whole
     * one): exact in float64 */
    enum { LONG = 1001 };
    double *lg = malloc(sizeof(double) * LONG);
    for (int i = 0; i < LONG; i++)
        lg[i] = (rank_ + 1) * 1000.0 + i;
    OK(ts_dist_allreduce_sum(lg, LONG, TS_F64));
    good = 1;
    for (int i = 0; i < LONG; i++)
        good &= lg[i] == 1000.0 * tri + n * i;
    free(lg);
    check(good, "a sum of 1001 float64 (shards and a tail)", NULL);
    const char *want_h = getenv("DIST_CHECK_HIERARCHY"); /* "NODESxPER" or "flat" */
    if (want_h) {
        int nodes = 0, per = 0, on = ts_dist_hierarchy(&nodes, &per);
        char got[32];
        snprintf(got, sizeof got, on ? "%dx%d" : "flat", nodes, per);
        check(!strcmp(got, want_h), "the all-reduce's hierarchy is as configured", got);
        if (rank_ == 0)
            printf("# all-reduce: %s\n", got);
    }
    check(ts_dist_reduce_scatter_sum(rs_send, rs_send + 1, RS, TS_F64) == TS_EINVAL,
          "reduce-scatter refuses overlapping buffers", ts_last_error());
    free(rs_send);
    OK(ts_dist_barrier());
    check(ts_dist_broadcast(msg, 1, size_) == TS_EINVAL, "a broadcast root past the ranks is "
          "refused", ts_last_error());
    /* a module: every rank seeds differently, rank 0's weights win */
    ts_rng rng;
    ts_rng_init(&rng, 1000 + (uint64_t)rank_);
    ts_weight_init init = {TS_INIT_NORMAL, 1.0, &rng};
    ts_module *lin;
    OK(ts_nn_linear(NULL, 5, 3, 1, &init, &lin));
    ts_named_tensor p[2];
    ts_module_parameters(lin, p, 2);
    OK(ts_dist_broadcast_module(lin, 0));
    float w[15], w0[15];
    OK(ts_tensor_to_host(p[0].tensor, w, sizeof w));
    memcpy(w0, w, sizeof w);
    OK(ts_dist_broadcast(w0, sizeof w0, 0));
    check(!memcmp(w, w0, sizeof w), "broadcast_module: every rank holds rank 0's weights", NULL);
    ts_module_free(lin);
}

/* The test model: a wide first layer (its weight gradient is the last and largest GEMM of
 * backward, so the later layers' buckets are reduced while it runs), then three more. */
static int64_t IN = 256; /* input features: ddp makes it wide */

static ts_module *model(ts_rng *rng, int32_t dtype)
{
    ts_module *seq, *m;
    ts_weight_init init = {TS_INIT_KAIMING_UNIFORM, 0, rng};
    OK(ts_nn_sequential(&seq));
    const int64_t w[] = {IN, IN == 256 ? 512 : 1024, 64, 32, 10};
    for (int i = 0; i < 4; i++) {
        char name[8];
        snprintf(name, sizeof name, "fc%d", i);
        OK(ts_nn_linear(NULL, w[i], w[i + 1], 1, &init, &m));
        OK(ts_nn_sequential_add(seq, name, m));
        if (i < 3) {
            snprintf(name, sizeof name, "act%d", i);
            OK(ts_nn_tanh(&m));
            OK(ts_nn_sequential_add(seq, name, m));
        }
    }
    OK(ts_module_to_dtype(seq, dtype));
    return seq;
}

/* A global batch of B rows, the same on every rank; rows [lo, lo + n). */
static void batch(int32_t dtype, int64_t B, int64_t lo, int64_t n, int step, ts_tensor **x,
                  ts_tensor **y)
{
    double *xv = malloc(sizeof *xv * (size_t)(n * IN));
    int64_t *yv = malloc(sizeof *yv * (size_t)n);
    for (int64_t r = 0; r < n; r++) {
        for (int j = 0; j < IN; j++)
            xv[r * IN + j] = sin(0.37 * (double)((lo + r) * IN + j) + 0.1 * step);
        yv[r] = (lo + r + step) % 10;
    }
    ts_tensor *x64;
    OK(ts_tensor_from_host(NULL, TS_F64, 2, (const int64_t[]){n, IN}, xv, &x64));
    OK(ts_cast(x64, dtype, x));
    OK(ts_tensor_from_host(NULL, TS_I64, 1, &n, yv, y));
    ts_tensor_unref(x64);
    free(xv);
    free(yv);
    (void)B;
}

/* Mean cross-entropy of model on rows [lo, lo + n) of the global batch, scaled by n / B so
 * that the shards' average over ranks is the global mean when every shard has B / size rows. */
static ts_tensor *loss_on(ts_module *m, int64_t B, int64_t lo, int64_t n, int step)
{
    ts_tensor *x, *y, *logits, *loss;
    batch(TS_F64, B, lo, n, step, &x, &y);
    OK(ts_module_forward(m, x, &logits));
    OK(ts_cross_entropy(logits, y, TS_REDUCTION_MEAN, &loss));
    ts_tensor_unref(x), ts_tensor_unref(y), ts_tensor_unref(logits);
    return loss;
}

static void ddp_grads(void)
{
    /* a wide first layer (1024 x 1024) at 32 rows a rank: its weight gradient, the last GEMM
     * of backward, takes milliseconds, while the other buckets' sums take microseconds */
    IN = 1024;
    const int64_t B = 32 * size_, n = B / size_, lo = rank_ * n;
    ts_rng rng;
    ts_rng_init(&rng, 5);
    ts_module *dp = model(&rng, TS_F64), *ref = model(&rng, TS_F64);
    OK(ts_dist_broadcast_module(dp, 0));
    size_t np = ts_module_parameters(dp, NULL, 0);
    ts_named_tensor *p = calloc(np, sizeof *p), *q = calloc(np, sizeof *q);
    ts_module_parameters(dp, p, np);
    ts_module_parameters(ref, q, np);
    ts_no_grad_enter(); /* the reference starts from the same weights */
    for (size_t i = 0; i < np; i++)
        OK(ts_copy_(q[i].tensor, p[i].tensor));
    ts_no_grad_exit();
    ts_ddp *ddp;
    OK(ts_ddp_new(p, np, 64 << 10, &ddp)); /* 64 KiB buckets: several per step */
    double worst = 0;
    for (int step = 0; step < 3; step++) {
        ts_tensor *l = loss_on(dp, B, lo, n, step), *lr = loss_on(ref, B, 0, B, step);
        OK(ts_backward(l, NULL, 0));
        OK(ts_ddp_sync(ddp));
        OK(ts_backward(lr, NULL, 0));
        for (size_t i = 0; i < np; i++) {
            int64_t ne = ts_tensor_numel(p[i].tensor);
            double *a = malloc(sizeof *a * (size_t)ne), *b = malloc(sizeof *b * (size_t)ne);
            OK(ts_tensor_to_host(ts_tensor_grad(p[i].tensor), a, sizeof *a * (size_t)ne));
            OK(ts_tensor_to_host(ts_tensor_grad(q[i].tensor), b, sizeof *b * (size_t)ne));
            double scale = 0;
            for (int64_t j = 0; j < ne; j++)
                scale = fmax(scale, fabs(b[j]));
            for (int64_t j = 0; j < ne; j++) /* summation order only: 1e-12 of the largest */
                worst = fmax(worst, fabs(a[j] - b[j]) / (scale > 0 ? scale : 1));
            free(a), free(b);
            ts_tensor_zero_grad(p[i].tensor);
            ts_tensor_zero_grad(q[i].tensor);
        }
        ts_tensor_unref(l), ts_tensor_unref(lr);
    }
    char d[200];
    snprintf(d, sizeof d, "worst difference %.3g of the largest gradient", worst);
    check(worst < 1e-12, "ddp: averaged shard gradients equal the global batch's", d);
    ts_ddp_stats st;
    ts_ddp_get_stats(ddp, &st);
    /* A bucket finishing before ts_ddp_sync is a matter of timing: on a loaded machine the
     * communication thread may get no core while the last GEMM runs. More steps until one
     * does (at most 40), every rank running as many (the verdict is summed). */
    uint64_t started3 = st.started_early;
    int extra = 0;
    for (; size_ > 1 && extra < 40; extra++) {
        int64_t done = st.finished_early >= 1; /* ranks that saw one */
        OK(ts_dist_allreduce_sum(&done, 1, TS_I64));
        if (done == size_)
            break;
        for (size_t i = 0; i < np; i++)
            ts_tensor_zero_grad(p[i].tensor);
        ts_tensor *l = loss_on(dp, B, lo, n, 3 + extra);
        OK(ts_backward(l, NULL, 0));
        OK(ts_ddp_sync(ddp));
        ts_tensor_unref(l);
        ts_ddp_get_stats(ddp, &st);
    }
    snprintf(d, sizeof d, "%llu buckets per step, %llu started before ts_ddp_sync in 3 steps; "
             "%llu finished before it in %d steps", (unsigned long long)st.nbuckets,
             (unsigned long long)started3, (unsigned long long)st.finished_early, 3 + extra);
    if (rank_ == 0)
        printf("# %s\n", d);
    /* DIST_CHECK_OVERSUBSCRIBED (more ranks than cores): the communication thread may never
     * get a core while backward runs, so only the early starts are required */
    int crowded = getenv("DIST_CHECK_OVERSUBSCRIBED") != NULL;
    check(size_ == 1 || (st.nbuckets >= 3 && st.buckets == (uint64_t)(3 + extra) * st.nbuckets &&
                         started3 >= 3 * (st.nbuckets - 1) &&
                         (crowded || st.finished_early >= 1)),
          "ddp: buckets reduced while backward ran", d);
    /* Two backwards before a sync: with gradients as views of the buckets the second adds
     * into memory being summed, so the sync refuses (as PyTorch's DDP does), never returning
     * a wrong average; the next step is clean again. */
    if (size_ > 1 && st.in_place) {
        for (size_t i = 0; i < np; i++)
            ts_tensor_zero_grad(p[i].tensor);
        ts_tensor *l1 = loss_on(dp, B, lo, n, 7), *l2 = loss_on(dp, B, lo, n, 8);
        OK(ts_backward(l1, NULL, 0));
        OK(ts_backward(l2, NULL, 0));
        ts_status s2 = ts_ddp_sync(ddp);
        snprintf(d, sizeof d, "%s: %s", ts_status_name(s2), ts_last_error());
        check(s2 == TS_ESTATE && strstr(ts_last_error(), "second backward"),
              "ddp: a second backward before the sync is refused, not averaged wrong", d);
        for (size_t i = 0; i < np; i++)
            ts_tensor_zero_grad(p[i].tensor);
        ts_tensor_unref(l1), ts_tensor_unref(l2);
        ts_tensor *l3 = loss_on(dp, B, lo, n, 9);
        OK(ts_backward(l3, NULL, 0));
        check(ts_ddp_sync(ddp) == TS_OK, "ddp: the next step syncs again", ts_last_error());
        ts_tensor_unref(l3);
    }
    if (ts_dist_device()) { /* a device-buffer backend: the sums ran in its device memory */
        snprintf(d, sizeof d, "in_place %d, on_device %d", st.in_place, st.on_device);
        check(st.in_place && st.on_device && ts_tensor_device(p[0].tensor) == ts_dist_device(),
              "ddp: buckets summed in place in the backend's device memory", d);
    }
    ts_ddp_free(ddp);
    free(p), free(q);
    ts_module_free(dp), ts_module_free(ref);
}

static void steps(void)
{
    /* one global batch for 1, 2, 3, 4 or 6 ranks: the same losses whatever the world */
    const int64_t B = 12, n = B / size_, lo = rank_ * n;
    if (B % size_) {
        check(0, "steps: 12 rows split evenly over the ranks", "run on 1, 2, 3, 4 or 6 ranks");
        return;
    }
    for (int opt = 0; opt < 2; opt++) {
        ts_rng rng;
        ts_rng_init(&rng, 9 + (uint64_t)rank_); /* differs by rank: the broadcast fixes it */
        ts_module *dp = model(&rng, TS_F64), *ref = model(&rng, TS_F64);
        OK(ts_dist_broadcast_module(dp, 0));
        size_t np = ts_module_parameters(dp, NULL, 0);
        ts_named_tensor *p = calloc(np, sizeof *p), *q = calloc(np, sizeof *q);
        ts_module_parameters(dp, p, np);
        ts_module_parameters(ref, q, np);
        ts_no_grad_enter();
        for (size_t i = 0; i < np; i++)
            OK(ts_copy_(q[i].tensor, p[i].tensor));
        ts_no_grad_exit();
        ts_optim *o1, *o2;
        if (opt == 0) {
            ts_sgd_options so = {0.01, 0.5, 0, 1e-4, 0};
            OK(ts_optim_sgd(p, np, &so, &o1));
            OK(ts_optim_sgd(q, np, &so, &o2));
        } else {
            ts_adam_options ao = {1e-3, 0.9, 0.999, 1e-8, 0.01};
            OK(ts_optim_adamw(p, np, &ao, &o1));
            OK(ts_optim_adamw(q, np, &ao, &o2));
        }
        ts_ddp *ddp;
        OK(ts_ddp_new(p, np, 0, &ddp));
        double worst = 0, first = 0, last = 0;
        for (int step = 0; step < 30; step++) {
            ts_tensor *l = loss_on(dp, B, lo, n, step), *lr = loss_on(ref, B, 0, B, step);
            OK(ts_backward(l, NULL, 0));
            OK(ts_ddp_sync(ddp));
            OK(ts_optim_step(o1));
            ts_optim_zero_grad(o1);
            OK(ts_backward(lr, NULL, 0));
            OK(ts_optim_step(o2));
            ts_optim_zero_grad(o2);
            double a, b;
            OK(ts_tensor_to_host(l, &a, sizeof a));
            OK(ts_tensor_to_host(lr, &b, sizeof b));
            OK(ts_dist_allreduce_sum(&a, 1, TS_F64)); /* the global mean of the shards' */
            a /= size_;
            worst = fmax(worst, fabs(a - b) / fabs(b));
            if (step == 0)
                first = b;
            last = b;
            ts_tensor_unref(l), ts_tensor_unref(lr);
        }
        char d[160];
        snprintf(d, sizeof d, "%s: loss %.6f -> %.6f, worst relative difference %.3g",
                 opt ? "adamw" : "sgd", first, last, worst);
        if (rank_ == 0)
            printf("# %s\n", d);
        check(worst < 1e-10 && last < first, opt ? "30 AdamW steps data-parallel equal one "
              "process on the global batch" : "30 SGD steps data-parallel equal one process "
              "on the global batch", d);
        ts_ddp_free(ddp);
        ts_optim_free(o1), ts_optim_free(o2);
        free(p), free(q);
        ts_module_free(dp), ts_module_free(ref);
    }
}

/* One data-parallel run for the sharded-optimizer checks: the model of seed 9 (or a
 * checkpoint's), SGD with momentum or AdamW (decay groups, a cosine schedule), gradients
 * clipped to norm 1 through ts_optim_clip_grad_norm, 64 KiB buckets (a parameter larger than
 * a bucket gets its own; shards cut parameters), steps [from, to) of a global batch of 12.
 * losses[step]: the global batch's loss; save_at > 0: model and optimizer written to `save`
 * after that step (rank 0, after consolidating); *w (malloc'd): the weights at the end;
 * *state_bytes: the device's optimizer-role bytes at the end. */
typedef struct zrun {
    int adamw, shard, from, to, save_at;
    const char *resume, *save;
    double losses[30];
    double *w;
    size_t nw;
    uint64_t state_bytes;
    int on_device; /* the buckets were summed in the backend's device memory */
} zrun;

/* The model of seed 9 (IN 256) and its parameters (*p malloc'd, *np of them). */
static ts_module *seed9_model(ts_named_tensor **p, size_t *np)
{
    IN = 256;
    ts_rng rng;
    ts_rng_init(&rng, 9);
    ts_module *m = model(&rng, TS_F64);
    *np = ts_module_parameters(m, NULL, 0);
    *p = calloc(*np, sizeof **p);
    ts_module_parameters(m, *p, *np);
    return m;
}

static void zero_run(zrun *r)
{
    const int64_t B = 12, n = B / size_, lo = rank_ * n;
    size_t np;
    ts_named_tensor *p;
    ts_module *m = seed9_model(&p, &np);
    ts_optim *o;
    if (!r->adamw) {
        ts_sgd_options so = {0.01, 0.5, 0, 1e-4, 0};
        OK(ts_optim_sgd(p, np, &so, &o));
    } else {
        ts_adam_options ao = {1e-3, 0.9, 0.95, 1e-8, 0.1};
        OK(ts_optim_adamw(p, np, &ao, &o));
        ts_optim_decay_matrices_only(o);
        ts_lr_schedule sch = {TS_LR_COSINE, 1e-3, 3, 0, 0, 30, 1e-4};
        OK(ts_optim_set_schedule(o, &sch));
    }
    ts_ddp *ddp;
    OK(ts_ddp_new(p, np, 64 << 10, &ddp));
    ts_checkpoint *ck = NULL;
    if (r->resume) {
        OK(ts_checkpoint_load(r->resume, NULL, &ck));
        OK(ts_module_load(m, "model.", ck));
    }
    /* resumed SGD loads before sharding (the state cut at ts_optim_shard), AdamW after (cut
     * at the load) */
    if (ck && !r->adamw)
        OK(ts_optim_load_state(o, ck));
    if (r->shard)
        OK(ts_optim_shard(o, ddp));
    if (ck && r->adamw)
        OK(ts_optim_load_state(o, ck));
    ts_checkpoint_free(ck);
    for (int step = r->from; step < r->to; step++) {
        ts_tensor *l = loss_on(m, B, lo, n, step);
        OK(ts_backward(l, NULL, 0));
        OK(ts_ddp_sync(ddp));
        OK(ts_optim_clip_grad_norm(o, 1.0, NULL));
        OK(ts_optim_step(o));
        ts_optim_zero_grad(o);
        double a;
        OK(ts_tensor_to_host(l, &a, sizeof a));
        OK(ts_dist_allreduce_sum(&a, 1, TS_F64));
        r->losses[step] = a / size_;
        ts_tensor_unref(l);
        if (step + 1 == r->save_at) {
            OK(ts_optim_consolidate_state(o, 0));
            if (rank_ == 0) {
                OK(ts_checkpoint_new(&ck));
                OK(ts_module_save(m, "model.", ck));
                OK(ts_optim_save_state(o, ck));
                OK(ts_checkpoint_save(ck, r->save));
                ts_checkpoint_free(ck);
            }
            OK(ts_dist_barrier());
        }
    }
    uint64_t roles[TS_ROLE_COUNT];
    ts_device_memory_by_role(ts_tensor_device(p[0].tensor), roles);
    r->state_bytes = roles[TS_ROLE_OPTIMIZER];
    r->nw = 0;
    for (size_t i = 0; i < np; i++)
        r->nw += (size_t)ts_tensor_numel(p[i].tensor);
    r->w = malloc(sizeof *r->w * r->nw);
    for (size_t i = 0, at = 0; i < np; i++) {
        size_t ne = (size_t)ts_tensor_numel(p[i].tensor);
        OK(ts_tensor_to_host(p[i].tensor, r->w + at, ne * sizeof *r->w));
        at += ne;
    }
    ts_ddp_stats st;
    ts_ddp_get_stats(ddp, &st);
    r->on_device = st.on_device;
    ts_ddp_free(ddp);
    ts_optim_free(o);
    free(p);
    ts_module_free(m);
}

/* Largest difference of two weight vectors, relative to the largest weight. */
static double weights_apart(const zrun *a, const zrun *b)
{
    double worst = 0, scale = 0;
    for (size_t i = 0; i < a->nw; i++)
        scale = fmax(scale, fabs(a->w[i]));
    for (size_t i = 0; i < a->nw && i < b->nw; i++)
        worst = fmax(worst, fabs(a->w[i] - b->w[i]) / scale);
    return a->nw == b->nw ? worst : INFINITY;
}

static double losses_apart(const zrun *a, const zrun *b, int from, int to)
{
    double worst = 0;
    for (int i = from; i < to; i++)
        worst = fmax(worst, fabs(a->losses[i] - b->losses[i]) / fabs(b->losses[i]));
    return worst;
}

static void zero(const char *dir)
{
    if (12 % size_) {
        check(0, "zero: 12 rows split evenly over the ranks", "run on 1, 2, 3, 4 or 6 ranks");
        return;
    }
    char ck_plain[512], ck_shard[512], d[400];
    snprintf(ck_plain, sizeof ck_plain, "%s/zero-plain.safetensors", dir);
    snprintf(ck_shard, sizeof ck_shard, "%s/zero-shard.safetensors", dir);
    for (int adamw = 0; adamw < 2; adamw++) {
        const char *name = adamw ? "AdamW" : "SGD with momentum";
        /* float64 throughout: the runs differ in summation order only (the reduce-scatter
         * against the all-reduce, the norm summed by shard) */
        const double tol = 1e-11;
        zrun plain = {.adamw = adamw, .to = 30, .save_at = 15, .save = ck_plain},
             shard = {.adamw = adamw, .shard = 1, .to = 30, .save_at = 15, .save = ck_shard};
        zero_run(&plain);
        zero_run(&shard);
        double dl = losses_apart(&shard, &plain, 0, 30), dw = weights_apart(&shard, &plain);
        snprintf(d, sizeof d, "%s: loss %.6f -> %.6f; sharded vs not: losses %.3g, weights %.3g "
                 "apart", name, plain.losses[0], plain.losses[29], dl, dw);
        if (rank_ == 0)
            printf("# %s\n", d);
        if (ts_dist_device()) /* a device-buffer backend: the sharded path in its memory */
            check(shard.on_device && plain.on_device,
                  "zero: under a device-buffer backend the shards live in its device memory",
                  ts_device_name(ts_dist_device()));
        check(dl < tol && dw < tol && plain.losses[29] < plain.losses[0],
              adamw ? "zero: 30 sharded AdamW steps equal the unsharded ones"
                    : "zero: 30 sharded SGD steps equal the unsharded ones", d);
        /* 1/N of the state, plus the all-gather's buffers: an eighth of the parameters'
         * bytes within [64 KiB, 1 MiB], and 1/N of that (docs/distributed.md) */
        const double share = (double)plain.state_bytes / size_,
                     bucket = fmax(64 << 10, fmin(1 << 20, (double)plain.nw * 8 / 8 + 64));
        snprintf(d, sizeof d, "%s: optimizer bytes per rank %llu sharded, %llu not (1/%d of it "
                 "%.0f, buffers at most %.0f)", name, (unsigned long long)shard.state_bytes,
                 (unsigned long long)plain.state_bytes, size_, share, bucket * (1 + 1.0 / size_));
        if (rank_ == 0)
            printf("# %s\n", d);
        check(size_ == 1 ? shard.state_bytes == plain.state_bytes
                         : shard.state_bytes <= share + bucket * (1 + 1.0 / size_) + 64 &&
                               shard.state_bytes >= share &&
                               shard.state_bytes < plain.state_bytes,
              "zero: the optimizer's bytes per rank are 1/N, plus the all-gather's buffers", d);
        /* the checkpoints are interchangeable: each resumed the other way from step 15 */
        zrun from_plain = {.adamw = adamw, .shard = 1, .from = 15, .to = 30, .resume = ck_plain},
             from_shard = {.adamw = adamw, .from = 15, .to = 30, .resume = ck_shard};
        zero_run(&from_plain);
        zero_run(&from_shard);
        double d1 = losses_apart(&from_plain, &plain, 15, 30), w1 = weights_apart(&from_plain, &plain);
        double d2 = losses_apart(&from_shard, &shard, 15, 30), w2 = weights_apart(&from_shard, &shard);
        snprintf(d, sizeof d, "%s: unsharded checkpoint resumed sharded: losses %.3g, weights "
                 "%.3g apart; sharded resumed unsharded: %.3g, %.3g", name, d1, w1, d2, w2);
        if (rank_ == 0)
            printf("# %s\n", d);
        check(d1 < tol && w1 < tol && d2 < tol && w2 < tol,
              adamw ? "zero: AdamW checkpoints of sharded and unsharded runs are interchangeable"
                    : "zero: SGD checkpoints of sharded and unsharded runs are interchangeable",
              d);
        free(plain.w), free(shard.w), free(from_plain.w), free(from_shard.w);
    }
    /* misuse: a sharded state saved without consolidating; parameters the ts_ddp lacks */
    if (size_ > 1) {
        size_t np;
        ts_named_tensor *p;
        ts_module *m = seed9_model(&p, &np);
        ts_optim *o;
        ts_ddp *ddp, *part;
        ts_adam_options ao = TS_ADAMW_DEFAULTS;
        OK(ts_optim_adamw(p, np, &ao, &o));
        OK(ts_ddp_new(p, np - 1, 0, &part));
        ts_status s1 = ts_optim_shard(o, part);
        snprintf(d, sizeof d, "%s: %s", ts_status_name(s1), ts_last_error());
        check(s1 == TS_EINVAL && strstr(ts_last_error(), "fc3.bias") && !ts_optim_sharded(o),
              "zero: sharding over a ts_ddp without every parameter is refused, naming it", d);
        ts_ddp_free(part);
        ts_optim *fewer; /* the reverse: the ts_ddp averages one the optimizer lacks */
        OK(ts_optim_adamw(p, np - 1, &ao, &fewer));
        OK(ts_ddp_new(p, np, 0, &ddp));
        ts_status s0 = ts_optim_shard(fewer, ddp);
        snprintf(d, sizeof d, "%s: %s", ts_status_name(s0), ts_last_error());
        check(s0 == TS_EINVAL && strstr(ts_last_error(), "does not have") &&
                  !ts_optim_sharded(fewer),
              "zero: sharding over a ts_ddp with a parameter the optimizer lacks is refused", d);
        ts_optim_free(fewer);
        ts_ddp_free(ddp);
        OK(ts_ddp_new(p, np, 0, &ddp));
        OK(ts_optim_shard(o, ddp));
        ts_checkpoint *ck;
        OK(ts_checkpoint_new(&ck));
        ts_status s2 = ts_optim_save_state(o, ck);
        snprintf(d, sizeof d, "%s: %s", ts_status_name(s2), ts_last_error());
        check(s2 == TS_ESTATE && strstr(ts_last_error(), "ts_optim_consolidate_state"),
              "zero: saving a sharded state unconsolidated is refused, saying what to call", d);
        ts_checkpoint_free(ck);
        /* a backward without ts_ddp_sync: its sums are queued, the step would all-gather
         * into them (a hang); refused on every rank instead */
        ts_tensor *l = loss_on(m, 12, rank_ * (12 / size_), 12 / size_, 0);
        OK(ts_backward(l, NULL, 0));
        ts_status s4 = ts_optim_step(o);
        snprintf(d, sizeof d, "%s: %s", ts_status_name(s4), ts_last_error());
        int refused = s4 == TS_ESTATE && strstr(ts_last_error(), "no ts_ddp_sync") != NULL;
        /* the queued sums collected before any other collective (check's own sum) */
        OK(ts_ddp_sync(ddp));
        check(refused, "zero: a step without ts_ddp_sync is refused, not a hang", d);
        OK(ts_optim_step(o)); /* after the sync: fine, once */
        ts_status s5 = ts_optim_step(o);
        check(s5 == TS_ESTATE, "zero: a second step on the same sync is refused",
              ts_last_error());
        ts_optim_zero_grad(o);
        ts_tensor_unref(l);
        ts_ddp_free(ddp); /* freed first: the next step fails, no crash */
        ts_status s3 = ts_optim_step(o);
        snprintf(d, sizeof d, "%s: %s", ts_status_name(s3), ts_last_error());
        check(s3 == TS_ESTATE && strstr(ts_last_error(), "was freed"),
              "zero: a step after its ts_ddp is freed fails cleanly", d);
        ts_optim_free(o);
        /* only rank 0 shards: it would reduce-scatter where the others all-reduce (a hang);
         * the ranks compare before their first sum and every sync fails instead */
        OK(ts_optim_adamw(p, np, &ao, &o));
        OK(ts_ddp_new(p, np, 0, &ddp));
        if (rank_ == 0)
            OK(ts_optim_shard(o, ddp));
        l = loss_on(m, 12, rank_ * (12 / size_), 12 / size_, 0);
        OK(ts_backward(l, NULL, 0));
        ts_status s6 = ts_ddp_sync(ddp);
        snprintf(d, sizeof d, "%s: %s", ts_status_name(s6), ts_last_error());
        check(s6 == TS_ESTATE && strstr(ts_last_error(), "ts_optim_shard"),
              "zero: one rank sharding alone: every rank's sync fails naming ts_optim_shard, "
              "no hang", d);
        /* the sharded rank's step after that failed sync must not all-gather (a hang) */
        ts_status s7 = ts_optim_step(o);
        snprintf(d, sizeof d, "%s: %s", ts_status_name(s7), ts_last_error());
        check(rank_ != 0 || (s7 == TS_ESTATE && strstr(ts_last_error(), "failed")),
              "zero: after that failed sync the sharded rank's step is refused, no hang", d);
        ts_optim_zero_grad(o);
        ts_tensor_unref(l);
        ts_ddp_free(ddp);
        ts_optim_free(o);
        /* sharding after the ts_ddp has summed (one rank alone could not be caught later):
         * refused; the job goes on unsharded */
        OK(ts_optim_adamw(p, np, &ao, &o));
        OK(ts_ddp_new(p, np, 0, &ddp));
        l = loss_on(m, 12, rank_ * (12 / size_), 12 / size_, 0);
        OK(ts_backward(l, NULL, 0));
        OK(ts_ddp_sync(ddp));
        OK(ts_optim_step(o));
        ts_optim_zero_grad(o);
        ts_tensor_unref(l);
        ts_status s8 = rank_ == 0 ? ts_optim_shard(o, ddp) : TS_ESTATE;
        snprintf(d, sizeof d, "%s: %s", ts_status_name(s8), ts_last_error());
        int late = s8 == TS_ESTATE && !ts_optim_sharded(o) &&
                   (rank_ != 0 || strstr(ts_last_error(), "before the first backward"));
        l = loss_on(m, 12, rank_ * (12 / size_), 12 / size_, 0);
        OK(ts_backward(l, NULL, 0));
        ts_status s9 = ts_ddp_sync(ddp);
        check(late && s9 == TS_OK,
              "zero: sharding after the first sum is refused and the job goes on unsharded", d);
        ts_optim_zero_grad(o);
        ts_tensor_unref(l);
        ts_ddp_free(ddp);
        ts_optim_free(o);
        free(p);
        ts_module_free(m);
    }
}

static void mismatch(void)
{
    ts_rng rng;
    ts_rng_init(&rng, 1);
    ts_weight_init init = {TS_INIT_NORMAL, 1.0, &rng};
    ts_module *lin;
    OK(ts_nn_linear(NULL, 5, rank_ == 1 ? 4 : 3, 1, &init, &lin));
    ts_status s = ts_dist_broadcast_module(lin, 0);
    const char *e = ts_last_error();
    check(size_ == 1 ? s == TS_OK
                     : s == TS_ESHAPE && strstr(e, "rank 1's model differs from rank 0's"),
          "a rank with another model is refused on every rank", e);
    ts_module_free(lin);
}

int main(int argc, char **argv)
{
    if (argc < 2 || (argc != 2 && strcmp(argv[1], "zero")) || (!strcmp(argv[1], "zero") && argc != 3)) {
        fprintf(stderr, "usage: dist-check collectives|ddp|steps|mismatch|zero DIR\n");
        return 2;
    }
    if (ts_init(NULL) != TS_OK || ts_dist_init(NULL) != TS_OK) {
        fprintf(stderr, "dist-check: %s\n", ts_last_error());
        return 1;
    }
    rank_ = ts_dist_rank();
    size_ = ts_dist_size();
    if (!strcmp(argv[1], "collectives"))
        collectives();
    else if (!strcmp(argv[1], "ddp"))
        ddp_grads();
    else if (!strcmp(argv[1], "steps"))
        steps();
    else if (!strcmp(argv[1], "mismatch"))
        mismatch();
    else if (!strcmp(argv[1], "zero"))
        zero(argv[2]);
    else
        return 2;
    if (rank_ == 0)
        printf("1..%d\n", ntest);
    ts_dist_shutdown();
    ts_shutdown();
    return nfailed ? 1 : 0;
}
