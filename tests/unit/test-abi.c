/* tests/unit/test-abi.c: the plugin ABI is frozen. Every public struct's size and the offsets
 * of its landmark members are recorded here per ABI version (LP64). Changing a layout without
 * bumping TS_PLUGIN_ABI_MINOR (append) or _MAJOR (anything else) fails this test; a bump must
 * add the new version's row, so the change is deliberate and reviewed. */
#include <stddef.h>

#include "../tap.h"

typedef struct layout {
    const char *what;
    size_t actual, expected;
} layout;

#define L(expr, value) {#expr, expr, value}

static void test_layout_matches_version(void)
{
    if (sizeof(void *) != 8)
        SKIP("layouts are recorded for LP64 only");
    CHECK_MSG(TS_PLUGIN_ABI_MAJOR == 1 && TS_PLUGIN_ABI_MINOR == 3,
              "ABI is %d.%d: add its layout row to this test", TS_PLUGIN_ABI_MAJOR,
              TS_PLUGIN_ABI_MINOR);
    /* ABI 1.0; every row still holds later, except sizes of the tables that grew (noted). */
    static const layout v1_0[] = {
        L(offsetof(ts_plugin_desc, init), 40),
        L(offsetof(ts_plugin_desc, set_limits), 144),
        L(offsetof(ts_plugin_desc, supports), 152),
        L(offsetof(ts_plugin_desc, run), 160),
        L(sizeof(ts_host), 48),
        L(offsetof(ts_host, fail), 8),
        L(offsetof(ts_host, pool), 24),
        L(offsetof(ts_host, host_private), 40),
        L(sizeof(ts_operand), 152),
        L(offsetof(ts_operand, shape), 24),
        L(offsetof(ts_operand, strides), 88),
        L(sizeof(ts_kernel_call), 48),
        L(offsetof(ts_kernel_call, params_size), 40),
        L(sizeof(ts_memory_stats), 144),
        L(offsetof(ts_memory_stats, n_oom), 136),
        L(sizeof(ts_device_info), 160),
        L(offsetof(ts_device_info, total_bytes), 144),
        L(sizeof(ts_pool_api), 72),
        L(offsetof(ts_pool_api, set_limits), 64),
        L(offsetof(ts_pool_options, caching), 40), /* 1.0 ended here: sizeof was 48 */
        L(sizeof(ts_raw_allocator), 24),
        L(sizeof(ts_setting), 32),
        L(offsetof(ts_setting, v), 24),
        L(sizeof(ts_config_key), 48),
    };
    for (size_t i = 0; i < sizeof v1_0 / sizeof v1_0[0]; i++)
        CHECK_MSG(v1_0[i].actual == v1_0[i].expected,
                  "%s is %zu, ABI 1.0 says %zu: bump the ABI version and record the new layout",
                  v1_0[i].what, v1_0[i].actual, v1_0[i].expected);
    /* ABI 1.1: appended ts_pool_options.vm and the ts_raw_vm table (expandable segments). */
    static const layout v1_1[] = {
        L(sizeof(ts_pool_options), 56),
        L(offsetof(ts_pool_options, vm), 48),
        L(sizeof(ts_raw_vm), 64),
        L(offsetof(ts_raw_vm, granularity), 16),
        L(offsetof(ts_raw_vm, reserve), 32),
        L(offsetof(ts_raw_vm, decommit), 56),
    };
    for (size_t i = 0; i < sizeof v1_1 / sizeof v1_1[0]; i++)
        CHECK_MSG(v1_1[i].actual == v1_1[i].expected,
                  "%s is %zu, ABI 1.1 says %zu: bump the ABI version and record the new layout",
                  v1_1[i].what, v1_1[i].actual, v1_1[i].expected);
    /* ABI 1.2: ts_plugin_desc gained flags (TS_PLUGIN_HOST_MEMORY) at its end, right where
     * the 1.0/1.1 descriptor (168 bytes) stopped, so an older plugin's struct_size excludes it. */
    static const layout v1_2[] = {
        L(offsetof(ts_plugin_desc, flags), 168),
        L(sizeof(ts_plugin_desc), 176),
    };
    for (size_t i = 0; i < sizeof v1_2 / sizeof v1_2[0]; i++)
        CHECK_MSG(v1_2[i].actual == v1_2[i].expected,
                  "%s is %zu, ABI 1.2 says %zu: bump the ABI version and record the new layout",
                  v1_2[i].what, v1_2[i].actual, v1_2[i].expected);
    CHECK_INT_EQ(TS_PLUGIN_HOST_MEMORY, 1);
    /* ABI 1.3: no layout change; TS_OP_RELU_BACKWARD appended to ts_op (test below). */
}

static void test_enums_are_append_only(void)
{
    /* Values cross the boundary: they may only be appended. */
    CHECK_INT_EQ(TS_F32, 0);
    CHECK_INT_EQ(TS_F64, 1);
    CHECK_INT_EQ(TS_I32, 2);
    CHECK_INT_EQ(TS_I64, 3);
    CHECK_INT_EQ(TS_U8, 4);
    CHECK_INT_EQ(TS_OP_COPY, 1);
    CHECK_INT_EQ(TS_OP_ADAM_STEP, 24);
    CHECK_INT_EQ(TS_OP_RELU_BACKWARD, 25); /* 1.3 */
    CHECK_INT_EQ(TS_ENOMEM, -2);
    CHECK_INT_EQ(TS_ENODEV, -8);
    CHECK_INT_EQ(TS_SETTING_BOOL, 4);
}

int main(int argc, char **argv)
{
    static const tap_test tests[] = {
        TAP_TEST(test_layout_matches_version),
        TAP_TEST(test_enums_are_append_only),
    };
    return tap_run(tests, sizeof tests / sizeof tests[0], argc, argv);
}
