/* tools/bench_dist.c: `tessera bench dist`, run under `mpirun -np N`: (1) the sum over ranks of
 * float32 buffers from 4 KiB to 64 MiB through tessera's communication plugin against raw
 * MPI_Allreduce on the same buffers in the same run (tessera-bench-mpi.so), as bus bandwidth;
 * (2) ts_ddp's bucketed gradient averaging of a large parameter set against one raw
 * MPI_Allreduce of the same bytes; (3) data-parallel training throughput of a model (images per
 * second over the global batch), with memory and allocations per steady step. Alone it is a
 * world of one: (3) is then the single-process baseline. */
#include "config.h"

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char usage[] =
    "usage: tessera bench dist [--iters N] [--max-mib M] [--model mlp|lenet5|cnn]\n"
    "                          [--batch-size B] [--steps N] [--device NAME] [--json]\n"
    "       (under a launcher: mpirun -np N tessera bench dist ...)\n"
    "\n"
    "All-reduce of float32 buffers of 4 KiB .. --max-mib MiB (default 64) through tessera's\n"
    "communication plugin next to raw MPI_Allreduce on the same buffers (median of --iters, default\n"
    "20, after 3 untimed; bus bandwidth 2 (N-1)/N bytes / time); ts_ddp's bucketed averaging of\n"
    "96 MiB of float32 gradients in 8 tensors against one MPI_Allreduce of the same bytes; and\n"
    "--steps (default 100) data-parallel training steps of --model (default mlp) at global batch\n"
    "--batch-size (default 256) on random images: images/s, raw pool allocations per step.\n"
    "Also reduce-scatter and all-gather of 1 MiB .. --max-mib MiB (the halves of a sharded\n"
    "optimizer's step) next to MPI_Reduce_scatter_block and MPI_Allgather. Alone, a world of\n"
    "one rank: the training figures are the single-process baseline.\n";

typedef int (*mpi_ready_fn)(void);
typedef int (*mpi_allreduce_fn)(float *, long);
typedef int (*mpi_reduce_scatter_fn)(const float *, float *, long);
typedef int (*mpi_allgather_fn)(const void *, void *, long);
typedef int (*mpi_hier_fn)(float *, long, int);

/* The raw hierarchical all-reduce (the same three MPI calls tessera makes), when the job's
 * all-reduce is hierarchical: what tessera's is compared with besides the flat one. */
static mpi_hier_fn hier_raw;
static int hier_per_node;

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median over ranks' views is rank 0's: every collective ends on all ranks together. */
static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n ? v[n / 2] : 0;
}

typedef struct opts {
    int iters, steps, json;
    int64_t max_mib, batch;
    const char *device;
    cli_model arch;
} opts;

static int parse(int argc, char **argv, opts *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int took = cli_model_option(&o->arch, "bench dist", a, v);
        if (took < 0)
            return 2;
        if (took) {
            i++;
            continue;
        }
        int64_t n;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage, stdout);
            return -1;
        } else if (!strcmp(a, "--json")) {
            o->json = 1;
        } else if (!strcmp(a, "--device") && v) {
            o->device = v, i++;
        } else if (!strcmp(a, "--iters") || !strcmp(a, "--steps") || !strcmp(a, "--max-mib") ||
                   !strcmp(a, "--batch-size")) {
            int64_t hi = !strcmp(a, "--max-mib") ? 1024 : !strcmp(a, "--batch-size") ? 60000
                                                                                      : 100000;
            if (cli_parse_i64("bench dist", a, v, 1, hi, &n))
                return 2;
            i++;
            if (!strcmp(a, "--iters"))
                o->iters = (int)n;
            else if (!strcmp(a, "--steps"))
                o->steps = (int)n;
            else if (!strcmp(a, "--max-mib"))
                o->max_mib = n;
            else
                o->batch = n;
        } else {
            return cli_usage_error("bench dist", "unexpected argument '%s'", a);
        }
    }
    return cli_model_check(&o->arch, "bench dist") ? 2 : 0;
}

