/* tests/plugins/test-train-reference.c: a LeNet-5 training step on each CPU plugin in float32
 * against the same step in float64 on the core's reference kernels (the hostonly fixture),
 * from the same weights and batch: the loss, every parameter's gradient, and the weights
 * after one SGD or Adam step; then a short horizon of 4 SGD steps, each checked the same way
 * from the plugin's own weights. Each plugin is compared with the reference, never with the
 * other plugin. The bounds follow from the computation, not from any one CPU, so they hold
 * whatever kernels OpenBLAS and oneDNN pick (AVX2 or AVX-512, Intel or AMD), in whatever
 * order they sum, with or without FMA:
 *
 * - A float32 sum of K products, in any order, is within gamma(K) = K u / (1 - K u)
 *   (u = 2^-24) times sum |a_i b_i| of the exact sum. So a stage's output error is at most
 *   gamma(K) (|W| |a| + |b|) on the actual activations plus its input's error through |W|
 *   (stage_err): a running bound, in float64, along the reference. A ReLU passes its input's
 *   error where it passes the input; a max pool passes the chosen input's.
 * - ReLU and max pool branch: at an input within float32 error of a kink either branch is
 *   right, and the gradient differs between them by a whole term. So the reference takes the
 *   plugin's branches (its ReLU signs and max-pool indices), and check_branches fails any
 *   branch the reference would not take itself that is outside the error bound (with these
 *   data none is within it: the output says how many).
 * - Backward, stage by stage from the top (backward_bounds): the logits' gradient
 *   (softmax - onehot) / B is off by at most 2 p_j max E_z (softmax's sensitivity to the
 *   logits' error) plus CE_ROUND u of its own roundings; a backward-data GEMM adds
 *   gamma(Kb) |W|^T |g| and passes the error through |W|^T; a weight gradient in^T g adds
 *   gamma(N) |in|^T |g| plus |in|^T E_g + E_in^T |g|; a bias gradient gamma(N) sum |g| plus
 *   sum E_g. N is the batch times the output positions; first order in u throughout (the
 *   neglected terms are (k u)^2 relative, below 1e-6 of the bounds here).
 * - The loss: log-sum-exp is 1-Lipschitz in the max norm, so max_j E_z + E_z(y) per image,
 *   plus CE_ROUND u and the batch mean's gamma(B) on its magnitude.
 * - SGD: w' = w - lr g is within lr E_g + 2 u (|w| + lr |g|). Adam's first step is
 *   w - lr g / (|g| + eps) (bias-corrected), whose derivative in g is lr eps / (|g| + eps)^2:
 *   within lr E_g eps / (max(|g| - E_g, 0) + eps)^2 (at most 2 lr) + 16 u (|w| + lr) for
 *   the dozen roundings of the update.
 * The output prints each bound's largest ratio error / bound: about 1e-3 for the gradients
 * (the bounds are worst cases: K u where sums of random signs give sqrt(K) u) and 0.1-0.3
 * for the updated weights, so a kernel off by one term or one index fails. */
#include "kt.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>

#define U 0x1p-24 /* float32 unit roundoff */
/* Roundings in the loss's softmax (the max, exp, the sum of 10, the division, the
 * subtraction), in u, with room for an exp that is within a few ulp rather than correctly
 * rounded (glibc's expf is within 1 ulp; oneDNN's own exp within a few). */
#define CE_ROUND 16.0

