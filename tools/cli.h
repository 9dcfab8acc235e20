/* tools/cli.h: what the tessera subcommands share. */
#ifndef TESSERA_TOOLS_CLI_H
#define TESSERA_TOOLS_CLI_H

#include <time.h>

#include <tessera/tessera.h>
#include <tessera/models.h>

/* Options every subcommand takes. */
typedef struct cli_common {
    const char *config; /* --config FILE, or NULL */
    int json;           /* --json */
    char **argv;        /* the command line as main got it (to re-execute) */
} cli_common;

/* Prints "tessera: error: ..." and returns 2 (misuse) or 1 (failure). */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int cli_fail(ts_status s, const char *what);
/* Strict numeric option values (tools/cli_args.c): all of v a number, no overflow, finite, in
 * range; else a usage error naming opt, v and the range, and the return value is 2. 0 when
 * *out was set. min_open: the value must be > min, not >= min. */
int cli_parse_i64(const char *cmd, const char *opt, const char *v, int64_t min, int64_t max,
                  int64_t *out);
int cli_parse_u64(const char *cmd, const char *opt, const char *v, uint64_t min, uint64_t max,
                  uint64_t *out);
int cli_parse_double(const char *cmd, const char *opt, const char *v, double min, int min_open,
                     double max, double *out);

/* The same rule without a message: 0 (*out set), 1 not a number, 2 out of range. */
int cli_strict_i64(const char *v, int64_t min, int64_t max, int64_t *out);
int cli_strict_u64(const char *v, uint64_t min, uint64_t max, uint64_t *out);
int cli_strict_double(const char *v, double min, int min_open, double max, double *out);

/* ---- options as data (tools/cli_opts.c) ---------------------------------------------- */
/* One row per option of a command: the flag, the type and where its value lives in the
 * command's options struct, the range, and what the run does with it: its key in the JSON
 * start record, the checkpoint key a resumed run takes it from, whether a differing value on
 * --resume is refused or an override, and the group of settings the ranks of a job must agree
 * on. Parsing (with "did you mean"), the start record, the resume adoption and the ranks'
 * fingerprints all come from the rows. */
struct cJSON;
typedef enum cli_opt_type {
    CLI_I64,   /* int64_t */
    CLI_U64,   /* uint64_t */
    CLI_F64,   /* double */
    CLI_STR,   /* const char * (NULL: not given) */
    CLI_FLAG,  /* int, set to 1 */
    CLI_ONOFF, /* int: "on" 1, "off" 0 */
    CLI_CHOICE, /* const char *: one of choices */
    CLI_LEVEL   /* int: 1 alone; 2 + i when followed by choices[i] (--profile all) */
} cli_opt_type;
typedef struct cli_opt {
    const char *flag;
    cli_opt_type type;
    size_t off;        /* of the value in the options struct */
    double lo, hi;     /* the range of a number */
    int lo_open;       /* lo itself excluded */
    size_t hi_of;      /* non-zero: off + 1 of an earlier row's value that bounds this one */
    const char *json;  /* its key in the start record, or NULL */
    const char *ckpt;  /* the metadata key --resume takes it from unless given, or NULL */
    int refuse;        /* given otherwise than ckpt on --resume: refused (else an override) */
    int agree;         /* the group of settings the ranks must agree on (0: none) */
    const char *const *choices; /* CLI_CHOICE: the values, NULL-terminated */
    const char *arg;   /* the value's name in --help (NULL: from the type: N, X, on|off...) */
    const char *help;  /* its line in --help, wrapped there (NULL: not shown) */
} cli_opt;
/* A command's --help: "usage: " synopsis, then one [flag ARG] per shown row of pre and of the
 * table, intro, each shown row with its help, outro. pre: rows another parser reads (shown
 * first, never parsed by the table). */
