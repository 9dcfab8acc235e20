/* tools/cmd_train.c: `tessera train`: a model on Fashion-MNIST, with a progress bar on a
 * terminal, one summary per epoch (or one JSON object with --json), evaluation on the test
 * set, and checkpoints that resume bit-identically (parameters, optimizer state, step,
 * shuffle position). */
#include "config.h"

#include <ctype.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli.h"

/* Documented ranges of the numeric options (usage text and docs/training.md). */
#define MAX_EPOCHS 1000000
#define MAX_BATCH ((int64_t)1 << 20)
#define MAX_STEPS ((int64_t)1 << 53)
#define MAX_LIMIT ((int64_t)1 << 31)
#define MAX_LR 1e6
#define MAX_WEIGHT_DECAY 1e3

typedef struct train_opts {
    const char *model, *optimizer, *device, *data, *save, *resume, *memtrace, *memplot, *config;
    int64_t epochs, batch, max_steps, train_limit, save_every, log_every, accumulate;
    double lr, momentum, weight_decay;
    const char *lr_schedule, *decay; /* "constant" / "step" / "cosine"; "all" / "matrices" */
    const char *precision;           /* "fp32" / "bf16" */
    int64_t warmup_steps, lr_step_size, lr_decay_steps;
    double min_lr, lr_gamma, clip;
    uint64_t seed;
    int json, log_steps, eval_only, profile;
    /* given on the command line (checked against a resumed checkpoint) */
    cli_model arch; /* --model, --hidden, --channels, --init */
    unsigned char given[48]; /* per row of opts */
} train_opts;

/* The options, once (tools/cli.h, cli_opt): flag, type, field, range, start-record key, the
 * checkpoint key a resumed run takes it from unless given, and the group of settings every
 * rank must agree on. The model's own options (--model, --hidden, --channels, --init) are
 * cli_model_option's. A resumed run refuses another --seed, --batch-size or --train-limit in
 * resume() (with the position checked); the rows' adoption never refuses. */
enum { SEED = 1, BATCH, OPT, DATA };
static const char *const schedules[] = {"constant", "step", "cosine", NULL};
static const char *const decays[] = {"all", "matrices", NULL};
static const char *const profile_all[] = {"all", NULL}; /* --profile all: every kernel */
#define O(f) CLI_OFF(train_opts, f)
static const cli_opt opts[] = {
    {.flag = "--optimizer", .type = CLI_STR, .off = O(optimizer), .json = "optimizer",
     .agree = OPT, .arg = "sgd|adam|adamw",
     .help = "the optimizer (default adam)"},
    {.flag = "--device", .type = CLI_STR, .off = O(device), .arg = "NAME",
     .help = "the backend: a plugin's name or path (default: the configuration's)"},
    {.flag = "--data", .type = CLI_STR, .off = O(data), .arg = "DIR",
     .help = "the Fashion-MNIST files (default " TS_FASHION_MNIST_DIR ")"},
    {.flag = "--save", .type = CLI_STR, .off = O(save), .arg = "CKPT",
     .help = "write a checkpoint (safetensors) after every epoch and at the end; the path is "
             "checked before training starts"},
    {.flag = "--resume", .type = CLI_STR, .off = O(resume), .json = "resumed_from",
     .agree = DATA, .arg = "CKPT",
     .help = "continue exactly where CKPT stopped: its model, optimizer and settings, the same "
             "batches in the same order (a setting given must agree, or is refused naming both "
             "values)"},
    {.flag = "--memtrace", .type = CLI_STR, .off = O(memtrace), .arg = "TRACE",
     .help = "write a Chrome/Perfetto trace of the pools' memory with epoch and evaluation "
             "marks (one file a rank under mpirun: TRACE.rankN)"},
    {.flag = "--memplot", .type = CLI_STR, .off = O(memplot), .arg = "FILE.svg",
     .help = "draw the trace as an SVG at the end (tessera memplot); without --memtrace the "
             "trace is FILE.svg.trace.json"},
    {.flag = "--config", .type = CLI_STR, .off = O(config), .arg = "FILE",
     .help = "the configuration file (as tessera --config FILE)"}, /* the caller's */
    {"--seed", CLI_U64, O(seed), 0, 18446744073709551615.0, .json = "seed",
     .ckpt = "train.seed", .agree = SEED, .arg = "S",
     .help = "the seed of the initial weights, the batches' order and dropout (default 1)"},
    {"--batch-size", CLI_I64, O(batch), 1, (double)MAX_BATCH, .json = "batch_size",
     .ckpt = "train.batch_size", .agree = BATCH, .arg = "B",
     .help = "images per optimizer step (default 64); under mpirun the global batch, split "
             "over the ranks"},
    {"--train-limit", CLI_I64, O(train_limit), 0, (double)MAX_LIMIT, .ckpt = "train.train_limit",
     .agree = DATA,
     .help = "train on the first N training images only (0: all)"},
    {"--epochs", CLI_I64, O(epochs), 1, MAX_EPOCHS, .json = "epochs", .ckpt = "train.epochs",
     .agree = OPT,
     .help = "epochs to train (default 1)"},
    {"--accumulate", CLI_I64, O(accumulate), 1, (double)MAX_BATCH, .hi_of = O(batch) + 1,
     .json = "accumulate", .ckpt = "train.accumulate", .arg = "K",
     .help = "each step's batch in K micro-batches, their gradients summed: the activations of "
             "a batch/K at a time, the same step to float rounding (default 1; on --resume the "
             "checkpoint's unless given)"},
    CLI_PRECISION_OPT(O(precision), OPT, "the matmuls and convolutions"),
    {"--max-steps", CLI_I64, O(max_steps), 0, (double)MAX_STEPS, .json = "max_steps",
     .agree = OPT,
     .help = "stop after N optimizer steps in all (then evaluate and save)"},
    {"--save-every", CLI_I64, O(save_every), 1, (double)MAX_STEPS, .agree = 0,
     .help = "also write the checkpoint every N steps (needs --save)"},
    {"--log-every", CLI_I64, O(log_every), 1, (double)MAX_STEPS, .agree = 0,
     .help = "when stderr is not a terminal, a progress line there every N steps (default: 5 s "
             "in, then every 30 s); on a terminal a progress bar is drawn there instead"},
    {"--lr", CLI_F64, O(lr), 0, MAX_LR, 1, .json = "lr", .agree = OPT,
     .help = "the learning rate (default 1e-3; 0.05 with sgd)"},
    {"--momentum", CLI_F64, O(momentum), 0, 0.999999, .json = "momentum", .agree = OPT, .arg = "M",
     .help = "sgd's momentum (default 0)"},
    {"--weight-decay", CLI_F64, O(weight_decay), 0, MAX_WEIGHT_DECAY, .json = "weight_decay",
     .agree = OPT, .arg = "W",
     .help = "weight decay (default 0; decoupled from the gradient with adamw)"},
    {.flag = "--lr-schedule", .type = CLI_CHOICE, .off = O(lr_schedule), .choices = schedules,
     .json = "lr_schedule", .agree = OPT,
     .help = "the learning rate per step: constant (default), step (times --lr-gamma every "
             "--lr-step-size steps) or cosine (down to --min-lr at step --lr-decay-steps); "
             "each after a linear warm-up from 0 over --warmup-steps"},
    {"--warmup-steps", CLI_I64, O(warmup_steps), 0, (double)MAX_STEPS, .agree = OPT,
     .help = "warm-up steps (default 0)"},
    {"--min-lr", CLI_F64, O(min_lr), 0, MAX_LR, .agree = OPT,
     .help = "where cosine ends (default lr/10)"},
    {"--lr-decay-steps", CLI_I64, O(lr_decay_steps), 1, (double)MAX_STEPS, .agree = OPT,
     .help = "the step at which cosine reaches --min-lr (default: the run's last)"},
    {"--lr-step-size", CLI_I64, O(lr_step_size), 1, (double)MAX_STEPS, .agree = OPT,
     .help = "step: steps between decays (default one epoch)"},
    {"--lr-gamma", CLI_F64, O(lr_gamma), 0, 1, 1, .agree = OPT, .arg = "G",
     .help = "step: the factor of each decay (default 0.5)"},
    {"--clip-grad-norm", CLI_F64, O(clip), 0, 1e12, .json = "clip_grad_norm", .agree = OPT,
     .help = "scale the gradients to a global L2 norm of at most X (0: off, the default)"},
    {.flag = "--decay", .type = CLI_CHOICE, .off = O(decay), .choices = decays, .agree = OPT,
     .help = "which parameters weight decay applies to: all (default), or matrices (no decay "
             "on parameters of fewer than 2 dims: biases)"},
    {.flag = "--json", .type = CLI_FLAG, .off = O(json),
     .help = "one JSON object per epoch instead of the progress bar and summary"},
    {.flag = "--eval-only", .type = CLI_FLAG, .off = O(eval_only)}, /* tessera eval */
    {.flag = "--profile", .type = CLI_LEVEL, .off = O(profile), .choices = profile_all,
     .help = "time every kernel; at the end, where a training step's time goes and whether the "
             "plugin or the reference kernels ran each kernel, then the evaluation passes "
             "apart (stderr, or a JSON record with --json; the top 15, or all); with "
             "--memtrace each kernel is also a slice in the trace, inside \"step N\" slices, "
             "on the memory's timeline"},
    {.flag = "--log-steps", .type = CLI_FLAG, .off = O(log_steps),
     .help = "print every step's loss (one line each; JSON lines with --json)"},
};
#undef O
enum { NOPTS = sizeof opts / sizeof opts[0] };
_Static_assert(NOPTS <= sizeof ((train_opts *)0)->given, "train_opts.given is too small");

