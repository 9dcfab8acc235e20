/* tests/unit/test-tensor.c: creation, host round trips, clone/contiguous/to, metadata, the
 * version counter, and the counter-based generator (Philox known answers, determinism across
 * devices). Every test ends with no tensor, storage or pool block left. */
#include <math.h>

#include "../tap.h"

/* Exposed by core/random.c for this known-answer test. */
#include "philox.h" /* core/: the generator's block function, header-only */

static ts_device *dev;

static void setup(void)
{
    dev = tap_start();
}

static void test_creation(void)
{
    setup();
    static const int32_t dtypes[] = {TS_F32, TS_F64, TS_I32, TS_I64, TS_U8};
    for (size_t k = 0; k < 5; k++) {
        ts_tensor *t;
        CHECK_OK(ts_tensor_full(dev, dtypes[k], 2, (const int64_t[]){3, 5}, 7, &t));
        CHECK_INT_EQ(ts_tensor_numel(t), 15);
        CHECK_INT_EQ(ts_tensor_dtype(t), dtypes[k]);
        CHECK(ts_tensor_is_contiguous(t));
        CHECK(ts_tensor_strides(t)[0] == 5 && ts_tensor_strides(t)[1] == 1);
        double want = dtypes[k] == TS_U8 ? 1 : 7; /* uint8 stores != 0 */
        unsigned char raw[15 * 8];
        CHECK_OK(ts_tensor_to_host(t, raw, 15 * ts_dtype_size(dtypes[k])));
        for (int i = 0; i < 15; i++) {
            double v = dtypes[k] == TS_F32   ? ((float *)raw)[i]
                       : dtypes[k] == TS_F64 ? ((double *)raw)[i]
                       : dtypes[k] == TS_I32 ? ((int32_t *)raw)[i]
                       : dtypes[k] == TS_I64 ? (double)((int64_t *)raw)[i]
                                             : raw[i];
            CHECK(v == want);
        }
        ts_tensor_unref(t);
    }
    ts_tensor *z, *o, *e;
    CHECK_OK(ts_tensor_zeros(dev, TS_F32, 0, NULL, &z)); /* 0-d */
    CHECK_INT_EQ(ts_tensor_numel(z), 1);
    CHECK_OK(ts_tensor_ones(dev, TS_F32, 1, (const int64_t[]){0}, &e)); /* empty */
    CHECK_INT_EQ(ts_tensor_numel(e), 0);
    float one;
    CHECK_OK(ts_tensor_ones(dev, TS_F32, 3, (const int64_t[]){1, 1, 1}, &o));
    CHECK_OK(ts_tensor_to_host(o, &one, sizeof one));
    CHECK(one == 1.0f);
    ts_tensor_unref(z);
    ts_tensor_unref(o);
    ts_tensor_unref(e);

    ts_tensor *r;
    CHECK_OK(ts_tensor_arange(dev, TS_F64, 1, 2, 0.25, &r));
    double a[4];
    CHECK_OK(ts_tensor_to_host(r, a, sizeof a));
    CHECK(a[0] == 1 && a[1] == 1.25 && a[3] == 1.75);
    ts_tensor_unref(r);
    CHECK_OK(ts_tensor_arange(dev, TS_I64, 5, 0, -2, &r));
    int64_t b[3];
    CHECK_OK(ts_tensor_to_host(r, b, sizeof b));
    CHECK(b[0] == 5 && b[1] == 3 && b[2] == 1);
    ts_tensor_unref(r);
    tap_end();
}

