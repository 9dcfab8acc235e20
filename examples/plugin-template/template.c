/* template.c: a complete, minimal tessera device plugin. Copy this folder, rename "template"
 * (file name, .name below, Makefile) and fill in your device.
 *
 * Its memory is host memory from posix_memalign, cached by the host's pool component. It
 * implements two kernels itself (COPY and FILL, any dtype, any strides) and declares
 * TS_PLUGIN_HOST_MEMORY, so tessera runs its reference host kernels for every other op: the
 * plugin trains models from the first build, and you replace ops one at a time by claiming
 * them in template_supports. `tessera plugin-check ./template.so` checks it.
 *
 * It includes nothing from tessera but <tessera/plugin.h> and never links libtessera. */
#define _POSIX_C_SOURCE 200112L /* posix_memalign under -std=c11 */

#include <stdlib.h>
#include <string.h>

#include <tessera/plugin.h>

#define ALIGNMENT 64 /* every block: 64 bytes (CPU); a GPU plugin uses 256 */

/* One instance: init makes it, every other entry gets it back as ctx. */
typedef struct template_ctx {
    const ts_host *host; /* errors, logging, the pool component: valid until shutdown */
    ts_pool *pool;
    char label[64];      /* the "label" setting */
} template_ctx;

/* Keys of [plugin.template] besides the common memory_fraction, cache_limit, caching. The
 * host validates the INI file against them and hands init the resolved values. */
static const ts_config_key template_keys[] = {
    {"label", TS_SETTING_STRING, "template device", 0, 0, "name shown by tessera info"},
    {NULL, 0, NULL, 0, 0, NULL},
};

/* ---- memory ------------------------------------------------------------------------------ */

/* The raw allocator under the pool: called only when the pool's cache cannot serve. */
static ts_status raw_alloc(void *user, size_t nbytes, void **ptr)
{
    (void)user;
    return posix_memalign(ptr, ALIGNMENT, nbytes ? nbytes : ALIGNMENT) == 0 ? TS_OK : TS_ENOMEM;
}

static void raw_free(void *user, void *ptr, size_t nbytes)
{
    (void)user;
    (void)nbytes;
    free(ptr);
}

static ts_status template_init(const ts_host *host, const ts_setting *settings, size_t n,
                               void **out)
{
    template_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return host->fail(host, TS_ENOMEM, "out of memory for the plugin context");
    c->host = host;
    const ts_setting *label = ts_setting_find(settings, n, "label");
    strncpy(c->label, label ? label->text : "template device", sizeof c->label - 1);

    uint64_t total, avail;
    ts_status s = host->host_memory(&total, &avail);
    if (s) {
        free(c);
        return s;
    }
    /* The host always passes these three (declared or not), resolved to defaults. */
    const ts_setting *frac = ts_setting_find(settings, n, "memory_fraction");
    const ts_setting *cache = ts_setting_find(settings, n, "cache_limit");
    const ts_setting *caching = ts_setting_find(settings, n, "caching");
    ts_pool_options opts = {
        .struct_size = sizeof opts,
        .name = "template",
        .alignment = ALIGNMENT,
        .reserve_limit = (uint64_t)((double)total * (frac ? frac->v.fraction : 0.5)),
        .cache_limit = cache ? cache->v.size : 512u << 20,
        .caching = caching ? caching->v.boolean : 1,
    };
    ts_raw_allocator raw = {.user = c, .alloc = raw_alloc, .free = raw_free};
    if ((s = host->pool->create(&opts, &raw, &c->pool))) {
        free(c);
        return s;
    }
    *out = c;
    return TS_OK;
}

static void template_shutdown(void *ctx)
{
    template_ctx *c = ctx;
    c->host->pool->destroy(c->pool);
    free(c);
}

static ts_status template_device_info(void *ctx, ts_device_info *info)
{
    template_ctx *c = ctx;
    uint64_t total, avail;
    ts_status s = c->host->host_memory(&total, &avail);
    if (s)
        return s;
    info->count = 1;
    info->index = 0;
    strncpy(info->name, c->label, sizeof info->name - 1);
    info->total_bytes = total;
    info->free_bytes = avail;
    info->valid = TS_DEVINFO_TOTAL | TS_DEVINFO_FREE; /* say which figures are real */
    return TS_OK;
}

static ts_status template_alloc(void *ctx, size_t nbytes, const char *tag, void **ptr)
{
    template_ctx *c = ctx;
    return c->host->pool->alloc(c->pool, nbytes, tag, ptr);
}

static void template_free(void *ctx, void *ptr)
{
    template_ctx *c = ctx;
    c->host->pool->free(c->pool, ptr);
}

/* Host memory: all three copies are memmove. A device plugin calls its DMA engine here. */
static ts_status template_copy(void *ctx, void *dst, const void *src, size_t nbytes)
{
    (void)ctx;
    memmove(dst, src, nbytes);
    return TS_OK;
}

static ts_status template_fill(void *ctx, void *dst, size_t nbytes, const void *pattern,
                               size_t pattern_size)
{
    template_ctx *c = ctx;
    if (pattern_size == 0 || pattern_size > 8 || nbytes % pattern_size)
        return c->host->fail(c->host, TS_EINVAL, "fill: a %zu-byte pattern does not tile %zu "
                             "bytes", pattern_size, nbytes);
    for (size_t i = 0; i < nbytes; i += pattern_size)
        memcpy((char *)dst + i, pattern, pattern_size);
    return TS_OK;
}

static ts_status template_synchronize(void *ctx)
{
    (void)ctx; /* everything ran synchronously */
    return TS_OK;
}

