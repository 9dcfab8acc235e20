/* tessera/plugin.h: the whole device-plugin ABI. A plugin is a shared object exporting one
 * symbol, tessera_plugin_entry, that returns a descriptor: plain data and function pointers,
 * no tessera objects, no refcounts. Everything a plugin needs from the host (errors, logging,
 * the caching pool component, host memory figures) comes through the ts_host table it is
 * handed at init, so a plugin never links against libtessera. Includes only status.h.
 *
 * Versioning rules (docs/writing-a-plugin.md has the full contract):
 *  - abi_major changes when anything existing changes meaning or layout; the host refuses a
 *    plugin whose major differs from its own.
 *  - abi_minor grows when members are appended to a table or values to an enum. Every table
 *    starts with struct_size; a reader uses a member only if it lies inside struct_size, so
 *    an older plugin (shorter table) keeps loading on a newer host and vice versa.
 *  - Slots marked (optional) may be NULL; the host checks before calling. */
#ifndef TESSERA_PLUGIN_H
#define TESSERA_PLUGIN_H

#include <stddef.h>
#include <stdint.h>
#include <tessera/status.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TS_PLUGIN_ABI_MAJOR 1
#define TS_PLUGIN_ABI_MINOR 3

/* Most dims a tensor or operand has. */
#define TS_MAX_DIMS 8

/* True if the table t (whose struct_size field says how many bytes the other side filled)
 * contains the member m. Use it before reading any member added after abi 1.0. */
#define TS_HAS_MEMBER(t, type, m) \
    ((t)->struct_size >= offsetof(type, m) + sizeof(((type *)0)->m))

#if defined(__GNUC__)
#define TS_PLUGIN_EXPORT __attribute__((visibility("default")))
#else
#define TS_PLUGIN_EXPORT
#endif

/* Element types. Values are ABI: append only. */
typedef enum ts_dtype {
    TS_F32 = 0,
    TS_F64 = 1,
    TS_I32 = 2,
    TS_I64 = 3,
    TS_U8 = 4, /* booleans and masks */
    TS_DTYPE_COUNT
} ts_dtype;

/* Log levels, most severe first. */
typedef enum ts_log_level {
    TS_LOG_ERROR = 0,
    TS_LOG_WARN = 1,
    TS_LOG_INFO = 2,
    TS_LOG_DEBUG = 3
} ts_log_level;

/* ---------------------------------------------------------------------------------------- */
/* Configuration handed to a plugin: its [plugin.NAME] section, validated by the host.       */

typedef enum ts_setting_kind {
    TS_SETTING_STRING = 0,
    TS_SETTING_INT = 1,      /* decimal integer within [min, max] */
    TS_SETTING_SIZE = 2,     /* bytes, with an optional K/M/G/T suffix (powers of 1024) */
    TS_SETTING_FRACTION = 3, /* a number in (0, 1] */
    TS_SETTING_BOOL = 4      /* true/false, yes/no, on/off, 1/0 */
} ts_setting_kind;

/* A key a plugin accepts in its section, declared in its descriptor so that the host can
 * validate the INI file (file, line, key, expected form) before the plugin ever sees it. */
typedef struct ts_config_key {
    const char *name;          /* "threads" */
    int32_t kind;              /* ts_setting_kind */
    const char *default_value; /* text form, parsed like a file value; NULL = no default */
    int64_t min, max;          /* bounds for TS_SETTING_INT */
    const char *help;          /* one line for `tessera info` and the docs */
} ts_config_key;

/* One resolved setting: the file's value or the declared default. */
typedef struct ts_setting {
    const char *name;
    int32_t kind;        /* ts_setting_kind */
    int32_t from_file;   /* 1 if the INI file set it, 0 if it is the default */
    const char *text;    /* the value as written */
    union {
        int64_t i;       /* TS_SETTING_INT */
        uint64_t size;   /* TS_SETTING_SIZE, bytes */
        double fraction; /* TS_SETTING_FRACTION */
        int32_t boolean; /* TS_SETTING_BOOL */
    } v;
} ts_setting;

