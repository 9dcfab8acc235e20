/* kernels/host/reduce.c: reductions (sum, mean, max, min, argmax, argmin) and softmax /
 * log-softmax on host memory, any strides. A reduction walks the reduced dims of one output
 * element's slice as strided runs; threads take whole output elements, or, when there are fewer
 * outputs than threads, ranges of one slice whose partial results are combined in order. */
#include "hostkern.h"
#include "vmath.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* Below this many input elements one thread is faster than waking the team. */
#define RD_PAR_MIN (1 << 15)
/* Most threads a split slice uses: the size of the partials array. */
#define RD_MAX_PARTS 256

/* The threads the work is cut for: the threads setting, not the threads running now
 * (adaptive_threads), so that a slice split in parts sums alike whatever the load. */
static int threads_for(const hk_dev *hd, int64_t work)
{
    int nt = hd->configured > 1 && work >= RD_PAR_MIN ? hd->configured : 1;
    return nt < RD_MAX_PARTS ? nt : RD_MAX_PARTS;
}

/* The threads to run nt parts on now. */
static int run_for(const hk_dev *hd, int nt)
{
    int run = hk_threads(hd);
    return run < nt ? (run > 1 ? run : 1) : nt;
}

/* ---- reduce ---------------------------------------------------------------------------- */

/* The iteration space of a reduction: kept dims (one output element per index) and reduced
 * dims (the slice each output element reduces), the latter merged where contiguous. */
typedef struct rd_plan {
    int32_t fn, dtype; /* ts_reduce_fn; the input's dtype */
    int nkeep, nred;
    int64_t keep_shape[TS_MAX_DIMS], keep_in[TS_MAX_DIMS], keep_out[TS_MAX_DIMS]; /* strides */
    int64_t red_shape[TS_MAX_DIMS], red_in[TS_MAX_DIMS];
    int64_t nout, nslice; /* output elements; elements per slice */
    const char *in;       /* the input's element 0 */
    char *out;            /* the output's element 0 */
    size_t in_es;
} rd_plan;

/* Partial result over part of a slice. Float values are held as double (exact for both float
 * dtypes), integer ones as int64; integer sums wrap like the integer dtypes do. */
typedef struct rd_part {
    double fsum;
    uint64_t isum;
    double fbest;
    int64_t ibest;
    int64_t at; /* index of best in the slice (row-major over the reduced dims); -1: none yet */
} rd_part;

/* Whether a is a strictly better max (min) than b. NaN beats every number, the first NaN wins,
 * as in PyTorch; equal values keep the earlier, so arg* returns the first occurrence. */
#define F_MAX_BETTER(a, b) ((b) == (b) && ((a) != (a) || (a) > (b)))
#define F_MIN_BETTER(a, b) ((b) == (b) && ((a) != (a) || (a) < (b)))

/* One run of n elements x[0], x[s], ...: index `at` of the slice. */
#define SUM_RUN(T, ACC, dst)                                                                       \
    do {                                                                                           \
        const T *x_ = (const T *)px;                                                               \
        ACC r_ = 0;                                                                                \
        if (s == 1) {                                                                              \
            _Pragma("omp simd reduction(+ : r_)") for (int64_t i = 0; i < n; i++) r_ +=            \
                (ACC)x_[i];                                                                        \
        } else {                                                                                   \
            for (int64_t i = 0; i < n; i++)                                                        \
                r_ += (ACC)x_[i * s];                                                              \
        }                                                                                          \
        dst += r_;                                                                                 \
    } while (0)

#define BEST_RUN(T, HOLD, best, BETTER)                                                            \
    do {                                                                                           \
        const T *x_ = (const T *)px;                                                               \
        for (int64_t i = 0; i < n; i++) {                                                          \
            HOLD v_ = (HOLD)x_[i * s];                                                             \
            if (r->at < 0 || BETTER(v_, best)) {                                                   \
                best = v_;                                                                         \
                r->at = at + i;                                                                    \
            }                                                                                      \
        }                                                                                          \
    } while (0)

