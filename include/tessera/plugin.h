/* tessera/plugin.h: the whole device-plugin ABI. A plugin is a shared object exporting one
 * symbol, tessera_plugin_entry, that returns a descriptor: plain data and function pointers,
 * no tessera objects, no refcounts. Everything a plugin needs from the host (errors, logging,
 * kernel scratch memory, host memory figures) comes through the ts_host table it is handed at
 * init, so a plugin never links against libtessera. Includes only status.h.
 *
 * ABI 2: a plugin supplies raw memory (whole segments from its device, optionally address
 * space it can map piece by piece) and its device's memory figures; the host builds the
 * caching pool on them for each device instance and owns its statistics, limits
 * (memory_fraction, cache_limit: hard for every plugin) and cache.
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
#include <stdlib.h>
#include <tessera/status.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TS_PLUGIN_ABI_MAJOR 2
#define TS_PLUGIN_ABI_MINOR 7

/* Most dims a tensor or operand has. */
#define TS_MAX_DIMS 8

/* True if the table t (whose struct_size field says how many bytes the other side filled)
 * contains the member m. Use it before reading any member added after abi 2.0. */
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
    /* ABI 2.5: the 16-bit floats, held as their patterns (ts_plugin_f32_to_bf16 and the
     * other conversions below). A plugin built for an older minor is never asked about them
     * nor handed them. */
    TS_BF16 = 5, /* bfloat16: float32's exponent, 8 bits of significand */
    TS_F16 = 6,  /* IEEE float16 (binary16) */
    TS_DTYPE_COUNT
} ts_dtype;

/* Helpers every side of the ABI needs, inline so a plugin needs nothing but this header (the
 * core uses the same ones). TS_PLUGIN_INLINE also compiles them for CUDA device code. */
#if defined(__CUDACC__)
#define TS_PLUGIN_INLINE static inline __host__ __device__
#else
#define TS_PLUGIN_INLINE static inline
#endif

/* Bytes per element; 0 for an unknown dtype. */
TS_PLUGIN_INLINE size_t ts_plugin_dtype_size(int32_t dtype)
{
    return dtype == TS_F32 || dtype == TS_I32   ? 4
           : dtype == TS_F64 || dtype == TS_I64 ? 8
           : dtype == TS_BF16 || dtype == TS_F16 ? 2
           : dtype == TS_U8                     ? 1
                                                : 0;
}

/* "float32", "float64", "int32", "int64", "uint8", "bfloat16", "float16"; "unknown"
 * otherwise. */
TS_PLUGIN_INLINE const char *ts_plugin_dtype_name(int32_t dtype)
{
    return dtype == TS_F32    ? "float32"
           : dtype == TS_F64  ? "float64"
           : dtype == TS_I32  ? "int32"
           : dtype == TS_I64  ? "int64"
           : dtype == TS_U8   ? "uint8"
           : dtype == TS_BF16 ? "bfloat16"
           : dtype == TS_F16  ? "float16"
                              : "unknown";
}

/* The dtypes kernels compute in: float32 and float64 (the 16-bit floats are storage formats,
 * ts_plugin_dtype_is_half). */
TS_PLUGIN_INLINE int ts_plugin_dtype_is_float(int32_t dtype)
{
    return dtype == TS_F32 || dtype == TS_F64;
}

/* bfloat16 or float16. */
TS_PLUGIN_INLINE int ts_plugin_dtype_is_half(int32_t dtype)
{
    return dtype == TS_BF16 || dtype == TS_F16;
}

/* The minor ABI version that added dtype (0: 2.0's): the host never asks a plugin built for
 * an older one about it. */
TS_PLUGIN_INLINE int ts_plugin_dtype_minor(int32_t dtype)
{
    return dtype == TS_BF16 || dtype == TS_F16 ? 5 : 0;
}

/* The one rule by which a double becomes an integer element (fills, scalar operands, casts
 * from float): truncation toward zero like a C cast, but defined everywhere: values beyond
 * the type's range saturate to its bounds and NaN becomes 0. uint8 is the mask dtype: it
 * stores v != 0 (so NaN stores 1). */
TS_PLUGIN_INLINE int32_t ts_plugin_sat_i32(double v)
{
    return v != v                ? 0
           : v <= -2147483648.0  ? INT32_MIN
           : v >= 2147483647.0   ? INT32_MAX
                                 : (int32_t)v;
}

TS_PLUGIN_INLINE int64_t ts_plugin_sat_i64(double v)
{
    /* 2^63 is the first double past INT64_MAX */
    return v != v                         ? 0
           : v <= -9223372036854775808.0  ? INT64_MIN
           : v >= 9223372036854775808.0   ? INT64_MAX
                                          : (int64_t)v;
}

