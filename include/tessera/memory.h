/* tessera/memory.h: watching device memory across every caching pool in the process: the
 * registry of live pools, an event hook, a Chrome/Perfetto memory trace and the leak report.
 * The pools themselves are built by the host, one per device instance, over each plugin's raw
 * memory (plugin.h: mem_alloc, mem_free); docs/memory.md describes the design. Every hook here costs one relaxed atomic load per allocation while
 * it is off. */
#ifndef TESSERA_MEMORY_H
#define TESSERA_MEMORY_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <tessera/plugin.h>
#include <tessera/status.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the registry of pools -------------------------------------------------------------- */

/* Calls fn once per live pool with its name and statistics (stats->struct_size is
 * sizeof(ts_memory_stats)), in creation order. fn runs with the registry locked: it must not
 * create or destroy pools. Returns the number of pools. Thread safe. */
size_t ts_memory_pools(void (*fn)(const char *pool, const ts_memory_stats *stats, void *user),
                       void *user);

/* ---- memory by role --------------------------------------------------------------------- */

typedef struct ts_tensor ts_tensor; /* tessera/tensor.h */
typedef struct ts_device ts_device; /* tessera/device.h */

/* What a tensor's memory is for, as the library sees it when it makes or adopts the tensor:
 * a module's parameters and buffers, the gradients autograd accumulates into leaves, an
 * optimizer's state, data (data sets and the loader's batches), activations (whatever is made
 * while gradients are recorded: the forward's intermediates), and other (the rest: evaluation,
 * backward's temporaries, tensors a program makes with gradients off). */
typedef enum ts_memory_role {
    TS_ROLE_OTHER = 0,
    TS_ROLE_PARAMETER = 1,
    TS_ROLE_GRADIENT = 2,
    TS_ROLE_OPTIMIZER = 3,
    TS_ROLE_ACTIVATION = 4,
    TS_ROLE_DATA = 5,
    TS_ROLE_COUNT
} ts_memory_role;
/* "parameter", "gradient", ...; "unknown" past the enum. */
const char *ts_memory_role_name(int role);
/* Tags t's storage (every view of it) with role; the bytes move between the device's role
 * counters, and a memory trace records the change. A program tags its own tensors so. */
void ts_tensor_set_role(ts_tensor *t, ts_memory_role role);
/* The bytes of live storages on dev, by role (out: TS_ROLE_COUNT entries). Storage bytes, as
 * asked for: the pool's in_use adds its rounding. */
void ts_device_memory_by_role(ts_device *dev, uint64_t *out);

/* Figures of a pool's statistics: the share of allocations the cache served (hits over hits
 * and misses; -1 before any), and the fragmentation of the cache: 1 - the largest free block
 * over the cached bytes (0 with nothing cached: a cache of one block is not fragmented, one of
 * many small blocks that cannot serve a large request is near 1). */
double ts_memory_hit_rate(const ts_memory_stats *st);
double ts_memory_fragmentation(const ts_memory_stats *st);

/* Blocks handed out and not yet freed, summed over every live pool. Tests assert it is zero
 * at their end. Thread safe. */
uint64_t ts_memory_live_count(void);

/* Returns every fully free segment of every pool to its raw allocator. Thread safe. */
void ts_memory_empty_cache(void);

/* ---- the event hook --------------------------------------------------------------------- */

/* Values are ABI: append only. */
typedef enum ts_memory_event_kind {
    TS_MEMORY_ALLOC = 0, /* a block was handed out */
    TS_MEMORY_FREE = 1,  /* a block came back */
    TS_MEMORY_OOM = 2    /* a request failed with TS_ENOMEM; ptr is NULL */
} ts_memory_event_kind;

typedef struct ts_memory_event {
    int32_t kind;         /* ts_memory_event_kind */
    const char *pool;     /* the pool's name (transfer none, valid during the call) */
    const void *ptr;      /* the block */
    uint64_t nbytes;      /* bytes asked for by the caller (before rounding) */
    uint64_t block_bytes; /* bytes of the block (after rounding); 0 for TS_MEMORY_OOM */
    const char *tag;      /* the caller's tag, or NULL */
    uint64_t in_use;      /* the pool's in-use bytes after the event */
    uint64_t reserved;    /* the pool's reserved bytes after the event */
} ts_memory_event;

typedef void (*ts_memory_event_fn)(const ts_memory_event *ev, void *user);

