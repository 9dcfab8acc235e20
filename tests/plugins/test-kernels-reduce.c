/* tests/plugins/test-kernels-reduce.c: the reduce kernels (sum, mean, max, min, argmax,
 * argmin) and softmax / log-softmax on every built CPU plugin, through ts_device_run with
 * operands in every layout, against float64 references computed here: every subset of dims of
 * a 3-D tensor, keep-dim outputs, ties, NaN, empty and 0-d tensors, large (threaded) inputs,
 * numerically hard softmax inputs, and the error paths. */
#include <math.h>

#include "kt.h"

static const int32_t num_dtypes[4] = {TS_F32, TS_F64, TS_I32, TS_I64};
static const int64_t shape3[3] = {3, 4, 5};

static int is_float(int32_t dt)
{
    return dt == TS_F32 || dt == TS_F64;
}

static const char *const *plugins(void)
{
    const char *const *p = kt_plugins();
    if (!p[0])
        SKIP("no CPU plugin is built");
    return p;
}

static void check_no_leaks(ts_device *dev)
{
    ts_memory_stats st;
    CHECK_OK(ts_device_memory_stats(dev, &st));
    CHECK_INT_EQ(st.live_blocks, 0);
}

/* Runs the block once per built plugin with dev loaded, then checks the pool is empty. */
#define FOR_EACH_PLUGIN(dev)                                                                       \
    for (const char *const *pl_ = plugins(); *pl_; pl_++)                                          \
        for (ts_device *dev = kt_load(*pl_); dev; check_no_leaks(dev), dev = NULL)



/* ---- reference reductions -------------------------------------------------------------- */

/* Reference for output element at oidx (keep-dim index) of reducing in over the dims with
 * red[d] set: value (sum, mean, max, min) or first index (arg*, along the single reduced dim)
 * in *v; *scale gets sum |x| for the tolerance of sums. NaN wins max / min / arg*. */
static void ref_reduce(const ts_operand *in, const int *red, const int64_t *oidx, int32_t fn,
                       double *v, double *scale)
{
    int nd = in->ndim;
    int64_t shp[TS_MAX_DIMS], n = 1;
    for (int d = 0; d < nd; d++) {
        shp[d] = red[d] ? in->shape[d] : 1;
        n *= shp[d];
    }
    double sum = 0, abs_sum = 0, best = 0;
    int64_t at = -1;
    for (int64_t i = 0; i < n; i++) {
        int64_t idx[TS_MAX_DIMS], rem = i, along = 0;
        for (int d = nd - 1; d >= 0; d--) {
            int64_t k = rem % shp[d];
            rem /= shp[d];
            idx[d] = red[d] ? k : oidx[d];
            if (red[d])
                along = k;
        }
        double x = kt_get(in, idx);
        sum += x;
        abs_sum += fabs(x);
        int maxish = fn == TS_REDUCE_MAX || fn == TS_REDUCE_ARGMAX;
        int better = at < 0 || (!isnan(best) && (isnan(x) || (maxish ? x > best : x < best)));
        if (better) {
            best = x;
            at = fn == TS_REDUCE_ARGMAX || fn == TS_REDUCE_ARGMIN ? along : i;
        }
    }
    *scale = abs_sum;
    switch (fn) {
    case TS_REDUCE_SUM:
        *v = sum;
        break;
    case TS_REDUCE_MEAN:
        *v = sum / (double)n;
        break;
    case TS_REDUCE_MAX:
    case TS_REDUCE_MIN:
        *v = best;
        break;
    default:
        *v = (double)at;
        break;
    }
}

/* Runs the reduction of in into out (keep-dim shape) and checks every output element. */
static void check_reduce(ts_device *dev, const ts_operand *in, const kt_buf *out, int32_t fn,
                         int32_t dim, const int *red, const char *label)
{
    ts_reduce_params p = {fn, dim};
    ts_status s = kt_run(dev, TS_OP_REDUCE, in, 1, &out->op, 1, &p, sizeof p);
    CHECK_MSG(s == TS_OK, "%s: %s: %s", label, ts_status_name(s), ts_last_error());
    int64_t n = kt_numel(&out->op), idx[TS_MAX_DIMS];
    /* Sums are checked relative to sum |x|: the order of additions differs from ours. */
    double eps = in->dtype == TS_F32 ? 2e-6 : in->dtype == TS_F64 ? 1e-13 : 0;
    for (int64_t i = 0; i < n; i++) {
        kt_unravel(&out->op, i, idx);
        double want, scale;
        ref_reduce(in, red, idx, fn, &want, &scale);
        if (out->op.dtype == TS_F32)
            want = (float)want;
        double got = kt_get(&out->op, idx);
        CHECK_MSG(kt_close(got, want, kt_rtol(in->dtype), eps * scale),
                  "%s: output %lld is %.9g, expected %.9g", label, (long long)i, got, want);
    }
    kt_check_gaps(out);
}

