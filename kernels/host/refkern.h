/* kernels/host/refkern.h: the reference host kernels (refkern.c): the shared host kernels
 * plus plain-loop matmul and convolutions. Single-threaded, no scratch, no BLAS. */
#ifndef TESSERA_PLUGINS_REFKERN_H
#define TESSERA_PLUGINS_REFKERN_H

#include "hostkern.h"

/* Non-zero if the reference kernels implement op for the output dtype. */
int hk_ref_supports(int32_t op, int32_t dtype);
/* Runs op on host operands; TS_ENOTSUP (no message) if unsupported. Errors via hd->host. */
ts_status hk_ref_run(hk_dev *hd, const ts_kernel_call *call);

#endif /* TESSERA_PLUGINS_REFKERN_H */
