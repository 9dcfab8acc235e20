/* tests/plugins/test-kernels-nn.c: matmul and conv2d on cpu_blas, pooling and index_select /
 * index_add on every host plugin, each against a float64 reference computed here with naive
 * loops, over contiguous, transposed, strided and offset operands. Also: parameter checks
 * (TS_EINVAL with a message), index range checks, and that no op leaks pool blocks. Layer
 * norm each way on every host plugin against double-precision formulas, with error bounds
 * derived from the sums it makes. */
#include "kt.h"

#include <math.h>

static const int32_t float_dtypes[] = {TS_F32, TS_F64};




/* ---------------------------------------------------------------------------------------- */
/* matmul                                                                                    */

/* Runs out = alpha * a @ b + beta * out on shapes a (..., M, K), b (..., K, N) as given (maybe
 * broadcast views) and checks every element against a float64 reference. */
static void check_matmul(ts_device *dev, const ts_operand *a, const ts_operand *b, kt_buf *out,
                         double alpha, double beta, const char *what)
{
    const ts_operand *c = &out->op;
    int nd = c->ndim;
    int64_t M = c->shape[nd - 2], N = c->shape[nd - 1], K = a->shape[nd - 1];
    int64_t total = kt_numel(c);
    double *before = malloc(sizeof(double) * (size_t)(total ? total : 1));
    CHECK(before);
    int64_t idx[TS_MAX_DIMS];
    for (int64_t i = 0; i < total; i++) {
        kt_unravel(c, i, idx);
        before[i] = kt_get(c, idx);
    }
    ts_matmul_params p = {.alpha = alpha, .beta = beta};
    CHECK_OK(kt_run(dev, TS_OP_MATMUL, (ts_operand[]){*a, *b}, 2, c, 1, &p, sizeof p));
    double rtol = c->dtype == TS_F32 ? 1e-4 : 1e-11;
    double atol = (c->dtype == TS_F32 ? 1e-6 : 1e-13) * (double)(K + 1) * 4.0 * fabs(alpha);
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
        double want = alpha * acc + (beta != 0.0 ? beta * before[i] : 0.0);
        double got = kt_get(c, idx);
        CHECK_MSG(kt_close(got, want, rtol, atol),
                  "matmul %s: M=%lld N=%lld K=%lld element %lld: got %.9g, want %.9g", what,
                  (long long)M, (long long)N, (long long)K, (long long)i, got, want);
    }
    free(before);
}

static void matmul_case(ts_device *dev, int32_t dt, int64_t M, int64_t K, int64_t N,
                        kt_layout la, kt_layout lb, kt_layout lc, double alpha, double beta)
{
    kt_buf a = kt_make(dev, dt, 2, (int64_t[]){M, K}, la, 1);
    kt_buf b = kt_make(dev, dt, 2, (int64_t[]){K, N}, lb, 2);
    kt_buf c = kt_make(dev, dt, 2, (int64_t[]){M, N}, lc, 3);
    char what[96];
    snprintf(what, sizeof what, "%s a=%s b=%s out=%s alpha=%g beta=%g", ts_dtype_name(dt),
             kt_layout_name(la), kt_layout_name(lb), kt_layout_name(lc), alpha, beta);
    check_matmul(dev, &a.op, &b.op, &c, alpha, beta, what);
    kt_check_gaps(&c);
    kt_free(&c);
    kt_free(&b);
    kt_free(&a);
}

static void test_matmul_shapes(void)
{
    ts_device *dev = kt_load("cpu_blas");
    /* The last three are large enough for cpu_blas to split them over its threads: by rows
     * (130 x 90), by columns (70 x 130), and with edges off the 16-aligned bands (33 x 301). */
    static const int64_t shapes[][3] = {{1, 1, 1},     {3, 5, 7},      {64, 33, 17},
                                        {17, 64, 1},   {1, 40, 9},     {130, 70, 90},
                                        {70, 90, 130}, {33, 200, 301}};
    for (int d = 0; d < 2; d++) {
        CHECK(ts_device_supports(dev, TS_OP_MATMUL, float_dtypes[d]));
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            matmul_case(dev, float_dtypes[d], shapes[s][0], shapes[s][1], shapes[s][2], KT_CONTIG,
                        KT_CONTIG, KT_CONTIG, 1.0, 0.0);
            matmul_case(dev, float_dtypes[d], shapes[s][0], shapes[s][1], shapes[s][2], KT_CONTIG,
                        KT_TRANSPOSED, KT_STRIDED, -0.5, 2.0);
            matmul_case(dev, float_dtypes[d], shapes[s][0], shapes[s][1], shapes[s][2],
                        KT_TRANSPOSED, KT_OFFSET, KT_CONTIG, 1.5, 0.0);
        }
    }
    CHECK(!ts_device_supports(dev, TS_OP_MATMUL, TS_I32));
    CHECK(!ts_device_supports(dev, TS_OP_MATMUL, TS_U8));
    kt_check_no_live_blocks(dev);
}

/* Every combination of layouts for a, b and out, with and without alpha/beta. */
static void test_matmul_layouts(void)
{
    ts_device *dev = kt_load("cpu_blas");
    for (int d = 0; d < 2; d++)
        for (int la = 0; la < KT_NLAYOUTS; la++)
            for (int lb = 0; lb < KT_NLAYOUTS; lb++)
                for (int lc = 0; lc < KT_NLAYOUTS; lc++) {
                    matmul_case(dev, float_dtypes[d], 7, 5, 6, la, lb, lc, 1.0, 0.0);
                    matmul_case(dev, float_dtypes[d], 6, 9, 4, la, lb, lc, 1.5, -0.75);
                }
    kt_check_no_live_blocks(dev);
}

/* a (2, 3, M, K) @ b (K, N) broadcast to (2, 3, K, N) with stride-0 batch dims, and a (3, M, K)
 * broadcast over the leading batch dim; b in several layouts. */
static void test_matmul_batched(void)
{
    ts_device *dev = kt_load("cpu_blas");
    for (int d = 0; d < 2; d++) {
        int32_t dt = float_dtypes[d];
        for (int l = 0; l < KT_NLAYOUTS; l++) {
            kt_buf a = kt_make(dev, dt, 4, (int64_t[]){2, 3, 4, 5}, l, 10);
            kt_buf b = kt_make(dev, dt, 2, (int64_t[]){5, 6}, (l + 1) % KT_NLAYOUTS, 11);
            kt_buf c = kt_make(dev, dt, 4, (int64_t[]){2, 3, 4, 6}, (l + 2) % KT_NLAYOUTS, 12);
            ts_operand bb = kt_broadcast(&b.op, 4, (int64_t[]){2, 3, 5, 6});
            CHECK(bb.strides[0] == 0 && bb.strides[1] == 0);
            check_matmul(dev, &a.op, &bb, &c, 1.0, 0.0, "batched, b broadcast");
            check_matmul(dev, &a.op, &bb, &c, 0.25, 1.0, "batched, b broadcast, beta 1");
            kt_check_gaps(&c);

            kt_buf a3 = kt_make(dev, dt, 3, (int64_t[]){3, 4, 5}, l, 13);
            kt_buf b4 = kt_make(dev, dt, 4, (int64_t[]){2, 1, 5, 6}, l, 14);
            ts_operand ab = kt_broadcast(&a3.op, 4, (int64_t[]){2, 3, 4, 5});
            ts_operand bb4 = kt_broadcast(&b4.op, 4, (int64_t[]){2, 3, 5, 6});
            check_matmul(dev, &ab, &bb4, &c, 1.0, 0.0, "batched, both broadcast");
            kt_free(&b4);
            kt_free(&a3);
            kt_free(&c);
            kt_free(&b);
            kt_free(&a);
        }
    }
    kt_check_no_live_blocks(dev);
}

