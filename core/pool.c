/* core/pool.c: the caching pool (ts__pool_* in core/pool.h) that the host builds over each
 * plugin instance's raw memory, and the registry of live pools behind memory.h.
 * Requests are rounded to the alignment and served best-fit from segmented free lists: small
 * ones (<= 1 MiB) carved from shared 2 MiB segments, medium ones (<= 10 MiB) from shared
 * 20 MiB segments, large ones from segments of at least 64 MiB that later host any large
 * request (or exactly their rounded size when the limit is near); blocks are
 * split when the remainder is worth keeping and coalesced with free neighbours at once, so a
 * loop whose shapes repeat stops calling the raw allocator. When the plugin hands over a
 * virtual-memory allocator (ts_raw_vm), every block over 1 MiB comes instead from one
 * reserved address range whose committed part grows and shrinks at its end (an expandable
 * segment): free space there always merges, as in one unbounded heap. docs/memory.md has the
 * design.
 * Block headers live in host memory, never in the (possibly device) memory handed out. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "memtrace.h"

#define MIB ((size_t)1 << 20)
#define SMALL_MAX MIB               /* requests up to this come from the small segments */
#define SMALL_SEGMENT (2 * MIB)     /* size of a small segment */
#define MEDIUM_MAX (10 * MIB)       /* requests up to this come from the medium segments */
#define MEDIUM_SEGMENT (20 * MIB)   /* size of a medium segment */
#define SEGMENT_ROUND (2 * MIB)     /* large segments are rounded up to this ... */
#define LARGE_SEGMENT_MIN (64 * MIB) /* ... and are at least this big, so any freed one can
                                      * host any large request up to this size */
#define LARGE_ROUND ((size_t)512)   /* large blocks are rounded up to this (or the alignment) */
#define LARGE_SPLIT_MIN MIB         /* a medium/large block is split if more is left */
#define HUGE_BLOCK (128 * MIB)      /* a free block this big only serves a near fit ... */
#define HUGE_SLACK_SHIFT 3          /* ... one wasting at most 1/8 of it */
#define MIN_ALIGN ((size_t)16)      /* internal granularity floor, so size classes work */
#define MAX_REQUEST ((size_t)1 << 48)
#define NCLASS 256                  /* size classes: 4 per power of two, up to 2^63 */
#define SCAN_MAX 16                 /* blocks examined for a best fit in the request's class */
#define CHUNK_BLOCKS 64             /* block headers are allocated this many at a time */
#define LEAKS_LOGGED 16             /* live blocks listed one by one at destroy */

enum { KIND_SMALL, KIND_MEDIUM, KIND_LARGE, NKIND };

typedef struct segment segment;
typedef struct block block;

/* A run of bytes inside a segment, allocated or free. */
struct block {
    uintptr_t addr;
    size_t size;          /* bytes, a multiple of the pool's granularity */
    segment *seg;
    block *prev, *next;   /* neighbours in the segment, by address */
    block *fprev, *fnext; /* the free list of its size class, while free */
    size_t requested;     /* bytes asked for, while allocated */
    const char *tag;      /* the caller's static tag, while allocated */
    char *name;           /* debug mode: what made it ("matmul (64,10) float32"), or NULL */
    int name_final;       /* name is the op's, not only the creator's */
    uint64_t seq;         /* debug-mode sequence number, 0 otherwise */
    int is_free;
};

/* One raw allocation. Its first block's header never changes: splits keep the lower half's
 * header and coalescing merges into the lower neighbour. */
struct segment {
    uintptr_t base;
    size_t size;            /* bytes obtained from the raw allocator */
    int kind;               /* KIND_SMALL, KIND_MEDIUM or KIND_LARGE */
    uint64_t birth;         /* creation order, for "oldest first" */
    block *first;
    segment *prev, *next;   /* every segment of the pool */
    segment *wprev, *wnext; /* segments that are one whole free block */
    int whole;
    int shared;             /* may hold several blocks (split); counted in shared_bytes */
    int expandable;         /* the vm range: size is the committed prefix of span */
    size_t span;            /* bytes of address space reserved (expandable only) */
    block *last;            /* the block at the highest address */
};

/* Free lists, one per size class, and a bitmap of the non-empty ones. */
typedef struct bins {
    uint64_t map[NCLASS / 64];
    block *head[NCLASS];
} bins;

typedef struct chunk {
    struct chunk *next;
    block blocks[CHUNK_BLOCKS];
} chunk;

struct ts_pool {
    pthread_mutex_t lock;
    char *name;
    ts_raw_allocator raw;
    ts_raw_vm vm;       /* vm.reserve is NULL without one */
    segment *arena;     /* the expandable segment, once reserved */
    size_t user_align;  /* opts->alignment: what the raw allocator guarantees */
    size_t align;       /* granularity of small blocks: max(user_align, MIN_ALIGN) */
    size_t large_round; /* granularity of large blocks */
    int caching;
    bins bins[NKIND];  /* free lists by segment kind */
    segment *segs;      /* every segment */
    segment *whole;     /* fully free segments */
    uint64_t n_whole;
    uint64_t births;
    block **map;        /* live blocks by address: open addressing, linear probing */
    size_t map_cap, map_len;
    unsigned map_shift; /* 64 - log2(map_cap) */
    block *spare;       /* recycled block headers */
    size_t n_spare;
    chunk *chunks;
    ts_memory_stats st; /* counters; cached and largest_free are computed by stats() */
    uint64_t shared_bytes; /* bytes of shared segments: at most cache_limit (see grow) */
    ts_pool *reg_prev, *reg_next;
};

static size_t round_up(size_t n, size_t m)
{
    return (n + m - 1) / m * m;
}

