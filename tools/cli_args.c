/* tools/cli_args.c: strict parsing of numeric command-line values, shared by every command.
 * A value is accepted only when all of it is a number (no empty text, no leading space or sign
 * trickery, no trailing characters), it did not overflow, it is finite, and it lies in the
 * range the option documents; otherwise the command exits 2 with a message that names the
 * option, the text and the accepted range. */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "cli.h"

/* Leading white space and a '+' are taken by strto*: refuse them, as a typo is more likely
 * than an intent. An empty value is refused too. */
/* A number as a person writes one: a digit (or a point) first, or a minus then a digit. A
 * negative number where the range has none is out of range, not "not a number". */
static int plain_start(const char *v)
{
    if (!v || !*v)
        return 0;
    if (*v == '-')
        v++;
    return (*v >= '0' && *v <= '9') || *v == '.';
}

int cli_strict_i64(const char *v, int64_t min, int64_t max, int64_t *out)
{
    char *end;
    if (!plain_start(v) || *v == '.')
        return 1;
    errno = 0;
    long long n = strtoll(v, &end, 10);
    if (*end)
        return 1;
    if (errno == ERANGE || n < min || n > max)
        return 2;
    *out = n;
    return 0;
}

int cli_strict_double(const char *v, double min, int min_open, double max, double *out)
{
    char *end;
    /* strtod takes hexadecimal (0x1p-3) too: decimal only, as documented. */
    if (!plain_start(v) || strpbrk(v, "xX"))
        return 1;
    errno = 0;
    double d = strtod(v, &end);
    if (*end)
        return 1;
    if (errno == ERANGE || !isfinite(d) || d < min || (min_open && d == min) || d > max)
        return 2;
    *out = d;
    return 0;
}

int cli_parse_i64(const char *cmd, const char *opt, const char *v, int64_t min, int64_t max,
                  int64_t *out)
{
    if (!v)
        return cli_usage_error(cmd, "%s needs a value (a whole number %lld..%lld)", opt,
                               (long long)min, (long long)max);
    int r = cli_strict_i64(v, min, max, out);
    if (r == 1)
        return cli_usage_error(cmd, "%s '%s' is not a whole number (expected %lld..%lld)", opt,
                               v, (long long)min, (long long)max);
    if (r == 2)
        return cli_usage_error(cmd, "%s '%s' is out of range: expected %lld..%lld", opt, v,
                               (long long)min, (long long)max);
    return 0;
}
int cli_strict_u64(const char *v, uint64_t min, uint64_t max, uint64_t *out)
{
    char *end;
    if (!plain_start(v) || *v == '.')
        return 1;
    if (*v == '-') { /* a whole number below 0: out of range (strtoull would wrap it) */
        long long neg = strtoll(v, &end, 10);
        return *end || neg > 0 ? 1 : 2;
    }
    errno = 0;
    unsigned long long n = strtoull(v, &end, 10);
    if (*end)
        return 1;
    if (errno == ERANGE || n < min || n > max)
        return 2;
    *out = n;
    return 0;
}

int cli_parse_u64(const char *cmd, const char *opt, const char *v, uint64_t min, uint64_t max,
                  uint64_t *out)
{
    if (!v)
        return cli_usage_error(cmd, "%s needs a value (a whole number %llu..%llu)", opt,
                               (unsigned long long)min, (unsigned long long)max);
    int r = cli_strict_u64(v, min, max, out);
    if (r == 1)
        return cli_usage_error(cmd, "%s '%s' is not a whole number (expected %llu..%llu)", opt,
                               v, (unsigned long long)min, (unsigned long long)max);
    if (r == 2)
        return cli_usage_error(cmd, "%s '%s' is out of range: expected %llu..%llu", opt, v,
                               (unsigned long long)min, (unsigned long long)max);
    return 0;
}

int cli_parse_double(const char *cmd, const char *opt, const char *v, double min, int min_open,
                     double max, double *out)
{
    const char *range_lo = min_open ? ">" : ">=";
    if (!v)
        return cli_usage_error(cmd, "%s needs a value (a finite number %s %g, at most %g)", opt,
                               range_lo, min, max);
    int r = cli_strict_double(v, min, min_open, max, out);
    if (r == 1)
        return cli_usage_error(cmd, "%s '%s' is not a number (expected a finite number %s %g, "
                               "at most %g)", opt, v, range_lo, min, max);
    if (r == 2)
        return cli_usage_error(cmd, "%s '%s' is out of range: expected a finite number %s %g, "
                               "at most %g", opt, v, range_lo, min, max);
    return 0;
}

