/* kernels/host/hostdev.c: host-memory device plumbing shared by the CPU plugins. */
#include "config.h"

#include "hostdev.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* Commits go in steps of this: a step's pages are mapped and faulted in at once. */
#define VM_GRANULARITY ((size_t)2 << 20)

ts_status hk_dev_mem_alloc(void *ctx, size_t nbytes, void **ptr)
{
    (void)ctx;
    void *p = NULL;
    if (posix_memalign(&p, HK_ALIGN, nbytes ? nbytes : HK_ALIGN) != 0)
        return TS_ENOMEM;
    /* Touch every page now: reserved memory is then resident, so the process's RSS follows
     * the pool's reserved figure instead of creeping up as blocks land on fresh pages. Raw
     * allocations are rare (none in a steady training step), so this costs nothing there. */
    memset(p, 0, nbytes);
    *ptr = p;
    return TS_OK;
}

void hk_dev_mem_free(void *ctx, void *ptr, size_t nbytes)
{
    (void)ctx;
    (void)nbytes;
    free(ptr);
}

/* The expandable segment's address space: mapped PROT_NONE without a commit charge, then
 * mapped over read-write (charged, pages faulted in like raw_alloc's memset) piece by piece
 * from its start, and mapped back to PROT_NONE when the pool trims its end. */
size_t hk_dev_vm_granularity(void *ctx)
{
    (void)ctx;
    return VM_GRANULARITY;
}

ts_status hk_dev_vm_reserve(void *ctx, size_t nbytes, void **base)
{
    hk_dev *hd = ctx;
    /* mmap aligns to pages only: reserve one granule more and trim both ends to a range
     * aligned to the granularity the host asks for */
    const size_t g = VM_GRANULARITY;
    if (nbytes > SIZE_MAX - g)
        return hd->host->fail(hd->host, TS_ENOMEM, "plugin '%s': %zu bytes of address space "
                              "is too many", hd->name, nbytes);
    char *p = mmap(NULL, nbytes + g, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED)
        return hd->host->fail(hd->host, TS_ENOMEM, "plugin '%s': reserving %zu bytes of "
                              "address space: %s", hd->name, nbytes, strerror(errno));
    size_t head = (g - (uintptr_t)p % g) % g;
    if (head)
        munmap(p, head);
    if (g - head)
        munmap(p + head + nbytes, g - head);
    *base = p + head;
    return TS_OK;
}

void hk_dev_vm_release(void *ctx, void *base, size_t nbytes)
{
    (void)ctx;
    munmap(base, nbytes);
}

ts_status hk_dev_vm_commit(void *ctx, void *addr, size_t nbytes)
{
    hk_dev *hd = ctx;
    void *p = mmap(addr, nbytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED)
        return hd->host->fail(hd->host, TS_ENOMEM, "plugin '%s': committing %zu bytes: %s",
                              hd->name, nbytes, strerror(errno));
    return TS_OK;
}

void hk_dev_vm_decommit(void *ctx, void *addr, size_t nbytes)
{
    (void)ctx;
    /* A fresh PROT_NONE mapping drops the pages and the commit charge; should the kernel
     * refuse (it does not), the pages are at least given back. */
    if (mmap(addr, nbytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE,
             -1, 0) == MAP_FAILED)
        madvise(addr, nbytes, MADV_DONTNEED);
}

void hk_dev_init(hk_dev *hd, const ts_host *host, const char *name,
                     const ts_setting *settings, size_t nsettings)
{
    memset(hd, 0, sizeof *hd);
    hd->host = host;
    hd->name = name;
    const ts_setting *threads = ts_setting_find(settings, nsettings, "threads");
    const ts_setting *adapt = ts_setting_find(settings, nsettings, "adaptive_threads");
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    hd->configured = threads && threads->v.i > 0 ? (int)threads->v.i : (ncpu > 0 ? (int)ncpu : 1);
    hd->threads = hd->configured;
    hd->adaptive = adapt ? adapt->v.boolean != 0 : 0;
    /* TESSERA_RUN_THREADS=N: kernels run on N threads (at most the setting) as adaptive
     * threads would under load, the work still cut for `threads`: to check that results do
     * not depend on how many threads run (tests/cli/test-threads-invariant.sh). */
#ifdef HAVE_SECURE_GETENV
    const char *run = secure_getenv("TESSERA_RUN_THREADS"); /* as the core reads its own */
#else
    const char *run = getenv("TESSERA_RUN_THREADS");
#endif
    char *end;
    errno = 0;
    long n = run ? strtol(run, &end, 10) : 0;
    if (run && *run && !*end && !errno && n > 0) { /* anything else: ignored */
        hd->threads = n < hd->configured ? (int)n : hd->configured;
        hd->adaptive = 0;
    }
}

int hk_threads_for(int configured, int ncpu, double others)
{
    /* a quarter of a core of slack: a shell or a logger does not cost a thread */
    double free_cores = (double)ncpu - others + 0.25;
    int n = free_cores < 1 ? 1 : (int)free_cores;
    return n < configured ? n : configured;
}

/* The machine's busy time so far (all cores, clock ticks), or 0 without /proc/stat. */
static unsigned long long busy_ticks(void)
{
    FILE *f = fopen("/proc/stat", "re");
    if (!f)
        return 0;
    unsigned long long v[8] = {0};
    int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                   &v[4], &v[5], &v[6], &v[7]);
    fclose(f);
    /* user nice system idle iowait irq softirq steal: busy is all but idle and iowait */
    return n == 8 ? v[0] + v[1] + v[2] + v[5] + v[6] + v[7] : 0;
}

