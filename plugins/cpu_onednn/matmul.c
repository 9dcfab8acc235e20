/* plugins/cpu_onednn/matmul.c: TS_OP_MATMUL, F32, on a oneDNN matmul primitive. The operands
 * go to oneDNN as they lie (memory descriptors by strides: transposed or strided matrices
 * need no copy); a batch dim broadcast with stride 0 becomes a size-1 dim (oneDNN broadcasts
 * it), and a batch dim both inputs broadcast is looped over. alpha is the output scale, beta
 * a sum post-op. An output overlapping an input, or a matrix dim with stride 0, goes through
 * dense pool scratch. A product with enough work runs in parts, one per configured thread
 * (up to 4), each on a one-thread primitive (split_dim). oneDNN's CPU matmul has no f64:
 * supports() says so for F64. */
#include "config.h"

#include <string.h>

#include "onednn.h"

int dn_matmul_supports(int32_t op, int32_t dtype)
{
    return op == TS_OP_MATMUL && dtype == TS_F32;
}

static int64_t numel(const ts_operand *o)
{
    int64_t n = 1;
    for (int d = 0; d < o->ndim; d++)
        n *= o->shape[d];
    return n;
}

/* A matrix dim of size > 1 with stride 0: oneDNN memory descriptors cannot say that. */
static int needs_pack(const ts_operand *o)
{
    int nd = o->ndim;
    return (o->shape[nd - 2] > 1 && o->strides[nd - 2] == 0) ||
           (o->shape[nd - 1] > 1 && o->strides[nd - 1] == 0);
}

static ts_status pack(dn_ctx *c, const ts_operand *o, ts_operand *dense, void **buf)
{
    const ts_host *h = c->hd.host;
    int64_t n = numel(o);
    ts_status s = h->scratch_alloc(h, (size_t)(n ? n : 1) * 4, "matmul", buf);
    if (s)
        return s;
    *dense = hk_dense_like(o, *buf);
    return hk_dev_copy_strided(dense, o);
}

/* The cache key of a matmul of these oneDNN dims and strides (a size-1 dim's stride is free). */
static void matmul_key(dn_key *key, int32_t dt, int nd, const int64_t *ad, const int64_t *as,
                       const int64_t *bd, const int64_t *bs, const int64_t *cd, const int64_t *cs,
                       double alpha, double beta)
{
    *key = (dn_key){0};
    dn_key_push(key, TS_OP_MATMUL);
    dn_key_push(key, dt);
    dn_key_push(key, nd);
    for (int d = 0; d < nd; d++) {
        dn_key_push(key, ad[d]);
        dn_key_push(key, ad[d] == 1 ? 0 : as[d]);
        dn_key_push(key, bd[d]);
        dn_key_push(key, bd[d] == 1 ? 0 : bs[d]);
        dn_key_push(key, cd[d]);
        dn_key_push(key, cd[d] == 1 ? 0 : cs[d]);
    }
    dn_key_push_double(key, alpha);
    dn_key_push_double(key, beta);
}

