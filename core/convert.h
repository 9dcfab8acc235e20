/* core/convert.h: the one rule by which a double becomes an integer tensor element, shared by
 * the core (ts_tensor_full, random fills) and plugins/common (fill_, scalar operands, casts
 * from float). Truncation toward zero, like a C cast, but defined everywhere: values beyond
 * the type's range saturate to its bounds, NaN becomes 0. uint8 is the mask dtype: it stores
 * v != 0 (so NaN, being != 0, stores 1), as the float -> uint8 cast does.
 * Header-only (static inline) so a plugin compiles it in without linking the core. */
#ifndef TESSERA_CORE_CONVERT_H
#define TESSERA_CORE_CONVERT_H

#include <stdint.h>
#include <string.h>

#include <tessera/plugin.h>

static inline int32_t ts__sat_i32(double v)
{
    if (v != v)
        return 0;
    if (v <= -2147483648.0)
        return INT32_MIN;
    if (v >= 2147483647.0)
        return INT32_MAX;
    return (int32_t)v;
}

static inline int64_t ts__sat_i64(double v)
{
    if (v != v)
        return 0;
    if (v <= -9223372036854775808.0)
        return INT64_MIN;
    if (v >= 9223372036854775808.0) /* 2^63: the first double past INT64_MAX */
        return INT64_MAX;
    return (int64_t)v;
}

static inline uint8_t ts__mask_u8(double v)
{
    return (uint8_t)(v != 0);
}

/* Writes v converted to dtype (ts_dtype) at buf, which may be unaligned. */
static inline void ts__convert_scalar(int32_t dtype, double v, void *buf)
{
    switch (dtype) {
    case TS_F32: {
        float f = (float)v;
        memcpy(buf, &f, sizeof f);
        break;
    }
    case TS_F64: memcpy(buf, &v, sizeof v); break;
    case TS_I32: {
        int32_t i = ts__sat_i32(v);
        memcpy(buf, &i, sizeof i);
        break;
    }
    case TS_I64: {
        int64_t i = ts__sat_i64(v);
        memcpy(buf, &i, sizeof i);
        break;
    }
    case TS_U8: {
        uint8_t u = ts__mask_u8(v);
        memcpy(buf, &u, 1);
        break;
    }
    default: break;
    }
}

#endif /* TESSERA_CORE_CONVERT_H */
