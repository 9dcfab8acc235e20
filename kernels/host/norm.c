/* kernels/host/norm.c: layer norm in one pass per row each way (TS_OP_LAYER_NORM and its
 * backward), on contiguous operands. Statistics accumulate in double for every dtype: the
 * mean first, then the variance around it (two passes over a row that is in cache), so a row
 * with a large mean keeps its precision. Rows run on hd->threads OpenMP threads; the weight
 * and bias gradients, sums over rows, are accumulated by one thread per block of columns. */
#include <math.h>
#include <string.h>

#include "hostkern.h"
#include "vmath.h"

int hk_norm_supports(int32_t op, int32_t dtype)
{
    return (op == TS_OP_LAYER_NORM || op == TS_OP_LAYER_NORM_BWD) && hk_op_defined(op, dtype);
}


#define AT(o, T) ((T *)(o).data + (o).offset)

static int64_t numel(const ts_operand *o)
{
    int64_t n = 1;
    for (int d = 0; d < o->ndim; d++)
        n *= o->shape[d];
    return n;
}

/* One row of the forward: mean and variance in double (two passes), then y. The sums are
 * vectorized (omp simd reductions: double lanes, so their order depends on the vector width,
 * as any vectorized sum does). */
#define LN_FWD_ROW(name, T)                                                                 \
    HK_CLONES static void name(const T *xr, T *yr, const T *w, const T *b, int64_t D,       \
                               double eps, T *mean, T *rstd)                                \
    {                                                                                       \
        double sum = 0, v = 0;                                                              \
        _Pragma("omp simd reduction(+ : sum)")                                              \
        for (int64_t j = 0; j < D; j++)                                                     \
            sum += (double)xr[j];                                                           \
        double mu = sum / (double)D;                                                        \
        _Pragma("omp simd reduction(+ : v)")                                                \
        for (int64_t j = 0; j < D; j++) {                                                   \
            double d = (double)xr[j] - mu;                                                  \
            v += d * d;                                                                     \
        }                                                                                   \
        double rs = 1 / sqrt(v / (double)D + eps);                                          \
        *mean = (T)mu;                                                                      \
        *rstd = (T)rs;                                                                      \
        const T m_ = (T)mu, s_ = (T)rs;                                                     \
        if (w) {                                                                            \
            _Pragma("omp simd")                                                             \
            for (int64_t j = 0; j < D; j++)                                                 \
                yr[j] = (xr[j] - m_) * s_ * w[j] + b[j];                                    \
        } else {                                                                            \
            _Pragma("omp simd")                                                             \
            for (int64_t j = 0; j < D; j++)                                                 \
                yr[j] = (xr[j] - m_) * s_;                                                  \
        }                                                                                   \
    }

/* One row of the gradient w.r.t. x:
 * gx = rstd * (gy w - mean_j(gy w) - xhat mean_j(gy w xhat)), xhat = (x - mean) rstd. */
#define LN_BWD_ROW(name, T)                                                                 \
    HK_CLONES static void name(const T *gr, const T *xr, const T *w, T *gxr, int64_t D,     \
                               double mu, double rs)                                        \
    {                                                                                       \
        double a = 0, c = 0;                                                                \
        _Pragma("omp simd reduction(+ : a, c)")                                             \
        for (int64_t j = 0; j < D; j++) {                                                   \
            double gw_ = (double)gr[j] * (w ? (double)w[j] : 1.0);                          \
            a += gw_;                                                                       \
            c += gw_ * ((double)xr[j] - mu) * rs;                                           \
        }                                                                                   \
        a /= (double)D;                                                                     \
        c /= (double)D;                                                                     \
        _Pragma("omp simd")                                                                 \
        for (int64_t j = 0; j < D; j++) {                                                   \
            double gw_ = (double)gr[j] * (w ? (double)w[j] : 1.0);                          \
            double xh = ((double)xr[j] - mu) * rs;                                          \
            gxr[j] = (T)(rs * (gw_ - a - xh * c));                                          \
        }                                                                                   \
    }

/* The affine gradients of columns [j0, j1) (at most 64): gw = sum_rows gy xhat,
 * gb = sum_rows gy, row by row in order. */
#define LN_AFFINE_COLS(name, T)                                                             \
    HK_CLONES static void name(const T *gy, const T *x, const T *mean, const T *rstd,       \
                               int64_t rows, int64_t D, int64_t j0, int64_t j1, T *gw,      \
                               T *gb)                                                       \
    {                                                                                       \
        double sw[64] = {0}, sb[64] = {0};                                                  \
        const int64_t n = j1 - j0;                                                          \
        for (int64_t r = 0; r < rows; r++) {                                                \
            const T *gr = gy + r * D + j0, *xr = x + r * D + j0;                            \
            const double mu = (double)mean[r], rs = (double)rstd[r];                        \
            _Pragma("omp simd")                                                             \
            for (int64_t j = 0; j < n; j++) {                                               \
                sw[j] += (double)gr[j] * ((double)xr[j] - mu) * rs;                         \
                sb[j] += (double)gr[j];                                                     \
            }                                                                               \
        }                                                                                   \
        for (int64_t j = 0; j < n; j++) {                                                   \
            gw[j0 + j] = (T)sw[j];                                                          \
            gb[j0 + j] = (T)sb[j];                                                          \
        }                                                                                   \
    }

