/* plugins/cpu_onednn/cpu_onednn.c: the oneDNN backend: host memory from the shared pool
 * component, a oneDNN CPU engine and stream created at init, MATMUL and the CONV2D family
 * (F32) on oneDNN primitives (matmul.c, conv.c), large dense exp/tanh/sigmoid and softmaxes
 * too (eltwise.c decides per call), all kept in a bounded LRU cache; everything else from the
 * shared host kernels.
 *
 * Threads: Debian's libdnnl runs on OpenMP and sizes its parallel regions from
 * omp_get_max_threads(); every execution sets the calling thread's OpenMP thread count to the
 * "threads" setting (hd->threads) and restores the previous value afterwards, so the setting
 * holds for oneDNN without changing what the rest of the process sees. run may be called from
 * several host threads at once: the cache is locked, entries are reference counted so that an
 * eviction never frees one that another thread is executing, and each execution makes its own
 * memory objects and takes its own stream (onednn.h). */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "onednn.h"

/* Primitives (main ones and reorders) created and destroyed, and streams alive, over every
 * context of this plugin. Test-only diagnostics: not part of the plugin ABI; tests dlsym them
 * from the loaded module to check that steady state creates no primitive, that evicted
 * entries are freed (live primitives stay within the cache) and that streams are reused. */
static unsigned long long n_primitives, n_primitives_destroyed;
static long long n_streams;

/* Exported only from the test build of the plugin (tests/plugins/hooks/cpu_onednn.so, compiled
 * with TS_ONEDNN_TEST_HOOKS): the installed plugin exports its entry point and nothing else. */
#ifdef TS_ONEDNN_TEST_HOOKS
#define DN_TEST_HOOK __attribute__((visibility("default")))
#else
#define DN_TEST_HOOK
#endif

DN_TEST_HOOK unsigned long long cpu_onednn_primitive_count(void);
unsigned long long cpu_onednn_primitive_count(void)
{
    return __atomic_load_n(&n_primitives, __ATOMIC_RELAXED);
}

DN_TEST_HOOK long long cpu_onednn_primitive_live(void);
long long cpu_onednn_primitive_live(void)
{
    return (long long)(__atomic_load_n(&n_primitives, __ATOMIC_RELAXED) -
                       __atomic_load_n(&n_primitives_destroyed, __ATOMIC_RELAXED));
}

DN_TEST_HOOK long long cpu_onednn_stream_live(void);
long long cpu_onednn_stream_live(void)
{
    return __atomic_load_n(&n_streams, __ATOMIC_RELAXED);
}

static void destroy_primitive(dnnl_primitive_t p)
{
    dnnl_primitive_destroy(p);
    __atomic_add_fetch(&n_primitives_destroyed, 1, __ATOMIC_RELAXED);
}

static dnnl_status_t make_stream(dn_ctx *c, dnnl_stream_t *s)
{
    dnnl_status_t st = dnnl_stream_create(s, c->engine, dnnl_stream_default_flags);
    if (st == dnnl_success)
        __atomic_add_fetch(&n_streams, 1, __ATOMIC_RELAXED);
    return st;
}

static void destroy_stream(dnnl_stream_t s)
{
    dnnl_stream_destroy(s);
    __atomic_sub_fetch(&n_streams, 1, __ATOMIC_RELAXED);
}

static const ts_config_key keys[] = {
    HK_KEYS("false", "fewer threads while other processes use the cores (oneDNN's matmuls "
                     "then give bits that follow the load on some CPUs)"),
    {NULL, 0, NULL, 0, 0, NULL},
};

/* ---------------------------------------------------------------------------------------- */
/* Primitive cache.                                                                          */

void dn_key_push(dn_key *k, int64_t v)
{
    if (k->n < 0)
        return;
    if (k->n >= DN_KEY_MAX) {
        k->n = -1; /* too long: never cached, never matched */
        return;
    }
    k->v[k->n++] = v;
}

void dn_key_push_double(dn_key *k, double v)
{
    int64_t bits;
    memcpy(&bits, &v, sizeof bits);
    dn_key_push(k, bits);
}

static uint64_t key_hash(const dn_key *k)
{
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < k->n; i++) {
        h ^= (uint64_t)k->v[i];
        h *= 1099511628211ull;
        h ^= h >> 29;
    }
    return h;
}

