/* tools/tessera.c: the `tessera` command: global options, subcommands from a table (and the
 * benchmarks from another; the usage text is generated from both), `help`, and the log
 * handler that turns the library's messages into stderr lines. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_pool.h"
#include "cli.h"

typedef int (*command_fn)(int argc, char **argv, const cli_common *common);

/* A subcommand: its name, the arguments shown in the usage, one line of summary and the
 * function that runs it (argv[0] is the name; "--help" prints its own usage). */
typedef struct command {
    const char *name, *args, *summary;
    command_fn run;
} command;

static int cmd_bench(int argc, char **argv, const cli_common *common);
static int cmd_help(int argc, char **argv, const cli_common *common);

static const command benches[] = {
    {"pool", "[...]", "caching pool vs malloc/free on a training-like size mix", cli_bench_pool},
    {"ops", "[...]", "matmul vs cblas_sgemm, add vs memcpy, small-op overhead", cli_bench_ops},
    {"autograd", "", "cost of recording the graph: time per op, memory per step",
     cli_bench_autograd},
    {"compare", "", "the same conv, matmul and training step on several backends",
     cli_bench_compare},
    {"train", "[...]", "training step time vs its GEMM floor, allocations per step",
     cli_bench_train},
    {"cuda", "", "the cuda plugin vs raw cuBLAS/CUDA, and GPU vs CPU training", cli_bench_cuda},
    {"gpt", "[...]", "a GPT over 10,000 steps: peak RSS, raw allocations, mallocs per step",
     cli_bench_gpt},
    {"dist", "[...]", "all-reduce vs raw MPI_Allreduce; data-parallel training throughput",
     cli_bench_dist},
};

static const command commands[] = {
    {"info", "[--json]", "version, configuration, plugins found, devices and pools", cmd_info},
    {"train", "[...]", "train a model: Fashion-MNIST, or a GPT on text (--model gpt)",
     cmd_train},
    {"eval", "--resume CKPT", "test accuracy or validation loss of a checkpoint", cmd_eval},
    {"generate", "--resume CKPT", "sample text from a GPT checkpoint", cmd_generate},
    {"inspect", "FILE", "tensors, dtypes, shapes and metadata of a safetensors file",
     cmd_inspect},
    {"convert", "IN... -o OUT", "NumPy .npy arrays to a safetensors file and back",
     cmd_convert},
    {"memplot", "TRACE", "draw a memory trace as an SVG: in use, reserved, peaks, epochs",
     cmd_memplot},
    {"plugin-check", "NAME", "conformance suite of a plugin, by NAME or PATH.so",
     cmd_plugin_check},
    {"bench", "NAME [...]", "benchmarks (tessera bench --help): pool, ops, autograd, compare, "
     "train, cuda, gpt", cmd_bench},
    {"help", "[COMMAND]", "this text, or a command's own --help", cmd_help},
};

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static const command *find(const command *table, size_t n, const char *name)
{
    for (size_t i = 0; name && i < n; i++)
        if (strcmp(table[i].name, name) == 0)
            return &table[i];
    return NULL;
}

/* The name of table closest to a misspelt one (at most 2 edits: a letter added, dropped,
 * changed or two swapped), or NULL. */
static const char *closest(const command *table, size_t n, const char *name)
{
    const char *names[64];
    for (size_t i = 0; i < n && i < 64; i++)
        names[i] = table[i].name;
    return cli_did_you_mean(name, names, n < 64 ? n : 64);
}

/* "unknown command 'trian' (did you mean 'train'?)" */
static int unknown(const char *cmd, const char *what, const command *table, size_t n,
                   const char *name)
{
    const char *near = closest(table, n, name);
    return cli_usage_error(cmd, "unknown %s '%s'%s%s%s", what, name,
                           near ? " (did you mean '" : "", near ? near : "", near ? "'?)" : "");
}

static void print_table(FILE *f, const char *prefix, const command *table, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char left[64];
        snprintf(left, sizeof left, "%s%s%s%s", prefix, table[i].name, table[i].args[0] ? " " : "",
                 table[i].args);
        fprintf(f, "  %-22s %s\n", left, table[i].summary);
    }
}

