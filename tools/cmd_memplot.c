/* tools/cmd_memplot.c: `tessera memplot TRACE -o mem.svg`: the memory trace of a run
 * (TESSERA_MEMTRACE, ts_memtrace_start, tessera train --memtrace) drawn as an SVG a browser
 * shows: per pool, bytes in use and reserved over time and the peak, with the run's epoch
 * marks and evaluation slices. The trace is read one event per line, as tessera writes it, so
 * a trace of any length is drawn in bounded memory per sample (16 bytes). A trace is outside
 * input: a number no run could have written (non-finite, negative, or past MAX_BYTES or
 * MAX_SECONDS) is skipped and counted, never drawn, so every label and coordinate is finite. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli.h"

static const char usage[] =
    "usage: tessera memplot TRACE [-o FILE.svg] [--steps A:B]\n"
    "\n"
    "Draws a memory trace (tessera train --memtrace TRACE, TESSERA_MEMTRACE=TRACE, or\n"
    "ts_memtrace_start) as an SVG: for every pool, the bytes in use and reserved over time and\n"
    "their peaks, the memory by role (parameters, gradients, optimizer state, data,\n"
    "activations, other) as bands, with epoch marks and evaluation slices. --steps A:B shows\n"
    "training steps A to B only, the byte axis zoomed to them. Default output: TRACE with .svg.\n";

#define MAX_POOLS 8
#define MAX_MARKS 4096
#define W 960
#define H 260 /* per pool */
#define PL 80  /* plot area: left, right, top, bottom margins */
#define PR 20
#define PT 36
#define PB 34
/* The largest byte count and time a sample may hold. 2^53 bytes (8 PiB) is past any device's
 * memory and the last integer a double holds exactly (tessera writes counts as integers); 1e9
 * seconds is 31 years of run. Past these a value is damage, and would overflow the axes. */
#define MAX_BYTES 9007199254740992.0
#define MAX_SECONDS 1e9

enum { NROLES = 6 }; /* the trace's "roles POOL" counters, stacked bottom to top */
static const char *const role_key[NROLES] = {"parameter", "gradient", "optimizer",
                                             "data",      "activation", "other"};
static const char *const role_color[NROLES] = {"#4c72b0", "#dd8452", "#55a868",
                                               "#8172b3", "#c44e52", "#b0a090"};

typedef struct series {
    char name[80];
    double *t, *in_use, *reserved;
    size_t n, cap;
    double *rt, *rv[NROLES]; /* bytes by role over time */
    size_t rn, rcap;
} series;

typedef struct mark {
    double t, t_end; /* t_end > t: a slice */
    char name[48];
} mark;

typedef struct plot {
    series pools[MAX_POOLS];
    int npools;
    mark marks[MAX_MARKS];
    int nmarks, open_slice;
    long long dropped_events; /* counter events of pools past the first MAX_POOLS */
    long long skipped;        /* events with a non-finite or out-of-range time or byte count */
    double t_max;
    int64_t step_a, step_b;   /* --steps A:B (0: the whole trace) */
    double step_ta, step_tb;  /* the times where step A began and step B + 1 began (< 0: none) */
    int64_t step_lo, step_hi; /* the steps the trace marks */
} plot;

/* The window drawn: [VT0, VT0 + VTS] seconds, and bytes from VY0 up (--steps zooms both). */
static double VT0, VTS = 1, VY0;

static double xpos(double t)
{
    return PL + (t - VT0) / VTS * (W - PL - PR);
}

static double ypos(int y0, double v, double ymax)
{
    const int ph = H - PT - PB;
    double y = (v - VY0) / (ymax - VY0);
    y = y < 0 ? 0 : y > 1.02 ? 1.02 : y;
    return y0 + PT + ph - y * ph;
}

static int add_sample(series *s, double t, double in_use, double reserved)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 1024;
        double *a = realloc(s->t, cap * sizeof *a), *b, *c;
        if (!a)
            return -1;
        s->t = a;
        if (!(b = realloc(s->in_use, cap * sizeof *b)))
            return -1;
        s->in_use = b;
        if (!(c = realloc(s->reserved, cap * sizeof *c)))
            return -1;
        s->reserved = c;
        s->cap = cap;
    }
    s->t[s->n] = t, s->in_use[s->n] = in_use, s->reserved[s->n] = reserved;
    s->n++;
    return 0;
}

