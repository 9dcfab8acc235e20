/* tools/plugin_check_kernels.c: the kernel suites of `tessera plugin-check`: every claimed
 * (op, dtype) at its cases (from the case table below: one builder per op family) in five
 * layouts against the reference kernels, the error paths, and the claimed kernels run from
 * several threads at once. Operands come from the operand harness (operand.h) that the kernel
 * tests (tests/plugins/kt.c) use too. */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "operand.h"
#include "plugin_check.h"

/* ---- kernels --------------------------------------------------------------------------- */

typedef oph_layout layout;
#define L_CONTIG OPH_CONTIG
#define L_BCAST OPH_BCAST
#define L_NLAYOUTS OPH_NLAYOUTS

/* How an operand's values are drawn. */
typedef enum values {
    V_RANDOM,   /* floats in [-2, 2), ints in [-9, 9], u8 {0, 1} */
    V_POSITIVE, /* floats in [0.5, 2.5), ints in [1, 9] */
    V_INDEX,    /* ints in [0, range) */
    V_BADINDEX  /* like V_INDEX with one element == range (out of range) */
} values;

typedef struct opspec {
    int32_t dtype;
    int ndim;
    int64_t shape[TS_MAX_DIMS];
    values v;
    int64_t range;
    int contig_only; /* optimizer operands: the ABI promises contiguous */
    int no_bcast;    /* outputs, indices, operands whose every dim matters */
} opspec;

typedef struct kcase {
    int32_t op;
    int nin, nout;
    opspec in[5], out[3];
    unsigned char params[96];
    uint32_t params_size;
    char what[160];
} kcase;

/* One operand on the device and its twin in host memory for the reference. */
typedef struct buf {
    void *dptr;        /* device block */
    unsigned char *host, *ref; /* host images of the block: uploaded / reference */
    size_t nbytes;
    ts_operand op;     /* layout inside the block (data filled per side) */
} buf;

/* Lays out spec in layout l inside a new device block; fills both host images with the same
 * values (gaps hold 0xA5). */