#define I_MAX_BETTER(a, b) ((a) > (b))
#define I_MIN_BETTER(a, b) ((a) < (b))

/* Folds slice elements [lo, hi) of the slice starting at in into r. */
static void rd_part_range(const rd_plan *p, const char *in, int64_t lo, int64_t hi, rd_part *r)
{
    if (lo >= hi) /* also an empty slice, whose size-0 dim must not be divided by */
        return;
    int last = p->nred - 1;
    int64_t idx[TS_MAX_DIMS], rem = lo;
    for (int d = last; d >= 0; d--) {
        idx[d] = rem % p->red_shape[d];
        rem /= p->red_shape[d];
    }
    int64_t s = p->red_in[last];
    int maxish = p->fn == TS_REDUCE_MAX || p->fn == TS_REDUCE_ARGMAX;
    int sum = p->fn == TS_REDUCE_SUM || p->fn == TS_REDUCE_MEAN;
    for (int64_t at = lo; at < hi;) {
        int64_t off = 0;
        for (int d = 0; d <= last; d++)
            off += idx[d] * p->red_in[d];
        const char *px = in + off * (int64_t)p->in_es;
        int64_t n = p->red_shape[last] - idx[last];
        if (n > hi - at)
            n = hi - at;
        switch (p->dtype) {
        case TS_F32:
            if (sum)
                SUM_RUN(float, double, r->fsum);
            else if (maxish)
                BEST_RUN(float, double, r->fbest, F_MAX_BETTER);
            else
                BEST_RUN(float, double, r->fbest, F_MIN_BETTER);
            break;
        case TS_F64:
            if (sum)
                SUM_RUN(double, double, r->fsum);
            else if (maxish)
                BEST_RUN(double, double, r->fbest, F_MAX_BETTER);
            else
                BEST_RUN(double, double, r->fbest, F_MIN_BETTER);
            break;
        case TS_I32:
            if (sum)
                SUM_RUN(int32_t, uint64_t, r->isum);
            else if (maxish)
                BEST_RUN(int32_t, int64_t, r->ibest, I_MAX_BETTER);
            else
                BEST_RUN(int32_t, int64_t, r->ibest, I_MIN_BETTER);
            break;
        case TS_I64:
            if (sum)
                SUM_RUN(int64_t, uint64_t, r->isum);
            else if (maxish)
                BEST_RUN(int64_t, int64_t, r->ibest, I_MAX_BETTER);
            else
                BEST_RUN(int64_t, int64_t, r->ibest, I_MIN_BETTER);
            break;
        }
        at += n;
        idx[last] += n;
        for (int d = last; d > 0 && idx[d] == p->red_shape[d]; d--) {
            idx[d] = 0;
            idx[d - 1]++;
        }
    }
}

static void rd_part_init(rd_part *r)
{
    memset(r, 0, sizeof *r);
    r->at = -1;
}

/* Folds b, a later range of the same slice, into a. */
static void rd_part_merge(const rd_plan *p, rd_part *a, const rd_part *b)
{
    a->fsum += b->fsum;
    a->isum += b->isum;
    if (b->at < 0)
        return;
    int maxish = p->fn == TS_REDUCE_MAX || p->fn == TS_REDUCE_ARGMAX;
    int better;
    if (ts_plugin_dtype_is_float(p->dtype))
        better = maxish ? F_MAX_BETTER(b->fbest, a->fbest) : F_MIN_BETTER(b->fbest, a->fbest);
    else
        better = maxish ? b->ibest > a->ibest : b->ibest < a->ibest;
    if (a->at < 0 || better) {
        a->fbest = b->fbest;
        a->ibest = b->ibest;
        a->at = b->at;
    }
}

/* A float32 result stored in dtype: a 16-bit float rounded once from it, the bits of the same
 * reduction run in float32 and then narrowed (hk_via_float32). */
