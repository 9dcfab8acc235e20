/* kernels/host/hostkern.c: dispatch of the shared host kernels to their families. */
#include "hostkern.h"

typedef struct family {
    int (*supports)(int32_t op, int32_t dtype);
    ts_status (*run)(hk_dev *hd, const ts_kernel_call *call);
} family;

static const family families[] = {
    {hk_elementwise_supports, hk_elementwise},
    {hk_reduce_supports, hk_reduce},
    {hk_index_supports, hk_index},
    {hk_pool2d_supports, hk_pool2d},
    {hk_loss_supports, hk_loss},
    {hk_optimizer_supports, hk_optimizer},
    {hk_norm_supports, hk_norm},
    {hk_attention_supports, hk_attention},
};

int hk_supports(int32_t op, int32_t dtype)
{
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        if (families[i].supports(op, dtype))
            return 1;
    return 0;
}

static ts_status run_families(void *hd, const ts_kernel_call *call)
{
    return hk_run(hd, call);
}

ts_status hk_run(hk_dev *hd, const ts_kernel_call *call)
{
    if (hk_call_has_half(call) && !hk_half_native_call(call))
        return hk_via_float32(hd->host, 0, call, hk_convert, hd, run_families, hd);
    int32_t dtype = call->noutputs > 0 ? call->outputs[0].dtype : TS_F32;
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        if (families[i].supports(call->op, dtype))
            return families[i].run(hd, call);
    return TS_ENOTSUP;
}
