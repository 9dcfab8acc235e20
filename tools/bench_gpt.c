/* tools/bench_gpt.c: `tessera bench gpt`: a small character-level GPT trained for many steps
 * (10,000 by default) on synthetic text, to show that memory stays flat: the process's peak
 * RSS at step 1,000 and at the end, the pool's raw allocations and tessera's host mallocs per
 * steady step (the benchmark module's counter), the pool's peak reserved bytes, and tokens
 * per second. A benchmark, not a test: it takes minutes. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char usage[] =
    "usage: tessera bench gpt [--steps N] [--context T] [--layers L] [--heads H] [--embd C]\n"
    "                         [--batch-size B] [--precision fp32|bf16|fp16] [--device NAME]\n"
    "                         [--json]\n"
    "\n"
    "Trains a GPT (default: 10000 steps, context 64, 2 layers, 2 heads, embd 64, batch 8,\n"
    "AdamW with clipping) on synthetic text and reports, at step 1000 and at the end: peak\n"
    "RSS (VmHWM), the pool's peak reserved bytes, raw pool allocations and tessera mallocs per\n"
    "step since step 100, and tokens per second. --precision: mixed precision as `tessera\n"
    "train --precision` runs it (float32 weights and optimizer state, the forward under\n"
    "autocast; fp16 with loss scaling).\n";

/* VmHWM and VmRSS of this process, kB. */
static void rss(long *hwm, long *now)
{
    *hwm = *now = -1;
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f)) {
        if (!strncmp(line, "VmHWM:", 6))
            *hwm = strtol(line + 6, NULL, 10);
        else if (!strncmp(line, "VmRSS:", 6))
            *now = strtol(line + 6, NULL, 10);
    }
    if (f)
        fclose(f);
}

typedef struct mark {
    int64_t step;
    long hwm_kb, rss_kb;
    uint64_t peak_reserved, raw, mallocs;
    double secs;
} mark;

