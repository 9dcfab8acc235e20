/* plugins/common/hostdev.h: what every host-memory plugin (cpu_blas, cpu_onednn) shares:
 * a pool over aligned host memory sized from memory_fraction of the (cgroup-capped) RAM,
 * copies, fill, statistics, and the strided copy kernel. Compiled into each plugin, hidden;
 * it uses nothing but the plugin ABI, like a third-party plugin would. A plugin's context
 * struct starts with a ts_hostdev so these functions can sit in its vtable directly. */
#ifndef TESSERA_PLUGINS_HOSTDEV_H
#define TESSERA_PLUGINS_HOSTDEV_H

#include <tessera/plugin.h>

#define TS_HOSTDEV_ALIGN 64 /* AVX-512 loads */

typedef struct ts_hostdev {
    const ts_host *host;
    const char *name;
    ts_pool *pool;
    uint64_t total_bytes; /* host RAM the fraction applies to */
    int threads;          /* resolved thread count (the "threads" setting, 0 = all cores) */
} ts_hostdev;

/* Sets up hd: reads memory_fraction, cache_limit, caching and threads from the settings and
 * creates the pool. */
ts_status ts_hostdev_init(ts_hostdev *hd, const ts_host *host, const char *name,
                          const ts_setting *settings, size_t nsettings);
void ts_hostdev_fini(ts_hostdev *hd);

/* Vtable members for any ctx whose struct starts with a ts_hostdev. */
ts_status ts_hostdev_device_info(void *ctx, ts_device_info *info);
ts_status ts_hostdev_alloc(void *ctx, size_t nbytes, const char *tag, void **ptr);
void ts_hostdev_free(void *ctx, void *ptr);
ts_status ts_hostdev_copy(void *ctx, void *dst, const void *src, size_t nbytes);
ts_status ts_hostdev_fill(void *ctx, void *dst, size_t nbytes, const void *pattern,
                          size_t pattern_size);
ts_status ts_hostdev_synchronize(void *ctx);
void ts_hostdev_memory_stats(void *ctx, ts_memory_stats *stats);
void ts_hostdev_reset_peak(void *ctx);
void ts_hostdev_empty_cache(void *ctx);
ts_status ts_hostdev_set_limits(void *ctx, uint64_t reserve_limit, uint64_t cache_limit);

/* TS_OP_COPY on host memory: any strides, any dtype. */
ts_status ts_hostdev_copy_strided(const ts_operand *dst, const ts_operand *src);

/* Bytes per element of a dtype; 0 for an unknown one. */
size_t ts_hostdev_dtype_size(int32_t dtype);

/* The keys both CPU plugins declare. */
#define TS_HOSTDEV_KEYS                                                                     \
    {"threads", TS_SETTING_INT, "0", 0, 4096, "worker threads; 0 = all cores"},              \
    {"expandable_segments", TS_SETTING_BOOL, "true", 0, 0,                                   \
     "blocks over 1 MiB share one address range that grows and shrinks at its end"}

#endif /* TESSERA_PLUGINS_HOSTDEV_H */