/* The model's options, which cli_model_option reads: shown in --help first. */
static const cli_opt model_opts[] = {
    {.flag = "--model", .arg = "mlp|lenet5|cnn", .help = "the model (default lenet5)"},
    {.flag = "--hidden", .arg = "N,...",
     .help = "widths of the hidden linear layers, ReLU after each (mlp default 256,128; cnn "
             "default none, after the conv blocks)"},
    {.flag = "--channels", .arg = "N,...",
     .help = "cnn: one block per entry: 3x3 conv (pad 1), ReLU, 2x2 max pool (default 32,64); "
             "then a linear layer to the 10 classes"},
    {.flag = "--init", .arg = "kaiming|kaiming-normal|xavier|normal:STD",
     .help = "weight initialisation (default kaiming: PyTorch's Kaiming-uniform); normal:STD "
             "draws N(0, STD) with zero biases"},
};

static const cli_usage usage = {
    .synopsis = "tessera train",
    .intro = "Trains on Fashion-MNIST (default data: " TS_FASHION_MNIST_DIR ", Debian package "
             "dataset-fashion-mnist). Defaults: lenet5, 1 epoch, batch 64, adam, lr 1e-3, seed "
             "1.\n",
    .outro = "A loss that becomes NaN or infinite stops training with exit status 1. SIGINT "
             "(Ctrl-C) or SIGTERM finishes the current step, saves (with --save) and exits with "
             "130 or 143; a second one stops at once.\n"
             "tessera train --model gpt --help: the character-level GPT on a text file.\n",
    .pre = model_opts,
    .npre = sizeof model_opts / sizeof model_opts[0],
};

static int given(const train_opts *o, const char *flag)
{
    return cli_opts_given(opts, NOPTS, o->given, flag);
}

/* Whether any option of the learning-rate schedule was given. */
static int schedule_given(const train_opts *o)
{
    static const char *const sched[] = {"--lr-schedule", "--warmup-steps", "--min-lr",
                                        "--lr-decay-steps", "--lr-step-size", "--lr-gamma"};
    int any = 0;
    for (size_t k = 0; k < sizeof sched / sizeof sched[0]; k++)
        any |= given(o, sched[k]);
    return any;
}

/* ---- models ------------------------------------------------------------------------------ */

void cli_model_init(cli_model *m)
{
    *m = (cli_model){.name = "lenet5", .nhidden = -1, .nchannels = -1,
                     .init = TS_INIT_KAIMING_UNIFORM};
}

/* "500" or "256,128" into out (at most CLI_MAX_LAYERS entries, each 1..max, each as strict
 * as any other number: no space, sign or trailing text). */
static int parse_list(const char *cmd, const char *opt, const char *val, int64_t max,
                      int64_t *out, int *n)
{
    const char *p = val;
    *n = 0;
    if (!*p)
        return cli_usage_error(cmd, "%s needs a comma-separated list of sizes", opt), -2;
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char item[32];
        if (len >= sizeof item)
            return cli_usage_error(cmd, "%s '%s': expected sizes like 256,128", opt, val), -2;
        memcpy(item, p, len);
        item[len] = '\0';
        if (*n == CLI_MAX_LAYERS)
            return cli_usage_error(cmd, "%s '%s': at most %d layers", opt, val,
                                   CLI_MAX_LAYERS), -2;
        int r = cli_strict_i64(item, 1, max, &out[*n]);
        if (r == 1)
            return cli_usage_error(cmd, "%s '%s': expected sizes like 256,128 ('%s' is not a "
                                   "whole number)", opt, val, item), -2;
        if (r == 2)
            return cli_usage_error(cmd, "%s '%s': each size must be 1..%lld", opt, val,
                                   (long long)max), -2;
        (*n)++;
        if (!comma)
            return 1;
        p = comma + 1;
    }
}

int cli_model_option(cli_model *m, const char *cmd, const char *opt, const char *val)
{
    int model = !strcmp(opt, "--model"), hidden = !strcmp(opt, "--hidden"),
        channels = !strcmp(opt, "--channels"), init = !strcmp(opt, "--init");
    if (!model && !hidden && !channels && !init)
        return 0;
    if (!val)
        return cli_usage_error(cmd, "%s needs a value%s", opt,
                               model ? ": mlp, lenet5 or cnn"
                               : init ? ": kaiming, kaiming-normal, xavier or normal:STD"
                                      : " like 256,128"), -2;
    if (model) {
        if (strcmp(val, "mlp") && strcmp(val, "lenet5") && strcmp(val, "cnn"))
            return cli_usage_error(cmd, "unknown model '%s' (mlp, lenet5 or cnn)", val), -2;
        m->name = val;
        return 1;
    }
    if (hidden)
        return parse_list(cmd, opt, val, 1 << 16, m->hidden, &m->nhidden);
    if (channels)
        return parse_list(cmd, opt, val, 4096, m->channels, &m->nchannels);
    if (!strcmp(val, "kaiming")) {
        m->init = TS_INIT_KAIMING_UNIFORM;
    } else if (!strcmp(val, "kaiming-normal")) {
        m->init = TS_INIT_KAIMING_NORMAL;
    } else if (!strcmp(val, "xavier")) {
        m->init = TS_INIT_XAVIER_UNIFORM;
    } else if (!strncmp(val, "normal:", 7)) {
        double sd;
        if (cli_strict_double(val + 7, 0, 1, 1e6, &sd))
            return cli_usage_error(cmd, "--init '%s': the standard deviation must be a number "
                                   "> 0 and at most 1e6, like normal:0.01", val), -2;
        m->init = TS_INIT_NORMAL;
        m->init_std = sd;
    } else {
        return cli_usage_error(cmd, "unknown --init '%s' (kaiming, kaiming-normal, xavier or "
                               "normal:STD)", val), -2;
    }
    return 1;
}

int cli_model_check(cli_model *m, const char *cmd)
{
    int mlp = !strcmp(m->name, "mlp"), cnn = !strcmp(m->name, "cnn");
    if (m->nhidden > 0 && !mlp && !cnn)
        return cli_usage_error(cmd, "--hidden applies to --model mlp or cnn, not %s", m->name);
    if (m->nchannels > 0 && !cnn)
        return cli_usage_error(cmd, "--channels applies to --model cnn, not %s", m->name);
    if (mlp && m->nhidden < 0) { /* 784-256-128-10 */
        m->nhidden = 2;
        m->hidden[0] = 256, m->hidden[1] = 128;
    }
    if (cnn && m->nchannels < 0) {
        m->nchannels = 2;
        m->channels[0] = 32, m->channels[1] = 64;
    }
    if (m->nhidden < 0)
        m->nhidden = 0;
    if (m->nchannels < 0)
        m->nchannels = 0;
    /* Each block halves 28x28 (rounding down): 14, 7, 3, 1, then nothing is left. */
    if (m->nchannels > 4)
        return cli_usage_error(cmd, "--channels: at most 4 conv blocks (each 2x2 pool halves "
                               "the 28x28 image: 14, 7, 3, 1), got %d", m->nchannels);
    return 0;
}

void cli_model_config(const cli_model *m, ts_model_config *out)
{
    ts_model_defaults(m->name, out);
    out->nhidden = m->nhidden > 0 ? m->nhidden : 0;
    out->nchannels = m->nchannels > 0 ? m->nchannels : 0;
    memset(out->hidden, 0, sizeof out->hidden); /* no default width left past the lists */
    memset(out->channels, 0, sizeof out->channels);
    memcpy(out->hidden, m->hidden, (size_t)out->nhidden * sizeof *m->hidden);
    memcpy(out->channels, m->channels, (size_t)out->nchannels * sizeof *m->channels);
    out->init = m->init;
    out->init_std = m->init == TS_INIT_NORMAL ? m->init_std : 0;
}

const char *cli_model_describe(const cli_model *m, char *buf, size_t len)
{
    ts_model_config c;
    cli_model_config(m, &c);
    return ts_model_describe(&c, buf, len);
}

ts_status cli_build_model_spec(const cli_model *mp, ts_device *dev, ts_rng *rng,
                               ts_module **out)
{
    *out = NULL;
    cli_model m = *mp;
    if (cli_model_check(&m, NULL))
        return TS_EINVAL;
    ts_model_config c;
    cli_model_config(&m, &c);
    return ts_model_new(&c, dev, rng, out);
}

ts_status cli_build_model(const char *name, ts_device *dev, ts_rng *rng, ts_module **out)
{
    ts_model_config c;
    ts_status s = ts_model_defaults(name, &c);
    return s ? s : ts_model_new(&c, dev, rng, out);
}

