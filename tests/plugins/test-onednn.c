/* tests/plugins/test-onednn.c: cpu_onednn's MATMUL and CONV2D family (oneDNN primitives) on
 * float32, checked against a float64 reference computed here, over contiguous, transposed,
 * strided and offset operands; cpu_blas (where built) runs the same inputs and is checked
 * against the same reference with the same bound. Never plugin against plugin: their float32
 * sums differ in order (by CPU model too), and the bound between them is the sum of both
 * bounds to the reference, which the reference checks already imply. Also: supports() (F32 yes, F64 no), that steady state creates no primitive (the
 * test-only cpu_onednn_primitive_count symbol, dlsym'ed from the loaded module), that the
 * bounded primitive cache evicts and stays correct, and that no pool block leaks. */
#include "kt.h"

#include <dlfcn.h>
#include <math.h>
#include <unistd.h>

#define RTOL 1e-4

static int has_plugin(const char *name)
{
    for (const char *const *pn = kt_plugins(); *pn; pn++)
        if (strcmp(*pn, name) == 0)
            return 1;
    return 0;
}

static ts_device *load_onednn(void)
{
    if (!has_plugin("cpu_onednn"))
        SKIP("cpu_onednn is not built");
    return kt_load(tap_plugin_under_test("cpu_onednn")); /* the test build: hooks exported */
}

/* cpu_blas for the cross-check, or NULL when it is not built. */
static ts_device *load_blas(void)
{
    return has_plugin("cpu_blas") ? kt_load("cpu_blas") : NULL;
}

typedef unsigned long long (*count_fn)(void);

static count_fn primitive_counter(ts_device *dev)
{
    const char *path = ts_device_path(dev);
    CHECK(path);
    void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    CHECK_MSG(h, "dlopen(%s, RTLD_NOLOAD): %s", path, dlerror());
    count_fn f;
    void *sym = dlsym(h, "cpu_onednn_primitive_count");
    CHECK_MSG(sym, "cpu_onednn_primitive_count not exported: %s", dlerror());
    memcpy(&f, &sym, sizeof f);
    dlclose(h); /* the device keeps its own reference */
    return f;
}

/* All elements of op in row-major order, as doubles (malloc'd). */
static double *snapshot(const ts_operand *op)
{
    int64_t n = kt_numel(op), idx[TS_MAX_DIMS];
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    CHECK(v);
    for (int64_t i = 0; i < n; i++) {
        kt_unravel(op, i, idx);
        v[i] = kt_get(op, idx);
    }
    return v;
}

/* ---------------------------------------------------------------------------------------- */
/* matmul                                                                                    */

/* Runs out = alpha * a @ b + beta * out on dev and returns the result (malloc'd); the
 * float64 reference of the same computation goes to *ref when ref is not NULL. */
static double *run_matmul(ts_device *dev, const ts_operand *a, const ts_operand *b,
                          const ts_operand *c, double alpha, double beta, double **ref)
{
    int nd = c->ndim;
    int64_t K = a->shape[nd - 1], total = kt_numel(c), idx[TS_MAX_DIMS];
    double *before = snapshot(c);
    ts_matmul_params p = {.alpha = alpha, .beta = beta};
    CHECK_OK(kt_run(dev, TS_OP_MATMUL, (ts_operand[]){*a, *b}, 2, c, 1, &p, sizeof p));
    if (ref) {
        *ref = malloc(sizeof(double) * (size_t)(total ? total : 1));
        CHECK(*ref);
        for (int64_t i = 0; i < total; i++) {
            kt_unravel(c, i, idx);
            int64_t ai[TS_MAX_DIMS], bi[TS_MAX_DIMS];
            memcpy(ai, idx, sizeof ai);
            memcpy(bi, idx, sizeof bi);
            double acc = 0.0;
            for (int64_t k = 0; k < K; k++) {
                ai[nd - 1] = k;
                bi[nd - 2] = k;
                acc += kt_get(a, ai) * kt_get(b, bi);
            }
            (*ref)[i] = alpha * acc + (beta != 0.0 ? beta * before[i] : 0.0);
        }
    }
    free(before);
    return snapshot(c);
}

static void compare_dev(const char *who, const char *what, const char *against,
                        const double *got, const double *want, int64_t n, double atol)
{
    for (int64_t i = 0; i < n; i++)
        CHECK_MSG(kt_close(got[i], want[i], RTOL, atol),
                  "%s: element %lld: %s %.9g, %s %.9g", what, (long long)i, who, got[i],
                  against, want[i]);
}

static void compare(const char *what, const char *against, const double *got, const double *want,
                    int64_t n, double atol)
{
    compare_dev("cpu_onednn", what, against, got, want, n, atol);
}

/* One matmul case: a (batch..., M, K) in layout la, b, out likewise, on cpu_onednn against
 * the reference, and cpu_blas on identical inputs against the same reference. bshape_b / bshape_a: when not NULL,
 * b / a are made with that (smaller) shape and broadcast to the batch. */
static void matmul_case(ts_device *dn, ts_device *bl, int nd, const int64_t *batch, int64_t M,
                        int64_t K, int64_t N, kt_layout la, kt_layout lb, kt_layout lc,
                        double alpha, double beta, int bcast_a, int bcast_b)
{
    int64_t as[TS_MAX_DIMS], bs[TS_MAX_DIMS], cs[TS_MAX_DIMS];
    for (int d = 0; d < nd - 2; d++)
        as[d] = bs[d] = cs[d] = batch[d];
    as[nd - 2] = M, as[nd - 1] = K;
    bs[nd - 2] = K, bs[nd - 1] = N;
    cs[nd - 2] = M, cs[nd - 1] = N;
    /* A broadcast operand is made 2-D (or with size-1 leading dim) and broadcast. */
    int and_ = bcast_a ? 2 : nd, bnd = bcast_b ? 2 : nd;
    ts_device *devs[2] = {dn, bl};
    double *res[2] = {NULL, NULL}, *ref = NULL;
    int64_t total = 0;
    for (int i = 0; i < 2; i++) {
        if (!devs[i])
            continue;
        kt_buf a = kt_make(devs[i], TS_F32, and_, as + (nd - and_), la, 1);
        kt_buf b = kt_make(devs[i], TS_F32, bnd, bs + (nd - bnd), lb, 2);
        kt_buf c = kt_make(devs[i], TS_F32, nd, cs, lc, 3);
        ts_operand ao = kt_broadcast(&a.op, nd, as), bo = kt_broadcast(&b.op, nd, bs);
        res[i] = run_matmul(devs[i], &ao, &bo, &c.op, alpha, beta, i == 0 ? &ref : NULL);
        total = kt_numel(&c.op);
        kt_check_gaps(&c);
        kt_free(&c);
        kt_free(&b);
        kt_free(&a);
    }
    char what[160];
    snprintf(what, sizeof what, "matmul nd=%d M=%lld K=%lld N=%lld a=%s%s b=%s%s out=%s alpha=%g "
             "beta=%g", nd, (long long)M, (long long)K, (long long)N, kt_layout_name(la),
             bcast_a ? "(bcast)" : "", kt_layout_name(lb), bcast_b ? "(bcast)" : "",
             kt_layout_name(lc), alpha, beta);
    double atol = 1e-6 * (double)(K + 1) * 4.0 * (fabs(alpha) + fabs(beta));
    compare(what, "float64 reference", res[0], ref, total, atol);
    if (res[1])
        compare_dev("cpu_blas", what, "float64 reference", res[1], ref, total, atol);
    free(ref);
    free(res[1]);
    free(res[0]);
}

static void test_matmul_supports(void)
{
    ts_device *dn = load_onednn();
    CHECK(ts_device_supports(dn, TS_OP_MATMUL, TS_F32));
    CHECK(!ts_device_supports(dn, TS_OP_MATMUL, TS_F64));
    CHECK(!ts_device_supports(dn, TS_OP_MATMUL, TS_I32));
    kt_buf a = kt_make(dn, TS_F64, 2, (int64_t[]){2, 3}, KT_CONTIG, 1);
    kt_buf b = kt_make(dn, TS_F64, 2, (int64_t[]){3, 2}, KT_CONTIG, 2);
    kt_buf c = kt_make(dn, TS_F64, 2, (int64_t[]){2, 2}, KT_CONTIG, 3);
    ts_matmul_params p = {.alpha = 1.0, .beta = 0.0};
    CHECK_FAILS(kt_run(dn, TS_OP_MATMUL, (ts_operand[]){a.op, b.op}, 2, &c.op, 1, &p, sizeof p),
                TS_ENOTSUP, "cpu_onednn", "float64");
    kt_check_gaps(&c);
    kt_free(&c);
    kt_free(&b);
    kt_free(&a);
    kt_check_no_live_blocks(dn);
}

static void test_matmul_shapes(void)
{
    ts_device *dn = load_onednn(), *bl = load_blas();
    static const int64_t shapes[][3] = {{1, 1, 1}, {3, 5, 7}, {64, 33, 17}, {17, 64, 1},
                                        {1, 40, 9}, {130, 70, 90}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        matmul_case(dn, bl, 2, NULL, shapes[s][0], shapes[s][1], shapes[s][2], KT_CONTIG,
                    KT_CONTIG, KT_CONTIG, 1.0, 0.0, 0, 0);
        matmul_case(dn, bl, 2, NULL, shapes[s][0], shapes[s][1], shapes[s][2], KT_CONTIG,
                    KT_TRANSPOSED, KT_STRIDED, -0.5, 2.0, 0, 0);
        matmul_case(dn, bl, 2, NULL, shapes[s][0], shapes[s][1], shapes[s][2], KT_TRANSPOSED,
                    KT_OFFSET, KT_TRANSPOSED, 1.0, 1.0, 0, 0);
    }
    kt_check_no_live_blocks(dn);
}