/* ---- stopping on a signal --------------------------------------------------------------- */

static volatile sig_atomic_t stop_signal;

static void on_stop_signal(int sig)
{
    stop_signal = sig; /* SA_RESETHAND: the next one takes the default action */
}

void cli_stop_signals_install(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND | SA_RESTART;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

int cli_stop_requested(void)
{
    return (int)stop_signal;
}

const volatile sig_atomic_t *cli_stop_flag(void)
{
    return &stop_signal;
}

const char *cli_signal_name(int sig)
{
    static char buf[24];
    if (sig == SIGINT)
        return "SIGINT";
    if (sig == SIGTERM)
        return "SIGTERM";
    snprintf(buf, sizeof buf, "signal %d", sig);
    return buf;
}

const char *cli_duration(double s, char *buf, size_t len)
{
    if (!(s >= 0) || s > 1e9)
        snprintf(buf, len, "?");
    else if (s < 60)
        snprintf(buf, len, "%.1f s", s);
    else if (s < 3600)
        snprintf(buf, len, "%dm%02ds", (int)s / 60, (int)s % 60);
    else
        snprintf(buf, len, "%dh%02dm", (int)s / 3600, (int)s % 3600 / 60);
    return buf;
}

int ranks_at_same_step(int64_t step, int rank, int world, const char *ckpt)
{
    int64_t *all = calloc((size_t)world, sizeof *all);
    if (!all || ts_dist_allgather(&step, all, sizeof step) != TS_OK) {
        fprintf(stderr, "tessera: error: rank %d: comparing the resumed steps failed: %s\n",
                rank, all ? ts_last_error() : "out of memory");
        free(all);
        return 1;
    }
    int bad = -1;
    for (int r = 1; r < world && bad < 0; r++)
        if (all[r] != all[0])
            bad = r;
    if (bad >= 0)
        fprintf(stderr, "tessera: error: rank %d resumed %s at step %lld but rank 0 at step "
                "%lld: every rank must read the same checkpoint (a shared file system), or "
                "the ranks' models and optimizers would drift apart\n", bad, ckpt,
                (long long)all[bad], (long long)all[0]);
    free(all);
    return bad >= 0;
}

void cli_json_line(cJSON *o)
{
    char *text = o ? cJSON_PrintUnformatted(o) : NULL;
    if (text)
        puts(text);
    fflush(stdout);
    cJSON_free(text);
    cJSON_Delete(o);
}

void cli_json_str_or_null(struct cJSON *o, const char *key, const char *value)
{
    if (value)
        cJSON_AddStringToObject(o, key, value);
    else
        cJSON_AddNullToObject(o, key);
}

/* path with its directory resolved (symbolic links, "." and ".."): the file it names
 * whether or not it exists yet. 0 when the directory cannot be resolved. */
static int canonical(const char *path, char *out, size_t len)
{
    const char *slash = strrchr(path, '/');
    char dir[4096];
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == path)
        snprintf(dir, sizeof dir, "/");
    else
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    char *real = realpath(dir, NULL);
    if (!real)
        return 0;
    snprintf(out, len, "%s/%s", real, slash ? slash + 1 : path);
    free(real);
    return 1;
}

/* The same file: the same inode when both exist (a hard link, another spelling); else the
 * same resolved path (a file neither has written yet). */
static int same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    if (stat(a, &sa) == 0 && stat(b, &sb) == 0)
        return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    char ca[8192], cb[8192];
    if (canonical(a, ca, sizeof ca) && canonical(b, cb, sizeof cb))
        return !strcmp(ca, cb);
    return !strcmp(a, b);
}

