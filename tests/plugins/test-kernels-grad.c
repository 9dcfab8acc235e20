/* tests/plugins/test-kernels-grad.c: the backward kernels (conv2d data / weight on cpu_blas;
 * max / avg pooling and cross-entropy on every host plugin), each checked two ways: against a
 * float64 reference written here from the definition, and (in F64) against central finite
 * differences of the plugin's own forward op. Also: non-contiguous operands, outputs
 * overwritten, parameter and index / target range checks, and that no pool block leaks. */
#include "kt.h"

#include <math.h>

static const int32_t float_dtypes[] = {TS_F32, TS_F64};




/* op's elements in row-major order. (transfer full) */
static double *to_array(const ts_operand *op)
{
    int64_t n = kt_numel(op), idx[TS_MAX_DIMS];
    double *a = malloc(sizeof(double) * (size_t)(n ? n : 1));
    CHECK(a);
    for (int64_t i = 0; i < n; i++) {
        kt_unravel(op, i, idx);
        a[i] = kt_get(op, idx);
    }
    return a;
}

/* A NaN in the first element of an output: the kernel must overwrite, not accumulate. */
static void poison(const ts_operand *op)
{
    int64_t idx[TS_MAX_DIMS] = {0};
    if (kt_numel(op) > 0)
        kt_set(op, idx, NAN);
}

/* Every element of got (row-major) against want[]. */
static void check_against(const ts_operand *got, const double *want, double rtol, double atol,
                          const char *what)
{
    int64_t n = kt_numel(got), idx[TS_MAX_DIMS];
    for (int64_t i = 0; i < n; i++) {
        kt_unravel(got, i, idx);
        double g = kt_get(got, idx);
        CHECK_MSG(kt_close(g, want[i], rtol, atol), "%s: element %lld: got %.12g, want %.12g",
                  what, (long long)i, g, want[i]);
    }
}

/* The finite-difference check. The forward op (inputs in, output fwd_out) defines
 * L = sum(gy * out); grad must hold dL/dv for v, one of the inputs (shared memory), which is
 * perturbed by +-eps in place and restored. Taking the difference output by output keeps the
 * outputs v does not reach exactly out of the sum. At most ~160 elements of v, spread evenly. */
static void check_fd(ts_device *dev, int32_t op, const ts_operand *in, int nin,
                     const ts_operand *fwd_out, const void *params, size_t params_size,
                     const ts_operand *v, const ts_operand *gy, const ts_operand *grad,
                     const char *what)
{
    const double eps = 1e-6;
    int64_t nv = kt_numel(v), ny = kt_numel(fwd_out), step = (nv + 159) / 160;
    int64_t idx[TS_MAX_DIMS], yi[TS_MAX_DIMS];
    double *gya = to_array(gy);
    for (int64_t i = 0; i < nv; i += step) {
        kt_unravel(v, i, idx);
        double x0 = kt_get(v, idx), xp = x0 + eps, xm = x0 - eps;
        kt_set(v, idx, xp);
        CHECK_OK(kt_run(dev, op, in, nin, fwd_out, 1, params, params_size));
        double *yp = to_array(fwd_out);
        kt_set(v, idx, xm);
        CHECK_OK(kt_run(dev, op, in, nin, fwd_out, 1, params, params_size));
        kt_set(v, idx, x0);
        double diff = 0.0;
        for (int64_t j = 0; j < ny; j++) {
            kt_unravel(fwd_out, j, yi);
            diff += gya[j] * (yp[j] - kt_get(fwd_out, yi));
        }
        free(yp);
        double fd = diff / (xp - xm), got = kt_get(grad, idx);
        CHECK_MSG(kt_close(got, fd, 1e-6, 1e-7),
                  "%s: finite difference at element %lld: kernel %.12g, numeric %.12g", what,
                  (long long)i, got, fd);
    }
    free(gya);
}

/* ---------------------------------------------------------------------------------------- */
/* conv2d backward                                                                           */

typedef struct conv_case {
    int64_t N, C, H, W, K, R, S;
    ts_conv2d_params p;
    kt_layout lx, lw, lgy, lg; /* lg: gx, and (lg + 1) % 4 for gw */
    int fd;                    /* also check against finite differences (F64) */
} conv_case;

#define CONVP(st, pd, dl, g) {(st), (st), (pd), (pd), (dl), (dl), (g)}

static int64_t conv_out(int64_t in, int pad, int dil, int64_t k, int stride)
{
    return (in + 2 * pad - dil * (k - 1) - 1) / stride + 1;
}

/* gx (N, C, H, W) and gw (K, C/G, R, S) of L = sum(gy * conv(x, w)), straight from the
 * definition of the convolution, in float64. */
static void conv_ref(const conv_case *cc, const ts_operand *x, const ts_operand *w,
                     const ts_operand *gy, int64_t P, int64_t Q, double *gx, double *gw)
{
    const ts_conv2d_params *p = &cc->p;
    int64_t C = cc->C, H = cc->H, W = cc->W, R = cc->R, S = cc->S;
    int64_t Cg = C / p->groups, Kg = cc->K / p->groups;
    memset(gx, 0, sizeof(double) * (size_t)(cc->N * C * H * W));
    memset(gw, 0, sizeof(double) * (size_t)(cc->K * Cg * R * S));
    for (int64_t n = 0; n < cc->N; n++)
        for (int64_t k = 0; k < cc->K; k++)
            for (int64_t pp = 0; pp < P; pp++)
                for (int64_t q = 0; q < Q; q++) {
                    double g = kt_get(gy, (int64_t[]){n, k, pp, q});
                    for (int64_t c = 0; c < Cg; c++)
                        for (int64_t r = 0; r < R; r++)
                            for (int64_t s = 0; s < S; s++) {
                                int64_t hh = pp * p->stride_h - p->pad_h + r * p->dilation_h;
                                int64_t ww = q * p->stride_w - p->pad_w + s * p->dilation_w;
                                if (hh < 0 || hh >= H || ww < 0 || ww >= W)
                                    continue;
                                int64_t ci = k / Kg * Cg + c;
                                gx[((n * C + ci) * H + hh) * W + ww] +=
                                    g * kt_get(w, (int64_t[]){k, c, r, s});
                                gw[((k * Cg + c) * R + r) * S + s] +=
                                    g * kt_get(x, (int64_t[]){n, ci, hh, ww});
                            }
                }
}

