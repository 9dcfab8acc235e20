/* core/memtrace.h: what core/pool.c and core/memtrace.c share: the hook flags checked on
 * every allocation, the trace writer and the event dispatcher. Never installed. */
#ifndef TESSERA_CORE_MEMTRACE_H
#define TESSERA_CORE_MEMTRACE_H

#include <stdatomic.h>
#include <stdint.h>

#include <tessera/memory.h>

/* Bits of ts__mem_hooks: a pool reads it once per call (relaxed) and does nothing more
 * while it is zero. */
#define TS__MEM_TRACE 0x1u    /* a trace file is open */
#define TS__MEM_CALLBACK 0x2u /* ts_memory_set_callback installed a function */
#define TS__MEM_DEBUG 0x4u    /* blocks get sequence numbers */

extern atomic_uint ts__mem_hooks;

static inline int ts__mem_debug_on(void)
{
    return (atomic_load_explicit(&ts__mem_hooks, memory_order_relaxed) & TS__MEM_DEBUG) != 0;
}

/* ---- memtrace.c ------------------------------------------------------------------------ */

/* Reads TESSERA_DEBUG_MEMORY and TESSERA_MEMTRACE once per process; called by the registry
 * when the first pool is created. */
void ts__memtrace_env_init(void);
/* A counter event for pool (bytes after the event). Call with that pool's lock held, so that
 * one pool's events are written in order. */
void ts__memtrace_counter(const char *pool, uint64_t in_use, uint64_t reserved,
                          uint64_t cached);
/* A counter event "roles POOL" with the device's live storage bytes by role. */
void ts__memtrace_roles(const char *pool, const uint64_t *bytes);
/* An instant event for a failed request of nbytes. Same locking as ts__memtrace_counter. */
void ts__memtrace_oom(const char *pool, uint64_t nbytes);
/* A kernel slice from ts__profile_begin's t0 to t1 (same clock) on the calling thread's
 * kernel track; out is the first output (NULL for a fill). Takes the trace lock. */
struct ts_operand;
void ts__memtrace_kernel(const char *name, uint64_t t0, uint64_t t1,
                         const struct ts_operand *out);
/* Writes out the buffer, leaving a valid file. */
void ts__memtrace_flush(void);
/* Calls the event hook, if any. Call with no pool lock held. */
void ts__mem_dispatch(const ts_memory_event *ev);
/* The next block sequence number (debug mode). */
uint64_t ts__mem_next_seq(void);

/* ---- pool.c ---------------------------------------------------------------------------- */

/* Debug mode only (else a no-op): names the live block at ptr for leak reports. final 0 is
 * its creator's name, set once, which starts with the block's tag ("tensor (64, 10)
 * float32"); final 1 is the op whose kernel first wrote it, put in place of that tag
 * ("matmul (64, 10) float32"), after which the name stays. A block without a creator's name
 * is left alone. */
struct ts_pool;
void ts__pool_name_block(struct ts_pool *p, const void *ptr, const char *text, int final);
/* The same for a device's pool, with final 0 (core/loader.c). */
struct ts_device;
void ts__device_name_block(struct ts_device *dev, const void *ptr, const char *text);

/* Writes a counter event for every live pool (a trace that starts while pools exist). */
void ts__pools_trace_snapshot(void);
/* "1.50 GiB", "512 B". Returns buf. */
const char *ts__fmt_bytes(char buf[32], uint64_t nbytes);

#endif /* TESSERA_CORE_MEMTRACE_H */