static void test_matmul_layouts(void)
{
    ts_device *dn = load_onednn(), *bl = load_blas();
    for (int la = 0; la < KT_NLAYOUTS; la++)
        for (int lb = 0; lb < KT_NLAYOUTS; lb++)
            for (int lc = 0; lc < KT_NLAYOUTS; lc++) {
                matmul_case(dn, bl, 2, NULL, 7, 5, 6, la, lb, lc, 1.0, 0.0, 0, 0);
                matmul_case(dn, bl, 2, NULL, 6, 9, 4, la, lb, lc, 1.5, -0.75, 0, 0);
            }
    kt_check_no_live_blocks(dn);
}

static void test_matmul_batched(void)
{
    ts_device *dn = load_onednn(), *bl = load_blas();
    const int64_t batch[2] = {2, 3};
    for (int l = 0; l < KT_NLAYOUTS; l++) {
        int l1 = (l + 1) % KT_NLAYOUTS, l2 = (l + 2) % KT_NLAYOUTS;
        matmul_case(dn, bl, 4, batch, 4, 5, 6, l, l1, l2, 1.0, 0.0, 0, 0);
        matmul_case(dn, bl, 4, batch, 4, 5, 6, l, l1, l2, 0.25, 1.0, 0, 0);
        matmul_case(dn, bl, 3, batch, 4, 5, 6, l, l1, l2, 1.0, 0.0, 0, 0);
        /* b (K, N) broadcast over both batch dims (stride 0), a likewise, both. */
        matmul_case(dn, bl, 4, batch, 4, 5, 6, l, l1, l2, 1.0, 0.0, 0, 1);
        matmul_case(dn, bl, 4, batch, 4, 5, 6, l, l1, l2, -1.0, 0.5, 1, 0);
        matmul_case(dn, bl, 4, batch, 4, 5, 6, l, l1, l2, 1.0, 0.0, 1, 1);
        matmul_case(dn, bl, 3, batch, 9, 7, 3, l, l1, l2, 2.0, 0.0, 0, 1);
    }
    /* a (3, M, K) and b (2, 1, K, N) broadcast to (2, 3, ...): a partial broadcast on each. */
    for (int i = 0; i < 2; i++) {
        ts_device *dev = i ? bl : dn;
        if (!dev)
            continue;
        kt_buf a3 = kt_make(dev, TS_F32, 3, (int64_t[]){3, 4, 5}, KT_TRANSPOSED, 13);
        kt_buf b4 = kt_make(dev, TS_F32, 4, (int64_t[]){2, 1, 5, 6}, KT_STRIDED, 14);
        kt_buf c = kt_make(dev, TS_F32, 4, (int64_t[]){2, 3, 4, 6}, KT_OFFSET, 12);
        ts_operand ab = kt_broadcast(&a3.op, 4, (int64_t[]){2, 3, 4, 5});
        ts_operand bb = kt_broadcast(&b4.op, 4, (int64_t[]){2, 3, 5, 6});
        double *ref, *got = run_matmul(dev, &ab, &bb, &c.op, 1.0, 0.0, &ref);
        compare("matmul both partially broadcast", "float64 reference", got, ref, 144, 1e-4);
        free(got);
        free(ref);
        kt_free(&c);
        kt_free(&b4);
        kt_free(&a3);
    }
    kt_check_no_live_blocks(dn);
}

/* K == 0: out = beta * out; M or N == 0: nothing; beta 0 overwrites NaN. */
static void test_matmul_empty(void)
{
    ts_device *dn = load_onednn(), *bl = load_blas();
    for (int lc = 0; lc < KT_NLAYOUTS; lc++) {
        matmul_case(dn, bl, 2, NULL, 3, 0, 4, KT_CONTIG, KT_CONTIG, lc, 1.0, 0.0, 0, 0);
        matmul_case(dn, bl, 2, NULL, 3, 0, 4, KT_TRANSPOSED, KT_STRIDED, lc, 1.0, 2.5, 0, 0);
        matmul_case(dn, bl, 2, NULL, 0, 3, 4, KT_CONTIG, KT_CONTIG, lc, 1.0, 1.0, 0, 0);
        matmul_case(dn, bl, 2, NULL, 3, 4, 0, KT_CONTIG, KT_CONTIG, lc, 1.0, 1.0, 0, 0);
        kt_buf a = kt_make(dn, TS_F32, 2, (int64_t[]){3, 2}, KT_CONTIG, 1);
        kt_buf b = kt_make(dn, TS_F32, 2, (int64_t[]){2, 4}, KT_CONTIG, 2);
        kt_buf c = kt_make(dn, TS_F32, 2, (int64_t[]){3, 4}, lc, 3);
        kt_set(&c.op, (int64_t[]){1, 2}, NAN);
        double *ref, *got = run_matmul(dn, &a.op, &b.op, &c.op, 1.0, 0.0, &ref);
        compare("matmul NaN in out, beta 0", "float64 reference", got, ref, 12, 1e-5);
        free(got);
        free(ref);
        kt_free(&c);
        kt_free(&b);
        kt_free(&a);
    }
    kt_check_no_live_blocks(dn);
}

/* out is exactly a (square, in place). */
static void test_matmul_in_place(void)
{
    ts_device *dn = load_onednn();
    kt_buf a = kt_make(dn, TS_F32, 2, (int64_t[]){8, 8}, KT_CONTIG, 4);
    kt_buf acopy = kt_make(dn, TS_F32, 2, (int64_t[]){8, 8}, KT_CONTIG, 4);
    kt_buf b = kt_make(dn, TS_F32, 2, (int64_t[]){8, 8}, KT_TRANSPOSED, 5);
    kt_buf ref = kt_make(dn, TS_F32, 2, (int64_t[]){8, 8}, KT_CONTIG, 6);
    ts_matmul_params p = {.alpha = 1.0, .beta = 0.5};
    CHECK_OK(kt_run(dn, TS_OP_MATMUL, (ts_operand[]){acopy.op, b.op}, 2, &acopy.op, 1, &p,
                    sizeof p));
    /* acopy now holds a @ b + 0.5 a computed in place; redo it out of place from a fresh a */
    kt_buf a2 = kt_make(dn, TS_F32, 2, (int64_t[]){8, 8}, KT_CONTIG, 4);
    kt_buf out = kt_make(dn, TS_F32, 2, (int64_t[]){8, 8}, KT_CONTIG, 4);
    CHECK_OK(kt_run(dn, TS_OP_MATMUL, (ts_operand[]){a2.op, b.op}, 2, &out.op, 1, &p, sizeof p));
    for (int64_t i = 0; i < 64; i++) {
        int64_t idx[2] = {i / 8, i % 8};
        CHECK(kt_close(kt_get(&acopy.op, idx), kt_get(&out.op, idx), 1e-5, 1e-5));
    }
    kt_free(&out);
    kt_free(&a2);
    kt_free(&ref);
    kt_free(&b);
    kt_free(&acopy);
    kt_free(&a);
    kt_check_no_live_blocks(dn);
}

/* Products with enough work run in parts, one thread each: cut along the first batch dim
 * that divides evenly enough, or else the rows, into one part per configured thread. Under
 * threads = 3 (parts of 8, 8 and 9 matrices, or of 66, 67 and 67 rows, need two primitives
 * where the whole product needs one; a small product is not cut), every layout and
 * broadcast, and bfloat16 (each element the exact sum of small integers rounded once); under
 * threads = 8 the product runs whole. */