/* ---- tests ----------------------------------------------------------------------------- */

static void test_supports(void)
{
    FOR_EACH_PLUGIN(dev)
    {
        for (int i = 0; i < 4; i++) {
            CHECK(ts_device_supports(dev, TS_OP_REDUCE, num_dtypes[i]));
            CHECK(ts_device_supports(dev, TS_OP_SOFTMAX, num_dtypes[i]) == is_float(num_dtypes[i]));
            CHECK(ts_device_supports(dev, TS_OP_LOG_SOFTMAX, num_dtypes[i]) ==
                  is_float(num_dtypes[i]));
        }
        CHECK(!ts_device_supports(dev, TS_OP_REDUCE, TS_U8));
        CHECK(!ts_device_supports(dev, TS_OP_SOFTMAX, TS_U8));
        /* Softmax on int32: refused by the core since supports() says no. */
        kt_buf a = kt_make(dev, TS_I32, 3, shape3, KT_CONTIG, 1);
        kt_buf o = kt_make(dev, TS_I32, 3, shape3, KT_CONTIG, 2);
        ts_dim_params dp = {1};
        CHECK_FAILS(kt_run(dev, TS_OP_SOFTMAX, &a.op, 1, &o.op, 1, &dp, sizeof dp), TS_ENOTSUP,
                    "does not implement");
        /* Integer mean: supports(REDUCE, int32) is yes (sum, max, min); the kernel refuses. */
        int64_t os[3] = {3, 1, 5};
        kt_buf r = kt_make(dev, TS_I32, 3, os, KT_CONTIG, 3);
        ts_reduce_params rp = {TS_REDUCE_MEAN, 0};
        CHECK_FAILS(kt_run(dev, TS_OP_REDUCE, &a.op, 1, &r.op, 1, &rp, sizeof rp), TS_ENOTSUP,
                    "not implemented");
        kt_check_gaps(&r);
        kt_free(&a);
        kt_free(&o);
        kt_free(&r);
    }
}

/* sum, mean, max, min over each of the 8 subsets of the dims of (3, 4, 5), every dtype, every
 * input and output layout. */
static void test_reduce_subsets(void)
{
    FOR_EACH_PLUGIN(dev)
    {
        for (int mask = 0; mask < 8; mask++)
            for (int32_t fn = TS_REDUCE_SUM; fn <= TS_REDUCE_MIN; fn++)
                for (int i = 0; i < 4; i++)
                    for (int li = 0; li < KT_NLAYOUTS; li++)
                        for (int lo = 0; lo < KT_NLAYOUTS; lo++) {
                            int32_t dt = num_dtypes[i];
                            if (fn == TS_REDUCE_MEAN && !is_float(dt))
                                continue;
                            int red[3];
                            int64_t os[3];
                            for (int d = 0; d < 3; d++) {
                                red[d] = (mask >> d) & 1;
                                os[d] = red[d] ? 1 : shape3[d];
                            }
                            kt_buf a = kt_make(dev, dt, 3, shape3, li, 10 + mask);
                            kt_buf o = kt_make(dev, dt, 3, os, lo, 20);
                            char label[96];
                            snprintf(label, sizeof label, "reduce fn %d %s mask %d %s->%s", (int)fn,
                                     ts_dtype_name(dt), mask, kt_layout_name(li), kt_layout_name(lo));
                            check_reduce(dev, &a.op, &o, fn, 0, red, label);
                            kt_free(&a);
                            kt_free(&o);
                        }
    }
}

/* argmax / argmin along each dim. Integer inputs in [-9, 9] have many ties: the reference
 * takes the first occurrence. */
