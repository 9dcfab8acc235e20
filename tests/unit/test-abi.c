/* tests/unit/test-abi.c: the plugin ABI is frozen. Every public struct's size and the offsets
 * of its landmark members are recorded here per ABI version (LP64). Changing a layout without
 * bumping TS_PLUGIN_ABI_MINOR (append) or _MAJOR (anything else) fails this test; a bump must
 * add the new version's row, so the change is deliberate and reviewed. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <tessera/comm.h>

#include "../tap.h"

typedef struct layout {
    const char *what;
    size_t actual, expected;
} layout;

#define L(expr, value) {#expr, expr, value}

static void check_rows(const char *version, const layout *rows, size_t n)
{
    for (size_t i = 0; i < n; i++)
        CHECK_MSG(rows[i].actual == rows[i].expected,
                  "%s is %zu, ABI %s says %zu: bump the ABI version and record the new layout",
                  rows[i].what, rows[i].actual, version, rows[i].expected);
}

static void test_layout_matches_version(void)
{
    if (sizeof(void *) != 8)
        SKIP("layouts are recorded for LP64 only");
    CHECK_MSG(TS_PLUGIN_ABI_MAJOR == 2 && TS_PLUGIN_ABI_MINOR == 7,
              "ABI is %d.%d: add its layout row to this test", TS_PLUGIN_ABI_MAJOR,
              TS_PLUGIN_ABI_MINOR);
    /* ABI 2.0: the host owns the pool. The descriptor lost alloc, free, memory_stats,
     * reset_peak, empty_cache and set_limits, gained alignment, mem_alloc/mem_free (raw
     * segments) and the optional vm_* address-space slots at its end; flags moved up front.
     * ts_host lost the pool component table and gained scratch_alloc/scratch_free. The
     * tables 1.x already had (operands, calls, statistics, device figures, settings) kept their
     * layouts. */
    static const layout v2_0[] = {
        L(offsetof(ts_plugin_desc, config_keys), 32),
        L(offsetof(ts_plugin_desc, flags), 40),
        L(offsetof(ts_plugin_desc, alignment), 48),
        L(offsetof(ts_plugin_desc, init), 56),
        L(offsetof(ts_plugin_desc, mem_alloc), 80),
        L(offsetof(ts_plugin_desc, mem_free), 88),
        L(offsetof(ts_plugin_desc, synchronize), 128),
        L(offsetof(ts_plugin_desc, supports), 136),
        L(offsetof(ts_plugin_desc, run), 144),
        L(offsetof(ts_plugin_desc, vm_granularity), 152),
        L(offsetof(ts_plugin_desc, vm_decommit), 184),
        L(offsetof(ts_plugin_desc, host_alloc), 192), /* the end of the 2.0 descriptor */
        L(sizeof(ts_host), 56),
        L(offsetof(ts_host, fail), 8),
        L(offsetof(ts_host, host_memory), 24),
        L(offsetof(ts_host, scratch_alloc), 32),
        L(offsetof(ts_host, scratch_free), 40),
        L(offsetof(ts_host, host_private), 48),
        L(sizeof(ts_operand), 152),
        L(offsetof(ts_operand, shape), 24),
        L(offsetof(ts_operand, strides), 88),
        L(sizeof(ts_kernel_call), 48),
        L(offsetof(ts_kernel_call, params_size), 40),
        L(sizeof(ts_memory_stats), 144),
        L(offsetof(ts_memory_stats, n_oom), 136),
        L(sizeof(ts_device_info), 160),
        L(offsetof(ts_device_info, total_bytes), 144),
        L(sizeof(ts_setting), 32),
        L(offsetof(ts_setting, v), 24),
        L(sizeof(ts_config_key), 48),
    };
    check_rows("2.0", v2_0, sizeof v2_0 / sizeof v2_0[0]);
    /* ABI 2.1: no layout change; TS_UNARY_GELU_TANH appended to ts_unary_fn, TS_OP_LAYER_NORM
     * and its backward to ts_op, with ts_layer_norm_params (tests below). ABI 2.2: no layout
     * change; TS_UNARY_GELU_TANH_DERIV appended to ts_unary_fn. */
    CHECK_INT_EQ(TS_PLUGIN_HOST_MEMORY, 1);
    /* ABI 2.3: pinned host memory, asynchronous uploads and graph capture appended to the
     * descriptor. ABI 2.4: no layout change; TS_UNARY_SILU appended to ts_unary_fn. ABI 2.5:
     * no layout change; TS_BF16 and TS_F16 appended to ts_dtype. ABI 2.6: no layout change;
     * TS_OP_ATTENTION and its backward appended to ts_op, with ts_attention_params. ABI 2.7:
     * no layout change; TS_OP_SOFTMAX_BWD appended to ts_op. */
    static const layout v2_3[] = {
        L(offsetof(ts_plugin_desc, host_alloc), 192),
        L(offsetof(ts_plugin_desc, host_free), 200),
        L(offsetof(ts_plugin_desc, copy_h2d_async), 208),
        L(offsetof(ts_plugin_desc, wait_copy), 216),
        L(offsetof(ts_plugin_desc, graph_begin), 224),
        L(offsetof(ts_plugin_desc, graph_free), 248),
        L(sizeof(ts_plugin_desc), 256),
    };
    check_rows("2.3", v2_3, sizeof v2_3 / sizeof v2_3[0]);
}