/* K == 0 is an empty sum: out = beta * out. M == 0 or N == 0 do nothing. */
static void test_matmul_empty(void)
{
    ts_device *dev = kt_load("cpu_blas");
    for (int d = 0; d < 2; d++)
        for (int lc = 0; lc < KT_NLAYOUTS; lc++) {
            int32_t dt = float_dtypes[d];
            matmul_case(dev, dt, 3, 0, 4, KT_CONTIG, KT_CONTIG, lc, 1.0, 0.0);
            matmul_case(dev, dt, 3, 0, 4, KT_TRANSPOSED, KT_STRIDED, lc, 1.0, 2.5);
            matmul_case(dev, dt, 0, 3, 4, KT_CONTIG, KT_CONTIG, lc, 1.0, 1.0);
            matmul_case(dev, dt, 3, 4, 0, KT_CONTIG, KT_CONTIG, lc, 1.0, 1.0);
            /* beta 0 overwrites: NaN already in out must not survive. */
            kt_buf a = kt_make(dev, dt, 2, (int64_t[]){3, 2}, KT_CONTIG, 1);
            kt_buf b = kt_make(dev, dt, 2, (int64_t[]){2, 4}, KT_CONTIG, 2);
            kt_buf c = kt_make(dev, dt, 2, (int64_t[]){3, 4}, lc, 3);
            kt_set(&c.op, (int64_t[]){1, 2}, NAN);
            check_matmul(dev, &a.op, &b.op, &c, 1.0, 0.0, "NaN in out, beta 0");
            kt_free(&c);
            kt_free(&b);
            kt_free(&a);
        }
    kt_check_no_live_blocks(dev);
}

/* out exactly the same memory as a (in place, square): the kernel must not read a after
 * writing out. */
static void test_matmul_in_place(void)
{
    ts_device *dev = kt_load("cpu_blas");
    for (int d = 0; d < 2; d++) {
        int32_t dt = float_dtypes[d];
        kt_buf a = kt_make(dev, dt, 2, (int64_t[]){8, 8}, KT_CONTIG, 4);
        kt_buf acopy = kt_make(dev, dt, 2, (int64_t[]){8, 8}, KT_CONTIG, 4);
        kt_buf b = kt_make(dev, dt, 2, (int64_t[]){8, 8}, KT_TRANSPOSED, 5);
        kt_buf ref = kt_make(dev, dt, 2, (int64_t[]){8, 8}, KT_CONTIG, 6);
        ts_matmul_params p = {.alpha = 1.0, .beta = 0.0};
        CHECK_OK(kt_run(dev, TS_OP_MATMUL, (ts_operand[]){acopy.op, b.op}, 2, &ref.op, 1, &p,
                        sizeof p));
        CHECK_OK(kt_run(dev, TS_OP_MATMUL, (ts_operand[]){a.op, b.op}, 2, &a.op, 1, &p,
                        sizeof p));
        for (int64_t i = 0; i < 64; i++) {
            int64_t idx[2] = {i / 8, i % 8};
            CHECK(kt_close(kt_get(&a.op, idx), kt_get(&ref.op, idx), kt_rtol(dt), 1e-6));
        }
        kt_free(&ref);
        kt_free(&b);
        kt_free(&acopy);
        kt_free(&a);
    }
    kt_check_no_live_blocks(dev);
}

/* ---------------------------------------------------------------------------------------- */
/* conv2d                                                                                    */

typedef struct conv_case {
    int64_t N, C, H, W, K, R, S;
    ts_conv2d_params p;
    int bias;
    kt_layout lx, lw, ly;
} conv_case;

static int64_t conv_out(int64_t in, int pad, int dil, int64_t k, int stride)
{
    return (in + 2 * pad - dil * (k - 1) - 1) / stride + 1;
}

static void run_conv_case(ts_device *dev, int32_t dt, const conv_case *cc)
{
    const ts_conv2d_params *p = &cc->p;
    int64_t G = p->groups, Cg = cc->C / G, Kg = cc->K / G;
    int64_t P = conv_out(cc->H, p->pad_h, p->dilation_h, cc->R, p->stride_h);
    int64_t Q = conv_out(cc->W, p->pad_w, p->dilation_w, cc->S, p->stride_w);
    kt_buf x = kt_make(dev, dt, 4, (int64_t[]){cc->N, cc->C, cc->H, cc->W}, cc->lx, 21);
    kt_buf w = kt_make(dev, dt, 4, (int64_t[]){cc->K, Cg, cc->R, cc->S}, cc->lw, 22);
    kt_buf bias = kt_make(dev, dt, 1, (int64_t[]){cc->K}, cc->lx == KT_STRIDED ? KT_STRIDED
                                                                               : KT_OFFSET, 23);
    kt_buf y = kt_make(dev, dt, 4, (int64_t[]){cc->N, cc->K, P, Q}, cc->ly, 24);
    ts_operand in[3] = {x.op, w.op, bias.op};
    CHECK_OK(kt_run(dev, TS_OP_CONV2D, in, cc->bias ? 3 : 2, &y.op, 1, p, sizeof *p));
    int64_t terms = Cg * cc->R * cc->S;
    double rtol = dt == TS_F32 ? 1e-4 : 1e-11;
    double atol = (dt == TS_F32 ? 1e-6 : 1e-13) * (double)(terms + 1) * 4.0;
    for (int64_t n = 0; n < cc->N; n++)
        for (int64_t k = 0; k < cc->K; k++)
            for (int64_t pp = 0; pp < P; pp++)
                for (int64_t q = 0; q < Q; q++) {
                    int64_t g = k / Kg;
                    double acc = cc->bias ? kt_get(&bias.op, (int64_t[]){k}) : 0.0;
                    for (int64_t c = 0; c < Cg; c++)
                        for (int64_t r = 0; r < cc->R; r++)
                            for (int64_t s = 0; s < cc->S; s++) {
                                int64_t hh = pp * p->stride_h - p->pad_h + r * p->dilation_h;
                                int64_t ww = q * p->stride_w - p->pad_w + s * p->dilation_w;
                                if (hh < 0 || hh >= cc->H || ww < 0 || ww >= cc->W)
                                    continue;
                                acc += kt_get(&x.op, (int64_t[]){n, g * Cg + c, hh, ww}) *
                                       kt_get(&w.op, (int64_t[]){k, c, r, s});
                            }
                    double got = kt_get(&y.op, (int64_t[]){n, k, pp, q});
                    CHECK_MSG(kt_close(got, acc, rtol, atol),
                              "conv2d %s groups=%d stride=%d pad=%d dil=%d bias=%d x=%s w=%s "
                              "y=%s at (%lld,%lld,%lld,%lld): got %.9g, want %.9g",
                              ts_dtype_name(dt), (int)G, (int)p->stride_h, (int)p->pad_h,
                              (int)p->dilation_h, cc->bias, kt_layout_name(cc->lx),
                              kt_layout_name(cc->lw), kt_layout_name(cc->ly), (long long)n,
                              (long long)k, (long long)pp, (long long)q, got, acc);
                }
    kt_check_gaps(&y);
    kt_free(&y);
    kt_free(&bias);
    kt_free(&w);
    kt_free(&x);
}

