/* tools/bench_pool.c: `tessera bench pool`: the caching pool (core/pool.c) against glibc
 * malloc/free on one pre-generated sequence of alloc+free pairs: sizes drawn from a fixed
 * set of tensor-like shapes, log-uniform between 64 B and 64 MiB, with a working set of live
 * blocks freed in random order (not LIFO). The first half of the sequence warms up; the
 * second half is timed and counted. The memory handed out is never touched, on either side. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <tessera/tessera.h>

#include "bench_pool.h"

/* The pool component; exported for tests and this benchmark, declared in core/internal.h. */
extern const ts_pool_api ts__pool_api;

#define NSHAPES 48
#define MIN_BYTES 64.0
#define MAX_BYTES (64.0 * 1024 * 1024)

typedef struct raw_counter {
    uint64_t n_alloc;
} raw_counter;

static ts_status raw_alloc(void *user, size_t nbytes, void **ptr)
{
    raw_counter *c = user;
    if (posix_memalign(ptr, 64, nbytes) != 0)
        return TS_ENOMEM;
    c->n_alloc++;
    return TS_OK;
}

static void raw_free(void *user, void *ptr, size_t nbytes)
{
    (void)user;
    (void)nbytes;
    free(ptr);
}

/* xorshift64*: the same sequence on every machine. */
static uint64_t next_rand(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1Dull;
}

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static const char *fmt_bytes(double v, char *buf, size_t len)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    snprintf(buf, len, u ? "%.2f %s" : "%.0f %s", v, units[u]);
    return buf;
}

static int parse_u64(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || v == 0)
        return 0;
    *out = v;
    return 1;
}

#define USAGE                                                                              \
    "usage: tessera bench pool [--pairs N] [--working-set N] [--step N | --no-repeat] "        \
    "[--seed N] [--cache-limit BYTES] [--json]\n"

