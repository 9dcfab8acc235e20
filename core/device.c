/* core/device.c: the ts_device calls around a loaded plugin's vtable: accessors, memory
 * through the host's pool, copies, fills, and kernel dispatch with the reference kernels
 * standing in where a host-memory plugin declines. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pthread.h>
#include <stdatomic.h>

#include "device.h"
#include "memtrace.h"

/* ---- accessors and vtable wrappers ---------------------------------------------------- */

TS_API const char *ts_device_name(const ts_device *dev)
{
    return dev ? dev->name : NULL;
}

TS_API const char *ts_device_path(const ts_device *dev)
{
    return dev ? dev->path : NULL;
}

TS_API const ts_plugin_desc *ts_device_desc(const ts_device *dev)
{
    return dev ? dev->desc : NULL;
}

TS_API const ts_setting *ts_device_settings(const ts_device *dev, size_t *n)
{
    if (n)
        *n = dev ? dev->nsettings : 0;
    return dev ? dev->settings : NULL;
}

TS_API ts_status ts_device_info_get(ts_device *dev, ts_device_info *info)
{
    if (!dev || !info)
        return ts__fail(TS_EINVAL, "ts_device_info_get: NULL argument");
    memset(info, 0, sizeof *info);
    info->struct_size = sizeof *info;
    ts_status s = dev->vt.device_info(dev->ctx, info);
    if (s)
        return s;
    info->name[sizeof info->name - 1] = 0;
    /* Figures no device can have are dropped (their valid bit cleared) with a warning, so
     * nothing downstream divides by a zero total or trusts free > total. */
    const char *why = NULL;
    if ((info->valid & TS_DEVINFO_TOTAL) && info->total_bytes == 0)
        why = "a total of 0 bytes";
    else if ((info->valid & TS_DEVINFO_TOTAL) && info->total_bytes > DEVINFO_MAX_BYTES)
        why = "an implausible total (over 64 PiB)";
    else if ((info->valid & (TS_DEVINFO_TOTAL | TS_DEVINFO_FREE)) ==
                 (TS_DEVINFO_TOTAL | TS_DEVINFO_FREE) &&
             info->free_bytes > info->total_bytes)
        why = "more free memory than total";
    if (why) {
        ts__log(TS_LOG_WARN, "plugin '%s' reports %s (total %llu, free %llu bytes); its memory "
                "figures are ignored: fix the plugin's device_info", dev->name, why,
                (unsigned long long)info->total_bytes, (unsigned long long)info->free_bytes);
        info->valid &= ~(TS_DEVINFO_TOTAL | TS_DEVINFO_FREE);
        info->total_bytes = info->free_bytes = 0;
    }
    return TS_OK;
}

TS_API int ts_device_supports(ts_device *dev, int op, int dtype)
{
    /* a dtype newer than the plugin's ABI is not its to be asked about */
    return dev && dev->vt.supports && dev->vt.run &&
           ts_plugin_dtype_minor(dtype) <= (int)dev->vt.abi_minor &&
           dev->vt.supports(dev->ctx, op, dtype);
}

TS_API ts_status ts_device_memory_stats(ts_device *dev, ts_memory_stats *stats)
{
    if (!dev || !stats)
        return ts__fail(TS_EINVAL, "ts_device_memory_stats: NULL argument");
    memset(stats, 0, sizeof *stats);
    stats->struct_size = sizeof *stats;
    ts__pool_stats(dev->pool, stats);
    return TS_OK;
}

TS_API void ts_device_reset_peak(ts_device *dev)
{
    if (dev)
        ts__pool_reset_peak(dev->pool);
}

TS_API void ts_device_empty_cache(ts_device *dev)
{
    if (dev)
        ts__pool_empty_cache(dev->pool);
}

TS_API ts_status ts_device_set_limits(ts_device *dev, uint64_t reserve_limit,
                                     uint64_t cache_limit)
{
    if (!dev)
        return ts__fail(TS_EINVAL, "ts_device_set_limits: device is NULL");
    return ts__pool_set_limits(dev->pool, reserve_limit, cache_limit);
}

