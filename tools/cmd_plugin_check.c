/* tools/cmd_plugin_check.c: `tessera plugin-check NAME|PATH.so`: the conformance suite a
 * plugin author runs. It loads the plugin like the runtime does and checks, one line each:
 * the descriptor and the ABI, device memory (alloc/free, alignment, zero-size and large
 * blocks, the three copies, fill), the pool (statistics, peaks, the cache, limits and the
 * out-of-memory path), every kernel the plugin claims (supports) at several shapes and
 * layouts (transposed, strided, offset, broadcast) against the core's reference kernels
 * (ts_reference_run) on the same values, error paths (bad arguments give an error with a
 * message, not a crash), concurrent run calls (several threads running the claimed kernels on
 * their own buffers at once, each result checked: the threading contract of
 * docs/writing-a-plugin.md), and a short training run. Buffers move through the plugin's own
 * copies, so device memory need not be host-addressable. Exit status 0 iff every check passed. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "elf_exports.h"
#include "kernel_cases.h"
#include "plugin_check.h"

static const char usage[] =
    "usage: tessera plugin-check [--config FILE] [--verbose] [--quick] [--coverage] NAME|PATH.so\n"
    "\n"
    "Runs the plugin conformance suite: descriptor and ABI, device memory, the pool, every\n"
    "kernel the plugin claims (compared with tessera's reference kernels at several shapes\n"
    "and layouts), error paths, the claimed kernels run from several threads at once, and a\n"
    "short training run. Prints one line per check and a summary; exits 1 if any check\n"
    "fails. The plugin is configured from its [plugin.NAME] section like any device.\n"
    "  --verbose   also print every kernel case\n"
    "  --quick     skip the large allocation and the training run\n"
    "  --coverage  instead of the checks: every (op, dtype) the built-in models need for\n"
    "              training and evaluation that the plugin does not claim, at once\n";

/* ok: 1 pass, 0 fail, -1 skip. */
void pc_report(checker *c, int ok, const char *name, const char *fmt, ...)
{
    char detail[1200] = "";
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(detail, sizeof detail, fmt, ap);
        va_end(ap);
    }
    printf("%s  %s%s%s\n", ok > 0 ? "PASS" : ok == 0 ? "FAIL" : "SKIP", name,
           detail[0] ? ": " : "", detail);
    fflush(stdout);
    if (ok > 0)
        c->npass++;
    else if (ok == 0)
        c->nfail++;
    else
        c->nskip++;
}

ts_status pc_nomem(void)
{
    fprintf(stderr, "tessera: error: plugin-check: out of host memory\n");
    return TS_ENOMEM;
}

const char *pc_err(void)
{
    return ts_last_error()[0] ? ts_last_error() : "(no message)";
}

/* ---- descriptor ------------------------------------------------------------------------ */

static int valid_name(const char *s)
{
    if (!s || !*s)
        return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '_'))
            return 0;
    return 1;
}

/* The dynamic symbols path exports besides the entry point (pc_elf_exports, elf_exports.c),
 * written to out as a list. Returns the count, or -1 with why set when the file cannot be read
 * as a 64-bit ELF shared object. */
static int extra_exports(const char *path, char *out, size_t len, const char **why)
{
    out[0] = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size == 0) {
        *why = "cannot read the file as an ELF object";
        if (fd >= 0)
            close(fd);
        return -1;
    }
    size_t size = (size_t)st.st_size;
    const unsigned char *m = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        *why = "cannot map the file";
        return -1;
    }
    int n = pc_elf_exports(m, size, out, len, why);
    munmap((void *)m, size);
    return n;
}

