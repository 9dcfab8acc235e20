/* core/pool_impl.h: the caching pool's layout and the segment and block machinery of
 * core/pool.c that core/pool_api.c (creating, allocating, freeing, statistics, the registry of
 * pools behind memory.h) is built on; never installed. */
#ifndef TESSERA_CORE_POOL_IMPL_H
#define TESSERA_CORE_POOL_IMPL_H
#include <pthread.h>

#include "internal.h"

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


static inline size_t round_up(size_t n, size_t m)
{
    return (n + m - 1) / m * m;
}

typedef enum grow_result { GROW_OK, GROW_LIMIT, GROW_RAW_FAILED, GROW_ERROR, GROW_NO_VM }
    grow_result;

/* Segments and blocks (core/pool.c), all with the pool's lock held. */
/* A free block of bins bn that fits s bytes (best of SCAN_MAX in its class), or NULL. */
block *ts__pool_bins_find(const ts_pool *p, bins *bn, size_t s);
/* The largest free block's size in bn. */
size_t ts__pool_bins_largest(const bins *bn);
/* Takes free block b off its free list. */
void ts__pool_bins_remove(ts_pool *p, block *b);
/* Marks b free, merges it with free neighbours and files it. */
void ts__pool_coalesce_insert(ts_pool *p, block *b);
/* A new free block of at least s bytes of segment kind `kind` from the raw allocator (or the
 * expandable segment); why not, with the raw allocator's message, when it cannot. */
grow_result ts__pool_grow(ts_pool *p, size_t s, int kind, block **out, ts_status *err,
                          char *raw_msg, size_t raw_msg_size);
/* The live-block map: find, enter, make room for one more, take out. */
block *ts__pool_map_find(const ts_pool *p, uintptr_t addr);
void ts__pool_map_put(ts_pool *p, block *b);
int ts__pool_map_reserve(ts_pool *p);
block *ts__pool_map_take(ts_pool *p, uintptr_t addr);
/* Gives the segment of whole-free block b back to the raw allocator. */
void ts__pool_release_segment(ts_pool *p, block *b);
/* Gives wholly free segments back: all of them, or down to the cache limit. */
void ts__pool_release_whole(ts_pool *p, int all);
/* Makes sure n spare block headers are at hand (0), or -1 out of host memory. */
int ts__pool_spare_reserve(ts_pool *p, size_t n);
/* Splits b so that it keeps s bytes, when the rest is worth keeping. */
void ts__pool_split(ts_pool *p, block *b, size_t s);

#endif /* TESSERA_CORE_POOL_IMPL_H */
