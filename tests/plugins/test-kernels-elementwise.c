/* tests/plugins/test-kernels-elementwise.c: placeholder until the elementwise kernel tests land. */
#include "kt.h"

static void test_pending(void)
{
    SKIP("elementwise kernel tests not written yet");
}

int main(int argc, char **argv)
{
    static const tap_test tests[] = {TAP_TEST(test_pending)};
    return tap_run(tests, 1, argc, argv);
}
