/* tools/bench_train.c: `tessera bench train`: the steady-state training step (forward,
 * cross-entropy, backward, optimizer step, zero_grad) of a configurable model on the in-memory
 * Fashion-MNIST training set, timed step by step after a warm-up, with its pool and host
 * allocations per step; and, in the same run, the floor: the step's GEMMs (convolutions as
 * the GEMMs of an im2col formulation, forward and both backward) called directly through
 * cblas_sgemm on preallocated buffers. */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <errno.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>


#include "cli.h"

static const char usage[] =
    "usage: tessera bench train [--model mlp|lenet5|cnn] [--hidden N,...] [--channels N,...]\n"
    "                           [--init KIND] [--optimizer sgd|adam|adamw] [--lr X]\n"
    "                           [--batch-size B] [--steps N] [--warmup N] [--device D|all]\n"
    "                           [--data DIR] [--synthetic] [--graph] [--profile] [--contend N]\n"
    "                           [--precision LIST] [--json]\n"
    "       tessera bench train --model gpt [--context T] [--layers L] [--heads H] [--embd C]\n"
    "                           [--batch-size B] [--steps N] [--warmup N] [--device D|all]\n"
    "                           [--graph] [--profile] [--contend N]\n"
    "                           [--precision LIST] [--attention MODE] [--json]\n"
    "\n"
    "Times --steps training steps (default 50) after --warmup steps (default 5) at batch\n"
    "--batch-size (default 100) on consecutive batches of the Fashion-MNIST training set held\n"
    "on the device (random data of the same shape with --synthetic or when the data set is\n"
    "not installed; the output says which). Model options as for `tessera train` (default\n"
    "lenet5, adam, lr 1e-3). Reports per device: ms per step (median, p10-p90), images/s, pool\n"
    "and raw pool allocations per step, host mallocs per step made by tessera's own code (and\n"
    "by everything, OpenBLAS and OpenMP included), threads created per step (by any library;\n"
    "a steady step creates none), and the floor: the step's GEMMs (im2col\n"
    "GEMMs for convolutions) through cblas_sgemm with the device's thread count, and the ratio\n"
    "step / floor; then the device floor: the same GEMMs through the device's own matmul in\n"
    "the dtype the precision's matmuls run in (float32; bfloat16 for bf16, float16 for fp16),\n"
    "each GEMM once per pass as a step runs them, the median of as many passes as steps:\n"
    "what the step's matmuls alone cost there (the composed attention's GEMMs included, as in\n"
    "the floor), and, between precisions, how far apart their matmuls are; not measured, with\n"
    "a warning, where its operands do not fit the device's pool.\n"
    "--device all: every cpu_* plugin on the plugin search path. --profile: also\n"
    "the time per step in each kernel (op, function, dtype), the most first, and the time\n"
    "outside kernels (the core's own work: autograd, shape checks, the pool).\n"
    "--graph: each batch is copied into fixed input tensors, and the forward and backward are\n"
    "recorded once after the warm-up (ts_graph_capture_begin; a CUDA graph on cuda) and\n"
    "replayed every step, the optimizer step running as before; devices that cannot record\n"
    "are reported as such.\n"
    "\n"
    "--model gpt: the step of `tessera train --model gpt` (AdamW betas 0.9, 0.95, weight decay\n"
    "0.1 on the blocks' matrices, clipping at norm 1; default context 128, 4 layers, 4 heads,\n"
    "embd 128, batch 16) on random byte windows; tokens/s instead of images/s. Its floor: the\n"
    "linear layers' GEMMs over batch x context rows, the attention's (Q K^T, P V and their four\n"
    "backward GEMMs, one cblas_sgemm per batch and head) and the tied head's.\n"
    "--attention auto|fused|composed: how the attention runs (ts_attention_fused): the fused\n"
    "kernel where it pays (auto, the default), wherever the device has it, or from matmul\n"
    "and softmax.\n"
    "\n"
    "--contend N: after the timed steps, N busy processes (each spinning on one core) start\n"
    "beside the benchmark, and the same number of steps is timed again with them running:\n"
    "the median under contention and its ratio to the median without (a CPU plugin's\n"
    "adaptive_threads setting gives up the cores they take).\n"
    "\n"
    "--precision LIST: any of fp32 (default), bf16 and fp16, comma-separated: each device's\n"
    "step in each, side by side (bf16, fp16: mixed precision as `tessera train --precision`\n"
    "runs it: float32 master weights and optimizer state, the forward under autocast; fp16\n"
    "with loss scaling), with the steps' own peak pool memory (step MiB: the peak over the\n"
    "timed steps less what was in use before them).\n";

/* The q-quantile of sorted v[0..n) (nearest rank). */
static double quantile(const double *v, int n, double q)
{
    int i = (int)floor(q * (n - 1) + 0.5);
    return v[i < 0 ? 0 : i >= n ? n - 1 : i];
}

/* ---- the floor: the step's GEMMs ------------------------------------------------------ */

/* C (M, N) = op(A) op(B), row-major, op = transpose when ta / tb. */
/* count: as many GEMMs of this shape on consecutive operands (attention's batch x heads). */
typedef struct gemm {
    int ta, tb;
    int64_t m, n, k, count;
    float *a, *b, *c;
} gemm;

enum { GPT_MAX_LAYERS = 16 };

typedef struct floor_plan {
    gemm g[18 * GPT_MAX_LAYERS + 3 + 3 * (2 * CLI_MAX_LAYERS + 4)];
    int n;     /* entries of g */
    int calls; /* cblas_sgemm calls per step */
    double flops; /* per step */
} floor_plan;

static void add_gemms(floor_plan *f, int ta, int tb, int64_t m, int64_t n, int64_t k,
                      int64_t count)
{
    f->g[f->n++] = (gemm){ta, tb, m, n, k, count, NULL, NULL, NULL};
    f->calls += (int)count;
    f->flops += 2.0 * (double)m * (double)n * (double)k * (double)count;
}

static void add_gemm(floor_plan *f, int ta, int tb, int64_t m, int64_t n, int64_t k)
{
    add_gemms(f, ta, tb, m, n, k, 1);
}

/* A linear layer in -> out at batch B: forward X W^T, dW = dY^T X, dX = dY W (not for the
 * first layer, whose input needs no gradient). */
static void add_linear(floor_plan *f, int64_t B, int64_t in, int64_t out, int first)
{
    add_gemm(f, 0, 1, B, out, in);
    add_gemm(f, 1, 0, out, in, B);
    if (!first)
        add_gemm(f, 0, 0, B, in, out);
}

