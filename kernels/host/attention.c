/* kernels/host/attention.c: scaled dot-product attention in one pass (TS_OP_ATTENTION and its
 * backward), on contiguous operands, after FlashAttention: the forward walks the keys of
 * each query block in blocks, keeping for every row its running maximum m, its running sum
 * l of exp(s - m) and its output, rescaled when m grows (the online softmax), so no Tq x Tk
 * matrix exists; it writes the row's log-sum-exp for the backward, which recomputes the
 * probabilities from it. The backward runs twice over the pairs: once per key block (the
 * key and value gradients, sums over queries) and once per query block (the query
 * gradients, sums over keys), so that every output element has one writer and one
 * summation order: no atomics, the same bits on every thread count.
 *
 * Inside a block the keys are transposed into scratch (kt: D x KB, vt: Dv x KB), so that a
 * row's scores are KB independent dot products accumulated over d in order: loops over j
 * that vectorize without horizontal sums, and so give the same bits on every vector width.
 * Work is spread over hd->threads OpenMP threads by a shared counter of tasks (a batch row
 * and a block), the heaviest first under the causal mask. */
#include <math.h>
#include <string.h>

#include "hostkern.h"
#include "vmath.h"

int hk_attention_supports(int32_t op, int32_t dtype)
{
    return (op == TS_OP_ATTENTION || op == TS_OP_ATTENTION_BWD) && hk_op_defined(op, dtype);
}

enum { QB = 16, KB = 64 };

#define AT(o, T) ((T *)(o).data + (o).offset)

static inline int64_t min64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

/* The keys [j0, j1) of rows of width D transposed into t (D x KB, column j - j0). */
#define ATT_TRANSPOSE(name, T)                                                               \
    static void name(const T *k, int64_t D, int64_t j0, int64_t j1, T *t)                   \
    {                                                                                        \
        for (int64_t j = j0; j < j1; j++)                                                    \
            for (int64_t d = 0; d < D; d++)                                                  \
                t[d * KB + (j - j0)] = k[j * D + d];                                         \
    }

/* s[0, n) = scale * (a . column j of t), summed over d in order. */
#define ATT_DOTS(name, T)                                                                    \
    HK_VINLINE void name(const T *a, const T *t, int64_t D, int64_t n, T scale, T *s)        \
    {                                                                                        \
        for (int64_t j = 0; j < n; j++)                                                      \
            s[j] = 0;                                                                        \
        for (int64_t d = 0; d < D; d++) {                                                    \
            const T ad = a[d], *td = t + d * KB;                                             \
            _Pragma("omp simd")                                                              \
            for (int64_t j = 0; j < n; j++)                                                  \
                s[j] += ad * td[j];                                                          \
        }                                                                                    \
        _Pragma("omp simd")                                                                  \
        for (int64_t j = 0; j < n; j++)                                                      \
            s[j] *= scale;                                                                   \
    }