int cli_memtrace_begin(char *trace, size_t len, const char *memtrace, const char *memplot,
                       const char *const keep[3], int rank, int world)
{
    trace[0] = 0;
    if (!memtrace && !memplot)
        return 0;
    if (memtrace) /* --memplot alone: the trace next to the picture */
        snprintf(trace, len, "%s", memtrace);
    else
        snprintf(trace, len, "%s.trace.json", memplot);
    if (world > 1) /* one file a rank */
        snprintf(trace + strlen(trace), len - strlen(trace), ".rank%d", rank);
    /* A trace or picture over a checkpoint would destroy it (the trace is created now,
     * before --resume reads it; the picture is written after --save). The files written are
     * compared, the trace by the name it gets. */
    const char *out[2] = {trace, memplot};
    static const char *const oname[2] = {"the trace", "--memplot"},
                             *kname[3] = {"--save", "--resume", "--save-initial"};
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            if (out[i] && keep[j] && same_file(out[i], keep[j])) {
                int rc = cli_usage_error("train", "%s (%s) is the file of %s %s: it would "
                                         "replace the checkpoint; give the trace and the "
                                         "picture files of their own", oname[i], out[i],
                                         kname[j], keep[j]);
                trace[0] = 0;
                return rc;
            }
    /* the picture's path is checked now, not after the run */
    ts_status ps = memplot ? ts_file_check_path(memplot, "the picture") : TS_OK;
    if (ps) {
        trace[0] = 0;
        return cli_fail(ps, "--memplot");
    }
    ts_status s = ts_memtrace_start(trace);
    if (s) {
        trace[0] = 0;
        return cli_fail(s, "--memtrace");
    }
    return 0;
}

int cli_memtrace_end(const char *trace, const char *memplot, int draw,
                     const cli_common *common)
{
    if (!trace[0])
        return 0;
    ts_memtrace_stop();
    if (!memplot || !draw)
        return 0;
    char *mv[] = {"memplot", (char *)trace, "-o", (char *)memplot, NULL};
    return cmd_memplot(4, mv, common) != 0;
}

int cli_ranks_agree(const uint64_t *mine, size_t n, const char *const *what, int rank,
                    int world)
{
    uint64_t *all = calloc((size_t)world * n, sizeof *all);
    ts_status s = all ? ts_dist_allgather(mine, all, n * sizeof *mine) : TS_ENOMEM;
    if (s) {
        if (!all)
            fprintf(stderr, "tessera: error: comparing the ranks' settings: out of memory\n");
        else
            cli_fail(s, "comparing the ranks' settings");
        free(all);
        return -1;
    }
    for (int k = 1; k < world; k++)
        for (size_t i = 0; i < n; i++)
            if (all[(size_t)k * n + i] != all[i]) {
                fprintf(stderr, "tessera: error: rank %d was started with %s than rank 0 (rank "
                        "%d of %d here); start every rank with the same command\n", k, what[i],
                        rank, world);
                free(all);
                return 1;
            }
    free(all);
    return 0;
}

/* text as one shell word: bare when it holds only safe characters, else single-quoted. */
static void put_word(char *buf, size_t len, const char *text)
{
    size_t at = strlen(buf);
    int bare = *text && strspn(text, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                     "0123456789_./:=,+-@%") == strlen(text);
    at += (size_t)snprintf(buf + at, at < len ? len - at : 0, " %s", bare ? "" : "'");
    for (const char *p = text; *p && at + 5 < len; p++) {
        if (*p == '\'') /* close the quote, an escaped quote, open again */
            at += (size_t)snprintf(buf + at, len - at, "'\\''");
        else
            buf[at++] = *p, buf[at] = 0;
    }
    if (!bare && at + 1 < len)
        snprintf(buf + at, len - at, "'");
}

void cli_say_stopped(int sig, long long step, const char *took, const char *save,
                     const char *const *keep)
{
    char cont[8192] = "tessera";
    if (save) {
        put_word(cont, sizeof cont, "train");
        put_word(cont, sizeof cont, "--resume");
        put_word(cont, sizeof cont, save);
        for (int i = 0; keep && keep[i]; i += 2)
            if (keep[i + 1]) {
                put_word(cont, sizeof cont, keep[i]);
                put_word(cont, sizeof cont, keep[i + 1]);
            }
    }
    fprintf(stderr, "tessera: %s: stopped after step %lld%s%s%s%s%s%s\n", cli_signal_name(sig),
            step, took ? " (" : "", took ? took : "", took ? " of training)" : "",
            save ? "; saved " : "; nothing saved (no --save)", save ? save : "",
            save ? "; continue with:" : "");
    if (save)
        fprintf(stderr, "  %s\n", cont);
}

