/* tools/kernel_cases.c: the kernel-case table (kernel_cases.h) and its runner: operands laid
 * out by the harness (operand.h), the plugin's result against the reference kernels'. */
#include "config.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tessera/tessera.h>

#include "kernel_cases.h"

uint64_t kc_rand(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static ts_status kc_nomem(void)
{
    fprintf(stderr, "tessera: error: out of host memory for the kernel cases\n");
    return TS_ENOMEM;
}

/* The last error's message, or "(no message)". */
static const char *kc_err(void)
{
    const char *m = ts_last_error();
    return m && *m ? m : "(no message)";
}

/* Lays out spec in oph_layout l inside a new device block; fills both host images with the same
 * values (gaps hold 0xA5). */
ts_status kc_make_buf(ts_device *dev, const opspec *sp, oph_layout l, uint64_t *rng, kc_buf *b)
{
    memset(b, 0, sizeof *b);
    int nd = sp->ndim;
    if (sp->contig_only)
        l = OPH_CONTIG;
    if (l == OPH_BCAST && (sp->no_bcast || nd == 0 || sp->shape[0] < 2))
        l = OPH_CONTIG;
    b->nbytes = oph_lay_out(&b->op, sp->dtype, nd, sp->shape, l);
    b->host = malloc(b->nbytes);
    b->ref = malloc(b->nbytes);
    if (!b->host || !b->ref)
        return kc_nomem();
    memset(b->host, 0xA5, b->nbytes);
    int64_t idx[TS_MAX_DIMS] = {0};
    int64_t n = oph_numel(&b->op), bad_at = n > 0 ? (int64_t)(kc_rand(rng) % (uint64_t)n) : -1;
    for (int64_t i = 0; i < n; i++, oph_next(&b->op, idx)) {
        uint64_t r = kc_rand(rng);
        double v;
        int is_float = kc_is_float(sp->dtype) || ts_plugin_dtype_is_half(sp->dtype);
        switch (sp->v) {
        case V_POSITIVE:
            v = is_float ? 0.5 + (double)(r >> 11) * 0x1p-53 * 2 : (double)(1 + r % 9);
            break;
        case V_INDEX:
        case V_BADINDEX:
            v = sp->range > 0 ? (double)(r % (uint64_t)sp->range) : 0;
            if (sp->v == V_BADINDEX && i == bad_at)
                v = (double)sp->range;
            break;
        default:
            if (sp->dtype == TS_U8)
                v = (double)(r & 1);
            else if (is_float)
                v = -2 + (double)(r >> 11) * 0x1p-53 * 4;
            else
                v = (double)(int)(r % 19) - 9;
        }
        oph_set(&b->op, b->host, idx, v);
    }
    memcpy(b->ref, b->host, b->nbytes);
    ts_status s = ts_device_alloc(dev, b->nbytes, "kernel case", &b->dptr);
    if (!s)
        s = ts_device_copy_from_host(dev, b->dptr, b->host, b->nbytes);
    return s;
}

void kc_free_buf(ts_device *dev, kc_buf *b)
{
    ts_device_free(dev, b->dptr);
    free(b->host);
    free(b->ref);
    memset(b, 0, sizeof *b);
}

/* An output that is not float32 (float64, integers, booleans) against the reference kernels
 * in its own dtype: float64 to 1e-9 of 1 + |want|, the others exactly. */
static int close_enough(double a, double b, int32_t dt)
{
    double tol = dt == TS_F64 ? 1e-9 : 0;
    return oph_close(a, b, tol, tol);
}

/* How a float32 result's error is bounded, by op family. */
typedef enum family {
    ELEMENTWISE, /* a few roundings per element: within a few ulps of 1 + |want| */
    SUMS,        /* sums of products of the inputs (matmul, convolution, reductions, pooling,
                  * gathers): within (K + 2) eps of the sum of the terms' magnitudes, which is
                  * the same op on the inputs' magnitudes */
    ROWS         /* nonlinear over a row (softmax, layer norm, cross-entropy): within
                  * (K + 2) eps of 1 + |want| */
} family;

static family family_of(int32_t op)
{
    switch (op) {
    case TS_OP_MATMUL:
    case TS_OP_CONV2D:
    case TS_OP_CONV2D_BWD_DATA:
    case TS_OP_CONV2D_BWD_WEIGHT:
    case TS_OP_REDUCE:
    case TS_OP_INDEX_SELECT:
    case TS_OP_INDEX_ADD:
    case TS_OP_MAXPOOL2D:
    case TS_OP_AVGPOOL2D:
    case TS_OP_MAXPOOL2D_BWD:
    case TS_OP_AVGPOOL2D_BWD:
        return SUMS;
    case TS_OP_LAYER_NORM_BWD: /* its magnitudes from ln_bwd_mag: sums over rows and columns */
    case TS_OP_ATTENTION_BWD:  /* from att_bwd_mag: sums over keys and over queries */
        return SUMS;
    case TS_OP_COPY:
    case TS_OP_CAST:
    case TS_OP_FILL:
    case TS_OP_UNARY:
    case TS_OP_BINARY:
    case TS_OP_BINARY_SCALAR:
    case TS_OP_WHERE:
    case TS_OP_RELU_BACKWARD:
    case TS_OP_SGD_STEP:
    case TS_OP_ADAM_STEP:
        return ELEMENTWISE;
    default: /* softmax, log-softmax, cross-entropy, layer norm; and an op not listed yet */
        return ROWS;
    }
}

/* Operand b's values, densely in row-major order (n doubles, malloc'd), or NULL. */
static double *dense(const kc_buf *b)
{
    int64_t n = oph_numel(&b->op), idx[TS_MAX_DIMS] = {0};
    double *v = malloc((size_t)(n > 0 ? n : 1) * sizeof *v);
    for (int64_t e = 0; v && e < n; e++, oph_next(&b->op, idx))
        v[e] = oph_get(&b->op, b->host, idx);
    return v;
}

/* Layer norm's backward: gx_i = rstd (gw_i - mean(gw) - xhat_i mean(gw xhat)), gw = gy w,
 * xhat = (x - mean) rstd; gweight = sum over rows of gy xhat, gbias of gy. Its terms'
 * magnitudes, per output element (mag[i], as reference64's): rstd (|gw_i| + mean|gw| +
 * |xhat_i| mean|gw xhat|), the sums of |gy xhat| and of |gy|. Its inputs are drawn
 * independently (an rstd that is not x's), so the terms can be far larger than the result.
 * 0, or -1 out of memory. */
static int ln_bwd_mag(const kcase *k, const kc_buf *in, int nin, double **mag)
{
    const ts_layer_norm_params *p = (const void *)k->params;
    const ts_operand *x = &in[1].op;
    int64_t n = oph_numel(x), D = 1;
    for (int d = x->ndim - p->ndim; d < x->ndim; d++)
        D *= x->shape[d];
    int64_t rows = D > 0 ? n / D : 0;
    double *v[5] = {0};
    int rc = -1;
    for (int i = 0; i < nin && i < 5; i++)
        if (!(v[i] = dense(&in[i])))
            goto out;
    for (int o = 0; o < (nin == 5 ? 3 : 1); o++)
        if (!(mag[o] = calloc((size_t)(o ? (D > 0 ? D : 1) : (n > 0 ? n : 1)), sizeof(double))))
            goto out;
    for (int64_t r = 0; r < rows; r++) {
        const double *gy = v[0] + r * D, *xr = v[1] + r * D, mu = v[2][r], rs = v[3][r];
        double sgw = 0, sgwx = 0;
        for (int64_t j = 0; j < D; j++) {
            double gw = fabs(gy[j] * (nin == 5 ? v[4][j] : 1)), xh = fabs((xr[j] - mu) * rs);
            sgw += gw;
            sgwx += gw * xh;
            if (nin == 5) {
                mag[1][j] += fabs(gy[j]) * xh;
                mag[2][j] += fabs(gy[j]);
            }
        }
        for (int64_t j = 0; j < D; j++) {
            double gw = fabs(gy[j] * (nin == 5 ? v[4][j] : 1)), xh = fabs((xr[j] - mu) * rs);
            mag[0][r * D + j] = fabs(rs) * (gw + sgw / (double)D + xh * sgwx / (double)D);
        }
    }
    rc = 0;
out:
    for (int i = 0; i < 5; i++)
        free(v[i]);
    return rc;
}

/* Attention's backward: with P = exp(scale q k^T - lse) (masked) and gs = P (go v^T - delta),
 * delta_i = go_i . o_i: gv = P^T go, gq = scale gs k, gk = scale gs^T q. Its terms'
 * magnitudes, per output element: P |go|, and scale P (|go v^T| + |delta|) times |k| or |q|
 * summed the same way, where each P carries the float32 error of its exponent (a sum of D
 * products) relative to it; that is within (K + 2) u of the bound the runner applies.
 * 0, or -1 out of memory. */
static int att_bwd_mag(const kcase *k, const kc_buf *in, double **mag)
{
    const ts_attention_params *p = (const void *)k->params;
    const ts_operand *q = &in[1].op, *kk = &in[2].op, *v = &in[3].op;
    const int64_t B = q->shape[0], Tq = q->shape[1], D = q->shape[2], Tk = kk->shape[1],
                  Dv = v->shape[2];
    double *x[6] = {0};
    int rc = -1;
    for (int i = 0; i < 6; i++)
        if (!(x[i] = dense(&in[i])))
            goto out;
    const int64_t n[3] = {B * Tq * D, B * Tk * D, B * Tk * Dv};
    for (int o = 0; o < 3; o++)
        if (!(mag[o] = calloc((size_t)(n[o] > 0 ? n[o] : 1), sizeof(double))))
            goto out;
    const double *go = x[0], *qv = x[1], *kv = x[2], *vv = x[3], *ov = x[4], *lse = x[5];
    const double sc = fabs(p->scale);
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < Tq; i++) {
            const double *qi = qv + (b * Tq + i) * D, *goi = go + (b * Tq + i) * Dv;
            double delta = 0;
            for (int64_t e = 0; e < Dv; e++)
                delta += fabs(goi[e] * ov[(b * Tq + i) * Dv + e]);
            for (int64_t j = 0; j < Tk; j++) {
                if (p->causal && j > i + Tk - Tq)
                    continue;
                const double *kj = kv + (b * Tk + j) * D, *vj = vv + (b * Tk + j) * Dv;
                double s = 0, dp = 0;
                for (int64_t d = 0; d < D; d++)
                    s += qi[d] * kj[d];
                for (int64_t e = 0; e < Dv; e++)
                    dp += fabs(goi[e] * vj[e]);
                const double P = exp(p->scale * s - lse[b * Tq + i]);
                const double gs = P * (dp + delta);
                for (int64_t e = 0; e < Dv; e++)
                    mag[2][(b * Tk + j) * Dv + e] += P * fabs(goi[e]);
                for (int64_t d = 0; d < D; d++) {
                    mag[0][(b * Tq + i) * D + d] += sc * gs * fabs(kj[d]);
                    mag[1][(b * Tk + j) * D + d] += sc * gs * fabs(qi[d]);
                }
            }
        }
    rc = 0;
out:
    for (int i = 0; i < 6; i++)
        free(x[i]);
    return rc;
}