/* A convolution as one im2col GEMM over the whole batch: W (K, C*R*S) times the columns
 * (C*R*S, B*P*Q); backward dW = dY cols^T and dcols = W^T dY (not for the first layer). */
static void add_conv(floor_plan *f, int64_t B, int64_t C, int64_t K, int64_t RS, int64_t PQ,
                     int first)
{
    add_gemm(f, 0, 0, K, B * PQ, C * RS);
    add_gemm(f, 0, 1, K, C * RS, B * PQ);
    if (!first)
        add_gemm(f, 1, 0, C * RS, B * PQ, K);
}

/* The GPT's GEMMs at batch B: per block the four linear layers over B*T rows (qkv, the
 * attention's output projection, the MLP's two) and, per batch and head, the attention's
 * S = Q K^T and Y = P V with their backward dP = dY V^T, dV = P^T dY, dQ = dS K and
 * dK = dS^T Q; then the head tied to wte (its input gradient too). Every input needs its
 * gradient (the embeddings train), so no layer is "first". */
static void floor_plan_gpt(const ts_gpt_config *c, int64_t B, floor_plan *f)
{
    memset(f, 0, sizeof *f);
    const int64_t N = B * c->context, T = c->context, C = c->embd, hd = c->embd / c->heads,
                  bh = B * c->heads;
    for (int64_t l = 0; l < c->layers; l++) {
        add_linear(f, N, C, 3 * C, 0);
        add_gemms(f, 0, 1, T, T, hd, bh);  /* S = Q K^T */
        add_gemms(f, 0, 0, T, hd, T, bh);  /* Y = P V */
        add_gemms(f, 0, 1, T, T, hd, bh);  /* dP = dY V^T */
        add_gemms(f, 1, 0, T, hd, T, bh);  /* dV = P^T dY */
        add_gemms(f, 0, 0, T, hd, T, bh);  /* dQ = dS K */
        add_gemms(f, 1, 0, T, hd, T, bh);  /* dK = dS^T Q */
        add_linear(f, N, C, C, 0);
        add_linear(f, N, C, 4 * C, 0);
        add_linear(f, N, 4 * C, C, 0);
    }
    add_linear(f, N, C, c->vocab, 0);
}

static void floor_plan_make(const cli_model *m, int64_t B, floor_plan *f)
{
    memset(f, 0, sizeof *f);
    int64_t feat = 784;
    int first = 1;
    if (!strcmp(m->name, "lenet5")) {
        add_conv(f, B, 1, 6, 25, 28 * 28, 1);  /* 5x5 pad 2: 28x28 -> 28x28, pool 14 */
        add_conv(f, B, 6, 16, 25, 10 * 10, 0); /* 5x5: 14x14 -> 10x10, pool 5 */
        add_linear(f, B, 400, 120, 0);
        add_linear(f, B, 120, 84, 0);
        add_linear(f, B, 84, 10, 0);
        return;
    }
    int64_t ch = 1, hw = 28;
    for (int i = 0; i < m->nchannels; i++) {
        add_conv(f, B, ch, m->channels[i], 9, hw * hw, first);
        first = 0;
        ch = m->channels[i];
        hw /= 2;
    }
    feat = ch * hw * hw;
    for (int i = 0; i <= m->nhidden; i++) {
        int64_t o = i < m->nhidden ? m->hidden[i] : 10;
        add_linear(f, B, feat, o, first);
        first = 0;
        feat = o;
    }
}

static void floor_free(floor_plan *f)
{
    for (int i = 0; i < f->n; i++)
        free(f->g[i].a), free(f->g[i].b), free(f->g[i].c);
}

static float *rand_buf(int64_t n, uint64_t *state)
{
    float *p = aligned_alloc(64, (size_t)((n * 4 + 63) / 64 * 64));
    for (int64_t i = 0; p && i < n; i++) {
        *state = *state * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = (float)((*state >> 40) & 0xffff) / 65536.0f - 0.5f;
    }
    return p;
}

static int floor_alloc(floor_plan *f)
{
    uint64_t st = 1;
    for (int i = 0; i < f->n; i++) {
        gemm *g = &f->g[i];
        g->a = rand_buf(g->m * g->k * g->count, &st);
        g->b = rand_buf(g->k * g->n * g->count, &st);
        g->c = rand_buf(g->m * g->n * g->count, &st);
        if (!g->a || !g->b || !g->c)
            return -1;
    }
    return 0;
}

/* The floor: every GEMM of the step through the benchmark module's OpenBLAS, on threads
 * threads (the first call sets them). */
static void floor_run(const floor_plan *f, int threads)
{
    for (int i = 0; i < f->n; i++) {
        const gemm *g = &f->g[i];
        for (int64_t j = 0; j < g->count; j++)
            cli_sgemm(g->ta, g->tb, (int)g->m, (int)g->n, (int)g->k, g->a + j * g->m * g->k,
                      g->ta ? (int)g->m : (int)g->k, g->b + j * g->k * g->n,
                      g->tb ? (int)g->k : (int)g->n, g->c + j * g->m * g->n, (int)g->n,
                      i == 0 && j == 0 ? threads : 0);
    }
}

enum { BLOCK = 20 };        /* timed steps, then as many timed floors, per block */
#define SETTLE_S 0.25       /* untimed runs before each block, seconds */

/* The device floor: the same GEMMs through the device's own matmul in the dtype a
 * precision's matmuls run in (each shape's count as one batched product, a transposed
 * operand as a transposed view), so that each precision's row can say what its matmuls
 * alone cost there, and two precisions' rows how far apart their matmuls are. */
typedef struct dev_floor {
    ts_tensor **t; /* a, b, c per GEMM; a and b may be transposed views */
    int n;
} dev_floor;

static void dev_floor_free(dev_floor *d)
{
    for (int i = 0; d->t && i < 3 * d->n; i++)
        ts_tensor_unref(d->t[i]);
    free(d->t);
    *d = (dev_floor){0};
}

/* A (count, rows, cols) operand (2-D when count is 1) of random values in dt, transposed as
 * a view when tr (so that it reads as (cols, rows)). */
static ts_status dev_operand(ts_device *dev, int32_t dt, int64_t count, int64_t rows,
                             int64_t cols, int tr, ts_rng *rng, ts_tensor **out)
{
    int nd = count > 1 ? 3 : 2;
    int64_t shape[3] = {count, tr ? cols : rows, tr ? rows : cols};
    ts_tensor *f = NULL, *t = NULL;
    ts_status s = ts_tensor_randn(dev, TS_F32, nd, shape + 3 - nd, 0, 1, rng, &f);
    if (s == TS_OK && dt != TS_F32)
        s = ts_cast(f, dt, &t);
    else if (s == TS_OK)
        t = ts_tensor_ref(f);
    ts_tensor_unref(f);
    if (s == TS_OK && tr) {
        s = ts_tensor_transpose(t, nd - 2, nd - 1, out);
        ts_tensor_unref(t);
        return s;
    }
    *out = s == TS_OK ? t : NULL;
    return s;
}

