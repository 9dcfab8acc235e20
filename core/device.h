/* core/device.h: a loaded device plugin, shared by core/loader.c (which loads it) and
 * core/device.c (the ts_device calls around its vtable); never installed. */
#ifndef TESSERA_CORE_DEVICE_H
#define TESSERA_CORE_DEVICE_H

#include "internal.h"
#include "pool.h"

struct ts_device {
    char *name;             /* the descriptor's name */
    char *path;             /* the .so */
    void *handle;           /* dlopen handle */
    const ts_plugin_desc *desc; /* the plugin's own descriptor */
    ts_plugin_desc vt;      /* a full-size copy: members past the plugin's struct_size are NULL */
    void *ctx;              /* from init */
    ts_setting *settings;
    size_t nsettings;
    ts_host host;           /* this device's host table; host_private points back here */
    ts_pool *pool;          /* the host's caching pool over the plugin's raw memory */
    int pinned_ok;          /* has pinned host memory: host_alloc, or host memory itself */
    ts_pool_options pinned_opts; /* its pool's options (name set when made) */
    ts_pool *pinned;        /* that pool, made on first use (ts__device_pinned_pool) */
    char *pinned_name;      /* "NAME pinned": its name in statistics and messages */
    struct ts_graph *capturing; /* the graph being recorded: frees are held for it */
    _Atomic uint64_t last_upload; /* the last ts_device_copy_from_pinned ticket */
    _Atomic uint64_t role_bytes[TS_ROLE_COUNT]; /* live storage bytes by ts_memory_role */
};

/* A recorded graph: the plugin's handle and the pool blocks freed while recording, kept out
 * of the pool until the graph is freed. */
struct ts_graph {
    ts_device *dev;
    void *handle;
    void **held;
    size_t nheld, cap;
    ts_status failed; /* a hold that could not be recorded (out of host memory) */
};
/* Builds dev's caching pool after init (core/device_pool.c): limits from its settings and
 * cfg, the expandable segment where the plugin has the vm_* slots. */
ts_status ts__device_build_pool(const ts_config *cfg, ts_device *dev);
/* dev's pinned pool (core/device_pool.c), made first when create is set; *out NULL when the
 * device has no pinned memory (or, without create, none was asked for yet). */
ts_status ts__device_pinned_pool(ts_device *dev, int create, ts_pool **out);
/* Frees a block of dev's pool, or holds it for the graph being recorded. */
void ts__device_pool_free(ts_device *dev, void *ptr);
/* Larger device memory than this in ts_device_info is a plugin bug (64 PiB). */
#define DEVINFO_MAX_BYTES ((uint64_t)1 << 56)

#endif /* TESSERA_CORE_DEVICE_H */