const char *ts__fmt_bytes(char buf[32], uint64_t n)
{
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
    if (n < 1024) {
        snprintf(buf, 32, "%llu B", (unsigned long long)n);
        return buf;
    }
    double v = (double)n / 1024;
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    snprintf(buf, 32, "%.2f %s", v, units[u]);
    return buf;
}

/* ---- size classes and free lists -------------------------------------------------------- */

/* Four classes per power of two; s >= 16. Monotone in s. */
static unsigned size_class(size_t s)
{
    unsigned fl = 63u - (unsigned)__builtin_clzll((unsigned long long)s);
    return (fl - 2) * 4 + (unsigned)((s >> (fl - 2)) & 3);
}

static void whole_link(ts_pool *p, segment *sg)
{
    sg->whole = 1;
    sg->wprev = NULL;
    sg->wnext = p->whole;
    if (p->whole)
        p->whole->wprev = sg;
    p->whole = sg;
    p->n_whole++;
}

static void whole_unlink(ts_pool *p, segment *sg)
{
    if (sg->wprev)
        sg->wprev->wnext = sg->wnext;
    else
        p->whole = sg->wnext;
    if (sg->wnext)
        sg->wnext->wprev = sg->wprev;
    sg->whole = 0;
    p->n_whole--;
}

static bins *bins_of(ts_pool *p, const block *b)
{
    return &p->bins[b->seg->kind];
}

static void bins_insert(ts_pool *p, block *b)
{
    bins *bn = bins_of(p, b);
    unsigned c = size_class(b->size);
    b->is_free = 1;
    b->fprev = NULL;
    b->fnext = bn->head[c];
    if (b->fnext)
        b->fnext->fprev = b;
    bn->head[c] = b;
    bn->map[c / 64] |= 1ull << (c % 64);
    if (b->size == b->seg->size)
        whole_link(p, b->seg);
}

static void bins_remove(ts_pool *p, block *b)
{
    bins *bn = bins_of(p, b);
    unsigned c = size_class(b->size);
    if (b->fprev)
        b->fprev->fnext = b->fnext;
    else
        bn->head[c] = b->fnext;
    if (b->fnext)
        b->fnext->fprev = b->fprev;
    if (!bn->head[c])
        bn->map[c / 64] &= ~(1ull << (c % 64));
    b->is_free = 0;
    if (b->seg->whole)
        whole_unlink(p, b->seg);
}

/* Whether segment sg, now holding one block, may become shared (hold several): only while
 * the bytes of shared segments stay within cache_limit. That is what makes cache_limit hard:
 * the free space inside segments that still hold live blocks cannot be given back, so it is
 * bounded by the shared segments' total; every other cached byte lies in a wholly free
 * segment, which release_whole returns. */
static int can_share(const ts_pool *p, const segment *sg)
{
    return sg->shared || p->shared_bytes + sg->size <= p->st.cache_limit;
}

/* Whether free block b may serve a request of s bytes: a huge block is never carved up for a
 * much smaller request (it would pin the whole segment); such requests get their own. A block
 * of a segment that may not be shared serves only a near fit (it is handed out whole). */
static int fits(const ts_pool *p, const block *b, size_t s)
{
    if (b->size < s)
        return 0;
    if (!can_share(p, b->seg) && b->size - s > (s >> HUGE_SLACK_SHIFT))
        return 0;
    return b->size < HUGE_BLOCK || b->seg->expandable ||
           s >= b->size - (b->size >> HUGE_SLACK_SHIFT);
}

/* Best fit among the first SCAN_MAX blocks of s's own class, else of the next non-empty
 * class whose blocks fit (all of them are larger than s). */
static block *bins_find(const ts_pool *p, bins *bn, size_t s)
{
    unsigned c = size_class(s);
    block *best = NULL;
    int n = 0;
    for (block *b = bn->head[c]; b && n < SCAN_MAX; b = b->fnext, n++) {
        if (fits(p, b, s) && (!best || b->size < best->size)) {
            best = b;
            if (b->size == s)
                break;
        }
    }
    if (best)
        return best;
    for (unsigned i = c + 1; i < NCLASS;) {
        uint64_t m = bn->map[i / 64] & (~0ull << (i % 64));
        if (!m) {
            i = (i / 64 + 1) * 64;
            continue;
        }
        i = (i / 64) * 64 + (unsigned)__builtin_ctzll(m);
        n = 0;
        for (block *b = bn->head[i]; b && n < SCAN_MAX; b = b->fnext, n++)
            if (fits(p, b, s) && (!best || b->size < best->size))
                best = b;
        if (best)
            return best;
        i++;
    }
    return NULL;
}

static size_t bins_largest(const bins *bn)
{
    for (int w = NCLASS / 64 - 1; w >= 0; w--) {
        if (!bn->map[w])
            continue;
        unsigned c = (unsigned)w * 64 + 63u - (unsigned)__builtin_clzll(bn->map[w]);
        size_t best = 0;
        for (const block *b = bn->head[c]; b; b = b->fnext)
            if (b->size > best)
                best = b->size;
        return best;
    }
    return 0;
}

/* ---- block headers and the address map -------------------------------------------------- */

/* Makes sure n headers are at hand, so that nothing fails half way through a change. */
static int spare_reserve(ts_pool *p, size_t n)
{
    while (p->n_spare < n) {
        chunk *c = malloc(sizeof *c);
        if (!c)
            return 0;
        c->next = p->chunks;
        p->chunks = c;
        for (int i = 0; i < CHUNK_BLOCKS; i++) {
            c->blocks[i].next = p->spare;
            p->spare = &c->blocks[i];
        }
        p->n_spare += CHUNK_BLOCKS;
    }
    return 1;
}