/* What a plugin's failing call looks like, for TS_FAULT_KERNEL (tessera/fault.h). */
static ts_status injected(ts_device *dev, const char *what)
{
    return ts__fail(TS_EPLUGIN, "plugin '%s': %s failed (injected fault)", dev->name, what);
}

TS_API ts_status ts_device_alloc(ts_device *dev, size_t nbytes, const char *tag, void **ptr)
{
    if (!ptr)
        return ts__fail(TS_EINVAL, "ts_device_alloc: ptr is NULL");
    *ptr = NULL;
    if (!dev)
        return ts__fail(TS_EINVAL, "ts_device_alloc: device is NULL");
    return ts__pool_alloc(dev->pool, nbytes, tag, ptr);
}

static pthread_mutex_t hold_lock = PTHREAD_MUTEX_INITIALIZER;

void ts__device_pool_free(ts_device *dev, void *ptr)
{
    pthread_mutex_lock(&hold_lock);
    ts_graph *g = dev->capturing;
    if (g) {
        if (g->nheld == g->cap) {
            size_t cap = g->cap ? 2 * g->cap : 64;
            void **h = realloc(g->held, cap * sizeof *h);
            if (!h) {
                /* Cannot keep it out of the pool: the recording is unsafe to replay. */
                g->failed = TS_ENOMEM;
                pthread_mutex_unlock(&hold_lock);
                ts__pool_free(dev->pool, ptr);
                return;
            }
            g->held = h;
            g->cap = cap;
        }
        g->held[g->nheld++] = ptr;
        pthread_mutex_unlock(&hold_lock);
        return;
    }
    pthread_mutex_unlock(&hold_lock);
    ts__pool_free(dev->pool, ptr);
}

TS_API void ts_device_free(ts_device *dev, void *ptr)
{
    if (dev && ptr)
        ts__device_pool_free(dev, ptr);
}

/* ---- graph capture ------------------------------------------------------------------------ */

TS_API int ts_device_can_capture(const ts_device *dev)
{
    return dev && dev->vt.graph_begin != NULL;
}

TS_API ts_status ts_graph_capture_begin(ts_device *dev)
{
    if (!dev)
        return ts__fail(TS_EINVAL, "ts_graph_capture_begin: device is NULL");
    if (!dev->vt.graph_begin)
        return ts__fail(TS_ENOTSUP, "ts_graph_capture_begin: plugin '%s' cannot record graphs "
                        "(no graph_* slots): run the step as it is", dev->name);
    if (dev->capturing)
        return ts__fail(TS_ESTATE, "ts_graph_capture_begin: plugin '%s' is already recording a "
                        "graph; end it with ts_graph_capture_end first", dev->name);
    ts_graph *g = ts__calloc(1, sizeof *g);
    if (!g)
        return ts__fail(TS_ENOMEM, "ts_graph_capture_begin: out of host memory");
    g->dev = dev;
    ts_status s = dev->vt.graph_begin(dev->ctx);
    if (s) {
        free(g);
        return ts__fail_prefix(s, "ts_graph_capture_begin: plugin '%s': ", dev->name);
    }
    pthread_mutex_lock(&hold_lock);
    dev->capturing = g;
    pthread_mutex_unlock(&hold_lock);
    return TS_OK;
}

TS_API ts_status ts_graph_capture_end(ts_device *dev, ts_graph **out)
{
    if (out)
        *out = NULL;
    if (!dev || !out)
        return ts__fail(TS_EINVAL, "ts_graph_capture_end: NULL argument");
    if (!dev->capturing)
        return ts__fail(TS_ESTATE, "ts_graph_capture_end: plugin '%s' is not recording a "
                        "graph (ts_graph_capture_begin first)", dev->name);
    pthread_mutex_lock(&hold_lock);
    ts_graph *g = dev->capturing;
    dev->capturing = NULL;
    pthread_mutex_unlock(&hold_lock);
    ts_status s = dev->vt.graph_end(dev->ctx, &g->handle);
    if (s == TS_OK && g->failed)
        s = ts__fail(g->failed, "ts_graph_capture_end: out of host memory keeping the blocks "
                     "freed while recording");
    else if (s)
        s = ts__fail_prefix(s, "ts_graph_capture_end: plugin '%s': the recording failed: ",
                            dev->name);
    if (s) {
        ts_graph_free(g);
        return s;
    }
    *out = g;
    return TS_OK;
}

