/* template.c: a complete, minimal tessera device plugin. Copy this folder, rename "template"
 * (file name, .name below, Makefile) and fill in your device.
 *
 * Its memory is host memory from posix_memalign; tessera builds its caching pool on top (with
 * the limits of [plugin.template] in the INI file) and keeps the statistics. It implements two
 * kernels itself (COPY and FILL, any dtype, any strides) and declares TS_PLUGIN_HOST_MEMORY,
 * so tessera runs its reference host kernels for every other op: the plugin trains models
 * from the first build, and you replace ops one at a time by claiming them in
 * template_supports. `tessera plugin-check ./template.so` checks it.
 *
 * It includes nothing from tessera but <tessera/plugin.h> and never links libtessera. */
#define _POSIX_C_SOURCE 200112L /* posix_memalign under -std=c11 */

#include <stdlib.h>
#include <string.h>

#include <tessera/plugin.h>

#define ALIGNMENT 64 /* every segment: 64 bytes (CPU); a GPU plugin uses 256 */

/* One instance: init makes it, every other entry gets it back as ctx. */
typedef struct template_ctx {
    const ts_host *host; /* errors, logging, scratch memory: valid until shutdown */
    char label[64];      /* the "label" setting */
} template_ctx;

/* Keys of [plugin.template] besides the ones every plugin has (memory_fraction, cache_limit,
 * caching, expandable_segments: the host applies those itself). The host validates the INI
 * file against them and hands init the resolved values. */
static const ts_config_key template_keys[] = {
    {"label", TS_SETTING_STRING, "template device", 0, 0, "name shown by tessera info"},
    {NULL, 0, NULL, 0, 0, NULL},
};

/* ---- the instance ------------------------------------------------------------------------ */

static ts_status template_init(const ts_host *host, const ts_setting *settings, size_t n,
                               void **out)
{
    template_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return host->fail(host, TS_ENOMEM, "out of memory for the plugin context");
    c->host = host;
    const ts_setting *label = ts_setting_find(settings, n, "label");
    strncpy(c->label, label ? label->text : "template device", sizeof c->label - 1);
    *out = c;
    return TS_OK;
}

static void template_shutdown(void *ctx)
{
    free(ctx); /* the host has already given back every segment through template_mem_free */
}

/* The device's memory figures: memory_fraction applies to total_bytes. */
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

/* ---- memory ------------------------------------------------------------------------------ */

/* Raw segments under the host's pool: called only when its cache cannot serve. */
static ts_status template_mem_alloc(void *ctx, size_t nbytes, void **ptr)
{
    (void)ctx;
    return posix_memalign(ptr, ALIGNMENT, nbytes) == 0 ? TS_OK : TS_ENOMEM;
}

static void template_mem_free(void *ctx, void *ptr, size_t nbytes)
{
    (void)ctx;
    (void)nbytes;
    free(ptr);
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
    (void)ctx; /* the host checked that pattern_size (1, 2, 4 or 8) divides nbytes */
    for (size_t i = 0; i < nbytes; i += pattern_size)
        memcpy((char *)dst + i, pattern, pattern_size);
    return TS_OK;
}

static ts_status template_synchronize(void *ctx)
{
    (void)ctx; /* everything ran synchronously */
    return TS_OK;
}

/* ---- kernels ----------------------------------------------------------------------------- */

/* The ops this plugin runs itself; tessera runs the rest (TS_PLUGIN_HOST_MEMORY). */
static int template_supports(void *ctx, int32_t op, int32_t dtype)
{
    (void)ctx;
    return (op == TS_OP_COPY || op == TS_OP_FILL) && ts_plugin_dtype_size(dtype) != 0;
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
    size_t es = out ? ts_plugin_dtype_size(out->dtype) : 0;
    if (!out || !es)
        return h->fail(h, TS_EINVAL, "%s needs one output of a known dtype",
                       call->op == TS_OP_COPY ? "copy" : "fill");
    if (call->op == TS_OP_COPY) {
        if (call->ninputs != 1 || call->inputs[0].dtype != out->dtype ||
            call->inputs[0].ndim != out->ndim)
            return h->fail(h, TS_EINVAL, "copy: needs one input of the output's dtype and ndim");
        /* The host guarantees out does not partially overlap in; exactly equal is fine. */
        each_element(out, &call->inputs[0], NULL, es);
        return TS_OK;
    }
    if (call->op == TS_OP_FILL) {
        if (!call->params || call->params_size < sizeof(ts_fill_params))
            return h->fail(h, TS_EINVAL, "fill: missing ts_fill_params");
        unsigned char value[8]; /* the value as one element of the output dtype */
        ts_plugin_store_scalar(out->dtype, ((const ts_fill_params *)call->params)->value,
                               value);
        each_element(out, NULL, value, es);
        return TS_OK;
    }
    return TS_ENOTSUP; /* not claimed: decline, and the reference kernels stand in */
}

/* ---- the descriptor ---------------------------------------------------------------------- */

static const ts_plugin_desc template_desc = {
    .abi_major = TS_PLUGIN_ABI_MAJOR,
    .abi_minor = TS_PLUGIN_ABI_MINOR,
    .struct_size = sizeof(ts_plugin_desc),
    .name = "template", /* must match the file name: template.so */
    .version = "2.0",
    .description = "minimal host-memory plugin (examples/plugin-template)",
    .config_keys = template_keys,
    .flags = TS_PLUGIN_HOST_MEMORY,
    .alignment = ALIGNMENT,
    .init = template_init,
    .shutdown = template_shutdown,
    .device_info = template_device_info,
    .mem_alloc = template_mem_alloc,
    .mem_free = template_mem_free,
    .copy_h2d = template_copy,
    .copy_d2h = template_copy,
    .copy_d2d = template_copy,
    .fill = template_fill,
    .synchronize = template_synchronize,
    .supports = template_supports,
    .run = template_run,
};

/* Exports tessera_plugin_entry, the only symbol the plugin exports (-fvisibility=hidden). */
TS_PLUGIN_DEFINE(template_desc)
