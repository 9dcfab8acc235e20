/* core/pool_api.c: the caching pool's calls (ts__pool_* of core/pool.h) over the segment and
 * block machinery of core/pool.c, and the registry of live pools behind memory.h. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pool_impl.h"
#include "memtrace.h"

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
        size_t l = ts__pool_bins_largest(&p->bins[k]);
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
    if (!ts__pool_map_reserve(p) || !ts__pool_spare_reserve(p, 2)) {
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
        b = ts__pool_bins_find(p, &p->bins[kind], s);
    if (b) {
        p->st.cache_hits++;
        ts__pool_bins_remove(p, b);
    } else {
        p->st.cache_misses++;
        grow_result g = ts__pool_grow(p, s, kind, &b, &st, raw_msg, sizeof raw_msg);
        if ((g == GROW_LIMIT || g == GROW_RAW_FAILED) &&
            (p->n_whole || (p->arena && p->arena->last && p->arena->last->is_free))) {
            /* The cache may hold what the limit or the device lacks: give it back, once. */
            ts__pool_release_whole(p, 1);
            g = ts__pool_grow(p, s, kind, &b, &st, raw_msg, sizeof raw_msg);
        }
        if (g == GROW_ERROR)
            goto out;
        if (g != GROW_OK) {
            st = oom(p, nbytes, g, raw_msg);
            goto out;
        }
    }
    ts__pool_split(p, b, s);
    b->requested = nbytes;
    b->tag = tag;
    b->name = NULL;
    b->name_final = 0;
    b->seq = (hooks & TS__MEM_DEBUG) ? ts__mem_next_seq() : 0;
    ts__pool_map_put(p, b);
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
        ts__pool_release_whole(p, 0);
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
    block *b = ts__pool_map_take(p, (uintptr_t)ptr);
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
        ts__pool_release_segment(p, b);
    } else {
        ts__pool_coalesce_insert(p, b);
        if (p->st.reserved - p->st.in_use > p->st.cache_limit)
            ts__pool_release_whole(p, 0);
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
    block *b = ts__pool_map_find(p, (uintptr_t)ptr);
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
        size_t l = ts__pool_bins_largest(&p->bins[k]);
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
    ts__pool_release_whole(p, 1);
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
    ts__pool_release_whole(p, 0);
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

TS_API double ts_memory_hit_rate(const ts_memory_stats *st)
{
    uint64_t n = st ? st->cache_hits + st->cache_misses : 0;
    return n ? (double)st->cache_hits / (double)n : -1;
}

TS_API double ts_memory_fragmentation(const ts_memory_stats *st)
{
    if (!st || !st->cached)
        return 0;
    double f = 1 - (double)st->largest_free / (double)st->cached;
    return f < 0 ? 0 : f;
}
