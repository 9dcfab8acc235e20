/* tests/unit/test-ops.c: every operation through the public API against a float64
 * reference computed here, with non-contiguous inputs (transposed, sliced with step,
 * expanded) and outputs, NumPy broadcasting, the in-place and out= forms, and the errors for
 * mismatched shapes, dtypes and devices (both sides named). The kernels themselves are
 * tested per plugin in tests/plugins/; this file tests what the core resolves. */
#include <math.h>
#include <string.h>

#include "../tap.h"
#include "../plugins/kt.h"

static ts_device *dev;

static void setup(void)
{
    dev = tap_start();
}

static ts_rng rng;

/* A random float64 tensor of shape, values in [lo, hi). */
static ts_tensor *rnd(int ndim, const int64_t *shape, double lo, double hi)
{
    ts_tensor *t;
    CHECK_OK(ts_tensor_rand(dev, TS_F64, ndim, shape, lo, hi, &rng, &t));
    return t;
}

/* The values of t, row-major, as doubles (any dtype, any strides). Caller frees. */
static double *vals(const ts_tensor *t)
{
    ts_tensor *d;
    CHECK_OK(ts_cast(t, TS_F64, &d));
    int64_t n = ts_tensor_numel(d);
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    CHECK_OK(ts_tensor_to_host(d, v, sizeof(double) * (size_t)n));
    ts_tensor_unref(d);
    return v;
}

/* Offset of multi-index idx (of an nd-dim result) in a row-major tensor of shape, with
 * NumPy broadcasting (size-1 and missing leading dims). */
static int64_t bidx(int nd, const int64_t *idx, int tnd, const int64_t *shape)
{
    int64_t off = 0;
    for (int d = 0; d < tnd; d++) {
        int64_t i = shape[d] == 1 ? 0 : idx[nd - tnd + d];
        off = off * shape[d] + i;
    }
    return off;
}

static void unravel(int nd, const int64_t *shape, int64_t lin, int64_t *idx)
{
    for (int d = nd - 1; d >= 0; d--) {
        idx[d] = lin % shape[d];
        lin /= shape[d];
    }
}

