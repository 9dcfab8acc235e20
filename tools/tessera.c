/* tools/tessera.c: the `tessera` command: global options, subcommand dispatch, and the log
 * handler that turns the library's messages into stderr lines. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_pool.h"
#include "cli.h"

static const char usage[] =
    "usage: tessera [--config FILE] COMMAND [ARGS]\n"
    "\n"
    "commands:\n"
    "  info [--json]     version, configuration, plugins found, devices and pools\n"
    "  train [...]       train a model on Fashion-MNIST (tessera train --help)\n"
    "  plugin-check NAME conformance suite of a plugin, by NAME or PATH.so\n"
    "  bench pool [...]  caching pool vs malloc/free on a training-like size mix\n"
    "  bench ops [...]   matmul vs cblas_sgemm, add vs memcpy, small-op overhead\n"
    "  bench autograd    cost of recording the graph: time per op, memory per step\n"
    "  bench compare     the same conv, matmul and training step on several backends\n"
    "  bench train [...] training step time vs its GEMM floor, allocations per step\n"
    "  bench cuda        the cuda plugin vs raw cuBLAS/CUDA, and GPU vs CPU training\n"
    "  help [COMMAND]    this text, or a command's own --help\n"
    "\n"
    "options:\n"
    "  --config FILE     configuration file (default: $TESSERA_CONFIG,\n"
    "                    $XDG_CONFIG_HOME/tessera/tessera.ini, the installed one, built-in)\n"
    "  --version         print the version\n"
    "  -h, --help        print this help\n"
    "\n"
    "environment: TESSERA_CONFIG, TESSERA_DEVICE, TESSERA_PLUGIN_PATH\n";

static void log_to_stderr(int level, const char *msg, void *user)
{
    (void)user;
    fprintf(stderr, "tessera: %s: %s\n", ts_log_level_name(level), msg);
}

int cli_usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "tessera: error: %s%s", cmd ? cmd : "", cmd ? ": " : "");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (see 'tessera %s%s--help')\n", cmd ? cmd : "", cmd ? " " : "");
    va_end(ap);
    return 2;
}

int cli_fail(ts_status s, const char *what)
{
    fprintf(stderr, "tessera: error: %s%s%s\n", what ? what : "", what ? ": " : "",
            ts_last_error()[0] ? ts_last_error() : ts_status_text(s));
    return 1;
}

double cli_seconds(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int cli_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

const char *cli_bytes(unsigned long long b, char *buf, size_t len)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int u = 0;
    while (v >= 1024 && u < 4)
        v /= 1024, u++;
    if (u == 0)
        snprintf(buf, len, "%llu B", b);
    else
        snprintf(buf, len, "%.2f %s", v, units[u]);
    return buf;
}

int main(int argc, char **argv)
{
    cli_common common = {0};
    ts_set_log_handler(log_to_stderr, NULL);
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (strcmp(argv[i], "--config") == 0) {
            if (++i == argc)
                return cli_usage_error(NULL, "--config needs a FILE");
            common.config = argv[i];
        } else if (strncmp(argv[i], "--config=", 9) == 0) {
            common.config = argv[i] + 9;
        } else if (strcmp(argv[i], "--version") == 0) {
            printf("tessera %s (plugin ABI %d.%d)\n", ts_version(), TS_PLUGIN_ABI_MAJOR,
                   TS_PLUGIN_ABI_MINOR);
            return 0;
        } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            fputs(usage, stdout);
            return 0;
        } else {
            return cli_usage_error(NULL, "unknown option '%s'", argv[i]);
        }
    }
    if (i == argc) {
        fputs(usage, stderr);
        return 2;
    }
    const char *cmd = argv[i];
    if (strcmp(cmd, "info") == 0)
        return cmd_info(argc - i, argv + i, &common);
    if (strcmp(cmd, "train") == 0)
        return cmd_train(argc - i, argv + i, &common);
    if (strcmp(cmd, "plugin-check") == 0)
        return cmd_plugin_check(argc - i, argv + i, &common);
    if (strcmp(cmd, "bench") == 0) {
        if (i + 1 < argc && strcmp(argv[i + 1], "pool") == 0)
            return cli_bench_pool(argc - i - 1, argv + i + 1, &common);
        if (i + 1 < argc && strcmp(argv[i + 1], "ops") == 0)
            return cli_bench_ops(argc - i - 1, argv + i + 1, &common);
        if (i + 1 < argc && strcmp(argv[i + 1], "autograd") == 0)
            return cli_bench_autograd(argc - i - 1, argv + i + 1, &common);
        if (i + 1 < argc && strcmp(argv[i + 1], "compare") == 0)
            return cli_bench_compare(argc - i - 1, argv + i + 1, &common);
        if (i + 1 < argc && strcmp(argv[i + 1], "train") == 0)
            return cli_bench_train(argc - i - 1, argv + i + 1, &common);
        if (i + 1 < argc && strcmp(argv[i + 1], "cuda") == 0)
            return cli_bench_cuda(argc - i - 1, argv + i + 1, &common);
        if (i + 1 < argc && (strcmp(argv[i + 1], "-h") == 0 || strcmp(argv[i + 1], "--help") == 0)) {
            puts("usage: tessera bench pool|ops|autograd|compare|train|cuda [--json] ... (tessera bench NAME --help)");
            return 0;
        }
        return cli_usage_error("bench", "expected a benchmark name: pool, ops, autograd, compare, train or cuda");
    }
    if (strcmp(cmd, "help") == 0) {
        if (i + 1 < argc && strcmp(argv[i + 1], "info") == 0) {
            char *a[] = {argv[i + 1], "--help", NULL};
            return cmd_info(2, a, &common);
        }
        if (i + 1 < argc && strcmp(argv[i + 1], "train") == 0) {
            char *a[] = {argv[i + 1], "--help", NULL};
            return cmd_train(2, a, &common);
        }
        if (i + 1 < argc && strcmp(argv[i + 1], "plugin-check") == 0) {
            char *a[] = {argv[i + 1], "--help", NULL};
            return cmd_plugin_check(2, a, &common);
        }
        fputs(usage, stdout);
        return 0;
    }
    return cli_usage_error(NULL, "unknown command '%s'", cmd);
}