/* (1) one buffer size: tessera's all-reduce and the raw one, alternating, medians. */
static int allreduce_size(const opts *o, mpi_allreduce_fn raw, long count, double *t_ts,
                          double *t_raw, double *t_hraw)
{
    float *buf = malloc(sizeof *buf * (size_t)count);
    double *a = malloc(sizeof *a * (size_t)o->iters), *b = malloc(sizeof *b * (size_t)o->iters);
    double *h = malloc(sizeof *h * (size_t)o->iters);
    if (!buf || !a || !b || !h) {
        free(buf), free(a), free(b), free(h);
        fprintf(stderr, "tessera: error: out of memory\n");
        return 1;
    }
    for (long i = 0; i < count; i++)
        buf[i] = 1.0f / (float)(1 + i % 7);
    ts_status s = TS_OK;
    for (int it = -3; it < o->iters && s == TS_OK; it++) {
        ts_dist_barrier();
        double t0 = cli_now();
        s = ts_dist_allreduce_sum(buf, (size_t)count, TS_F32);
        double t1 = cli_now();
        if (raw) {
            ts_dist_barrier();
            double t2 = cli_now();
            if (raw(buf, count))
                s = TS_EIO;
            double t3 = cli_now();
            if (it >= 0)
                b[it] = t3 - t2;
        }
        if (hier_raw) {
            ts_dist_barrier();
            double t4 = cli_now();
            if (hier_raw(buf, count, hier_per_node))
                s = TS_EIO;
            if (it >= 0)
                h[it] = cli_now() - t4;
        }
        if (it >= 0)
            a[it] = t1 - t0;
    }
    *t_ts = median(a, o->iters);
    *t_raw = raw ? median(b, o->iters) : 0;
    *t_hraw = hier_raw ? median(h, o->iters) : 0;
    free(buf), free(a), free(b), free(h);
    return s ? cli_fail(s, "all-reduce") : 0;
}

/* (1b) reduce-scatter of `total` floats (each rank keeps total / world of the sum) and
 * all-gather of total / world floats a rank, tessera's against the raw MPI calls, alternating,
 * medians: t[0] tessera reduce-scatter, t[1] raw, t[2] tessera all-gather, t[3] raw. */
static int shard_collectives(const opts *o, mpi_reduce_scatter_fn rs, mpi_allgather_fn ag,
                             long total, int world, double t[4])
{
    const long per = total / world;
    float *all = malloc(sizeof *all * (size_t)total), *mine = malloc(sizeof *mine * (size_t)per);
    double *v[4];
    for (int k = 0; k < 4; k++)
        v[k] = malloc(sizeof(double) * (size_t)o->iters);
    if (!all || !mine || !v[0] || !v[1] || !v[2] || !v[3]) {
        free(all), free(mine);
        for (int k = 0; k < 4; k++)
            free(v[k]);
        fprintf(stderr, "tessera: error: out of memory\n");
        return 1;
    }
    for (long i = 0; i < total; i++)
        all[i] = 1.0f / (float)(1 + i % 7);
    for (long i = 0; i < per; i++)
        mine[i] = (float)i;
    ts_status s = TS_OK;
    for (int it = -3; it < o->iters && s == TS_OK; it++) {
        double d[4] = {0, 0, 0, 0};
        for (int k = 0; k < 4 && s == TS_OK; k++) {
            if ((k == 1 && !rs) || (k == 3 && !ag))
                continue;
            ts_dist_barrier();
            double t0 = cli_now();
            if (k == 0)
                s = ts_dist_reduce_scatter_sum(all, mine, (size_t)per, TS_F32);
            else if (k == 1)
                s = rs(all, mine, per) ? TS_EIO : TS_OK;
            else if (k == 2)
                s = ts_dist_allgather(mine, all, sizeof(float) * (size_t)per);
            else
                s = ag(mine, all, (long)sizeof(float) * per) ? TS_EIO : TS_OK;
            d[k] = cli_now() - t0;
        }
        for (int k = 0; it >= 0 && k < 4; k++)
            v[k][it] = d[k];
    }
    for (int k = 0; k < 4; k++) {
        t[k] = median(v[k], o->iters);
        free(v[k]);
    }
    free(all), free(mine);
    return s ? cli_fail(s, "reduce-scatter / all-gather") : 0;
}

/* (2) ts_ddp over 8 float32 tensors of 3 Mi elements (96 MiB, 4 buckets of 25 MiB): time of
 * ts_ddp_sync (stage, sums, copies back) against one raw all-reduce of the same bytes. */