static ts_status dev_floor_make(const floor_plan *f, ts_device *dev, int32_t dt, dev_floor *d)
{
    *d = (dev_floor){0};
    if (!(d->t = calloc((size_t)(3 * f->n), sizeof *d->t)))
        return TS_ENOMEM;
    d->n = f->n;
    ts_rng rng;
    ts_rng_init(&rng, 3);
    ts_status s = TS_OK;
    for (int i = 0; i < f->n && s == TS_OK; i++) {
        const gemm *g = &f->g[i];
        int nd = g->count > 1 ? 3 : 2;
        int64_t cs[3] = {g->count, g->m, g->n};
        if ((s = dev_operand(dev, dt, g->count, g->m, g->k, g->ta, &rng, &d->t[3 * i])) ||
            (s = dev_operand(dev, dt, g->count, g->k, g->n, g->tb, &rng, &d->t[3 * i + 1])))
            break;
        s = ts_tensor_empty(dev, dt, nd, cs + 3 - nd, &d->t[3 * i + 2]);
    }
    if (s)
        dev_floor_free(d);
    return s;
}

static ts_status dev_floor_run(const dev_floor *d, ts_device *dev)
{
    ts_status s = TS_OK;
    for (int i = 0; i < d->n && s == TS_OK; i++)
        s = ts_matmul_out(d->t[3 * i], d->t[3 * i + 1], d->t[3 * i + 2]);
    return s ? s : ts_device_synchronize(dev);
}

/* Median ms of n passes over the floor's GEMMs on dev in dt, after SETTLE_S of untimed ones;
 * times has room for n. */
static ts_status dev_floor_time(const floor_plan *f, ts_device *dev, int32_t dt, double *times,
                                int n, double *ms)
{
    dev_floor d;
    ts_status s = dev_floor_make(f, dev, dt, &d);
    double t0 = cli_now();
    while (s == TS_OK && cli_now() - t0 < SETTLE_S)
        s = dev_floor_run(&d, dev);
    for (int i = 0; i < n && s == TS_OK; i++) {
        double t = cli_now();
        s = dev_floor_run(&d, dev);
        times[i] = (cli_now() - t) * 1e3;
    }
    dev_floor_free(&d);
    if (s)
        return s;
    qsort(times, (size_t)n, sizeof *times, cli_cmp_double);
    *ms = times[n / 2];
    return TS_OK;
}

/* ---- one device ---------------------------------------------------------------------- */

typedef struct bench_opts {
    cli_model arch;
    int gpt;             /* --model gpt: gcfg, not arch */
    ts_gpt_config gcfg;
    const char *optimizer, *data, *device;
    double lr;
    int64_t batch, steps, warmup;
    int json, synthetic, profile, graph;
    int64_t contend; /* busy processes beside the second timing (0: none) */
    int32_t prec[3]; /* --precision: each device's step in each, side by side */
    int nprec;
} bench_opts;

enum { PROFILE_MAX = 64 };

typedef struct result {
    const char *device;
    int threads;
    int64_t params;
    double med, p10, p90, min, max; /* ms per step */
    double floor_ms, floor_min;
    double dev_floor_ms;            /* the floor's GEMMs on the device in the matmuls' dtype
                                     * (precision's); <= 0: not measured (dev_floor_why) */
    char dev_floor_why[160];
    double raw_allocs, pool_allocs; /* per step */
    double mallocs, all_mallocs;    /* per step; mallocs < 0: not counted */
    double threads_created;         /* per step (any library); < 0: not counted */
    ts_profile_entry prof[PROFILE_MAX]; /* with --profile: over the prof_steps timed steps */
    size_t nprof;
    double prof_steps, mean; /* mean: ms per timed step */
    double contended;        /* --contend: the median ms per step with the busy processes */
    int32_t precision;       /* the trainer's: TS_F32 or TS_BF16 (mixed precision) */
    uint64_t peak, step_peak; /* pool bytes in use at most over the timed steps; and that less
                               * what was in use before them (the steps' own) */
} result;

static int device_threads(ts_device *dev)
{
    size_t n = 0;
    const ts_setting *st = ts_device_settings(dev, &n);
    for (size_t i = 0; st && i < n; i++)
        if (!strcmp(st[i].name, "threads") && st[i].v.i > 0)
            return (int)st[i].v.i;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    return ncpu > 0 ? (int)ncpu : 1;
}

/* The training set on dev, or random data of its shape. *synthetic says which. */
static ts_status load_data(const bench_opts *o, ts_device *dev, ts_tensor **x, ts_tensor **y,
                           int *synthetic)
{
    *synthetic = o->synthetic;
    if (!o->synthetic && ts_fashion_mnist_load(o->data, 1, dev, x, y) == TS_OK)
        return TS_OK;
    if (!o->synthetic && o->data)
        return ts_fashion_mnist_load(o->data, 1, dev, x, y); /* asked for: say why not */
    *synthetic = 1;
    enum { N = 60000 };
    int64_t *labels = malloc(N * sizeof *labels);
    if (!labels)
        return TS_ENOMEM;
    for (int i = 0; i < N; i++)
        labels[i] = (i * 7) % 10;
    ts_rng rng;
    ts_rng_init(&rng, 2);
    ts_status s = ts_tensor_rand(dev, TS_F32, 4, (const int64_t[]){N, 1, 28, 28}, 0, 1, &rng, x);
    if (s == TS_OK)
        s = ts_tensor_from_host(dev, TS_I64, 1, (const int64_t[]){N}, labels, y);
    free(labels);
    return s;
}

/* --model gpt: windows of random bytes (the step's cost does not depend on the text), 64
 * batches of them, targets the next byte. */
static ts_status load_text(const bench_opts *o, ts_device *dev, ts_tensor **x, ts_tensor **y)
{
    const int64_t rows = 64 * o->batch, T = o->gcfg.context, n = rows * T;
    int64_t *v = malloc(sizeof *v * (size_t)(n + 1));
    if (!v)
        return TS_ENOMEM;
    uint64_t r = 7;
    for (int64_t i = 0; i <= n; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        v[i] = (int64_t)(r >> 56);
    }
    ts_status s = ts_tensor_from_host(dev, TS_I64, 2, (const int64_t[]){rows, T}, v, x);
    if (s == TS_OK)
        s = ts_tensor_from_host(dev, TS_I64, 2, (const int64_t[]){rows, T}, v + 1, y);
    free(v);
    return s;
}