TS_PLUGIN_INLINE uint8_t ts_plugin_mask_u8(double v)
{
    return (uint8_t)(v != 0);
}

/* ---- half precision: bfloat16 and float16 as their 16-bit patterns ----------------------
 * Conversions as IEEE 754 says: to the nearest, ties to even; values past the largest finite
 * one become infinity; float16's subnormals kept; NaN stays NaN (made quiet, sign and the
 * payload's top bits kept). Widening is exact. */

TS_PLUGIN_INLINE uint32_t ts_plugin_f32_bits(float f)
{
    union {
        float f;
        uint32_t u;
    } v;
    v.f = f;
    return v.u;
}

TS_PLUGIN_INLINE float ts_plugin_f32_from_bits(uint32_t u)
{
    union {
        float f;
        uint32_t u;
    } v;
    v.u = u;
    return v.f;
}

TS_PLUGIN_INLINE float ts_plugin_bf16_to_f32(uint16_t h)
{
    return ts_plugin_f32_from_bits((uint32_t)h << 16);
}

TS_PLUGIN_INLINE uint16_t ts_plugin_f32_to_bf16(float f)
{
    uint32_t u = ts_plugin_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN */
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u); /* the carry rounds up, into the exponent if need be */
    return (uint16_t)(u >> 16);
}

TS_PLUGIN_INLINE float ts_plugin_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f) /* infinity, NaN (payload kept) */
        return ts_plugin_f32_from_bits(sign | 0x7f800000u | (man << 13));
    if (exp) /* normal: rebias 15 -> 127 */
        return ts_plugin_f32_from_bits(sign | ((exp + 112) << 23) | (man << 13));
    /* zero or subnormal: man * 2^-24, exact in float32 */
    float v = (float)man * 5.9604644775390625e-8f;
    return sign ? -v : v;
}

TS_PLUGIN_INLINE uint16_t ts_plugin_f32_to_f16(float f)
{
    uint32_t u = ts_plugin_f32_bits(f), a = u & 0x7fffffffu;
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    if (a > 0x7f800000u) /* NaN */
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) /* 65520 and past: rounds past 65504, the largest finite */
        return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) { /* normal (2^-14 and up): rebias 127 -> 15, 23 -> 10 bits */
        uint32_t r = a - 0x38000000u;
        r += 0xfffu + ((r >> 13) & 1u);
        return (uint16_t)(sign | (r >> 13));
    }
    if (a <= 0x33000000u) /* 2^-25 and below: 0 (2^-25 is the tie with 2^-24, to even) */
        return sign;
    /* subnormal: k units of 2^-24, k = m * 2^(e - 126) rounded to even; k may reach 0x400,
     * the smallest normal's pattern */
    uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, shift = 126 - e;
    uint32_t k = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    k += rem > half || (rem == half && (k & 1u));
    return (uint16_t)(sign | k);
}

/* A double to float32 rounded to odd (toward zero, the last bit set when inexact): rounding
 * that once more to a narrower format gives the double's correctly rounded value, which two
 * roundings to nearest do not always. */
TS_PLUGIN_INLINE float ts_plugin_f64_to_f32_odd(double d)
{
    float f = (float)d;
    if (f != f || (double)f == d)
        return f;
    uint32_t u = ts_plugin_f32_bits(f);
    if ((f < 0 ? -(double)f : (double)f) > (d < 0 ? -d : d))
        u -= 1u; /* one step toward zero: the truncation */
    return ts_plugin_f32_from_bits(u | 1u);
}

TS_PLUGIN_INLINE uint16_t ts_plugin_f64_to_bf16(double d)
{
    return ts_plugin_f32_to_bf16(ts_plugin_f64_to_f32_odd(d));
}

TS_PLUGIN_INLINE uint16_t ts_plugin_f64_to_f16(double d)
{
    return ts_plugin_f32_to_f16(ts_plugin_f64_to_f32_odd(d));
}

/* Writes v converted to dtype by that rule (to a 16-bit float: rounded once to nearest, ties
 * to even) at buf, which may be unaligned. */