static void run_conv_bwd_case(ts_device *dev, int32_t dt, const conv_case *cc)
{
    const ts_conv2d_params *p = &cc->p;
    int64_t G = p->groups, Cg = cc->C / G;
    int64_t P = conv_out(cc->H, p->pad_h, p->dilation_h, cc->R, p->stride_h);
    int64_t Q = conv_out(cc->W, p->pad_w, p->dilation_w, cc->S, p->stride_w);
    int64_t xs[4] = {cc->N, cc->C, cc->H, cc->W}, ws[4] = {cc->K, Cg, cc->R, cc->S};
    int64_t ys[4] = {cc->N, cc->K, P, Q};
    kt_buf x = kt_make(dev, dt, 4, xs, cc->lx, 51);
    kt_buf w = kt_make(dev, dt, 4, ws, cc->lw, 52);
    kt_buf gy = kt_make(dev, dt, 4, ys, cc->lgy, 53);
    kt_buf gx = kt_make(dev, dt, 4, xs, cc->lg, 54);
    kt_buf gw = kt_make(dev, dt, 4, ws, (cc->lg + 1) % KT_NLAYOUTS, 55);
    poison(&gx.op);
    poison(&gw.op);
    CHECK_OK(kt_run(dev, TS_OP_CONV2D_BWD_DATA, (ts_operand[]){gy.op, w.op}, 2, &gx.op, 1, p,
                    sizeof *p));
    CHECK_OK(kt_run(dev, TS_OP_CONV2D_BWD_WEIGHT, (ts_operand[]){gy.op, x.op}, 2, &gw.op, 1, p,
                    sizeof *p));

    char what[160];
    snprintf(what, sizeof what, "conv2d bwd %s N=%lld C=%lld K=%lld groups=%d stride=%d pad=%d "
             "dil=%d x=%s w=%s gy=%s out=%s", ts_dtype_name(dt), (long long)cc->N,
             (long long)cc->C, (long long)cc->K, (int)G, (int)p->stride_h, (int)p->pad_h,
             (int)p->dilation_h, kt_layout_name(cc->lx), kt_layout_name(cc->lw), kt_layout_name(cc->lgy),
             kt_layout_name(cc->lg));
    double *rx = malloc(sizeof(double) * (size_t)kt_numel(&x.op));
    double *rw = malloc(sizeof(double) * (size_t)kt_numel(&w.op));
    CHECK(rx && rw);
    conv_ref(cc, &x.op, &w.op, &gy.op, P, Q, rx, rw);
    double rtol = dt == TS_F32 ? 1e-4 : 1e-11, unit = dt == TS_F32 ? 1e-6 : 1e-13;
    char sub[200];
    snprintf(sub, sizeof sub, "%s: gx", what);
    check_against(&gx.op, rx, rtol, unit * (double)(cc->K / G * cc->R * cc->S + 1) * 8.0, sub);
    snprintf(sub, sizeof sub, "%s: gw", what);
    check_against(&gw.op, rw, rtol, unit * (double)(cc->N * P * Q + 1) * 8.0, sub);
    kt_check_gaps(&gx);
    kt_check_gaps(&gw);

    if (dt == TS_F64 && cc->fd) {
        kt_buf y = kt_make(dev, dt, 4, ys, KT_CONTIG, 56);
        ts_operand in[2] = {x.op, w.op};
        snprintf(sub, sizeof sub, "%s: gx", what);
        check_fd(dev, TS_OP_CONV2D, in, 2, &y.op, p, sizeof *p, &x.op, &gy.op, &gx.op, sub);
        snprintf(sub, sizeof sub, "%s: gw", what);
        check_fd(dev, TS_OP_CONV2D, in, 2, &y.op, p, sizeof *p, &w.op, &gy.op, &gw.op, sub);
        kt_free(&y);
    }
    free(rw);
    free(rx);
    kt_free(&gw);
    kt_free(&gx);
    kt_free(&gy);
    kt_free(&w);
    kt_free(&x);
}

static const conv_case conv_cases[] = {
    /* N C H W K R S params lx lw lgy lg fd */
    {2, 3, 7, 8, 4, 3, 3, CONVP(1, 0, 1, 1), KT_CONTIG, KT_CONTIG, KT_CONTIG, KT_CONTIG, 1},
    {2, 3, 7, 8, 4, 3, 3, CONVP(1, 1, 1, 1), KT_CONTIG, KT_CONTIG, KT_CONTIG, KT_CONTIG, 1},
    /* stride 2 with padding */
    {2, 3, 9, 8, 5, 3, 3, CONVP(2, 1, 1, 1), KT_STRIDED, KT_CONTIG, KT_TRANSPOSED, KT_OFFSET, 1},
    /* dilation 2, non-square kernel */
    {1, 2, 11, 10, 3, 3, 2, CONVP(1, 2, 2, 1), KT_TRANSPOSED, KT_OFFSET, KT_STRIDED, KT_STRIDED,
     1},
    /* groups 2, then groups 2 with stride 2 and dilation 2 */
    {2, 4, 8, 8, 6, 3, 3, CONVP(1, 1, 1, 2), KT_OFFSET, KT_TRANSPOSED, KT_CONTIG, KT_TRANSPOSED,
     1},
    {2, 4, 8, 8, 6, 3, 3, CONVP(2, 1, 2, 2), KT_STRIDED, KT_STRIDED, KT_OFFSET, KT_CONTIG, 1},
    /* depthwise, and depthwise with a channel multiplier of 2 */
    {2, 4, 9, 7, 4, 3, 3, CONVP(1, 1, 1, 4), KT_CONTIG, KT_CONTIG, KT_CONTIG, KT_STRIDED, 1},
    {1, 3, 9, 7, 6, 3, 3, CONVP(2, 1, 1, 3), KT_TRANSPOSED, KT_STRIDED, KT_CONTIG, KT_OFFSET, 1},
    /* stride 3 > kernel 2: some pixels receive nothing and must still be zeroed */
    {1, 2, 9, 9, 3, 2, 2, CONVP(3, 0, 1, 1), KT_CONTIG, KT_CONTIG, KT_STRIDED, KT_CONTIG, 1},
    /* 1x1 stride-1 unpadded: the paths without im2col / col2im, dense and not */
    {2, 5, 4, 6, 3, 1, 1, CONVP(1, 0, 1, 1), KT_CONTIG, KT_CONTIG, KT_CONTIG, KT_CONTIG, 1},
    {2, 5, 4, 6, 3, 1, 1, CONVP(1, 0, 1, 1), KT_OFFSET, KT_OFFSET, KT_OFFSET, KT_OFFSET, 1},
    {2, 4, 4, 6, 4, 1, 1, CONVP(1, 0, 1, 2), KT_STRIDED, KT_TRANSPOSED, KT_STRIDED, KT_STRIDED,
     1},
    /* kernel as large as the padded input: a 1x1 output */
    {1, 2, 3, 3, 2, 5, 5, CONVP(1, 1, 1, 1), KT_CONTIG, KT_CONTIG, KT_CONTIG, KT_CONTIG, 1},
    /* big enough for the threaded col2im / im2col */
    {2, 3, 40, 40, 24, 3, 3, CONVP(1, 1, 1, 1), KT_CONTIG, KT_CONTIG, KT_STRIDED, KT_CONTIG, 0},
};

