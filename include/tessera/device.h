/* tessera/device.h: devices (loaded plugin instances), the plugin search path, the runtime
 * that picks the default device with its fallback, and logging. */
#ifndef TESSERA_DEVICE_H
#define TESSERA_DEVICE_H

#include <stddef.h>
#include <stdint.h>
#include <tessera/config.h>
#include <tessera/plugin.h>
#include <tessera/status.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A device: one plugin, dlopen'ed and initialised with its [plugin.NAME] settings. */
typedef struct ts_device ts_device;

/* ---- logging ------------------------------------------------------------------------- */

/* Messages go to this handler, called from whichever thread logs. The default (and fn NULL)
 * writes "tessera: LEVEL: message" lines to stderr; libtessera never writes to stdout.
 * Silence it with ts_set_log_level(-1) or a handler that drops what it gets. */
typedef void (*ts_log_fn)(int level, const char *message, void *user);
void ts_set_log_handler(ts_log_fn fn, void *user);
/* Messages above level are not formatted at all. Default TS_LOG_WARN (errors and warnings);
 * -1 drops everything. */
void ts_set_log_level(int level);
int ts_log_level_get(void);
/* "error", "warn", "info", "debug". (transfer none, static) */
const char *ts_log_level_name(int level);

/* ---- plugin search -------------------------------------------------------------------- */

/* Calls fn for every directory searched for plugins, in order: the config's plugin_path
 * (relative entries resolved against the config file's directory), $TESSERA_PLUGIN_PATH
 * (ignored in setuid programs), the build tree when libtessera runs uninstalled, then the
 * installed plugin directory ($TESSERA_SYSTEM_PLUGIN_DIR replaces it; empty disables it).
 * The current directory is never searched implicitly. */
void ts_plugin_search_path(const ts_config *cfg, void (*fn)(const char *dir, void *user),
                           void *user);

/* Resolves a plugin name ("cuda") to the first DIR/NAME.so on the search path, or a value
 * containing '/' to that path. TS_EPLUGIN listing the directories tried if none exists.
 * (transfer full) on *path: free(). */
ts_status ts_plugin_find(const ts_config *cfg, const char *name, char **path);

/* Calls fn for every device plugin (*.so) found on the search path, the first one of each
 * name only; comm_*.so, the communication plugins (tessera/comm.h), are left out. */
void ts_plugin_scan(const ts_config *cfg,
                    void (*fn)(const char *name, const char *path, void *user), void *user);

/* ---- devices -------------------------------------------------------------------------- */

/* Finds, dlopens (RTLD_NOW|RTLD_LOCAL), checks the ABI of, and initialises a plugin.
 * name_or_path: "cpu_blas" or a path to a .so. cfg may be NULL (defaults).
 * Errors (TS_EPLUGIN unless noted), each with one clear message: not found (directories
 * tried), dlopen failure (dlerror text), missing entry symbol, ABI mismatch (both versions),
 * missing required vtable member (its name), TS_ECONFIG for a bad key in its section, and the
 * plugin's own init failure (TS_ENODEV: loads but has no usable device).
 * (transfer full) on *out: ts_device_unload. */
ts_status ts_device_load(const ts_config *cfg, const char *name_or_path, ts_device **out);

/* Shuts the plugin down and dlcloses it. NULL is a no-op. */
void ts_device_unload(ts_device *dev);

/* (transfer none) */
const char *ts_device_name(const ts_device *dev);
const char *ts_device_path(const ts_device *dev);
const ts_plugin_desc *ts_device_desc(const ts_device *dev);
/* The resolved settings of its section. (transfer none) */
const ts_setting *ts_device_settings(const ts_device *dev, size_t *n);
ts_status ts_device_info_get(ts_device *dev, ts_device_info *info);
/* Non-zero if the plugin runs op (ts_op) for dtype itself; 0 if the core must compose it or
 * report it unsupported. */
int ts_device_supports(ts_device *dev, int op, int dtype);
ts_status ts_device_memory_stats(ts_device *dev, ts_memory_stats *stats);
void ts_device_reset_peak(ts_device *dev);
void ts_device_empty_cache(ts_device *dev);
/* Changes the pool's limits: reserve_limit (0 = none) and cache_limit, in bytes. */
ts_status ts_device_set_limits(ts_device *dev, uint64_t reserve_limit, uint64_t cache_limit);