/* The inline helpers of plugin.h are what the core's public functions answer. */
static void test_inline_helpers(void)
{
    for (int32_t d = -1; d <= TS_DTYPE_COUNT; d++) {
        CHECK_INT_EQ(ts_plugin_dtype_size(d), ts_dtype_size(d));
        CHECK(strcmp(ts_plugin_dtype_name(d), ts_dtype_name(d)) == 0);
    }
    CHECK(ts_plugin_dtype_is_float(TS_F32) && ts_plugin_dtype_is_float(TS_F64));
    CHECK(!ts_plugin_dtype_is_float(TS_I32) && !ts_plugin_dtype_is_float(TS_U8));
    CHECK_INT_EQ(ts_plugin_sat_i32(3e9), INT32_MAX);
    CHECK_INT_EQ(ts_plugin_sat_i32(-3e9), INT32_MIN);
    CHECK_INT_EQ(ts_plugin_sat_i32(0.0 / 0.0), 0);
    CHECK_INT_EQ(ts_plugin_sat_i32(-2.9), -2);
    CHECK(ts_plugin_sat_i64(1e19) == INT64_MAX && ts_plugin_sat_i64(-1e19) == INT64_MIN);
    CHECK(ts_plugin_sat_i64(9223372036854775807.0) == INT64_MAX); /* rounds to 2^63 */
    CHECK_INT_EQ(ts_plugin_mask_u8(0.0 / 0.0), 1);
    CHECK_INT_EQ(ts_plugin_mask_u8(-0.0), 0);
    unsigned char buf[9] = {0};
    ts_plugin_store_scalar(TS_I32, 1e10, buf + 1); /* unaligned */
    int32_t i32;
    memcpy(&i32, buf + 1, 4);
    CHECK_INT_EQ(i32, INT32_MAX);
    ts_plugin_store_scalar(TS_F64, 0.5, buf + 1);
    double f64;
    memcpy(&f64, buf + 1, 8);
    CHECK(f64 == 0.5);
}

/* The communication ABI (comm.h) is frozen the same way, with TS_COMM_ABI_*. */
static void test_comm_layout(void)
{
    if (sizeof(void *) != 8)
        SKIP("layouts are recorded for LP64 only");
    CHECK_MSG(TS_COMM_ABI_MAJOR == 1 && TS_COMM_ABI_MINOR == 2,
              "communication ABI is %d.%d: add its layout row to this test", TS_COMM_ABI_MAJOR,
              TS_COMM_ABI_MINOR);
    static const layout v1_0[] = {
        L(offsetof(ts_comm_desc, name), 8),
        L(offsetof(ts_comm_desc, flags), 24),
        L(offsetof(ts_comm_desc, launched), 32),
        L(offsetof(ts_comm_desc, allreduce), 64),
        L(offsetof(ts_comm_desc, abort), 96),
        L(offsetof(ts_comm_desc, shutdown), 104),
        L(sizeof(ts_comm_host), 24),
        L(offsetof(ts_comm_host, log), 16),
    };
    check_rows("comm 1.0", v1_0, sizeof v1_0 / sizeof v1_0[0]);
    /* 1.1: device (the device whose memory a TS_COMM_DEVICE_BUFFERS plugin takes) appended */
    static const layout v1_1[] = {
        L(offsetof(ts_comm_desc, device), 112),
    };
    check_rows("comm 1.1", v1_1, sizeof v1_1 / sizeof v1_1[0]);
    /* 1.2: reduce_scatter (optional: the host composes it for an older plugin), split and
     * free_sub (optional: the host's all-reduce then stays flat) appended */
    static const layout v1_2[] = {
        L(offsetof(ts_comm_desc, reduce_scatter), 120),
        L(offsetof(ts_comm_desc, split), 128),
        L(offsetof(ts_comm_desc, free_sub), 136),
        L(sizeof(ts_comm_desc), 144),
    };
    check_rows("comm 1.2", v1_2, sizeof v1_2 / sizeof v1_2[0]);
    CHECK_INT_EQ(TS_COMM_SUM, 0);
    CHECK_INT_EQ(TS_COMM_HOST_BUFFERS, 1);
    CHECK_INT_EQ(TS_COMM_DEVICE_BUFFERS, 2);
}