static void check_descriptor(checker *c)
{
    const ts_plugin_desc *d = ts_device_desc(c->dev);
    char extra[600];
    const char *why;
    int nextra = extra_exports(ts_device_path(c->dev), extra, sizeof extra, &why);
    if (nextra < 0)
        pc_report(c, 0, "exports: only the entry point", "%s", why);
    else if (nextra == 0)
        pc_report(c, 1, "exports: only the entry point", "%s", TS_PLUGIN_ENTRY_SYMBOL);
    else
        pc_report(c, 0, "exports: only the entry point",
                  "%d more symbol(s): %s%s; build with -fvisibility=hidden (TS_PLUGIN_DEFINE marks "
                  "the entry point visible) and link static libraries with "
                  "-Wl,--exclude-libs,ALL", nextra, extra, nextra > 8 ? ", ..." : "");
    pc_report(c, d->abi_major == TS_PLUGIN_ABI_MAJOR && d->abi_minor <= TS_PLUGIN_ABI_MINOR,
              "abi: version", "plugin built for ABI %u.%u, host speaks %d.%d%s",
              (unsigned)d->abi_major, (unsigned)d->abi_minor, TS_PLUGIN_ABI_MAJOR,
              TS_PLUGIN_ABI_MINOR,
              d->abi_minor > TS_PLUGIN_ABI_MINOR ? " (a newer minor than the host: rebuild against "
                                                "these headers)" : "");
    /* struct_size must match the size of the ABI minor it claims (2.0: the whole table). */
    size_t want = sizeof(ts_plugin_desc);
    pc_report(c, d->abi_minor > TS_PLUGIN_ABI_MINOR || d->struct_size == want, "abi: struct_size",
              "%u bytes for ABI %u.%u (expected %zu)", (unsigned)d->struct_size,
              (unsigned)d->abi_major, (unsigned)d->abi_minor, want);
    pc_report(c, valid_name(d->name), "descriptor: name", "'%s'", d->name ? d->name : "(null)");
    pc_report(c, d->version && *d->version && d->description && *d->description,
              "descriptor: version and description", "'%s', '%s'",
              d->version ? d->version : "(null)", d->description ? d->description : "(null)");
    int keys_ok = 1, nkeys = 0;
    const char *bad = "";
    for (const ts_config_key *k = d->config_keys; k && k->name; k++, nkeys++) {
        if (!valid_name(k->name) || k->kind < TS_SETTING_STRING || k->kind > TS_SETTING_BOOL ||
            !k->help || (k->kind == TS_SETTING_INT && k->min > k->max)) {
            keys_ok = 0;
            bad = k->name;
        }
    }
    if (keys_ok)
        pc_report(c, 1, "descriptor: config_keys", "%d declared", nkeys);
    else
        pc_report(c, 0, "descriptor: config_keys", "key '%s' is malformed (name [a-z0-9_]+, a "
                  "known kind, help text, min <= max)", bad);
    uint64_t flags = TS_HAS_MEMBER(d, ts_plugin_desc, flags) ? d->flags : 0;
    pc_report(c, (flags & ~(uint64_t)TS_PLUGIN_HOST_MEMORY) == 0, "descriptor: flags", "0x%llx%s",
              (unsigned long long)flags,
              flags & TS_PLUGIN_HOST_MEMORY ? " (host memory: the core composes unclaimed ops)"
                                            : "");
    pc_report(
        c, d->alignment >= 16 && d->alignment <= (1u << 20) && !(d->alignment & (d->alignment - 1)),
        "descriptor: alignment", "%u bytes", (unsigned)d->alignment);
    int has_supports = TS_HAS_MEMBER(d, ts_plugin_desc, supports) && d->supports;
    int has_run = TS_HAS_MEMBER(d, ts_plugin_desc, run) && d->run;
    pc_report(c, has_supports == has_run, "descriptor: supports and run",
              has_supports == has_run ? "%s" : "one of them is NULL: set both or neither",
              has_run ? "both set" : "neither set (no kernels of its own)");
    int sane = !ts_device_supports(c->dev, TS_OP_NONE, TS_F32) &&
               !ts_device_supports(c->dev, TS_OP_COUNT + 7, TS_F32) &&
               !ts_device_supports(c->dev, TS_OP_COPY, TS_DTYPE_COUNT + 3) &&
               !ts_device_supports(c->dev, TS_OP_COPY, -1);
    pc_report(c, sane, "descriptor: supports() refuses unknown ops and dtypes", NULL);

    ts_device_info info;
    ts_status s = ts_device_info_get(c->dev, &info);
    int ok = s == TS_OK && info.count >= 1 && info.index >= 0 && info.index < info.count &&
             memchr(info.name, 0, sizeof info.name) && info.name[0] &&
             (!(info.valid & TS_DEVINFO_TOTAL) || info.total_bytes > 0) &&
             (!((info.valid & TS_DEVINFO_TOTAL) && (info.valid & TS_DEVINFO_FREE)) ||
              info.free_bytes <= info.total_bytes) &&
             !(info.valid & ~(uint32_t)(TS_DEVINFO_TOTAL | TS_DEVINFO_FREE));
    if (s)
        pc_report(c, 0, "device_info", "%s", pc_err());
    else
        pc_report(c, ok, "device_info",
                  "'%.60s', device %d of %d, valid 0x%x, total %llu, free %llu",
                  info.name[0] && memchr(info.name, 0, sizeof info.name) ? info.name : "(bad name)",
                  (int)info.index, (int)info.count, (unsigned)info.valid,
                  (unsigned long long)info.total_bytes, (unsigned long long)info.free_bytes);
}