/* A TAP diagnostic line: the measured margins. */
static void diag(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void diag(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("# ", stdout);
    vprintf(fmt, ap);
    fputs("\n", stdout);
    fflush(stdout);
    va_end(ap);
}

static double gam(double k)
{
    return k * U / (1 - k * U);
}

enum { B = 16, NP = 10, NCLS = 10, SEED = 3 };

static const char *const pname[NP] = {"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias",
                                      "fc1.weight",   "fc1.bias",   "fc2.weight",   "fc2.bias",
                                      "fc3.weight",   "fc3.bias"};
static const int pndim[NP] = {4, 1, 4, 1, 2, 1, 2, 1, 2, 1};
static const int64_t pshape[NP][4] = {{6, 1, 5, 5}, {6}, {16, 6, 5, 5}, {16}, {400, 120},
                                      {120},        {120, 84}, {84},      {84, 10}, {10}};
static const int64_t pfan[NP] = {25, 25, 150, 150, 400, 400, 120, 120, 84, 84};

static int64_t pnumel(int i)
{
    int64_t n = 1;
    for (int d = 0; d < pndim[i]; d++)
        n *= pshape[i][d];
    return n;
}

/* Forward stages, bottom to top: terms per output (K plus the bias). */
static const double fwd_k[5] = {26, 151, 401, 121, 85};
/* ---- the network ------------------------------------------------------------------------ */

typedef struct run {
    ts_tensor *p[NP];   /* leaves requiring grad */
    ts_tensor *z[4];    /* ReLU inputs: conv1, conv2, fc1, fc2 outputs */
    ts_tensor *idx[2];  /* the max pools' choices (TS_I64, flat within each plane) */
    ts_tensor *logits;
} run;

/* A plugin's branches: its ReLUs' (z > 0) and its max pools' indices, which the reference
 * follows (see reference()). Host arrays. */
typedef struct branches {
    double *mask[4];
    int64_t *idx[2];
} branches;

static const int64_t zshape[4][4] = {{B, 6, 28, 28}, {B, 16, 10, 10}, {B, 120}, {B, 84}};
static const int zndim[4] = {4, 4, 2, 2};

/* *t after the call that set it (arguments are evaluated in any order: pass its address). */
static ts_tensor *T(ts_status s, ts_tensor **t)
{
    CHECK_MSG(s == TS_OK, "%s", ts_last_error());
    return *t;
}

static ts_tensor *linear(ts_tensor *x, ts_tensor *w, ts_tensor *b)
{
    ts_tensor *y, *yb;
    y = T(ts_matmul(x, w, &y), &y);
    yb = T(ts_add(y, b, &yb), &yb);
    ts_tensor_unref(y);
    return yb;
}

/* a (B, C, H, W) at the plugin's max-pool choices idx (flat within each plane): (B, C, H/2,
 * W/2), a gather whose gradient goes where the plugin's went. */
static ts_tensor *gather_pool(ts_tensor *a, const int64_t *idx)
{
    int64_t C = ts_tensor_size(a, 1), H = ts_tensor_size(a, 2), n = B * C * (H / 2) * (H / 2);
    int64_t *g = malloc((size_t)n * 8);
    CHECK(g);
    for (int64_t o = 0; o < n; o++) {
        CHECK_MSG(idx[o] >= 0 && idx[o] < H * H, "max pool index %lld outside its %lldx%lld "
                  "plane", (long long)idx[o], (long long)H, (long long)H);
        g[o] = o / (H / 2 * (H / 2)) * H * H + idx[o];
    }
    ts_tensor *flat, *gi, *sel, *out;
    flat = T(ts_tensor_reshape(a, 1, (const int64_t[]){B * C * H * H}, &flat), &flat);
    CHECK_OK(ts_tensor_from_host(ts_tensor_device(a), TS_I64, 1, &n, g, &gi));
    sel = T(ts_index_select(flat, 0, gi, &sel), &sel);
    out = T(ts_tensor_reshape(sel, 4, (const int64_t[]){B, C, H / 2, H / 2}, &out), &out);
    ts_tensor_unref(flat), ts_tensor_unref(gi), ts_tensor_unref(sel);
    free(g);
    return out;
}

/* Max pool 2x2 stride 2 (keeping its indices in *idx), or the plugin's choices (br). */
static ts_tensor *pool(ts_tensor *a, const int64_t *br, ts_tensor **idx)
{
    ts_pool2d_params pp = {2, 2, 2, 2, 0, 0, 1};
    ts_tensor *o;
    if (br)
        return gather_pool(a, br);
    return T(ts_max_pool2d(a, &pp, &o, idx), &o);
}

/* ReLU, or z * mask for the plugin's choices (br). */
static ts_tensor *act(ts_tensor *z, const double *br, int l)
{
    ts_tensor *a, *m;
    if (!br)
        return T(ts_relu(z, &a), &a);
    CHECK_OK(ts_tensor_from_host(ts_tensor_device(z), TS_F64, zndim[l], zshape[l], br, &m));
    a = T(ts_mul(z, m, &a), &a);
    ts_tensor_unref(m);
    return a;
}

/* logits of x (B, 1, 28, 28); keeps each ReLU input in r->z, and the max pools' indices in
 * r->idx (without br). */
static void forward(run *r, ts_tensor *x, const branches *br)
{
    ts_conv2d_params c1 = {1, 1, 2, 2, 1, 1, 1}, c2 = {1, 1, 0, 0, 1, 1, 1};
    ts_tensor *a, *h, *f;
    r->z[0] = T(ts_conv2d(x, r->p[0], r->p[1], &c1, &r->z[0]), &r->z[0]); /* (B, 6, 28, 28) */
    a = act(r->z[0], br ? br->mask[0] : NULL, 0);
    h = pool(a, br ? br->idx[0] : NULL, &r->idx[0]); /* (B, 6, 14, 14) */
    ts_tensor_unref(a);
    r->z[1] = T(ts_conv2d(h, r->p[2], r->p[3], &c2, &r->z[1]), &r->z[1]); /* (B, 16, 10, 10) */
    ts_tensor_unref(h);
    a = act(r->z[1], br ? br->mask[1] : NULL, 1);
    h = pool(a, br ? br->idx[1] : NULL, &r->idx[1]); /* (B, 16, 5, 5) */
    ts_tensor_unref(a);
    f = T(ts_tensor_reshape(h, 2, (const int64_t[]){B, 400}, &f), &f);
    ts_tensor_unref(h);
    r->z[2] = linear(f, r->p[4], r->p[5]); /* (B, 120) */
    ts_tensor_unref(f);
    a = act(r->z[2], br ? br->mask[2] : NULL, 2);
    r->z[3] = linear(a, r->p[6], r->p[7]); /* (B, 84) */
    ts_tensor_unref(a);
    a = act(r->z[3], br ? br->mask[3] : NULL, 3);
    r->logits = linear(a, r->p[8], r->p[9]); /* (B, 10) */
    ts_tensor_unref(a);
}

static void run_free(run *r)
{
    for (int i = 0; i < NP; i++)
        ts_tensor_unref(r->p[i]);
    for (int i = 0; i < 4; i++)
        ts_tensor_unref(r->z[i]);
    ts_tensor_unref(r->idx[0]), ts_tensor_unref(r->idx[1]);
    ts_tensor_unref(r->logits);
    memset(r, 0, sizeof *r);
}

/* Parameters on dev in dtype from host values w[i] (float64 holding float32 values). */
static void make_params(run *r, ts_device *dev, int32_t dtype, double *const *w)
{
    for (int i = 0; i < NP; i++) {
        int64_t n = pnumel(i);
        void *buf = malloc((size_t)n * 8);
        CHECK(buf);
        for (int64_t j = 0; j < n; j++) {
            double v = w[i][j];
            if (dtype == TS_F32)
                ((float *)buf)[j] = (float)v;
            else
                ((double *)buf)[j] = v;
        }
        CHECK_OK(ts_tensor_from_host(dev, dtype, pndim[i], pshape[i], buf, &r->p[i]));
        CHECK_OK(ts_tensor_set_requires_grad(r->p[i], 1));
        free(buf);
    }
}

/* t (any float dtype) into host doubles (numel values). */
static double *host(const ts_tensor *t)
{
    int64_t n = ts_tensor_numel(t);
    double *d = malloc((size_t)(n ? n : 1) * 8);
    CHECK(d);
    if (ts_tensor_dtype(t) == TS_F64) {
        CHECK_OK(ts_tensor_to_host(t, d, (size_t)n * 8));
    } else {
        float *f = malloc((size_t)(n ? n : 1) * 4);
        CHECK(f);
        CHECK_OK(ts_tensor_to_host(t, f, (size_t)n * 4));
        for (int64_t i = 0; i < n; i++)
            d[i] = f[i];
        free(f);
    }
    return d;
}

static double *grad_host(ts_tensor *p)
{
    ts_tensor *g = ts_tensor_grad(p);
    CHECK_MSG(g, "no gradient");
    return host(g);
}

/* ---- the data and the reference ---------------------------------------------------------- */

static uint64_t lcg = 12345;
static double urand(void) /* [0, 1), 24 bits: exact in float32 */
{
    lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(lcg >> 40) / 16777216.0;
}

typedef struct problem {
    double *w[NP];      /* float32 values */
    double x[B * 784];  /* float32 values */
    int64_t y[B];
} problem;

static void problem_make(problem *pb, uint64_t seed)
{
    lcg = seed;
    for (int i = 0; i < NP; i++) {
        int64_t n = pnumel(i);
        pb->w[i] = malloc((size_t)n * 8);
        CHECK(pb->w[i]);
        double b = 1.0 / sqrt((double)pfan[i]); /* PyTorch's default range */
        for (int64_t j = 0; j < n; j++)
            pb->w[i][j] = (double)(float)((2 * urand() - 1) * b);
    }
    for (int i = 0; i < B * 784; i++)
        pb->x[i] = urand();
    for (int i = 0; i < B; i++)
        pb->y[i] = (int64_t)(urand() * NCLS);
}

static void problem_free(problem *pb)
{
    for (int i = 0; i < NP; i++)
        free(pb->w[i]);
}

/* The float64 reference of one step and the bounds of every compared value. */
typedef struct refstep {
    double loss, loss_bound;
    double *g[NP], *gbound[NP]; /* gradient, and its error bound (backward_bounds) */
} refstep;

/* The hostonly fixture: host memory and no kernels, so every op runs on the core's reference
 * kernels (plain loops). Unloaded by the caller. */
static ts_device *ref_dev(void)
{
    char path[4096];
    const char *b = getenv("TS_BUILDDIR");
    snprintf(path, sizeof path, "%s/tests/fixtures/.libs/hostonly.so", b ? b : ".");
    ts_device *dev;
    CHECK_OK(ts_device_load(NULL, path, &dev));
    return dev;
}

static ts_tensor *input(ts_device *dev, int32_t dtype, const problem *pb)
{
    ts_tensor *x;
    double *d = malloc(sizeof pb->x);
    float *f = malloc(sizeof pb->x / 2);
    CHECK(d && f);
    for (int i = 0; i < B * 784; i++)
        d[i] = pb->x[i], f[i] = (float)d[i];
    CHECK_OK(ts_tensor_from_host(dev, dtype, 4, (const int64_t[]){B, 1, 28, 28},
                                 dtype == TS_F32 ? (void *)f : (void *)d, &x));
    free(d), free(f);
    return x;
}

/* |t| (transfer full). */
static ts_tensor *absolute(ts_tensor *t)
{
    ts_tensor *a;
    return T(ts_abs(t, &a), &a);
}

/* e * mask: a ReLU's output error where it passes its input; elsewhere its output is an
 * exact 0 in the plugin and in the reference, which takes the same branch. */
static ts_tensor *relu_err(ts_tensor *e, const double *mask, int l)
{
    ts_tensor *m, *o;
    CHECK_OK(ts_tensor_from_host(ts_tensor_device(e), TS_F64, zndim[l], zshape[l], mask, &m));
    o = T(ts_mul(e, m, &o), &o);
    ts_tensor_unref(m);
    return o;
}

/* e_out = gamma(K) (|a| @ |W| + |b|) + e_in @ |W| (conv: the same with conv2d): a stage's
 * rounding on the actual |activations| plus its input's error through |W|. */
static ts_tensor *stage_err(ts_tensor *a, ts_tensor *e_in, ts_tensor *w, ts_tensor *b,
                            const ts_conv2d_params *cp, double k)
{
    ts_tensor *aa = absolute(a), *aw = absolute(w), *ab = absolute(b), *s, *sk, *p = NULL, *o;
    if (cp) {
        s = T(ts_conv2d(aa, aw, ab, cp, &s), &s);
        if (e_in)
            p = T(ts_conv2d(e_in, aw, NULL, cp, &p), &p);
    } else {
        ts_tensor *mm = T(ts_matmul(aa, aw, &mm), &mm);
        s = T(ts_add(mm, ab, &s), &s);
        ts_tensor_unref(mm);
        if (e_in)
            p = T(ts_matmul(e_in, aw, &p), &p);
    }
    sk = T(ts_mul_scalar(s, gam(k), &sk), &sk);
    if (p) {
        o = T(ts_add(sk, p, &o), &o);
        ts_tensor_unref(sk);
    } else {
        o = sk;
    }
    ts_tensor_unref(aa), ts_tensor_unref(aw), ts_tensor_unref(ab), ts_tensor_unref(s);
    ts_tensor_unref(p);
    return o;
}

/* Forward error bounds along the reference, and what the backward bounds need. */
typedef struct fwd_bounds {
    ts_tensor *in[5];  /* each stage's input (x, pooled conv1, flattened pooled conv2, fc1 and
                          fc2 activations), outside the graph */
    ts_tensor *ein[5]; /* its error bound (ein[0]: NULL, x is exact) */
    ts_tensor *ez;     /* the logits' error bound */
} fwd_bounds;

static void fwd_bounds_free(fwd_bounds *fb)
{
    for (int l = 0; l < 5; l++)
        ts_tensor_unref(fb->in[l]), ts_tensor_unref(fb->ein[l]);
    ts_tensor_unref(fb->ez);
}

static const ts_conv2d_params conv_p[2] = {{1, 1, 2, 2, 1, 1, 1}, {1, 1, 0, 0, 1, 1, 1}};

/* The plugin's branches must be ones a float32 computation may take: the gradient of a ReLU
 * network is only defined piecewise, and at an input within float32 error of a kink either
 * piece is right. So the reference follows the plugin's branches, and this checks that each
 * one the reference would not take itself is within the error bound: a ReLU input of the
 * other sign has |z| <= E_z; a max-pool choice other than the reference's largest input is
 * within the two values' bounds of it. E is a running bound along the reference (forward
 * pass r, which followed br): each stage's rounding on the actual |activations| plus the
 * propagated error (stage_err); a ReLU passes its input's error where it passes the input,
 * and a max pool the chosen input's. Prints how many branches were within error. */
/* t outside the graph; takes t. */
static ts_tensor *det(ts_tensor *t)
{
    ts_tensor *d = T(ts_tensor_detach(t, &d), &d);
    ts_tensor_unref(t);
    return d;
}

static void check_branches(run *r, ts_tensor *x, const branches *br, const char *dev,
                           fwd_bounds *fb)
{
    ts_tensor *e = NULL, *a = NULL, *ea = NULL, *h, *eh, *m, *zd;
    int64_t near_kink = 0, near_tie = 0;
    memset(fb, 0, sizeof *fb);
    for (int l = 0; l < 5; l++) {
        fb->in[l] = l == 0 ? ts_tensor_ref(x) : a;
        fb->ein[l] = l == 0 ? NULL : ea;
        e = det(stage_err(fb->in[l], fb->ein[l], r->p[2 * l], r->p[2 * l + 1],
                          l < 2 ? &conv_p[l] : NULL, fwd_k[l]));
        if (l == 4) {
            fb->ez = e;
            break;
        }
        CHECK_OK(ts_tensor_detach(r->z[l], &zd));
        double *zr = host(zd), *er = host(e);
        int64_t n = ts_tensor_numel(zd);
        for (int64_t i = 0; i < n; i++)
            if (br->mask[l][i] != (zr[i] > 0)) {
                CHECK_MSG(fabs(zr[i]) <= er[i], "%s: ReLU %d input %lld: the plugin took the "
                          "branch of z %s 0, but z = %.9g in float64, beyond its float32 "
                          "error bound %.3g", dev, l, (long long)i,
                          br->mask[l][i] ? ">" : "<=", zr[i], er[i]);
                near_kink++;
            }
        CHECK_OK(ts_tensor_from_host(ts_tensor_device(e), TS_F64, zndim[l], zshape[l],
                                     br->mask[l], &m));
        a = T(ts_mul(zd, m, &a), &a);
        ts_tensor_unref(m), ts_tensor_unref(zd);
        ea = relu_err(e, br->mask[l], l);
        ts_tensor_unref(e);
        if (l < 2) { /* the max pools after the ReLUs of the two convolutions */
            double *ar = host(a), *eb = host(ea);
            int64_t C = l ? 16 : 6, H = l ? 10 : 28, Q = H / 2;
            for (int64_t o = 0; o < B * C * Q * Q; o++) {
                int64_t plane = o / (Q * Q) * H * H, i = o % (Q * Q) / Q * 2, j = o % Q * 2;
                int64_t ch = br->idx[l][o], top = -1;
                CHECK_MSG(ch / H >= i && ch / H < i + 2 && ch % H >= j && ch % H < j + 2,
                          "%s: max pool %d output %lld chose %lld, outside its window", dev, l,
                          (long long)o, (long long)ch);
                for (int k = 0; k < 4; k++) {
                    int64_t at = (i + k / 2) * H + j + k % 2;
                    if (top < 0 || ar[plane + at] > ar[plane + top])
                        top = at;
                }
                double vt = ar[plane + top], vc = ar[plane + ch];
                if (ch != top && vc != vt) {
                    CHECK_MSG(vt - vc <= eb[plane + top] + eb[plane + ch], "%s: max pool %d "
                              "output %lld chose %.9g over %.9g, beyond their float32 error "
                              "bounds", dev, l, (long long)o, vc, vt);
                    near_tie++;
                }
            }
            free(ar), free(eb);
            h = gather_pool(a, br->idx[l]);
            eh = gather_pool(ea, br->idx[l]); /* the chosen input's error */
            ts_tensor_unref(a), ts_tensor_unref(ea);
            a = h, ea = eh;
            if (l == 1) { /* flatten for fc1 */
                a = T(ts_tensor_reshape(h, 2, (const int64_t[]){B, 400}, &a), &a);
                ea = T(ts_tensor_reshape(eh, 2, (const int64_t[]){B, 400}, &ea), &ea);
                ts_tensor_unref(h), ts_tensor_unref(eh);
            }
        }
        free(zr), free(er);
    }
    diag("%s: %lld ReLU inputs and %lld max-pool choices within float32 error of a kink, "
         "followed", dev, (long long)near_kink, (long long)near_tie);
}

/* Captures the gradient flowing into a stage's output (dL/dz) as a float64 host copy. */
typedef struct capture {
    double *g;
} capture;

static ts_status capture_hook(ts_tensor *grad, void *user)
{
    capture *c = user;
    free(c->g);
    c->g = host(grad);
    return TS_OK;
}

/* A float64 tensor of shape like t from host values v (|v| * scale when abs_). */
static ts_tensor *like(const ts_tensor *t, const double *v, double scale, int abs_)
{
    int64_t n = ts_tensor_numel(t), shape[4];
    int nd = ts_tensor_ndim(t);
    double *d = malloc((size_t)n * 8);
    CHECK(d);
    for (int i = 0; i < nd; i++)
        shape[i] = ts_tensor_size(t, i);
    for (int64_t i = 0; i < n; i++)
        d[i] = (abs_ ? fabs(v[i]) : v[i]) * scale;
    ts_tensor *o;
    CHECK_OK(ts_tensor_from_host(ts_tensor_device(t), TS_F64, nd, shape, d, &o));
    free(d);
    return o;
}

static ts_tensor *plus(ts_tensor *a, ts_tensor *b) /* a + b; takes both */
{
    ts_tensor *o = T(ts_add(a, b, &o), &o);
    ts_tensor_unref(a), ts_tensor_unref(b);
    return o;
}

/* Stage l on (a, w, b) without the graph of the reference: conv or a @ w, plus b if given. */
static ts_tensor *stage(int l, ts_tensor *a, ts_tensor *w, ts_tensor *b)
{
    ts_tensor *o;
    if (l < 2)
        return T(ts_conv2d(a, w, b, &conv_p[l], &o), &o);
    o = T(ts_matmul(a, w, &o), &o);
    return b ? plus(o, ts_tensor_ref(b)) : o;
}

/* A float64 leaf requiring grad: |t| (abs_) or zeros, shaped like t. */
static ts_tensor *leaf(ts_tensor *t, int abs_)
{
    ts_tensor *o;
    if (abs_) {
        o = absolute(t);
        ts_tensor *d = T(ts_tensor_detach(o, &d), &d);
        ts_tensor_unref(o);
        o = d;
    } else {
        int64_t shape[4];
        for (int i = 0; i < ts_tensor_ndim(t); i++)
            shape[i] = ts_tensor_size(t, i);
        CHECK_OK(ts_tensor_zeros(ts_tensor_device(t), TS_F64, ts_tensor_ndim(t), shape, &o));
    }
    CHECK_OK(ts_tensor_set_requires_grad(o, 1));
    return o;
}

/* Backward error bounds, stage by stage from the top, along the branches br, with the actual
 * float64 gradients gz[l] = dL/dz_l (captured). A stage's backward-data GEMM adds
 * gamma(Kb) |W|^T |gz| and passes the error of gz through |W|^T (then the ReLU's mask and
 * the max pool's routing, both exact): egin = |T_l|^T (gamma(Kb) |gz| + egz). The weight
 * gradient in^T gz adds gamma(N) |in|^T |gz| plus |in|^T egz + ein^T |gz|; the bias gradient
 * gamma(N) sum |gz| + sum egz. bound[i] receives each parameter's bound (host). */
static void backward_bounds(run *r, const fwd_bounds *fb, const branches *br,
                            double *const *gz, const double *egz_top, double **bound)
{
    static const double bwd_k[5] = {0, 400, 120, 84, 10}; /* stage l's backward-data terms */
    static const double red_n[5] = {B * 28 * 28, B * 10 * 10, B, B, B};
    ts_tensor *egz = NULL; /* error bound of dL/dz_l, float64 */
    for (int l = 4; l >= 0; l--) {
        ts_tensor *zt = l == 4 ? r->logits : r->z[l];
        if (!egz)
            egz = like(zt, egz_top, 1, 0);
        ts_tensor *agz = like(zt, gz[l], 1, 1);
        /* weights and bias: backward through stage(|in|, W, b) with seed gamma(N)|gz| + egz,
         * and through stage(ein, W) with seed |gz| */
        ts_tensor *wl = leaf(r->p[2 * l], 0), *bl = leaf(r->p[2 * l + 1], 0);
        ts_tensor *ain = absolute(fb->in[l]), *s1, *seed;
        s1 = stage(l, ain, wl, bl);
        seed = T(ts_mul_scalar(agz, gam(red_n[l]), &seed), &seed);
        seed = plus(seed, ts_tensor_ref(egz));
        CHECK_OK(ts_backward(s1, seed, 0));
        ts_tensor_unref(s1), ts_tensor_unref(seed), ts_tensor_unref(ain);
        if (fb->ein[l]) {
            s1 = stage(l, fb->ein[l], wl, NULL);
            CHECK_OK(ts_backward(s1, agz, 0));
            ts_tensor_unref(s1);
        }
        bound[2 * l] = host(ts_tensor_grad(wl));
        bound[2 * l + 1] = host(ts_tensor_grad(bl));
        ts_tensor_unref(wl), ts_tensor_unref(bl);
        if (l > 0) { /* egz of the stage below: through |W|^T, the pool's routing, the mask */
            int k = l - 1;
            ts_tensor *zl = leaf(r->z[k], 0), *m, *a, *h, *aw = absolute(r->p[2 * l]), *o;
            CHECK_OK(ts_tensor_from_host(ts_tensor_device(zl), TS_F64, zndim[k], zshape[k],
                                         br->mask[k], &m));
            a = T(ts_mul(zl, m, &a), &a);
            ts_tensor_unref(m);
            if (k < 2) {
                h = gather_pool(a, br->idx[k]);
                ts_tensor_unref(a);
                a = h;
                if (k == 1) {
                    h = T(ts_tensor_reshape(a, 2, (const int64_t[]){B, 400}, &h), &h);
                    ts_tensor_unref(a);
                    a = h;
                }
            }
            o = stage(l, a, aw, NULL);
            seed = T(ts_mul_scalar(agz, gam(bwd_k[l]), &seed), &seed);
            seed = plus(seed, egz);
            CHECK_OK(ts_backward(o, seed, 0));
            double *ez = host(ts_tensor_grad(zl));
            egz = like(zl, ez, 1, 0);
            free(ez);
            ts_tensor_unref(o), ts_tensor_unref(seed), ts_tensor_unref(a), ts_tensor_unref(aw);
            ts_tensor_unref(zl);
        } else {
            ts_tensor_unref(egz);
        }
        ts_tensor_unref(agz);
    }
}

/* The float64 reference of the step the plugin took: the same weights and batch, on the
 * plugin's branches (checked by check_branches), and the bounds of every compared value. */
static void reference(ts_device *rd, const problem *pb, const branches *br, const char *dev,
                      refstep *rs)
{
    ts_tensor *x = input(rd, TS_F64, pb), *y, *loss, *sm;
    CHECK_OK(ts_tensor_from_host(rd, TS_I64, 1, (const int64_t[]){B}, pb->y, &y));
    run r = {0};
    fwd_bounds fb;
    capture cap[5] = {{0}};
    make_params(&r, rd, TS_F64, pb->w);
    forward(&r, x, br);
    check_branches(&r, x, br, dev, &fb);
    for (int l = 0; l < 5; l++)
        CHECK_OK(ts_tensor_register_hook(l == 4 ? r.logits : r.z[l], capture_hook, &cap[l]));
    CHECK_OK(ts_cross_entropy(r.logits, y, TS_REDUCTION_MEAN, &loss));
    CHECK_OK(ts_backward(loss, NULL, 0));
    double *lv = host(loss);
    rs->loss = lv[0];
    free(lv);
    for (int i = 0; i < NP; i++)
        rs->g[i] = grad_host(r.p[i]);
    ts_tensor *ld;
    CHECK_OK(ts_tensor_detach(r.logits, &ld));
    CHECK_OK(ts_softmax(ld, 1, &sm));
    double *p = host(sm), *z = host(ld), *ez = host(fb.ez), egz[B * NCLS], lossabs = 0;
    rs->loss_bound = 0;
    for (int n = 0; n < B; n++) {
        double mx = 0, zmax = -INFINITY, se = 0;
        for (int j = 0; j < NCLS; j++) {
            mx = fmax(mx, ez[n * NCLS + j]);
            zmax = fmax(zmax, z[n * NCLS + j]);
        }
        for (int j = 0; j < NCLS; j++) {
            /* the softmax's error from the logits' (at most 2 p_j max E_z) and its own
             * roundings, over the batch mean */
            double pj = p[n * NCLS + j];
            egz[n * NCLS + j] = (2 * pj * mx + CE_ROUND * U * (pj + (j == pb->y[n]))) / B;
            se += exp(z[n * NCLS + j] - zmax);
        }
        /* the loss: log-sum-exp is 1-Lipschitz in the max norm, z_y has its own error */
        rs->loss_bound += (mx + ez[n * NCLS + pb->y[n]]) / B;
        lossabs += (fabs(zmax + log(se)) + fabs(z[n * NCLS + pb->y[n]])) / B;
    }
    rs->loss_bound += (CE_ROUND * U + gam(B)) * lossabs;
    double *gz[5];
    for (int l = 0; l < 5; l++) {
        CHECK_MSG(cap[l].g, "no gradient captured at stage %d", l);
        gz[l] = cap[l].g;
    }
    backward_bounds(&r, &fb, br, gz, egz, rs->gbound);
    for (int l = 0; l < 5; l++)
        free(gz[l]);
    free(p), free(z), free(ez);
    fwd_bounds_free(&fb);
    ts_tensor_unref(ld), ts_tensor_unref(sm), ts_tensor_unref(loss);
    ts_tensor_unref(x), ts_tensor_unref(y);
    run_free(&r);
}

static void refstep_free(refstep *rs)
{
    for (int i = 0; i < NP; i++)
        free(rs->g[i]), free(rs->gbound[i]);
}

/* ---- the comparisons ----------------------------------------------------------------------- */

/* Fails unless |got - want| <= bound elementwise; returns the largest ratio. */
static double within(const char *what, const char *dev, const double *got, const double *want,
                     const double *bound, int64_t n)
{
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double err = fabs(got[i] - want[i]), b = bound[i] + 1e-37; /* + float32 denormals */
        CHECK_MSG(err <= b, "%s: %s[%lld] = %.9g, float64 reference %.9g, error %.3g > bound "
                  "%.3g", dev, what, (long long)i, got[i], want[i], err, b);
        worst = fmax(worst, err / b);
    }
    return worst;
}