ts_status cli_make_optim(const char *name, double lr, double momentum, double weight_decay,
                         ts_named_tensor *params, size_t n, ts_optim **out)
{
    if (!strcmp(name, "sgd")) {
        ts_sgd_options so = {lr, momentum, 0, weight_decay, 0};
        return ts_optim_sgd(params, n, &so, out);
    }
    ts_adam_options ao = {lr, 0.9, 0.999, 1e-8, weight_decay};
    return !strcmp(name, "adam") ? ts_optim_adam(params, n, &ao, out)
                                 : ts_optim_adamw(params, n, &ao, out);
}

ts_status cli_fixed_setup(const char *model, const char *optim, double lr, ts_device *dev,
                          uint64_t seed, int64_t batch, cli_fixed *f)
{
    memset(f, 0, sizeof *f);
    ts_rng rng;
    ts_rng_init(&rng, seed);
    ts_tensor *yf = NULL;
    int64_t xs[4] = {batch, 1, 28, 28}, ys[1] = {batch};
    ts_status s = cli_build_model(model, dev, &rng, &f->model);
    if (!s)
        s = ts_tensor_rand(dev, TS_F32, 4, xs, 0, 1, &rng, &f->x);
    if (!s)
        s = ts_tensor_rand(dev, TS_F32, 1, ys, 0, 10, &rng, &yf);
    if (!s)
        s = ts_cast(yf, TS_I64, &f->y);
    ts_tensor_unref(yf);
    f->nparams = s ? 0 : ts_module_parameters(f->model, NULL, 0);
    if (!s && !(f->params = calloc(f->nparams + 1, sizeof *f->params)))
        s = TS_ENOMEM;
    if (!s) {
        ts_module_parameters(f->model, f->params, f->nparams);
        s = cli_make_optim(optim, lr, 0.9, 0, f->params, f->nparams, &f->opt);
    }
    if (s)
        cli_fixed_free(f);
    return s;
}

void cli_fixed_free(cli_fixed *f)
{
    ts_optim_free(f->opt);
    free(f->params);
    ts_module_free(f->model);
    ts_tensor_unref(f->x);
    ts_tensor_unref(f->y);
    memset(f, 0, sizeof *f);
}

/* ---- state ------------------------------------------------------------------------------- */

typedef struct trainer {
    train_opts o;
    ts_device *dev;
    ts_module *model;
    ts_named_tensor *params, *buffers;
    size_t nparams, nbuffers;
    ts_optim *opt;
    ts_loader *loader;
    ts_tensor *train_x, *train_y, *test_x, *test_y;
    ts_rng rng;        /* initialisation and dropout */
    int64_t step;      /* optimizer steps taken */
    uint64_t epoch;    /* the epoch in progress (0-based) */
    int tty;            /* the progress display is a bar on a terminal */
    int show_progress;  /* rank 0, no --log-steps: a bar, or plain lines where not a terminal */
    cli_progress progress;
    int save_failed; /* a checkpoint of --save could not be written */
    double epoch_t0;     /* cli_now() when the epoch in progress began */
    int64_t first_batch; /* its first batch run here (> 0: resumed part-way) */
    int64_t saved_step; /* the step of this run's last --save, or -1 */
    int rank, world;    /* data parallelism: this rank of world (1: a single process) */
    ts_trainer *tr;     /* the step (data-parallel when world > 1) */
    int64_t correct;    /* this rank's correct predictions in the epoch so far */
    int stopped_by;     /* the signal that stopped training, or 0 */
    double started;     /* cli_now() when training began */
    int64_t first_step; /* t->step then (a resumed run's start) */
    double best_acc, last_acc;
    uint64_t best_epoch; /* 1-based; 0: no evaluation yet */
    cli_loss_scale scale; /* --resume: fp16's loss scale from the checkpoint */
} trainer;

static uint64_t fnv64(const char *p)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *p; p++)
        h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
    return h;
}

/* A hash of t's bytes (64 bits at a time), into h; 0 when they cannot be read. */
static uint64_t hash_tensor(ts_tensor *t, uint64_t h)
{
    size_t n = (size_t)ts_tensor_numel(t) * ts_dtype_size(ts_tensor_dtype(t));
    unsigned char *b = malloc(n + 8);
    if (!b || ts_tensor_to_host(t, b, n) != TS_OK) {
        free(b);
        return 0;
    }
    memset(b + n, 0, 8);
    for (size_t i = 0; i < n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
    }
    free(b);
    return h ^ n;
}

/* Every rank must run the same training: the same model, data, seed (which orders the
 * batches), global batch size and optimizer. Compared at start; a rank started otherwise is
 * named, on every rank, before any step. */
static int same_run_everywhere(const trainer *t)
{
    char arch[256];
    cli_model_describe(&t->o.arch, arch, sizeof arch);
    /* the images and labels themselves: another --data directory, or other files in it */
    uint64_t data = 0xcbf29ce484222325ull;
    ts_tensor *sets[] = {t->train_x, t->train_y, t->test_x, t->test_y};
    for (size_t i = 0; i < 4; i++)
        data = hash_tensor(sets[i], data);
    const uint64_t mine[] = {fnv64(arch), t->o.seed, (uint64_t)t->o.batch,
                             cli_opts_fingerprint(opts, NOPTS, &t->o, OPT),
                             cli_opts_fingerprint(opts, NOPTS, &t->o, DATA), data};
    static const char *const what[] = {
        "another model (--model, --hidden, --channels, --init)", "another --seed",
        "another --batch-size", "other optimizer settings",
        "other data (--train-limit or --resume)",
        "other images or labels (--data: the files differ)"};
    return cli_ranks_agree(mine, sizeof mine / sizeof mine[0], what, t->rank, t->world);
}

/* Rows [*lo, *lo + *n) of a batch of b rows are this rank's: contiguous shards, the first
 * b % world ranks one row longer. */
static void shard(const trainer *t, int64_t b, int64_t *lo, int64_t *n)
{
    int64_t q = b / t->world, r = b % t->world;
    *lo = t->rank * q + (t->rank < r ? t->rank : r);
    *n = q + (t->rank < r);
}

static ts_status save(trainer *t, const char *path)
{
    ts_checkpoint *ck;
    ts_status s = ts_checkpoint_new(&ck);
    if (s)
        return s;
    for (size_t i = 0; i < t->nparams && s == TS_OK; i++)
        s = ts_checkpoint_add(ck, t->params[i].name, t->params[i].tensor);
    for (size_t i = 0; i < t->nbuffers && s == TS_OK; i++)
        s = ts_checkpoint_add(ck, t->buffers[i].name, t->buffers[i].tensor);
    if (s == TS_OK)
        s = ts_optim_save_state(t->opt, ck);
    if (s == TS_OK) {
        uint64_t epoch;
        int64_t batch;
        ts_loader_position(t->loader, &epoch, &batch);
        ts_model_config mc;
        cli_model_config(&t->o.arch, &mc);
        if ((s = ts_model_save_config(&mc, ck)) != TS_OK) {
            ts_checkpoint_free(ck);
            return s;
        }
        ts_checkpoint_set_meta(ck, "train.format", "tessera-train-1");
        cli_meta_set_u64(ck, "train.seed", t->o.seed);
        cli_meta_set_u64(ck, "train.batch_size", (uint64_t)t->o.batch);
        cli_meta_set_u64(ck, "train.train_limit", (uint64_t)t->o.train_limit);
        cli_meta_set_u64(ck, "train.epochs", (uint64_t)t->o.epochs);
        cli_meta_set_u64(ck, "train.accumulate", (uint64_t)t->o.accumulate);
        ts_checkpoint_set_meta(ck, "train.precision", t->o.precision);
        cli_save_loss_scale(ck, t->tr, t->o.precision);
        cli_meta_set_u64(ck, "train.step", (uint64_t)t->step);
        cli_meta_set_u64(ck, "train.epoch", epoch);
        cli_meta_set_u64(ck, "train.batch", (uint64_t)batch);
        cli_meta_set_u64(ck, "train.rng_seed", t->rng.seed);
        cli_meta_set_u64(ck, "train.rng_offset", t->rng.offset);
        char clip[32];
        snprintf(clip, sizeof clip, "%.17g", t->o.clip);
        ts_checkpoint_set_meta(ck, "train.clip_grad_norm", clip);
        ts_checkpoint_set_meta(ck, "train.decay", t->o.decay);
        s = ts_checkpoint_save(ck, path);
        if (s == TS_OK)
            t->saved_step = t->step;
    }
    ts_checkpoint_free(ck);
    return s;
}

/* A save of every rank: a sharded optimizer's state gathered on rank 0 (every rank takes
 * part), then rank 0 writes the checkpoint. */
static ts_status save_all(trainer *t, const char *path)
{
    ts_status s = ts_optim_consolidate_state(t->opt, 0);
    return s == TS_OK && t->rank == 0 ? save(t, path) : s;
}

/* v in the fewest significant digits that read back as v (0.1, not 0.10000000000000001). */
static const char *shortest(double v, char *buf, size_t len)
{
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, len, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    return buf;
}

/* An optimizer hyper-parameter given on the command line must equal the checkpoint's: the
 * optimizer state comes from the checkpoint, so a different value would be silently ignored.
 * Not given: the checkpoint's value is used (and printed in the banner). */