static void test_conv2d_bwd(void)
{
    ts_device *dev = kt_load("cpu_blas");
    for (int d = 0; d < 2; d++) {
        CHECK(ts_device_supports(dev, TS_OP_CONV2D_BWD_DATA, float_dtypes[d]));
        CHECK(ts_device_supports(dev, TS_OP_CONV2D_BWD_WEIGHT, float_dtypes[d]));
        for (size_t i = 0; i < sizeof conv_cases / sizeof conv_cases[0]; i++)
            run_conv_bwd_case(dev, float_dtypes[d], &conv_cases[i]);
    }
    CHECK(!ts_device_supports(dev, TS_OP_CONV2D_BWD_DATA, TS_I64));
    CHECK(!ts_device_supports(dev, TS_OP_CONV2D_BWD_WEIGHT, TS_I32));
    kt_check_no_live_blocks(dev);
}

/* Every combination of layouts for x / w, gy and the outputs, against the reference. */
static void test_conv2d_bwd_layouts(void)
{
    ts_device *dev = kt_load("cpu_blas");
    for (int d = 0; d < 2; d++)
        for (int li = 0; li < KT_NLAYOUTS; li++)
            for (int lgy = 0; lgy < KT_NLAYOUTS; lgy++)
                for (int lo = 0; lo < KT_NLAYOUTS; lo++) {
                    conv_case cc = {2, 4, 7, 6, 6, 3, 2, CONVP(2, 1, 1, 2), li,
                                    (li + 1) % KT_NLAYOUTS, lgy, lo, 0};
                    run_conv_bwd_case(dev, float_dtypes[d], &cc);
                    conv_case one = {2, 4, 3, 5, 2, 1, 1, CONVP(1, 0, 1, 1), li, li, lgy, lo, 0};
                    run_conv_bwd_case(dev, float_dtypes[d], &one);
                }
    kt_check_no_live_blocks(dev);
}

/* No images: gw is an empty sum, so zeros; gx is empty. */
static void test_conv2d_bwd_empty(void)
{
    ts_device *dev = kt_load("cpu_blas");
    for (int d = 0; d < 2; d++) {
        int32_t dt = float_dtypes[d];
        ts_conv2d_params p = CONVP(1, 1, 1, 1);
        kt_buf x = kt_make(dev, dt, 4, (int64_t[]){0, 2, 5, 5}, KT_CONTIG, 1);
        kt_buf gy = kt_make(dev, dt, 4, (int64_t[]){0, 3, 5, 5}, KT_CONTIG, 2);
        kt_buf gw = kt_make(dev, dt, 4, (int64_t[]){3, 2, 3, 3}, KT_STRIDED, 3);
        poison(&gw.op);
        CHECK_OK(kt_run(dev, TS_OP_CONV2D_BWD_WEIGHT, (ts_operand[]){gy.op, x.op}, 2, &gw.op, 1,
                        &p, sizeof p));
        for (int64_t i = 0; i < 54; i++) {
            int64_t idx[4];
            kt_unravel(&gw.op, i, idx);
            CHECK(kt_get(&gw.op, idx) == 0.0);
        }
        kt_check_gaps(&gw);
        kt_free(&gw);
        kt_free(&gy);
        kt_free(&x);
    }
    kt_check_no_live_blocks(dev);
}

static void test_conv2d_bwd_bad_params(void)
{
    ts_device *dev = kt_load("cpu_blas");
    kt_buf x = kt_make(dev, TS_F32, 4, (int64_t[]){1, 4, 6, 6}, KT_CONTIG, 1);
    kt_buf w = kt_make(dev, TS_F32, 4, (int64_t[]){4, 2, 3, 3}, KT_CONTIG, 2);
    kt_buf gy = kt_make(dev, TS_F32, 4, (int64_t[]){1, 4, 4, 4}, KT_CONTIG, 3);
    kt_buf gx = kt_make(dev, TS_F32, 4, (int64_t[]){1, 4, 6, 6}, KT_CONTIG, 4);
    kt_buf gw = kt_make(dev, TS_F32, 4, (int64_t[]){4, 2, 3, 3}, KT_CONTIG, 5);
    kt_buf gx64 = kt_make(dev, TS_F64, 4, (int64_t[]){1, 4, 6, 6}, KT_CONTIG, 6);
    ts_operand dat[2] = {gy.op, w.op}, wei[2] = {gy.op, x.op};
    ts_conv2d_params ok = CONVP(1, 0, 1, 2), p;
    CHECK_OK(kt_run(dev, TS_OP_CONV2D_BWD_DATA, dat, 2, &gx.op, 1, &ok, sizeof ok));
    CHECK_OK(kt_run(dev, TS_OP_CONV2D_BWD_WEIGHT, wei, 2, &gw.op, 1, &ok, sizeof ok));
    for (int op = TS_OP_CONV2D_BWD_DATA; op <= TS_OP_CONV2D_BWD_WEIGHT; op++) {
        const ts_operand *in = op == TS_OP_CONV2D_BWD_DATA ? dat : wei;
        const ts_operand *out = op == TS_OP_CONV2D_BWD_DATA ? &gx.op : &gw.op;
        const char *name = op == TS_OP_CONV2D_BWD_DATA ? "conv2d_bwd_data" : "conv2d_bwd_weight";
        p = ok;
        p.stride_w = 0;
        CHECK_FAILS(kt_run(dev, op, in, 2, out, 1, &p, sizeof p), TS_EINVAL, name, "stride");
        p = ok;
        p.dilation_h = 0;
        CHECK_FAILS(kt_run(dev, op, in, 2, out, 1, &p, sizeof p), TS_EINVAL, "dilation");
        p = ok;
        p.pad_w = -1;
        CHECK_FAILS(kt_run(dev, op, in, 2, out, 1, &p, sizeof p), TS_EINVAL, "padding");
        p = ok;
        p.groups = 3;
        CHECK_FAILS(kt_run(dev, op, in, 2, out, 1, &p, sizeof p), TS_EINVAL, "groups");
        p = ok;
        p.groups = 1; /* w has C/2 input channels */
        CHECK_FAILS(kt_run(dev, op, in, 2, out, 1, &p, sizeof p), TS_EINVAL, "groups");
        p = ok;
        p.dilation_w = 4; /* 9 columns > 6 */
        CHECK_FAILS(kt_run(dev, op, in, 2, out, 1, &p, sizeof p), TS_EINVAL, "fit");
        p = ok;
        p.pad_h = 1; /* gy should have 6 rows */
        CHECK_FAILS(kt_run(dev, op, in, 2, out, 1, &p, sizeof p), TS_ESHAPE, "gy", "expected");
        CHECK_FAILS(kt_run(dev, op, in, 2, out, 1, NULL, 0), TS_EINVAL, "params");
        CHECK_FAILS(kt_run(dev, op, in, 1, out, 1, &ok, sizeof ok), TS_EINVAL, "2 inputs");
    }
    CHECK_FAILS(kt_run(dev, TS_OP_CONV2D_BWD_DATA, dat, 2, &gx64.op, 1, &ok, sizeof ok),
                TS_EINVAL, "dtypes");
    kt_free(&gx64);
    kt_free(&gw);
    kt_free(&gx);
    kt_free(&gy);
    kt_free(&w);
    kt_free(&x);
    kt_check_no_live_blocks(dev);
}