/* ---- memory ---------------------------------------------------------------------------- */

static ts_memory_stats stats(checker *c)
{
    ts_memory_stats st;
    ts_device_memory_stats(c->dev, &st);
    return st;
}

static void check_memory(checker *c)
{
    ts_device *dev = c->dev;
    void *a = NULL, *b = NULL;
    ts_status s = ts_device_alloc(dev, 0, "plugin-check", &a);
    if (s == TS_OK)
        s = ts_device_alloc(dev, 0, "plugin-check", &b);
    pc_report(c, s == TS_OK && a && b && a != b, "memory: zero-size blocks are valid and distinct",
              "%s", s ? pc_err() : "");
    ts_device_free(dev, a);
    ts_device_free(dev, b);

    static const size_t sizes[] = {1, 3, 63, 64, 65, 1000, 4097, 65536, 1 << 20, 3 << 20};
    int aligned = 1;
    size_t misaligned = 0;
    s = TS_OK;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0] && !s; i++) {
        void *p;
        if ((s = ts_device_alloc(dev, sizes[i], "plugin-check", &p)))
            break;
        if ((uintptr_t)p % 64) {
            aligned = 0;
            misaligned = sizes[i];
        }
        ts_device_free(dev, p);
    }
    if (s)
        pc_report(c, 0, "memory: 64-byte alignment", "alloc failed: %s", pc_err());
    else
        pc_report(c, aligned, "memory: 64-byte alignment", aligned ? "sizes 1 B to 3 MiB" :
                  "a block of %zu bytes is not 64-byte aligned", misaligned);

    /* Copies: host -> device -> device -> host, at odd sizes and offsets. */
    size_t n = (1 << 20) + 13;
    unsigned char *h = malloc(n), *back = malloc(n);
    void *d1 = NULL, *d2 = NULL;
    int ok = h && back;
    if (ok && (s = ts_device_alloc(dev, n, "plugin-check", &d1)) == TS_OK)
        s = ts_device_alloc(dev, n, "plugin-check", &d2);
    if (!ok || s) {
        pc_report(c, 0, "memory: copies", "%s", ok ? pc_err() : "out of host memory");
    } else {
        uint64_t r = c->seed;
        for (size_t i = 0; i < n; i++)
            h[i] = (unsigned char)kc_rand(&r);
        s = ts_device_copy_from_host(dev, d1, h, n);
        if (!s)
            s = ts_device_copy_device(dev, d2, d1, n);
        if (!s)
            s = ts_device_synchronize(dev);
        memset(back, 0, n);
        if (!s)
            s = ts_device_copy_to_host(dev, back, d2, n);
        int same = !s && memcmp(h, back, n) == 0;
        /* A 7-byte window at an odd offset leaves its neighbours alone. */
        unsigned char seven[7] = {1, 2, 3, 4, 5, 6, 7};
        if (!s)
            s = ts_device_copy_from_host(dev, (char *)d1 + 1001, seven, sizeof seven);
        if (!s)
            s = ts_device_copy_to_host(dev, back, d1, 2048);
        int window = !s && memcmp(back + 1001, seven, 7) == 0 && memcmp(back, h, 1001) == 0 &&
                     memcmp(back + 1008, h + 1008, 2048 - 1008) == 0;
        pc_report(c, !s && same && window, "memory: host->device->device->host copies",
                  s ? "%s" : same ? (window ? "" : "a partial copy wrote outside its bytes")
                               : "the bytes came back different", s ? pc_err() : "");

        /* fill with 1-, 2-, 4- and 8-byte patterns on a window, checking the neighbours. */
        int fills = 1;
        const char *why = "";
        for (size_t ps = 1; ps <= 8 && !s; ps *= 2) {
            unsigned char pat[8] = {0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88};
            pat[0] = (unsigned char)(0x10 + ps);
            size_t off = 64 * ps, len = 4096 * ps;
            if ((s = ts_device_copy_from_host(dev, d1, h, 2 * len + off)) ||
                (s = ts_device_fill(dev, (char *)d1 + off, len, pat, ps)) ||
                (s = ts_device_copy_to_host(dev, back, d1, 2 * len + off)))
                break;
            for (size_t i = 0; i < 2 * len + off; i++) {
                unsigned char want = i >= off && i < off + len ? pat[(i - off) % ps] : h[i];
                if (back[i] != want) {
                    fills = 0;
                    why = i >= off && i < off + len ? "wrong bytes in the filled range"
                                                    : "bytes outside the range changed";
                    break;
                }
            }
        }
        pc_report(c, !s && fills, "memory: fill with 1, 2, 4 and 8-byte patterns", "%s",
                  s ? pc_err() : why);
    }
    ts_device_free(dev, d1);
    ts_device_free(dev, d2);
    free(h);
    free(back);

    /* An impossible request fails with TS_ENOMEM and a message, and changes nothing. */
    void *p = (void *)1;
    ts_clear_error();
    s = ts_device_alloc(dev, (size_t)1 << 62, "plugin-check", &p);
    pc_report(c, s == TS_ENOMEM && ts_last_error()[0], "memory: an impossible allocation (4 EiB) "
              "fails with TS_ENOMEM and a message", "%s: %s", ts_status_name(s), pc_err());
    if (s == TS_OK)
        ts_device_free(dev, p);

    if (c->quick) {
        pc_report(c, -1, "memory: a large allocation", "--quick");
        return;
    }
    ts_memory_stats st = stats(c);
    uint64_t big = 256ull << 20;
    if (st.reserve_limit && big > st.reserve_limit / 4)
        big = st.reserve_limit / 4;
    big &= ~(uint64_t)4095;
    s = ts_device_alloc(dev, big, "plugin-check", &p);
    if (!s) {
        unsigned char tail[4096], got[4096];
        for (size_t i = 0; i < sizeof tail; i++)
            tail[i] = (unsigned char)(i * 7 + 1);
        if (!(s = ts_device_copy_from_host(dev, (char *)p + big - 4096, tail, 4096)) &&
            !(s = ts_device_copy_from_host(dev, p, tail, 4096)) &&
            !(s = ts_device_copy_to_host(dev, got, (char *)p + big - 4096, 4096)))
            ok = memcmp(got, tail, 4096) == 0;
        ts_device_free(dev, p);
    }
    char bb[32];
    pc_report(c, !s && ok, "memory: a large allocation",
              "%s, first and last 4 KiB written and read "
              "back%s%s",
              cli_bytes(big, bb, sizeof bb), s ? ": " : "", s ? pc_err() : "");
}