TS_PLUGIN_INLINE void ts_plugin_store_scalar(int32_t dtype, double v, void *buf)
{
    unsigned char *b = (unsigned char *)buf;
    union {
        float f;
        double d;
        int32_t i32;
        int64_t i64;
        uint8_t u8;
        uint16_t u16;
        unsigned char bytes[8];
    } u;
    size_t n = ts_plugin_dtype_size(dtype);
    switch (dtype) {
    case TS_F32: u.f = (float)v; break;
    case TS_F64: u.d = v; break;
    case TS_I32: u.i32 = ts_plugin_sat_i32(v); break;
    case TS_I64: u.i64 = ts_plugin_sat_i64(v); break;
    case TS_U8: u.u8 = ts_plugin_mask_u8(v); break;
    case TS_BF16: u.u16 = ts_plugin_f64_to_bf16(v); break;
    case TS_F16: u.u16 = ts_plugin_f64_to_f16(v); break;
    default: return;
    }
    for (size_t k = 0; k < n; k++)
        b[k] = u.bytes[k];
}

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
 *                   allocator, so sanitizers see each block.
 *   expandable_segments (bool, default true): blocks over 1 MiB share one address range
 *                   that grows and shrinks at its end; used only when the plugin implements
 *                   the vm_* slots and its vm_granularity answers non-zero.
 * The host applies all four itself, to the pool it builds for the plugin; a plugin reads them
 * only if it wants to (none of ours does). */

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
/* The op table: every op, once, as X(ID, value, "name", minor): TS_OP_ID = value, its name
 * (ts_plugin_op_name), and the minor ABI version that added it (the host never hands an op or
 * function to a plugin built for an older minor). The comment above each entry is its
 * specification. The enums below, the names, the minor-version gating of the host and of
 * tessera plugin-check come from this table and the function tables after it. */