int dn_is_declined(dn_ctx *c, const dn_key *key)
{
    uint64_t h = key_hash(key);
    int found = 0;
    pthread_mutex_lock(&c->lock);
    for (int i = 0; i < c->ndeclined && !found; i++)
        found = c->declined[i] == h;
    pthread_mutex_unlock(&c->lock);
    return found;
}

void dn_declined(dn_ctx *c, const dn_key *key)
{
    uint64_t h = key_hash(key);
    pthread_mutex_lock(&c->lock);
    if (c->ndeclined < DN_DECLINED)
        c->declined[c->ndeclined++] = h;
    pthread_mutex_unlock(&c->lock);
}

static int key_equal(const dn_key *a, const dn_key *b)
{
    return a->n == b->n && a->n >= 0 && memcmp(a->v, b->v, (size_t)a->n * sizeof a->v[0]) == 0;
}

static void entry_destroy(dn_entry *e)
{
    if (!e)
        return;
    for (int i = 0; i < e->nargs; i++)
        if (e->args[i].reorder)
            destroy_primitive(e->args[i].reorder);
    if (e->prim)
        destroy_primitive(e->prim);
    if (e->pd)
        dnnl_primitive_desc_destroy(e->pd);
    if (e->hint_pd)
        dnnl_primitive_desc_destroy(e->hint_pd);
    free(e);
}

/* The entry for key in the cache, referenced for the caller, or NULL. Under c->lock. */
static dn_entry *find_locked(dn_ctx *c, const dn_key *key, uint64_t h)
{
    for (int i = 0; i < c->ncache; i++) {
        dn_entry *e = c->cache[i];
        if (e->hash == h && key_equal(&e->key, key)) {
            e->last_use = ++c->tick;
            e->refs++;
            return e;
        }
    }
    return NULL;
}

/* key with the thread count the primitive is made for: oneDNN fixes a primitive's parallel
 * regions when it creates it, so when adaptive_threads (off by default here) changes the
 * count (another process took a core) the next call makes, and caches, a primitive for the
 * new count instead of running the old one's threads on too few cores. Convolutions keep the
 * threads setting: oneDNN splits their sums (the weight gradient's over the images) by
 * thread. Matmuls adapt, and their bits follow the count on some CPUs (AVX2: the GPT's
 * 10-step checkpoints on 1 and 2 running threads differ; with AVX-512 they were equal),
 * which is why adapting is opt-in on this plugin; a matmul cut into parts (matmul.c) makes
 * them for one thread (forced), and its bits stay. */
static dn_key with_threads(const dn_ctx *c, const dn_key *key, int forced, int *threads)
{
    dn_key k = *key;
    int conv = key->n > 0 && (key->v[0] == TS_OP_CONV2D || key->v[0] == TS_OP_CONV2D_BWD_DATA ||
                              key->v[0] == TS_OP_CONV2D_BWD_WEIGHT);
    int nt = forced > 0 ? forced : conv ? c->hd.configured : hk_threads(&c->hd);
    dn_key_push(&k, nt);
    if (threads)
        *threads = nt > 0 ? nt : c->hd.configured;
    return k;
}

dn_entry *dn_cache_find(dn_ctx *c, const dn_key *key0)
{
    return dn_cache_find_nt(c, key0, 0);
}

dn_entry *dn_cache_find_nt(dn_ctx *c, const dn_key *key0, int threads)
{
    const dn_key tk = with_threads(c, key0, threads, NULL), *key = &tk;
    if (key->n < 0)
        return NULL;
    uint64_t h = key_hash(key);
    pthread_mutex_lock(&c->lock);
    dn_entry *e = find_locked(c, key, h);
    pthread_mutex_unlock(&c->lock);
    return e;
}

void dn_entry_release(dn_ctx *c, dn_entry *e)
{
    if (!e)
        return;
    pthread_mutex_lock(&c->lock);
    int last = --e->refs == 0;
    pthread_mutex_unlock(&c->lock);
    if (last)
        entry_destroy(e);
}

ts_status dn_fail(dn_ctx *c, dnnl_status_t st, const char *name, const char *what)
{
    const ts_host *h = c->hd.host;
    ts_status code = st == dnnl_out_of_memory ? TS_ENOMEM
                     : st == dnnl_unimplemented ? TS_ENOTSUP
                                                : TS_EINVAL;
    return h->fail(h, code, "%s: %s failed (dnnl_status %d%s)", name, what, (int)st,
                   st == dnnl_unimplemented ? ": no oneDNN implementation" : "");
}