/* ---- pool ------------------------------------------------------------------------------ */

static void check_pool(checker *c)
{
    ts_device *dev = c->dev;
    ts_memory_stats st0 = stats(c);
    /* The limits are the host's: memory_fraction of the device's total caps reserved bytes
     * whatever the plugin does. A request one byte past the configured limit fails with the
     * pool's message before the plugin's mem_alloc is ever called. */
    ts_device_info info;
    size_t nset;
    const ts_setting *set0 = ts_device_settings(dev, &nset);
    const ts_setting *frac = ts_setting_find(set0, nset, "memory_fraction");
    if (ts_device_info_get(dev, &info) == TS_OK && (info.valid & TS_DEVINFO_TOTAL) && frac) {
        uint64_t want = (uint64_t)((double)info.total_bytes * frac->v.fraction);
        void *q = (void *)1;
        ts_clear_error();
        ts_status s = ts_device_alloc(dev, (size_t)want + 1, "plugin-check", &q);
        ts_memory_stats sl = stats(c);
        char lim[32];
        pc_report(c, st0.reserve_limit == want && s == TS_ENOMEM && q == NULL &&
                      strstr(ts_last_error(), "memory_fraction") &&
                      sl.n_raw_alloc == st0.n_raw_alloc && sl.reserved <= st0.reserved,
                  "pool: memory_fraction caps reserved bytes",
                  "limit %s (memory_fraction %g of %llu bytes), a request 1 byte past it: %s: %s",
                  cli_bytes(st0.reserve_limit, lim, sizeof lim), frac->v.fraction,
                  (unsigned long long)info.total_bytes, ts_status_name(s), pc_err());
        if (s == TS_OK)
            ts_device_free(dev, q);
    } else {
        pc_report(c, -1, "pool: memory_fraction caps reserved bytes",
                  "the plugin reports no total memory: the pool has no reserve limit");
    }
    void *p[3] = {NULL, NULL, NULL};
    static const size_t sz[3] = {1000, 70000, 5 << 20};
    ts_status s = TS_OK;
    for (int i = 0; i < 3 && !s; i++)
        s = ts_device_alloc(dev, sz[i], "plugin-check", &p[i]);
    ts_memory_stats st1 = stats(c);
    int ok = !s && st1.live_blocks == st0.live_blocks + 3 && st1.n_alloc == st0.n_alloc + 3 &&
             st1.in_use >= st0.in_use + sz[0] + sz[1] + sz[2] &&
             st1.requested == st0.requested + sz[0] + sz[1] + sz[2] &&
             st1.peak_in_use >= st1.in_use && st1.reserved >= st1.in_use &&
             st1.peak_reserved >= st1.reserved;
    if (s)
        pc_report(c, 0, "pool: statistics follow allocations", "%s", pc_err());
    else
        pc_report(c, ok, "pool: statistics follow allocations", "live %llu, in use %llu, "
                  "requested %llu, reserved %llu", (unsigned long long)st1.live_blocks,
                  (unsigned long long)st1.in_use, (unsigned long long)st1.requested,
                  (unsigned long long)st1.reserved);
    for (int i = 0; i < 3; i++)
        ts_device_free(dev, p[i]);
    ts_memory_stats st2 = stats(c);
    pc_report(c, st2.live_blocks == st0.live_blocks && st2.in_use == st0.in_use &&
                  st2.n_free == st0.n_free + 3,
              "pool: statistics follow frees", "live %llu, in use %llu",
              (unsigned long long)st2.live_blocks, (unsigned long long)st2.in_use);
    ts_device_reset_peak(dev);
    ts_memory_stats st3 = stats(c);
    pc_report(c, st3.peak_in_use == st3.in_use, "pool: reset_peak", "peak %llu, in use %llu",
              (unsigned long long)st3.peak_in_use, (unsigned long long)st3.in_use);
    ts_device_empty_cache(dev);
    ts_memory_stats st4 = stats(c);
    pc_report(c, st4.cached == 0 && st4.reserved <= st2.reserved, "pool: empty_cache",
              "cached %llu, reserved %llu", (unsigned long long)st4.cached,
              (unsigned long long)st4.reserved);

    /* A reserve limit just above what is reserved now: a 64 MiB request must fail cleanly. */
    uint64_t limit = st4.reserved + (1 << 20);
    s = ts_device_set_limits(dev, limit, st4.cache_limit);
    if (s) {
        pc_report(c, 0, "pool: set_limits", "%s", pc_err());
        return;
    }
    void *q = (void *)1;
    ts_clear_error();
    s = ts_device_alloc(dev, 64 << 20, "plugin-check", &q);
    ts_memory_stats st5 = stats(c);
    pc_report(c, s == TS_ENOMEM && ts_last_error()[0] && st5.n_oom == st4.n_oom + 1 &&
                  st5.reserve_limit == limit && st5.live_blocks == st4.live_blocks,
              "pool: a request over the reserve limit fails with TS_ENOMEM", "%s: %s",
              ts_status_name(s), pc_err());
    if (s == TS_OK)
        ts_device_free(dev, q);
    s = ts_device_set_limits(dev, st4.reserve_limit, st4.cache_limit);
    if (!s && (s = ts_device_alloc(dev, 64 << 20, "plugin-check", &q)) == TS_OK)
        ts_device_free(dev, q);
    pc_report(c, s == TS_OK, "pool: set_limits restores the limits", "%s", s ? pc_err() : "");

    /* With caching on, a freed block serves the next request of its size. */
    size_t n;
    const ts_setting *set = ts_device_settings(dev, &n);
    const ts_setting *caching = ts_setting_find(set, n, "caching");
    if (caching && !caching->v.boolean) {
        pc_report(c, -1, "pool: the cache serves a repeated size", "caching = false");
    } else {
        ts_memory_stats a = stats(c);
        void *r1 = NULL, *r2 = NULL;
        if (!(s = ts_device_alloc(dev, 123456, "plugin-check", &r1))) {
            ts_device_free(dev, r1);
            if (!(s = ts_device_alloc(dev, 123456, "plugin-check", &r2)))
                ts_device_free(dev, r2);
        }
        ts_memory_stats b = stats(c);
        pc_report(c, !s && b.cache_hits > a.cache_hits, "pool: the cache serves a repeated size",
                  "%s", s ? pc_err() : "");
    }
}