/* Raw device memory through the plugin (its pool). (transfer full) on *ptr. */
ts_status ts_device_alloc(ts_device *dev, size_t nbytes, const char *tag, void **ptr);
void ts_device_free(ts_device *dev, void *ptr);
ts_status ts_device_copy_from_host(ts_device *dev, void *dst, const void *src, size_t nbytes);
ts_status ts_device_copy_to_host(ts_device *dev, void *dst, const void *src, size_t nbytes);
/* Device-to-device copy (non-overlapping or identical ranges) and a fill repeating a pattern
 * of pattern_size bytes (1, 2, 4 or 8, dividing nbytes; TS_EINVAL otherwise) over dst. */
ts_status ts_device_copy_device(ts_device *dev, void *dst, const void *src, size_t nbytes);
ts_status ts_device_fill(ts_device *dev, void *dst, size_t nbytes, const void *pattern,
                         size_t pattern_size);
ts_status ts_device_synchronize(ts_device *dev);

/* ---- pinned host memory ----------------------------------------------------------------
 * Page-locked host memory that dev copies from without staging and, with
 * ts_device_copy_from_pinned, while the caller goes on (CUDA: cudaHostAlloc). Host-memory
 * plugins (the CPU ones) give ordinary memory of their pool: the same calls work on every
 * device. The blocks come from a caching pool of the device's own (cache_limit and caching as
 * for the device; no reserve limit), with its own statistics. */
/* Host memory the CPU reads and writes directly. TS_ENOTSUP naming the plugin when the device
 * has no pinned memory (a GPU plugin without the host_alloc slot). (transfer full) on *ptr:
 * ts_device_pinned_free. */
ts_status ts_device_pinned_alloc(ts_device *dev, size_t nbytes, const char *tag, void **ptr);
/* Waits for the device's uploads from pinned memory first: the block is handed out again. */
void ts_device_pinned_free(ts_device *dev, void *ptr);
/* The pinned pool's statistics (in_use, reserved, cached, n_raw_alloc, ...); all zero with
 * valid = 0 when the device has no pinned memory. */
ts_status ts_device_pinned_stats(ts_device *dev, ts_memory_stats *stats);
/* Queues the copy of nbytes from src, which must lie in one block of ts_device_pinned_alloc
 * of the same device, to device memory dst, and returns: kernels queued later see the data.
 * src must stay unwritten until ts_device_wait_copy(dev, *ticket) returns. Where the plugin
 * has no asynchronous upload the copy is done on return and *ticket is 0. */
ts_status ts_device_copy_from_pinned(ts_device *dev, void *dst, const void *src, size_t nbytes,
                                     uint64_t *ticket);
/* Returns once the copy named by ticket (and every earlier one) has completed; 0 returns at
 * once. */
ts_status ts_device_wait_copy(ts_device *dev, uint64_t ticket);

/* ---- graph capture ----------------------------------------------------------------------
 * Records the work a stretch of code gives a device (a training step's forward and backward)
 * once, and replays it with one call: on CUDA a CUDA graph, which removes the launch cost of
 * every kernel. Between begin and end the device records instead of running: nothing is
 * computed until the first replay. A replay redoes the recorded work on the same addresses:
 * tensors that live across replays (parameters, their gradients, the inputs the caller
 * rewrites before each replay, the loss it reads after) keep their places, and blocks freed
 * while recording stay out of the pool until ts_graph_free. So the recorded code must have
 * static shapes and must not read device data on the host (copies to the host fail while
 * recording; index range checks are skipped, and a replay ignores an out-of-range index of
 * index_select / index_add rather than read or write outside the tensor); bytes copied from
 * the host while recording are replayed as they were then. One recording at a time per
 * device; no other thread may use the device meanwhile. */
