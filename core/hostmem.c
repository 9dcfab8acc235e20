/* core/hostmem.c: how much host RAM there is for the CPU plugins' memory_fraction: physical
 * memory, capped by the cgroup (v2 memory.max, or v1 limit_in_bytes) when one is set. */
#include <stdio.h>
#include <string.h>
#include <sys/sysinfo.h>

#include "internal.h"

static int read_u64(const char *path, uint64_t *out)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    char buf[64] = {0};
    int ok = fgets(buf, sizeof buf, f) != NULL;
    fclose(f);
    if (!ok || strncmp(buf, "max", 3) == 0)
        return 0;
    unsigned long long v;
    if (sscanf(buf, "%llu", &v) != 1)
        return 0;
    *out = v;
    return 1;
}

ts_status ts__host_memory(uint64_t *total, uint64_t *available)
{
    struct sysinfo si;
    if (sysinfo(&si) != 0)
        return ts__fail(TS_EIO, "sysinfo() failed: cannot read the host's memory size");
    uint64_t phys = (uint64_t)si.totalram * si.mem_unit;
    uint64_t avail = (uint64_t)(si.freeram + si.bufferram) * si.mem_unit;
    uint64_t lim;
    /* A v1 "no limit" reads as a huge number; only a limit below RAM counts. */
    if ((read_u64("/sys/fs/cgroup/memory.max", &lim) ||
         read_u64("/sys/fs/cgroup/memory/memory.limit_in_bytes", &lim)) &&
        lim < phys) {
        phys = lim;
        uint64_t used;
        if (read_u64("/sys/fs/cgroup/memory.current", &used) ||
            read_u64("/sys/fs/cgroup/memory/memory.usage_in_bytes", &used))
            avail = used < lim ? lim - used : 0;
        if (avail > phys)
            avail = phys;
    }
    if (total)
        *total = phys;
    if (available)
        *available = avail;
    return TS_OK;
}
