/* plugins/cpu_onednn/onednn.h: what the cpu_onednn files share: the plugin context, the
 * primitive cache (cpu_onednn.c) and the kernels on oneDNN primitives (matmul.c, conv.c,
 * eltwise.c).
 * Same contract as the hostkern families: TS_ENOTSUP with no message for ops they do not run.
 *
 * Every oneDNN primitive the plugin runs lives in a cache entry keyed by (op, the operands'
 * shapes and strides, params): created once, reused by every later call with the same key.
 * An entry holds the main primitive and, for each user operand whose layout differs from the
 * one the primitive wants (oneDNN's blocked formats for convolutions), a reorder between the
 * user's strided memory and a scratch buffer drawn from the plugin's pool per execution. The
 * scratchpad is user-managed (dnnl_scratchpad_mode_user), also from the pool per execution:
 * in oneDNN's default (library) mode a primitive owns one scratchpad and two threads executing
 * it at once would share it. */
#ifndef TESSERA_PLUGINS_CPU_ONEDNN_H
#define TESSERA_PLUGINS_CPU_ONEDNN_H

#include <pthread.h>

#include <dnnl.h>

#include "hostkern.h" /* kernels/host */

#define DN_CACHE_SIZE 256 /* most cached entries; the least recently used goes first */
#define DN_KEY_MAX 96     /* int64 words in a key */
#define DN_MAX_ARGS 4     /* user operands of one primitive */

/* What identifies a primitive: the words a kernel pushes (op, dims, strides, params). */
typedef struct dn_key {
    int32_t n;
    int64_t v[DN_KEY_MAX];
} dn_key;

/* One user operand of a cached primitive. Only descriptions: the dnnl_memory objects that
 * carry the data handles are made per execution (see dn_execute), so that threads running
 * the same entry at once never share one. */
typedef struct dn_arg {
    int arg;                  /* DNNL_ARG_SRC, ... */
    int is_output;
    dnnl_memory_desc_t user_md; /* the user's strided layout */
    dnnl_memory_desc_t prim_md; /* the primitive's layout when it differs (has_prim) */
    int has_prim;
    dnnl_primitive_t reorder; /* user -> prim (input) or prim -> user (output), or NULL */
    size_t prim_bytes;        /* size of a prim_md buffer */
} dn_arg;

/* A cached primitive. Immutable once in the cache but for last_use and refs (both under
 * dn_ctx.lock); oneDNN primitives are safe to execute from several threads at once when each
 * execution brings its own memory objects and scratchpad, which dn_execute does. */
typedef struct dn_entry {
    dn_key key;
    uint64_t hash, last_use;
    int refs; /* the cache's (while in it) plus one per caller between find/create and release */
    dnnl_primitive_desc_t pd, hint_pd; /* hint_pd: the forward pd a backward pd refers to */
    dnnl_primitive_t prim;
    int nargs;
    dn_arg args[DN_MAX_ARGS];
    dnnl_memory_desc_t scratch_md; /* user scratchpad, shared by prim and reorders */
    size_t scratch_bytes;          /* 0: none */
    int threads;                   /* the OpenMP threads it was made for and runs on */
} dn_entry;

#define DN_MAX_IDLE_STREAMS 16 /* streams kept for reuse; more threads make and destroy theirs */

/* The plugin context. run may be called from several threads at once (docs/writing-a-plugin.md):
 * lock guards the cache (its array, tick and every entry's refs and last_use) and the idle
 * streams; nothing is executed or created under it. */
enum { DN_DECLINED = 64 };

typedef struct dn_ctx {
    hk_dev hd; /* first: the hostdev vtable members take this ctx */
    dnnl_engine_t engine;
    pthread_mutex_t lock;
    dn_entry *cache[DN_CACHE_SIZE];
    int ncache;
    uint64_t tick;
    dnnl_stream_t idle[DN_MAX_IDLE_STREAMS]; /* streams no execution holds */
    int nidle;
    /* the keys of 16-bit matmuls oneDNN has no fast kernels for (under lock), so that they
     * go through float32 without asking again; a full list asks again */
    uint64_t declined[DN_DECLINED];
    int ndeclined;
} dn_ctx;

/* Key building: dn_key_push appends one word (silently marks the key unusable when full). */
void dn_key_push(dn_key *k, int64_t v);
void dn_key_push_double(dn_key *k, double v);
/* Whether key was declined (dn_declined), and marking it so; thread-safe. */
int dn_is_declined(dn_ctx *c, const dn_key *key);
void dn_declined(dn_ctx *c, const dn_key *key);

/* The cached entry for key, or NULL. Counts as a use. The caller holds a reference on the
 * entry (eviction by another thread does not free it) until dn_entry_release. */