/* ts_launcher_local_rank: the launchers' variables in order, digits only. */
static void test_launcher_local_rank(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                       "SLURM_LOCALID", "LOCAL_RANK"};
    for (size_t i = 0; i < 4; i++)
        unsetenv(vars[i]);
    CHECK_INT_EQ(ts_launcher_local_rank(), -1);
    setenv("LOCAL_RANK", "5", 1);
    CHECK_INT_EQ(ts_launcher_local_rank(), 5);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3", 1); /* Open MPI's first */
    CHECK_INT_EQ(ts_launcher_local_rank(), 3);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3x", 1); /* not a number: the next variable */
    CHECK_INT_EQ(ts_launcher_local_rank(), 5);
    setenv("LOCAL_RANK", "-1", 1);
    CHECK_INT_EQ(ts_launcher_local_rank(), -1);
    setenv("LOCAL_RANK", "99999999999999999999", 1); /* overlong: refused, never overflowed */
    CHECK(ts_launcher_local_rank() == -1);
    for (size_t i = 0; i < 4; i++)
        unsetenv(vars[i]);
}

static void test_enums_are_append_only(void)
{
    /* Values cross the boundary: they may only be appended. */
    CHECK_INT_EQ(TS_F32, 0);
    CHECK_INT_EQ(TS_F64, 1);
    CHECK_INT_EQ(TS_I32, 2);
    CHECK_INT_EQ(TS_I64, 3);
    CHECK_INT_EQ(TS_U8, 4);
    CHECK_INT_EQ(TS_BF16, 5); /* 2.5 */
    CHECK_INT_EQ(TS_F16, 6);
    CHECK_INT_EQ(TS_OP_COPY, 1);
    CHECK_INT_EQ(TS_OP_ADAM_STEP, 24);
    CHECK_INT_EQ(TS_OP_RELU_BACKWARD, 25);
    CHECK_INT_EQ(TS_UNARY_ERF, 10);
    CHECK_INT_EQ(TS_UNARY_GELU_TANH, 11); /* 2.1 */
    CHECK_INT_EQ(TS_OP_LAYER_NORM, 26);    /* 2.1 */
    CHECK_INT_EQ(TS_OP_LAYER_NORM_BWD, 27);
    CHECK_INT_EQ(TS_UNARY_GELU_TANH_DERIV, 12); /* 2.2 */
    CHECK_INT_EQ(TS_UNARY_SILU, 13);            /* 2.4 */
    CHECK_INT_EQ(sizeof(ts_layer_norm_params), 16);
    CHECK_INT_EQ(TS_OP_ATTENTION, 28); /* 2.6 */
    CHECK_INT_EQ(TS_OP_ATTENTION_BWD, 29);
    CHECK_INT_EQ(TS_OP_SOFTMAX_BWD, 30); /* 2.7 */
    CHECK_INT_EQ(sizeof(ts_attention_params), 16);
    CHECK_INT_EQ(TS_ENOMEM, -2);
    CHECK_INT_EQ(TS_ENODEV, -8);
    CHECK_INT_EQ(TS_SETTING_BOOL, 4);
}

/* Every row of the op and function tables (plugin.h) as it was released: value, name and the
 * minor version that added it cross the boundary and may only be appended to. A new op or
 * function appends its row here with the minor version that adds it. */