/* The pool does the bookkeeping. */
static void template_memory_stats(void *ctx, ts_memory_stats *stats)
{
    template_ctx *c = ctx;
    c->host->pool->stats(c->pool, stats);
}

static void template_reset_peak(void *ctx)
{
    template_ctx *c = ctx;
    c->host->pool->reset_peak(c->pool);
}

static void template_empty_cache(void *ctx)
{
    template_ctx *c = ctx;
    c->host->pool->empty_cache(c->pool);
}

static ts_status template_set_limits(void *ctx, uint64_t reserve_limit, uint64_t cache_limit)
{
    template_ctx *c = ctx;
    return c->host->pool->set_limits(c->pool, reserve_limit, cache_limit);
}

/* ---- kernels ----------------------------------------------------------------------------- */

static size_t dtype_size(int32_t dtype)
{
    switch (dtype) {
    case TS_F32: case TS_I32: return 4;
    case TS_F64: case TS_I64: return 8;
    case TS_U8: return 1;
    default: return 0;
    }
}

/* The ops this plugin runs itself; tessera composes the rest (TS_PLUGIN_HOST_MEMORY). */
static int template_supports(void *ctx, int32_t op, int32_t dtype)
{
    (void)ctx;
    return (op == TS_OP_COPY || op == TS_OP_FILL) && dtype_size(dtype) != 0;
}

/* Writes every element of out: from the same position in in, or the value at pattern when in
 * is NULL. Walks a multi-index over out's shape: the usual way to honour arbitrary strides
 * (0 = broadcast) and offsets. */
static void each_element(const ts_operand *out, const ts_operand *in, const void *pattern,
                         size_t es)
{
    int64_t idx[TS_MAX_DIMS] = {0}, n = 1;
    for (int d = 0; d < out->ndim; d++)
        n *= out->shape[d];
    for (int64_t i = 0; i < n; i++) {
        int64_t o = out->offset, s = in ? in->offset : 0;
        for (int d = 0; d < out->ndim; d++) {
            o += idx[d] * out->strides[d];
            if (in)
                s += idx[d] * in->strides[d];
        }
        const void *src = in ? (const char *)in->data + s * (int64_t)es : pattern;
        memcpy((char *)out->data + o * (int64_t)es, src, es);
        for (int d = out->ndim - 1; d >= 0; d--) {
            if (++idx[d] < out->shape[d])
                break;
            idx[d] = 0;
        }
    }
}

static ts_status template_run(void *ctx, const ts_kernel_call *call)
{
    template_ctx *c = ctx;
    const ts_host *h = c->host;
    const ts_operand *out = call->noutputs > 0 ? &call->outputs[0] : NULL;
    size_t es = out ? dtype_size(out->dtype) : 0;
    if (!out || !es)
        return h->fail(h, TS_EINVAL, "%s needs one output of a known dtype",
                       call->op == TS_OP_COPY ? "copy" : "fill");
    switch (call->op) {
    case TS_OP_COPY: {
        if (call->ninputs != 1 || call->inputs[0].dtype != out->dtype ||
            call->inputs[0].ndim != out->ndim)
            return h->fail(h, TS_EINVAL, "copy: needs one input of the output's dtype and ndim");
        /* The host guarantees out does not partially overlap in; exactly equal is fine. */
        each_element(out, &call->inputs[0], NULL, es);
        return TS_OK;
    }
    case TS_OP_FILL: {
        if (!call->params || call->params_size < sizeof(ts_fill_params))
            return h->fail(h, TS_EINVAL, "fill: missing ts_fill_params");
        double v = ((const ts_fill_params *)call->params)->value;
        unsigned char value[8] = {0}; /* v as one element of the output dtype */
        switch (out->dtype) {
        case TS_F32: { float f = (float)v; memcpy(value, &f, 4); break; }
        case TS_F64: memcpy(value, &v, 8); break;
        case TS_I32: { int32_t i = (int32_t)v; memcpy(value, &i, 4); break; }
        case TS_I64: { int64_t i = (int64_t)v; memcpy(value, &i, 8); break; }
        default: value[0] = v != 0; break;
        }
        each_element(out, NULL, value, es);
        return TS_OK;
    }
    default:
        return h->fail(h, TS_ENOTSUP, "op %d is not implemented", (int)call->op);
    }
}

/* ---- the descriptor ---------------------------------------------------------------------- */

static const ts_plugin_desc template_desc = {
    .abi_major = TS_PLUGIN_ABI_MAJOR,
    .abi_minor = TS_PLUGIN_ABI_MINOR,
    .struct_size = sizeof(ts_plugin_desc),
    .name = "template", /* must match the file name: template.so */
    .version = "1.0",
    .description = "minimal host-memory plugin (examples/plugin-template)",
    .config_keys = template_keys,
    .init = template_init,
    .shutdown = template_shutdown,
    .device_info = template_device_info,
    .alloc = template_alloc,
    .free = template_free,
    .copy_h2d = template_copy,
    .copy_d2h = template_copy,
    .copy_d2d = template_copy,
    .fill = template_fill,
    .synchronize = template_synchronize,
    .memory_stats = template_memory_stats,
    .reset_peak = template_reset_peak,
    .empty_cache = template_empty_cache,
    .set_limits = template_set_limits,
    .supports = template_supports,
    .run = template_run,
    .flags = TS_PLUGIN_HOST_MEMORY,
};

/* Exports tessera_plugin_entry, the only symbol the plugin exports (-fvisibility=hidden). */
TS_PLUGIN_DEFINE(template_desc)
