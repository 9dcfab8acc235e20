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

/* ---- memtrace.c ------------------------------------------------------------------------ */

/* Reads TESSERA_DEBUG_MEMORY and TESSERA_MEMTRACE once per process; called by the registry
 * when the first pool is created. */
void ts__memtrace_env_init(void);
/* A counter event for pool (bytes after the event). Call with that pool's lock held, so that
 * one pool's events are written in order. */
void ts__memtrace_counter(const char *pool, uint64_t in_use, uint64_t reserved,
                          uint64_t cached);
/* An instant event for a failed request of nbytes. Same locking as ts__memtrace_counter. */
void ts__memtrace_oom(const char *pool, uint64_t nbytes);
/* Writes out the buffer, leaving a valid file. */
void ts__memtrace_flush(void);
/* Calls the event hook, if any. Call with no pool lock held. */
void ts__mem_dispatch(const ts_memory_event *ev);
/* The next block sequence number (debug mode). */
uint64_t ts__mem_next_seq(void);

/* ---- pool.c ---------------------------------------------------------------------------- */

/* Writes a counter event for every live pool (a trace that starts while pools exist). */
void ts__pools_trace_snapshot(void);
/* "1.50 GiB", "512 B". Returns buf. */
const char *ts__fmt_bytes(char buf[32], uint64_t nbytes);

#endif /* TESSERA_CORE_MEMTRACE_H */