static long long clock_ns(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (long long)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

void hk_dev_adapt(hk_dev *hd)
{
    if (!hd->adaptive || hd->configured < 2)
        return;
    long long now = clock_ns(CLOCK_MONOTONIC);
    long long last = __atomic_load_n(&hd->probe_ns, __ATOMIC_RELAXED);
    if (now - last < 250000000ll || __atomic_exchange_n(&hd->probing, 1, __ATOMIC_ACQUIRE))
        return;
    unsigned long long busy = busy_ticks();
    double self = 1e-9 * (double)clock_ns(CLOCK_PROCESS_CPUTIME_ID), dt = 1e-9 * (double)(now - last);
    long hz = sysconf(_SC_CLK_TCK), ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    if (busy && hd->busy_ticks && hz > 0 && ncpu > 0 && dt > 0 && dt < 5) {
        double others = ((double)(busy - hd->busy_ticks) / (double)hz - (self - hd->self_cpu)) / dt;
        __atomic_store_n(&hd->threads, hk_threads_for(hd->configured, (int)ncpu, others),
                         __ATOMIC_RELAXED);
    }
    hd->busy_ticks = busy;
    hd->self_cpu = self;
    __atomic_store_n(&hd->probe_ns, now, __ATOMIC_RELAXED);
    __atomic_store_n(&hd->probing, 0, __ATOMIC_RELEASE);
}

ts_status hk_dev_device_info(void *ctx, ts_device_info *info)
{
    hk_dev *hd = ctx;
    uint64_t total, avail;
    ts_status s = hd->host->host_memory(&total, &avail);
    if (s)
        return s;
    info->count = 1;
    info->index = 0;
    snprintf(info->name, sizeof info->name, "host CPU, %d threads", hd->configured);
    info->total_bytes = total;
    info->free_bytes = avail;
    info->valid = TS_DEVINFO_TOTAL | TS_DEVINFO_FREE;
    return TS_OK;
}

ts_status hk_dev_copy(void *ctx, void *dst, const void *src, size_t nbytes)
{
    (void)ctx;
    memmove(dst, src, nbytes);
    return TS_OK;
}

ts_status hk_dev_fill(void *ctx, void *dst, size_t nbytes, const void *pattern,
                          size_t pattern_size)
{
    hk_dev *hd = ctx;
    if (pattern_size == 0 || pattern_size > 8 || nbytes % pattern_size)
        return hd->host->fail(hd->host, TS_EINVAL,
                              "fill: pattern of %zu bytes does not tile %zu bytes", pattern_size,
                              nbytes);
    unsigned char *d = dst;
    const unsigned char *p = pattern;
    int uniform = 1;
    for (size_t i = 1; i < pattern_size; i++)
        uniform &= p[i] == p[0];
    if (uniform) {
        memset(d, p[0], nbytes);
        return TS_OK;
    }
    if (nbytes == 0)
        return TS_OK;
    /* Double the filled prefix each step: log2(n) memcpy calls. */
    memcpy(d, p, pattern_size);
    size_t done = pattern_size;
    while (done < nbytes) {
        size_t n = done < nbytes - done ? done : nbytes - done;
        memcpy(d + done, d, n);
        done += n;
    }
    return TS_OK;
}

ts_status hk_dev_synchronize(void *ctx)
{
    (void)ctx; /* host kernels are synchronous */
    return TS_OK;
}

ts_status hk_dev_copy_strided(const ts_operand *dst, const ts_operand *src)
{
    size_t es = ts_plugin_dtype_size(dst->dtype);
    if (!es || dst->dtype != src->dtype || dst->ndim != src->ndim)
        return TS_EINVAL;
    int nd = dst->ndim;
    int64_t n = 1, idx[TS_MAX_DIMS] = {0};
    for (int d = 0; d < nd; d++) {
        if (dst->shape[d] != src->shape[d])
            return TS_ESHAPE;
        n *= dst->shape[d];
    }
    if (n == 0)
        return TS_OK;
    char *dp = (char *)dst->data;
    const char *sp = (const char *)src->data;
    /* Innermost dim as a run; outer dims by an odometer. */
    int64_t inner = nd ? dst->shape[nd - 1] : 1;
    int64_t ds = nd ? dst->strides[nd - 1] : 1, ss = nd ? src->strides[nd - 1] : 1;
    for (int64_t done = 0; done < n; done += inner) {
        int64_t doff = dst->offset, soff = src->offset;
        for (int d = 0; d < nd - 1; d++) {
            doff += idx[d] * dst->strides[d];
            soff += idx[d] * src->strides[d];
        }
        if (ds == 1 && ss == 1) {
            memcpy(dp + doff * (int64_t)es, sp + soff * (int64_t)es, (size_t)inner * es);
        } else {
            for (int64_t i = 0; i < inner; i++)
                memcpy(dp + (doff + i * ds) * (int64_t)es, sp + (soff + i * ss) * (int64_t)es,
                       es);
        }
        for (int d = nd - 2; d >= 0; d--) {
            if (++idx[d] < dst->shape[d])
                break;
            idx[d] = 0;
        }
    }
    return TS_OK;
}
