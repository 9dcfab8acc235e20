/* tools/train_gpt.c: `tessera train --model gpt`: a character-level GPT (models/gpt.c)
 * on any text file, bytes as tokens (vocabulary 256). The last 10% of the file is held out
 * for validation; each step trains on a batch of random windows of --context tokens, drawn
 * from (seed, step) alone so that a resumed run draws what the straight run would. AdamW
 * with weight decay on the blocks' matrices only, a warm-up then cosine learning rate, and
 * gradient clipping; validation loss in nats and bits per byte, and tokens per second. */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli.h"

#define FORTUNES_DIR "/usr/share/games/fortunes"
#define MAX_TEXT ((size_t)1 << 31)

typedef struct gpt_opts {
    const char *model, *config; /* "gpt"; the caller's */
    const char *text, *device, *save, *resume, *save_initial, *memtrace, *memplot;
    ts_gpt_config cfg;
    int64_t batch, steps, max_steps, warmup, eval_every, eval_batches, accumulate, log_every;
    double lr, min_lr, weight_decay, clip;
    uint64_t seed;
    int json, log_steps, eval_only, profile;
    const char *precision; /* "fp32" / "bf16" */
    unsigned char given[40]; /* per row of opts: given on the command line */
} gpt_opts;

/* The options, once: flag, type, field, range, start-record key, the checkpoint key a resumed
 * run takes it from unless given (then refused when it differs, or an override), and the
 * group of settings every rank must agree on. In adoption order: a range may name an earlier
 * row's value. */
enum { ARCH = 1, SEED, BATCH, RUN };
static const char *const profile_all[] = {"all", NULL}; /* --profile all: every kernel */
#define O(f) CLI_OFF(gpt_opts, f)
#define HI(f) (O(f) + 1)
static const cli_opt opts[] = {
    {.flag = "--model", .type = CLI_STR, .off = O(model)},
    {.flag = "--config", .type = CLI_STR, .off = O(config), .arg = "FILE",
     .help = "the configuration file (as tessera --config FILE)"},
    {.flag = "--text", .type = CLI_STR, .off = O(text), .arg = "FILE",
     .help = "the text to train on (default: the fortunes, above)"},
    {.flag = "--device", .type = CLI_STR, .off = O(device), .arg = "NAME",
     .help = "the backend: a plugin's name or path (default: the configuration's)"},
    {.flag = "--save", .type = CLI_STR, .off = O(save), .arg = "CKPT",
     .help = "write a checkpoint at each evaluation, and when a signal stops the run"},
    {"--resume", CLI_STR, O(resume), .json = "resumed_from", .agree = RUN, .arg = "CKPT",
     .help = "continue exactly where CKPT stopped, on the same text: its model and settings (a "
             "setting given must agree, or is refused naming both values)"},
    {.flag = "--save-initial", .type = CLI_STR, .off = O(save_initial), .arg = "CKPT",
     .help = "write the freshly initialised weights (bench/gpt_compare.py starts PyTorch from "
             "them)"},
    {.flag = "--memtrace", .type = CLI_STR, .off = O(memtrace), .arg = "TRACE",
     .help = "write a Chrome/Perfetto trace of the pools' memory with step and evaluation "
             "marks (one file a rank under mpirun: TRACE.rankN)"},
    {.flag = "--memplot", .type = CLI_STR, .off = O(memplot), .arg = "FILE.svg",
     .help = "draw the trace as an SVG at the end (tessera memplot); without --memtrace the "
             "trace is FILE.svg.trace.json"},
    {"--context", CLI_I64, O(cfg.context), 1, 4096, .agree = ARCH, .arg = "T",
     .help = "tokens per window (default 128)"},
    {"--layers", CLI_I64, O(cfg.layers), 1, 64, .agree = ARCH, .arg = "L",
     .help = "transformer blocks (default 4)"},
    {"--heads", CLI_I64, O(cfg.heads), 1, 64, .agree = ARCH, .arg = "H",
     .help = "attention heads (default 4; --embd must be a multiple)"},
    {"--embd", CLI_I64, O(cfg.embd), 1, 8192, .agree = ARCH, .arg = "C",
     .help = "channels (default 128)"},
    {"--dropout", CLI_F64, O(cfg.dropout), 0, 0.99, .agree = ARCH, .arg = "P",
     .help = "dropout probability (default 0)"},
    {"--seed", CLI_U64, O(seed), 0, 18446744073709551615.0, .json = "seed",
     .ckpt = "train.seed", .refuse = 1, .agree = SEED, .arg = "S",
     .help = "the seed of the initial weights, the windows drawn and dropout (default 1)"},
    {"--batch-size", CLI_I64, O(batch), 1, 4096, .json = "batch_size",
     .ckpt = "train.batch_size", .refuse = 1, .agree = BATCH, .arg = "B",
     .help = "windows per step (default 16)"},
    {"--lr", CLI_F64, O(lr), 0, 1e6, 1, .json = "lr", .ckpt = "optim.schedule.base_lr",
     .refuse = 1, .agree = RUN,
     .help = "AdamW's peak learning rate (default 1e-3; betas 0.9, 0.95)"},
    {"--steps", CLI_I64, O(steps), 1, 1099511627776.0, .json = "steps",
     .ckpt = "optim.schedule.total_steps", .refuse = 1, .agree = RUN,
     .help = "the run's length: the cosine ends there (default 2000)"},
    {"--warmup-steps", CLI_I64, O(warmup), 0, 1099511627776.0, .hi_of = HI(steps),
     .json = "warmup_steps", .ckpt = "optim.schedule.warmup_steps", .refuse = 1, .agree = RUN,
     .help = "linear warm-up steps (default 100, at most --steps)"},
    {"--min-lr", CLI_F64, O(min_lr), 0, 1e6, .hi_of = HI(lr), .json = "min_lr",
     .ckpt = "optim.schedule.min_lr", .refuse = 1, .agree = RUN,
     .help = "where the cosine ends (default lr/10)"},
    {"--weight-decay", CLI_F64, O(weight_decay), 0, 1e6, .json = "weight_decay",
     .ckpt = "optim.weight_decay", .refuse = 1, .agree = RUN, .arg = "W",
     .help = "on the blocks' matrices only (default 0.1)"},
    {"--clip-grad-norm", CLI_F64, O(clip), 0, 1e12, .json = "clip_grad_norm", .agree = RUN,
     .help = "scale the gradients to a global L2 norm of at most X (default 1; 0: off)"},
    {"--accumulate", CLI_I64, O(accumulate), 1, 4096, .hi_of = HI(batch), .json = "accumulate",
     .ckpt = "train.accumulate", .arg = "K",
     .help = "each batch as K micro-batches whose gradients add up: the same step to float "
             "rounding, a K-th of the activations (on --resume the checkpoint's unless given)"},
    {"--checkpoint-activations", CLI_ONOFF, O(cfg.checkpoint), .json = "checkpoint_activations",
     .ckpt = "train.checkpoint_activations",
     .help = "on: keep only each block's input and recompute the block in backward: the same "
             "gradients, about a third more compute (on --resume the checkpoint's unless "
             "given)"},
    CLI_PRECISION_OPT(O(precision), RUN, "the matmuls"),
    {"--max-steps", CLI_I64, O(max_steps), 1, 1099511627776.0, .json = "max_steps",
     .agree = RUN,
     .help = "stop after N steps in all, to resume later on the same schedule"},
    {"--eval-every", CLI_I64, O(eval_every), 1, 1099511627776.0, .agree = RUN,
     .help = "the validation loss every N steps and at the end (default 200)"},
    {"--log-every", CLI_I64, O(log_every), 1, 1099511627776.0, .agree = 0,
     .help = "when stderr is not a terminal, a progress line there every N steps (default: 5 s "
             "in, then every 30 s); on a terminal one line redrawn in place instead"},
    {"--eval-batches", CLI_I64, O(eval_batches), 1, 1099511627776.0, .agree = RUN,
     .help = "batches per validation (default 20)"},
    {.flag = "--json", .type = CLI_FLAG, .off = O(json),
     .help = "one JSON object per evaluation instead of the progress line and summary"},
    {.flag = "--eval-only", .type = CLI_FLAG, .off = O(eval_only)}, /* tessera eval */
    {.flag = "--log-steps", .type = CLI_FLAG, .off = O(log_steps),
     .help = "print every step's loss (one line each; JSON lines with --json)"},
    {.flag = "--profile", .type = CLI_LEVEL, .off = O(profile), .choices = profile_all,
     .help = "time every kernel and print where a step's time goes at the end (a JSON record "
             "with --json; the top 15, or all); with --memtrace each kernel is also a slice in "
             "the trace, inside \"step N\" slices, on the memory's timeline"},
};
#undef HI
#undef O
enum { NOPTS = sizeof opts / sizeof opts[0] };
_Static_assert(NOPTS <= sizeof ((gpt_opts *)0)->given, "gpt_opts.given is too small");