static int add_roles(series *s, double t, const double *v)
{
    if (s->rn == s->rcap) {
        size_t cap = s->rcap ? s->rcap * 2 : 1024;
        double *a = realloc(s->rt, cap * sizeof *a);
        if (!a)
            return -1;
        s->rt = a;
        for (int r = 0; r < NROLES; r++) {
            double *b = realloc(s->rv[r], cap * sizeof *b);
            if (!b)
                return -1;
            s->rv[r] = b;
        }
        s->rcap = cap;
    }
    s->rt[s->rn] = t;
    for (int r = 0; r < NROLES; r++)
        s->rv[r][s->rn] = v[r];
    s->rn++;
    return 0;
}

/* The series of the pool named name: found, or made (NULL past MAX_POOLS). */
static series *pool_named(plot *p, const char *name)
{
    char key[sizeof p->pools[0].name]; /* names are kept cut to this size: compare them cut */
    snprintf(key, sizeof key, "%s", name);
    int k = 0;
    while (k < p->npools && strcmp(p->pools[k].name, key))
        k++;
    if (k == p->npools) {
        if (p->npools == MAX_POOLS)
            return NULL;
        snprintf(p->pools[p->npools++].name, sizeof p->pools[0].name, "%s", key);
    }
    return &p->pools[k];
}

/* One event line of the trace. */
static int take_event(plot *p, const cJSON *e)
{
    const cJSON *ph = cJSON_GetObjectItemCaseSensitive(e, "ph"),
                *name = cJSON_GetObjectItemCaseSensitive(e, "name"),
                *ts = cJSON_GetObjectItemCaseSensitive(e, "ts");
    if (!cJSON_IsString(ph) || !cJSON_IsString(name) || !cJSON_IsNumber(ts))
        return 0;
    double t = ts->valuedouble / 1e6;
    if (!isfinite(t) || t < 0 || t > MAX_SECONDS) {
        p->skipped++; /* not a time of this trace */
        return 0;
    }
    p->t_max = t > p->t_max ? t : p->t_max;
    if (!strcmp(ph->valuestring, "C") && !strncmp(name->valuestring, "pool ", 5)) {
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(e, "args");
        const cJSON *iu = cJSON_GetObjectItemCaseSensitive(args, "in_use"),
                    *rs = cJSON_GetObjectItemCaseSensitive(args, "reserved");
        if (!cJSON_IsNumber(iu) || !cJSON_IsNumber(rs) || !(iu->valuedouble >= 0) ||
            !(rs->valuedouble >= 0) || iu->valuedouble > MAX_BYTES ||
            rs->valuedouble > MAX_BYTES) {
            p->skipped++; /* no byte count, or not one a run could have (NaN fails >= 0) */
            return 0;
        }
        series *sr = pool_named(p, name->valuestring + 5);
        if (!sr) {
            p->dropped_events++; /* a pool past the first MAX_POOLS: said at the end */
            return 0;
        }
        return add_sample(sr, t, iu->valuedouble, rs->valuedouble);
    }
    if (!strcmp(ph->valuestring, "C") && !strcmp(name->valuestring, "step")) {
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(e, "args"), "step");
        if (!cJSON_IsNumber(st) || !(st->valuedouble >= 1) || st->valuedouble > 1e15) {
            p->skipped++;
            return 0;
        }
        int64_t n = (int64_t)st->valuedouble;
        p->step_lo = !p->step_lo || n < p->step_lo ? n : p->step_lo;
        p->step_hi = n > p->step_hi ? n : p->step_hi;
        if (n == p->step_a && p->step_ta < 0)
            p->step_ta = t;
        if (n == p->step_b + 1 && p->step_tb < 0)
            p->step_tb = t;
        return 0;
    }
    if (!strcmp(ph->valuestring, "C") && !strncmp(name->valuestring, "roles ", 6)) {
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(e, "args");
        double v[NROLES];
        for (int r = 0; r < NROLES; r++) {
            const cJSON *x = cJSON_GetObjectItemCaseSensitive(args, role_key[r]);
            v[r] = cJSON_IsNumber(x) ? x->valuedouble : 0;
            if (!(v[r] >= 0) || v[r] > MAX_BYTES) {
                p->skipped++;
                return 0;
            }
        }
        series *sr = pool_named(p, name->valuestring + 6);
        if (!sr) {
            p->dropped_events++;
            return 0;
        }
        return add_roles(sr, t, v);
    }
    if (p->nmarks == MAX_MARKS)
        return 0;
    /* Slices are the marks track's (tid 1: evaluation); a kernel track's "step N" slices
     * and kernels (--profile) are for a trace viewer, not this picture. */
    const cJSON *tid = cJSON_GetObjectItemCaseSensitive(e, "tid");
    if (cJSON_IsNumber(tid) && tid->valuedouble != 1 &&
        (!strcmp(ph->valuestring, "B") || !strcmp(ph->valuestring, "E")))
        return 0;
    if (!strcmp(ph->valuestring, "i")) { /* epoch and step marks, out-of-memory events */
        mark *m = &p->marks[p->nmarks++];
        m->t = m->t_end = t;
        snprintf(m->name, sizeof m->name, "%s", name->valuestring);
    } else if (!strcmp(ph->valuestring, "B")) { /* a slice: evaluation */
        mark *m = &p->marks[p->nmarks++];
        m->t = t, m->t_end = t;
        snprintf(m->name, sizeof m->name, "%s", name->valuestring);
        p->open_slice = p->nmarks;
    } else if (!strcmp(ph->valuestring, "E") && p->open_slice) {
        p->marks[p->open_slice - 1].t_end = t;
        p->open_slice = 0;
    }
    return 0;
}