static const char frozen_rows[] =
    "COPY 1 copy 0\n"
    "CAST 2 cast 0\n"
    "FILL 3 fill 0\n"
    "UNARY 4 unary 0\n"
    "BINARY 5 binary 0\n"
    "BINARY_SCALAR 6 binary_scalar 0\n"
    "WHERE 7 where 0\n"
    "REDUCE 8 reduce 0\n"
    "MATMUL 9 matmul 0\n"
    "SOFTMAX 10 softmax 0\n"
    "LOG_SOFTMAX 11 log_softmax 0\n"
    "INDEX_SELECT 12 index_select 0\n"
    "INDEX_ADD 13 index_add 0\n"
    "CONV2D 14 conv2d 0\n"
    "MAXPOOL2D 15 max_pool2d 0\n"
    "AVGPOOL2D 16 avg_pool2d 0\n"
    "CONV2D_BWD_DATA 17 conv2d_backward_data 0\n"
    "CONV2D_BWD_WEIGHT 18 conv2d_backward_weight 0\n"
    "MAXPOOL2D_BWD 19 max_pool2d_backward 0\n"
    "AVGPOOL2D_BWD 20 avg_pool2d_backward 0\n"
    "CROSS_ENTROPY 21 cross_entropy 0\n"
    "CROSS_ENTROPY_BWD 22 cross_entropy_backward 0\n"
    "SGD_STEP 23 sgd_step 0\n"
    "ADAM_STEP 24 adam_step 0\n"
    "RELU_BACKWARD 25 relu_backward 0\n"
    "LAYER_NORM 26 layer_norm 1\n"
    "LAYER_NORM_BWD 27 layer_norm_backward 1\n"
    "ATTENTION 28 attention 6\n"
    "ATTENTION_BWD 29 attention_backward 6\n"
    "SOFTMAX_BWD 30 softmax_backward 7\n"
    "NEG 0 neg 0\n"
    "ABS 1 abs 0\n"
    "EXP 2 exp 0\n"
    "LOG 3 log 0\n"
    "SQRT 4 sqrt 0\n"
    "RSQRT 5 rsqrt 0\n"
    "TANH 6 tanh 0\n"
    "SIGMOID 7 sigmoid 0\n"
    "RELU 8 relu 0\n"
    "GELU 9 gelu 0\n"
    "ERF 10 erf 0\n"
    "GELU_TANH 11 gelu_tanh 1\n"
    "GELU_TANH_DERIV 12 gelu_tanh_deriv 2\n"
    "SILU 13 silu 4\n"
    "ADD 0 add 0\n"
    "SUB 1 sub 0\n"
    "MUL 2 mul 0\n"
    "DIV 3 div 0\n"
    "POW 4 pow 0\n"
    "MAXIMUM 5 maximum 0\n"
    "MINIMUM 6 minimum 0\n"
    "EQ 7 eq 0\n"
    "NE 8 ne 0\n"
    "LT 9 lt 0\n"
    "LE 10 le 0\n"
    "GT 11 gt 0\n"
    "GE 12 ge 0\n"
    "SUM 0 sum 0\n"
    "MEAN 1 mean 0\n"
    "MAX 2 max 0\n"
    "MIN 3 min 0\n"
    "ARGMAX 4 argmax 0\n"
    "ARGMIN 5 argmin 0\n";

static void test_op_tables_frozen(void)
{
    char now[sizeof frozen_rows + 1024];
    size_t len = 0;
#define ROW(ID, v, name, minor)                                                                \
    len += (size_t)snprintf(now + len, len < sizeof now ? sizeof now - len : 0, "%s %d %s %d\n", \
                            #ID, v, name, minor);
    TS_OP_TABLE(ROW)
    TS_UNARY_TABLE(ROW)
    TS_BINARY_TABLE(ROW)
    TS_REDUCE_TABLE(ROW)
#undef ROW
    CHECK_MSG(len < sizeof now, "the tables grew past the test's buffer");
    /* the released rows unchanged; rows after them are the version in progress's */
    const char *a = frozen_rows, *b = now;
    while (*a && *a == *b)
        a++, b++;
    CHECK_MSG(!*a, "an op or function row changed (ABI break): released '%.40s', now '%.40s'",
              a, b);
    /* each row's name is the one the helpers give, and no row is newer than this ABI */
#define ROW(ID, v, name, minor)                                                                \
    CHECK_MSG(!strcmp(ts_plugin_op_name(TS_OP_##ID), name), "op %s", name);                 \
    CHECK_MSG(minor <= TS_PLUGIN_ABI_MINOR, "op %s: minor %d", name, minor);
    TS_OP_TABLE(ROW)
#undef ROW
    int last = 0;
#define ROW(ID, v, name, minor) last = v > last ? v : last;
    TS_OP_TABLE(ROW)
#undef ROW
    CHECK_INT_EQ(TS_OP_COUNT, last + 1);
}

int main(int argc, char **argv)
{
    static const tap_test tests[] = {
        TAP_TEST(test_layout_matches_version),
        TAP_TEST(test_enums_are_append_only),
        TAP_TEST(test_op_tables_frozen),
        TAP_TEST(test_inline_helpers),
        TAP_TEST(test_comm_layout),
        TAP_TEST(test_launcher_local_rank),
    };
    return tap_run(tests, sizeof tests / sizeof tests[0], argc, argv);
}