typedef struct session {
    ts_module *model;
    ts_optim *opt;
    ts_named_tensor *params;
    size_t np;
    ts_tensor *x, *y;
    int64_t nbatches;
    int gpt;
    ts_trainer *tr; /* tessera train's step */
    /* --graph: fixed inputs, the recording and the loss it writes */
    int use_graph;
    ts_tensor *gx, *gy, *gloss;
    ts_graph *graph;
} session;

/* --graph: the batch copied into the fixed inputs; the forward and backward recorded on the
 * first call and replayed on every call; clipping and the optimizer step run eagerly. */
static ts_status step_graph(session *ss, ts_device *dev, int64_t i, int64_t batch)
{
    ts_tensor *x = NULL, *y = NULL, *logits = NULL;
    int64_t at = (i % ss->nbatches) * batch;
    ts_status s;
    if ((s = ts_tensor_narrow(ss->x, 0, at, batch, &x)) ||
        (s = ts_tensor_narrow(ss->y, 0, at, batch, &y)) ||
        (!ss->gx && ((s = ts_tensor_empty(dev, ts_tensor_dtype(x), ts_tensor_ndim(x),
                                           ts_tensor_shape(x), &ss->gx)) ||
                     (s = ts_tensor_empty(dev, ts_tensor_dtype(y), ts_tensor_ndim(y),
                                          ts_tensor_shape(y), &ss->gy)))) ||
        (s = ts_copy_(ss->gx, x)) || (s = ts_copy_(ss->gy, y)))
        goto out;
    if (!ss->graph) {
        ts_optim_zero_grad(ss->opt); /* the recorded backward writes fresh gradients */
        if ((s = ts_graph_capture_begin(dev)))
            goto out;
        if ((s = ts_module_forward(ss->model, ss->gx, &logits)) == TS_OK &&
            (s = ss->gpt ? ts_gpt_loss(logits, ss->gy, &ss->gloss)
                         : ts_cross_entropy(logits, ss->gy, TS_REDUCTION_MEAN, &ss->gloss)) ==
                TS_OK)
            s = ts_backward(ss->gloss, NULL, 0);
        ts_tensor_unref(logits);
        ts_status e = ts_graph_capture_end(dev, &ss->graph);
        if (s || (s = e))
            goto out;
    }
    if ((s = ts_graph_replay(ss->graph)) == TS_OK &&
        (!ss->gpt || (s = ts_clip_grad_norm(ss->params, ss->np, 1.0, NULL)) == TS_OK) &&
        (s = ts_optim_step(ss->opt)) == TS_OK)
        s = ts_device_synchronize(dev);
out:
    ts_tensor_unref(x), ts_tensor_unref(y);
    return s;
}

static ts_status step(session *ss, ts_device *dev, int64_t i, int64_t batch)
{
    if (ss->use_graph)
        return step_graph(ss, dev, i, batch);
    ts_tensor *x = NULL, *y = NULL;
    int64_t at = (i % ss->nbatches) * batch;
    ts_status s;
    if ((s = ts_tensor_narrow(ss->x, 0, at, batch, &x)) == TS_OK &&
        (s = ts_tensor_narrow(ss->y, 0, at, batch, &y)) == TS_OK &&
        (s = ts_trainer_step(ss->tr, x, y, NULL)) == TS_OK) /* tessera train's step */
        s = ts_device_synchronize(dev);
    ts_tensor_unref(x), ts_tensor_unref(y);
    return s;
}

static ts_status pool_stats(ts_device *dev, ts_memory_stats *st)
{
    memset(st, 0, sizeof *st);
    st->struct_size = sizeof *st;
    return ts_device_memory_stats(dev, st);
}

/* n processes that each spin on a core until killed (and die with this one). 0, or -1 after
 * saying why none could start (those started are killed). */
static int start_busy(pid_t *pids, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        pid_t p = fork();
        if (p == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            for (volatile unsigned long k = 0;; k++)
                ;
        }
        if (p < 0) {
            fprintf(stderr, "tessera: error: bench train: --contend: fork: %s\n", strerror(errno));
            for (int64_t j = 0; j < i; j++)
                kill(pids[j], SIGKILL), waitpid(pids[j], NULL, 0);
            return -1;
        }
        pids[i] = p;
    }
    return 0;
}

static void stop_busy(const pid_t *pids, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        kill(pids[i], SIGKILL);
    for (int64_t i = 0; i < n; i++)
        waitpid(pids[i], NULL, 0);
}

/* --contend: the steps again with o->contend busy processes running, after a second of
 * them (the plugins sample the machine four times a second); their median into *med. */
static ts_status contended_steps(const bench_opts *o, session *ss, ts_device *dev, int64_t *it,
                                 double *times, double *med)
{
    pid_t pids[64];
    if (start_busy(pids, o->contend))
        return TS_EIO;
    ts_status s = TS_OK;
    double t0 = cli_now();
    while (s == TS_OK && cli_now() - t0 < 1.0)
        s = step(ss, dev, (*it)++, o->batch);
    for (int64_t i = 0; i < o->steps && s == TS_OK; i++) {
        double t = cli_now();
        s = step(ss, dev, (*it)++, o->batch);
        times[i] = (cli_now() - t) * 1e3;
    }
    stop_busy(pids, o->contend);
    if (s == TS_OK) {
        qsort(times, (size_t)o->steps, sizeof *times, cli_cmp_double);
        *med = quantile(times, (int)o->steps, 0.5);
    }
    return s;
}