/* The float64 reference of k: the reference kernels on copies of the operands (inputs and
 * the outputs' values before the call, from each buffer's host image) in which float32 is
 * float64, laid out densely; mag: on the magnitudes of the float values instead. want[i]
 * receives output i's values in row-major order (numel doubles, malloc'd). 0, or -1 when the
 * reference does not run it so (want untouched). */
static int reference64(const kcase *k, const kc_buf *in, int nin, const kc_buf *out, int nout,
                       int mag, double **want)
{
    ts_operand p[KC_MAX_IN + KC_MAX_OUT];
    void *mem[KC_MAX_IN + KC_MAX_OUT] = {0};
    int n = nin + nout, rc = -1;
    for (int i = 0; i < n; i++) {
        const ts_operand *o = i < nin ? &in[i].op : &out[i - nin].op;
        const unsigned char *img = i < nin ? in[i].host : out[i - nin].host;
        int32_t dt = o->dtype == TS_F32 || ts_plugin_dtype_is_half(o->dtype) ? TS_F64 : o->dtype;
        size_t bytes = oph_lay_out(&p[i], dt, o->ndim, o->shape, OPH_CONTIG);
        if (!(mem[i] = calloc(1, bytes)))
            goto out;
        int64_t idx[TS_MAX_DIMS] = {0}, ne = oph_numel(o);
        for (int64_t e = 0; e < ne; e++, oph_next(o, idx)) {
            double v = oph_get(o, img, idx);
            int fl = kc_is_float(o->dtype) || ts_plugin_dtype_is_half(o->dtype);
            oph_set(&p[i], mem[i], idx, mag && fl ? fabs(v) : v);
        }
        p[i].data = mem[i];
    }
    ts_kernel_call call = {.struct_size = sizeof call, .op = k->op, .ninputs = nin,
                           .noutputs = nout, .inputs = p, .outputs = p + nin,
                           .params = k->params_size ? k->params : NULL,
                           .params_size = k->params_size};
    if (ts_reference_run(&call) != TS_OK) {
        ts_clear_error();
        goto out;
    }
    for (int i = 0; i < nout; i++) {
        int64_t idx[TS_MAX_DIMS] = {0}, ne = oph_numel(&p[nin + i]);
        if (!(want[i] = malloc((size_t)(ne > 0 ? ne : 1) * sizeof(double))))
            goto out;
        for (int64_t e = 0; e < ne; e++, oph_next(&p[nin + i], idx))
            want[i][e] = oph_get(&p[nin + i], mem[nin + i], idx);
    }
    rc = 0;
out:
    for (int i = 0; i < n; i++)
        free(mem[i]);
    return rc;
}