static void test_argmax(void)
{
    FOR_EACH_PLUGIN(dev)
    {
        for (int32_t fn = TS_REDUCE_ARGMAX; fn <= TS_REDUCE_ARGMIN; fn++)
            for (int dim = 0; dim < 3; dim++)
                for (int i = 0; i < 4; i++)
                    for (int l = 0; l < KT_NLAYOUTS; l++) {
                        int32_t dt = num_dtypes[i];
                        int red[3] = {0, 0, 0};
                        red[dim] = 1;
                        int64_t os[3] = {3, 4, 5};
                        os[dim] = 1;
                        kt_buf a = kt_make(dev, dt, 3, shape3, l, 30 + dim);
                        kt_buf o = kt_make(dev, TS_I64, 3, os, (l + 1) % KT_NLAYOUTS, 40);
                        char label[96];
                        snprintf(label, sizeof label, "arg fn %d dim %d %s %s", (int)fn, dim,
                                 ts_dtype_name(dt), kt_layout_name(l));
                        check_reduce(dev, &a.op, &o, fn, dim, red, label);
                        /* Negative dims count from the end. */
                        check_reduce(dev, &a.op, &o, fn, dim - 3, red, label);
                        kt_free(&a);
                        kt_free(&o);
                    }
    }
}

/* Explicit ties and NaN: first occurrence wins; NaN counts as the max and the min (PyTorch),
 * and max / min propagate it. */
static void test_ties_and_nan(void)
{
    static const double ties[] = {1, 3, 3, -2, 3, -2};
    static const double nans[] = {1, NAN, 7, NAN, -4, 2};
    int64_t n = 6, one = 1;
    FOR_EACH_PLUGIN(dev)
    {
        for (int i = 0; i < 4; i++) {
            int32_t dt = num_dtypes[i];
            kt_buf a = kt_make(dev, dt, 1, &n, KT_STRIDED, 1);
            kt_buf o = kt_make(dev, TS_I64, 1, &one, KT_OFFSET, 2);
            kt_buf v = kt_make(dev, dt, 1, &one, KT_CONTIG, 3);
            for (int64_t k = 0; k < n; k++)
                kt_set(&a.op, &k, ties[k]);
            ts_reduce_params p = {TS_REDUCE_ARGMAX, 0};
            int64_t z = 0;
            CHECK_OK(kt_run(dev, TS_OP_REDUCE, &a.op, 1, &o.op, 1, &p, sizeof p));
            CHECK_INT_EQ(kt_get(&o.op, &z), 1);
            p.fn = TS_REDUCE_ARGMIN;
            CHECK_OK(kt_run(dev, TS_OP_REDUCE, &a.op, 1, &o.op, 1, &p, sizeof p));
            CHECK_INT_EQ(kt_get(&o.op, &z), 3);
            if (is_float(dt)) {
                for (int64_t k = 0; k < n; k++)
                    kt_set(&a.op, &k, nans[k]);
                for (int32_t fn = TS_REDUCE_ARGMAX; fn <= TS_REDUCE_ARGMIN; fn++) {
                    p.fn = fn;
                    CHECK_OK(kt_run(dev, TS_OP_REDUCE, &a.op, 1, &o.op, 1, &p, sizeof p));
                    CHECK_INT_EQ(kt_get(&o.op, &z), 1);
                }
                for (int32_t fn = TS_REDUCE_SUM; fn <= TS_REDUCE_MIN; fn++) {
                    p.fn = fn;
                    CHECK_OK(kt_run(dev, TS_OP_REDUCE, &a.op, 1, &v.op, 1, &p, sizeof p));
                    CHECK(isnan(kt_get(&v.op, &z)));
                }
            }
            kt_check_gaps(&o);
            kt_free(&a);
            kt_free(&o);
            kt_free(&v);
        }
    }
}

/* Reducing over broadcast (stride-0) dims, and inputs whose reduced dims are merged. */
static void test_reduce_broadcast(void)
{
    int64_t s1[3] = {3, 1, 5};
    FOR_EACH_PLUGIN(dev)
    {
        for (int mask = 0; mask < 8; mask++) {
            kt_buf a = kt_make(dev, TS_F64, 3, s1, KT_STRIDED, 50);
            ts_operand ab = kt_broadcast(&a.op, 3, shape3);
            int red[3];
            int64_t os[3];
            for (int d = 0; d < 3; d++) {
                red[d] = (mask >> d) & 1;
                os[d] = red[d] ? 1 : shape3[d];
            }
            for (int32_t fn = TS_REDUCE_SUM; fn <= TS_REDUCE_MIN; fn++) {
                kt_buf o = kt_make(dev, TS_F64, 3, os, KT_STRIDED, 51);
                check_reduce(dev, &ab, &o, fn, 0, red, "reduce broadcast");
                kt_free(&o);
            }
            kt_free(&a);
        }
    }
}

/* A size-0 reduced dim: sum 0, mean NaN, max / min / arg* an error. A size-0 kept dim: an
 * empty output, nothing to do. 0-d: the element itself. */