static block *spare_take(ts_pool *p)
{
    block *b = p->spare;
    TS_ASSERT(b);
    p->spare = b->next;
    p->n_spare--;
    memset(b, 0, sizeof *b);
    return b;
}

static void spare_put(ts_pool *p, block *b)
{
    b->next = p->spare;
    p->spare = b;
    p->n_spare++;
}

static size_t map_slot(const ts_pool *p, uintptr_t addr)
{
    return (size_t)(((uint64_t)addr * 0x9E3779B97F4A7C15ull) >> p->map_shift);
}

static void map_put(ts_pool *p, block *b)
{
    size_t mask = p->map_cap - 1, i = map_slot(p, b->addr);
    while (p->map[i])
        i = (i + 1) & mask;
    p->map[i] = b;
    p->map_len++;
}

/* Room for one more entry at a load of at most 1/2. */
static int map_reserve(ts_pool *p)
{
    if ((p->map_len + 1) * 2 <= p->map_cap)
        return 1;
    size_t cap = p->map_cap ? p->map_cap * 2 : 256;
    block **m = calloc(cap, sizeof *m), **old = p->map;
    if (!m)
        return 0;
    size_t oldcap = p->map_cap;
    p->map = m;
    p->map_cap = cap;
    p->map_shift = 64u - (unsigned)__builtin_ctzll((unsigned long long)cap);
    p->map_len = 0;
    for (size_t i = 0; i < oldcap; i++)
        if (old[i])
            map_put(p, old[i]);
    free(old);
    return 1;
}

/* The slot holding addr, or the empty slot ending its probe run. map_cap > 0. */
static size_t map_probe(const ts_pool *p, uintptr_t addr)
{
    size_t mask = p->map_cap - 1, i = map_slot(p, addr);
    while (p->map[i] && p->map[i]->addr != addr)
        i = (i + 1) & mask;
    return i;
}

static block *map_find(const ts_pool *p, uintptr_t addr)
{
    return p->map_cap ? p->map[map_probe(p, addr)] : NULL;
}

static block *map_take(ts_pool *p, uintptr_t addr)
{
    if (!p->map_cap)
        return NULL;
    size_t mask = p->map_cap - 1, i = map_probe(p, addr);
    block *b = p->map[i];
    if (!b)
        return NULL;
    /* Backward-shift deletion: pull later entries of the probe run into the hole unless
     * their home slot lies cyclically in (hole, j]. */
    for (size_t j = i;;) {
        j = (j + 1) & mask;
        if (!p->map[j])
            break;
        size_t k = map_slot(p, p->map[j]->addr);
        if (i <= j ? (i < k && k <= j) : (i < k || k <= j))
            continue;
        p->map[i] = p->map[j];
        i = j;
    }
    p->map[i] = NULL;
    p->map_len--;
    return b;
}

/* ---- segments ----------------------------------------------------------------------------- */

typedef enum grow_result { GROW_OK, GROW_LIMIT, GROW_RAW_FAILED, GROW_ERROR, GROW_NO_VM }
    grow_result;

/* Reserves the expandable segment's address space: the reserve limit, or the vm's own figure
 * without one. GROW_NO_VM when there is none to be had: the pool then uses plain segments. */
static grow_result arena_reserve(ts_pool *p, ts_status *err)
{
    size_t g = p->vm.granularity;
    uint64_t want = p->st.reserve_limit ? p->st.reserve_limit : p->vm.max_reserve;
    if (want < g || want > MAX_REQUEST)
        return GROW_NO_VM;
    size_t span = (size_t)want / g * g;
    segment *sg = malloc(sizeof *sg);
    if (!sg) {
        *err = ts__fail(TS_ENOMEM, "pool '%s': out of host memory for the pool's bookkeeping",
                        p->name);
        return GROW_ERROR;
    }
    void *base = NULL;
    ts_clear_error();
    ts_status rs = p->vm.reserve(p->vm.user, span, &base);
    if (rs != TS_OK || !base || (uintptr_t)base % g) {
        char sz[32], why[96];
        if (rs == TS_OK) /* the plugin said yes, but not in a usable form */
            snprintf(why, sizeof why, "%s", !base ? "no address returned"
                                                  : "the address is not aligned to the "
                                                    "granularity");
        ts__log(TS_LOG_WARN, "pool '%s': reserving %s of address space failed (%s); using "
                "separate segments instead of one expandable segment", p->name,
                ts__fmt_bytes(sz, span), rs != TS_OK ? ts_last_error() : why);
        if (base)
            p->vm.release(p->vm.user, base, span);
        free(sg);
        p->vm.reserve = NULL;
        return GROW_NO_VM;
    }
    *sg = (segment){.base = (uintptr_t)base, .size = 0, .kind = KIND_LARGE,
                    .birth = p->births++, .next = p->segs, .shared = 1, .expandable = 1,
                    .span = span};
    if (p->segs)
        p->segs->prev = sg;
    p->segs = sg;
    p->arena = sg;
    return GROW_OK;
}

/* Commits enough at the end of the expandable segment to hold s bytes in its last block and
 * returns that block, in no free list. */