static dnnl_status_t make_primitive(dnnl_primitive_t *p, const_dnnl_primitive_desc_t pd)
{
    dnnl_status_t st = dnnl_primitive_create(p, pd);
    if (st == dnnl_success)
        __atomic_add_fetch(&n_primitives, 1, __ATOMIC_RELAXED);
    return st;
}

static size_t scratch_size(const_dnnl_primitive_desc_t pd)
{
    const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    return md ? dnnl_memory_desc_get_size(md) : 0;
}

dnnl_status_t dn_md_strided(dnnl_memory_desc_t *md, int ndim, const int64_t *dims,
                            const int64_t *strides)
{
    return dn_md_strided_dt(md, ndim, dims, strides, TS_F32);
}

dnnl_status_t dn_md_strided_dt(dnnl_memory_desc_t *md, int ndim, const int64_t *dims,
                               const int64_t *strides, int32_t dtype)
{
    dnnl_dims_t d, s;
    for (int i = 0; i < ndim; i++) {
        d[i] = dims[i];
        s[i] = strides[i];
        if (dims[i] == 1) {
            /* A size-1 dim's stride is free: give it the plain one (the extent of the dims
             * after it), which is what oneDNN's plain layouts have. */
            int64_t ext = 1;
            for (int j = i + 1; j < ndim; j++)
                if (dims[j] > 1 && strides[j] * dims[j] > ext)
                    ext = strides[j] * dims[j];
            s[i] = ext;
        }
    }
    return dnnl_memory_desc_init_by_strides(md, ndim, d,
                                            dtype == TS_BF16  ? dnnl_bf16
                                            : dtype == TS_F16 ? dnnl_f16
                                                              : dnnl_f32,
                                            s);
}

static ts_status cache_create(dn_ctx *c, const dn_key *key, int threads, const dn_spec *spec,
                              const char *name, dn_entry **out);

/* oneDNN sizes a primitive's parallel regions when it creates it (from
 * omp_get_max_threads()): create it for the thread count in its key (with_threads), the
 * count dn_execute runs it with. */
ts_status dn_cache_create(dn_ctx *c, const dn_key *key0, const dn_spec *spec, const char *name,
                          dn_entry **out)
{
    return dn_cache_create_nt(c, key0, 0, spec, name, out);
}

ts_status dn_cache_create_nt(dn_ctx *c, const dn_key *key0, int threads, const dn_spec *spec,
                             const char *name, dn_entry **out)
{
    int nt;
    const dn_key key = with_threads(c, key0, threads, &nt);
#ifdef _OPENMP
    int omp_before = omp_get_max_threads();
    omp_set_num_threads(nt);
#endif
    ts_status s = cache_create(c, &key, nt, spec, name, out);
#ifdef _OPENMP
    omp_set_num_threads(omp_before);
#endif
    return s;
}

