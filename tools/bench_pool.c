/* tools/bench_pool.c: `tessera bench pool`: the caching pool (core/pool.c) against glibc
 * malloc/free on pre-generated event sequences (each event frees a slot's block, then
 * allocates a new one into the slot, or only frees), with sizes from a fixed set of 48
 * tensor-like shapes, log-uniform between 64 B and 64 MiB. Two mixes:
 *  - training: a 32-layer network's step (forward keeps two activations per layer and uses a
 *    workspace, backward frees them in reverse while gradients come and go, the optimizer
 *    uses a temporary per layer; weights and Adam state stay live), repeated step after step;
 *  - random: a working set of live blocks replaced in random order (not LIFO), a step of 1000
 *    replacements repeating (or never, --no-repeat): a stress test of fragmentation.
 * The first half of each sequence warms up; the second half is timed and counted. The memory
 * handed out is never touched, on either side. Next to the pool's peak reserved / peak in
 * use, the same run reports what an ideal non-moving allocator gets on the same sequence: one
 * unbounded address range (no segment boundaries), best fit by address, free neighbours
 * coalesced at once. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include <tessera/tessera.h>

#include "bench_pool.h"
#include "cli.h"

#define NSHAPES 48
#define MIN_BYTES 64.0
#define MAX_BYTES (64.0 * 1024 * 1024)
#define LAYERS 32
#define ARENA_ALIGN 64

/* Free the slot's block (if any), then allocate size bytes into it unless size is 0. */
typedef struct event {
    uint32_t slot;
    size_t size;
} event;

typedef struct sequence {
    const char *mix;
    event *ev;
    size_t n, cap;
    size_t timed_from; /* index of the first timed event */
    uint32_t nslots;
    uint64_t warm_allocs, timed_allocs;
} sequence;

typedef struct result {
    double ns_malloc, ns_pool, per1000, ratio, arena_ratio;
    uint64_t raw_warmup, peak_reserved, peak_in_use;
} result;

/* xorshift64*: the same sequence on every machine. */
static uint64_t next_rand(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1Dull;
}

/* ---- the sequences ------------------------------------------------------------------------ */

static int push(sequence *q, uint32_t slot, size_t size)
{
    if (q->n == q->cap) {
        size_t cap = q->cap ? 2 * q->cap : 4096;
        event *ev = realloc(q->ev, cap * sizeof *ev);
        if (!ev)
            return 0;
        q->ev = ev;
        q->cap = cap;
    }
    q->ev[q->n++] = (event){slot, size};
    if (slot >= q->nslots)
        q->nslots = slot + 1;
    return 1;
}

static void make_shapes(uint64_t *rng, size_t shapes[NSHAPES])
{
    for (int k = 0; k < NSHAPES; k++) {
        /* 64 B * 2^(20 k / 47), the fraction of each octave linearised (no libm) */
        double e = 20.0 * k / (NSHAPES - 1);
        int ip = (int)e;
        double v = MIN_BYTES * (double)(1ull << ip) * (1.0 + (e - ip));
        shapes[k] = (size_t)v / 4 * 4 + 4 * (next_rand(rng) % 16); /* not all round */
    }
}

/* Random replacement: wset slots filled, then 2 * pairs replacements; a step of `step`
 * replacements repeats unless step is 0. */
static int make_random(sequence *q, uint64_t seed, uint64_t pairs, uint64_t wset, uint64_t step)
{
    size_t shapes[NSHAPES];
    uint64_t rng = seed * 0x9E3779B97F4A7C15ull | 1;
    make_shapes(&rng, shapes);
    uint64_t n = wset + 2 * pairs;
    for (uint64_t i = 0; i < n; i++) {
        if (i == wset + pairs)
            q->timed_from = q->n;
        event e;
        if (step && i >= wset + step) {
            e = q->ev[i - step];
        } else {
            e.slot = i < wset ? (uint32_t)i : (uint32_t)(next_rand(&rng) % wset);
            e.size = shapes[next_rand(&rng) % NSHAPES];
        }
        if (!push(q, e.slot, e.size))
            return 0;
    }
    return 1;
}