int cli_bench_pool(int argc, char **argv)
{
    uint64_t pairs = 200000, wset = 64, step = 1000, seed = 1;
    uint64_t cache_limit = UINT64_MAX; /* the steady state is the point; see docs/memory.md */
    int json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        uint64_t *dst = !strcmp(a, "--pairs") ? &pairs
                        : !strcmp(a, "--working-set") ? &wset
                        : !strcmp(a, "--seed") ? &seed
                        : !strcmp(a, "--step") ? &step
                        : !strcmp(a, "--cache-limit") ? &cache_limit
                                                      : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(USAGE, stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--no-repeat")) {
            step = 0;
        } else if (dst && i + 1 < argc && parse_u64(argv[i + 1], dst)) {
            i++;
        } else {
            fprintf(stderr, "tessera: error: bench pool: bad option '%s'\n%s", a, USAGE);
            return 2;
        }
    }

    /* The sequence: 2 * pairs (slot, size) pairs after filling the working set; a training
     * step of `step` pairs repeats (the same shapes in the same order), unless --no-repeat. */
    size_t shapes[NSHAPES];
    uint64_t rng = seed * 0x9E3779B97F4A7C15ull | 1;
    for (int k = 0; k < NSHAPES; k++) {
        /* 64 B * 2^(20 k / 47), the fraction of each octave linearised (no libm) */
        double e = 20.0 * k / (NSHAPES - 1);
        int ip = (int)e;
        double v = MIN_BYTES * (double)(1ull << ip) * (1.0 + (e - ip));
        shapes[k] = (size_t)v / 4 * 4 + 4 * (next_rand(&rng) % 16); /* not all round */
    }
    uint64_t nsteps = wset + 2 * pairs;
    uint32_t *slot = malloc(nsteps * sizeof *slot);
    size_t *size = malloc(nsteps * sizeof *size);
    void **live = calloc(wset, sizeof *live);
    if (!slot || !size || !live) {
        fprintf(stderr, "tessera: error: bench pool: out of memory for the sequence\n");
        free(slot);
        free(size);
        free(live);
        return 1;
    }
    for (uint64_t i = 0; i < nsteps; i++) {
        if (step && i >= wset + step) {
            slot[i] = slot[i - step];
            size[i] = size[i - step];
            continue;
        }
        slot[i] = i < wset ? (uint32_t)i : (uint32_t)(next_rand(&rng) % wset);
        size[i] = shapes[next_rand(&rng) % NSHAPES];
    }

    /* malloc/free */
    double t_malloc = 0;
    for (uint64_t i = 0; i < nsteps; i++) {
        if (i == wset + pairs)
            t_malloc = now_ns();
        free(live[slot[i]]);
        live[slot[i]] = malloc(size[i]);
    }
    t_malloc = now_ns() - t_malloc;
    for (uint64_t i = 0; i < wset; i++) {
        free(live[i]);
        live[i] = NULL;
    }

    /* the pool */
    raw_counter rc = {0};
    ts_raw_allocator raw = {.user = &rc, .alloc = raw_alloc, .free = raw_free};
    ts_pool_options o = {.struct_size = sizeof o, .name = "bench", .alignment = 64,
                         .reserve_limit = 0, .cache_limit = cache_limit, .caching = 1};
    ts_pool *pool = NULL;
    ts_status st = ts__pool_api.create(&o, &raw, &pool);
    if (st != TS_OK) {
        fprintf(stderr, "tessera: error: bench pool: %s\n", ts_last_error());
        goto fail;
    }
    double t_pool = 0;
    uint64_t raw_warmup = 0;
    for (uint64_t i = 0; i < nsteps; i++) {
        if (i == wset + pairs) {
            raw_warmup = rc.n_alloc;
            t_pool = now_ns();
        }
        ts__pool_api.free(pool, live[slot[i]]);
        st = ts__pool_api.alloc(pool, size[i], "bench", &live[slot[i]]);
        if (st != TS_OK) {
            fprintf(stderr, "tessera: error: bench pool: %s\n", ts_last_error());
            goto fail;
        }
    }
    t_pool = now_ns() - t_pool;
    uint64_t raw_steady = rc.n_alloc - raw_warmup;
    ts_memory_stats s = {.struct_size = sizeof s};
    ts__pool_api.stats(pool, &s);
    for (uint64_t i = 0; i < wset; i++)
        ts__pool_api.free(pool, live[i]);
    ts__pool_api.destroy(pool);
    pool = NULL;

    double ns_malloc = t_malloc / (double)pairs, ns_pool = t_pool / (double)pairs;
    double per1000 = 1000.0 * (double)raw_steady / (double)pairs;
    double ratio = s.peak_in_use ? (double)s.peak_reserved / (double)s.peak_in_use : 0;
    char climit[32] = "null";
    if (cache_limit != UINT64_MAX)
        snprintf(climit, sizeof climit, "%llu", (unsigned long long)cache_limit);
    if (json) {
        printf("{\"pairs\": %llu, \"working_set\": %llu, \"shapes\": %d, \"min_bytes\": %.0f, "
               "\"max_bytes\": %.0f, \"malloc_ns_per_pair\": %.1f, \"pool_ns_per_pair\": %.1f, "
               "\"speedup\": %.2f, \"raw_allocs_per_1000_pairs\": %.3f, "
               "\"warmup_raw_allocs\": %llu, \"peak_reserved\": %llu, \"peak_in_use\": %llu, "
               "\"reserved_over_peak_in_use\": %.3f, \"cache_limit\": %s}\n",
               (unsigned long long)pairs, (unsigned long long)wset, NSHAPES, MIN_BYTES,
               MAX_BYTES, ns_malloc, ns_pool, ns_malloc / ns_pool, per1000,
               (unsigned long long)raw_warmup, (unsigned long long)s.peak_reserved,
               (unsigned long long)s.peak_in_use, ratio, climit);
    } else {
        char b1[32], b2[32];
        printf("pool benchmark: %llu alloc+free pairs timed after %llu of warm-up; %d shapes "
               "from 64 B to 64 MiB (log-uniform), %llu live blocks\n",
               (unsigned long long)pairs, (unsigned long long)pairs, NSHAPES,
               (unsigned long long)wset);
        printf("  malloc/free     %10.1f ns per pair\n", ns_malloc);
        printf("  tessera pool    %10.1f ns per pair  (%.1fx faster)\n", ns_pool,
               ns_malloc / ns_pool);
        printf("  raw allocations %10.3f per 1000 pairs in steady state (%llu during warm-up)\n",
               per1000, (unsigned long long)raw_warmup);
        printf("  peak reserved   %s for a peak in use of %s (ratio %.3f)\n",
               fmt_bytes((double)s.peak_reserved, b1, sizeof b1),
               fmt_bytes((double)s.peak_in_use, b2, sizeof b2), ratio);
    }
    free(slot);
    free(size);
    free(live);
    return 0;

fail:
    ts__pool_api.destroy(pool); /* reports and returns what is still live */
    free(slot);
    free(size);
    free(live);
    return 1;
}