/* The largest element count of k's inputs: a bound on the terms any output element sums. */
static int64_t max_terms(const kc_buf *in, int nin)
{
    int64_t m = 1;
    for (int i = 0; i < nin; i++)
        m = oph_numel(&in[i].op) > m ? oph_numel(&in[i].op) : m;
    return m;
}

/* The tolerance of a float32 result against its float64 reference: want, and for SUMS the
 * same op on the inputs' magnitudes. Four times the bound (K + 2) u (1 + |want|) or
 * (K + 2) u sum|terms|, u the unit roundoff 2^-24: what any summation order of K terms in
 * float32 stays within, whatever the CPU's kernels. */
static double tolerance(int32_t op, family f, int64_t terms, double want, double mag)
{
    /* an optimizer's step: a handful of roundings per element (moments, bias correction,
     * the update) */
    double k = op == TS_OP_SGD_STEP || op == TS_OP_ADAM_STEP ? 4
               : f == ELEMENTWISE                           ? 1
                                                            : (double)terms;
    return 4 * (k + 2) * 0x1p-24 * (f == SUMS ? mag + fabs(want) : 1 + fabs(want));
}

/* Whether the plugin's blocks are host memory: a call it declines (TS_ENOTSUP without a
 * message) runs on the host's reference kernels, as the guide allows. */
static int host_memory_plugin(ts_device *dev)
{
    const ts_plugin_desc *d = ts_device_desc(dev);
    return TS_HAS_MEMBER(d, ts_plugin_desc, flags) && (d->flags & TS_PLUGIN_HOST_MEMORY);
}

/* The plugin's result against the reference kernels' on the same values: float32 outputs
 * against the float64 reference with the derived tolerance (where the reference kernels run
 * the op in float64), the others against the reference in their own dtype. */
int kc_run(ts_device *dev, const kcase *k, oph_layout l, uint64_t seed, char *why,
           size_t whylen)
{
    kc_buf in[KC_MAX_IN], out[KC_MAX_OUT];
    double *want64[KC_MAX_OUT] = {0}, *mag64[KC_MAX_OUT] = {0};
    int nin = 0, nout = 0, r = 0;
    uint64_t rng = seed;
    ts_status s = TS_OK;
    for (; nin < k->nin && !s; nin++)
        s = kc_make_buf(dev, &k->in[nin], l, &rng, &in[nin]);
    for (; nout < k->nout && !s; nout++) {
        opspec o = k->out[nout];
        o.no_bcast = 1;
        s = kc_make_buf(dev, &o, l, &rng, &out[nout]);
    }
    if (s) {
        snprintf(why, whylen, "setting up operands: %s", kc_err());
        goto done;
    }
    ts_operand din[KC_MAX_IN], dout[KC_MAX_OUT], rin[KC_MAX_IN], rout[KC_MAX_OUT];
    for (int i = 0; i < nin; i++) {
        din[i] = rin[i] = in[i].op;
        din[i].data = in[i].dptr;
        rin[i].data = in[i].ref;
    }
    for (int i = 0; i < nout; i++) {
        dout[i] = rout[i] = out[i].op;
        dout[i].data = out[i].dptr;
        rout[i].data = out[i].ref;
    }
    ts_kernel_call call = {.struct_size = sizeof call, .op = k->op, .ninputs = nin,
                           .noutputs = nout, .inputs = din, .outputs = dout,
                           .params = k->params_size ? k->params : NULL,
                           .params_size = k->params_size};
    ts_kernel_call rcall = call;
    rcall.inputs = rin;
    rcall.outputs = rout;
    if (ts_reference_run(&rcall) != TS_OK) {
        r = -1;
        goto done;
    }
    /* float32 outputs against float64: the same op with float32 as float64 */
    const family fam = family_of(k->op);
    const int64_t terms = max_terms(in, nin);
    int have64 = 0;
    for (int i = 0; i < nout; i++)
        have64 |= out[i].op.dtype == TS_F32 || ts_plugin_dtype_is_half(out[i].op.dtype);
    if (have64)
        have64 = reference64(k, in, nin, out, nout, 0, want64) == 0 &&
                 (fam != SUMS || (k->op == TS_OP_LAYER_NORM_BWD ? ln_bwd_mag(k, in, nin, mag64)
                                  : k->op == TS_OP_ATTENTION_BWD
                                      ? att_bwd_mag(k, in, mag64)
                                      : reference64(k, in, nin, out, nout, 1, mag64)) == 0);
    ts_clear_error();
    if ((s = ts_device_run(dev, &call)) || (s = ts_device_synchronize(dev))) {
        if (s == TS_ENOTSUP && host_memory_plugin(dev) && strstr(ts_last_error(), "' declined ")) {
            r = 2; /* declined without a message: the host runs it on its reference kernels */
            snprintf(why, whylen, "%s declined", k->what);
            goto done;
        }
        snprintf(why, whylen, "%s failed: %s: %s", k->what, ts_status_name(s), kc_err());
        goto done;
    }
    for (int i = 0; i < nout; i++) {
        if ((s = ts_device_copy_to_host(dev, out[i].host, out[i].dptr, out[i].nbytes))) {
            snprintf(why, whylen, "copy back: %s", kc_err());
            goto done;
        }
        const ts_operand *o = &out[i].op;
        int64_t idx[TS_MAX_DIMS] = {0}, n = oph_numel(o);
        int f64 = have64 && (o->dtype == TS_F32 || ts_plugin_dtype_is_half(o->dtype));
        for (int64_t e = 0; e < n; e++, oph_next(o, idx)) {
            double got = oph_get(o, out[i].host, idx), want = oph_get(o, out[i].ref, idx);
            double tol = 0;
            if (f64) {
                want = want64[i][e];
                tol = tolerance(k->op, fam, terms, want, fam == SUMS ? mag64[i][e] : 0);
                /* a 16-bit float result: its float32 value rounded once more, half a unit */
                if (o->dtype == TS_BF16)
                    tol += 0x1p-8 * fabs(want) + 0x1p-133;
                else if (o->dtype == TS_F16)
                    tol += 0x1p-11 * fabs(want) + 0x1p-25;
            }
            if (f64 ? !oph_close(got, want, 0, tol) : !close_enough(got, want, o->dtype)) {
                char at[96] = "";
                size_t len = 0;
                for (int d = 0; d < o->ndim; d++)
                    len += (size_t)snprintf(at + len, sizeof at - len, "%s%lld", d ? ", " : "",
                                            (long long)idx[d]);
                if (f64)
                    snprintf(why, whylen, "%s: output %d at (%s) is %.9g, the float64 reference "
                             "says %.9g (off by %.3g, tolerance %.3g)", k->what, i, at, got,
                             want, fabs(got - want), tol);
                else
                    snprintf(why, whylen, "%s: output %d at (%s) is %.9g, the reference says "
                             "%.9g", k->what, i, at, got, want);
                goto done;
            }
        }
        /* Bytes between strided elements and before the offset stay untouched. */
        if (oph_gap_written(o, out[i].host, out[i].nbytes, 0xA5) >= 0) {
            snprintf(why, whylen, "%s: output %d: the kernel wrote bytes outside its elements",
                     k->what, i);
            goto done;
        }
    }
    r = 1;
done:
    for (int i = 0; i < nin; i++)
        kc_free_buf(dev, &in[i]);
    for (int i = 0; i < nout; i++) {
        kc_free_buf(dev, &out[i]);
        free(want64[i]);
        free(mag64[i]);
    }
    return r;
}