static int ddp_buckets(const opts *o, ts_device *dev, mpi_allreduce_fn raw, double *t_ddp,
                       double *t_raw, double *mib, size_t *nbuckets)
{
    enum { NT = 8 };
    const int64_t per = 3 << 20;
    ts_named_tensor p[NT];
    ts_status s = TS_OK;
    memset(p, 0, sizeof p);
    for (int i = 0; i < NT && s == TS_OK; i++) {
        snprintf(p[i].name, sizeof p[i].name, "w%d", i);
        if ((s = ts_tensor_ones(dev, TS_F32, 1, &per, &p[i].tensor)) == TS_OK &&
            (s = ts_tensor_set_requires_grad(p[i].tensor, 1)) == TS_OK) {
            ts_tensor *g = NULL;
            if ((s = ts_tensor_full(dev, TS_F32, 1, &per, 0.5, &g)) == TS_OK)
                s = ts_tensor_set_grad(p[i].tensor, g);
            ts_tensor_unref(g);
        }
    }
    ts_ddp *d = NULL;
    if (s == TS_OK)
        s = ts_ddp_new(p, NT, 0, &d);
    float *flat = malloc(sizeof *flat * (size_t)(NT * per));
    double *a = malloc(sizeof *a * (size_t)o->iters), *b = malloc(sizeof *b * (size_t)o->iters);
    if (s == TS_OK && (!flat || !a || !b))
        s = TS_ENOMEM;
    for (int64_t i = 0; flat && i < NT * per; i++)
        flat[i] = 0.5f;
    for (int it = -2; it < o->iters && s == TS_OK; it++) {
        ts_dist_barrier();
        double t0 = cli_now();
        s = ts_ddp_sync(d);
        double t1 = cli_now();
        if (raw) {
            ts_dist_barrier();
            double t2 = cli_now();
            if (raw(flat, (long)(NT * per)))
                s = TS_EIO;
            if (it >= 0)
                b[it] = cli_now() - t2;
        }
        if (it >= 0)
            a[it] = t1 - t0;
    }
    if (s == TS_OK) {
        ts_ddp_stats st;
        ts_ddp_get_stats(d, &st);
        *nbuckets = st.nbuckets;
        *t_ddp = median(a, o->iters);
        *t_raw = raw ? median(b, o->iters) : 0;
        *mib = (double)(NT * per) * 4.0 / 1048576.0;
    }
    ts_ddp_free(d);
    for (int i = 0; i < NT; i++)
        ts_tensor_unref(p[i].tensor);
    free(flat), free(a), free(b);
    return s ? cli_fail(s, "bucketed all-reduce") : 0;
}

/* Peak RSS (VmHWM) of this process, kB; -1 unknown. */
static long peak_rss_kb(void)
{
    long v = -1;
    char line[256];
    FILE *f = fopen("/proc/self/status", "r");
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6))
            v = strtol(line + 6, NULL, 10);
    if (f)
        fclose(f);
    return v;
}

/* (3) data-parallel training, the optimizer sharded or not: images/s over the global batch,
 * raw allocations per step, peak RSS after the first 100 timed steps and at the end, and the
 * bytes of optimizer state (pool statistics, role "optimizer"), the largest over ranks. */