static ts_status cache_create(dn_ctx *c, const dn_key *key, int threads, const dn_spec *spec,
                              const char *name, dn_entry **out)
{
    if (key->n < 0)
        return c->hd.host->fail(c->hd.host, TS_EINVAL, "%s: primitive key too long", name);
    dn_entry *e = calloc(1, sizeof *e);
    if (!e)
        return c->hd.host->fail(c->hd.host, TS_ENOMEM, "%s: out of memory", name);
    e->key = *key;
    e->threads = threads;
    e->hash = key_hash(key);
    ts_status s = TS_OK;
    dnnl_status_t st;
    dnnl_primitive_attr_t rattr = NULL;
    const char *what = "dnnl_primitive_attr_set_scratchpad_mode";
    if ((st = dnnl_primitive_attr_set_scratchpad_mode(spec->attr, dnnl_scratchpad_mode_user)))
        goto dfail;
    if (spec->hint_desc) {
        what = "creating the forward hint primitive descriptor";
        if ((st = dnnl_primitive_desc_create(&e->hint_pd, spec->hint_desc, NULL, c->engine,
                                             NULL)))
            goto dfail;
    }
    what = "dnnl_primitive_desc_create";
    if ((st = dnnl_primitive_desc_create(&e->pd, spec->op_desc, spec->attr, c->engine,
                                         e->hint_pd)))
        goto dfail;
    const char *impl = NULL;
    if (spec->no_reference &&
        (dnnl_primitive_desc_query(e->pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success ||
         !impl || !strncmp(impl, "ref", 3))) {
        st = dnnl_unimplemented; /* only oneDNN's reference loops for it on this CPU */
        goto dfail;
    }
    what = "dnnl_primitive_create";
    if ((st = make_primitive(&e->prim, e->pd)))
        goto dfail;
    e->scratch_bytes = scratch_size(e->pd);

    what = "creating the reorder attributes";
    if ((st = dnnl_primitive_attr_create(&rattr)) ||
        (st = dnnl_primitive_attr_set_scratchpad_mode(rattr, dnnl_scratchpad_mode_user)))
        goto dfail;
    e->nargs = spec->nargs;
    for (int i = 0; i < spec->nargs; i++) {
        dn_arg *a = &e->args[i];
        a->arg = spec->args[i];
        a->is_output = spec->outputs[i];
        const dnnl_memory_desc_t *um = &spec->user[i];
        a->user_md = *um;
        const dnnl_memory_desc_t *pm = dnnl_primitive_desc_query_md(e->pd, spec->query[i],
                                                                    spec->qidx[i]);
        what = "querying a primitive's memory descriptor";
        if (!pm) {
            st = dnnl_runtime_error;
            goto dfail;
        }
        if (dnnl_memory_desc_equal(um, pm))
            continue;
        dnnl_primitive_desc_t rpd = NULL;
        what = "creating a reorder";
        if (a->is_output)
            st = dnnl_reorder_primitive_desc_create(&rpd, pm, c->engine, um, c->engine, rattr);
        else
            st = dnnl_reorder_primitive_desc_create(&rpd, um, c->engine, pm, c->engine, rattr);
        if (st)
            goto dfail;
        st = make_primitive(&a->reorder, rpd);
        size_t rs = scratch_size(rpd);
        dnnl_primitive_desc_destroy(rpd);
        if (st)
            goto dfail;
        if (rs > e->scratch_bytes)
            e->scratch_bytes = rs;
        a->prim_bytes = dnnl_memory_desc_get_size(pm);
        a->prim_md = *pm;
        a->has_prim = 1;
    }
    if (e->scratch_bytes) {
        dnnl_dims_t dims = {(dnnl_dim_t)e->scratch_bytes};
        what = "creating the scratchpad memory descriptor";
        if ((st = dnnl_memory_desc_init_by_tag(&e->scratch_md, 1, dims, dnnl_u8, dnnl_a)))
            goto dfail;
    }
    dnnl_primitive_attr_destroy(rattr);
    rattr = NULL;

    /* Another thread may have cached the same key while this one created its primitives: use
     * that entry (one per key) and drop this one. A full cache evicts its least recently used
     * entry; a thread still running it keeps it alive until it releases it. */
    dn_entry *victim = NULL, *dup;
    pthread_mutex_lock(&c->lock);
    if ((dup = find_locked(c, key, e->hash))) {
        pthread_mutex_unlock(&c->lock);
        entry_destroy(e);
        *out = dup;
        return TS_OK;
    }
    if (c->ncache == DN_CACHE_SIZE) {
        int lru = 0;
        for (int i = 1; i < c->ncache; i++)
            if (c->cache[i]->last_use < c->cache[lru]->last_use)
                lru = i;
        victim = c->cache[lru];
        if (--victim->refs != 0)
            victim = NULL; /* its last user destroys it */
        c->cache[lru] = c->cache[--c->ncache];
    }
    e->refs = 2; /* the cache's and the caller's */
    c->cache[c->ncache++] = e;
    e->last_use = ++c->tick;
    pthread_mutex_unlock(&c->lock);
    entry_destroy(victim);
    *out = e;
    return TS_OK;
dfail:
    s = dn_fail(c, st, name, what);
    if (rattr)
        dnnl_primitive_attr_destroy(rattr);
    entry_destroy(e);
    return s;
}

static dnnl_status_t run_reorder(dnnl_stream_t stream, dnnl_primitive_t r, dnnl_memory_t from,
                                 dnnl_memory_t to, dnnl_memory_t scratch)
{
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to},
                               {DNNL_ARG_SCRATCHPAD, scratch}};
    return dnnl_primitive_execute(r, stream, scratch ? 3 : 2, args);
}