/* Calls fn after every allocation, free and out-of-memory failure of every pool, from the
 * thread that made the call, with no pool lock held (fn may itself allocate). NULL turns the
 * hook off. Set it while no other thread allocates: a call racing with the change may still
 * reach the previous fn. Events of different threads may arrive out of order. */
void ts_memory_set_callback(ts_memory_event_fn fn, void *user);

/* ---- the memory trace ------------------------------------------------------------------- */

/* Starts writing a Chrome Trace Event file (the JSON object form, {"traceEvents": [...]})
 * at path: one counter event ("ph": "C") per allocation and free with the pool's in_use,
 * reserved and cached bytes, plus an instant event per out-of-memory failure; timestamps in
 * microseconds since the start. Open it in https://ui.perfetto.dev or chrome://tracing.
 * Writes are buffered; the file is valid JSON after every flush, after ts_memtrace_stop,
 * when the last pool is destroyed and when libtessera is unloaded. The environment variable
 * TESSERA_MEMTRACE=FILE starts a trace when the first pool is created.
 * Errors: TS_ESTATE if a trace is already running, TS_EIO if path cannot be created.
 * Thread safe. */
ts_status ts_memtrace_start(const char *path);

/* Flushes and closes the trace. A no-op if none is running. Thread safe. */
void ts_memtrace_stop(void);
/* Marks the running trace (a no-op without one): phase 0 an instant event named name
 * ("epoch 2", "step 100") drawn across the whole timeline; 1 and -1 begin and end a slice
 * ("train", "eval") on a track of its own, so that memory can be read against what the
 * program was doing (tessera memplot draws these); 2 and -2 begin and end a slice on the
 * calling thread's kernel track ("step 12"), around the kernel slices of that thread.
 * While the kernel profile is on (ts_profile_enable), every kernel call and fill is a
 * slice on its thread's kernel track (name, start, duration, output dtype and shape), on
 * the same timeline as the pool counters. Thread safe. */
void ts_memtrace_marker(const char *name, int phase);
/* Marks the start of training step `step` in the running trace (a no-op without one): a
 * counter event "step" that tools read to find a step's time (tessera memplot --steps A:B),
 * not drawn as a mark. Thread safe. */
void ts_memtrace_step(int64_t step);

/* ---- leak reports ----------------------------------------------------------------------- */

/* Debug mode gives each new block a process-wide sequence number, so that a report can list
 * only the blocks allocated after a mark (a training step's leaks). Tags are kept in every
 * mode. On when TESSERA_DEBUG_MEMORY=1 is set at the first pool's creation, or by this
 * call. Returns the previous setting. Thread safe. */
int ts_memory_debug(int on);

/* The current sequence number: blocks allocated afterwards in debug mode have a larger one.
 * Take it at the top of a step, then report with since = the mark at its end. */
uint64_t ts_memory_mark(void);

typedef struct ts_memory_block_info {
    const char *pool;   /* (transfer none) valid during the callback */
    const void *ptr;
    uint64_t nbytes;    /* bytes asked for */
    uint64_t block_bytes; /* bytes of the block (after rounding) */
    const char *tag;    /* the allocation's tag, or NULL; in debug mode what made a tensor's
                         * block ("matmul (64, 10) float32"). Valid during the callback. */
    uint64_t seq;       /* its sequence number; 0 if debug mode was off when it was made */
} ts_memory_block_info;

/* Calls fn for every live block of every pool whose sequence number is above since (0: every
 * block, debug mode or not), pool by pool, in no particular order within a pool. fn runs
 * with the registry and that pool locked: it must not call into tessera. Returns the number
 * of blocks listed. Thread safe. */
uint64_t ts_memory_live_blocks(uint64_t since, void (*fn)(const ts_memory_block_info *b,
                                                          void *user),
                               void *user);

/* Writes the blocks ts_memory_live_blocks(since, ...) would list to out, one line each in
 * allocation order ("pool 'cpu_blas': 2.50 KiB (2560 bytes asked) tag 'matmul (64, 10)
 * float32' seq 42
 * at 0x..."), then a summary line; nothing if there are none. libtessera never prints on its
 * own: out is the caller's. *count (optional) receives the number of blocks.
 * Errors: TS_EINVAL if out is NULL, TS_ENOMEM (host memory to sort the list). */
ts_status ts_memory_leak_report(FILE *out, uint64_t since, uint64_t *count);

#ifdef __cplusplus
}
#endif
#endif /* TESSERA_MEMORY_H */
