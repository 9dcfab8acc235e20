/* tools/bench_hooks.c: the tessera executable's side of the benchmark module
 * (tools/benchmod, tessera-bench.so). `tessera bench` re-executes itself once with the module
 * preloaded, so that its malloc and pthread_create counters see every library's calls; every
 * other command runs with glibc's malloc and links no BLAS. The counters and the BLAS
 * baseline are found with dlsym and are each optional: without the module a benchmark runs
 * and says what it could not measure. */
#include "config.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <unistd.h>

#include "cli.h"

#define MODULE "tessera-bench.so"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define NO_PRELOAD 1 /* the sanitizer runtime must come first in the library list */
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define NO_PRELOAD 1
#endif
#endif

/* The module's file: next to the executable when it runs from a libtool build tree
 * (BUILD/tools/.libs), else the installed one in $(pkglibdir). 0 when there is none. */
static int file_path(const char *file, char *out, size_t len)
{
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash && slash - exe >= 6 && strncmp(slash - 6, "/.libs", 6) == 0) {
            snprintf(out, len, "%.*s/%s", (int)(slash - exe), exe, file);
            if (access(out, R_OK) == 0)
                return 1;
        }
    }
    snprintf(out, len, "%s/%s", TS_PKGLIBDIR, file);
    return access(out, R_OK) == 0;
}

static int module_path(char *out, size_t len)
{
    return file_path(MODULE, out, len);
}

void *cli_bench_dlopen(const char *file)
{
    char path[PATH_MAX + 64];
    if (getauxval(AT_SECURE) || !file_path(file, path, sizeof path))
        return NULL;
    return dlopen(path, RTLD_NOW | RTLD_LOCAL);
}

void cli_bench_preload(char **argv)
{
#ifndef NO_PRELOAD
    char path[PATH_MAX + 32];
    if (dlsym(RTLD_DEFAULT, "tsb_malloc_count_setup") || getauxval(AT_SECURE) ||
        getenv("TESSERA_BENCH_PRELOADED") || !module_path(path, sizeof path))
        return;
    const char *old = getenv("LD_PRELOAD");
    char *pre = malloc(strlen(path) + (old ? strlen(old) + 2 : 1));
    if (!pre)
        return;
    sprintf(pre, "%s%s%s", path, old && *old ? ":" : "", old && *old ? old : "");
    if (setenv("LD_PRELOAD", pre, 1) == 0 && setenv("TESSERA_BENCH_PRELOADED", "1", 1) == 0)
        execv("/proc/self/exe", argv);
    /* exec failed: run on without the counters */
    free(pre);
#else
    (void)argv;
#endif
}

typedef struct hooks {
    int (*setup)(const char *const *, int);
    void (*enable)(int);
    void (*read)(uint64_t *, uint64_t *);
    int (*threads)(uint64_t *);
    int (*sgemm)(int, int, int, int, int, const float *, int, const float *, int, float *, int,
                 int);
} hooks;

static const hooks *get(void)
{
    static hooks h;
    static int done;
    if (done)
        return &h;
    done = 1;
    void *lib = RTLD_DEFAULT, *own = NULL;
    if (!dlsym(RTLD_DEFAULT, "tsb_sgemm")) {
        /* Not preloaded (sanitizer builds, a setuid run): the BLAS baseline alone, by dlopen.
         * Its malloc and pthread_create then interpose nothing. */
        char path[PATH_MAX + 32];
        if (module_path(path, sizeof path))
            own = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!own)
            return &h;
        lib = own;
    }
    void *p;
#define GET(field, name)                                                                    \
    if ((p = dlsym(lib, name)))                                                             \
        memcpy(&h.field, &p, sizeof p);
    GET(sgemm, "tsb_sgemm")
    if (!own) {
        GET(setup, "tsb_malloc_count_setup")
        GET(enable, "tsb_malloc_count_enable")
        GET(read, "tsb_malloc_count_read")
        GET(threads, "tsb_thread_count_read")
    }
#undef GET
    return &h;
}

int cli_malloc_count_setup(const char *const *plugin_paths, int npaths)
{
    const hooks *h = get();
    return h->setup && h->enable && h->read ? h->setup(plugin_paths, npaths) : 0;
}

void cli_malloc_count_enable(int on)
{
    const hooks *h = get();
    if (h->enable)
        h->enable(on);
}

void cli_malloc_count_read(uint64_t *tessera, uint64_t *all)
{
    const hooks *h = get();
    *tessera = *all = 0;
    if (h->read)
        h->read(tessera, all);
}

int cli_thread_count_read(uint64_t *created)
{
    const hooks *h = get();
    *created = 0;
    return h->threads ? h->threads(created) : 0;
}

int cli_sgemm(int ta, int tb, int m, int n, int k, const float *a, int lda, const float *b,
              int ldb, float *c, int ldc, int threads)
{
    const hooks *h = get();
    return h->sgemm ? h->sgemm(ta, tb, m, n, k, a, lda, b, ldb, c, ldc, threads) : 0;
}

int cli_have_sgemm(void)
{
    const hooks *h = get();
    if (!h->sgemm)
        return 0;
    float one = 1, out = 0;
    return h->sgemm(0, 0, 1, 1, 1, &one, 1, &one, 1, &out, 1, 0) && out == 1;
}