opspec kc_spec(int32_t dt, int nd, const int64_t *shape)
{
    opspec o = {.dtype = dt, .ndim = nd};
    for (int d = 0; d < nd; d++)
        o.shape[d] = shape[d];
    return o;
}


void kc_set_params(kcase *k, const void *p, size_t n)
{
    memcpy(k->params, p, n);
    k->params_size = (uint32_t)n;
}


kcase *kc_add(caselist *l, int32_t op, const char *fmt, ...)
{
    static kcase dummy;
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        kcase *v = realloc(l->v, (size_t)cap * sizeof *v);
        if (!v)
            return memset(&dummy, 0, sizeof dummy);
        l->v = v;
        l->cap = cap;
    }
    kcase *k = &l->v[l->n++];
    memset(k, 0, sizeof *k);
    k->op = op;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(k->what, sizeof k->what, fmt, ap);
    va_end(ap);
    return k;
}

static const struct {
    int nd;
    int64_t shape[3];
} eshapes[] = {{0, {0}}, {1, {7}}, {2, {3, 5}}, {3, {2, 3, 4}}, {2, {0, 3}}};

int kc_is_float(int32_t dt)
{
    return dt == TS_F32 || dt == TS_F64;
}

/* The minor ABI of the plugin under test (set by kc_build): functions added after it are not
 * its to run; and the device, whose claims decide which 16-bit float inputs a comparison
 * takes. */
static int plugin_minor = TS_PLUGIN_ABI_MINOR;
static ts_device *plugin_dev;

/* ---- the case table: one builder per op family ------------------------------------------ */
/* Each builder adds the cases of op for output dtype dt: shapes (scalars and empty tensors
 * included), every function of the op, params variants, input dtypes. A new op gets a
 * builder and a row (docs/architecture.md, "Adding an op"). */

static void cases_elementwise_unary(int32_t op, int32_t dt, caselist *l)
{
    const char *dn = ts_dtype_name(dt);
    kcase *k;
    for (size_t si = 0; si < sizeof eshapes / sizeof eshapes[0]; si++) {
        opspec o = kc_spec(dt, eshapes[si].nd, eshapes[si].shape);
        if (op == TS_OP_COPY) {
            k = kc_add(l, op, "copy %s %dd", dn, o.ndim);
            k->nin = k->nout = 1;
            k->in[0] = k->out[0] = o;
        } else if (op == TS_OP_CAST) {
            for (int32_t from = 0; from < TS_DTYPE_COUNT; from++) {
                if (ts_plugin_dtype_minor(from) > plugin_minor)
                    continue; /* a dtype after the plugin's minor: never sent to it */
                k = kc_add(l, op, "cast %s -> %s %dd", ts_dtype_name(from), dn, o.ndim);
                k->nin = k->nout = 1;
                k->in[0] = kc_spec(from, o.ndim, o.shape);
                k->out[0] = o;
            }
        } else if (op == TS_OP_FILL) {
            ts_fill_params p = {kc_is_float(dt) || ts_plugin_dtype_is_half(dt) ? 2.5
                                : dt == TS_U8                   ? 1
                                                                : -3};
            k = kc_add(l, op, "fill %s %dd", dn, o.ndim);
            k->nout = 1;
            k->out[0] = o;
            kc_set_params(k, &p, sizeof p);
        } else {
            for (int fn = 0; fn < TS_UNARY_COUNT; fn++) {
                if (ts_plugin_call_minor(op, fn) > plugin_minor)
                    continue; /* added after the plugin's minor: never sent to it */
                ts_unary_params p = {fn};
                k = kc_add(l, op, "unary %s %s %dd", ts_fn_name(op, fn), dn, o.ndim);
                k->nin = k->nout = 1;
                k->in[0] = k->out[0] = o;
                if (fn == TS_UNARY_LOG || fn == TS_UNARY_SQRT || fn == TS_UNARY_RSQRT)
                    k->in[0].v = V_POSITIVE;
                kc_set_params(k, &p, sizeof p);
            }
        }
    }
}

