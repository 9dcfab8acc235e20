/* tools/cli.h: what the tessera subcommands share. */
#ifndef TESSERA_TOOLS_CLI_H
#define TESSERA_TOOLS_CLI_H

#include <tessera/tessera.h>

/* Options every subcommand takes. */
typedef struct cli_common {
    const char *config; /* --config FILE, or NULL */
    int json;           /* --json */
} cli_common;

/* Prints "tessera: error: ..." and returns 2 (misuse) or 1 (failure). */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int cli_fail(ts_status s, const char *what);

/* Formats bytes as "1.50 GiB" into buf. */
const char *cli_bytes(unsigned long long bytes, char *buf, size_t len);

int cmd_info(int argc, char **argv, const cli_common *common);
int cmd_train(int argc, char **argv, const cli_common *common);
int cmd_plugin_check(int argc, char **argv, const cli_common *common);
int cli_bench_compare(int argc, char **argv, const cli_common *common);
/* The models of `tessera train`: "mlp", "lenet5", "cnn" (TS_EINVAL for another name). */
ts_status cli_build_model(const char *name, ts_device *dev, ts_rng *rng, ts_module **out);
int cli_bench_ops(int argc, char **argv, const cli_common *common);
int cli_bench_autograd(int argc, char **argv, const cli_common *common);

#endif /* TESSERA_TOOLS_CLI_H */