#define CONVP(st, pd, dl, g) {(st), (st), (pd), (pd), (dl), (dl), (g)}

static void test_conv2d(void)
{
    ts_device *dev = kt_load("cpu_blas");
    static const conv_case cases[] = {
        /* N C H W K R S params bias lx lw ly */
        {2, 3, 7, 8, 4, 3, 3, CONVP(1, 0, 1, 1), 0, KT_CONTIG, KT_CONTIG, KT_CONTIG},
        {2, 3, 7, 8, 4, 3, 3, CONVP(1, 1, 1, 1), 1, KT_CONTIG, KT_CONTIG, KT_CONTIG},
        {2, 3, 9, 8, 5, 3, 3, CONVP(2, 1, 1, 1), 1, KT_STRIDED, KT_CONTIG, KT_CONTIG},
        {1, 2, 11, 10, 3, 3, 2, CONVP(1, 2, 2, 1), 0, KT_TRANSPOSED, KT_OFFSET, KT_STRIDED},
        {2, 4, 8, 8, 6, 3, 3, CONVP(1, 1, 1, 2), 1, KT_OFFSET, KT_TRANSPOSED, KT_TRANSPOSED},
        {2, 4, 8, 8, 6, 3, 3, CONVP(2, 1, 2, 2), 0, KT_STRIDED, KT_STRIDED, KT_OFFSET},
        {2, 4, 9, 7, 4, 3, 3, CONVP(1, 1, 1, 4), 1, KT_CONTIG, KT_CONTIG, KT_CONTIG},
        {1, 3, 9, 7, 6, 3, 3, CONVP(2, 1, 1, 3), 0, KT_TRANSPOSED, KT_STRIDED, KT_CONTIG},
        /* 1x1, stride 1, no padding: the path without im2col */
        {2, 5, 4, 6, 3, 1, 1, CONVP(1, 0, 1, 1), 1, KT_CONTIG, KT_CONTIG, KT_CONTIG},
        {2, 5, 4, 6, 3, 1, 1, CONVP(1, 0, 1, 1), 0, KT_OFFSET, KT_CONTIG, KT_OFFSET},
        {2, 4, 4, 6, 4, 1, 1, CONVP(1, 0, 1, 2), 1, KT_STRIDED, KT_TRANSPOSED, KT_STRIDED},
        /* unpadded stride-1 kernels with one 1-sized side still need im2col */
        {2, 3, 6, 5, 4, 3, 1, CONVP(1, 0, 1, 1), 1, KT_CONTIG, KT_CONTIG, KT_CONTIG},
        {1, 3, 5, 6, 2, 1, 3, CONVP(1, 0, 1, 1), 0, KT_CONTIG, KT_CONTIG, KT_CONTIG},
        /* big enough for the threaded im2col and bias / copy-out loops */
        {1, 3, 40, 40, 24, 3, 3, CONVP(1, 1, 1, 1), 1, KT_CONTIG, KT_CONTIG, KT_STRIDED},
        /* kernel as large as the padded input: a 1x1 output */
        {1, 2, 3, 3, 2, 5, 5, CONVP(1, 1, 1, 1), 1, KT_CONTIG, KT_CONTIG, KT_CONTIG},
    };
    for (int d = 0; d < 2; d++) {
        CHECK(ts_device_supports(dev, TS_OP_CONV2D, float_dtypes[d]));
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            run_conv_case(dev, float_dtypes[d], &cases[i]);
            conv_case flipped = cases[i];
            flipped.bias = !flipped.bias;
            run_conv_case(dev, float_dtypes[d], &flipped);
        }
    }
    CHECK(!ts_device_supports(dev, TS_OP_CONV2D, TS_I64));
    kt_check_no_live_blocks(dev);
}

static void test_conv2d_bad_params(void)
{
    ts_device *dev = kt_load("cpu_blas");
    kt_buf x = kt_make(dev, TS_F32, 4, (int64_t[]){1, 4, 6, 6}, KT_CONTIG, 1);
    kt_buf w = kt_make(dev, TS_F32, 4, (int64_t[]){4, 2, 3, 3}, KT_CONTIG, 2);
    kt_buf y = kt_make(dev, TS_F32, 4, (int64_t[]){1, 4, 4, 4}, KT_CONTIG, 3);
    ts_operand in[2] = {x.op, w.op};
    ts_conv2d_params ok = CONVP(1, 0, 1, 2);
    CHECK_OK(kt_run(dev, TS_OP_CONV2D, in, 2, &y.op, 1, &ok, sizeof ok));
    ts_conv2d_params p = ok;
    p.stride_h = 0;
    CHECK_FAILS(kt_run(dev, TS_OP_CONV2D, in, 2, &y.op, 1, &p, sizeof p), TS_EINVAL, "stride");
    p = ok;
    p.dilation_w = 0;
    CHECK_FAILS(kt_run(dev, TS_OP_CONV2D, in, 2, &y.op, 1, &p, sizeof p), TS_EINVAL, "dilation");
    p = ok;
    p.pad_h = -1;
    CHECK_FAILS(kt_run(dev, TS_OP_CONV2D, in, 2, &y.op, 1, &p, sizeof p), TS_EINVAL, "padding");
    p = ok;
    p.groups = 3;
    CHECK_FAILS(kt_run(dev, TS_OP_CONV2D, in, 2, &y.op, 1, &p, sizeof p), TS_EINVAL, "groups");
    p = ok;
    p.groups = 1; /* w has C/2 input channels */
    CHECK_FAILS(kt_run(dev, TS_OP_CONV2D, in, 2, &y.op, 1, &p, sizeof p), TS_EINVAL, "groups");
    p = ok;
    p.groups = 0;
    CHECK_FAILS(kt_run(dev, TS_OP_CONV2D, in, 2, &y.op, 1, &p, sizeof p), TS_EINVAL, "groups");
    p = ok;
    p.dilation_h = 4; /* 1 + 4*2 = 9 rows > 6 */
    CHECK_FAILS(kt_run(dev, TS_OP_CONV2D, in, 2, &y.op, 1, &p, sizeof p), TS_EINVAL, "fit");
    p = ok;
    p.pad_h = 1; /* y should be 6 rows */
    CHECK_FAILS(kt_run(dev, TS_OP_CONV2D, in, 2, &y.op, 1, &p, sizeof p), TS_ESHAPE, "expected");
    CHECK_FAILS(kt_run(dev, TS_OP_CONV2D, in, 2, &y.op, 1, NULL, 0), TS_EINVAL, "params");
    kt_buf bias = kt_make(dev, TS_F32, 1, (int64_t[]){3}, KT_CONTIG, 4);
    ts_operand in3[3] = {x.op, w.op, bias.op};
    CHECK_FAILS(kt_run(dev, TS_OP_CONV2D, in3, 3, &y.op, 1, &ok, sizeof ok), TS_ESHAPE, "bias");
    kt_free(&bias);
    kt_free(&y);
    kt_free(&w);
    kt_free(&x);
    kt_check_no_live_blocks(dev);
}