static const char *fmt_bytes(double b, char *buf, size_t len)
{
    static const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int i = 0;
    if (!isfinite(b) || b < 0)
        b = 0; /* never drawn: take_event keeps counts in [0, MAX_BYTES] */
    while (b >= 1024 && i < 5)
        b /= 1024, i++;
    snprintf(buf, len, i ? "%.1f %s" : "%.0f %s", b, u[i]);
    return buf;
}

/* A round step for about n ticks over [0, max]: 1, 2 or 5 times a power of ten, of bytes in
 * the unit (B, KiB, MiB, ...) max is shown in when bytes, else of seconds. */
static double nice_step(double max, int n, int bytes)
{
    double unit = 1;
    while (bytes && max / unit >= 1024 && unit < 1125899906842624.0)
        unit *= 1024;
    double raw = max / unit / n, p = pow(10, floor(log10(raw > 0 ? raw : 1)));
    double m = raw / p;
    double step = (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
    return step * unit;
}

/* A tick's value: "64 MiB", "1.5 GiB" (no ".0"). */
static const char *fmt_tick(double b, char *buf, size_t len)
{
    static const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int i = 0;
    while (b >= 1024 && i < 5)
        b /= 1024, i++;
    snprintf(buf, len, "%.*f %s", b == floor(b) ? 0 : b * 10 == floor(b * 10) ? 1 : 2, b, u[i]);
    return buf;
}

/* The escaped text of s for SVG. */
static void put_text(FILE *f, const char *s)
{
    for (; *s; s++)
        if (*s == '<')
            fputs("&lt;", f);
        else if (*s == '>')
            fputs("&gt;", f);
        else if (*s == '&')
            fputs("&amp;", f);
        else if ((unsigned char)*s >= 0x20 && (unsigned char)*s < 0x7f)
            fputc(*s, f);
}

/* The envelope (largest value) of v over each of the plot's pixel columns, as a polyline. */
static void put_line(FILE *f, const series *s, const double *v, double ymax, double tmax,
                     int y0, const char *color)
{
    const int pw = W - PL - PR, ph = H - PT - PB;
    fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"", color);
    (void)tmax, (void)ph;
    size_t i = 0;
    double last = 0;
    while (i < s->n && s->t[i] < VT0) /* before the window: only the value it starts with */
        last = v[i++];
    for (int x = 0; x <= pw; x++) {
        double until = VT0 + VTS * (x + 1) / pw, best = -1;
        for (; i < s->n && s->t[i] <= until; i++)
            best = v[i] > best ? v[i] : best;
        if (best < 0)
            best = last; /* no event in this column: the value holds */
        last = i ? v[i - 1] : last;
        fprintf(f, "%d,%.1f ", PL + x, ypos(y0, best, ymax));
    }
    fputs("\"/>\n", f);
}

