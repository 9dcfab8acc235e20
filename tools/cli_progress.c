/* tools/cli_progress.c: the training loops' progress display (tools/cli.h): a line that fits
 * the terminal's width, redrawn in place; plain lines every N steps or 30 seconds elsewhere. */
#include "config.h"

#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "cli.h"

/* A field of a progress line, in the order shown; prio 0 is kept longest. */
typedef struct cli_field {
    char text[64];
    int prio;
} cli_field;

static volatile sig_atomic_t resized = 1; /* read the width at first use */
static int cols = 80;

static void on_winch(int sig)
{
    (void)sig;
    resized = 1;
}

int cli_term_cols(void)
{
    if (resized) {
        resized = 0;
        struct winsize ws;
        if ((ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 ||
             ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0) && ws.ws_col >= 20)
            cols = ws.ws_col > 1000 ? 1000 : ws.ws_col;
    }
    return cols;
}

void cli_progress_init(cli_progress *p, int tty, int64_t log_every)
{
    /* elsewhere, the first line 5 s into the run (a quick run prints none), then every 30 s */
    *p = (cli_progress){.tty = tty, .log_every = log_every, .last = cli_now() - 25};
    if (tty) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_winch;
        sa.sa_flags = SA_RESTART;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGWINCH, &sa, NULL);
        resized = 1;
    }
}

void cli_progress_clear(cli_progress *p)
{
    if (p->tty && p->shown) {
        fprintf(stderr, "\r\033[K");
        fflush(stderr);
        p->shown = 0;
    }
}

/* The fields that fit in width (the bar, when frac >= 0, wants at least 12 columns): the
 * most important first, until the next would not fit. keep[i] says whether field i shows. */
static int fit(const cli_field *f, int n, int width, int bar, int *keep)
{
    int used = bar ? 12 : 0;
    for (int i = 0; i < n; i++)
        keep[i] = 0;
    for (int prio = 0; prio < 16; prio++)
        for (int i = 0; i < n; i++)
            if (f[i].prio == prio) {
                int w = (int)strlen(f[i].text) + 2;
                if (used + w <= width)
                    keep[i] = 1, used += w;
            }
    return used;
}

/* Shows step's progress: frac of the bar (0..1, < 0: no bar) and the fields; elsewhere than a
 * terminal, a plain line when one is due (log_every, or 30 s). */
static void show(cli_progress *p, int64_t step, double frac, const cli_field *f, int n)
{
    if (!p->tty) {
        double now = cli_now();
        int due = p->log_every > 0 ? step % p->log_every == 0 : now - p->last >= 30;
        if (!due)
            return;
        p->last = now;
        for (int i = 0; i < n; i++) { /* "epoch 1/3 batch 10/128: loss 0.41, ..." */
            size_t pl = i ? strlen(f[i - 1].text) : 0;
            fprintf(stderr, "%s%s", !i ? "" : f[i - 1].text[pl - 1] == ':' ? " " : ", ",
                    f[i].text);
        }
        fputc('\n', stderr);
        fflush(stderr);
        return;
    }
    int width = cli_term_cols() - 1; /* the last column would wrap on some terminals */
    int keep[32];
    n = n > 32 ? 32 : n;
    int used = fit(f, n, width, frac >= 0, keep);
    char line[1100] = "";
    size_t len = 0;
    if (!keep[0]) { /* not even the head fits beside the bar: the head alone, cut to fit */
        snprintf(line, sizeof line, "%.*s", width > 0 ? width : 1, f[0].text);
        fprintf(stderr, "\r%s\033[K", line);
        fflush(stderr);
        p->shown = 1;
        return;
    }
    for (int i = 0; i < n && len < sizeof line; i++) {
        if (!keep[i])
            continue;
        len += (size_t)snprintf(line + len, sizeof line - len, "%s%s", len ? "  " : "", f[i].text);
        if (i == 0 && frac >= 0 && len < sizeof line) { /* the bar after the first field */
            int bw = width - used + 12 - 4; /* what the fields left, less " [" and "]" */
            bw = bw > 40 ? 40 : bw;
            if (bw >= 8) {
                int done = (int)(frac * bw + 0.5);
                len += (size_t)snprintf(line + len, sizeof line - len, " [");
                for (int k = 0; k < bw && len + 2 < sizeof line; k++)
                    line[len++] = k < done ? '=' : k == done ? '>' : ' ';
                line[len++] = ']';
                line[len] = 0;
            }
        }
    }
    fprintf(stderr, "\r%s\033[K", line);
    fflush(stderr);
    p->shown = 1;
}

void cli_puts_fit(const char *text)
{
    int width = isatty(STDOUT_FILENO) ? cli_term_cols() - 1 : 0;
    size_t len = strlen(text);
    if (width < 8 || (int)len <= width) {
        fputs(text, stdout);
        fputc('\n', stdout);
        return;
    }
    /* break after ", " or "; " (or at a space), continuation lines indented by two */
    const char *p = text;
    int first = 1;
    while (*p) {
        int room = first ? width : width - 2;
        size_t n = strlen(p);
        if ((int)n <= room) {
            printf("%s%s\n", first ? "" : "  ", p);
            break;
        }
        int cut = -1;
        for (int i = room; i > room / 3 && cut < 0; i--)
            if ((p[i - 1] == ',' || p[i - 1] == ';') && p[i] == ' ')
                cut = i;
        for (int i = room; i > room / 3 && cut < 0; i--)
            if (p[i] == ' ')
                cut = i;
        if (cut < 0)
            cut = room;
        printf("%s%.*s\n", first ? "" : "  ", cut, p);
        p += cut;
        while (*p == ' ')
            p++;
        first = 0;
    }
}

void cli_printf_fit(const char *fmt, ...)
{
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    size_t n = strlen(buf);
    while (n && buf[n - 1] == '\n')
        buf[--n] = 0;
    cli_puts_fit(buf);
}

void cli_progress_step(cli_progress *p, int64_t step, const char *head, double frac,
                       double loss, double rate, const char *unit, double started,
                       int64_t done, int64_t left, ts_device *dev)
{
    char el[32], eta[32], b[32];
    double elapsed = cli_now() - started;
    cli_duration(elapsed, el, sizeof el);
    cli_duration(done > 0 ? elapsed / (double)done * (double)left : -1, eta, sizeof eta);
    ts_memory_stats st = {.struct_size = sizeof st};
    ts_device_memory_stats(dev, &st);
    /* shown in this order; kept longest: the head and loss, then ETA, rate, elapsed, pool */
    cli_field f[6] = {{.prio = 0}, {.prio = 0}, {.prio = 2}, {.prio = 3}, {.prio = 1},
                      {.prio = 4}};
    snprintf(f[0].text, sizeof f[0].text, "%s", head);
    snprintf(f[1].text, sizeof f[1].text, "loss %.4f", loss);
    snprintf(f[2].text, sizeof f[2].text, "%.0f %s", rate, unit);
    snprintf(f[3].text, sizeof f[3].text, "%s elapsed", el);
    snprintf(f[4].text, sizeof f[4].text, "ETA %s", eta);
    snprintf(f[5].text, sizeof f[5].text, "pool %s", cli_bytes(st.in_use, b, sizeof b));
    show(p, step, frac, f, p->tty ? 6 : 5);
}