static void test_reduce_empty_and_0d(void)
{
    int64_t e[3] = {3, 0, 4}, oe[3] = {3, 1, 4}, ok[3] = {1, 0, 4};
    FOR_EACH_PLUGIN(dev)
    {
        for (int i = 0; i < 4; i++) {
            int32_t dt = num_dtypes[i];
            kt_buf a = kt_make(dev, dt, 3, e, KT_STRIDED, 60);
            kt_buf o = kt_make(dev, dt, 3, oe, KT_OFFSET, 61);
            kt_buf oi = kt_make(dev, TS_I64, 3, oe, KT_CONTIG, 62);
            kt_buf o2 = kt_make(dev, dt, 3, ok, KT_CONTIG, 63);
            int red[3] = {0, 1, 0};
            check_reduce(dev, &a.op, &o, TS_REDUCE_SUM, 0, red, "sum of empty");
            CHECK(kt_get(&o.op, (int64_t[]){2, 0, 3}) == 0);
            if (is_float(dt)) {
                check_reduce(dev, &a.op, &o, TS_REDUCE_MEAN, 0, red, "mean of empty");
                CHECK(isnan(kt_get(&o.op, (int64_t[]){0, 0, 0})));
            }
            ts_reduce_params p = {TS_REDUCE_MAX, 1};
            CHECK_FAILS(kt_run(dev, TS_OP_REDUCE, &a.op, 1, &o.op, 1, &p, sizeof p), TS_EINVAL,
                        "empty");
            p.fn = TS_REDUCE_MIN;
            CHECK_FAILS(kt_run(dev, TS_OP_REDUCE, &a.op, 1, &o.op, 1, &p, sizeof p), TS_EINVAL,
                        "empty");
            p.fn = TS_REDUCE_ARGMAX;
            CHECK_FAILS(kt_run(dev, TS_OP_REDUCE, &a.op, 1, &oi.op, 1, &p, sizeof p), TS_EINVAL,
                        "empty");
            /* Reducing dim 0 of (3, 0, 4): the (1, 0, 4) output has no elements. */
            for (int32_t fn = TS_REDUCE_SUM; fn <= TS_REDUCE_MIN; fn++) {
                if (fn == TS_REDUCE_MEAN && !is_float(dt))
                    continue;
                p.fn = fn;
                CHECK_OK(kt_run(dev, TS_OP_REDUCE, &a.op, 1, &o2.op, 1, &p, sizeof p));
            }
            kt_check_gaps(&o2);
            /* 0-d in and out. */
            kt_buf s = kt_make(dev, dt, 0, NULL, KT_OFFSET, 64);
            kt_buf so = kt_make(dev, dt, 0, NULL, KT_OFFSET, 65);
            kt_buf si = kt_make(dev, TS_I64, 0, NULL, KT_CONTIG, 66);
            for (int32_t fn = TS_REDUCE_SUM; fn <= TS_REDUCE_MIN; fn++) {
                if (fn == TS_REDUCE_MEAN && !is_float(dt))
                    continue;
                check_reduce(dev, &s.op, &so, fn, 0, red, "0-d");
            }
            check_reduce(dev, &s.op, &si, TS_REDUCE_ARGMAX, 0, red, "0-d argmax");
            CHECK(kt_get(&si.op, NULL) == 0);
            kt_free(&a);
            kt_free(&o);
            kt_free(&oi);
            kt_free(&o2);
            kt_free(&s);
            kt_free(&so);
            kt_free(&si);
        }
    }
}

/* Inputs above the threading threshold: a full reduction (fewer outputs than threads: the
 * slice is split and the partials merged in order) and row reductions. The max sits in the
 * first half with a tie in the second, so the merge must keep the first occurrence. */