/* threads: what the primitive is made for (0: the plugin's threads now). */
static ts_status matmul_entry(dn_ctx *c, const dn_key *key, int threads, int32_t dt, int nd,
                              const int64_t *ad, const int64_t *as, const int64_t *bd,
                              const int64_t *bs, const int64_t *cd, const int64_t *cs,
                              double alpha, double beta, dn_entry **e)
{
    if ((*e = dn_cache_find_nt(c, key, threads)))
        return TS_OK;
    dn_spec sp = {.nargs = 3,
                  .args = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST},
                  .outputs = {0, 0, 1},
                  .query = {dnnl_query_src_md, dnnl_query_weights_md, dnnl_query_dst_md},
                  .no_reference = dt != TS_F32};
    dnnl_status_t st;
    const char *what = "building the memory descriptors";
    dnnl_matmul_desc_t md;
    dnnl_post_ops_t po = NULL;
    if ((st = dn_md_strided_dt(&sp.user[0], nd, ad, as, dt)) ||
        (st = dn_md_strided_dt(&sp.user[1], nd, bd, bs, dt)) ||
        (st = dn_md_strided_dt(&sp.user[2], nd, cd, cs, dt)))
        return dn_fail(c, st, "matmul", what);
    if ((st = dnnl_matmul_desc_init(&md, &sp.user[0], &sp.user[1], NULL, &sp.user[2])))
        return dn_fail(c, st, "matmul", "dnnl_matmul_desc_init");
    what = "setting the attributes";
    if ((st = dnnl_primitive_attr_create(&sp.attr)))
        return dn_fail(c, st, "matmul", what);
    if (alpha != 1.0) {
        float a = (float)alpha;
        if ((st = dnnl_primitive_attr_set_output_scales(sp.attr, 1, 0, &a)))
            goto dfail;
    }
    if (beta != 0.0) {
        if ((st = dnnl_post_ops_create(&po)) || (st = dnnl_post_ops_append_sum(po, (float)beta)) ||
            (st = dnnl_primitive_attr_set_post_ops(sp.attr, po)))
            goto dfail;
        dnnl_post_ops_destroy(po);
        po = NULL;
    }
    sp.op_desc = &md;
    ts_status s = dn_cache_create_nt(c, key, threads, &sp, "matmul", e);
    dnnl_primitive_attr_destroy(sp.attr);
    return s;
dfail:
    if (po)
        dnnl_post_ops_destroy(po);
    dnnl_primitive_attr_destroy(sp.attr);
    return dn_fail(c, st, "matmul", what);
}

/* Parts of a matmul run side by side, one thread each (see split_dim): one per configured
 * thread, for up to DN_MAX_PARTS of them. Measured at 2 threads; with many, every part of a
 * row cut would read all of b, where oneDNN's own partitioning blocks both of the output's
 * dims, so from there on the products run whole (1: no parts). */
static int parts_of(const dn_ctx *c)
{
    return c->hd.configured <= DN_MAX_PARTS ? c->hd.configured : 1;
}

/* The dim to cut a matmul of output dims cd (oneDNN's: no dim both inputs broadcast) and
 * inner size K along, or -1 to run it whole on oneDNN's own threads. With few threads
 * oneDNN partitions the small products of a transformer step unevenly (at 2 threads its
 * bf16 attention products ran 1.0-1.25x faster than on 1; the same products cut in two and
 * run one per thread, 1.2-1.65x), so a product with enough work is cut, into one part per
 * configured thread, along its first batch dim that divides evenly enough or else its rows.
 * The parts are made for one thread each whatever the threads running them, so the bits do
 * not follow adaptive_threads either. */
static int split_dim(const dn_ctx *c, int nd, const int64_t *cd, int64_t K)
{
    int parts = parts_of(c);
    if (parts < 2)
        return -1;
    int64_t work = K; /* multiply-adds */
    for (int d = 0; d < nd; d++)
        work *= cd[d];
    if (work < ((int64_t)parts << 20))
        return -1;
    for (int d = 0; d < nd - 2; d++) {
        if (cd[d] == 1)
            continue;
        if (cd[d] % parts == 0 || cd[d] >= 8 * (int64_t)parts)
            return d;
        break;
    }
    return cd[nd - 2] >= 32 * (int64_t)parts ? nd - 2 : -1;
}

/* The matmul in parts along dim sd (split_dim): part p takes rows [n p / P, n (p+1) / P) of
 * that dim of the output and of each input that has it (a broadcast input is whole in every
 * part; b has no row dim). */
