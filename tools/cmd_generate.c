/* tools/cmd_generate.c: `tessera generate --resume CKPT`: samples text from a checkpoint of
 * `tessera train --model gpt`, one token at a time through the key/value cache (each new
 * token costs one position). Temperature and top-k sampling from a seeded generator; the
 * text goes to stdout as the bytes it is, the figures to stderr. */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

static const char usage[] =
    "usage: tessera generate --resume CKPT [--prompt TEXT] [--tokens N] [--temperature T]\n"
    "                        [--top-k K] [--seed S] [--precision P] [--device NAME]\n"
    "\n"
    "Samples text from a checkpoint of `tessera train --model gpt`: the prompt (default a\n"
    "newline), then --tokens new bytes (default 200), each drawn from the model's next-byte\n"
    "distribution divided by --temperature (default 0.8; 0 takes the most likely byte) among\n"
    "the --top-k most likely (default 0: all), with a generator seeded by --seed (default 1).\n"
    "A key/value cache makes each new token cost one position; past the context the last half\n"
    "of it is fed again. --precision fp32 (default), bf16 or fp16: the forward under autocast\n"
    "(the matmuls in the 16-bit type; the weights stay as the checkpoint holds them). The text\n"
    "goes to stdout, the speed to stderr.\n";

static uint64_t next_u64(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The next token from logits (vocab of them): greedy at temperature 0, else sampled. */
static int64_t pick(const float *logits, int64_t vocab, double temp, int64_t top_k,
                    uint64_t *rng)
{
    int64_t best = 0;
    for (int64_t i = 1; i < vocab; i++)
        if (logits[i] > logits[best])
            best = i;
    if (temp == 0)
        return best;
    double *w = malloc(sizeof *w * (size_t)vocab);
    if (!w)
        return best;
    /* the k-th largest logit: those below it are out */
    double cut = -INFINITY;
    if (top_k > 0 && top_k < vocab) {
        for (int64_t k = 0; k < top_k; k++) {
            double m = -INFINITY;
            for (int64_t i = 0; i < vocab; i++)
                if (logits[i] > m && (k == 0 || logits[i] < cut))
                    m = logits[i];
            cut = m;
        }
    }
    double sum = 0;
    for (int64_t i = 0; i < vocab; i++) {
        w[i] = logits[i] >= cut ? exp(((double)logits[i] - logits[best]) / temp) : 0;
        sum += w[i];
    }
    double u = (double)(next_u64(rng) >> 11) * 0x1p-53 * sum;
    int64_t chosen = best;
    for (int64_t i = 0; i < vocab; i++) {
        if (u < w[i]) {
            chosen = i;
            break;
        }
        u -= w[i];
    }
    free(w);
    return chosen;
}

static void put_byte(int c, int tty)
{
    if (tty && ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f))
        printf("\\x%02x", c);
    else
        fputc(c, stdout);
}