/* Keys every plugin has, validated by the host whether or not the plugin declares them (a
 * plugin may declare them to change the default):
 *   memory_fraction (fraction, default 0.5): most bytes the pool may reserve, as a share of
 *                   the device's total memory.
 *   cache_limit     (size, default 512M): most bytes kept in the pool's free lists.
 *   caching         (bool, default true): false sends every free straight back to the raw
 *                   allocator, so sanitizers see each block. */

/* ---------------------------------------------------------------------------------------- */
/* Memory figures.                                                                           */

/* Valid bits of ts_device_info.valid. Zero is never a sentinel for "unknown". */
#define TS_DEVINFO_TOTAL 0x1u
#define TS_DEVINFO_FREE 0x2u

typedef struct ts_device_info {
    uint32_t struct_size; /* set by the caller to sizeof(ts_device_info) */
    uint32_t valid;       /* TS_DEVINFO_* bits for the fields below that hold real values */
    int32_t count;        /* devices of this kind the plugin sees */
    int32_t index;        /* the one this instance drives */
    char name[128];       /* human-readable, e.g. "NVIDIA H100 80GB HBM3" */
    uint64_t total_bytes; /* device memory (host RAM, cgroup-capped, for CPU plugins) */
    uint64_t free_bytes;
} ts_device_info;

/* Statistics of one pool. valid says whether the plugin has pool figures at all. */
#define TS_STATS_POOL 0x1u

typedef struct ts_memory_stats {
    uint32_t struct_size; /* set by the caller to sizeof(ts_memory_stats) */
    uint32_t valid;       /* TS_STATS_POOL when the counters below are real */
    uint64_t in_use;      /* bytes in blocks handed out (after rounding) */
    uint64_t peak_in_use;
    uint64_t requested;   /* bytes asked for by callers, before rounding */
    uint64_t reserved;    /* bytes obtained from the raw allocator and not returned */
    uint64_t peak_reserved;
    uint64_t cached;      /* reserved bytes sitting in free lists */
    uint64_t largest_free; /* largest free block, bytes */
    uint64_t reserve_limit; /* memory_fraction applied to the device total; 0 = none */
    uint64_t cache_limit;
    uint64_t live_blocks;   /* allocations not yet freed */
    uint64_t n_alloc, n_free;         /* pool calls */
    uint64_t n_raw_alloc, n_raw_free; /* raw allocator calls */
    uint64_t cache_hits, cache_misses;
    uint64_t n_oom;         /* requests that failed with TS_ENOMEM */
} ts_memory_stats;

/* ---------------------------------------------------------------------------------------- */
/* The caching pool component, written once in the host and instantiated by each plugin     */
/* over its own raw allocator (malloc for CPUs, cudaMalloc for CUDA, ...).                   */

typedef struct ts_raw_allocator {
    void *user; /* handed back to both calls */
    /* Obtain nbytes (a multiple of the pool's alignment) aligned to that alignment. Return
     * TS_ENOMEM on failure; the pool then frees its cache and tries once more. */
    ts_status (*alloc)(void *user, size_t nbytes, void **ptr);
    /* Give back a block obtained from alloc, with the size it was obtained with. */
    void (*free)(void *user, void *ptr, size_t nbytes);
} ts_raw_allocator;

/* Optional (ABI 1.1): a raw allocator that can reserve address space and back pieces of it
 * with memory. Given one, the pool keeps every block over 1 MiB in a single range that grows
 * and shrinks at its end (an "expandable segment"): free neighbours always merge, so there is
 * no fragmentation between separate raw allocations. Host memory: mmap; CUDA: the driver's
 * cuMemAddressReserve/cuMemCreate/cuMemMap. */
typedef struct ts_raw_vm {
    uint32_t struct_size; /* sizeof(ts_raw_vm) */
    void *user;           /* handed back to every call */
    size_t granularity;   /* power of two >= the pool's alignment: commit sizes and offsets */
    uint64_t max_reserve; /* address space to reserve when the pool has no reserve_limit */
    /* Reserve nbytes of address space, no memory; the base is aligned to granularity. */
    ts_status (*reserve)(void *user, size_t nbytes, void **base);
    /* Give back a whole reservation (committed parts included). */
    void (*release)(void *user, void *base, size_t nbytes);
    /* Back [addr, addr + nbytes) of a reservation with memory; TS_ENOMEM when there is none. */
    ts_status (*commit)(void *user, void *addr, size_t nbytes);
    /* Return the memory behind [addr, addr + nbytes); the addresses stay reserved. */
    void (*decommit)(void *user, void *addr, size_t nbytes);
} ts_raw_vm;