#define TS_OP_TABLE(X)                                                                             \
    /* out[0] = in[0]; same shape and dtype. No params. */                                         \
    X(COPY, 1, "copy", 0)                                                                          \
    /* out[0] = (out dtype) in[0]; same shape, any dtypes (float -> int truncates toward 0,        \
     * anything -> U8 is != 0). No params. */                                                      \
    X(CAST, 2, "cast", 0)                                                                          \
    /* out[0][...] = value. ts_fill_params. */                                                     \
    X(FILL, 3, "fill", 0)                                                                          \
    /* out[0] = fn(in[0]); same shape and dtype. ts_unary_params. */                               \
    X(UNARY, 4, "unary", 0)                                                                        \
    /* out[0] = fn(in[0], in[1]); all the same shape; same dtype, except comparisons whose         \
     * output is TS_U8. ts_binary_params. */                                                       \
    X(BINARY, 5, "binary", 0)                                                                      \
    /* out[0] = fn(in[0], scalar) or fn(scalar, in[0]); ts_scalar_params. */                       \
    X(BINARY_SCALAR, 6, "binary_scalar", 0)                                                        \
    /* out[0] = in[0] (TS_U8 mask) ? in[1] : in[2]. No params. */                                  \
    X(WHERE, 7, "where", 0)                                                                        \
    /* out[0] = reduce(in[0]) over every dim where out[0].shape[d] == 1 and in[0].shape[d] != 1    \
     * (out has in's ndim: "keepdim" layout). ARGMAX/ARGMIN reduce one dim (params.dim) and        \
     * write TS_I64 indices (first occurrence). ts_reduce_params. */                               \
    X(REDUCE, 8, "reduce", 0)                                                                      \
    /* out[0] = in[0] @ in[1]: in[0] (B..., M, K), in[1] (B..., K, N), out (B..., M, N), the       \
     * batch dims already broadcast. Float dtypes. ts_matmul_params (alpha, beta: out =            \
     * alpha * a @ b + beta * out). */                                                             \
    X(MATMUL, 9, "matmul", 0)                                                                      \
    /* Softmax / log-softmax of in[0] along params.dim, numerically stable (max subtracted).       \
     * ts_dim_params. */                                                                           \
    X(SOFTMAX, 10, "softmax", 0)                                                                   \
    X(LOG_SOFTMAX, 11, "log_softmax", 0)                                                           \
    /* out[0] = in[0] gathered along params.dim at the TS_I64/TS_I32 indices in[1] (1-D):          \
     * out.shape = in[0].shape with dim replaced by len(in[1]). Indices are range-checked by       \
     * the plugin (TS_EINVAL naming the bad index). ts_dim_params. */                              \
    X(INDEX_SELECT, 12, "index_select", 0)                                                         \
    /* out[0] (already holding values) += in[0] scattered along params.dim at indices in[1]        \
     * (1-D): out.select(dim, idx[i]) += in[0].select(dim, i). ts_dim_params. */                   \
    X(INDEX_ADD, 13, "index_add", 0)                                                               \
    /* 2-D convolution. in[0] x (N, C, H, W), in[1] w (K, C/groups, R, S), optional in[2] bias     \
     * (K) (ninputs 2 or 3); out[0] y (N, K, P, Q). ts_conv2d_params. */                           \
    X(CONV2D, 14, "conv2d", 0)                                                                     \
    /* Max pooling. in[0] x (N, C, H, W); out[0] y (N, C, P, Q); optional out[1] TS_I64            \
     * indices (N, C, P, Q) of each max within its (H*W) plane, for backward. ts_pool2d_params. */ \
    X(MAXPOOL2D, 15, "max_pool2d", 0)                                                              \
    /* Average pooling; same shapes, no indices. ts_pool2d_params. */                              \
    X(AVGPOOL2D, 16, "avg_pool2d", 0)                                                              \
    /* Gradient of CONV2D w.r.t. x: in[0] gy (N, K, P, Q), in[1] w (K, C/groups, R, S);            \
     * out[0] gx (N, C, H, W), overwritten. ts_conv2d_params. */                                   \
    X(CONV2D_BWD_DATA, 17, "conv2d_backward_data", 0)                                              \
    /* Gradient of CONV2D w.r.t. w: in[0] gy (N, K, P, Q), in[1] x (N, C, H, W); out[0] gw         \
     * (K, C/groups, R, S), overwritten. ts_conv2d_params. (The bias gradient is a sum.) */        \
    X(CONV2D_BWD_WEIGHT, 18, "conv2d_backward_weight", 0)                                          \
    /* Gradient of MAXPOOL2D: in[0] gy (N, C, P, Q), in[1] TS_I64 indices (N, C, P, Q) from        \
     * the forward; out[0] gx (N, C, H, W), overwritten (zeros, plus gy summed at each index).     \
     * ts_pool2d_params. */                                                                        \
    X(MAXPOOL2D_BWD, 19, "max_pool2d_backward", 0)                                                 \
    /* Gradient of AVGPOOL2D: in[0] gy (N, C, P, Q); out[0] gx (N, C, H, W), overwritten.          \
     * ts_pool2d_params. */                                                                        \
    X(AVGPOOL2D_BWD, 20, "avg_pool2d_backward", 0)                                                 \
    /* Cross-entropy per sample, fused and numerically stable: in[0] logits (N, C) float,          \
     * in[1] targets (N) TS_I64/TS_I32 in [0, C) (range-checked: TS_EINVAL naming the bad          \
     * target); out[0] loss (N) = logsumexp(logits[i]) - logits[i, t_i]. No params. */             \
    X(CROSS_ENTROPY, 21, "cross_entropy", 0)                                                       \
    /* Its gradient: in[0] logits (N, C), in[1] targets (N), in[2] gloss (N); out[0] glogits       \
     * (N, C) = gloss[i] * (softmax(logits[i]) - onehot(t_i)), overwritten. No params. */          \
    X(CROSS_ENTROPY_BWD, 22, "cross_entropy_backward", 0)                                          \
    /* One SGD update, in place: in[0] grad; out[0] param; out[1] momentum buffer when             \
     * momentum > 0. All contiguous, same shape and float dtype. ts_sgd_params. */                 \
    X(SGD_STEP, 23, "sgd_step", 0)                                                                 \
    /* One Adam/AdamW update, in place: in[0] grad; out[0] param, out[1] first moment,             \
     * out[2] second moment. All contiguous, same shape and float dtype. ts_adam_params. */        \
    X(ADAM_STEP, 24, "adam_step", 0)                                                               \
    /* ReLU's gradient in one pass: in[0] g, in[1] x (the ReLU's input), both of the               \
     * output's shape, any strides; out[0] = g where x > 0, else 0 (a NaN x gives 0, and so        \
     * does x <= 0 whatever g is). Float dtypes, all the same. No params. The core composes it     \
     * from TS_BINARY_SCALAR gt, a cast and TS_BINARY mul on a plugin that does not claim it. */   \
    X(RELU_BACKWARD, 25, "relu_backward", 0)                                                       \
    /* ABI 2.1. Layer norm over the last params.ndim dims (D elements: their product), one pass    \
     * per row: in[0] x, optional in[1] weight and in[2] bias (both or neither, the trailing       \
     * dims' shape); out[0] y (x's shape), out[1] mean and out[2] rstd (x's dtype, one per row:    \
     * the leading dims' shape, 0-d when there are none). y = (x - mean) * rstd * weight + bias    \
     * with rstd = 1 / sqrt(var + eps), var the biased variance. Float dtypes; all operands        \
     * contiguous (the host makes them so). ts_layer_norm_params. Optional: the core composes it   \
     * from plain ops on a plugin that does not claim both it and its backward. */                 \
    X(LAYER_NORM, 26, "layer_norm", 1)                                                             \
    /* Its gradient: in[0] gy, in[1] x, in[2] mean, in[3] rstd (as the forward wrote them),        \
     * optional in[4] weight; out[0] gx, and with a weight out[1] gweight and out[2] gbias, all    \
     * overwritten. Float dtypes, contiguous. ts_layer_norm_params. */                             \
    X(LAYER_NORM_BWD, 27, "layer_norm_backward", 1)                                                \
    /* ABI 2.6. Scaled dot-product attention in one pass per (batch, query block), with the     \
     * online softmax (no Tq x Tk matrix): in[0] q (B, Tq, D), in[1] k (B, Tk, D), in[2] v       \
     * (B, Tk, Dv); out[0] o (B, Tq, Dv) = softmax(scale q k^T + mask) v, out[1] lse (B, Tq) =   \
     * the log-sum-exp of each row of scale q k^T + mask, for the backward. With causal, query    \
     * i sees keys j <= i + Tk - Tq (the last query sees every key; Tq <= Tk); without, every    \
     * key (Tk >= 1). Contiguous operands (the host makes them so), no output overlapping an    \
     * input; q, k, v, o one float dtype; lse float32, or float64 when q is float64.             \
     * Accumulates in float32 or wider.                                                          \
     * ts_attention_params. Optional: the core composes it from matmul and softmax on a plugin   \
     * that does not claim both it and its backward. */                                         \
    X(ATTENTION, 28, "attention", 6)                                                               \
    /* Its gradient: in[0] go (B, Tq, Dv), in[1] q, in[2] k, in[3] v, in[4] o, in[5] lse (as the  \
     * forward wrote them); out[0] gq, out[1] gk, out[2] gv, overwritten. With P = exp(scale q    \
     * k^T + mask - lse) and delta_i = go_i . o_i: gv = P^T go, gs = P * (go v^T - delta),        \
     * gq = scale gs k, gk = scale gs^T q. ts_attention_params. */                               \
    X(ATTENTION_BWD, 29, "attention_backward", 6)                                                  \
    /* ABI 2.7. Softmax's gradient in one pass per slice along params.dim: in[0] y (the          \
     * forward's output), in[1] g (the output's gradient), both of out's shape, any strides;     \
     * out[0] = y * (g - sum_dim(g * y)), overwritten. One float dtype for all three; the sum   \
     * accumulated in float32 or wider. ts_dim_params. Optional: the core composes it from mul,  \
     * sum and sub on a plugin that does not claim it. */                                       \
    X(SOFTMAX_BWD, 30, "softmax_backward", 7)                                                      \
    /* end of TS_OP_TABLE */