static void rd_store_f32(int32_t dtype, float f, char *out)
{
    if (dtype == TS_F32) {
        memcpy(out, &f, sizeof f);
        return;
    }
    uint16_t h = dtype == TS_BF16 ? ts_plugin_f32_to_bf16(f) : ts_plugin_f32_to_f16(f);
    memcpy(out, &h, sizeof h);
}

/* Writes the result of a whole slice to out (an element of the output's dtype). */
static void rd_part_store(const rd_plan *p, const rd_part *r, char *out)
{
    switch (p->fn) {
    case TS_REDUCE_ARGMAX:
    case TS_REDUCE_ARGMIN:
        *(int64_t *)out = r->at < 0 ? 0 : r->at;
        return;
    case TS_REDUCE_MEAN: {
        double m = r->fsum / (double)p->nslice; /* 0 / 0: NaN for an empty slice */
        if (p->dtype == TS_F64)
            *(double *)out = m;
        else
            rd_store_f32(p->dtype, (float)m, out);
        return;
    }
    default:
        break;
    }
    int sum = p->fn == TS_REDUCE_SUM;
    switch (p->dtype) {
    case TS_F32:
    case TS_BF16:
    case TS_F16:
        rd_store_f32(p->dtype, (float)(sum ? r->fsum : r->fbest), out);
        break;
    case TS_F64:
        *(double *)out = sum ? r->fsum : r->fbest;
        break;
    case TS_I32:
        *(int32_t *)out = (int32_t)(uint32_t)(sum ? r->isum : (uint64_t)r->ibest);
        break;
    case TS_I64:
        *(int64_t *)out = (int64_t)(sum ? r->isum : (uint64_t)r->ibest);
        break;
    }
}

/* Offsets (elements) of output element j's slice in the input and its place in the output. */
static void rd_locate(const rd_plan *p, int64_t j, int64_t *in_off, int64_t *out_off)
{
    int64_t io = 0, oo = 0;
    for (int d = p->nkeep - 1; d >= 0; d--) {
        int64_t i = j % p->keep_shape[d];
        j /= p->keep_shape[d];
        io += i * p->keep_in[d];
        oo += i * p->keep_out[d];
    }
    *in_off = io;
    *out_off = oo;
}

/* A float sum or mean over the rows of a matrix whose kept dim is contiguous (a bias
 * gradient: (batch, features) summed over the batch). Walking each output's column would read
 * one float per cache line; this adds whole rows into a block of double accumulators
 * instead, in the same order (row 0 first) as the column walk, so the results are the same.
 * Blocks of 32 columns: their accumulators stay in registers (four 8-double vectors) across
 * the rows, and a (rows, 128) gradient still has four blocks for the threads to share. */
enum { RD_COLS = 32 };

static int rd_by_rows(const rd_plan *p)
{
    return (p->fn == TS_REDUCE_SUM || p->fn == TS_REDUCE_MEAN) &&
           (ts_plugin_dtype_is_float(p->dtype) || ts_plugin_dtype_is_half(p->dtype)) &&
           p->nkeep == 1 && p->keep_in[0] == 1 &&
           p->nred == 1 && p->nout >= 8;
}

typedef uint32_t rd_v8u __attribute__((vector_size(32)));
typedef uint16_t rd_v8h __attribute__((vector_size(16)));

/* d = the 8 bfloat16 values at x, as doubles (exact); float32's: vmath.h's HK_LOAD8_F32 */
#define RD_LOAD8_BF16(d, x)                                                                        \
    do {                                                                                           \
        rd_v8h h_;                                                                                 \
        memcpy(&h_, (x), sizeof h_);                                                               \
        rd_v8u u_ = __builtin_convertvector(h_, rd_v8u) << 16;                                     \
        hk_v8f f_;                                                                                 \
        memcpy(&f_, &u_, sizeof f_);                                                               \
        (d) = __builtin_convertvector(f_, hk_v8d);                                                 \
    } while (0)

