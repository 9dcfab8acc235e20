/* tools/bench_ops.c: `tessera bench ops`: tensor operations through tessera next to their
 * floor in the same run: matmul against raw cblas_sgemm on the same buffers, elementwise add
 * against memcpy bandwidth, and the fixed cost of one small op. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"


static const char usage[] =
    "usage: tessera bench ops [--device NAME] [--reps N] [--json]\n"
    "\n"
    "Times, in one run and on the same buffers:\n"
    "  matmul 128/512/2048 float32 through tessera vs raw cblas_sgemm (GFLOP/s)\n"
    "  add of two 16M-float tensors into a third vs memcpy of 64 MiB (GB/s moved)\n"
    "  one add on 1-element tensors, with and without allocating the result (ns)\n"
    "  causal attention forward + backward at context 128, 512 and 1024 (batch 8, 4 heads of\n"
    "  32: the default GPT's), fused (one pass, no T x T matrix) vs composed from matmul and\n"
    "  softmax: tokens per second and peak pool memory above the operands\n"
    "Each figure is the best of --reps runs (default 5).\n";

typedef struct bench_ctx {
    ts_device *dev;
    int reps;
    int json;
    int first;
} bench_ctx;

static void report(bench_ctx *b, const char *name, double value, const char *unit,
                   double floor, const char *floor_name)
{
    if (b->json) {
        printf("%s    {\"name\": \"%s\", \"value\": %.4g, \"unit\": \"%s\"", b->first ? "" : ",\n",
               name, value, unit);
        if (floor > 0)
            printf(", \"floor\": %.4g, \"floor_name\": \"%s\", \"ratio\": %.4f", floor,
                   floor_name, value / floor);
        printf("}");
    } else if (floor > 0) {
        printf("  %-24s %10.2f %-8s  %-12s %10.2f %-8s  %6.1f%%\n", name, value, unit, floor_name,
               floor, unit, 100.0 * value / floor);
    } else {
        printf("  %-24s %10.1f %-8s\n", name, value, unit);
    }
    b->first = 0;
}

static ts_status bench_matmul(bench_ctx *b, int64_t n)
{
    ts_tensor *x, *y, *z;
    ts_rng rng;
    ts_rng_init(&rng, 1);
    int64_t shape[2] = {n, n};
    ts_status s;
    if ((s = ts_tensor_rand(b->dev, TS_F32, 2, shape, -1, 1, &rng, &x)))
        return s;
    if ((s = ts_tensor_rand(b->dev, TS_F32, 2, shape, -1, 1, &rng, &y)) ||
        (s = ts_tensor_empty(b->dev, TS_F32, 2, shape, &z))) {
        ts_tensor_unref(x);
        ts_tensor_unref(y);
        return s;
    }
    int inner = n <= 128 ? 200 : n <= 512 ? 10 : 1;
    double best = 1e30, best_raw = 1e30;
    for (int r = 0; r < b->reps && s == TS_OK; r++) {
        double t = cli_now();
        for (int i = 0; i < inner && s == TS_OK; i++)
            s = ts_matmul_out(x, y, z);
        ts_device_synchronize(b->dev);
        t = (cli_now() - t) / inner;
        best = t < best ? t : best;
        /* The floor: the same GEMM on the same host buffers, straight into OpenBLAS (the
         * benchmark module's baseline). */
        if (strncmp(ts_device_name(b->dev), "cpu_", 4) == 0 && cli_have_sgemm()) {
            t = cli_now();
            for (int i = 0; i < inner; i++)
                cli_sgemm(0, 0, (int)n, (int)n, (int)n, ts_tensor_data(x), (int)n,
                          ts_tensor_data(y), (int)n, ts_tensor_data(z), (int)n, 0);
            t = (cli_now() - t) / inner;
            best_raw = t < best_raw ? t : best_raw;
        }
    }
    if (s == TS_OK) {
        char name[64];
        snprintf(name, sizeof name, "matmul %lld", (long long)n);
        double flops = 2.0 * (double)n * (double)n * (double)n;
        report(b, name, flops / best * 1e-9, "GFLOP/s",
               best_raw < 1e30 ? flops / best_raw * 1e-9 : 0, "cblas_sgemm");
    }
    ts_tensor_unref(x);
    ts_tensor_unref(y);
    ts_tensor_unref(z);
    return s;
}