typedef struct ts_pool_options {
    uint32_t struct_size;   /* sizeof(ts_pool_options) */
    const char *name;       /* used in messages and statistics: the plugin's name */
    size_t alignment;       /* power of two: every block is aligned to it (64 CPU, 256 CUDA) */
    uint64_t reserve_limit; /* most bytes reserved from the raw allocator; 0 = no limit */
    uint64_t cache_limit;   /* most bytes kept in free lists */
    int32_t caching;        /* 0: frees go straight back to the raw allocator */
    const ts_raw_vm *vm;    /* ABI 1.1, optional (NULL): an expandable segment; copied */
} ts_pool_options;

typedef struct ts_pool ts_pool;

/* All calls are thread safe. */
typedef struct ts_pool_api {
    uint32_t struct_size;
    /* Creates a pool; the raw allocator table is copied. (transfer full) on *out. */
    ts_status (*create)(const ts_pool_options *opts, const ts_raw_allocator *raw, ts_pool **out);
    /* Returns every cached block to the raw allocator and frees the pool. Blocks still live
     * are reported as leaks (log) and returned too. NULL is a no-op. */
    void (*destroy)(ts_pool *pool);
    /* A block of at least nbytes (0 gives a valid unique block). tag: a static string naming
     * the caller (an op name) for leak reports; may be NULL. TS_ENOMEM with a message giving
     * the request, in use, reserved, cached and the limits when it cannot be met. */
    ts_status (*alloc)(ts_pool *pool, size_t nbytes, const char *tag, void **ptr);
    /* Returns a block to the pool. NULL is a no-op. */
    void (*free)(ts_pool *pool, void *ptr);
    void (*stats)(ts_pool *pool, ts_memory_stats *out);
    void (*reset_peak)(ts_pool *pool);
    /* Returns every cached (free) block to the raw allocator. */
    void (*empty_cache)(ts_pool *pool);
    ts_status (*set_limits)(ts_pool *pool, uint64_t reserve_limit, uint64_t cache_limit);
} ts_pool_api;

/* ---------------------------------------------------------------------------------------- */
/* Kernels: one entry point, an op code, strided operands.                                   */

/* A tensor as a kernel sees it. Element (i0, ..., in) lives at
 * data + (offset + sum_k ik * strides[k]) * dtype_size. A stride of 0 broadcasts. */
typedef struct ts_operand {
    void *data;      /* device pointer to the storage's first byte */
    int64_t offset;  /* elements */
    int32_t dtype;   /* ts_dtype */
    int32_t ndim;    /* 0 (a scalar) to TS_MAX_DIMS */
    int64_t shape[TS_MAX_DIMS];
    int64_t strides[TS_MAX_DIMS]; /* elements */
} ts_operand;

/* Op codes. Values are ABI: append only. The host has already checked shapes, dtypes and
 * devices, broadcast inputs to the output's shape (stride 0 on broadcast dims), and made sure
 * outputs do not partially overlap inputs (an output may be exactly an input: in place).
 * Operands may have any strides, including negative-free non-contiguous views. The params
 * struct of each op is named next to it; params_size says how much of it the host filled. */