/* The forward of the query rows [i0, i1) of one batch row: o and lse. */
#define ATT_FWD(name, T, EXP, LOG, DOTS, TRANSPOSE)                                          \
    HK_CLONES static void name(const T *q, const T *k, const T *v, T *o, T *lse, int64_t Tq, \
                               int64_t Tk, int64_t D, int64_t Dv, int64_t i0, int64_t i1,    \
                               T scale, int causal, T *kt)                                   \
    {                                                                                        \
        const int64_t off = Tk - Tq;                                                         \
        T m[QB], l[QB], s[KB];                                                               \
        for (int64_t i = i0; i < i1; i++) {                                                  \
            m[i - i0] = -(T)INFINITY;                                                        \
            l[i - i0] = 0;                                                                   \
            memset(o + i * Dv, 0, (size_t)Dv * sizeof(T));                                   \
        }                                                                                    \
        const int64_t jend = causal ? min64(Tk, i1 + off) : Tk;                              \
        for (int64_t j0 = 0; j0 < jend; j0 += KB) {                                          \
            const int64_t j1 = min64(j0 + KB, jend);                                         \
            TRANSPOSE(k, D, j0, j1, kt);                                                     \
            for (int64_t i = i0; i < i1; i++) {                                              \
                const int64_t n = (causal ? min64(j1, i + off + 1) : j1) - j0;               \
                if (n <= 0)                                                                  \
                    continue;                                                                \
                DOTS(q + i * D, kt, D, n, scale, s);                                         \
                T mb = m[i - i0];                                                            \
                for (int64_t j = 0; j < n; j++)                                              \
                    mb = s[j] > mb ? s[j] : mb;                                              \
                T *oi = o + i * Dv;                                                          \
                if (mb > m[i - i0]) { /* the running maximum grew: rescale what is summed */ \
                    const T c = EXP(m[i - i0] - mb);                                         \
                    l[i - i0] *= c;                                                          \
                    _Pragma("omp simd")                                                      \
                    for (int64_t e = 0; e < Dv; e++)                                         \
                        oi[e] *= c;                                                          \
                    m[i - i0] = mb;                                                          \
                }                                                                            \
                T sum = 0;                                                                   \
                _Pragma("omp simd")                                                          \
                for (int64_t j = 0; j < n; j++)                                              \
                    s[j] = EXP(s[j] - mb);                                                   \
                for (int64_t j = 0; j < n; j++)                                              \
                    sum += s[j];                                                             \
                l[i - i0] += sum;                                                            \
                for (int64_t j = 0; j < n; j++) {                                            \
                    const T p = s[j], *vj = v + (j0 + j) * Dv;                               \
                    _Pragma("omp simd")                                                      \
                    for (int64_t e = 0; e < Dv; e++)                                         \
                        oi[e] += p * vj[e];                                                  \
                }                                                                            \
            }                                                                                \
        }                                                                                    \
        for (int64_t i = i0; i < i1; i++) {                                                  \
            T *oi = o + i * Dv;                                                              \
            const T inv = 1 / l[i - i0];                                                     \
            _Pragma("omp simd")                                                              \
            for (int64_t e = 0; e < Dv; e++)                                                 \
                oi[e] *= inv;                                                                \
            lse[i] = m[i - i0] + LOG(l[i - i0]);                                             \
        }                                                                                    \
    }

/* The key and value gradients of the keys [j0, j1) of one batch row: sums over the queries
 * that see them. */
#define ATT_BWD_KV(name, T, EXP, DOTS, TRANSPOSE)                                            \
    HK_CLONES static void name(const T *go, const T *q, const T *k, const T *v,              \
                               const T *lse, const T *delta, T *gk, T *gv, int64_t Tq,       \
                               int64_t Tk, int64_t D, int64_t Dv, int64_t j0, int64_t j1,    \
                               T scale, int causal, T *kt, T *vt)                            \
    {                                                                                        \
        const int64_t off = Tk - Tq;                                                         \
        T p[KB], dp[KB];                                                                     \
        memset(gk + j0 * D, 0, (size_t)((j1 - j0) * D) * sizeof(T));                          \
        memset(gv + j0 * Dv, 0, (size_t)((j1 - j0) * Dv) * sizeof(T));                        \
        TRANSPOSE(k, D, j0, j1, kt);                                                         \
        TRANSPOSE(v, Dv, j0, j1, vt);                                                        \
        /* query i sees key j when j <= i + off: the first query to see j0 is j0 - off */    \
        for (int64_t i = causal && j0 - off > 0 ? j0 - off : 0; i < Tq; i++) {               \
            const int64_t n = (causal ? min64(j1, i + off + 1) : j1) - j0;                   \
            if (n <= 0)                                                                      \
                continue;                                                                    \
            const T *qi = q + i * D, *goi = go + i * Dv;                                     \
            DOTS(qi, kt, D, n, scale, p);                                                    \
            DOTS(goi, vt, Dv, n, (T)1, dp);                                                  \
            const T li = lse[i], di = delta[i];                                              \
            _Pragma("omp simd")                                                              \
            for (int64_t j = 0; j < n; j++) {                                                \
                p[j] = EXP(p[j] - li);                                                       \
                dp[j] = scale * p[j] * (dp[j] - di); /* scale * gs */                        \
            }                                                                                \
            for (int64_t j = 0; j < n; j++) {                                                \
                T *gvj = gv + (j0 + j) * Dv, *gkj = gk + (j0 + j) * D;                       \
                const T pj = p[j], gsj = dp[j];                                              \
                _Pragma("omp simd")                                                          \
                for (int64_t e = 0; e < Dv; e++)                                             \
                    gvj[e] += pj * goi[e];                                                   \
                _Pragma("omp simd")                                                          \
                for (int64_t d = 0; d < D; d++)                                              \
                    gkj[d] += gsj * qi[d];                                                   \
            }                                                                                \
        }                                                                                    \
    }