void cli_kernel_name(const ts_profile_entry *e, char *buf, size_t n)
{
    const char *fn = ts_fn_name(e->op, e->fn);
    snprintf(buf, n, "%s%s%s%s%s", ts_op_name(e->op), fn ? " " : "", fn ? fn : "",
             e->dtype >= 0 ? " " : "", e->dtype >= 0 ? ts_dtype_name(e->dtype) : "");
}

void cli_profile_begin(int on)
{
    if (!on)
        return;
    ts_profile_reset();
    ts_profile_enable(1);
}

void cli_step_mark(int on, long long step, int begin)
{
    if (!on)
        return;
    char mk[48];
    snprintf(mk, sizeof mk, "step %lld", step);
    ts_memtrace_marker(mk, begin ? 2 : -2);
}

static long long step_open; /* the step whose --profile slice is open, or 0 */

void cli_fit_step(ts_fit_event ev, const ts_fit_state *st, int profile, int log_steps, int json,
                  double lr)
{
    if (ev == TS_FIT_STEP_BEGIN) {
        step_open = (long long)st->step + 1;
        cli_step_mark(profile, step_open, 1);
        ts_memtrace_step(st->step + 1);
        return;
    }
    if (ev != TS_FIT_STEP)
        return;
    cli_step_mark(profile, (long long)st->step, 0);
    step_open = 0;
    if (log_steps && json)
        printf("{\"step\": %lld, \"loss\": %.9g, \"lr\": %.9g}\n", (long long)st->step, st->loss,
               lr);
    else if (log_steps)
        printf("step %lld loss %.9g lr %.6g\n", (long long)st->step, st->loss, lr);
}

void cli_fit_failed(int profile)
{
    if (step_open)
        cli_step_mark(profile, step_open, 0);
    step_open = 0;
}

#define PROFILE_SHOWN 15

/* Evaluation apart: the counts when the pass in progress began, and the passes' sums. */
static ts_profile_entry *ev_start, *ev_sum;
static size_t ev_nstart, ev_nsum;
static int ev_passes;
static double ev_began, ev_wall; /* the pass in progress's start; the passes' wall time */

static int same_kernel(const ts_profile_entry *a, const ts_profile_entry *b)
{
    return a->op == b->op && a->fn == b->fn && a->dtype == b->dtype;
}

/* d's counts plus (sign 1) or less (sign -1) s's. */
static void add_counts(ts_profile_entry *d, const ts_profile_entry *s, int sign)
{
    d->calls += (uint64_t)sign * s->calls;
    d->seconds += sign * s->seconds;
    d->reference_calls += (uint64_t)sign * s->reference_calls;
    d->declined_calls += (uint64_t)sign * s->declined_calls;
}

/* Every entry of the profile now (*n of them), or NULL when out of memory. */
static ts_profile_entry *profile_now(size_t *n)
{
    size_t want = ts_profile_read(NULL, 0);
    ts_profile_entry *e = calloc(want + 1, sizeof *e);
    if (e) {
        size_t got = ts_profile_read(e, want);
        *n = got < want ? got : want;
    }
    return e;
}

void cli_profile_eval(int on, int begin)
{
    if (!on)
        return;
    size_t n = 0;
    ts_profile_entry *now = profile_now(&n);
    if (begin || !now) {
        free(ev_start);
        ev_start = now, ev_nstart = n;
        ev_began = cli_now();
        return;
    }
    ev_wall += cli_now() - ev_began;
    for (size_t i = 0; i < n; i++) { /* what this pass added, into the sums */
        ts_profile_entry d = now[i];
        for (size_t j = 0; j < ev_nstart; j++)
            if (same_kernel(&ev_start[j], &d))
                add_counts(&d, &ev_start[j], -1);
        if (!d.calls)
            continue;
        size_t k = 0;
        while (k < ev_nsum && !same_kernel(&ev_sum[k], &d))
            k++;
        if (k == ev_nsum) {
            ts_profile_entry *g = realloc(ev_sum, (ev_nsum + 1) * sizeof *g);
            if (!g)
                continue;
            ev_sum = g;
            ev_sum[ev_nsum++] = (ts_profile_entry){.op = d.op, .fn = d.fn, .dtype = d.dtype};
        }
        add_counts(&ev_sum[k], &d, 1);
    }
    ev_passes++;
    free(now);
    free(ev_start);
    ev_start = NULL, ev_nstart = 0;
}