static ts_status bench_device(const bench_opts *o, const char *name, int32_t precision,
                              const floor_plan *fp, double *times, result *r, int *synthetic)
{
    ts_device *dev;
    session ss = {0};
    ts_status s = ts_device_get(name, &dev);
    if (s)
        return s;
    *r = (result){.device = name, .threads = device_threads(dev), .mallocs = -1,
                  .threads_created = -1, .precision = precision};
    ss.gpt = o->gpt;
    ss.use_graph = o->graph;
    if (o->graph && !ts_device_can_capture(dev)) {
        fprintf(stderr, "tessera: error: bench train: --graph: '%s' cannot record graphs\n",
                name);
        s = TS_ENOTSUP;
        goto out;
    }
    if ((s = o->gpt ? load_text(o, dev, &ss.x, &ss.y) : load_data(o, dev, &ss.x, &ss.y, synthetic)))
        goto out;
    ss.nbatches = ts_tensor_size(ss.x, 0) / o->batch;
    if (ss.nbatches < 1) {
        s = TS_EINVAL;
        fprintf(stderr, "tessera: error: bench train: --batch-size %lld is larger than the "
                        "training set (%lld images)\n",
                (long long)o->batch, (long long)ts_tensor_size(ss.x, 0));
        goto out;
    }
    ts_rng rng;
    ts_rng_init(&rng, 1);
    if ((s = o->gpt ? ts_gpt_new(&o->gcfg, dev, &rng, &ss.model)
                    : cli_build_model_spec(&o->arch, dev, &rng, &ss.model)))
        goto out;
    size_t np = ts_module_parameters(ss.model, NULL, 0);
    if (!(ss.params = calloc(np + 1, sizeof *ss.params))) {
        s = TS_ENOMEM;
        goto out;
    }
    ts_module_parameters(ss.model, ss.params, np);
    ss.np = np;
    r->params = ts_module_num_params(ss.model);
    if (o->gpt) { /* as `tessera train --model gpt` trains */
        ts_adam_options ao = {o->lr, 0.9, 0.95, 1e-8, 0.1};
        if ((s = ts_optim_adamw(ss.params, np, &ao, &ss.opt)))
            goto out;
        ts_gpt_decay_groups(ss.opt);
    } else if ((s = cli_make_optim(o->optimizer, o->lr, 0, 0, ss.params, np, &ss.opt))) {
        goto out;
    }
    ts_trainer_options to = {.loss = TS_LOSS_CROSS_ENTROPY, .clip_grad_norm = o->gpt ? 1.0 : 0,
                             .accumulate = 1, .precision = precision};
    if ((s = ts_trainer_new(ss.model, ss.opt, &to, &ss.tr)))
        goto out;
    for (int64_t i = 0; i < o->warmup && s == TS_OK; i++)
        s = step(&ss, dev, i, o->batch);
    if (s)
        goto out;

    /* Steps and floors alternate in blocks of BLOCK, so that load from other processes hits
     * both alike. Each block is timed back to back, as a training loop or a GEMM loop runs,
     * after SETTLE_S of untimed runs of the same thing: the other side's idle threads spin
     * for a while after its last call (OpenBLAS's pthread workers for about 2^28 cycles,
     * libgomp's for GOMP_SPINCOUNT) and would otherwise be timed as part of this side. */
    ts_memory_stats st0, st1;
    uint64_t tm = 0, all = 0, created = 0;
    const char *paths[1] = {ts_device_path(dev)};
    double *ftimes = times + o->steps;
    int64_t it = o->warmup, nrun = 0;
    ts_device_reset_peak(dev);
    pool_stats(dev, &st0);
    int counted = cli_malloc_count_setup(paths, 1), threads_counted = 1;
    if (o->profile)
        ts_profile_reset();
    for (int64_t done = 0; done < o->steps && s == TS_OK;) {
        int64_t nb = o->steps - done < BLOCK ? o->steps - done : BLOCK;
        uint64_t c0 = 0, c1 = 0;
        threads_counted &= cli_thread_count_read(&c0);
        double t0 = cli_now();
        cli_malloc_count_enable(1);
        do {
            s = step(&ss, dev, it++, o->batch);
            nrun++;
        } while (s == TS_OK && cli_now() - t0 < SETTLE_S);
        ts_profile_enable(o->profile);
        for (int64_t i = 0; i < nb && s == TS_OK; i++, nrun++) {
            double t = cli_now();
            s = step(&ss, dev, it++, o->batch);
            times[done + i] = (cli_now() - t) * 1e3;
        }
        ts_profile_enable(0);
        cli_malloc_count_enable(0);
        threads_counted &= cli_thread_count_read(&c1);
        created += c1 - c0; /* the steps' only, not the floor's */
        t0 = cli_now();
        do
            floor_run(fp, r->threads);
        while (cli_now() - t0 < SETTLE_S);
        for (int64_t i = 0; i < nb; i++) {
            double t = cli_now();
            floor_run(fp, r->threads);
            ftimes[done + i] = (cli_now() - t) * 1e3;
        }
        done += nb;
    }
    if (o->profile) { /* the timed steps only */
        size_t nk = ts_profile_read(r->prof, PROFILE_MAX);
        r->nprof = nk < PROFILE_MAX ? nk : PROFILE_MAX;
        r->prof_steps = (double)o->steps;
    }
    cli_malloc_count_read(&tm, &all);
    pool_stats(dev, &st1);
    if (s)
        goto out;
    int ns = (int)o->steps;
    if (counted) { /* over every step since the warm-up, settling ones too */
        r->mallocs = (double)tm / (double)nrun;
        r->all_mallocs = (double)all / (double)nrun;
    }
    if (threads_counted) /* over every step since the warm-up, settling ones too */
        r->threads_created = (double)created / (double)nrun;
    if (st1.valid & TS_STATS_POOL) { /* over every step since the warm-up, settling ones too */
        r->peak = st1.peak_in_use;
        r->step_peak = st1.peak_in_use > st0.in_use ? st1.peak_in_use - st0.in_use : 0;
        r->raw_allocs = (double)(st1.n_raw_alloc - st0.n_raw_alloc) / (double)nrun;
        r->pool_allocs = (double)(st1.n_alloc - st0.n_alloc) / (double)nrun;
    } else {
        r->raw_allocs = r->pool_allocs = -1;
    }
    for (int i = 0; i < ns; i++)
        r->mean += times[i] / ns;
    qsort(times, (size_t)ns, sizeof *times, cli_cmp_double);
    r->med = quantile(times, ns, 0.5);
    r->p10 = quantile(times, ns, 0.1);
    r->p90 = quantile(times, ns, 0.9);
    r->min = times[0];
    r->max = times[ns - 1];
    qsort(ftimes, (size_t)ns, sizeof *ftimes, cli_cmp_double);
    r->floor_ms = quantile(ftimes, ns, 0.5);
    r->floor_min = ftimes[0];
    /* Mixed precision runs its matmuls in the low dtype. A device floor that cannot run (its
     * operands, all made at once, may not fit where the step did) leaves the row without one. */
    if (dev_floor_time(fp, dev, precision, ftimes, ns, &r->dev_floor_ms)) {
        r->dev_floor_ms = 0;
        snprintf(r->dev_floor_why, sizeof r->dev_floor_why, "%s", ts_last_error());
        fprintf(stderr, "tessera: warning: bench train: no device floor on '%s' in %s: %s\n",
                name, ts_dtype_name(precision), r->dev_floor_why);
    }
    if (o->contend > 0) /* the same steps again, beside busy processes */
        s = contended_steps(o, &ss, dev, &it, ftimes, &r->contended);
out:
    ts_graph_free(ss.graph);
    ts_tensor_unref(ss.gloss);
    ts_tensor_unref(ss.gx);
    ts_tensor_unref(ss.gy);
    ts_trainer_free(ss.tr);
    ts_optim_free(ss.opt);
    ts_module_free(ss.model);
    free(ss.params);
    ts_tensor_unref(ss.x);
    ts_tensor_unref(ss.y);
    ts_empty_cache(dev);
    return s;
}