static void test_matmul_parts(void)
{
    tap_start();
    if (!has_plugin("cpu_onednn"))
        SKIP("cpu_onednn is not built");
    ts_config *cfg;
    CHECK_OK(ts_config_parse("[plugin.cpu_onednn]\nthreads = 3\nadaptive_threads = false\n",
                             "t.ini", NULL, &cfg));
    ts_device *dn;
    CHECK_OK(ts_device_load(cfg, tap_plugin_under_test("cpu_onednn"), &dn));
    count_fn count = primitive_counter(dn);
    const int64_t b6[2] = {1, 6}, b25 = 25, b4 = 4;
    for (int l = 0; l < KT_NLAYOUTS; l++) {
        int l1 = (l + 1) % KT_NLAYOUTS, l2 = (l + 2) % KT_NLAYOUTS;
        /* a batch of 6 in 3 parts: b broadcast (a linear layer), a broadcast, neither; a 4-D
         * product whose first dim is 1 is cut along its second */
        matmul_case(dn, NULL, 3, b6 + 1, 64, 128, 80, l, l1, l2, 1.0, 0.0, 0, 1);
        matmul_case(dn, NULL, 3, b6 + 1, 64, 128, 80, l, l1, l2, -0.5, 2.0, 1, 0);
        matmul_case(dn, NULL, 4, b6, 64, 128, 80, l2, l, l1, 1.0, 1.0, 0, 0);
        unsigned long long c0 = count();
        matmul_case(dn, NULL, 3, &b25, 32, 64, 64, l, l1, l2, 1.0, 0.0, 0, 0);
        CHECK_MSG(count() - c0 == 2, "a batch of 25 in 3 parts made %llu primitives, not 2",
                  count() - c0);
        c0 = count();
        matmul_case(dn, NULL, 2, NULL, 200, 150, 120, l, l1, l2, 1.5, -0.75, 0, 0);
        CHECK_MSG(count() - c0 == 2, "200 rows in 3 parts made %llu primitives, not 2",
                  count() - c0);
        c0 = count();
        matmul_case(dn, NULL, 3, &b4, 128, 64, 128, l, l1, l2, 1.0, 0.0, 0, 1);
        CHECK_MSG(count() - c0 == 2, "a batch of 4 by rows in 3 parts made %llu primitives, "
                  "not 2", count() - c0);
        c0 = count();
        matmul_case(dn, NULL, 3, &b25, 8, 8, 8, l, l1, l2, 1.0, 0.0, 0, 0);
        CHECK_MSG(count() - c0 == 1, "a small product made %llu primitives, not 1",
                  count() - c0);
    }
    kt_buf a = kt_make(dn, TS_BF16, 3, (int64_t[]){6, 64, 128}, KT_CONTIG, 1);
    kt_buf b = kt_make(dn, TS_BF16, 3, (int64_t[]){6, 128, 80}, KT_TRANSPOSED, 2);
    kt_buf c = kt_make(dn, TS_BF16, 3, (int64_t[]){6, 64, 80}, KT_STRIDED, 3);
    ts_matmul_params mp = {1.0, 0.0};
    CHECK_OK(kt_run(dn, TS_OP_MATMUL, (ts_operand[]){a.op, b.op}, 2, &c.op, 1, &mp, sizeof mp));
    for (int64_t q = 0; q < 6; q++)
        for (int64_t i = 0; i < 64; i++)
            for (int64_t j = 0; j < 80; j++) {
                double sum = 0;
                for (int64_t k = 0; k < 128; k++)
                    sum += kt_get(&a.op, (int64_t[]){q, i, k}) * kt_get(&b.op, (int64_t[]){q, k, j});
                double want = ts_plugin_bf16_to_f32(ts_plugin_f64_to_bf16(sum));
                double got = kt_get(&c.op, (int64_t[]){q, i, j});
                CHECK_MSG(got == want, "bfloat16 matmul in parts (%lld, %lld, %lld): %.9g, not "
                          "%.9g", (long long)q, (long long)i, (long long)j, got, want);
            }
    kt_check_gaps(&c);
    kt_free(&a), kt_free(&b), kt_free(&c);
    kt_check_no_live_blocks(dn);
    ts_device_unload(dn);
    ts_config_free(cfg);
    /* With more than 4 threads configured the products run whole, on oneDNN's partitioning. */
    CHECK_OK(ts_config_parse("[plugin.cpu_onednn]\nthreads = 8\nadaptive_threads = false\n",
                             "t.ini", NULL, &cfg));
    CHECK_OK(ts_device_load(cfg, tap_plugin_under_test("cpu_onednn"), &dn));
    const int64_t b65 = 65; /* 8 parts of 8 or 9 matrices, were it cut: two primitives */
    unsigned long long c0 = count();
    matmul_case(dn, NULL, 3, &b65, 32, 64, 64, KT_CONTIG, KT_TRANSPOSED, KT_CONTIG, 1.0, 0.0, 0, 0);
    CHECK_MSG(count() - c0 == 1, "threads = 8: a batch of 65 made %llu primitives, not 1 (whole)",
              count() - c0);
    kt_check_no_live_blocks(dn);
    ts_device_unload(dn);
    ts_config_free(cfg);
    tap_end();
}

/* The parts' bits do not depend on how many threads run them: threads = 3 with 1 running
 * (TESSERA_RUN_THREADS=1, as adaptive_threads would leave under load) and with 3, the same
 * bits for products cut along a batch dim and along the rows (a weight gradient's long K),
 * in float32 and bfloat16. (Run whole on oneDNN's threads, the float32 row case differs in
 * 424 of 24000 elements under ONEDNN_MAX_CPU_ISA=AVX2; AVX-512's kernels happened to agree.) */
static void test_matmul_parts_bits(void)
{
    tap_start();
    if (!has_plugin("cpu_onednn"))
        SKIP("cpu_onednn is not built");
    static const struct {
        int nd;
        int64_t a[3], b[3];
        kt_layout la, lb;
    } cases[] = {
        {3, {6, 64, 128}, {6, 128, 80}, KT_CONTIG, KT_TRANSPOSED},
        {2, {200, 2048}, {2048, 120}, KT_TRANSPOSED, KT_CONTIG},
    };
    enum { NCASE = sizeof cases / sizeof cases[0] };
    double *got[2][2][NCASE];
    int64_t n[NCASE];
    for (int run = 0; run < 2; run++) {
        setenv("TESSERA_RUN_THREADS", run ? "3" : "1", 1);
        ts_config *cfg;
        CHECK_OK(ts_config_parse("[plugin.cpu_onednn]\nthreads = 3\nadaptive_threads = false\n",
                                 "t.ini", NULL, &cfg));
        ts_device *dn;
        CHECK_OK(ts_device_load(cfg, tap_plugin_under_test("cpu_onednn"), &dn));
        for (int h = 0; h < 2; h++)
            for (int i = 0; i < NCASE; i++) {
                int nd = cases[i].nd;
                int32_t dt = h ? TS_BF16 : TS_F32;
                int64_t cs[3];
                memcpy(cs, cases[i].a, sizeof cs);
                cs[nd - 1] = cases[i].b[nd - 1];
                kt_buf a = kt_make(dn, dt, nd, cases[i].a, cases[i].la, 1);
                kt_buf b = kt_make(dn, dt, nd, cases[i].b, cases[i].lb, 2);
                kt_buf c = kt_make(dn, dt, nd, cs, KT_CONTIG, 3);
                ts_matmul_params mp = {1.0, 0.0};
                CHECK_OK(kt_run(dn, TS_OP_MATMUL, (ts_operand[]){a.op, b.op}, 2, &c.op, 1, &mp,
                                sizeof mp));
                got[run][h][i] = snapshot(&c.op);
                n[i] = kt_numel(&c.op);
                kt_free(&a), kt_free(&b), kt_free(&c);
            }
        kt_check_no_live_blocks(dn);
        ts_device_unload(dn);
        ts_config_free(cfg);
    }
    setenv("TESSERA_RUN_THREADS", "4096", 1);
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < NCASE; i++) {
            int64_t differ = 0;
            for (int64_t e = 0; e < n[i]; e++)
                differ += memcmp(&got[0][h][i][e], &got[1][h][i][e], sizeof(double)) != 0;
            CHECK_MSG(differ == 0, "%s case %d: %lld of %lld elements differ between 1 and 3 "
                      "running threads", h ? "bfloat16" : "float32", i, (long long)differ,
                      (long long)n[i]);
            free(got[0][h][i]), free(got[1][h][i]);
        }
    tap_end();
}

/* ---------------------------------------------------------------------------------------- */
/* conv2d, forward and backward                                                              */

typedef struct conv_case {
    int64_t N, C, H, W, K, R, S;
    ts_conv2d_params p;
    int bias;
    kt_layout lx, lw, ly;
} conv_case;

#define CONVP(st, pd, dl, g) {(st), (st), (pd), (pd), (dl), (dl), (g)}

static const conv_case conv_cases[] = {
    /* N C H W K R S params bias lx lw ly */
    {2, 3, 7, 8, 4, 3, 3, CONVP(1, 0, 1, 1), 0, KT_CONTIG, KT_CONTIG, KT_CONTIG},
    {2, 3, 7, 8, 4, 3, 3, CONVP(1, 1, 1, 1), 1, KT_CONTIG, KT_CONTIG, KT_CONTIG},
    {2, 3, 9, 8, 5, 3, 3, CONVP(2, 1, 1, 1), 1, KT_STRIDED, KT_CONTIG, KT_CONTIG},
    {1, 2, 11, 10, 3, 3, 2, CONVP(1, 2, 2, 1), 0, KT_TRANSPOSED, KT_OFFSET, KT_STRIDED},
    {2, 4, 8, 8, 6, 3, 3, CONVP(1, 1, 1, 2), 1, KT_OFFSET, KT_TRANSPOSED, KT_TRANSPOSED},
    {2, 4, 8, 8, 6, 3, 3, CONVP(2, 1, 2, 2), 0, KT_STRIDED, KT_STRIDED, KT_OFFSET},
    {2, 4, 9, 7, 4, 3, 3, CONVP(1, 1, 1, 4), 1, KT_CONTIG, KT_CONTIG, KT_CONTIG},
    {1, 3, 9, 7, 6, 3, 3, CONVP(2, 1, 1, 3), 0, KT_TRANSPOSED, KT_STRIDED, KT_CONTIG},
    {2, 5, 4, 6, 3, 1, 1, CONVP(1, 0, 1, 1), 1, KT_CONTIG, KT_CONTIG, KT_CONTIG},
    {2, 4, 4, 6, 4, 1, 1, CONVP(1, 0, 1, 2), 1, KT_STRIDED, KT_TRANSPOSED, KT_STRIDED},
    {2, 3, 6, 5, 4, 3, 1, CONVP(1, 0, 1, 1), 1, KT_CONTIG, KT_CONTIG, KT_CONTIG},
    /* stride 2 where the window does not tile the input (right padding < left) */
    {1, 2, 8, 8, 3, 3, 3, CONVP(2, 0, 1, 1), 1, KT_CONTIG, KT_OFFSET, KT_CONTIG},
    /* LeNet-5 shaped, and wide enough for blocked layouts */
    {4, 1, 28, 28, 6, 5, 5, CONVP(1, 2, 1, 1), 1, KT_CONTIG, KT_CONTIG, KT_CONTIG},
    {4, 6, 14, 14, 16, 5, 5, CONVP(1, 0, 1, 1), 1, KT_CONTIG, KT_CONTIG, KT_CONTIG},
    {2, 32, 10, 10, 48, 3, 3, CONVP(1, 1, 1, 1), 1, KT_OFFSET, KT_CONTIG, KT_STRIDED},
    {2, 32, 10, 10, 32, 3, 3, CONVP(1, 1, 1, 32), 0, KT_CONTIG, KT_CONTIG, KT_CONTIG},
    /* kernel as large as the padded input */
    {1, 2, 3, 3, 2, 5, 5, CONVP(1, 1, 1, 1), 1, KT_CONTIG, KT_CONTIG, KT_CONTIG},
};

