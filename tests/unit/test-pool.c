/* tests/unit/test-pool.c: the caching pool component (core/pool.c) driven through
 * the pool (ts__pool_*) over a counting raw allocator that can fail its N-th call or act as a device
 * of fixed capacity, plus the memory.h observers (registry, hook, trace, leak report). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <cjson/cJSON.h>
#include <tessera/memory.h>

#include "internal.h"
#include "tap.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

/* ---- a counting raw allocator ------------------------------------------------------------ */

#define RAW_TRACKED 4096

typedef struct rawctl {
    pthread_mutex_t lock;
    size_t align;
    uint64_t calls;        /* alloc calls, failed ones included */
    uint64_t fail_at;      /* fail the fail_at-th call (1-based); 0: never */
    int failed;            /* the injected failure happened */
    uint64_t capacity;     /* a device this big: fail beyond it; 0: unlimited */
    uint64_t n_alloc, n_free, outstanding;
    size_t last_size;
    void *last_freed;
    void *ptrs[RAW_TRACKED];
    size_t sizes[RAW_TRACKED];
} rawctl;

static ts_status raw_alloc(void *user, size_t nbytes, void **ptr)
{
    rawctl *r = user;
    ts_status st = TS_OK;
    pthread_mutex_lock(&r->lock);
    r->calls++;
    CHECK_MSG(nbytes % r->align == 0, "raw alloc of %zu, not a multiple of %zu", nbytes,
              r->align);
    if (r->fail_at && r->calls == r->fail_at) {
        r->failed = 1;
        st = TS_ENOMEM;
    } else if (r->capacity && r->outstanding + nbytes > r->capacity) {
        st = TS_ENOMEM;
    } else if (posix_memalign(ptr, r->align < sizeof(void *) ? sizeof(void *) : r->align,
                              nbytes) != 0) {
        st = TS_ENOMEM;
    } else {
        int i = 0;
        while (i < RAW_TRACKED && r->ptrs[i])
            i++;
        CHECK(i < RAW_TRACKED);
        r->ptrs[i] = *ptr;
        r->sizes[i] = nbytes;
        r->n_alloc++;
        r->outstanding += nbytes;
        r->last_size = nbytes;
    }
    pthread_mutex_unlock(&r->lock);
    return st;
}

static void raw_free(void *user, void *ptr, size_t nbytes)
{
    rawctl *r = user;
    pthread_mutex_lock(&r->lock);
    int i = 0;
    while (i < RAW_TRACKED && r->ptrs[i] != ptr)
        i++;
    CHECK_MSG(i < RAW_TRACKED, "raw free of %p, never allocated", ptr);
    CHECK_MSG(r->sizes[i] == nbytes, "raw free of %p with %zu bytes, allocated with %zu", ptr,
              nbytes, r->sizes[i]);
    r->ptrs[i] = NULL;
    r->n_free++;
    r->outstanding -= nbytes;
    r->last_freed = ptr;
    free(ptr);
    pthread_mutex_unlock(&r->lock);
}

static rawctl *raw_new(size_t align)
{
    rawctl *r = calloc(1, sizeof *r);
    CHECK(r);
    pthread_mutex_init(&r->lock, NULL);
    r->align = align;
    return r;
}

static ts_pool *pool_new_ex(const char *name, rawctl *r, uint64_t reserve_limit,
                            uint64_t cache_limit, int caching)
{
    ts_pool_options o = {.name = name, .alignment = r->align,
                         .reserve_limit = reserve_limit, .cache_limit = cache_limit,
                         .caching = caching};
    ts_raw_allocator ra = {.user = r, .alloc = raw_alloc, .free = raw_free};
    ts_pool *p = NULL;
    CHECK_OK(ts__pool_create(&o, &ra, &p));
    CHECK(p);
    return p;
}

static ts_pool *pool_new(rawctl *r)
{
    return pool_new_ex("test", r, 0, (uint64_t)1 << 40, 1);
}

static ts_memory_stats stats(ts_pool *p)
{
    ts_memory_stats s;
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    ts__pool_stats(p, &s);
    return s;
}

/* The invariants every state must satisfy. */
static void check_balance(ts_pool *p)
{
    ts_memory_stats s = stats(p);
    CHECK_INT_EQ(s.valid, TS_STATS_POOL);
    CHECK_INT_EQ(s.n_alloc - s.n_free, s.live_blocks);
    CHECK(s.in_use <= s.reserved);
    CHECK(s.requested <= s.in_use);
    CHECK_INT_EQ(s.cached, s.reserved - s.in_use);
    CHECK(s.largest_free <= s.cached);
    CHECK(s.peak_in_use >= s.in_use);
    CHECK(s.peak_reserved >= s.reserved);
    CHECK(s.n_raw_alloc >= s.n_raw_free);
    CHECK_INT_EQ(s.cache_hits + s.cache_misses, s.n_alloc + s.n_oom);
}

/* Every test ends here: no live block, and every raw allocation given back. */
static void finish(ts_pool *p, rawctl *r)
{
    check_balance(p);
    CHECK_INT_EQ(stats(p).live_blocks, 0);
    CHECK_INT_EQ(ts_memory_live_count(), 0);
    ts__pool_destroy(p);
    CHECK_INT_EQ(r->n_alloc, r->n_free);
    CHECK_INT_EQ(r->outstanding, 0);
    free(r);
}

static void *xalloc(ts_pool *p, size_t n, const char *tag)
{
    void *ptr = NULL;
    CHECK_OK(ts__pool_alloc(p, n, tag, &ptr));
    CHECK(ptr);
    return ptr;
}

/* ---- size classes, reuse, alignment -------------------------------------------------------- */

static void test_round_and_reuse(void)
{
    rawctl *r = raw_new(64);
    ts_pool *p = pool_new(r);
    void *a = xalloc(p, 1000, "a");
    ts_memory_stats s = stats(p);
    CHECK_INT_EQ(s.in_use, 1024);
    CHECK_INT_EQ(s.requested, 1000);
    CHECK_INT_EQ(s.reserved, 2 * MIB);
    ts__pool_free(p, a);
    for (size_t n = 961; n <= 1024; n += 7) {
        void *b = xalloc(p, n, "b");
        CHECK_MSG(b == a, "alloc of %zu after free gave %p, not %p", n, b, a);
        CHECK_INT_EQ(stats(p).in_use, 1024);
        ts__pool_free(p, b);
    }
    CHECK_INT_EQ(stats(p).n_raw_alloc, 1);
    finish(p, r);
}

static void test_steady_state_no_raw_allocs(void)
{
    static const size_t shapes[] = {64, 4096, 100000, 300 * KIB, MIB, 3 * MIB + 5, 16 * MIB,
                                    7000, 48 * MIB, 512};
    const size_t n = sizeof shapes / sizeof shapes[0];
    rawctl *r = raw_new(64);
    ts_pool *p = pool_new(r);
    void *v[10];
    uint64_t raw_after_warmup = 0;
    for (int step = 0; step < 50; step++) {
        /* forward: activations in order; backward: freed in reverse, with one kept across */
        for (size_t i = 0; i < n; i++)
            v[i] = xalloc(p, shapes[(i + (size_t)step % 2) % n], "step");
        for (size_t i = n; i-- > 0;)
            ts__pool_free(p, v[i]);
        if (step == 2)
            raw_after_warmup = stats(p).n_raw_alloc;
        check_balance(p);
    }
    ts_memory_stats s = stats(p);
    CHECK_MSG(s.n_raw_alloc == raw_after_warmup, "%llu raw allocations after warm-up",
              (unsigned long long)(s.n_raw_alloc - raw_after_warmup));
    CHECK(s.cache_hits >= 47 * n);
    finish(p, r);
}

static void test_alignment(void)
{
    static const size_t aligns[] = {64, 256, 4096};
    for (size_t k = 0; k < 3; k++) {
        rawctl *r = raw_new(aligns[k]);
        ts_pool *p = pool_new(r);
        void *v[200];
        unsigned seed = 7;
        for (int i = 0; i < 200; i++) {
            size_t n = (size_t)rand_r(&seed) % (i % 10 == 0 ? 5 * MIB : 5000);
            v[i] = xalloc(p, n, "align");
            CHECK_MSG((uintptr_t)v[i] % aligns[k] == 0, "%p not aligned to %zu", v[i],
                      aligns[k]);
            memset(v[i], i & 0xff, n);
        }
        for (int i = 0; i < 200; i += 2)
            ts__pool_free(p, v[i]);
        for (int i = 0; i < 200; i += 2) {
            v[i] = xalloc(p, (size_t)i * 13, "align2");
            CHECK((uintptr_t)v[i] % aligns[k] == 0);
        }
        for (int i = 0; i < 200; i++)
            ts__pool_free(p, v[i]);
        finish(p, r);
    }
}