static int train(const opts *o, ts_device *dev, int shard, double *ips, double *raw_per_step,
                 int64_t *params, long rss_kb[2], long *opt_bytes)
{
    const int rank = ts_dist_rank(), world = ts_dist_size();
    const int64_t B = o->batch, n = B / world + (rank < B % world), N = 64 * n;
    ts_rng rng;
    ts_rng_init(&rng, 1 + (uint64_t)rank); /* this rank's own images */
    ts_tensor *x = NULL, *y = NULL;
    ts_module *m = NULL;
    ts_optim *opt = NULL;
    ts_ddp *d = NULL;
    ts_named_tensor *p = NULL;
    int64_t *labels = malloc(sizeof *labels * (size_t)N);
    ts_status s = labels ? TS_OK : TS_ENOMEM;
    for (int64_t i = 0; labels && i < N; i++)
        labels[i] = (i * 7 + rank) % 10;
    if (s == TS_OK)
        s = ts_tensor_rand(dev, TS_F32, 4, (const int64_t[]){N, 1, 28, 28}, 0, 1, &rng, &x);
    if (s == TS_OK)
        s = ts_tensor_from_host(dev, TS_I64, 1, &N, labels, &y);
    if (s == TS_OK)
        s = cli_build_model_spec(&o->arch, dev, &rng, &m);
    size_t np = m ? ts_module_parameters(m, NULL, 0) : 0;
    if (s == TS_OK && !(p = calloc(np + 1, sizeof *p)))
        s = TS_ENOMEM;
    if (s == TS_OK) {
        ts_module_parameters(m, p, np);
        *params = ts_module_num_params(m);
        ts_adam_options ao = {1e-3, 0.9, 0.999, 1e-8, 0};
        if ((s = ts_dist_broadcast_module(m, 0)) == TS_OK &&
            (s = ts_optim_adam(p, np, &ao, &opt)) == TS_OK &&
            (s = ts_ddp_new(p, np, 0, &d)) == TS_OK && shard)
            s = ts_optim_shard(opt, d);
    }
    ts_memory_stats st0 = {.struct_size = sizeof st0}, st1 = {.struct_size = sizeof st1};
    double t0 = 0;
    rss_kb[0] = rss_kb[1] = -1;
    for (int step = -5; step < o->steps && s == TS_OK; step++) {
        if (step == (o->steps > 200 ? 100 : 0))
            rss_kb[0] = peak_rss_kb();
        if (step == 0) {
            ts_dist_barrier();
            ts_device_memory_stats(dev, &st0);
            t0 = cli_now();
        }
        ts_tensor *xb = NULL, *yb = NULL, *logits = NULL, *loss = NULL;
        int64_t at = ((step + 5) % 64) * n;
        if ((s = ts_tensor_narrow(x, 0, at, n, &xb)) == TS_OK &&
            (s = ts_tensor_narrow(y, 0, at, n, &yb)) == TS_OK &&
            (s = ts_module_forward(m, xb, &logits)) == TS_OK &&
            (s = ts_cross_entropy(logits, yb, TS_REDUCTION_MEAN, &loss)) == TS_OK &&
            (s = ts_backward(loss, NULL, 0)) == TS_OK && (s = ts_ddp_sync(d)) == TS_OK &&
            (s = ts_optim_step(opt)) == TS_OK) {
            ts_optim_zero_grad(opt);
            s = ts_device_synchronize(dev);
        }
        ts_tensor_unref(xb), ts_tensor_unref(yb), ts_tensor_unref(logits), ts_tensor_unref(loss);
    }
    if (s == TS_OK) {
        ts_dist_barrier();
        double secs = cli_now() - t0;
        ts_device_memory_stats(dev, &st1);
        *ips = (double)B * o->steps / secs;
        *raw_per_step = (double)(st1.n_raw_alloc - st0.n_raw_alloc) / o->steps;
        rss_kb[1] = peak_rss_kb();
        uint64_t roles[TS_ROLE_COUNT];
        ts_device_memory_by_role(dev, roles);
        *opt_bytes = (long)roles[TS_ROLE_OPTIMIZER];
        int64_t r[3] = {rss_kb[0], rss_kb[1], *opt_bytes}, all[3 * 64];
        if (world <= 64 && ts_dist_allgather(r, all, sizeof r) == TS_OK)
            for (int i = 0; i < world; i++) {
                rss_kb[0] = all[3 * i] > rss_kb[0] ? all[3 * i] : rss_kb[0];
                rss_kb[1] = all[3 * i + 1] > rss_kb[1] ? all[3 * i + 1] : rss_kb[1];
                *opt_bytes = all[3 * i + 2] > *opt_bytes ? all[3 * i + 2] : *opt_bytes;
            }
    }
    ts_ddp_free(d);
    ts_optim_free(opt);
    free(p);
    ts_module_free(m);
    ts_tensor_unref(x), ts_tensor_unref(y);
    free(labels);
    return s ? cli_fail(s, "bench dist: training") : 0;
}