static int64_t conv_out(int64_t in, int pad, int dil, int64_t k, int stride)
{
    return (in + 2 * pad - dil * (k - 1) - 1) / stride + 1;
}

/* Float64 references of the three ops over dense (row-major) double arrays, from x, w, bias,
 * gy as given. */
typedef struct conv_ref {
    double *y, *gx, *gw;
} conv_ref;

static conv_ref conv_reference(const conv_case *cc, int64_t P, int64_t Q, const ts_operand *x,
                               const ts_operand *w, const ts_operand *bias,
                               const ts_operand *gy)
{
    const ts_conv2d_params *p = &cc->p;
    int64_t G = p->groups, Cg = cc->C / G, Kg = cc->K / G;
    conv_ref r;
    r.y = calloc((size_t)(cc->N * cc->K * P * Q) + 1, sizeof(double));
    r.gx = calloc((size_t)(cc->N * cc->C * cc->H * cc->W) + 1, sizeof(double));
    r.gw = calloc((size_t)(cc->K * Cg * cc->R * cc->S) + 1, sizeof(double));
    CHECK(r.y && r.gx && r.gw);
    for (int64_t n = 0; n < cc->N; n++)
        for (int64_t k = 0; k < cc->K; k++)
            for (int64_t pp = 0; pp < P; pp++)
                for (int64_t q = 0; q < Q; q++) {
                    int64_t g = k / Kg, yi = ((n * cc->K + k) * P + pp) * Q + q;
                    double acc = cc->bias ? kt_get(bias, (int64_t[]){k}) : 0.0;
                    double gyv = kt_get(gy, (int64_t[]){n, k, pp, q});
                    for (int64_t c = 0; c < Cg; c++)
                        for (int64_t rr = 0; rr < cc->R; rr++)
                            for (int64_t s = 0; s < cc->S; s++) {
                                int64_t hh = pp * p->stride_h - p->pad_h + rr * p->dilation_h;
                                int64_t ww = q * p->stride_w - p->pad_w + s * p->dilation_w;
                                if (hh < 0 || hh >= cc->H || ww < 0 || ww >= cc->W)
                                    continue;
                                int64_t ci = g * Cg + c;
                                double xv = kt_get(x, (int64_t[]){n, ci, hh, ww});
                                double wv = kt_get(w, (int64_t[]){k, c, rr, s});
                                acc += xv * wv;
                                r.gx[((n * cc->C + ci) * cc->H + hh) * cc->W + ww] += gyv * wv;
                                r.gw[((k * Cg + c) * cc->R + rr) * cc->S + s] += gyv * xv;
                            }
                    r.y[yi] = acc;
                }
    return r;
}

/* One conv case, all three ops, on cpu_onednn and cpu_blas; checks both against the
 * reference and each other. */
static void run_conv_case(ts_device *dn, ts_device *bl, const conv_case *cc)
{
    const ts_conv2d_params *p = &cc->p;
    int64_t G = p->groups, Cg = cc->C / G;
    int64_t P = conv_out(cc->H, p->pad_h, p->dilation_h, cc->R, p->stride_h);
    int64_t Q = conv_out(cc->W, p->pad_w, p->dilation_w, cc->S, p->stride_w);
    int64_t xs[4] = {cc->N, cc->C, cc->H, cc->W}, ws[4] = {cc->K, Cg, cc->R, cc->S};
    int64_t ys[4] = {cc->N, cc->K, P, Q};
    ts_device *devs[2] = {dn, bl};
    double *res[2][3] = {{NULL}};
    conv_ref ref = {NULL, NULL, NULL};
    int64_t ny = ys[0] * ys[1] * P * Q, nx = xs[0] * xs[1] * xs[2] * xs[3];
    int64_t nw = ws[0] * ws[1] * ws[2] * ws[3];
    for (int i = 0; i < 2; i++) {
        ts_device *dev = devs[i];
        if (!dev)
            continue;
        kt_buf x = kt_make(dev, TS_F32, 4, xs, cc->lx, 21);
        kt_buf w = kt_make(dev, TS_F32, 4, ws, cc->lw, 22);
        kt_buf bias = kt_make(dev, TS_F32, 1, (int64_t[]){cc->K},
                              cc->lx == KT_STRIDED ? KT_STRIDED : KT_OFFSET, 23);
        kt_buf y = kt_make(dev, TS_F32, 4, ys, cc->ly, 24);
        kt_buf gy = kt_make(dev, TS_F32, 4, ys, cc->ly, 25);
        kt_buf gx = kt_make(dev, TS_F32, 4, xs, cc->lx, 26);
        kt_buf gw = kt_make(dev, TS_F32, 4, ws, cc->lw, 27);
        if (i == 0)
            ref = conv_reference(cc, P, Q, &x.op, &w.op, &bias.op, &gy.op);
        CHECK_OK(kt_run(dev, TS_OP_CONV2D, (ts_operand[]){x.op, w.op, bias.op}, cc->bias ? 3 : 2,
                        &y.op, 1, p, sizeof *p));
        CHECK_OK(kt_run(dev, TS_OP_CONV2D_BWD_DATA, (ts_operand[]){gy.op, w.op}, 2, &gx.op, 1,
                        p, sizeof *p));
        CHECK_OK(kt_run(dev, TS_OP_CONV2D_BWD_WEIGHT, (ts_operand[]){gy.op, x.op}, 2, &gw.op, 1,
                        p, sizeof *p));
        res[i][0] = snapshot(&y.op);
        res[i][1] = snapshot(&gx.op);
        res[i][2] = snapshot(&gw.op);
        kt_check_gaps(&y);
        kt_check_gaps(&gx);
        kt_check_gaps(&gw);
        kt_free(&gw);
        kt_free(&gx);
        kt_free(&gy);
        kt_free(&y);
        kt_free(&bias);
        kt_free(&w);
        kt_free(&x);
    }
    char what[3][200];
    static const char *const ops[3] = {"conv2d", "conv2d_bwd_data", "conv2d_bwd_weight"};
    for (int o = 0; o < 3; o++)
        snprintf(what[o], sizeof what[o], "%s N=%lld C=%lld H=%lld W=%lld K=%lld R=%lld S=%lld "
                 "groups=%d stride=%d pad=%d dil=%d bias=%d x=%s w=%s y=%s", ops[o],
                 (long long)cc->N, (long long)cc->C, (long long)cc->H, (long long)cc->W,
                 (long long)cc->K, (long long)cc->R, (long long)cc->S, (int)G, (int)p->stride_h,
                 (int)p->pad_h, (int)p->dilation_h, cc->bias, kt_layout_name(cc->lx),
                 kt_layout_name(cc->lw), kt_layout_name(cc->ly));
    /* terms per output: Cg*R*S (y), Kg*R*S (gx, at most), N*P*Q (gw) */
    double at[3] = {1e-6 * (double)(Cg * cc->R * cc->S + 1) * 4.0,
                    1e-6 * (double)(cc->K / G * cc->R * cc->S + 1) * 4.0,
                    1e-6 * (double)(cc->N * P * Q + 1) * 4.0};
    const double *refs[3] = {ref.y, ref.gx, ref.gw};
    int64_t counts[3] = {ny, nx, nw};
    for (int o = 0; o < 3; o++) {
        compare(what[o], "float64 reference", res[0][o], refs[o], counts[o], at[o]);
        if (res[1][o])
            compare_dev("cpu_blas", what[o], "float64 reference", res[1][o], refs[o],
                        counts[o], at[o]);
    }
    for (int i = 0; i < 2; i++)
        for (int o = 0; o < 3; o++)
            free(res[i][o]);
    free(ref.y);
    free(ref.gx);
    free(ref.gw);
}

static void test_conv_supports(void)
{
    ts_device *dn = load_onednn();
    static const int32_t ops[] = {TS_OP_CONV2D, TS_OP_CONV2D_BWD_DATA, TS_OP_CONV2D_BWD_WEIGHT};
    for (int i = 0; i < 3; i++) {
        CHECK(ts_device_supports(dn, ops[i], TS_F32));
        CHECK(!ts_device_supports(dn, ops[i], TS_F64));
    }
    /* what the shared host kernels do stays supported */
    CHECK(ts_device_supports(dn, TS_OP_COPY, TS_F64));
    CHECK(ts_device_supports(dn, TS_OP_MAXPOOL2D, TS_F32));
}

static void test_conv(void)
{
    ts_device *dn = load_onednn(), *bl = load_blas();
    for (size_t i = 0; i < sizeof conv_cases / sizeof conv_cases[0]; i++) {
        run_conv_case(dn, bl, &conv_cases[i]);
        conv_case flipped = conv_cases[i];
        flipped.bias = !flipped.bias;
        run_conv_case(dn, bl, &flipped);
    }
    kt_check_no_live_blocks(dn);
}

