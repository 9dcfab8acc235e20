/* core/autocast.c: mixed precision's per-thread setting and the casts the op front ends ask
 * for (tessera/autograd.h). */
#include "grad_fns.h"

enum { AC_DEPTH = 16 };

static _Thread_local int32_t ac_stack[AC_DEPTH];
static _Thread_local int ac_depth;

TS_API ts_status ts_autocast_begin(int32_t dtype)
{
    if (dtype != TS_F32 && !ts_plugin_dtype_is_half(dtype))
        return ts__fail(TS_EDTYPE, "autocast: %s is not a mixed-precision dtype; use bfloat16 "
                        "or float16 (float32 turns it off)", ts_dtype_name(dtype));
    if (ac_depth == AC_DEPTH)
        return ts__fail(TS_ESTATE, "autocast: more than %d nested scopes; end one first",
                        AC_DEPTH);
    ac_stack[ac_depth++] = dtype;
    return TS_OK;
}

TS_API void ts_autocast_end(void)
{
    if (ac_depth > 0)
        ac_depth--;
}

TS_API int32_t ts_autocast_dtype(void)
{
    return ac_depth > 0 ? ac_stack[ac_depth - 1] : TS_F32;
}

ts_status ts__autocast_push(int32_t dtype)
{
    if (ac_depth == AC_DEPTH)
        return ts__fail(TS_ESTATE, "autocast: more than %d nested scopes (backward or a "
                        "checkpoint's recomputation inside them)", AC_DEPTH);
    ac_stack[ac_depth++] = dtype;
    return TS_OK;
}

ts_status ts__autocast(int kind, int n, const ts_tensor *const *in, ts_tensor **out, int *cast)
{
    *cast = 0;
    int32_t low = ts_autocast_dtype();
    if (low == TS_F32)
        return TS_OK;
    int32_t want[TS__AC_MAX];
    for (int i = 0; i < n; i++) {
        int32_t dt = in[i] ? in[i]->dtype : -1;
        want[i] = dt;
        if (kind == TS__AC_LOW && dt == TS_F32)
            want[i] = low;
        else if (kind == TS__AC_FLOAT32 && ts_plugin_dtype_is_half(dt))
            want[i] = TS_F32;
        *cast |= want[i] != dt;
    }
    if (!*cast)
        return TS_OK;
    ts_status s = TS_OK;
    for (int i = 0; i < n; i++) {
        out[i] = NULL;
        if (!in[i])
            continue;
        if (s == TS_OK && want[i] != in[i]->dtype)
            s = ts_cast(in[i], want[i], &out[i]);
        else if (s == TS_OK)
            out[i] = ts_tensor_ref((ts_tensor *)in[i]);
    }
    if (s)
        ts__autocast_release(n, out);
    return s;
}

void ts__autocast_release(int n, ts_tensor **t)
{
    for (int i = 0; i < n; i++) {
        ts_tensor_unref(t[i]);
        t[i] = NULL;
    }
}