typedef enum ts_op {
    TS_OP_NONE = 0,
#define TS_OP_ENUM_(id, value, name, minor) TS_OP_##id = value,
    TS_OP_TABLE(TS_OP_ENUM_)
#undef TS_OP_ENUM_
    TS_OP_COUNT
} ts_op;

/* TS_OP_UNARY functions, as X(ID, value, "name", minor) (the op table's form). Values are ABI:
 * append only. */
#define TS_UNARY_TABLE(X)                                                                          \
    X(NEG, 0, "neg", 0)                                                                            \
    X(ABS, 1, "abs", 0)                                                                            \
    X(EXP, 2, "exp", 0)                                                                            \
    X(LOG, 3, "log", 0)                                                                            \
    X(SQRT, 4, "sqrt", 0)                                                                          \
    X(RSQRT, 5, "rsqrt", 0)                                                                        \
    X(TANH, 6, "tanh", 0)                                                                          \
    X(SIGMOID, 7, "sigmoid", 0)                                                                    \
    X(RELU, 8, "relu", 0)                                                                          \
    X(GELU, 9, "gelu", 0) /* exact: x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)) */                    \
    X(ERF, 10, "erf", 0) /* the error function (GELU's gradient needs it) */                       \
    /* ABI 2.1. GELU's tanh approximation (GPT-2's): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715      \
     * x^3))). The host never sends it to a plugin built for 2.0. */                               \
    X(GELU_TANH, 11, "gelu_tanh", 1)                                                               \
    /* ABI 2.2. The derivative of GELU_TANH, for its gradient in one pass: with t = tanh(u),       \
     * u = sqrt(2/pi) (x + 0.044715 x^3): (1 + t) / 2 + x (1 - t^2) sqrt(2/pi) (1 + 3 0.044715     \
     * x^2) / 2. The host never sends it to a plugin built for 2.0 or 2.1. */                      \
    X(GELU_TANH_DERIV, 12, "gelu_tanh_deriv", 2)                                                   \
    /* ABI 2.4. SiLU (swish), the gated MLPs' activation: x sigmoid(x) = x / (1 + exp(-x)).     \
     * The host never sends it to a plugin built for 2.3 or older. */                           \
    X(SILU, 13, "silu", 4)                                                                         \
    /* end of TS_UNARY_TABLE */

typedef enum ts_unary_fn {
#define TS_FN_ENUM_(id, value, name, minor) TS_UNARY_##id = value,
    TS_UNARY_TABLE(TS_FN_ENUM_)
#undef TS_FN_ENUM_
    TS_UNARY_COUNT
} ts_unary_fn;