/* A convolution whose output is its input (the ABI allows an output to be exactly an input)
 * and the same shapes out of place share no cached primitive: each order, out of place then
 * in place and in place then out of place, gives the out-of-place result, and the in-place
 * call writes nothing between the strided view's elements. */
static void test_conv_in_place_and_not(void)
{
    ts_device *dn = load_onednn();
    const ts_conv2d_params p = CONVP(1, 1, 1, 1);
    for (int order = 0; order < 2; order++) {
        const int64_t side = 5 + order; /* a shape of its own for each order: fresh keys */
        const int64_t shape[4] = {1, 4, side, side};
        kt_buf x = kt_make(dn, TS_F32, 4, shape, KT_STRIDED, 1);
        kt_buf x2 = kt_make(dn, TS_F32, 4, shape, KT_STRIDED, 1); /* x's values: in place */
        kt_buf y = kt_make(dn, TS_F32, 4, shape, KT_STRIDED, 3);
        kt_buf w = kt_make(dn, TS_F32, 4, (int64_t[]){4, 4, 3, 3}, KT_CONTIG, 2);
        for (int step = 0; step < 2; step++) {
            if ((step == 0) == (order == 0))
                CHECK_OK(kt_run(dn, TS_OP_CONV2D, (ts_operand[]){x.op, w.op}, 2, &y.op, 1, &p,
                                sizeof p));
            else
                CHECK_OK(kt_run(dn, TS_OP_CONV2D, (ts_operand[]){x2.op, w.op}, 2, &x2.op, 1, &p,
                                sizeof p));
        }
        int64_t n = kt_numel(&y.op), bad = 0;
        for (int64_t e = 0; e < n; e++) {
            int64_t id[4];
            kt_unravel(&y.op, e, id);
            double a = kt_get(&y.op, id), b = kt_get(&x2.op, id);
            if (!kt_close(b, a, 1e-5, 1e-5) && bad++ < 3)
                CHECK_MSG(0, "order %d: in place %.9g, out of place %.9g at %lld", order, b, a,
                          (long long)e);
        }
        CHECK_INT_EQ(bad, 0);
        kt_check_gaps(&x2);
        kt_check_gaps(&y);
        kt_free(&x), kt_free(&x2), kt_free(&y), kt_free(&w);
    }
    kt_check_no_live_blocks(dn);
}

/* The checks and messages of cpu_blas. */
static void test_conv_bad_params(void)
{
    ts_device *dn = load_onednn();
    kt_buf x = kt_make(dn, TS_F32, 4, (int64_t[]){1, 4, 6, 6}, KT_CONTIG, 1);
    kt_buf w = kt_make(dn, TS_F32, 4, (int64_t[]){4, 2, 3, 3}, KT_CONTIG, 2);
    kt_buf y = kt_make(dn, TS_F32, 4, (int64_t[]){1, 4, 4, 4}, KT_CONTIG, 3);
    ts_operand in[2] = {x.op, w.op}, wei[2] = {y.op, x.op};
    ts_conv2d_params ok = CONVP(1, 0, 1, 2), p = ok;
    CHECK_OK(kt_run(dn, TS_OP_CONV2D, in, 2, &y.op, 1, &ok, sizeof ok));
    p.stride_h = 0;
    CHECK_FAILS(kt_run(dn, TS_OP_CONV2D, in, 2, &y.op, 1, &p, sizeof p), TS_EINVAL, "stride");
    p = ok;
    p.groups = 3;
    CHECK_FAILS(kt_run(dn, TS_OP_CONV2D, in, 2, &y.op, 1, &p, sizeof p), TS_EINVAL, "groups");
    p = ok;
    p.dilation_h = 4;
    CHECK_FAILS(kt_run(dn, TS_OP_CONV2D, in, 2, &y.op, 1, &p, sizeof p), TS_EINVAL, "fit");
    p = ok;
    p.pad_h = 1;
    CHECK_FAILS(kt_run(dn, TS_OP_CONV2D, in, 2, &y.op, 1, &p, sizeof p), TS_ESHAPE, "expected");
    CHECK_FAILS(kt_run(dn, TS_OP_CONV2D, in, 2, &y.op, 1, NULL, 0), TS_EINVAL, "params");
    CHECK_FAILS(kt_run(dn, TS_OP_CONV2D_BWD_WEIGHT, wei, 2, &w.op, 1, &p, sizeof p), TS_ESHAPE,
                "conv2d_bwd_weight", "gy");
    CHECK_FAILS(kt_run(dn, TS_OP_CONV2D_BWD_DATA, wei, 1, &x.op, 1, &ok, sizeof ok), TS_EINVAL,
                "2 inputs");
    kt_free(&y);
    kt_free(&w);
    kt_free(&x);
    kt_check_no_live_blocks(dn);
}

/* ---------------------------------------------------------------------------------------- */
/* unary and softmax: oneDNN for large dense F32 operands, the host kernels otherwise          */

/* Enough elements for the oneDNN path (cpu_onednn's DN_UNARY_MIN is 65536). */
static const int64_t big3[3] = {4, 129, 128};

/* The value of element i of an eltwise test input: special values first, then a spread that
 * covers where each function's approximation changes regime (exp overflow and underflow,
 * tanh and sigmoid saturation, log near 1 and of denormals). */
static double special_input(int32_t fn, int64_t i, int with_nan)
{
    if (i == 0 && !with_nan)
        return 0.25;
    static const double sp[] = {NAN, INFINITY, -INFINITY, 0.0, -0.0, 1.0, -1.0, 1e-40, 88.0,
                                89.0, -87.0, -104.0, -110.0, 1e-7, -1e-7, 20.0, -20.0, 9.0, -9.0};
    int64_t nsp = (int64_t)(sizeof sp / sizeof sp[0]);
    if (i < nsp)
        return sp[i];
    double t = (double)((i * 7919) % 6000) / 6000.0; /* [0, 1), scrambled */
    if (fn == TS_UNARY_LOG || fn == TS_UNARY_SQRT)
        return ldexp(0.5 + t, (int)(i % 60) - 30); /* positive, 2^-31 .. 2^30 */
    return (t - 0.5) * 60.0;                       /* [-30, 30) */
}

/* What the functions compute, in double. */
static double unary_ref(int32_t fn, double x)
{
    switch (fn) {
    case TS_UNARY_EXP:
        return exp(x);
    case TS_UNARY_LOG:
        return log(x);
    case TS_UNARY_TANH:
        return tanh(x);
    case TS_UNARY_SIGMOID:
        return 1.0 / (1.0 + exp(-x));
    case TS_UNARY_SQRT:
        return sqrt(x);
    case TS_UNARY_RELU:
        return x < 0 ? 0.0 : x;
    case TS_UNARY_GELU:
        return 0.5 * x * erfc(-x / sqrt(2.0));
    default:
        return -x;
    }
}

/* Runs fn on big3 in layout lo (in place or not; with a NaN as the first element or not) on
 * cpu_onednn and cpu_blas; checks against
 * the float32 rounding of the double reference (rtol 1e-5, as the kernel tests, or atol 1e-37 for results in
 * float32's denormal range) and against cpu_blas. created: what the first cpu_onednn call
 * must do to the primitive count: 1 create (the oneDNN path, on a shape not seen yet), 0
 * create none (the host kernels), -1 either (a shape seen before). */
static void check_unary(ts_device *dn, ts_device *bl, int32_t fn, kt_layout lo, int in_place,
                        int with_nan, int created)
{
    count_fn count = primitive_counter(dn);
    ts_device *devs[2] = {dn, bl};
    double *res[2] = {NULL, NULL}, *in = NULL;
    int64_t n = 0;
    for (int d = 0; d < 2; d++) {
        if (!devs[d])
            continue;
        kt_buf a = kt_make(devs[d], TS_F32, 3, big3, lo, 1);
        kt_buf o = kt_make(devs[d], TS_F32, 3, big3, lo, 2);
        n = kt_numel(&a.op);
        int64_t idx[3];
        for (int64_t i = 0; i < n; i++) {
            kt_unravel(&a.op, i, idx);
            kt_set(&a.op, idx, special_input(fn, i, with_nan));
        }
        if (d == 0)
            in = snapshot(&a.op);
        ts_unary_params p = {fn};
        const ts_operand *out = in_place ? &a.op : &o.op;
        unsigned long long c0 = count();
        CHECK_OK(kt_run(devs[d], TS_OP_UNARY, &a.op, 1, out, 1, &p, sizeof p));
        unsigned long long c1 = count();
        if (d == 0 && created >= 0)
            CHECK_MSG((c1 > c0) == created, "unary %d %s: primitives %llu -> %llu, expected %s",
                      (int)fn, kt_layout_name(lo), c0, c1, created ? "a new one" : "none");
        res[d] = snapshot(out);
        kt_check_gaps(in_place ? &a : &o);
        kt_free(&o);
        kt_free(&a);
    }
    for (int64_t i = 0; i < n; i++) {
        double want = (double)(float)unary_ref(fn, in[i]);
        CHECK_MSG(kt_close(res[0][i], want, 1e-5, 1e-37),
                  "unary %d %s%s: f(%.9g) = %.9g, expected %.9g", (int)fn, kt_layout_name(lo),
                  in_place ? " in place" : "", in[i], res[0][i], want);
        if (res[1])
            CHECK_MSG(kt_close(res[1][i], want, 1e-5, 1e-37),
                      "unary %d %s: f(%.9g): cpu_blas %.9g, expected %.9g", (int)fn,
                      kt_layout_name(lo), in[i], res[1][i], want);
    }
    free(in);
    free(res[0]);
    free(res[1]);
}