static void test_reduce_large(void)
{
    int64_t n = 100003, s2[2] = {263, 509}, one = 1;
    FOR_EACH_PLUGIN(dev)
    {
        for (int i = 0; i < 4; i++)
            for (int l = 0; l < KT_NLAYOUTS; l++) {
                int32_t dt = num_dtypes[i];
                kt_buf a = kt_make(dev, dt, 1, &n, l, 70);
                kt_set(&a.op, (int64_t[]){20001}, 50);
                kt_set(&a.op, (int64_t[]){90001}, 50);
                kt_set(&a.op, (int64_t[]){60001}, -50);
                kt_set(&a.op, (int64_t[]){70001}, -50);
                kt_buf o = kt_make(dev, dt, 1, &one, KT_CONTIG, 71);
                kt_buf oi = kt_make(dev, TS_I64, 1, &one, KT_CONTIG, 72);
                int red[1] = {1};
                for (int32_t fn = TS_REDUCE_SUM; fn <= TS_REDUCE_MIN; fn++)
                    if (fn != TS_REDUCE_MEAN || is_float(dt))
                        check_reduce(dev, &a.op, &o, fn, 0, red, "large full reduction");
                check_reduce(dev, &a.op, &oi, TS_REDUCE_ARGMAX, 0, red, "large argmax");
                CHECK_INT_EQ(kt_get(&oi.op, (int64_t[]){0}), 20001);
                check_reduce(dev, &a.op, &oi, TS_REDUCE_ARGMIN, 0, red, "large argmin");
                CHECK_INT_EQ(kt_get(&oi.op, (int64_t[]){0}), 60001);
                kt_free(&a);
                kt_free(&o);
                kt_free(&oi);

                kt_buf b = kt_make(dev, dt, 2, s2, l, 73);
                for (int d = 0; d < 2; d++) {
                    int64_t os[2] = {s2[0], s2[1]};
                    os[d] = 1;
                    int r2[2] = {d == 0, d == 1};
                    kt_buf ob = kt_make(dev, dt, 2, os, (l + 1) % KT_NLAYOUTS, 74);
                    check_reduce(dev, &b.op, &ob, TS_REDUCE_SUM, 0, r2, "large rows");
                    if (is_float(dt)) /* over dim 0 of a contiguous b: summed row by row */
                        check_reduce(dev, &b.op, &ob, TS_REDUCE_MEAN, 0, r2, "large rows");
                    check_reduce(dev, &b.op, &ob, TS_REDUCE_MAX, 0, r2, "large rows");
                    kt_free(&ob);
                }
                kt_free(&b);
            }
    }
}

/* float32 sums must not accumulate in float32: 1e8 followed by 200002 ones loses every one
 * added to the 1e8 (float32 spacing there is 8); a float64 or pairwise sum is off by the final
 * rounding only. */
static void test_sum_accuracy(void)
{
    int64_t n = 200003, one = 1;
    FOR_EACH_PLUGIN(dev)
    {
        for (int l = 0; l < KT_NLAYOUTS; l++) {
            kt_buf a = kt_make(dev, TS_F32, 1, &n, l, 1);
            kt_buf o = kt_make(dev, TS_F32, 1, &one, KT_OFFSET, 2);
            for (int64_t i = 0; i < n; i++)
                kt_set(&a.op, &i, i == 0 ? 1e8 : 1);
            ts_reduce_params p = {TS_REDUCE_SUM, 0};
            int64_t z = 0;
            CHECK_OK(kt_run(dev, TS_OP_REDUCE, &a.op, 1, &o.op, 1, &p, sizeof p));
            double want = 1e8 + (double)(n - 1);
            CHECK_MSG(fabs(kt_get(&o.op, &z) - want) <= 8, "float32 sum %.1f, expected %.1f",
                      kt_get(&o.op, &z), want);
            p.fn = TS_REDUCE_MEAN;
            CHECK_OK(kt_run(dev, TS_OP_REDUCE, &a.op, 1, &o.op, 1, &p, sizeof p));
            CHECK(kt_close(kt_get(&o.op, &z), want / (double)n, 1e-6, 0));
            kt_check_gaps(&o);
            kt_free(&a);
            kt_free(&o);
        }
    }
}

/* A sum over the rows of a contiguous matrix (a bias gradient) adds each column in row order
 * in double: the result is that sum rounded once, bit for bit, in float32 and bfloat16, for
 * full blocks of columns and a ragged last one. Each column starts at 2^50 and ends at -2^50,
 * so the small values between are rounded to 2^50's spacing as they are added: another order
 * (pairwise, float32 partials, blocks of rows) gives other bits. */