/* TS_OP_BINARY / TS_OP_BINARY_SCALAR functions, as X(ID, value, "name", minor) (the op table's form). Values are ABI:
 * append only. */
#define TS_BINARY_TABLE(X)                                                                         \
    X(ADD, 0, "add", 0)                                                                            \
    X(SUB, 1, "sub", 0)                                                                            \
    X(MUL, 2, "mul", 0)                                                                            \
    X(DIV, 3, "div", 0) /* integer dtypes: truncating; division by zero is TS_EINVAL */            \
    X(POW, 4, "pow", 0)                                                                            \
    X(MAXIMUM, 5, "maximum", 0)                                                                    \
    X(MINIMUM, 6, "minimum", 0)                                                                    \
    /* Comparisons: output TS_U8, 1 or 0. */                                                       \
    X(EQ, 7, "eq", 0)                                                                              \
    X(NE, 8, "ne", 0)                                                                              \
    X(LT, 9, "lt", 0)                                                                              \
    X(LE, 10, "le", 0)                                                                             \
    X(GT, 11, "gt", 0)                                                                             \
    X(GE, 12, "ge", 0)                                                                             \
    /* end of TS_BINARY_TABLE */

typedef enum ts_binary_fn {
#define TS_FN_ENUM_(id, value, name, minor) TS_BINARY_##id = value,
    TS_BINARY_TABLE(TS_FN_ENUM_)
#undef TS_FN_ENUM_
    TS_BINARY_COUNT
} ts_binary_fn;

/* TS_OP_REDUCE functions, as X(ID, value, "name", minor) (the op table's form). Values are ABI:
 * append only. */
#define TS_REDUCE_TABLE(X)                                                                         \
    X(SUM, 0, "sum", 0)                                                                            \
    X(MEAN, 1, "mean", 0)                                                                          \
    X(MAX, 2, "max", 0)                                                                            \
    X(MIN, 3, "min", 0)                                                                            \
    X(ARGMAX, 4, "argmax", 0)                                                                      \
    X(ARGMIN, 5, "argmin", 0)                                                                      \
    /* end of TS_REDUCE_TABLE */

typedef enum ts_reduce_fn {
#define TS_FN_ENUM_(id, value, name, minor) TS_REDUCE_##id = value,
    TS_REDUCE_TABLE(TS_FN_ENUM_)
#undef TS_FN_ENUM_
    TS_REDUCE_COUNT
} ts_reduce_fn;

/* An op's name in the op table ("matmul"); "none" for TS_OP_NONE, "unknown" past the table. */
static inline const char *ts_plugin_op_name(int32_t op)
{
    switch (op) {
    case TS_OP_NONE:
        return "none";
#define TS_X_(id, value, name, minor) case value: return name;
        TS_OP_TABLE(TS_X_)
    default:
        return "unknown";
    }
}

/* The name of function fn of op ("sub" of TS_OP_BINARY or TS_OP_BINARY_SCALAR), or NULL when op
 * takes no function or fn is not in its table. */
static inline const char *ts_plugin_fn_name(int32_t op, int32_t fn)
{
    if (op == TS_OP_UNARY)
        switch (fn) { TS_UNARY_TABLE(TS_X_) }
    else if (op == TS_OP_BINARY || op == TS_OP_BINARY_SCALAR)
        switch (fn) { TS_BINARY_TABLE(TS_X_) }
    else if (op == TS_OP_REDUCE)
        switch (fn) { TS_REDUCE_TABLE(TS_X_) }
#undef TS_X_
    return NULL;
}

/* The minor ABI version that added op together with its function fn (fn is ignored for an op
 * that takes none), or -1 for an op or function past the tables. The host hands a call to a
 * plugin only when this is at most the minor the plugin was built for. */
static inline int ts_plugin_call_minor(int32_t op, int32_t fn)
{
    int op_minor = -1, fn_minor = 0;
#define TS_X_(id, value, name, minor) case value: op_minor = minor; break;
    switch (op) { TS_OP_TABLE(TS_X_) default: break; }
#undef TS_X_
#define TS_X_(id, value, name, minor) case value: fn_minor = minor; break;
    if (op == TS_OP_UNARY) {
        fn_minor = -1;
        switch (fn) { TS_UNARY_TABLE(TS_X_) default: break; }
    } else if (op == TS_OP_BINARY || op == TS_OP_BINARY_SCALAR) {
        fn_minor = -1;
        switch (fn) { TS_BINARY_TABLE(TS_X_) default: break; }
    } else if (op == TS_OP_REDUCE) {
        fn_minor = -1;
        switch (fn) { TS_REDUCE_TABLE(TS_X_) default: break; }
    }
#undef TS_X_
    return op_minor < 0 || fn_minor < 0 ? -1 : op_minor > fn_minor ? op_minor : fn_minor;
}

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