#define CLOSE(got, want, tol)                                                               \
    CHECK_MSG(fabs((got) - (want)) <= (tol) * (1 + fabs(want)), "%s: got %.17g, want %.17g", \
              #got, (double)(got), (double)(want))

static double ref_binary(int fn, double a, double b)
{
    switch (fn) {
    case TS_BINARY_ADD: return a + b;
    case TS_BINARY_SUB: return a - b;
    case TS_BINARY_MUL: return a * b;
    case TS_BINARY_DIV: return a / b;
    case TS_BINARY_POW: return pow(a, b);
    case TS_BINARY_MAXIMUM: return a > b ? a : b;
    case TS_BINARY_MINIMUM: return a < b ? a : b;
    case TS_BINARY_EQ: return a == b;
    case TS_BINARY_NE: return a != b;
    case TS_BINARY_LT: return a < b;
    case TS_BINARY_LE: return a <= b;
    case TS_BINARY_GT: return a > b;
    case TS_BINARY_GE: return a >= b;
    }
    return NAN;
}

static void test_binary_broadcast_noncontiguous(void)
{
    setup();
    ts_rng_init(&rng, 1);
    /* a: (3, 1, 5) sliced with step from (3, 2, 10); b: (4, 5) as the transpose of (5, 4). */
    ts_tensor *abig = rnd(3, (const int64_t[]){3, 2, 10}, 0.5, 2), *bt = rnd(2, (const int64_t[]){5, 4}, 0.5, 2);
    ts_tensor *a0, *a, *b;
    CHECK_OK(ts_tensor_slice(abig, 2, 0, 10, 2, &a0));
    CHECK_OK(ts_tensor_narrow(a0, 1, 1, 1, &a));
    CHECK_OK(ts_tensor_transpose(bt, 0, 1, &b));
    CHECK(!ts_tensor_is_contiguous(a) && !ts_tensor_is_contiguous(b));
    double *va = vals(a), *vb = vals(b);
    const int64_t rs[3] = {3, 4, 5};
    for (int fn = 0; fn < TS_BINARY_COUNT; fn++) {
        ts_tensor *r;
        CHECK_OK(ts_binary(fn, a, b, &r));
        CHECK_INT_EQ(ts_tensor_ndim(r), 3);
        CHECK(ts_tensor_shape(r)[0] == 3 && ts_tensor_shape(r)[1] == 4 && ts_tensor_shape(r)[2] == 5);
        CHECK_INT_EQ(ts_tensor_dtype(r), fn >= TS_BINARY_EQ ? TS_U8 : TS_F64);
        double *vr = vals(r);
        for (int64_t i = 0; i < 60; i++) {
            int64_t idx[3];
            unravel(3, rs, i, idx);
            double want = ref_binary(fn, va[bidx(3, idx, 3, (const int64_t[]){3, 1, 5})],
                                     vb[bidx(3, idx, 2, (const int64_t[]){4, 5})]);
            CLOSE(vr[i], want, 1e-12);
        }
        free(vr);
        ts_tensor_unref(r);
    }
    free(va);
    free(vb);
    ts_tensor_unref(a0);
    ts_tensor_unref(a);
    ts_tensor_unref(b);
    ts_tensor_unref(abig);
    ts_tensor_unref(bt);
    tap_end();
}

static double ref_unary(int fn, double x)
{
    return kt_unary_ref(fn, x);
}

static void test_unary_and_scalar(void)
{
    setup();
    ts_rng_init(&rng, 2);
    ts_tensor *base = rnd(2, (const int64_t[]){6, 8}, 0.1, 3), *x;
    CHECK_OK(ts_tensor_slice(base, 1, 1, 8, 3, &x)); /* (6, 3) strided */
    double *vx = vals(x);
    for (int fn = 0; fn < TS_UNARY_COUNT; fn++) {
        ts_tensor *r;
        CHECK_OK(ts_unary(fn, x, &r));
        double *vr = vals(r);
        for (int i = 0; i < 18; i++)
            CLOSE(vr[i], ref_unary(fn, vx[i]), 1e-12);
        free(vr);
        ts_tensor_unref(r);
    }
    /* Scalars on both sides: 10 - x, x / 4, x ^ 2. */
    ts_tensor *r1, *r2, *r3;
    CHECK_OK(ts_binary_scalar(TS_BINARY_SUB, x, 10, 1, &r1));
    CHECK_OK(ts_binary_scalar(TS_BINARY_DIV, x, 4, 0, &r2));
    CHECK_OK(ts_pow_scalar(x, 2, &r3));
    double *v1 = vals(r1), *v2 = vals(r2), *v3 = vals(r3);
    for (int i = 0; i < 18; i++) {
        CLOSE(v1[i], 10 - vx[i], 1e-12);
        CLOSE(v2[i], vx[i] / 4, 1e-12);
        CLOSE(v3[i], vx[i] * vx[i], 1e-12);
    }
    free(v1), free(v2), free(v3);
    ts_tensor_unref(r1), ts_tensor_unref(r2), ts_tensor_unref(r3);
    /* In place through the strided view: only the viewed elements change. */
    double *before = vals(base);
    CHECK_OK(ts_mul_scalar_(x, 2));
    double *after = vals(base);
    for (int i = 0; i < 48; i++) {
        int col = i % 8, viewed = col >= 1 && (col - 1) % 3 == 0;
        CLOSE(after[i], viewed ? 2 * before[i] : before[i], 1e-15);
    }
    free(before), free(after), free(vx);
    ts_tensor_unref(x);
    ts_tensor_unref(base);
    tap_end();
}

static void test_inplace_out_and_overlap(void)
{
    setup();
    ts_rng_init(&rng, 3);
    ts_tensor *a = rnd(2, (const int64_t[]){4, 4}, -1, 1), *row = rnd(1, (const int64_t[]){4}, -1, 1);
    double *va = vals(a), *vrow = vals(row);
    uint64_t ver = ts_tensor_version(a);
    CHECK_OK(ts_add_(a, row)); /* row broadcast over a's rows */
    CHECK(ts_tensor_version(a) == ver + 1);
    double *v = vals(a);
    for (int i = 0; i < 16; i++)
        CLOSE(v[i], va[i] + vrow[i % 4], 1e-15);
    free(v);
    /* b must broadcast to a's shape, not the other way round. */
    CHECK_FAILS(ts_add_(row, a), TS_ESHAPE, "(4, 4)", "(4)");
    /* a += a^T reads the original a even though the transposed view aliases it. */
    ts_tensor *at;
    CHECK_OK(ts_tensor_transpose(a, 0, 1, &at));
    double *orig = vals(a);
    CHECK_OK(ts_add_(a, at));
    v = vals(a);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++)
            CLOSE(v[i * 4 + j], orig[i * 4 + j] + orig[j * 4 + i], 1e-15);
    free(v), free(orig);
    /* out=: right shape works, wrong shape / dtype are errors naming both. */
    ts_tensor *o, *wrong, *wrongd;
    CHECK_OK(ts_tensor_empty(dev, TS_F64, 2, (const int64_t[]){4, 4}, &o));
    CHECK_OK(ts_mul_out(a, row, o));
    CHECK_OK(ts_tensor_empty(dev, TS_F64, 2, (const int64_t[]){4, 5}, &wrong));
    CHECK_FAILS(ts_mul_out(a, row, wrong), TS_ESHAPE, "(4, 5)", "(4, 4)");
    CHECK_OK(ts_tensor_empty(dev, TS_F32, 2, (const int64_t[]){4, 4}, &wrongd));
    CHECK_FAILS(ts_add_out(a, row, wrongd), TS_EDTYPE, "float32", "float64");
    CHECK_FAILS(ts_binary_(TS_BINARY_LT, a, row), TS_EDTYPE, "uint8");
    free(va), free(vrow);
    ts_tensor_unref(o), ts_tensor_unref(wrong), ts_tensor_unref(wrongd);
    ts_tensor_unref(at), ts_tensor_unref(a), ts_tensor_unref(row);
    tap_end();
}