typedef enum ts_op {
    TS_OP_NONE = 0,
    /* out[0] = in[0]; same shape and dtype. No params. */
    TS_OP_COPY = 1,
    /* out[0] = (out dtype) in[0]; same shape, any dtypes (float -> int truncates toward 0,
     * anything -> U8 is != 0). No params. */
    TS_OP_CAST = 2,
    /* out[0][...] = value. ts_fill_params. */
    TS_OP_FILL = 3,
    /* out[0] = fn(in[0]); same shape and dtype. ts_unary_params. */
    TS_OP_UNARY = 4,
    /* out[0] = fn(in[0], in[1]); all the same shape; same dtype, except comparisons whose
     * output is TS_U8. ts_binary_params. */
    TS_OP_BINARY = 5,
    /* out[0] = fn(in[0], scalar) or fn(scalar, in[0]); ts_scalar_params. */
    TS_OP_BINARY_SCALAR = 6,
    /* out[0] = in[0] (TS_U8 mask) ? in[1] : in[2]. No params. */
    TS_OP_WHERE = 7,
    /* out[0] = reduce(in[0]) over every dim where out[0].shape[d] == 1 and in[0].shape[d] != 1
     * (out has in's ndim: "keepdim" layout). ARGMAX/ARGMIN reduce one dim (params.dim) and
     * write TS_I64 indices (first occurrence). ts_reduce_params. */
    TS_OP_REDUCE = 8,
    /* out[0] = in[0] @ in[1]: in[0] (B..., M, K), in[1] (B..., K, N), out (B..., M, N), the
     * batch dims already broadcast. Float dtypes. ts_matmul_params (alpha, beta: out =
     * alpha * a @ b + beta * out). */
    TS_OP_MATMUL = 9,
    /* Softmax / log-softmax of in[0] along params.dim, numerically stable (max subtracted).
     * ts_dim_params. */
    TS_OP_SOFTMAX = 10,
    TS_OP_LOG_SOFTMAX = 11,
    /* out[0] = in[0] gathered along params.dim at the TS_I64/TS_I32 indices in[1] (1-D):
     * out.shape = in[0].shape with dim replaced by len(in[1]). Indices are range-checked by
     * the plugin (TS_EINVAL naming the bad index). ts_dim_params. */
    TS_OP_INDEX_SELECT = 12,
    /* out[0] (already holding values) += in[0] scattered along params.dim at indices in[1]
     * (1-D): out.select(dim, idx[i]) += in[0].select(dim, i). ts_dim_params. */
    TS_OP_INDEX_ADD = 13,
    /* 2-D convolution. in[0] x (N, C, H, W), in[1] w (K, C/groups, R, S), optional in[2] bias
     * (K) (ninputs 2 or 3); out[0] y (N, K, P, Q). ts_conv2d_params. */
    TS_OP_CONV2D = 14,
    /* Max pooling. in[0] x (N, C, H, W); out[0] y (N, C, P, Q); optional out[1] TS_I64
     * indices (N, C, P, Q) of each max within its (H*W) plane, for backward. ts_pool2d_params. */
    TS_OP_MAXPOOL2D = 15,
    /* Average pooling; same shapes, no indices. ts_pool2d_params. */
    TS_OP_AVGPOOL2D = 16,
    /* Gradient of CONV2D w.r.t. x: in[0] gy (N, K, P, Q), in[1] w (K, C/groups, R, S);
     * out[0] gx (N, C, H, W), overwritten. ts_conv2d_params. */
    TS_OP_CONV2D_BWD_DATA = 17,
    /* Gradient of CONV2D w.r.t. w: in[0] gy (N, K, P, Q), in[1] x (N, C, H, W); out[0] gw
     * (K, C/groups, R, S), overwritten. ts_conv2d_params. (The bias gradient is a sum.) */
    TS_OP_CONV2D_BWD_WEIGHT = 18,
    /* Gradient of MAXPOOL2D: in[0] gy (N, C, P, Q), in[1] TS_I64 indices (N, C, P, Q) from
     * the forward; out[0] gx (N, C, H, W), overwritten (zeros, plus gy summed at each index).
     * ts_pool2d_params. */
    TS_OP_MAXPOOL2D_BWD = 19,
    /* Gradient of AVGPOOL2D: in[0] gy (N, C, P, Q); out[0] gx (N, C, H, W), overwritten.
     * ts_pool2d_params. */
    TS_OP_AVGPOOL2D_BWD = 20,
    /* Cross-entropy per sample, fused and numerically stable: in[0] logits (N, C) float,
     * in[1] targets (N) TS_I64/TS_I32 in [0, C) (range-checked: TS_EINVAL naming the bad
     * target); out[0] loss (N) = logsumexp(logits[i]) - logits[i, t_i]. No params. */
    TS_OP_CROSS_ENTROPY = 21,
    /* Its gradient: in[0] logits (N, C), in[1] targets (N), in[2] gloss (N); out[0] glogits
     * (N, C) = gloss[i] * (softmax(logits[i]) - onehot(t_i)), overwritten. No params. */
    TS_OP_CROSS_ENTROPY_BWD = 22,
    /* One SGD update, in place: in[0] grad; out[0] param; out[1] momentum buffer when
     * momentum > 0. All contiguous, same shape and float dtype. ts_sgd_params. */
    TS_OP_SGD_STEP = 23,
    /* One Adam/AdamW update, in place: in[0] grad; out[0] param, out[1] first moment,
     * out[2] second moment. All contiguous, same shape and float dtype. ts_adam_params. */
    TS_OP_ADAM_STEP = 24,
    /* ABI 1.3. ReLU's gradient in one pass: in[0] g, in[1] x (the ReLU's input), both of the
     * output's shape, any strides; out[0] = g where x > 0, else 0 (a NaN x gives 0, and so
     * does x <= 0 whatever g is). Float dtypes, all the same. No params. The core composes it
     * from TS_BINARY_SCALAR gt, a cast and TS_BINARY mul on a plugin that does not claim it. */
    TS_OP_RELU_BACKWARD = 25,
    TS_OP_COUNT
} ts_op;