typedef struct ts_layer_norm_params {
    double eps;   /* > 0 */
    int32_t ndim; /* the trailing dims normalized: 1 .. x's ndim */
} ts_layer_norm_params;

typedef struct ts_attention_params {
    double scale;   /* the factor of q k^T: commonly 1 / sqrt(D) */
    int32_t causal; /* 1: query i sees keys j <= i + Tk - Tq; 0: every key */
} ts_attention_params;

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
    /* Host RAM: total (capped by the cgroup memory limit when one is set) and available. */
    ts_status (*host_memory)(uint64_t *total, uint64_t *available);
    /* Kernel scratch: a block of this device's memory from the host's pool for this instance,
     * counted against its limits like any tensor (TS_ENOMEM with the pool's message past
     * them). Valid once init has returned (not during init), from any thread. tag names the
     * kernel in leak reports. Give every block back with scratch_free before run returns. */
    ts_status (*scratch_alloc)(const struct ts_host *self, size_t nbytes, const char *tag,
                               void **ptr);
    void (*scratch_free)(const struct ts_host *self, void *ptr);
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

/* This process's rank among the ranks a launcher started on this machine (Open MPI's
 * OMPI_COMM_WORLD_LOCAL_RANK, MPICH's MPI_LOCALRANKID, Slurm's SLURM_LOCALID, LOCAL_RANK),
 * or -1 without a launcher. A GPU plugin and a communication plugin pick the same GPU from it
 * (local rank modulo the GPUs), so that one rank's device and communicator agree. */