/* One training step of a LAYERS-deep network whose activation and weight sizes are drawn
 * from the shapes; the weights, their gradients and two Adam moments stay live (slots 0 ..
 * 4 LAYERS - 1, allocated before the first step). */
static int make_training(sequence *q, uint64_t seed, uint64_t pairs)
{
    size_t shapes[NSHAPES], act[LAYERS], wgt[LAYERS];
    uint64_t rng = seed * 0x9E3779B97F4A7C15ull | 1;
    make_shapes(&rng, shapes);
    for (int l = 0; l < LAYERS; l++) {
        act[l] = shapes[next_rand(&rng) % NSHAPES];
        wgt[l] = shapes[next_rand(&rng) % NSHAPES];
    }
    enum { W = 0, Z = 4 * LAYERS, A = Z + LAYERS, TMP = A + LAYERS, LOSS, GOUT, GIN, GZ, GW };
    for (uint32_t l = 0; l < LAYERS; l++)
        for (uint32_t k = 0; k < 4; k++)
            if (!push(q, W + 4 * l + k, wgt[l]))
                return 0;
    uint64_t allocs = 0;
    while (allocs < 2 * pairs) {
        if (allocs >= pairs && !q->timed_from)
            q->timed_from = q->n;
        size_t n0 = q->n;
        int ok = 1;
        for (uint32_t l = 0; l < LAYERS; l++) /* forward */
            ok &= push(q, Z + l, act[l]) && push(q, TMP, act[l]) && push(q, TMP, 0) &&
                  push(q, A + l, act[l]);
        ok &= push(q, LOSS, 64) && push(q, GOUT, act[LAYERS - 1]) && push(q, LOSS, 0);
        uint32_t gout = GOUT, gin = GIN;
        for (uint32_t l = LAYERS; l-- > 0;) { /* backward, then the layer's optimizer step */
            ok &= push(q, GZ, act[l]) && push(q, gout, 0) && push(q, A + l, 0) &&
                  push(q, GW, wgt[l]) && push(q, Z + l, 0);
            if (l)
                ok &= push(q, gin, act[l - 1]);
            ok &= push(q, GZ, 0) && push(q, TMP, wgt[l]) && push(q, TMP, 0) && push(q, GW, 0);
            uint32_t t = gout;
            gout = gin;
            gin = t;
        }
        if (!ok)
            return 0;
        for (size_t i = n0; i < q->n; i++)
            allocs += q->ev[i].size != 0;
    }
    return 1;
}

static void count_allocs(sequence *q)
{
    for (size_t i = 0; i < q->n; i++) {
        if (!q->ev[i].size)
            continue;
        if (i < q->timed_from)
            q->warm_allocs++;
        else
            q->timed_allocs++;
    }
}

/* ---- the ideal non-moving allocator -------------------------------------------------------- */

typedef struct span {
    uint64_t addr, size;
} span;

/* Peak top of the address range / peak bytes in use for best fit by address over one
 * unbounded range, sizes rounded to ARENA_ALIGN like the pool's. Returns 0 on allocation
 * failure of its own bookkeeping. */