/* TS_OP_UNARY functions. Values are ABI: append only. */
typedef enum ts_unary_fn {
    TS_UNARY_NEG = 0,
    TS_UNARY_ABS = 1,
    TS_UNARY_EXP = 2,
    TS_UNARY_LOG = 3,
    TS_UNARY_SQRT = 4,
    TS_UNARY_RSQRT = 5,
    TS_UNARY_TANH = 6,
    TS_UNARY_SIGMOID = 7,
    TS_UNARY_RELU = 8,
    TS_UNARY_GELU = 9, /* exact: x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)) */
    TS_UNARY_ERF = 10, /* the error function (GELU's gradient needs it) */
    TS_UNARY_COUNT
} ts_unary_fn;

/* TS_OP_BINARY / TS_OP_BINARY_SCALAR functions. Values are ABI: append only. */
typedef enum ts_binary_fn {
    TS_BINARY_ADD = 0,
    TS_BINARY_SUB = 1,
    TS_BINARY_MUL = 2,
    TS_BINARY_DIV = 3, /* integer dtypes: truncating; division by zero is TS_EINVAL */
    TS_BINARY_POW = 4,
    TS_BINARY_MAXIMUM = 5,
    TS_BINARY_MINIMUM = 6,
    /* Comparisons: output TS_U8, 1 or 0. */
    TS_BINARY_EQ = 7,
    TS_BINARY_NE = 8,
    TS_BINARY_LT = 9,
    TS_BINARY_LE = 10,
    TS_BINARY_GT = 11,
    TS_BINARY_GE = 12,
    TS_BINARY_COUNT
} ts_binary_fn;

/* TS_OP_REDUCE functions. Values are ABI: append only. */
typedef enum ts_reduce_fn {
    TS_REDUCE_SUM = 0,
    TS_REDUCE_MEAN = 1,
    TS_REDUCE_MAX = 2,
    TS_REDUCE_MIN = 3,
    TS_REDUCE_ARGMAX = 4,
    TS_REDUCE_ARGMIN = 5,
    TS_REDUCE_COUNT
} ts_reduce_fn;

typedef struct ts_fill_params {
    double value; /* converted to the output dtype */
} ts_fill_params;

typedef struct ts_unary_params {
    int32_t fn; /* ts_unary_fn */
} ts_unary_params;

typedef struct ts_binary_params {
    int32_t fn; /* ts_binary_fn */
} ts_binary_params;

typedef struct ts_scalar_params {
    int32_t fn;           /* ts_binary_fn */
    int32_t scalar_first; /* 1: fn(scalar, x); 0: fn(x, scalar) */
    double scalar;        /* converted to the input dtype */
} ts_scalar_params;

typedef struct ts_reduce_params {
    int32_t fn;  /* ts_reduce_fn */
    int32_t dim; /* the dim for ARGMAX/ARGMIN */
} ts_reduce_params;

