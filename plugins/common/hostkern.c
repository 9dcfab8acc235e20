/* plugins/common/hostkern.c: dispatch of the shared host kernels to their families. */
#include "hostkern.h"

typedef struct family {
    int (*supports)(int32_t op, int32_t dtype);
    ts_status (*run)(ts_hostdev *hd, const ts_kernel_call *call);
} family;

static const family families[] = {
    {ts_hostkern_elementwise_supports, ts_hostkern_elementwise},
    {ts_hostkern_reduce_supports, ts_hostkern_reduce},
    {ts_hostkern_index_supports, ts_hostkern_index},
    {ts_hostkern_pool2d_supports, ts_hostkern_pool2d},
    {ts_hostkern_loss_supports, ts_hostkern_loss},
    {ts_hostkern_optimizer_supports, ts_hostkern_optimizer},
};

int ts_hostkern_supports(int32_t op, int32_t dtype)
{
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        if (families[i].supports(op, dtype))
            return 1;
    return 0;
}

ts_status ts_hostkern_run(ts_hostdev *hd, const ts_kernel_call *call)
{
    int32_t dtype = call->noutputs > 0 ? call->outputs[0].dtype : TS_F32;
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        if (families[i].supports(call->op, dtype))
            return families[i].run(hd, call);
    return TS_ENOTSUP;
}