typedef struct cli_usage {
    const char *synopsis; /* "tessera train" */
    const char *intro, *outro;
    const cli_opt *pre;
    size_t npre;
} cli_usage;
void cli_opts_usage(FILE *f, const cli_usage *u, const cli_opt *t, size_t n);
#define CLI_OFF(type, field) offsetof(type, field)
/* Parses argv[1..] by the table into o; given[i] is set for each row seen. An argument no row
 * has goes to other (when not NULL: 1 when it took the argument and its value, 0 when not
 * its own, -1 after a usage error of its own; other_flags, NULL-terminated, names its flags
 * for "did you mean"). "-h"/"--help" prints usage and returns -1; an
 * unknown argument is a usage error naming the closest flag. 0, or 2 after a usage error. */
int cli_opts_parse(const char *cmd, const char *what, const cli_opt *t, size_t n, int argc,
                   char **argv, void *o, unsigned char *given, const cli_usage *usage,
                   int (*other)(void *o, const char *arg, const char *value),
                   const char *const *other_flags);
/* Whether the row of flag was given. */
int cli_opts_given(const cli_opt *t, size_t n, const unsigned char *given, const char *flag);
/* --resume: each row with a ckpt key, in table order, from ck unless given (given otherwise:
 * refused naming both values, or accepted as an override); each value checked against the
 * row's range. 0, or the exit status after a message. */
int cli_opts_adopt(const cli_opt *t, size_t n, const unsigned char *given,
                   const ts_checkpoint *ck, const char *path, void *o);
/* Adds every row with a json key to the start record j. */
void cli_opts_record(const cli_opt *t, size_t n, const void *o, struct cJSON *j);
/* The fingerprint of the rows of one agreement group. */
uint64_t cli_opts_fingerprint(const cli_opt *t, size_t n, const void *o, int group);

/* "pool: peak in use 12.0 MiB, reserved 16.0 MiB; cache hits 99.9% of 52,000 allocations;
 * fragmentation 3%": dev's pool at the end of a run, into buf; and the same figures as JSON
 * fields (pool_peak_in_use, pool_reserved, pool_hit_rate, pool_fragmentation) in j. */
const char *cli_pool_summary(ts_device *dev, char *buf, size_t len);
/* "; the optimizer's state sharded over them, 1/world on each ([dist] shard_optimizer)" into
 * buf for a sharded opt, else "": the tail of the trainers' data-parallel line. */
const char *cli_sharded_text(const ts_optim *opt, int world, char *buf, size_t len);
void cli_pool_record(ts_device *dev, struct cJSON *j);
/* ---- progress (tools/cli_progress.c) ---------------------------------------------------- */
/* One display for every training loop. On a terminal: one line redrawn in place, as wide as
 * the terminal (TIOCGWINSZ, read again after SIGWINCH): fields are dropped from the least
 * important up until the line fits, and the bar takes what is left. Elsewhere (a file, a
 * pipe, CI): a plain line every log_every steps, or when log_every is 0 one 5 seconds into
 * the run and then every 30 seconds, so a redirected run shows progress without flags. */
typedef struct cli_progress {
    int tty;
    int64_t log_every;
    double last; /* cli_now() of the last plain line */
    int shown;   /* a bar is on the terminal's line */
} cli_progress;
void cli_progress_init(cli_progress *p, int tty, int64_t log_every);
/* The training loops' line: head ("epoch 1/3 batch 10/128:", "step 20/2000:"), the bar at
 * frac, the loss, the rate in unit ("images/s"), elapsed and the time left (done of total
 * steps since started) and dev's pool in use. */
void cli_progress_step(cli_progress *p, int64_t step, const char *head, double frac,
                       double loss, double rate, const char *unit, double started,
                       int64_t done, int64_t left, ts_device *dev);
/* Clears the bar's line (before other output). */
void cli_progress_clear(cli_progress *p);
/* Prints text and a newline on stdout; on a terminal narrower than the text, broken after
 * ", " or "; " (else at a space) into lines that fit, continuations indented by two. */