int cli_bench_gpt(int argc, char **argv, const cli_common *common)
{
    int64_t steps = 10000, B = 8;
    ts_gpt_config cfg = {256, 64, 2, 2, 64, 0, 0};
    const char *device = NULL, *precision = "fp32";
    int json = common->json;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t *p = !strcmp(a, "--steps")        ? &steps
                     : !strcmp(a, "--context")    ? &cfg.context
                     : !strcmp(a, "--layers")     ? &cfg.layers
                     : !strcmp(a, "--heads")      ? &cfg.heads
                     : !strcmp(a, "--embd")       ? &cfg.embd
                     : !strcmp(a, "--batch-size") ? &B
                                                  : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage, stdout);
            return 0;
        } else if (p) {
            if (cli_parse_i64("bench gpt", a, v, p == &steps ? 200 : 1, p == &steps ? 10000000 : 4096,
                              p))
                return 2;
            i++;
        } else if (!strcmp(a, "--device") && v) {
            device = argv[++i];
        } else if (!strcmp(a, "--precision")) {
            if (!(precision = cli_precision_find(v)))
                return cli_usage_error("bench gpt", "--precision takes fp32, bf16 or fp16");
            i++;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else {
            return cli_usage_error("bench gpt", "unexpected argument '%s'", a);
        }
    }
    if (cfg.embd % cfg.heads)
        return cli_usage_error("bench gpt", "--embd is not a multiple of --heads");
    ts_status s = ts_init(common->config);
    if (s)
        return cli_fail(s, "cannot start tessera");
    int rc = 1;
    ts_device *dev = ts_default_device();
    ts_module *gpt = NULL;
    ts_named_tensor *params = NULL;
    ts_optim *opt = NULL;
    ts_trainer *tr = NULL;
    int64_t *xv = NULL, *yv = NULL;
    if (device && (s = ts_device_get(device, &dev))) {
        cli_fail(s, "--device");
        goto out;
    }
    ts_rng rng;
    ts_rng_init(&rng, 1);
    if ((s = ts_gpt_new(&cfg, dev, &rng, &gpt))) {
        cli_fail(s, "bench gpt");
        goto out;
    }
    size_t np = ts_module_parameters(gpt, NULL, 0);
    params = calloc(np + 1, sizeof *params);
    xv = malloc(sizeof *xv * (size_t)(B * cfg.context));
    yv = malloc(sizeof *yv * (size_t)(B * cfg.context));
    if (!params || !xv || !yv) {
        fprintf(stderr, "tessera: error: out of memory\n");
        goto out;
    }
    ts_module_parameters(gpt, params, np);
    ts_adam_options ao = {1e-3, 0.9, 0.95, 1e-8, 0.1};
    if ((s = ts_optim_adamw(params, np, &ao, &opt))) {
        cli_fail(s, "bench gpt");
        goto out;
    }
    ts_gpt_decay_groups(opt);
    ts_trainer_options to = {.loss = TS_LOSS_CROSS_ENTROPY, .clip_grad_norm = 1.0,
                             .accumulate = 1, .precision = cli_precision_dtype(precision)};
    if ((s = ts_trainer_new(gpt, opt, &to, &tr))) {
        cli_fail(s, "bench gpt");
        goto out;
    }
    const char *paths[1] = {ts_device_path(dev)};
    int counted = cli_malloc_count_setup(paths, 1);
    mark marks[2];
    int nm = 0;
    uint64_t raw0 = 0, mal0 = 0, tok0 = 0, all;
    double t0 = cli_now();
    uint64_t r = 12345;
    for (int64_t step = 0; step < steps; step++) {
        /* synthetic text: a repeating pattern with noise, so the model has something to learn */
        for (int64_t i = 0; i < B * cfg.context + B; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            int64_t tok = (i % 7) * 9 + (int64_t)((r >> 60) & 3);
            if (i < B * cfg.context)
                xv[i] = tok;
            if (i >= 1 && i - 1 < B * cfg.context)
                yv[i - 1] = tok;
        }
        ts_tensor *x = NULL, *y = NULL;
        const int64_t shape[2] = {B, cfg.context};
        if (!(s = ts_tensor_from_host(dev, TS_I64, 2, shape, xv, &x)) &&
            !(s = ts_tensor_from_host(dev, TS_I64, 2, shape, yv, &y)))
            s = ts_trainer_step(tr, x, y, NULL); /* tessera train's step */
        ts_tensor_unref(x), ts_tensor_unref(y);
        if (s) {
            cli_fail(s, "bench gpt");
            goto out;
        }
        ts_memory_stats st;
        if (step + 1 == 100) { /* steady from here: count from now on */
            ts_device_memory_stats(dev, &st);
            raw0 = st.n_raw_alloc;
            cli_malloc_count_read(&mal0, &all);
            cli_malloc_count_enable(1);
            tok0 = (uint64_t)step + 1;
            t0 = cli_now();
        }
        if (step + 1 == 1000 || step + 1 == steps) {
            ts_device_memory_stats(dev, &st);
            uint64_t mal;
            cli_malloc_count_read(&mal, &all);
            mark *m = &marks[nm < 2 ? nm++ : 1];
            m->step = step + 1;
            rss(&m->hwm_kb, &m->rss_kb);
            m->peak_reserved = st.peak_reserved;
            m->raw = st.n_raw_alloc - raw0;
            m->mallocs = mal - mal0;
            m->secs = cli_now() - t0;
        }
    }
    cli_malloc_count_enable(0);
    mark *end = &marks[nm - 1], *k = &marks[0];
    double per = (double)(end->step - (int64_t)tok0);
    double tps = per * (double)(B * cfg.context) / end->secs;
    double growth = k->hwm_kb > 0 ? 100.0 * (double)(end->hwm_kb - k->hwm_kb) / (double)k->hwm_kb
                                   : 0;
    if (json) {
        printf("{\"steps\": %lld, \"context\": %lld, \"layers\": %lld, \"embd\": %lld, "
               "\"batch_size\": %lld, \"device\": \"%s\", \"precision\": \"%s\", "
               "\"peak_rss_kb_at_1000\": %ld, "
               "\"peak_rss_kb_at_end\": %ld, \"peak_rss_growth_percent\": %.3f, "
               "\"pool_peak_reserved\": %llu, \"raw_allocs_per_step\": %.6f, "
               "\"tessera_mallocs_per_step\": %s%.6f, \"tokens_per_s\": %.0f}\n",
               (long long)steps, (long long)cfg.context, (long long)cfg.layers,
               (long long)cfg.embd, (long long)B, ts_device_name(dev), precision, k->hwm_kb,
               end->hwm_kb,
               growth, (unsigned long long)end->peak_reserved, (double)end->raw / per,
               counted ? "" : "-", counted ? (double)end->mallocs / per : 1.0, tps);
    } else {
        printf("tessera bench gpt: %lld steps, context %lld, %lld layers, embd %lld, batch %lld, "
               "%s, on '%s'\n", (long long)steps, (long long)cfg.context, (long long)cfg.layers,
               (long long)cfg.embd, (long long)B, precision, ts_device_name(dev));
        for (int i = 0; i < nm; i++)
            printf("  step %6lld: peak RSS %ld kB (now %ld kB), pool peak reserved %llu B\n",
                   (long long)marks[i].step, marks[i].hwm_kb, marks[i].rss_kb,
                   (unsigned long long)marks[i].peak_reserved);
        printf("  peak RSS from step %lld to %lld: %+.3f%%\n", (long long)k->step,
               (long long)end->step, growth);
        printf("  per step since step 100: %.6f raw pool allocations, ", (double)end->raw / per);
        if (counted)
            printf("%.6f tessera mallocs\n", (double)end->mallocs / per);
        else
            printf("tessera mallocs not counted (no benchmark module, or a sanitizer build)\n");
        printf("  %.0f tokens/s\n", tps);
    }
    rc = 0;
out:
    free(xv);
    free(yv);
    ts_trainer_free(tr);
    ts_optim_free(opt);
    free(params);
    ts_module_free(gpt);
    ts_shutdown();
    return rc;
}