static int hyper(trainer *t, const ts_checkpoint *ck, const char *key, const char *flag,
                 int given, double *val)
{
    const char *txt = ts_checkpoint_meta(ck, key);
    if (!txt)
        return 0; /* not this optimizer's (momentum of adam); ts_optim_load_state checks */
    char *end;
    double saved = strtod(txt, &end);
    if (*end || !isfinite(saved))
        return 0; /* ts_optim_load_state refuses it with the reason */
    if (given && saved != *val) {
        char a[32], b[32];
        fprintf(stderr, "tessera: error: %s was trained with %s %s, not %s; the optimizer "
                        "state comes from the checkpoint: resume without %s (or with %s %s), "
                        "or start a new run\n",
                t->o.resume, flag, shortest(saved, a, sizeof a), shortest(*val, b, sizeof b),
                flag, flag, a);
        return 2;
    }
    *val = saved;
    return 0;
}

/* The schedule the options ask for: 0 for none (constant, no warm-up). Cosine ends at
 * --lr-decay-steps, else at the run's last step (--epochs whole epochs, or --max-steps if
 * that comes first). */
static int schedule_from_opts(const trainer *t, ts_lr_schedule *out)
{
    const train_opts *o = &t->o;
    int kind = !strcmp(o->lr_schedule, "step")     ? TS_LR_STEP
               : !strcmp(o->lr_schedule, "cosine") ? TS_LR_COSINE
                                                   : TS_LR_CONSTANT;
    if (kind == TS_LR_CONSTANT && o->warmup_steps == 0)
        return 0;
    int64_t nb = ts_loader_batches(t->loader);
    int64_t total = o->epochs * nb; /* the run's last step: --epochs or --max-steps, first */
    if (o->max_steps > 0 && o->max_steps < total)
        total = o->max_steps;
    if (o->lr_decay_steps > 0) /* a run stopped early to be resumed keeps its horizon */
        total = o->lr_decay_steps;
    *out = (ts_lr_schedule){.kind = kind,
                            .base_lr = o->lr,
                            .warmup_steps = o->warmup_steps,
                            .step_size = o->lr_step_size > 0 ? o->lr_step_size : (nb ? nb : 1),
                            .gamma = o->lr_gamma,
                            .total_steps = total,
                            .min_lr = o->min_lr >= 0 ? o->min_lr : o->lr / 10};
    return 1;
}

/* "cosine, warm-up 100, lr 0.001 down to 0.0001 at step 5000" and the like. */
static const char *schedule_text(const ts_optim *opt, char *buf, size_t len)
{
    ts_lr_schedule sc;
    if (!ts_optim_get_schedule(opt, &sc)) {
        snprintf(buf, len, "constant");
        return buf;
    }
    int n = snprintf(buf, len, "%s", sc.kind == TS_LR_STEP     ? "step"
                                     : sc.kind == TS_LR_COSINE ? "cosine"
                                                               : "constant");
    if (sc.warmup_steps && n >= 0 && (size_t)n < len)
        n += snprintf(buf + n, len - (size_t)n, ", warm-up %lld", (long long)sc.warmup_steps);
    if (n >= 0 && (size_t)n < len && sc.kind == TS_LR_STEP)
        snprintf(buf + n, len - (size_t)n, ", x%g every %lld steps", sc.gamma,
                 (long long)sc.step_size);
    else if (n >= 0 && (size_t)n < len && sc.kind == TS_LR_COSINE)
        snprintf(buf + n, len - (size_t)n, " down to %g at step %lld", sc.min_lr,
                 (long long)sc.total_steps);
    return buf;
}

/* Applies --decay and the schedule to a fresh optimizer. 0, or the exit status. */
static int setup_optimizer(trainer *t)
{
    if (!strcmp(t->o.decay, "matrices"))
        ts_optim_decay_matrices_only(t->opt);
    ts_lr_schedule sc;
    ts_status s;
    if (schedule_from_opts(t, &sc) && (s = ts_optim_set_schedule(t->opt, &sc)))
        return cli_fail(s, "--lr-schedule");
    return 0;
}

/* On --resume: the schedule, --decay and --clip-grad-norm are the checkpoint's; flags that
 * ask for something else are refused, as --lr is. 0, or the exit status. */
static int resume_schedule(trainer *t, const ts_checkpoint *ck)
{
    const char *path = t->o.resume;
    const char *clip = ts_checkpoint_meta(ck, "train.clip_grad_norm");
    const char *decay = ts_checkpoint_meta(ck, "train.decay");
    double saved_clip = 0;
    if (clip && cli_strict_double(clip, 0, 0, 1e12, &saved_clip) != 0) {
        fprintf(stderr, "tessera: error: %s: train.clip_grad_norm = '%s' is not a number in "
                        "[0, 1e12]; the checkpoint is damaged\n", path, clip);
        return 1;
    }
    if (decay && strcmp(decay, "all") && strcmp(decay, "matrices")) {
        fprintf(stderr, "tessera: error: %s: train.decay = '%s' is neither all nor matrices; the "
                        "checkpoint is damaged\n", path, decay);
        return 1;
    }
    if (given(&t->o, "--clip-grad-norm") && t->o.clip != saved_clip) {
        fprintf(stderr, "tessera: error: %s was trained with --clip-grad-norm %g, not %g; resume "
                        "without --clip-grad-norm (or with the same), or start a new run\n",
                path, saved_clip, t->o.clip);
        return 2;
    }
    if (given(&t->o, "--decay") && strcmp(t->o.decay, decay ? decay : "all")) {
        fprintf(stderr, "tessera: error: %s was trained with --decay %s, not %s; resume without "
                        "--decay (or with the same), or start a new run\n",
                path, decay ? decay : "all", t->o.decay);
        return 2;
    }
    t->o.clip = saved_clip;
    t->o.decay = decay && !strcmp(decay, "matrices") ? "matrices" : "all";
    if (schedule_given(&t->o)) {
        ts_lr_schedule want, have;
        int w = schedule_from_opts(t, &want), h = ts_optim_get_schedule(t->opt, &have);
        if (w != h || (w && (want.kind != have.kind || want.base_lr != have.base_lr ||
                             want.warmup_steps != have.warmup_steps ||
                             want.step_size != have.step_size || want.gamma != have.gamma ||
                             want.total_steps != have.total_steps ||
                             want.min_lr != have.min_lr))) {
            char a[160];
            fprintf(stderr, "tessera: error: %s was trained with the learning-rate schedule "
                            "'%s', which these flags change; the schedule comes from the "
                            "checkpoint: resume without the schedule flags, or start a new "
                            "run\n", path, schedule_text(t->opt, a, sizeof a));
            return 2;
        }
    }
    return 0;
}