/* g and x of out's shape; random x has both signs. */
static void cases_relu_backward(int32_t op, int32_t dt, caselist *l)
{
    const char *dn = ts_dtype_name(dt);
    kcase *k;
    if (!kc_is_float(dt) && !ts_plugin_dtype_is_half(dt))
        return;
    for (size_t si = 1; si < sizeof eshapes / sizeof eshapes[0]; si++) {
        opspec o = kc_spec(dt, eshapes[si].nd, eshapes[si].shape);
        k = kc_add(l, op, "relu_backward %s %dd", dn, o.ndim);
        k->nin = 2;
        k->nout = 1;
        k->in[0] = k->in[1] = k->out[0] = o;
    }
}

static void cases_binary(int32_t op, int32_t dt, caselist *l)
{
    const char *dn = ts_dtype_name(dt);
    kcase *k;
    for (size_t si = 1; si < sizeof eshapes / sizeof eshapes[0]; si++) {
        opspec o = kc_spec(dt, eshapes[si].nd, eshapes[si].shape);
        if (op == TS_OP_WHERE) {
            k = kc_add(l, op, "where %s %dd", dn, o.ndim);
            k->nin = 3;
            k->nout = 1;
            k->in[0] = kc_spec(TS_U8, o.ndim, o.shape);
            k->in[1] = k->in[2] = k->out[0] = o;
            continue;
        }
        for (int fn = 0; fn < TS_BINARY_COUNT; fn++) {
            if (ts_plugin_call_minor(op, fn) > plugin_minor)
                continue; /* added after the plugin's minor: never sent to it */
            int cmp = fn >= TS_BINARY_EQ;
            int32_t from_list[TS_DTYPE_COUNT];
            int nfrom = 0;
            if (cmp && dt != TS_U8)
                continue;
            if (cmp) {
                for (int32_t f = 0; f < TS_DTYPE_COUNT; f++)
                    if (ts_plugin_dtype_minor(f) <= plugin_minor && /* else never sent to it */
                        (!ts_plugin_dtype_is_half(f) || !plugin_dev ||
                         ts_device_supports(plugin_dev, op, f))) /* nor these, unclaimed */
                        from_list[nfrom++] = f;
            } else {
                from_list[nfrom++] = dt;
            }
            for (int fi = 0; fi < nfrom; fi++) {
                opspec a = kc_spec(from_list[fi], o.ndim, o.shape);
                if (fn == TS_BINARY_POW || fn == TS_BINARY_DIV)
                    a.v = V_POSITIVE;
                if (op == TS_OP_BINARY) {
                    k = kc_add(l, op, "binary %s %s -> %s %dd", ts_fn_name(op, fn),
                            ts_dtype_name(from_list[fi]), dn, o.ndim);
                    k->nin = 2;
                    k->nout = 1;
                    k->in[0] = k->in[1] = a;
                    k->in[0].v = fn == TS_BINARY_POW ? V_POSITIVE : V_RANDOM;
                    k->out[0] = o;
                    ts_binary_params p = {fn};
                    kc_set_params(k, &p, sizeof p);
                } else {
                    for (int first = 0; first < 2; first++) {
                        k = kc_add(l, op, "scalar %s%s %s -> %s %dd", ts_fn_name(op, fn),
                                first ? " (scalar first)" : "",
                                ts_dtype_name(from_list[fi]), dn, o.ndim);
                        k->nin = k->nout = 1;
                        k->in[0] = a;
                        k->in[0].v = fn == TS_BINARY_POW || (fn == TS_BINARY_DIV && first)
                                         ? V_POSITIVE : V_RANDOM;
                        k->out[0] = o;
                        ts_scalar_params p = {fn, first,
                                              kc_is_float(from_list[fi]) ? 1.5 : 3};
                        kc_set_params(k, &p, sizeof p);
                    }
                }
            }
        }
    }
}

static void cases_reduce(int32_t op, int32_t dt, caselist *l)
{
    const char *dn = ts_dtype_name(dt);
    kcase *k;
    static const struct {
        int nd;
        int64_t in[3], out[3];
    } rs[] = {{3, {4, 5, 6}, {4, 1, 6}}, {3, {4, 5, 6}, {1, 1, 1}}, {3, {4, 5, 6}, {4, 5, 1}},
              {1, {7}, {1}}, {2, {3, 4}, {1, 4}}};
    for (size_t i = 0; i < sizeof rs / sizeof rs[0]; i++)
        for (int fn = 0; fn < TS_REDUCE_COUNT; fn++) {
            if (ts_plugin_call_minor(op, fn) > plugin_minor)
                continue;
            int arg = fn == TS_REDUCE_ARGMAX || fn == TS_REDUCE_ARGMIN;
            if (arg != (dt == TS_I64))
                continue;
            int dim = -1, nred = 0;
            for (int d = 0; d < rs[i].nd; d++)
                if (rs[i].out[d] == 1 && rs[i].in[d] != 1)
                    dim = d, nred++;
            if (arg && nred != 1)
                continue;
            int32_t from_list[3] = {dt, TS_F32, TS_F64};
            for (int fi = 0; fi < (arg ? 3 : 1); fi++) {
                if (arg && fi == 0)
                    continue;
                k = kc_add(l, op, "reduce %s %s -> %s %dd", ts_fn_name(op, fn),
                        ts_dtype_name(from_list[fi]), dn, rs[i].nd);
                k->nin = k->nout = 1;
                k->in[0] = kc_spec(from_list[fi], rs[i].nd, rs[i].in);
                k->out[0] = kc_spec(dt, rs[i].nd, rs[i].out);
                ts_reduce_params p = {fn, dim < 0 ? 0 : dim};
                kc_set_params(k, &p, sizeof p);
            }
        }
}