static void test_mismatch_errors(void)
{
    setup();
    ts_tensor *f32, *f64, *x23, *x43, *r = (ts_tensor *)1;
    CHECK_OK(ts_tensor_zeros(dev, TS_F32, 1, (const int64_t[]){3}, &f32));
    CHECK_OK(ts_tensor_zeros(dev, TS_F64, 1, (const int64_t[]){3}, &f64));
    CHECK_OK(ts_tensor_zeros(dev, TS_F32, 2, (const int64_t[]){2, 3}, &x23));
    CHECK_OK(ts_tensor_zeros(dev, TS_F32, 2, (const int64_t[]){4, 3}, &x43));
    CHECK_FAILS(ts_add(f32, f64, &r), TS_EDTYPE, "float32", "float64", "ts_cast");
    CHECK(r == NULL);
    CHECK_FAILS(ts_mul(x23, x43, &r), TS_ESHAPE, "(2, 3)", "(4, 3)");
    CHECK_FAILS(ts_where(f32, f32, f32, &r), TS_EDTYPE, "uint8");
    CHECK_FAILS(ts_add(NULL, f32, &r), TS_EINVAL, "NULL");
    CHECK_FAILS(ts_mean(x23, 1, (const int[]){2}, 0, &r), TS_EINVAL, "dim 2");
    char *path;
    if (ts_plugin_find(NULL, "cpu_onednn", &path) == TS_OK) {
        free(path);
        ts_device *other;
        ts_tensor *elsewhere;
        CHECK_OK(ts_device_get("cpu_onednn", &other));
        CHECK_OK(ts_tensor_zeros(other, TS_F32, 1, (const int64_t[]){3}, &elsewhere));
        CHECK_FAILS(ts_add(f32, elsewhere, &r), TS_EDEVICE, "cpu_blas", "cpu_onednn",
                    "ts_tensor_to");
        /* copy_ moves between devices by itself. */
        CHECK_OK(ts_fill_(f32, 5));
        CHECK_OK(ts_copy_(elsewhere, f32));
        double *v = vals(elsewhere);
        CHECK(v[0] == 5 && v[2] == 5);
        free(v);
        ts_tensor_unref(elsewhere);
    }
    ts_tensor_unref(f32), ts_tensor_unref(f64), ts_tensor_unref(x23), ts_tensor_unref(x43);
    tap_end();
}

static void test_where_cast_copy(void)
{
    setup();
    ts_rng_init(&rng, 4);
    ts_tensor *a = rnd(2, (const int64_t[]){3, 4}, -2, 2), *b = rnd(1, (const int64_t[]){4}, -2, 2);
    ts_tensor *m, *w;
    CHECK_OK(ts_gt(a, b, &m));
    CHECK_OK(ts_where(m, a, b, &w));
    double *va = vals(a), *vb = vals(b), *vw = vals(w);
    for (int i = 0; i < 12; i++)
        CHECK(vw[i] == (va[i] > vb[i % 4] ? va[i] : vb[i % 4]));
    ts_tensor *ci;
    CHECK_OK(ts_cast(a, TS_I32, &ci)); /* truncation toward zero */
    double *vc = vals(ci);
    for (int i = 0; i < 12; i++)
        CHECK(vc[i] == trunc(va[i]));
    /* copy_ with broadcasting and a dtype change: float32 rows <- float64 vector. */
    ts_tensor *dst;
    CHECK_OK(ts_tensor_zeros(dev, TS_F32, 2, (const int64_t[]){2, 4}, &dst));
    CHECK_OK(ts_copy_(dst, b));
    double *vd = vals(dst);
    for (int i = 0; i < 8; i++)
        CLOSE(vd[i], vb[i % 4], 1e-6);
    CHECK_FAILS(ts_copy_(b, dst), TS_ESHAPE, "(2, 4)", "(4)");
    free(va), free(vb), free(vw), free(vc), free(vd);
    ts_tensor_unref(a), ts_tensor_unref(b), ts_tensor_unref(m), ts_tensor_unref(w);
    ts_tensor_unref(ci), ts_tensor_unref(dst);
    tap_end();
}

