/* tools/bench_autograd.c: `tessera bench autograd`: what recording the graph costs, next to
 * the same work with grad mode off in the same run: the time per small op, and the memory
 * of one MLP training step's graph (host bookkeeping per node, device bytes kept for
 * backward). */
#include "config.h"

#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"

static const char usage[] =
    "usage: tessera bench autograd [--device NAME] [--json]\n"
    "\n"
    "  per-op cost of recording a node: mul of 1-element tensors, grad on vs off (ns)\n"
    "  one forward of an MLP 784-256-128-10 at batch 100 with grad on vs off: graph nodes,\n"
    "  host bytes of bookkeeping per node, device bytes held for backward\n";

static ts_status op_cost(ts_device *dev, int grad, double *ns)
{
    ts_tensor *a, *b;
    const int64_t one = 1;
    ts_status s = ts_tensor_full(dev, TS_F32, 1, &one, 1.5, &a);
    if (s)
        return s;
    if ((s = ts_tensor_full(dev, TS_F32, 1, &one, 2.0, &b))) {
        ts_tensor_unref(a);
        return s;
    }
    ts_tensor_set_requires_grad(a, 1);
    if (!grad)
        ts_no_grad_enter();
    const int iters = 200000;
    double best = 1e30;
    for (int rep = 0; rep < 5 && s == TS_OK; rep++) {
        double t = cli_now();
        for (int i = 0; i < iters && s == TS_OK; i++) {
            ts_tensor *c;
            if ((s = ts_mul(a, b, &c)) == TS_OK)
                ts_tensor_unref(c);
        }
        t = (cli_now() - t) / iters;
        best = t < best ? t : best;
    }
    if (!grad)
        ts_no_grad_exit();
    *ns = best * 1e9;
    ts_tensor_unref(a);
    ts_tensor_unref(b);
    return s;
}

typedef struct graph_cost {
    uint64_t nodes;
    double host_bytes;  /* heap growth while the graph is alive */
    uint64_t device_bytes; /* pool bytes in use with the forward's outputs dropped */
} graph_cost;

/* One forward; every intermediate is dropped, so what stays is what backward needs. */
static ts_status mlp_forward(ts_device *dev, int grad, graph_cost *c)
{
    static const int64_t dims[4] = {784, 256, 128, 10};
    ts_rng rng;
    ts_rng_init(&rng, 7);
    ts_tensor *w[3] = {NULL}, *x = NULL, *h = NULL;
    ts_status s = TS_OK;
    for (int i = 0; i < 3 && s == TS_OK; i++)
        if ((s = ts_tensor_randn(dev, TS_F32, 2, (const int64_t[]){dims[i], dims[i + 1]}, 0,
                                 0.05, &rng, &w[i])) == TS_OK)
            ts_tensor_set_requires_grad(w[i], 1);
    if (s == TS_OK)
        s = ts_tensor_randn(dev, TS_F32, 2, (const int64_t[]){100, 784}, 0, 1, &rng, &x);
    if (s) {
        for (int i = 0; i < 3; i++)
            ts_tensor_unref(w[i]);
        return s;
    }
    if (!grad)
        ts_no_grad_enter();
    ts_memory_stats before, after;
    ts_device_memory_stats(dev, &before);
    uint64_t nodes0 = ts_autograd_live_nodes();
    size_t heap0 = mallinfo2().uordblks;
    h = ts_tensor_ref(x);
    for (int i = 0; i < 3 && s == TS_OK; i++) {
        ts_tensor *a, *r;
        if ((s = ts_matmul(h, w[i], &a)) == TS_OK) {
            ts_tensor_unref(h);
            h = a;
            if (i < 2 && (s = ts_relu(h, &r)) == TS_OK) {
                ts_tensor_unref(h);
                h = r;
            }
        }
    }
    ts_tensor *l = NULL;
    if (s == TS_OK)
        s = ts_mean(h, 0, NULL, 0, &l);
    ts_tensor_unref(h);
    ts_device_memory_stats(dev, &after);
    c->nodes = ts_autograd_live_nodes() - nodes0;
    c->host_bytes = (double)(mallinfo2().uordblks - heap0);
    c->device_bytes = after.in_use - before.in_use;
    ts_tensor_unref(l);
    if (!grad)
        ts_no_grad_exit();
    for (int i = 0; i < 3; i++)
        ts_tensor_unref(w[i]);
    ts_tensor_unref(x);
    return s;
}

int cli_bench_autograd(int argc, char **argv, const cli_common *common)
{
    int json = common->json;
    const char *device = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0)
            json = 1;
        else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc)
            device = argv[++i];
        else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0)
            return fputs(usage, stdout), 0;
        else
            return cli_usage_error("bench autograd", "unexpected argument '%s'", argv[i]);
    }
    ts_status s = ts_init(common->config);
    if (s)
        return cli_fail(s, "cannot start tessera");
    ts_device *dev = ts_default_device();
    if (device && (s = ts_device_get(device, &dev))) {
        int rc = cli_fail(s, "bench autograd");
        ts_shutdown();
        return rc;
    }
    double on_ns = 0, off_ns = 0;
    graph_cost on = {0}, off = {0};
    if (!(s = op_cost(dev, 1, &on_ns)) && !(s = op_cost(dev, 0, &off_ns)) &&
        !(s = mlp_forward(dev, 0, &off)) && !(s = mlp_forward(dev, 1, &on))) {
        double per_node = on.nodes ? (on.host_bytes - off.host_bytes) / (double)on.nodes : 0;
        if (json) {
            printf("{\"device\": \"%s\", \"op_ns_grad\": %.1f, \"op_ns_no_grad\": %.1f, "
                   "\"record_ns\": %.1f, \"graph_nodes\": %llu, \"host_bytes_per_node\": %.0f, "
                   "\"device_bytes_grad\": %llu, \"device_bytes_no_grad\": %llu}\n",
                   ts_device_name(dev), on_ns, off_ns, on_ns - off_ns,
                   (unsigned long long)on.nodes, per_node,
                   (unsigned long long)on.device_bytes, (unsigned long long)off.device_bytes);
        } else {
            char b1[32], b2[32];
            printf("tessera bench autograd on '%s'\n", ts_device_name(dev));
            printf("  mul, 1 element:   %8.1f ns with grad, %8.1f ns without: %.1f ns to record "
                   "a node\n",
                   on_ns, off_ns, on_ns - off_ns);
            printf("  MLP forward:      %llu nodes, %.0f host bytes each (structs are recycled: "
                   "a steady step mallocs none)\n",
                   (unsigned long long)on.nodes, per_node);
            printf("  held for backward: %s of device memory with grad, %s without\n",
                   cli_bytes(on.device_bytes, b1, sizeof b1),
                   cli_bytes(off.device_bytes, b2, sizeof b2));
        }
    }
    int rc = s ? cli_fail(s, "bench autograd") : 0;
    ts_shutdown();
    return rc;
}
