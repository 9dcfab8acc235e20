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

enum { QB = 64, KB = 64, R = 4 };

#define AT(o, T) ((T *)(o).data + (o).offset)

static inline int64_t min64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

static inline int64_t clamp64(int64_t v, int64_t lo, int64_t hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

/* 64-byte vectors (GCC's and clang's vector extension): one AVX-512 register, two AVX2 ones
 * or four SSE2 ones on the clones of HK_CLONES; the arithmetic is lane by lane, so every
 * clone computes the same bits. */
typedef float att_vf __attribute__((vector_size(64)));
typedef double att_vd __attribute__((vector_size(64)));

/* The keys [j0, j1) of rows of width D transposed into t (D x KB, column j - j0); the
 * columns past j1 - j0 zero. */
#define ATT_TRANSPOSE(name, T)                                                               \
    static void name(const T *k, int64_t D, int64_t j0, int64_t j1, T *t)                   \
    {                                                                                        \
        for (int64_t d = 0; d < D; d++) {                                                    \
            T *td = t + d * KB;                                                              \
            for (int64_t j = j0; j < j1; j++)                                                \
                td[j - j0] = k[j * D + d];                                                   \
            for (int64_t j = j1 - j0; j < KB; j++)                                           \
                td[j] = 0;                                                                   \
        }                                                                                    \
    }

/* s[r][j] = scale * sum_d a[r][d] t[d][j] for the R rows a[r] and all KB columns of t, the
 * R x 2 vectors of a column chunk held in registers over d. */
#define ATT_SCORES(name, T, V, W)                                                            \
    HK_VINLINE void name(const T *const *a, const T *t, int64_t D, T scale, T (*s)[KB])     \
    {                                                                                        \
        for (int c = 0; c < KB; c += 2 * W) {                                                \
            V acc[R][2];                                                                     \
            memset(acc, 0, sizeof acc);                                                      \
            for (int64_t d = 0; d < D; d++) {                                                \
                V t0, t1;                                                                    \
                memcpy(&t0, t + d * KB + c, sizeof t0);                                      \
                memcpy(&t1, t + d * KB + c + W, sizeof t1);                                  \
                for (int r = 0; r < R; r++) {                                                \
                    const T ar = a[r][d];                                                    \
                    acc[r][0] += t0 * ar;                                                    \
                    acc[r][1] += t1 * ar;                                                    \
                }                                                                            \
            }                                                                                \
            for (int r = 0; r < R; r++) {                                                    \
                acc[r][0] *= scale;                                                          \
                acc[r][1] *= scale;                                                          \
                memcpy(&s[r][c], &acc[r][0], sizeof acc[r][0]);                              \
                memcpy(&s[r][c + W], &acc[r][1], sizeof acc[r][1]);                          \
            }                                                                                \
        }                                                                                    \
    }

/* out[r][e] += sum_{j < n} s[r][j] rows[j][e] for the R output rows, e < width (rows of
 * `width` elements): per chunk of W the R sums in registers over j. */
#define ATT_ACCUM(name, T, V, W)                                                             \
    HK_VINLINE void name(T *const *out, const T (*s)[KB], const T *rows, int64_t n,          \
                         int64_t width)                                                      \
    {                                                                                        \
        int64_t e0 = 0;                                                                      \
        for (; e0 + W <= width; e0 += W) {                                                   \
            V acc[R];                                                                        \
            for (int r = 0; r < R; r++)                                                      \
                memcpy(&acc[r], out[r] + e0, sizeof acc[r]);                                 \
            for (int64_t j = 0; j < n; j++) {                                                \
                V x;                                                                         \
                memcpy(&x, rows + j * width + e0, sizeof x);                                 \
                for (int r = 0; r < R; r++)                                                  \
                    acc[r] += x * s[r][j];                                                   \
            }                                                                                \
            for (int r = 0; r < R; r++)                                                      \
                memcpy(out[r] + e0, &acc[r], sizeof acc[r]);                                 \
        }                                                                                    \
        for (int r = 0; r < R; r++)                                                          \
            for (int64_t e = e0; e < width; e++) {                                           \
                T acc = out[r][e];                                                           \
                for (int64_t j = 0; j < n; j++)                                              \
                    acc += rows[j * width + e] * s[r][j];                                    \
                out[r][e] = acc;                                                             \
            }                                                                                \
    }

/* rows[j][e] += sum_r s[r][j] in[r][e] for j < n, e < width: the transposed accumulation
 * (a key's gradient from R queries), per chunk the R input vectors in registers. */
#define ATT_ACCUM_T(name, T, V, W)                                                           \
    HK_VINLINE void name(T *rows, const T (*s)[KB], const T *const *in, int64_t n,           \
                         int64_t width)                                                      \
    {                                                                                        \
        int64_t e0 = 0;                                                                      \
        for (; e0 + W <= width; e0 += W) {                                                   \
            V x[R];                                                                          \
            for (int r = 0; r < R; r++)                                                      \
                memcpy(&x[r], in[r] + e0, sizeof x[r]);                                      \
            for (int64_t j = 0; j < n; j++) {                                                \
                V acc;                                                                       \
                memcpy(&acc, rows + j * width + e0, sizeof acc);                             \
                for (int r = 0; r < R; r++)                                                  \
                    acc += x[r] * s[r][j];                                                   \
                memcpy(rows + j * width + e0, &acc, sizeof acc);                             \
            }                                                                                \
        }                                                                                    \
        for (int64_t j = 0; j < n; j++)                                                      \
            for (int64_t e = e0; e < width; e++) {                                           \
                T acc = rows[j * width + e];                                                 \
                for (int r = 0; r < R; r++)                                                  \
                    acc += in[r][e] * s[r][j];                                               \
                rows[j * width + e] = acc;                                                   \
            }                                                                                \
    }

/* Each thread's scratch (elements of T): kt (D x KB), vt (Dv x KB), and two rows of zeros
 * standing in for the rows past a block's end. */
static size_t scratch_per_thread(int64_t D, int64_t Dv)
{
    int64_t w = D > Dv ? D : Dv;
    return (size_t)((D + Dv) * KB + 2 * w);
}

/* Each row's key count in the block [j0, j0 + n) for the group of R rows from i (0 for rows
 * at or past end): all n, or under the causal mask those up to i + off. Returns the most.
 * Dtype-free: one function for both kernels. */
static int64_t att_group(int64_t i, int64_t end, int causal, int64_t off, int64_t j0, int64_t n,
                         int64_t *nr)
{
    int64_t most = 0;
    for (int r = 0; r < R; r++) {
        nr[r] = i + r >= end ? 0 : causal ? clamp64(i + r + off + 1 - j0, 0, n) : n;
        most = nr[r] > most ? nr[r] : most;
    }
    return most;
}

/* The forward of the query rows [i0, i1) of one batch row: o and lse. */
#define ATT_FWD(name, T, EXP, LOG, SCORES, ACCUM, TRANSPOSE, GROUP)                          \
    HK_CLONES static void name(const T *q, const T *k, const T *v, T *o, T *lse, int64_t Tq, \
                               int64_t Tk, int64_t D, int64_t Dv, int64_t i0, int64_t i1,    \
                               T scale, int causal, T *w)                                    \
    {                                                                                        \
        const int64_t off = Tk - Tq;                                                         \
        T *kt = w, *zero = w + (D + Dv) * KB, *sink = zero + (D > Dv ? D : Dv);              \
        T m[QB], l[QB], s[R][KB];                                                            \
        int64_t nr[R];                                                                       \
        memset(zero, 0, (size_t)(D > Dv ? D : Dv) * sizeof(T));                              \
        for (int64_t i = i0; i < i1; i++) {                                                  \
            m[i - i0] = -(T)INFINITY;                                                        \
            l[i - i0] = 0;                                                                   \
            memset(o + i * Dv, 0, (size_t)Dv * sizeof(T));                                   \
        }                                                                                    \
        const int64_t jend = causal ? min64(Tk, i1 + off) : Tk;                              \
        for (int64_t j0 = 0; j0 < jend; j0 += KB) {                                          \
            const int64_t n = min64(KB, jend - j0);                                          \
            TRANSPOSE(k, D, j0, j0 + n, kt);                                                 \
            for (int64_t g = i0; g < i1; g += R) {                                           \
                const int64_t most = GROUP(g, i1, causal, off, j0, n, nr);                   \
                if (most == 0)                                                               \
                    continue;                                                                \
                const T *qr[R];                                                              \
                T *orow[R];                                                                  \
                for (int r = 0; r < R; r++) {                                                \
                    qr[r] = g + r < i1 ? q + (g + r) * D : zero;                             \
                    orow[r] = g + r < i1 ? o + (g + r) * Dv : sink;                          \
                }                                                                            \
                SCORES(qr, kt, D, scale, s);                                                 \
                for (int r = 0; r < R; r++) {                                                \
                    T *sr = s[r];                                                            \
                    if (nr[r] == 0) {                                                        \
                        memset(sr, 0, sizeof s[r]);                                          \
                        continue;                                                            \
                    }                                                                        \
                    const int64_t x = g + r - i0;                                            \
                    T mb = m[x];                                                             \
                    for (int64_t j = 0; j < nr[r]; j++)                                      \
                        mb = sr[j] > mb ? sr[j] : mb;                                        \
                    if (mb > m[x]) { /* the running maximum grew: rescale what is summed */  \
                        const T c = EXP(m[x] - mb);                                          \
                        l[x] *= c;                                                           \
                        _Pragma("omp simd")                                                  \
                        for (int64_t e = 0; e < Dv; e++)                                     \
                            orow[r][e] *= c;                                                 \
                        m[x] = mb;                                                           \
                    }                                                                        \
                    _Pragma("omp simd")                                                      \
                    for (int64_t j = 0; j < KB; j++)                                         \
                        sr[j] = j < nr[r] ? EXP(sr[j] - mb) : 0;                             \
                    T sum = 0;                                                               \
                    for (int64_t j = 0; j < nr[r]; j++)                                      \
                        sum += sr[j];                                                        \
                    l[x] += sum;                                                             \
                }                                                                            \
                ACCUM(orow, (const T(*)[KB])s, v + j0 * Dv, most, Dv);                       \
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

/* P and the scaled score gradient of a group: p[r][j] = exp(s - lse) and
 * dp[r][j] = scale p (dp - delta) for j < nr[r], 0 beyond. */
#define ATT_PROBS(name, T, EXP)                                                              \
    HK_VINLINE void name(T (*p)[KB], T (*dp)[KB], const int64_t *nr, const T *lse,           \
                         const T *delta, int64_t g, int64_t end, T scale)                    \
    {                                                                                        \
        for (int r = 0; r < R; r++) {                                                        \
            const T li = g + r < end ? lse[g + r] : 0, di = g + r < end ? delta[g + r] : 0;  \
            const int64_t n = nr[r];                                                         \
            T *pr = p[r], *dr = dp[r];                                                       \
            _Pragma("omp simd")                                                              \
            for (int64_t j = 0; j < KB; j++) {                                               \
                const T pj = j < n ? EXP(pr[j] - li) : 0;                                    \
                pr[j] = pj;                                                                  \
                dr[j] = j < n ? scale * pj * (dr[j] - di) : 0;                               \
            }                                                                                \
        }                                                                                    \
    }

/* The key and value gradients of the keys [j0, j1) of one batch row: sums over the queries
 * that see them, R queries at a time. */
#define ATT_BWD_KV(name, T, SCORES, ACCUM_T, TRANSPOSE, GROUP, PROBS)                        \
    HK_CLONES static void name(const T *go, const T *q, const T *k, const T *v,              \
                               const T *lse, const T *delta, T *gk, T *gv, int64_t Tq,       \
                               int64_t Tk, int64_t D, int64_t Dv, int64_t j0, int64_t j1,    \
                               T scale, int causal, T *w)                                    \
    {                                                                                        \
        const int64_t off = Tk - Tq, n = j1 - j0;                                            \
        T *kt = w, *vt = w + D * KB, *zero = w + (D + Dv) * KB;                              \
        T p[R][KB], dp[R][KB];                                                               \
        int64_t nr[R];                                                                       \
        memset(zero, 0, (size_t)(D > Dv ? D : Dv) * sizeof(T));                              \
        memset(gk + j0 * D, 0, (size_t)(n * D) * sizeof(T));                                 \
        memset(gv + j0 * Dv, 0, (size_t)(n * Dv) * sizeof(T));                               \
        TRANSPOSE(k, D, j0, j1, kt);                                                         \
        TRANSPOSE(v, Dv, j0, j1, vt);                                                        \
        /* query i sees key j when j <= i + off: the first query to see j0 is j0 - off */    \
        for (int64_t g = causal && j0 - off > 0 ? j0 - off : 0; g < Tq; g += R) {            \
            const int64_t most = GROUP(g, Tq, causal, off, j0, n, nr);                       \
            if (most == 0)                                                                   \
                continue;                                                                    \
            const T *qr[R], *gor[R];                                                         \
            for (int r = 0; r < R; r++) {                                                    \
                qr[r] = g + r < Tq ? q + (g + r) * D : zero;                                 \
                gor[r] = g + r < Tq ? go + (g + r) * Dv : zero;                              \
            }                                                                                \
            SCORES(qr, kt, D, scale, p);                                                     \
            SCORES(gor, vt, Dv, (T)1, dp);                                                   \
            PROBS(p, dp, nr, lse, delta, g, Tq, scale);                                      \
            ACCUM_T(gv + j0 * Dv, (const T(*)[KB])p, gor, most, Dv);                         \
            ACCUM_T(gk + j0 * D, (const T(*)[KB])dp, qr, most, D);                           \
        }                                                                                    \
    }

/* The query gradients of the rows [i0, i1) of one batch row: sums over the keys they see. */
#define ATT_BWD_Q(name, T, SCORES, ACCUM, TRANSPOSE, GROUP, PROBS)                           \
    HK_CLONES static void name(const T *go, const T *q, const T *k, const T *v,              \
                               const T *lse, const T *delta, T *gq, int64_t Tq, int64_t Tk,  \
                               int64_t D, int64_t Dv, int64_t i0, int64_t i1, T scale,       \
                               int causal, T *w)                                             \
    {                                                                                        \
        const int64_t off = Tk - Tq;                                                         \
        T *kt = w, *vt = w + D * KB, *zero = w + (D + Dv) * KB;                              \
        T *sink = zero + (D > Dv ? D : Dv);                                                  \
        T p[R][KB], dp[R][KB];                                                               \
        int64_t nr[R];                                                                       \
        memset(zero, 0, (size_t)(D > Dv ? D : Dv) * sizeof(T));                              \
        memset(gq + i0 * D, 0, (size_t)((i1 - i0) * D) * sizeof(T));                         \
        const int64_t jend = causal ? min64(Tk, i1 + off) : Tk;                              \
        for (int64_t j0 = 0; j0 < jend; j0 += KB) {                                          \
            const int64_t n = min64(KB, jend - j0);                                          \
            TRANSPOSE(k, D, j0, j0 + n, kt);                                                 \
            TRANSPOSE(v, Dv, j0, j0 + n, vt);                                                \
            for (int64_t g = i0; g < i1; g += R) {                                           \
                const int64_t most = GROUP(g, i1, causal, off, j0, n, nr);                   \
                if (most == 0)                                                               \
                    continue;                                                                \
                const T *qr[R], *gor[R];                                                     \
                T *gqr[R];                                                                   \
                for (int r = 0; r < R; r++) {                                                \
                    qr[r] = g + r < i1 ? q + (g + r) * D : zero;                             \
                    gor[r] = g + r < i1 ? go + (g + r) * Dv : zero;                          \
                    gqr[r] = g + r < i1 ? gq + (g + r) * D : sink;                           \
                }                                                                            \
                SCORES(qr, kt, D, scale, p);                                                 \
                SCORES(gor, vt, Dv, (T)1, dp);                                               \
                PROBS(p, dp, nr, lse, delta, g, i1, scale);                                  \
                ACCUM(gqr, (const T(*)[KB])dp, k + j0 * D, most, D);                         \
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
ATT_SCORES(att_scores_f32, float, att_vf, 16)
ATT_SCORES(att_scores_f64, double, att_vd, 8)
ATT_ACCUM(att_accum_f32, float, att_vf, 16)
ATT_ACCUM(att_accum_f64, double, att_vd, 8)
ATT_ACCUM_T(att_accum_t_f32, float, att_vf, 16)
ATT_ACCUM_T(att_accum_t_f64, double, att_vd, 8)
ATT_PROBS(att_probs_f32, float, hk_expf)
ATT_PROBS(att_probs_f64, double, exp_f64)
ATT_FWD(att_fwd_f32, float, hk_expf, logf, att_scores_f32, att_accum_f32, att_transpose_f32,
        att_group)
ATT_FWD(att_fwd_f64, double, exp_f64, log, att_scores_f64, att_accum_f64, att_transpose_f64,
        att_group)
ATT_BWD_KV(att_bwd_kv_f32, float, att_scores_f32, att_accum_t_f32, att_transpose_f32,
           att_group, att_probs_f32)
ATT_BWD_KV(att_bwd_kv_f64, double, att_scores_f64, att_accum_t_f64, att_transpose_f64,
           att_group, att_probs_f64)
ATT_BWD_Q(att_bwd_q_f32, float, att_scores_f32, att_accum_f32, att_transpose_f32,
          att_group, att_probs_f32)
ATT_BWD_Q(att_bwd_q_f64, double, att_scores_f64, att_accum_f64, att_transpose_f64,
          att_group, att_probs_f64)
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
               (T)j->scale, j->causal, w);                                                   \
        } else {                                                                             \
            task_of(t - a->B * nkb, nqb, &b, &blk);                                          \
            const int64_t i0 = blk * QB, i1 = min64(i0 + QB, a->Tq);                         \
            Q(go + b * a->Tq * a->Dv, q + b * a->Tq * a->D, k + b * a->Tk * a->D,            \
              v + b * a->Tk * a->Dv, lse + b * a->Tq, delta + b * a->Tq,                     \
              AT(c->outputs[0], T) + b * a->Tq * a->D, a->Tq, a->Tk, a->D, a->Dv, i0, i1,    \
              (T)j->scale, j->causal, w);                                                    \
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
    j.per = scratch_per_thread(a->D, a->Dv);
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