/* The pool's bytes by role as stacked areas: per pixel column the last counts before its
 * end, each role a band over the ones below it. */
static void put_roles(FILE *f, const series *s, double ymax, double tmax, int y0)
{
    const int pw = W - PL - PR, ph = H - PT - PB;
    if (!s->rn)
        return;
    double *cum = calloc((size_t)(pw + 1) * (NROLES + 1), sizeof *cum);
    if (!cum)
        return;
    (void)tmax;
    size_t i = 0;
    for (int x = 0; x <= pw; x++) {
        double until = VT0 + VTS * (x + 1) / pw;
        while (i < s->rn && s->rt[i] <= until)
            i++;
        double acc = 0;
        for (int r = 0; r < NROLES; r++) {
            acc += i ? s->rv[r][i - 1] : 0;
            cum[(size_t)x * (NROLES + 1) + r + 1] = acc;
        }
    }
    for (int r = 0; r < NROLES; r++) {
        fprintf(f, "<polygon fill=\"%s\" fill-opacity=\"0.45\" stroke=\"none\" points=\"",
                role_color[r]);
        for (int x = 0; x <= pw; x++)
            fprintf(f, "%d,%.1f ", PL + x, ypos(y0, cum[(size_t)x * (NROLES + 1) + r + 1], ymax));
        for (int x = pw; x >= 0; x--)
            fprintf(f, "%d,%.1f ", PL + x, ypos(y0, cum[(size_t)x * (NROLES + 1) + r], ymax));
        fputs("\"/>\n", f);
    }
    free(cum);
    for (int r = 0; r < NROLES; r++) /* the legend, under the time axis */
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"9\" height=\"9\" fill=\"%s\" "
                "fill-opacity=\"0.6\"/><text x=\"%d\" y=\"%d\">%s</text>\n",
                PL + 80 * r, y0 + PT + ph + 20, role_color[r], PL + 80 * r + 12,
                y0 + PT + ph + 28, role_key[r]);
}