TS_API ts_status ts_graph_replay(ts_graph *g)
{
    if (!g)
        return ts__fail(TS_EINVAL, "ts_graph_replay: graph is NULL");
    if (g->dev->capturing)
        return ts__fail(TS_ESTATE, "ts_graph_replay: plugin '%s' is recording a graph",
                        g->dev->name);
    ts_status s = g->dev->vt.graph_launch(g->dev->ctx, g->handle);
    return s ? ts__fail_prefix(s, "ts_graph_replay: plugin '%s': ", g->dev->name) : TS_OK;
}

TS_API void ts_graph_free(ts_graph *g)
{
    if (!g)
        return;
    if (g->handle)
        g->dev->vt.graph_free(g->dev->ctx, g->handle);
    for (size_t i = 0; i < g->nheld; i++)
        ts__pool_free(g->dev->pool, g->held[i]);
    free(g->held);
    free(g);
}

static ts_status no_pinned(const ts_device *dev, const char *fn)
{
    return ts__fail(TS_ENOTSUP, "%s: plugin '%s' has no pinned host memory (its descriptor "
                    "has no host_alloc slot and its memory is not host memory)", fn, dev->name);
}

TS_API ts_status ts_device_pinned_alloc(ts_device *dev, size_t nbytes, const char *tag,
                                        void **ptr)
{
    if (!ptr)
        return ts__fail(TS_EINVAL, "ts_device_pinned_alloc: ptr is NULL");
    *ptr = NULL;
    if (!dev)
        return ts__fail(TS_EINVAL, "ts_device_pinned_alloc: device is NULL");
    ts_pool *pool;
    ts_status s = ts__device_pinned_pool(dev, 1, &pool);
    if (s)
        return s;
    if (!pool)
        return no_pinned(dev, "ts_device_pinned_alloc");
    return ts__pool_alloc(pool, nbytes, tag ? tag : "pinned", ptr);
}

TS_API void ts_device_pinned_free(ts_device *dev, void *ptr)
{
    if (!dev || !dev->pinned || !ptr)
        return;
    /* The pool hands the block out again at once: no upload may still be reading it. */
    uint64_t t = atomic_load(&dev->last_upload);
    if (t && ts_device_wait_copy(dev, t) != TS_OK)
        ts__log(TS_LOG_WARN, "ts_device_pinned_free: waiting for the uploads from pinned memory "
                "failed: %s", ts_last_error());
    ts__pool_free(dev->pinned, ptr);
}

TS_API ts_status ts_device_pinned_stats(ts_device *dev, ts_memory_stats *stats)
{
    if (!dev || !stats)
        return ts__fail(TS_EINVAL, "ts_device_pinned_stats: NULL argument");
    memset(stats, 0, sizeof *stats);
    stats->struct_size = sizeof *stats;
    ts_pool *pool;
    ts__device_pinned_pool(dev, 0, &pool);
    if (pool)
        ts__pool_stats(pool, stats);
    else if (dev->pinned_ok)
        stats->valid = TS_STATS_POOL; /* none asked for yet: all zero */
    return TS_OK;
}

TS_API ts_status ts_device_copy_from_pinned(ts_device *dev, void *dst, const void *src,
                                            size_t nbytes, uint64_t *ticket)
{
    if (ticket)
        *ticket = 0;
    if (!dev || !ticket || (nbytes && (!dst || !src)))
        return ts__fail(TS_EINVAL, "ts_device_copy_from_pinned: NULL argument");
    if (!dev->pinned_ok)
        return no_pinned(dev, "ts_device_copy_from_pinned");
    if (!dev->vt.copy_h2d_async) /* done on return */
        return ts_device_copy_from_host(dev, dst, src, nbytes);
    if (!nbytes)
        return TS_OK;
    if (ts__fault_hit(TS_FAULT_KERNEL))
        return injected(dev, "copy_h2d_async");
    ts_status s = dev->vt.copy_h2d_async(dev->ctx, dst, src, nbytes, ticket);
    if (s == TS_OK && *ticket == 0)
        return ts__fail(TS_EPLUGIN, "plugin '%s': copy_h2d_async returned ticket 0 (tickets "
                        "are > 0)", dev->name);
    if (s == TS_OK) { /* tickets grow: keep the largest */
        uint64_t last = atomic_load(&dev->last_upload);
        while (last < *ticket && !atomic_compare_exchange_weak(&dev->last_upload, &last, *ticket))
            ;
    }
    return s;
}