static void cases_matmul(int32_t op, int32_t dt, caselist *l)
{
    const char *dn = ts_dtype_name(dt);
    kcase *k;
    static const struct {
        int nd;
        int64_t a[3], b[3], c[3];
        int bcast_b;
    } ms[] = {{2, {3, 4}, {4, 5}, {3, 5}, 0}, {2, {1, 7}, {7, 1}, {1, 1}, 0},
              {2, {17, 33}, {33, 9}, {17, 9}, 0}, {3, {2, 3, 4}, {2, 4, 5}, {2, 3, 5}, 0},
              {3, {3, 2, 6}, {3, 6, 4}, {3, 2, 4}, 1}};
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
        for (int ab = 0; ab < 2; ab++) {
            k = kc_add(l, op, "matmul %s %dd %lldx%lldx%lld%s%s", dn, ms[i].nd,
                    (long long)ms[i].a[ms[i].nd - 2], (long long)ms[i].a[ms[i].nd - 1],
                    (long long)ms[i].b[ms[i].nd - 1], ab ? " alpha 0.5 beta 2" : "",
                    ms[i].bcast_b ? " broadcast batch" : "");
            k->nin = 2;
            k->nout = 1;
            k->in[0] = kc_spec(dt, ms[i].nd, ms[i].a);
            k->in[1] = kc_spec(dt, ms[i].nd, ms[i].b);
            k->in[0].no_bcast = 1;
            k->in[1].no_bcast = !ms[i].bcast_b;
            k->out[0] = kc_spec(dt, ms[i].nd, ms[i].c);
            ts_matmul_params p = {ab ? 0.5 : 1, ab ? 2 : 0};
            kc_set_params(k, &p, sizeof p);
        }
}

/* Softmax, log-softmax and softmax's gradient (y and g of out's shape) along each dim,
 * strided rows included. */
static void cases_softmax(int32_t op, int32_t dt, caselist *l)
{
    const char *dn = ts_dtype_name(dt);
    kcase *k;
    static const struct {
        int nd;
        int64_t s[3];
        int dim;
    } ss[] = {{2, {4, 7}, 1}, {2, {4, 7}, 0}, {3, {2, 3, 5}, 1}, {1, {9}, 0}, {2, {3, 33}, -1}};
    for (size_t i = 0; i < sizeof ss / sizeof ss[0]; i++) {
        k = kc_add(l, op, "%s %s %dd dim %d", ts_plugin_op_name(op), dn, ss[i].nd, ss[i].dim);
        k->nin = op == TS_OP_SOFTMAX_BWD ? 2 : 1;
        k->nout = 1;
        k->in[0] = k->in[1] = k->out[0] = kc_spec(dt, ss[i].nd, ss[i].s);
        ts_dim_params p = {ss[i].dim};
        kc_set_params(k, &p, sizeof p);
    }
}

static void cases_index(int32_t op, int32_t dt, caselist *l)
{
    const char *dn = ts_dtype_name(dt);
    kcase *k;
    for (int dim = 0; dim < 2; dim++)
        for (int32_t it = TS_I32; it <= TS_I64; it++) {
            int64_t src[2] = {5, 4}, dst[2] = {5, 4}, nidx = dim ? 6 : 3;
            (op == TS_OP_INDEX_SELECT ? dst : src)[dim] = nidx;
            k = kc_add(l, op, "%s %s dim %d %s indices",
                    op == TS_OP_INDEX_SELECT ? "index_select" : "index_add", dn, dim,
                    ts_dtype_name(it));
            k->nin = 2;
            k->nout = 1;
            k->in[0] = kc_spec(dt, 2, src);
            k->in[1] = kc_spec(it, 1, &nidx);
            k->in[1].v = V_INDEX;
            k->in[1].range = (op == TS_OP_INDEX_SELECT ? src : dst)[dim];
            k->in[1].no_bcast = 1;
            k->out[0] = kc_spec(dt, 2, dst);
            ts_dim_params p = {dim};
            kc_set_params(k, &p, sizeof p);
        }
}

static void cases_conv2d(int32_t op, int32_t dt, caselist *l)
{
    const char *dn = ts_dtype_name(dt);
    kcase *k;
    static const struct {
        int64_t N, C, H, W, K, R, S;
        ts_conv2d_params p;
        int bias;
    } cs[] = {{2, 3, 7, 7, 4, 3, 3, {1, 1, 1, 1, 1, 1, 1}, 1},
              {2, 3, 8, 7, 4, 3, 2, {2, 2, 0, 1, 1, 1, 1}, 0},
              {1, 4, 6, 6, 4, 3, 3, {1, 1, 1, 1, 1, 1, 2}, 1},
              {1, 2, 9, 9, 3, 3, 3, {1, 1, 2, 2, 2, 2, 1}, 0},
              {3, 1, 5, 5, 2, 1, 1, {1, 1, 0, 0, 1, 1, 1}, 1}};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        const ts_conv2d_params *p = &cs[i].p;
        int64_t P = (cs[i].H + 2 * p->pad_h - p->dilation_h * (cs[i].R - 1) - 1) / p->stride_h + 1;
        int64_t Q = (cs[i].W + 2 * p->pad_w - p->dilation_w * (cs[i].S - 1) - 1) / p->stride_w + 1;
        int64_t x[4] = {cs[i].N, cs[i].C, cs[i].H, cs[i].W};
        int64_t w[4] = {cs[i].K, cs[i].C / p->groups, cs[i].R, cs[i].S};
        int64_t y[4] = {cs[i].N, cs[i].K, P, Q}, b[1] = {cs[i].K};
        k = kc_add(l, op, "%s %s x (%lld, %lld, %lld, %lld) w (%lld, %lld, %lld, %lld) stride "
                "%d pad %d dilation %d groups %d",
                op == TS_OP_CONV2D ? "conv2d" : op == TS_OP_CONV2D_BWD_DATA
                                                    ? "conv2d_bwd_data" : "conv2d_bwd_weight",
                dn, (long long)x[0], (long long)x[1], (long long)x[2], (long long)x[3],
                (long long)w[0], (long long)w[1], (long long)w[2], (long long)w[3],
                (int)p->stride_h, (int)p->pad_h, (int)p->dilation_h, (int)p->groups);
        k->nout = 1;
        if (op == TS_OP_CONV2D) {
            k->nin = cs[i].bias ? 3 : 2;
            k->in[0] = kc_spec(dt, 4, x);
            k->in[1] = kc_spec(dt, 4, w);
            k->in[2] = kc_spec(dt, 1, b);
            k->out[0] = kc_spec(dt, 4, y);
        } else {
            k->nin = 2;
            k->in[0] = kc_spec(dt, 4, y);
            k->in[1] = op == TS_OP_CONV2D_BWD_DATA ? kc_spec(dt, 4, w) : kc_spec(dt, 4, x);
            k->out[0] = op == TS_OP_CONV2D_BWD_DATA ? kc_spec(dt, 4, x) : kc_spec(dt, 4, w);
        }
        for (int j = 0; j < k->nin; j++)
            k->in[j].no_bcast = 1;
        kc_set_params(k, p, sizeof *p);
    }
}