/* acc[0..32) = the column sums of a full block: rows of x (element size es) stride apart */
#define RD_BLOCK32(name, LOAD, es)                                                                 \
    HK_CLONES static void name(const char *x, int64_t stride, int64_t rows, double *acc)          \
    {                                                                                              \
        hk_v8d a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, t;                                          \
        for (int64_t i = 0; i < rows; i++, x += stride * (es)) {                                   \
            LOAD(t, x);                                                                            \
            a0 += t;                                                                               \
            LOAD(t, x + 8 * (es));                                                                 \
            a1 += t;                                                                               \
            LOAD(t, x + 16 * (es));                                                                \
            a2 += t;                                                                               \
            LOAD(t, x + 24 * (es));                                                                \
            a3 += t;                                                                               \
        }                                                                                          \
        memcpy(acc, &a0, sizeof a0);                                                               \
        memcpy(acc + 8, &a1, sizeof a1);                                                           \
        memcpy(acc + 16, &a2, sizeof a2);                                                          \
        memcpy(acc + 24, &a3, sizeof a3);                                                          \
    }

RD_BLOCK32(rd_block32_f32, HK_LOAD8_F32, 4)
RD_BLOCK32(rd_block32_bf16, RD_LOAD8_BF16, 2)

#define RD_ROWS(T)                                                                                 \
    do {                                                                                           \
        const T *x = (const T *)p->in + j0;                                                        \
        for (int64_t i = 0; i < p->nslice; i++, x += p->red_in[0])                                 \
            for (int64_t j = 0; j < nj; j++)                                                       \
                acc[j] += (double)x[j];                                                            \
    } while (0)

/* acc[j] += x[j] over one row of 16-bit floats, widened on the way (vectorized) */
HK_CLONES static void rd_row_bf16(double *acc, const uint16_t *x, int64_t nj)
{
    _Pragma("omp simd") for (int64_t j = 0; j < nj; j++)
    {
        uint32_t u = (uint32_t)x[j] << 16;
        float f;
        memcpy(&f, &u, sizeof f);
        acc[j] += (double)f;
    }
}

HK_CLONES static void rd_row_f16(double *acc, const uint16_t *x, int64_t nj)
{
    _Pragma("omp simd") for (int64_t j = 0; j < nj; j++) acc[j] += (double)hk_f16_to_f32(x[j]);
}

#define RD_ROWS_HALF(FN)                                                                           \
    do {                                                                                           \
        const uint16_t *x = (const uint16_t *)p->in + j0;                                          \
        for (int64_t i = 0; i < p->nslice; i++, x += p->red_in[0])                                 \
            FN(acc, x, nj);                                                                        \
    } while (0)

static void rd_execute_rows(const hk_dev *hd, const rd_plan *p, size_t out_es)
{
    int64_t nblocks = (p->nout + RD_COLS - 1) / RD_COLS;
    int nt = run_for(hd, threads_for(hd, p->nout * p->nslice));
    (void)nt; /* the reference flavour has no parallel regions */
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && nblocks > 1)
    for (int64_t b = 0; b < nblocks; b++) {
        int64_t j0 = b * RD_COLS, nj = p->nout - j0 < RD_COLS ? p->nout - j0 : RD_COLS;
        double acc[RD_COLS] = {0};
        if (nj == RD_COLS && p->dtype == TS_F32)
            rd_block32_f32(p->in + j0 * 4, p->red_in[0], p->nslice, acc);
        else if (nj == RD_COLS && p->dtype == TS_BF16)
            rd_block32_bf16(p->in + j0 * 2, p->red_in[0], p->nslice, acc);
        else if (p->dtype == TS_F32)
            RD_ROWS(float);
        else if (p->dtype == TS_BF16)
            RD_ROWS_HALF(rd_row_bf16);
        else if (p->dtype == TS_F16)
            RD_ROWS_HALF(rd_row_f16);
        else
            RD_ROWS(double);
        for (int64_t j = 0; j < nj; j++) {
            rd_part r;
            rd_part_init(&r);
            r.fsum = acc[j];
            rd_part_store(p, &r, p->out + (j0 + j) * p->keep_out[0] * (int64_t)out_es);
        }
    }
}