static void test_reductions(void)
{
    setup();
    ts_rng_init(&rng, 5);
    ts_tensor *base = rnd(3, (const int64_t[]){4, 3, 2}, -3, 3), *x;
    CHECK_OK(ts_tensor_permute(base, (const int[]){2, 0, 1}, &x)); /* (2, 4, 3), permuted */
    double *vx = vals(x);
    const int64_t xs[3] = {2, 4, 3};
    /* Every subset of dims, keepdim on and off. */
    for (int mask = 0; mask < 8; mask++) {
        int dims[3], nd = 0;
        for (int d = 0; d < 3; d++)
            if (mask & (1 << d))
                dims[nd++] = d - 3; /* negative dims */
        for (int keep = 0; keep < 2; keep++) {
            ts_tensor *s, *mx, *mean;
            CHECK_OK(ts_sum(x, nd, dims, keep, &s));
            CHECK_OK(ts_max(x, nd, dims, keep, &mx));
            CHECK_OK(ts_mean(x, nd, dims, keep, &mean));
            int64_t rs[3], n_out = 1, count = 1;
            for (int d = 0; d < 3; d++) {
                int red = nd == 0 || (mask & (1 << d));
                rs[d] = red ? 1 : xs[d];
                n_out *= rs[d];
                count *= red ? xs[d] : 1;
            }
            CHECK_INT_EQ(ts_tensor_numel(s), n_out);
            CHECK_INT_EQ(ts_tensor_ndim(s), keep ? 3 : (nd == 0 ? 0 : 3 - nd));
            double *vs = vals(s), *vm = vals(mx), *vmean = vals(mean);
            for (int64_t o = 0; o < n_out; o++) {
                int64_t oi[3];
                unravel(3, rs, o, oi);
                double sum = 0, best = -INFINITY;
                for (int64_t i = 0; i < 24; i++) {
                    int64_t ii[3];
                    unravel(3, xs, i, ii);
                    int in = 1;
                    for (int d = 0; d < 3; d++)
                        in &= rs[d] == 1 || ii[d] == oi[d];
                    if (in) {
                        sum += vx[i];
                        best = vx[i] > best ? vx[i] : best;
                    }
                }
                CLOSE(vs[o], sum, 1e-12);
                CLOSE(vm[o], best, 0);
                CLOSE(vmean[o], sum / (double)count, 1e-12);
            }
            free(vs), free(vm), free(vmean);
            ts_tensor_unref(s), ts_tensor_unref(mx), ts_tensor_unref(mean);
        }
    }
    ts_tensor *am;
    CHECK_OK(ts_argmax(x, 1, 0, &am)); /* (2, 3) int64 */
    CHECK_INT_EQ(ts_tensor_dtype(am), TS_I64);
    double *vam = vals(am);
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 3; k++) {
            int best = 0;
            for (int j = 1; j < 4; j++)
                if (vx[(i * 4 + j) * 3 + k] > vx[(i * 4 + best) * 3 + k])
                    best = j;
            CHECK(vam[i * 3 + k] == best);
        }
    free(vam), free(vx);
    ts_tensor_unref(am);
    ts_tensor *ints, *isum;
    CHECK_OK(ts_tensor_arange(dev, TS_I32, 0, 10, 1, &ints));
    CHECK_OK(ts_sum(ints, 0, NULL, 0, &isum));
    double *vi = vals(isum);
    CHECK(vi[0] == 45);
    free(vi);
    ts_tensor_unref(isum);
    CHECK_FAILS(ts_mean(ints, 0, NULL, 0, &isum), TS_EDTYPE, "int32");
    CHECK_FAILS(ts_sum(x, 2, (const int[]){1, -2}, 0, &isum), TS_EINVAL, "twice");
    ts_tensor_unref(ints);
    ts_tensor_unref(x), ts_tensor_unref(base);
    tap_end();
}

/* c[i][j] = sum_k a[i][k] b[k][j] over row-major value arrays. */
static void ref_mm(const double *a, const double *b, double *c, int64_t M, int64_t K, int64_t N)
{
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = 0;
            for (int64_t k = 0; k < K; k++)
                s += a[i * K + k] * b[k * N + j];
            c[i * N + j] = s;
        }
}