static grow_result arena_grow(ts_pool *p, size_t s, block **out, ts_status *err,
                              char *raw_msg, size_t raw_msg_size)
{
    if (!p->arena) {
        grow_result g = arena_reserve(p, err);
        if (g != GROW_OK)
            return g;
    }
    segment *sg = p->arena;
    block *top = sg->last && sg->last->is_free ? sg->last : NULL;
    size_t have = top ? top->size : 0;
    size_t more = have >= s ? 0 : round_up(s - have, p->vm.granularity);
    uint64_t limit = p->st.reserve_limit;
    if (more > sg->span - sg->size)
        return p->st.reserve_limit ? GROW_LIMIT : GROW_NO_VM;
    if (limit && p->st.reserved + more > limit)
        return GROW_LIMIT;
    if (p->shared_bytes + more > p->st.cache_limit)
        return GROW_NO_VM; /* the range is shared: past the budget, blocks get segments */
    if (more) {
        ts_clear_error();
        ts_status st = p->vm.commit(p->vm.user, (void *)(sg->base + sg->size), more);
        if (st != TS_OK) {
            snprintf(raw_msg, raw_msg_size, "%s", ts_last_error());
            return GROW_RAW_FAILED;
        }
        p->st.n_raw_alloc++;
        p->st.reserved += more;
        p->shared_bytes += more;
        if (p->st.reserved > p->st.peak_reserved)
            p->st.peak_reserved = p->st.reserved;
    }
    block *b = top;
    if (b) {
        bins_remove(p, b);
        b->size += more;
    } else {
        b = spare_take(p);
        b->addr = sg->base + sg->size;
        b->size = more;
        b->seg = sg;
        b->prev = sg->last;
        if (sg->last)
            sg->last->next = b;
        else
            sg->first = b;
        sg->last = b;
    }
    sg->size += more;
    *out = b;
    return GROW_OK;
}

/* Decommits free space at the end of the expandable segment (the granularity allowing): all
 * of it, or (all == 0) what brings the cache under cache_limit. A wholly free segment is left
 * to release_whole, which returns it in one piece. */
static void arena_trim(ts_pool *p, int all)
{
    segment *sg = p->arena;
    if (!sg || sg->whole || !sg->last || !sg->last->is_free)
        return;
    block *t = sg->last;
    size_t keep = round_up(t->addr - sg->base, p->vm.granularity);
    if (keep >= sg->size)
        return;
    size_t cut = sg->size - keep;
    uint64_t cached = p->st.reserved - p->st.in_use;
    if (!all && cached - p->st.cache_limit < cut)
        cut = round_up(cached - p->st.cache_limit, p->vm.granularity);
    keep = sg->size - cut;
    bins_remove(p, t);
    p->vm.decommit(p->vm.user, (void *)(sg->base + keep), cut);
    p->st.n_raw_free++;
    p->st.reserved -= cut;
    p->shared_bytes -= cut;
    sg->size = keep;
    t->size -= cut;
    if (t->size) {
        bins_insert(p, t);
    } else { /* t was not the first block, or the segment would have been whole */
        sg->last = t->prev;
        t->prev->next = NULL;
        spare_put(p, t);
    }
}

/* Obtains a segment able to hold s bytes and returns its single block, not in any free list.
 * On GROW_RAW_FAILED, raw_msg holds the raw allocator's message (if it left one). */
static grow_result grow(ts_pool *p, size_t s, int kind, block **out, ts_status *err,
                        char *raw_msg, size_t raw_msg_size)
{
    if (p->vm.reserve && p->caching && kind == KIND_LARGE) {
        grow_result g = arena_grow(p, s, out, err, raw_msg, raw_msg_size);
        if (g != GROW_NO_VM)
            return g;
    }
    uint64_t limit = p->st.reserve_limit;
    size_t want = !p->caching ? s
                  : kind == KIND_SMALL ? SMALL_SEGMENT
                  : kind == KIND_MEDIUM ? MEDIUM_SEGMENT
                                        : round_up(s, SEGMENT_ROUND);
    if (p->caching && kind == KIND_LARGE && want < LARGE_SEGMENT_MIN)
        want = LARGE_SEGMENT_MIN;
    if (want > s && p->shared_bytes + want > p->st.cache_limit)
        want = s; /* no room to share a segment: the block gets one of its own size */
    if (limit && p->st.reserved + want > limit && kind != KIND_SMALL &&
        p->st.reserved + s <= limit)
        want = s; /* the rounding alone would cross the limit */
    if (limit && (want > limit || p->st.reserved + want > limit))
        return GROW_LIMIT;
    segment *sg = malloc(sizeof *sg);
    if (!sg) {
        *err = ts__fail(TS_ENOMEM, "pool '%s': out of host memory for the pool's bookkeeping",
                        p->name);
        return GROW_ERROR;
    }
    void *mem = NULL;
    ts_clear_error();
    ts_status st = p->raw.alloc(p->raw.user, want, &mem);
    if ((st != TS_OK || !mem) && want > s) {
        /* the device may lack room for the rounding alone: try the exact size */
        want = s;
        mem = NULL;
        ts_clear_error();
        st = p->raw.alloc(p->raw.user, want, &mem);
    }
    if (st != TS_OK || !mem) {
        snprintf(raw_msg, raw_msg_size, "%s", ts_last_error());
        free(sg);
        return GROW_RAW_FAILED;
    }
    if ((uintptr_t)mem % p->user_align) {
        p->raw.free(p->raw.user, mem, want);
        free(sg);
        *err = ts__fail(TS_EPLUGIN, "pool '%s': the raw allocator returned %p, not aligned "
                        "to %zu", p->name, mem, p->user_align);
        return GROW_ERROR;
    }
    p->st.n_raw_alloc++;
    p->st.reserved += want;
    if (p->st.reserved > p->st.peak_reserved)
        p->st.peak_reserved = p->st.reserved;
    *sg = (segment){.base = (uintptr_t)mem, .size = want, .kind = kind,
                    .birth = p->births++, .next = p->segs, .shared = want > s};
    if (sg->shared)
        p->shared_bytes += want;
    if (p->segs)
        p->segs->prev = sg;
    p->segs = sg;
    block *b = spare_take(p);
    b->addr = sg->base;
    b->size = want;
    b->seg = sg;
    sg->first = b;
    sg->last = b;
    *out = b;
    return GROW_OK;
}