static void check_training(checker *c)
{
    if (c->quick) {
        pc_report(c, -1, "training: an MLP learns a fixed batch", "--quick");
        return;
    }
    cli_fixed f;
    double first = NAN, last = NAN;
    int steps = 30;
    ts_status s = cli_fixed_setup("mlp", "sgd", 0.05, c->dev, 7, 32, &f);
    for (int i = 0; i < steps && !s; i++) {
        ts_tensor *logits = NULL, *loss = NULL, *d = NULL;
        double lv = NAN;
        if (!(s = ts_module_forward(f.model, f.x, &logits)) &&
            !(s = ts_cross_entropy(logits, f.y, TS_REDUCTION_MEAN, &loss)) &&
            !(s = ts_backward(loss, NULL, 0)) && !(s = ts_optim_step(f.opt)) &&
            !(s = ts_cast(loss, TS_F64, &d)) && !(s = ts_tensor_to_host(d, &lv, sizeof lv)))
            ts_optim_zero_grad(f.opt);
        ts_tensor_unref(logits);
        ts_tensor_unref(loss);
        ts_tensor_unref(d);
        if (i == 0)
            first = lv;
        last = lv;
    }
    cli_fixed_free(&f); /* safe after a failed setup too: it left f empty */
    if (s)
        pc_report(c, 0, "training: an MLP learns a fixed batch", "%s", pc_err());
    else
        pc_report(c, isfinite(last) && last < 0.5 * first,
                  "training: an MLP learns a fixed batch",
                  "loss %.4f -> %.4f in %d SGD steps (784-256-128-10, batch 32)", first, last,
                  steps);
}

