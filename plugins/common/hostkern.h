/* plugins/common/hostkern.h: kernels on host memory shared by the CPU plugins, one file per
 * family. Each family function handles the ops of its family and returns TS_ENOTSUP (with no
 * message) for anything else; ts_hostkern_run tries them in turn. Operands may have any
 * strides (0 for broadcast dims); dtypes per op as plugin.h documents. Large loops run on
 * hd->threads OpenMP threads. Errors go through hd->host->fail. */
#ifndef TESSERA_PLUGINS_HOSTKERN_H
#define TESSERA_PLUGINS_HOSTKERN_H

#include "hostdev.h"

/* Non-zero if the shared host kernels implement op for the output dtype. */
int ts_hostkern_supports(int32_t op, int32_t dtype);

/* Runs op if the shared host kernels implement it; TS_ENOTSUP (no message) otherwise. */
ts_status ts_hostkern_run(ts_hostdev *hd, const ts_kernel_call *call);

/* Families (elementwise.c, reduce.c, index.c, pool2d.c, loss.c). Same contract as ts_hostkern_run. */
int ts_hostkern_elementwise_supports(int32_t op, int32_t dtype);
ts_status ts_hostkern_elementwise(ts_hostdev *hd, const ts_kernel_call *call);
int ts_hostkern_reduce_supports(int32_t op, int32_t dtype);
ts_status ts_hostkern_reduce(ts_hostdev *hd, const ts_kernel_call *call);
int ts_hostkern_index_supports(int32_t op, int32_t dtype);
ts_status ts_hostkern_index(ts_hostdev *hd, const ts_kernel_call *call);
int ts_hostkern_pool2d_supports(int32_t op, int32_t dtype);
ts_status ts_hostkern_pool2d(ts_hostdev *hd, const ts_kernel_call *call);
int ts_hostkern_loss_supports(int32_t op, int32_t dtype);
ts_status ts_hostkern_loss(ts_hostdev *hd, const ts_kernel_call *call);
int ts_hostkern_optimizer_supports(int32_t op, int32_t dtype);
ts_status ts_hostkern_optimizer(ts_hostdev *hd, const ts_kernel_call *call);

#endif /* TESSERA_PLUGINS_HOSTKERN_H */