static void test_creation_errors(void)
{
    setup();
    ts_tensor *t = (ts_tensor *)1;
    CHECK_FAILS(ts_tensor_empty(dev, TS_F32, 2, (const int64_t[]){3, -1}, &t), TS_EINVAL,
                "negative size", "(3, -1)");
    CHECK(t == NULL);
    CHECK_FAILS(ts_tensor_empty(dev, TS_F32, 9, (const int64_t[9]){1}, &t), TS_EINVAL, "9 dims");
    CHECK_FAILS(ts_tensor_empty(dev, 42, 1, (const int64_t[]){1}, &t), TS_EDTYPE, "dtype 42");
    CHECK_FAILS(ts_tensor_empty(dev, TS_F32, 2,
                                (const int64_t[]){INT64_MAX / 2, INT64_MAX / 2}, &t),
                TS_EINVAL, "too large");
    CHECK_FAILS(ts_tensor_arange(dev, TS_F32, 0, 1, 0, &t), TS_EINVAL, "step");
    /* More than memory_fraction allows: a clean TS_ENOMEM with the pool's figures. */
    CHECK_FAILS(ts_tensor_empty(dev, TS_F64, 2, (const int64_t[]){1 << 20, 1 << 20}, &t),
                TS_ENOMEM, "memory_fraction");
    float buf[4];
    ts_tensor *ok;
    CHECK_OK(ts_tensor_zeros(dev, TS_F32, 1, (const int64_t[]){3}, &ok));
    CHECK_FAILS(ts_tensor_to_host(ok, buf, sizeof buf), TS_EINVAL, "needs 12 bytes, got 16");
    ts_tensor_unref(ok);
    tap_end();
    /* No runtime, no device. */
    CHECK_FAILS(ts_tensor_empty(NULL, TS_F32, 1, (const int64_t[]){1}, &t), TS_ESTATE,
                "ts_init");
}

static void test_clone_contiguous_to(void)
{
    setup();
    double src[6] = {1, 2, 3, 4, 5, 6}, got[6];
    ts_tensor *t, *tt, *c;
    CHECK_OK(ts_tensor_from_host(dev, TS_F64, 2, (const int64_t[]){2, 3}, src, &t));
    CHECK_OK(ts_tensor_contiguous(t, &c));
    CHECK(c == t); /* already contiguous: the same tensor, one more reference */
    ts_tensor_unref(c);
    CHECK_OK(ts_tensor_transpose(t, 0, 1, &tt));
    CHECK_OK(ts_tensor_contiguous(tt, &c));
    CHECK(c != tt && ts_tensor_is_contiguous(c) && !ts_tensor_shares_storage(c, t));
    CHECK_OK(ts_tensor_to_host(c, got, sizeof got));
    CHECK(got[0] == 1 && got[1] == 4 && got[2] == 2 && got[5] == 6);
    ts_tensor_unref(c);
    CHECK_OK(ts_tensor_clone(t, &c));
    CHECK(!ts_tensor_shares_storage(c, t));
    ts_tensor_unref(c);

    /* Across plugins: cpu_blas -> cpu_onednn and back, values intact. */
    ts_device *other;
    char *path;
    if (ts_plugin_find(NULL, "cpu_onednn", &path) == TS_OK) {
        free(path);
        CHECK_OK(ts_device_get("cpu_onednn", &other));
        ts_tensor *moved, *back;
        CHECK_OK(ts_tensor_to(tt, other, &moved));
        CHECK(ts_tensor_device(moved) == other);
        CHECK_OK(ts_tensor_to(moved, dev, &back));
        CHECK_OK(ts_tensor_to_host(back, got, sizeof got));
        CHECK(got[0] == 1 && got[1] == 4 && got[5] == 6);
        ts_tensor_unref(moved);
        ts_tensor_unref(back);
    }
    CHECK_OK(ts_tensor_to(t, dev, &c)); /* same device: the same tensor */
    CHECK(c == t);
    ts_tensor_unref(c);
    ts_tensor_unref(tt);
    ts_tensor_unref(t);
    tap_end();
}

static void test_metadata_and_version(void)
{
    setup();
    ts_tensor *t, *v;
    CHECK_OK(ts_tensor_zeros(dev, TS_F32, 3, (const int64_t[]){2, 3, 4}, &t));
    CHECK_INT_EQ(ts_tensor_ndim(t), 3);
    CHECK_INT_EQ(ts_tensor_size(t, -1), 4);
    CHECK_INT_EQ(ts_tensor_size(t, 3), -1);
    CHECK_INT_EQ(ts_tensor_storage_nbytes(t), 96);
    CHECK(ts_tensor_device(t) == dev);
    char buf[64];
    CHECK(strcmp(ts_tensor_describe(t, buf, sizeof buf), "float32(2, 3, 4)") == 0);
    CHECK_OK(ts_tensor_select(t, 0, 1, &v));
    CHECK_INT_EQ(ts_tensor_offset(v), 12);
    uint64_t ver = ts_tensor_version(t);
    CHECK_OK(ts_fill_(v, 3));
    /* A write through a view bumps the version every view of the storage sees. */
    CHECK(ts_tensor_version(t) == ver + 1 && ts_tensor_version(v) == ver + 1);
    float x[24];
    CHECK_OK(ts_tensor_to_host(t, x, sizeof x));
    CHECK(x[11] == 0 && x[12] == 3 && x[23] == 3);
    ts_tensor_unref(v);
    ts_tensor_unref(t);
    tap_end();
}