static void rd_execute(const hk_dev *hd, const rd_plan *p, size_t out_es)
{
    if (rd_by_rows(p)) {
        rd_execute_rows(hd, p, out_es);
        return;
    }
    int nt = threads_for(hd, p->nout * p->nslice), nrun = run_for(hd, nt);
    (void)nrun; /* the reference flavour has no parallel regions */
    if (nt == 1 || p->nout >= nt) {
#pragma omp parallel for num_threads(nrun) schedule(static) if (nrun > 1)
        for (int64_t j = 0; j < p->nout; j++) {
            int64_t io, oo;
            rd_locate(p, j, &io, &oo);
            rd_part r;
            rd_part_init(&r);
            rd_part_range(p, p->in + io * (int64_t)p->in_es, 0, p->nslice, &r);
            rd_part_store(p, &r, p->out + oo * (int64_t)out_es);
        }
        return;
    }
    /* Fewer outputs than threads (a full reduction): split each slice instead. */
    for (int64_t j = 0; j < p->nout; j++) {
        int64_t io, oo;
        rd_locate(p, j, &io, &oo);
        rd_part parts[RD_MAX_PARTS];
#pragma omp parallel for num_threads(nrun) schedule(static) if (nrun > 1)
        for (int t = 0; t < nt; t++) {
            rd_part_init(&parts[t]);
            int64_t lo = p->nslice * t / nt, hi = p->nslice * (t + 1) / nt;
            if (lo < hi)
                rd_part_range(p, p->in + io * (int64_t)p->in_es, lo, hi, &parts[t]);
        }
        for (int t = 1; t < nt; t++)
            rd_part_merge(p, &parts[0], &parts[t]);
        rd_part_store(p, &parts[0], p->out + oo * (int64_t)out_es);
    }
}

static ts_status run_reduce(hk_dev *hd, const ts_kernel_call *call);

static ts_status reduce_f32(void *hd, const ts_kernel_call *call)
{
    return run_reduce(hd, call);
}

/* in: (d0, ..., dk); out: the same dims with 1 where reduced. ARGMAX/ARGMIN: only params.dim
 * reduced, out TS_I64. */
static ts_status run_reduce(hk_dev *hd, const ts_kernel_call *call)
{
    int dim;
    ts_status s = hk_reduce_check(hd->host, 0, call, &dim);
    if (s)
        return s;
    const ts_reduce_params *prm = call->params;
    const ts_operand *in = &call->inputs[0], *out = &call->outputs[0];
    int32_t fn = prm->fn;
    int arg = fn == TS_REDUCE_ARGMAX || fn == TS_REDUCE_ARGMIN;
    const char *what = ts_plugin_fn_name(TS_OP_REDUCE, fn);

    rd_plan p = {.fn = fn, .dtype = in->dtype, .nout = 1, .nslice = 1};
    p.in_es = ts_plugin_dtype_size(in->dtype);
    size_t out_es = ts_plugin_dtype_size(out->dtype);
    p.in = (const char *)in->data + in->offset * (int64_t)p.in_es;
    p.out = (char *)out->data + out->offset * (int64_t)out_es;
    for (int d = 0; d < in->ndim; d++) {
        int64_t ni = in->shape[d], no = out->shape[d];
        int reduced = arg ? d == dim : no == 1 && ni != 1; /* shapes checked */
        if (reduced) {
            p.nslice *= ni;
            /* Merge with the previous reduced dim when this one is contiguous inside it: the
             * row-major slice index stays the same, kept dims in between or not. */
            if (p.nred > 0 && p.red_in[p.nred - 1] == in->strides[d] * ni) {
                p.red_shape[p.nred - 1] *= ni;
                p.red_in[p.nred - 1] = in->strides[d];
            } else {
                p.red_shape[p.nred] = ni;
                p.red_in[p.nred++] = in->strides[d];
            }
        } else if (ni != 1) {
            p.nout *= ni;
            p.keep_shape[p.nkeep] = ni;
            p.keep_in[p.nkeep] = in->strides[d];
            p.keep_out[p.nkeep++] = out->strides[d];
        }
    }
    if (p.nred == 0) { /* nothing reduced: a slice is one element */
        p.red_shape[0] = 1;
        p.red_in[0] = 0;
        p.nred = 1;
    }
    if (p.nout == 0)
        return TS_OK;
    /* 16-bit floats: read as they are by the sums over rows, widened first otherwise */
    if (ts_plugin_dtype_is_half(p.dtype) && !rd_by_rows(&p))
        return hk_via_float32(hd->host, 0, call, hk_convert, hd, reduce_f32, hd);
    if (p.nslice == 0 && fn != TS_REDUCE_SUM && fn != TS_REDUCE_MEAN)
        return hd->host->fail(hd->host, TS_EINVAL,
                              "reduce %s over an empty dim has no result (input has 0 elements "
                              "along a reduced dim)",
                              what);
    rd_execute(hd, &p, out_es);
    return TS_OK;
}