enum { OPT_SGD, OPT_ADAM };

/* One step on plugin dev from pb's weights, checked against the reference; pb's weights then
 * become the plugin's updated ones (float32 values), for the next step. */
static void check_step(ts_device *dev, ts_device *rd, problem *pb, int opt, int step)
{
    const char *name = ts_device_name(dev);
    refstep rs = {0};
    run r = {0};
    ts_tensor *x = input(dev, TS_F32, pb), *y, *loss;
    CHECK_OK(ts_tensor_from_host(dev, TS_I64, 1, (const int64_t[]){B}, pb->y, &y));
    make_params(&r, dev, TS_F32, pb->w);
    forward(&r, x, NULL);
    CHECK_OK(ts_cross_entropy(r.logits, y, TS_REDUCTION_MEAN, &loss));
    CHECK_OK(ts_backward(loss, NULL, 0));

    branches br;
    for (int l = 0; l < 4; l++) {
        br.mask[l] = host(r.z[l]);
        for (int64_t i = 0; i < ts_tensor_numel(r.z[l]); i++)
            br.mask[l][i] = br.mask[l][i] > 0;
    }
    for (int l = 0; l < 2; l++) {
        int64_t n = ts_tensor_numel(r.idx[l]);
        br.idx[l] = malloc((size_t)n * 8);
        CHECK(br.idx[l] && ts_tensor_dtype(r.idx[l]) == TS_I64);
        CHECK_OK(ts_tensor_to_host(r.idx[l], br.idx[l], (size_t)n * 8));
    }
    reference(rd, pb, &br, name, &rs);
    for (int l = 0; l < 4; l++)
        free(br.mask[l]);
    free(br.idx[0]), free(br.idx[1]);

    double *lv = host(loss), worst = 0;
    CHECK_MSG(fabs(lv[0] - rs.loss) <= rs.loss_bound, "%s step %d: loss %.9g, float64 "
              "reference %.9g, error %.3g > bound %.3g", name, step, lv[0], rs.loss,
              fabs(lv[0] - rs.loss), rs.loss_bound);
    diag("%s step %d: loss %.7f, error / bound %.3g", name, step, lv[0],
         fabs(lv[0] - rs.loss) / rs.loss_bound);
    free(lv);

    ts_named_tensor nt[NP];
    double *g32[NP];
    for (int i = 0; i < NP; i++) {
        snprintf(nt[i].name, sizeof nt[i].name, "%s", pname[i]);
        nt[i].tensor = r.p[i];
        g32[i] = grad_host(r.p[i]);
        worst = fmax(worst, within(pname[i], name, g32[i], rs.g[i], rs.gbound[i], pnumel(i)));
    }
    diag("%s step %d: gradients, largest error / bound %.3g", name, step, worst);

    ts_optim *o;
    double lr = opt == OPT_SGD ? 0.05 : 1e-3, eps = 1e-8;
    if (opt == OPT_SGD)
        CHECK_OK(ts_optim_sgd(nt, NP, &(ts_sgd_options){.lr = lr}, &o));
    else
        CHECK_OK(ts_optim_adam(nt, NP, &(ts_adam_options){lr, 0.9, 0.999, eps, 0}, &o));
    CHECK_OK(ts_optim_step(o));
    worst = 0;
    for (int i = 0; i < NP; i++) {
        int64_t n = pnumel(i);
        double *w1 = host(r.p[i]), *want = malloc((size_t)n * 8), *bd = malloc((size_t)n * 8);
        CHECK(want && bd);
        for (int64_t j = 0; j < n; j++) {
            double w = pb->w[i][j], g = rs.g[i][j], eg = rs.gbound[i][j];
            if (opt == OPT_SGD) {
                want[j] = w - lr * g;
                bd[j] = lr * eg + 2 * U * (fabs(w) + lr * fabs(g));
            } else {
                double lo = fmax(fabs(g) - eg, 0) + eps;
                want[j] = w - lr * g / (fabs(g) + eps);
                bd[j] = fmin(lr * eg * eps / (lo * lo), 2 * lr) + 16 * U * (fabs(w) + lr);
            }
        }
        worst = fmax(worst, within(pname[i], name, w1, want, bd, n));
        for (int64_t j = 0; j < n; j++) /* the next step starts from the plugin's weights */
            pb->w[i][j] = w1[j];
        free(w1), free(want), free(bd);
    }
    diag("%s step %d: weights after %s, largest error / bound %.3g", name, step,
         opt == OPT_SGD ? "SGD" : "Adam", worst);
    ts_optim_free(o);
    for (int i = 0; i < NP; i++)
        free(g32[i]);
    ts_tensor_unref(loss), ts_tensor_unref(x), ts_tensor_unref(y);
    run_free(&r);
    refstep_free(&rs);
}