static void draw(FILE *f, const plot *p)
{
    const int pw = W - PL - PR, ph = H - PT - PB;
    double tmax = p->t_max > 0 && p->t_max <= MAX_SECONDS ? p->t_max : 1;
    /* the window: the whole trace, or steps A to B (--steps) */
    VT0 = p->step_a ? p->step_ta : 0;
    VTS = (p->step_a ? (p->step_tb >= 0 ? p->step_tb : tmax) : tmax) - VT0;
    VTS = VTS > 0 ? VTS : 1e-6;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
            "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"11\">\n"
            "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            W, H * p->npools, W, H * p->npools);
    for (int k = 0; k < p->npools; k++) {
        const series *s = &p->pools[k];
        int y0 = k * H;
        double peak_in = 0, peak_res = 0, t_peak = 0, low = -1;
        for (size_t i = 0; i < s->n; i++) {
            if (s->t[i] < VT0 || s->t[i] > VT0 + VTS) /* outside the window */
                continue;
            if (s->in_use[i] > peak_in)
                peak_in = s->in_use[i], t_peak = s->t[i];
            peak_res = s->reserved[i] > peak_res ? s->reserved[i] : peak_res;
            low = low < 0 || s->in_use[i] < low ? s->in_use[i] : low;
        }
        for (size_t i = 0; i < s->rn; i++) { /* the bands' top counts too */
            if (s->rt[i] < VT0 || s->rt[i] > VT0 + VTS)
                continue;
            double sum = 0;
            for (int r = 0; r < NROLES; r++)
                sum += s->rv[r][i];
            peak_res = sum > peak_res ? sum : peak_res;
        }
        /* the axis: round ticks, the top the first tick above the highest line; zoomed on
         * steps, the bottom the last tick below the lowest in-use value */
        double top = peak_res > peak_in ? peak_res : peak_in;
        top = top > 0 && isfinite(top) ? top : 1;
        VY0 = 0;
        double ystep = nice_step(top, 4, 1);
        if (p->step_a && low > 0) {
            ystep = nice_step(top - low > 0 ? top - low : top, 4, 1);
            VY0 = floor(low / ystep) * ystep;
        }
        int nyt = (int)ceil((top - VY0) / ystep - 1e-9);
        nyt = nyt < 1 ? 1 : nyt > 12 ? 12 : nyt;
        double ymax = VY0 + ystep * nyt;
        char b1[32], b2[32];
        fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"13\" font-weight=\"bold\">pool ", PL,
                y0 + 16);
        put_text(f, s->name);
        fprintf(f, "</text>\n<text x=\"%d\" y=\"%d\" fill=\"#444\">peak in use %s, peak "
                "reserved %s, %zu memory counter events</text>\n", PL + 220, y0 + 16,
                fmt_bytes(peak_in, b1, sizeof b1), fmt_bytes(peak_res, b2, sizeof b2), s->n);
        /* evaluation slices, then epoch marks */
        double last_label = -1e9;
        for (int m = 0; m < p->nmarks; m++) { /* slices first: marks and labels go on top */
            const mark *mk = &p->marks[m];
            double x = xpos(mk->t), x2 = xpos(mk->t_end);
            x = x < PL ? PL : x, x2 = x2 > PL + pw ? PL + pw : x2;
            if (mk->t_end > mk->t && x2 > x)
                fprintf(f, "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\" "
                        "fill=\"#e8f0e0\"/>\n", x, y0 + PT, x2 - x > 1 ? x2 - x : 1, ph);
        }
        for (int m = 0; m < p->nmarks; m++) {
            const mark *mk = &p->marks[m];
            double x = xpos(mk->t);
            int oom = !strncmp(mk->name, "out of memory", 13);
            if (mk->t_end > mk->t || x < PL || x > PL + pw)
                continue;
            fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"%s\" "
                    "stroke-dasharray=\"3,3\"/>\n", x, y0 + PT, x, y0 + PT + ph,
                    oom ? "#d22" : "#bbb");
            if (x - last_label > 48 || oom) { /* labels that do not overlap */
                /* near the right edge the label ends at its mark instead of past the frame */
                int at_end = x > PL + pw - 60;
                fprintf(f, "<text x=\"%.1f\" y=\"%d\" fill=\"%s\" font-size=\"9\"%s>",
                        at_end ? x - 2 : x + 2, y0 + PT + 9, oom ? "#d22" : "#777",
                        at_end ? " text-anchor=\"end\"" : "");
                put_text(f, mk->name);
                fputs("</text>\n", f);
                last_label = x;
            }
        }
        /* axes and ticks */
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" "
                "stroke=\"#333\"/>\n", PL, y0 + PT, pw, ph);
        for (int i = 0; i <= nyt; i++) {
            double v = VY0 + ystep * i;
            double y = ypos(y0, v, ymax);
            fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", PL - 6,
                    y + 4, fmt_tick(v, b1, sizeof b1));
        }
        double tstep = nice_step(VTS, 6, 0), tfirst = ceil(VT0 / tstep - 1e-9) * tstep;
        for (int i = 0; tfirst + i * tstep <= VT0 + VTS * 1.0001 && i <= 40; i++)
            fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%g s</text>\n",
                    xpos(tfirst + i * tstep), y0 + PT + ph + 14, tfirst + i * tstep);
        put_roles(f, s, ymax, tmax, y0);
        put_line(f, s, s->reserved, ymax, tmax, y0, "#e8890c");
        put_line(f, s, s->in_use, ymax, tmax, y0, "#1f6fc5");
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#1f6fc5\" "
                "stroke-dasharray=\"6,3\" stroke-width=\"0.8\"/>\n", PL,
                ypos(y0, peak_in, ymax), PL + pw, ypos(y0, peak_in, ymax));
        /* the peak, labelled where it happens */
        if (peak_in > 0) {
            double px = xpos(t_peak), py = ypos(y0, peak_in, ymax);
            int left = px > PL + pw - 160;
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"#1f6fc5\"/>\n"
                    "<text x=\"%.1f\" y=\"%.1f\" fill=\"#1f6fc5\" font-size=\"10\"%s>peak %s "
                    "at %.3g s</text>\n", px, py, left ? px - 5 : px + 5, py - 5,
                    left ? " text-anchor=\"end\"" : "", fmt_bytes(peak_in, b1, sizeof b1),
                    t_peak);
        }
        fprintf(f, "<text x=\"%d\" y=\"%d\" fill=\"#1f6fc5\">in use</text><text x=\"%d\" "
                "y=\"%d\" fill=\"#e8890c\">reserved</text><text x=\"%d\" y=\"%d\" "
                "fill=\"#6a8a50\">eval</text>\n", PL + pw - 150, y0 + PT + ph + 28,
                PL + pw - 100, y0 + PT + ph + 28, PL + pw - 40, y0 + PT + ph + 28);
    }
    fputs("</svg>\n", f);
}