/* float32's affine gradients over a block of 32 columns: the same sums in the same order as
 * ln_affine_cols, kept in eight 8-double vectors (vmath.h's hk_v8d) across the rows instead
 * of 128 doubles on the stack (a load and a store per element and sum), so the same bits. */
#define LN_ACC8(k)                                                                          \
    do {                                                                                    \
        hk_v8d g_, x_;                                                                      \
        HK_LOAD8_F32(g_, gr + 8 * (k));                                                     \
        HK_LOAD8_F32(x_, xr + 8 * (k));                                                     \
        sw[k] += g_ * (x_ - mu) * rs;                                                       \
        sb[k] += g_;                                                                        \
    } while (0)

HK_CLONES static void ln_affine_block32_f32(const float *gy, const float *x, const float *mean,
                                            const float *rstd, int64_t rows, int64_t D,
                                            int64_t j0, float *gw, float *gb)
{
    hk_v8d sw[4] = {{0}}, sb[4] = {{0}};
    for (int64_t r = 0; r < rows; r++) {
        const float *gr = gy + r * D + j0, *xr = x + r * D + j0;
        const double mu = (double)mean[r], rs = (double)rstd[r];
        LN_ACC8(0);
        LN_ACC8(1);
        LN_ACC8(2);
        LN_ACC8(3);
    }
    for (int k = 0; k < 4; k++)
        for (int j = 0; j < 8; j++) {
            gw[j0 + 8 * k + j] = (float)sw[k][j];
            gb[j0 + 8 * k + j] = (float)sb[k][j];
        }
}

LN_FWD_ROW(ln_fwd_row_f32, float)
LN_FWD_ROW(ln_fwd_row_f64, double)
LN_BWD_ROW(ln_bwd_row_f32, float)
LN_BWD_ROW(ln_bwd_row_f64, double)
LN_AFFINE_COLS(ln_affine_cols_f32, float)
LN_AFFINE_COLS(ln_affine_cols_f64, double)

/* The affine gradients gw, gb of every column: float32 in blocks of 32 (a ragged tail as
 * below), float64 64 columns at a time, a block per thread at a time. */
static void ln_affine_f32(const float *gy, const float *x, const float *mean, const float *rstd,
                          int64_t rows, int64_t D, float *gw, float *gb, int nt)
{
    (void)nt; /* the reference flavour has no parallel regions */
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int64_t j0 = 0; j0 < D; j0 += 32) {
        if (j0 + 32 <= D)
            ln_affine_block32_f32(gy, x, mean, rstd, rows, D, j0, gw, gb);
        else
            ln_affine_cols_f32(gy, x, mean, rstd, rows, D, j0, D, gw, gb);
    }
}

static void ln_affine_f64(const double *gy, const double *x, const double *mean,
                          const double *rstd, int64_t rows, int64_t D, double *gw, double *gb,
                          int nt)
{
    (void)nt;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int64_t j0 = 0; j0 < D; j0 += 64)
        ln_affine_cols_f64(gy, x, mean, rstd, rows, D, j0, j0 + 64 < D ? j0 + 64 : D, gw, gb);
}

#define LN_FWD(T, SFX)                                                                      \
    do {                                                                                    \
        const T *x = AT(call->inputs[0], const T);                                          \
        const T *w = affine ? AT(call->inputs[1], const T) : NULL;                         \
        const T *b = affine ? AT(call->inputs[2], const T) : NULL;                         \
        T *y = AT(call->outputs[0], T), *mean = AT(call->outputs[1], T),                    \
          *rstd = AT(call->outputs[2], T);                                                  \
        _Pragma("omp parallel for num_threads(nt) schedule(static) if(nt > 1)")             \
        for (int64_t r = 0; r < rows; r++)                                                  \
            ln_fwd_row_##SFX(x + r * D, y + r * D, w, b, D, P->eps, mean + r, rstd + r);    \
    } while (0)

#define LN_BWD(T, SFX)                                                                      \
    do {                                                                                    \
        const T *gy = AT(call->inputs[0], const T), *x = AT(call->inputs[1], const T);      \
        const T *mean = AT(call->inputs[2], const T), *rstd = AT(call->inputs[3], const T); \
        const T *w = affine ? AT(call->inputs[4], const T) : NULL;                         \
        T *gx = AT(call->outputs[0], T);                                                    \
        _Pragma("omp parallel for num_threads(nt) schedule(static) if(nt > 1)")             \
        for (int64_t r = 0; r < rows; r++)                                                  \
            ln_bwd_row_##SFX(gy + r * D, x + r * D, w, gx + r * D, D, (double)mean[r],      \
                             (double)rstd[r]);                                              \
        if (affine) {                                                                       \
            T *gw = AT(call->outputs[1], T), *gb = AT(call->outputs[2], T);                 \
            ln_affine_##SFX(gy, x, mean, rstd, rows, D, gw, gb, nt);                        \
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
    int nt = rows * D > 32768 ? hk_threads(hd) : 1;
    (void)nt; /* the reference flavour has no parallel regions */
    if (call->inputs[0].dtype == TS_F32) {
        if (bwd)
            LN_BWD(float, f32);
        else
            LN_FWD(float, f32);
    } else {
        if (bwd)
            LN_BWD(double, f64);
        else
            LN_FWD(double, f64);
    }
    return TS_OK;
}
