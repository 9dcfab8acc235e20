/* core/fault.c: the fault-injection hooks behind tessera/fault.h, the host allocation
 * wrappers (ts__malloc and friends) that every core file uses so TS_FAULT_HOST can reach
 * them, and the loader's test-only hook. Disarmed, a hook is one relaxed atomic load. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <tessera/fault.h>

#include "internal.h"

static _Atomic unsigned armed_sites; /* 0: off */
static _Atomic uint64_t counter, target;
static _Atomic unsigned fired;

TS_API void ts_fault_arm(unsigned sites, uint64_t n)
{
    atomic_store(&armed_sites, 0);
    atomic_store(&counter, 0);
    atomic_store(&target, n);
    atomic_store(&fired, 0);
    atomic_store(&armed_sites, sites & TS_FAULT_ALL);
}

TS_API void ts_fault_disarm(void)
{
    atomic_store(&armed_sites, 0);
}

TS_API uint64_t ts_fault_count(void)
{
    return atomic_load(&counter);
}

TS_API unsigned ts_fault_fired(void)
{
    return atomic_load(&fired);
}

int ts__fault_hit(unsigned site)
{
    if (!(atomic_load_explicit(&armed_sites, memory_order_relaxed) & site))
        return 0;
    uint64_t k = atomic_fetch_add(&counter, 1) + 1;
    if (k != atomic_load(&target))
        return 0;
    atomic_store(&fired, site);
    return 1;
}

void *ts__malloc(size_t n)
{
    return ts__fault_hit(TS_FAULT_HOST) ? NULL : malloc(n);
}

void *ts__calloc(size_t n, size_t size)
{
    return ts__fault_hit(TS_FAULT_HOST) ? NULL : calloc(n, size);
}

void *ts__realloc(void *p, size_t n)
{
    return ts__fault_hit(TS_FAULT_HOST) ? NULL : realloc(p, n);
}

void (*ts__loader_after_check_hook)(const char *real);