static int write_svg(FILE *f, void *user)
{
    draw(f, user);
    return 0;
}

/* The trace itself (or a hard link to it) is never written over. */
static int is_input(const char *out, const struct stat *in)
{
    struct stat st;
    return stat(out, &st) == 0 && st.st_dev == in->st_dev && st.st_ino == in->st_ino;
}

int cmd_memplot(int argc, char **argv, const cli_common *common)
{
    (void)common;
    const char *in = NULL, *out = NULL;
    int64_t step_a = 0, step_b = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(usage, stdout);
            return 0;
        } else if (!strcmp(argv[i], "-o")) {
            if (++i == argc)
                return cli_usage_error("memplot", "-o needs a FILE");
            out = argv[i];
        } else if (!strcmp(argv[i], "--steps")) {
            /* A:B, each a whole number read as strictly as any option's */
            char part[32];
            const char *colon = ++i < argc ? strchr(argv[i], ':') : NULL;
            size_t la = colon ? (size_t)(colon - argv[i]) : 0;
            int ok = colon && la < sizeof part;
            if (ok) {
                memcpy(part, argv[i], la);
                part[la] = 0;
                ok = !cli_strict_i64(part, 1, (int64_t)1e15, &step_a) &&
                     !cli_strict_i64(colon + 1, step_a, (int64_t)1e15, &step_b);
            }
            if (!ok)
                return cli_usage_error("memplot", "--steps takes A:B, the first and last "
                                       "training steps to show (1 <= A <= B)");
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return cli_usage_error("memplot", "unknown option '%s'", argv[i]);
        } else if (in) {
            return cli_usage_error("memplot", "one TRACE at a time");
        } else {
            in = argv[i];
        }
    }
    if (!in)
        return cli_usage_error("memplot", "which trace? (tessera memplot TRACE -o mem.svg)");
    char def[4096];
    if (!out) {
        size_t n = strlen(in);
        const char *dot = n > 5 && !strcmp(in + n - 5, ".json") ? in + n - 5 : in + n;
        snprintf(def, sizeof def, "%.*s.svg", (int)(dot - in), in);
        out = def;
    }
    /* A regular file only: a FIFO or a device would block or never end. */
    struct stat st;
    /* stat first: a device behind the name is never opened (a terminal would become the
     * controlling one of a session leader without O_NOCTTY) */
    int fd = stat(in, &st) != 0 ? -1
             : !S_ISREG(st.st_mode) ? (errno = EINVAL, -1)
                                     : open(in, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0 && errno == EINVAL) {
        fprintf(stderr, "tessera: error: memplot: cannot read '%s': not a regular file\n", in);
        return 1;
    }
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        fprintf(stderr, "tessera: error: memplot: cannot read '%s': %s\n", in,
                fd < 0 ? strerror(errno) : "not a regular file");
        if (fd >= 0)
            close(fd);
        return 1;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    FILE *f = fdopen(fd, "r");
    if (!f) {
        close(fd);
        return cli_fail(TS_ENOMEM, "memplot");
    }
    plot *p = calloc(1, sizeof *p);
    /* One event a line, each well under LINE_MAX bytes as tessera writes them: a longer line
     * (a huge file of zeros, say) is refused, not read whole into memory. */
    enum { LINE_MAX_BYTES = 65536 };
    char *line = malloc(LINE_MAX_BYTES + 2);
    ssize_t len;
    long long lineno = 0;
    int bad = !p || !line, events = 0, too_long = 0;
    if (p) {
        p->step_a = step_a, p->step_b = step_b;
        p->step_ta = p->step_tb = -1;
    }
    for (int c = 0; !bad && c != EOF;) {
        /* one line, counted in bytes (a NUL is a byte like any other) */
        len = 0;
        while ((c = getc(f)) != EOF && c != '\n' && len <= LINE_MAX_BYTES)
            line[len++] = (char)c;
        if (len == 0 && c == EOF)
            break;
        lineno++;
        if (len > LINE_MAX_BYTES) {
            too_long = 1;
            break;
        }
        line[len] = 0;
        if (memchr(line, 0, (size_t)len))
            continue; /* not text: no event of ours */
        while (len && (line[len - 1] == ',' || line[len - 1] == ' '))
            line[--len] = 0;
        if (len < 2 || line[0] != '{' || line[len - 1] != '}')
            continue; /* the header and the closing "]}" */
        if (!strncmp(line, "{\"displayTimeUnit\"", 18))
            continue;
        cJSON *e = cJSON_Parse(line);
        if (e) {
            bad = take_event(p, e) != 0;
            events++;
        }
        cJSON_Delete(e);
    }
    int rerr = ferror(f);
    fclose(f);
    free(line);
    int rc = 1;
    if (too_long)
        fprintf(stderr, "tessera: error: memplot: line %lld of '%s' is longer than %d bytes: "
                "not a trace of tessera's memory (--memtrace, TESSERA_MEMTRACE)\n", lineno, in,
                LINE_MAX_BYTES);
    else if (bad || rerr)
        fprintf(stderr, "tessera: error: memplot: %s\n",
                rerr ? "reading the trace failed" : "out of memory");
    else if (!p->npools)
        fprintf(stderr, "tessera: error: memplot: '%s' holds no pool counter events (%d "
                "events): is it a trace of tessera's memory (--memtrace, TESSERA_MEMTRACE)?\n",
                in, events);
    else if (p->step_a && p->step_ta < 0) {
        if (p->step_hi)
            fprintf(stderr, "tessera: error: memplot: --steps %lld:%lld: '%s' marks steps "
                    "%lld to %lld\n", (long long)p->step_a, (long long)p->step_b, in,
                    (long long)p->step_lo, (long long)p->step_hi);
        else
            fprintf(stderr, "tessera: error: memplot: --steps: '%s' marks no training steps "
                    "(a trace of tessera train marks them)\n", in);
    } else if (is_input(out, &st))
        fprintf(stderr, "tessera: error: memplot: cannot create '%s': it is the trace being "
                "drawn\n", out);
    else if (ts_file_save(out, "the picture", write_svg, p) != TS_OK)
        fprintf(stderr, "tessera: error: memplot: %s\n", ts_last_error());
    else {
        rc = 0;
        printf("%s: %d pools, %d events -> %s\n", in, p->npools, events, out);
        if (p->skipped)
            fprintf(stderr, "tessera: memplot: skipped %lld events with non-finite or "
                    "out-of-range values (times must lie in 0 to %.0f s, byte counts in 0 to "
                    "2^53): the trace is damaged or edited; the rest is drawn\n", p->skipped,
                    MAX_SECONDS);
        if (p->dropped_events)
            fprintf(stderr, "tessera: memplot: %s has more than %d pools: the first %d are "
                    "drawn, %lld events of the others are not\n", in, MAX_POOLS, MAX_POOLS,
                    p->dropped_events);
    }
    for (int k = 0; p && k < p->npools; k++) {
        free(p->pools[k].t), free(p->pools[k].in_use), free(p->pools[k].reserved);
        free(p->pools[k].rt);
        for (int r = 0; r < NROLES; r++)
            free(p->pools[k].rv[r]);
    }
    free(p);
    return rc;
}