/* A short horizon: 4 SGD steps, each checked from the plugin's own weights, so the bound of
 * every step is that of one step (a difference between plugins never compounds). */
static void test_sgd_steps(void)
{
    ts_device *rd = ref_dev();
    for (const char *const *pl = kt_plugins(); *pl; pl++) {
        ts_device *dev = kt_load(*pl);
        problem pb;
        problem_make(&pb, SEED);
        for (int step = 1; step <= 4; step++)
            check_step(dev, rd, &pb, OPT_SGD, step);
        problem_free(&pb);
        kt_check_no_live_blocks(dev);
    }
    ts_device_unload(rd);
}

static void test_adam_step(void)
{
    ts_device *rd = ref_dev();
    for (const char *const *pl = kt_plugins(); *pl; pl++) {
        ts_device *dev = kt_load(*pl);
        problem pb;
        problem_make(&pb, SEED);
        check_step(dev, rd, &pb, OPT_ADAM, 1);
        problem_free(&pb);
        kt_check_no_live_blocks(dev);
    }
    ts_device_unload(rd);
}

/* The cuda plugin (or the plugin named by $TS_GPU_TEST_DEVICE, to check this harness on a
 * host plugin), same bounds: the plugin keeps cuBLAS at full float32 (no TF32). SKIPs
 * without a GPU. */