/* Gives a segment back; b is its single block, in no free list. */
static void release_segment(ts_pool *p, block *b)
{
    segment *sg = b->seg;
    TS_ASSERT(b == sg->first && b->size == sg->size && !sg->whole);
    if (sg->prev)
        sg->prev->next = sg->next;
    else
        p->segs = sg->next;
    if (sg->next)
        sg->next->prev = sg->prev;
    if (sg->expandable) {
        p->vm.release(p->vm.user, (void *)sg->base, sg->span);
        p->arena = NULL;
    } else {
        p->raw.free(p->raw.user, (void *)sg->base, sg->size);
    }
    p->st.n_raw_free++;
    p->st.reserved -= sg->size;
    if (sg->shared)
        p->shared_bytes -= sg->size;
    spare_put(p, b);
    free(sg);
}

/* Returns whole free segments, largest then oldest first: all of them (all != 0) or until
 * the cached bytes fit under cache_limit. */
static void release_whole(ts_pool *p, int all)
{
    if (all || p->st.reserved - p->st.in_use > p->st.cache_limit)
        arena_trim(p, all);
    while (p->n_whole && (all || p->st.reserved - p->st.in_use > p->st.cache_limit)) {
        segment *pick = p->whole;
        for (segment *sg = pick->wnext; sg; sg = sg->wnext)
            if (sg->size > pick->size || (sg->size == pick->size && sg->birth < pick->birth))
                pick = sg;
        block *b = pick->first;
        bins_remove(p, b);
        release_segment(p, b);
    }
}

/* Cuts s bytes off the front of b (in no free list) when the rest is worth keeping. */
static void split(ts_pool *p, block *b, size_t s)
{
    size_t rest = b->size - s;
    size_t keep = b->seg->expandable ? p->large_round /* the rest merges again later */
                  : b->seg->kind != KIND_SMALL ? LARGE_SPLIT_MIN + 1
                                               : p->align;
    if (rest < keep)
        return;
    segment *sg = b->seg;
    if (!sg->shared) {
        if (!can_share(p, sg))
            return; /* handed out whole (fits allowed it: a near fit) */
        sg->shared = 1;
        p->shared_bytes += sg->size;
    }
    block *r = spare_take(p);
    r->addr = b->addr + s;
    r->size = rest;
    r->seg = b->seg;
    r->prev = b;
    r->next = b->next;
    if (b->next)
        b->next->prev = r;
    b->next = r;
    b->size = s;
    if (!r->next)
        r->seg->last = r;
    bins_insert(p, r);
}

/* Returns b (no longer allocated) to the free lists, merged with its free neighbours. */
static void coalesce_insert(ts_pool *p, block *b)
{
    block *n = b->next, *q = b->prev;
    if (n && n->is_free) {
        bins_remove(p, n);
        b->size += n->size;
        b->next = n->next;
        if (n->next)
            n->next->prev = b;
        else
            b->seg->last = b;
        spare_put(p, n);
    }
    if (q && q->is_free) {
        bins_remove(p, q);
        q->size += b->size;
        q->next = b->next;
        if (b->next)
            b->next->prev = q;
        else
            q->seg->last = q;
        spare_put(p, b);
        b = q;
    }
    bins_insert(p, b);
}

/* ---- the registry ----------------------------------------------------------------------- */

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static ts_pool *reg_head, *reg_tail;
static int reg_env_read;

static void registry_add(ts_pool *p)
{
    pthread_mutex_lock(&reg_lock);
    if (!reg_env_read) {
        reg_env_read = 1;
        ts__memtrace_env_init();
    }
    p->reg_prev = reg_tail;
    p->reg_next = NULL;
    if (reg_tail)
        reg_tail->reg_next = p;
    else
        reg_head = p;
    reg_tail = p;
    pthread_mutex_unlock(&reg_lock);
}

static void registry_remove(ts_pool *p)
{
    pthread_mutex_lock(&reg_lock);
    if (p->reg_prev)
        p->reg_prev->reg_next = p->reg_next;
    else
        reg_head = p->reg_next;
    if (p->reg_next)
        p->reg_next->reg_prev = p->reg_prev;
    else
        reg_tail = p->reg_prev;
    int empty = !reg_head;
    pthread_mutex_unlock(&reg_lock);
    if (empty)
        ts__memtrace_flush();
}

/* ---- the pool api ----------------------------------------------------------------------- */

static void trace_locked(ts_pool *p)
{
    ts__memtrace_counter(p->name, p->st.in_use, p->st.reserved, p->st.reserved - p->st.in_use);
}