static void check_mm(const ts_tensor *a, const ts_tensor *b, int64_t M, int64_t K, int64_t N)
{
    ts_tensor *c;
    CHECK_OK(ts_matmul(a, b, &c));
    double *va = vals(a), *vb = vals(b), *vc = vals(c), *want = malloc(sizeof(double) * (size_t)(M * N));
    ref_mm(va, vb, want, M, K, N);
    CHECK_INT_EQ(ts_tensor_numel(c), M * N);
    for (int64_t i = 0; i < M * N; i++)
        CLOSE(vc[i], want[i], 1e-12);
    free(va), free(vb), free(vc), free(want);
    ts_tensor_unref(c);
}

static void test_matmul(void)
{
    setup();
    ts_rng_init(&rng, 6);
    ts_tensor *at = rnd(2, (const int64_t[]){7, 5}, -1, 1), *b = rnd(2, (const int64_t[]){7, 3}, -1, 1);
    ts_tensor *a;
    CHECK_OK(ts_tensor_transpose(at, 0, 1, &a)); /* (5, 7), column-major */
    check_mm(a, b, 5, 7, 3);
    /* 1-D promotions: (7) @ (7, 3) -> (3); (5, 7) @ (7) -> (5); (7) @ (7) -> (). */
    ts_tensor *v, *r;
    CHECK_OK(ts_tensor_select(b, 1, 0, &v)); /* (7), strided */
    CHECK_OK(ts_matmul(v, b, &r));
    CHECK_INT_EQ(ts_tensor_ndim(r), 1);
    ts_tensor_unref(r);
    check_mm(v, b, 1, 7, 3);
    CHECK_OK(ts_matmul(a, v, &r));
    CHECK(ts_tensor_ndim(r) == 1 && ts_tensor_shape(r)[0] == 5);
    ts_tensor_unref(r);
    check_mm(a, v, 5, 7, 1);
    CHECK_OK(ts_matmul(v, v, &r));
    CHECK_INT_EQ(ts_tensor_ndim(r), 0);
    double *dot = vals(r), *vv = vals(v), want = 0;
    for (int i = 0; i < 7; i++)
        want += vv[i] * vv[i];
    CLOSE(dot[0], want, 1e-12);
    free(dot), free(vv);
    ts_tensor_unref(r);
    /* Batched with broadcasting: (2, 1, 3, 4) @ (5, 4, 2) -> (2, 5, 3, 2). */
    ts_tensor *ba = rnd(4, (const int64_t[]){2, 1, 3, 4}, -1, 1), *bb = rnd(3, (const int64_t[]){5, 4, 2}, -1, 1);
    CHECK_OK(ts_matmul(ba, bb, &r));
    CHECK(ts_tensor_ndim(r) == 4 && ts_tensor_shape(r)[0] == 2 && ts_tensor_shape(r)[1] == 5 &&
          ts_tensor_shape(r)[2] == 3 && ts_tensor_shape(r)[3] == 2);
    double *vba = vals(ba), *vbb = vals(bb), *vr = vals(r), c[6];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 5; j++) {
            ref_mm(vba + i * 12, vbb + j * 8, c, 3, 4, 2);
            for (int k = 0; k < 6; k++)
                CLOSE(vr[(i * 5 + j) * 6 + k], c[k], 1e-12);
        }
    free(vba), free(vbb), free(vr);
    ts_tensor_unref(r);
    /* out= and errors. */
    ts_tensor *o;
    CHECK_OK(ts_tensor_empty(dev, TS_F64, 2, (const int64_t[]){5, 3}, &o));
    CHECK_OK(ts_matmul_out(a, b, o));
    CHECK_FAILS(ts_matmul(a, a, &r), TS_ESHAPE, "(5, 7) @ (5, 7)", "inner dims 7 and 5");
    ts_tensor *ints;
    CHECK_OK(ts_tensor_zeros(dev, TS_I32, 2, (const int64_t[]){2, 2}, &ints));
    CHECK_FAILS(ts_matmul(ints, ints, &r), TS_EDTYPE, "int32");
    ts_tensor_unref(ints), ts_tensor_unref(o);
    ts_tensor_unref(ba), ts_tensor_unref(bb), ts_tensor_unref(v);
    ts_tensor_unref(a), ts_tensor_unref(at), ts_tensor_unref(b);
    tap_end();
}