/* The query gradients of the rows [i0, i1) of one batch row: sums over the keys they see. */
#define ATT_BWD_Q(name, T, EXP, DOTS, TRANSPOSE)                                             \
    HK_CLONES static void name(const T *go, const T *q, const T *k, const T *v,              \
                               const T *lse, const T *delta, T *gq, int64_t Tq, int64_t Tk,  \
                               int64_t D, int64_t Dv, int64_t i0, int64_t i1, T scale,       \
                               int causal, T *kt, T *vt)                                     \
    {                                                                                        \
        const int64_t off = Tk - Tq;                                                         \
        T p[KB], dp[KB];                                                                     \
        memset(gq + i0 * D, 0, (size_t)((i1 - i0) * D) * sizeof(T));                          \
        const int64_t jend = causal ? min64(Tk, i1 + off) : Tk;                              \
        for (int64_t j0 = 0; j0 < jend; j0 += KB) {                                          \
            const int64_t j1 = min64(j0 + KB, jend);                                         \
            TRANSPOSE(k, D, j0, j1, kt);                                                     \
            TRANSPOSE(v, Dv, j0, j1, vt);                                                    \
            for (int64_t i = i0; i < i1; i++) {                                              \
                const int64_t n = (causal ? min64(j1, i + off + 1) : j1) - j0;               \
                if (n <= 0)                                                                  \
                    continue;                                                                \
                DOTS(q + i * D, kt, D, n, scale, p);                                         \
                DOTS(go + i * Dv, vt, Dv, n, (T)1, dp);                                      \
                const T li = lse[i], di = delta[i];                                          \
                _Pragma("omp simd")                                                          \
                for (int64_t j = 0; j < n; j++)                                              \
                    dp[j] = scale * EXP(p[j] - li) * (dp[j] - di);                           \
                T *gqi = gq + i * D;                                                         \
                for (int64_t j = 0; j < n; j++) {                                            \
                    const T gsj = dp[j], *kj = k + (j0 + j) * D;                             \
                    _Pragma("omp simd")                                                      \
                    for (int64_t d = 0; d < D; d++)                                          \
                        gqi[d] += gsj * kj[d];                                               \
                }                                                                            \
            }                                                                                \
        }                                                                                    \
    }

/* delta[i] = go_i . o_i, for the rows of every batch row. */
#define ATT_DELTA(name, T)                                                                   \
    HK_CLONES static void name(const T *go, const T *o, T *delta, int64_t rows, int64_t Dv)  \
    {                                                                                        \
        for (int64_t i = 0; i < rows; i++) {                                                 \
            T acc = 0;                                                                       \
            for (int64_t e = 0; e < Dv; e++)                                                 \
                acc += go[i * Dv + e] * o[i * Dv + e];                                       \
            delta[i] = acc;                                                                  \
        }                                                                                    \
    }

static inline double exp_f64(double x)
{
    return exp(x);
}

ATT_TRANSPOSE(att_transpose_f32, float)
ATT_TRANSPOSE(att_transpose_f64, double)
ATT_DOTS(att_dots_f32, float)
ATT_DOTS(att_dots_f64, double)
ATT_FWD(att_fwd_f32, float, hk_expf, logf, att_dots_f32, att_transpose_f32)
ATT_FWD(att_fwd_f64, double, exp_f64, log, att_dots_f64, att_transpose_f64)
ATT_BWD_KV(att_bwd_kv_f32, float, hk_expf, att_dots_f32, att_transpose_f32)
ATT_BWD_KV(att_bwd_kv_f64, double, exp_f64, att_dots_f64, att_transpose_f64)
ATT_BWD_Q(att_bwd_q_f32, float, hk_expf, att_dots_f32, att_transpose_f32)
ATT_BWD_Q(att_bwd_q_f64, double, exp_f64, att_dots_f64, att_transpose_f64)
ATT_DELTA(att_delta_f32, float)
ATT_DELTA(att_delta_f64, double)