/* ---- the command ------------------------------------------------------------------------ */

static const char *prec_name(int32_t p)
{
    return p == TS_BF16 ? "bf16" : p == TS_F16 ? "fp16" : "fp32";
}


static void print_profile(const result *r)
{
    double total = 0;
    for (size_t j = 0; j < r->nprof; j++)
        total += r->prof[j].seconds * 1e3 / r->prof_steps;
    printf("  %s kernels, per timed step (mean of %.0f):\n  %9s %7s %10s  %s\n", r->device,
           r->prof_steps, "ms/step", "share", "calls/step", "kernel");
    for (size_t j = 0; j < r->nprof; j++) {
        const ts_profile_entry *e = &r->prof[j];
        double ms = e->seconds * 1e3 / r->prof_steps;
        char k[64];
        cli_kernel_name(e, k, sizeof k);
        printf("  %9.3f %6.1f%% %10.1f  %s\n", ms, total > 0 ? 100 * ms / total : 0,
               (double)e->calls / r->prof_steps, k);
    }
    printf("  %9.3f in kernels, of a mean step of %.3f: %.3f outside them (the core's own work:"
           " autograd, checks, the pool)\n", total, r->mean, r->mean - total);
}

typedef struct names {
    char name[16][64];
    int n;
} names;

static void add_cpu_plugin(const char *name, const char *path, void *user)
{
    (void)path;
    names *nm = user;
    if (!strncmp(name, "cpu_", 4) && nm->n < 16)
        snprintf(nm->name[nm->n++], sizeof nm->name[0], "%s", name);
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(a, b);
}

static int parse(int argc, char **argv, bench_opts *o)
{
    const char *not_gpt = NULL, *gpt_only = NULL; /* the first option of each kind given */
    int batch_given = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--model") && v && !strcmp(v, "gpt")) {
            o->gpt = 1;
            i++;
            continue;
        }
        int64_t *g = !strcmp(a, "--context") ? &o->gcfg.context
                     : !strcmp(a, "--layers") ? &o->gcfg.layers
                     : !strcmp(a, "--heads")  ? &o->gcfg.heads
                     : !strcmp(a, "--embd")   ? &o->gcfg.embd
                                              : NULL;
        if (g) {
            if (cli_parse_i64("bench train", a, v, 1, g == &o->gcfg.layers ? GPT_MAX_LAYERS : 4096,
                              g))
                return 2;
            gpt_only = gpt_only ? gpt_only : a;
            i++;
            continue;
        }
        int took = cli_model_option(&o->arch, "bench train", a, v);
        if (took < 0)
            return 2;
        if (took) {
            if (strcmp(a, "--model"))
                not_gpt = not_gpt ? not_gpt : a;
            i++;
            continue;
        }
        if (!strcmp(a, "--json")) {
            o->json = 1;
            continue;
        }
        if (!strcmp(a, "--synthetic")) {
            o->synthetic = 1;
            not_gpt = not_gpt ? not_gpt : a;
            continue;
        }
        if (!strcmp(a, "--profile")) {
            o->profile = 1;
            continue;
        }
        if (!strcmp(a, "--graph")) {
            o->graph = 1;
            continue;
        }
        if (!strcmp(a, "--attention")) { /* the whole process: ts_attention_fused */
            static const char *const modes[] = {"composed", "fused", "auto"};
            int mode = -1;
            for (int k = 0; v && k < 3; k++)
                mode = !strcmp(v, modes[k]) ? k : mode;
            if (mode < 0)
                return cli_usage_error("bench train", "--attention takes auto, fused or composed");
            ts_attention_fused(mode);
            i++;
            continue;
        }
        if (!strcmp(a, "--precision")) {
            if (!v)
                return cli_usage_error("bench train", "--precision needs a value");
            char buf[64];
            snprintf(buf, sizeof buf, "%s", v);
            o->nprec = 0;
            for (char *save = NULL, *t = strtok_r(buf, ",", &save); t;
                 t = strtok_r(NULL, ",", &save)) {
                if (!cli_precision_find(t))
                    return cli_usage_error("bench train", "--precision: '%s' is not fp32, bf16 "
                                           "or fp16", t);
                int32_t p = cli_precision_dtype(t);
                for (int k = 0; k < o->nprec; k++)
                    if (o->prec[k] == p)
                        return cli_usage_error("bench train", "--precision: %s twice", t);
                if (o->nprec == 3)
                    return cli_usage_error("bench train", "--precision: at most fp32,bf16,fp16");
                o->prec[o->nprec++] = p;
            }
            if (!o->nprec)
                return cli_usage_error("bench train", "--precision needs fp32, bf16 or both");
            i++;
            continue;
        }
        if (!strcmp(a, "--contend")) {
            if (!v)
                return cli_usage_error("bench train", "--contend needs a value");
            if (cli_parse_i64("bench train", a, v, 1, 64, &o->contend))
                return 2;
            i++;
            continue;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage, stdout);
            return -1;
        }
        int is_num = !strcmp(a, "--batch-size") || !strcmp(a, "--steps") ||
                     !strcmp(a, "--warmup") || !strcmp(a, "--lr");
        if (!is_num && strcmp(a, "--optimizer") && strcmp(a, "--device") && strcmp(a, "--data"))
            return cli_usage_error("bench train", "unexpected argument '%s'", a);
        if (!v)
            return cli_usage_error("bench train", "%s needs a value", a);
        i++;
        if (!strcmp(a, "--optimizer") || !strcmp(a, "--data"))
            not_gpt = not_gpt ? not_gpt : a;
        batch_given |= !strcmp(a, "--batch-size");
        if (!strcmp(a, "--optimizer")) {
            if (strcmp(v, "sgd") && strcmp(v, "adam") && strcmp(v, "adamw"))
                return cli_usage_error("bench train", "unknown optimizer '%s' (sgd, adam or "
                                       "adamw)", v);
            o->optimizer = v;
        } else if (!strcmp(a, "--device")) {
            o->device = v;
        } else if (!strcmp(a, "--data")) {
            o->data = v;
        } else if (!strcmp(a, "--lr")) {
            if (cli_parse_double("bench train", a, v, 0, 1, 1e6, &o->lr))
                return 2;
        } else {
            int64_t n, lo = !strcmp(a, "--warmup") ? 0 : 1,
                       hi = !strcmp(a, "--batch-size") ? 60000 : 100000;
            if (cli_parse_i64("bench train", a, v, lo, hi, &n))
                return 2;
            *(!strcmp(a, "--batch-size") ? &o->batch : !strcmp(a, "--steps") ? &o->steps
                                                                               : &o->warmup) = n;
        }
    }
    if (o->gpt) {
        if (not_gpt)
            return cli_usage_error("bench train", "%s does not apply to --model gpt (it trains "
                                   "as `tessera train --model gpt` does)", not_gpt);
        if (o->gcfg.embd % o->gcfg.heads)
            return cli_usage_error("bench train", "--embd %lld is not a multiple of --heads %lld",
                                   (long long)o->gcfg.embd, (long long)o->gcfg.heads);
        if (!batch_given)
            o->batch = 16;
        o->optimizer = "adamw";
        return 0;
    }
    if (gpt_only)
        return cli_usage_error("bench train", "%s applies to --model gpt only", gpt_only);
    if (cli_model_check(&o->arch, "bench train"))
        return 2;
    return 0;
}