static int resume(trainer *t)
{
    ts_checkpoint *ck;
    ts_status s = ts_checkpoint_load(t->o.resume, t->dev, &ck);
    if (s)
        return cli_fail(s, "--resume");
    uint64_t seed, batch_size, limit, step, epoch, batch, rseed, roff;
    int rc = 1;
    ts_model_config saved;
    char want[256], have[256];
    cli_model_describe(&t->o.arch, want, sizeof want);
    if ((s = ts_model_load_config(ck, &saved)) != TS_OK) {
        fprintf(stderr, "tessera: error: %s: %s\n", t->o.resume, ts_last_error());
        goto out;
    }
    if (strcmp(saved.name, t->o.model) != 0) {
        fprintf(stderr, "tessera: error: %s holds a '%s' model, not '%s' (use --model %s)\n",
                t->o.resume, saved.name, t->o.model, saved.name);
        goto out;
    }
    if (strcmp(ts_model_describe(&saved, have, sizeof have), want) != 0) {
        fprintf(stderr, "tessera: error: %s holds a '%s' model, not '%s' (use --model %s)\n",
                t->o.resume, have, want, have);
        goto out;
    }
    const char *path = t->o.resume;
    const char *format = ts_checkpoint_meta(ck, "train.format");
    if (format && strcmp(format, "tessera-train-1") != 0) { /* absent: an older tessera's */
        fprintf(stderr, "tessera: error: %s: metadata 'train.format' = '%s': this tessera reads "
                        "'tessera-train-1' only (a newer tessera wrote it, or it is damaged)\n",
                path, format);
        goto out;
    }
    if (cli_meta_u64(ck, path, "train.seed", UINT64_MAX, &seed) ||
        cli_meta_u64(ck, path, "train.batch_size", MAX_BATCH, &batch_size) ||
        cli_meta_u64(ck, path, "train.train_limit", MAX_LIMIT, &limit) ||
        cli_meta_u64(ck, path, "train.step", MAX_STEPS, &step) ||
        cli_meta_u64(ck, path, "train.epoch", MAX_EPOCHS, &epoch) ||
        cli_meta_u64(ck, path, "train.batch", MAX_LIMIT, &batch) ||
        cli_meta_u64(ck, path, "train.rng_seed", UINT64_MAX, &rseed) ||
        cli_meta_u64(ck, path, "train.rng_offset", UINT64_MAX, &roff) ||
        cli_read_loss_scale(ck, path, &t->scale))
        goto out;
    if (seed != t->o.seed || (int64_t)batch_size != t->o.batch ||
        (int64_t)limit != t->o.train_limit) {
        fprintf(stderr, "tessera: error: %s was trained with --seed %llu --batch-size %llu "
                        "--train-limit %llu; resume with the same values\n",
                t->o.resume, (unsigned long long)seed, (unsigned long long)batch_size,
                (unsigned long long)limit);
        goto out;
    }
    /* Every step is one batch, so the position and the step count must agree. */
    uint64_t nb = (uint64_t)ts_loader_batches(t->loader);
    if (batch > nb || step != epoch * nb + batch) {
        fprintf(stderr, "tessera: error: %s: inconsistent position: step %llu at epoch %llu, "
                        "batch %llu, with %llu batches per epoch; the checkpoint is damaged\n",
                path, (unsigned long long)step, (unsigned long long)epoch,
                (unsigned long long)batch, (unsigned long long)nb);
        goto out;
    }
    if (batch == nb) { /* written at the end of an epoch: the next one starts at its beginning */
        epoch++;
        batch = 0;
    }
    /* The optimizer and its hyper-parameters are the checkpoint's. */
    const char *kind = ts_checkpoint_meta(ck, "optim.kind");
    if (kind && strcmp(kind, t->o.optimizer) != 0) {
        if (given(&t->o, "--optimizer")) {
            fprintf(stderr, "tessera: error: %s was trained with --optimizer %s, not %s; resume "
                            "without --optimizer (or with --optimizer %s)\n",
                    path, kind, t->o.optimizer, kind);
            rc = 2;
            goto out;
        }
        if (strcmp(kind, "sgd") && strcmp(kind, "adam") && strcmp(kind, "adamw")) {
            fprintf(stderr, "tessera: error: %s: unknown optimizer '%s' in the checkpoint\n",
                    path, kind);
            goto out;
        }
        t->o.optimizer = !strcmp(kind, "sgd") ? "sgd" : !strcmp(kind, "adam") ? "adam" : "adamw";
    }
    if (given(&t->o, "--momentum") && t->o.momentum != 0 && strcmp(t->o.optimizer, "sgd") != 0) {
        fprintf(stderr, "tessera: error: %s was trained with --optimizer %s, which takes no "
                        "--momentum; resume without --momentum\n",
                path, t->o.optimizer);
        rc = 2;
        goto out;
    }
    if ((rc = hyper(t, ck, "optim.lr", "--lr", given(&t->o, "--lr"), &t->o.lr)) ||
        (rc = hyper(t, ck, "optim.momentum", "--momentum", given(&t->o, "--momentum"), &t->o.momentum)) ||
        (rc = hyper(t, ck, "optim.weight_decay", "--weight-decay", given(&t->o, "--weight-decay"),
                    &t->o.weight_decay)))
        goto out;
    rc = 1;
    ts_optim_free(t->opt);
    t->opt = NULL;
    if ((s = cli_make_optim(t->o.optimizer, t->o.lr, t->o.momentum, t->o.weight_decay,
                            t->params, t->nparams, &t->opt))) {
        rc = cli_fail(s, "--resume");
        goto out;
    }
    if (cli_restore_model(ck, path, t->params, t->nparams, t->buffers, t->nbuffers))
        goto out;
    /* eval needs the model only (an exported model has no optimizer state) */
    if ((!t->o.eval_only && (s = ts_optim_load_state(t->opt, ck))) ||
        (s = ts_loader_seek(t->loader, epoch, (int64_t)batch))) {
        rc = cli_fail(s, "--resume");
        goto out;
    }
    if ((rc = resume_schedule(t, ck)))
        goto out;
    rc = 1;
    t->step = (int64_t)step;
    t->epoch = epoch;
    t->rng.seed = rseed;
    t->rng.offset = roff;
    rc = 0;
out:
    ts_checkpoint_free(ck);
    return rc;
}

/* After a resume: what is left to train. 0: train; else the exit status, having said why
 * nothing will be trained (the checkpoint is left as it is). */
static int resume_left(const trainer *t)
{
    const char *p = t->o.resume;
    if (t->o.max_steps > 0 && t->step > t->o.max_steps) {
        fprintf(stderr, "tessera: error: %s is at step %lld, past --max-steps %lld: nothing to "
                        "train; the checkpoint is left as it was (pass a larger --max-steps to "
                        "continue)\n",
                p, (long long)t->step, (long long)t->o.max_steps);
        return 1;
    }
    if (t->epoch > (uint64_t)t->o.epochs) {
        fprintf(stderr, "tessera: error: %s has finished %llu epochs, more than --epochs %lld: "
                        "nothing to train; the checkpoint is left as it was (pass --epochs "
                        "above %llu to continue)\n",
                p, (unsigned long long)t->epoch, (long long)t->o.epochs,
                (unsigned long long)t->epoch);
        return 1;
    }
    if (t->o.max_steps > 0 && t->step == t->o.max_steps) {
        fprintf(stderr, "tessera: %s is at step %lld and --max-steps %lld is reached: the run is "
                        "complete, nothing to train; the checkpoint is left as it was (pass a "
                        "larger --max-steps to continue)\n",
                p, (long long)t->step, (long long)t->o.max_steps);
        return -1;
    }
    if (t->epoch == (uint64_t)t->o.epochs) {
        fprintf(stderr, "tessera: %s has finished its %lld epochs (step %lld): the run is "
                        "complete, nothing to train; the checkpoint is left as it was (pass a "
                        "larger --epochs to continue)\n",
                p, (long long)t->o.epochs, (long long)t->step);
        return -1;
    }
    return 0;
}

/* ---- training and evaluation --------------------------------------------------------------- */

/* Correct predictions of logits (B, 10) against labels (B), added to *correct. */
ts_status cli_count_correct(ts_tensor *logits, ts_tensor *labels, int64_t *correct)
{
    ts_tensor *pred = NULL, *eq = NULL, *n = NULL, *n64 = NULL;
    int64_t c = 0;
    ts_status s = ts_argmax(logits, 1, 0, &pred);
    if (s == TS_OK)
        s = ts_eq(pred, labels, &eq);
    if (s == TS_OK)
        s = ts_cast(eq, TS_I64, &n64);
    if (s == TS_OK)
        s = ts_sum(n64, 0, NULL, 0, &n);
    if (s == TS_OK)
        s = ts_tensor_to_host(n, &c, sizeof c);
    if (s == TS_OK)
        *correct += c;
    ts_tensor_unref(pred);
    ts_tensor_unref(eq);
    ts_tensor_unref(n);
    ts_tensor_unref(n64);
    return s;
}

/* The trainer's on_output: a running count of correct predictions. */
static ts_status count_correct(void *user, ts_tensor *logits, ts_tensor *labels)
{
    return cli_count_correct(logits, labels, &((trainer *)user)->correct);
}

static ts_status evaluate(trainer *t, double *acc)
{
    int64_t n = ts_tensor_size(t->test_x, 0), correct = 0, lo, mine;
    shard(t, n, &lo, &mine); /* every rank evaluates its part; the counts are summed */
    ts_status s = TS_OK;
    ts_module_train(t->model, 0);
    ts_no_grad_enter();
    if ((s = ts_autocast_begin(cli_precision_dtype(t->o.precision)))) { /* the run's */
        ts_no_grad_exit();
        return s;
    }
    for (int64_t b = lo; b < lo + mine && s == TS_OK; b += 1000) {
        int64_t len = lo + mine - b < 1000 ? lo + mine - b : 1000;
        ts_tensor *x = NULL, *y = NULL, *logits = NULL;
        if ((s = ts_tensor_narrow(t->test_x, 0, b, len, &x)) == TS_OK &&
            (s = ts_tensor_narrow(t->test_y, 0, b, len, &y)) == TS_OK &&
            (s = ts_module_forward(t->model, x, &logits)) == TS_OK)
            s = cli_count_correct(logits, y, &correct);
        ts_tensor_unref(x);
        ts_tensor_unref(y);
        ts_tensor_unref(logits);
    }
    ts_autocast_end();
    ts_no_grad_exit();
    ts_module_train(t->model, 1);
    if (s == TS_OK)
        s = ts_dist_allreduce_sum(&correct, 1, TS_I64);
    *acc = n ? (double)correct / (double)n : 0;
    return s;
}

/* Progress on stderr: a bar redrawn in place on a terminal, else a plain line (--log-every).
 * rate: images a second over this epoch so far. Elapsed and ETA over the whole run. */
static void progress(trainer *t, const ts_fit_state *st, double rate)
{
    char head[64];
    snprintf(head, sizeof head, "epoch %llu/%lld batch %lld/%lld:",
             (unsigned long long)st->epoch + 1, (long long)t->o.epochs, (long long)st->batch,
             (long long)st->batches);
    cli_progress_step(&t->progress, st->step, head, (double)st->batch / (double)st->batches,
                      st->mean_loss, rate, "images/s", t->started, st->step - st->first_step,
                      st->last_step - st->step, t->dev);
}

