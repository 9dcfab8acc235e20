/* tessera/fault.h: fault injection for tests, in the manner of SQLite's test hooks. Compiled
 * into every build and off until armed: disarmed, each hook costs one relaxed atomic load.
 * Armed, it counts the calls at the chosen sites and makes exactly the n-th one fail with
 * the status a real failure would have, so a test can walk every failure point of a workload
 * (count first, then fail 1, 2, ..., count). docs/reliability.md shows the loop. */
#ifndef TESSERA_FAULT_H
#define TESSERA_FAULT_H

#include <stdint.h>

#include <tessera/status.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Where a fault can be injected (a bit mask; values are ABI, append only). */
typedef enum ts_fault_site {
    /* A pool allocation (every device allocation goes through the plugin's pool): TS_ENOMEM. */
    TS_FAULT_POOL = 1 << 0,
    /* A host allocation made by libtessera itself (tensor and node structs, names, buffers;
     * not those made inside libc, inih, cJSON or a plugin): TS_ENOMEM. */
    TS_FAULT_HOST = 1 << 1,
    /* A call into a plugin that does work: a kernel (ts_device_run), a fill or a host<->device
     * copy: TS_EPLUGIN, as if the plugin had returned an error. */
    TS_FAULT_KERNEL = 1 << 2,
    /* A step of ts_checkpoint_save that touches the disk: each write, the fsync of the
     * temporary file, the rename over the target, the fsync of the directory. Fails with
     * errno EIO, so the save returns TS_EIO ("injected I/O error"). */
    TS_FAULT_IO = 1 << 3,
    TS_FAULT_ALL = (1 << 4) - 1,
} ts_fault_site;

/* Starts counting the calls at sites (a mask of ts_fault_site) from zero; the n-th one
 * (1-based) fails, and only that one. n = 0 counts without failing. Replaces any earlier
 * arming. Process-wide: calls from every thread count. */
void ts_fault_arm(unsigned sites, uint64_t n);
/* Stops counting and failing. */
void ts_fault_disarm(void);
/* Calls counted at the armed sites since ts_fault_arm (the failed one included). */
uint64_t ts_fault_count(void);
/* The site of the injected failure since ts_fault_arm, or 0 if none has fired yet. */
unsigned ts_fault_fired(void);

#ifdef __cplusplus
}
#endif

#endif /* TESSERA_FAULT_H */