/* A memory object of md over handle, for one execution. */
static dnnl_status_t make_memory(dn_ctx *c, dnnl_memory_t *m, const dnnl_memory_desc_t *md,
                                 void *handle)
{
    dnnl_status_t st = dnnl_memory_create(m, md, c->engine, DNNL_MEMORY_NONE);
    if (st == dnnl_success && (st = dnnl_memory_set_data_handle(*m, handle)) != dnnl_success) {
        dnnl_memory_destroy(*m);
        *m = NULL;
    }
    return st;
}

/* A stream no other execution holds: an idle one, or a new one. */
static dnnl_status_t stream_get(dn_ctx *c, dnnl_stream_t *s)
{
    pthread_mutex_lock(&c->lock);
    *s = c->nidle > 0 ? c->idle[--c->nidle] : NULL;
    pthread_mutex_unlock(&c->lock);
    return *s ? dnnl_success : make_stream(c, s);
}

static void stream_put(dn_ctx *c, dnnl_stream_t s)
{
    if (!s)
        return;
    pthread_mutex_lock(&c->lock);
    if (c->nidle < DN_MAX_IDLE_STREAMS) {
        c->idle[c->nidle++] = s;
        s = NULL;
    }
    pthread_mutex_unlock(&c->lock);
    if (s)
        destroy_stream(s);
}

/* One execution of an entry: its stream, scratchpad and memory objects, made on the calling
 * thread (run_prepare), so that failures report there; run_exec may then run on any thread. */
typedef struct dn_run {
    dnnl_stream_t stream;
    void *scratch, *bufs[DN_MAX_ARGS];
    dnnl_memory_t smem, user[DN_MAX_ARGS], prim[DN_MAX_ARGS];
    dnnl_status_t st; /* run_exec's */
    const char *what; /* what failed */
} dn_run;

static ts_status run_prepare(dn_ctx *c, const dn_entry *e, void *const *handles,
                             const char *name, dn_run *r)
{
    const ts_host *h = c->hd.host;
    ts_status s;
    memset(r, 0, sizeof *r);
    r->what = "dnnl_stream_create";
    if ((r->st = stream_get(c, &r->stream)))
        return dn_fail(c, r->st, name, r->what);
    r->what = "creating a memory object";
    if (e->scratch_bytes) {
        if ((s = h->scratch_alloc(h, e->scratch_bytes, name, &r->scratch)))
            return s;
        if ((r->st = make_memory(c, &r->smem, &e->scratch_md, r->scratch)))
            return dn_fail(c, r->st, name, r->what);
    }
    for (int i = 0; i < e->nargs; i++) {
        const dn_arg *a = &e->args[i];
        if ((r->st = make_memory(c, &r->user[i], &a->user_md, handles[i])))
            return dn_fail(c, r->st, name, r->what);
        if (!a->has_prim)
            continue;
        if ((s = h->scratch_alloc(h, a->prim_bytes ? a->prim_bytes : 1, name, &r->bufs[i])))
            return s;
        if ((r->st = make_memory(c, &r->prim[i], &a->prim_md, r->bufs[i])))
            return dn_fail(c, r->st, name, r->what);
    }
    return TS_OK;
}

/* Input reorders, the primitive, output reorders, and the wait: r->st, r->what on failure. */
static void run_exec(const dn_entry *e, dn_run *r)
{
    dnnl_exec_arg_t args[DN_MAX_ARGS + 1];
    int nargs = 0;
    r->what = "reordering an input";
    for (int i = 0; i < e->nargs; i++) {
        const dn_arg *a = &e->args[i];
        if (a->has_prim && !a->is_output &&
            (r->st = run_reorder(r->stream, a->reorder, r->user[i], r->prim[i], r->smem)))
            goto fail;
        args[nargs++] = (dnnl_exec_arg_t){a->arg, a->has_prim ? r->prim[i] : r->user[i]};
    }
    if (r->smem)
        args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, r->smem};
    r->what = "dnnl_primitive_execute";
    if ((r->st = dnnl_primitive_execute(e->prim, r->stream, nargs, args)))
        goto fail;
    r->what = "reordering an output";
    for (int i = 0; i < e->nargs; i++) {
        const dn_arg *a = &e->args[i];
        if (a->is_output && a->has_prim &&
            (r->st = run_reorder(r->stream, a->reorder, r->prim[i], r->user[i], r->smem)))
            goto fail;
    }
    r->what = "dnnl_stream_wait";
    r->st = dnnl_stream_wait(r->stream);
    return;
