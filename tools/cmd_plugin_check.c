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

#include <elf.h>
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

#include "cli.h"

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

typedef struct checker {
    ts_device *dev;
    int verbose, quick;
    int npass, nfail, nskip;
    uint64_t seed;
    unsigned char kernel_failed[TS_OP_COUNT][TS_DTYPE_COUNT]; /* by check_kernels */
} checker;

static void report(checker *c, int ok, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* ok: 1 pass, 0 fail, -1 skip. */
static void report(checker *c, int ok, const char *name, const char *fmt, ...)
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

static ts_status nomem(void)
{
    fprintf(stderr, "tessera: error: plugin-check: out of host memory\n");
    return TS_ENOMEM;
}

static const char *err(void)
{
    return ts_last_error()[0] ? ts_last_error() : "(no message)";
}

static uint64_t next_rand(uint64_t *s)
{
    /* splitmix64 */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
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

/* The dynamic symbols path defines and exports (global or weak, default or protected
 * visibility), the linker's own aside, other than the entry point: written to out as a list.
 * Returns the count, or -1 with why set when the file is no 64-bit ELF shared object it can
 * read. Every offset is checked against the file's size: the file may be hostile. */
static int extra_exports(const char *path, char *out, size_t len, const char **why)
{
    static const char *const linker[] = {TS_PLUGIN_ENTRY_SYMBOL, "_init", "_fini", "_edata",
                                         "_end", "__bss_start"};
    *why = "";
    out[0] = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
        (size_t)st.st_size < sizeof(Elf64_Ehdr)) {
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
    int n = -1;
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)m;
    if (memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_ident[EI_CLASS] != ELFCLASS64 ||
        eh->e_shentsize != sizeof(Elf64_Shdr) || eh->e_shoff > size ||
        (size - eh->e_shoff) / sizeof(Elf64_Shdr) < eh->e_shnum) {
        *why = "not a 64-bit ELF object with readable section headers";
        goto out;
    }
    const Elf64_Shdr *sh = (const Elf64_Shdr *)(m + eh->e_shoff);
    for (unsigned i = 0; i < eh->e_shnum; i++) {
        if (sh[i].sh_type != SHT_DYNSYM)
            continue;
        if (sh[i].sh_link >= eh->e_shnum || sh[i].sh_entsize != sizeof(Elf64_Sym) ||
            sh[i].sh_offset > size || sh[i].sh_size > size - sh[i].sh_offset)
            break;
        const Elf64_Shdr *strs = &sh[sh[i].sh_link];
        if (strs->sh_offset > size || strs->sh_size > size - strs->sh_offset)
            break;
        const char *names = (const char *)m + strs->sh_offset;
        const Elf64_Sym *sym = (const Elf64_Sym *)(m + sh[i].sh_offset);
        size_t nsym = sh[i].sh_size / sizeof(Elf64_Sym), used = 0;
        n = 0;
        for (size_t k = 1; k < nsym; k++) {
            int bind = ELF64_ST_BIND(sym[k].st_info), vis = ELF64_ST_VISIBILITY(sym[k].st_other);
            if (sym[k].st_shndx == SHN_UNDEF || (bind != STB_GLOBAL && bind != STB_WEAK) ||
                (vis != STV_DEFAULT && vis != STV_PROTECTED) || sym[k].st_name >= strs->sh_size)
                continue;
            const char *name = names + sym[k].st_name;
            if (!memchr(name, 0, strs->sh_size - sym[k].st_name))
                continue;
            int known = 0;
            for (size_t j = 0; j < sizeof linker / sizeof linker[0]; j++)
                known |= strcmp(name, linker[j]) == 0;
            if (known)
                continue;
            if (n++ < 8 && used < len)
                used += (size_t)snprintf(out + used, len - used, "%s%s", n > 1 ? ", " : "", name);
        }
        break;
    }
    if (n < 0 && !**why)
        *why = "no readable dynamic symbol table";
out:
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
        report(c, 0, "exports: only the entry point", "%s", why);
    else if (nextra == 0)
        report(c, 1, "exports: only the entry point", "%s", TS_PLUGIN_ENTRY_SYMBOL);
    else
        report(c, 0, "exports: only the entry point",
               "%d more symbol(s): %s%s; build with -fvisibility=hidden (TS_PLUGIN_DEFINE marks "
               "the entry point visible) and link static libraries with "
               "-Wl,--exclude-libs,ALL", nextra, extra, nextra > 8 ? ", ..." : "");
    report(c, d->abi_major == TS_PLUGIN_ABI_MAJOR && d->abi_minor <= TS_PLUGIN_ABI_MINOR,
           "abi: version", "plugin built for ABI %u.%u, host speaks %d.%d%s",
           (unsigned)d->abi_major, (unsigned)d->abi_minor, TS_PLUGIN_ABI_MAJOR,
           TS_PLUGIN_ABI_MINOR,
           d->abi_minor > TS_PLUGIN_ABI_MINOR ? " (a newer minor than the host: rebuild against "
                                                "these headers)" : "");
    /* struct_size must match the size of the ABI minor it claims (2.0: the whole table). */
    size_t want = sizeof(ts_plugin_desc);
    report(c, d->abi_minor > TS_PLUGIN_ABI_MINOR || d->struct_size == want, "abi: struct_size",
           "%u bytes for ABI %u.%u (expected %zu)", (unsigned)d->struct_size,
           (unsigned)d->abi_major, (unsigned)d->abi_minor, want);
    report(c, valid_name(d->name), "descriptor: name", "'%s'", d->name ? d->name : "(null)");
    report(c, d->version && *d->version && d->description && *d->description,
           "descriptor: version and description", "'%s', '%s'", d->version ? d->version : "(null)",
           d->description ? d->description : "(null)");
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
        report(c, 1, "descriptor: config_keys", "%d declared", nkeys);
    else
        report(c, 0, "descriptor: config_keys", "key '%s' is malformed (name [a-z0-9_]+, a "
               "known kind, help text, min <= max)", bad);
    uint64_t flags = TS_HAS_MEMBER(d, ts_plugin_desc, flags) ? d->flags : 0;
    report(c, (flags & ~(uint64_t)TS_PLUGIN_HOST_MEMORY) == 0, "descriptor: flags",
           "0x%llx%s", (unsigned long long)flags,
           flags & TS_PLUGIN_HOST_MEMORY ? " (host memory: the core composes unclaimed ops)" : "");
    report(c, d->alignment >= 16 && d->alignment <= (1u << 20) &&
                  !(d->alignment & (d->alignment - 1)),
           "descriptor: alignment", "%u bytes", (unsigned)d->alignment);
    int has_supports = TS_HAS_MEMBER(d, ts_plugin_desc, supports) && d->supports;
    int has_run = TS_HAS_MEMBER(d, ts_plugin_desc, run) && d->run;
    report(c, has_supports == has_run, "descriptor: supports and run",
           has_supports == has_run ? "%s" : "one of them is NULL: set both or neither",
           has_run ? "both set" : "neither set (no kernels of its own)");
    int sane = !ts_device_supports(c->dev, TS_OP_NONE, TS_F32) &&
               !ts_device_supports(c->dev, TS_OP_COUNT + 7, TS_F32) &&
               !ts_device_supports(c->dev, TS_OP_COPY, TS_DTYPE_COUNT + 3) &&
               !ts_device_supports(c->dev, TS_OP_COPY, -1);
    report(c, sane, "descriptor: supports() refuses unknown ops and dtypes", NULL);

    ts_device_info info;
    ts_status s = ts_device_info_get(c->dev, &info);
    int ok = s == TS_OK && info.count >= 1 && info.index >= 0 && info.index < info.count &&
             memchr(info.name, 0, sizeof info.name) && info.name[0] &&
             (!(info.valid & TS_DEVINFO_TOTAL) || info.total_bytes > 0) &&
             (!((info.valid & TS_DEVINFO_TOTAL) && (info.valid & TS_DEVINFO_FREE)) ||
              info.free_bytes <= info.total_bytes) &&
             !(info.valid & ~(uint32_t)(TS_DEVINFO_TOTAL | TS_DEVINFO_FREE));
    if (s)
        report(c, 0, "device_info", "%s", err());
    else
        report(c, ok, "device_info", "'%.60s', device %d of %d, valid 0x%x, total %llu, free %llu",
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
    report(c, s == TS_OK && a && b && a != b, "memory: zero-size blocks are valid and distinct",
           "%s", s ? err() : "");
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
        report(c, 0, "memory: 64-byte alignment", "alloc failed: %s", err());
    else
        report(c, aligned, "memory: 64-byte alignment", aligned ? "sizes 1 B to 3 MiB" :
               "a block of %zu bytes is not 64-byte aligned", misaligned);

    /* Copies: host -> device -> device -> host, at odd sizes and offsets. */
    size_t n = (1 << 20) + 13;
    unsigned char *h = malloc(n), *back = malloc(n);
    void *d1 = NULL, *d2 = NULL;
    int ok = h && back;
    if (ok && (s = ts_device_alloc(dev, n, "plugin-check", &d1)) == TS_OK)
        s = ts_device_alloc(dev, n, "plugin-check", &d2);
    if (!ok || s) {
        report(c, 0, "memory: copies", "%s", ok ? err() : "out of host memory");
    } else {
        uint64_t r = c->seed;
        for (size_t i = 0; i < n; i++)
            h[i] = (unsigned char)next_rand(&r);
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
        report(c, !s && same && window, "memory: host->device->device->host copies",
               s ? "%s" : same ? (window ? "" : "a partial copy wrote outside its bytes")
                               : "the bytes came back different", s ? err() : "");

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
        report(c, !s && fills, "memory: fill with 1, 2, 4 and 8-byte patterns", "%s",
               s ? err() : why);
    }
    ts_device_free(dev, d1);
    ts_device_free(dev, d2);
    free(h);
    free(back);

    /* An impossible request fails with TS_ENOMEM and a message, and changes nothing. */
    void *p = (void *)1;
    ts_clear_error();
    s = ts_device_alloc(dev, (size_t)1 << 62, "plugin-check", &p);
    report(c, s == TS_ENOMEM && ts_last_error()[0], "memory: an impossible allocation (4 EiB) "
           "fails with TS_ENOMEM and a message", "%s: %s", ts_status_name(s), err());
    if (s == TS_OK)
        ts_device_free(dev, p);

    if (c->quick) {
        report(c, -1, "memory: a large allocation", "--quick");
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
    report(c, !s && ok, "memory: a large allocation", "%s, first and last 4 KiB written and read "
           "back%s%s", cli_bytes(big, bb, sizeof bb), s ? ": " : "", s ? err() : "");
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
        report(c, st0.reserve_limit == want && s == TS_ENOMEM && q == NULL &&
                      strstr(ts_last_error(), "memory_fraction") &&
                      sl.n_raw_alloc == st0.n_raw_alloc && sl.reserved <= st0.reserved,
               "pool: memory_fraction caps reserved bytes",
               "limit %s (memory_fraction %g of %llu bytes), a request 1 byte past it: %s: %s",
               cli_bytes(st0.reserve_limit, lim, sizeof lim), frac->v.fraction,
               (unsigned long long)info.total_bytes, ts_status_name(s), err());
        if (s == TS_OK)
            ts_device_free(dev, q);
    } else {
        report(c, -1, "pool: memory_fraction caps reserved bytes",
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
        report(c, 0, "pool: statistics follow allocations", "%s", err());
    else
        report(c, ok, "pool: statistics follow allocations", "live %llu, in use %llu, "
               "requested %llu, reserved %llu", (unsigned long long)st1.live_blocks,
               (unsigned long long)st1.in_use, (unsigned long long)st1.requested,
               (unsigned long long)st1.reserved);
    for (int i = 0; i < 3; i++)
        ts_device_free(dev, p[i]);
    ts_memory_stats st2 = stats(c);
    report(c, st2.live_blocks == st0.live_blocks && st2.in_use == st0.in_use &&
                  st2.n_free == st0.n_free + 3,
           "pool: statistics follow frees", "live %llu, in use %llu",
           (unsigned long long)st2.live_blocks, (unsigned long long)st2.in_use);
    ts_device_reset_peak(dev);
    ts_memory_stats st3 = stats(c);
    report(c, st3.peak_in_use == st3.in_use, "pool: reset_peak", "peak %llu, in use %llu",
           (unsigned long long)st3.peak_in_use, (unsigned long long)st3.in_use);
    ts_device_empty_cache(dev);
    ts_memory_stats st4 = stats(c);
    report(c, st4.cached == 0 && st4.reserved <= st2.reserved, "pool: empty_cache",
           "cached %llu, reserved %llu", (unsigned long long)st4.cached,
           (unsigned long long)st4.reserved);

    /* A reserve limit just above what is reserved now: a 64 MiB request must fail cleanly. */
    uint64_t limit = st4.reserved + (1 << 20);
    s = ts_device_set_limits(dev, limit, st4.cache_limit);
    if (s) {
        report(c, 0, "pool: set_limits", "%s", err());
        return;
    }
    void *q = (void *)1;
    ts_clear_error();
    s = ts_device_alloc(dev, 64 << 20, "plugin-check", &q);
    ts_memory_stats st5 = stats(c);
    report(c, s == TS_ENOMEM && ts_last_error()[0] && st5.n_oom == st4.n_oom + 1 &&
                  st5.reserve_limit == limit && st5.live_blocks == st4.live_blocks,
           "pool: a request over the reserve limit fails with TS_ENOMEM", "%s: %s",
           ts_status_name(s), err());
    if (s == TS_OK)
        ts_device_free(dev, q);
    s = ts_device_set_limits(dev, st4.reserve_limit, st4.cache_limit);
    if (!s && (s = ts_device_alloc(dev, 64 << 20, "plugin-check", &q)) == TS_OK)
        ts_device_free(dev, q);
    report(c, s == TS_OK, "pool: set_limits restores the limits", "%s", s ? err() : "");

    /* With caching on, a freed block serves the next request of its size. */
    size_t n;
    const ts_setting *set = ts_device_settings(dev, &n);
    const ts_setting *caching = ts_setting_find(set, n, "caching");
    if (caching && !caching->v.boolean) {
        report(c, -1, "pool: the cache serves a repeated size", "caching = false");
    } else {
        ts_memory_stats a = stats(c);
        void *r1 = NULL, *r2 = NULL;
        if (!(s = ts_device_alloc(dev, 123456, "plugin-check", &r1))) {
            ts_device_free(dev, r1);
            if (!(s = ts_device_alloc(dev, 123456, "plugin-check", &r2)))
                ts_device_free(dev, r2);
        }
        ts_memory_stats b = stats(c);
        report(c, !s && b.cache_hits > a.cache_hits, "pool: the cache serves a repeated size",
               "%s", s ? err() : "");
    }
}

/* ---- kernels --------------------------------------------------------------------------- */

typedef enum layout { L_CONTIG, L_TRANSPOSED, L_STRIDED, L_OFFSET, L_BCAST, L_NLAYOUTS } layout;
static const char *const layout_names[] = {"contiguous", "transposed", "strided", "offset",
                                           "broadcast"};

/* How an operand's values are drawn. */
typedef enum values {
    V_RANDOM,   /* floats in [-2, 2), ints in [-9, 9], u8 {0, 1} */
    V_POSITIVE, /* floats in [0.5, 2.5), ints in [1, 9] */
    V_INDEX,    /* ints in [0, range) */
    V_BADINDEX  /* like V_INDEX with one element == range (out of range) */
} values;

typedef struct opspec {
    int32_t dtype;
    int ndim;
    int64_t shape[TS_MAX_DIMS];
    values v;
    int64_t range;
    int contig_only; /* optimizer operands: the ABI promises contiguous */
    int no_bcast;    /* outputs, indices, operands whose every dim matters */
} opspec;

typedef struct kcase {
    int32_t op;
    int nin, nout;
    opspec in[4], out[3];
    unsigned char params[96];
    uint32_t params_size;
    char what[160];
} kcase;

/* One operand on the device and its twin in host memory for the reference. */
typedef struct buf {
    void *dptr;        /* device block */
    unsigned char *host, *ref; /* host images of the block: uploaded / reference */
    size_t nbytes;
    ts_operand op;     /* layout inside the block (data filled per side) */
} buf;

static size_t esize(int32_t dt)
{
    return ts_dtype_size(dt);
}

static double getv(const ts_operand *o, const void *base, const int64_t *idx)
{
    int64_t off = o->offset;
    for (int d = 0; d < o->ndim; d++)
        off += idx[d] * o->strides[d];
    const char *p = (const char *)base + off * (int64_t)esize(o->dtype);
    switch (o->dtype) {
    case TS_F32: { float f; memcpy(&f, p, 4); return f; }
    case TS_F64: { double f; memcpy(&f, p, 8); return f; }
    case TS_I32: { int32_t i; memcpy(&i, p, 4); return i; }
    case TS_I64: { int64_t i; memcpy(&i, p, 8); return (double)i; }
    default: return *(const unsigned char *)p;
    }
}

static void setv(const ts_operand *o, void *base, const int64_t *idx, double v)
{
    int64_t off = o->offset;
    for (int d = 0; d < o->ndim; d++)
        off += idx[d] * o->strides[d];
    char *p = (char *)base + off * (int64_t)esize(o->dtype);
    switch (o->dtype) {
    case TS_F32: { float f = (float)v; memcpy(p, &f, 4); break; }
    case TS_F64: memcpy(p, &v, 8); break;
    case TS_I32: { int32_t i = (int32_t)v; memcpy(p, &i, 4); break; }
    case TS_I64: { int64_t i = (int64_t)v; memcpy(p, &i, 8); break; }
    default: *(unsigned char *)p = (unsigned char)v; break;
    }
}

static int64_t numel(int nd, const int64_t *shape)
{
    int64_t n = 1;
    for (int d = 0; d < nd; d++)
        n *= shape[d];
    return n;
}

static int next_index(int nd, const int64_t *shape, int64_t *idx)
{
    for (int d = nd - 1; d >= 0; d--) {
        if (++idx[d] < shape[d])
            return 1;
        idx[d] = 0;
    }
    return 0;
}

/* Lays out spec in layout l inside a new device block; fills both host images with the same
 * values (gaps hold 0xA5). */
static ts_status make_buf(checker *c, const opspec *sp, layout l, uint64_t *rng, buf *b)
{
    memset(b, 0, sizeof *b);
    int nd = sp->ndim;
    if (sp->contig_only)
        l = L_CONTIG;
    if (l == L_BCAST && (sp->no_bcast || nd == 0 || sp->shape[0] < 2))
        l = L_CONTIG;
    b->op.dtype = sp->dtype;
    b->op.ndim = nd;
    int order[TS_MAX_DIMS];
    for (int d = 0; d < nd; d++) {
        b->op.shape[d] = sp->shape[d];
        order[d] = d;
    }
    if (l == L_TRANSPOSED && nd >= 2) {
        order[nd - 2] = nd - 1;
        order[nd - 1] = nd - 2;
    }
    int64_t mult = l == L_STRIDED ? 2 : 1, acc = 1;
    for (int k = nd - 1; k >= 0; k--) {
        int d = order[k];
        if (l == L_BCAST && d == 0) {
            b->op.strides[d] = 0;
            continue;
        }
        b->op.strides[d] = acc * mult;
        acc *= sp->shape[d] * mult;
        if (sp->shape[d] == 0)
            acc = acc ? acc : 1;
    }
    b->op.offset = l == L_OFFSET ? 5 : 0;
    int64_t span = b->op.offset + 1;
    for (int d = 0; d < nd; d++)
        if (sp->shape[d] > 0)
            span += (sp->shape[d] - 1) * b->op.strides[d];
    b->nbytes = (size_t)span * esize(sp->dtype);
    b->host = malloc(b->nbytes);
    b->ref = malloc(b->nbytes);
    if (!b->host || !b->ref)
        return nomem();
    memset(b->host, 0xA5, b->nbytes);
    int64_t idx[TS_MAX_DIMS] = {0};
    int64_t n = numel(nd, sp->shape), bad_at = n > 0 ? (int64_t)(next_rand(rng) % (uint64_t)n) : -1;
    for (int64_t i = 0; i < n; i++, next_index(nd, sp->shape, idx)) {
        uint64_t r = next_rand(rng);
        double v;
        int is_float = sp->dtype == TS_F32 || sp->dtype == TS_F64;
        switch (sp->v) {
        case V_POSITIVE:
            v = is_float ? 0.5 + (double)(r >> 11) * 0x1p-53 * 2 : (double)(1 + r % 9);
            break;
        case V_INDEX:
        case V_BADINDEX:
            v = sp->range > 0 ? (double)(r % (uint64_t)sp->range) : 0;
            if (sp->v == V_BADINDEX && i == bad_at)
                v = (double)sp->range;
            break;
        default:
            if (sp->dtype == TS_U8)
                v = (double)(r & 1);
            else if (is_float)
                v = -2 + (double)(r >> 11) * 0x1p-53 * 4;
            else
                v = (double)(int)(r % 19) - 9;
        }
        setv(&b->op, b->host, idx, v);
    }
    memcpy(b->ref, b->host, b->nbytes);
    ts_status s = ts_device_alloc(c->dev, b->nbytes, "plugin-check", &b->dptr);
    if (!s)
        s = ts_device_copy_from_host(c->dev, b->dptr, b->host, b->nbytes);
    return s;
}

static void free_buf(checker *c, buf *b)
{
    ts_device_free(c->dev, b->dptr);
    free(b->host);
    free(b->ref);
    memset(b, 0, sizeof *b);
}

static double rtol_for(int32_t dt)
{
    return dt == TS_F32 ? 2e-4 : dt == TS_F64 ? 1e-9 : 0;
}

static int close_enough(double a, double b, int32_t dt)
{
    if (isnan(a) || isnan(b))
        return isnan(a) && isnan(b);
    if (isinf(a) || isinf(b))
        return a == b;
    double tol = rtol_for(dt);
    return fabs(a - b) <= tol * (1 + fabs(b));
}

/* Runs one case on the plugin and on the reference, with operand values drawn from seed.
 * 1 agree, 0 differ (why filled), -1 the reference does not do this combination (skipped).
 * Reads c only: several threads may run cases at once. */
static int run_case_seeded(checker *c, const kcase *k, layout l, uint64_t seed, char *why,
                           size_t whylen)
{
    buf in[4], out[3];
    int nin = 0, nout = 0, r = 0;
    uint64_t rng = seed;
    ts_status s = TS_OK;
    for (; nin < k->nin && !s; nin++)
        s = make_buf(c, &k->in[nin], l, &rng, &in[nin]);
    for (; nout < k->nout && !s; nout++) {
        opspec o = k->out[nout];
        o.no_bcast = 1;
        s = make_buf(c, &o, l, &rng, &out[nout]);
    }
    if (s) {
        snprintf(why, whylen, "setting up operands: %s", err());
        goto done;
    }
    ts_operand din[4], dout[3], rin[4], rout[3];
    for (int i = 0; i < nin; i++) {
        din[i] = rin[i] = in[i].op;
        din[i].data = in[i].dptr;
        rin[i].data = in[i].ref;
    }
    for (int i = 0; i < nout; i++) {
        dout[i] = rout[i] = out[i].op;
        dout[i].data = out[i].dptr;
        rout[i].data = out[i].ref;
    }
    ts_kernel_call call = {.struct_size = sizeof call, .op = k->op, .ninputs = nin,
                           .noutputs = nout, .inputs = din, .outputs = dout,
                           .params = k->params_size ? k->params : NULL,
                           .params_size = k->params_size};
    ts_kernel_call rcall = call;
    rcall.inputs = rin;
    rcall.outputs = rout;
    if (ts_reference_run(&rcall) != TS_OK) {
        r = -1;
        goto done;
    }
    ts_clear_error();
    if ((s = ts_device_run(c->dev, &call)) || (s = ts_device_synchronize(c->dev))) {
        snprintf(why, whylen, "%s failed: %s: %s", k->what, ts_status_name(s), err());
        goto done;
    }
    for (int i = 0; i < nout; i++) {
        if ((s = ts_device_copy_to_host(c->dev, out[i].host, out[i].dptr, out[i].nbytes))) {
            snprintf(why, whylen, "copy back: %s", err());
            goto done;
        }
        const ts_operand *o = &out[i].op;
        int64_t idx[TS_MAX_DIMS] = {0}, n = numel(o->ndim, o->shape);
        for (int64_t e = 0; e < n; e++, next_index(o->ndim, o->shape, idx)) {
            double got = getv(o, out[i].host, idx), want = getv(o, out[i].ref, idx);
            if (!close_enough(got, want, o->dtype)) {
                char at[96] = "";
                size_t len = 0;
                for (int d = 0; d < o->ndim; d++)
                    len += (size_t)snprintf(at + len, sizeof at - len, "%s%lld", d ? ", " : "",
                                            (long long)idx[d]);
                snprintf(why, whylen, "%s: output %d at (%s) is %.9g, the reference says %.9g",
                         k->what, i, at, got, want);
                goto done;
            }
        }
        /* Bytes between strided elements and before the offset stay untouched. */
        memcpy(out[i].ref, out[i].host, out[i].nbytes);
        memset(out[i].ref, 0xA5, out[i].nbytes);
        memset(idx, 0, sizeof idx);
        for (int64_t e = 0; e < n; e++, next_index(o->ndim, o->shape, idx)) {
            int64_t off = o->offset;
            for (int d = 0; d < o->ndim; d++)
                off += idx[d] * o->strides[d];
            memcpy(out[i].ref + off * (int64_t)esize(o->dtype),
                   out[i].host + off * (int64_t)esize(o->dtype), esize(o->dtype));
        }
        if (memcmp(out[i].ref, out[i].host, out[i].nbytes) != 0) {
            snprintf(why, whylen, "%s: output %d: the kernel wrote bytes outside its elements",
                     k->what, i);
            goto done;
        }
    }
    r = 1;
done:
    for (int i = 0; i < nin; i++)
        free_buf(c, &in[i]);
    for (int i = 0; i < nout; i++)
        free_buf(c, &out[i]);
    return r;
}

static int run_case(checker *c, const kcase *k, layout l, char *why, size_t whylen)
{
    return run_case_seeded(c, k, l, c->seed ^ ((uint64_t)k->op << 32) ^ (uint64_t)l, why, whylen);
}

static opspec spec(int32_t dt, int nd, const int64_t *shape)
{
    opspec o = {.dtype = dt, .ndim = nd};
    for (int d = 0; d < nd; d++)
        o.shape[d] = shape[d];
    return o;
}

#define SHAPE(...) (sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__}

static void set_params(kcase *k, const void *p, size_t n)
{
    memcpy(k->params, p, n);
    k->params_size = (uint32_t)n;
}

typedef struct caselist {
    kcase *v;
    int n, cap;
} caselist;

static kcase *add(caselist *l, int32_t op, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static kcase *add(caselist *l, int32_t op, const char *fmt, ...)
{
    static kcase dummy;
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        kcase *v = realloc(l->v, (size_t)cap * sizeof *v);
        if (!v)
            return memset(&dummy, 0, sizeof dummy);
        l->v = v;
        l->cap = cap;
    }
    kcase *k = &l->v[l->n++];
    memset(k, 0, sizeof *k);
    k->op = op;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(k->what, sizeof k->what, fmt, ap);
    va_end(ap);
    return k;
}

static const struct {
    int nd;
    int64_t shape[3];
} eshapes[] = {{0, {0}}, {1, {7}}, {2, {3, 5}}, {3, {2, 3, 4}}, {2, {0, 3}}};

static int is_floatdt(int32_t dt)
{
    return dt == TS_F32 || dt == TS_F64;
}

/* The cases for op with output dtype dt. */
static void build_cases(int32_t op, int32_t dt, caselist *l)
{
    const char *dn = ts_dtype_name(dt);
    kcase *k;
    switch (op) {
    case TS_OP_COPY:
    case TS_OP_CAST:
    case TS_OP_FILL:
    case TS_OP_UNARY:
        for (size_t si = 0; si < sizeof eshapes / sizeof eshapes[0]; si++) {
            opspec o = spec(dt, eshapes[si].nd, eshapes[si].shape);
            if (op == TS_OP_COPY) {
                k = add(l, op, "copy %s %dd", dn, o.ndim);
                k->nin = k->nout = 1;
                k->in[0] = k->out[0] = o;
            } else if (op == TS_OP_CAST) {
                for (int32_t from = 0; from < TS_DTYPE_COUNT; from++) {
                    k = add(l, op, "cast %s -> %s %dd", ts_dtype_name(from), dn, o.ndim);
                    k->nin = k->nout = 1;
                    k->in[0] = spec(from, o.ndim, o.shape);
                    k->out[0] = o;
                }
            } else if (op == TS_OP_FILL) {
                ts_fill_params p = {is_floatdt(dt) ? 2.5 : dt == TS_U8 ? 1 : -3};
                k = add(l, op, "fill %s %dd", dn, o.ndim);
                k->nout = 1;
                k->out[0] = o;
                set_params(k, &p, sizeof p);
            } else {
                for (int fn = 0; fn < TS_UNARY_COUNT; fn++) {
                    ts_unary_params p = {fn};
                    k = add(l, op, "unary fn %d %s %dd", fn, dn, o.ndim);
                    k->nin = k->nout = 1;
                    k->in[0] = k->out[0] = o;
                    if (fn == TS_UNARY_LOG || fn == TS_UNARY_SQRT || fn == TS_UNARY_RSQRT)
                        k->in[0].v = V_POSITIVE;
                    set_params(k, &p, sizeof p);
                }
            }
        }
        break;
    case TS_OP_RELU_BACKWARD: /* g and x of out's shape; random x has both signs */
        if (!is_floatdt(dt))
            break;
        for (size_t si = 1; si < sizeof eshapes / sizeof eshapes[0]; si++) {
            opspec o = spec(dt, eshapes[si].nd, eshapes[si].shape);
            k = add(l, op, "relu_backward %s %dd", dn, o.ndim);
            k->nin = 2;
            k->nout = 1;
            k->in[0] = k->in[1] = k->out[0] = o;
        }
        break;
    case TS_OP_BINARY:
    case TS_OP_BINARY_SCALAR:
    case TS_OP_WHERE:
        for (size_t si = 1; si < sizeof eshapes / sizeof eshapes[0]; si++) {
            opspec o = spec(dt, eshapes[si].nd, eshapes[si].shape);
            if (op == TS_OP_WHERE) {
                k = add(l, op, "where %s %dd", dn, o.ndim);
                k->nin = 3;
                k->nout = 1;
                k->in[0] = spec(TS_U8, o.ndim, o.shape);
                k->in[1] = k->in[2] = k->out[0] = o;
                continue;
            }
            for (int fn = 0; fn < TS_BINARY_COUNT; fn++) {
                int cmp = fn >= TS_BINARY_EQ;
                int32_t from_list[TS_DTYPE_COUNT];
                int nfrom = 0;
                if (cmp && dt != TS_U8)
                    continue;
                if (cmp)
                    for (int32_t f = 0; f < TS_DTYPE_COUNT; f++)
                        from_list[nfrom++] = f;
                else
                    from_list[nfrom++] = dt;
                for (int fi = 0; fi < nfrom; fi++) {
                    opspec a = spec(from_list[fi], o.ndim, o.shape);
                    if (fn == TS_BINARY_POW || fn == TS_BINARY_DIV)
                        a.v = V_POSITIVE;
                    if (op == TS_OP_BINARY) {
                        k = add(l, op, "binary fn %d %s -> %s %dd", fn,
                                ts_dtype_name(from_list[fi]), dn, o.ndim);
                        k->nin = 2;
                        k->nout = 1;
                        k->in[0] = k->in[1] = a;
                        k->in[0].v = fn == TS_BINARY_POW ? V_POSITIVE : V_RANDOM;
                        k->out[0] = o;
                        ts_binary_params p = {fn};
                        set_params(k, &p, sizeof p);
                    } else {
                        for (int first = 0; first < 2; first++) {
                            k = add(l, op, "scalar fn %d%s %s -> %s %dd", fn,
                                    first ? " (scalar first)" : "",
                                    ts_dtype_name(from_list[fi]), dn, o.ndim);
                            k->nin = k->nout = 1;
                            k->in[0] = a;
                            k->in[0].v = fn == TS_BINARY_POW || (fn == TS_BINARY_DIV && first)
                                             ? V_POSITIVE : V_RANDOM;
                            k->out[0] = o;
                            ts_scalar_params p = {fn, first,
                                                  is_floatdt(from_list[fi]) ? 1.5 : 3};
                            set_params(k, &p, sizeof p);
                        }
                    }
                }
            }
        }
        break;
    case TS_OP_REDUCE: {
        static const struct {
            int nd;
            int64_t in[3], out[3];
        } rs[] = {{3, {4, 5, 6}, {4, 1, 6}}, {3, {4, 5, 6}, {1, 1, 1}}, {3, {4, 5, 6}, {4, 5, 1}},
                  {1, {7}, {1}}, {2, {3, 4}, {1, 4}}};
        for (size_t i = 0; i < sizeof rs / sizeof rs[0]; i++)
            for (int fn = 0; fn < TS_REDUCE_COUNT; fn++) {
                int arg = fn == TS_REDUCE_ARGMAX || fn == TS_REDUCE_ARGMIN;
                if (arg != (dt == TS_I64))
                    continue;
                int dim = -1, nred = 0;
                for (int d = 0; d < rs[i].nd; d++)
                    if (rs[i].out[d] == 1 && rs[i].in[d] != 1)
                        dim = d, nred++;
                if (arg && nred != 1)
                    continue;
                int32_t from_list[3] = {dt, TS_F32, TS_F64};
                for (int fi = 0; fi < (arg ? 3 : 1); fi++) {
                    if (arg && fi == 0)
                        continue;
                    k = add(l, op, "reduce fn %d %s -> %s %dd", fn,
                            ts_dtype_name(from_list[fi]), dn, rs[i].nd);
                    k->nin = k->nout = 1;
                    k->in[0] = spec(from_list[fi], rs[i].nd, rs[i].in);
                    k->out[0] = spec(dt, rs[i].nd, rs[i].out);
                    ts_reduce_params p = {fn, dim < 0 ? 0 : dim};
                    set_params(k, &p, sizeof p);
                }
            }
        break;
    }
    case TS_OP_MATMUL: {
        static const struct {
            int nd;
            int64_t a[3], b[3], c[3];
            int bcast_b;
        } ms[] = {{2, {3, 4}, {4, 5}, {3, 5}, 0}, {2, {1, 7}, {7, 1}, {1, 1}, 0},
                  {2, {17, 33}, {33, 9}, {17, 9}, 0}, {3, {2, 3, 4}, {2, 4, 5}, {2, 3, 5}, 0},
                  {3, {3, 2, 6}, {3, 6, 4}, {3, 2, 4}, 1}};
        for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
            for (int ab = 0; ab < 2; ab++) {
                k = add(l, op, "matmul %s %dd %lldx%lldx%lld%s%s", dn, ms[i].nd,
                        (long long)ms[i].a[ms[i].nd - 2], (long long)ms[i].a[ms[i].nd - 1],
                        (long long)ms[i].b[ms[i].nd - 1], ab ? " alpha 0.5 beta 2" : "",
                        ms[i].bcast_b ? " broadcast batch" : "");
                k->nin = 2;
                k->nout = 1;
                k->in[0] = spec(dt, ms[i].nd, ms[i].a);
                k->in[1] = spec(dt, ms[i].nd, ms[i].b);
                k->in[0].no_bcast = 1;
                k->in[1].no_bcast = !ms[i].bcast_b;
                k->out[0] = spec(dt, ms[i].nd, ms[i].c);
                ts_matmul_params p = {ab ? 0.5 : 1, ab ? 2 : 0};
                set_params(k, &p, sizeof p);
            }
        break;
    }
    case TS_OP_SOFTMAX:
    case TS_OP_LOG_SOFTMAX: {
        static const struct {
            int nd;
            int64_t s[3];
            int dim;
        } ss[] = {{2, {4, 7}, 1}, {2, {4, 7}, 0}, {3, {2, 3, 5}, 1}, {1, {9}, 0}};
        for (size_t i = 0; i < sizeof ss / sizeof ss[0]; i++) {
            k = add(l, op, "%s %s %dd dim %d", op == TS_OP_SOFTMAX ? "softmax" : "log_softmax",
                    dn, ss[i].nd, ss[i].dim);
            k->nin = k->nout = 1;
            k->in[0] = k->out[0] = spec(dt, ss[i].nd, ss[i].s);
            ts_dim_params p = {ss[i].dim};
            set_params(k, &p, sizeof p);
        }
        break;
    }
    case TS_OP_INDEX_SELECT:
    case TS_OP_INDEX_ADD:
        for (int dim = 0; dim < 2; dim++)
            for (int32_t it = TS_I32; it <= TS_I64; it++) {
                int64_t src[2] = {5, 4}, dst[2] = {5, 4}, nidx = dim ? 6 : 3;
                (op == TS_OP_INDEX_SELECT ? dst : src)[dim] = nidx;
                k = add(l, op, "%s %s dim %d %s indices",
                        op == TS_OP_INDEX_SELECT ? "index_select" : "index_add", dn, dim,
                        ts_dtype_name(it));
                k->nin = 2;
                k->nout = 1;
                k->in[0] = spec(dt, 2, src);
                k->in[1] = spec(it, 1, &nidx);
                k->in[1].v = V_INDEX;
                k->in[1].range = (op == TS_OP_INDEX_SELECT ? src : dst)[dim];
                k->in[1].no_bcast = 1;
                k->out[0] = spec(dt, 2, dst);
                ts_dim_params p = {dim};
                set_params(k, &p, sizeof p);
            }
        break;
    case TS_OP_CONV2D:
    case TS_OP_CONV2D_BWD_DATA:
    case TS_OP_CONV2D_BWD_WEIGHT: {
        static const struct {
            int64_t N, C, H, W, K, R, S;
            ts_conv2d_params p;
            int bias;
        } cs[] = {{2, 3, 7, 7, 4, 3, 3, {1, 1, 1, 1, 1, 1, 1}, 1},
                  {2, 3, 8, 7, 4, 3, 2, {2, 2, 0, 1, 1, 1, 1}, 0},
                  {1, 4, 6, 6, 4, 3, 3, {1, 1, 1, 1, 1, 1, 2}, 1},
                  {1, 2, 9, 9, 3, 3, 3, {1, 1, 2, 2, 2, 2, 1}, 0},
                  {3, 1, 5, 5, 2, 1, 1, {1, 1, 0, 0, 1, 1, 1}, 1}};
        for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
            const ts_conv2d_params *p = &cs[i].p;
            int64_t P = (cs[i].H + 2 * p->pad_h - p->dilation_h * (cs[i].R - 1) - 1) / p->stride_h + 1;
            int64_t Q = (cs[i].W + 2 * p->pad_w - p->dilation_w * (cs[i].S - 1) - 1) / p->stride_w + 1;
            int64_t x[4] = {cs[i].N, cs[i].C, cs[i].H, cs[i].W};
            int64_t w[4] = {cs[i].K, cs[i].C / p->groups, cs[i].R, cs[i].S};
            int64_t y[4] = {cs[i].N, cs[i].K, P, Q}, b[1] = {cs[i].K};
            k = add(l, op, "%s %s x (%lld, %lld, %lld, %lld) w (%lld, %lld, %lld, %lld) stride "
                    "%d pad %d dilation %d groups %d",
                    op == TS_OP_CONV2D ? "conv2d" : op == TS_OP_CONV2D_BWD_DATA
                                                        ? "conv2d_bwd_data" : "conv2d_bwd_weight",
                    dn, (long long)x[0], (long long)x[1], (long long)x[2], (long long)x[3],
                    (long long)w[0], (long long)w[1], (long long)w[2], (long long)w[3],
                    (int)p->stride_h, (int)p->pad_h, (int)p->dilation_h, (int)p->groups);
            k->nout = 1;
            if (op == TS_OP_CONV2D) {
                k->nin = cs[i].bias ? 3 : 2;
                k->in[0] = spec(dt, 4, x);
                k->in[1] = spec(dt, 4, w);
                k->in[2] = spec(dt, 1, b);
                k->out[0] = spec(dt, 4, y);
            } else {
                k->nin = 2;
                k->in[0] = spec(dt, 4, y);
                k->in[1] = op == TS_OP_CONV2D_BWD_DATA ? spec(dt, 4, w) : spec(dt, 4, x);
                k->out[0] = op == TS_OP_CONV2D_BWD_DATA ? spec(dt, 4, x) : spec(dt, 4, w);
            }
            for (int j = 0; j < k->nin; j++)
                k->in[j].no_bcast = 1;
            set_params(k, p, sizeof *p);
        }
        break;
    }
    case TS_OP_MAXPOOL2D:
    case TS_OP_AVGPOOL2D:
    case TS_OP_MAXPOOL2D_BWD:
    case TS_OP_AVGPOOL2D_BWD: {
        static const ts_pool2d_params ps[] = {{2, 2, 2, 2, 0, 0, 0}, {3, 3, 2, 2, 1, 1, 0},
                                              {3, 3, 2, 2, 1, 1, 1}, {2, 3, 1, 2, 0, 1, 1}};
        int fwd = op == TS_OP_MAXPOOL2D || op == TS_OP_AVGPOOL2D;
        int max = op == TS_OP_MAXPOOL2D || op == TS_OP_MAXPOOL2D_BWD;
        for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) {
            const ts_pool2d_params *p = &ps[i];
            if (max && p->count_include_pad)
                continue;
            int64_t H = 7, W = 6;
            int64_t P = (H + 2 * p->pad_h - p->kernel_h) / p->stride_h + 1;
            int64_t Q = (W + 2 * p->pad_w - p->kernel_w) / p->stride_w + 1;
            int64_t x[4] = {2, 3, H, W}, y[4] = {2, 3, P, Q};
            for (int with_idx = 0; with_idx < (op == TS_OP_MAXPOOL2D ? 2 : 1); with_idx++) {
                if (op == TS_OP_MAXPOOL2D && dt == TS_I64)
                    break;
                k = add(l, op, "%s %s kernel %dx%d stride %d pad %d%s%s",
                        max ? "maxpool2d" : "avgpool2d", fwd ? "" : "backward", (int)p->kernel_h,
                        (int)p->kernel_w, (int)p->stride_h, (int)p->pad_h,
                        with_idx ? " with indices" : "",
                        p->count_include_pad ? " count_include_pad" : "");
                if (fwd) {
                    k->nin = 1;
                    k->nout = 1 + with_idx;
                    k->in[0] = spec(dt, 4, x);
                    k->out[0] = spec(dt, 4, y);
                    k->out[1] = spec(TS_I64, 4, y);
                } else {
                    k->nin = max ? 2 : 1;
                    k->nout = 1;
                    k->in[0] = spec(dt, 4, y);
                    k->in[1] = spec(TS_I64, 4, y);
                    k->in[1].v = V_INDEX;
                    k->in[1].range = H * W;
                    k->out[0] = spec(dt, 4, x);
                }
                k->in[0].no_bcast = k->in[1].no_bcast = 1;
                set_params(k, p, sizeof *p);
            }
        }
        break;
    }
    case TS_OP_CROSS_ENTROPY:
    case TS_OP_CROSS_ENTROPY_BWD:
        for (int32_t it = TS_I32; it <= TS_I64; it++)
            for (int64_t C = 3; C <= 11; C += 8) {
                int64_t lg[2] = {5, C}, n = 5;
                k = add(l, op, "%s %s (5, %lld) %s targets",
                        op == TS_OP_CROSS_ENTROPY ? "cross_entropy" : "cross_entropy_bwd", dn,
                        (long long)C, ts_dtype_name(it));
                k->in[0] = spec(dt, 2, lg);
                k->in[1] = spec(it, 1, &n);
                k->in[1].v = V_INDEX;
                k->in[1].range = C;
                k->in[1].no_bcast = 1;
                if (op == TS_OP_CROSS_ENTROPY) {
                    k->nin = 2;
                    k->out[0] = spec(dt, 1, &n);
                } else {
                    k->nin = 3;
                    k->in[2] = spec(dt, 1, &n);
                    k->out[0] = spec(dt, 2, lg);
                }
                k->nout = 1;
            }
        break;
    case TS_OP_SGD_STEP:
    case TS_OP_ADAM_STEP: {
        int64_t n = 37;
        for (int v = 0; v < 4; v++) {
            k = add(l, op, "%s %s variant %d", op == TS_OP_SGD_STEP ? "sgd_step" : "adam_step", dn,
                    v);
            k->nin = 1;
            k->in[0] = spec(dt, 1, &n);
            k->in[0].contig_only = 1;
            if (op == TS_OP_SGD_STEP) {
                ts_sgd_params p = {0.1, v ? 0.9 : 0, v == 2 ? 0.1 : 0, v >= 2 ? 0.01 : 0,
                                   v == 3, v == 1};
                k->nout = v ? 2 : 1;
                set_params(k, &p, sizeof p);
            } else {
                ts_adam_params p = {0.01, 0.9, 0.999, 1e-8, v >= 2 ? 0.01 : 0, v == 3, 1 + v};
                k->nout = 3;
                set_params(k, &p, sizeof p);
            }
            for (int j = 0; j < k->nout; j++) {
                k->out[j] = spec(dt, 1, &n);
                k->out[j].contig_only = 1;
            }
            if (op == TS_OP_ADAM_STEP)
                k->out[2].v = V_POSITIVE;
        }
        break;
    }
    default:
        break;
    }
}

static void check_kernels(checker *c)
{
    int claimed = 0;
    for (int32_t op = TS_OP_NONE + 1; op < TS_OP_COUNT; op++)
        for (int32_t dt = 0; dt < TS_DTYPE_COUNT; dt++) {
            if (!ts_device_supports(c->dev, op, dt))
                continue;
            claimed++;
            char name[96];
            snprintf(name, sizeof name, "kernel: %s %s", ts_op_name(op), ts_dtype_name(dt));
            caselist l = {0};
            build_cases(op, dt, &l);
            int passed = 0, skipped = 0, failed = 0;
            char why[512] = "";
            for (int i = 0; i < l.n && !failed; i++)
                for (int lay = 0; lay < L_NLAYOUTS && !failed; lay++) {
                    char w[512] = "";
                    int r = run_case(c, &l.v[i], (layout)lay, w, sizeof w);
                    if (c->verbose)
                        printf("      %s, %s: %s\n", l.v[i].what, layout_names[lay],
                               r > 0 ? "ok" : r == 0 ? w : "reference does not do it");
                    if (r > 0)
                        passed++;
                    else if (r < 0)
                        skipped++;
                    else {
                        failed++;
                        snprintf(why, sizeof why, "%s (%s layout)", w, layout_names[lay]);
                    }
                }
            free(l.v);
            c->kernel_failed[op][dt] = failed > 0;
            if (failed)
                report(c, 0, name, "%s", why);
            else if (passed == 0)
                report(c, -1, name, "no case this suite knows for it (%d combinations the "
                       "reference does not do)", skipped);
            else
                report(c, 1, name, "%d cases agree with the reference", passed);
        }
    if (!claimed)
        report(c, -1, "kernels", "the plugin claims none%s",
               (TS_HAS_MEMBER(ts_device_desc(c->dev), ts_plugin_desc, flags) &&
                (ts_device_desc(c->dev)->flags & TS_PLUGIN_HOST_MEMORY))
                   ? " (the core runs its reference kernels on its host memory)"
                   : "");
}

/* ---- error paths ----------------------------------------------------------------------- */

/* Runs a bad call; it must fail with a status and a message (and not crash). */
static void expect_error(checker *c, const char *name, const kcase *k)
{
    char why[256];
    buf in[4], out[3];
    int nin = 0, nout = 0;
    uint64_t rng = c->seed;
    ts_status s = TS_OK;
    for (; nin < k->nin && !s; nin++)
        s = make_buf(c, &k->in[nin], L_CONTIG, &rng, &in[nin]);
    for (; nout < k->nout && !s; nout++)
        s = make_buf(c, &k->out[nout], L_CONTIG, &rng, &out[nout]);
    if (s) {
        snprintf(why, sizeof why, "setting up: %s", err());
        report(c, 0, name, "%s", why);
    } else {
        ts_operand din[4], dout[3];
        for (int i = 0; i < nin; i++)
            din[i] = in[i].op, din[i].data = in[i].dptr;
        for (int i = 0; i < nout; i++)
            dout[i] = out[i].op, dout[i].data = out[i].dptr;
        ts_kernel_call call = {.struct_size = sizeof call, .op = k->op, .ninputs = k->nin,
                               .noutputs = k->nout, .inputs = din, .outputs = dout,
                               .params = k->params_size ? k->params : NULL,
                               .params_size = k->params_size};
        ts_clear_error();
        s = ts_device_run(c->dev, &call);
        if (!s)
            s = ts_device_synchronize(c->dev);
        report(c, s != TS_OK && ts_last_error()[0], name, "%s: %s", ts_status_name(s),
               s ? err() : "the bad call succeeded");
    }
    for (int i = 0; i < nin; i++)
        free_buf(c, &in[i]);
    for (int i = 0; i < nout; i++)
        free_buf(c, &out[i]);
}

static void check_errors(checker *c)
{
    int any = 0;
    int64_t n5[2] = {5, 4}, n3 = 3, n4 = 4;
    for (int32_t dt = 0; dt < TS_DTYPE_COUNT; dt++) {
        for (int add = 0; add < 2; add++) { /* index_select (5,4)->(3,4), index_add back */
            int32_t op = add ? TS_OP_INDEX_ADD : TS_OP_INDEX_SELECT;
            if (!ts_device_supports(c->dev, op, dt))
                continue;
            kcase k = {.op = op, .nin = 2, .nout = 1};
            int64_t n34[2] = {3, 4};
            k.in[0] = spec(dt, 2, add ? n34 : n5);
            k.in[1] = spec(TS_I64, 1, &n3);
            k.in[1].v = V_BADINDEX;
            k.in[1].range = 5;
            k.out[0] = spec(dt, 2, add ? n5 : n34);
            ts_dim_params p = {0};
            set_params(&k, &p, sizeof p);
            char name[96];
            snprintf(name, sizeof name, "errors: %s %s with an index out of range",
                     add ? "index_add" : "index_select", ts_dtype_name(dt));
            expect_error(c, name, &k);
            any = 1;
        }
        for (int bwd = 0; bwd < 2; bwd++) {
            int32_t op = bwd ? TS_OP_CROSS_ENTROPY_BWD : TS_OP_CROSS_ENTROPY;
            if (!ts_device_supports(c->dev, op, dt))
                continue;
            kcase k = {.op = op, .nin = bwd ? 3 : 2, .nout = 1};
            k.in[0] = spec(dt, 2, n5);
            k.in[1] = spec(TS_I64, 1, n5);
            k.in[1].v = V_BADINDEX;
            k.in[1].range = 4;
            k.in[2] = spec(dt, 1, n5);
            k.out[0] = bwd ? spec(dt, 2, n5) : spec(dt, 1, n5);
            char name[96];
            snprintf(name, sizeof name, "errors: %s %s with a target out of range",
                     ts_op_name(op), ts_dtype_name(dt));
            expect_error(c, name, &k);
            any = 1;
        }
        if ((dt == TS_I32 || dt == TS_I64) && ts_device_supports(c->dev, TS_OP_BINARY, dt)) {
            kcase k = {.op = TS_OP_BINARY, .nin = 2, .nout = 1};
            k.in[0] = k.out[0] = spec(dt, 1, &n4);
            k.in[1] = spec(dt, 1, &n4);
            k.in[1].v = V_INDEX; /* values in [0, 1): all zero */
            k.in[1].range = 1;
            ts_binary_params p = {TS_BINARY_DIV};
            set_params(&k, &p, sizeof p);
            char name[96];
            snprintf(name, sizeof name, "errors: integer division by zero (%s)",
                     ts_dtype_name(dt));
            expect_error(c, name, &k);
            any = 1;
        }
        if (is_floatdt(dt) && ts_device_supports(c->dev, TS_OP_CONV2D, dt)) {
            kcase k = {.op = TS_OP_CONV2D, .nin = 2, .nout = 1};
            int64_t x[4] = {1, 2, 5, 5}, w[4] = {3, 2, 3, 3}, y[4] = {1, 3, 3, 3};
            k.in[0] = spec(dt, 4, x);
            k.in[1] = spec(dt, 4, w);
            k.out[0] = spec(dt, 4, y);
            char name[96];
            snprintf(name, sizeof name, "errors: conv2d %s without its params",
                     ts_dtype_name(dt));
            expect_error(c, name, &k);
            any = 1;
        }
    }
    /* Every claimed op, called with no operands at all: an error, not a crash. */
    int nbad = 0, nclaimed = 0;
    char first_bad[160] = "";
    for (int32_t op = TS_OP_NONE + 1; op < TS_OP_COUNT; op++) {
        int32_t dt = 0;
        while (dt < TS_DTYPE_COUNT && !ts_device_supports(c->dev, op, dt))
            dt++;
        if (dt == TS_DTYPE_COUNT)
            continue;
        nclaimed++;
        ts_operand none[1];
        memset(none, 0, sizeof none);
        ts_kernel_call call = {.struct_size = sizeof call, .op = op, .inputs = none,
                               .outputs = none};
        ts_clear_error();
        ts_status s = ts_device_run(c->dev, &call);
        if (s == TS_OK || !ts_last_error()[0]) {
            if (!nbad++)
                snprintf(first_bad, sizeof first_bad, "%s returned %s%s", ts_op_name(op),
                         ts_status_name(s), s ? " without a message" : "");
        }
    }
    if (nclaimed) {
        if (nbad)
            report(c, 0, "errors: every claimed op refuses a call without operands",
                   "%s (and %d more)", first_bad, nbad - 1);
        else
            report(c, 1, "errors: every claimed op refuses a call without operands", "%d ops",
                   nclaimed);
        any = 1;
    }
    if (!any)
        report(c, -1, "errors: kernel argument checks", "the plugin claims no kernel with a "
               "documented error (index, target, integer division, conv params)");
}

/* ---- concurrent run calls --------------------------------------------------------------- */

#define TH_THREADS 4    /* threads running kernels at once */
#define TH_PER_OP 6     /* cases per claimed (op, dtype), spread over its list */
#define TH_REPS 8       /* runs of each case per thread, back to back, layouts in turn */
#define TH_DEADLINE 120 /* seconds for all of it (well under a second for the shipped plugins) */

/* Threads that have finished, for the deadline. */
typedef struct th_done {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int n;
} th_done;

typedef struct th_job {
    checker *c;
    th_done *done;
    const kcase *cases;
    int ncases;
    unsigned id;
    int runs, failed;
    char why[600];
} th_job;

/* Every thread runs the same cases in the same order, so that they run the same kernel at
 * the same time, each on its own buffers and its own values (its own seed): a plugin that
 * keeps per-call state in shared memory (a static or per-context scratch buffer, a cached
 * object whose fields a call sets) hands one thread's result to another. */
static void *th_run(void *arg)
{
    th_job *j = arg;
    for (int i = 0; i < j->ncases && !j->failed; i++)
        for (int r = 0; r < TH_REPS && !j->failed; r++) {
            uint64_t seed = j->c->seed ^ (0x9e3779b97f4a7c15ull * (j->id + 1)) ^
                            ((uint64_t)(i * TH_REPS + r) << 40);
            layout l = (layout)(r % L_NLAYOUTS);
            char w[512] = "";
            int res = run_case_seeded(j->c, &j->cases[i], l, seed, w, sizeof w);
            if (res == 0) {
                j->failed = 1;
                snprintf(j->why, sizeof j->why, "thread %u: %s (%s layout)", j->id, w,
                         layout_names[l]);
            } else if (res > 0) {
                j->runs++;
            }
        }
    pthread_mutex_lock(&j->done->lock);
    j->done->n++;
    pthread_cond_signal(&j->done->cond);
    pthread_mutex_unlock(&j->done->lock);
    return NULL;
}

static void check_threads(checker *c)
{
    const char *name = "threads: concurrent run calls";
    caselist all = {0};
    int nops = 0, nbad = 0;
    for (int32_t op = TS_OP_NONE + 1; op < TS_OP_COUNT; op++)
        for (int32_t dt = 0; dt < TS_DTYPE_COUNT; dt++) {
            if (!ts_device_supports(c->dev, op, dt))
                continue;
            if (c->kernel_failed[op][dt]) { /* wrong alone already: reported above */
                nbad++;
                continue;
            }
            caselist l = {0};
            build_cases(op, dt, &l);
            int take = l.n < TH_PER_OP ? l.n : TH_PER_OP;
            for (int t = 0; t < take; t++)
                *add(&all, op, "-") = l.v[(size_t)t * (size_t)l.n / (size_t)take];
            nops += take > 0;
            free(l.v);
        }
    if (all.n == 0) {
        free(all.v);
        report(c, -1, name,
               nbad ? "every claimed kernel failed its kernel check"
                    : "the plugin claims no kernel");
        return;
    }
    th_job jobs[TH_THREADS];
    pthread_t t[TH_THREADS];
    th_done done = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    int started = 0, err_no = 0, timed_out = 0, ndone;
    for (unsigned i = 0; i < TH_THREADS; i++) {
        jobs[i] = (th_job){.c = c, .done = &done, .cases = all.v, .ncases = all.n, .id = i};
        if ((err_no = pthread_create(&t[i], NULL, th_run, &jobs[i])) != 0)
            break;
        started++;
    }
    /* A plugin that deadlocks or spins under concurrent calls must not hang the suite. */
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += TH_DEADLINE;
    pthread_mutex_lock(&done.lock);
    while (done.n < started && !timed_out)
        timed_out = pthread_cond_timedwait(&done.cond, &done.lock, &deadline) == ETIMEDOUT;
    ndone = done.n;
    pthread_mutex_unlock(&done.lock);
    if (timed_out) {
        /* The threads are stuck inside the plugin: nothing can be unloaded or freed safely. */
        report(c, 0, name,
               "%d of %d threads still running after %d s (one thread takes well under a "
               "second): a deadlock or a corrupted state under concurrent run calls "
               "(docs/writing-a-plugin.md, Threading)",
               started - ndone, started, TH_DEADLINE);
        printf("plugin-check %s: %d passed, %d failed, %d skipped\n", ts_device_name(c->dev),
               c->npass, c->nfail, c->nskip);
        fflush(stdout);
        _exit(1);
    }
    for (int i = 0; i < started; i++)
        pthread_join(t[i], NULL);
    int ncases = all.n;
    free(all.v);
    if (started < TH_THREADS) {
        report(c, 0, name, "could not start thread %d: %s", started, strerror(err_no));
        return;
    }
    int runs = 0;
    for (int i = 0; i < TH_THREADS; i++) {
        if (jobs[i].failed) {
            report(c, 0, name,
                   "%s; while other threads ran the same kernel on other buffers (alone the "
                   "case agrees, see the kernel checks): keep per-call state on the stack or in "
                   "pool scratch and guard shared state (docs/writing-a-plugin.md, Threading)",
                   jobs[i].why);
            return;
        }
        runs += jobs[i].runs;
    }
    report(c, runs > 0 ? 1 : -1, name,
           "%d threads ran %d cases of %d claimed kernels %d times each at once; all %d "
           "results agree with the reference%s",
           TH_THREADS, ncases, nops, TH_REPS, runs,
           nbad ? " (kernels that failed their kernel check left out)" : "");
}

/* ---- a short training run -------------------------------------------------------------- */

static void check_training(checker *c)
{
    if (c->quick) {
        report(c, -1, "training: an MLP learns a fixed batch", "--quick");
        return;
    }
    ts_device *dev = c->dev;
    ts_rng rng;
    ts_rng_init(&rng, 7);
    ts_module *model = NULL;
    ts_tensor *x = NULL, *y = NULL, *yf = NULL;
    ts_named_tensor *params = NULL;
    ts_optim *opt = NULL;
    double first = NAN, last = NAN;
    int steps = 30;
    int64_t xs[4] = {32, 1, 28, 28}, ys[1] = {32};
    ts_status s = cli_build_model("mlp", dev, &rng, &model);
    if (!s)
        s = ts_tensor_rand(dev, TS_F32, 4, xs, 0, 1, &rng, &x);
    if (!s)
        s = ts_tensor_rand(dev, TS_F32, 1, ys, 0, 10, &rng, &yf);
    if (!s)
        s = ts_cast(yf, TS_I64, &y);
    size_t np = s ? 0 : ts_module_parameters(model, NULL, 0);
    if (!s && !(params = calloc(np + 1, sizeof *params)))
        s = nomem();
    if (!s) {
        ts_module_parameters(model, params, np);
        ts_sgd_options so = {0.05, 0.9, 0, 0, 0};
        s = ts_optim_sgd(params, np, &so, &opt);
    }
    for (int i = 0; i < steps && !s; i++) {
        ts_tensor *logits = NULL, *loss = NULL, *d = NULL;
        double lv = NAN;
        if (!(s = ts_module_forward(model, x, &logits)) &&
            !(s = ts_cross_entropy(logits, y, TS_REDUCTION_MEAN, &loss)) &&
            !(s = ts_backward(loss, NULL, 0)) && !(s = ts_optim_step(opt)) &&
            !(s = ts_cast(loss, TS_F64, &d)) && !(s = ts_tensor_to_host(d, &lv, sizeof lv)))
            ts_optim_zero_grad(opt);
        ts_tensor_unref(logits);
        ts_tensor_unref(loss);
        ts_tensor_unref(d);
        if (i == 0)
            first = lv;
        last = lv;
    }
    ts_optim_free(opt);
    free(params);
    ts_module_free(model);
    ts_tensor_unref(x);
    ts_tensor_unref(y);
    ts_tensor_unref(yf);
    if (s)
        report(c, 0, "training: an MLP learns a fixed batch", "%s", err());
    else
        report(c, isfinite(last) && last < 0.5 * first, "training: an MLP learns a fixed batch",
               "loss %.4f -> %.4f in %d SGD steps (784-256-128-10, batch 32)", first, last, steps);
}

static void check_no_leaks(checker *c)
{
    ts_memory_stats st = stats(c);
    report(c, !(st.valid & TS_STATS_POOL) || st.live_blocks == 0, "pool: no block left live",
           "%llu live blocks, %llu bytes in use after every check freed its memory",
           (unsigned long long)st.live_blocks, (unsigned long long)st.in_use);
}

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
        printf("FAIL  load: %s\n", err());
        printf("plugin-check %s: 0 passed, 1 failed, 0 skipped\n", target);
        ts_shutdown();
        return 1;
    }
    if (coverage) {
        int rc = cli_plugin_coverage(c.dev);
        ts_shutdown();
        return rc;
    }
    report(&c, 1, "load", "%s (%s %s)", ts_device_path(c.dev), ts_device_name(c.dev),
           ts_device_desc(c.dev)->version ? ts_device_desc(c.dev)->version : "");
    check_descriptor(&c);
    check_memory(&c);
    check_pool(&c);
    check_kernels(&c);
    check_errors(&c);
    check_threads(&c);
    check_training(&c);
    check_no_leaks(&c);
    printf("plugin-check %s: %d passed, %d failed, %d skipped\n", ts_device_name(c.dev), c.npass,
           c.nfail, c.nskip);
    ts_shutdown();
    return c.nfail ? 1 : 0;
}