static void test_gpu_steps(void)
{
    const char *name = getenv("TS_GPU_TEST_DEVICE");
    name = name && *name ? name : "cuda";
    char *path;
    if (ts_plugin_find(NULL, name, &path) != TS_OK)
        SKIP("the %s plugin is not built", name);
    free(path);
    ts_device *dev;
    ts_status s = ts_device_load(NULL, name, &dev);
    if (s == TS_ENODEV)
        SKIP("no GPU: %s", ts_last_error());
    CHECK_MSG(s == TS_OK, "loading %s: %s", name, ts_last_error());
    ts_device *rd = ref_dev();
    problem pb;
    problem_make(&pb, SEED);
    check_step(dev, rd, &pb, OPT_ADAM, 1);
    problem_free(&pb);
    problem_make(&pb, SEED);
    for (int step = 1; step <= 4; step++)
        check_step(dev, rd, &pb, OPT_SGD, step);
    problem_free(&pb);
    ts_device_unload(rd);
    ts_device_unload(dev);
}

int main(int argc, char **argv)
{
    /* LeakSanitizer's exit-time tracer crashes once oneDNN's primitives have run their threads
     * (tests/plugins/test-onednn.c), so the per-test LSan check is off here; each plugin's
     * pool must still hold no live block after its steps (kt_check_no_live_blocks). */
    setenv("TS_NO_LSAN_CHECK", "1", 1);
    static const tap_test tests[] = {
        TAP_TEST(test_sgd_steps),
        TAP_TEST(test_adam_step),
        TAP_TEST(test_gpu_steps),
    };
    return tap_run(tests, sizeof tests / sizeof tests[0], argc, argv);
}
