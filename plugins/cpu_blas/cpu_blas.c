/* plugins/cpu_blas/cpu_blas.c: the default backend: host memory (the host's pool over
 * kernels/host's raw memory), kernels on the CPU with OpenBLAS for the GEMMs. This file holds the descriptor
 * and the kernel dispatch; kernels live one file per family. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "blas.h"

typedef struct blas_ctx {
    hk_dev hd; /* first: the hostdev vtable members take this ctx */
} blas_ctx;

static const ts_config_key keys[] = {
    HK_KEYS("true", "fewer threads while other processes use the cores (the work still cut "
                    "for threads: the same bits)"),
    {NULL, 0, NULL, 0, 0, NULL},
};

static ts_status blas_init(const ts_host *host, const ts_setting *settings, size_t nsettings,
                           void **ctx)
{
    blas_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return host->fail(host, TS_ENOMEM, "out of memory creating the plugin context");
    hk_dev_init(&c->hd, host, "cpu_blas", settings, nsettings);
    /* One thread pool: OpenBLAS stays single-threaded, the plugin's OpenMP threads split the
     * large GEMMs (gemm.c). */
    ts_blas_single_thread();
    *ctx = c;
    return TS_OK;
}

static void blas_shutdown(void *ctx)
{
    free(ctx);
}

/* "host CPU, 2 threads, OpenBLAS 0.3.21 (SkylakeX kernels)": which of its kernel sets
 * OpenBLAS picked for this CPU matters (an OpenBLAS older than the CPU picks an older set:
 * docs/backends.md), so `tessera info` says it. */
static ts_status blas_device_info(void *ctx, ts_device_info *info)
{
    ts_status s = hk_dev_device_info(ctx, info);
    if (s == TS_OK) {
        const char *cfg = openblas_get_config(), *core = openblas_get_corename();
        /* the configuration string starts "OpenBLAS <version> " */
        char ver[32] = "";
        if (cfg && strncmp(cfg, "OpenBLAS ", 9) == 0)
            sscanf(cfg + 9, "%31s", ver);
        blas_ctx *c = ctx;
        snprintf(info->name, sizeof info->name, "host CPU, %d threads, OpenBLAS %s (%s kernels)",
                 c->hd.configured, *ver ? ver : "?", core && *core ? core : "unknown");
    }
    return s;
}

static int blas_supports(void *ctx, int32_t op, int32_t dtype)
{
    if (ts_plugin_dtype_is_half(dtype)) /* in float32: converted around sgemm and the rest */
        return hk_half_claim(op) && blas_supports(ctx, op, TS_F32);
    return hk_supports(op, dtype) || ts_blas_matmul_supports(op, dtype) ||
           ts_blas_conv_supports(op, dtype);
}

static ts_status blas_run_f32(void *ctx, const ts_kernel_call *call);

static ts_status blas_run(void *ctx, const ts_kernel_call *call)
{
    blas_ctx *c = ctx;
    hk_dev_adapt(&c->hd);
    if (hk_call_has_half(call) && !hk_half_native_call(call))
        return hk_via_float32(c->hd.host, 0, call, hk_convert, &c->hd, blas_run_f32, c);
    return blas_run_f32(c, call);
}

static ts_status blas_run_f32(void *ctx, const ts_kernel_call *call)
{
    blas_ctx *c = ctx;
    int32_t dtype = call->noutputs > 0 ? call->outputs[0].dtype : TS_F32;
    if (ts_blas_matmul_supports(call->op, dtype))
        return ts_blas_matmul(&c->hd, call);
    if (ts_blas_conv_supports(call->op, dtype))
        return ts_blas_conv(&c->hd, call);
    /* A family that claims the op writes its own, more precise message ("unary exp is not
     * implemented for int32"); only an op no family claims gets the generic one. */
    if (!hk_supports(call->op, dtype))
        return c->hd.host->fail(c->hd.host, TS_ENOTSUP, "op %d is not implemented for dtype %d",
                                (int)call->op, (int)dtype);
    return hk_run(&c->hd, call);
}

static const ts_plugin_desc desc = {
    .abi_major = TS_PLUGIN_ABI_MAJOR,
    .abi_minor = TS_PLUGIN_ABI_MINOR,
    .struct_size = sizeof(ts_plugin_desc),
    .name = "cpu_blas",
    .version = PACKAGE_VERSION,
    .description = "CPU kernels with OpenBLAS GEMMs; bfloat16 and float16 emulated: computed "
                   "in float32, the GEMMs on float32 copies (OpenBLAS has no 16-bit GEMM)",
    .config_keys = keys,
    HK_DESC_MEMBERS,
    .init = blas_init,
    .shutdown = blas_shutdown,
    .device_info = blas_device_info,
    .supports = blas_supports,
    .run = blas_run,
};

TS_PLUGIN_DEFINE(desc)
