/* core/pool.c: the segment and block machinery of the caching pool that the host builds over
 * each plugin instance's raw memory; its calls (ts__pool_* in core/pool.h) and the registry of
 * live pools behind memory.h are core/pool_api.c.
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

#include "pool_impl.h"


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

void ts__pool_bins_remove(ts_pool *p, block *b)
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
block *ts__pool_bins_find(const ts_pool *p, bins *bn, size_t s)
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

size_t ts__pool_bins_largest(const bins *bn)
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
int ts__pool_spare_reserve(ts_pool *p, size_t n)
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

void ts__pool_map_put(ts_pool *p, block *b)
{
    size_t mask = p->map_cap - 1, i = map_slot(p, b->addr);
    while (p->map[i])
        i = (i + 1) & mask;
    p->map[i] = b;
    p->map_len++;
}

/* Room for one more entry at a load of at most 1/2. */
int ts__pool_map_reserve(ts_pool *p)
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
            ts__pool_map_put(p, old[i]);
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

block *ts__pool_map_find(const ts_pool *p, uintptr_t addr)
{
    return p->map_cap ? p->map[map_probe(p, addr)] : NULL;
}

block *ts__pool_map_take(ts_pool *p, uintptr_t addr)
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
        ts__pool_bins_remove(p, b);
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
    ts__pool_bins_remove(p, t);
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
grow_result ts__pool_grow(ts_pool *p, size_t s, int kind, block **out, ts_status *err,
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
void ts__pool_release_segment(ts_pool *p, block *b)
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
void ts__pool_release_whole(ts_pool *p, int all)
{
    if (all || p->st.reserved - p->st.in_use > p->st.cache_limit)
        arena_trim(p, all);
    while (p->n_whole && (all || p->st.reserved - p->st.in_use > p->st.cache_limit)) {
        segment *pick = p->whole;
        for (segment *sg = pick->wnext; sg; sg = sg->wnext)
            if (sg->size > pick->size || (sg->size == pick->size && sg->birth < pick->birth))
                pick = sg;
        block *b = pick->first;
        ts__pool_bins_remove(p, b);
        ts__pool_release_segment(p, b);
    }
}

/* Cuts s bytes off the front of b (in no free list) when the rest is worth keeping. */
void ts__pool_split(ts_pool *p, block *b, size_t s)
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
void ts__pool_coalesce_insert(ts_pool *p, block *b)
{
    block *n = b->next, *q = b->prev;
    if (n && n->is_free) {
        ts__pool_bins_remove(p, n);
        b->size += n->size;
        b->next = n->next;
        if (n->next)
            n->next->prev = b;
        else
            b->seg->last = b;
        spare_put(p, n);
    }
    if (q && q->is_free) {
        ts__pool_bins_remove(p, q);
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