static void test_sum_rows_exact(void)
{
    static const int64_t shapes[][2] = {{2048, 200}, {300, 77}, {65, 32}};
    FOR_EACH_PLUGIN(dev)
    {
        for (int h = 0; h < 2; h++)
            for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
                int32_t dt = h ? TS_BF16 : TS_F32;
                int64_t R = shapes[c][0], C = shapes[c][1], os[2] = {1, C};
                kt_buf a = kt_make(dev, dt, 2, shapes[c], KT_CONTIG, 90 + c);
                for (int64_t i = 0; i < R; i++)
                    for (int64_t j = 0; j < C; j++) {
                        double v = kt_get(&a.op, (int64_t[]){i, j});
                        v *= ldexp(1.0, (int)((i * 7 + j) % 9) - 4);
                        kt_set(&a.op, (int64_t[]){i, j}, i == 0 ? 0x1p50 : i == R - 1 ? -0x1p50 : v);
                    }
                kt_buf o = kt_make(dev, dt, 2, os, KT_CONTIG, 99);
                ts_reduce_params p = {TS_REDUCE_SUM, 0};
                CHECK_OK(kt_run(dev, TS_OP_REDUCE, &a.op, 1, &o.op, 1, &p, sizeof p));
                for (int64_t j = 0; j < C; j++) {
                    double sum = 0;
                    for (int64_t i = 0; i < R; i++)
                        sum += kt_get(&a.op, (int64_t[]){i, j});
                    double want = h ? ts_plugin_bf16_to_f32(ts_plugin_f32_to_bf16((float)sum))
                                    : (double)(float)sum;
                    double got = kt_get(&o.op, (int64_t[]){0, j});
                    CHECK_MSG(got == want, "%s %s (%lld, %lld) summed over rows: column %lld is "
                              "%.9g, not %.9g (the row-order double sum rounded once)",
                              ts_device_name(dev), ts_dtype_name(dt), (long long)R, (long long)C,
                              (long long)j, got, want);
                }
                kt_free(&o);
                kt_free(&a);
            }
    }
}

/* ---- softmax --------------------------------------------------------------------------- */

/* Checks out = (log_)softmax(x) along dim against a float64 reference (from a snapshot x of
 * the input taken before the run, which may be in place). Softmax rows must sum to 1. */
static void check_softmax(const ts_operand *out, const double *x, int dim, int log_form,
                          const char *label)
{
    int64_t n = kt_numel(out), idx[TS_MAX_DIMS];
    int nd = out->ndim;
    int64_t len = nd ? out->shape[dim] : 1;
    double tol = out->dtype == TS_F32 ? 1e-5 : 1e-12;
    /* Element i's slice: the linear indices differing only along dim. */
    int64_t step = 1;
    for (int d = nd - 1; d > dim; d--)
        step *= out->shape[d];
    /* Each slice's max and sum of exp, kept at the index of its first element (visited
     * before the slice's others in row-major order). */
    double *ms = malloc((size_t)(n ? n : 1) * 2 * sizeof *ms);
    CHECK(ms);
    for (int64_t i = 0; i < n; i++) {
        kt_unravel(out, i, idx);
        int64_t k = nd ? idx[dim] : 0, first = i - k * step;
        double row = 0;
        if (k == 0) {
            ms[2 * i] = -INFINITY;
            ms[2 * i + 1] = 0;
            for (int64_t j = 0; j < len; j++)
                ms[2 * i] = fmax(ms[2 * i], x[first + j * step]);
            for (int64_t j = 0; j < len; j++)
                ms[2 * i + 1] += exp(x[first + j * step] - ms[2 * i]);
        }
        double m = ms[2 * first], s = ms[2 * first + 1];
        double want = log_form ? x[i] - m - log(s) : exp(x[i] - m) / s;
        double got = kt_get(out, idx);
        CHECK_MSG(isfinite(got) && kt_close(got, want, tol, tol * 0.1),
                  "%s: element %lld is %.9g, expected %.9g", label, (long long)i, got, want);
        if (!log_form && k == 0) {
            int64_t jdx[TS_MAX_DIMS];
            for (int64_t j = 0; j < len; j++) {
                kt_unravel(out, first + j * step, jdx);
                row += kt_get(out, jdx);
            }
            CHECK_MSG(fabs(row - 1) < 10 * tol, "%s: a row sums to %.9g", label, row);
        }
    }
    free(ms);
}

static double *snapshot(const ts_operand *op)
{
    int64_t n = kt_numel(op), idx[TS_MAX_DIMS];
    double *x = malloc((size_t)(n ? n : 1) * sizeof *x);
    CHECK(x);
    for (int64_t i = 0; i < n; i++) {
        kt_unravel(op, i, idx);
        x[i] = kt_get(op, idx);
    }
    return x;
}

static void run_softmax(ts_device *dev, int32_t op, const ts_operand *in, const kt_buf *out,
                        int dim, const char *label)
{
    double *x = snapshot(in);
    ts_dim_params p = {dim};
    ts_status s = kt_run(dev, op, in, 1, &out->op, 1, &p, sizeof p);
    CHECK_MSG(s == TS_OK, "%s: %s: %s", label, ts_status_name(s), ts_last_error());
    int nd = out->op.ndim;
    check_softmax(&out->op, x, nd ? (dim + nd) % nd : 0, op == TS_OP_LOG_SOFTMAX, label);
    kt_check_gaps(out);
    free(x);
}