/* Task t of n (blocks per batch row nb): its batch row and block, the last blocks first
 * (under the causal mask they see the most keys). */
static void task_of(int64_t t, int64_t nb, int64_t *b, int64_t *blk)
{
    *b = t / nb;
    *blk = nb - 1 - t % nb;
}

/* One task loop: each OpenMP thread takes tasks from a shared counter and works in its own
 * slice of the scratch (per = elements per thread). */
typedef struct att_job {
    const ts_kernel_call *call;
    hk_attention_dims a;
    int causal;
    double scale;
    void *scratch, *delta;
    size_t per;
} att_job;

static void fwd_task_f32(const att_job *j, int64_t t, float *w)
{
    const hk_attention_dims *a = &j->a;
    const int64_t nb = (a->Tq + QB - 1) / QB;
    int64_t b, blk;
    task_of(t, nb, &b, &blk);
    const int64_t i0 = blk * QB, i1 = min64(i0 + QB, a->Tq);
    att_fwd_f32(AT(j->call->inputs[0], const float) + b * a->Tq * a->D,
                AT(j->call->inputs[1], const float) + b * a->Tk * a->D,
                AT(j->call->inputs[2], const float) + b * a->Tk * a->Dv,
                AT(j->call->outputs[0], float) + b * a->Tq * a->Dv,
                AT(j->call->outputs[1], float) + b * a->Tq, a->Tq, a->Tk, a->D, a->Dv, i0, i1,
                (float)j->scale, j->causal, w);
}

static void fwd_task_f64(const att_job *j, int64_t t, double *w)
{
    const hk_attention_dims *a = &j->a;
    const int64_t nb = (a->Tq + QB - 1) / QB;
    int64_t b, blk;
    task_of(t, nb, &b, &blk);
    const int64_t i0 = blk * QB, i1 = min64(i0 + QB, a->Tq);
    att_fwd_f64(AT(j->call->inputs[0], const double) + b * a->Tq * a->D,
                AT(j->call->inputs[1], const double) + b * a->Tk * a->D,
                AT(j->call->inputs[2], const double) + b * a->Tk * a->Dv,
                AT(j->call->outputs[0], double) + b * a->Tq * a->Dv,
                AT(j->call->outputs[1], double) + b * a->Tq, a->Tq, a->Tk, a->D, a->Dv, i0,
                i1, j->scale, j->causal, w);
}

/* Backward tasks: the first B * nkb the key blocks, then B * nqb the query blocks. */
#define ATT_BWD_TASK(name, T, KV, Q)                                                         \
    static void name(const att_job *j, int64_t t, T *w)                                      \
    {                                                                                        \
        const hk_attention_dims *a = &j->a;                                                  \
        const ts_kernel_call *c = j->call;                                                   \
        const int64_t nkb = (a->Tk + KB - 1) / KB, nqb = (a->Tq + QB - 1) / QB;              \
        const T *go = AT(c->inputs[0], const T), *q = AT(c->inputs[1], const T);             \
        const T *k = AT(c->inputs[2], const T), *v = AT(c->inputs[3], const T);              \
        const T *lse = AT(c->inputs[5], const T), *delta = j->delta;                         \
        T *kt = w, *vt = w + a->D * KB;                                                      \
        int64_t b, blk;                                                                      \
        if (t < a->B * nkb) {                                                                \
            task_of(t, nkb, &b, &blk);                                                       \
            /* under the mask the first key blocks are the heaviest */                       \
            blk = nkb - 1 - blk;                                                             \
            const int64_t j0 = blk * KB, j1 = min64(j0 + KB, a->Tk);                         \
            KV(go + b * a->Tq * a->Dv, q + b * a->Tq * a->D, k + b * a->Tk * a->D,           \
               v + b * a->Tk * a->Dv, lse + b * a->Tq, delta + b * a->Tq,                    \
               AT(c->outputs[1], T) + b * a->Tk * a->D,                                      \
               AT(c->outputs[2], T) + b * a->Tk * a->Dv, a->Tq, a->Tk, a->D, a->Dv, j0, j1,  \
               (T)j->scale, j->causal, kt, vt);                                              \
        } else {                                                                             \
            task_of(t - a->B * nkb, nqb, &b, &blk);                                          \
            const int64_t i0 = blk * QB, i1 = min64(i0 + QB, a->Tq);                         \
            Q(go + b * a->Tq * a->Dv, q + b * a->Tq * a->D, k + b * a->Tk * a->D,            \
              v + b * a->Tk * a->Dv, lse + b * a->Tq, delta + b * a->Tq,                     \
              AT(c->outputs[0], T) + b * a->Tq * a->D, a->Tq, a->Tk, a->D, a->Dv, i0, i1,    \
              (T)j->scale, j->causal, kt, vt);                                               \
        }                                                                                    \
    }