int cmd_generate(int argc, char **argv, const cli_common *common)
{
    const char *resume = NULL, *prompt = "\n", *device = NULL, *precision = "fp32";
    int64_t tokens = 200, top_k = 0;
    double temp = 0.8;
    uint64_t seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage, stdout);
            return 0;
        } else if (!strcmp(a, "--resume") || !strcmp(a, "--prompt") || !strcmp(a, "--device")) {
            if (!v)
                return cli_usage_error("generate", "%s needs a value", a);
            *(!strcmp(a, "--resume") ? &resume : !strcmp(a, "--prompt") ? &prompt : &device) = v;
            i++;
        } else if (!strcmp(a, "--tokens")) {
            bad = cli_parse_i64("generate", a, v, 0, 1 << 24, &tokens), i++;
        } else if (!strcmp(a, "--top-k")) {
            bad = cli_parse_i64("generate", a, v, 0, 1 << 20, &top_k), i++;
        } else if (!strcmp(a, "--temperature")) {
            bad = cli_parse_double("generate", a, v, 0, 0, 100, &temp), i++;
        } else if (!strcmp(a, "--seed")) {
            bad = cli_parse_u64("generate", a, v, 0, UINT64_MAX, &seed), i++;
        } else if (!strcmp(a, "--precision")) {
            if (!(precision = cli_precision_find(v)))
                return cli_usage_error("generate", "--precision takes fp32, bf16 or fp16");
            i++;
        } else if (!strcmp(a, "--config")) {
            i++;
        } else {
            return cli_usage_error("generate", "unexpected argument '%s'", a);
        }
        if (bad)
            return 2;
    }
    if (!resume)
        return cli_usage_error("generate", "--resume CKPT is required (a checkpoint of "
                               "tessera train --model gpt)");
    const char *config = common->config;
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--config"))
            config = argv[i + 1];
    ts_status s = ts_init(config);
    if (s)
        return cli_fail(s, "cannot start tessera");
    int rc = 1;
    ts_device *dev = ts_default_device();
    ts_checkpoint *ck = NULL;
    ts_module *gpt = NULL;
    ts_gpt_cache *cache = NULL;
    ts_tensor *logits = NULL;
    float *lv = NULL;
    ts_named_tensor *params = NULL;
    if (device && (s = ts_device_get(device, &dev))) {
        cli_fail(s, "--device");
        goto out;
    }
    ts_gpt_config cfg;
    if (cli_gpt_open(resume, dev, &ck, &cfg) || cli_gpt_too_big(&cfg, 1, 0, dev))
        goto out;
    ts_rng rng;
    ts_rng_init(&rng, 0);
    if ((s = ts_gpt_new(&cfg, dev, &rng, &gpt))) {
        cli_fail(s, "generate: cannot build the model");
        goto out;
    }
    size_t np = ts_module_parameters(gpt, NULL, 0);
    if (!(params = calloc(np + 1, sizeof *params))) {
        cli_fail(TS_ENOMEM, "generate");
        goto out;
    }
    ts_module_parameters(gpt, params, np);
    if (cli_restore_model(ck, resume, params, np, NULL, 0))
        goto out;
    if (!(lv = malloc(sizeof *lv * (size_t)cfg.vocab))) {
        fprintf(stderr, "tessera: error: out of memory\n");
        goto out;
    }
    /* history: the prompt and what follows, for refeeding past the context */
    size_t plen = strlen(prompt), cap = plen + (size_t)tokens + 1, len = 0;
    unsigned char *hist = malloc(cap);
    if (!hist || !plen) {
        free(hist);
        fprintf(stderr, "tessera: error: generate: %s\n",
                plen ? "out of memory" : "the prompt is empty (give at least one byte)");
        goto out;
    }
    memcpy(hist, prompt, plen);
    len = plen;
    /* On a terminal, control bytes the model writes are shown as \xNN: a checkpoint from
     * someone else could otherwise send the terminal escape sequences (retitle it, clear it,
     * rewrite what is on screen). Redirected, the bytes are written as they are. */
    const int tty = isatty(STDOUT_FILENO);
    for (size_t i = 0; i < plen; i++)
        put_byte((unsigned char)prompt[i], tty);
    uint64_t r = seed;
    double t0 = cli_now();
    /* feed the prompt (its last context positions) */
    size_t from = len > (size_t)cfg.context ? len - (size_t)cfg.context : 0;
    if ((s = ts_gpt_cache_new(gpt, &cache))) {
        free(hist);
        cli_fail(s, "generate");
        goto out;
    }
    int ac = (s = ts_autocast_begin(cli_precision_dtype(precision))) == TS_OK;
    for (size_t i = from; i < len && !s; i++) {
        ts_tensor_unref(logits);
        logits = NULL;
        s = ts_gpt_cache_step(gpt, cache, hist[i], &logits);
    }
    for (int64_t t = 0; t < tokens && !s; t++) {
        ts_tensor *l32 = NULL; /* a 16-bit matmul's logits, as float32 */
        if (!(s = ts_cast(logits, TS_F32, &l32)))
            s = ts_tensor_to_host(l32, lv, sizeof *lv * (size_t)cfg.vocab);
        ts_tensor_unref(l32);
        if (s)
            break;
        int64_t next = pick(lv, cfg.vocab, temp, top_k, &r);
        hist[len++] = (unsigned char)next;
        put_byte((int)next, tty);
        ts_tensor_unref(logits);
        logits = NULL;
        if (t + 1 == tokens)
            break;
        if (len - from >= (size_t)cfg.context) { /* the cache is full: refeed the last half */
            ts_gpt_cache_free(cache);
            cache = NULL;
            from = len - (size_t)cfg.context / 2;
            if ((s = ts_gpt_cache_new(gpt, &cache)))
                break;
            for (size_t i = from; i + 1 < len && !s; i++) {
                ts_tensor *l = NULL;
                s = ts_gpt_cache_step(gpt, cache, hist[i], &l);
                ts_tensor_unref(l);
            }
        }
        if (!s)
            s = ts_gpt_cache_step(gpt, cache, next, &logits);
    }
    if (ac)
        ts_autocast_end();
    free(hist);
    fflush(stdout);
    if (s) {
        cli_fail(s, "generate");
        goto out;
    }
    double secs = cli_now() - t0;
    fprintf(stderr, "\ntessera generate: %lld tokens in %.2f s (%.0f tokens/s, prompt included)\n",
            (long long)tokens, secs, secs > 0 ? (double)(tokens + (int64_t)plen) / secs : 0);
    rc = 0;
out:
    free(lv);
    free(params);
    ts_tensor_unref(logits);
    ts_gpt_cache_free(cache);
    ts_module_free(gpt);
    ts_checkpoint_free(ck);
    ts_shutdown();
    return rc;
}