static inline int ts_launcher_local_rank(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                       "SLURM_LOCALID", "LOCAL_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (!v || *v < '0' || *v > '9')
            continue;
        long r = 0;
        for (; *v >= '0' && *v <= '9' && r < 1000000; v++)
            r = r * 10 + (*v - '0');
        if (!*v)
            return (int)r;
    }
    return -1;
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
    uint64_t flags;       /* TS_PLUGIN_* bits; 0 = none */
    /* Alignment of every segment mem_alloc returns and of every block the pool hands out: a
     * power of two in [16, 1 MiB] (64 for CPUs: AVX-512 loads; 256 for CUDA). */
    uint32_t alignment;
    uint32_t reserved0;   /* 0 */

    /* Starts one instance driving the device its settings select. On failure, returns a
     * status with a message through host->fail; TS_ENODEV means "loads fine but has no usable
     * device" (no driver, no GPU) and makes the host fall back. *ctx is handed to every other
     * call. May be called again after shutdown. */
    ts_status (*init)(const ts_host *host, const ts_setting *settings, size_t nsettings,
                      void **ctx);
    /* Frees everything init made. The host has destroyed the instance's pool first: every
     * segment went back through mem_free / vm_release. */
    void (*shutdown)(void *ctx);
    /* Fills info (info->struct_size is set by the host). The pool's reserve limit is
     * memory_fraction of info->total_bytes (TS_DEVINFO_TOTAL); without a total, no limit. */
    ts_status (*device_info)(void *ctx, ts_device_info *info);

    /* Raw device memory under the host's caching pool, called only when the pool's cache
     * cannot serve (no call in a steady training step). mem_alloc obtains nbytes (a multiple
     * of alignment, > 0) aligned to alignment; TS_ENOMEM when the device has no room (the
     * pool then frees its cache and tries once more before failing with its figures).
     * mem_free gives a segment back with the size it was obtained with. */
    ts_status (*mem_alloc)(void *ctx, size_t nbytes, void **ptr);
    void (*mem_free)(void *ctx, void *ptr, size_t nbytes);

    ts_status (*copy_h2d)(void *ctx, void *dst, const void *src, size_t nbytes);
    ts_status (*copy_d2h)(void *ctx, void *dst, const void *src, size_t nbytes);
    ts_status (*copy_d2d)(void *ctx, void *dst, const void *src, size_t nbytes);
    /* Writes nbytes at dst by repeating the pattern (pattern_size divides nbytes; 1, 2, 4
     * or 8 bytes). */
    ts_status (*fill)(void *ctx, void *dst, size_t nbytes, const void *pattern,
                      size_t pattern_size);
    /* Waits for all queued work. */
    ts_status (*synchronize)(void *ctx);

    /* Kernels. (optional) supports: non-zero if run implements op for the output dtype;
     * NULL means "none". A claim covers every call of that op and output dtype, whatever
     * the inputs and functions (docs/writing-a-plugin.md, "Claims", has the full table):
     *   CAST d       conversion to d from every dtype (the one rule: ts_plugin_sat_*, mask);
     *   UNARY d      all functions (integer dtypes: neg and abs);
     *   BINARY(_SCALAR) d      add..minimum on d (integers wrap, a zero divisor is EINVAL);
     *   BINARY(_SCALAR) uint8  the comparisons of every input dtype and uint8 arithmetic;
     *   REDUCE d     sum, max, min (mean: float d only);
     *   REDUCE int64 also argmax/argmin of every input dtype and int64 sums;
     *   SOFTMAX, MATMUL, the conv, pooling and loss ops: float d;
     *   SGD_STEP, ADAM_STEP, RELU_BACKWARD, LAYER_NORM(_BWD): optional (composed by the core
     *   when unclaimed; LAYER_NORM is used fused only when both directions are claimed). */
    int (*supports)(void *ctx, int32_t op, int32_t dtype);
    /* (optional) Runs one kernel. May decline one call it claimed (an input dtype or a case
     * it does not handle) by returning TS_ENOTSUP without calling host->fail: a
     * TS_PLUGIN_HOST_MEMORY plugin's call then runs on the reference host kernels; any other
     * plugin's fails with a message naming the op, the dtypes and the plugin. */
    ts_status (*run)(void *ctx, const ts_kernel_call *call);

    /* (optional, all five or none) Address space for an expandable segment: the pool keeps
     * every block over 1 MiB in one reserved range whose backed part grows and shrinks at its
     * end, so free neighbours always merge. Host memory: mmap; CUDA: cuMemAddressReserve /
     * cuMemCreate / cuMemMap. vm_granularity: the commit unit, a power of two >= 512 and >=
     * alignment, or 0 when this instance cannot (then the pool uses mem_alloc only). */
    size_t (*vm_granularity)(void *ctx);
    /* Reserve nbytes (a multiple of the granularity) of address space, no memory; the base
     * is aligned to the granularity. */
    ts_status (*vm_reserve)(void *ctx, size_t nbytes, void **base);
    /* Give back a whole reservation (backed parts included). */
    void (*vm_release)(void *ctx, void *base, size_t nbytes);
    /* Back [addr, addr + nbytes) of a reservation with memory; TS_ENOMEM when there is none. */
    ts_status (*vm_commit)(void *ctx, void *addr, size_t nbytes);
    /* Return the memory behind [addr, addr + nbytes); the addresses stay reserved. */
    void (*vm_decommit)(void *ctx, void *addr, size_t nbytes);

    /* ABI 2.3. (optional, both or neither) Pinned host memory: page-locked host addresses the
     * CPU reads and writes directly and the device copies from without staging (CUDA:
     * cudaHostAlloc / cudaFreeHost). The host keeps them under a second caching pool of its
     * own (ts_device_pinned_alloc); a plugin without them that sets TS_PLUGIN_HOST_MEMORY gets
     * that pool over mem_alloc / mem_free, since its memory is host memory already. host_free
     * may be called while copies are queued: it waits for them. */
    ts_status (*host_alloc)(void *ctx, size_t nbytes, void **ptr);
    void (*host_free)(void *ctx, void *ptr, size_t nbytes);
    /* (optional, both or neither) Asynchronous upload from host_alloc memory: queues the copy
     * of nbytes from src to device memory dst in the order of the instance's other work (a
     * kernel queued later sees the data) and returns at once, with *ticket (> 0, increasing)
     * naming it. src must not be written until wait_copy(ticket) has returned; wait_copy
     * returns once that copy (and every earlier one) has completed. Without them the host
     * uses copy_h2d, and a ticket of 0 needs no wait. */
    ts_status (*copy_h2d_async)(void *ctx, void *dst, const void *src, size_t nbytes,
                                uint64_t *ticket);
    ts_status (*wait_copy)(void *ctx, uint64_t ticket);

    /* ABI 2.3. (optional, all four or none) Graph capture (CUDA graphs): between graph_begin
     * and graph_end the instance records the work it is given instead of running it: kernels,
     * fills, device copies, and copies from host memory (whose bytes it keeps, so a replay
     * uploads what was given at capture). Copies to host memory and synchronize fail while
     * recording; checks that need the host (index range checks) are skipped. graph_end
     * returns the recording as *graph (also on the way out of a failed recording it must
     * leave recording mode); graph_launch queues one replay of it, in order with other work;
     * graph_free releases it (waiting for replays in flight). The host keeps every block freed
     * while recording out of its pool until graph_free, so the addresses a replay touches
     * stay the recording's. */
    ts_status (*graph_begin)(void *ctx);
    ts_status (*graph_end)(void *ctx, void **graph);
    ts_status (*graph_launch)(void *ctx, void *graph);
    void (*graph_free)(void *ctx, void *graph);
} ts_plugin_desc;

/* Bits of ts_plugin_desc.flags. */
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
