/* tessera/tessera.h: the umbrella header. */
#ifndef TESSERA_TESSERA_H
#define TESSERA_TESSERA_H

#include <tessera/status.h>
#include <tessera/plugin.h>
#include <tessera/config.h>
#include <tessera/device.h>
#include <tessera/memory.h>
#include <tessera/tensor.h>
#include <tessera/ops.h>
#include <tessera/autograd.h>
#include <tessera/checkpoint.h>
#include <tessera/data.h>
#include <tessera/nn.h>
#include <tessera/optim.h>
#include <tessera/dist.h>
#include <tessera/models.h>
#include <tessera/scope.h>
#include <tessera/train.h>

#define TESSERA_VERSION_MAJOR 0
#define TESSERA_VERSION_MINOR 1
#define TESSERA_VERSION_PATCH 0

#ifdef __cplusplus
extern "C" {
#endif

/* "0.1.0". (transfer none, static) */
const char *ts_version(void);

#ifdef __cplusplus
}
#endif
#endif /* TESSERA_TESSERA_H */