static void print_usage(FILE *f)
{
    fputs("usage: tessera [--config FILE] COMMAND [ARGS]\n\ncommands:\n", f);
    print_table(f, "", commands, COUNT(commands));
    fputs("\nbenchmarks:\n", f);
    print_table(f, "bench ", benches, COUNT(benches));
    fputs("\noptions:\n"
          "  --config FILE          your configuration file (default: $TESSERA_CONFIG, else\n"
          "                         $XDG_CONFIG_HOME/tessera/tessera.ini), read on top of the\n"
          "                         installed one key by key\n"
          "  --version              print the version\n"
          "  -h, --help             print this help\n"
          "\n"
          "environment:\n"
          "  TESSERA_CONFIG         your configuration file (over the installed one)\n"
          "  TESSERA_SYSTEM_CONFIG  replaces the installed configuration file's path\n"
          "  TESSERA_DEVICE         the device, over [core] device\n"
          "  TESSERA_PLUGIN_PATH    extra plugin directories (absolute, colon-separated)\n"
          "  TESSERA_SYSTEM_PLUGIN_DIR  replaces the installed plugin directory\n"
          "  TESSERA_MEMTRACE       write a Chrome/Perfetto trace of pool memory to this file\n"
          "  TESSERA_DEBUG_MEMORY   1: record where each block was made, for leak reports\n"
          "  launchers' variables (mpirun, srun): see man tessera\n",
          f);
}

static void print_bench_usage(FILE *f)
{
    fputs("usage: tessera bench NAME [ARGS]   (tessera bench NAME --help for its options)\n\n", f);
    print_table(f, "", benches, COUNT(benches));
}

static int cmd_bench(int argc, char **argv, const cli_common *common)
{
    /* The counters interpose malloc and pthread_create: bench runs with the benchmark module
     * preloaded (re-executed once), nothing else does. */
    if (argc >= 2 && strcmp(argv[1], "-h") != 0 && strcmp(argv[1], "--help") != 0)
        cli_bench_preload(common->argv);
    if (argc < 2)
        return cli_usage_error("bench", "expected a benchmark name: pool, ops, autograd, "
                               "compare, train, cuda or gpt");
    if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        print_bench_usage(stdout);
        return 0;
    }
    const command *b = find(benches, COUNT(benches), argv[1]);
    if (!b)
        return cli_usage_error("bench", "unknown benchmark '%s' (pool, ops, autograd, compare, "
                               "train, cuda or gpt)", argv[1]);
    return b->run(argc - 1, argv + 1, common);
}

/* `tessera help [COMMAND [BENCHMARK]]`: a command's own --help. */
static int cmd_help(int argc, char **argv, const cli_common *common)
{
    if (argc < 2) {
        print_usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "--help") == 0) {
        puts("usage: tessera help [COMMAND [BENCHMARK]]\n\nPrints a command's own help (tessera "
             "help bench train: a benchmark's); without COMMAND, the list of commands.");
        return 0;
    }
    const command *c = find(commands, COUNT(commands), argv[1]);
    if (!c)
        return unknown("help", "command", commands, COUNT(commands), argv[1]);
    if (c->run == cmd_bench) {
        if (argc < 3) {
            print_bench_usage(stdout);
            return 0;
        }
        const command *b = find(benches, COUNT(benches), argv[2]);
        if (!b)
            return cli_usage_error("help", "unknown benchmark '%s'", argv[2]);
        char *a[] = {argv[2], "--help", NULL};
        return b->run(2, a, common);
    }
    char *a[] = {argv[1], "--help", NULL};
    return c->run(2, a, common);
}

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
    cli_common common = {.argv = argv};
    ts_set_log_handler(log_to_stderr, NULL);
    /* a redirected run's lines reach its log as they are printed (nohup, CI), not at exit */
    setvbuf(stdout, NULL, _IOLBF, 0);
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
            print_usage(stdout);
            return 0;
        } else {
            return cli_usage_error(NULL, "unknown option '%s'", argv[i]);
        }
    }
    if (common.config && !*common.config)
        return cli_usage_error(NULL, "--config needs a FILE: an empty name means no file, not "
                                     "the default (leave --config out for that)");
    if (i == argc) {
        print_usage(stderr);
        return 2;
    }
    const command *c = find(commands, COUNT(commands), argv[i]);
    if (!c)
        return unknown(NULL, "command", commands, COUNT(commands), argv[i]);
    /* --name=value is --name value, for every command */
    char **args = calloc(2 * (size_t)(argc - i) + 1, sizeof *args);
    if (!args)
        return cli_fail(TS_ENOMEM, "tessera");
    int n = 0;
    for (int k = i; k < argc; k++) {
        const char *eq = argv[k][0] == '-' && argv[k][1] == '-' ? strchr(argv[k], '=') : NULL;
        if (eq && eq > argv[k] + 2 && strspn(argv[k] + 2, "abcdefghijklmnopqrstuvwxyz"
                                                          "0123456789-") == (size_t)(eq - argv[k] - 2)) {
            *(char *)eq = 0; /* argv is ours to change */
            args[n++] = argv[k];
            args[n++] = (char *)eq + 1;
        } else {
            args[n++] = argv[k];
        }
    }
    int rc = c->run(n, args, &common);
    free(args);
    return rc;
}
