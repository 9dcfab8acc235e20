/* kernels/host/index.c: TS_OP_INDEX_SELECT (gather along a dim) and TS_OP_INDEX_ADD
 * (scatter-add along a dim) for every dtype, with TS_I64 or TS_I32 indices, each range-checked
 * before any element moves. Work is split over the dims other than the indexed one, so one
 * thread owns each output element and duplicate indices of INDEX_ADD accumulate in order. */
#include "hostkern.h"

int hk_index_supports(int32_t op, int32_t dtype)
{
    return (op == TS_OP_INDEX_SELECT || op == TS_OP_INDEX_ADD) && hk_op_defined(op, dtype);
}

static int64_t index_at(const ts_operand *ix, int64_t i)
{
    int64_t off = ix->offset + i * ix->strides[0];
    return ix->dtype == TS_I64 ? ((const int64_t *)ix->data)[off]
                               : (int64_t)((const int32_t *)ix->data)[off];
}

/* The walk shared by both ops. "dst" and "src" are out and in[0]; along dim, dst moves by
 * dstep(i) and src by sstep(i), i over the n indices. The other dims split into outer (before
 * dim) x mid (between dim and the last) x chunks of the last dim: one work item each. */
typedef struct walk {
    const ts_operand *dst, *src, *ix;
    int dim, nd, add;
    int64_t n;           /* len(ix) */
    int64_t last, chunk; /* the last dim's length (1 when dim is last) and its chunk size */
} walk;

#define WALK(T, NAME)                                                                       \
    static void NAME(const walk *k, int64_t items, int threads)                            \
    {                                                                                       \
        T *dd = (T *)k->dst->data;                                                          \
        const T *sd = (const T *)k->src->data;                                              \
        int64_t nchunks = (k->last + k->chunk - 1) / k->chunk;                              \
        int lastd = k->dim == k->nd - 1 ? -1 : k->nd - 1;                                   \
        int64_t dls = lastd >= 0 ? k->dst->strides[lastd] : 0;                              \
        int64_t sls = lastd >= 0 ? k->src->strides[lastd] : 0;                              \
        int par = items > 1 && items * k->n * k->chunk > 32768;                             \
        (void)par;                                                                          \
        _Pragma("omp parallel for num_threads(threads) schedule(static) if(par)")           \
        for (int64_t it = 0; it < items; it++) {                                            \
            int64_t rest = it / nchunks, t0 = it % nchunks * k->chunk;                      \
            int64_t t1 = t0 + k->chunk < k->last ? t0 + k->chunk : k->last;                 \
            int64_t doff = k->dst->offset, soff = k->src->offset;                           \
            for (int d = k->nd - 1; d >= 0; d--) {                                          \
                if (d == k->dim || d == lastd)                                              \
                    continue;                                                               \
                int64_t c = rest % k->dst->shape[d];                                        \
                rest /= k->dst->shape[d];                                                   \
                doff += c * k->dst->strides[d];                                             \
                soff += c * k->src->strides[d];                                             \
            }                                                                               \
            for (int64_t i = 0; i < k->n; i++) {                                            \
                int64_t j = index_at(k->ix, i);                                             \
                /* select: dst[i] = src[j]; add: dst[j] += src[i] */                        \
                int64_t dp = doff + (k->add ? j : i) * k->dst->strides[k->dim];             \
                int64_t sp = soff + (k->add ? i : j) * k->src->strides[k->dim];             \
                if (k->add)                                                                 \
                    for (int64_t t = t0; t < t1; t++)                                       \
                        dd[dp + t * dls] = (T)(dd[dp + t * dls] + sd[sp + t * sls]);        \
                else                                                                        \
                    for (int64_t t = t0; t < t1; t++)                                       \
                        dd[dp + t * dls] = sd[sp + t * sls];                                \
            }                                                                               \
        }                                                                                   \
    }
WALK(float, walk_f32)
WALK(double, walk_f64)
WALK(int32_t, walk_i32)
WALK(int64_t, walk_i64)
WALK(uint8_t, walk_u8)

/* select: in[0] data (..., D, ...), in[1] idx (n) -> out (..., n, ...);
 * add: out (..., D, ...) += in[0] (..., n, ...) at idx (n). */
ts_status hk_index(hk_dev *hd, const ts_kernel_call *call)
{
    const ts_host *h = hd->host;
    if (call->op != TS_OP_INDEX_SELECT && call->op != TS_OP_INDEX_ADD)
        return TS_ENOTSUP;
    int add = call->op == TS_OP_INDEX_ADD;
    const char *name = add ? "index_add" : "index_select";
    int dim;
    ts_status s = hk_index_check(h, 0, call, &dim);
    if (s)
        return s;
    const ts_operand *src = &call->inputs[0], *ix = &call->inputs[1], *dst = &call->outputs[0];
    int nd = dst->ndim;
    int64_t n = ix->shape[0];
    /* size: the length of the indexed dim; the other operand has n there. */
    int64_t size = (add ? dst : src)->shape[dim];
    for (int64_t i = 0; i < n; i++) {
        int64_t j = index_at(ix, i);
        if (j < 0 || j >= size)
            return h->fail(h, TS_EINVAL, "%s: index %lld (at position %lld) is out of range "
                           "for dim %d of size %lld", name, (long long)j, (long long)i, dim,
                           (long long)size);
    }
    int64_t items = 1;
    for (int d = 0; d < nd; d++)
        if (d != dim && d != nd - 1)
            items *= dst->shape[d];
    walk k = {.dst = dst, .src = src, .ix = ix, .dim = dim, .nd = nd, .add = add, .n = n};
    k.last = dim == nd - 1 ? 1 : dst->shape[nd - 1];
    if (items == 0 || k.last == 0 || n == 0)
        return TS_OK;
    /* Split long rows so that dim-0 ops on matrices still spread over the threads. */
    k.chunk = k.last > 1024 ? 1024 : k.last;
    items *= (k.last + k.chunk - 1) / k.chunk;
    int th = hk_threads(hd);
    switch (dst->dtype) {
    case TS_F32: walk_f32(&k, items, th); break;
    case TS_F64: walk_f64(&k, items, th); break;
    case TS_I32: walk_i32(&k, items, th); break;
    case TS_I64: walk_i64(&k, items, th); break;
    case TS_U8: walk_u8(&k, items, th); break;
    default: return h->fail(h, TS_EINVAL, "%s: unknown dtype %d", name, (int)dst->dtype);
    }
    return TS_OK;
}