int cli_bench_dist(int argc, char **argv, const cli_common *common)
{
    opts o = {.iters = 20, .steps = 100, .max_mib = 64, .batch = 256, .json = common->json};
    cli_model_init(&o.arch);
    o.arch.name = "mlp";
    int rc = parse(argc, argv, &o);
    if (rc)
        return rc < 0 ? 0 : rc;
    ts_status s = ts_init(common->config);
    if (s)
        return cli_fail(s, "cannot start tessera");
    if ((s = ts_dist_init(NULL))) {
        cli_fail(s, "cannot join the distributed job");
        ts_shutdown();
        return 1;
    }
    const int rank = ts_dist_rank(), world = ts_dist_size();
    ts_device *dev = ts_dist_device() ? ts_dist_device() : ts_default_device();
    rc = 1;
    if (o.device && (s = ts_device_get(o.device, &dev))) {
        cli_fail(s, "--device");
        goto out;
    }
    if (rank != 0 && !freopen("/dev/null", "w", stdout))
        goto out;
    /* the raw baseline, when MPI runs this job */
    mpi_allreduce_fn raw = NULL;
    void *mod = world > 1 ? cli_bench_dlopen("tessera-bench-mpi.so") : NULL;
    if (mod) {
        mpi_ready_fn ready;
        *(void **)&ready = dlsym(mod, "tsb_mpi_ready");
        *(void **)&raw = dlsym(mod, "tsb_mpi_allreduce_f32");
        if (!ready || !ready())
            raw = NULL;
        if (raw && ts_dist_hierarchy(NULL, &hier_per_node))
            *(void **)&hier_raw = dlsym(mod, "tsb_mpi_hier_allreduce_f32");
    }
    const double bus = world > 1 ? 2.0 * (world - 1) / world : 0;
    if (!o.json) {
        printf("tessera bench dist: %d rank%s over '%s', device '%s'\n", world,
               world == 1 ? "" : "s", ts_dist_backend(), ts_device_name(dev));
        int hn = 0, hp = 0;
        if (world > 1 && ts_dist_hierarchy(&hn, &hp))
            printf("  all-reduce: hierarchical, %d machines of %d ranks ([dist] "
                   "hierarchical); \"hier raw\": the same three MPI calls made directly\n",
                   hn, hp);
        if (world > 1)
            printf("  all-reduce (sum, float32), bus bandwidth GB/s, median of %d; raw: "
                   "MPI_Allreduce on the same buffer%s\n  %10s %12s %12s %12s %8s%s\n",
                   o.iters, raw ? "" : " (not measured: tessera-bench-mpi.so not found)",
                   "bytes", "tessera ms", "raw ms", "tessera GB/s", "ratio",
                   hier_raw ? "  hier raw ms    ratio" : "");
    } else {
        printf("{\"world_size\": %d, \"backend\": \"%s\", \"allreduce\": [", world,
               ts_dist_backend());
    }
    int first = 1;
    for (long bytes = 4096; world > 1 && bytes <= o.max_mib * 1048576L; bytes *= 4) {
        double tt, tr, th;
        if ((rc = allreduce_size(&o, raw, bytes / 4, &tt, &tr, &th)))
            goto out;
        rc = 1;
        double gbs = bus * (double)bytes / tt * 1e-9;
        char hier[96] = "";
        if (o.json) {
            if (hier_raw)
                snprintf(hier, sizeof hier, ", \"raw_hier_ms\": %.4f, \"hier_ratio\": %.3f",
                         th * 1e3, th / tt);
            printf("%s{\"bytes\": %ld, \"tessera_ms\": %.4f, \"raw_ms\": %.4f, "
                   "\"tessera_busbw_gbs\": %.3f, \"ratio\": %.3f%s}",
                   first ? "" : ", ", bytes, tt * 1e3, tr * 1e3, gbs, tr > 0 ? tr / tt : 0,
                   hier);
        } else {
            if (hier_raw)
                snprintf(hier, sizeof hier, " %12.4f %7.2fx", th * 1e3, th / tt);
            printf("  %10ld %12.4f %12.4f %12.3f %7.2fx%s\n", bytes, tt * 1e3, tr * 1e3, gbs,
                   tr > 0 ? tr / tt : 0, hier);
        }
        first = 0;
    }
    /* (1b) the halves of a sharded step: reduce-scatter and all-gather, 1 MiB and up */
    mpi_reduce_scatter_fn rsraw = NULL;
    mpi_allgather_fn agraw = NULL;
    if (mod && raw) {
        *(void **)&rsraw = dlsym(mod, "tsb_mpi_reduce_scatter_f32");
        *(void **)&agraw = dlsym(mod, "tsb_mpi_allgather");
    }
    if (world > 1 && !o.json)
        printf("  reduce-scatter (sum, float32) and all-gather of the same bytes, ms, median "
               "of %d; raw: MPI_Reduce_scatter_block, MPI_Allgather\n  %10s %12s %12s %8s "
               "%12s %12s %8s\n", o.iters, "bytes", "rs tessera", "rs raw", "ratio",
               "ag tessera", "ag raw", "ratio");
    if (o.json)
        printf("], \"shards\": [");
    first = 1;
    for (long bytes = 1048576; world > 1 && bytes <= o.max_mib * 1048576L; bytes *= 4) {
        double t[4];
        if ((rc = shard_collectives(&o, rsraw, agraw, bytes / 4 / world * world, world, t)))
            goto out;
        rc = 1;
        if (o.json)
            printf("%s{\"bytes\": %ld, \"reduce_scatter_ms\": %.4f, \"reduce_scatter_raw_ms\": "
                   "%.4f, \"allgather_ms\": %.4f, \"allgather_raw_ms\": %.4f}",
                   first ? "" : ", ", bytes, t[0] * 1e3, t[1] * 1e3, t[2] * 1e3, t[3] * 1e3);
        else
            printf("  %10ld %12.4f %12.4f %7.2fx %12.4f %12.4f %7.2fx\n", bytes, t[0] * 1e3,
                   t[1] * 1e3, t[1] > 0 ? t[1] / t[0] : 0, t[2] * 1e3, t[3] * 1e3,
                   t[3] > 0 ? t[3] / t[2] : 0);
        first = 0;
    }
    double td = 0, trd = 0, mib = 0, ips = 0, rps = 0;
    size_t nb = 0;
    int64_t params = 0;
    if (world > 1) {
        if ((rc = ddp_buckets(&o, dev, raw, &td, &trd, &mib, &nb)))
            goto out;
        rc = 1;
    }
    long rss[2], ob = 0, rss_z[2] = {-1, -1}, ob_z = 0;
    double ips_z = 0, rps_z = 0;
    if ((rc = train(&o, dev, 0, &ips, &rps, &params, rss, &ob)))
        goto out;
    if (world > 1 && (rc = train(&o, dev, 1, &ips_z, &rps_z, &params, rss_z, &ob_z)))
        goto out;
    char arch[128];
    cli_model_describe(&o.arch, arch, sizeof arch);
    if (o.json) {
        printf("], \"ddp\": {\"mib\": %.0f, \"buckets\": %zu, \"ms\": %.3f, \"raw_ms\": %.3f, "
               "\"of_raw_bandwidth\": %.3f}, \"train\": {\"model\": \"%s\", \"parameters\": "
               "%lld, \"global_batch\": %lld, \"images_per_s\": %.1f, "
               "\"raw_allocs_per_step\": %.3f, \"peak_rss_kb_early\": %ld, "
               "\"peak_rss_kb_end\": %ld, \"optimizer_bytes_per_rank\": %ld}, "
               "\"train_sharded\": {\"images_per_s\": %.1f, \"raw_allocs_per_step\": %.3f, "
               "\"peak_rss_kb_end\": %ld, \"optimizer_bytes_per_rank\": %ld}}\n",
               mib, nb, td * 1e3, trd * 1e3, td > 0 && trd > 0 ? trd / td : 0, arch,
               (long long)params, (long long)o.batch, ips, rps, rss[0], rss[1], ob, ips_z,
               rps_z, rss_z[1], ob_z);
    } else {
        if (world > 1)
            printf("  gradient averaging (ts_ddp_sync, %zu buckets of <= 25 MiB, %.0f MiB): "
                   "%.2f ms; one raw MPI_Allreduce of the same bytes: %.2f ms; %.0f%% of its "
                   "bandwidth\n", nb, mib, td * 1e3, trd * 1e3,
                   td > 0 && trd > 0 ? 100 * trd / td : 0);
        printf("  training %s (%lld parameters), global batch %lld on %d rank%s: %.0f images/s, "
               "%.2f raw pool allocations per steady step\n", arch, (long long)params,
               (long long)o.batch, world, world == 1 ? "" : "s", ips, rps);
        printf("  peak RSS (largest rank): %ld kB after %d steps, %ld kB after %d (%+.3f%%)\n",
               rss[0], o.steps > 200 ? 100 : 0, rss[1], o.steps,
               rss[0] > 0 ? 100.0 * (double)(rss[1] - rss[0]) / (double)rss[0] : 0.0);
        if (world > 1)
            printf("  optimizer sharded ([dist] shard_optimizer): %.0f images/s (%.2fx), "
                   "%.2f raw allocations per steady step; optimizer state per rank %.2f MiB, "
                   "unsharded %.2f MiB (%.3f of it; 1/%d is %.3f)\n", ips_z,
                   ips > 0 ? ips_z / ips : 0, rps_z, (double)ob_z / 1048576,
                   (double)ob / 1048576, ob > 0 ? (double)ob_z / (double)ob : 0, world,
                   1.0 / world);
    }
    rc = 0;
out:
    if (rc && world > 1)
        ts_dist_abort(rc, "bench dist stopped on rank %d", rank);
    ts_dist_shutdown();
    ts_shutdown();
    return rc;
}