ts_status ts__pool_create(const ts_pool_options *opts, const ts_raw_allocator *raw,
                             ts_pool **out)
{
    if (!out)
        return ts__fail(TS_EINVAL, "pool: out is NULL");
    *out = NULL;
    if (!opts || !raw || !raw->alloc || !raw->free)
        return ts__fail(TS_EINVAL, "pool: options and a raw allocator with alloc and free are "
                                   "required");
    const char *name = opts->name ? opts->name : "pool";
    size_t a = opts->alignment;
    if (a == 0 || (a & (a - 1)) || a > SMALL_SEGMENT / 2)
        return ts__fail(TS_EINVAL, "pool '%s': alignment %zu is not a power of two in [1, 1 MiB]",
                        name, a);
    ts_pool *p = calloc(1, sizeof *p);
    if (!p)
        goto fail_nomem;
    p->name = ts__strdup(name);
    if (!p->name)
        goto fail_free;
    if (pthread_mutex_init(&p->lock, NULL) != 0)
        goto fail_name;
    p->raw = *raw;
    p->user_align = a;
    p->align = a > MIN_ALIGN ? a : MIN_ALIGN;
    p->large_round = p->align > LARGE_ROUND ? p->align : LARGE_ROUND;
    p->st.struct_size = sizeof p->st;
    p->st.valid = TS_STATS_POOL;
    p->st.reserve_limit = opts->reserve_limit;
    p->st.cache_limit = opts->cache_limit;
    p->caching = opts->caching != 0;
    const ts_raw_vm *vm = opts->vm;
    if (vm) {
        size_t g = vm->granularity;
        if (!g || (g & (g - 1)) || g < p->large_round || !vm->reserve || !vm->release ||
            !vm->commit || !vm->decommit) {
            size_t need = p->large_round;
            pthread_mutex_destroy(&p->lock);
            free(p->name);
            free(p);
            return ts__fail(TS_EINVAL, "pool '%s': ts_raw_vm needs all four calls and a "
                            "power-of-two granularity >= %zu (got %zu)", name, need, g);
        }
        p->vm = *vm;
    }
    registry_add(p);
    *out = p;
    return TS_OK;

fail_name:
    free(p->name);
fail_free:
    free(p);
fail_nomem:
    return ts__fail(TS_ENOMEM, "pool '%s': out of host memory creating the pool", name);
}

/* What a report calls the block: its debug-mode name, else the caller's tag. */
static const char *block_tag(const block *b)
{
    return b->name ? b->name : b->tag;
}

static void log_leak(ts_pool *p, const block *b)
{
    char sz[32];
    ts__log(TS_LOG_WARN, "pool '%s': leaked %s (%zu bytes asked) tag '%s' seq %llu at %p",
            p->name, ts__fmt_bytes(sz, b->size), b->requested,
            block_tag(b) ? block_tag(b) : "(none)",
            (unsigned long long)b->seq, (void *)b->addr);
}