static ts_status run_parts(dn_ctx *c, int32_t dt, int nd, int sd, const ts_operand *A,
                           const ts_operand *B, const ts_operand *C, const int64_t *ad,
                           const int64_t *as, const int64_t *bd, const int64_t *bs,
                           const int64_t *cd, const int64_t *cs, double alpha, double beta)
{
    int parts = parts_of(c);
    int64_t n = cd[sd];
    size_t es = ts_plugin_dtype_size(dt);
    int cut_a = sd == nd - 2 || ad[sd] > 1, cut_b = sd < nd - 2 && bd[sd] > 1;
    dn_entry *e[DN_MAX_PARTS] = {NULL};
    void *handles[DN_MAX_PARTS][DN_MAX_ARGS];
    ts_status s = TS_OK;
    int got = 0;
    for (; got < parts; got++) {
        int64_t lo = n * got / parts, hi = n * (got + 1) / parts;
        int64_t pa[TS_MAX_DIMS], pb[TS_MAX_DIMS], pc[TS_MAX_DIMS];
        memcpy(pa, ad, sizeof pa[0] * (size_t)nd);
        memcpy(pb, bd, sizeof pb[0] * (size_t)nd);
        memcpy(pc, cd, sizeof pc[0] * (size_t)nd);
        pc[sd] = hi - lo;
        if (cut_a)
            pa[sd] = hi - lo;
        if (cut_b)
            pb[sd] = hi - lo;
        dn_key key;
        matmul_key(&key, dt, nd, pa, as, pb, bs, pc, cs, alpha, beta);
        if ((s = matmul_entry(c, &key, 1, dt, nd, pa, as, pb, bs, pc, cs, alpha, beta,
                              &e[got])))
            break;
        int64_t ao = A->offset + (cut_a ? lo * as[sd] : 0);
        int64_t bo = B->offset + (cut_b ? lo * bs[sd] : 0);
        int64_t co = C->offset + lo * cs[sd];
        handles[got][0] = (char *)A->data + ao * (int64_t)es;
        handles[got][1] = (char *)B->data + bo * (int64_t)es;
        handles[got][2] = (char *)C->data + co * (int64_t)es;
    }
    if (!s)
        s = dn_execute_parts(c, parts, e, (void *const(*)[DN_MAX_ARGS])handles, "matmul");
    for (int p = 0; p < got; p++)
        dn_entry_release(c, e[p]);
    return s;
}

/* a: (B..., M, K), b: (B..., K, N), out: (B..., M, N); out = alpha * a @ b + beta * out.
 * half: the 16-bit float path, which declines (*declined, nothing written) what it does not
 * run. */