static void cases_pool2d(int32_t op, int32_t dt, caselist *l)
{
    const char *dn = ts_dtype_name(dt);
    kcase *k;
    static const ts_pool2d_params ps[] = {{2, 2, 2, 2, 0, 0, 0}, {3, 3, 2, 2, 1, 1, 0},
                                          {3, 3, 2, 2, 1, 1, 1}, {2, 3, 1, 2, 0, 1, 1}};
    int fwd = op == TS_OP_MAXPOOL2D || op == TS_OP_AVGPOOL2D;
    int max = op == TS_OP_MAXPOOL2D || op == TS_OP_MAXPOOL2D_BWD;
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) {
        const ts_pool2d_params *p = &ps[i];
        if (max && p->count_include_pad)
            continue;
        int64_t H = 7, W = 6;
        int64_t P = (H + 2 * p->pad_h - p->kernel_h) / p->stride_h + 1;
        int64_t Q = (W + 2 * p->pad_w - p->kernel_w) / p->stride_w + 1;
        int64_t x[4] = {2, 3, H, W}, y[4] = {2, 3, P, Q};
        for (int with_idx = 0; with_idx < (op == TS_OP_MAXPOOL2D ? 2 : 1); with_idx++) {
            if (op == TS_OP_MAXPOOL2D && dt == TS_I64)
                break;
            k = kc_add(l, op, "%s%s %s kernel %dx%d stride %d pad %d%s%s",
                    max ? "maxpool2d" : "avgpool2d", fwd ? "" : " backward", dn, (int)p->kernel_h,
                    (int)p->kernel_w, (int)p->stride_h, (int)p->pad_h,
                    with_idx ? " with indices" : "",
                    p->count_include_pad ? " count_include_pad" : "");
            if (fwd) {
                k->nin = 1;
                k->nout = 1 + with_idx;
                k->in[0] = kc_spec(dt, 4, x);
                k->out[0] = kc_spec(dt, 4, y);
                k->out[1] = kc_spec(TS_I64, 4, y);
            } else {
                k->nin = max ? 2 : 1;
                k->nout = 1;
                k->in[0] = kc_spec(dt, 4, y);
                k->in[1] = kc_spec(TS_I64, 4, y);
                k->in[1].v = V_INDEX;
                k->in[1].range = H * W;
                k->out[0] = kc_spec(dt, 4, x);
            }
            k->in[0].no_bcast = k->in[1].no_bcast = 1;
            kc_set_params(k, p, sizeof *p);
        }
    }
}

static void cases_cross_entropy(int32_t op, int32_t dt, caselist *l)
{
    const char *dn = ts_dtype_name(dt);
    kcase *k;
    for (int32_t it = TS_I32; it <= TS_I64; it++)
        for (int64_t C = 3; C <= 11; C += 8) {
            int64_t lg[2] = {5, C}, n = 5;
            k = kc_add(l, op, "%s %s (5, %lld) %s targets",
                    op == TS_OP_CROSS_ENTROPY ? "cross_entropy" : "cross_entropy_bwd", dn,
                    (long long)C, ts_dtype_name(it));
            k->in[0] = kc_spec(dt, 2, lg);
            k->in[1] = kc_spec(it, 1, &n);
            k->in[1].v = V_INDEX;
            k->in[1].range = C;
            k->in[1].no_bcast = 1;
            if (op == TS_OP_CROSS_ENTROPY) {
                k->nin = 2;
                k->out[0] = kc_spec(dt, 1, &n);
            } else {
                k->nin = 3;
                k->in[2] = kc_spec(dt, 1, &n);
                k->out[0] = kc_spec(dt, 2, lg);
            }
            k->nout = 1;
        }
}

static void cases_optimizer(int32_t op, int32_t dt, caselist *l)
{
    const char *dn = ts_dtype_name(dt);
    kcase *k;
    int64_t n = 37;
    for (int v = 0; v < 4; v++) {
        k = kc_add(l, op, "%s %s variant %d", op == TS_OP_SGD_STEP ? "sgd_step" : "adam_step", dn,
                v);
        k->nin = 1;
        k->in[0] = kc_spec(dt, 1, &n);
        k->in[0].contig_only = 1;
        if (op == TS_OP_SGD_STEP) {
            ts_sgd_params p = {0.1, v ? 0.9 : 0, v == 2 ? 0.1 : 0, v >= 2 ? 0.01 : 0,
                               v == 3, v == 1};
            k->nout = v ? 2 : 1;
            kc_set_params(k, &p, sizeof p);
        } else {
            ts_adam_params p = {0.01, 0.9, 0.999, 1e-8, v >= 2 ? 0.01 : 0, v == 3, 1 + v};
            k->nout = 3;
            kc_set_params(k, &p, sizeof p);
        }
        for (int j = 0; j < k->nout; j++) {
            k->out[j] = kc_spec(dt, 1, &n);
            k->out[j].contig_only = 1;
        }
        if (op == TS_OP_ADAM_STEP)
            k->out[2].v = V_POSITIVE;
    }
}

/* Layer norm and its backward: contiguous operands (the ABI promises them), one and two
 * normalized dims, with and without the affine parameters. */
static void cases_layer_norm(int32_t op, int32_t dt, caselist *l)
{
    const char *dn = ts_dtype_name(dt);
    kcase *k;
    if (!kc_is_float(dt) && !ts_plugin_dtype_is_half(dt))
        return;
    static const struct {
        int nd, norm;
        int64_t s[3];
    } ls[] = {{2, 1, {4, 7}}, {3, 1, {2, 3, 5}}, {3, 2, {2, 3, 5}}, {2, 1, {1, 9}}, {1, 1, {6}}};
    for (size_t i = 0; i < sizeof ls / sizeof ls[0]; i++)
        for (int affine = 0; affine < 2; affine++) {
            int lead = ls[i].nd - ls[i].norm;
            const int64_t *tail = ls[i].s + lead;
            k = kc_add(l, op, "%s %s %dd over %d dims%s",
                    op == TS_OP_LAYER_NORM ? "layer_norm" : "layer_norm_bwd", dn, ls[i].nd,
                    ls[i].norm, affine ? " affine" : "");
            opspec x = kc_spec(dt, ls[i].nd, ls[i].s), row = kc_spec(dt, lead, ls[i].s),
                   col = kc_spec(dt, ls[i].norm, tail);
            x.contig_only = row.contig_only = col.contig_only = 1;
            if (op == TS_OP_LAYER_NORM) {
                k->nin = affine ? 3 : 1;
                k->in[0] = x;
                k->in[1] = k->in[2] = col;
                k->nout = 3;
                k->out[0] = x;
                k->out[1] = k->out[2] = row;
            } else {
                k->nin = affine ? 5 : 4;
                k->in[0] = k->in[1] = x;
                k->in[2] = k->in[3] = row;
                k->in[3].v = V_POSITIVE; /* rstd */
                k->in[4] = col;
                k->nout = affine ? 3 : 1;
                k->out[0] = x;
                k->out[1] = k->out[2] = col;
            }
            ts_layer_norm_params p = {1e-5, ls[i].norm};
            kc_set_params(k, &p, sizeof p);
        }
}