/* The evaluation at an epoch's end (or the run's): the test accuracy and the epoch's record. */
static ts_status epoch_record(trainer *t, const ts_fit_state *st)
{
    if (t->tty) {
        cli_progress_clear(&t->progress);
        char msg[128];
        snprintf(msg, sizeof msg, "  epoch %llu/%lld: testing on %lld images ...",
                 (unsigned long long)st->epoch + 1, (long long)t->o.epochs,
                 (long long)ts_tensor_size(t->test_x, 0));
        fprintf(stderr, "%.*s", cli_term_cols() - 1, msg); /* one line, as the bar was */
        fflush(stderr);
        t->progress.shown = 1; /* cleared with the bar */
    }
    double secs = cli_now() - t->epoch_t0, test_acc = 0;
    int64_t correct = t->correct, seen = st->rows_since;
    t->correct = 0;
    ts_status s = ts_dist_allreduce_sum(&correct, 1, TS_I64);
    ts_memtrace_marker("eval", 1);
    if (s == TS_OK) {
        cli_profile_eval(t->o.profile, 1); /* --profile: evaluation apart from the steps */
        s = evaluate(t, &test_acc);
        cli_profile_eval(t->o.profile, 0);
    }
    ts_memtrace_marker("eval", -1);
    cli_progress_clear(&t->progress);
    if (s)
        return s;
    t->last_acc = test_acc;
    if (!t->best_epoch || test_acc > t->best_acc) {
        t->best_acc = test_acc;
        t->best_epoch = st->epoch + 1;
    }
    ts_memory_stats ms;
    ts_device_memory_stats(t->dev, &ms);
    double train_acc = seen ? (double)correct / (double)seen : 0;
    if (t->o.json) {
        printf("{\"epoch\": %llu, \"steps\": %lld, \"lr\": %.9g, \"train_loss\": %.6f, "
               "\"train_acc\": %.4f, \"test_acc\": %.4f, \"seconds\": %.2f, \"pool_in_use\": %llu, "
               "\"pool_reserved\": %llu, \"pool_peak_reserved\": %llu, \"pool_peak_in_use\": "
               "%llu, \"world_size\": %d, \"train_batches\": %lld}\n",
               (unsigned long long)st->epoch + 1, (long long)st->step, ts_optim_lr(t->opt),
               st->mean_loss, train_acc, test_acc, secs, (unsigned long long)ms.in_use,
               (unsigned long long)ms.reserved, (unsigned long long)ms.peak_reserved,
               (unsigned long long)ms.peak_in_use, t->world,
               (long long)(st->batch - t->first_batch));
    } else {
        char b1[32], b2[32], b3[32], part[64] = "";
        if (t->first_batch > 0) /* a resumed epoch: its loss covers the batches run here */
            snprintf(part, sizeof part, " (batches %lld-%lld)", (long long)t->first_batch + 1,
                     (long long)st->batch);
        cli_printf_fit("epoch %llu: train loss %.4f acc %.4f%s, test acc %.4f, %.1f s, pool in "
                       "use %s / reserved %s / peak %s\n",
                       (unsigned long long)st->epoch + 1, st->mean_loss, train_acc, part,
                       test_acc, secs, cli_bytes(ms.in_use, b1, sizeof b1),
                       cli_bytes(ms.reserved, b2, sizeof b2),
                       cli_bytes(ms.peak_reserved, b3, sizeof b3));
    }
    fflush(stdout);
    return TS_OK;
}

/* What the run does around each step (ts_fit's callback): markers, the step's line and
 * progress, --save-every, the epoch's evaluation and its checkpoint. */
static ts_status on_event(void *user, ts_fit_event ev, const ts_fit_state *st)
{
    trainer *t = user;
    switch (ev) {
    case TS_FIT_EPOCH_BEGIN: {
        char mk[32];
        snprintf(mk, sizeof mk, "epoch %llu", (unsigned long long)st->epoch + 1);
        ts_memtrace_marker(mk, 0);
        t->epoch = st->epoch;
        t->epoch_t0 = cli_now();
        t->first_batch = st->batch; /* > 0 in an epoch resumed part-way */
        return TS_OK;
    }
    case TS_FIT_STEP_BEGIN:
        cli_fit_step(ev, st, t->o.profile, 0, 0, 0);
        return TS_OK;
    case TS_FIT_STEP:
        cli_fit_step(ev, st, t->o.profile, t->o.log_steps, t->o.json, ts_optim_lr(t->opt));
        t->step = st->step;
        if (t->show_progress && (!t->tty || st->batch % 10 == 0 || st->batch == st->batches))
            progress(t, st, (double)st->rows_since / (cli_now() - t->epoch_t0));
        if (t->o.save_every > 0 && t->step % t->o.save_every == 0) {
            ts_status s = save_all(t, t->o.save);
            t->save_failed = s != TS_OK;
            return s;
        }
        return TS_OK;
    case TS_FIT_EVAL:
        return epoch_record(t, st);
    case TS_FIT_EPOCH_END: /* the position saved is the next epoch's start */
        if (t->o.save) {
            ts_status s = save_all(t, t->o.save);
            t->save_failed = s != TS_OK;
            return s;
        }
        return TS_OK;
    }
    return TS_OK;
}

/* After a failed ts_fit: why, and what was kept. */
static void say_failed(trainer *t, ts_status s, const ts_fit_state *st)
{
    cli_fit_failed(t->o.profile);
    cli_progress_clear(&t->progress);
    if (!st->diverged) {
        cli_fail(s, t->save_failed ? "--save" : "training failed");
        return;
    }
    fprintf(stderr, "tessera: error: the loss became %s at step %lld (epoch %llu, batch %lld): "
                    "training diverged and is stopped (try a smaller --lr); ",
            isnan(st->loss) ? "NaN" : "infinite", (long long)st->step,
            (unsigned long long)st->epoch + 1, (long long)st->batch);
    if (t->saved_step >= 0)
        fprintf(stderr, "%s is left as saved at step %lld\n", t->o.save,
                (long long)t->saved_step);
    else if (t->o.save)
        fprintf(stderr, "nothing was saved: %s was not written\n", t->o.save);
    else
        fprintf(stderr, "nothing was saved\n");
}

/* ---- the command ------------------------------------------------------------------------- */

/* The model's options, for the table's parser. */
static int model_option(void *o, const char *a, const char *v)
{
    int took = cli_model_option(&((train_opts *)o)->arch, "train", a, v);
    return took < 0 ? -1 : took;
}

static int parse(int argc, char **argv, train_opts *o, const cli_common *common)
{
    *o = (train_opts){.model = "lenet5", .optimizer = "adam", .epochs = 1, .batch = 64,
                      .accumulate = 1, .seed = 1, .json = common->json, .lr_schedule = "constant",
                      .precision = "fp32",
                      .decay = "all", .min_lr = -1, .lr_gamma = 0.5};
    cli_model_init(&o->arch);
    static const char *const model_flags[] = {"--model", "--hidden", "--channels", "--init",
                                              NULL};
    int rc = cli_opts_parse("train", NULL, opts, NOPTS, argc, argv, o, o->given, &usage,
                            model_option, model_flags);
    if (rc)
        return rc;
    if (cli_model_check(&o->arch, "train"))
        return 2;
    if (o->save_every && !o->save)
        return cli_usage_error("train", "--save-every needs --save CKPT (where to write)");
    o->model = o->arch.name;
    if (strcmp(o->optimizer, "sgd") && strcmp(o->optimizer, "adam") &&
        strcmp(o->optimizer, "adamw"))
        return cli_usage_error("train", "unknown optimizer '%s' (sgd, adam or adamw)",
                               o->optimizer);
    /* On --resume without --optimizer the optimizer is the checkpoint's: resume() checks. */
    if (given(o, "--momentum") && o->momentum != 0 && strcmp(o->optimizer, "sgd") != 0 &&
        !(o->resume && !given(o, "--optimizer")))
        return cli_usage_error("train", "--momentum applies to --optimizer sgd, not %s",
                               o->optimizer);
    if (!given(o, "--lr"))
        o->lr = strcmp(o->optimizer, "sgd") == 0 ? 0.05 : 1e-3;
    return 0;
}

static void trainer_free(trainer *t)
{
    ts_loader_free(t->loader);
    ts_optim_free(t->opt);
    ts_module_free(t->model);
    free(t->params);
    free(t->buffers);
    ts_tensor_unref(t->train_x);
    ts_tensor_unref(t->train_y);
    ts_tensor_unref(t->test_x);
    ts_tensor_unref(t->test_y);
}

/* The options that describe a model's architecture (train.arch in a checkpoint). */
static int arch_option(const char *a)
{
    static const char *const arch[] = {"--model", "--hidden", "--channels", "--init",
                                       "--context", "--layers", "--heads", "--embd",
                                       "--dropout"};
    for (size_t i = 0; i < sizeof arch / sizeof arch[0]; i++)
        if (!strcmp(a, arch[i]))
            return 1;
    return 0;
}

/* --resume CKPT without any architecture option: the checkpoint's model configuration
 * (ts_model_load_config), as options ("mlp --hidden 500", "gpt --context 128 ..."), goes in
 * front of the command line, so the model needs no repeating. The file may be hostile: its
 * values are checked on load, and only a model name followed by architecture options and
 * their values is taken, nothing that could name a path or a device. *nargv (transfer full,
 * with *buf) or NULL to keep argv. Returns 0, or 1 after an error message when the
 * checkpoint's configuration is damaged or edited (training some other model instead would
 * only confuse). */