static void check_no_leaks(checker *c)
{
    ts_memory_stats st = stats(c);
    pc_report(c, !(st.valid & TS_STATS_POOL) || st.live_blocks == 0, "pool: no block left live",
              "%llu live blocks, %llu bytes in use after every check freed its memory",
              (unsigned long long)st.live_blocks, (unsigned long long)st.in_use);
}

/* The suites, in the order they run: each prints one line per check. */
static const struct {
    const char *name;
    void (*run)(checker *c);
} suites[] = {
    {"descriptor and ABI", check_descriptor},
    {"device memory", check_memory},
    {"the pool and its limits", check_pool},
    {"kernels against the reference", pc_check_kernels},
    {"error paths", pc_check_errors},
    {"concurrent run calls", pc_check_threads},
    {"training", check_training},
    {"no block left live", check_no_leaks},
};

int cmd_plugin_check(int argc, char **argv, const cli_common *common)
{
    checker c = {.seed = 0x7e55e7a};
    const char *target = NULL, *config = common->config;
    int coverage = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(usage, stdout);
            return 0;
        } else if (!strcmp(argv[i], "--verbose")) {
            c.verbose = 1;
        } else if (!strcmp(argv[i], "--quick")) {
            c.quick = 1;
        } else if (!strcmp(argv[i], "--coverage")) {
            coverage = 1;
        } else if (!strcmp(argv[i], "--config") && i + 1 < argc) {
            config = argv[++i];
        } else if (argv[i][0] == '-') {
            return cli_usage_error("plugin-check", "unknown option '%s'", argv[i]);
        } else if (target) {
            return cli_usage_error("plugin-check", "one plugin at a time ('%s' and '%s')",
                                   target, argv[i]);
        } else {
            target = argv[i];
        }
    }
    if (!target)
        return cli_usage_error("plugin-check", "expected a plugin NAME or PATH.so");
    ts_status s = ts_init(config);
    if (s)
        return cli_fail(s, "cannot start tessera");
    if ((s = ts_device_get(target, &c.dev))) {
        printf("FAIL  load: %s\n", pc_err());
        printf("plugin-check %s: 0 passed, 1 failed, 0 skipped\n", target);
        ts_shutdown();
        return 1;
    }
    if (coverage) {
        int rc = cli_plugin_coverage(c.dev);
        ts_shutdown();
        return rc;
    }
    pc_report(&c, 1, "load", "%s (%s %s)", ts_device_path(c.dev), ts_device_name(c.dev),
              ts_device_desc(c.dev)->version ? ts_device_desc(c.dev)->version : "");
    for (size_t i = 0; i < sizeof suites / sizeof suites[0]; i++)
        suites[i].run(&c);
    printf("plugin-check %s: %d passed, %d failed, %d skipped\n", ts_device_name(c.dev), c.npass,
           c.nfail, c.nskip);
    ts_shutdown();
    return c.nfail ? 1 : 0;
}