/* ---------------------------------------------------------------------------------------- */
/* pooling backward                                                                          */

/* gx of L = sum(gy * pool(x)) from the definition: max sends gy to the first maximum of its
 * window (row-major scan, strict >), avg spreads gy / count over the window. */
static void pool_ref(int is_max, const ts_operand *x, const ts_operand *gy,
                     const ts_pool2d_params *p, double *gx)
{
    int64_t N = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3];
    int64_t P = gy->shape[2], Q = gy->shape[3];
    memset(gx, 0, sizeof(double) * (size_t)(N * C * H * W));
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t pp = 0; pp < P; pp++)
                for (int64_t q = 0; q < Q; q++) {
                    double g = kt_get(gy, (int64_t[]){n, c, pp, q}), best = -INFINITY;
                    int64_t arg = -1, cnt = 0;
                    for (int64_t r = 0; r < p->kernel_h; r++)
                        for (int64_t s = 0; s < p->kernel_w; s++) {
                            int64_t hh = pp * p->stride_h - p->pad_h + r;
                            int64_t ww = q * p->stride_w - p->pad_w + s;
                            if (hh < 0 || hh >= H || ww < 0 || ww >= W)
                                continue;
                            double v = kt_get(x, (int64_t[]){n, c, hh, ww});
                            cnt++;
                            if (arg < 0 || v > best) {
                                best = v;
                                arg = hh * W + ww;
                            }
                        }
                    double *plane = gx + (n * C + c) * H * W;
                    if (is_max) {
                        plane[arg] += g;
                        continue;
                    }
                    if (p->count_include_pad)
                        cnt = (int64_t)p->kernel_h * p->kernel_w;
                    for (int64_t r = 0; r < p->kernel_h; r++)
                        for (int64_t s = 0; s < p->kernel_w; s++) {
                            int64_t hh = pp * p->stride_h - p->pad_h + r;
                            int64_t ww = q * p->stride_w - p->pad_w + s;
                            if (hh >= 0 && hh < H && ww >= 0 && ww < W)
                                plane[hh * W + ww] += g / (double)cnt;
                        }
                }
}

/* ties: x on a coarse grid so that maxima repeat and several windows pick the same input. */
static void pool_bwd_case(ts_device *dev, int32_t dt, int is_max, int64_t N, int64_t C,
                          int64_t H, int64_t W, const ts_pool2d_params *p, int ties, int fd,
                          kt_layout l)
{
    int64_t P = (H + 2 * p->pad_h - p->kernel_h) / p->stride_h + 1;
    int64_t Q = (W + 2 * p->pad_w - p->kernel_w) / p->stride_w + 1;
    int64_t xs[4] = {N, C, H, W}, ys[4] = {N, C, P, Q}, idx[4];
    kt_buf x = kt_make(dev, dt, 4, xs, (l + 1) % KT_NLAYOUTS, 61);
    if (ties)
        for (int64_t i = 0; i < kt_numel(&x.op); i++) {
            kt_unravel(&x.op, i, idx);
            kt_set(&x.op, idx, floor(kt_get(&x.op, idx)));
        }
    kt_buf gy = kt_make(dev, dt, 4, ys, l, 62);
    kt_buf gx = kt_make(dev, dt, 4, xs, (l + 2) % KT_NLAYOUTS, 63);
    kt_buf y = kt_make(dev, dt, 4, ys, KT_CONTIG, 64);
    kt_buf ix = kt_make(dev, TS_I64, 4, ys, (l + 3) % KT_NLAYOUTS, 65);
    poison(&gx.op);
    if (is_max) {
        CHECK_OK(kt_run(dev, TS_OP_MAXPOOL2D, &x.op, 1, (ts_operand[]){y.op, ix.op}, 2, p,
                        sizeof *p));
        CHECK_OK(kt_run(dev, TS_OP_MAXPOOL2D_BWD, (ts_operand[]){gy.op, ix.op}, 2, &gx.op, 1, p,
                        sizeof *p));
    } else {
        CHECK_OK(kt_run(dev, TS_OP_AVGPOOL2D_BWD, &gy.op, 1, &gx.op, 1, p, sizeof *p));
    }
    char what[160];
    snprintf(what, sizeof what, "%s %s k=%dx%d s=%dx%d pad=%dx%d cip=%d ties=%d gy=%s",
             is_max ? "maxpool2d_bwd" : "avgpool2d_bwd", ts_dtype_name(dt), (int)p->kernel_h,
             (int)p->kernel_w, (int)p->stride_h, (int)p->stride_w, (int)p->pad_h, (int)p->pad_w,
             (int)p->count_include_pad, ties, kt_layout_name(l));
    double *ref = malloc(sizeof(double) * (size_t)kt_numel(&x.op));
    CHECK(ref);
    pool_ref(is_max, &x.op, &gy.op, p, ref);
    int64_t terms = (int64_t)p->kernel_h * p->kernel_w;
    check_against(&gx.op, ref, dt == TS_F32 ? 1e-5 : 1e-12,
                  (dt == TS_F32 ? 1e-6 : 1e-14) * (double)terms * 4.0, what);
    kt_check_gaps(&gx);
    if (dt == TS_F64 && fd && !ties)
        check_fd(dev, is_max ? TS_OP_MAXPOOL2D : TS_OP_AVGPOOL2D, &x.op, 1, &y.op, p, sizeof *p,
                 &x.op, &gy.op, &gx.op, what);
    free(ref);
    kt_free(&ix);
    kt_free(&y);
    kt_free(&gx);
    kt_free(&gy);
    kt_free(&x);
}

static const ts_pool2d_params pool_params[] = {
    /* kh kw sh sw ph pw count_include_pad */
    {2, 2, 2, 2, 0, 0, 0}, /* disjoint windows */
    {3, 3, 1, 1, 1, 1, 0}, /* overlapping (stride < kernel), padded */
    {3, 3, 2, 2, 1, 1, 1}, /* overlapping, count_include_pad */
    {3, 3, 2, 2, 1, 1, 0}, /* the same without count_include_pad */
    {3, 2, 2, 1, 1, 1, 0}, {4, 4, 3, 2, 2, 1, 1}, {1, 1, 1, 1, 0, 0, 0},
    {2, 2, 3, 3, 0, 0, 0}, /* stride > kernel: inputs no window covers */
};