static const cli_usage usage = {
    .synopsis = "tessera train --model gpt",
    .intro = "Trains a character-level GPT on a text file, bytes as tokens; the last 10% of the "
             "file is held out for validation. Default text: the Debian package fortunes ("
             FORTUNES_DIR ", its files concatenated in name order). Defaults: context 128, 4 "
             "layers, 4 heads, embd 128, dropout 0, batch 16, 2000 steps, AdamW lr 1e-3 (betas "
             "0.9, 0.95) with weight decay 0.1 on the blocks' matrices only, 100 warm-up steps "
             "then cosine to lr/10 at the last step, gradient clipping at norm 1, evaluation "
             "every 200 steps on 20 batches, seed 1. Losses are in nats per token; bits per "
             "byte is that over ln 2.\n",
    .outro = "A loss that becomes NaN or infinite stops training with exit status 1. SIGINT or "
             "SIGTERM finishes the step, saves (with --save) and exits with 130 or 143.\n",
};

/* Whether flag was given on the command line. */
static int given(const gpt_opts *o, const char *flag)
{
    return cli_opts_given(opts, NOPTS, o->given, flag);
}

/* ---- the text ------------------------------------------------------------------------- */

/* Appends the regular file at path to *buf (grown as needed). 0, or 1 with a message. */
static int append_file(const char *path, unsigned char **buf, size_t *n)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        fprintf(stderr, "tessera: error: train --text: cannot open %s: %s\n", path,
                strerror(errno));
        if (fd >= 0)
            close(fd);
        return 1;
    }
    if (!S_ISREG(st.st_mode)) {
        fprintf(stderr, "tessera: error: train --text: %s is not a regular file (a %s); give a "
                        "text file\n", path, S_ISDIR(st.st_mode) ? "directory"
                                             : S_ISFIFO(st.st_mode) ? "FIFO"
                                                                   : "device or socket");
        close(fd);
        return 1;
    }
    if ((uint64_t)st.st_size > MAX_TEXT - *n) {
        fprintf(stderr, "tessera: error: train --text: %s makes the text larger than 2 GiB\n",
                path);
        close(fd);
        return 1;
    }
    unsigned char *b = realloc(*buf, *n + (size_t)st.st_size + 1);
    if (!b) {
        fprintf(stderr, "tessera: error: train --text: out of memory reading %s\n", path);
        close(fd);
        return 1;
    }
    *buf = b;
    size_t got = 0;
    while (got < (size_t)st.st_size) {
        ssize_t r = read(fd, b + *n + got, (size_t)st.st_size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    *n += got;
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The default corpus: every regular file of the fortunes directory but the .dat indexes, in
 * name order. */
static int load_fortunes(unsigned char **buf, size_t *n)
{
    char *names[1024];
    size_t count = 0;
    char cmdpath[4096];
    struct stat st;
    if (stat(FORTUNES_DIR, &st) != 0 || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "tessera: error: train --model gpt: no --text and no default corpus in "
                        "%s: install the Debian package fortunes, or give --text FILE\n",
                FORTUNES_DIR);
        return 1;
    }
    DIR *d = opendir(FORTUNES_DIR);
    struct dirent *de;
    while (d && (de = readdir(d)) && count < 1024) {
        size_t len = strlen(de->d_name);
        if (de->d_name[0] == '.' || (len > 4 && !strcmp(de->d_name + len - 4, ".dat")) ||
            (len > 2 && !strcmp(de->d_name + len - 2, ".u8")))
            continue;
        snprintf(cmdpath, sizeof cmdpath, "%s/%s", FORTUNES_DIR, de->d_name);
        if (lstat(cmdpath, &st) == 0 && S_ISREG(st.st_mode) && (names[count] = strdup(cmdpath)))
            count++;
    }
    if (d)
        closedir(d);
    qsort(names, count, sizeof *names, cmp_str);
    int rc = count ? 0 : 1;
    if (!count)
        fprintf(stderr, "tessera: error: train --model gpt: %s holds no text files\n",
                FORTUNES_DIR);
    for (size_t i = 0; i < count; i++) {
        if (!rc)
            rc = append_file(names[i], buf, n);
        free(names[i]);
    }
    return rc;
}

/* FNV-1a over the text: a checkpoint says which text it was trained on. */
static uint64_t fnv1a(const unsigned char *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* ---- batches --------------------------------------------------------------------------- */

static uint64_t mix(uint64_t z)
{
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Windows b = b0..b0+B-1 of batch `draw` from text[0, n): ids (B, T) and their next tokens.
 * The starts depend on (seed, draw, b) only, so a rank draws its rows of a global batch alone. */
static ts_status windows(ts_device *dev, const unsigned char *text, size_t n, uint64_t seed,
                         uint64_t draw, int64_t b0, int64_t B, int64_t T, ts_tensor **x,
                         ts_tensor **y)
{
    int64_t *xv = malloc(sizeof *xv * (size_t)(B * T) + 1),
            *yv = malloc(sizeof *yv * (size_t)(B * T) + 1);
    ts_status s = xv && yv ? TS_OK : ts_fail(TS_ENOMEM, "out of host memory for a batch");
    for (int64_t i = 0; !s && i < B; i++) {
        const int64_t b = b0 + i;
        uint64_t start = mix(seed ^ mix(draw * 0x100000001b3ull + (uint64_t)b)) %
                         (uint64_t)(n - (size_t)T);
        for (int64_t t = 0; t < T; t++) {
            xv[i * T + t] = text[start + (uint64_t)t];
            yv[i * T + t] = text[start + (uint64_t)t + 1];
        }
    }
    if (!s)
        s = ts_tensor_from_host(dev, TS_I64, 2, (const int64_t[]){B, T}, xv, x);
    if (!s)
        s = ts_tensor_from_host(dev, TS_I64, 2, (const int64_t[]){B, T}, yv, y);
    if (!s) {
        ts_tensor_set_role(*x, TS_ROLE_DATA);
        ts_tensor_set_role(*y, TS_ROLE_DATA);
    }
    free(xv);
    free(yv);
    return s;
}

/* Mean loss (nats per token) of the model on batch x, y, in the run's precision (as nanoGPT
 * evaluates under its autocast context); grad mode off. */
static ts_status eval_loss(ts_module *gpt, const char *precision, ts_tensor *x, ts_tensor *y,
                           double *out)
{
    ts_tensor *logits = NULL, *loss = NULL, *d = NULL;
    ts_status s = ts_autocast_begin(cli_precision_dtype(precision));
    if (s)
        return s;
    s = ts_module_forward(gpt, x, &logits);
    if (!s)
        s = ts_gpt_loss(logits, y, &loss);
    ts_autocast_end();
    if (!s)
        s = ts_cast(loss, TS_F64, &d);
    if (!s)
        s = ts_tensor_to_host(d, out, sizeof *out);
    ts_tensor_unref(logits), ts_tensor_unref(loss), ts_tensor_unref(d);
    return s;
}

/* ---- checkpoints ----------------------------------------------------------------------- */

typedef struct run {
    gpt_opts o;
    ts_device *dev;
    ts_module *gpt;
    ts_named_tensor *params;
    size_t np;
    ts_optim *opt;
    ts_checkpoint *ck; /* --resume's, open from adopt_settings to the end */
    ts_rng rng; /* initialisation and dropout */
    int64_t step;
    uint64_t text_hash;
    int rank, world; /* data parallelism: this rank of world (1: a single process) */
    ts_trainer *tr; /* the step (data-parallel when world > 1) */
    int stopped; /* the signal that stopped training, or 0 */
    cli_session ss;
    /* the run in progress (ts_fit's callback) */
    const unsigned char *text, *vtext; /* the training and validation bytes */
    size_t ntrain, nval;
    cli_progress prog;
    int show;                   /* progress shown (rank 0) */
    double t0, drawn, started;  /* since the last evaluation; last redraw; training began */
    double last_val, best_val;  /* NaN: no evaluation yet */
    int save_failed;            /* a checkpoint of --save could not be written */
    int eval_failed;            /* the validation loss could not be computed */
    cli_loss_scale scale;       /* --resume: fp16's loss scale from the checkpoint */
} run;

/* Every rank must train the same model on the same text with the same settings; a rank
 * started otherwise is named on every rank, before any step. */
static int same_run_everywhere(const run *r)
{
    /* everything that decides the sequence of collectives: steps, evaluations, position */
    const uint64_t mine[] = {cli_opts_fingerprint(opts, NOPTS, &r->o, ARCH), r->o.seed,
                             (uint64_t)r->o.batch, r->text_hash,
                             cli_opts_fingerprint(opts, NOPTS, &r->o, RUN) ^
                                 mix((uint64_t)r->step)};
    static const char *const what[] = {
        "another model (--context, --layers, --heads, --embd, --dropout)", "another --seed",
        "another --batch-size", "another text",
        "other optimizer, schedule, evaluation or --resume settings (or resumed at another "
        "step)"};
    return cli_ranks_agree(mine, sizeof mine / sizeof mine[0], what, r->rank, r->world);
}

static ts_status save_to(const run *r, const char *path);

/* Every rank: a sharded optimizer's state gathered on rank 0; rank 0 writes --save. */
static ts_status save(const run *r)
{
    ts_status s = ts_optim_consolidate_state(r->opt, 0);
    return s == TS_OK && r->rank == 0 ? save_to(r, r->o.save) : s;
}

static ts_status save_to(const run *r, const char *path)
{
    ts_checkpoint *ck;
    ts_status s = ts_checkpoint_new(&ck);
    for (size_t i = 0; i < r->np && s == TS_OK; i++)
        s = ts_checkpoint_add(ck, r->params[i].name, r->params[i].tensor);
    if (s == TS_OK)
        s = ts_optim_save_state(r->opt, ck);
    if (s == TS_OK) {
        ts_model_config mc;
        ts_model_defaults("gpt", &mc);
        mc.gpt = r->o.cfg;
        if ((s = ts_model_save_config(&mc, ck)) != TS_OK) {
            ts_checkpoint_free(ck);
            return s;
        }
        ts_checkpoint_set_meta(ck, "train.format", CLI_GPT_FORMAT);
        ts_checkpoint_set_meta(ck, "train.tokenizer", "bytes");
        cli_meta_set_u64(ck, "train.seed", r->o.seed);
        cli_meta_set_u64(ck, "train.batch_size", (uint64_t)r->o.batch);
        cli_meta_set_u64(ck, "train.accumulate", (uint64_t)r->o.accumulate);
        cli_meta_set_u64(ck, "train.checkpoint_activations", (uint64_t)r->o.cfg.checkpoint);
        ts_checkpoint_set_meta(ck, "train.precision", r->o.precision);
        cli_save_loss_scale(ck, r->tr, r->o.precision);
        cli_meta_set_u64(ck, "train.step", (uint64_t)r->step);
        cli_meta_set_u64(ck, "train.rng_offset", r->rng.offset);
        cli_meta_set_u64(ck, "train.text_hash", r->text_hash);
        s = ts_checkpoint_save(ck, path);
    }
    ts_checkpoint_free(ck);
    return s;
}

/* A resumed run is the run its checkpoint was written by: the model and the run settings
 * (seed, batch size, learning rate, schedule, weight decay) are the checkpoint's. A setting
 * given on the command line must agree (a different --lr or --steps would otherwise be
 * silently ignored by the restored optimizer, or run past the end of its schedule); one not
 * given is taken from the checkpoint, each value checked as strictly as the option. r->ck
 * stays open for resume(). 0, or the exit status. */
static int adopt_settings(run *r)
{
    gpt_opts *o = &r->o;
    const char *path = o->resume;
    ts_gpt_config cfg;
    if (cli_gpt_open(path, r->dev, &r->ck, &cfg))
        return 1;
    char want[256], have[256];
    cli_gpt_describe(&cfg, have, sizeof have);
    if (strcmp(have, cli_gpt_describe(&o->cfg, want, sizeof want)) != 0) {
        fprintf(stderr, "tessera: error: %s is a '%s', not a '%s'; resume with the same "
                        "--context, --layers, --heads, --embd and --dropout\n",
                path, have, want);
        return 2;
    }
    /* in the table's order: each range may depend on a value adopted before it */
    return cli_opts_adopt(opts, NOPTS, o->given, r->ck, path, o);
}

/* Restores model, optimizer and position from r->ck (adopt_settings opened and checked it);
 * refuses another text. 0, or the exit status. */
static int resume(run *r)
{
    const char *path = r->o.resume;
    ts_checkpoint *ck = r->ck;
    uint64_t step, roff, hash;
    if (cli_meta_u64(ck, path, "train.step", (uint64_t)1 << 53, &step) ||
        cli_meta_u64(ck, path, "train.rng_offset", UINT64_MAX, &roff) ||
        cli_meta_u64(ck, path, "train.text_hash", UINT64_MAX, &hash) ||
        cli_read_loss_scale(ck, path, &r->scale))
        return 1;
    if (hash != r->text_hash) {
        fprintf(stderr, "tessera: error: %s was trained on another text (its bytes differ "
                        "from this --text); resume on the same text\n", path);
        return 2;
    }
    if (cli_restore_model(ck, path, r->params, r->np, NULL, 0))
        return 1;
    /* eval needs the model only (an exported model has no optimizer state) */
    ts_status s = r->o.eval_only ? TS_OK : ts_optim_load_state(r->opt, ck);
    if (s)
        return cli_fail(s, "--resume");
    r->step = (int64_t)step;
    r->rng.offset = roff;
    return 0;
}

/* ---- options --------------------------------------------------------------------------- */

static int parse(int argc, char **argv, gpt_opts *o, const cli_common *common)
{
    *o = (gpt_opts){.cfg = {256, 128, 4, 4, 128, 0, 0},
                    .batch = 16,
                    .accumulate = 1,
                    .precision = "fp32",
                    .steps = 2000,
                    .warmup = 100,
                    .eval_every = 200,
                    .eval_batches = 20,
                    .lr = 1e-3,
                    .min_lr = -1,
                    .weight_decay = 0.1,
                    .clip = 1.0,
                    .seed = 1,
                    .json = common->json};
    int rc = cli_opts_parse("train", "for --model gpt", opts, NOPTS, argc, argv, o, o->given,
                            &usage, NULL, NULL);
    if (rc)
        return rc;
    if (o->model && strcmp(o->model, "gpt"))
        return cli_usage_error("train", "--model gpt expected here");
    if (o->resume && !o->save && !o->eval_only)
        o->save = o->resume; /* a resumed run saves where it was resumed from */
    if (o->resume && o->save_initial)
        return cli_usage_error("train", "--save-initial writes a new model's initial weights; "
                               "with --resume there is none (leave one of them out)");
    if (o->accumulate > o->batch)
        return cli_usage_error("train", "--accumulate %lld is more than --batch-size %lld: each "
                               "micro-batch needs one row at least",
                               (long long)o->accumulate, (long long)o->batch);
    if (o->cfg.embd % o->cfg.heads)
        return cli_usage_error("train", "--embd %lld is not a multiple of --heads %lld",
                               (long long)o->cfg.embd, (long long)o->cfg.heads);
    if (o->min_lr < 0)
        o->min_lr = o->lr / 10;
    if (o->min_lr > o->lr)
        return cli_usage_error("train", "--min-lr %g is above --lr %g", o->min_lr, o->lr);
    if (!given(o, "--warmup-steps") && o->warmup > o->steps)
        o->warmup = o->steps; /* the default, for a short run */
    if (o->warmup > o->steps)
        return cli_usage_error("train", "--warmup-steps %lld is more than --steps %lld",
                               (long long)o->warmup, (long long)o->steps);
    return 0;
}

/* ---- training -------------------------------------------------------------------------- */

/* The mean loss over --eval-batches windows of the validation text (the same windows at
 * every evaluation), the ranks sharing the batches out. */
static ts_status validation_loss(run *r, const unsigned char *vtext, size_t nval, int64_t T,
                                 double *val)
{
    double vsum = 0;
    ts_status s = TS_OK;
    ts_module_train(r->gpt, 0);
    ts_no_grad_enter();
    for (int64_t e = r->rank; e < r->o.eval_batches && !s; e += r->world) {
        double v = 0;
        ts_tensor *x = NULL, *y = NULL;
        if (!(s = windows(r->dev, vtext, nval, r->o.seed ^ 0x5eed, (uint64_t)e, 0, r->o.batch,
                          T, &x, &y)))
            s = eval_loss(r->gpt, r->o.precision, x, y, &v);
        ts_tensor_unref(x), ts_tensor_unref(y);
        vsum += v;
    }
    ts_no_grad_exit();
    if (!s)
        s = ts_dist_allreduce_sum(&vsum, 1, TS_F64);
    *val = vsum / (double)r->o.eval_batches;
    return s;
}

/* One progress line or bar: step of stop, the mean loss since the last evaluation, tokens/s,
 * elapsed, ETA, pool. */
static void step_progress(run *r, const ts_fit_state *st)
{
    char head[64];
    double tps = (double)st->steps_since * (double)(r->o.batch * r->o.cfg.context) /
                 (r->drawn - r->t0);
    snprintf(head, sizeof head, "step %lld/%lld:", (long long)st->step, (long long)st->last_step);
    cli_progress_step(&r->prog, st->step, head, (double)st->step / (double)st->last_step,
                      st->mean_loss, tps, "tokens/s", r->started, st->step - st->first_step,
                      st->last_step - st->step, r->dev);
}

/* Step k's batch: its windows of the training text. */
static ts_status batch_of(void *user, int64_t k, ts_tensor **x, ts_tensor **y)
{
    run *r = user;
    return windows(r->dev, r->text, r->ntrain, r->o.seed, (uint64_t)k, 0, r->o.batch,
                   r->o.cfg.context, x, y);
}

/* The evaluation every --eval-every steps and at the end: the validation loss, its record,
 * the checkpoint. */
static ts_status eval_record(run *r, const ts_fit_state *st)
{
    cli_progress_clear(&r->prog);
    double secs = cli_now() - r->t0, val = 0;
    char mk[40];
    snprintf(mk, sizeof mk, "step %lld", (long long)st->step);
    ts_memtrace_marker(mk, 0);
    ts_memtrace_marker("eval", 1);
    cli_profile_eval(r->o.profile, 1); /* --profile: evaluation apart from the steps */
    ts_status s = validation_loss(r, r->vtext, r->nval, r->o.cfg.context, &val);
    cli_profile_eval(r->o.profile, 0);
    ts_memtrace_marker("eval", -1);
    if (s) {
        r->eval_failed = 1;
        return s;
    }
    r->last_val = val;
    r->best_val = isnan(r->best_val) || val < r->best_val ? val : r->best_val;
    double tps = (double)st->steps_since * (double)(r->o.batch * r->o.cfg.context) / secs;
    char scale[96] = ""; /* fp16: the loss scale and the steps it skipped */
    double ls;
    ts_trainer_loss_scale(r->tr, &ls, NULL);
    if (r->o.json && !strcmp(r->o.precision, "fp16"))
        snprintf(scale, sizeof scale, ", \"loss_scale\": %.17g, \"skipped_steps\": %lld", ls,
                 (long long)st->skipped);
    else if (!strcmp(r->o.precision, "fp16"))
        snprintf(scale, sizeof scale, ", loss scale %g (%lld steps skipped)", ls,
                 (long long)st->skipped);
    if (r->o.json)
        printf("{\"step\": %lld, \"train_loss\": %.6f, \"val_loss\": %.6f, "
               "\"val_bits_per_byte\": %.6f, \"lr\": %.9g, \"tokens_per_s\": %.0f, "
               "\"seconds\": %.2f, \"world_size\": %d%s}\n",
               (long long)st->step, st->mean_loss, val, val / log(2.0), ts_optim_lr(r->opt),
               tps, secs, r->world, scale);
    else
        cli_printf_fit("step %lld: train loss %.4f, val loss %.4f (%.3f bits/byte), lr %.3g, "
                       "%.0f tokens/s%s\n",
                       (long long)st->step, st->mean_loss, val, val / log(2.0),
                       ts_optim_lr(r->opt), tps, scale);
    fflush(stdout);
    r->t0 = cli_now();
    if (r->o.save && (s = save(r)))
        r->save_failed = 1;
    return s;
}

/* What the run does around each step (ts_fit's callback). */
static ts_status on_event(void *user, ts_fit_event ev, const ts_fit_state *st)
{
    run *r = user;
    switch (ev) {
    case TS_FIT_STEP_BEGIN:
        cli_fit_step(ev, st, r->o.profile, 0, 0, 0);
        return TS_OK;
    case TS_FIT_STEP:
        cli_fit_step(ev, st, r->o.profile, r->o.log_steps, r->o.json, ts_optim_lr(r->opt));
        r->step = st->step;
        if (r->show && !st->stopped && cli_now() - r->drawn >= (r->prog.tty ? 0.1 : 0)) {
            r->drawn = cli_now(); /* 10 redraws a second on a terminal */
            step_progress(r, st);
        }
        return TS_OK;
    case TS_FIT_EVAL:
        return eval_record(r, st);
    default:
        return TS_OK;
    }
}

int cli_train_gpt(int argc, char **argv, const cli_common *common)
{
    run r;
    memset(&r, 0, sizeof r);
    const char *config = common->config;
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--config"))
            config = argv[i + 1];
    int rc = parse(argc, argv, &r.o, common);
    if (rc)
        return rc < 0 ? 0 : rc;
    unsigned char *text = NULL;
    size_t n = 0;
    if (r.o.text ? append_file(r.o.text, &text, &n) : load_fortunes(&text, &n)) {
        free(text);
        return 1;
    }
    const int64_t T = r.o.cfg.context;
    size_t ntrain = n - n / 10, nval = n - ntrain;
    if (ntrain < (size_t)T + 2 || nval < (size_t)T + 2) {
        fprintf(stderr, "tessera: error: train --model gpt: the text has %zu bytes; with "
                        "--context %lld it needs at least %lld (90%% to train, 10%% to "
                        "validate, each longer than a window)\n",
                n, (long long)T, (long long)(10 * (T + 2)));
        free(text);
        return 1;
    }
    r.text_hash = fnv1a(text, n);
    if ((rc = cli_session_begin(&r.ss, config, r.o.device, r.o.save, r.o.memtrace, r.o.memplot,
                                (const char *const[3]){r.o.save, r.o.resume,
                                                       r.o.save_initial}))) {
        free(text);
        return rc;
    }
    rc = 1;
    ts_status s;
    r.rank = r.ss.rank;
    r.world = r.ss.world;
    r.dev = r.ss.dev;
    if (r.o.resume && (rc = adopt_settings(&r)))
        goto out;
    rc = 1;
    /* An absurd shape is refused now, not after building for minutes. */
    if (cli_gpt_too_big(&r.o.cfg, r.o.batch / r.world + (r.o.batch % r.world != 0),
                        !r.o.eval_only, r.dev))
        goto out;
    ts_rng_init(&r.rng, r.o.seed);
    if ((s = ts_gpt_new(&r.o.cfg, r.dev, &r.rng, &r.gpt))) {
        cli_fail(s, "cannot build the model");
        goto out;
    }
    r.np = ts_module_parameters(r.gpt, NULL, 0);
    if (!(r.params = calloc(r.np + 1, sizeof *r.params))) {
        fprintf(stderr, "tessera: error: out of memory\n");
        goto out;
    }
    ts_module_parameters(r.gpt, r.params, r.np);
    ts_adam_options ao = {r.o.lr, 0.9, 0.95, 1e-8, r.o.weight_decay};
    ts_lr_schedule sch = {TS_LR_COSINE, r.o.lr, r.o.warmup, 0, 0, r.o.steps, r.o.min_lr};
    if ((s = ts_optim_adamw(r.params, r.np, &ao, &r.opt)) ||
        (s = ts_optim_set_schedule(r.opt, &sch))) {
        cli_fail(s, "cannot set up the optimizer");
        goto out;
    }
    ts_gpt_decay_groups(r.opt);
    if (r.o.save_initial && r.rank == 0 && (s = save_to(&r, r.o.save_initial))) {
        cli_fail(s, "--save-initial");
        goto out;
    }
    if (r.o.resume && (rc = resume(&r)))
        goto out;
    rc = 1;
    if (cli_session_refuse_differing(&r.ss, r.world > 1 ? same_run_everywhere(&r) : 0)) {
        r.world = r.ss.world; /* -1: a local failure, the job is aborted */
        goto out;
    }
    ts_trainer_options to = {.loss = TS_LOSS_CROSS_ENTROPY, .clip_grad_norm = r.o.clip,
                             .accumulate = r.o.accumulate,
                             .precision = cli_precision_dtype(r.o.precision)};
    if ((s = ts_trainer_new(r.gpt, r.opt, &to, &r.tr))) {
        cli_fail(s, r.world > 1 ? "data parallelism" : "cannot set up training");
        goto out;
    }
    if (cli_apply_loss_scale(&r.scale, r.tr, r.o.precision))
        goto out;
    /* Dropout: each rank draws from a stream of its own (the same seed on every rank would
     * give row i of every rank the same mask); rank 0's is the single process's. */
    if (r.rank > 0)
        r.rng.seed = mix(r.rng.seed ^ mix(0x6a09e667f3bcc909ull * (uint64_t)r.rank));
    char arch[256];
    if (r.o.eval_only) { /* tessera eval: the checkpoint's validation loss, no step */
        double val = 0;
        if ((s = validation_loss(&r, text + ntrain, nval, T, &val))) {
            cli_fail(s, "evaluation failed");
            goto out;
        }
        if (r.o.json) {
            cJSON *j = cli_eval_record(r.o.resume, "gpt", (long long)r.step);
            cJSON_AddNumberToObject(j, "val_loss", val);
            cJSON_AddNumberToObject(j, "val_bits_per_byte", val / log(2.0));
            cJSON_AddNumberToObject(j, "val_tokens", (double)(r.o.eval_batches * r.o.batch * T));
            cli_json_line(j);
        } else {
            printf("%s (step %lld): validation loss %.4f nats, %.3f bits/byte, over %lld "
                   "windows of %lld bytes\n", r.o.resume, (long long)r.step, val, val / log(2.0),
                   (long long)(r.o.eval_batches * r.o.batch), (long long)T);
        }
        rc = 0;
        goto out;
    }
    if (r.o.json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "event", "start");
        cJSON_AddStringToObject(j, "model", "gpt");
        cJSON_AddStringToObject(j, "arch", cli_gpt_describe(&r.o.cfg, arch, sizeof arch));
        cJSON_AddNumberToObject(j, "parameters", (double)ts_module_num_params(r.gpt));
        cJSON_AddStringToObject(j, "device", ts_device_name(r.dev));
        cJSON_AddStringToObject(j, "optimizer", "adamw");
        cli_opts_record(opts, NOPTS, &r.o, j); /* the settings in use */
        cJSON_AddNumberToObject(j, "text_bytes", (double)n);
        cJSON_AddNumberToObject(j, "world_size", r.world);
        cJSON_AddBoolToObject(j, "optimizer_sharded", ts_optim_sharded(r.opt));
        cJSON_AddNumberToObject(j, "start_step", (double)r.step);
        cli_json_line(j);
    } else {
        char resumed_at[48] = "";
        if (r.o.resume)
            snprintf(resumed_at, sizeof resumed_at, " at step %lld", (long long)r.step);
        cli_printf_fit("tessera train: %s (%lld parameters) on '%s', %zu bytes of text (%zu to train, "
               "%zu to validate), batch %lld x %lld tokens, seed %llu, adamw lr %g weight decay "
               "%g, %lld warm-up steps then cosine to %g, %lld steps%s%s%s\n",
               cli_gpt_describe(&r.o.cfg, arch, sizeof arch),
               (long long)ts_module_num_params(r.gpt),
               ts_device_name(r.dev), n, ntrain, nval, (long long)r.o.batch, (long long)T,
               (unsigned long long)r.o.seed, r.o.lr, r.o.weight_decay, (long long)r.o.warmup,
               r.o.min_lr, (long long)r.o.steps, r.o.resume ? ", resumed from " : "",
               r.o.resume ? r.o.resume : "", resumed_at);
        char zt[96];
        if (r.world > 1)
            cli_printf_fit("  data parallel: %d ranks over '%s', sharing each batch's windows%s\n",
                           r.world, ts_dist_backend(), cli_sharded_text(r.opt, r.world, zt,
                                                                        sizeof zt));
        if (r.o.accumulate > 1)
            cli_printf_fit("  gradient accumulation: each batch in %lld micro-batches\n",
                   (long long)r.o.accumulate);
        if (r.o.cfg.checkpoint)
            cli_printf_fit("  activation checkpointing: each block recomputed in backward\n");
    }
    int64_t first_step = r.step;
    int64_t stop = r.o.max_steps > 0 && r.o.max_steps < r.o.steps ? r.o.max_steps : r.o.steps;
    if (r.step >= stop) {
        fprintf(stderr, "tessera: %s is at step %lld: nothing left to train up to step %lld\n",
                r.o.resume, (long long)r.step, (long long)stop);
        rc = r.step == stop ? 0 : 1;
        goto out;
    }
    cli_profile_begin(r.o.profile);
    /* progress: a bar on a terminal; elsewhere a line every --log-every steps or 30 s */
    int tty = r.rank == 0 && isatty(STDERR_FILENO) && !r.o.log_steps &&
              !(r.o.json && isatty(STDOUT_FILENO));
    r.show = r.rank == 0 && (tty || !isatty(STDERR_FILENO) || r.o.log_every > 0);
    cli_progress_init(&r.prog, tty, r.o.log_every);
    r.text = text;
    r.ntrain = ntrain;
    r.vtext = text + ntrain;
    r.nval = nval;
    r.t0 = r.started = cli_now();
    r.last_val = r.best_val = NAN;
    ts_fit_options fo = {.batch = batch_of, .steps = stop, .eval_every = r.o.eval_every,
                         .stop = cli_stop_flag(), .on_event = on_event, .user = &r};
    ts_fit_state st;
    if ((s = ts_trainer_set_steps(r.tr, r.step)) || (s = ts_fit(r.tr, &fo, &st))) {
        cli_fit_failed(r.o.profile);
        cli_progress_clear(&r.prog);
        if (st.diverged)
            fprintf(stderr, "tessera: error: the loss became %s at step %lld: training diverged "
                            "(try a smaller --lr)\n", isnan(st.loss) ? "NaN" : "infinite",
                    (long long)st.step);
        else
            cli_fail(s, r.save_failed   ? "--save"
                        : r.eval_failed ? "evaluation failed"
                                        : "training failed");
        goto out;
    }
    r.step = st.step;
    if (st.stopped) {
        cli_progress_clear(&r.prog);
        int sig = cli_stop_requested() ? cli_stop_requested() : SIGTERM;
        if (r.o.save && (s = save(&r))) {
            cli_fail(s, "--save");
            goto out;
        }
        if (r.rank == 0)
            cli_say_stopped(sig, (long long)r.step, NULL, r.o.save,
                            (const char *const[]){"--text", r.o.text, "--device",
                                                  r.o.device, "--config", config, NULL});
        r.stopped = sig;
    }
    double started = r.started, last_val = r.last_val, best_val = r.best_val;
    if (r.rank == 0)
        cli_profile_report(r.o.profile, (long long)(r.step - first_step), cli_now() - started,
                           r.o.json);
    if (r.o.json) { /* steps: cumulative */
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "event", "end");
        cJSON_AddNumberToObject(j, "steps", (double)r.step);
        cJSON_AddNumberToObject(j, "steps_this_run", (double)(r.step - first_step));
        cJSON_AddNumberToObject(j, "seconds", cli_now() - started);
        if (!isnan(last_val)) {
            cJSON_AddNumberToObject(j, "last_val_loss", last_val);
            cJSON_AddNumberToObject(j, "best_val_loss", best_val);
        }
        cli_json_str_or_null(j, "checkpoint", r.o.save);
        cli_json_str_or_null(j, "stopped_by", r.stopped ? cli_signal_name(r.stopped) : NULL);
        cli_pool_record(r.dev, j);
        cli_json_line(j);
    } else if (!r.stopped) { /* the run's summary, as the image models print it */
        char took[32], pool[200];
        cli_duration(cli_now() - started, took, sizeof took);
        cli_printf_fit("%s\n", cli_pool_summary(r.dev, pool, sizeof pool));
        char val[128] = "";
        if (!isnan(last_val))
            snprintf(val, sizeof val, "; val loss %.4f (best %.4f, %.3f bits/byte)", last_val,
                     best_val, last_val / log(2.0));
        cli_printf_fit("done: %lld steps in %s%s%s%s", (long long)(r.step - first_step), took, val,
                       r.o.save ? "; checkpoint " : "", r.o.save ? r.o.save : "");
    }
    rc = r.stopped ? 128 + r.stopped : 0;
out:
    ts_trainer_free(r.tr);
    ts_optim_free(r.opt);
    ts_checkpoint_free(r.ck);
    free(r.params);
    ts_module_free(r.gpt);
    free(text);
    r.ss.world = r.world;
    r.ss.stopped = r.stopped;
    return cli_session_end(&r.ss, rc, common);
}