static int more_time(const void *a, const void *b)
{
    const ts_profile_entry *x = a, *y = b;
    return (x->seconds < y->seconds) - (x->seconds > y->seconds);
}

/* The JSON rows of n profile entries: name, calls, milliseconds per `per` (under ms_key),
 * share of total, and the calls the reference kernels ran. */
static void kernels_json(cJSON *arr, const ts_profile_entry *e, size_t n, const char *ms_key,
                         double per, double total)
{
    char k[96];
    for (size_t i = 0; i < n; i++) {
        cJSON *it = cJSON_CreateObject();
        cli_kernel_name(&e[i], k, sizeof k);
        cJSON_AddStringToObject(it, "kernel", k);
        cJSON_AddNumberToObject(it, "calls", (double)e[i].calls);
        cJSON_AddNumberToObject(it, ms_key, e[i].seconds * 1e3 / per);
        cJSON_AddNumberToObject(it, "share", total > 0 ? e[i].seconds / total : 0);
        cJSON_AddNumberToObject(it, "reference_calls", (double)e[i].reference_calls);
        cJSON_AddNumberToObject(it, "declined_calls", (double)e[i].declined_calls);
        cJSON_AddItemToArray(arr, it);
    }
}

/* "plugin", "100% reference", "30% reference (declined)": where e's calls ran. */
static const char *ran_on(const ts_profile_entry *e, char *buf, size_t len)
{
    uint64_t ref = e->reference_calls, dec = e->declined_calls, c = e->calls;
    if (!ref && !dec)
        return "plugin";
    snprintf(buf, len, "%s%.0f%% reference%s", ref + dec < c ? "plugin, " : "",
             100.0 * (double)(ref + dec) / (double)c,
             dec ? (ref ? " (some declined)" : " (declined)") : "");
    return buf;
}

void cli_profile_report(int on, long long steps, double seconds, int json)
{
    if (!on)
        return;
    ts_profile_enable(0);
    /* every entry once (the total covers them all), the first PROFILE_SHOWN listed */
    size_t n = ts_profile_read(NULL, 0);
    ts_profile_entry *e = calloc(n ? n : 1, sizeof *e);
    if (!e) {
        cli_fail(TS_ENOMEM, "--profile");
        return;
    }
    size_t got = ts_profile_read(e, n);
    n = got < n ? got : n;
    /* the training steps' share: the totals less the evaluation passes' (and their time) */
    seconds -= ev_wall;
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < ev_nsum; j++)
            if (same_kernel(&ev_sum[j], &e[i]))
                add_counts(&e[i], &ev_sum[j], -1);
        if (e[i].calls)
            e[kept++] = e[i];
    }
    n = kept;
    qsort(e, n, sizeof *e, more_time);
    qsort(ev_sum, ev_nsum, sizeof *ev_sum, more_time);
    size_t shown = on >= 2 || n < PROFILE_SHOWN ? n : PROFILE_SHOWN; /* --profile all: all */
    size_t ev_shown = on >= 2 || ev_nsum < 5 ? ev_nsum : 5;
    double ev_total = 0, passes = ev_passes > 0 ? ev_passes : 1;
    for (size_t i = 0; i < ev_nsum; i++)
        ev_total += ev_sum[i].seconds;
    double total = 0, per = steps > 0 ? (double)steps : 1;
    for (size_t i = 0; i < n; i++)
        total += e[i].seconds;
    char k[96];
    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "event", "profile");
        cJSON_AddNumberToObject(o, "steps", (double)steps);
        cJSON_AddNumberToObject(o, "in_kernels_ms_per_step", total * 1e3 / per);
        cJSON_AddNumberToObject(o, "ms_per_step", seconds * 1e3 / per);
        kernels_json(cJSON_AddArrayToObject(o, "kernels"), e, shown, "ms_per_step", per, total);
        cJSON_AddNumberToObject(o, "eval_passes", ev_passes);
        cJSON_AddNumberToObject(o, "eval_in_kernels_ms_per_pass", ev_total * 1e3 / passes);
        kernels_json(cJSON_AddArrayToObject(o, "eval_kernels"), ev_sum, ev_shown, "ms_per_pass",
                     passes, ev_total);
        cli_json_line(o);
        free(e);
        return;
    }
    fprintf(stderr, "kernels over %lld training steps (evaluation apart, below), the most "
                    "time first:\n  %9s %7s %10s  %-28s %s\n", steps, "ms/step", "share",
            "calls/step", "kernel", "ran on");
    char where[64];
    for (size_t i = 0; i < shown; i++) {
        cli_kernel_name(&e[i], k, sizeof k);
        fprintf(stderr, "  %9.3f %6.1f%% %10.1f  %-28s %s\n", e[i].seconds * 1e3 / per,
                total > 0 ? 100 * e[i].seconds / total : 0, (double)e[i].calls / per, k,
                ran_on(&e[i], where, sizeof where));
    }
    if (n > shown)
        fprintf(stderr, "  (%zu more kernels: --profile all lists them)\n", n - shown);
    fprintf(stderr, "  %9.3f ms in kernels, of %.3f ms a step: %.3f outside them (autograd, "
                    "checks, the pool, data)\n", total * 1e3 / per, seconds * 1e3 / per,
            (seconds - total) * 1e3 / per);
    if (ev_passes) {
        fprintf(stderr, "evaluation: %d pass%s, %.3f ms in kernels each; the most time:\n",
                ev_passes, ev_passes == 1 ? "" : "es", ev_total * 1e3 / passes);
        for (size_t i = 0; i < ev_shown; i++) {
            cli_kernel_name(&ev_sum[i], k, sizeof k);
            fprintf(stderr, "  %9.3f ms %10.1f calls  %-28s %s\n",
                    ev_sum[i].seconds * 1e3 / passes, (double)ev_sum[i].calls / passes, k,
                    ran_on(&ev_sum[i], where, sizeof where));
        }
    }
    free(e);
}