TS_API ts_status ts_device_wait_copy(ts_device *dev, uint64_t ticket)
{
    if (!dev)
        return ts__fail(TS_EINVAL, "ts_device_wait_copy: device is NULL");
    if (ticket == 0 || !dev->vt.wait_copy)
        return TS_OK;
    return dev->vt.wait_copy(dev->ctx, ticket);
}

TS_API ts_status ts_device_copy_from_host(ts_device *dev, void *dst, const void *src,
                                          size_t nbytes)
{
    if (!dev || (nbytes && (!dst || !src)))
        return ts__fail(TS_EINVAL, "ts_device_copy_from_host: NULL argument");
    if (nbytes && ts__fault_hit(TS_FAULT_KERNEL))
        return injected(dev, "copy_h2d");
    return nbytes ? dev->vt.copy_h2d(dev->ctx, dst, src, nbytes) : TS_OK;
}

TS_API ts_status ts_device_copy_to_host(ts_device *dev, void *dst, const void *src,
                                        size_t nbytes)
{
    if (!dev || (nbytes && (!dst || !src)))
        return ts__fail(TS_EINVAL, "ts_device_copy_to_host: NULL argument");
    if (nbytes && ts__fault_hit(TS_FAULT_KERNEL))
        return injected(dev, "copy_d2h");
    return nbytes ? dev->vt.copy_d2h(dev->ctx, dst, src, nbytes) : TS_OK;
}

TS_API ts_status ts_device_copy_device(ts_device *dev, void *dst, const void *src,
                                      size_t nbytes)
{
    if (!dev || (nbytes && (!dst || !src)))
        return ts__fail(TS_EINVAL, "ts_device_copy_device: NULL argument");
    return nbytes ? dev->vt.copy_d2d(dev->ctx, dst, src, nbytes) : TS_OK;
}

TS_API ts_status ts_device_fill(ts_device *dev, void *dst, size_t nbytes, const void *pattern,
                                size_t pattern_size)
{
    if (!dev || !pattern || (nbytes && !dst))
        return ts__fail(TS_EINVAL, "ts_device_fill: NULL argument");
    if ((pattern_size != 1 && pattern_size != 2 && pattern_size != 4 && pattern_size != 8) ||
        nbytes % pattern_size)
        return ts__fail(TS_EINVAL, "ts_device_fill: a pattern of %zu bytes (1, 2, 4 or 8) "
                        "must divide the %zu bytes to fill", pattern_size, nbytes);
    return ts__device_fill(dev, dst, nbytes, pattern, pattern_size);
}

TS_API ts_status ts_device_synchronize(ts_device *dev)
{
    if (!dev)
        return ts__fail(TS_EINVAL, "ts_device_synchronize: device is NULL");
    return dev->vt.synchronize(dev->ctx);
}

/* Whether dev's plugin knows everything call uses: an op, function or dtype added after the
 * minor ABI the plugin was built for is never sent to it (it would not know the value). A
 * value past the tables is the plugin's to refuse. */
static int plugin_knows(const ts_device *dev, const ts_kernel_call *call)
{
    int32_t fn = 0;
    if ((call->op == TS_OP_UNARY || call->op == TS_OP_BINARY ||
         call->op == TS_OP_BINARY_SCALAR || call->op == TS_OP_REDUCE) &&
        call->params && call->params_size >= sizeof(int32_t))
        fn = *(const int32_t *)call->params; /* every function op's params begin with fn */
    int known = ts_plugin_call_minor(call->op, fn) <= (int)dev->vt.abi_minor;
    for (int i = 0; known && i < call->ninputs; i++) /* and every operand's dtype */
        known = ts_plugin_dtype_minor(call->inputs[i].dtype) <= (int)dev->vt.abi_minor;
    for (int i = 0; known && i < call->noutputs; i++)
        known = ts_plugin_dtype_minor(call->outputs[i].dtype) <= (int)dev->vt.abi_minor;
    return known;
}