void ts__pool_destroy(ts_pool *p)
{
    if (!p)
        return;
    if (atomic_load_explicit(&ts__mem_hooks, memory_order_relaxed) & TS__MEM_TRACE)
        ts__memtrace_counter(p->name, 0, 0, 0); /* before the registry flushes the trace */
    registry_remove(p);
    if (p->st.live_blocks) {
        char sz[32];
        ts__log(TS_LOG_WARN, "pool '%s': %llu blocks (%s) still live at destroy; returned to "
                "the raw allocator", p->name, (unsigned long long)p->st.live_blocks,
                ts__fmt_bytes(sz, p->st.in_use));
        size_t shown = 0;
        for (size_t i = 0; i < p->map_cap && shown < LEAKS_LOGGED; i++)
            if (p->map[i]) {
                log_leak(p, p->map[i]);
                shown++;
            }
        for (size_t i = 0; i < p->map_cap; i++)
            if (p->map[i]) {
                free(p->map[i]->name);
                p->map[i]->name = NULL;
            }
        if (p->st.live_blocks > shown)
            ts__log(TS_LOG_WARN, "pool '%s': ... and %llu more", p->name,
                    (unsigned long long)(p->st.live_blocks - shown));
    }
    for (segment *sg = p->segs, *next; sg; sg = next) {
        next = sg->next;
        if (sg->expandable)
            p->vm.release(p->vm.user, (void *)sg->base, sg->span);
        else
            p->raw.free(p->raw.user, (void *)sg->base, sg->size);
        p->st.n_raw_free++;
        free(sg);
    }
    for (chunk *c = p->chunks, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    free(p->map);
    pthread_mutex_destroy(&p->lock);
    free(p->name);
    free(p);
}

/* Fills the out-of-memory message; called with the lock held. */
static ts_status oom(ts_pool *p, size_t nbytes, grow_result why, const char *raw_msg)
{
    char req[32], used[32], resv[32], cached[32], lfree[32], lim[32] = "no limit";
    size_t largest = 0;
    for (int k = 0; k < NKIND; k++) {
        size_t l = bins_largest(&p->bins[k]);
        if (l > largest)
            largest = l;
    }
    if (p->st.reserve_limit)
        snprintf(lim, sizeof lim, "limit %s",
                 ts__fmt_bytes((char[32]){0}, p->st.reserve_limit));
    ts__fmt_bytes(req, nbytes);
    ts__fmt_bytes(used, p->st.in_use);
    ts__fmt_bytes(resv, p->st.reserved);
    ts__fmt_bytes(cached, p->st.reserved - p->st.in_use);
    ts__fmt_bytes(lfree, largest);
    p->st.n_oom++;
    if (why == GROW_RAW_FAILED)
        return ts__fail(TS_ENOMEM,
                        "pool '%s': out of memory allocating %s: %s in use, %s reserved (%s "
                        "cached, largest free block %s), %s (memory_fraction); the device "
                        "allocator failed%s%s; free tensors, lower cache_limit in [plugin.%s] "
                        "or lower memory_fraction to leave room for other users of the device",
                        p->name, req, used, resv, cached, lfree, lim, raw_msg[0] ? ": " : "",
                        raw_msg, p->name);
    return ts__fail(TS_ENOMEM,
                    "pool '%s': out of memory allocating %s: %s in use, %s reserved (%s cached, "
                    "largest free block %s), %s (memory_fraction); raise memory_fraction or "
                    "lower cache_limit in [plugin.%s], or free tensors",
                    p->name, req, used, resv, cached, lfree, lim, p->name);
}

ts_status ts__pool_alloc(ts_pool *p, size_t nbytes, const char *tag, void **ptr)
{
    if (!ptr)
        return ts__fail(TS_EINVAL, "pool alloc: ptr is NULL");
    *ptr = NULL;
    if (!p)
        return ts__fail(TS_EINVAL, "pool alloc: pool is NULL");
    if (ts__fault_hit(TS_FAULT_POOL))
        return ts__fail(TS_ENOMEM, "pool '%s': out of memory (injected fault)", p->name);
    unsigned hooks = atomic_load_explicit(&ts__mem_hooks, memory_order_relaxed);
    ts_status st = TS_OK;
    ts_memory_event ev;
    block *b = NULL;
    char raw_msg[256] = "";
    size_t s = nbytes > MAX_REQUEST ? MAX_REQUEST : round_up(nbytes ? nbytes : 1, p->align);
    int kind = s <= SMALL_MAX ? KIND_SMALL : KIND_LARGE;
    if (kind != KIND_SMALL) {
        s = round_up(s, p->large_round);
        if (s <= MEDIUM_MAX && !p->vm.reserve) /* the expandable segment takes both */
            kind = KIND_MEDIUM;
    }

    pthread_mutex_lock(&p->lock);
    if (!map_reserve(p) || !spare_reserve(p, 2)) {
        st = ts__fail(TS_ENOMEM, "pool '%s': out of host memory for the pool's bookkeeping",
                      p->name);
        goto out;
    }
    if (nbytes > MAX_REQUEST) {
        p->st.cache_misses++;
        st = oom(p, nbytes, GROW_LIMIT, raw_msg);
        goto out;
    }
    if (p->caching)
        b = bins_find(p, &p->bins[kind], s);
    if (b) {
        p->st.cache_hits++;
        bins_remove(p, b);
    } else {
        p->st.cache_misses++;
        grow_result g = grow(p, s, kind, &b, &st, raw_msg, sizeof raw_msg);
        if ((g == GROW_LIMIT || g == GROW_RAW_FAILED) &&
            (p->n_whole || (p->arena && p->arena->last && p->arena->last->is_free))) {
            /* The cache may hold what the limit or the device lacks: give it back, once. */
            release_whole(p, 1);
            g = grow(p, s, kind, &b, &st, raw_msg, sizeof raw_msg);
        }
        if (g == GROW_ERROR)
            goto out;
        if (g != GROW_OK) {
            st = oom(p, nbytes, g, raw_msg);
            goto out;
        }
    }
    split(p, b, s);
    b->requested = nbytes;
    b->tag = tag;
    b->name = NULL;
    b->name_final = 0;
    b->seq = (hooks & TS__MEM_DEBUG) ? ts__mem_next_seq() : 0;
    map_put(p, b);
    p->st.in_use += b->size;
    if (p->st.in_use > p->st.peak_in_use)
        p->st.peak_in_use = p->st.in_use;

    p->st.requested += nbytes;
    p->st.live_blocks++;
    p->st.n_alloc++;
    *ptr = (void *)b->addr;
    /* A new shared segment's free part can push the cache past its limit: whole free
     * segments go first. */
    if (p->st.reserved - p->st.in_use > p->st.cache_limit)
        release_whole(p, 0);
out:
    if (hooks) {
        if ((hooks & TS__MEM_TRACE) && st == TS_ENOMEM)
            ts__memtrace_oom(p->name, nbytes);
        if (hooks & TS__MEM_TRACE)
            trace_locked(p);
        ev = (ts_memory_event){.kind = st == TS_OK ? TS_MEMORY_ALLOC : TS_MEMORY_OOM,
                               .pool = p->name, .ptr = *ptr, .nbytes = nbytes,
                               .block_bytes = st == TS_OK ? b->size : 0, .tag = tag,
                               .in_use = p->st.in_use, .reserved = p->st.reserved};
    }
    pthread_mutex_unlock(&p->lock);
    if ((hooks & TS__MEM_CALLBACK) && (st == TS_OK || st == TS_ENOMEM))
        ts__mem_dispatch(&ev);
    return st;
}

void ts__pool_free(ts_pool *p, void *ptr)
{
    if (!p || !ptr)
        return;
    unsigned hooks = atomic_load_explicit(&ts__mem_hooks, memory_order_relaxed);
    ts_memory_event ev;
    pthread_mutex_lock(&p->lock);
    block *b = map_take(p, (uintptr_t)ptr);
    if (!b) {
        pthread_mutex_unlock(&p->lock);
        ts__log(TS_LOG_ERROR, "pool '%s': free of %p, which is not a live block of this pool "
                "(double free, or a block of another pool); ignored", p->name, ptr);
        return;
    }
    size_t size = b->size, requested = b->requested;
    /* events carry the caller's static tag, as the allocation's did; the debug-mode name
     * is only for live-block listings and leak reports */
    char *name = b->name;
    const char *tag = b->tag;
    b->name = NULL;
    p->st.in_use -= size;
    p->st.requested -= requested;
    p->st.live_blocks--;
    p->st.n_free++;
    if (!p->caching) {
        release_segment(p, b);
    } else {
        coalesce_insert(p, b);
        if (p->st.reserved - p->st.in_use > p->st.cache_limit)
            release_whole(p, 0);
    }
    if (hooks) {
        if (hooks & TS__MEM_TRACE)
            trace_locked(p);
        ev = (ts_memory_event){.kind = TS_MEMORY_FREE, .pool = p->name, .ptr = ptr,
                               .nbytes = requested, .block_bytes = size, .tag = tag,
                               .in_use = p->st.in_use, .reserved = p->st.reserved};
    }
    pthread_mutex_unlock(&p->lock);
    if (name) /* debug mode only: no libc call on the usual path */
        free(name);
    if (hooks & TS__MEM_CALLBACK)
        ts__mem_dispatch(&ev);
}

void ts__pool_name_block(ts_pool *p, const void *ptr, const char *text, int final)
{
    if (!p || !ptr || !text ||
        !(atomic_load_explicit(&ts__mem_hooks, memory_order_relaxed) & TS__MEM_DEBUG))
        return;
    pthread_mutex_lock(&p->lock);
    block *b = map_find(p, (uintptr_t)ptr);
    if (b && !b->name_final && (!final || b->name)) {
        char *n;
        if (!final) { /* the creator's name: "tensor (64,10) float32" */
            n = b->name ? NULL : ts__strdup(text);
        } else { /* the op's: its name in place of the creator's word */
            size_t keep = b->tag ? strlen(b->tag) : 0;
            n = strncmp(b->name, b->tag ? b->tag : "", keep) == 0
                    ? ts__asprintf("%s%s", text, b->name + keep)
                    : NULL;
        }
        if (n) {
            free(b->name);
            b->name = n;
            b->name_final = final;
        }
    }
    pthread_mutex_unlock(&p->lock);
}

static void stats_locked(ts_pool *p, ts_memory_stats *full)
{
    *full = p->st;
    full->cached = p->st.reserved - p->st.in_use;
    full->largest_free = 0;
    for (int k = 0; k < NKIND; k++) {
        size_t l = bins_largest(&p->bins[k]);
        if (l > full->largest_free)
            full->largest_free = l;
    }
}

void ts__pool_stats(ts_pool *p, ts_memory_stats *out)
{
    if (!out)
        return;
    uint32_t size = out->struct_size;
    ts_memory_stats full;
    if (!p) {
        memset(&full, 0, sizeof full);
    } else {
        pthread_mutex_lock(&p->lock);
        stats_locked(p, &full);
        pthread_mutex_unlock(&p->lock);
    }
    full.struct_size = size;
    /* Only what the caller's (possibly older, shorter) struct holds. */
    memcpy(out, &full, size < sizeof full ? size : sizeof full);
}

void ts__pool_reset_peak(ts_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->lock);
    p->st.peak_in_use = p->st.in_use;
    p->st.peak_reserved = p->st.reserved;
    pthread_mutex_unlock(&p->lock);
}