ATT_BWD_TASK(bwd_task_f32, float, att_bwd_kv_f32, att_bwd_q_f32)
ATT_BWD_TASK(bwd_task_f64, double, att_bwd_kv_f64, att_bwd_q_f64)

ts_status hk_attention(hk_dev *hd, const ts_kernel_call *call)
{
    int bwd = call->op == TS_OP_ATTENTION_BWD;
    if (call->op != TS_OP_ATTENTION && !bwd)
        return TS_ENOTSUP;
    const ts_host *h = hd->host;
    att_job j = {.call = call};
    ts_status s = hk_attention_check(h, 0, call, &j.a);
    if (s)
        return s;
    const ts_attention_params *P = call->params;
    const hk_attention_dims *a = &j.a;
    j.causal = P->causal != 0;
    j.scale = P->scale;
    const int f64 = call->inputs[0].dtype == TS_F64;
    const size_t es = f64 ? sizeof(double) : sizeof(float);
    if (a->B == 0 || a->Tq == 0 || (bwd && a->Tk == 0)) {
        /* nothing attends: the key and value gradients of unseen keys are zero */
        for (int i = bwd ? 1 : 0; bwd && i < 3; i++) {
            const ts_operand *o = &call->outputs[i];
            memset(AT(*o, char), 0, (size_t)hk_attention_numel(o) * es);
        }
        return TS_OK;
    }
    const int64_t work = a->B * a->Tq * a->Tk * (a->D + a->Dv);
    int nt = work > 65536 ? hk_threads(hd) : 1;
    nt = nt < 1 ? 1 : nt;
    const int64_t nkb = (a->Tk + KB - 1) / KB, nqb = (a->Tq + QB - 1) / QB;
    const int64_t ntask = bwd ? a->B * (nkb + nqb) : a->B * nqb;
    nt = ntask < nt ? (int)ntask : nt;
    j.per = (size_t)((a->D + a->Dv) * KB);
    if ((s = h->scratch_alloc(h, (size_t)nt * j.per * es, "attention key blocks", &j.scratch)))
        return s;
    if (bwd && (s = h->scratch_alloc(h, (size_t)(a->B * a->Tq) * es, "attention row sums",
                                     &j.delta))) {
        h->scratch_free(h, j.scratch);
        return s;
    }
    if (bwd) {
        if (f64)
            att_delta_f64(AT(call->inputs[0], const double), AT(call->inputs[4], const double),
                          j.delta, a->B * a->Tq, a->Dv);
        else
            att_delta_f32(AT(call->inputs[0], const float), AT(call->inputs[4], const float),
                          j.delta, a->B * a->Tq, a->Dv);
    }
    int64_t next = 0;
    int slot = 0;
    (void)slot;
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        /* this thread's slice of the scratch: the slot counter hands them out */
        int me = __atomic_fetch_add(&slot, 1, __ATOMIC_RELAXED);
        char *w = (char *)j.scratch + (size_t)me * j.per * es;
        int64_t t;
        while ((t = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED)) < ntask) {
            if (bwd)
                f64 ? bwd_task_f64(&j, t, (double *)w) : bwd_task_f32(&j, t, (float *)w);
            else
                f64 ? fwd_task_f64(&j, t, (double *)w) : fwd_task_f32(&j, t, (float *)w);
        }
    }
    if (j.delta)
        h->scratch_free(h, j.delta);
    h->scratch_free(h, j.scratch);
    return TS_OK;
}