static void test_softmax(void)
{
    setup();
    ts_rng_init(&rng, 7);
    ts_tensor *base = rnd(2, (const int64_t[]){5, 3}, -50, 50), *x, *sm, *lsm;
    CHECK_OK(ts_tensor_transpose(base, 0, 1, &x)); /* (3, 5) */
    CHECK_OK(ts_softmax(x, -1, &sm));
    CHECK_OK(ts_log_softmax(x, 1, &lsm));
    double *vx = vals(x), *vs = vals(sm), *vl = vals(lsm);
    for (int i = 0; i < 3; i++) {
        double mx = -INFINITY, z = 0;
        for (int j = 0; j < 5; j++)
            mx = fmax(mx, vx[i * 5 + j]);
        for (int j = 0; j < 5; j++)
            z += exp(vx[i * 5 + j] - mx);
        for (int j = 0; j < 5; j++) {
            CLOSE(vs[i * 5 + j], exp(vx[i * 5 + j] - mx) / z, 1e-12);
            CLOSE(vl[i * 5 + j], vx[i * 5 + j] - mx - log(z), 1e-12);
        }
    }
    free(vx), free(vs), free(vl);
    ts_tensor *r;
    CHECK_FAILS(ts_softmax(x, 2, &r), TS_EINVAL, "dim 2");
    ts_tensor_unref(sm), ts_tensor_unref(lsm), ts_tensor_unref(x), ts_tensor_unref(base);
    tap_end();
}

static void test_embedding_and_index_add(void)
{
    setup();
    ts_rng_init(&rng, 8);
    ts_tensor *w = rnd(2, (const int64_t[]){10, 3}, -1, 1), *idx, *e;
    int64_t ids[8] = {3, 0, 9, 3, 1, 1, 7, 2};
    CHECK_OK(ts_tensor_from_host(dev, TS_I64, 2, (const int64_t[]){2, 4}, ids, &idx));
    CHECK_OK(ts_embedding(w, idx, &e));
    CHECK(ts_tensor_ndim(e) == 3 && ts_tensor_shape(e)[2] == 3);
    double *vw = vals(w), *ve = vals(e);
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 3; j++)
            CHECK(ve[i * 3 + j] == vw[ids[i] * 3 + j]);
    /* index_add_: duplicates accumulate (embedding backward). */
    ts_tensor *g, *flat, *src;
    CHECK_OK(ts_tensor_zeros(dev, TS_F64, 2, (const int64_t[]){10, 3}, &g));
    CHECK_OK(ts_tensor_reshape(idx, 1, (const int64_t[]){8}, &flat));
    CHECK_OK(ts_tensor_ones(dev, TS_F64, 2, (const int64_t[]){8, 3}, &src));
    CHECK_OK(ts_index_add_(g, 0, flat, src));
    double *vg = vals(g);
    int count[10] = {0};
    for (int i = 0; i < 8; i++)
        count[ids[i]]++;
    for (int r = 0; r < 10; r++)
        CHECK(vg[r * 3] == count[r] && vg[r * 3 + 2] == count[r]);
    /* Out of range: a clear error, nothing written. */
    int64_t bad[2] = {1, 10};
    ts_tensor *badidx, *r;
    CHECK_OK(ts_tensor_from_host(dev, TS_I64, 1, (const int64_t[]){2}, bad, &badidx));
    CHECK_FAILS(ts_index_select(w, 0, badidx, &r), TS_EINVAL, "10");
    CHECK_FAILS(ts_index_select(w, 0, w, &r), TS_EDTYPE, "float64", "int64");
    CHECK_FAILS(ts_index_add_(g, 0, flat, w), TS_ESHAPE, "(10, 3)");
    free(vw), free(ve), free(vg);
    ts_tensor_unref(badidx), ts_tensor_unref(g), ts_tensor_unref(flat), ts_tensor_unref(src);
    ts_tensor_unref(w), ts_tensor_unref(idx), ts_tensor_unref(e);
    tap_end();
}

