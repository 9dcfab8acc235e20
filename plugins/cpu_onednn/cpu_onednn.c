/* plugins/cpu_onednn/cpu_onednn.c: the oneDNN backend: host memory from the shared pool
 * component, a oneDNN CPU engine and stream created at init. Primitives arrive with the
 * cpu_onednn issue; until then it runs what the shared host code offers. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>

#include <dnnl.h>

#include "../common/hostkern.h"

typedef struct dnnl_ctx {
    ts_hostdev hd; /* first: the hostdev vtable members take this ctx */
    dnnl_engine_t engine;
    dnnl_stream_t stream;
} dnnl_ctx;

static const ts_config_key keys[] = {
    TS_HOSTDEV_THREADS_KEY,
    {NULL, 0, NULL, 0, 0, NULL},
};

static void dnnl_shutdown_ctx(void *ctx)
{
    dnnl_ctx *c = ctx;
    if (c->stream)
        dnnl_stream_destroy(c->stream);
    if (c->engine)
        dnnl_engine_destroy(c->engine);
    ts_hostdev_fini(&c->hd);
    free(c);
}

static ts_status dnnl_init_ctx(const ts_host *host, const ts_setting *settings, size_t nsettings,
                               void **ctx)
{
    dnnl_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return host->fail(host, TS_ENOMEM, "out of memory creating the plugin context");
    ts_status s = ts_hostdev_init(&c->hd, host, "cpu_onednn", settings, nsettings);
    if (s)
        goto fail;
    dnnl_status_t ds = dnnl_engine_create(&c->engine, dnnl_cpu, 0);
    if (ds != dnnl_success) {
        s = host->fail(host, TS_ENODEV, "dnnl_engine_create(cpu) failed (dnnl_status %d)",
                       (int)ds);
        goto fail;
    }
    ds = dnnl_stream_create(&c->stream, c->engine, dnnl_stream_default_flags);
    if (ds != dnnl_success) {
        s = host->fail(host, TS_ENODEV, "dnnl_stream_create failed (dnnl_status %d)", (int)ds);
        goto fail;
    }
    *ctx = c;
    return TS_OK;
fail:
    dnnl_shutdown_ctx(c);
    return s;
}

static ts_status dnnl_device_info(void *ctx, ts_device_info *info)
{
    ts_status s = ts_hostdev_device_info(ctx, info);
    if (s == TS_OK) {
        const dnnl_version_t *v = dnnl_version();
        dnnl_ctx *c = ctx;
        snprintf(info->name, sizeof info->name, "host CPU, %d threads, oneDNN %d.%d.%d",
                 c->hd.threads, v->major, v->minor, v->patch);
    }
    return s;
}

static int dnnl_supports(void *ctx, int32_t op, int32_t dtype)
{
    (void)ctx;
    return ts_hostkern_supports(op, dtype);
}

static ts_status dnnl_run(void *ctx, const ts_kernel_call *call)
{
    dnnl_ctx *c = ctx;
    int32_t dtype = call->noutputs > 0 ? call->outputs[0].dtype : TS_F32;
    /* A family that claims the op writes its own, more precise message. */
    if (!ts_hostkern_supports(call->op, dtype))
        return c->hd.host->fail(c->hd.host, TS_ENOTSUP, "op %d is not implemented for dtype %d",
                                (int)call->op, (int)dtype);
    return ts_hostkern_run(&c->hd, call);
}

static const ts_plugin_desc desc = {
    .abi_major = TS_PLUGIN_ABI_MAJOR,
    .abi_minor = TS_PLUGIN_ABI_MINOR,
    .struct_size = sizeof(ts_plugin_desc),
    .name = "cpu_onednn",
    .version = PACKAGE_VERSION,
    .description = "CPU kernels with oneDNN primitives",
    .config_keys = keys,
    .init = dnnl_init_ctx,
    .shutdown = dnnl_shutdown_ctx,
    .device_info = dnnl_device_info,
    .alloc = ts_hostdev_alloc,
    .free = ts_hostdev_free,
    .copy_h2d = ts_hostdev_copy,
    .copy_d2h = ts_hostdev_copy,
    .copy_d2d = ts_hostdev_copy,
    .fill = ts_hostdev_fill,
    .synchronize = ts_hostdev_synchronize,
    .memory_stats = ts_hostdev_memory_stats,
    .reset_peak = ts_hostdev_reset_peak,
    .empty_cache = ts_hostdev_empty_cache,
    .set_limits = ts_hostdev_set_limits,
    .supports = dnnl_supports,
    .run = dnnl_run,
};

TS_PLUGIN_DEFINE(desc)