static ts_status run_matmul(dn_ctx *c, const ts_kernel_call *call, int half, int *declined)
{
    const ts_host *h = c->hd.host;
    if (call->op != TS_OP_MATMUL)
        return TS_ENOTSUP;
    hk_matmul_dims md;
    ts_status chk = hk_matmul_check(h, call, &md);
    if (chk)
        return chk;
    const ts_operand *A = &call->inputs[0], *B = &call->inputs[1], *C = &call->outputs[0];
    int32_t dt = C->dtype;
    int nd = md.nd;
    int64_t M = md.M, K = md.K, N = md.N, nbatch = md.nbatch;
    if (dt != TS_F32 && !half)
        return h->fail(h, TS_ENOTSUP, "matmul: cpu_onednn runs float32 only (oneDNN's CPU "
                       "matmul has no float64)");
    double alpha = 1.0, beta = 0.0;
    if (call->params && call->params_size >= sizeof(ts_matmul_params)) {
        const ts_matmul_params *p = call->params;
        alpha = p->alpha;
        beta = p->beta;
    }
    if (nbatch == 0 || M == 0 || N == 0)
        return TS_OK;
    if (half && (K == 0 || needs_pack(A) || needs_pack(B) || hk_overlaps(C, A) ||
                 hk_overlaps(C, B))) {
        *declined = 1; /* the rare layouts: through float32 */
        return TS_OK;
    }
    if (K == 0) {
        /* An empty sum: out = beta * out (beta 0 overwrites, NaN or not). */
        int64_t n = numel(C), idx[TS_MAX_DIMS] = {0};
        for (int64_t i = 0; i < n; i++) {
            int64_t off = C->offset;
            for (int d = 0; d < nd; d++)
                off += idx[d] * C->strides[d];
            float *q = (float *)C->data + off;
            *q = beta == 0.0 ? 0.0f : (float)beta * *q;
            for (int d = nd - 1; d >= 0; d--) {
                if (++idx[d] < C->shape[d])
                    break;
                idx[d] = 0;
            }
        }
        return TS_OK;
    }

    ts_status s = TS_OK;
    void *abuf = NULL, *bbuf = NULL, *cbuf = NULL;
    dn_entry *e = NULL;
    ts_operand Ad = *A, Bd = *B, Cd = *C;
    if (needs_pack(A) && (s = pack(c, A, &Ad, &abuf)))
        goto done;
    if (needs_pack(B) && (s = pack(c, B, &Bd, &bbuf)))
        goto done;
    if (hk_overlaps(C, A) || hk_overlaps(C, B)) {
        int64_t n = numel(C);
        if ((s = h->scratch_alloc(h, (size_t)n * 4, "matmul", &cbuf)))
            goto done;
        Cd = hk_dense_like(C, cbuf);
        if (beta != 0.0 && (s = hk_dev_copy_strided(&Cd, C)))
            goto done;
    }

    /* oneDNN dims: batch dims an input broadcasts become 1; dims both broadcast are looped. */
    int64_t ad[TS_MAX_DIMS], as[TS_MAX_DIMS], bd[TS_MAX_DIMS], bs[TS_MAX_DIMS];
    int64_t cd[TS_MAX_DIMS], cs[TS_MAX_DIMS];
    int loop[TS_MAX_DIMS], nloop = 0;
    for (int d = 0; d < nd; d++) {
        int64_t n = Cd.shape[d];
        int batch = d < nd - 2;
        int a0 = batch && n > 1 && Ad.strides[d] == 0, b0 = batch && n > 1 && Bd.strides[d] == 0;
        ad[d] = a0 ? 1 : Ad.shape[d];
        as[d] = Ad.strides[d];
        bd[d] = b0 ? 1 : Bd.shape[d];
        bs[d] = Bd.strides[d];
        cd[d] = n;
        cs[d] = Cd.strides[d];
        if (a0 && b0) {
            cd[d] = 1;
            loop[nloop++] = d;
        }
    }
    dn_key key;
    matmul_key(&key, dt, nd, ad, as, bd, bs, cd, cs, alpha, beta);
    if (half && dn_is_declined(c, &key)) {
        *declined = 1;
        goto done;
    }
    int sdim = nloop ? -1 : split_dim(c, nd, cd, K);
    if (sdim >= 0) {
        if ((s = run_parts(c, dt, nd, sdim, &Ad, &Bd, &Cd, ad, as, bd, bs, cd, cs, alpha, beta)) ==
                TS_ENOTSUP &&
            half) {
            dn_declined(c, &key);
            *declined = 1;
            s = TS_OK;
        }
        goto copy_back;
    }
    if ((s = matmul_entry(c, &key, 0, dt, nd, ad, as, bd, bs, cd, cs, alpha, beta, &e))) {
        if (half && s == TS_ENOTSUP) { /* no fast kernels for it: this key through float32 */
            dn_declined(c, &key);
            *declined = 1;
            s = TS_OK;
        }
        goto done;
    }

    int64_t idx[TS_MAX_DIMS] = {0};
    for (;;) {
        int64_t ao = Ad.offset, bo = Bd.offset, co = Cd.offset;
        for (int i = 0; i < nloop; i++) {
            int d = loop[i];
            ao += idx[d] * Ad.strides[d];
            bo += idx[d] * Bd.strides[d];
            co += idx[d] * Cd.strides[d];
        }
        size_t es = ts_plugin_dtype_size(dt);
        void *handles[3] = {(char *)Ad.data + ao * (int64_t)es, (char *)Bd.data + bo * (int64_t)es,
                            (char *)Cd.data + co * (int64_t)es};
        if ((s = dn_execute(c, e, handles, "matmul")))
            goto done;
        int i = nloop - 1;
        for (; i >= 0; i--) {
            int d = loop[i];
            if (++idx[d] < Cd.shape[d])
                break;
            idx[d] = 0;
        }
        if (i < 0)
            break;
    }
copy_back:
    if (cbuf && !s)
        s = hk_dev_copy_strided(C, &Cd);
done:
    dn_entry_release(c, e);
    h->scratch_free(h, cbuf);
    h->scratch_free(h, bbuf);
    h->scratch_free(h, abuf);
    return s;
}

ts_status dn_matmul(dn_ctx *c, const ts_kernel_call *call)
{
    return run_matmul(c, call, 0, NULL);
}

ts_status dn_matmul_half(dn_ctx *c, const ts_kernel_call *call, int *declined)
{
    *declined = 0;
    return run_matmul(c, call, 1, declined);
}
