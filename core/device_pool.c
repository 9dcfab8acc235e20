/* core/device_pool.c: the pools the host builds over a loaded plugin: the caching pool over its
 * raw memory slots (mem_alloc / mem_free, and the vm_* slots for an expandable segment), with
 * the reserve limit from memory_fraction, and the pinned-memory pool (host_alloc / host_free,
 * or mem_alloc for host-memory plugins), made on first use. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"

/* ---- the pool over the plugin's raw memory ---------------------------------------------- */

static ts_status raw_alloc(void *user, size_t nbytes, void **ptr)
{
    ts_device *dev = user;
    return dev->vt.mem_alloc(dev->ctx, nbytes, ptr);
}

static void raw_free(void *user, void *ptr, size_t nbytes)
{
    ts_device *dev = user;
    dev->vt.mem_free(dev->ctx, ptr, nbytes);
}

static ts_status pinned_raw_alloc(void *user, size_t nbytes, void **ptr)
{
    ts_device *dev = user;
    return dev->vt.host_alloc(dev->ctx, nbytes, ptr);
}

static void pinned_raw_free(void *user, void *ptr, size_t nbytes)
{
    ts_device *dev = user;
    dev->vt.host_free(dev->ctx, ptr, nbytes);
}

/* The pinned pool, made on first use (a program that never asks for pinned memory has no
 * such pool in its statistics): over host_alloc, or over mem_alloc for a host-memory plugin
 * (its memory is host memory: nothing to pin). *out NULL when the device has none. */
static pthread_mutex_t pinned_lock = PTHREAD_MUTEX_INITIALIZER;

ts_status ts__device_pinned_pool(ts_device *dev, int create, ts_pool **out)
{
    *out = NULL;
    if (!dev->pinned_ok)
        return TS_OK;
    pthread_mutex_lock(&pinned_lock);
    ts_status s = TS_OK;
    if (!dev->pinned && create) {
        ts_raw_allocator raw = {.user = dev, .alloc = pinned_raw_alloc, .free = pinned_raw_free};
        if (!dev->vt.host_alloc) {
            raw.alloc = raw_alloc;
            raw.free = raw_free;
        }
        char name[96];
        snprintf(name, sizeof name, "%s pinned", dev->name);
        free(dev->pinned_name);
        if (!(dev->pinned_name = ts__strdup(name))) {
            s = ts__fail(TS_ENOMEM, "out of memory");
        } else {
            ts_pool_options opts = dev->pinned_opts;
            opts.name = dev->pinned_name;
            if ((s = ts__pool_create(&opts, &raw, &dev->pinned))) {
                char msg[900];
                snprintf(msg, sizeof msg, "%s", ts_last_error());
                s = ts__fail(s, "plugin '%s' (%s): pinned memory: %s", dev->name, dev->path,
                             msg);
            }
        }
    }
    *out = dev->pinned;
    pthread_mutex_unlock(&pinned_lock);
    return s;
}

/* What the pinned pool will be: the device pool's caching, host alignment, no reserve limit
 * (host memory: the pinned buffers a program asks for). */
static void plan_pinned_pool(ts_device *dev, const ts_pool_options *dev_opts)
{
    dev->pinned_ok = dev->vt.host_alloc || (dev->vt.flags & TS_PLUGIN_HOST_MEMORY);
    dev->pinned_opts = *dev_opts;
    dev->pinned_opts.alignment = dev_opts->alignment > 64 ? dev_opts->alignment : 64;
    dev->pinned_opts.reserve_limit = 0;
    dev->pinned_opts.vm = NULL;
    dev->pinned_opts.name = NULL;
}

static ts_status vm_reserve(void *user, size_t nbytes, void **base)
{
    ts_device *dev = user;
    return dev->vt.vm_reserve(dev->ctx, nbytes, base);
}

static void vm_release(void *user, void *base, size_t nbytes)
{
    ts_device *dev = user;
    dev->vt.vm_release(dev->ctx, base, nbytes);
}

static ts_status vm_commit(void *user, void *addr, size_t nbytes)
{
    ts_device *dev = user;
    return dev->vt.vm_commit(dev->ctx, addr, nbytes);
}

static void vm_decommit(void *user, void *addr, size_t nbytes)
{
    ts_device *dev = user;
    dev->vt.vm_decommit(dev->ctx, addr, nbytes);
}

/* memory_fraction of total as the pool's reserve limit; 0 (none) when total is unknown. */
static uint64_t reserve_limit(const ts_setting *frac, uint64_t total)
{
    return total && frac ? (uint64_t)((double)total * frac->v.fraction) : 0;
}

/* Builds dev's pool from its settings once init has run: the reserve limit from
 * memory_fraction and the device's total memory, cache_limit, caching, and the expandable
 * segment when the plugin has address-space slots. memory_fraction must give a usable pool
 * (ts__config_check_reserve). */
ts_status ts__device_build_pool(const ts_config *cfg, ts_device *dev)
{
    /* The plugin's own answer, quietly: figures ts_device_info_get would drop (with its
     * warning, when the user asks) are no basis for a limit. */
    ts_device_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    uint64_t total = 0;
    if (dev->vt.device_info(dev->ctx, &info) == TS_OK && (info.valid & TS_DEVINFO_TOTAL) &&
        info.total_bytes > 0 && info.total_bytes <= DEVINFO_MAX_BYTES &&
        !((info.valid & TS_DEVINFO_FREE) && info.free_bytes > info.total_bytes))
        total = info.total_bytes;
    ts_clear_error();
    ts_status s = ts__config_check_reserve(cfg, dev->name, dev->settings, dev->nsettings, total);
    if (s)
        return s;
    const ts_setting *frac = ts_setting_find(dev->settings, dev->nsettings, "memory_fraction");
    const ts_setting *cache = ts_setting_find(dev->settings, dev->nsettings, "cache_limit");
    const ts_setting *caching = ts_setting_find(dev->settings, dev->nsettings, "caching");
    const ts_setting *exp = ts_setting_find(dev->settings, dev->nsettings, "expandable_segments");
    ts_pool_options opts = {
        .name = dev->name,
        .alignment = dev->vt.alignment,
        .reserve_limit = reserve_limit(frac, total),
        .cache_limit = cache ? cache->v.size : (uint64_t)512 << 20,
        .caching = caching ? caching->v.boolean : 1,
    };
    ts_raw_vm vm = {.user = dev, .reserve = vm_reserve,
                    .release = vm_release, .commit = vm_commit, .decommit = vm_decommit};
    if ((!exp || exp->v.boolean) && dev->vt.vm_granularity && total &&
        (vm.granularity = dev->vt.vm_granularity(dev->ctx)) != 0) {
        vm.max_reserve = opts.reserve_limit ? opts.reserve_limit : total;
        opts.vm = &vm;
    }
    ts_raw_allocator raw = {.user = dev, .alloc = raw_alloc, .free = raw_free};
    if ((s = ts__pool_create(&opts, &raw, &dev->pool)) != TS_OK) {
        char msg[900];
        snprintf(msg, sizeof msg, "%s", ts_last_error());
        return ts__fail(s, "plugin '%s' (%s): %s", dev->name, dev->path, msg);
    }
    plan_pinned_pool(dev, &opts);
    return TS_OK;
}