typedef struct ts_graph ts_graph;
/* Non-zero if the device's plugin can record graphs (the cuda plugin). */
int ts_device_can_capture(const ts_device *dev);
/* TS_ENOTSUP naming the plugin when it cannot; TS_ESTATE when already recording. */
ts_status ts_graph_capture_begin(ts_device *dev);
/* Ends the recording. On failure (a call the device cannot record) the recording is dropped
 * and the device runs work again. (transfer full) on *out: ts_graph_free. */
ts_status ts_graph_capture_end(ts_device *dev, ts_graph **out);
/* Queues one replay, in order with the device's other work. */
ts_status ts_graph_replay(ts_graph *g);
/* Frees the recording and gives its held blocks back; before the device is unloaded (a
 * recording still open at unload is dropped). NULL is a no-op. */
void ts_graph_free(ts_graph *g);

/* Runs one kernel on the device exactly as given: no shape, dtype or overlap checks (the
 * tensor API does those). For conformance tests and plugin authors. TS_ENOTSUP if the plugin
 * does not implement the op for the output's dtype. */
ts_status ts_device_run(ts_device *dev, const ts_kernel_call *call);

/* ---- kernel profile ------------------------------------------------------------------------
 * Process-wide. While enabled, every kernel call the core makes on any device (fills
 * included) is counted, with the wall-clock seconds around the plugin's run, per op, function
 * (unary/binary/reduce) and output dtype. Counts add up across enabled periods until
 * ts_profile_reset. On a device whose memory is not host memory (cuda, which runs kernels
 * asynchronously) the core waits for each kernel while counting, so the time is the kernel's
 * own, not its launch's (and the device runs slower meanwhile). Disabled (the default), it
 * costs one relaxed atomic load per call. */
typedef struct ts_profile_entry {
    int32_t op;     /* ts_op */
    int32_t fn;     /* for TS_OP_UNARY / _BINARY / _BINARY_SCALAR / _REDUCE; else -1 */
    int32_t dtype;  /* the output's; -1 for fills (raw bytes) */
    uint64_t calls;
    double seconds;
    uint64_t reference_calls; /* of calls: run by the core's reference kernels on host memory
                               * because the plugin does not claim the op (or is too old to
                               * know the function) */
    uint64_t declined_calls;  /* ... because the plugin declined the call */
} ts_profile_entry;

/* Turns counting on (nonzero) or off; returns whether it was on. */
int ts_profile_enable(int enable);
/* Zeroes every count. */
void ts_profile_reset(void);
/* Copies up to max entries with at least one call into out (NULL: none), the most time
 * first; returns how many there are. Counting may go on while reading. */
size_t ts_profile_read(ts_profile_entry *out, size_t max);

/* The core's reference host kernels (plain loops, single-threaded): what runs, for a plugin
 * declaring TS_PLUGIN_HOST_MEMORY, every op its supports() does not claim. Operands must be
 * host memory. ts_reference_supports says which op/dtype (output dtype) they implement;
 * ts_reference_run runs one (TS_ENOTSUP otherwise), with the errors a plugin would give. For
 * conformance checks (tessera plugin-check) and plugin authors' tests. */
int ts_reference_supports(int op, int dtype);
ts_status ts_reference_run(const ts_kernel_call *call);

/* ---- the runtime ----------------------------------------------------------------------- */

/* Loads the configuration (config_path as for ts_config_load), sets the log level, and loads
 * the default device: $TESSERA_DEVICE if set, else [core] device. If that cannot start, the
 * [core] fallback device is loaded and a warning says why ("plugin 'cuda': ...; falling back
 * to 'cpu_blas'"). Fails only if neither starts. Not thread safe against itself. */
ts_status ts_init(const char *config_path);

/* Unloads every device and frees the configuration. Safe without ts_init. */
void ts_shutdown(void);

/* The runtime's configuration and default device; NULL before ts_init. (transfer none) */
const ts_config *ts_runtime_config(void);
ts_device *ts_default_device(void);

/* A device by name, loading it on first use; the runtime owns it until ts_shutdown.
 * (transfer none) on *out. Thread safe. */
ts_status ts_device_get(const char *name, ts_device **out);

/* Empties the pool cache of every loaded device (dev NULL) or of one. */
void ts_empty_cache(ts_device *dev);

#ifdef __cplusplus
}
#endif
#endif /* TESSERA_DEVICE_H */