/* ---- softmax --------------------------------------------------------------------------- */

/* One slice of len elements: x at stride sx, y at stride sy (y may be x: in place). Rows are
 * shifted by their max so exp never overflows; the sum is accumulated in double. */
#define SOFTMAX_SLICE(T, EXPF)                                                                     \
    do {                                                                                           \
        const T *x = (const T *)px;                                                                \
        T *y = (T *)py;                                                                            \
        T m = x[0];                                                                                \
        for (int64_t i = 1; i < len; i++)                                                          \
            if (x[i * sx] > m || x[i * sx] != x[i * sx])                                           \
                m = x[i * sx];                                                                     \
        double sum = 0;                                                                            \
        if (log_form) {                                                                            \
            for (int64_t i = 0; i < len; i++)                                                      \
                sum += (double)EXPF(x[i * sx] - m);                                                \
            T lse = (T)log(sum);                                                                   \
            for (int64_t i = 0; i < len; i++)                                                      \
                y[i * sy] = x[i * sx] - m - lse;                                                   \
        } else {                                                                                   \
            for (int64_t i = 0; i < len; i++) {                                                    \
                T e = EXPF(x[i * sx] - m);                                                         \
                sum += (double)e;                                                                  \
                y[i * sy] = e;                                                                     \
            }                                                                                      \
            T inv = (T)(1.0 / sum);                                                                \
            for (int64_t i = 0; i < len; i++)                                                      \
                y[i * sy] *= inv;                                                                  \
        }                                                                                          \
    } while (0)

/* A float32 slice with unit strides, vectorized: the max (NaN if any element is NaN, as the
 * strided loop gives), exp and its sum in double lanes, then the scale. */
HK_CLONES static void softmax_f32_contig(const float *x, float *y, int64_t len,
                                         int log_form)
{
    const float m = hk_max_nan_f32(x, len);
    if (log_form) {
        const float lse = (float)log(hk_exp_shift_sum_f32(x, m, NULL, len));
#pragma omp simd
        for (int64_t i = 0; i < len; i++)
            y[i] = x[i] - m - lse;
        return;
    }
    /* A masked tail (a causal mask's -inf up to the row's end: half of each row on average)
     * gives exactly 0 and adds 0 to the sum: in a row of a multiple of 16 with a finite max
     * the exp stops at the last block of 16 that is not all -inf, the tail is written 0, and
     * the sum runs over the whole row in a pass of its own, so that a row gives the same bits
     * cut or not, whatever the compiler's vector lanes (tests/unit/test-half). Any other row
     * (a NaN, every element -inf, a length not a multiple of 16) as one pass. */
    double sum;
    if (len % 16 == 0 && m > -__builtin_inff() && m < __builtin_inff()) {
        int64_t n = len;
        while (n >= 16) {
            int tail = 1;
#pragma omp simd reduction(& : tail)
            for (int64_t i = n - 16; i < n; i++)
                tail &= x[i] == -__builtin_inff();
            if (!tail)
                break;
            n -= 16;
        }
#pragma omp simd
        for (int64_t i = 0; i < n; i++)
            y[i] = hk_expf(x[i] - m);
        for (int64_t i = n; i < len; i++)
            y[i] = 0.0f;
        sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int64_t i = 0; i < len; i++)
            sum += (double)y[i];
    } else {
        sum = hk_exp_shift_sum_f32(x, m, y, len);
    }
    const float inv = (float)(1.0 / sum);