static void test_softmax(void)
{
    FOR_EACH_PLUGIN(dev)
    {
        for (int32_t op = TS_OP_SOFTMAX; op <= TS_OP_LOG_SOFTMAX; op++)
            for (int i = 0; i < 2; i++)
                for (int dim = -1; dim < 3; dim++)
                    for (int li = 0; li < KT_NLAYOUTS; li++)
                        for (int lo = 0; lo < KT_NLAYOUTS; lo++) {
                            int32_t dt = num_dtypes[i];
                            kt_buf a = kt_make(dev, dt, 3, shape3, li, 80 + dim);
                            kt_buf o = kt_make(dev, dt, 3, shape3, lo, 90);
                            char label[96];
                            snprintf(label, sizeof label, "%s %s dim %d %s->%s", ts_op_name(op),
                                     ts_dtype_name(dt), dim, kt_layout_name(li), kt_layout_name(lo));
                            run_softmax(dev, op, &a.op, &o, dim, label);
                            /* In place. */
                            run_softmax(dev, op, &a.op, &a, dim, label);
                            kt_free(&a);
                            kt_free(&o);
                        }
    }
}

/* Large logits: exp(1000) overflows, the max-shifted form does not. Also a broadcast input,
 * 0-d and empty tensors, and rows long enough to thread. */
static void test_softmax_hard_inputs(void)
{
    int64_t s2[2] = {4, 6}, e[2] = {3, 0}, big[2] = {1031, 67};
    FOR_EACH_PLUGIN(dev)
    {
        for (int i = 0; i < 2; i++) {
            int32_t dt = num_dtypes[i];
            kt_buf a = kt_make(dev, dt, 2, s2, KT_TRANSPOSED, 100);
            kt_buf o = kt_make(dev, dt, 2, s2, KT_STRIDED, 101);
            int64_t idx[2];
            for (int64_t k = 0; k < 24; k++) {
                kt_unravel(&a.op, k, idx);
                kt_set(&a.op, idx, 1000 + (double)(k % 6) - (k / 6 == 2 ? 3000 : 0));
            }
            for (int32_t op = TS_OP_SOFTMAX; op <= TS_OP_LOG_SOFTMAX; op++)
                for (int dim = 0; dim < 2; dim++)
                    run_softmax(dev, op, &a.op, &o, dim, "large logits");

            int64_t r1[2] = {4, 1};
            kt_buf b = kt_make(dev, dt, 2, r1, KT_CONTIG, 102);
            ts_operand bb = kt_broadcast(&b.op, 2, s2);
            run_softmax(dev, TS_OP_SOFTMAX, &bb, &o, 1, "broadcast input");
            run_softmax(dev, TS_OP_LOG_SOFTMAX, &bb, &o, 0, "broadcast input");

            kt_buf s = kt_make(dev, dt, 0, NULL, KT_OFFSET, 103);
            kt_buf so = kt_make(dev, dt, 0, NULL, KT_OFFSET, 104);
            run_softmax(dev, TS_OP_SOFTMAX, &s.op, &so, 0, "0-d softmax");
            CHECK(kt_get(&so.op, NULL) == 1);
            run_softmax(dev, TS_OP_LOG_SOFTMAX, &s.op, &so, -1, "0-d log_softmax");
            CHECK(kt_get(&so.op, NULL) == 0);

            kt_buf ea = kt_make(dev, dt, 2, e, KT_CONTIG, 105);
            kt_buf eo = kt_make(dev, dt, 2, e, KT_STRIDED, 106);
            run_softmax(dev, TS_OP_SOFTMAX, &ea.op, &eo, 1, "empty softmax");
            run_softmax(dev, TS_OP_SOFTMAX, &ea.op, &eo, 0, "empty softmax");

            kt_buf ga = kt_make(dev, dt, 2, big, KT_TRANSPOSED, 107);
            kt_buf go = kt_make(dev, dt, 2, big, KT_CONTIG, 108);
            run_softmax(dev, TS_OP_SOFTMAX, &ga.op, &go, 1, "many rows");
            run_softmax(dev, TS_OP_LOG_SOFTMAX, &ga.op, &go, 0, "long rows");
            kt_free(&a);
            kt_free(&o);
            kt_free(&b);
            kt_free(&s);
            kt_free(&so);
            kt_free(&ea);
            kt_free(&eo);
            kt_free(&ga);
            kt_free(&go);
        }
    }
}