static ts_status make_buf(checker *c, const opspec *sp, layout l, uint64_t *rng, buf *b)
{
    memset(b, 0, sizeof *b);
    int nd = sp->ndim;
    if (sp->contig_only)
        l = L_CONTIG;
    if (l == L_BCAST && (sp->no_bcast || nd == 0 || sp->shape[0] < 2))
        l = L_CONTIG;
    b->nbytes = oph_lay_out(&b->op, sp->dtype, nd, sp->shape, l);
    b->host = malloc(b->nbytes);
    b->ref = malloc(b->nbytes);
    if (!b->host || !b->ref)
        return pc_nomem();
    memset(b->host, 0xA5, b->nbytes);
    int64_t idx[TS_MAX_DIMS] = {0};
    int64_t n = oph_numel(&b->op), bad_at = n > 0 ? (int64_t)(pc_rand(rng) % (uint64_t)n) : -1;
    for (int64_t i = 0; i < n; i++, oph_next(&b->op, idx)) {
        uint64_t r = pc_rand(rng);
        double v;
        int is_float = sp->dtype == TS_F32 || sp->dtype == TS_F64;
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
    ts_status s = ts_device_alloc(c->dev, b->nbytes, "plugin-check", &b->dptr);
    if (!s)
        s = ts_device_copy_from_host(c->dev, b->dptr, b->host, b->nbytes);
    return s;
}

static void free_buf(checker *c, buf *b)
{
    ts_device_free(c->dev, b->dptr);
    free(b->host);
    free(b->ref);
    memset(b, 0, sizeof *b);
}

static double rtol_for(int32_t dt)
{
    return dt == TS_F32 ? 2e-4 : dt == TS_F64 ? 1e-9 : 0;
}

/* Relative to 1 + |want|: plugin-check's tolerance, looser than the kernel tests' (its
 * reference is the float kernels themselves, not a float64 computation). */
static int close_enough(double a, double b, int32_t dt)
{
    double tol = rtol_for(dt);
    return oph_close(a, b, tol, tol);
}

/* Runs one case on the plugin and on the reference, with operand values drawn from seed.
 * 1 agree, 0 differ (why filled), -1 the reference does not do this combination (skipped).
 * Reads c only: several threads may run cases at once. */
/* Whether the plugin's blocks are host memory: a call it declines (TS_ENOTSUP without a
 * message) runs on the host's reference kernels, as the guide allows. */
static int host_memory_plugin(checker *c)
{
    const ts_plugin_desc *d = ts_device_desc(c->dev);
    return TS_HAS_MEMBER(d, ts_plugin_desc, flags) && (d->flags & TS_PLUGIN_HOST_MEMORY);
}

/* One case on the plugin against the reference: 1 agrees, 0 fails (why says how), -1 the
 * reference does not do it, 2 declined by a host-memory plugin. */
static int run_case_seeded(checker *c, const kcase *k, layout l, uint64_t seed, char *why,
                           size_t whylen)
{
    buf in[5], out[3];
    int nin = 0, nout = 0, r = 0;
    uint64_t rng = seed;
    ts_status s = TS_OK;
    for (; nin < k->nin && !s; nin++)
        s = make_buf(c, &k->in[nin], l, &rng, &in[nin]);
    for (; nout < k->nout && !s; nout++) {
        opspec o = k->out[nout];
        o.no_bcast = 1;
        s = make_buf(c, &o, l, &rng, &out[nout]);
    }
    if (s) {
        snprintf(why, whylen, "setting up operands: %s", pc_err());
        goto done;
    }
    ts_operand din[5], dout[3], rin[5], rout[3];
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
    ts_clear_error();
    if ((s = ts_device_run(c->dev, &call)) || (s = ts_device_synchronize(c->dev))) {
        if (s == TS_ENOTSUP && host_memory_plugin(c) && strstr(ts_last_error(), "' declined ")) {
            r = 2; /* declined without a message: the host runs it on its reference kernels */
            snprintf(why, whylen, "%s declined", k->what);
            goto done;
        }
        snprintf(why, whylen, "%s failed: %s: %s", k->what, ts_status_name(s), pc_err());
        goto done;
    }
    for (int i = 0; i < nout; i++) {
        if ((s = ts_device_copy_to_host(c->dev, out[i].host, out[i].dptr, out[i].nbytes))) {
            snprintf(why, whylen, "copy back: %s", pc_err());
            goto done;
        }
        const ts_operand *o = &out[i].op;
        int64_t idx[TS_MAX_DIMS] = {0}, n = oph_numel(o);
        for (int64_t e = 0; e < n; e++, oph_next(o, idx)) {
            double got = oph_get(o, out[i].host, idx), want = oph_get(o, out[i].ref, idx);
            if (!close_enough(got, want, o->dtype)) {
                char at[96] = "";
                size_t len = 0;
                for (int d = 0; d < o->ndim; d++)
                    len += (size_t)snprintf(at + len, sizeof at - len, "%s%lld", d ? ", " : "",
                                            (long long)idx[d]);
                snprintf(why, whylen, "%s: output %d at (%s) is %.9g, the reference says %.9g",
                         k->what, i, at, got, want);
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
        free_buf(c, &in[i]);
    for (int i = 0; i < nout; i++)
        free_buf(c, &out[i]);
    return r;
}

static int run_case(checker *c, const kcase *k, layout l, char *why, size_t whylen)
{
    return run_case_seeded(c, k, l, c->seed ^ ((uint64_t)k->op << 32) ^ (uint64_t)l, why, whylen);
}

static opspec spec(int32_t dt, int nd, const int64_t *shape)
{
    opspec o = {.dtype = dt, .ndim = nd};
    for (int d = 0; d < nd; d++)
        o.shape[d] = shape[d];
    return o;
}

#define SHAPE(...) (sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__}

static void set_params(kcase *k, const void *p, size_t n)
{
    memcpy(k->params, p, n);
    k->params_size = (uint32_t)n;
}

typedef struct caselist {
    kcase *v;
    int n, cap;
} caselist;

static kcase *add(caselist *l, int32_t op, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static kcase *add(caselist *l, int32_t op, const char *fmt, ...)
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

static int is_floatdt(int32_t dt)
{
    return dt == TS_F32 || dt == TS_F64;
}

/* The minor ABI of the plugin under test: functions added after it are not its to run. */
static int plugin_minor = TS_PLUGIN_ABI_MINOR;

/* ---- the case table: one builder per op family ------------------------------------------ */
/* Each builder adds the cases of op for output dtype dt: shapes (scalars and empty tensors
 * included), every function of the op, params variants, input dtypes. A new op gets a
 * builder and a row (docs/architecture.md, "Adding an op"). */

static void cases_elementwise_unary(int32_t op, int32_t dt, caselist *l)
{
    const char *dn = ts_dtype_name(dt);
    kcase *k;
    for (size_t si = 0; si < sizeof eshapes / sizeof eshapes[0]; si++) {
        opspec o = spec(dt, eshapes[si].nd, eshapes[si].shape);
        if (op == TS_OP_COPY) {
            k = add(l, op, "copy %s %dd", dn, o.ndim);
            k->nin = k->nout = 1;
            k->in[0] = k->out[0] = o;
        } else if (op == TS_OP_CAST) {
            for (int32_t from = 0; from < TS_DTYPE_COUNT; from++) {
                k = add(l, op, "cast %s -> %s %dd", ts_dtype_name(from), dn, o.ndim);
                k->nin = k->nout = 1;
                k->in[0] = spec(from, o.ndim, o.shape);
                k->out[0] = o;
            }
        } else if (op == TS_OP_FILL) {
            ts_fill_params p = {is_floatdt(dt) ? 2.5 : dt == TS_U8 ? 1 : -3};
            k = add(l, op, "fill %s %dd", dn, o.ndim);
            k->nout = 1;
            k->out[0] = o;
            set_params(k, &p, sizeof p);
        } else {
            for (int fn = 0; fn < TS_UNARY_COUNT; fn++) {
                if (ts_plugin_call_minor(op, fn) > plugin_minor)
                    continue; /* added after the plugin's minor: never sent to it */
                ts_unary_params p = {fn};
                k = add(l, op, "unary %s %s %dd", ts_fn_name(op, fn), dn, o.ndim);
                k->nin = k->nout = 1;
                k->in[0] = k->out[0] = o;
                if (fn == TS_UNARY_LOG || fn == TS_UNARY_SQRT || fn == TS_UNARY_RSQRT)
                    k->in[0].v = V_POSITIVE;
                set_params(k, &p, sizeof p);
            }
        }
    }
}

/* g and x of out's shape; random x has both signs. */
static void cases_relu_backward(int32_t op, int32_t dt, caselist *l)
{
    const char *dn = ts_dtype_name(dt);
    kcase *k;
    if (!is_floatdt(dt))
        return;
    for (size_t si = 1; si < sizeof eshapes / sizeof eshapes[0]; si++) {
        opspec o = spec(dt, eshapes[si].nd, eshapes[si].shape);
        k = add(l, op, "relu_backward %s %dd", dn, o.ndim);
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
        opspec o = spec(dt, eshapes[si].nd, eshapes[si].shape);
        if (op == TS_OP_WHERE) {
            k = add(l, op, "where %s %dd", dn, o.ndim);
            k->nin = 3;
            k->nout = 1;
            k->in[0] = spec(TS_U8, o.ndim, o.shape);
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
            if (cmp)
                for (int32_t f = 0; f < TS_DTYPE_COUNT; f++)
                    from_list[nfrom++] = f;
            else
                from_list[nfrom++] = dt;
            for (int fi = 0; fi < nfrom; fi++) {
                opspec a = spec(from_list[fi], o.ndim, o.shape);
                if (fn == TS_BINARY_POW || fn == TS_BINARY_DIV)
                    a.v = V_POSITIVE;
                if (op == TS_OP_BINARY) {
                    k = add(l, op, "binary %s %s -> %s %dd", ts_fn_name(op, fn),
                            ts_dtype_name(from_list[fi]), dn, o.ndim);
                    k->nin = 2;
                    k->nout = 1;
                    k->in[0] = k->in[1] = a;
                    k->in[0].v = fn == TS_BINARY_POW ? V_POSITIVE : V_RANDOM;
                    k->out[0] = o;
                    ts_binary_params p = {fn};
                    set_params(k, &p, sizeof p);
                } else {
                    for (int first = 0; first < 2; first++) {
                        k = add(l, op, "scalar %s%s %s -> %s %dd", ts_fn_name(op, fn),
                                first ? " (scalar first)" : "",
                                ts_dtype_name(from_list[fi]), dn, o.ndim);
                        k->nin = k->nout = 1;
                        k->in[0] = a;
                        k->in[0].v = fn == TS_BINARY_POW || (fn == TS_BINARY_DIV && first)
                                         ? V_POSITIVE : V_RANDOM;
                        k->out[0] = o;
                        ts_scalar_params p = {fn, first,
                                              is_floatdt(from_list[fi]) ? 1.5 : 3};
                        set_params(k, &p, sizeof p);
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
                k = add(l, op, "reduce %s %s -> %s %dd", ts_fn_name(op, fn),
                        ts_dtype_name(from_list[fi]), dn, rs[i].nd);
                k->nin = k->nout = 1;
                k->in[0] = spec(from_list[fi], rs[i].nd, rs[i].in);
                k->out[0] = spec(dt, rs[i].nd, rs[i].out);
                ts_reduce_params p = {fn, dim < 0 ? 0 : dim};
                set_params(k, &p, sizeof p);
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
            k = add(l, op, "matmul %s %dd %lldx%lldx%lld%s%s", dn, ms[i].nd,
                    (long long)ms[i].a[ms[i].nd - 2], (long long)ms[i].a[ms[i].nd - 1],
                    (long long)ms[i].b[ms[i].nd - 1], ab ? " alpha 0.5 beta 2" : "",
                    ms[i].bcast_b ? " broadcast batch" : "");
            k->nin = 2;
            k->nout = 1;
            k->in[0] = spec(dt, ms[i].nd, ms[i].a);
            k->in[1] = spec(dt, ms[i].nd, ms[i].b);
            k->in[0].no_bcast = 1;
            k->in[1].no_bcast = !ms[i].bcast_b;
            k->out[0] = spec(dt, ms[i].nd, ms[i].c);
            ts_matmul_params p = {ab ? 0.5 : 1, ab ? 2 : 0};
            set_params(k, &p, sizeof p);
        }
}

static void cases_softmax(int32_t op, int32_t dt, caselist *l)
{
    const char *dn = ts_dtype_name(dt);
    kcase *k;
    static const struct {
        int nd;
        int64_t s[3];
        int dim;
    } ss[] = {{2, {4, 7}, 1}, {2, {4, 7}, 0}, {3, {2, 3, 5}, 1}, {1, {9}, 0}};
    for (size_t i = 0; i < sizeof ss / sizeof ss[0]; i++) {
        k = add(l, op, "%s %s %dd dim %d", op == TS_OP_SOFTMAX ? "softmax" : "log_softmax",
                dn, ss[i].nd, ss[i].dim);
        k->nin = k->nout = 1;
        k->in[0] = k->out[0] = spec(dt, ss[i].nd, ss[i].s);
        ts_dim_params p = {ss[i].dim};
        set_params(k, &p, sizeof p);
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
            k = add(l, op, "%s %s dim %d %s indices",
                    op == TS_OP_INDEX_SELECT ? "index_select" : "index_add", dn, dim,
                    ts_dtype_name(it));
            k->nin = 2;
            k->nout = 1;
            k->in[0] = spec(dt, 2, src);
            k->in[1] = spec(it, 1, &nidx);
            k->in[1].v = V_INDEX;
            k->in[1].range = (op == TS_OP_INDEX_SELECT ? src : dst)[dim];
            k->in[1].no_bcast = 1;
            k->out[0] = spec(dt, 2, dst);
            ts_dim_params p = {dim};
            set_params(k, &p, sizeof p);
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
        k = add(l, op, "%s %s x (%lld, %lld, %lld, %lld) w (%lld, %lld, %lld, %lld) stride "
                "%d pad %d dilation %d groups %d",
                op == TS_OP_CONV2D ? "conv2d" : op == TS_OP_CONV2D_BWD_DATA
                                                    ? "conv2d_bwd_data" : "conv2d_bwd_weight",
                dn, (long long)x[0], (long long)x[1], (long long)x[2], (long long)x[3],
                (long long)w[0], (long long)w[1], (long long)w[2], (long long)w[3],
                (int)p->stride_h, (int)p->pad_h, (int)p->dilation_h, (int)p->groups);
        k->nout = 1;
        if (op == TS_OP_CONV2D) {
            k->nin = cs[i].bias ? 3 : 2;
            k->in[0] = spec(dt, 4, x);
            k->in[1] = spec(dt, 4, w);
            k->in[2] = spec(dt, 1, b);
            k->out[0] = spec(dt, 4, y);
        } else {
            k->nin = 2;
            k->in[0] = spec(dt, 4, y);
            k->in[1] = op == TS_OP_CONV2D_BWD_DATA ? spec(dt, 4, w) : spec(dt, 4, x);
            k->out[0] = op == TS_OP_CONV2D_BWD_DATA ? spec(dt, 4, x) : spec(dt, 4, w);
        }
        for (int j = 0; j < k->nin; j++)
            k->in[j].no_bcast = 1;
        set_params(k, p, sizeof *p);
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
            k = add(l, op, "%s%s %s kernel %dx%d stride %d pad %d%s%s",
                    max ? "maxpool2d" : "avgpool2d", fwd ? "" : " backward", dn, (int)p->kernel_h,
                    (int)p->kernel_w, (int)p->stride_h, (int)p->pad_h,
                    with_idx ? " with indices" : "",
                    p->count_include_pad ? " count_include_pad" : "");
            if (fwd) {
                k->nin = 1;
                k->nout = 1 + with_idx;
                k->in[0] = spec(dt, 4, x);
                k->out[0] = spec(dt, 4, y);
                k->out[1] = spec(TS_I64, 4, y);
            } else {
                k->nin = max ? 2 : 1;
                k->nout = 1;
                k->in[0] = spec(dt, 4, y);
                k->in[1] = spec(TS_I64, 4, y);
                k->in[1].v = V_INDEX;
                k->in[1].range = H * W;
                k->out[0] = spec(dt, 4, x);
            }
            k->in[0].no_bcast = k->in[1].no_bcast = 1;
            set_params(k, p, sizeof *p);
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
            k = add(l, op, "%s %s (5, %lld) %s targets",
                    op == TS_OP_CROSS_ENTROPY ? "cross_entropy" : "cross_entropy_bwd", dn,
                    (long long)C, ts_dtype_name(it));
            k->in[0] = spec(dt, 2, lg);
            k->in[1] = spec(it, 1, &n);
            k->in[1].v = V_INDEX;
            k->in[1].range = C;
            k->in[1].no_bcast = 1;
            if (op == TS_OP_CROSS_ENTROPY) {
                k->nin = 2;
                k->out[0] = spec(dt, 1, &n);
            } else {
                k->nin = 3;
                k->in[2] = spec(dt, 1, &n);
                k->out[0] = spec(dt, 2, lg);
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
        k = add(l, op, "%s %s variant %d", op == TS_OP_SGD_STEP ? "sgd_step" : "adam_step", dn,
                v);
        k->nin = 1;
        k->in[0] = spec(dt, 1, &n);
        k->in[0].contig_only = 1;
        if (op == TS_OP_SGD_STEP) {
            ts_sgd_params p = {0.1, v ? 0.9 : 0, v == 2 ? 0.1 : 0, v >= 2 ? 0.01 : 0,
                               v == 3, v == 1};
            k->nout = v ? 2 : 1;
            set_params(k, &p, sizeof p);
        } else {
            ts_adam_params p = {0.01, 0.9, 0.999, 1e-8, v >= 2 ? 0.01 : 0, v == 3, 1 + v};
            k->nout = 3;
            set_params(k, &p, sizeof p);
        }
        for (int j = 0; j < k->nout; j++) {
            k->out[j] = spec(dt, 1, &n);
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
    if (!is_floatdt(dt))
        return;
    static const struct {
        int nd, norm;
        int64_t s[3];
    } ls[] = {{2, 1, {4, 7}}, {3, 1, {2, 3, 5}}, {3, 2, {2, 3, 5}}, {2, 1, {1, 9}}, {1, 1, {6}}};
    for (size_t i = 0; i < sizeof ls / sizeof ls[0]; i++)
        for (int affine = 0; affine < 2; affine++) {
            int lead = ls[i].nd - ls[i].norm;
            const int64_t *tail = ls[i].s + lead;
            k = add(l, op, "%s %s %dd over %d dims%s",
                    op == TS_OP_LAYER_NORM ? "layer_norm" : "layer_norm_bwd", dn, ls[i].nd,
                    ls[i].norm, affine ? " affine" : "");
            opspec x = spec(dt, ls[i].nd, ls[i].s), row = spec(dt, lead, ls[i].s),
                   col = spec(dt, ls[i].norm, tail);
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
            set_params(k, &p, sizeof p);
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
};

/* The cases for op with output dtype dt (none for an op without a row). */
static void build_cases(int32_t op, int32_t dt, caselist *l)
{
    for (size_t i = 0; i < sizeof case_table / sizeof case_table[0]; i++)
        if (case_table[i].op == op)
            case_table[i].build(op, dt, l);
}

void pc_check_kernels(checker *c)
{
    plugin_minor = ts_device_desc(c->dev)->abi_minor;
    int claimed = 0;
    for (int32_t op = TS_OP_NONE + 1; op < TS_OP_COUNT; op++)
        for (int32_t dt = 0; dt < TS_DTYPE_COUNT; dt++) {
            if (!ts_device_supports(c->dev, op, dt))
                continue;
            claimed++;
            char name[96];
            snprintf(name, sizeof name, "kernel: %s %s", ts_op_name(op), ts_dtype_name(dt));
            caselist l = {0};
            build_cases(op, dt, &l);
            int passed = 0, skipped = 0, failed = 0, declined = 0;
            char why[512] = "";
            for (int i = 0; i < l.n && !failed; i++)
                for (int lay = 0; lay < L_NLAYOUTS && !failed; lay++) {
                    char w[512] = "";
                    int r = run_case(c, &l.v[i], (layout)lay, w, sizeof w);
                    if (c->verbose)
                        printf("      %s, %s: %s\n", l.v[i].what, oph_layout_name(lay),
                               r == 2   ? "declined (the host's reference kernels run it)"
                               : r > 0  ? "ok"
                               : r == 0 ? w
                                        : "reference does not do it");
                    if (r == 2)
                        declined++;
                    else if (r > 0)
                        passed++;
                    else if (r < 0)
                        skipped++;
                    else {
                        failed++;
                        snprintf(why, sizeof why, "%s (%s layout)", w, oph_layout_name(lay));
                    }
                }
            free(l.v);
            c->kernel_failed[op][dt] = failed > 0;
            if (failed)
                pc_report(c, 0, name, "%s", why);
            else if (passed == 0 && declined)
                pc_report(c, -1, name, "declines all %d cases: the host runs them on its "
                          "reference kernels, so the claim does nothing", declined);
            else if (passed == 0)
                pc_report(c, -1, name, "no case this suite knows for it (%d combinations the "
                          "reference does not do)", skipped);
            else if (declined)
                pc_report(c, 1, name, "%d cases agree with the reference; %d declined (the "
                          "host runs them on its reference kernels)", passed, declined);
            else
                pc_report(c, 1, name, "%d cases agree with the reference", passed);
        }
    if (!claimed)
        pc_report(c, -1, "kernels", "the plugin claims none%s",
                  (TS_HAS_MEMBER(ts_device_desc(c->dev), ts_plugin_desc, flags) &&
                (ts_device_desc(c->dev)->flags & TS_PLUGIN_HOST_MEMORY))
                   ? " (the core runs its reference kernels on its host memory)"
                   : "");
}

/* ---- error paths ----------------------------------------------------------------------- */

/* Runs a bad call; it must fail with a status and a message (and not crash). */
static void expect_error(checker *c, const char *name, const kcase *k)
{
    char why[256];
    buf in[5], out[3];
    int nin = 0, nout = 0;
    uint64_t rng = c->seed;
    ts_status s = TS_OK;
    for (; nin < k->nin && !s; nin++)
        s = make_buf(c, &k->in[nin], L_CONTIG, &rng, &in[nin]);
    for (; nout < k->nout && !s; nout++)
        s = make_buf(c, &k->out[nout], L_CONTIG, &rng, &out[nout]);
    if (s) {
        snprintf(why, sizeof why, "setting up: %s", pc_err());
        pc_report(c, 0, name, "%s", why);
    } else {
        ts_operand din[5], dout[3];
        for (int i = 0; i < nin; i++)
            din[i] = in[i].op, din[i].data = in[i].dptr;
        for (int i = 0; i < nout; i++)
            dout[i] = out[i].op, dout[i].data = out[i].dptr;
        ts_kernel_call call = {.struct_size = sizeof call, .op = k->op, .ninputs = k->nin,
                               .noutputs = k->nout, .inputs = din, .outputs = dout,
                               .params = k->params_size ? k->params : NULL,
                               .params_size = k->params_size};
        ts_clear_error();
        s = ts_device_run(c->dev, &call);
        if (!s)
            s = ts_device_synchronize(c->dev);
        pc_report(c, s != TS_OK && ts_last_error()[0], name, "%s: %s", ts_status_name(s),
                  s ? pc_err() : "the bad call succeeded");
    }
    for (int i = 0; i < nin; i++)
        free_buf(c, &in[i]);
    for (int i = 0; i < nout; i++)
        free_buf(c, &out[i]);
}

void pc_check_errors(checker *c)
{
    int any = 0;
    int64_t n5[2] = {5, 4}, n3 = 3, n4 = 4;
    for (int32_t dt = 0; dt < TS_DTYPE_COUNT; dt++) {
        for (int add = 0; add < 2; add++) { /* index_select (5,4)->(3,4), index_add back */
            int32_t op = add ? TS_OP_INDEX_ADD : TS_OP_INDEX_SELECT;
            if (!ts_device_supports(c->dev, op, dt))
                continue;
            kcase k = {.op = op, .nin = 2, .nout = 1};
            int64_t n34[2] = {3, 4};
            k.in[0] = spec(dt, 2, add ? n34 : n5);
            k.in[1] = spec(TS_I64, 1, &n3);
            k.in[1].v = V_BADINDEX;
            k.in[1].range = 5;
            k.out[0] = spec(dt, 2, add ? n5 : n34);
            ts_dim_params p = {0};
            set_params(&k, &p, sizeof p);
            char name[96];
            snprintf(name, sizeof name, "errors: %s %s with an index out of range",
                     add ? "index_add" : "index_select", ts_dtype_name(dt));
            expect_error(c, name, &k);
            any = 1;
        }
        for (int bwd = 0; bwd < 2; bwd++) {
            int32_t op = bwd ? TS_OP_CROSS_ENTROPY_BWD : TS_OP_CROSS_ENTROPY;
            if (!ts_device_supports(c->dev, op, dt))
                continue;
            kcase k = {.op = op, .nin = bwd ? 3 : 2, .nout = 1};
            k.in[0] = spec(dt, 2, n5);
            k.in[1] = spec(TS_I64, 1, n5);
            k.in[1].v = V_BADINDEX;
            k.in[1].range = 4;
            k.in[2] = spec(dt, 1, n5);
            k.out[0] = bwd ? spec(dt, 2, n5) : spec(dt, 1, n5);
            char name[96];
            snprintf(name, sizeof name, "errors: %s %s with a target out of range",
                     ts_op_name(op), ts_dtype_name(dt));
            expect_error(c, name, &k);
            any = 1;
        }
        if ((dt == TS_I32 || dt == TS_I64) && ts_device_supports(c->dev, TS_OP_BINARY, dt)) {
            kcase k = {.op = TS_OP_BINARY, .nin = 2, .nout = 1};
            k.in[0] = k.out[0] = spec(dt, 1, &n4);
            k.in[1] = spec(dt, 1, &n4);
            k.in[1].v = V_INDEX; /* values in [0, 1): all zero */
            k.in[1].range = 1;
            ts_binary_params p = {TS_BINARY_DIV};
            set_params(&k, &p, sizeof p);
            char name[96];
            snprintf(name, sizeof name, "errors: integer division by zero (%s)",
                     ts_dtype_name(dt));
            expect_error(c, name, &k);
            any = 1;
        }
        if (is_floatdt(dt) && ts_device_supports(c->dev, TS_OP_CONV2D, dt)) {
            kcase k = {.op = TS_OP_CONV2D, .nin = 2, .nout = 1};
            int64_t x[4] = {1, 2, 5, 5}, w[4] = {3, 2, 3, 3}, y[4] = {1, 3, 3, 3};
            k.in[0] = spec(dt, 4, x);
            k.in[1] = spec(dt, 4, w);
            k.out[0] = spec(dt, 4, y);
            char name[96];
            snprintf(name, sizeof name, "errors: conv2d %s without its params",
                     ts_dtype_name(dt));
            expect_error(c, name, &k);
            any = 1;
        }
    }
    /* Every claimed op, called with no operands at all: an error, not a crash. */
    int nbad = 0, nclaimed = 0;
    char first_bad[160] = "";
    for (int32_t op = TS_OP_NONE + 1; op < TS_OP_COUNT; op++) {
        int32_t dt = 0;
        while (dt < TS_DTYPE_COUNT && !ts_device_supports(c->dev, op, dt))
            dt++;
        if (dt == TS_DTYPE_COUNT)
            continue;
        nclaimed++;
        ts_operand none[1];
        memset(none, 0, sizeof none);
        ts_kernel_call call = {.struct_size = sizeof call, .op = op, .inputs = none,
                               .outputs = none};
        ts_clear_error();
        ts_status s = ts_device_run(c->dev, &call);
        if (s == TS_OK || !ts_last_error()[0]) {
            if (!nbad++)
                snprintf(first_bad, sizeof first_bad, "%s returned %s%s", ts_op_name(op),
                         ts_status_name(s), s ? " without a message" : "");
        }
    }
    if (nclaimed) {
        if (nbad)
            pc_report(c, 0, "errors: every claimed op refuses a call without operands",
                      "%s (and %d more)", first_bad, nbad - 1);
        else
            pc_report(c, 1, "errors: every claimed op refuses a call without operands", "%d ops",
                      nclaimed);
        any = 1;
    }
    if (!any)
        pc_report(c, -1, "errors: kernel argument checks", "the plugin claims no kernel with a "
                  "documented error (index, target, integer division, conv params)");
}

/* ---- concurrent run calls --------------------------------------------------------------- */

#define TH_THREADS 4    /* threads running kernels at once */
#define TH_PER_OP 6     /* cases per claimed (op, dtype), spread over its list */
#define TH_REPS 8       /* runs of each case per thread, back to back, layouts in turn */
#define TH_DEADLINE 120 /* seconds for all of it (well under a second for the shipped plugins) */

/* Threads that have finished, for the deadline. */
typedef struct th_done {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int n;
} th_done;

typedef struct th_job {
    checker *c;
    th_done *done;
    const kcase *cases;
    int ncases;
    unsigned id;
    int runs, declined, failed;
    char why[600];
} th_job;

/* Every thread runs the same cases in the same order, so that they run the same kernel at
 * the same time, each on its own buffers and its own values (its own seed): a plugin that
 * keeps per-call state in shared memory (a static or per-context scratch buffer, a cached
 * object whose fields a call sets) hands one thread's result to another. */
static void *th_run(void *arg)
{
    th_job *j = arg;
    for (int i = 0; i < j->ncases && !j->failed; i++)
        for (int r = 0; r < TH_REPS && !j->failed; r++) {
            uint64_t seed = j->c->seed ^ (0x9e3779b97f4a7c15ull * (j->id + 1)) ^
                            ((uint64_t)(i * TH_REPS + r) << 40);
            layout l = (layout)(r % L_NLAYOUTS);
            char w[512] = "";
            int res = run_case_seeded(j->c, &j->cases[i], l, seed, w, sizeof w);
            if (res == 0) {
                j->failed = 1;
                snprintf(j->why, sizeof j->why, "thread %u: %s (%s layout)", j->id, w,
                         oph_layout_name(l));
            } else if (res == 2) {
                j->declined++;
            } else if (res > 0) {
                j->runs++;
            }
        }
    pthread_mutex_lock(&j->done->lock);
    j->done->n++;
    pthread_cond_signal(&j->done->cond);
    pthread_mutex_unlock(&j->done->lock);
    return NULL;
}

void pc_check_threads(checker *c)
{
    const char *name = "threads: concurrent run calls";
    caselist all = {0};
    int nops = 0, nbad = 0;
    for (int32_t op = TS_OP_NONE + 1; op < TS_OP_COUNT; op++)
        for (int32_t dt = 0; dt < TS_DTYPE_COUNT; dt++) {
            if (!ts_device_supports(c->dev, op, dt))
                continue;
            if (c->kernel_failed[op][dt]) { /* wrong alone already: reported above */
                nbad++;
                continue;
            }
            caselist l = {0};
            build_cases(op, dt, &l);
            int take = l.n < TH_PER_OP ? l.n : TH_PER_OP;
            for (int t = 0; t < take; t++)
                *add(&all, op, "-") = l.v[(size_t)t * (size_t)l.n / (size_t)take];
            nops += take > 0;
            free(l.v);
        }
    if (all.n == 0) {
        free(all.v);
        pc_report(c, -1, name,
                  nbad ? "every claimed kernel failed its kernel check"
                    : "the plugin claims no kernel");
        return;
    }
    th_job jobs[TH_THREADS];
    pthread_t t[TH_THREADS];
    th_done done = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    int started = 0, err_no = 0, timed_out = 0, ndone;
    for (unsigned i = 0; i < TH_THREADS; i++) {
        jobs[i] = (th_job){.c = c, .done = &done, .cases = all.v, .ncases = all.n, .id = i};
        if ((err_no = pthread_create(&t[i], NULL, th_run, &jobs[i])) != 0)
            break;
        started++;
    }
    /* A plugin that deadlocks or spins under concurrent calls must not hang the suite. */
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += TH_DEADLINE;
    pthread_mutex_lock(&done.lock);
    while (done.n < started && !timed_out)
        timed_out = pthread_cond_timedwait(&done.cond, &done.lock, &deadline) == ETIMEDOUT;
    ndone = done.n;
    pthread_mutex_unlock(&done.lock);
    if (timed_out) {
        /* The threads are stuck inside the plugin: nothing can be unloaded or freed safely. */
        pc_report(c, 0, name,
                  "%d of %d threads still running after %d s (one thread takes well under a "
                  "second): a deadlock or a corrupted state under concurrent run calls "
                  "(docs/writing-a-plugin.md, Threading)",
                  started - ndone, started, TH_DEADLINE);
        printf("plugin-check %s: %d passed, %d failed, %d skipped\n", ts_device_name(c->dev),
               c->npass, c->nfail, c->nskip);
        fflush(stdout);
        _exit(1);
    }
    for (int i = 0; i < started; i++)
        pthread_join(t[i], NULL);
    int ncases = all.n;
    free(all.v);
    if (started < TH_THREADS) {
        pc_report(c, 0, name, "could not start thread %d: %s", started, strerror(err_no));
        return;
    }
    int runs = 0, declined = 0;
    for (int i = 0; i < TH_THREADS; i++) {
        if (jobs[i].failed) {
            pc_report(c, 0, name,
                      "%s; while other threads ran the same kernel on other buffers (alone the "
                      "case agrees, see the kernel checks): keep per-call state on the stack or in "
                      "pool scratch and guard shared state (docs/writing-a-plugin.md, Threading)",
                      jobs[i].why);
            return;
        }
        runs += jobs[i].runs;
        declined += jobs[i].declined;
    }
    char dec[96] = "";
    if (declined)
        snprintf(dec, sizeof dec, " (%d calls declined, for the reference kernels)", declined);
    pc_report(c, runs > 0 ? 1 : -1, name,
              "%d threads ran %d cases of %d claimed kernels %d times each at once; all %d "
              "results agree with the reference%s%s",
              TH_THREADS, ncases, nops, TH_REPS, runs, dec,
              nbad ? " (kernels that failed their kernel check left out)" : "");
}

/* ---- a short training run -------------------------------------------------------------- */