void cli_puts_fit(const char *text);
/* The same for a printf format (a trailing newline is the one it prints). */
void cli_printf_fit(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The terminal's width for the display (80 when unknown). */
int cli_term_cols(void);

/* Formats bytes as "1.50 GiB" into buf. */
const char *cli_bytes(unsigned long long bytes, char *buf, size_t len);

/* Seconds on clock (CLOCK_MONOTONIC for wall time, CLOCK_PROCESS_CPUTIME_ID for CPU time). */
double cli_seconds(clockid_t clock);
static inline double cli_now(void)
{
    return cli_seconds(CLOCK_MONOTONIC);
}
/* Training loops stop cleanly on SIGINT and SIGTERM: after cli_stop_signals_install, the
 * first such signal only records itself (the loop finishes its step, saves and exits with
 * 128 + the signal's number); a second one ends the process as usual. */
void cli_stop_signals_install(void);
/* The recorded signal's number, or 0. */
int cli_stop_requested(void);
/* The flag behind it, for ts_fit_options.stop. */
const volatile sig_atomic_t *cli_stop_flag(void);
/* "SIGINT", "SIGTERM" or "signal N". (static) */
const char *cli_signal_name(int sig);
/* Formats seconds as "42.3 s", "3m05s" or "2h03m" into buf. */
const char *cli_duration(double seconds, char *buf, size_t len);

/* Under mpirun, after --resume: 0 when every rank is at the same step; else 1, with a message
 * naming the rank (every rank fails then, or the job is aborted: never a hang). */
int ranks_at_same_step(int64_t step, int rank, int world, const char *ckpt);
/* Prints a JSON object as one line on stdout, flushed, and frees it (cJSON). */
struct cJSON;
void cli_json_line(struct cJSON *o);
/* The fields every `tessera eval` JSON record starts with: event "eval", checkpoint, model,
 * checkpoint_step. (transfer full: for cli_json_line) */
struct cJSON *cli_eval_record(const char *ckpt, const char *model, long long step);
/* key: value, or key: null when value is NULL. */
void cli_json_str_or_null(struct cJSON *o, const char *key, const char *value);
/* --memtrace/--memplot: refuses the trace's file or the picture being one of the
 * checkpoints keep names (--save, --resume, --save-initial; NULL: none) by any spelling or
 * link (exit status 2), then starts the trace (memtrace, or memplot + ".trace.json"; ".rankN"
 * appended under mpirun) into trace (len bytes; "" when none). 0, or the exit status (1,
 * or 2 for the misuse) after an error message. */
int cli_memtrace_begin(char *trace, size_t len, const char *memtrace, const char *memplot,
                       const char *const keep[3], int rank, int world);
/* Stops the trace started above and, when draw and memplot, draws it: 0, or 1 when the
 * drawing failed (its message printed). */
int cli_memtrace_end(const char *trace, const char *memplot, int draw,
                     const cli_common *common);
/* Under mpirun: this rank's n settings fingerprints against rank 0's. 0 when every rank
 * agrees; 1 when one differs (named on every rank with what[i], its first differing field:
 * "another --seed"); -1 when comparing failed here (the others are in the collective: the
 * caller ends the job). */
int cli_ranks_agree(const uint64_t *mine, size_t n, const char *const *what, int rank,
                    int world);
/* What a training command starts and must stop: the core, the distributed job, the memory
 * trace; this process's rank and the device it trains on. */
typedef struct cli_session {
    int rank, world; /* world 1: one process */
    ts_device *dev;
    const char *memplot;
    int stopped;      /* the signal that stopped training, or 0 */
    char trace[4200]; /* --memtrace's file, while one is written */
} cli_session;
/* Starts tessera (config), joins the distributed job, installs the stop signals, silences
 * stdout on ranks above 0, refuses an unwritable --save (save; NULL: none) on rank 0 before
 * anything is built, begins the memory trace (memtrace, memplot, keep: cli_memtrace_begin)
 * and picks the device (device, else a device-buffer backend's, else the default). 0, or the
 * exit status after a message, with everything started stopped again. */
int cli_session_begin(cli_session *ss, const char *config, const char *device, const char *save,
                      const char *memtrace, const char *memplot, const char *const keep[3]);
/* Under mpirun: refuses, on every rank, a rank whose run differs (differ from cli_ranks_agree:
 * 1) and lets each rank stop alone (world becomes 1); -1 (a local failure) is left to the
 * caller. Returns differ. */
int cli_session_refuse_differing(cli_session *ss, int differ);
/* Ends the session begun above with the command's exit status rc: ends the memory trace
 * (drawn on rank 0 when rc is 0 or a signal stopped the run; a failed drawing makes rc 1),
 * ends the whole job when this rank failed while others wait in a collective, then leaves
 * the distributed job and the core. Returns the exit status. */
int cli_session_end(cli_session *ss, int rc, const cli_common *common);
/* "tessera: SIGTERM: stopped after step N[ (T of training)]; saved CKPT; continue with:" and,
 * on the next line, the exact command that continues the run (tessera train --resume CKPT,
 * then each pair of keep (flag, value; NULL-terminated; a NULL value left out), every word
 * quoted for the shell), or that nothing was saved, on stderr. took may be NULL. */
void cli_say_stopped(int sig, long long step, const char *took, const char *save,
                     const char *const *keep);
/* "unary relu float32", "matmul float32", "fill": a kernel profile entry's name. */
void cli_kernel_name(const ts_profile_entry *e, char *buf, size_t n);
/* --profile (on nonzero): the kernel profile, counted from now. */
void cli_profile_begin(int on);
/* With --profile, a "step N" slice around a training step on the trace's kernel track. */
void cli_step_mark(int on, long long step, int begin);
/* What both trainers do at ts_fit's step events: at TS_FIT_STEP_BEGIN the step's --profile
 * slice opens and --memtrace counts from it; at TS_FIT_STEP the slice closes and --log-steps
 * prints the step's line (a JSON line with json), lr the learning rate it ran at. */
void cli_fit_step(ts_fit_event ev, const ts_fit_state *st, int profile, int log_steps, int json,
                  double lr);
/* After a failed ts_fit: closes the --profile slice of the step that failed, if one is open. */
void cli_fit_failed(int profile);
/* With --profile: the kernels with the most time, per step over steps (seconds: the run's
 * wall time), as a table on stderr, or with json a {"event": "profile"} record on stdout;
 * then the profile is turned off. */
void cli_profile_report(int on, long long steps, double seconds, int json);
/* With --profile: an evaluation pass begins (begin) or ends; its kernels are reported apart
 * from the training steps'. */
void cli_profile_eval(int on, int begin);
/* Text from a file (a tensor name, metadata) made safe to print: control characters and bytes
 * over 0x7e as \xNN, cut with "..." after max bytes, into buf (len bytes). Returns buf. */
const char *cli_printable(const char *s, size_t max, char *buf, size_t len);
/* Restores a model's parameters and buffers from ck (the file path, for messages) as every
 * command that reads a checkpoint does: each must be there with its shape and dtype, the
 * checkpoint may hold nothing else but optimizer state ("optim." names), and every restored
 * floating-point value must be finite. Prints the error; returns 0, or the exit status. */
int cli_restore_model(const ts_checkpoint *ck, const char *path, const ts_named_tensor *params,
                      size_t np, const ts_named_tensor *buffers, size_t nb);
/* The GPT's checkpoints as train --resume, eval and generate all read them: the model from
 * the checkpoint's configuration (ts_model_load_config) must be gpt and train.format
 * CLI_GPT_FORMAT; the parameters are then restored with cli_restore_model, which checks them
 * against the tensors present. Prints the error; returns 0 ((transfer full) on *ck), or the
 * exit status. */
#define CLI_GPT_FORMAT "tessera-train-gpt-1"
/* Whether cfg, read from ck, has as many parameters as ck's tensors hold (optimizer state
 * aside): checked before anything is built, so that a hostile configuration cannot make a
 * run allocate and initialise a huge model first. 0, or 1 after a message naming path. */
int cli_model_matches_tensors(const ts_checkpoint *ck, const char *path,
                              const ts_model_config *cfg);
int cli_gpt_open(const char *path, ts_device *dev, ts_checkpoint **ck, ts_gpt_config *cfg);
/* A training checkpoint's whole-number metadata: key written as decimal digits; read back
 * strictly (digits only, at most max), 1 after a message naming path and key when it is
 * missing or malformed. */
void cli_meta_set_u64(ts_checkpoint *ck, const char *key, uint64_t v);
int cli_meta_u64(const ts_checkpoint *ck, const char *path, const char *key, uint64_t max,
                 uint64_t *v);
/* "gpt --context C --layers L --heads H --embd E --dropout D" (ts_model_describe). */
const char *cli_gpt_describe(const ts_gpt_config *c, char *buf, size_t len);
/* 1, after an error message naming the sizes, when ts_gpt_bytes is over dev's pool limit. */
int cli_gpt_too_big(const ts_gpt_config *c, int64_t batch, int training, ts_device *dev);
/* A run setting a resumed run takes from its checkpoint: metadata key of the checkpoint, for
 * option opt. Not given: *v becomes the checkpoint's value. Given with another value: with
 * refuse, 2 after a message naming both values; without, left as given (an override, or
 * checked later). A value outside [lo, hi] (the option's own range): 1 after a message. A
 * missing key: 1 after a message when required, else 0 and *v as it was. */
typedef struct cli_run_key {
    const char *key, *opt;
    int given, required, refuse;
} cli_run_key;
int cli_adopt_int(const ts_checkpoint *ck, const char *path, cli_run_key k, uint64_t lo,
                  uint64_t hi, uint64_t *v);
int cli_adopt_f64(const ts_checkpoint *ck, const char *path, cli_run_key k, double lo,
                  int lo_open, double hi, double *v);
/* A choice (one of choices, NULL-terminated) the same way; *v points into choices. */
int cli_adopt_choice(const ts_checkpoint *ck, const char *path, cli_run_key k,
                     const char *const *choices, const char **v);
/* --precision: "fp32" (default), "bf16" or "fp16" (mixed precision; fp16 with loss scaling),
 * and the trainer's dtype for it. */
extern const char *const cli_precisions[];
int32_t cli_precision_dtype(const char *p);
/* The entry of cli_precisions that v names, or NULL (v NULL too). */
const char *cli_precision_find(const char *v);
/* The --precision row of a trainer's option table (off: its field, a const char *; agree:
 * the ranks' agreement group; what: the ops that run in the 16-bit type). */
#define CLI_PRECISION_OPT(off_, agree_, what)                                                 \
    {.flag = "--precision", .type = CLI_CHOICE, .off = (off_), .choices = cli_precisions,     \
     .json = "precision", .ckpt = "train.precision", .agree = (agree_), .arg = "P",           \
     .help = "fp32 (default), bf16 or fp16: mixed precision as torch.autocast runs it, "      \
             "float32 weights, gradients and optimizer state with " what " in the 16-bit "    \
             "type; fp16 with dynamic loss scaling, as GradScaler (on --resume the "          \
             "checkpoint's unless given)"}
/* float16 loss scaling's state in a checkpoint (train.loss_scale, train.loss_scale_clean):
 * written from a float16 trainer only (none before the trainer exists: --save-initial); read
 * at --resume (absent: have 0, and a new fp16 trainer starts from the initial scale); put
 * back into the new trainer when it trains in fp16. read and apply: 0, or 1 after a
 * message. */
typedef struct cli_loss_scale {
    double scale;
    uint64_t clean;
    int have;
} cli_loss_scale;
void cli_save_loss_scale(ts_checkpoint *ck, const ts_trainer *tr, const char *precision);
int cli_read_loss_scale(const ts_checkpoint *ck, const char *path, cli_loss_scale *ls);
int cli_apply_loss_scale(const cli_loss_scale *ls, ts_trainer *tr, const char *precision);
/* Of names, the one a misspelt given is closest to (at most 2 edits: a letter added,
 * dropped, changed, or two swapped; fewer than half the name), or NULL: for "did you mean". */
const char *cli_did_you_mean(const char *given, const char *const *names, size_t n);
/* qsort comparator for doubles, ascending. */
int cli_cmp_double(const void *a, const void *b);

int cmd_info(int argc, char **argv, const cli_common *common);
/* tools/cmd_inspect.c: `tessera inspect FILE`. */
int cmd_inspect(int argc, char **argv, const cli_common *common);
/* tools/cmd_convert.c: `tessera convert IN... -o OUT` (.npy <-> safetensors). */
int cmd_convert(int argc, char **argv, const cli_common *common);
/* tools/cmd_memplot.c: `tessera memplot TRACE -o FILE.svg`. */
int cmd_memplot(int argc, char **argv, const cli_common *common);
int cmd_train(int argc, char **argv, const cli_common *common);
/* `tessera eval --resume CKPT`: cmd_train without training. */
int cmd_eval(int argc, char **argv, const cli_common *common);
/* tools/train_gpt.c: `tessera train --model gpt ...` (cmd_train hands it over). */
int cli_train_gpt(int argc, char **argv, const cli_common *common);
/* tools/cmd_generate.c: `tessera generate --resume CKPT ...`. */
int cmd_generate(int argc, char **argv, const cli_common *common);
/* tools/bench_gpt.c: `tessera bench gpt`: memory over many GPT training steps. */
int cli_bench_gpt(int argc, char **argv, const cli_common *common);
int cmd_plugin_check(int argc, char **argv, const cli_common *common);
int cli_bench_compare(int argc, char **argv, const cli_common *common);
/* A model of the registry by name, with its defaults (ts_model_defaults, ts_model_new). */
ts_status cli_build_model(const char *name, ts_device *dev, ts_rng *rng, ts_module **out);
/* Correct predictions of logits (B, 10) against labels (B), added to *correct: the
 * evaluation's kernels (argmax, eq, cast, sum). */
ts_status cli_count_correct(ts_tensor *logits, ts_tensor *labels, int64_t *correct);
/* `tessera plugin-check --coverage`: prints what the built-in models need that target does not
 * claim; the exit status (0, 1 when something is missing on a device without host memory, 2
 * when no device can run the models). */
int cli_plugin_coverage(ts_device *target);

/* A configurable model (`--model`, `--hidden`, `--channels`, `--init`), shared by `tessera
 * train` and `tessera bench train`: the options as given, -1 for a list not given; checked,
 * it becomes a ts_model_config of the registry (tessera/models.h). */
#define CLI_MAX_LAYERS TS_MODEL_MAX_LAYERS
typedef struct cli_model {
    const char *name;                /* "mlp", "lenet5" or "cnn" */
    int nhidden, nchannels;          /* -1: the model's default */
    int64_t hidden[CLI_MAX_LAYERS];  /* widths of the hidden linear layers (ReLU after each) */
    int64_t channels[CLI_MAX_LAYERS]; /* cnn: output channels of each 3x3 conv + pool block */
    int32_t init;                    /* ts_init_kind */
    double init_std;                 /* TS_INIT_NORMAL */
} cli_model;

/* The defaults: lenet5, Kaiming-uniform. */
void cli_model_init(cli_model *m);
/* If opt is one of --model, --hidden, --channels, --init: takes val into m and returns 1, or
 * prints a usage error for cmd and returns -2. Returns 0 for any other option. */
int cli_model_option(cli_model *m, const char *cmd, const char *opt, const char *val);
/* Checks the combination (--hidden only for mlp and cnn, --channels only for cnn, sizes) and
 * fills in the defaults. 0, or a usage error printed for cmd and 2. */
int cli_model_check(cli_model *m, const char *cmd);
/* "mlp --hidden 500 --init normal:0.01": the options that rebuild m. */
const char *cli_model_describe(const cli_model *m, char *buf, size_t len);
/* m (checked) as the registry's configuration. */
void cli_model_config(const cli_model *m, ts_model_config *out);
ts_status cli_build_model_spec(const cli_model *m, ts_device *dev, ts_rng *rng,
                               ts_module **out);
/* "sgd" (with momentum), "adam" or "adamw" over params. (transfer full) on *out */
ts_status cli_make_optim(const char *name, double lr, double momentum, double weight_decay,
                         ts_named_tensor *params, size_t n, ts_optim **out);
/* A model of `tessera train` with its optimizer over one fixed random batch of Fashion-MNIST's
 * shape (images in [0, 1), labels 0..9 as int64): what plugin-check's training check and
 * --coverage run. (transfer full) on f: free with cli_fixed_free. */
typedef struct cli_fixed {
    ts_module *model;
    ts_tensor *x, *y;
    ts_named_tensor *params;
    size_t nparams;
    ts_optim *opt;
} cli_fixed;
ts_status cli_fixed_setup(const char *model, const char *optim, double lr, ts_device *dev,
                          uint64_t seed, int64_t batch, cli_fixed *f);
void cli_fixed_free(cli_fixed *f);
int cli_bench_ops(int argc, char **argv, const cli_common *common);
int cli_bench_autograd(int argc, char **argv, const cli_common *common);
int cli_bench_train(int argc, char **argv, const cli_common *common);

/* tools/bench_hooks.c: the benchmark module's entry points (tools/benchmod/benchmod.h), found
 * at run time. cli_bench_preload re-executes `tessera bench` with the module preloaded (once;
 * returns when it cannot or need not). The counters: host allocations, all calls and those
 * from the code of libtessera or of the plugins at plugin_paths; setup finds that code and
 * zeroes the counters (counting off), returning 0 when counting is unavailable (no module,
 * sanitizer builds); enable turns counting on (1) or off (0); read reads the counters. */
void cli_bench_preload(char **argv);
int cli_malloc_count_setup(const char *const *plugin_paths, int npaths);
void cli_malloc_count_enable(int on);
void cli_malloc_count_read(uint64_t *tessera, uint64_t *all);
/* *created = threads the process has created so far (every pthread_create, by any library).
 * Returns 0 when counting is unavailable, 1 otherwise. */
int cli_thread_count_read(uint64_t *created);
/* The raw BLAS baseline: C = op(A) op(B), float32 row-major, on threads threads (0: as is).
 * cli_sgemm returns 0 (nothing done) and cli_have_sgemm 0 without it. */
int cli_sgemm(int ta, int tb, int m, int n, int k, const float *a, int lda, const float *b,
              int ldb, float *c, int ldc, int threads);
int cli_have_sgemm(void);
/* dlopens a file of the benchmark module's directory (next to the executable in a build
 * tree, else $(pkglibdir)): tessera-bench-mpi.so. NULL when absent or under AT_SECURE. */
void *cli_bench_dlopen(const char *file);
/* tools/bench_dist.c: `tessera bench dist`. */
int cli_bench_dist(int argc, char **argv, const cli_common *common);
int cli_bench_cuda(int argc, char **argv, const cli_common *common);

#endif /* TESSERA_TOOLS_CLI_H */
