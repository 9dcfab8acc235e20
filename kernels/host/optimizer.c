/* kernels/host/optimizer.c: fused optimizer updates on host memory, one pass over each
 * parameter (read grad, update state and parameter in place), threaded from 8192 elements
 * (an Adam element moves 28 bytes and takes a square root and a division: about ten times an
 * add's, whose threshold is 65536; at 65536 every matrix of the default GPT ran on one
 * thread). Each element's update is independent: the bits do not depend on the threads. The
 * arithmetic follows ts_sgd_params / ts_adam_params in plugin.h, in the parameter's dtype. */
#include <math.h>

#include "hostkern.h"

int hk_optimizer_supports(int32_t op, int32_t dtype)
{
    return (op == TS_OP_SGD_STEP || op == TS_OP_ADAM_STEP) && hk_op_defined(op, dtype);
}

/* The flags are loop-invariant selects, not branches, so that the loops vectorize; a select
 * computes both sides and keeps one, so wd * p (NaN for an infinite p) is dropped unused
 * exactly as a branch would skip it. */
#define SGD_LOOP(T)                                                                         \
    do {                                                                                    \
        const T *g = (const T *)call->inputs[0].data + call->inputs[0].offset;             \
        T *p = (T *)call->outputs[0].data + call->outputs[0].offset;                       \
        T *buf = mom ? (T *)call->outputs[1].data + call->outputs[1].offset : NULL;        \
        const T lr = (T)P->lr, mu = (T)P->momentum, damp = (T)(1 - P->dampening),          \
                wd = (T)P->weight_decay;                                                    \
        const int first = P->first_step != 0, nest = P->nesterov != 0, has_wd = wd != 0;   \
        if (!buf) {                                                                         \
            _Pragma("omp parallel for simd num_threads(threads) if(n > 8192) schedule(static)") \
            for (int64_t i = 0; i < n; i++) {                                               \
                T pi = p[i];                                                                \
                p[i] = pi - lr * (g[i] + (has_wd ? wd * pi : (T)0));                        \
            }                                                                               \
            break;                                                                          \
        }                                                                                   \
        _Pragma("omp parallel for simd num_threads(threads) if(n > 8192) schedule(static)") \
        for (int64_t i = 0; i < n; i++) {                                                   \
            T pi = p[i];                                                                    \
            T d = g[i] + (has_wd ? wd * pi : (T)0);                                         \
            T b = first ? d : mu * buf[i] + damp * d;                                       \
            buf[i] = b;                                                                     \
            p[i] = pi - lr * (nest ? d + mu * b : b);                                       \
        }                                                                                   \
    } while (0)

#define ADAM_LOOP(T, SQRT)                                                                  \
    do {                                                                                    \
        const T *g = (const T *)call->inputs[0].data + call->inputs[0].offset;             \
        T *p = (T *)call->outputs[0].data + call->outputs[0].offset;                       \
        T *m = (T *)call->outputs[1].data + call->outputs[1].offset;                       \
        T *v = (T *)call->outputs[2].data + call->outputs[2].offset;                       \
        const T b1 = (T)P->beta1, b2 = (T)P->beta2, ob1 = (T)(1 - P->beta1),               \
                ob2 = (T)(1 - P->beta2), eps = (T)P->eps, wd = (T)P->weight_decay,          \
                decay = (T)(1 - P->lr * P->weight_decay),                                   \
                inv_bc2 = (T)(1 / sqrt(1 - pow(P->beta2, (double)P->step))),                \
                step = (T)(P->lr / (1 - pow(P->beta1, (double)P->step)));                   \
        /* Branch-free, so that it vectorizes (one vector sqrt and divide per lane group; the \
         * build has no math errno): AdamW scales p by decay, Adam adds wd * p to g. */      \
        const T pscale = P->decoupled ? decay : (T)1, gwd = P->decoupled ? (T)0 : wd;       \
        _Pragma("omp parallel for simd num_threads(threads) if(n > 8192) schedule(static)") \
        for (int64_t i = 0; i < n; i++) {                                                   \
            T pi = p[i], gi = g[i] + gwd * pi;                                              \
            T mi = b1 * m[i] + ob1 * gi, vi = b2 * v[i] + ob2 * gi * gi;                    \
            m[i] = mi;                                                                      \
            v[i] = vi;                                                                      \
            p[i] = pi * pscale - step * mi / (SQRT(vi) * inv_bc2 + eps);                    \
        }                                                                                   \
    } while (0)

ts_status hk_optimizer(hk_dev *hd, const ts_kernel_call *call)
{
    const ts_host *h = hd->host;
    int threads = hk_threads(hd);
    if (call->op == TS_OP_SGD_STEP) {
        ts_status s = hk_optimizer_check(h, 0, call);
        if (s)
            return s;
        const ts_sgd_params *P = call->params;
        int mom = P->momentum != 0;
        int64_t n = 1;
        for (int d = 0; d < call->inputs[0].ndim; d++)
            n *= call->inputs[0].shape[d];
        if (call->inputs[0].dtype == TS_F32)
            SGD_LOOP(float);
        else
            SGD_LOOP(double);
        return TS_OK;
    }
    if (call->op == TS_OP_ADAM_STEP) {
        ts_status s = hk_optimizer_check(h, 0, call);
        if (s)
            return s;
        const ts_adam_params *P = call->params;
        int64_t n = 1;
        for (int d = 0; d < call->inputs[0].ndim; d++)
            n *= call->inputs[0].shape[d];
        if (call->inputs[0].dtype == TS_F32)
            ADAM_LOOP(float, sqrtf);
        else
            ADAM_LOOP(double, sqrt);
        return TS_OK;
    }
    return TS_ENOTSUP;
}