void ts__pool_empty_cache(ts_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->lock);
    release_whole(p, 1);
    if (atomic_load_explicit(&ts__mem_hooks, memory_order_relaxed) & TS__MEM_TRACE)
        trace_locked(p);
    pthread_mutex_unlock(&p->lock);
}

ts_status ts__pool_set_limits(ts_pool *p, uint64_t reserve_limit, uint64_t cache_limit)
{
    if (!p)
        return ts__fail(TS_EINVAL, "pool set_limits: pool is NULL");
    pthread_mutex_lock(&p->lock);
    p->st.reserve_limit = reserve_limit;
    p->st.cache_limit = cache_limit;
    release_whole(p, 0);
    pthread_mutex_unlock(&p->lock);
    return TS_OK;
}

/* Internal: the loader builds each device's pool with it; tests/unit/test-pool links the core
 * statically (core/libtscore.la) to drive it directly. libtessera does not export it. */

/* ---- memory.h: across every pool -------------------------------------------------------- */

TS_API size_t ts_memory_pools(void (*fn)(const char *pool, const ts_memory_stats *stats,
                                         void *user),
                              void *user)
{
    size_t n = 0;
    pthread_mutex_lock(&reg_lock);
    for (ts_pool *p = reg_head; p; p = p->reg_next, n++) {
        if (!fn)
            continue;
        ts_memory_stats st;
        pthread_mutex_lock(&p->lock);
        stats_locked(p, &st);
        pthread_mutex_unlock(&p->lock);
        fn(p->name, &st, user);
    }
    pthread_mutex_unlock(&reg_lock);
    return n;
}

TS_API uint64_t ts_memory_live_count(void)
{
    uint64_t n = 0;
    pthread_mutex_lock(&reg_lock);
    for (ts_pool *p = reg_head; p; p = p->reg_next) {
        pthread_mutex_lock(&p->lock);
        n += p->st.live_blocks;
        pthread_mutex_unlock(&p->lock);
    }
    pthread_mutex_unlock(&reg_lock);
    return n;
}

TS_API void ts_memory_empty_cache(void)
{
    pthread_mutex_lock(&reg_lock);
    for (ts_pool *p = reg_head; p; p = p->reg_next)
        ts__pool_empty_cache(p);
    pthread_mutex_unlock(&reg_lock);
}

TS_API uint64_t ts_memory_live_blocks(uint64_t since,
                                      void (*fn)(const ts_memory_block_info *b, void *user),
                                      void *user)
{
    uint64_t n = 0;
    pthread_mutex_lock(&reg_lock);
    for (ts_pool *p = reg_head; p; p = p->reg_next) {
        pthread_mutex_lock(&p->lock);
        for (size_t i = 0; i < p->map_cap; i++) {
            const block *b = p->map[i];
            if (!b || (since && b->seq <= since))
                continue;
            n++;
            if (fn) {
                ts_memory_block_info info = {.pool = p->name, .ptr = (const void *)b->addr,
                                             .nbytes = b->requested, .block_bytes = b->size,
                                             .tag = block_tag(b), .seq = b->seq};
                fn(&info, user);
            }
        }
        pthread_mutex_unlock(&p->lock);
    }
    pthread_mutex_unlock(&reg_lock);
    return n;
}

void ts__pools_trace_snapshot(void)
{
    pthread_mutex_lock(&reg_lock);
    for (ts_pool *p = reg_head; p; p = p->reg_next) {
        pthread_mutex_lock(&p->lock);
        trace_locked(p);
        pthread_mutex_unlock(&p->lock);
    }
    pthread_mutex_unlock(&reg_lock);
}