dn_entry *dn_cache_find(dn_ctx *c, const dn_key *key);
/* The same for a primitive made for `threads` OpenMP threads (0: as dn_cache_find). */
dn_entry *dn_cache_find_nt(dn_ctx *c, const dn_key *key, int threads);
/* Drops the caller's reference from dn_cache_find or dn_cache_create; NULL is a no-op. */
void dn_entry_release(dn_ctx *c, dn_entry *e);

/* A user operand as a oneDNN memory descriptor of ndim dims / strides (elements; size-1
 * dims get a plain stride). */
dnnl_status_t dn_md_strided(dnnl_memory_desc_t *md, int ndim, const int64_t *dims,
                            const int64_t *strides);
/* The same in dtype (TS_F32, TS_BF16 or TS_F16). */
dnnl_status_t dn_md_strided_dt(dnnl_memory_desc_t *md, int ndim, const int64_t *dims,
                               const int64_t *strides, int32_t dtype);

/* Description of a primitive to create: op_desc and attr (attr: NULL or one with whatever
 * the op needs; the scratchpad mode is set here), hint for backward ops. user[i] is the
 * layout of operand i (argument args[i], an output when outputs[i]), query[i] / qidx[i] what
 * to ask the pd for the layout it wants for it. */
typedef struct dn_spec {
    const_dnnl_op_desc_t op_desc;
    dnnl_primitive_attr_t attr;
    const_dnnl_op_desc_t hint_desc; /* forward op desc for a backward primitive, or NULL */
    int nargs;
    int args[DN_MAX_ARGS];
    int outputs[DN_MAX_ARGS];
    dnnl_memory_desc_t user[DN_MAX_ARGS];
    dnnl_query_t query[DN_MAX_ARGS];
    int qidx[DN_MAX_ARGS];
    int no_reference; /* refuse oneDNN's reference implementation (TS_ENOTSUP): a 16-bit
                       * primitive the CPU has no kernels for runs faster through float32 */
} dn_spec;

/* Creates the primitive(s) for spec and caches them under key; fails through host->fail
 * (name prefixes the message). The creation runs outside the lock: when another thread cached
 * the same key meanwhile, *out is that entry and the new one is dropped. *out is referenced
 * as by dn_cache_find. */
ts_status dn_cache_create(dn_ctx *c, const dn_key *key, const dn_spec *spec, const char *name,
                          dn_entry **out);

/* dn_cache_create for a primitive made for `threads` OpenMP threads (0: as dn_cache_create:
 * the plugin's threads now, or its setting for convolutions). */
ts_status dn_cache_create_nt(dn_ctx *c, const dn_key *key, int threads, const dn_spec *spec,
                             const char *name, dn_entry **out);

/* Runs e on the user buffers handles[i] (pointers to the operands' first elements),
 * reordering through pool scratch where needed, and waits for it. Every execution has its own
 * memory objects, scratch buffers, scratchpad and stream: safe to call from several threads
 * at once, on the same entry too. */
ts_status dn_execute(dn_ctx *c, dn_entry *e, void *const *handles, const char *name);

/* Runs nparts (at most DN_MAX_PARTS) independent parts of one operation side by side, part p
 * being e[p] (made for one thread) on handles[p], each as dn_execute runs an entry, on the
 * plugin's threads now, and waits for all. */
#define DN_MAX_PARTS 4
ts_status dn_execute_parts(dn_ctx *c, int nparts, dn_entry *const *e,
                           void *const (*handles)[DN_MAX_ARGS], const char *name);

/* Fails through host->fail with the dnnl status. */
ts_status dn_fail(dn_ctx *c, dnnl_status_t st, const char *name, const char *what);

int dn_matmul_supports(int32_t op, int32_t dtype);
ts_status dn_matmul(dn_ctx *c, const ts_kernel_call *call);
/* A bfloat16 / float16 matmul on oneDNN's primitive of that dtype (float32 accumulation; the
 * AVX512_BF16 / AMX kernels where the CPU has them). *declined when it does not take the call
 * (no primitive for this CPU, a layout oneDNN cannot describe, an aliased output): the caller
 * runs it through float32. */
ts_status dn_matmul_half(dn_ctx *c, const ts_kernel_call *call, int *declined);
int dn_conv_supports(int32_t op, int32_t dtype);
ts_status dn_conv(dn_ctx *c, const ts_kernel_call *call);
/* The 16-bit float convolutions on oneDNN's own bfloat16 / float16 kernels; declines
 * (*declined, nothing written) what it does not run natively. */
ts_status dn_conv_half(dn_ctx *c, const ts_kernel_call *call, int *declined);
/* Non-zero if oneDNN runs this UNARY / SOFTMAX / LOG_SOFTMAX call (F32, dense, large enough,
 * a function oneDNN computes as exactly as the host kernel); decided per call from the
 * operands, so the same op may run on either. */
int dn_eltwise_wants(const ts_kernel_call *call);
ts_status dn_eltwise(dn_ctx *c, const ts_kernel_call *call);

#endif