/* A 16-bit float input of a call that dev's plugin does not claim the op for in that dtype:
 * a claim for another output dtype (a comparison's uint8, argmax's int64) takes them only
 * from a plugin that claims the op in that dtype too (ABI 2.5); a cast takes them with its
 * claim. Its dtype, or -1 when there is none. */
static int32_t unclaimed_half_input(ts_device *dev, const ts_kernel_call *call)
{
    if (call->op == TS_OP_COPY || call->op == TS_OP_CAST || !call->inputs)
        return -1;
    for (int i = 0; i < call->ninputs; i++)
        if (ts_plugin_dtype_is_half(call->inputs[i].dtype) &&
            !ts_device_supports(dev, call->op, call->inputs[i].dtype))
            return call->inputs[i].dtype;
    return -1;
}

/* What in call is newer than dev's plugin (plugin_knows said so): "unary gelu_tanh", or
 * "bfloat16". */
static const char *newer_part(const ts_device *dev, const ts_kernel_call *call, char *buf,
                              size_t len)
{
    int32_t fn = 0;
    snprintf(buf, len, "something");
    if ((call->op == TS_OP_UNARY || call->op == TS_OP_BINARY ||
         call->op == TS_OP_BINARY_SCALAR || call->op == TS_OP_REDUCE) &&
        call->params && call->params_size >= sizeof(int32_t))
        fn = *(const int32_t *)call->params;
    if (ts_plugin_call_minor(call->op, fn) > (int)dev->vt.abi_minor)
        snprintf(buf, len, "%s %s", ts_op_name(call->op), ts_fn_name(call->op, fn));
    else
        for (int i = 0; i < call->ninputs + call->noutputs; i++) {
            int32_t d = i < call->noutputs ? call->outputs[i].dtype
                                           : call->inputs[i - call->noutputs].dtype;
            if (ts_plugin_dtype_minor(d) > (int)dev->vt.abi_minor) {
                snprintf(buf, len, "the dtype %s", ts_dtype_name(d));
                break;
            }
        }
    return buf;
}

/* "float32 <- float32, int64": the output's dtype, then the inputs'. */
static const char *call_dtypes(const ts_kernel_call *call, char *buf, size_t len)
{
    size_t n = 0;
    buf[0] = 0;
    for (int i = 0; i < call->noutputs && i < 4 && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%s", i ? ", " : "",
                              ts_dtype_name(call->outputs[i].dtype));
    if (n < len)
        n += (size_t)snprintf(buf + n, len - n, " <-");
    for (int i = 0; i < call->ninputs && i < 4 && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%s", i ? ", " : " ",
                              ts_dtype_name(call->inputs[i].dtype));
    return buf;
}