static void test_conv_and_pool(void)
{
    setup();
    ts_rng_init(&rng, 9);
    /* x (2, 4, 7, 6), w (6, 2, 3, 2), groups 2, stride (2, 1), pad (1, 0), dilation (1, 2). */
    ts_tensor *x = rnd(4, (const int64_t[]){2, 4, 7, 6}, -1, 1), *w = rnd(4, (const int64_t[]){6, 2, 3, 2}, -1, 1);
    ts_tensor *bias = rnd(1, (const int64_t[]){6}, -1, 1), *y;
    ts_conv2d_params p = {.stride_h = 2, .stride_w = 1, .pad_h = 1, .pad_w = 0,
                          .dilation_h = 1, .dilation_w = 2, .groups = 2};
    CHECK_OK(ts_conv2d(x, w, bias, &p, &y));
    const int64_t *ys = ts_tensor_shape(y);
    /* P = (7 + 2 - 3) / 2 + 1 = 4; Q = (6 - 2*1 - 1) / 1 + 1 = 4 */
    CHECK(ys[0] == 2 && ys[1] == 6 && ys[2] == 4 && ys[3] == 4);
    double *vx = vals(x), *vw = vals(w), *vb = vals(bias), *vy = vals(y);
    for (int n = 0; n < 2; n++)
        for (int k = 0; k < 6; k++)
            for (int oh = 0; oh < 4; oh++)
                for (int ow = 0; ow < 4; ow++) {
                    int g = k / 3;
                    double s = vb[k];
                    for (int c = 0; c < 2; c++)
                        for (int r = 0; r < 3; r++)
                            for (int q = 0; q < 2; q++) {
                                int ih = oh * 2 - 1 + r, iw = ow + q * 2;
                                if (ih < 0 || ih >= 7 || iw < 0 || iw >= 6)
                                    continue;
                                s += vx[((n * 4 + g * 2 + c) * 7 + ih) * 6 + iw] *
                                     vw[((k * 2 + c) * 3 + r) * 2 + q];
                            }
                    CLOSE(vy[((n * 6 + k) * 4 + oh) * 4 + ow], s, 1e-12);
                }
    free(vw), free(vb), free(vy);
    ts_tensor *bad;
    CHECK_FAILS(ts_conv2d(x, x, NULL, &p, &bad), TS_ESHAPE, "(2, 4, 7, 6)", "groups = 2");
    ts_conv2d_params p0 = p;
    p0.stride_h = 0;
    CHECK_FAILS(ts_conv2d(x, w, NULL, &p0, &bad), TS_EINVAL, "stride");
    CHECK_FAILS(ts_conv2d(x, w, x, &p, &bad), TS_ESHAPE, "bias");

    /* Max pool 3x3, stride 2, pad 1, with indices; avg pool 2x2. */
    ts_pool2d_params mp = {.kernel_h = 3, .kernel_w = 3, .stride_h = 2, .stride_w = 2,
                           .pad_h = 1, .pad_w = 1};
    ts_tensor *m, *mi, *a;
    CHECK_OK(ts_max_pool2d(x, &mp, &m, &mi));
    const int64_t *ms = ts_tensor_shape(m);
    CHECK(ms[2] == 4 && ms[3] == 3); /* (7 + 2 - 3)/2 + 1, (6 + 2 - 3)/2 + 1 */
    double *vm = vals(m), *vi = vals(mi);
    for (int plane = 0; plane < 8; plane++)
        for (int oh = 0; oh < 4; oh++)
            for (int ow = 0; ow < 3; ow++) {
                double best = -INFINITY;
                for (int r = 0; r < 3; r++)
                    for (int q = 0; q < 3; q++) {
                        int ih = oh * 2 - 1 + r, iw = ow * 2 - 1 + q;
                        if (ih >= 0 && ih < 7 && iw >= 0 && iw < 6)
                            best = fmax(best, vx[(plane * 7 + ih) * 6 + iw]);
                    }
                int o = (plane * 4 + oh) * 3 + ow;
                CHECK(vm[o] == best);
                CHECK(vx[plane * 42 + (int64_t)vi[o]] == best);
            }
    ts_pool2d_params ap = {.kernel_h = 2, .kernel_w = 2, .stride_h = 2, .stride_w = 2};
    CHECK_OK(ts_avg_pool2d(x, &ap, &a));
    double *vav = vals(a);
    CLOSE(vav[0], (vx[0] + vx[1] + vx[6] + vx[7]) / 4, 1e-12);
    ts_pool2d_params badp = {.kernel_h = 2, .kernel_w = 2, .stride_h = 1, .stride_w = 1,
                             .pad_h = 2};
    CHECK_FAILS(ts_avg_pool2d(x, &badp, &bad), TS_EINVAL, "padding");
    ts_pool2d_params big = {.kernel_h = 5, .kernel_w = 5, .stride_h = 1, .stride_w = 1};
    CHECK_FAILS(ts_max_pool2d(w, &big, &bad, NULL), TS_ESHAPE, "5x5 window", "(6, 2, 3, 2)");
    free(vx), free(vm), free(vi), free(vav);
    ts_tensor_unref(m), ts_tensor_unref(mi), ts_tensor_unref(a);
    ts_tensor_unref(x), ts_tensor_unref(w), ts_tensor_unref(bias), ts_tensor_unref(y);
    tap_end();
}

/* The kernel profile counts exactly the kernels run while it is enabled, per op, function and
 * dtype, the most time first; and ts_fn_name names the functions. */
static const ts_profile_entry *find_entry(const ts_profile_entry *e, size_t n, int32_t op,
                                          int32_t fn, int32_t dtype)
{
    for (size_t i = 0; i < n; i++)
        if (e[i].op == op && e[i].fn == fn && e[i].dtype == dtype)
            return &e[i];
    return NULL;
}