typedef struct ts_dim_params {
    int32_t dim;
} ts_dim_params;

typedef struct ts_matmul_params {
    double alpha, beta;
} ts_matmul_params;

typedef struct ts_conv2d_params {
    int32_t stride_h, stride_w;
    int32_t pad_h, pad_w;
    int32_t dilation_h, dilation_w;
    int32_t groups;
} ts_conv2d_params;

/* d = g + weight_decay * p; with momentum: buf = first_step ? d : momentum * buf +
 * (1 - dampening) * d, then d = nesterov ? d + momentum * buf : buf; p -= lr * d. */
typedef struct ts_sgd_params {
    double lr, momentum, dampening, weight_decay;
    int32_t nesterov, first_step;
} ts_sgd_params;

/* decoupled (AdamW): p *= 1 - lr * weight_decay; else g += weight_decay * p. Then
 * m = beta1 m + (1 - beta1) g; v = beta2 v + (1 - beta2) g^2;
 * p -= lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps). */
typedef struct ts_adam_params {
    double lr, beta1, beta2, eps, weight_decay;
    int32_t decoupled;
    int64_t step; /* 1 at the first update */
} ts_adam_params;

typedef struct ts_pool2d_params {
    int32_t kernel_h, kernel_w;
    int32_t stride_h, stride_w;
    int32_t pad_h, pad_w; /* padding counts as -inf for max */
    int32_t count_include_pad; /* avg: divide by the full window (1) or the valid part (0) */
} ts_pool2d_params;

typedef struct ts_kernel_call {
    uint32_t struct_size;
    int32_t op;               /* ts_op */
    int32_t ninputs, noutputs;
    const ts_operand *inputs;
    const ts_operand *outputs;
    const void *params;       /* op-specific parameter struct, or NULL */
    uint32_t params_size;     /* its size: the op's struct may grow at its end too */
} ts_kernel_call;

/* ---------------------------------------------------------------------------------------- */
/* Host services: handed to init, valid until shutdown returns.                              */

typedef struct ts_host {
    uint16_t abi_major, abi_minor; /* the host's TS_PLUGIN_ABI_* */
    uint32_t struct_size;
    /* Records the failure message of the call in progress (printf-like) and returns code,
     * so that a plugin writes `return host->fail(host, TS_ENOMEM, "cudaMalloc(%zu): %s", ...)`.
     * The host prefixes the plugin's name. */
    ts_status (*fail)(const struct ts_host *self, ts_status code, const char *fmt, ...)
#if defined(__GNUC__)
        __attribute__((format(printf, 3, 4)))
#endif
        ;
    /* Logs through the application's handler, prefixed with the plugin's name. */
    void (*log)(const struct ts_host *self, int level, const char *fmt, ...)
#if defined(__GNUC__)
        __attribute__((format(printf, 3, 4)))
#endif
        ;
    /* The pool component. */
    const ts_pool_api *pool;
    /* Host RAM: total (capped by the cgroup memory limit when one is set) and available. */
    ts_status (*host_memory)(uint64_t *total, uint64_t *available);
    void *host_private; /* the host's own; plugins leave it alone */
} ts_host;

/* Finds a setting by name in the array handed to init; NULL if absent. Inline so that a
 * plugin needs nothing but this header. */
static inline const ts_setting *ts_setting_find(const ts_setting *s, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++) {
        const char *a = s[i].name, *b = name;
        while (*a && *a == *b) {
            a++;
            b++;
        }
        if (*a == *b)
            return &s[i];
    }
    return NULL;
}

/* ---------------------------------------------------------------------------------------- */
/* The descriptor.                                                                           */

