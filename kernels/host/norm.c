/* kernels/host/norm.c: layer norm in one pass per row each way (TS_OP_LAYER_NORM and its
 * backward), on contiguous operands. Statistics accumulate in double for every dtype: the
 * mean first, then the variance around it (two passes over a row that is in cache), so a row
 * with a large mean keeps its precision. Rows run on hd->threads OpenMP threads; the weight
 * and bias gradients, sums over rows, are accumulated by one thread per block of columns. */
#include <math.h>
#include <string.h>

#include "hostkern.h"

int hk_norm_supports(int32_t op, int32_t dtype)
{
    return (op == TS_OP_LAYER_NORM || op == TS_OP_LAYER_NORM_BWD) &&
           (dtype == TS_F32 || dtype == TS_F64);
}


#define AT(o, T) ((T *)(o).data + (o).offset)

static int64_t numel(const ts_operand *o)
{
    int64_t n = 1;
    for (int d = 0; d < o->ndim; d++)
        n *= o->shape[d];
    return n;
}

#define LN_FWD(T)                                                                           \
    do {                                                                                    \
        const T *x = AT(call->inputs[0], const T);                                          \
        const T *w = affine ? AT(call->inputs[1], const T) : NULL;                         \
        const T *b = affine ? AT(call->inputs[2], const T) : NULL;                         \
        T *y = AT(call->outputs[0], T), *mean = AT(call->outputs[1], T),                    \
          *rstd = AT(call->outputs[2], T);                                                  \
        _Pragma("omp parallel for num_threads(nt) schedule(static) if(nt > 1)")             \
        for (int64_t r = 0; r < rows; r++) {                                                \
            const T *xr = x + r * D;                                                        \
            T *yr = y + r * D;                                                              \
            double sum = 0, v = 0;                                                          \
            for (int64_t j = 0; j < D; j++)                                                 \
                sum += (double)xr[j];                                                       \
            double mu = sum / (double)D;                                                    \
            for (int64_t j = 0; j < D; j++) {                                               \
                double d = (double)xr[j] - mu;                                              \
                v += d * d;                                                                 \
            }                                                                               \
            double rs = 1 / sqrt(v / (double)D + P->eps);                                   \
            mean[r] = (T)mu;                                                                \
            rstd[r] = (T)rs;                                                                \
            const T m_ = (T)mu, s_ = (T)rs;                                                 \
            if (w) {                                                                        \
                for (int64_t j = 0; j < D; j++)                                             \
                    yr[j] = (xr[j] - m_) * s_ * w[j] + b[j];                                \
            } else {                                                                        \
                for (int64_t j = 0; j < D; j++)                                             \
                    yr[j] = (xr[j] - m_) * s_;                                              \
            }                                                                               \
        }                                                                                   \
    } while (0)

/* gx = rstd * (gy w - mean_j(gy w) - xhat mean_j(gy w xhat)), xhat = (x - mean) rstd;
 * gw = sum_rows gy xhat, gb = sum_rows gy. */
#define LN_BWD(T)                                                                           \
    do {                                                                                    \
        const T *gy = AT(call->inputs[0], const T), *x = AT(call->inputs[1], const T);      \
        const T *mean = AT(call->inputs[2], const T), *rstd = AT(call->inputs[3], const T); \
        const T *w = affine ? AT(call->inputs[4], const T) : NULL;                         \
        T *gx = AT(call->outputs[0], T);                                                    \
        _Pragma("omp parallel for num_threads(nt) schedule(static) if(nt > 1)")             \
        for (int64_t r = 0; r < rows; r++) {                                                \
            const T *gr = gy + r * D, *xr = x + r * D;                                      \
            T *gxr = gx + r * D;                                                            \
            const double mu = (double)mean[r], rs = (double)rstd[r];                       \
            double a = 0, c = 0;                                                            \
            for (int64_t j = 0; j < D; j++) {                                               \
                double gw_ = (double)gr[j] * (w ? (double)w[j] : 1.0);                     \
                a += gw_;                                                                   \
                c += gw_ * ((double)xr[j] - mu) * rs;                                       \
            }                                                                               \
            a /= (double)D;                                                                 \
            c /= (double)D;                                                                 \
            for (int64_t j = 0; j < D; j++) {                                               \
                double gw_ = (double)gr[j] * (w ? (double)w[j] : 1.0);                     \
                double xh = ((double)xr[j] - mu) * rs;                                      \
                gxr[j] = (T)(rs * (gw_ - a - xh * c));                                      \
            }                                                                               \
        }                                                                                   \
        if (affine) {                                                                       \
            T *gw = AT(call->outputs[1], T), *gb = AT(call->outputs[2], T);                 \
            _Pragma("omp parallel for num_threads(nt) schedule(static) if(nt > 1)")         \
            for (int64_t j0 = 0; j0 < D; j0 += 64) {                                        \
                int64_t j1 = j0 + 64 < D ? j0 + 64 : D;                                     \
                double sw[64] = {0}, sb[64] = {0};                                          \
                for (int64_t r = 0; r < rows; r++) {                                        \
                    const T *gr = gy + r * D, *xr = x + r * D;                              \
                    const double mu = (double)mean[r], rs = (double)rstd[r];               \
                    for (int64_t j = j0; j < j1; j++) {                                     \
                        sw[j - j0] += (double)gr[j] * ((double)xr[j] - mu) * rs;            \
                        sb[j - j0] += (double)gr[j];                                        \
                    }                                                                       \
                }                                                                           \
                for (int64_t j = j0; j < j1; j++) {                                         \
                    gw[j] = (T)sw[j - j0];                                                  \
                    gb[j] = (T)sb[j - j0];                                                  \
                }                                                                           \
            }                                                                               \
        }                                                                                   \
    } while (0)

ts_status hk_norm(hk_dev *hd, const ts_kernel_call *call)
{
    int bwd = call->op == TS_OP_LAYER_NORM_BWD;
    if (call->op != TS_OP_LAYER_NORM && !bwd)
        return TS_ENOTSUP;
    int affine = 0;
    int64_t rows = 0, D = 0;
    ts_status s = hk_norm_check(hd->host, call, bwd, &affine, &rows, &D);
    if (s)
        return s;
    if (rows == 0 || D == 0) { /* nothing to normalize; gradients of nothing are zero */
        for (int i = 1; bwd && affine && i < 3; i++) {
            const ts_operand *o = &call->outputs[i];
            memset(AT(*o, char), 0, (size_t)numel(o) * ts_plugin_dtype_size(o->dtype));
        }
        return TS_OK;
    }
    const ts_layer_norm_params *P = call->params;
    int nt = rows * D > 32768 ? hd->threads : 1;
    (void)nt; /* the reference flavour has no parallel regions */
    if (call->inputs[0].dtype == TS_F32) {
        if (bwd)
            LN_BWD(float);
        else
            LN_FWD(float);
    } else {
        if (bwd)
            LN_BWD(double);
        else
            LN_FWD(double);
    }
    return TS_OK;
}