/* Attention and its backward: contiguous (B, T, D) operands (the ABI promises them), causal
 * and not, more keys than queries, D != Dv, a single row, no queries. The row statistics
 * (lse) are float32 beside 16-bit operands; the backward's are drawn positive, its o and go
 * at random (the arithmetic is the same whatever they are). */
static void cases_attention(int32_t op, int32_t dt, caselist *l)
{
    if (!kc_is_float(dt) && !ts_plugin_dtype_is_half(dt))
        return;
    const int32_t sdt = dt == TS_F64 ? TS_F64 : TS_F32;
    static const struct {
        int64_t B, Tq, Tk, D, Dv;
        int causal;
    } as[] = {{2, 3, 3, 4, 4, 1}, {1, 5, 5, 3, 2, 0}, {2, 2, 6, 4, 3, 1}, {1, 1, 1, 2, 2, 1},
              {3, 9, 9, 8, 8, 1}, {1, 4, 7, 5, 5, 0}, {2, 0, 3, 2, 2, 1}};
    for (size_t i = 0; i < sizeof as / sizeof as[0]; i++) {
        const int64_t B = as[i].B, Tq = as[i].Tq, Tk = as[i].Tk, D = as[i].D, Dv = as[i].Dv;
        kcase *k = kc_add(l, op, "%s %s B %lld Tq %lld Tk %lld D %lld Dv %lld%s",
                          op == TS_OP_ATTENTION ? "attention" : "attention_bwd",
                          ts_dtype_name(dt), (long long)B, (long long)Tq, (long long)Tk,
                          (long long)D, (long long)Dv, as[i].causal ? " causal" : "");
        opspec q = kc_spec(dt, 3, (const int64_t[]){B, Tq, D});
        opspec kk = kc_spec(dt, 3, (const int64_t[]){B, Tk, D});
        opspec v = kc_spec(dt, 3, (const int64_t[]){B, Tk, Dv});
        opspec o = kc_spec(dt, 3, (const int64_t[]){B, Tq, Dv});
        opspec lse = kc_spec(sdt, 2, (const int64_t[]){B, Tq});
        q.contig_only = kk.contig_only = v.contig_only = o.contig_only = lse.contig_only = 1;
        if (op == TS_OP_ATTENTION) {
            k->nin = 3;
            k->in[0] = q, k->in[1] = kk, k->in[2] = v;
            k->nout = 2;
            k->out[0] = o, k->out[1] = lse;
        } else {
            k->nin = 6;
            k->in[0] = o, k->in[1] = q, k->in[2] = kk, k->in[3] = v, k->in[4] = o;
            k->in[5] = lse;
            k->in[5].v = V_POSITIVE;
            k->nout = 3;
            k->out[0] = q, k->out[1] = kk, k->out[2] = v;
        }
        ts_attention_params p = {0.5, as[i].causal};
        kc_set_params(k, &p, sizeof p);
    }
}

static const struct {
    int32_t op;
    void (*build)(int32_t op, int32_t dt, caselist *l);
} case_table[] = {
    {TS_OP_COPY, cases_elementwise_unary},
    {TS_OP_CAST, cases_elementwise_unary},
    {TS_OP_FILL, cases_elementwise_unary},
    {TS_OP_UNARY, cases_elementwise_unary},
    {TS_OP_RELU_BACKWARD, cases_relu_backward},
    {TS_OP_BINARY, cases_binary},
    {TS_OP_BINARY_SCALAR, cases_binary},
    {TS_OP_WHERE, cases_binary},
    {TS_OP_REDUCE, cases_reduce},
    {TS_OP_MATMUL, cases_matmul},
    {TS_OP_SOFTMAX, cases_softmax},
    {TS_OP_LOG_SOFTMAX, cases_softmax},
    {TS_OP_SOFTMAX_BWD, cases_softmax},
    {TS_OP_INDEX_SELECT, cases_index},
    {TS_OP_INDEX_ADD, cases_index},
    {TS_OP_CONV2D, cases_conv2d},
    {TS_OP_CONV2D_BWD_DATA, cases_conv2d},
    {TS_OP_CONV2D_BWD_WEIGHT, cases_conv2d},
    {TS_OP_MAXPOOL2D, cases_pool2d},
    {TS_OP_AVGPOOL2D, cases_pool2d},
    {TS_OP_MAXPOOL2D_BWD, cases_pool2d},
    {TS_OP_AVGPOOL2D_BWD, cases_pool2d},
    {TS_OP_CROSS_ENTROPY, cases_cross_entropy},
    {TS_OP_CROSS_ENTROPY_BWD, cases_cross_entropy},
    {TS_OP_SGD_STEP, cases_optimizer},
    {TS_OP_ADAM_STEP, cases_optimizer},
    {TS_OP_LAYER_NORM, cases_layer_norm},
    {TS_OP_LAYER_NORM_BWD, cases_layer_norm},
    {TS_OP_ATTENTION, cases_attention},
    {TS_OP_ATTENTION_BWD, cases_attention},
};

/* The cases for op with output dtype dt (none for an op without a row). */
void kc_build(ts_device *dev, int32_t op, int32_t dt, caselist *l)
{
    plugin_minor = dev ? (int)ts_device_desc(dev)->abi_minor : TS_PLUGIN_ABI_MINOR;
    plugin_dev = dev;
    for (size_t i = 0; i < sizeof case_table / sizeof case_table[0]; i++)
        if (case_table[i].op == op)
            case_table[i].build(op, dt, l);
}