TS_API ts_status ts_device_run(ts_device *dev, const ts_kernel_call *call)
{
    if (!dev || !call)
        return ts__fail(TS_EINVAL, "ts_device_run: NULL argument");
    if (call->op <= TS_OP_NONE || call->op >= TS_OP_COUNT)
        return ts__fail(TS_EINVAL, "ts_device_run: unknown op %d", (int)call->op);
    if (call->ninputs < 0 || call->noutputs < 0 || (call->ninputs && !call->inputs) ||
        (call->noutputs && !call->outputs))
        return ts__fail(TS_EINVAL, "ts_device_run: inconsistent operand counts or arrays");
    int32_t dtype = call->noutputs > 0 ? call->outputs[0].dtype : TS_F32;
    char dts[128], newer[64];
    if (!plugin_knows(dev, call))
        return ts__fail(TS_ENOTSUP, "plugin '%s' was built for plugin ABI %u.%u, before %s "
                        "(%s) was added; rebuild it against this tessera's headers",
                        dev->name, (unsigned)dev->vt.abi_major, (unsigned)dev->vt.abi_minor,
                        newer_part(dev, call, newer, sizeof newer),
                        call_dtypes(call, dts, sizeof dts));
    if (!ts_device_supports(dev, call->op, dtype))
        return ts__fail(TS_ENOTSUP, "plugin '%s' does not implement %s for %s (%s)", dev->name,
                        ts_op_name(call->op), ts_dtype_name(dtype),
                        call_dtypes(call, dts, sizeof dts));
    int32_t half = unclaimed_half_input(dev, call);
    if (half >= 0)
        return ts__fail(TS_ENOTSUP, "plugin '%s' takes no %s inputs for %s (it does not claim "
                        "%s for %s); cast them to float32 first", dev->name, ts_dtype_name(half),
                        ts_op_name(call->op), ts_op_name(call->op), ts_dtype_name(half));
    if (ts__fault_hit(TS_FAULT_KERNEL))
        return injected(dev, ts_op_name(call->op));
    ts_clear_error();
    ts_status s = dev->vt.run(dev->ctx, call);
    if (s == TS_OK) /* a path the plugin tried and recovered from leaves no message */
        ts_clear_error();
    if (s == TS_ENOTSUP && !ts_last_error()[0])
        ts__fail(TS_ENOTSUP, "plugin '%s' declined %s (%s), which it claims for %s; %s",
                 dev->name, ts_op_name(call->op), call_dtypes(call, dts, sizeof dts),
                 ts_dtype_name(dtype),
                 (dev->vt.flags & TS_PLUGIN_HOST_MEMORY)
                     ? "the core runs such a call on its reference kernels (this entry point "
                       "does not)"
                     : "it has no host memory the reference kernels could run on: implement "
                       "the case or use another device");
    return s;
}

static int host_memory(const ts_device *dev);

ts_status ts__device_fill(ts_device *dev, void *dst, size_t nbytes, const void *pattern,
                          size_t pattern_size)
{
    if (nbytes && ts__fault_hit(TS_FAULT_KERNEL))
        return injected(dev, "fill");
    if (!nbytes)
        return TS_OK;
    uint64_t t0 = ts__profile_begin();
    ts_status s = dev->vt.fill(dev->ctx, dst, nbytes, pattern, pattern_size);
    if (t0 && s == TS_OK && !host_memory(dev) && !dev->capturing)
        s = dev->vt.synchronize(dev->ctx); /* as in ts__device_run */
    uint64_t t1 = ts__profile_end(t0, TS_OP_FILL, -1, -1); /* raw bytes: no dtype */
    if (t1 && (atomic_load_explicit(&ts__mem_hooks, memory_order_relaxed) & TS__MEM_TRACE))
        ts__memtrace_kernel("fill", t0, t1, NULL);
    if (s == TS_OK && ts__mem_debug_on())
        ts__pool_name_block(dev->pool, dst, "fill", 1);
    return s;
}

/* Whether the core's reference kernels may stand in for dev: its memory is host memory. */
static int host_memory(const ts_device *dev)
{
    return (dev->vt.flags & TS_PLUGIN_HOST_MEMORY) != 0;
}

/* Whether op runs on the core's reference kernels on dev: a host-memory plugin that does not
 * claim it. */
static int uses_reference(ts_device *dev, int32_t op, int32_t dtype)
{
    return host_memory(dev) && op > TS_OP_NONE && op < TS_OP_COUNT &&
           !ts_device_supports(dev, op, dtype) && ts__hostref_supports(op, dtype);
}

int ts__device_is_host_memory(const ts_device *dev)
{
    return dev && host_memory(dev);
}

int ts__device_runs(ts_device *dev, int32_t op, int32_t dtype)
{
    return dev && (ts_device_supports(dev, op, dtype) || uses_reference(dev, op, dtype));
}

int ts__device_runs_unary(ts_device *dev, int32_t fn, int32_t dtype)
{
    if (!ts__device_runs(dev, TS_OP_UNARY, dtype))
        return 0;
    ts_unary_params p = {fn};
    ts_kernel_call call = {.op = TS_OP_UNARY, .params = &p, .params_size = sizeof p};
    return plugin_knows(dev, &call) ||
           (host_memory(dev) && ts__hostref_supports(TS_OP_UNARY, dtype));
}

