/* tools/benchmod/malloc_count.c: counts host heap allocations for `tessera bench train`. The
 * benchmark module (preloaded into `tessera bench` only) defines malloc, calloc, realloc,
 * aligned_alloc and posix_memalign, which every library in the process then calls; each forwards to glibc's own entry point (__libc_*) and,
 * while counting is on, adds one to "all" and, when the caller's return address lies in the
 * code of libtessera or of a loaded tessera plugin, one to "tessera". So OpenBLAS's, oneDNN's
 * and the OpenMP runtime's own allocations are counted apart from tessera's. Calls tessera
 * makes through another libc function (strdup, fopen) show up as libc's, not tessera's.
 *
 * Not built under AddressSanitizer, which must own malloc itself: there the counter reports
 * that it is unavailable. */
#include "config.h"

#include <link.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "benchmod.h"

#if defined(__SANITIZE_ADDRESS__)
#define TS_NO_MALLOC_COUNT 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TS_NO_MALLOC_COUNT 1
#endif
#endif

#ifndef TS_NO_MALLOC_COUNT

#define MAX_RANGES 64

static atomic_int counting;
static atomic_uint_fast64_t n_all, n_tessera;
static uintptr_t range_lo[MAX_RANGES], range_hi[MAX_RANGES];
static int nranges;

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);

static void count(uintptr_t caller)
{
    if (!atomic_load_explicit(&counting, memory_order_relaxed))
        return;
    atomic_fetch_add_explicit(&n_all, 1, memory_order_relaxed);
    for (int i = 0; i < nranges; i++)
        if (caller >= range_lo[i] && caller < range_hi[i]) {
            atomic_fetch_add_explicit(&n_tessera, 1, memory_order_relaxed);
            return;
        }
}

/* Visible to every library: the module is preloaded, so these come before glibc's. */
#define EXPORT __attribute__((visibility("default")))
#define CALLER ((uintptr_t)__builtin_return_address(0))

EXPORT void *malloc(size_t n)
{
    count(CALLER);
    return __libc_malloc(n);
}

EXPORT void *calloc(size_t n, size_t size)
{
    count(CALLER);
    return __libc_calloc(n, size);
}

EXPORT void *realloc(void *p, size_t n)
{
    count(CALLER);
    return __libc_realloc(p, n);
}

EXPORT void *aligned_alloc(size_t align, size_t n)
{
    count(CALLER);
    return __libc_memalign(align, n);
}

EXPORT int posix_memalign(void **out, size_t align, size_t n)
{
    count(CALLER);
    if (align < sizeof(void *) || (align & (align - 1)))
        return 22; /* EINVAL */
    void *p = __libc_memalign(align, n);
    if (!p)
        return 12; /* ENOMEM */
    *out = p;
    return 0;
}

/* The executable segments of libtessera and of the plugins named in paths. */
typedef struct scan {
    const char *const *paths;
    int npaths;
} scan;

static int is_tessera(const char *name, const scan *sc)
{
    const char *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    if (!strncmp(base, "libtessera.so", 13))
        return 1;
    for (int i = 0; i < sc->npaths; i++) {
        const char *p = sc->paths[i], *pb = p ? strrchr(p, '/') : NULL;
        if (p && (!strcmp(p, name) || !strcmp(pb ? pb + 1 : p, base)))
            return 1;
    }
    return 0;
}

static int add_object(struct dl_phdr_info *info, size_t size, void *user)
{
    (void)size;
    if (!info->dlpi_name || !is_tessera(info->dlpi_name, user))
        return 0;
    for (int i = 0; i < info->dlpi_phnum && nranges < MAX_RANGES; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X))
            continue;
        range_lo[nranges] = (uintptr_t)(info->dlpi_addr + ph->p_vaddr);
        range_hi[nranges] = range_lo[nranges] + (uintptr_t)ph->p_memsz;
        nranges++;
    }
    return 0;
}

TSB_EXPORT int tsb_malloc_count_setup(const char *const *plugin_paths, int npaths)
{
    atomic_store(&counting, 0);
    nranges = 0;
    scan sc = {plugin_paths, npaths};
    dl_iterate_phdr(add_object, &sc);
    atomic_store(&n_all, 0);
    atomic_store(&n_tessera, 0);
    return nranges > 0;
}

TSB_EXPORT void tsb_malloc_count_enable(int on)
{
    atomic_store(&counting, on);
}

TSB_EXPORT void tsb_malloc_count_read(uint64_t *tessera, uint64_t *all)
{
    *tessera = atomic_load(&n_tessera);
    *all = atomic_load(&n_all);
}

#else

TSB_EXPORT int tsb_malloc_count_setup(const char *const *plugin_paths, int npaths)
{
    (void)plugin_paths, (void)npaths;
    return 0;
}

TSB_EXPORT void tsb_malloc_count_enable(int on)
{
    (void)on;
}

TSB_EXPORT void tsb_malloc_count_read(uint64_t *tessera, uint64_t *all)
{
    *tessera = *all = 0;
}

#endif