static double arena_ratio(const sequence *q)
{
    span *holes = malloc((q->nslots + 2) * sizeof *holes), *live = calloc(q->nslots, sizeof *live);
    if (!holes || !live) {
        free(holes);
        free(live);
        return 0;
    }
    size_t nh = 0;
    uint64_t top = 0, peak_top = 0, in_use = 0, peak_in_use = 0;
    for (size_t i = 0; i < q->n; i++) {
        span *b = &live[q->ev[i].slot];
        if (b->size) { /* free: insert by address, merge with neighbours or the top */
            uint64_t a = b->addr, s = b->size;
            in_use -= s;
            b->size = 0;
            size_t j = 0;
            while (j < nh && holes[j].addr < a)
                j++;
            if (j < nh && holes[j].addr == a + s) {
                s += holes[j].size;
                memmove(holes + j, holes + j + 1, (nh - j - 1) * sizeof *holes);
                nh--;
            }
            if (j > 0 && holes[j - 1].addr + holes[j - 1].size == a) {
                a = holes[j - 1].addr;
                s += holes[j - 1].size;
                memmove(holes + j - 1, holes + j, (nh - j) * sizeof *holes);
                nh--;
                j--;
            }
            if (a + s == top) {
                top = a;
            } else {
                memmove(holes + j + 1, holes + j, (nh - j) * sizeof *holes);
                holes[j] = (span){a, s};
                nh++;
            }
        }
        uint64_t s = (q->ev[i].size + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
        if (!s)
            continue;
        size_t best = nh;
        for (size_t j = 0; j < nh; j++)
            if (holes[j].size >= s && (best == nh || holes[j].size < holes[best].size))
                best = j;
        if (best < nh) {
            b->addr = holes[best].addr;
            holes[best].addr += s;
            holes[best].size -= s;
            if (!holes[best].size) {
                memmove(holes + best, holes + best + 1, (nh - best - 1) * sizeof *holes);
                nh--;
            }
        } else {
            b->addr = top;
            top += s;
        }
        b->size = s;
        in_use += s;
        if (in_use > peak_in_use)
            peak_in_use = in_use;
        if (top > peak_top)
            peak_top = top;
    }
    free(holes);
    free(live);
    return peak_in_use ? (double)peak_top / (double)peak_in_use : 0;
}

/* ---- the runs ------------------------------------------------------------------------------- */

/* An instance of plugin name (a host-memory plugin: cpu_blas by default) whose pool is the one
 * benchmarked: the host's pool over the plugin's raw memory, as every tensor gets it, with no
 * reserve limit but the device's, the given cache limit and expandable segments or not. The
 * plugin is found through the user's configuration and loaded by path under a configuration
 * of the run's own. */
static ts_status bench_device(const char *config, const char *name, uint64_t cache_limit,
                              int use_vm, ts_device **out, ts_config **cfg_out)
{
    ts_config *base = NULL, *cfg = NULL;
    char *path = NULL, text[256];
    ts_status s = config ? ts_config_load(config, &base) : ts_config_defaults(&base);
    if (!s)
        s = ts_plugin_find(base, name, &path);
    if (!s) {
        snprintf(text, sizeof text, "[plugin.%s]\nmemory_fraction = 1\nexpandable_segments = %s\n",
                 name, use_vm ? "true" : "false");
        s = ts_config_parse(text, "bench pool", NULL, &cfg);
    }
    if (!s)
        s = ts_device_load(cfg, path, out);
    if (!s) {
        ts_memory_stats st;
        ts_device_memory_stats(*out, &st);
        if ((s = ts_device_set_limits(*out, st.reserve_limit, cache_limit))) {
            ts_device_unload(*out);
            *out = NULL;
        }
    }
    free(path);
    ts_config_free(base);
    if (s)
        ts_config_free(cfg);
    else
        *cfg_out = cfg;
    return s;
}

static uint64_t raw_calls(ts_device *dev)
{
    ts_memory_stats st;
    ts_device_memory_stats(dev, &st);
    return st.n_raw_alloc;
}

static int run(const sequence *q, ts_device *dev, result *r)
{
    void **live = calloc(q->nslots, sizeof *live);
    if (!live) {
        fprintf(stderr, "tessera: error: bench pool: out of memory for the sequence\n");
        return 0;
    }
    double t = 0;
    for (size_t i = 0; i < q->n; i++) {
        if (i == q->timed_from)
            t = cli_now();
        free(live[q->ev[i].slot]);
        live[q->ev[i].slot] = q->ev[i].size ? malloc(q->ev[i].size) : NULL;
    }
    r->ns_malloc = (cli_now() - t) * 1e9 / (double)q->timed_allocs;
    for (uint32_t i = 0; i < q->nslots; i++) {
        free(live[i]);
        live[i] = NULL;
    }

    ts_status st = TS_OK;
    ts_device_empty_cache(dev);
    ts_device_reset_peak(dev);
    uint64_t raw0 = raw_calls(dev), raw_timed = raw0;
    for (size_t i = 0; i < q->n; i++) {
        if (i == q->timed_from) {
            raw_timed = raw_calls(dev);
            r->raw_warmup = raw_timed - raw0;
            t = cli_now();
        }
        ts_device_free(dev, live[q->ev[i].slot]);
        live[q->ev[i].slot] = NULL;
        if (q->ev[i].size &&
            (st = ts_device_alloc(dev, q->ev[i].size, "bench", &live[q->ev[i].slot])) != TS_OK)
            break;
    }
    if (st == TS_OK) {
        r->ns_pool = (cli_now() - t) * 1e9 / (double)q->timed_allocs;
        r->per1000 = 1000.0 * (double)(raw_calls(dev) - raw_timed) / (double)q->timed_allocs;
    }
    ts_memory_stats s = {.struct_size = sizeof s};
    ts_device_memory_stats(dev, &s);
    for (uint32_t i = 0; i < q->nslots; i++)
        ts_device_free(dev, live[i]);
    ts_device_empty_cache(dev);
    free(live);
    if (st != TS_OK) {
        fprintf(stderr, "tessera: error: bench pool: %s\n", ts_last_error());
        return 0;
    }
    r->peak_reserved = s.peak_reserved;
    r->peak_in_use = s.peak_in_use;
    r->ratio = s.peak_in_use ? (double)s.peak_reserved / (double)s.peak_in_use : 0;
    r->arena_ratio = arena_ratio(q);
    return 1;
}

static void print_text(const sequence *q, const result *r)
{
    char b1[32], b2[32];
    if (!strcmp(q->mix, "training"))
        printf("training mix: a %d-layer network's steps (activations kept for backward, "
               "freed in reverse), %llu allocations timed after %llu of warm-up\n",
               LAYERS, (unsigned long long)q->timed_allocs, (unsigned long long)q->warm_allocs);
    else
        printf("random mix: %u live blocks replaced in random order, %llu allocations timed "
               "after %llu of warm-up\n", q->nslots, (unsigned long long)q->timed_allocs,
               (unsigned long long)q->warm_allocs);
    printf("  malloc/free     %10.1f ns per pair\n", r->ns_malloc);
    printf("  tessera pool    %10.1f ns per pair  (%.1fx faster)\n", r->ns_pool,
           r->ns_malloc / r->ns_pool);
    printf("  raw allocations %10.3f per 1000 pairs in steady state (%llu during warm-up)\n",
           r->per1000, (unsigned long long)r->raw_warmup);
    printf("  peak reserved   %s for a peak in use of %s (ratio %.3f; an ideal non-moving "
           "allocator: %.3f)\n", cli_bytes(r->peak_reserved, b1, sizeof b1),
           cli_bytes(r->peak_in_use, b2, sizeof b2), r->ratio, r->arena_ratio);
}

static void print_json(const sequence *q, const result *r)
{
    printf("\"%s\": {\"allocations\": %llu, \"warmup_allocations\": %llu, \"slots\": %u, "
           "\"malloc_ns_per_pair\": %.1f, \"pool_ns_per_pair\": %.1f, \"speedup\": %.2f, "
           "\"raw_allocs_per_1000_pairs\": %.3f, \"warmup_raw_allocs\": %llu, "
           "\"peak_reserved\": %llu, \"peak_in_use\": %llu, \"reserved_over_peak_in_use\": %.3f, "
           "\"ideal_reserved_over_peak_in_use\": %.3f}",
           q->mix, (unsigned long long)q->timed_allocs, (unsigned long long)q->warm_allocs,
           q->nslots, r->ns_malloc, r->ns_pool, r->ns_malloc / r->ns_pool, r->per1000,
           (unsigned long long)r->raw_warmup, (unsigned long long)r->peak_reserved,
           (unsigned long long)r->peak_in_use, r->ratio, r->arena_ratio);
}

#define USAGE                                                                              \
    "usage: tessera bench pool [--mix training|random|all] [--pairs N] [--working-set N] "     \
    "[--step N | --no-repeat] [--seed N] [--cache-limit BYTES] [--no-expandable] [--device NAME]\n" \
    "       [--json]\n" \
    "  --pairs 1..10^7 (default 200000), --working-set 1..10^6 (default 64), --step, --seed\n" \
    "  and --cache-limit 1..2^64-1; --device: the host-memory plugin whose pool is measured\n" \
    "  (default cpu_blas)\n"

int cli_bench_pool(int argc, char **argv, const cli_common *common)
{
    const char *device = "cpu_blas";
    uint64_t pairs = 200000, wset = 64, step = 1000, seed = 1;
    uint64_t cache_limit = UINT64_MAX; /* the steady state is the point; see docs/memory.md */
    int json = 0, mixes = 3;           /* bit 0: training, bit 1: random */
    int use_vm = 1;
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
        } else if (!strcmp(a, "--no-expandable")) {
            use_vm = 0;
        } else if (!strcmp(a, "--device") && i + 1 < argc) {
            device = argv[++i];
        } else if (!strcmp(a, "--no-repeat")) {
            step = 0;
        } else if (!strcmp(a, "--mix") && i + 1 < argc &&
                   (!strcmp(argv[i + 1], "training") || !strcmp(argv[i + 1], "random") ||
                    !strcmp(argv[i + 1], "all"))) {
            i++;
            mixes = !strcmp(argv[i], "training") ? 1 : !strcmp(argv[i], "random") ? 2 : 3;
        } else if (dst) {
            /* Bounded so that the sequences fit in memory (--pairs, --working-set). */
            uint64_t max = dst == &pairs ? 10000000 : dst == &wset ? 1000000 : UINT64_MAX;
            if (cli_parse_u64("bench pool", a, i + 1 < argc ? argv[i + 1] : NULL, 1, max, dst))
                return 2;
            i++;
        } else {
            fprintf(stderr, "tessera: error: bench pool: bad option '%s'\n%s", a, USAGE);
            return 2;
        }
    }

    if (json)
        printf("{\"seed\": %llu, \"shapes\": %d, \"min_bytes\": %.0f, \"max_bytes\": %.0f, "
               "\"expandable_segments\": %s, \"cache_limit\": ", (unsigned long long)seed,
               NSHAPES, MIN_BYTES, MAX_BYTES, use_vm ? "true" : "false");
    if (json && cache_limit != UINT64_MAX)
        printf("%llu", (unsigned long long)cache_limit);
    else if (json)
        printf("null");
    ts_device *dev = NULL;
    ts_config *dcfg = NULL;
    ts_status ds = bench_device(common ? common->config : NULL, device, cache_limit, use_vm,
                                &dev, &dcfg);
    if (ds) {
        if (json)
            printf("}\n");
        return cli_fail(ds, "bench pool");
    }
    int rc = 0;
    for (int m = 0; m < 2 && !rc; m++) {
        if (!(mixes & (1 << m)))
            continue;
        sequence q = {.mix = m == 0 ? "training" : "random"};
        result r = {0};
        int ok = m == 0 ? make_training(&q, seed, pairs)
                        : make_random(&q, seed, pairs, wset, step);
        if (!ok)
            fprintf(stderr, "tessera: error: bench pool: out of memory for the sequence\n");
        count_allocs(&q);
        if (ok && run(&q, dev, &r)) {
            if (json) {
                printf(", ");
                print_json(&q, &r);
            } else {
                print_text(&q, &r);
            }
        } else {
            rc = 1;
        }
        free(q.ev);
    }
    if (json)
        printf("}\n");
    ts_device_unload(dev);
    ts_config_free(dcfg);
    return rc;
}