/* ---------------------------------------------------------------------------------------- */
/* pooling                                                                                   */

static void pool_case(ts_device *dev, int32_t dt, int is_max, int64_t N, int64_t C, int64_t H,
                      int64_t W, ts_pool2d_params p, int with_idx, kt_layout lx, kt_layout ly)
{
    int64_t P = (H + 2 * p.pad_h - p.kernel_h) / p.stride_h + 1;
    int64_t Q = (W + 2 * p.pad_w - p.kernel_w) / p.stride_w + 1;
    kt_buf x = kt_make(dev, dt, 4, (int64_t[]){N, C, H, W}, lx, 31);
    /* Values on a coarse grid so that windows often hold ties: first occurrence must win.
     * For max, a NaN every 7th element, so some windows hold one or two: the first wins. */
    int64_t idx[4];
    for (int64_t i = 0; i < kt_numel(&x.op); i++) {
        kt_unravel(&x.op, i, idx);
        kt_set(&x.op, idx, is_max && i % 7 == 3 ? NAN : floor(kt_get(&x.op, idx)));
    }
    kt_buf y = kt_make(dev, dt, 4, (int64_t[]){N, C, P, Q}, ly, 32);
    kt_buf ix = kt_make(dev, TS_I64, 4, (int64_t[]){N, C, P, Q}, ly, 33);
    ts_operand outs[2] = {y.op, ix.op};
    CHECK_OK(kt_run(dev, is_max ? TS_OP_MAXPOOL2D : TS_OP_AVGPOOL2D, &x.op, 1, outs,
                    with_idx ? 2 : 1, &p, sizeof p));
    for (int64_t i = 0; i < kt_numel(&y.op); i++) {
        kt_unravel(&y.op, i, idx);
        int64_t n = idx[0], c = idx[1], pp = idx[2], q = idx[3];
        double best = -INFINITY, sum = 0.0;
        int64_t arg = -1, cnt = 0;
        for (int64_t r = 0; r < p.kernel_h; r++)
            for (int64_t s = 0; s < p.kernel_w; s++) {
                int64_t hh = pp * p.stride_h - p.pad_h + r, ww = q * p.stride_w - p.pad_w + s;
                if (hh < 0 || hh >= H || ww < 0 || ww >= W)
                    continue;
                double v = kt_get(&x.op, (int64_t[]){n, c, hh, ww});
                sum += v;
                cnt++;
                /* Row-major scan with strict > gives the first occurrence; the first NaN
                 * beats everything. */
                if (arg < 0 || v > best || (isnan(v) && !isnan(best))) {
                    best = v;
                    arg = hh * W + ww;
                }
            }
        double want = is_max ? best
                             : sum / (double)(p.count_include_pad ? p.kernel_h * p.kernel_w : cnt);
        double got = kt_get(&y.op, idx);
        CHECK_MSG(kt_close(got, want, kt_rtol(dt), 1e-6),
                  "%s %s k=%dx%d s=%d pad=%d cip=%d at %lld: got %g, want %g",
                  is_max ? "maxpool" : "avgpool", ts_dtype_name(dt), (int)p.kernel_h,
                  (int)p.kernel_w, (int)p.stride_h, (int)p.pad_h, (int)p.count_include_pad,
                  (long long)i, got, want);
        if (is_max && with_idx)
            CHECK_MSG(kt_get(&ix.op, idx) == (double)arg, "maxpool index at %lld: got %g, want "
                      "%lld", (long long)i, kt_get(&ix.op, idx), (long long)arg);
    }
    kt_check_gaps(&y);
    if (!(is_max && with_idx))
        kt_check_gaps(&ix); /* an index tensor not handed over stays untouched */
    kt_free(&ix);
    kt_free(&y);
    kt_free(&x);
}

static void test_pool2d(void)
{
    const char *const *names = kt_plugins();
    if (!*names)
        SKIP("no host plugin is built");
    static const ts_pool2d_params params[] = {
        /* kh kw sh sw ph pw count_include_pad */
        {2, 2, 2, 2, 0, 0, 0}, {3, 3, 1, 1, 1, 1, 0}, {3, 3, 2, 2, 1, 1, 1},
        {3, 2, 2, 1, 1, 1, 0}, {4, 4, 3, 2, 2, 1, 1}, {1, 1, 1, 1, 0, 0, 0},
    };
    for (; *names; names++) {
        ts_device *dev = kt_load(*names);
        for (int d = 0; d < 2; d++) {
            CHECK(ts_device_supports(dev, TS_OP_MAXPOOL2D, float_dtypes[d]));
            CHECK(ts_device_supports(dev, TS_OP_AVGPOOL2D, float_dtypes[d]));
            for (size_t i = 0; i < sizeof params / sizeof params[0]; i++)
                for (int l = 0; l < KT_NLAYOUTS; l++) {
                    pool_case(dev, float_dtypes[d], 1, 2, 3, 7, 9, params[i], 1, l,
                              (l + 1) % KT_NLAYOUTS);
                    pool_case(dev, float_dtypes[d], 1, 2, 3, 7, 9, params[i], 0, l, l);
                    pool_case(dev, float_dtypes[d], 0, 2, 3, 7, 9, params[i], 0, l,
                              (l + 3) % KT_NLAYOUTS);
                    /* Wider rows: 2x2 max pooling runs 4 windows at a time, then a tail. */
                    pool_case(dev, float_dtypes[d], 1, 2, 3, 5, 23, params[i], 1, l, l);
                    pool_case(dev, float_dtypes[d], 1, 1, 2, 4, 18, params[i], 0, l,
                              (l + 1) % KT_NLAYOUTS);
                }
            /* Large enough to run on several threads. */
            pool_case(dev, float_dtypes[d], 1, 2, 4, 32, 33, params[1], 1, KT_CONTIG, KT_STRIDED);
            pool_case(dev, float_dtypes[d], 0, 2, 4, 32, 33, params[2], 0, KT_STRIDED, KT_CONTIG);
        }
        CHECK(!ts_device_supports(dev, TS_OP_MAXPOOL2D, TS_I32));
        kt_check_no_live_blocks(dev);
    }
}

