/* plugins/common/reduce.c: placeholder until the reduce kernels land; supports nothing. */
#include "hostkern.h"

int ts_hostkern_reduce_supports(int32_t op, int32_t dtype)
{
    (void)op;
    (void)dtype;
    return 0;
}

ts_status ts_hostkern_reduce(ts_hostdev *hd, const ts_kernel_call *call)
{
    (void)hd;
    (void)call;
    return TS_ENOTSUP;
}
