/* tests/unit/test-graph.c: graph capture through the graphrec fixture, which records like a
 * GPU stream under capture and replays through the reference kernels: a recorded and replayed
 * training step gives the eager step's losses and weights bit for bit; the misuses fail with
 * what to do; a plugin without the graph_* slots says it cannot. */
#include <unistd.h>

#include "../plugins/kt.h"


static void test_replay_matches_eager(void)
{
    ts_device *d;
    CHECK_OK(ts_device_load(NULL, tap_fixture("graphrec"), &d));
    CHECK(ts_device_can_capture(d));
    kt_check_graph_step(d, 8);
    kt_check_no_live_blocks(d); /* the held blocks went back with the graph */
    ts_device_unload(d);
}

static void test_misuse(void)
{
    ts_device *d, *plain;
    CHECK_OK(ts_device_load(NULL, tap_fixture("graphrec"), &d));
    ts_graph *g;
    CHECK_FAILS(ts_graph_capture_end(d, &g), TS_ESTATE, "not recording", "capture_begin");
    CHECK(g == NULL);
    ts_tensor *t, *u;
    CHECK_OK(ts_tensor_ones(d, TS_F32, 1, (const int64_t[]){4}, &t));
    CHECK_OK(ts_graph_capture_begin(d));
    CHECK_OK(ts_mul_scalar(t, 3.0, &u));
    float v[4] = {0};
    /* Nothing has run yet: reading it is refused, not answered with stale bytes. */
    CHECK_FAILS(ts_tensor_to_host(u, v, sizeof v), TS_ESTATE, "recording");
    CHECK_OK(ts_graph_capture_end(d, &g));
    CHECK_OK(ts_graph_replay(g));
    CHECK_OK(ts_tensor_to_host(u, v, sizeof v));
    CHECK(v[0] == 3.0f && v[3] == 3.0f);
    /* Replay while another recording runs. */
    CHECK_OK(ts_graph_capture_begin(d));
    CHECK_FAILS(ts_graph_replay(g), TS_ESTATE, "recording");
    ts_graph *g2;
    CHECK_OK(ts_graph_capture_end(d, &g2));
    ts_graph_free(g2);
    ts_graph_free(g);
    ts_graph_free(NULL);
    ts_tensor_unref(t);
    ts_tensor_unref(u);
    ts_device_unload(d);

    CHECK_OK(ts_device_load(NULL, tap_fixture("hostonly"), &plain));
    CHECK(!ts_device_can_capture(plain));
    CHECK_FAILS(ts_graph_capture_begin(plain), TS_ENOTSUP, "'hostonly' cannot record");
    ts_device_unload(plain);
}

int main(int argc, char **argv)
{
    static const tap_test tests[] = {
        TAP_TEST(test_replay_matches_eager),
        TAP_TEST(test_misuse),
    };
    return tap_run(tests, sizeof tests / sizeof tests[0], argc, argv);
}