typedef struct ts_plugin_desc {
    uint16_t abi_major;   /* TS_PLUGIN_ABI_MAJOR the plugin was built with */
    uint16_t abi_minor;   /* TS_PLUGIN_ABI_MINOR the plugin was built with */
    uint32_t struct_size; /* sizeof(ts_plugin_desc) the plugin was built with */
    const char *name;     /* [a-z0-9_]+, matches the file name: "cpu_blas" */
    const char *version;  /* the plugin's own version */
    const char *description;
    const ts_config_key *config_keys; /* (optional) array ended by a NULL name */

    /* Starts one instance driving the device its settings select. On failure, returns a
     * status with a message through host->fail; TS_ENODEV means "loads fine but has no usable
     * device" (no driver, no GPU) and makes the host fall back. *ctx is handed to every other
     * call. May be called again after shutdown. */
    ts_status (*init)(const ts_host *host, const ts_setting *settings, size_t nsettings,
                      void **ctx);
    /* Frees everything init made. The host has freed every block first. */
    void (*shutdown)(void *ctx);
    /* Fills info (info->struct_size is set by the host). */
    ts_status (*device_info)(void *ctx, ts_device_info *info);

    /* Device memory. alloc returns 64-byte (CPU) / 256-byte (GPU) aligned blocks; nbytes may be
     * 0; tag names the caller for leak reports (may be NULL). */
    ts_status (*alloc)(void *ctx, size_t nbytes, const char *tag, void **ptr);
    void (*free)(void *ctx, void *ptr);
    ts_status (*copy_h2d)(void *ctx, void *dst, const void *src, size_t nbytes);
    ts_status (*copy_d2h)(void *ctx, void *dst, const void *src, size_t nbytes);
    ts_status (*copy_d2d)(void *ctx, void *dst, const void *src, size_t nbytes);
    /* Writes nbytes at dst by repeating the pattern (pattern_size divides nbytes; 1, 2, 4
     * or 8 bytes). */
    ts_status (*fill)(void *ctx, void *dst, size_t nbytes, const void *pattern,
                      size_t pattern_size);
    /* Waits for all queued work. */
    ts_status (*synchronize)(void *ctx);

    /* The plugin's pool: required, since each plugin owns its pool. */
    void (*memory_stats)(void *ctx, ts_memory_stats *stats);
    void (*reset_peak)(void *ctx);
    void (*empty_cache)(void *ctx);
    ts_status (*set_limits)(void *ctx, uint64_t reserve_limit, uint64_t cache_limit);

    /* Kernels. (optional) supports: non-zero if run implements op for dtype; NULL means
     * "none". The host composes or reports what a plugin lacks. */
    int (*supports)(void *ctx, int32_t op, int32_t dtype);
    /* (optional) Runs one kernel. */
    ts_status (*run)(void *ctx, const ts_kernel_call *call);

    /* ---- ABI 1.2 ---- */
    /* TS_PLUGIN_* bits; 0 = none. Read only when the descriptor's struct_size covers it. */
    uint64_t flags;
} ts_plugin_desc;

/* Bits of ts_plugin_desc.flags (ABI 1.2). */
/* The pointers alloc returns are ordinary host addresses the host's CPU may read and write
 * directly (copy_h2d/d2h are plain memory copies). The core then runs its reference host
 * kernels for every op/dtype that supports() does not claim, so a plugin may implement as few
 * kernels as it likes (none at all) and still train. */
#define TS_PLUGIN_HOST_MEMORY 0x1u

/* The entry symbol's type. host_abi_major/minor are the host's numbers, so a plugin that
 * supports several may pick; returning NULL refuses the host. */
typedef const ts_plugin_desc *(*ts_plugin_entry_fn)(uint32_t host_abi_major,
                                                    uint32_t host_abi_minor);
#define TS_PLUGIN_ENTRY_SYMBOL "tessera_plugin_entry"

/* Defines the entry symbol returning &desc. Use once per plugin. */
#define TS_PLUGIN_DEFINE(desc)                                                              \
    TS_PLUGIN_EXPORT const ts_plugin_desc *tessera_plugin_entry(uint32_t host_abi_major,    \
                                                                uint32_t host_abi_minor);   \
    TS_PLUGIN_EXPORT const ts_plugin_desc *tessera_plugin_entry(uint32_t host_abi_major,    \
                                                                uint32_t host_abi_minor)    \
    {                                                                                       \
        (void)host_abi_major;                                                               \
        (void)host_abi_minor;                                                               \
        return &(desc);                                                                     \
    }

#ifdef __cplusplus
}
#endif
#endif /* TESSERA_PLUGIN_H */