static int arch_from_checkpoint(int argc, char **argv, int *nargc, char ***nargv, char **buf)
{
    const char *ckpt = NULL;
    *nargv = NULL;
    *buf = NULL;
    for (int i = 1; i < argc; i++) {
        if (arch_option(argv[i]))
            return 0;
        if (!strcmp(argv[i], "--resume") && i + 1 < argc)
            ckpt = argv[++i];
    }
    ts_checkpoint *ck = NULL;
    if (!ckpt)
        return 0;
    /* A missing or damaged checkpoint is said as such here: going on without its model
     * would end in some option the default model does not take (--text). */
    ts_status s = ts_checkpoint_load(ckpt, NULL, &ck);
    if (s)
        return cli_fail(s, "--resume");
    /* The model's configuration, every value checked (model.* keys, or an older checkpoint's
     * train.arch); as the options of tessera train, the text tessera itself writes. */
    ts_model_config mc;
    if ((s = ts_model_load_config(ck, &mc)) != TS_OK) {
        fprintf(stderr, "tessera: error: %s: %s\n", ckpt, ts_last_error());
        ts_checkpoint_free(ck);
        return 1;
    }
    if (cli_model_matches_tensors(ck, ckpt, &mc)) {
        ts_checkpoint_free(ck);
        return 1;
    }
    char text[512];
    const char *arch = ts_model_describe(&mc, text, sizeof text);
    char shown[400]; /* printable and short */
    cli_printable(arch, 80, shown, sizeof shown);
    char *copy = strlen(arch) < 512 ? strdup(arch) : NULL;
    ts_checkpoint_free(ck);
    char *tok[40];
    int n = 0, ok = copy != NULL;
    for (char *save = NULL, *t = copy ? strtok_r(copy, " ", &save) : NULL; t && ok;
         t = strtok_r(NULL, " ", &save)) {
        ok = n < 39 && strspn(t, "abcdefghijklmnopqrstuvwxyz0123456789-_.:,") == strlen(t) &&
             (n == 0 ? t[0] != '-' : n % 2 == 1 ? arch_option(t) : t[0] != '-' || isdigit((unsigned char)t[1]));
        tok[n++] = t;
    }
    ok = ok && n >= 1 && n % 2 == 1;
    char **nv = ok ? calloc((size_t)(argc + n + 2), sizeof *nv) : NULL;
    if (!nv) {
        free(copy);
        if (ok)
            return cli_fail(TS_ENOMEM, "--resume");
        fprintf(stderr, "tessera: error: %s: its model '%s' is not one tessera train can "
                "build from options: give --model and its options on the command line\n", ckpt,
                shown);
        return 1;
    }
    int k = 0;
    nv[k++] = argv[0];
    nv[k++] = "--model";
    for (int i = 0; i < n; i++)
        nv[k++] = tok[i];
    for (int i = 1; i < argc; i++)
        nv[k++] = argv[i];
    fprintf(stderr, "tessera: the model from %s:", ckpt);
    for (int i = 0; i < n; i++)
        fprintf(stderr, " %s", tok[i]);
    fputc('\n', stderr);
    *nargc = k;
    *nargv = nv;
    *buf = copy;
    return 0;
}

/* A resumed run is the run its checkpoint was written by: --seed, --batch-size and
 * --train-limit not given are the checkpoint's (given, they must agree: resume() refuses
 * another value, naming both), --epochs not given is the run's length as it was planned
 * (given, it is an override: a longer or shorter run on the same schedule), and --save not
 * given is the checkpoint resumed from. Each value is checked as strictly as its option. 0,
 * or the exit status after a message. */
static int adopt_run(train_opts *o)
{
    if (!o->resume)
        return 0;
    ts_checkpoint *ck;
    ts_status s = ts_checkpoint_load(o->resume, NULL, &ck);
    if (s)
        return cli_fail(s, "--resume");
    /* Given otherwise, --seed, --batch-size and --train-limit are refused by resume() (with
     * the checkpoint's position checked too); --epochs and --accumulate are overrides. */
    int rc = cli_opts_adopt(opts, NOPTS, o->given, ck, o->resume, o);
    ts_checkpoint_free(ck);
    if (!rc && !o->save && !o->eval_only)
        o->save = o->resume;
    return rc;
}

