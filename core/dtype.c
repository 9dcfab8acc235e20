/* core/dtype.c: names and sizes of dtypes, and the names of ops (plugin.h's op table). */
#include "internal.h"

/* The public names of plugin.h's inline helpers, so that both sides agree by construction. */
TS_API size_t ts_dtype_size(int32_t dtype)
{
    return ts_plugin_dtype_size(dtype);
}

TS_API const char *ts_dtype_name(int32_t dtype)
{
    return ts_plugin_dtype_name(dtype);
}

TS_API const char *ts_op_name(int32_t op)
{
    return ts_plugin_op_name(op);
}

TS_API const char *ts_fn_name(int32_t op, int32_t fn)
{
    return ts_plugin_fn_name(op, fn);
}
