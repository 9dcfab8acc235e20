/* kernels/host/hostdev.h: what every host-memory plugin (cpu_blas, cpu_onednn) shares:
 * raw memory for the host's pool (aligned, pre-faulted host memory and an mmap'ed address
 * range for the expandable segment), device figures of the (cgroup-capped) RAM, copies, fill
 * and the strided copy kernel. Compiled into each plugin, hidden;
 * it uses nothing but the plugin ABI, like a third-party plugin would. A plugin's context
 * struct starts with a hk_dev so these functions can sit in its vtable directly. */
#ifndef TESSERA_PLUGINS_HOSTDEV_H
#define TESSERA_PLUGINS_HOSTDEV_H

#include <tessera/plugin.h>

#define HK_ALIGN 64 /* AVX-512 loads */

typedef struct hk_dev {
    const ts_host *host;
    const char *name;
    int threads;    /* the threads kernels use now: hk_threads (changed by hk_dev_adapt) */
    int configured; /* the "threads" setting resolved (0 = all cores) */
    int adaptive;   /* "adaptive_threads": fewer threads while other processes use the cores */
    int probing;          /* one caller samples at a time (atomic) */
    long long probe_ns;   /* the last sample's monotonic clock (atomic) */
    double self_cpu;      /* this process's CPU time then */
    unsigned long long busy_ticks; /* and the machine's busy time, in clock ticks */
} hk_dev;

/* The threads a kernel splits its work over now (read once per kernel). */
static inline int hk_threads(const hk_dev *hd)
{
    return __atomic_load_n(&hd->threads, __ATOMIC_RELAXED);
}

/* Called at every kernel call: about four times a second, samples how much of the machine
 * other processes used since the last sample (its busy time, /proc/stat, less this process's
 * CPU time) and sets the threads to the cores they left free (at least one, at most the
 * setting), so that a busy machine does not leave threads waiting on each other for a core.
 * Nothing without /proc or with adaptive_threads = false. The host kernels and cpu_blas cut
 * their work for the threads setting (hd->configured: GEMM bands, a split reduction's parts,
 * a convolution's image slots) and run the parts on hk_threads of them, so their bits do not
 * follow the load; oneDNN's primitives partition by the count they are made for. */
void hk_dev_adapt(hk_dev *hd);
/* The policy: of `configured` threads on `ncpu` cores, others using `others` cores. */
int hk_threads_for(int configured, int ncpu, double others);

/* Sets up hd: reads the threads setting. */
void hk_dev_init(hk_dev *hd, const ts_host *host, const char *name,
                     const ts_setting *settings, size_t nsettings);

/* Descriptor members for any ctx whose struct starts with a hk_dev. */
ts_status hk_dev_device_info(void *ctx, ts_device_info *info);
ts_status hk_dev_mem_alloc(void *ctx, size_t nbytes, void **ptr);
void hk_dev_mem_free(void *ctx, void *ptr, size_t nbytes);
ts_status hk_dev_copy(void *ctx, void *dst, const void *src, size_t nbytes);
ts_status hk_dev_fill(void *ctx, void *dst, size_t nbytes, const void *pattern,
                          size_t pattern_size);
ts_status hk_dev_synchronize(void *ctx);
size_t hk_dev_vm_granularity(void *ctx);
ts_status hk_dev_vm_reserve(void *ctx, size_t nbytes, void **base);
void hk_dev_vm_release(void *ctx, void *base, size_t nbytes);
ts_status hk_dev_vm_commit(void *ctx, void *addr, size_t nbytes);
void hk_dev_vm_decommit(void *ctx, void *addr, size_t nbytes);

/* The descriptor members above but device_info, for a designated initializer. */
#define HK_DESC_MEMBERS                                                             \
    .flags = TS_PLUGIN_HOST_MEMORY, .alignment = HK_ALIGN,                          \
    .mem_alloc = hk_dev_mem_alloc,                                                      \
    .mem_free = hk_dev_mem_free, .copy_h2d = hk_dev_copy, .copy_d2h = hk_dev_copy, \
    .copy_d2d = hk_dev_copy, .fill = hk_dev_fill,                                   \
    .synchronize = hk_dev_synchronize, .vm_granularity = hk_dev_vm_granularity,     \
    .vm_reserve = hk_dev_vm_reserve, .vm_release = hk_dev_vm_release,               \
    .vm_commit = hk_dev_vm_commit, .vm_decommit = hk_dev_vm_decommit

/* TS_OP_COPY on host memory: any strides, any dtype. */
ts_status hk_dev_copy_strided(const ts_operand *dst, const ts_operand *src);


/* The keys both CPU plugins declare; adaptive_threads' default and help are the plugin's
 * (cpu_blas adapts without changing a bit; cpu_onednn's oneDNN primitives would). */
#define HK_KEYS(adaptive_default, adaptive_help)                                            \
    {"threads", TS_SETTING_INT, "0", 0, 4096, "worker threads; 0 = all cores"},              \
    {"adaptive_threads", TS_SETTING_BOOL, adaptive_default, 0, 0, adaptive_help}

#endif /* TESSERA_PLUGINS_HOSTDEV_H */