static void test_unary(void)
{
    ts_device *dn = load_onednn(), *bl = load_blas();
    static const int32_t on_dnnl[] = {TS_UNARY_EXP, TS_UNARY_TANH, TS_UNARY_SIGMOID};
    static const int32_t on_host[] = {TS_UNARY_LOG, TS_UNARY_SQRT, TS_UNARY_RELU, TS_UNARY_GELU,
                                      TS_UNARY_NEG};
    for (size_t f = 0; f < sizeof on_dnnl / sizeof on_dnnl[0]; f++) {
        check_unary(dn, bl, on_dnnl[f], KT_CONTIG, 0, 0, 1);
        check_unary(dn, bl, on_dnnl[f], KT_OFFSET, 0, 0, 0); /* the same cached primitive */
        check_unary(dn, bl, on_dnnl[f], KT_CONTIG, 1, 0, 0);
        check_unary(dn, bl, on_dnnl[f], KT_CONTIG, 0, 1, 0);     /* a NaN: host kernel */
        check_unary(dn, bl, on_dnnl[f], KT_STRIDED, 0, 0, 0);    /* host kernel */
        check_unary(dn, bl, on_dnnl[f], KT_TRANSPOSED, 0, 0, 0); /* host kernel */
    }
    for (size_t f = 0; f < sizeof on_host / sizeof on_host[0]; f++)
        for (int l = 0; l < KT_NLAYOUTS; l++)
            check_unary(dn, bl, on_host[f], l, l == KT_OFFSET, 1, 0);
    kt_check_no_live_blocks(dn);
}

/* Softmax (op) over dim of a shape-sh tensor in layout lo (in place or not; with a NaN, +inf,
 * -inf and a large value or not) on cpu_onednn and cpu_blas, against a double reference and
 * each other. Rows holding NaN or +inf are NaN; -inf gives 0 (log: -inf). */
static void check_softmax(ts_device *dn, ts_device *bl, const int64_t *sh, int32_t op, int dim,
                          kt_layout lo, int in_place, int specials)
{
    ts_device *devs[2] = {dn, bl};
    double *res[2] = {NULL, NULL}, *in = NULL;
    int64_t n = 0;
    for (int d = 0; d < 2; d++) {
        if (!devs[d])
            continue;
        kt_buf a = kt_make(devs[d], TS_F32, 3, sh, lo, 31);
        kt_buf o = kt_make(devs[d], TS_F32, 3, sh, lo, 32);
        n = kt_numel(&a.op);
        if (specials) {
            kt_set(&a.op, (int64_t[]){0, 0, 0}, NAN);
            kt_set(&a.op, (int64_t[]){1, 2, 3}, INFINITY);
            kt_set(&a.op, (int64_t[]){2, 4, 5}, -INFINITY);
            kt_set(&a.op, (int64_t[]){2, 7, 9}, 80.0);
        }
        if (d == 0)
            in = snapshot(&a.op);
        ts_dim_params p = {dim};
        const ts_operand *out = in_place ? &a.op : &o.op;
        CHECK_OK(kt_run(devs[d], op, &a.op, 1, out, 1, &p, sizeof p));
        res[d] = snapshot(out);
        kt_check_gaps(in_place ? &a : &o);
        kt_free(&o);
        kt_free(&a);
    }
    /* Per slice (all elements but dim fixed): its max, then its sum of exp(x - max). */
    int nd = dim < 0 ? dim + 3 : dim;
    int64_t st = 1, len = sh[nd];
    for (int k = nd + 1; k < 3; k++)
        st *= sh[k];
    int64_t nslice = len ? n / len : 0;
    double *m = malloc(sizeof(double) * (size_t)(nslice + 1));
    double *sum = calloc((size_t)(nslice + 1), sizeof(double));
    CHECK(m && sum);
    for (int64_t j = 0; j < nslice; j++)
        m[j] = -INFINITY;
#define SLICE(i) ((i) / (st * len) * st + (i) % st)
    for (int64_t i = 0; i < n; i++)
        if (!isnan(m[SLICE(i)]) && (in[i] > m[SLICE(i)] || isnan(in[i])))
            m[SLICE(i)] = in[i];
    for (int64_t i = 0; i < n; i++)
        sum[SLICE(i)] += exp(in[i] - m[SLICE(i)]);
    const char *name = op == TS_OP_SOFTMAX ? "softmax" : "log_softmax";
    double atol = op == TS_OP_SOFTMAX ? 1e-37 : 1e-5;
    for (int64_t i = 0; i < n; i++) {
        int64_t j = SLICE(i);
        double want = op == TS_OP_SOFTMAX ? exp(in[i] - m[j]) / sum[j] : in[i] - m[j] - log(sum[j]);
        CHECK_MSG(kt_close(res[0][i], want, 1e-5, atol), "%s dim %d %s: element %lld %.9g, "
                  "expected %.9g", name, dim, kt_layout_name(lo), (long long)i, res[0][i], want);
        if (res[1])
            CHECK_MSG(kt_close(res[1][i], want, 1e-5, atol), "%s dim %d: element %lld: "
                      "cpu_blas %.9g, expected %.9g", name, dim, (long long)i, res[1][i], want);
    }
#undef SLICE
    free(m);
    free(sum);
    free(in);
    free(res[0]);
    free(res[1]);
}

static void test_softmax(void)
{
    ts_device *dn = load_onednn(), *bl = load_blas();
    count_fn count = primitive_counter(dn);
    /* 1M elements: oneDNN's softmax (cpu_onednn's DN_SOFTMAX_MIN); big3 stays on the host. */
    static const int64_t huge[3] = {4, 512, 512};
    for (int o = 0; o < 2; o++) {
        int32_t op = o ? TS_OP_LOG_SOFTMAX : TS_OP_SOFTMAX;
        for (int dim = -1; dim < 1; dim++) {
            unsigned long long c0 = count();
            check_softmax(dn, bl, huge, op, dim, KT_CONTIG, 0, 0);
            CHECK_MSG(count() == c0 + 1, "%d softmax dim %d: primitives %llu -> %llu", (int)op,
                      dim, c0, count());
        }
        unsigned long long c1 = count();
        check_softmax(dn, bl, huge, op, -1, KT_OFFSET, 1, 0); /* cached */
        check_softmax(dn, bl, huge, op, -1, KT_CONTIG, 0, 1); /* specials: host */
        CHECK_MSG(count() == c1, "softmax: %llu primitives, then %llu after two more calls", c1,
                  count());
        for (int dim = 0; dim < 3; dim++) /* small or strided: host */
            check_softmax(dn, bl, big3, op, dim, dim == 1 ? KT_STRIDED : KT_CONTIG, dim == 0,
                          dim == 2);
        CHECK(count() == c1);
    }
    kt_check_no_live_blocks(dn);
}

/* ---------------------------------------------------------------------------------------- */
/* primitive cache                                                                           */

/* One "training step": conv forward + both backward, matmuls (plain, transposed,
 * batched-broadcast, with beta), the unary functions that run on oneDNN (in place and not),
 * softmax and log-softmax on a 1M-element tensor, and a small softmax (host kernel). */
static void step(ts_device *dn, kt_buf *bufs)
{
    ts_conv2d_params p = CONVP(1, 2, 1, 1);
    kt_buf *x = &bufs[0], *w = &bufs[1], *b = &bufs[2], *y = &bufs[3], *gx = &bufs[4];
    kt_buf *gw = &bufs[5], *ma = &bufs[6], *mb = &bufs[7], *mc = &bufs[8], *bc = &bufs[9];
    CHECK_OK(kt_run(dn, TS_OP_CONV2D, (ts_operand[]){x->op, w->op, b->op}, 3, &y->op, 1, &p,
                    sizeof p));
    CHECK_OK(kt_run(dn, TS_OP_CONV2D_BWD_DATA, (ts_operand[]){y->op, w->op}, 2, &gx->op, 1, &p,
                    sizeof p));
    CHECK_OK(kt_run(dn, TS_OP_CONV2D_BWD_WEIGHT, (ts_operand[]){y->op, x->op}, 2, &gw->op, 1,
                    &p, sizeof p));
    ts_matmul_params mp = {1.0, 0.0}, mp2 = {1.0, 1.0};
    CHECK_OK(kt_run(dn, TS_OP_MATMUL, (ts_operand[]){ma->op, mb->op}, 2, &mc->op, 1, &mp,
                    sizeof mp));
    CHECK_OK(kt_run(dn, TS_OP_MATMUL, (ts_operand[]){ma->op, mb->op}, 2, &mc->op, 1, &mp2,
                    sizeof mp2));
    ts_operand bb = kt_broadcast(&mb->op, 3, (int64_t[]){3, 16, 10});
    CHECK_OK(kt_run(dn, TS_OP_MATMUL, (ts_operand[]){bc->op, bb}, 2, &bufs[10].op, 1, &mp,
                    sizeof mp));
    kt_buf *u = &bufs[11], *uo = &bufs[12], *sm = &bufs[13], *smo = &bufs[14];
    static const int32_t fns[] = {TS_UNARY_TANH, TS_UNARY_SIGMOID, TS_UNARY_EXP};
    for (int i = 0; i < 3; i++) {
        ts_unary_params up = {fns[i]};
        CHECK_OK(kt_run(dn, TS_OP_UNARY, &u->op, 1, &uo->op, 1, &up, sizeof up));
        CHECK_OK(kt_run(dn, TS_OP_UNARY, &uo->op, 1, &uo->op, 1, &up, sizeof up));
    }
    ts_dim_params dp = {-1};
    CHECK_OK(kt_run(dn, TS_OP_SOFTMAX, &sm->op, 1, &smo->op, 1, &dp, sizeof dp));
    CHECK_OK(kt_run(dn, TS_OP_LOG_SOFTMAX, &sm->op, 1, &smo->op, 1, &dp, sizeof dp));
    CHECK_OK(kt_run(dn, TS_OP_SOFTMAX, &y->op, 1, &y->op, 1, &dp, sizeof dp));
}