static void test_errors(void)
{
    int64_t os[3] = {3, 1, 5}, bad[3] = {3, 2, 5}, two[2] = {3, 5};
    FOR_EACH_PLUGIN(dev)
    {
        kt_buf a = kt_make(dev, TS_F32, 3, shape3, KT_CONTIG, 1);
        kt_buf of = kt_make(dev, TS_F32, 3, os, KT_CONTIG, 2);
        kt_buf od = kt_make(dev, TS_F64, 3, os, KT_CONTIG, 3);
        kt_buf oi = kt_make(dev, TS_I64, 3, os, KT_CONTIG, 4);
        kt_buf ob = kt_make(dev, TS_F32, 3, bad, KT_CONTIG, 5);
        kt_buf o2 = kt_make(dev, TS_F32, 2, two, KT_CONTIG, 6);
        kt_buf sm = kt_make(dev, TS_F64, 3, shape3, KT_CONTIG, 7);
        ts_reduce_params p = {TS_REDUCE_SUM, 1};
        CHECK_FAILS(kt_run(dev, TS_OP_REDUCE, &a.op, 1, &od.op, 1, &p, sizeof p), TS_EINVAL,
                    "float64", "float32");
        CHECK_FAILS(kt_run(dev, TS_OP_REDUCE, &a.op, 1, &ob.op, 1, &p, sizeof p), TS_ESHAPE,
                    "dim 1");
        CHECK_FAILS(kt_run(dev, TS_OP_REDUCE, &a.op, 1, &o2.op, 1, &p, sizeof p), TS_ESHAPE,
                    "dims");
        CHECK_FAILS(kt_run(dev, TS_OP_REDUCE, &a.op, 1, &of.op, 1, NULL, 0), TS_EINVAL, "params");
        ts_operand two_in[2] = {a.op, a.op}; /* a call must hold as many as it says */
        CHECK_FAILS(kt_run(dev, TS_OP_REDUCE, two_in, 2, &of.op, 1, &p, sizeof p), TS_EINVAL,
                    "expected 1 input");
        p.fn = 42;
        CHECK_FAILS(kt_run(dev, TS_OP_REDUCE, &a.op, 1, &of.op, 1, &p, sizeof p), TS_EINVAL,
                    "unknown function");
        /* argmax writes int64 and reduces exactly params.dim. */
        p.fn = TS_REDUCE_ARGMAX;
        CHECK_FAILS(kt_run(dev, TS_OP_REDUCE, &a.op, 1, &of.op, 1, &p, sizeof p), TS_EINVAL,
                    "int64");
        p.dim = 3;
        CHECK_FAILS(kt_run(dev, TS_OP_REDUCE, &a.op, 1, &oi.op, 1, &p, sizeof p), TS_EINVAL,
                    "dim 3");
        p.dim = 0;
        CHECK_FAILS(kt_run(dev, TS_OP_REDUCE, &a.op, 1, &oi.op, 1, &p, sizeof p), TS_ESHAPE, "dim");
        ts_dim_params dp = {-4};
        CHECK_FAILS(kt_run(dev, TS_OP_SOFTMAX, &a.op, 1, &a.op, 1, &dp, sizeof dp), TS_EINVAL,
                    "dim -4");
        dp.dim = 0;
        CHECK_FAILS(kt_run(dev, TS_OP_SOFTMAX, &a.op, 1, &sm.op, 1, &dp, sizeof dp), TS_EINVAL,
                    "float32");
        CHECK_FAILS(kt_run(dev, TS_OP_LOG_SOFTMAX, &a.op, 1, &of.op, 1, &dp, sizeof dp), TS_ESHAPE,
                    "dim 1");
        kt_check_gaps(&of);
        kt_check_gaps(&oi);
        kt_free(&a);
        kt_free(&of);
        kt_free(&od);
        kt_free(&oi);
        kt_free(&ob);
        kt_free(&o2);
        kt_free(&sm);
    }
}

int main(int argc, char **argv)
{
    static const tap_test tests[] = {
        TAP_TEST(test_supports),         TAP_TEST(test_reduce_subsets),
        TAP_TEST(test_argmax),           TAP_TEST(test_ties_and_nan),
        TAP_TEST(test_reduce_broadcast), TAP_TEST(test_reduce_empty_and_0d),
        TAP_TEST(test_reduce_large),     TAP_TEST(test_sum_accuracy),
        TAP_TEST(test_sum_rows_exact),
        TAP_TEST(test_softmax),          TAP_TEST(test_softmax_hard_inputs),
        TAP_TEST(test_errors),
    };
    return tap_run(tests, sizeof tests / sizeof tests[0], argc, argv);
}