static void test_pool2d_bwd(void)
{
    const char *const *names = kt_plugins();
    if (!*names)
        SKIP("no host plugin is built");
    for (; *names; names++) {
        ts_device *dev = kt_load(*names);
        for (int d = 0; d < 2; d++) {
            int32_t dt = float_dtypes[d];
            CHECK(ts_device_supports(dev, TS_OP_MAXPOOL2D_BWD, dt));
            CHECK(ts_device_supports(dev, TS_OP_AVGPOOL2D_BWD, dt));
            for (size_t i = 0; i < sizeof pool_params / sizeof pool_params[0]; i++)
                for (int l = 0; l < KT_NLAYOUTS; l++) {
                    pool_bwd_case(dev, dt, 1, 2, 3, 7, 9, &pool_params[i], 0, l == 0, l);
                    pool_bwd_case(dev, dt, 1, 2, 3, 7, 9, &pool_params[i], 1, 0, l);
                    pool_bwd_case(dev, dt, 0, 2, 3, 7, 9, &pool_params[i], 0, l == 0, l);
                }
            /* Large enough to run on several threads. */
            pool_bwd_case(dev, dt, 1, 2, 4, 32, 33, &pool_params[1], 1, 0, KT_STRIDED);
            pool_bwd_case(dev, dt, 0, 2, 4, 32, 33, &pool_params[2], 0, 0, KT_CONTIG);
        }
        CHECK(!ts_device_supports(dev, TS_OP_MAXPOOL2D_BWD, TS_I32));
        CHECK(!ts_device_supports(dev, TS_OP_AVGPOOL2D_BWD, TS_I64));
        kt_check_no_live_blocks(dev);
    }
}

/* Every output pointing at one input must add up there; gx may be gy itself (1x1 window). */
static void test_pool2d_bwd_accumulate(void)
{
    const char *const *names = kt_plugins();
    if (!*names)
        SKIP("no host plugin is built");
    for (; *names; names++) {
        ts_device *dev = kt_load(*names);
        ts_pool2d_params p = {3, 3, 1, 1, 1, 1, 0};
        kt_buf gy = kt_make(dev, TS_F64, 4, (int64_t[]){1, 2, 4, 4}, KT_STRIDED, 1);
        kt_buf ix = kt_make(dev, TS_I64, 4, (int64_t[]){1, 2, 4, 4}, KT_CONTIG, 2);
        kt_buf gx = kt_make(dev, TS_F64, 4, (int64_t[]){1, 2, 4, 4}, KT_OFFSET, 3);
        double sum[2] = {0, 0};
        for (int64_t i = 0; i < 32; i++) {
            int64_t idx[4];
            kt_unravel(&ix.op, i, idx);
            kt_set(&ix.op, idx, 5.0);
            sum[idx[1]] += kt_get(&gy.op, idx);
        }
        CHECK_OK(kt_run(dev, TS_OP_MAXPOOL2D_BWD, (ts_operand[]){gy.op, ix.op}, 2, &gx.op, 1, &p,
                        sizeof p));
        for (int64_t i = 0; i < 32; i++) {
            int64_t idx[4];
            kt_unravel(&gx.op, i, idx);
            double want = idx[2] * 4 + idx[3] == 5 ? sum[idx[1]] : 0.0;
            CHECK(kt_close(kt_get(&gx.op, idx), want, 1e-12, 1e-14));
        }
        /* 2x2 stride 2 into a dense gx: plane 0's indices each inside their own window, as
         * max pooling makes them; plane 1's first row of windows too, its second all at one
         * pixel outside their windows (indices come from the caller and may point anywhere
         * in the plane); on a 5x7 input with an odd row and column. */
        {
            ts_pool2d_params p2 = {2, 2, 2, 2, 0, 0, 0};
            kt_buf gy2 = kt_make(dev, TS_F32, 4, (int64_t[]){1, 2, 2, 3}, KT_CONTIG, 4);
            kt_buf ix2 = kt_make(dev, TS_I64, 4, (int64_t[]){1, 2, 2, 3}, KT_STRIDED, 5);
            kt_buf gx2 = kt_make(dev, TS_F32, 4, (int64_t[]){1, 2, 5, 7}, KT_CONTIG, 6);
            double want[2][35] = {{0}};
            for (int64_t i = 0; i < 12; i++) {
                int64_t idx[4];
                kt_unravel(&ix2.op, i, idx);
                int64_t pp = idx[2], q = idx[3], k = (pp * 3 + q) % 4;
                int64_t a = idx[1] == 0 || pp == 0 ? (2 * pp + k / 2) * 7 + 2 * q + k % 2 : 12;
                kt_set(&ix2.op, idx, (double)a);
                want[idx[1]][a] += kt_get(&gy2.op, idx);
            }
            CHECK_OK(kt_run(dev, TS_OP_MAXPOOL2D_BWD, (ts_operand[]){gy2.op, ix2.op}, 2, &gx2.op,
                            1, &p2, sizeof p2));
            for (int64_t i = 0; i < 70; i++) {
                int64_t idx[4];
                kt_unravel(&gx2.op, i, idx);
                double w = want[idx[1]][idx[2] * 7 + idx[3]];
                CHECK_MSG(kt_close(kt_get(&gx2.op, idx), w, 1e-6, 1e-7),
                          "maxpool2d_bwd 2x2 plane %lld at (%lld, %lld): got %g, want %g",
                          (long long)idx[1], (long long)idx[2], (long long)idx[3],
                          kt_get(&gx2.op, idx), w);
            }
            kt_free(&gx2);
            kt_free(&ix2);
            kt_free(&gy2);
        }
        /* In place: gx is gy. */
        ts_pool2d_params one = {1, 1, 1, 1, 0, 0, 0};
        double *before = to_array(&gy.op);
        for (int64_t i = 0; i < 32; i++) {
            int64_t idx[4];
            kt_unravel(&ix.op, i, idx);
            kt_set(&ix.op, idx, (double)(idx[2] * 4 + idx[3]));
        }
        CHECK_OK(kt_run(dev, TS_OP_AVGPOOL2D_BWD, &gy.op, 1, &gy.op, 1, &one, sizeof one));
        check_against(&gy.op, before, 1e-15, 0, "avgpool2d_bwd in place");
        CHECK_OK(kt_run(dev, TS_OP_MAXPOOL2D_BWD, (ts_operand[]){gy.op, ix.op}, 2, &gy.op, 1,
                        &one, sizeof one));
        check_against(&gy.op, before, 1e-15, 0, "maxpool2d_bwd in place");
        free(before);
        kt_free(&gx);
        kt_free(&ix);
        kt_free(&gy);
        kt_check_no_live_blocks(dev);
    }
}

