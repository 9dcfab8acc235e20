/* core/dtype.c: names and sizes of dtypes and ops. */
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
    static const char *const names[] = {
        "none",    "copy",        "cast",         "fill",      "unary",
        "binary",  "binary_scalar", "where",      "reduce",    "matmul",
        "softmax", "log_softmax", "index_select", "index_add", "conv2d",
        "max_pool2d", "avg_pool2d", "conv2d_backward_data", "conv2d_backward_weight",
        "max_pool2d_backward", "avg_pool2d_backward", "cross_entropy", "cross_entropy_backward",
        "sgd_step", "adam_step", "relu_backward", "layer_norm", "layer_norm_backward",
    };
    _Static_assert(sizeof names / sizeof names[0] == TS_OP_COUNT, "ts_op_name out of date");
    return op >= 0 && op < TS_OP_COUNT ? names[op] : "unknown";
}

TS_API const char *ts_fn_name(int32_t op, int32_t fn)
{
    static const char *const unary[] = {"neg",  "abs",     "exp",  "log",  "sqrt", "rsqrt",
                                        "tanh", "sigmoid", "relu", "gelu", "erf",
                                        "gelu_tanh", "gelu_tanh_deriv"};
    static const char *const binary[] = {"add", "sub", "mul", "div", "pow", "maximum", "minimum",
                                         "eq",  "ne",  "lt",  "le",  "gt",  "ge"};
    static const char *const reduce[] = {"sum", "mean", "max", "min", "argmax", "argmin"};
    _Static_assert(sizeof unary / sizeof unary[0] == TS_UNARY_COUNT, "unary names out of date");
    _Static_assert(sizeof binary / sizeof binary[0] == TS_BINARY_COUNT, "binary names");
    _Static_assert(sizeof reduce / sizeof reduce[0] == TS_REDUCE_COUNT, "reduce names");
    if (fn < 0)
        return NULL;
    if (op == TS_OP_UNARY)
        return fn < TS_UNARY_COUNT ? unary[fn] : NULL;
    if (op == TS_OP_BINARY || op == TS_OP_BINARY_SCALAR)
        return fn < TS_BINARY_COUNT ? binary[fn] : NULL;
    if (op == TS_OP_REDUCE)
        return fn < TS_REDUCE_COUNT ? reduce[fn] : NULL;
    return NULL;
}