/* The first call of each kernel (op, function, dtype) that runs on the reference kernels
 * instead of the plugin is said at info level (log_level = info), once per process. */
static void note_fallback(const ts_device *dev, const ts_kernel_call *call, int32_t dtype,
                          int where)
{
    static atomic_uchar said[TS_OP_COUNT][32][TS_DTYPE_COUNT + 1];
    int32_t fn = -1;
    if ((call->op == TS_OP_UNARY || call->op == TS_OP_BINARY ||
         call->op == TS_OP_BINARY_SCALAR || call->op == TS_OP_REDUCE) &&
        call->params && call->params_size >= sizeof(int32_t))
        fn = *(const int32_t *)call->params;
    int f = fn >= 0 && fn < 31 ? fn : 31, d = dtype >= 0 && dtype < TS_DTYPE_COUNT
                                                  ? dtype
                                                  : TS_DTYPE_COUNT;
    if (call->op <= TS_OP_NONE || call->op >= TS_OP_COUNT ||
        atomic_exchange(&said[call->op][f][d], 1))
        return;
    const char *fname = ts_fn_name(call->op, fn);
    ts__log(TS_LOG_INFO, "%s%s%s %s runs on the reference kernels, not plugin '%s': %s",
            ts_op_name(call->op), fname ? " " : "", fname ? fname : "", ts_dtype_name(dtype),
            dev->name,
            where == TS__RAN_DECLINED ? "the plugin declined the call"
            : !plugin_knows(dev, call) ? "the plugin's ABI is older than the function"
                                       : "the plugin does not claim it");
}

ts_status ts__device_run(ts_device *dev, const ts_kernel_call *call)
{
    if (!dev || !call)
        return ts_device_run(dev, call);
    uint64_t t0 = ts__profile_begin();
    ts_status s;
    int32_t dtype = call->noutputs > 0 && call->outputs ? call->outputs[0].dtype : TS_F32;
    int where = TS__RAN_PLUGIN;
    if (uses_reference(dev, call->op, dtype) ||
        ((!plugin_knows(dev, call) || unclaimed_half_input(dev, call) >= 0) && host_memory(dev) &&
         ts__hostref_supports(call->op, dtype))) {
        where = TS__RAN_REFERENCE;
        s = ts__hostref_run(&dev->host, call);
    } else {
        s = ts_device_run(dev, call);
        /* A claimed op the plugin declined for this call: the reference kernels stand in on
         * host memory. */
        if (s == TS_ENOTSUP && host_memory(dev) && ts_device_supports(dev, call->op, dtype) &&
            ts__hostref_supports(call->op, dtype)) {
            ts_clear_error();
            where = TS__RAN_DECLINED;
            s = ts__hostref_run(&dev->host, call);
        }
    }
    if (where != TS__RAN_PLUGIN)
        note_fallback(dev, call, dtype, where);
    /* Profiling an asynchronous device (cuda): wait for the kernel, so that its time is its
     * own rather than its launch's (not while recording a graph: nothing runs then). */
    if (t0 && s == TS_OK && !host_memory(dev) && !dev->capturing)
        s = dev->vt.synchronize(dev->ctx);
    uint64_t t1 = ts__profile_end_call(t0, call, where);
    if (t1 && (atomic_load_explicit(&ts__mem_hooks, memory_order_relaxed) & TS__MEM_TRACE))
        ts__memtrace_kernel(ts__call_name(call), t0, t1,
                            call->noutputs > 0 && call->outputs ? &call->outputs[0] : NULL);
    /* Debug mode: the first kernel to write a new tensor names its block for leak reports. */
    if (s == TS_OK && ts__mem_debug_on())
        for (int i = 0; i < call->noutputs && call->outputs; i++)
            ts__pool_name_block(dev->pool, call->outputs[i].data, ts__call_name(call), 1);
    return s;
}

void ts__device_name_block(ts_device *dev, const void *ptr, const char *text)
{
    if (dev)
        ts__pool_name_block(dev->pool, ptr, text, 0);
}