static ts_status bench_add(bench_ctx *b)
{
    const int64_t n = 16 << 20;
    ts_tensor *x, *y, *z;
    ts_status s;
    if ((s = ts_tensor_full(b->dev, TS_F32, 1, &n, 1.0, &x)))
        return s;
    if ((s = ts_tensor_full(b->dev, TS_F32, 1, &n, 2.0, &y)) ||
        (s = ts_tensor_empty(b->dev, TS_F32, 1, &n, &z))) {
        ts_tensor_unref(x);
        ts_tensor_unref(y);
        return s;
    }
    size_t bytes = (size_t)n * 4;
    double best = 1e30, best_copy = 1e30;
    int host = strncmp(ts_device_name(b->dev), "cpu_", 4) == 0;
    for (int r = 0; r < b->reps && s == TS_OK; r++) {
        double t = cli_now();
        s = ts_add_out(x, y, z);
        ts_device_synchronize(b->dev);
        t = cli_now() - t;
        best = t < best ? t : best;
        if (host) {
            t = cli_now();
            memcpy(ts_tensor_data(z), ts_tensor_data(x), bytes);
            t = cli_now() - t;
            best_copy = t < best_copy ? t : best_copy;
        }
    }
    /* Bytes moved: add reads two arrays and writes one; memcpy reads one and writes one. */
    if (s == TS_OK)
        report(b, "add 16M float32", 3.0 * (double)bytes / best * 1e-9, "GB/s",
               host ? 2.0 * (double)bytes / best_copy * 1e-9 : 0, "memcpy");
    ts_tensor_unref(x);
    ts_tensor_unref(y);
    ts_tensor_unref(z);
    return s;
}

static ts_status bench_small(bench_ctx *b)
{
    ts_tensor *x, *y, *z, *r;
    const int64_t one = 1;
    ts_status s;
    if ((s = ts_tensor_full(b->dev, TS_F32, 1, &one, 1.0, &x)))
        return s;
    ts_tensor_full(b->dev, TS_F32, 1, &one, 2.0, &y);
    ts_tensor_empty(b->dev, TS_F32, 1, &one, &z);
    const int iters = 200000;
    double best_new = 1e30, best_out = 1e30;
    for (int rep = 0; rep < b->reps && s == TS_OK; rep++) {
        double t = cli_now();
        for (int i = 0; i < iters && s == TS_OK; i++) {
            s = ts_add(x, y, &r);
            ts_tensor_unref(r);
        }
        t = (cli_now() - t) / iters;
        best_new = t < best_new ? t : best_new;
        t = cli_now();
        for (int i = 0; i < iters && s == TS_OK; i++)
            s = ts_add_out(x, y, z);
        t = (cli_now() - t) / iters;
        best_out = t < best_out ? t : best_out;
    }
    if (s == TS_OK) {
        report(b, "add 1 element (new)", best_new * 1e9, "ns", 0, NULL);
        report(b, "add 1 element (out=)", best_out * 1e9, "ns", 0, NULL);
    }
    ts_tensor_unref(x);
    ts_tensor_unref(y);
    ts_tensor_unref(z);
    return s;
}

/* One causal attention forward and backward (q = k = v, a leaf) on the fused or composed
 * path: the best time of b->reps runs and the peak pool bytes above what was in use. */
