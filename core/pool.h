/* core/pool.h: the caching pool component (pool.c). The host builds one pool per device
 * instance over the plugin's raw memory slots (ts_plugin_desc.mem_alloc / vm_*), and owns its
 * statistics, limits and cache; plugins only see it through ts_host.scratch_alloc. Internal:
 * not installed. tests/unit/test-pool and tools/bench_pool drive it directly. */
#ifndef TESSERA_CORE_POOL_H
#define TESSERA_CORE_POOL_H

#include <stddef.h>
#include <stdint.h>

#include <tessera/plugin.h>

typedef struct ts_raw_allocator {
    void *user; /* handed back to both calls */
    /* Obtain nbytes (a multiple of the pool's alignment) aligned to that alignment. Return
     * TS_ENOMEM on failure; the pool then frees its cache and tries once more. */
    ts_status (*alloc)(void *user, size_t nbytes, void **ptr);
    /* Give back a block obtained from alloc, with the size it was obtained with. */
    void (*free)(void *user, void *ptr, size_t nbytes);
} ts_raw_allocator;

/* Optional: a raw allocator that can reserve address space and back pieces of it
 * with memory. Given one, the pool keeps every block over 1 MiB in a single range that grows
 * and shrinks at its end (an "expandable segment"): free neighbours always merge, so there is
 * no fragmentation between separate raw allocations. Host memory: mmap; CUDA: the driver's
 * cuMemAddressReserve/cuMemCreate/cuMemMap. */
typedef struct ts_raw_vm {
    void *user;           /* handed back to every call */
    size_t granularity;   /* power of two >= the pool's alignment: commit sizes and offsets */
    uint64_t max_reserve; /* address space to reserve when the pool has no reserve_limit */
    /* Reserve nbytes of address space, no memory; the base is aligned to granularity. */
    ts_status (*reserve)(void *user, size_t nbytes, void **base);
    /* Give back a whole reservation (committed parts included). */
    void (*release)(void *user, void *base, size_t nbytes);
    /* Back [addr, addr + nbytes) of a reservation with memory; TS_ENOMEM when there is none. */
    ts_status (*commit)(void *user, void *addr, size_t nbytes);
    /* Return the memory behind [addr, addr + nbytes); the addresses stay reserved. */
    void (*decommit)(void *user, void *addr, size_t nbytes);
} ts_raw_vm;

typedef struct ts_pool_options {
    const char *name;       /* used in messages and statistics: the plugin's name */
    size_t alignment;       /* power of two: every block is aligned to it (64 CPU, 256 CUDA) */
    uint64_t reserve_limit; /* most bytes reserved from the raw allocator; 0 = no limit */
    uint64_t cache_limit;   /* most bytes kept in free lists (the plugins' default: 512 MiB) */
    int32_t caching;        /* 0: frees go straight back to the raw allocator */
    const ts_raw_vm *vm;    /* optional (NULL): an expandable segment; copied */
} ts_pool_options;

typedef struct ts_pool ts_pool;

/* All calls are thread safe. */
/* Creates a pool; the raw allocator table and the options are copied. (transfer full) */
ts_status ts__pool_create(const ts_pool_options *opts, const ts_raw_allocator *raw, ts_pool **out);
/* Returns every cached block to the raw allocator and frees the pool. Blocks still live are
 * reported as leaks (log) and returned too. NULL is a no-op. */
void ts__pool_destroy(ts_pool *pool);
/* A block of at least nbytes (0 gives a valid unique block). tag: a static string naming the
 * caller (an op name) for leak reports; may be NULL. TS_ENOMEM with a message giving the
 * request, in use, reserved, cached and the limits when it cannot be met. */
ts_status ts__pool_alloc(ts_pool *pool, size_t nbytes, const char *tag, void **ptr);
/* Returns a block to the pool. NULL is a no-op. */
void ts__pool_free(ts_pool *pool, void *ptr);
void ts__pool_stats(ts_pool *pool, ts_memory_stats *out);
void ts__pool_reset_peak(ts_pool *pool);
/* Returns every cached (free) block to the raw allocator. */
void ts__pool_empty_cache(ts_pool *pool);
ts_status ts__pool_set_limits(ts_pool *pool, uint64_t reserve_limit, uint64_t cache_limit);

#endif /* TESSERA_CORE_POOL_H */