static void test_zero_bytes(void)
{
    rawctl *r = raw_new(64);
    ts_pool *p = pool_new(r);
    void *a = xalloc(p, 0, "zero"), *b = xalloc(p, 0, "zero");
    CHECK(a != b);
    CHECK_INT_EQ(stats(p).live_blocks, 2);
    CHECK_INT_EQ(stats(p).requested, 0);
    CHECK(stats(p).in_use >= 2 * 16);
    ts__pool_free(p, a);
    ts__pool_free(p, b);
    ts__pool_free(p, NULL); /* a no-op */
    finish(p, r);
}

/* ---- split and coalesce ------------------------------------------------------------------- */

static void test_split_coalesce(void)
{
    static const int orders[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2},
                                     {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
    rawctl *r = raw_new(64);
    ts_pool *p = pool_new(r);
    char *first[3] = {0};
    for (int k = 0; k < 6; k++) {
        char *v[3];
        for (int i = 0; i < 3; i++)
            v[i] = xalloc(p, 256 * KIB, "third");
        CHECK(v[1] == v[0] + 256 * KIB && v[2] == v[1] + 256 * KIB);
        if (k == 0)
            memcpy(first, v, sizeof v);
        for (int i = 0; i < 3; i++)
            CHECK_MSG(v[i] == first[i], "order %d: block %d moved", k, i);
        for (int i = 0; i < 3; i++) {
            ts__pool_free(p, v[orders[k][i]]);
            check_balance(p);
        }
        ts_memory_stats s = stats(p);
        CHECK_MSG(s.largest_free == 2 * MIB, "order %d: largest free %llu, not one segment", k,
                  (unsigned long long)s.largest_free);
        CHECK_INT_EQ(s.n_raw_alloc, 1);
    }
    /* best fit: a hole of exactly the size is preferred to the segment's tail */
    char *a = xalloc(p, 256 * KIB, "a"), *b = xalloc(p, 256 * KIB, "b"),
         *c = xalloc(p, 256 * KIB, "c");
    ts__pool_free(p, b);
    char *d = xalloc(p, 200 * KIB, "d");
    CHECK(d == b);
    ts__pool_free(p, a);
    ts__pool_free(p, c);
    ts__pool_free(p, d);
    CHECK_INT_EQ(stats(p).largest_free, 2 * MIB);
    finish(p, r);
}

static void test_large_block_serves_smaller(void)
{
    rawctl *r = raw_new(256);
    ts_pool *p = pool_new(r);
    char *big = xalloc(p, 64 * MIB, "big");
    ts__pool_free(p, big);
    char *a = xalloc(p, 12 * MIB, "a"), *b = xalloc(p, 16 * MIB, "b");
    CHECK(a == big && b == big + 12 * MIB);
    CHECK_INT_EQ(stats(p).n_raw_alloc, 1);
    CHECK_INT_EQ(stats(p).largest_free, 36 * MIB);
    /* small and medium requests never carve large segments */
    void *s = xalloc(p, 4 * KIB, "small");
    CHECK((char *)s < big || (char *)s >= big + 64 * MIB);
    CHECK_INT_EQ(stats(p).n_raw_alloc, 2);
    char *m = xalloc(p, 4 * MIB, "medium");
    CHECK(m < big || m >= big + 64 * MIB);
    CHECK_INT_EQ(stats(p).n_raw_alloc, 3);
    ts__pool_free(p, a);
    ts__pool_free(p, b);
    ts__pool_free(p, s);
    ts__pool_free(p, m);
    CHECK_INT_EQ(stats(p).largest_free, 64 * MIB);
    finish(p, r);
}

static void test_huge_block_not_split_for_small_request(void)
{
    rawctl *r = raw_new(256);
    ts_pool *p = pool_new(r);
    char *huge = xalloc(p, 256 * MIB, "huge");
    ts__pool_free(p, huge);
    char *a = xalloc(p, 4 * MIB, "a");
    CHECK(a < huge || a >= huge + 256 * MIB);
    CHECK_INT_EQ(stats(p).n_raw_alloc, 2);
    char *b = xalloc(p, 240 * MIB, "near fit");
    CHECK(b == huge);
    CHECK_INT_EQ(stats(p).n_raw_alloc, 2);
    ts__pool_free(p, a);
    ts__pool_free(p, b);
    finish(p, r);
}

static void test_medium_blocks_share_a_segment(void)
{
    rawctl *r = raw_new(256);
    ts_pool *p = pool_new(r);
    char *a = xalloc(p, 3 * MIB, "a"), *b = xalloc(p, 5 * MIB, "b"), *c = xalloc(p, 9 * MIB, "c");
    CHECK(b == a + 3 * MIB && c == b + 5 * MIB);
    ts_memory_stats s = stats(p);
    CHECK_INT_EQ(s.n_raw_alloc, 1);
    CHECK_INT_EQ(s.reserved, 20 * MIB);
    CHECK_INT_EQ(r->last_size, 20 * MIB);
    ts__pool_free(p, b);
    ts__pool_free(p, a);
    ts__pool_free(p, c);
    CHECK_INT_EQ(stats(p).largest_free, 20 * MIB);
    /* a 20 MiB segment never serves a large (> 10 MiB) request */
    char *d = xalloc(p, 11 * MIB, "large");
    CHECK(d < a || d >= a + 20 * MIB);
    CHECK_INT_EQ(stats(p).n_raw_alloc, 2);
    ts__pool_free(p, d);
    finish(p, r);
}

static void test_large_segments_are_interchangeable(void)
{
    rawctl *r = raw_new(256);
    ts_pool *p = pool_new(r);
    /* a large request gets a segment of at least 64 MiB ... */
    char *a = xalloc(p, 20 * MIB, "a");
    CHECK_INT_EQ(r->last_size, 64 * MIB);
    ts__pool_free(p, a);
    /* ... so that, once free, it hosts any other large request up to 64 MiB */
    char *b = xalloc(p, 60 * MIB, "b");
    CHECK(b == a);
    CHECK_INT_EQ(stats(p).n_raw_alloc, 1);
    ts__pool_free(p, b);
    /* above 64 MiB: rounded to 2 MiB only */
    char *c = xalloc(p, 65 * MIB, "c");
    CHECK_INT_EQ(r->last_size, 66 * MIB);
    ts__pool_free(p, c);
    ts__pool_empty_cache(p);
    /* near reserve_limit, or when the device lacks room, the exact rounded size */
    CHECK_OK(ts__pool_set_limits(p, 40 * MIB, (uint64_t)1 << 40));
    char *d = xalloc(p, 30 * MIB, "d");
    CHECK_INT_EQ(r->last_size, 30 * MIB);
    ts__pool_free(p, d);
    ts__pool_empty_cache(p);
    CHECK_OK(ts__pool_set_limits(p, 0, (uint64_t)1 << 40));
    r->capacity = 32 * MIB;
    char *e = xalloc(p, 30 * MIB, "e");
    CHECK_INT_EQ(r->last_size, 30 * MIB);
    ts__pool_free(p, e);
    finish(p, r);
}

/* ---- limits -------------------------------------------------------------------------------- */

static void test_cache_limit_after_burst(void)
{
    rawctl *r = raw_new(64);
    ts_pool *p = pool_new_ex("test", r, 0, 8 * MIB, 1);
    void *v[200];
    for (int i = 0; i < 20; i++)
        v[i] = xalloc(p, 3 * MIB, "burst");
    CHECK(stats(p).reserved >= 60 * MIB);
    for (int i = 0; i < 20; i++)
        ts__pool_free(p, v[i]);
    ts_memory_stats s = stats(p);
    CHECK_MSG(s.cached <= 8 * MIB, "cached %llu", (unsigned long long)s.cached);
    /* A 20 MiB medium segment would not fit the 8 MiB budget of shared segments: each block
     * got its own 3 MiB segment, and all but what the limit keeps went back. */
    CHECK_MSG(s.reserved <= 8 * MIB, "reserved %llu", (unsigned long long)s.reserved);
    CHECK(s.n_raw_free >= 18);
    for (int i = 0; i < 200; i++)
        v[i] = xalloc(p, 100 * KIB, "small burst");
    for (int i = 0; i < 200; i++)
        ts__pool_free(p, v[i]);
    CHECK(stats(p).cached <= 8 * MIB);
    finish(p, r);
}

static void test_cache_limit_largest_oldest_first(void)
{
    rawctl *r = raw_new(64);
    /* large requests over 64 MiB: one segment each, of exactly their size */
    ts_pool *p = pool_new_ex("test", r, 0, 140 * MIB, 1);
    void *a = xalloc(p, 66 * MIB, "66"), *b = xalloc(p, 68 * MIB, "68"),
         *c = xalloc(p, 70 * MIB, "70");
    ts__pool_free(p, a);
    ts__pool_free(p, b);
    CHECK_INT_EQ(stats(p).n_raw_free, 0);
    ts__pool_free(p, c);
    CHECK_INT_EQ(stats(p).n_raw_free, 1);
    CHECK(r->last_freed == c); /* the largest */
    CHECK_INT_EQ(stats(p).reserved, 134 * MIB);
    ts__pool_empty_cache(p);
    CHECK_INT_EQ(stats(p).reserved, 0);

    CHECK_OK(ts__pool_set_limits(p, 0, 136 * MIB));
    void *x = xalloc(p, 68 * MIB, "x"), *y = xalloc(p, 68 * MIB, "y"),
         *z = xalloc(p, 68 * MIB, "z");
    ts__pool_free(p, z);
    ts__pool_free(p, y);
    ts__pool_free(p, x);
    CHECK(r->last_freed == x); /* same sizes: the oldest */
    CHECK_INT_EQ(stats(p).reserved, 136 * MIB);
    finish(p, r);
}

static void test_reserve_limit(void)
{
    rawctl *r = raw_new(64);
    ts_pool *p = pool_new_ex("test", r, 16 * MIB, (uint64_t)1 << 40, 1);
    void *v[4], *extra = (void *)1;
    for (int i = 0; i < 4; i++)
        v[i] = xalloc(p, 4 * MIB, "quarter");
    CHECK_FAILS(ts__pool_alloc(p, 4 * MIB, "fifth", &extra), TS_ENOMEM, "pool 'test'",
                "out of memory allocating 4.00 MiB", "16.00 MiB in use", "16.00 MiB reserved",
                "largest free block 0 B", "limit 16.00 MiB", "memory_fraction", "cache_limit",
                "[plugin.test]");
    CHECK(extra == NULL);
    CHECK_INT_EQ(stats(p).n_oom, 1);
    CHECK_INT_EQ(stats(p).reserved, 16 * MIB);
    check_balance(p);
    ts__pool_free(p, v[3]);
    v[3] = xalloc(p, 4 * MIB, "retry");
    CHECK_FAILS(ts__pool_alloc(p, 32 * MIB, "too big", &extra), TS_ENOMEM,
                "allocating 32.00 MiB");
    for (int i = 0; i < 4; i++)
        ts__pool_free(p, v[i]);
    ts__pool_empty_cache(p);
    /* a large request whose 2 MiB rounding alone would cross the limit still fits */
    CHECK_OK(ts__pool_set_limits(p, 5 * MIB, (uint64_t)1 << 40));
    void *w = xalloc(p, 4 * MIB + 512 * KIB, "squeezed");
    CHECK_INT_EQ(stats(p).reserved, 4 * MIB + 512 * KIB);
    ts__pool_free(p, w);
    CHECK_INT_EQ(stats(p).n_oom, 2);
    finish(p, r);
}

static void test_oom_releases_cache_and_retries(void)
{
    rawctl *r = raw_new(64);
    ts_pool *p = pool_new_ex("test", r, 16 * MIB, (uint64_t)1 << 40, 1);
    void *a = xalloc(p, 6 * MIB, "a"), *b = xalloc(p, 6 * MIB, "b");
    ts__pool_free(p, a);
    ts__pool_free(p, b);
    CHECK_INT_EQ(stats(p).cached, 12 * MIB);
    void *c = xalloc(p, 10 * MIB, "needs the cache back");
    ts_memory_stats s = stats(p);
    CHECK_INT_EQ(s.n_raw_free, 2);
    CHECK_INT_EQ(s.n_oom, 0);
    CHECK_INT_EQ(s.reserved, 10 * MIB);
    ts__pool_free(p, c);
    finish(p, r);
}

static void test_device_full_releases_cache(void)
{
    rawctl *r = raw_new(64);
    r->capacity = 10 * MIB;
    ts_pool *p = pool_new(r);
    void *a = xalloc(p, 6 * MIB, "a");
    ts__pool_free(p, a);
    void *b = xalloc(p, 8 * MIB, "b"); /* the device lacks room until the cache goes */
    CHECK_INT_EQ(stats(p).n_raw_free, 1);
    void *c = (void *)1;
    CHECK_FAILS(ts__pool_alloc(p, 4 * MIB, "c", &c), TS_ENOMEM, "pool 'test'",
                "allocating 4.00 MiB", "8.00 MiB in use", "no limit", "device allocator failed",
                "cache_limit", "memory_fraction");
    CHECK(c == NULL);
    ts__pool_free(p, b);
    c = xalloc(p, 4 * MIB, "c again");
    ts__pool_free(p, c);
    finish(p, r);
}

/* ---- fault injection ---------------------------------------------------------------------- */

/* About 30 allocations and frees of mixed sizes (each step toggles a slot: allocated if
 * empty, freed if not); returns how many allocations failed. */
static int scenario(ts_pool *p)
{
    static const size_t sizes[] = {100, 3 * MIB, 200 * KIB, 12 * MIB, 64,
                                   MIB, 70 * MIB, 0, 700 * KIB, 2 * MIB + 1};
    static const int steps[] = {0, 3, 6, 0, 9, 2, 3, 5, 8, 6, 1, 4, 0, 7, 9,
                                2, 5, 3, 8, 1, 6, 3, 9, 1, 5, 6, 8, 0, 2, 4};
    void *v[10] = {0};
    int fails = 0;
    for (size_t k = 0; k < sizeof steps / sizeof steps[0]; k++) {
        int j = steps[k];
        if (k == 15)
            ts__pool_empty_cache(p);
        if (v[j]) {
            ts__pool_free(p, v[j]);
            v[j] = NULL;
            continue;
        }
        ts_status s = ts__pool_alloc(p, sizes[j], "scenario", &v[j]);
        if (s != TS_OK) {
            CHECK_INT_EQ(s, TS_ENOMEM);
            CHECK(v[j] == NULL);
            CHECK_STR_CONTAINS(ts_last_error(), "out of memory allocating");
            fails++;
        }
        check_balance(p);
    }
    for (int j = 0; j < 10; j++)
        ts__pool_free(p, v[j]);
    return fails;
}

static void test_raw_failure_at_every_call(void)
{
    rawctl *r = raw_new(64);
    ts_pool *p = pool_new_ex("test", r, 0, 0, 1);
    CHECK_INT_EQ(scenario(p), 0);
    uint64_t total = r->calls;
    printf("# scenario: %llu raw allocator calls\n", (unsigned long long)total);
    CHECK(total >= 8);
    finish(p, r);
    int surfaced = 0;
    for (uint64_t n = 1; n <= total; n++) {
        r = raw_new(64);
        r->fail_at = n;
        p = pool_new_ex("test", r, 0, 0, 1);
        surfaced += scenario(p);
        CHECK_MSG(r->failed, "call %llu was never made", (unsigned long long)n);
        /* usable afterwards */
        void *x = xalloc(p, 1000, "after");
        void *y = xalloc(p, 3 * MIB, "after");
        ts__pool_free(p, x);
        ts__pool_free(p, y);
        finish(p, r);
    }
    CHECK(surfaced > 0); /* some failures reached the caller (others the retry absorbed) */
}

static void test_caching_off(void)
{
    rawctl *r = raw_new(64);
    ts_pool *p = pool_new_ex("test", r, 0, (uint64_t)1 << 40, 0);
    void *a = xalloc(p, 100, "exact");
    CHECK_INT_EQ(r->last_size, 128);
    CHECK_INT_EQ(stats(p).in_use, 128);
    CHECK_INT_EQ(stats(p).reserved, 128);
    ts__pool_free(p, a);
    CHECK_INT_EQ(r->n_free, 1);
    CHECK_INT_EQ(stats(p).reserved, 0);
    for (int i = 0; i < 10; i++) {
        void *b = xalloc(p, 100, "again");
        ts__pool_free(p, b);
    }
    void *c = xalloc(p, 3 * MIB + 5, "large");
    CHECK_INT_EQ(r->last_size, 3 * MIB + 512);
    ts_memory_stats s = stats(p);
    CHECK_INT_EQ(s.n_raw_alloc, 12);
    CHECK_INT_EQ(s.n_raw_free, 11);
    CHECK_INT_EQ(s.cache_hits, 0);
    CHECK_INT_EQ(s.n_alloc, 12);
    CHECK_INT_EQ(s.requested, 3 * MIB + 5);
    ts__pool_free(p, c);
    finish(p, r);
}

/* ---- statistics --------------------------------------------------------------------------- */

static void test_stats_honour_struct_size(void)
{
    rawctl *r = raw_new(64);
    ts_pool *p = pool_new_ex("test", r, 100 * MIB, 50 * MIB, 1);
    void *a = xalloc(p, 5000, "s");
    union {
        ts_memory_stats s;
        unsigned char bytes[sizeof(ts_memory_stats)];
    } u;
    memset(&u, 0xab, sizeof u);
    u.s.struct_size = (uint32_t)offsetof(ts_memory_stats, reserved);
    ts__pool_stats(p, &u.s);
    CHECK_INT_EQ(u.s.struct_size, offsetof(ts_memory_stats, reserved));
    CHECK_INT_EQ(u.s.valid, TS_STATS_POOL);
    CHECK_INT_EQ(u.s.in_use, 5056);
    CHECK_INT_EQ(u.s.requested, 5000);
    for (size_t i = offsetof(ts_memory_stats, reserved); i < sizeof u; i++)
        CHECK_MSG(u.bytes[i] == 0xab, "byte %zu beyond struct_size was written", i);
    ts_memory_stats s = stats(p);
    CHECK_INT_EQ(s.reserve_limit, 100 * MIB);
    CHECK_INT_EQ(s.cache_limit, 50 * MIB);
    CHECK_INT_EQ(s.reserved, 2 * MIB);
    CHECK_INT_EQ(s.largest_free, 2 * MIB - 5056);
    CHECK_INT_EQ(s.live_blocks, 1);
    CHECK_INT_EQ(s.n_raw_alloc, 1);
    CHECK_INT_EQ(s.cache_misses, 1);
    ts__pool_free(p, a);
    finish(p, r);
}

static void test_peaks_and_reset(void)
{
    rawctl *r = raw_new(64);
    ts_pool *p = pool_new(r);
    void *a = xalloc(p, 66 * MIB, "a"), *b = xalloc(p, 66 * MIB, "b");
    ts__pool_free(p, a);
    ts__pool_empty_cache(p);
    ts_memory_stats s = stats(p);
    CHECK_INT_EQ(s.peak_in_use, 132 * MIB);
    CHECK_INT_EQ(s.peak_reserved, 132 * MIB);
    CHECK_INT_EQ(s.in_use, 66 * MIB);
    ts__pool_reset_peak(p);
    s = stats(p);
    CHECK_INT_EQ(s.peak_in_use, 66 * MIB);
    CHECK_INT_EQ(s.peak_reserved, 66 * MIB);
    ts__pool_free(p, b);
    finish(p, r);
}

static void test_empty_cache_keeps_used_segments(void)
{
    rawctl *r = raw_new(64);
    ts_pool *p = pool_new(r);
    void *small = xalloc(p, 64, "pins a small segment");
    void *big = xalloc(p, 4 * MIB, "big");
    ts__pool_free(p, big);
    ts__pool_empty_cache(p);
    ts_memory_stats s = stats(p);
    CHECK_INT_EQ(s.reserved, 2 * MIB);
    CHECK_INT_EQ(s.n_raw_free, 1);
    ts__pool_free(p, small);
    ts__pool_empty_cache(p);
    CHECK_INT_EQ(stats(p).reserved, 0);
    finish(p, r);
}

static void test_set_limits_trims_cache(void)
{
    rawctl *r = raw_new(64);
    ts_pool *p = pool_new(r);
    void *v[5];
    for (int i = 0; i < 5; i++)
        v[i] = xalloc(p, 66 * MIB, "v");
    for (int i = 0; i < 5; i++)
        ts__pool_free(p, v[i]);
    CHECK_INT_EQ(stats(p).reserved, 330 * MIB);
    CHECK_OK(ts__pool_set_limits(p, 200 * MIB, 66 * MIB));
    CHECK_INT_EQ(stats(p).reserved, 66 * MIB);
    CHECK_INT_EQ(stats(p).reserve_limit, 200 * MIB);
    void *a = xalloc(p, 130 * MIB, "a"), *b = NULL;
    CHECK_FAILS(ts__pool_alloc(p, 72 * MIB, "b", &b), TS_ENOMEM, "limit 200.00 MiB");
    ts__pool_free(p, a);
    finish(p, r);
}

/* ---- threads ------------------------------------------------------------------------------- */

typedef struct stress_arg {
    ts_pool *pool;
    unsigned seed;
    int ops;
} stress_arg;

/* Small blocks are filled whole; big ones at both ends (cheap, and catches overlaps). */
static void stamp(unsigned char *q, size_t n, uint32_t key)
{
    if (n <= 512) {
        for (size_t i = 0; i < n; i++)
            q[i] = (unsigned char)(key + i);
        return;
    }
    for (size_t i = 0; i < 256; i++) {
        q[i] = (unsigned char)(key + i);
        q[n - 1 - i] = (unsigned char)(key ^ i);
    }
}

static int stamped(const unsigned char *q, size_t n, uint32_t key)
{
    if (n <= 512) {
        for (size_t i = 0; i < n; i++)
            if (q[i] != (unsigned char)(key + i))
                return 0;
        return 1;
    }
    for (size_t i = 0; i < 256; i++)
        if (q[i] != (unsigned char)(key + i) || q[n - 1 - i] != (unsigned char)(key ^ i))
            return 0;
    return 1;
}

static void *stress_thread(void *arg)
{
    stress_arg *a = arg;
    enum { SLOTS = 64 };
    unsigned char *ptr[SLOTS] = {0};
    size_t len[SLOTS];
    uint32_t key[SLOTS];
    for (int op = 0; op < a->ops; op++) {
        int i = rand_r(&a->seed) % SLOTS;
        if (ptr[i]) {
            CHECK_MSG(stamped(ptr[i], len[i], key[i]), "block %p (%zu bytes) was overwritten",
                      (void *)ptr[i], len[i]);
            ts__pool_free(a->pool, ptr[i]);
            ptr[i] = NULL;
            continue;
        }
        int r = rand_r(&a->seed);
        len[i] = r % 50 == 0 ? (size_t)r % (4 * MIB) : (size_t)r % (64 * KIB);
        key[i] = (uint32_t)rand_r(&a->seed);
        CHECK_OK(ts__pool_alloc(a->pool, len[i], "stress", (void **)&ptr[i]));
        stamp(ptr[i], len[i], key[i]);
    }
    for (int i = 0; i < SLOTS; i++)
        if (ptr[i]) {
            CHECK(stamped(ptr[i], len[i], key[i]));
            ts__pool_free(a->pool, ptr[i]);
        }
    return NULL;
}

static void test_threads_stress(void)
{
    const char *env = getenv("TS_POOL_STRESS_OPS");
    int ops = env && *env ? atoi(env) : 20000;
    rawctl *r = raw_new(64);
    ts_pool *p = pool_new_ex("test", r, 0, 64 * MIB, 1);
    pthread_t t[4];
    stress_arg a[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (stress_arg){.pool = p, .seed = 1234u + (unsigned)i, .ops = ops};
        CHECK(pthread_create(&t[i], NULL, stress_thread, &a[i]) == 0);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    ts_memory_stats s = stats(p);
    CHECK(s.n_alloc >= (uint64_t)ops); /* about half the ops of each thread are allocations */
    CHECK(s.cache_hits > s.cache_misses);
    CHECK_INT_EQ(s.in_use, 0);
    finish(p, r);
}

/* ---- the expandable segment (ts_raw_vm) ------------------------------------------------------ */

#define VM_GRAN (2 * MIB)
#define VM_MAX_GRANULES 1024

/* A vm over mmap that checks the pool's calls: commits and decommits inside the reservation,
 * granule-aligned, never twice; it can fail its N-th commit, refuse to reserve, or act as a
 * device of fixed capacity. */
typedef struct vmctl {
    pthread_mutex_t lock;
    uintptr_t base;
    size_t span;
    unsigned char state[VM_MAX_GRANULES]; /* 1: committed */
    uint64_t reserves, releases, commits, decommits, commit_calls;
    uint64_t commit_fail_at; /* fail the N-th commit call (1-based); 0: never */
    int refuse_reserve;
    uint64_t capacity; /* committed bytes allowed; 0: unlimited */
    uint64_t committed;
} vmctl;

static ts_status vm_reserve(void *user, size_t nbytes, void **base)
{
    vmctl *v = user;
    if (v->refuse_reserve)
        return TS_ENOMEM;
    CHECK_MSG(!v->base, "a second reservation while the first is held");
    CHECK(nbytes % VM_GRAN == 0 && nbytes / VM_GRAN <= VM_MAX_GRANULES);
    void *p = mmap(NULL, nbytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    CHECK(p != MAP_FAILED);
    v->base = (uintptr_t)p;
    v->span = nbytes;
    v->reserves++;
    *base = p;
    return TS_OK;
}

static void vm_release(void *user, void *base, size_t nbytes)
{
    vmctl *v = user;
    CHECK(v->base == (uintptr_t)base && v->span == nbytes);
    munmap(base, nbytes);
    memset(v->state, 0, sizeof v->state);
    v->base = 0;
    v->committed = 0;
    v->releases++;
}

static int vm_range(vmctl *v, void *addr, size_t nbytes, size_t *g0, size_t *g1)
{
    uintptr_t a = (uintptr_t)addr;
    if (!v->base || a < v->base || a % VM_GRAN || nbytes % VM_GRAN || !nbytes ||
        a + nbytes > v->base + v->span)
        return 0;
    *g0 = (a - v->base) / VM_GRAN;
    *g1 = *g0 + nbytes / VM_GRAN;
    return 1;
}

static ts_status vm_commit(void *user, void *addr, size_t nbytes)
{
    vmctl *v = user;
    size_t g0, g1;
    pthread_mutex_lock(&v->lock);
    v->commit_calls++;
    CHECK_MSG(vm_range(v, addr, nbytes, &g0, &g1), "commit of %zu at %p: outside or unaligned",
              nbytes, addr);
    ts_status st = TS_OK;
    if (v->commit_fail_at && v->commit_calls == v->commit_fail_at)
        st = TS_ENOMEM;
    else if (v->capacity && v->committed + nbytes > v->capacity)
        st = TS_ENOMEM;
    if (st == TS_OK) {
        for (size_t g = g0; g < g1; g++) {
            CHECK_MSG(!v->state[g], "granule %zu committed twice", g);
            v->state[g] = 1;
        }
        CHECK(mmap(addr, nbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
                   -1, 0) != MAP_FAILED);
        v->committed += nbytes;
        v->commits++;
    }
    pthread_mutex_unlock(&v->lock);
    return st;
}

static void vm_decommit(void *user, void *addr, size_t nbytes)
{
    vmctl *v = user;
    size_t g0, g1;
    pthread_mutex_lock(&v->lock);
    CHECK(vm_range(v, addr, nbytes, &g0, &g1));
    for (size_t g = g0; g < g1; g++) {
        CHECK_MSG(v->state[g], "granule %zu decommitted but not committed", g);
        v->state[g] = 0;
    }
    mmap(addr, nbytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    v->committed -= nbytes;
    v->decommits++;
    pthread_mutex_unlock(&v->lock);
}

static vmctl *vm_new(void)
{
    vmctl *v = calloc(1, sizeof *v);
    CHECK(v);
    pthread_mutex_init(&v->lock, NULL);
    return v;
}

static ts_pool *vm_pool(rawctl *r, vmctl *v, uint64_t reserve_limit, uint64_t cache_limit)
{
    ts_raw_vm vm = {.user = v, .granularity = VM_GRAN,
                    .max_reserve = 512 * MIB, .reserve = vm_reserve, .release = vm_release,
                    .commit = vm_commit, .decommit = vm_decommit};
    ts_pool_options o = {.name = "test", .alignment = r->align,
                         .reserve_limit = reserve_limit, .cache_limit = cache_limit,
                         .caching = 1, .vm = &vm};
    ts_raw_allocator ra = {.user = r, .alloc = raw_alloc, .free = raw_free};
    ts_pool *p = NULL;
    CHECK_OK(ts__pool_create(&o, &ra, &p));
    return p;
}

/* Every byte of [ptr, ptr + n) lies in committed granules of the reservation. */
static int vm_backed(vmctl *v, const void *ptr, size_t n)
{
    uintptr_t a = (uintptr_t)ptr;
    if (a < v->base || a + n > v->base + v->span)
        return 0;
    for (size_t g = (a - v->base) / VM_GRAN; g <= (a + n - 1 - v->base) / VM_GRAN; g++)
        if (!v->state[g])
            return 0;
    return 1;
}

static void vm_finish(ts_pool *p, rawctl *r, vmctl *v)
{
    finish(p, r);
    CHECK_INT_EQ(v->reserves, v->releases);
    CHECK_INT_EQ(v->committed, 0);
    free(v);
}

static void test_vm_blocks_share_one_range(void)
{
    rawctl *r = raw_new(64);
    vmctl *v = vm_new();
    ts_pool *p = vm_pool(r, v, 0, (uint64_t)1 << 40);
    char *a = xalloc(p, 3 * MIB, "a"), *b = xalloc(p, 5 * MIB, "b"), *c = xalloc(p, 12 * MIB, "c");
    CHECK_INT_EQ(v->reserves, 1);
    CHECK(vm_backed(v, a, 3 * MIB) && vm_backed(v, b, 5 * MIB) && vm_backed(v, c, 12 * MIB));
    CHECK(b == a + 3 * MIB && c == b + 5 * MIB); /* one range, packed like a stack */
    CHECK_INT_EQ(stats(p).reserved, 20 * MIB);
    CHECK_INT_EQ(r->n_alloc, 0); /* nothing over 1 MiB came from the plain raw allocator */
    void *small = xalloc(p, 1000, "small"); /* small blocks keep their own segments */
    CHECK_INT_EQ(r->n_alloc, 1);
    uint64_t commits = v->commits;
    ts__pool_free(p, a);
    ts__pool_free(p, b);
    char *d = xalloc(p, 8 * MIB, "d"); /* a and b merged: no commit */
    CHECK(d == a);
    CHECK_INT_EQ(v->commits, commits);
    ts__pool_free(p, c); /* the end is free now ... */
    char *e = xalloc(p, 16 * MIB, "e"); /* ... and grows in place: commit only the difference */
    CHECK(e == c);
    CHECK_INT_EQ(v->commits, commits + 1);
    CHECK_INT_EQ(stats(p).reserved, 24 * MIB + 2 * MIB); /* + the small segment */
    ts__pool_free(p, d);
    ts__pool_free(p, e);
    ts__pool_free(p, small);
    check_balance(p);
    vm_finish(p, r, v);
}

static void test_vm_training_steps_reach_steady_state(void)
{
    rawctl *r = raw_new(64);
    vmctl *v = vm_new();
    ts_pool *p = vm_pool(r, v, 0, (uint64_t)1 << 40);
    static const size_t act[] = {3 * MIB + 100, 17 * MIB, 2 * MIB + 7, 40 * MIB, 5 * MIB,
                                 9 * MIB + 512, 1100 * KIB, 30 * MIB};
    enum { L = sizeof act / sizeof act[0] };
    uint64_t raw_after_first = 0;
    for (int step = 0; step < 20; step++) {
        void *z[L], *g = NULL;
        for (int l = 0; l < L; l++) /* forward keeps activations; a workspace comes and goes */
            z[l] = xalloc(p, act[l], "act"), ts__pool_free(p, xalloc(p, act[l] / 2, "ws"));
        for (int l = L; l-- > 0;) { /* backward frees them in reverse while gradients come */
            void *gin = xalloc(p, act[l], "grad");
            ts__pool_free(p, g);
            ts__pool_free(p, z[l]);
            g = gin;
        }
        ts__pool_free(p, g);
        if (step == 0)
            raw_after_first = v->commits + r->n_alloc;
        check_balance(p);
    }
    CHECK_INT_EQ(v->commits + r->n_alloc, raw_after_first);
    ts_memory_stats s = stats(p);
    printf("# peak reserved %llu, peak in use %llu\n", (unsigned long long)s.peak_reserved,
           (unsigned long long)s.peak_in_use);
    /* one range packs like a stack: reserved tracks the peak in use to the granule */
    CHECK(s.peak_reserved <= s.peak_in_use + 2 * VM_GRAN);
    vm_finish(p, r, v);
}

static void test_vm_cache_limit_trims_the_end(void)
{
    rawctl *r = raw_new(64);
    vmctl *v = vm_new();
    ts_pool *p = vm_pool(r, v, 0, 40 * MIB);
    void *a = xalloc(p, 4 * MIB, "a"), *b = xalloc(p, 30 * MIB, "b");
    CHECK_INT_EQ(stats(p).reserved, 34 * MIB);
    CHECK_INT_EQ(v->committed, 34 * MIB); /* both in the range: within the 40 MiB budget */
    ts__pool_free(p, b);
    CHECK_INT_EQ(stats(p).reserved, 34 * MIB); /* 30 MiB cached, under the limit */
    CHECK_OK(ts__pool_set_limits(p, 0, 3 * MIB)); /* 30 MiB cached > 3 MiB: the end is */
    CHECK_INT_EQ(stats(p).reserved, 6 * MIB); /* the limit (28 of 30 MiB, in 2 MiB granules) */
    CHECK_INT_EQ(v->committed, 6 * MIB);
    CHECK(stats(p).cached <= 3 * MIB);
    CHECK(v->decommits >= 1);
    check_balance(p);
    CHECK_OK(ts__pool_set_limits(p, 0, 40 * MIB));
    void *c = xalloc(p, 3 * MIB, "c"); /* commits again at the end */
    CHECK(vm_backed(v, c, 3 * MIB));
    ts__pool_free(p, a); /* a hole before c: cached, but not at the end, so it stays */
    CHECK_INT_EQ(stats(p).reserved, 8 * MIB);
    CHECK_OK(ts__pool_set_limits(p, 0, 3 * MIB));
    ts__pool_free(p, c); /* the whole range is free: it goes back in one piece */
    CHECK_INT_EQ(stats(p).reserved, 0);
    CHECK_INT_EQ(v->releases, 1);
    CHECK_OK(ts__pool_set_limits(p, 0, 40 * MIB));
    void *d = xalloc(p, 6 * MIB, "d"); /* and a new range is reserved on demand */
    CHECK_INT_EQ(v->reserves, 2);
    ts__pool_free(p, d);
    ts__pool_empty_cache(p);
    CHECK_INT_EQ(stats(p).reserved, 0);
    vm_finish(p, r, v);
}

/* cache_limit is hard: after every call the cached bytes are within it, whatever the mix of
 * sizes and the order of frees, with plain segments and with an expandable one. */
static void hard_cache_limit(ts_pool *p)
{
    void *v[96] = {0};
    static const size_t sizes[] = {64, 4000, 70 * KIB, 600 * KIB, 2 * MIB, 5 * MIB, 12 * MIB};
    uint64_t seed = 99, worst = 0, limit = stats(p).cache_limit;
    for (int round = 0; round < 5000; round++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        int i = (int)((seed >> 33) % 96);
        if (v[i]) {
            ts__pool_free(p, v[i]);
            v[i] = NULL;
        } else {
            v[i] = xalloc(p, sizes[(seed >> 45) % 7] + (seed >> 20) % 999, "mix");
        }
        ts_memory_stats s = stats(p);
        if (s.cached > worst)
            worst = s.cached;
    }
    printf("# worst cached %llu under a limit of %llu\n", (unsigned long long)worst,
           (unsigned long long)limit);
    CHECK_MSG(worst <= limit, "cached reached %llu", (unsigned long long)worst);
    for (int i = 0; i < 96; i++)
        ts__pool_free(p, v[i]);
}

static void test_cache_limit_is_hard(void)
{
    static const uint64_t limits[] = {0, MIB, 3 * MIB, 24 * MIB, 100 * MIB};
    for (size_t k = 0; k < sizeof limits / sizeof limits[0]; k++) {
        rawctl *r = raw_new(64);
        ts_pool *p = pool_new_ex("test", r, 0, limits[k], 1);
        hard_cache_limit(p);
        finish(p, r);
        r = raw_new(64);
        vmctl *v = vm_new();
        p = vm_pool(r, v, 0, limits[k]);
        hard_cache_limit(p);
        vm_finish(p, r, v);
    }
}

static void test_vm_reserve_limit_and_oom(void)
{
    rawctl *r = raw_new(64);
    vmctl *v = vm_new();
    ts_pool *p = vm_pool(r, v, 16 * MIB, (uint64_t)1 << 40);
    void *a = xalloc(p, 10 * MIB, "a"), *extra = (void *)1;
    CHECK_INT_EQ(v->span, 16 * MIB); /* the reservation is the limit */
    CHECK_FAILS(ts__pool_alloc(p, 10 * MIB, "b", &extra), TS_ENOMEM, "pool 'test'",
                "out of memory allocating 10.00 MiB", "10.00 MiB in use", "limit 16.00 MiB",
                "memory_fraction", "cache_limit");
    CHECK(extra == NULL);
    check_balance(p);
    ts__pool_free(p, a);
    void *b = xalloc(p, 14 * MIB, "b after the free");
    ts__pool_free(p, b);
    v->capacity = 4 * MIB; /* now the device itself is short */
    ts__pool_empty_cache(p);
    CHECK_FAILS(ts__pool_alloc(p, 6 * MIB, "c", &extra), TS_ENOMEM, "allocating 6.00 MiB",
                "device allocator failed");
    void *c = xalloc(p, 3 * MIB, "c fits");
    ts__pool_free(p, c);
    vm_finish(p, r, v);
}

static void test_vm_commit_failure_at_every_call(void)
{
    rawctl *r = raw_new(64);
    vmctl *v = vm_new();
    ts_pool *p = vm_pool(r, v, 0, (uint64_t)1 << 40);
    CHECK_INT_EQ(scenario(p), 0);
    uint64_t total = v->commit_calls;
    printf("# scenario: %llu commits\n", (unsigned long long)total);
    CHECK(total >= 4);
    vm_finish(p, r, v);
    for (uint64_t n = 1; n <= total; n++) {
        r = raw_new(64);
        v = vm_new();
        v->commit_fail_at = n;
        p = vm_pool(r, v, 0, (uint64_t)1 << 40);
        scenario(p);
        void *x = xalloc(p, 1000, "after"), *y = xalloc(p, 3 * MIB, "after");
        ts__pool_free(p, x);
        ts__pool_free(p, y);
        vm_finish(p, r, v);
    }
}

static void test_vm_reserve_failure_falls_back(void)
{
    rawctl *r = raw_new(64);
    vmctl *v = vm_new();
    v->refuse_reserve = 1;
    ts_pool *p = vm_pool(r, v, 0, (uint64_t)1 << 40);
    void *a = xalloc(p, 5 * MIB, "a"); /* from a plain segment */
    CHECK_INT_EQ(v->reserves, 0);
    CHECK(r->n_alloc >= 1);
    ts__pool_free(p, a);
    vm_finish(p, r, v);
}

static void test_vm_bad_options(void)
{
    rawctl *r = raw_new(64);
    vmctl *v = vm_new();
    ts_raw_vm vm = {.user = v, .granularity = 3 * MIB,
                    .reserve = vm_reserve, .release = vm_release, .commit = vm_commit,
                    .decommit = vm_decommit};
    ts_pool_options o = {.name = "bad", .alignment = 64, .vm = &vm};
    ts_raw_allocator ra = {.user = r, .alloc = raw_alloc, .free = raw_free};
    ts_pool *p = (ts_pool *)1;
    CHECK_FAILS(ts__pool_create(&o, &ra, &p), TS_EINVAL, "pool 'bad'", "ts_raw_vm",
                "granularity", "got 3145728");
    CHECK(p == NULL);
    vm.granularity = VM_GRAN;
    vm.commit = NULL;
    CHECK_FAILS(ts__pool_create(&o, &ra, &p), TS_EINVAL, "all four calls");
    vm.commit = vm_commit;
    o.vm = NULL; /* without one, no reservation */
    CHECK_OK(ts__pool_create(&o, &ra, &p));
    ts__pool_free(p, xalloc(p, 5 * MIB, "plain"));
    CHECK_INT_EQ(v->reserves, 0);
    finish(p, r);
    free(v);
}

static void test_vm_threads_stress(void)
{
    const char *env = getenv("TS_POOL_STRESS_OPS");
    int ops = env && *env ? atoi(env) : 20000;
    rawctl *r = raw_new(64);
    vmctl *v = vm_new();
    ts_pool *p = vm_pool(r, v, 0, 16 * MIB);
    pthread_t t[4];
    stress_arg a[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (stress_arg){.pool = p, .seed = 99u + (unsigned)i, .ops = ops};
        CHECK(pthread_create(&t[i], NULL, stress_thread, &a[i]) == 0);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    CHECK_INT_EQ(stats(p).in_use, 0);
    vm_finish(p, r, v);
}

/* ---- observers: registry, leak report, hook, trace ----------------------------------------- */

static void count_pool(const char *name, const ts_memory_stats *s, void *user)
{
    char *names = user;
    strcat(names, name);
    strcat(names, s->valid == TS_STATS_POOL ? ";" : "!");
}

static void test_registry(void)
{
    rawctl *r1 = raw_new(64), *r2 = raw_new(64);
    ts_pool *p1 = pool_new_ex("p1", r1, 0, (uint64_t)1 << 40, 1);
    ts_pool *p2 = pool_new_ex("p2", r2, 0, (uint64_t)1 << 40, 1);
    char names[64] = "";
    CHECK_INT_EQ(ts_memory_pools(count_pool, names), 2);
    CHECK(strcmp(names, "p1;p2;") == 0);
    void *a = xalloc(p1, 100, "a"), *b = xalloc(p2, 100, "b"), *c = xalloc(p2, 4 * MIB, "c");
    CHECK_INT_EQ(ts_memory_live_count(), 3);
    ts__pool_free(p2, c);
    ts_memory_empty_cache();
    CHECK_INT_EQ(stats(p2).reserved, 2 * MIB);
    ts__pool_free(p1, a);
    ts__pool_free(p2, b);
    ts_memory_empty_cache();
    CHECK_INT_EQ(stats(p1).reserved + stats(p2).reserved, 0);
    finish(p1, r1);
    CHECK_INT_EQ(ts_memory_pools(NULL, NULL), 1);
    finish(p2, r2);
    CHECK_INT_EQ(ts_memory_pools(NULL, NULL), 0);
}

static char *slurp(FILE *f)
{
    long n = ftell(f);
    rewind(f);
    char *s = calloc(1, (size_t)n + 1);
    CHECK(s && fread(s, 1, (size_t)n, f) == (size_t)n);
    return s;
}

static void test_leak_report_finds_planted_leak(void)
{
    CHECK_INT_EQ(ts_memory_debug(1), 0);
    rawctl *r = raw_new(64);
    ts_pool *p = pool_new_ex("leaky", r, 0, (uint64_t)1 << 40, 1);
    void *old = xalloc(p, 64, "before_mark");
    uint64_t mark = ts_memory_mark();
    void *leak = xalloc(p, 1000, "planted_leak");
    void *tmp = xalloc(p, 2000, "transient");
    ts__pool_free(p, tmp);
    CHECK_INT_EQ(ts_memory_live_count(), 2);

    FILE *f = tmpfile();
    uint64_t n = 0;
    CHECK_OK(ts_memory_leak_report(f, mark, &n));
    CHECK_INT_EQ(n, 1);
    char *text = slurp(f);
    CHECK_STR_CONTAINS(text, "pool 'leaky'");
    CHECK_STR_CONTAINS(text, "tag 'planted_leak'");
    CHECK_STR_CONTAINS(text, "1000 bytes asked");
    CHECK_STR_CONTAINS(text, "1 live block");
    CHECK(!strstr(text, "before_mark") && !strstr(text, "transient"));
    free(text);
    fclose(f);

    f = tmpfile();
    CHECK_OK(ts_memory_leak_report(f, 0, &n));
    CHECK_INT_EQ(n, 2);
    text = slurp(f);
    CHECK(strstr(text, "before_mark") < strstr(text, "planted_leak")); /* allocation order */
    free(text);
    fclose(f);
    CHECK_FAILS(ts_memory_leak_report(NULL, 0, NULL), TS_EINVAL, "out is NULL");

    ts__pool_free(p, old);
    ts__pool_free(p, leak);
    f = tmpfile();
    CHECK_OK(ts_memory_leak_report(f, 0, &n));
    CHECK_INT_EQ(n, 0);
    CHECK_INT_EQ(ftell(f), 0);
    fclose(f);
    CHECK_INT_EQ(ts_memory_debug(0), 1);
    finish(p, r);
}

static char logged[4096];

static void capture_log(int level, const char *message, void *user)
{
    (void)user;
    if (level <= TS_LOG_WARN && strlen(logged) + strlen(message) + 2 < sizeof logged) {
        strcat(logged, message);
        strcat(logged, "\n");
    }
}

static void test_destroy_reports_leaks(void)
{
    ts_set_log_handler(capture_log, NULL);
    rawctl *r = raw_new(64);
    ts_pool *p = pool_new(r);
    xalloc(p, 3000, "forgotten_tensor");
    xalloc(p, 5 * MIB, "forgotten_weight");
    ts__pool_destroy(p);
    CHECK_STR_CONTAINS(logged, "pool 'test': 2 blocks");
    CHECK_STR_CONTAINS(logged, "still live at destroy");
    CHECK_STR_CONTAINS(logged, "forgotten_tensor");
    CHECK_STR_CONTAINS(logged, "forgotten_weight");
    CHECK_INT_EQ(r->n_alloc, r->n_free);
    CHECK_INT_EQ(r->outstanding, 0);
    /* a free of a pointer the pool never gave is reported and ignored */
    logged[0] = '\0';
    r->n_alloc = r->n_free = 0;
    p = pool_new(r);
    void *a = xalloc(p, 10, "a");
    ts__pool_free(p, (char *)a + 64);
    CHECK_STR_CONTAINS(logged, "not a live block of this pool");
    CHECK_INT_EQ(stats(p).live_blocks, 1);
    ts__pool_free(p, a);
    ts_set_log_handler(NULL, NULL);
    finish(p, r);
}

typedef struct events {
    int n[3];
    ts_memory_event last;
    int tagged;
} events;

static void on_event(const ts_memory_event *ev, void *user)
{
    events *e = user;
    CHECK(ev->kind >= 0 && ev->kind < 3);
    CHECK(strcmp(ev->pool, "hooked") == 0);
    e->n[ev->kind]++;
    e->last = *ev;
    if (ev->tag && strcmp(ev->tag, "cb_tag") == 0)
        e->tagged++;
}

static void test_callback_sees_every_event(void)
{
    events e;
    memset(&e, 0, sizeof e);
    ts_memory_set_callback(on_event, &e);
    rawctl *r = raw_new(64);
    ts_pool *p = pool_new_ex("hooked", r, 8 * MIB, (uint64_t)1 << 40, 1);
    void *v[3];
    for (int i = 0; i < 3; i++) {
        v[i] = xalloc(p, 1000 * (size_t)(i + 1), "cb_tag");
        CHECK(e.last.kind == TS_MEMORY_ALLOC && e.last.ptr == v[i]);
        CHECK_INT_EQ(e.last.nbytes, 1000 * (i + 1));
        CHECK_INT_EQ(e.last.in_use, stats(p).in_use);
        CHECK_INT_EQ(e.last.reserved, stats(p).reserved);
    }
    void *x = NULL;
    CHECK(ts__pool_alloc(p, 9 * MIB, "cb_tag", &x) == TS_ENOMEM);
    CHECK(e.last.kind == TS_MEMORY_OOM && e.last.ptr == NULL && e.last.nbytes == 9 * MIB);
    for (int i = 0; i < 3; i++) {
        ts__pool_free(p, v[i]);
        CHECK(e.last.kind == TS_MEMORY_FREE && e.last.ptr == v[i]);
        CHECK_INT_EQ(e.last.in_use, stats(p).in_use);
    }
    ts_memory_stats s = stats(p);
    CHECK_INT_EQ(e.n[TS_MEMORY_ALLOC], s.n_alloc);
    CHECK_INT_EQ(e.n[TS_MEMORY_FREE], s.n_free);
    CHECK_INT_EQ(e.n[TS_MEMORY_OOM], s.n_oom);
    CHECK_INT_EQ(e.tagged, 7);
    ts_memory_set_callback(NULL, NULL);
    ts__pool_free(p, xalloc(p, 10, "after"));
    CHECK_INT_EQ(e.n[TS_MEMORY_ALLOC], 3);
    finish(p, r);
}

/* Parses a trace file and checks its shape; returns the counter events of pool name. */
static int check_trace(const char *path, const char *name, uint64_t *last_in_use)
{
    FILE *f = fopen(path, "r");
    CHECK_MSG(f, "no trace at %s", path);
    fseek(f, 0, SEEK_END);
    char *text = slurp(f);
    fclose(f);
    cJSON *root = cJSON_Parse(text);
    CHECK_MSG(root, "trace is not valid JSON near: %.80s",
              cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() : "?");
    cJSON *evs = cJSON_GetObjectItemCaseSensitive(root, "traceEvents");
    CHECK(cJSON_IsArray(evs));
    char track[80];
    snprintf(track, sizeof track, "pool %s", name);
    int n = 0;
    double last_ts = -1;
    cJSON *ev;
    cJSON_ArrayForEach(ev, evs) {
        cJSON *ph = cJSON_GetObjectItemCaseSensitive(ev, "ph");
        CHECK(cJSON_IsString(ph));
        CHECK(cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(ev, "pid")));
        if (strcmp(ph->valuestring, "C") != 0)
            continue;
        cJSON *nm = cJSON_GetObjectItemCaseSensitive(ev, "name");
        cJSON *ts = cJSON_GetObjectItemCaseSensitive(ev, "ts");
        cJSON *args = cJSON_GetObjectItemCaseSensitive(ev, "args");
        CHECK(cJSON_IsString(nm) && cJSON_IsNumber(ts) && cJSON_IsObject(args));
        CHECK(ts->valuedouble >= last_ts);
        last_ts = ts->valuedouble;
        cJSON *iu = cJSON_GetObjectItemCaseSensitive(args, "in_use");
        cJSON *rs = cJSON_GetObjectItemCaseSensitive(args, "reserved");
        cJSON *ca = cJSON_GetObjectItemCaseSensitive(args, "cached");
        CHECK(cJSON_IsNumber(iu) && cJSON_IsNumber(rs) && cJSON_IsNumber(ca));
        CHECK(iu->valuedouble + ca->valuedouble == rs->valuedouble);
        if (strcmp(nm->valuestring, track) == 0) {
            n++;
            *last_in_use = (uint64_t)iu->valuedouble;
        }
    }
    cJSON_Delete(root);
    free(text);
    return n;
}

static void test_memtrace_is_valid_json(void)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/trace.json", tap_tmpdir());
    CHECK_OK(ts_memtrace_start(path));
    CHECK_FAILS(ts_memtrace_start(path), TS_ESTATE, "already");
    rawctl *r = raw_new(64);
    ts_pool *p = pool_new_ex("traced", r, 0, 16 * MIB, 1);
    void *v[64] = {0};
    unsigned seed = 42;
    for (int i = 0; i < 3000; i++) { /* enough events to flush the buffer a few times */
        int k = rand_r(&seed) % 64;
        if (v[k]) {
            ts__pool_free(p, v[k]);
            v[k] = NULL;
        } else {
            v[k] = xalloc(p, (size_t)rand_r(&seed) % (3 * MIB), "traced");
        }
    }
    ts_memory_stats s = stats(p);
    ts_memtrace_stop();
    ts_memtrace_stop(); /* a no-op */
    uint64_t last = 1;
    int n = check_trace(path, "traced", &last);
    CHECK_INT_EQ(n, s.n_alloc + s.n_free);
    CHECK_INT_EQ(last, s.in_use);
    for (int k = 0; k < 64; k++)
        ts__pool_free(p, v[k]);
    finish(p, r);
    CHECK_FAILS(ts_memtrace_start("/nonexistent-dir/trace.json"), TS_EIO, "cannot save",
                "/nonexistent-dir/trace.json");
}

static void test_memtrace_from_environment(void)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/env-trace.json", tap_tmpdir());
    setenv("TESSERA_MEMTRACE", path, 1);
    rawctl *r = raw_new(64);
    ts_pool *p = pool_new_ex("envpool", r, 0, 16 * MIB, 1);
    void *a = xalloc(p, 5000, "e"), *b = xalloc(p, 3 * MIB, "e");
    ts__pool_free(p, a);
    ts__pool_free(p, b);
    finish(p, r); /* the last pool gone: the file is complete without a stop */
    uint64_t last = 1;
    CHECK_INT_EQ(check_trace(path, "envpool", &last), 5); /* 4 events, then destroy's */
    CHECK_INT_EQ(last, 0);
    ts_memtrace_stop();
}

static void test_bad_arguments(void)
{
    rawctl *r = raw_new(64);
    ts_raw_allocator ra = {.user = r, .alloc = raw_alloc, .free = raw_free};
    ts_pool_options o = {.name = "bad", .alignment = 48,
                         .cache_limit = MIB, .caching = 1};
    ts_pool *p = (ts_pool *)1;
    CHECK_FAILS(ts__pool_create(&o, &ra, &p), TS_EINVAL, "pool 'bad'", "alignment 48");
    CHECK(p == NULL);
    o.alignment = 64;
    CHECK_FAILS(ts__pool_create(&o, NULL, &p), TS_EINVAL, "raw allocator");
    p = pool_new(r);
    CHECK_FAILS(ts__pool_alloc(p, 10, "x", NULL), TS_EINVAL, "ptr is NULL");
    void *x = (void *)1;
    CHECK_FAILS(ts__pool_alloc(p, SIZE_MAX, "x", &x), TS_ENOMEM, "out of memory");
    CHECK(x == NULL);
    ts__pool_destroy(NULL);
    finish(p, r);
}

/* The figures derived from a pool's statistics: the cache's hit rate and its fragmentation. */
static void test_hit_rate_and_fragmentation(void)
{
    ts_memory_stats st = {.struct_size = sizeof st};
    CHECK(ts_memory_hit_rate(&st) == -1);    /* no allocation yet */
    CHECK(ts_memory_fragmentation(&st) == 0); /* nothing cached */
    st.cache_hits = 3, st.cache_misses = 1;
    CHECK(ts_memory_hit_rate(&st) == 0.75);
    st.cached = 100 << 20, st.largest_free = 100 << 20; /* one free block: not fragmented */
    CHECK(ts_memory_fragmentation(&st) == 0);
    st.largest_free = 25 << 20; /* four blocks of 25 MiB: a 30 MiB request fits none */
    CHECK(ts_memory_fragmentation(&st) == 0.75);
    CHECK(ts_memory_hit_rate(NULL) == -1 && ts_memory_fragmentation(NULL) == 0);
}

int main(int argc, char **argv)
{
    static const tap_test tests[] = {
        TAP_TEST(test_round_and_reuse),
        TAP_TEST(test_steady_state_no_raw_allocs),
        TAP_TEST(test_alignment),
        TAP_TEST(test_zero_bytes),
        TAP_TEST(test_split_coalesce),
        TAP_TEST(test_large_block_serves_smaller),
        TAP_TEST(test_huge_block_not_split_for_small_request),
        TAP_TEST(test_medium_blocks_share_a_segment),
        TAP_TEST(test_large_segments_are_interchangeable),
        TAP_TEST(test_cache_limit_after_burst),
        TAP_TEST(test_cache_limit_is_hard),
        TAP_TEST(test_cache_limit_largest_oldest_first),
        TAP_TEST(test_reserve_limit),
        TAP_TEST(test_oom_releases_cache_and_retries),
        TAP_TEST(test_device_full_releases_cache),
        TAP_TEST(test_raw_failure_at_every_call),
        TAP_TEST(test_caching_off),
        TAP_TEST(test_stats_honour_struct_size),
        TAP_TEST(test_peaks_and_reset),
        TAP_TEST(test_empty_cache_keeps_used_segments),
        TAP_TEST(test_set_limits_trims_cache),
        TAP_TEST(test_threads_stress),
        TAP_TEST(test_vm_blocks_share_one_range),
        TAP_TEST(test_vm_training_steps_reach_steady_state),
        TAP_TEST(test_vm_cache_limit_trims_the_end),
        TAP_TEST(test_vm_reserve_limit_and_oom),
        TAP_TEST(test_vm_commit_failure_at_every_call),
        TAP_TEST(test_vm_reserve_failure_falls_back),
        TAP_TEST(test_vm_bad_options),
        TAP_TEST(test_vm_threads_stress),
        TAP_TEST(test_registry),
        TAP_TEST(test_leak_report_finds_planted_leak),
        TAP_TEST(test_destroy_reports_leaks),
        TAP_TEST(test_callback_sees_every_event),
        TAP_TEST(test_memtrace_is_valid_json),
        TAP_TEST(test_memtrace_from_environment),
        TAP_TEST(test_bad_arguments),
        TAP_TEST(test_hit_rate_and_fragmentation),
    };
    return tap_run(tests, sizeof tests / sizeof tests[0], argc, argv);
}