static int cpu_flag(const char *flag)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[8192];
    int has = 0;
    size_t n = strlen(flag);
    while (f && !has && fgets(line, sizeof line, f))
        if (!strncmp(line, "flags", 5))
            for (const char *p = strstr(line, flag); p && !has; p = strstr(p + 1, flag))
                has = p[-1] == ' ' && (p[n] == ' ' || p[n] == '\n');
    if (f)
        fclose(f);
    return has;
}

/* bfloat16 and float16 matmuls on oneDNN's primitive of the dtype where the CPU has one (on a
 * CPU with AVX512_BF16, bfloat16 must: the primitive count grows once, then not again), else
 * through float32; either way each element is the exact sum rounded once (small integers:
 * float32 accumulates them exactly). */
static void test_matmul_half(void)
{
    ts_device *dn = load_onednn();
    count_fn count = primitive_counter(dn);
    for (int bf = 1; bf >= 0; bf--) {
        int32_t dt = bf ? TS_BF16 : TS_F16;
        kt_buf a = kt_make(dn, dt, 3, (int64_t[]){2, 7, 33}, KT_CONTIG, 1);
        kt_buf b = kt_make(dn, dt, 3, (int64_t[]){2, 33, 9}, KT_TRANSPOSED, 2);
        kt_buf c = kt_make(dn, dt, 3, (int64_t[]){2, 7, 9}, KT_CONTIG, 3);
        ts_matmul_params mp = {1.0, 0.0};
        /* the float32 primitive the route through float32 would use (dense copies), made
         * first: only a 16-bit primitive adds to the count below */
        kt_buf fa = kt_make(dn, TS_F32, 3, (int64_t[]){2, 7, 33}, KT_CONTIG, 1);
        kt_buf fb = kt_make(dn, TS_F32, 3, (int64_t[]){2, 33, 9}, KT_CONTIG, 2);
        kt_buf fc = kt_make(dn, TS_F32, 3, (int64_t[]){2, 7, 9}, KT_CONTIG, 3);
        CHECK_OK(kt_run(dn, TS_OP_MATMUL, (ts_operand[]){fa.op, fb.op}, 2, &fc.op, 1, &mp,
                        sizeof mp));
        kt_free(&fa), kt_free(&fb), kt_free(&fc);
        unsigned long long c0 = count();
        CHECK_OK(kt_run(dn, TS_OP_MATMUL, (ts_operand[]){a.op, b.op}, 2, &c.op, 1, &mp,
                        sizeof mp));
        unsigned long long c1 = count();
        CHECK_OK(kt_run(dn, TS_OP_MATMUL, (ts_operand[]){a.op, b.op}, 2, &c.op, 1, &mp,
                        sizeof mp));
        CHECK_MSG(count() == c1, "%s: the second matmul created a primitive",
                  ts_dtype_name(dt));
        for (int64_t q = 0; q < 2; q++)
            for (int64_t i = 0; i < 7; i++)
                for (int64_t j = 0; j < 9; j++) {
                    double sum = 0;
                    for (int64_t k = 0; k < 33; k++)
                        sum += kt_get(&a.op, (int64_t[]){q, i, k}) *
                               kt_get(&b.op, (int64_t[]){q, k, j});
                    double want = bf ? ts_plugin_bf16_to_f32(ts_plugin_f64_to_bf16(sum))
                                     : ts_plugin_f16_to_f32(ts_plugin_f64_to_f16(sum));
                    double got = kt_get(&c.op, (int64_t[]){q, i, j});
                    CHECK_MSG(got == want, "%s matmul (%lld, %lld, %lld): %.9g, not %.9g (%.9g "
                              "rounded once)", ts_dtype_name(dt), (long long)q, (long long)i,
                              (long long)j, got, want, sum);
                }
        int native = c1 > c0;
        printf("# %s matmul: %s\n", ts_dtype_name(dt),
               native ? "oneDNN's primitive" : "through float32 (no kernels for it on this CPU)");
        if (bf && cpu_flag("avx512_bf16") && !getenv("ONEDNN_MAX_CPU_ISA") &&
            !getenv("DNNL_MAX_CPU_ISA"))
            CHECK_MSG(native, "bfloat16 matmul did not use oneDNN's primitive on a CPU with "
                      "AVX512_BF16");
        kt_free(&a), kt_free(&b), kt_free(&c);
    }
    kt_check_no_live_blocks(dn);
}

/* Convolutions in bfloat16 and float16, each way (bias on the forward): the float32 sum of
 * the 16-bit inputs' products, rounded once (half a unit of the 16-bit dtype, plus float32's
 * error on the sum of the terms' magnitudes), on oneDNN's own 16-bit primitive where it has
 * one: on a CPU with AVX512_BF16 the bfloat16 forward must be (a primitive the float32 route
 * would not have made). */
static void test_conv_half(void)
{
    ts_device *dn = load_onednn();
    count_fn count = primitive_counter(dn);
    const int64_t N = 2, C = 16, H = 7, W = 7, K = 16, R = 3, S = 3;
    const ts_conv2d_params p = CONVP(1, 1, 1, 1);
    static const char *const names[3] = {"conv2d", "conv2d_bwd_data", "conv2d_bwd_weight"};
    static const int32_t ops[3] = {TS_OP_CONV2D, TS_OP_CONV2D_BWD_DATA, TS_OP_CONV2D_BWD_WEIGHT};
    for (int bf = 1; bf >= 0; bf--) {
        const int32_t dt = bf ? TS_BF16 : TS_F16;
        for (int o = 0; o < 3; o++) {
            /* the float32 primitive the route through float32 would use, made first */
            kt_buf f[4];
            int32_t fdts[2] = {TS_F32, dt};
            kt_buf x, w, y, b;
            for (int pass = 0; pass < 2; pass++) {
                const int32_t t = fdts[pass];
                kt_buf *xs = pass ? &x : &f[0], *ws = pass ? &w : &f[1], *ys = pass ? &y : &f[2],
                       *bs = pass ? &b : &f[3];
                *xs = kt_make(dn, t, 4, (int64_t[]){N, C, H, W}, KT_CONTIG, 1);
                *ws = kt_make(dn, t, 4, (int64_t[]){K, C, R, S}, KT_CONTIG, 2);
                *ys = kt_make(dn, t, 4, (int64_t[]){N, K, H, W}, KT_CONTIG, 3);
                *bs = kt_make(dn, t, 1, (int64_t[]){K}, KT_CONTIG, 4);
                ts_operand fin[3] = {xs->op, ws->op, bs->op}, din[2] = {ys->op, ws->op},
                           win[2] = {ys->op, xs->op};
                const ts_operand *in = o == 0 ? fin : o == 1 ? din : win;
                const ts_operand *out = o == 0 ? &ys->op : o == 1 ? &xs->op : &ws->op;
                unsigned long long c0 = count();
                CHECK_OK(kt_run(dn, ops[o], in, o == 0 ? 3 : 2, out, 1, &p, sizeof p));
                if (!pass)
                    continue;
                int native = count() > c0;
                printf("# %s %s: %s\n", ts_dtype_name(dt), names[o],
                       native ? "oneDNN's primitive" : "through float32");
                if (o == 0 && bf && cpu_flag("avx512_bf16") && !getenv("ONEDNN_MAX_CPU_ISA") &&
                    !getenv("DNNL_MAX_CPU_ISA"))
                    CHECK_MSG(native, "bfloat16 conv2d did not use oneDNN's primitive on a CPU "
                              "with AVX512_BF16");
            }
            /* the float64 sums of the 16-bit values, and their terms' magnitudes */
            const double unit = bf ? 0x1p-8 : 0x1p-11;
            const ts_operand *res = o == 0 ? &y.op : o == 1 ? &x.op : &w.op;
            int64_t nres = kt_numel(res), bad = 0;
            for (int64_t e = 0; e < nres; e++) {
                int64_t id[4];
                kt_unravel(res, e, id);
                double sum = 0, mag = 0;
                /* y[n,k,i,j] = b[k] + sum_{c,r,q} x[n,c,i+r-1,j+q-1] w[k,c,r,q]; the backward
                 * ops sum the same products over the other indices */
                for (int64_t u = 0; u < (o == 0 ? C : o == 1 ? K : N); u++)
                    for (int64_t v1 = 0; v1 < (o == 2 ? H : R); v1++)
                        for (int64_t v2 = 0; v2 < (o == 2 ? W : S); v2++) {
                            int64_t n, c, k, i, j, r, q;
                            if (o == 0)
                                n = id[0], k = id[1], i = id[2], j = id[3], c = u, r = v1, q = v2;
                            else if (o == 1)
                                n = id[0], c = id[1], k = u, r = v1, q = v2,
                                i = id[2] - r + 1, j = id[3] - q + 1;
                            else
                                k = id[0], c = id[1], r = id[2], q = id[3], n = u, i = v1, j = v2;
                            int64_t hi = i + r - 1, wi = j + q - 1;
                            if (i < 0 || i >= H || j < 0 || j >= W || hi < 0 || hi >= H ||
                                wi < 0 || wi >= W)
                                continue;
                            double t = (o == 1 ? kt_get(&y.op, (int64_t[]){n, k, i, j})
                                               : kt_get(&x.op, (int64_t[]){n, c, hi, wi})) *
                                       (o == 2 ? kt_get(&y.op, (int64_t[]){n, k, i, j})
                                               : kt_get(&w.op, (int64_t[]){k, c, r, q}));
                            sum += t;
                            mag += fabs(t);
                        }
                if (o == 0) {
                    double bk = kt_get(&b.op, (int64_t[]){id[1]});
                    sum += bk;
                    mag += fabs(bk);
                }
                double got = kt_get(res, id);
                double tol = unit * fabs(sum) + 64 * 0x1p-24 * mag + 1e-30;
                if (fabs(got - sum) > tol && bad++ < 3)
                    CHECK_MSG(0, "%s %s at %lld: %.9g, the float64 sum %.9g (tolerance %.3g)",
                              ts_dtype_name(dt), names[o], (long long)e, got, sum, tol);
            }
            CHECK_INT_EQ(bad, 0);
            for (int i = 0; i < 4; i++)
                kt_free(&f[i]);
            kt_free(&x), kt_free(&w), kt_free(&y), kt_free(&b);
        }
    }
    kt_check_no_live_blocks(dn);
}