static void test_pool2d_bwd_bad_params(void)
{
    const char *const *names = kt_plugins();
    if (!*names)
        SKIP("no host plugin is built");
    for (; *names; names++) {
        ts_device *dev = kt_load(*names);
        kt_buf gy = kt_make(dev, TS_F32, 4, (int64_t[]){1, 2, 3, 3}, KT_CONTIG, 1);
        kt_buf ix = kt_make(dev, TS_I64, 4, (int64_t[]){1, 2, 3, 3}, KT_CONTIG, 2);
        kt_buf ix32 = kt_make(dev, TS_I32, 4, (int64_t[]){1, 2, 3, 3}, KT_CONTIG, 2);
        kt_buf gx = kt_make(dev, TS_F32, 4, (int64_t[]){1, 2, 6, 6}, KT_CONTIG, 3);
        for (int64_t i = 0; i < 18; i++) {
            int64_t idx[4];
            kt_unravel(&ix.op, i, idx);
            kt_set(&ix.op, idx, (double)(i % 36));
        }
        ts_pool2d_params ok = {2, 2, 2, 2, 0, 0, 0}, p;
        ts_operand mx[2] = {gy.op, ix.op};
        CHECK_OK(kt_run(dev, TS_OP_MAXPOOL2D_BWD, mx, 2, &gx.op, 1, &ok, sizeof ok));
        CHECK_OK(kt_run(dev, TS_OP_AVGPOOL2D_BWD, &gy.op, 1, &gx.op, 1, &ok, sizeof ok));
        p = ok;
        p.stride_w = 0;
        CHECK_FAILS(kt_run(dev, TS_OP_MAXPOOL2D_BWD, mx, 2, &gx.op, 1, &p, sizeof p), TS_EINVAL,
                    "maxpool2d_bwd", "stride");
        p = ok;
        p.kernel_h = 0;
        CHECK_FAILS(kt_run(dev, TS_OP_AVGPOOL2D_BWD, &gy.op, 1, &gx.op, 1, &p, sizeof p),
                    TS_EINVAL, "avgpool2d_bwd", "kernel");
        p = ok;
        p.pad_h = 2;
        CHECK_FAILS(kt_run(dev, TS_OP_AVGPOOL2D_BWD, &gy.op, 1, &gx.op, 1, &p, sizeof p),
                    TS_EINVAL, "padding");
        p = ok;
        p.stride_h = 1; /* gy should have 5 rows */
        CHECK_FAILS(kt_run(dev, TS_OP_MAXPOOL2D_BWD, mx, 2, &gx.op, 1, &p, sizeof p), TS_ESHAPE,
                    "expected");
        CHECK_FAILS(kt_run(dev, TS_OP_AVGPOOL2D_BWD, &gy.op, 1, &gx.op, 1, &p, sizeof p),
                    TS_ESHAPE, "expected");
        CHECK_FAILS(kt_run(dev, TS_OP_AVGPOOL2D_BWD, &gy.op, 1, &gx.op, 1, NULL, 0), TS_EINVAL,
                    "params");
        CHECK_FAILS(kt_run(dev, TS_OP_MAXPOOL2D_BWD, mx, 1, &gx.op, 1, &ok, sizeof ok),
                    TS_EINVAL, "indices");
        CHECK_FAILS(kt_run(dev, TS_OP_MAXPOOL2D_BWD, (ts_operand[]){gy.op, ix32.op}, 2, &gx.op,
                           1, &ok, sizeof ok),
                    TS_EINVAL, "TS_I64");
        /* Indices outside the 6x6 plane, high and low; gx is left untouched. */
        double *keep = to_array(&gx.op);
        kt_set(&ix.op, (int64_t[]){0, 1, 2, 1}, 36.0);
        CHECK_FAILS(kt_run(dev, TS_OP_MAXPOOL2D_BWD, mx, 2, &gx.op, 1, &ok, sizeof ok),
                    TS_EINVAL, "index 36", "(0, 1, 2, 1)", "6x6");
        kt_set(&ix.op, (int64_t[]){0, 1, 2, 1}, -1.0);
        CHECK_FAILS(kt_run(dev, TS_OP_MAXPOOL2D_BWD, mx, 2, &gx.op, 1, &ok, sizeof ok),
                    TS_EINVAL, "index -1");
        check_against(&gx.op, keep, 0, 0, "gx after a failed maxpool2d_bwd");
        free(keep);
        kt_free(&gx);
        kt_free(&ix32);
        kt_free(&ix);
        kt_free(&gy);
        kt_check_no_live_blocks(dev);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* cross-entropy                                                                             */

/* logits (N, C): loss[i] = logsumexp(row) - row[t], glogits = gloss * (softmax - onehot). */
static void ce_ref(const ts_operand *x, const int64_t *t, const ts_operand *gl, double *loss,
                   double *gx)
{
    int64_t N = x->shape[0], C = x->shape[1];
    for (int64_t i = 0; i < N; i++) {
        double m = -INFINITY, sum = 0.0;
        for (int64_t j = 0; j < C; j++)
            m = fmax(m, kt_get(x, (int64_t[]){i, j}));
        for (int64_t j = 0; j < C; j++)
            sum += exp(kt_get(x, (int64_t[]){i, j}) - m);
        double lse = m + log(sum);
        loss[i] = lse - kt_get(x, (int64_t[]){i, t[i]});
        double g = kt_get(gl, (int64_t[]){i});
        for (int64_t j = 0; j < C; j++)
            gx[i * C + j] = g * (exp(kt_get(x, (int64_t[]){i, j}) - lse) - (j == t[i]));
    }
}

/* scale: logits are kt's [-2, 2) values times scale, plus shift on every other row. */
static void ce_case(ts_device *dev, int32_t dt, int32_t tdt, int64_t N, int64_t C, double scale,
                    double shift, kt_layout l, int fd)
{
    kt_buf x = kt_make(dev, dt, 2, (int64_t[]){N, C}, l, 71);
    kt_buf t = kt_make(dev, tdt, 1, (int64_t[]){N}, l == KT_STRIDED ? KT_STRIDED : KT_OFFSET, 0);
    kt_buf gl = kt_make(dev, dt, 1, (int64_t[]){N}, (l + 1) % KT_NLAYOUTS, 72);
    kt_buf loss = kt_make(dev, dt, 1, (int64_t[]){N}, (l + 2) % KT_NLAYOUTS, 73);
    kt_buf gx = kt_make(dev, dt, 2, (int64_t[]){N, C}, (l + 3) % KT_NLAYOUTS, 74);
    int64_t *tv = malloc(sizeof(int64_t) * (size_t)N);
    CHECK(tv);
    for (int64_t i = 0; i < N; i++) {
        tv[i] = (i * 7 + 3) % C;
        kt_set(&t.op, (int64_t[]){i}, (double)tv[i]);
        for (int64_t j = 0; j < C; j++) {
            int64_t ij[2] = {i, j};
            kt_set(&x.op, ij, kt_get(&x.op, ij) * scale + (i % 2 ? shift : 0.0));
        }
    }
    poison(&loss.op);
    poison(&gx.op);
    CHECK_OK(kt_run(dev, TS_OP_CROSS_ENTROPY, (ts_operand[]){x.op, t.op}, 2, &loss.op, 1, NULL,
                    0));
    CHECK_OK(kt_run(dev, TS_OP_CROSS_ENTROPY_BWD, (ts_operand[]){x.op, t.op, gl.op}, 3, &gx.op,
                    1, NULL, 0));
    char what[128];
    snprintf(what, sizeof what, "cross_entropy %s targets %s N=%lld C=%lld scale=%g shift=%g "
             "logits=%s", ts_dtype_name(dt), ts_dtype_name(tdt), (long long)N, (long long)C,
             scale, shift, kt_layout_name(l));
    double *rl = malloc(sizeof(double) * (size_t)N), *rg = malloc(sizeof(double) * (size_t)(N * C));
    CHECK(rl && rg);
    ce_ref(&x.op, tv, &gl.op, rl, rg);
    /* F32 logits of size s carry an absolute error of s * 2^-24 into the loss. */
    double rtol = dt == TS_F32 ? 1e-5 : 1e-12;
    double atol = dt == TS_F32 ? 1e-6 * (1.0 + fabs(scale) + fabs(shift)) : 1e-12;
    check_against(&loss.op, rl, rtol, atol, what);
    check_against(&gx.op, rg, rtol, dt == TS_F32 ? 1e-6 : 1e-14, what);
    for (int64_t i = 0; i < N; i++) {
        double row = 0.0, lv = kt_get(&loss.op, (int64_t[]){i});
        CHECK_MSG(isfinite(lv) && lv >= -atol, "%s: loss[%lld] = %g", what, (long long)i, lv);
        for (int64_t j = 0; j < C; j++) {
            double g = kt_get(&gx.op, (int64_t[]){i, j});
            CHECK_MSG(isfinite(g), "%s: glogits[%lld, %lld] = %g", what, (long long)i,
                      (long long)j, g);
            row += g;
        }
        CHECK_MSG(fabs(row) <= (dt == TS_F32 ? 1e-6 : 1e-14) * (double)C * 4.0,
                  "%s: glogits row %lld sums to %g, not 0", what, (long long)i, row);
    }
    kt_check_gaps(&loss);
    kt_check_gaps(&gx);
    if (dt == TS_F64 && fd)
        check_fd(dev, TS_OP_CROSS_ENTROPY, (ts_operand[]){x.op, t.op}, 2, &loss.op, NULL, 0,
                 &x.op, &gl.op, &gx.op, what);
    free(rg);
    free(rl);
    free(tv);
    kt_free(&gx);
    kt_free(&loss);
    kt_free(&gl);
    kt_free(&t);
    kt_free(&x);
}

static void test_cross_entropy(void)
{
    const char *const *names = kt_plugins();
    if (!*names)
        SKIP("no host plugin is built");
    for (; *names; names++) {
        ts_device *dev = kt_load(*names);
        for (int d = 0; d < 2; d++) {
            int32_t dt = float_dtypes[d];
            CHECK(ts_device_supports(dev, TS_OP_CROSS_ENTROPY, dt));
            CHECK(ts_device_supports(dev, TS_OP_CROSS_ENTROPY_BWD, dt));
            for (int it = 0; it < 2; it++) {
                int32_t tdt = it ? TS_I32 : TS_I64;
                for (int l = 0; l < KT_NLAYOUTS; l++) {
                    ce_case(dev, dt, tdt, 5, 7, 1.0, 0.0, l, 1);
                    ce_case(dev, dt, tdt, 4, 1, 1.0, 0.0, l, 1); /* one class: loss 0 */
                }
                /* Large logits: exp would overflow without the max subtracted. */
                ce_case(dev, dt, tdt, 6, 5, 500.0, 1000.0, KT_CONTIG, 0);
                ce_case(dev, dt, tdt, 6, 5, 1.0, -1000.0, KT_STRIDED, 1);
                /* Many rows: the threaded loop. */
                ce_case(dev, dt, tdt, 300, 100, 3.0, 0.0, KT_CONTIG, 0);
            }
        }
        CHECK(!ts_device_supports(dev, TS_OP_CROSS_ENTROPY, TS_I64));
        CHECK(!ts_device_supports(dev, TS_OP_CROSS_ENTROPY_BWD, TS_I32));
        kt_check_no_live_blocks(dev);
    }
}

/* Logits of 1000 next to 0 and -1000: the loss is exact in double and must come out finite. */
static void test_cross_entropy_large(void)
{
    const char *const *names = kt_plugins();
    if (!*names)
        SKIP("no host plugin is built");
    for (; *names; names++) {
        ts_device *dev = kt_load(*names);
        for (int d = 0; d < 2; d++) {
            int32_t dt = float_dtypes[d];
            kt_buf x = kt_make(dev, dt, 2, (int64_t[]){2, 3}, KT_CONTIG, 1);
            kt_buf t = kt_make(dev, TS_I64, 1, (int64_t[]){2}, KT_CONTIG, 0);
            kt_buf gl = kt_make(dev, dt, 1, (int64_t[]){2}, KT_CONTIG, 0);
            kt_buf loss = kt_make(dev, dt, 1, (int64_t[]){2}, KT_CONTIG, 0);
            kt_buf gx = kt_make(dev, dt, 2, (int64_t[]){2, 3}, KT_CONTIG, 0);
            double v[2][3] = {{1000.0, 0.0, -1000.0}, {1000.0, 1000.0, 999.0}};
            for (int i = 0; i < 2; i++) {
                for (int j = 0; j < 3; j++)
                    kt_set(&x.op, (int64_t[]){i, j}, v[i][j]);
                kt_set(&gl.op, (int64_t[]){i}, 1.0);
            }
            kt_set(&t.op, (int64_t[]){0}, 2.0);
            kt_set(&t.op, (int64_t[]){1}, 0.0);
            CHECK_OK(kt_run(dev, TS_OP_CROSS_ENTROPY, (ts_operand[]){x.op, t.op}, 2, &loss.op, 1,
                            NULL, 0));
            CHECK_OK(kt_run(dev, TS_OP_CROSS_ENTROPY_BWD, (ts_operand[]){x.op, t.op, gl.op}, 3,
                            &gx.op, 1, NULL, 0));
            /* Row 0: lse = 1000 + log(1 + e^-1000 + e^-2000) = 1000; loss 2000.
             * Row 1: lse = 1000 + log(2 + e^-1). */
            double lse1 = 1000.0 + log(2.0 + exp(-1.0));
            double want[2] = {2000.0, lse1 - 1000.0};
            for (int i = 0; i < 2; i++)
                CHECK_MSG(kt_close(kt_get(&loss.op, (int64_t[]){i}), want[i], kt_rtol(dt), 0),
                          "%s large logits row %d: got %g, want %g", ts_dtype_name(dt), i,
                          kt_get(&loss.op, (int64_t[]){i}), want[i]);
            double gw[2][3] = {{1.0, 0.0, -1.0},
                               {1.0 / (2.0 + exp(-1.0)) - 1.0, 1.0 / (2.0 + exp(-1.0)),
                                exp(-1.0) / (2.0 + exp(-1.0))}};
            for (int i = 0; i < 2; i++)
                for (int j = 0; j < 3; j++)
                    CHECK_MSG(kt_close(kt_get(&gx.op, (int64_t[]){i, j}), gw[i][j], kt_rtol(dt),
                                       1e-7),
                              "%s large logits grad (%d, %d): got %g, want %g",
                              ts_dtype_name(dt), i, j, kt_get(&gx.op, (int64_t[]){i, j}),
                              gw[i][j]);
            kt_free(&gx);
            kt_free(&loss);
            kt_free(&gl);
            kt_free(&t);
            kt_free(&x);
        }
        kt_check_no_live_blocks(dev);
    }
}

/* glogits may be the logits themselves. */
static void test_cross_entropy_in_place(void)
{
    const char *const *names = kt_plugins();
    if (!*names)
        SKIP("no host plugin is built");
    for (; *names; names++) {
        ts_device *dev = kt_load(*names);
        kt_buf x = kt_make(dev, TS_F64, 2, (int64_t[]){4, 6}, KT_TRANSPOSED, 1);
        kt_buf t = kt_make(dev, TS_I32, 1, (int64_t[]){4}, KT_CONTIG, 0);
        kt_buf gl = kt_make(dev, TS_F64, 1, (int64_t[]){4}, KT_CONTIG, 2);
        kt_buf ref = kt_make(dev, TS_F64, 2, (int64_t[]){4, 6}, KT_CONTIG, 3);
        for (int64_t i = 0; i < 4; i++)
            kt_set(&t.op, (int64_t[]){i}, (double)(5 - i));
        CHECK_OK(kt_run(dev, TS_OP_CROSS_ENTROPY_BWD, (ts_operand[]){x.op, t.op, gl.op}, 3,
                        &ref.op, 1, NULL, 0));
        CHECK_OK(kt_run(dev, TS_OP_CROSS_ENTROPY_BWD, (ts_operand[]){x.op, t.op, gl.op}, 3,
                        &x.op, 1, NULL, 0));
        double *want = to_array(&ref.op);
        check_against(&x.op, want, 1e-15, 0, "cross_entropy_bwd in place");
        free(want);
        kt_free(&ref);
        kt_free(&gl);
        kt_free(&t);
        kt_free(&x);
        kt_check_no_live_blocks(dev);
    }
}

static void test_cross_entropy_errors(void)
{
    const char *const *names = kt_plugins();
    if (!*names)
        SKIP("no host plugin is built");
    for (; *names; names++) {
        ts_device *dev = kt_load(*names);
        for (int it = 0; it < 2; it++) {
            int32_t tdt = it ? TS_I32 : TS_I64;
            kt_buf x = kt_make(dev, TS_F32, 2, (int64_t[]){3, 7}, KT_CONTIG, 1);
            kt_buf t = kt_make(dev, tdt, 1, (int64_t[]){3}, KT_STRIDED, 0);
            kt_buf gl = kt_make(dev, TS_F32, 1, (int64_t[]){3}, KT_CONTIG, 2);
            kt_buf loss = kt_make(dev, TS_F32, 1, (int64_t[]){3}, KT_CONTIG, 3);
            kt_buf gx = kt_make(dev, TS_F32, 2, (int64_t[]){3, 7}, KT_CONTIG, 4);
            kt_buf tf = kt_make(dev, TS_F32, 1, (int64_t[]){3}, KT_CONTIG, 5);
            kt_buf loss64 = kt_make(dev, TS_F64, 1, (int64_t[]){3}, KT_CONTIG, 6);
            kt_buf loss2 = kt_make(dev, TS_F32, 1, (int64_t[]){2}, KT_CONTIG, 7);
            ts_operand fin[2] = {x.op, t.op}, bin[3] = {x.op, t.op, gl.op};
            for (int64_t i = 0; i < 3; i++)
                kt_set(&t.op, (int64_t[]){i}, (double)i);
            CHECK_OK(kt_run(dev, TS_OP_CROSS_ENTROPY, fin, 2, &loss.op, 1, NULL, 0));
            double *keep_l = to_array(&loss.op), *keep_g = to_array(&gx.op);
            static const double bad[2] = {7.0, -1.0};
            static const char *const needle[2] = {"target 7", "target -1"};
            for (int b = 0; b < 2; b++) {
                kt_set(&t.op, (int64_t[]){1}, bad[b]);
                CHECK_FAILS(kt_run(dev, TS_OP_CROSS_ENTROPY, fin, 2, &loss.op, 1, NULL, 0),
                            TS_EINVAL, "cross_entropy", needle[b], "C = 7");
                CHECK_FAILS(kt_run(dev, TS_OP_CROSS_ENTROPY_BWD, bin, 3, &gx.op, 1, NULL, 0),
                            TS_EINVAL, "cross_entropy_bwd", needle[b], "C = 7");
            }
            check_against(&loss.op, keep_l, 0, 0, "loss after a failed cross_entropy");
            check_against(&gx.op, keep_g, 0, 0, "glogits after a failed cross_entropy_bwd");
            free(keep_g);
            free(keep_l);
            kt_set(&t.op, (int64_t[]){1}, 6.0);
            CHECK_FAILS(kt_run(dev, TS_OP_CROSS_ENTROPY, (ts_operand[]){x.op, tf.op}, 2, &loss.op,
                               1, NULL, 0),
                        TS_EINVAL, "TS_I64");
            CHECK_FAILS(kt_run(dev, TS_OP_CROSS_ENTROPY, fin, 2, &loss64.op, 1, NULL, 0),
                        TS_EINVAL, "dtype");
            CHECK_FAILS(kt_run(dev, TS_OP_CROSS_ENTROPY, fin, 2, &loss2.op, 1, NULL, 0),
                        TS_ESHAPE, "(3, 7)");
            CHECK_FAILS(kt_run(dev, TS_OP_CROSS_ENTROPY_BWD, bin, 3, &loss.op, 1, NULL, 0),
                        TS_ESHAPE, "glogits");
            CHECK_FAILS(kt_run(dev, TS_OP_CROSS_ENTROPY_BWD, fin, 2, &gx.op, 1, NULL, 0),
                        TS_EINVAL, "3 inputs");
            kt_free(&loss2);
            kt_free(&loss64);
            kt_free(&tf);
            kt_free(&gx);
            kt_free(&loss);
            kt_free(&gl);
            kt_free(&t);
            kt_free(&x);
        }
        kt_check_no_live_blocks(dev);
    }
}

int main(int argc, char **argv)
{
    static const tap_test tests[] = {
        TAP_TEST(test_conv2d_bwd),
        TAP_TEST(test_conv2d_bwd_layouts),
        TAP_TEST(test_conv2d_bwd_empty),
        TAP_TEST(test_conv2d_bwd_bad_params),
        TAP_TEST(test_pool2d_bwd),
        TAP_TEST(test_pool2d_bwd_accumulate),
        TAP_TEST(test_pool2d_bwd_bad_params),
        TAP_TEST(test_cross_entropy),
        TAP_TEST(test_cross_entropy_large),
        TAP_TEST(test_cross_entropy_in_place),
        TAP_TEST(test_cross_entropy_errors),
    };
    return tap_run(tests, sizeof tests / sizeof tests[0], argc, argv);
}