static void read_loadavg(double out[3])
{
    out[0] = out[1] = out[2] = -1;
    FILE *l = fopen("/proc/loadavg", "r");
    if (l) {
        if (fscanf(l, "%lf %lf %lf", &out[0], &out[1], &out[2]) != 3)
            out[0] = out[1] = out[2] = -1;
        fclose(l);
    }
}

int cli_bench_train(int argc, char **argv, const cli_common *common)
{
    bench_opts o = {.optimizer = "adam", .lr = 1e-3, .batch = 100, .steps = 50, .warmup = 5,
                    .json = common->json, .gcfg = {256, 128, 4, 4, 128, 0, 0},
                    .prec = {TS_F32}, .nprec = 1};
    cli_model_init(&o.arch);
    int rc = parse(argc, argv, &o);
    if (rc)
        return rc < 0 ? 0 : rc;
    if (!cli_have_sgemm()) {
        fprintf(stderr, "tessera: error: bench train: the floor is timed through cblas_sgemm, "
                        "and the benchmark module (tessera-bench.so, with OpenBLAS) is not "
                        "there: build tessera with OpenBLAS installed\n");
        return 1;
    }
    ts_status s = ts_init(common->config);
    if (s)
        return cli_fail(s, "cannot start tessera");
    names nm = {0};
    if (o.device && !strcmp(o.device, "all")) {
        ts_plugin_scan(ts_runtime_config(), add_cpu_plugin, &nm);
        if (!nm.n) {
            fprintf(stderr, "tessera: error: bench train: --device all found no cpu_* plugin "
                            "on the plugin search path (see 'tessera info')\n");
            ts_shutdown();
            return 1;
        }
        qsort(nm.name, (size_t)nm.n, sizeof nm.name[0], cmp_name);
    } else {
        snprintf(nm.name[0], sizeof nm.name[0], "%s",
                 o.device ? o.device : ts_device_name(ts_default_device()));
        nm.n = 1;
    }
    floor_plan fp;
    if (o.gpt)
        floor_plan_gpt(&o.gcfg, o.batch, &fp);
    else
        floor_plan_make(&o.arch, o.batch, &fp);
    double *times = malloc(sizeof *times * 2 * (size_t)o.steps);
    result *res = calloc((size_t)nm.n * (size_t)o.nprec, sizeof *res);
    int nres = 0, synthetic = 0;
    char arch[256];
    if (o.gpt)
        snprintf(arch, sizeof arch, "gpt (context %lld, %lld layers, %lld heads, embd %lld)",
                 (long long)o.gcfg.context, (long long)o.gcfg.layers, (long long)o.gcfg.heads,
                 (long long)o.gcfg.embd);
    else
        cli_model_describe(&o.arch, arch, sizeof arch);
    /* items per step: images, or tokens for the GPT */
    const double items = (double)o.batch * (o.gpt ? (double)o.gcfg.context : 1.0);
    const char *unit = o.gpt ? "tokens" : "images";
    if (!times || !res || floor_alloc(&fp)) {
        fprintf(stderr, "tessera: error: bench train: out of memory\n");
        rc = 1;
        goto out;
    }
    rc = 0;
    for (int d = 0; d < nm.n; d++)
        for (int k = 0; k < o.nprec; k++) {
            int syn = 0;
            if ((s = bench_device(&o, nm.name[d], o.prec[k], &fp, times, &res[nres], &syn))) {
                rc = cli_fail(s, nm.name[d]);
                if (nm.n * o.nprec == 1)
                    goto out;
                continue; /* --device all: the others still run */
            }
            synthetic |= syn;
            nres++;
        }
    if (!nres)
        goto out;
    double load[3];
    read_loadavg(load);
    if (o.json) {
        printf("{\"model\": \"%s\", \"optimizer\": \"%s\", \"lr\": %g, \"batch_size\": %lld, "
               "\"steps\": %lld, \"warmup\": %lld, \"data\": \"%s\", \"floor_gemms\": %d, "
               "\"floor_gflop\": %.6f, \"loadavg\": [%.2f, %.2f, %.2f], \"results\": [",
               arch, o.optimizer, o.lr, (long long)o.batch, (long long)o.steps,
               (long long)o.warmup,
               o.gpt ? "random-bytes" : synthetic ? "synthetic" : "fashion-mnist", fp.calls,
               fp.flops * 1e-9, load[0], load[1], load[2]);
        for (int i = 0; i < nres; i++) {
            const result *r = &res[i];
            printf("%s\n  {\"device\": \"%s\", \"precision\": \"%s\", \"threads\": %d, "
                   "\"parameters\": %lld, \"peak_pool_bytes\": %llu, "
                   "\"step_peak_pool_bytes\": %llu, \"ms_median\": %.4f, "
                   "\"ms_p10\": %.4f, \"ms_p90\": %.4f, \"ms_min\": %.4f, \"ms_max\": %.4f, "
                   "\"%s_per_s\": %.1f, \"floor_ms\": %.4f, \"floor_ms_min\": %.4f, "
                   "\"step_over_floor\": %.3f, \"raw_allocs_per_step\": %.3f, "
                   "\"pool_allocs_per_step\": %.2f, ",
                   i ? "," : "", r->device, prec_name(r->precision), r->threads,
                   (long long)r->params, (unsigned long long)r->peak,
                   (unsigned long long)r->step_peak, r->med, r->p10,
                   r->p90, r->min, r->max, unit, items * 1e3 / r->med, r->floor_ms, r->floor_min,
                   r->floor_ms > 0 ? r->med / r->floor_ms : 0, r->raw_allocs, r->pool_allocs);
            if (r->dev_floor_ms > 0)
                printf("\"device_floor_ms\": %.4f, \"device_floor_dtype\": \"%s\", ",
                       r->dev_floor_ms, ts_dtype_name(r->precision));
            else
                printf("\"device_floor_ms\": null, \"device_floor_dtype\": null, ");
            if (r->mallocs >= 0)
                printf("\"tessera_mallocs_per_step\": %.3f, \"all_mallocs_per_step\": %.3f",
                       r->mallocs, r->all_mallocs);
            else
                printf("\"tessera_mallocs_per_step\": null, \"all_mallocs_per_step\": null");
            if (r->threads_created >= 0)
                printf(", \"threads_created_per_step\": %.3f", r->threads_created);
            else
                printf(", \"threads_created_per_step\": null");
            if (o.contend > 0)
                printf(", \"contend\": %lld, \"ms_median_contended\": %.4f, "
                       "\"contended_slowdown\": %.3f",
                       (long long)o.contend, r->contended, r->contended / r->med);
            if (o.profile) {
                printf(", \"profile\": [");
                for (size_t j = 0; j < r->nprof; j++) {
                    const ts_profile_entry *e = &r->prof[j];
                    char k[64];
                    cli_kernel_name(e, k, sizeof k);
                    printf("%s{\"kernel\": \"%s\", \"calls_per_step\": %.2f, \"ms_per_step\": "
                           "%.4f}", j ? ", " : "", k, (double)e->calls / r->prof_steps,
                           e->seconds * 1e3 / r->prof_steps);
                }
                printf("], \"ms_mean\": %.4f", r->mean);
            }
            printf("}");
        }
        printf("\n]}\n");
    } else {
        printf("tessera bench train: %s (%lld parameters), %s lr %g, batch %lld, median of %lld "
               "steps after %lld warm-up\n  data: %s; floor: %d cblas_sgemm calls, %.3f GFLOP "
               "per step\n",
               arch, (long long)res[0].params, o.optimizer, o.lr, (long long)o.batch, (long long)o.steps,
               (long long)o.warmup,
               o.gpt ? "random byte windows (the step's cost does not depend on the text)"
               : synthetic ? "SYNTHETIC random images of Fashion-MNIST's shape (60000x1x28x28; "
                             "the data set is not installed or --synthetic was given)"
                           : "the Fashion-MNIST training set, in memory",
               fp.calls, fp.flops * 1e-9);
        printf("  %-12s %4s %3s %9s %17s %9s %9s %10s %9s %9s %15s %12s %9s\n", "device", "prec",
               "thr", "ms/step", "p10-p90", o.gpt ? "tokens/s" : "images/s", "floor ms",
               "step/floor", "raw/step", "pool/step", "mallocs/step", "threads/step",
               "step MiB");
        for (int i = 0; i < nres; i++) {
            const result *r = &res[i];
            char m[48], spread[40], th[24];
            if (r->mallocs >= 0)
                snprintf(m, sizeof m, "%.2f (all %.1f)", r->mallocs, r->all_mallocs);
            else
                snprintf(m, sizeof m, "not counted");
            snprintf(spread, sizeof spread, "%.3f-%.3f", r->p10, r->p90);
            if (r->threads_created >= 0)
                snprintf(th, sizeof th, "%.2f", r->threads_created);
            else
                snprintf(th, sizeof th, "not counted");
            printf("  %-12s %4s %3d %9.3f %17s %9.0f %9.3f %9.2fx %9.2f %9.1f %15s %12s %9.2f\n",
                   r->device, prec_name(r->precision), r->threads, r->med, spread,
                   items * 1e3 / r->med, r->floor_ms, r->floor_ms > 0 ? r->med / r->floor_ms : 0,
                   r->raw_allocs, r->pool_allocs, m, th, (double)r->step_peak / 1048576.0);
        }
        for (int i = 1, b = 0; i < nres; i++) { /* a device's precisions against its first */
            if (res[i].device != res[b].device) {
                b = i;
                continue;
            }
            char df[48] = "";
            if (res[b].dev_floor_ms > 0 && res[i].dev_floor_ms > 0)
                snprintf(df, sizeof df, " (the device floor: %.2fx)",
                         res[b].dev_floor_ms / res[i].dev_floor_ms);
            printf("  %s: %s against %s: %.2fx the %s/s%s, %.2fx the step's peak pool memory\n",
                   res[i].device, prec_name(res[i].precision), prec_name(res[b].precision),
                   res[b].med / res[i].med, unit, df,
                   res[b].step_peak ? (double)res[i].step_peak / (double)res[b].step_peak : 0);
        }
        printf("  device floor: the floor's GEMMs through the device's own matmul in each "
               "precision's matmul dtype:");
        for (int i = 0; i < nres; i++)
            if (res[i].dev_floor_ms > 0)
                printf("%s %s %s %.3f ms (step %.2fx)", i ? "," : "", res[i].device,
                       prec_name(res[i].precision), res[i].dev_floor_ms,
                       res[i].med / res[i].dev_floor_ms);
            else
                printf("%s %s %s not measured (%s)", i ? "," : "", res[i].device,
                       prec_name(res[i].precision), res[i].dev_floor_why);
        printf("\n");
        printf("  mallocs/step: calls from libtessera and the plugin (all: every library); "
               "threads/step: threads created (pthread_create, by any library; 0 when every "
               "kernel runs on the pools made at start-up); load average %.2f %.2f %.2f\n",
               load[0], load[1], load[2]);
        for (int i = 0; o.contend > 0 && i < nres; i++)
            printf("  %-12s with %lld busy process%s beside it: %.3f ms/step, %.2fx the median "
                   "without\n", res[i].device, (long long)o.contend, o.contend > 1 ? "es" : "",
                   res[i].contended, res[i].contended / res[i].med);
        for (int i = 0; o.profile && i < nres; i++)
            print_profile(&res[i]);
    }
out:
    floor_free(&fp);
    free(times);
    free(res);
    ts_shutdown();
    return rc;
}
