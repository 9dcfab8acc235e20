/* plugins/common/elementwise.c: elementwise host kernels. For now only TS_OP_COPY; the rest of
 * the family lands with the tensor-core issue. */
#include "hostkern.h"

int ts_hostkern_elementwise_supports(int32_t op, int32_t dtype)
{
    return op == TS_OP_COPY && ts_hostdev_dtype_size(dtype) != 0;
}

ts_status ts_hostkern_elementwise(ts_hostdev *hd, const ts_kernel_call *call)
{
    if (call->op != TS_OP_COPY)
        return TS_ENOTSUP;
    if (call->ninputs != 1 || call->noutputs != 1)
        return hd->host->fail(hd->host, TS_EINVAL, "copy: expected 1 input and 1 output");
    return ts_hostdev_copy_strided(&call->outputs[0], &call->inputs[0]);
}