const char *cli_printable(const char *s, size_t max, char *buf, size_t len)
{
    size_t n = 0;
    buf[0] = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p && n + 5 < len; p++) {
        if ((size_t)(p - (const unsigned char *)s) >= max) {
            n += (size_t)snprintf(buf + n, len - n, "...");
            break;
        }
        n += (size_t)snprintf(buf + n, len - n, *p >= 0x20 && *p < 0x7f ? "%c" : "\\x%02x", *p);
    }
    buf[n < len ? n : len - 1] = 0;
    return buf;
}

cJSON *cli_eval_record(const char *ckpt, const char *model, long long step)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "event", "eval");
    cJSON_AddStringToObject(j, "checkpoint", ckpt);
    cJSON_AddStringToObject(j, "model", model);
    cJSON_AddNumberToObject(j, "checkpoint_step", (double)step);
    return j;
}

/* Edits between a and b (optimal string alignment: insert, delete, change, swap two
 * neighbours), up to 8 characters longer than needed to tell "near" from "far". */
static int edits(const char *a, const char *b)
{
    size_t n = strlen(a), m = strlen(b);
    if (n > 32 || m > 32)
        return 99;
    int d[33][33];
    for (size_t i = 0; i <= n; i++)
        d[i][0] = (int)i;
    for (size_t j = 0; j <= m; j++)
        d[0][j] = (int)j;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            int cost = a[i - 1] != b[j - 1];
            int v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v)
                v = d[i][j - 1] + 1;
            if (d[i - 1][j - 1] + cost < v)
                v = d[i - 1][j - 1] + cost;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
        }
    return d[n][m];
}

const char *cli_did_you_mean(const char *given, const char *const *names, size_t n)
{
    const char *best = NULL;
    int best_d = 3; /* at most 2 edits, and fewer than half the word */
    for (size_t i = 0; given && i < n; i++) {
        int d = edits(given, names[i]);
        if (d < best_d && (size_t)d * 2 < strlen(names[i])) {
            best = names[i];
            best_d = d;
        }
    }
    return best;
}

/* The shortest decimal text that reads back as d ("0.05", not "0.050000000000000003"). */
static void shortest(double d, char *buf, size_t len)
{
    for (int p = 6; p <= 17; p++) {
        snprintf(buf, len, "%.*g", p, d);
        if (strtod(buf, NULL) == d)
            return;
    }
}

/* The checkpoint's value ck_text against the one given, mine: 2 after the message when k
 * refuses another value, else 0. */
