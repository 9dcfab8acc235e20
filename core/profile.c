/* core/profile.c: the kernel profile (ts_profile_enable / _reset / _read). While on, every
 * kernel the core sends to a device (and every fill) is timed with the monotonic clock around
 * the plugin's call, and counted per (op, function, dtype) in a fixed table of relaxed atomic
 * counters: no lock, no allocation, and one relaxed load per call while off. */
#include "internal.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* fn slots, one per function of the op table's largest function table, and NFN - 1 for none;
 * dtype slots per dtype and NDT - 1 for none (fills) */
#define MAX2(a, b) ((a) > (b) ? (a) : (b))
enum {
    NFN = MAX2(MAX2((int)TS_UNARY_COUNT, (int)TS_BINARY_COUNT), (int)TS_REDUCE_COUNT) + 1,
    NDT = TS_DTYPE_COUNT + 1
};

typedef struct slot {
    atomic_uint_fast64_t calls, ns, reference, declined;
} slot;

static atomic_int on;
static slot table[TS_OP_COUNT][NFN][NDT];

static int fn_slot(int32_t op, int32_t fn)
{
    return ts_fn_name(op, fn) && fn < NFN - 1 ? fn : NFN - 1;
}

static int32_t call_fn(const ts_kernel_call *call)
{
    /* The ops with a function carry it as the params' first int32. */
    if (call->params && call->params_size >= sizeof(int32_t) &&
        (call->op == TS_OP_UNARY || call->op == TS_OP_BINARY ||
         call->op == TS_OP_BINARY_SCALAR || call->op == TS_OP_REDUCE)) {
        int32_t fn;
        memcpy(&fn, call->params, sizeof fn);
        return fn;
    }
    return -1;
}

/* Monotonic nanoseconds, plus 1 so that a start time is never 0 (0 means "not timed"). */
static uint64_t stamp(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec + 1;
}

const char *ts__call_name(const ts_kernel_call *call)
{
    const char *fn = ts_fn_name(call->op, call_fn(call));
    return fn ? fn : ts_op_name(call->op);
}

uint64_t ts__profile_begin(void)
{
    return atomic_load_explicit(&on, memory_order_relaxed) ? stamp() : 0;
}

uint64_t ts__profile_end(uint64_t t0, int32_t op, int32_t fn, int32_t dtype)
{
    if (!t0 || op <= TS_OP_NONE || op >= TS_OP_COUNT)
        return 0;
    if (dtype < 0 || dtype >= NDT - 1)
        dtype = NDT - 1;
    uint64_t now = stamp();
    slot *sl = &table[op][fn_slot(op, fn)][dtype];
    atomic_fetch_add_explicit(&sl->calls, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&sl->ns, now > t0 ? now - t0 : 0, memory_order_relaxed);
    return now;
}

uint64_t ts__profile_end_call(uint64_t t0, const ts_kernel_call *call, int where)
{
    uint64_t t1 = t0 ? ts__profile_end(t0, call->op, call_fn(call),
                                       call->noutputs > 0 ? call->outputs[0].dtype : TS_F32)
                     : 0;
    if (t1 && where != TS__RAN_PLUGIN) {
        int32_t dtype = call->noutputs > 0 ? call->outputs[0].dtype : TS_F32;
        if (dtype < 0 || dtype >= NDT - 1)
            dtype = NDT - 1;
        slot *sl = &table[call->op][fn_slot(call->op, call_fn(call))][dtype];
        atomic_fetch_add_explicit(where == TS__RAN_DECLINED ? &sl->declined : &sl->reference, 1,
                                  memory_order_relaxed);
    }
    return t1;
}

TS_API void ts_profile_reset(void)
{
    for (int o = 0; o < TS_OP_COUNT; o++)
        for (int f = 0; f < NFN; f++)
            for (int d = 0; d < NDT; d++) {
                atomic_store_explicit(&table[o][f][d].calls, 0, memory_order_relaxed);
                atomic_store_explicit(&table[o][f][d].ns, 0, memory_order_relaxed);
                atomic_store_explicit(&table[o][f][d].reference, 0, memory_order_relaxed);
                atomic_store_explicit(&table[o][f][d].declined, 0, memory_order_relaxed);
            }
}

TS_API int ts_profile_enable(int enable)
{
    return atomic_exchange(&on, enable != 0);
}

static int by_time(const void *a, const void *b)
{
    const ts_profile_entry *x = a, *y = b;
    if (x->seconds != y->seconds)
        return x->seconds < y->seconds ? 1 : -1;
    if (x->op != y->op)
        return x->op < y->op ? -1 : 1;
    if (x->fn != y->fn)
        return x->fn < y->fn ? -1 : 1;
    return (x->dtype > y->dtype) - (x->dtype < y->dtype);
}

/* Fills out[0..max) with the used slots in table order; returns how many are used. */
static size_t collect(ts_profile_entry *out, size_t max)
{
    size_t n = 0;
    for (int o = 0; o < TS_OP_COUNT; o++)
        for (int f = 0; f < NFN; f++)
            for (int d = 0; d < NDT; d++) {
                uint64_t c = atomic_load_explicit(&table[o][f][d].calls, memory_order_relaxed);
                if (!c)
                    continue;
                uint64_t ns = atomic_load_explicit(&table[o][f][d].ns, memory_order_relaxed);
                if (n < max)
                    out[n] = (ts_profile_entry){
                        .op = o,
                        .fn = f == NFN - 1 ? -1 : f,
                        .dtype = d == NDT - 1 ? -1 : d,
                        .calls = c,
                        .seconds = (double)ns * 1e-9,
                        .reference_calls = atomic_load_explicit(&table[o][f][d].reference,
                                                                memory_order_relaxed),
                        .declined_calls = atomic_load_explicit(&table[o][f][d].declined,
                                                               memory_order_relaxed),
                    };
                n++;
            }
    return n;
}

TS_API size_t ts_profile_read(ts_profile_entry *out, size_t max)
{
    enum { ALL = TS_OP_COUNT * NFN * NDT };
    if (!out || !max)
        return collect(NULL, 0);
    ts_profile_entry *all = malloc(ALL * sizeof *all);
    if (!all) /* unsorted, then */
        return collect(out, max);
    size_t n = collect(all, ALL);
    qsort(all, n, sizeof all[0], by_time);
    memcpy(out, all, (n < max ? n : max) * sizeof all[0]);
    free(all);
    return n;
}