#pragma omp simd
    for (int64_t i = 0; i < len; i++)
        y[i] *= inv;
}

/* Softmax's gradient over one slice: y * (g - sum(g * y)), each product rounded to T and the
 * sum accumulated in double, as the composed mul, sum, sub and mul compute it. */
#define SOFTMAX_BWD_SLICE(T)                                                                       \
    do {                                                                                           \
        const T *y = (const T *)px, *g = (const T *)pg;                                            \
        T *o = (T *)py;                                                                            \
        double sum = 0;                                                                            \
        for (int64_t i = 0; i < len; i++) {                                                        \
            T p = g[i * sg] * y[i * sx];                                                           \
            sum += (double)p;                                                                      \
        }                                                                                          \
        const T dot = (T)sum;                                                                      \
        for (int64_t i = 0; i < len; i++)                                                          \
            o[i * sy] = y[i * sx] * (g[i * sg] - dot);                                             \
    } while (0)

/* The float32 slice with unit strides, vectorized (the sum in double lanes). o may be y or g. */
HK_CLONES static void softmax_bwd_f32_contig(const float *y, const float *g, float *o,
                                             int64_t len)
{
    double sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < len; i++) {
        float p = g[i] * y[i];
        sum += (double)p;
    }
    const float s = (float)sum;
#pragma omp simd
    for (int64_t i = 0; i < len; i++)
        o[i] = y[i] * (g[i] - s);
}

/* A 16-bit slice with unit strides (hk_half_native_call admits only those, of at most
 * HK_HALF_ROW elements): widened into float32 rows, the float32 slice's arithmetic, the
 * result rounded once to 16 bits: the bits of the float32 kernel run on the widened values. */
static void softmax_half_contig(int32_t dt, int bwd, const void *px, const void *pg, void *py,
                                int64_t len)
{
    float a[HK_HALF_ROW], b[HK_HALF_ROW];
    hk_widen_half(a, px, len, dt);
    if (bwd) {
        hk_widen_half(b, pg, len, dt);
        softmax_bwd_f32_contig(a, b, a, len);
    } else {
        softmax_f32_contig(a, a, len, 0);
    }
    hk_narrow_half(py, a, len, dt);
}