fail:
    dnnl_stream_wait(r->stream);
}

static void run_finish(dn_ctx *c, const dn_entry *e, dn_run *r)
{
    const ts_host *h = c->hd.host;
    for (int i = 0; i < e->nargs; i++) {
        if (r->user[i])
            dnnl_memory_destroy(r->user[i]);
        if (r->prim[i])
            dnnl_memory_destroy(r->prim[i]);
        h->scratch_free(h, r->bufs[i]);
    }
    if (r->smem)
        dnnl_memory_destroy(r->smem);
    h->scratch_free(h, r->scratch);
    stream_put(c, r->stream);
}

ts_status dn_execute(dn_ctx *c, dn_entry *e, void *const *handles, const char *name)
{
    dn_run r;
    ts_status s = run_prepare(c, e, handles, name, &r);
    if (!s) {
#ifdef _OPENMP
        int omp_before = omp_get_max_threads();
        if (e->threads > 0) /* the count the primitive was made for */
            omp_set_num_threads(e->threads);
#endif
        run_exec(e, &r);
#ifdef _OPENMP
        omp_set_num_threads(omp_before);
#endif
        if (r.st)
            s = dn_fail(c, r.st, name, r.what);
    }
    run_finish(c, e, &r);
    return s;
}

ts_status dn_execute_parts(dn_ctx *c, int nparts, dn_entry *const *e,
                           void *const (*handles)[DN_MAX_ARGS], const char *name)
{
    dn_run r[DN_MAX_PARTS];
    ts_status s = TS_OK;
    int made = 0;
    if (nparts > DN_MAX_PARTS)
        return c->hd.host->fail(c->hd.host, TS_EINVAL, "%s: %d parts (at most %d)", name,
                                nparts, DN_MAX_PARTS);
    while (made < nparts && !s)
        s = run_prepare(c, e[made], handles[made], name, &r[made]), made++;
    if (!s) {
        int nt = hk_threads(&c->hd);
        nt = nt < nparts ? nt : nparts;
        (void)nt;
        /* Each part's primitive was made for one thread: run the parts side by side, each on
         * one thread. oneDNN's gemm-based kernels read the thread count when they run, not
         * when they are made, so the count is 1 for the parts' execution too, also when they
         * run one after the other on this thread (one thread running: no parallel region). */
#ifdef _OPENMP
        int omp_before = omp_get_max_threads();
        omp_set_num_threads(1);
#endif
#pragma omp parallel for num_threads(nt) schedule(static, 1) if (nt > 1)
        for (int p = 0; p < nparts; p++)
            run_exec(e[p], &r[p]);
#ifdef _OPENMP
        omp_set_num_threads(omp_before);
#endif
        for (int p = 0; p < nparts && !s; p++)
            if (r[p].st)
                s = dn_fail(c, r[p].st, name, r[p].what);
    }
    for (int p = 0; p < made; p++)
        run_finish(c, e[p], &r[p]);
    return s;
}

/* ---------------------------------------------------------------------------------------- */
/* Plugin.                                                                                   */

static void dnnl_shutdown_ctx(void *ctx)
{
    dn_ctx *c = ctx;
    /* shutdown is never concurrent with run: every entry holds only the cache's reference. */
    for (int i = 0; i < c->ncache; i++)
        entry_destroy(c->cache[i]);
    c->ncache = 0;
    for (int i = 0; i < c->nidle; i++)
        destroy_stream(c->idle[i]);
    c->nidle = 0;
    pthread_mutex_destroy(&c->lock);
    if (c->engine)
        dnnl_engine_destroy(c->engine);
    free(c);
}