static void test_philox_known_answers(void)
{
    /* Published known-answer vectors of Philox4x32-10 (Random123). */
    static const struct {
        uint32_t ctr[4], key[2], out[4];
    } kat[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
         {0xffffffff, 0xffffffff},
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
         {0xa4093822, 0x299f31d0},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (int i = 0; i < 3; i++) {
        uint32_t out[4];
        ts__philox4x32_10(kat[i].ctr, kat[i].key, out);
        for (int j = 0; j < 4; j++)
            CHECK_MSG(out[j] == kat[i].out[j], "vector %d word %d: %08x, want %08x", i, j, out[j],
                      kat[i].out[j]);
    }
}

static void test_random_streams(void)
{
    setup();
    ts_rng a, b;
    ts_rng_init(&a, 1234);
    ts_rng_init(&b, 1234);
    ts_tensor *x, *y, *z;
    const int64_t n = 20000;
    CHECK_OK(ts_tensor_rand(dev, TS_F32, 1, &n, -1, 3, &a, &x));
    CHECK_OK(ts_tensor_rand(dev, TS_F32, 1, &n, -1, 3, &b, &y));
    CHECK_INT_EQ(a.offset, n);
    static float fx[20000], fy[20000];
    CHECK_OK(ts_tensor_to_host(x, fx, sizeof fx));
    CHECK_OK(ts_tensor_to_host(y, fy, sizeof fy));
    CHECK(memcmp(fx, fy, sizeof fx) == 0); /* same seed and offset, same numbers */
    double sum = 0;
    for (int i = 0; i < n; i++) {
        CHECK(fx[i] >= -1 && fx[i] < 3);
        sum += fx[i];
    }
    CHECK_MSG(fabs(sum / n - 1.0) < 0.05, "uniform mean %g", sum / n);
    /* The next draw continues the stream: different numbers. */
    CHECK_OK(ts_tensor_rand(dev, TS_F32, 1, &n, -1, 3, &a, &z));
    CHECK_OK(ts_tensor_to_host(z, fy, sizeof fy));
    CHECK(memcmp(fx, fy, sizeof fx) != 0);
    ts_tensor_unref(x);
    ts_tensor_unref(y);
    ts_tensor_unref(z);

    /* Normal: mean and std, and the same numbers on another device. */
    ts_rng_init(&a, 99);
    CHECK_OK(ts_tensor_randn(dev, TS_F64, 2, (const int64_t[]){100, 200}, 2.0, 0.5, &a, &x));
    static double d[20000], d2[20000];
    CHECK_OK(ts_tensor_to_host(x, d, sizeof d));
    double m = 0, v = 0;
    for (int i = 0; i < n; i++)
        m += d[i];
    m /= n;
    for (int i = 0; i < n; i++)
        v += (d[i] - m) * (d[i] - m);
    v = sqrt(v / n);
    CHECK_MSG(fabs(m - 2.0) < 0.02 && fabs(v - 0.5) < 0.02, "normal mean %g std %g", m, v);
    char *path;
    if (ts_plugin_find(NULL, "cpu_onednn", &path) == TS_OK) {
        free(path);
        ts_device *other;
        CHECK_OK(ts_device_get("cpu_onednn", &other));
        ts_rng_init(&b, 99);
        CHECK_OK(ts_tensor_randn(other, TS_F64, 2, (const int64_t[]){100, 200}, 2.0, 0.5, &b, &y));
        CHECK_OK(ts_tensor_to_host(y, d2, sizeof d2));
        CHECK(memcmp(d, d2, sizeof d) == 0);
        ts_tensor_unref(y);
    }
    ts_tensor_unref(x);
    CHECK_FAILS(ts_tensor_rand(dev, TS_I32, 1, &n, 0, 1, &a, &x), TS_EDTYPE, "int32");
    CHECK_FAILS(ts_tensor_rand(dev, TS_F32, 1, &n, 1, 1, &a, &x), TS_EINVAL, "low < high");
    CHECK_FAILS(ts_tensor_randn(dev, TS_F32, 1, &n, 0, -1, &a, &x), TS_EINVAL, "std");
    tap_end();
}

/* ---- double -> integer element conversion ------------------------------------------------ */

/* The one rule: truncation toward zero, saturating at the type's bounds, NaN to 0; uint8 is the
 * mask dtype, so it stores v != 0 (NaN is != 0, so 1), as the float -> uint8 cast does. */
static const double conv_in[] = {1e10,         -1e10,         NAN,      INFINITY,
                                 -INFINITY,    2147483647.0,  2147483648.0, -2147483649.0,
                                 2.5,          -2.5,          0.0,      -0.0,
                                 0.999,        -0.999,        9.3e18,   -9.3e18,
                                 9223372036854775807.0,      -2147483648.0};

static int64_t conv_want(int32_t dtype, double v)
{
    if (dtype == TS_U8)
        return v != 0;
    double lo = dtype == TS_I32 ? -2147483648.0 : -9223372036854775808.0;
    double hi = dtype == TS_I32 ? 2147483647.0 : 9223372036854775807.0;
    if (isnan(v))
        return 0;
    if (v <= lo)
        return dtype == TS_I32 ? INT32_MIN : INT64_MIN;
    if (v >= hi)
        return dtype == TS_I32 ? INT32_MAX : INT64_MAX;
    return (int64_t)v;
}

static int64_t elem_at(int32_t dtype, const unsigned char *raw, int i)
{
    return dtype == TS_I32 ? ((const int32_t *)raw)[i]
           : dtype == TS_I64 ? ((const int64_t *)raw)[i]
                             : raw[i];
}

/* t's 3 elements all equal conv_want(dtype, v). */
static void check_conv(const char *how, const char *devname, ts_tensor *t, double v)
{
    int32_t dtype = ts_tensor_dtype(t);
    unsigned char raw[3 * 8];
    CHECK_OK(ts_tensor_to_host(t, raw, 3 * ts_dtype_size(dtype)));
    for (int i = 0; i < 3; i++)
        CHECK_MSG(elem_at(dtype, raw, i) == conv_want(dtype, v),
                  "%s on %s: %s from %.17g gave %lld, want %lld", how, devname,
                  ts_dtype_name(dtype), v, (long long)elem_at(dtype, raw, i),
                  (long long)conv_want(dtype, v));
}

static void conv_on(ts_device *d, const char *devname)
{
    static const int32_t dtypes[] = {TS_I32, TS_I64, TS_U8};
    const int64_t shape[1] = {3};
    for (size_t k = 0; k < 3; k++)
        for (size_t i = 0; i < sizeof conv_in / sizeof conv_in[0]; i++) {
            double v = conv_in[i];
            int32_t dt = dtypes[k];
            ts_tensor *t, *z, *o;
            CHECK_OK(ts_tensor_full(d, dt, 1, shape, v, &t));
            check_conv("ts_tensor_full", devname, t, v);
            CHECK_OK(ts_fill_(t, 5));
            CHECK_OK(ts_fill_(t, v));
            check_conv("ts_fill_", devname, t, v);
            ts_tensor_unref(t);
            if (dt == TS_U8)
                continue; /* masks have no arithmetic */
            CHECK_OK(ts_tensor_zeros(d, dt, 1, shape, &z));
            CHECK_OK(ts_add_scalar(z, v, &t));
            check_conv("ts_add_scalar(0, v)", devname, t, v);
            ts_tensor_unref(t);
            CHECK_OK(ts_add_scalar_(z, v));
            check_conv("ts_add_scalar_(0, v)", devname, z, v);
            CHECK_OK(ts_tensor_ones(d, dt, 1, shape, &o));
            CHECK_OK(ts_mul_scalar(o, v, &t));
            check_conv("ts_mul_scalar(1, v)", devname, t, v);
            ts_tensor_unref(t);
            ts_tensor_unref(z);
            ts_tensor_unref(o);
        }
}

/* The same double gives the same integer from every path: creation (core), fill_ and scalar
 * ops (kernels/host on cpu_blas and cpu_onednn), and the core's reference kernels. */
static void test_int_conversion(void)
{
    setup();
    conv_on(dev, "the default device");
    static const char *const plugins[] = {"cpu_blas", "cpu_onednn"};
    int ran = 0;
    for (int p = 0; p < 2; p++) {
        char *path;
        if (ts_plugin_find(NULL, plugins[p], &path) != TS_OK)
            continue;
        free(path);
        ts_device *d;
        CHECK_OK(ts_device_load(NULL, plugins[p], &d));
        conv_on(d, plugins[p]);
        ts_device_unload(d);
        ran++;
    }
    CHECK(ran >= 1);
    /* The reference kernels' fill. */
    static const int32_t dtypes[] = {TS_I32, TS_I64, TS_U8};
    for (size_t k = 0; k < 3; k++)
        for (size_t i = 0; i < sizeof conv_in / sizeof conv_in[0]; i++) {
            unsigned char raw[3 * 8];
            memset(raw, 0x5a, sizeof raw);
            ts_operand out = {.data = raw, .offset = 0, .dtype = dtypes[k], .ndim = 1,
                              .shape = {3}, .strides = {1}};
            ts_fill_params prm = {conv_in[i]};
            ts_kernel_call call = {.struct_size = sizeof call, .op = TS_OP_FILL, .ninputs = 0,
                                   .noutputs = 1, .outputs = &out, .params = &prm,
                                   .params_size = sizeof prm};
            CHECK_OK(ts_reference_run(&call));
            for (int e = 0; e < 3; e++)
                CHECK_MSG(elem_at(dtypes[k], raw, e) == conv_want(dtypes[k], conv_in[i]),
                          "reference fill: %s from %.17g gave %lld", ts_dtype_name(dtypes[k]),
                          conv_in[i], (long long)elem_at(dtypes[k], raw, e));
        }
    tap_end();
}

/* Shapes whose element count is zero are still bounded: every size, and the product of the
 * non-zero ones (else strides overflow). */
static void test_huge_zero_shapes(void)
{
    setup();
    static const int64_t bad[][3] = {{0, (int64_t)1 << 40, (int64_t)1 << 40},
                                     {(int64_t)1 << 40, (int64_t)1 << 40, 0},
                                     {(int64_t)1 << 40, 0, (int64_t)1 << 40},
                                     {0, INT64_MAX, 1},
                                     {0, (int64_t)1 << 62, 2}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ts_tensor *t = (ts_tensor *)1;
        CHECK_FAILS(ts_tensor_empty(dev, TS_U8, 3, bad[i], &t), TS_EINVAL, "too large");
        CHECK(t == NULL);
        CHECK_FAILS(ts_tensor_zeros(dev, TS_F32, 3, bad[i], &t), TS_EINVAL, "too large");
        CHECK_FAILS(ts_tensor_from_host(dev, TS_F32, 3, bad[i], "", &t), TS_EINVAL,
                    "too large");
    }
    ts_tensor *t;
    CHECK_OK(ts_tensor_empty(dev, TS_F64, 3, (const int64_t[]){0, (int64_t)1 << 20, 1 << 20},
                             &t));
    CHECK_INT_EQ(ts_tensor_numel(t), 0);
    ts_tensor_unref(t);
    /* arange with a count no tensor can hold. */
    CHECK_FAILS(ts_tensor_arange(dev, TS_F32, 0, 1e300, 1, &t), TS_EINVAL, "arange");
    CHECK_FAILS(ts_tensor_arange(dev, TS_F32, 0, 1e19, 1, &t), TS_EINVAL, "arange");
    tap_end();
}

/* Events carry the static tag the allocation was made with, also in debug mode (a name would
 * be freed with its block, and an alloc and its free would disagree). */
static void named_events(const ts_memory_event *ev, void *user)
{
    if (ev->tag && strchr(ev->tag, '('))
        ++*(int *)user;
}

static void count_named(const ts_memory_block_info *b, void *user)
{
    if (b->tag && strstr(b->tag, "(64, 10)"))
        ++*(uint64_t *)user;
}

static char *report_text(uint64_t since, uint64_t *n)
{
    FILE *f = tmpfile();
    CHECK(f != NULL);
    CHECK_OK(ts_memory_leak_report(f, since, n));
    long len = ftell(f);
    rewind(f);
    char *text = calloc(1, (size_t)len + 1);
    CHECK(text && fread(text, 1, (size_t)len, f) == (size_t)len);
    fclose(f);
    return text;
}

/* In debug mode a leak report names the op and the shape that made each tensor block: the
 * first kernel that writes a new storage names it ('matmul (64, 10) float32'); an uploaded or
 * never-written tensor keeps 'tensor' with its shape; a later in-place write does not rename
 * it; views share their base's block and name. */
static void test_leak_report_names_op_and_shape(void)
{
    setup();
    int named_ev = 0;
    ts_memory_set_callback(named_events, &named_ev);
    CHECK_INT_EQ(ts_memory_debug(1), 0);
    ts_tensor *a, *b, *c, *d, *e, *up, *z, *g;
    ts_rng rng = TS_RNG(1);
    CHECK_OK(ts_tensor_randn(dev, TS_F32, 2, (const int64_t[]){64, 32}, 0, 1, &rng, &a));
    CHECK_OK(ts_tensor_randn(dev, TS_F32, 2, (const int64_t[]){32, 10}, 0, 1, &rng, &b));
    uint64_t mark = ts_memory_mark();
    CHECK_OK(ts_matmul(a, b, &c));
    CHECK_OK(ts_add(c, c, &d));
    CHECK_OK(ts_add_(d, c)); /* in place: d keeps its name */
    CHECK_OK(ts_tensor_from_host(dev, TS_F64, 1, (const int64_t[]){3},
                                 (const double[]){1, 2, 3}, &up));
    CHECK_OK(ts_tensor_empty(dev, TS_I32, 3, (const int64_t[]){2, 3, 4}, &e));
    CHECK_OK(ts_tensor_zeros(dev, TS_F32, 1, (const int64_t[]){7}, &z));
    /* Autograd's tensors: the gradient of a matmul input is made by a matmul. */
    CHECK_OK(ts_tensor_set_requires_grad(a, 1));
    ts_tensor *y, *loss;
    CHECK_OK(ts_matmul(a, b, &y));
    CHECK_OK(ts_sum(y, 0, NULL, 0, &loss));
    CHECK_OK(ts_backward(loss, NULL, 0));
    g = ts_tensor_grad(a);
    CHECK(g != NULL);
    ts_tensor_unref(y);
    ts_tensor_unref(loss);

    uint64_t n = 0;
    char *text = report_text(mark, &n);
    CHECK_STR_CONTAINS(text, "tag 'matmul (64, 10) float32'");
    CHECK_STR_CONTAINS(text, "tag 'add (64, 10) float32'");
    CHECK_STR_CONTAINS(text, "tag 'tensor (3) float64'");
    CHECK_STR_CONTAINS(text, "tag 'tensor (2, 3, 4) int32'");
    CHECK_STR_CONTAINS(text, "tag 'fill (7) float32'");
    CHECK_STR_CONTAINS(text, "(64, 32) float32'"); /* a's gradient, named by its maker */
    CHECK_MSG(!strstr(text, "tag 'tensor'"), "a tensor block without its shape:\n%s", text);
    free(text);

    ts_tensor_unref(c); /* the name goes with the block: no report of it, no leak of it */
    ts_tensor_unref(d);
    text = report_text(mark, &n);
    CHECK_MSG(!strstr(text, "(64, 10)"), "%s", text);
    free(text);
    ts_tensor_unref(up);
    ts_tensor_unref(e);
    ts_tensor_unref(z);
    ts_memory_set_callback(NULL, NULL);
    CHECK_INT_EQ(named_ev, 0);
    CHECK_INT_EQ(ts_memory_debug(0), 1);
    /* Outside debug mode blocks keep the plain tag and cost nothing more. */
    CHECK_OK(ts_matmul(a, b, &c));
    n = 0;
    ts_memory_live_blocks(0, count_named, &n);
    CHECK_INT_EQ(n, 0);
    ts_tensor_unref(c);
    ts_tensor_unref(a);
    ts_tensor_unref(b);
    tap_end();
}

int main(int argc, char **argv)
{
    static const tap_test tests[] = {
        TAP_TEST(test_creation),          TAP_TEST(test_creation_errors),
        TAP_TEST(test_clone_contiguous_to), TAP_TEST(test_metadata_and_version),
        TAP_TEST(test_philox_known_answers), TAP_TEST(test_random_streams),
        TAP_TEST(test_int_conversion),    TAP_TEST(test_huge_zero_shapes),
        TAP_TEST(test_leak_report_names_op_and_shape),
    };
    return tap_run(tests, sizeof tests / sizeof tests[0], argc, argv);
}