static ts_status attention_once(bench_ctx *b, ts_tensor *q, int fused, double *best,
                                double *peak)
{
    ts_status s = TS_OK;
    int was = ts_attention_fused(fused ? TS_ATTENTION_FUSED : TS_ATTENTION_COMPOSED);
    *best = 1e30;
    *peak = 0;
    for (int r = 0; r < b->reps && s == TS_OK; r++) {
        ts_memory_stats st0 = {.struct_size = sizeof st0}, st = {.struct_size = sizeof st};
        ts_device_memory_stats(b->dev, &st0);
        ts_device_reset_peak(b->dev);
        double t = cli_now();
        ts_scope *sc = ts_scope_begin();
        ts_tensor *l = ts_s_sum(ts_s_attention(q, q, q, 1, 0), 0, NULL, 0);
        if (l)
            s = ts_backward(l, NULL, 0);
        ts_status e = ts_scope_end(sc);
        s = s ? s : e;
        ts_device_synchronize(b->dev);
        t = cli_now() - t;
        ts_device_memory_stats(b->dev, &st);
        *best = t < *best ? t : *best;
        *peak = (double)st.peak_in_use - (double)st0.in_use;
        ts_tensor_zero_grad(q);
    }
    ts_attention_fused(was);
    return s;
}

static ts_status bench_attention(bench_ctx *b, int64_t T)
{
    const int64_t B = 8, H = 4, D = 32;
    ts_tensor *q;
    ts_rng rng;
    ts_rng_init(&rng, 2);
    ts_status s = ts_tensor_randn(b->dev, TS_F32, 4, (const int64_t[]){B, H, T, D}, 0, 1, &rng,
                                  &q);
    if (s || (s = ts_tensor_set_requires_grad(q, 1))) {
        ts_tensor_unref(q);
        return s;
    }
    double tf, tc, pf, pc;
    if ((s = attention_once(b, q, 1, &tf, &pf)) == TS_OK &&
        (s = attention_once(b, q, 0, &tc, &pc)) == TS_OK) {
        char name[64];
        snprintf(name, sizeof name, "attention T %lld", (long long)T);
        report(b, name, (double)(B * T) / tf * 1e-3, "ktok/s", (double)(B * T) / tc * 1e-3,
               "composed");
        snprintf(name, sizeof name, "attention T %lld peak", (long long)T);
        report(b, name, pf / 1048576.0, "MiB", pc / 1048576.0, "composed");
    }
    ts_tensor_unref(q);
    return s;
}

int cli_bench_ops(int argc, char **argv, const cli_common *common)
{
    bench_ctx b = {.reps = 5, .json = common->json, .first = 1};
    const char *device = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            b.json = 1;
        } else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc) {
            device = argv[++i];
        } else if (strcmp(argv[i], "--reps") == 0) {
            int64_t n;
            if (cli_parse_i64("bench ops", "--reps", i + 1 < argc ? argv[i + 1] : NULL, 1,
                              1000000, &n))
                return 2;
            b.reps = (int)n, i++;
        } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            fputs(usage, stdout);
            return 0;
        } else {
            return cli_usage_error("bench ops", "unexpected argument '%s'", argv[i]);
        }
    }
    ts_status s = ts_init(common->config);
    if (s)
        return cli_fail(s, "cannot start tessera");
    b.dev = ts_default_device();
    if (device && (s = ts_device_get(device, &b.dev))) {
        int rc = cli_fail(s, "bench ops");
        ts_shutdown();
        return rc;
    }
    if (b.json)
        printf("{\"device\": \"%s\", \"results\": [\n", ts_device_name(b.dev));
    else
        printf("tessera bench ops on '%s' (best of %d)\n  %-24s %19s  %-12s %19s  %7s\n",
               ts_device_name(b.dev), b.reps, "operation", "tessera", "floor", "", "ratio");
    static const int64_t sizes[] = {128, 512, 2048};
    for (int i = 0; i < 3 && s == TS_OK; i++)
        s = bench_matmul(&b, sizes[i]);
    if (s == TS_OK)
        s = bench_add(&b);
    if (s == TS_OK)
        s = bench_small(&b);
    static const int64_t contexts[] = {128, 512, 1024};
    for (int i = 0; i < 3 && s == TS_OK; i++)
        s = bench_attention(&b, contexts[i]);
    if (b.json)
        printf("\n]}\n");
    int rc = s ? cli_fail(s, "bench ops") : 0;
    ts_shutdown();
    return rc;
}