static ts_status dnnl_init_ctx(const ts_host *host, const ts_setting *settings, size_t nsettings,
                               void **ctx)
{
    dn_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return host->fail(host, TS_ENOMEM, "out of memory creating the plugin context");
    pthread_mutex_init(&c->lock, NULL);
    ts_status s;
    hk_dev_init(&c->hd, host, "cpu_onednn", settings, nsettings);
    dnnl_status_t ds = dnnl_engine_create(&c->engine, dnnl_cpu, 0);
    if (ds != dnnl_success) {
        s = host->fail(host, TS_ENODEV, "dnnl_engine_create(cpu) failed (dnnl_status %d)",
                       (int)ds);
        goto fail;
    }
    /* One stream made here and kept idle: a failure shows at load, not at the first run. */
    ds = make_stream(c, &c->idle[0]);
    if (ds != dnnl_success) {
        s = host->fail(host, TS_ENODEV, "dnnl_stream_create failed (dnnl_status %d)", (int)ds);
        goto fail;
    }
    c->nidle = 1;
    *ctx = c;
    return TS_OK;
fail:
    dnnl_shutdown_ctx(c);
    return s;
}

static ts_status dnnl_device_info(void *ctx, ts_device_info *info)
{
    ts_status s = hk_dev_device_info(ctx, info);
    if (s == TS_OK) {
        const dnnl_version_t *v = dnnl_version();
        dn_ctx *c = ctx;
        snprintf(info->name, sizeof info->name, "host CPU, %d threads, oneDNN %d.%d.%d",
                 c->hd.configured, v->major, v->minor, v->patch);
    }
    return s;
}

static int dnnl_supports(void *ctx, int32_t op, int32_t dtype)
{
    if (ts_plugin_dtype_is_half(dtype)) /* in float32 around the primitives */
        return hk_half_claim(op) && dnnl_supports(ctx, op, TS_F32);
    return dn_matmul_supports(op, dtype) || dn_conv_supports(op, dtype) ||
           hk_supports(op, dtype);
}

static ts_status dnnl_run_f32(void *ctx, const ts_kernel_call *call);

static ts_status dnnl_run(void *ctx, const ts_kernel_call *call)
{
    dn_ctx *c = ctx;
    hk_dev_adapt(&c->hd);
    if (call->op == TS_OP_MATMUL && call->noutputs == 1 && call->outputs &&
        ts_plugin_dtype_is_half(call->outputs[0].dtype)) {
        int declined = 0;
        ts_status s = dn_matmul_half(c, call, &declined);
        if (!declined)
            return s;
    }
    if (dn_conv_supports(call->op, TS_F32) && call->noutputs == 1 && call->outputs &&
        ts_plugin_dtype_is_half(call->outputs[0].dtype)) {
        int declined = 0;
        ts_status s = dn_conv_half(c, call, &declined);
        if (!declined)
            return s;
    }
    if (hk_call_has_half(call) && !hk_half_native_call(call))
        return hk_via_float32(c->hd.host, 0, call, hk_convert, &c->hd, dnnl_run_f32, c);
    return dnnl_run_f32(c, call);
}

static ts_status dnnl_run_f32(void *ctx, const ts_kernel_call *call)
{
    dn_ctx *c = ctx;
    int32_t dtype = call->noutputs > 0 ? call->outputs[0].dtype : TS_F32;
    if (dn_matmul_supports(call->op, dtype))
        return dn_matmul(c, call);
    if (dn_conv_supports(call->op, dtype))
        return dn_conv(c, call);
    if (dn_eltwise_wants(call))
        return dn_eltwise(c, call);
    /* A family that claims the op writes its own, more precise message. */
    if (!hk_supports(call->op, dtype))
        return c->hd.host->fail(c->hd.host, TS_ENOTSUP, "op %d is not implemented for dtype %d",
                                (int)call->op, (int)dtype);
    return hk_run(&c->hd, call);
}

static const ts_plugin_desc desc = {
    .abi_major = TS_PLUGIN_ABI_MAJOR,
    .abi_minor = TS_PLUGIN_ABI_MINOR,
    .struct_size = sizeof(ts_plugin_desc),
    .name = "cpu_onednn",
    .version = PACKAGE_VERSION,
    .description = "CPU kernels with oneDNN primitives; bfloat16 and float16 matmuls and "
                   "convolutions native on oneDNN's 16-bit kernels where the CPU has them "
                   "(AVX512_BF16 or AMX for bfloat16, AVX512_FP16 for float16; convolutions "
                   "of 16 channels or more), else emulated in float32 like the other ops",
    .config_keys = keys,
    HK_DESC_MEMBERS,
    .init = dnnl_init_ctx,
    .shutdown = dnnl_shutdown_ctx,
    .device_info = dnnl_device_info,
    .supports = dnnl_supports,
    .run = dnnl_run,
};

TS_PLUGIN_DEFINE(desc)
