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
 * scratchpad is user-managed (dnnl_scratchpad_mode_user), also from the pool per execution. */
#ifndef TESSERA_PLUGINS_CPU_ONEDNN_H
#define TESSERA_PLUGINS_CPU_ONEDNN_H

#include <dnnl.h>

#include "../common/hostkern.h"

#define DN_CACHE_SIZE 256 /* most cached entries; the least recently used goes first */
#define DN_KEY_MAX 96     /* int64 words in a key */
#define DN_MAX_ARGS 4     /* user operands of one primitive */

/* What identifies a primitive: the words a kernel pushes (op, dims, strides, params). */
typedef struct dn_key {
    int32_t n;
    int64_t v[DN_KEY_MAX];
} dn_key;

/* One user operand of a cached primitive. */
typedef struct dn_arg {
    int arg;                  /* DNNL_ARG_SRC, ... */
    int is_output;
    dnnl_memory_t user_mem;   /* the user's strided layout; handle set per execution */
    dnnl_memory_t prim_mem;   /* the primitive's layout when it differs, else NULL */
    dnnl_primitive_t reorder; /* user -> prim (input) or prim -> user (output), or NULL */
    size_t prim_bytes;        /* size of prim_mem's buffer */
} dn_arg;

typedef struct dn_entry {
    dn_key key;
    uint64_t hash, last_use;
    dnnl_primitive_desc_t pd, hint_pd; /* hint_pd: the forward pd a backward pd refers to */
    dnnl_primitive_t prim;
    int nargs;
    dn_arg args[DN_MAX_ARGS];
    dnnl_memory_t scratch_mem; /* user scratchpad, shared by prim and reorders; or NULL */
    size_t scratch_bytes;
} dn_entry;

typedef struct dn_ctx {
    ts_hostdev hd; /* first: the hostdev vtable members take this ctx */
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    dn_entry *cache[DN_CACHE_SIZE];
    int ncache;
    uint64_t tick;
} dn_ctx;

/* Key building: dn_key_push appends one word (silently marks the key unusable when full). */
void dn_key_push(dn_key *k, int64_t v);
void dn_key_push_double(dn_key *k, double v);

/* The cached entry for key, or NULL. Counts as a use. */
dn_entry *dn_cache_find(dn_ctx *c, const dn_key *key);

/* A user operand as a oneDNN memory descriptor of ndim dims / strides (elements; size-1
 * dims get a plain stride). */
dnnl_status_t dn_md_strided(dnnl_memory_desc_t *md, int ndim, const int64_t *dims,
                            const int64_t *strides);

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
} dn_spec;

/* Creates the primitive(s) for spec and caches them under key; fails through host->fail
 * (name prefixes the message). */
ts_status dn_cache_create(dn_ctx *c, const dn_key *key, const dn_spec *spec, const char *name,
                          dn_entry **out);

/* Runs e on the user buffers handles[i] (pointers to the operands' first elements),
 * reordering through pool scratch where needed, and waits for it. */
ts_status dn_execute(dn_ctx *c, dn_entry *e, void *const *handles, const char *name);

/* Fails through host->fail with the dnnl status. */
ts_status dn_fail(dn_ctx *c, dnnl_status_t st, const char *name, const char *what);

int dn_matmul_supports(int32_t op, int32_t dtype);
ts_status dn_matmul(dn_ctx *c, const ts_kernel_call *call);
int dn_conv_supports(int32_t op, int32_t dtype);
ts_status dn_conv(dn_ctx *c, const ts_kernel_call *call);
/* Non-zero if oneDNN runs this UNARY / SOFTMAX / LOG_SOFTMAX call (F32, dense, large enough,
 * a function oneDNN computes as exactly as the host kernel); decided per call from the
 * operands, so the same op may run on either. */
int dn_eltwise_wants(const ts_kernel_call *call);
ts_status dn_eltwise(dn_ctx *c, const ts_kernel_call *call);

#endif