/* in (and g for the backward), out: the same shape, any strides; along params.dim. */
static ts_status run_softmax(hk_dev *hd, const ts_kernel_call *call)
{
    int log_form = call->op == TS_OP_LOG_SOFTMAX, bwd = call->op == TS_OP_SOFTMAX_BWD;
    int dim;
    ts_status s = hk_softmax_check(hd->host, 0, call, &dim);
    if (s)
        return s;
    const ts_operand *in = &call->inputs[0], *out = &call->outputs[0];
    const ts_operand *gin = bwd ? &call->inputs[1] : in;
    /* The other dims, as an odometer over slices. */
    int nouter = 0;
    int64_t oshape[TS_MAX_DIMS], ostr_in[TS_MAX_DIMS], ostr_g[TS_MAX_DIMS];
    int64_t ostr_out[TS_MAX_DIMS], nslices = 1;
    for (int d = 0; d < in->ndim; d++) {
        if (d == dim)
            continue;
        oshape[nouter] = in->shape[d];
        ostr_in[nouter] = in->strides[d];
        ostr_g[nouter] = gin->strides[d];
        ostr_out[nouter++] = out->strides[d];
        nslices *= in->shape[d];
    }
    int64_t len = in->ndim ? in->shape[dim] : 1;
    int64_t sx = in->ndim ? in->strides[dim] : 0, sy = in->ndim ? out->strides[dim] : 0;
    int64_t sg = in->ndim ? gin->strides[dim] : 0;
    if (nslices == 0 || len == 0)
        return TS_OK;
    size_t es = ts_plugin_dtype_size(in->dtype);
    const char *xbase = (const char *)in->data + in->offset * (int64_t)es;
    const char *gbase = (const char *)gin->data + gin->offset * (int64_t)es;
    char *ybase = (char *)out->data + out->offset * (int64_t)es;
    int32_t dtype = in->dtype;
    /* 16-bit rows reach here only as hk_half_native_call admits them (dense, at most
     * HK_HALF_ROW: the row buffers are on the stack); anything else is a caller's bug */
    if (ts_plugin_dtype_is_half(dtype) &&
        (len > HK_HALF_ROW || (len > 1 && (sx != 1 || sy != 1 || (bwd && sg != 1)))))
        return hd->host->fail(hd->host, TS_ENOTSUP,
                              "%s: %s rows must be dense and at most %d long here; run it "
                              "through float32 (hk_via_float32)",
                              ts_plugin_op_name(call->op), ts_plugin_dtype_name(dtype),
                              (int)HK_HALF_ROW);
    /* exp: costly elements; the backward's are cheap */
    int nt = run_for(hd, threads_for(hd, nslices * len * (bwd ? 2 : 8)));
    (void)nt;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && nslices > 1)
    for (int64_t j = 0; j < nslices; j++) {
        int64_t rem = j, xo = 0, go = 0, yo = 0;
        for (int d = nouter - 1; d >= 0; d--) {
            int64_t i = rem % oshape[d];
            rem /= oshape[d];
            xo += i * ostr_in[d];
            go += i * ostr_g[d];
            yo += i * ostr_out[d];
        }
        const char *px = xbase + xo * (int64_t)es, *pg = gbase + go * (int64_t)es;
        char *py = ybase + yo * (int64_t)es;
        int dense = sx == 1 && sy == 1 && (!bwd || sg == 1);
        if (ts_plugin_dtype_is_half(dtype))
            softmax_half_contig(dtype, bwd, px, pg, py, len);
        else if (bwd && dtype == TS_F32 && dense)
            softmax_bwd_f32_contig((const float *)px, (const float *)pg, (float *)py, len);
        else if (bwd && dtype == TS_F32)
            SOFTMAX_BWD_SLICE(float);
        else if (bwd)
            SOFTMAX_BWD_SLICE(double);
        else if (dtype == TS_F32 && dense)
            softmax_f32_contig((const float *)px, (float *)py, len, log_form);
        else if (dtype == TS_F32)
            SOFTMAX_SLICE(float, hk_expf);
        else
            SOFTMAX_SLICE(double, exp);
    }
    return TS_OK;
}

/* ---- entry points ---------------------------------------------------------------------- */

int hk_reduce_supports(int32_t op, int32_t dtype)
{
    return (op == TS_OP_REDUCE || op == TS_OP_SOFTMAX || op == TS_OP_LOG_SOFTMAX ||
            op == TS_OP_SOFTMAX_BWD) &&
           hk_op_defined(op, dtype);
}

ts_status hk_reduce(hk_dev *hd, const ts_kernel_call *call)
{
    switch (call->op) {
    case TS_OP_REDUCE:
        return run_reduce(hd, call);
    case TS_OP_SOFTMAX:
    case TS_OP_LOG_SOFTMAX:
    case TS_OP_SOFTMAX_BWD:
        return run_softmax(hd, call);
    default:
        return TS_ENOTSUP;
    }
}