static void test_pool2d_bad_params(void)
{
    const char *const *names = kt_plugins();
    if (!*names)
        SKIP("no host plugin is built");
    for (; *names; names++) {
        ts_device *dev = kt_load(*names);
        kt_buf x = kt_make(dev, TS_F32, 4, (int64_t[]){1, 2, 6, 6}, KT_CONTIG, 1);
        kt_buf y = kt_make(dev, TS_F32, 4, (int64_t[]){1, 2, 3, 3}, KT_CONTIG, 2);
        ts_pool2d_params ok = {2, 2, 2, 2, 0, 0, 0}, p;
        CHECK_OK(kt_run(dev, TS_OP_MAXPOOL2D, &x.op, 1, &y.op, 1, &ok, sizeof ok));
        p = ok;
        p.stride_w = 0;
        CHECK_FAILS(kt_run(dev, TS_OP_MAXPOOL2D, &x.op, 1, &y.op, 1, &p, sizeof p), TS_EINVAL,
                    "stride");
        p = ok;
        p.kernel_h = 0;
        CHECK_FAILS(kt_run(dev, TS_OP_AVGPOOL2D, &x.op, 1, &y.op, 1, &p, sizeof p), TS_EINVAL,
                    "kernel");
        p = ok;
        p.pad_h = 2; /* more than half the kernel */
        CHECK_FAILS(kt_run(dev, TS_OP_AVGPOOL2D, &x.op, 1, &y.op, 1, &p, sizeof p), TS_EINVAL,
                    "padding");
        p = ok;
        p.pad_w = -1;
        CHECK_FAILS(kt_run(dev, TS_OP_MAXPOOL2D, &x.op, 1, &y.op, 1, &p, sizeof p), TS_EINVAL,
                    "padding");
        p = ok;
        p.stride_h = 1; /* y should have 5 rows */
        CHECK_FAILS(kt_run(dev, TS_OP_MAXPOOL2D, &x.op, 1, &y.op, 1, &p, sizeof p), TS_ESHAPE,
                    "expected");
        kt_free(&y);
        kt_free(&x);
        kt_check_no_live_blocks(dev);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* index_select / index_add                                                                  */

static const int32_t all_dtypes[] = {TS_F32, TS_F64, TS_I32, TS_I64, TS_U8};

static kt_buf make_index(ts_device *dev, int32_t dt, const int64_t *vals, int64_t n,
                         kt_layout l)
{
    kt_buf ix = kt_make(dev, dt, 1, (int64_t[]){n}, l == KT_TRANSPOSED ? KT_CONTIG : l, 0);
    for (int64_t i = 0; i < n; i++)
        kt_set(&ix.op, (int64_t[]){i}, (double)vals[i]);
    return ix;
}

/* data (4, 5, 3); indices along dim with duplicates. */
static void index_case(ts_device *dev, int add, int32_t dt, int32_t idt, int dim, kt_layout ld,
                       kt_layout lo, kt_layout li)
{
    static const int64_t full_shape[3] = {4, 5, 3};
    static const int64_t vals[][6] = {{3, 0, 3, 1, 3, 2}, {4, 0, 4, 2, 4, 1}, {2, 2, 0, 1, 2, 0}};
    int64_t n = 6, picked[3], full[3];
    memcpy(full, full_shape, sizeof full);
    memcpy(picked, full_shape, sizeof picked);
    picked[dim] = n;
    kt_buf ix = make_index(dev, idt, vals[dim], n, li);
    kt_buf src = kt_make(dev, dt, 3, add ? picked : full, ld, 41);
    kt_buf out = kt_make(dev, dt, 3, add ? full : picked, lo, 42);
    int64_t total = kt_numel(&out.op), idx[3];
    double *before = malloc(sizeof(double) * (size_t)total);
    CHECK(before);
    for (int64_t i = 0; i < total; i++) {
        kt_unravel(&out.op, i, idx);
        before[i] = kt_get(&out.op, idx);
    }
    ts_dim_params p = {.dim = dim};
    CHECK_OK(kt_run(dev, add ? TS_OP_INDEX_ADD : TS_OP_INDEX_SELECT,
                    (ts_operand[]){src.op, ix.op}, 2, &out.op, 1, &p, sizeof p));
    for (int64_t i = 0; i < total; i++) {
        kt_unravel(&out.op, i, idx);
        double want;
        if (add) {
            want = before[i];
            for (int64_t j = 0; j < n; j++) {
                if (vals[dim][j] != idx[dim])
                    continue;
                int64_t si[3] = {idx[0], idx[1], idx[2]};
                si[dim] = j;
                want += kt_get(&src.op, si);
            }
            if (dt == TS_U8)
                want = (double)(uint8_t)(unsigned)want;
            else if (dt == TS_F32)
                want = (float)want;
        } else {
            int64_t si[3] = {idx[0], idx[1], idx[2]};
            si[dim] = vals[dim][idx[dim]];
            want = kt_get(&src.op, si);
        }
        double got = kt_get(&out.op, idx);
        CHECK_MSG(kt_close(got, want, kt_rtol(dt), 1e-6),
                  "%s %s index %s dim %d data=%s out=%s at %lld: got %g, want %g",
                  add ? "index_add" : "index_select", ts_dtype_name(dt), ts_dtype_name(idt), dim,
                  kt_layout_name(ld), kt_layout_name(lo), (long long)i, got, want);
    }
    kt_check_gaps(&out);
    free(before);
    kt_free(&out);
    kt_free(&src);
    kt_free(&ix);
}

static void test_index(void)
{
    const char *const *names = kt_plugins();
    if (!*names)
        SKIP("no host plugin is built");
    for (; *names; names++) {
        ts_device *dev = kt_load(*names);
        for (int add = 0; add < 2; add++)
            for (int d = 0; d < 5; d++) {
                int32_t op = add ? TS_OP_INDEX_ADD : TS_OP_INDEX_SELECT;
                CHECK(ts_device_supports(dev, op, all_dtypes[d]));
                for (int dim = 0; dim < 3; dim++)
                    for (int l = 0; l < KT_NLAYOUTS; l++) {
                        index_case(dev, add, all_dtypes[d], TS_I64, dim, l, (l + 1) % 4, l);
                        index_case(dev, add, all_dtypes[d], TS_I32, dim, (l + 2) % 4, l,
                                   (l + 2) % 4);
                    }
            }
        kt_check_no_live_blocks(dev);
    }
}

/* A wide row along dim 0 goes through the chunked split of the last dim, on several threads. */
static void test_index_wide(void)
{
    const char *const *names = kt_plugins();
    if (!*names)
        SKIP("no host plugin is built");
    for (; *names; names++) {
        ts_device *dev = kt_load(*names);
        int64_t vals[5] = {1, 1, 0, 2, 1};
        kt_buf ix = make_index(dev, TS_I64, vals, 5, KT_CONTIG);
        kt_buf src = kt_make(dev, TS_F64, 2, (int64_t[]){5, 9000}, KT_CONTIG, 1);
        kt_buf out = kt_make(dev, TS_F64, 2, (int64_t[]){3, 9000}, KT_STRIDED, 2);
        kt_buf ref = kt_make(dev, TS_F64, 2, (int64_t[]){3, 9000}, KT_STRIDED, 2);
        ts_dim_params p = {.dim = 0};
        CHECK_OK(kt_run(dev, TS_OP_INDEX_ADD, (ts_operand[]){src.op, ix.op}, 2, &out.op, 1, &p,
                        sizeof p));
        for (int64_t j = 0; j < 9000; j++)
            for (int64_t i = 0; i < 5; i++) {
                int64_t r[2] = {vals[i], j}, s[2] = {i, j};
                kt_set(&ref.op, r, kt_get(&ref.op, r) + kt_get(&src.op, s));
            }
        for (int64_t i = 0; i < 27000; i++) {
            int64_t idx[2] = {i / 9000, i % 9000};
            CHECK(kt_close(kt_get(&out.op, idx), kt_get(&ref.op, idx), 1e-12, 0));
        }
        kt_free(&ref);
        kt_free(&out);
        kt_free(&src);
        kt_free(&ix);
        kt_check_no_live_blocks(dev);
    }
}

static void test_index_errors(void)
{
    const char *const *names = kt_plugins();
    if (!*names)
        SKIP("no host plugin is built");
    for (; *names; names++) {
        ts_device *dev = kt_load(*names);
        for (int it = 0; it < 2; it++) {
            int32_t idt = it ? TS_I32 : TS_I64;
            kt_buf data = kt_make(dev, TS_F32, 2, (int64_t[]){5, 4}, KT_CONTIG, 1);
            kt_buf sel = kt_make(dev, TS_F32, 2, (int64_t[]){3, 4}, KT_CONTIG, 2);
            kt_buf keep = kt_make(dev, TS_F32, 2, (int64_t[]){5, 4}, KT_CONTIG, 1);
            ts_dim_params p = {.dim = 0};
            int64_t bad_hi[3] = {0, 5, 1}, bad_lo[3] = {1, 2, -1};
            kt_buf ix = make_index(dev, idt, bad_hi, 3, KT_CONTIG);
            CHECK_FAILS(kt_run(dev, TS_OP_INDEX_SELECT, (ts_operand[]){data.op, ix.op}, 2,
                               &sel.op, 1, &p, sizeof p),
                        TS_EINVAL, "index 5", "size 5");
            CHECK_FAILS(kt_run(dev, TS_OP_INDEX_ADD, (ts_operand[]){sel.op, ix.op}, 2, &data.op,
                               1, &p, sizeof p),
                        TS_EINVAL, "index 5", "size 5");
            kt_free(&ix);
            ix = make_index(dev, idt, bad_lo, 3, KT_STRIDED);
            CHECK_FAILS(kt_run(dev, TS_OP_INDEX_SELECT, (ts_operand[]){data.op, ix.op}, 2,
                               &sel.op, 1, &p, sizeof p),
                        TS_EINVAL, "index -1");
            CHECK_FAILS(kt_run(dev, TS_OP_INDEX_ADD, (ts_operand[]){sel.op, ix.op}, 2, &data.op,
                               1, &p, sizeof p),
                        TS_EINVAL, "index -1");
            /* A failed index_add leaves out untouched, even for the indices before the bad one. */
            for (int64_t i = 0; i < 20; i++) {
                int64_t idx[2] = {i / 4, i % 4};
                CHECK(kt_get(&data.op, idx) == kt_get(&keep.op, idx));
            }
            p.dim = 1; /* size 4: index 5 is bad */
            kt_free(&ix);
            ix = make_index(dev, idt, bad_hi, 3, KT_CONTIG);
            kt_buf sel1 = kt_make(dev, TS_F32, 2, (int64_t[]){5, 3}, KT_CONTIG, 2);
            CHECK_FAILS(kt_run(dev, TS_OP_INDEX_SELECT, (ts_operand[]){data.op, ix.op}, 2,
                               &sel1.op, 1, &p, sizeof p),
                        TS_EINVAL, "index 5", "size 4");
            kt_free(&sel1);
            kt_free(&ix);
            kt_free(&keep);
            kt_free(&sel);
            kt_free(&data);
        }
        kt_check_no_live_blocks(dev);
    }
}

/* ---- layer norm, each way, against a float64 reference --------------------------------- */

/* The unit roundoff of a float dtype. */
static double unit_roundoff(int32_t dt)
{
    return dt == TS_F32 ? 0x1p-24 : 0x1p-53;
}

/* One layer-norm case: x of shape (rows..., D...) with `norm` trailing dims; `style` 0 random
 * values in [-2, 2), 1 the same plus 1000 (a one-pass variance in the dtype would cancel),
 * 2 some rows constant (variance 0: y = bias, rstd = 1 / sqrt(eps)). Forward and backward are
 * checked element by element against double-precision formulas, with bounds that follow from
 * the computation: a sum of D terms in the dtype may be off by about D u times the sum of the
 * terms' magnitudes (u: the unit roundoff), and every output inherits the errors of the
 * statistics it is made of. */
static void layer_norm_case(ts_device *dev, int32_t dt, int nd, const int64_t *shape, int norm,
                            int affine, int style, kt_layout layout)
{
    const int lead = nd - norm;
    int64_t R = 1, D = 1;
    for (int i = 0; i < nd; i++)
        *(i < lead ? &R : &D) *= shape[i];
    const double u = unit_roundoff(dt), eps = 1e-5, gD = (4.0 + 2.0 * (double)D) * u,
                 gR = (4.0 + 2.0 * (double)R) * u;
    char what[160];
    snprintf(what, sizeof what, "layer_norm %s %dd over %d dims (D %lld)%s%s %s",
             ts_dtype_name(dt), nd, norm, (long long)D, affine ? " affine" : "",
             style == 1 ? " +1000" : style == 2 ? " constant rows" : "", kt_layout_name(layout));
    kt_buf x = kt_make(dev, dt, nd, shape, layout, 41);
    kt_buf w = kt_make(dev, dt, norm, shape + lead, layout, 42);
    kt_buf b = kt_make(dev, dt, norm, shape + lead, layout, 43);
    kt_buf y = kt_make(dev, dt, nd, shape, layout, 44);
    kt_buf gy = kt_make(dev, dt, nd, shape, layout, 45);
    kt_buf gx = kt_make(dev, dt, nd, shape, layout, 46);
    kt_buf mean = kt_make(dev, dt, lead, shape, layout, 47);
    kt_buf rstd = kt_make(dev, dt, lead, shape, layout, 48);
    kt_buf gw = kt_make(dev, dt, norm, shape + lead, layout, 49);
    kt_buf gb = kt_make(dev, dt, norm, shape + lead, layout, 50);
    double *X = malloc(sizeof *X * (size_t)(R * D)), *G = malloc(sizeof *G * (size_t)(R * D));
    double *W = malloc(sizeof *W * (size_t)D), *Bv = malloc(sizeof *Bv * (size_t)D);
    double *M = malloc(sizeof *M * (size_t)R), *S = malloc(sizeof *S * (size_t)R);
    double *Ma = malloc(sizeof *Ma * (size_t)R);
    CHECK(X && G && W && Bv && M && S && Ma);
    if (!(X && G && W && Bv && M && S && Ma))
        goto out;
    int64_t idx[8];
    /* Read back what the buffers hold (after the style's changes), in row-major order. */
    for (int64_t i = 0; i < R * D; i++) {
        kt_unravel(&x.op, i, idx);
        double v = kt_get(&x.op, idx);
        if (style == 1)
            v += 1000.0;
        if (style == 2 && (i / D) % 3 == 1)
            v = 0.75;
        kt_set(&x.op, idx, v);
        X[i] = kt_get(&x.op, idx); /* rounded to the dtype */
        G[i] = kt_get(&gy.op, idx);
    }
    for (int64_t j = 0; j < D; j++) {
        kt_unravel(&w.op, j, idx);
        W[j] = affine ? kt_get(&w.op, idx) : 1.0;
        Bv[j] = affine ? kt_get(&b.op, idx) : 0.0;
    }
    for (int64_t r = 0; r < R; r++) {
        double m = 0, a = 0, v = 0;
        for (int64_t j = 0; j < D; j++)
            m += X[r * D + j], a += fabs(X[r * D + j]);
        m /= (double)D;
        for (int64_t j = 0; j < D; j++)
            v += (X[r * D + j] - m) * (X[r * D + j] - m);
        M[r] = m, Ma[r] = a / (double)D, S[r] = 1.0 / sqrt(v / (double)D + eps);
    }
    ts_layer_norm_params p = {eps, norm};
    ts_operand fin[3] = {x.op, w.op, b.op}, fout[3] = {y.op, mean.op, rstd.op};
    ts_status st = kt_run(dev, TS_OP_LAYER_NORM, fin, affine ? 3 : 1, fout, 3, &p, sizeof p);
    CHECK_MSG(st == TS_OK, "%s: forward failed: %s", what, ts_last_error());
    if (st)
        goto out;
    int bad = 0;
    for (int64_t r = 0; r < R && bad < 3; r++) {
        kt_unravel(&mean.op, r, idx);
        double gm = kt_get(&mean.op, idx), gs = kt_get(&rstd.op, idx);
        /* mean: a sum of D terms; rstd: relative error of the variance's sum, halved by the
         * square root, plus the mean's error (relative to the spread it perturbs). */
        double tm = gD * Ma[r] + 2 * u * fabs(M[r]);
        double ts = S[r] * (gD + 2 * u + tm * S[r]) * 2 + 4 * u * S[r];
        if (!kt_close(gm, M[r], 0, tm) || !kt_close(gs, S[r], 0, ts)) {
            bad++;
            CHECK_MSG(0, "%s: row %lld: mean %.17g rstd %.17g, want %.17g and %.17g (bounds %g, "
                      "%g)", what, (long long)r, gm, gs, M[r], S[r], tm, ts);
        }
        for (int64_t j = 0; j < D && bad < 3; j++) {
            kt_unravel(&y.op, r * D + j, idx);
            double xh = (X[r * D + j] - M[r]) * S[r], want = xh * W[j] + Bv[j];
            double tol = fabs(W[j]) * (tm * S[r] + fabs(xh) * ts / S[r]) +
                         4 * u * (fabs(xh * W[j]) + fabs(Bv[j]));
            double got = kt_get(&y.op, idx);
            if (!kt_close(got, want, 0, tol)) {
                bad++;
                CHECK_MSG(0, "%s: y[%lld] = %.17g, want %.17g (bound %g)", what,
                          (long long)(r * D + j), got, want, tol);
            }
        }
    }
    kt_check_gaps(&y), kt_check_gaps(&mean), kt_check_gaps(&rstd);

    /* Backward from the reference statistics (rounded to the dtype, as a forward would give
     * them): gx = rstd (g w - mean(g w) - xhat mean(g w xhat)), gw = sum over rows of g xhat,
     * gb = sum over rows of g. */
    for (int64_t r = 0; r < R; r++) {
        kt_unravel(&mean.op, r, idx);
        kt_set(&mean.op, idx, M[r]);
        kt_set(&rstd.op, idx, S[r]);
        M[r] = kt_get(&mean.op, idx), S[r] = kt_get(&rstd.op, idx);
    }
    ts_operand bin[5] = {gy.op, x.op, mean.op, rstd.op, w.op}, bout[3] = {gx.op, gw.op, gb.op};
    st = kt_run(dev, TS_OP_LAYER_NORM_BWD, bin, affine ? 5 : 4, bout, affine ? 3 : 1, &p,
                sizeof p);
    CHECK_MSG(st == TS_OK, "%s: backward failed: %s", what, ts_last_error());
    if (st)
        goto out;
    for (int64_t r = 0; r < R && bad < 3; r++) {
        double a1 = 0, a2 = 0, m1 = 0, m2 = 0;
        for (int64_t j = 0; j < D; j++) {
            double gw_ = G[r * D + j] * W[j], xh = (X[r * D + j] - M[r]) * S[r];
            a1 += gw_, a2 += gw_ * xh, m1 += fabs(gw_), m2 += fabs(gw_ * xh);
        }
        a1 /= (double)D, a2 /= (double)D, m1 /= (double)D, m2 /= (double)D;
        double xerr = gD * Ma[r] * S[r]; /* error of xhat from the row's sums */
        for (int64_t j = 0; j < D && bad < 3; j++) {
            double gw_ = G[r * D + j] * W[j], xh = (X[r * D + j] - M[r]) * S[r];
            double want = S[r] * (gw_ - a1 - xh * a2);
            double tol = S[r] * (gD * (m1 + fabs(xh) * m2) + xerr * (m2 + m1 * (1 + fabs(xh))) +
                                 4 * u * (fabs(gw_) + fabs(a1) + fabs(xh * a2)));
            kt_unravel(&gx.op, r * D + j, idx);
            double got = kt_get(&gx.op, idx);
            if (!kt_close(got, want, 0, tol)) {
                bad++;
                CHECK_MSG(0, "%s: gx[%lld] = %.17g, want %.17g (bound %g)", what,
                          (long long)(r * D + j), got, want, tol);
            }
        }
    }
    kt_check_gaps(&gx);
    for (int64_t j = 0; affine && j < D && bad < 3; j++) {
        double sw = 0, sb = 0, aw = 0, ab = 0, xe = 0;
        for (int64_t r = 0; r < R; r++) {
            double g = G[r * D + j], xh = (X[r * D + j] - M[r]) * S[r];
            sw += g * xh, sb += g, aw += fabs(g * xh), ab += fabs(g);
            xe += fabs(g) * (gD * Ma[r] * S[r] + 2 * u * fabs(xh));
        }
        kt_unravel(&gw.op, j, idx);
        double got_w = kt_get(&gw.op, idx), got_b = kt_get(&gb.op, idx);
        double tw = gR * aw + xe, tb = gR * ab;
        if (!kt_close(got_w, sw, 0, tw) || !kt_close(got_b, sb, 0, tb)) {
            bad++;
            CHECK_MSG(0, "%s: gweight[%lld] = %.17g, gbias %.17g, want %.17g and %.17g (bounds "
                      "%g, %g)", what, (long long)j, got_w, got_b, sw, sb, tw, tb);
        }
    }
    if (affine)
        kt_check_gaps(&gw), kt_check_gaps(&gb);
    CHECK_MSG(!bad, "%s", what);
out:
    free(X), free(G), free(W), free(Bv), free(M), free(S), free(Ma);
    kt_free(&x), kt_free(&w), kt_free(&b), kt_free(&y), kt_free(&gy), kt_free(&gx);
    kt_free(&mean), kt_free(&rstd), kt_free(&gw), kt_free(&gb);
}

static void test_layer_norm(void)
{
    const char *const *names = kt_plugins();
    if (!*names)
        SKIP("no host plugin is built");
    static const struct {
        int nd, norm;
        int64_t s[3];
    } cs[] = {{2, 1, {5, 7}},   {3, 1, {2, 3, 64}}, {3, 2, {2, 3, 5}}, {2, 1, {4, 1}},
              {1, 1, {33}},     {2, 1, {37, 130}},  {2, 1, {3, 1000}}, {3, 2, {4, 8, 16}}};
    for (; *names; names++) {
        ts_device *dev = kt_load(*names);
        for (int d = 0; d < 2; d++) {
            int32_t dt = float_dtypes[d];
            if (!ts_device_supports(dev, TS_OP_LAYER_NORM, dt) ||
                !ts_device_supports(dev, TS_OP_LAYER_NORM_BWD, dt)) {
                CHECK_MSG(0, "%s does not claim layer norm for %s", *names, ts_dtype_name(dt));
                continue;
            }
            for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
                for (int affine = 0; affine < 2; affine++)
                    for (int style = 0; style < 3; style++)
                        layer_norm_case(dev, dt, cs[i].nd, cs[i].s, cs[i].norm, affine, style,
                                        (i + (size_t)style) % 2 ? KT_OFFSET : KT_CONTIG);
        }
        CHECK(!ts_device_supports(dev, TS_OP_LAYER_NORM, TS_I32));
        kt_check_no_live_blocks(dev);
    }
}

/* float32 affine gradients are sums over the rows in row order, in double, rounded once:
 * columns whose terms swing between +-2^40 and values with 24 significant bits make every
 * other order (or float accumulation) give other bits, in gb and in gw (where x - mean is
 * 1 / rstd on the large rows, powers of two, so that their products are exact and cancel).
 * D = 70: two blocks of 32 columns and a ragged tail. */
static void test_layer_norm_affine_exact(void)
{
    const char *const *names = kt_plugins();
    if (!*names)
        SKIP("no host plugin is built");
    enum { R = 600, D = 70 }; /* over 32768 elements: threaded where threads are free */
    int64_t xs[2] = {R, D}, rs[1] = {R}, ws[1] = {D};
    for (; *names; names++) {
        ts_device *dev = kt_load(*names);
        kt_buf gy = kt_make(dev, TS_F32, 2, xs, KT_CONTIG, 61);
        kt_buf x = kt_make(dev, TS_F32, 2, xs, KT_CONTIG, 62);
        kt_buf mean = kt_make(dev, TS_F32, 1, rs, KT_CONTIG, 63);
        kt_buf rstd = kt_make(dev, TS_F32, 1, rs, KT_CONTIG, 64);
        kt_buf w = kt_make(dev, TS_F32, 1, ws, KT_CONTIG, 65);
        kt_buf gx = kt_make(dev, TS_F32, 2, xs, KT_CONTIG, 66);
        kt_buf gw = kt_make(dev, TS_F32, 1, ws, KT_CONTIG, 67);
        kt_buf gb = kt_make(dev, TS_F32, 1, ws, KT_CONTIG, 68);
        int64_t idx[2];
        for (int64_t r = 0; r < R; r++) {
            idx[0] = r;
            double mu = 0.25 * (double)(r % 7) - 0.5, rsd = ldexp(1.0, (int)(r % 3) - 1);
            kt_set(&mean.op, idx, mu);
            kt_set(&rstd.op, idx, rsd);
            for (int64_t j = 0; j < D; j++) {
                idx[1] = j;
                int64_t k = (r + j) % 3;
                kt_set(&gy.op, idx, k == 0   ? ldexp(1.0, 40)
                                    : k == 1 ? -ldexp(1.0, 40)
                                             : 1.0 + (double)((r * 31 + j * 17) % 97) / 97.0);
                if (k != 2)
                    kt_set(&x.op, idx, mu + 1.0 / rsd);
            }
        }
        ts_layer_norm_params p = {1e-5, 1};
        ts_operand bin[5] = {gy.op, x.op, mean.op, rstd.op, w.op}, bout[3] = {gx.op, gw.op, gb.op};
        ts_status st = kt_run(dev, TS_OP_LAYER_NORM_BWD, bin, 5, bout, 3, &p, sizeof p);
        CHECK_MSG(st == TS_OK, "%s: layer norm backward failed: %s", *names, ts_last_error());
        int bad = 0;
        for (int64_t j = 0; !st && j < D && bad < 3; j++) {
            double sw = 0, sb = 0;
            for (int64_t r = 0; r < R; r++) {
                int64_t i2[2] = {r, j}, i1[1] = {r};
                double g = kt_get(&gy.op, i2), xv = kt_get(&x.op, i2);
                sw += g * (xv - kt_get(&mean.op, i1)) * kt_get(&rstd.op, i1);
                sb += g;
            }
            int64_t i1[1] = {j};
            float want_w = (float)sw, want_b = (float)sb;
            double got_w = kt_get(&gw.op, i1), got_b = kt_get(&gb.op, i1);
            if (got_w != (double)want_w || got_b != (double)want_b) {
                bad++;
                CHECK_MSG(0, "%s: column %lld: gweight %.9g gbias %.9g, want %.9g and %.9g "
                          "(row-order double sums rounded once)", *names, (long long)j, got_w,
                          got_b, (double)want_w, (double)want_b);
            }
        }
        CHECK_MSG(!bad, "%s: float32 layer norm affine gradients in row order", *names);
        kt_free(&gy), kt_free(&x), kt_free(&mean), kt_free(&rstd), kt_free(&w);
        kt_free(&gx), kt_free(&gw), kt_free(&gb);
        kt_check_no_live_blocks(dev);
    }
}

int main(int argc, char **argv)
{
    static const tap_test tests[] = {
        TAP_TEST(test_matmul_shapes),
        TAP_TEST(test_matmul_layouts),
        TAP_TEST(test_matmul_batched),
        TAP_TEST(test_matmul_empty),
        TAP_TEST(test_matmul_in_place),
        TAP_TEST(test_conv2d),
        TAP_TEST(test_conv2d_bad_params),
        TAP_TEST(test_pool2d),
        TAP_TEST(test_pool2d_bad_params),
        TAP_TEST(test_index),
        TAP_TEST(test_index_wide),
        TAP_TEST(test_index_errors),
        TAP_TEST(test_layer_norm),
        TAP_TEST(test_layer_norm_affine_exact),
    };
    return tap_run(tests, sizeof tests / sizeof tests[0], argc, argv);
}