static void test_steady_state(void)
{
    ts_device *dn = load_onednn();
    count_fn count = primitive_counter(dn);
    kt_buf bufs[15] = {
        kt_make(dn, TS_F32, 4, (int64_t[]){4, 1, 12, 12}, KT_CONTIG, 1),
        kt_make(dn, TS_F32, 4, (int64_t[]){6, 1, 5, 5}, KT_CONTIG, 2),
        kt_make(dn, TS_F32, 1, (int64_t[]){6}, KT_CONTIG, 3),
        kt_make(dn, TS_F32, 4, (int64_t[]){4, 6, 12, 12}, KT_CONTIG, 4),
        kt_make(dn, TS_F32, 4, (int64_t[]){4, 1, 12, 12}, KT_CONTIG, 5),
        kt_make(dn, TS_F32, 4, (int64_t[]){6, 1, 5, 5}, KT_CONTIG, 6),
        kt_make(dn, TS_F32, 2, (int64_t[]){8, 16}, KT_CONTIG, 7),
        kt_make(dn, TS_F32, 2, (int64_t[]){16, 10}, KT_TRANSPOSED, 8),
        kt_make(dn, TS_F32, 2, (int64_t[]){8, 10}, KT_CONTIG, 9),
        kt_make(dn, TS_F32, 3, (int64_t[]){3, 8, 16}, KT_STRIDED, 10),
        kt_make(dn, TS_F32, 3, (int64_t[]){3, 8, 10}, KT_CONTIG, 11),
        kt_make(dn, TS_F32, 2, (int64_t[]){64, 1024}, KT_CONTIG, 12),
        kt_make(dn, TS_F32, 2, (int64_t[]){64, 1024}, KT_CONTIG, 13),
        kt_make(dn, TS_F32, 2, (int64_t[]){1024, 1024}, KT_CONTIG, 14),
        kt_make(dn, TS_F32, 2, (int64_t[]){1024, 1024}, KT_CONTIG, 15),
    };
    unsigned long long c0 = count();
    step(dn, bufs);
    unsigned long long c1 = count();
    CHECK_MSG(c1 > c0, "the first round created no primitive (%llu -> %llu)", c0, c1);
    step(dn, bufs);
    step(dn, bufs);
    unsigned long long c2 = count();
    CHECK_MSG(c2 == c1, "steady state created primitives: %llu after round 1, %llu after 3", c1,
              c2);
    for (int i = 0; i < 15; i++)
        kt_free(&bufs[i]);
    kt_check_no_live_blocks(dn);
}

/* More distinct shapes than the cache holds: evicted entries are recreated, results stay
 * right, and the creation count keeps growing (the cache is bounded, not leaking). */
static void test_cache_eviction(void)
{
    ts_device *dn = load_onednn();
    count_fn count = primitive_counter(dn);
    unsigned long long c0 = count();
    for (int round = 0; round < 2; round++)
        for (int64_t m = 1; m <= 300; m++) {
            kt_buf a = kt_make(dn, TS_F32, 2, (int64_t[]){m, 3}, KT_CONTIG, (uint64_t)m);
            kt_buf b = kt_make(dn, TS_F32, 2, (int64_t[]){3, 2}, KT_CONTIG, 2);
            kt_buf c = kt_make(dn, TS_F32, 2, (int64_t[]){m, 2}, KT_CONTIG, 3);
            ts_matmul_params p = {1.0, 0.0};
            CHECK_OK(kt_run(dn, TS_OP_MATMUL, (ts_operand[]){a.op, b.op}, 2, &c.op, 1, &p,
                            sizeof p));
            int64_t i = m - 1;
            double want = 0;
            for (int64_t k = 0; k < 3; k++)
                want += kt_get(&a.op, (int64_t[]){i, k}) * kt_get(&b.op, (int64_t[]){k, 1});
            CHECK(kt_close(kt_get(&c.op, (int64_t[]){i, 1}), want, RTOL, 1e-5));
            kt_free(&c);
            kt_free(&b);
            kt_free(&a);
        }
    /* LRU with 300 keys cycling through 256 slots: every call of round 2 misses too. */
    CHECK_MSG(count() - c0 == 600, "created %llu primitives for 600 evicting calls",
              count() - c0);
    kt_check_no_live_blocks(dn);
}

/* threads = 1 holds for oneDNN's own parallel regions too: oneDNN sizes a primitive's regions
 * when it creates it, so a primitive created under the process's default (every core) ran
 * them on OpenMP workers whatever the setting (their spinning slowed a one-thread step 2x
 * beside a busy process). A matmul and a softmax under threads = 1 now start no thread. */
static void test_threads_setting_holds(void)
{
    tap_start();
    if (!has_plugin("cpu_onednn"))
        SKIP("cpu_onednn is not built");
    if (sysconf(_SC_NPROCESSORS_ONLN) < 2)
        SKIP("one core: the default is one thread anyway");
    ts_config *cfg;
    CHECK_OK(ts_config_parse("[plugin.cpu_onednn]\nthreads = 1\n", "t.ini", NULL, &cfg));
    ts_device *dev;
    CHECK_OK(ts_device_load(cfg, tap_plugin_under_test("cpu_onednn"), &dev));
    int64_t shape[3] = {64, 128, 128};
    ts_tensor *a, *b, *c;
    ts_rng rng = TS_RNG(1);
    CHECK_OK(ts_tensor_randn(dev, TS_F32, 3, shape, 0, 1, &rng, &a));
    CHECK_OK(ts_tensor_randn(dev, TS_F32, 3, shape, 0, 1, &rng, &b));
    int before = tap_count_entries("/proc/self/task", "");
    for (int i = 0; i < 2; i++) { /* a batched matmul and a softmax: oneDNN primitives */
        CHECK_OK(ts_matmul(a, b, &c));
        ts_tensor_unref(c);
        CHECK_OK(ts_softmax(a, 2, &c));
        ts_tensor_unref(c);
    }
    int after = tap_count_entries("/proc/self/task", ""); /* both count "." and ".." */
    CHECK_MSG(after == before, "%d threads after oneDNN primitives ran under threads = 1, %d "
              "before", after - 2, before - 2);
    ts_tensor_unref(a), ts_tensor_unref(b);
    ts_device_unload(dev);
    ts_config_free(cfg);
    tap_end();
}

int main(int argc, char **argv)
{
    /* LeakSanitizer's stop-the-world tracer crashes (SIGSEGV in the tracer) once oneDNN's
     * primitives have run their threads in this process, so the per-test LSan check is off
     * here; leaks of tessera's own objects are still checked by kt_check_no_live_blocks. */
    setenv("TS_NO_LSAN_CHECK", "1", 1);
    /* Primitives are keyed by the threads running them, which adaptive_threads (when on)
     * changes with the machine's load; the counts of primitives made here need a steady
     * count: every thread the setting gives, always. */
    setenv("TESSERA_RUN_THREADS", "4096", 1);
    static const tap_test tests[] = {
        TAP_TEST(test_matmul_supports),
        TAP_TEST(test_matmul_shapes),
        TAP_TEST(test_matmul_layouts),
        TAP_TEST(test_matmul_batched),
        TAP_TEST(test_matmul_empty),
        TAP_TEST(test_matmul_in_place),
        TAP_TEST(test_matmul_half),
        TAP_TEST(test_matmul_parts),
        TAP_TEST(test_matmul_parts_bits),
        TAP_TEST(test_conv_supports),
        TAP_TEST(test_conv),
        TAP_TEST(test_conv_bad_params),
        TAP_TEST(test_conv_in_place_and_not),
        TAP_TEST(test_conv_half),
        TAP_TEST(test_unary),
        TAP_TEST(test_softmax),
        TAP_TEST(test_steady_state),
        TAP_TEST(test_cache_eviction),
        TAP_TEST(test_threads_setting_holds),
    };
    return tap_run(tests, sizeof tests / sizeof tests[0], argc, argv);
}