int cmd_train(int argc, char **argv, const cli_common *common)
{
    char **nargv, *nbuf;
    int nargc = argc;
    if (arch_from_checkpoint(argc, argv, &nargc, &nargv, &nbuf))
        return 1;
    if (nargv) {
        int rc = cmd_train(nargc, nargv, common); /* now with architecture options: once */
        free(nargv);
        free(nbuf);
        return rc;
    }
    for (int i = 1; i + 1 < argc; i++) /* the sequence model has a loop of its own */
        if (!strcmp(argv[i], "--model") && !strcmp(argv[i + 1], "gpt"))
            return cli_train_gpt(argc, argv, common);
    trainer t = {.saved_step = -1};
    const char *config = common->config;
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--config"))
            config = argv[i + 1];
    int rc = parse(argc, argv, &t.o, common);
    if (rc)
        return rc < 0 ? 0 : rc;
    if ((rc = adopt_run(&t.o)))
        return rc;
    if (t.o.accumulate > t.o.batch) {
        fprintf(stderr, "tessera: error: train: --accumulate %lld is more than the batch size "
                        "%lld: each micro-batch needs one row at least\n",
                (long long)t.o.accumulate, (long long)t.o.batch);
        return 2;
    }
    /* the progress bar: on stderr when it is a terminal (rank 0 alone), not mixed into
     * --log-steps lines or into JSON on the same terminal */
    t.tty = isatty(STDERR_FILENO) && !t.o.log_steps && !(t.o.json && isatty(STDOUT_FILENO));
    cli_session ss;
    if ((rc = cli_session_begin(&ss, config, t.o.device, t.o.save, t.o.memtrace, t.o.memplot,
                                (const char *const[3]){t.o.save, t.o.resume, NULL})))
        return rc;
    rc = 1;
    ts_status s;
    t.rank = ss.rank;
    t.world = ss.world;
    t.dev = ss.dev;
    if (t.rank != 0)
        t.tty = 0;
    /* plain lines where stderr is no terminal (every --log-every steps or 30 s); on a terminal
     * that shows JSON or --log-steps lines, only with --log-every */
    t.show_progress = t.rank == 0 && (t.tty || !isatty(STDERR_FILENO) || t.o.log_every > 0);
    cli_progress_init(&t.progress, t.tty, t.o.log_every);
    double t0 = cli_now();
    if ((s = ts_fashion_mnist_load(t.o.data, 1, t.dev, &t.train_x, &t.train_y)) ||
        (s = ts_fashion_mnist_load(t.o.data, 0, t.dev, &t.test_x, &t.test_y))) {
        cli_fail(s, "cannot load the data");
        goto out;
    }
    if (t.o.train_limit > 0 && t.o.train_limit < ts_tensor_size(t.train_x, 0)) {
        ts_tensor *x, *y;
        if ((s = ts_tensor_narrow(t.train_x, 0, 0, t.o.train_limit, &x)) ||
            (s = ts_tensor_narrow(t.train_y, 0, 0, t.o.train_limit, &y))) {
            cli_fail(s, "--train-limit");
            goto out;
        }
        ts_tensor_unref(t.train_x);
        ts_tensor_unref(t.train_y);
        t.train_x = x;
        t.train_y = y;
    }
    ts_rng_init(&t.rng, t.o.seed);
    if ((s = cli_build_model_spec(&t.o.arch, t.dev, &t.rng, &t.model))) {
        cli_fail(s, "cannot build the model");
        goto out;
    }
    t.nparams = ts_module_parameters(t.model, NULL, 0);
    t.nbuffers = ts_module_buffers(t.model, NULL, 0);
    t.params = calloc(t.nparams + 1, sizeof *t.params);
    t.buffers = calloc(t.nbuffers + 1, sizeof *t.buffers);
    if (!t.params || !t.buffers) {
        fprintf(stderr, "tessera: error: out of memory\n");
        goto out;
    }
    ts_module_parameters(t.model, t.params, t.nparams);
    ts_module_buffers(t.model, t.buffers, t.nbuffers);
    s = cli_make_optim(t.o.optimizer, t.o.lr, t.o.momentum, t.o.weight_decay, t.params,
                       t.nparams, &t.opt);
    if (s || (s = ts_loader_new(t.train_x, t.train_y, t.o.batch, 1, t.o.seed, 0, &t.loader))) {
        cli_fail(s, "cannot set up training");
        goto out;
    }
    if (!t.o.resume && (rc = setup_optimizer(&t)))
        goto out;
    rc = 1;
    /* Every rank starts from rank 0's weights (whatever each drew), and a rank started with
     * another model is refused on every rank before any step. */
    if (cli_session_refuse_differing(&ss, t.world > 1 ? same_run_everywhere(&t) : 0)) {
        t.world = ss.world; /* -1: a local failure, the job is aborted */
        goto out;
    }
    if (t.o.resume && t.o.eval_only) { /* tessera eval: the checkpoint's test accuracy */
        double acc = 0;
        if ((rc = resume(&t)))
            goto out;
        rc = 1;
        if ((s = evaluate(&t, &acc))) {
            cli_fail(s, "evaluation failed");
            goto out;
        }
        if (t.o.json) {
            cJSON *j = cli_eval_record(t.o.resume, t.o.model, (long long)t.step);
            cJSON_AddNumberToObject(j, "test_acc", acc);
            cJSON_AddNumberToObject(j, "test_images", (double)ts_tensor_size(t.test_x, 0));
            cli_json_line(j);
        } else {
            printf("%s (step %lld): test accuracy %.4f on %lld images\n", t.o.resume,
                   (long long)t.step, acc, (long long)ts_tensor_size(t.test_x, 0));
        }
        rc = 0;
        goto out;
    }
    if (t.o.resume) {
        if ((rc = resume(&t)))
            goto out;
        rc = resume_left(&t);
        if (rc) {
            rc = rc < 0 ? 0 : rc;
            goto out;
        }
        rc = 1;
        if (t.world > 1 && ranks_at_same_step(t.step, t.rank, t.world, t.o.resume))
            goto out;
        if (t.rank == 0)
            fprintf(stderr, "tessera: resumed from %s at epoch %llu, step %lld\n", t.o.resume,
                    (unsigned long long)t.epoch + 1, (long long)t.step);
    }
    /* the trainer first: the header says what it set up (sharding) */
    ts_trainer_options to = {.on_output = count_correct, .user = &t, .clip_grad_norm = t.o.clip,
                             .accumulate = t.o.accumulate,
                             .precision = cli_precision_dtype(t.o.precision)};
    if ((s = ts_trainer_new(t.model, t.opt, &to, &t.tr)) ||
        (s = ts_trainer_set_steps(t.tr, t.step))) {
        cli_fail(s, t.world > 1 ? "data parallelism" : "cannot set up training");
        goto out;
    }
    char arch[256], hyper_txt[96], sched_txt[160];
    cli_model_describe(&t.o.arch, arch, sizeof arch);
    if (!strcmp(t.o.optimizer, "sgd"))
        snprintf(hyper_txt, sizeof hyper_txt, "lr %g momentum %g weight decay %g", t.o.lr,
                 t.o.momentum, t.o.weight_decay);
    else
        snprintf(hyper_txt, sizeof hyper_txt, "lr %g weight decay %g", t.o.lr,
                 t.o.weight_decay);
    if (t.o.json) { /* the whole configuration first: the values in use */
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "event", "start");
        cJSON_AddStringToObject(j, "model", t.o.model);
        cJSON_AddStringToObject(j, "arch", cli_model_describe(&t.o.arch, arch, sizeof arch));
        cJSON_AddNumberToObject(j, "parameters", (double)ts_module_num_params(t.model));
        cJSON_AddStringToObject(j, "device", ts_device_name(t.dev));
        cli_opts_record(opts, NOPTS, &t.o, j); /* the settings in use */
        cJSON_AddNumberToObject(j, "train_images", (double)ts_tensor_size(t.train_x, 0));
        cJSON_AddNumberToObject(j, "world_size", t.world);
        cJSON_AddBoolToObject(j, "optimizer_sharded", ts_optim_sharded(t.opt));
        cJSON_AddNumberToObject(j, "start_step", (double)t.step);
        cli_json_line(j);
    } else { /* the values in use: on --resume, the checkpoint's */
        cli_printf_fit("tessera train: %s (%lld parameters) on '%s', %s %s, batch %lld, %lld "
               "training images, data loaded in %.1f s\n",
               cli_model_describe(&t.o.arch, arch, sizeof arch),
               (long long)ts_module_num_params(t.model), ts_device_name(t.dev), t.o.optimizer,
               hyper_txt, (long long)t.o.batch, (long long)ts_tensor_size(t.train_x, 0),
               cli_now() - t0);
        char zt[96];
        if (t.world > 1)
            cli_printf_fit("  data parallel: %d ranks over '%s', each a %lld-row part of every batch "
                   "of %lld%s\n", t.world, ts_dist_backend(), (long long)(t.o.batch / t.world),
                   (long long)t.o.batch, cli_sharded_text(t.opt, t.world, zt, sizeof zt));
        if (t.o.accumulate > 1)
            cli_printf_fit("  gradient accumulation: each batch in %lld micro-batches\n",
                   (long long)t.o.accumulate);
        char clip_txt[48] = "off";
        if (t.o.clip > 0)
            snprintf(clip_txt, sizeof clip_txt, "at norm %g", t.o.clip);
        if (ts_optim_get_schedule(t.opt, NULL) || t.o.clip > 0 || strcmp(t.o.decay, "all"))
            cli_printf_fit("  lr schedule %s; weight decay on %s; gradient clipping %s\n",
                   schedule_text(t.opt, sched_txt, sizeof sched_txt),
                   strcmp(t.o.decay, "all") ? "matrices only" : "every parameter", clip_txt);
    }
    if (cli_apply_loss_scale(&t.scale, t.tr, t.o.precision))
        goto out;
    t.started = cli_now();
    t.first_step = t.step;
    cli_profile_begin(t.o.profile);
    ts_fit_options fo = {.loader = t.loader, .epochs = t.o.epochs, .steps = t.o.max_steps,
                         .stop = cli_stop_flag(), .on_event = on_event, .user = &t};
    ts_fit_state st;
    if ((s = ts_fit(t.tr, &fo, &st))) {
        say_failed(&t, s, &st);
        goto out;
    }
    if (st.stopped) { /* saved, if asked; no evaluation */
        cli_progress_clear(&t.progress);
        t.stopped_by = cli_stop_requested() ? cli_stop_requested() : SIGTERM;
        if (t.o.save && (s = save_all(&t, t.o.save))) {
            cli_fail(s, "--save");
            goto out;
        }
    }
    if (t.rank == 0)
        cli_profile_report(t.o.profile, (long long)(t.step - t.first_step),
                           cli_now() - t.started, t.o.json);
    char took[32];
    cli_duration(cli_now() - t.started, took, sizeof took);
    if (t.o.json) { /* steps: cumulative, as in the epoch records */
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "event", "end");
        cJSON_AddNumberToObject(j, "steps", (double)t.step);
        cJSON_AddNumberToObject(j, "steps_this_run", (double)(t.step - t.first_step));
        cJSON_AddNumberToObject(j, "seconds", cli_now() - t.started);
        if (t.best_epoch) {
            cJSON_AddNumberToObject(j, "last_test_acc", t.last_acc);
            cJSON_AddNumberToObject(j, "best_test_acc", t.best_acc);
            cJSON_AddNumberToObject(j, "best_epoch", (double)t.best_epoch);
        }
        cli_json_str_or_null(j, "checkpoint", t.o.save);
        cli_json_str_or_null(j, "stopped_by", t.stopped_by ? cli_signal_name(t.stopped_by) : NULL);
        cli_pool_record(t.dev, j);
        cli_json_line(j);
    }
    if (t.stopped_by) {
        if (t.rank == 0)
            cli_say_stopped(t.stopped_by, (long long)t.step, took, t.o.save,
                            (const char *const[]){"--data", t.o.data, "--device", t.o.device,
                                                  "--config", config, NULL});
        rc = 128 + t.stopped_by;
        t.world = 1; /* every rank stopped after the same step: nothing to abort */
        goto out;
    }
    if (!t.o.json && t.best_epoch) {
        char pool[200];
        cli_printf_fit("%s\n", cli_pool_summary(t.dev, pool, sizeof pool));
        cli_printf_fit("done: %lld steps in %s; test accuracy %.4f (best %.4f, epoch %llu)%s%s",
                       (long long)(t.step - t.first_step), took, t.last_acc, t.best_acc,
                       (unsigned long long)t.best_epoch, t.o.save ? "; checkpoint " : "",
                       t.o.save ? t.o.save : "");
    }
    rc = 0;
out:
    ts_trainer_free(t.tr);
    trainer_free(&t);
    ss.world = t.world;
    ss.stopped = t.stopped_by;
    return cli_session_end(&ss, rc, common);
}

/* ---- tessera eval ------------------------------------------------------------------------ */

static const char eval_usage[] =
    "usage: tessera eval --resume CKPT [--data DIR | --text FILE] [--device NAME] [--json]\n"
    "\n"
    "Evaluates a checkpoint of tessera train without training: test accuracy on the 10,000\n"
    "Fashion-MNIST test images for mlp, lenet5 and cnn; the validation loss (nats and bits\n"
    "per byte, the same windows as training's evaluations) for the GPT, on the text it was\n"
    "trained on (--text; the checkpoint refuses another). The model comes from the\n"
    "checkpoint; the other options of tessera train (--eval-batches, --batch-size, ...)\n"
    "apply as they do there.\n";

int cmd_eval(int argc, char **argv, const cli_common *common)
{
    int resume = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(eval_usage, stdout);
            return 0;
        }
        resume |= !strcmp(argv[i], "--resume") && i + 1 < argc;
    }
    if (!resume)
        return cli_usage_error("eval", "which checkpoint? (tessera eval --resume CKPT)");
    /* The run's settings (seed, batch size, training slice) are the checkpoint's unless
     * given: train --resume takes them from it (adopt_run). */
    char **nv = calloc((size_t)argc + 2, sizeof *nv);
    if (!nv)
        return cli_fail(TS_ENOMEM, "eval");
    int n = 0;
    for (int i = 0; i < argc; i++)
        nv[n++] = argv[i];
    nv[n++] = "--eval-only";
    int rc = cmd_train(n, nv, common);
    free(nv);
    return rc;
}