static void test_profile(void)
{
    setup();
    CHECK(!strcmp(ts_fn_name(TS_OP_UNARY, TS_UNARY_RELU), "relu"));
    CHECK(!strcmp(ts_fn_name(TS_OP_BINARY_SCALAR, TS_BINARY_GT), "gt"));
    CHECK(!strcmp(ts_fn_name(TS_OP_REDUCE, TS_REDUCE_ARGMIN), "argmin"));
    CHECK(ts_fn_name(TS_OP_MATMUL, 0) == NULL);
    CHECK(ts_fn_name(TS_OP_UNARY, TS_UNARY_COUNT) == NULL);
    CHECK(ts_fn_name(TS_OP_BINARY, -1) == NULL);

    ts_tensor *a = rnd(2, (int64_t[]){64, 32}, -1, 1), *b = rnd(2, (int64_t[]){32, 16}, -1, 1);
    ts_tensor *t = NULL;
    ts_profile_reset();
    CHECK_INT_EQ(ts_profile_read(NULL, 0), 0);
    /* Off by default: nothing counted. */
    CHECK_OK(ts_relu(a, &t));
    ts_tensor_unref(t);
    CHECK_INT_EQ(ts_profile_read(NULL, 0), 0);

    CHECK_INT_EQ(ts_profile_enable(1), 0);
    for (int i = 0; i < 3; i++) {
        CHECK_OK(ts_relu(a, &t));
        ts_tensor_unref(t);
    }
    for (int i = 0; i < 2; i++) {
        CHECK_OK(ts_add(a, a, &t));
        ts_tensor_unref(t);
    }
    CHECK_OK(ts_matmul(a, b, &t));
    ts_tensor_unref(t);
    CHECK_OK(ts_sum(a, 1, (int[]){0}, 0, &t));
    ts_tensor_unref(t);
    CHECK_INT_EQ(ts_profile_enable(0), 1);
    /* Off again: these are not counted. */
    CHECK_OK(ts_relu(a, &t));
    ts_tensor_unref(t);

    ts_profile_entry e[64];
    size_t n = ts_profile_read(e, 64);
    CHECK(n >= 4 && n <= 64);
    const ts_profile_entry *relu = find_entry(e, n, TS_OP_UNARY, TS_UNARY_RELU, TS_F64);
    const ts_profile_entry *add = find_entry(e, n, TS_OP_BINARY, TS_BINARY_ADD, TS_F64);
    const ts_profile_entry *mm = find_entry(e, n, TS_OP_MATMUL, -1, TS_F64);
    const ts_profile_entry *sum = find_entry(e, n, TS_OP_REDUCE, TS_REDUCE_SUM, TS_F64);
    CHECK(relu && add && mm && sum);
    if (relu && add && mm && sum) {
        CHECK_INT_EQ(relu->calls, 3);
        CHECK_INT_EQ(add->calls, 2);
        CHECK_INT_EQ(mm->calls, 1);
        CHECK_INT_EQ(sum->calls, 1);
        CHECK(relu->seconds > 0 && mm->seconds > 0 && mm->seconds < 10);
    }
    for (size_t i = 1; i < n; i++)
        CHECK_MSG(e[i - 1].seconds >= e[i].seconds, "entry %zu out of order", i);
    /* A short buffer still gets the total, and the first (the slowest) entries. */
    ts_profile_entry one;
    CHECK_INT_EQ(ts_profile_read(&one, 1), n);
    CHECK(one.op == e[0].op && one.fn == e[0].fn && one.dtype == e[0].dtype);
    /* Enabled periods add up until a reset. */
    ts_profile_enable(1);
    CHECK_OK(ts_relu(a, &t));
    ts_tensor_unref(t);
    ts_profile_enable(0);
    n = ts_profile_read(e, 64);
    relu = find_entry(e, n, TS_OP_UNARY, TS_UNARY_RELU, TS_F64);
    CHECK(relu && relu->calls == 4);
    ts_profile_reset();
    CHECK_INT_EQ(ts_profile_read(e, 64), 0);
    ts_tensor_unref(a), ts_tensor_unref(b);
    tap_end();
}

int main(int argc, char **argv)
{
    static const tap_test tests[] = {
        TAP_TEST(test_binary_broadcast_noncontiguous),
        TAP_TEST(test_unary_and_scalar),
        TAP_TEST(test_inplace_out_and_overlap),
        TAP_TEST(test_mismatch_errors),
        TAP_TEST(test_where_cast_copy),
        TAP_TEST(test_reductions),
        TAP_TEST(test_matmul),
        TAP_TEST(test_softmax),
        TAP_TEST(test_embedding_and_index_add),
        TAP_TEST(test_conv_and_pool),
        TAP_TEST(test_profile),
    };
    return tap_run(tests, sizeof tests / sizeof tests[0], argc, argv);
}