static int run_key_differs(const char *path, const cli_run_key *k, const char *ck_text,
                           const char *mine)
{
    if (!k->refuse)
        return 0;
    fprintf(stderr, "tessera: error: %s was trained with %s %s, and this run gives %s %s: a "
                    "resumed run continues the checkpoint's run; resume without %s (or with "
                    "%s %s), or start a new run\n",
            path, k->opt, ck_text, k->opt, mine, k->opt, k->opt, ck_text);
    return 2;
}

/* The text of k's key in ck, or NULL with *rc set: 1 after a message when it is required. */
static const char *run_key_text(const ts_checkpoint *ck, const char *path, const cli_run_key *k,
                                int *rc)
{
    const char *t = ts_checkpoint_meta(ck, k->key);
    *rc = 0;
    if (!t && k->required) {
        fprintf(stderr, "tessera: error: %s: metadata '%s' is missing; the checkpoint is "
                        "damaged or was edited\n", path, k->key);
        *rc = 1;
    }
    return t;
}

int cli_adopt_int(const ts_checkpoint *ck, const char *path, cli_run_key k, uint64_t lo,
                  uint64_t hi, uint64_t *v)
{
    int rc;
    const char *t = run_key_text(ck, path, &k, &rc);
    uint64_t got;
    if (!t)
        return rc;
    if (cli_strict_u64(t, lo, hi, &got)) {
        char shown[200];
        fprintf(stderr, "tessera: error: %s: '%s' = '%s' is not a whole number in [%llu, %llu] "
                        "(the values %s takes); the checkpoint is damaged or was edited\n",
                path, k.key, cli_printable(t, 60, shown, sizeof shown), (unsigned long long)lo,
                (unsigned long long)hi, k.opt);
        return 1;
    }
    if (k.given && got != *v) {
        char a[32], b[32];
        snprintf(a, sizeof a, "%llu", (unsigned long long)got);
        snprintf(b, sizeof b, "%llu", (unsigned long long)*v);
        return run_key_differs(path, &k, a, b);
    }
    if (!k.given)
        *v = got;
    return 0;
}

const char *const cli_precisions[] = {"fp32", "bf16", "fp16", NULL};

const char *cli_precision_find(const char *v)
{
    for (size_t k = 0; v && cli_precisions[k]; k++)
        if (!strcmp(v, cli_precisions[k]))
            return cli_precisions[k];
    return NULL;
}

int32_t cli_precision_dtype(const char *p)
{
    return !p ? TS_F32 : !strcmp(p, "bf16") ? TS_BF16 : !strcmp(p, "fp16") ? TS_F16 : TS_F32;
}

int cli_adopt_choice(const ts_checkpoint *ck, const char *path, cli_run_key k,
                     const char *const *choices, const char **v)
{
    int rc;
    const char *t = run_key_text(ck, path, &k, &rc);
    if (!t)
        return rc;
    size_t i = 0;
    while (choices[i] && strcmp(choices[i], t))
        i++;
    if (!choices[i]) {
        char shown[200];
        fprintf(stderr, "tessera: error: %s: '%s' = '%s' is not one of the values %s takes; the "
                        "checkpoint is damaged or was edited\n",
                path, k.key, cli_printable(t, 60, shown, sizeof shown), k.opt);
        return 1;
    }
    if (k.given && strcmp(choices[i], *v))
        return run_key_differs(path, &k, choices[i], *v);
    if (!k.given)
        *v = choices[i];
    return 0;
}

int cli_adopt_f64(const ts_checkpoint *ck, const char *path, cli_run_key k, double lo,
                  int lo_open, double hi, double *v)
{
    int rc;
    const char *t = run_key_text(ck, path, &k, &rc);
    double got;
    if (!t)
        return rc;
    if (cli_strict_double(t, lo, lo_open, hi, &got)) {
        char shown[200];
        fprintf(stderr, "tessera: error: %s: '%s' = '%s' is not a number in %s%g, %g] (the "
                        "values %s takes); the checkpoint is damaged or was edited\n",
                path, k.key, cli_printable(t, 60, shown, sizeof shown), lo_open ? "(" : "[", lo,
                hi, k.opt);
        return 1;
    }
    if (k.given && got != *v) {
        char a[40], b[40];
        shortest(got, a, sizeof a);
        shortest(*v, b, sizeof b);
        return run_key_differs(path, &k, a, b);
    }
    if (!k.given)
        *v = got;
    return 0;
}
