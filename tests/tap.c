/* tests/tap.c: the runner behind tap.h. Each test runs in a forked child so that a crash, an
 * abort or a hang fails that test alone; a pipe carries the failure or skip reason back, and
 * the parent watches the child's wall and CPU time to stop it and say why. */
#include "tap.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define TAP_SKIP_STATUS 77

static int report_fd = -1;
static char tmpdir[4096];
static char pathbuf[4096];

static void report(const char *prefix, const char *fmt, va_list ap)
{
    char buf[2048];
    int n = snprintf(buf, sizeof buf, "%s", prefix);
    vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    if (report_fd >= 0) {
        ssize_t w = write(report_fd, buf, strlen(buf));
        (void)w;
    } else {
        fprintf(stderr, "%s\n", buf);
    }
}

_Noreturn void tap_fail(const char *file, int line, const char *fmt, ...)
{
    char prefix[512];
    snprintf(prefix, sizeof prefix, "%s:%d: ", file, line);
    va_list ap;
    va_start(ap, fmt);
    report(prefix, fmt, ap);
    va_end(ap);
    fflush(NULL);
    _exit(1);
}

_Noreturn void tap_skip(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    report("", fmt, ap);
    va_end(ap);
    fflush(NULL);
    _exit(TAP_SKIP_STATUS);
}

const char *tap_srcdir(void)
{
    const char *s = getenv("TS_SRCDIR");
    static char buf[4096];
    snprintf(buf, sizeof buf, "%s/tests/data", s && *s ? s : ".");
    return buf;
}

const char *tap_plugin_under_test(const char *name)
{
    static __thread char buf[4200];
    const char *b = getenv("TS_BUILDDIR");
    if (strcmp(name, "cpu_onednn") != 0 || !b || !*b)
        return name;
    snprintf(buf, sizeof buf, "%s/tests/plugins/hooks/.libs/cpu_onednn.so", b);
    return access(buf, F_OK) == 0 ? buf : name;
}

void tap_on_cpu_plugins(void (*fn)(ts_device *dev, const char *name))
{
    static const char *const names[] = {"cpu_blas", "cpu_onednn"};
    for (int i = 0; i < 2; i++) {
        char *path;
        if (ts_plugin_find(NULL, names[i], &path) != TS_OK) {
            ts_clear_error();
            continue;
        }
        free(path);
        ts_device *d;
        CHECK_OK(ts_device_load(NULL, names[i], &d));
        fn(d, names[i]);
        ts_device_unload(d);
    }
}

static void rm_tmpdir(void)
{
    if (tmpdir[0]) {
        char cmd[4200];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
        int r = system(cmd);
        (void)r;
        tmpdir[0] = 0;
    }
}

const char *tap_tmpdir(void)
{
    if (!tmpdir[0]) {
        const char *base = getenv("TMPDIR");
        snprintf(tmpdir, sizeof tmpdir, "%s/tessera-test-XXXXXX", base && *base ? base : "/tmp");
        if (!mkdtemp(tmpdir))
            tap_fail(__FILE__, __LINE__, "mkdtemp: %s", strerror(errno));
        atexit(rm_tmpdir);
    }
    return tmpdir;
}

const char *tap_write_file(const char *dir, const char *name, const char *text)
{
    snprintf(pathbuf, sizeof pathbuf, "%s/%s", dir, name);
    FILE *f = fopen(pathbuf, "w");
    if (!f)
        tap_fail(__FILE__, __LINE__, "fopen %s: %s", pathbuf, strerror(errno));
    fputs(text, f);
    fclose(f);
    return pathbuf;
}

const char *tap_path_in(const char *dir, const char *name)
{
    static char bufs[64][4096];
    static int k;
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s/%s", dir, name); /* dir may be one of bufs */
    char *b = bufs[k++ % 64];
    memcpy(b, tmp, sizeof tmp);
    return b;
}

const char *tap_fixture(const char *name)
{
    const char *b = getenv("TS_BUILDDIR");
    char so[300];
    snprintf(so, sizeof so, "%s.so", name);
    const char *path = tap_path_in(tap_path_in(b ? b : ".", "tests/fixtures/.libs"), so);
    CHECK_MSG(access(path, F_OK) == 0, "fixture %s missing", path);
    return path;
}

void tap_write_bytes(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    CHECK_MSG(f, "fopen %s: %s", path, strerror(errno));
    CHECK(n == 0 || fwrite(data, 1, n, f) == n);
    CHECK(fclose(f) == 0);
}

unsigned char *tap_read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    CHECK_MSG(f, "fopen %s: %s", path, strerror(errno));
    CHECK(fseek(f, 0, SEEK_END) == 0);
    long size = ftell(f);
    CHECK(size >= 0);
    rewind(f);
    unsigned char *b = malloc((size_t)size + 1);
    CHECK(b);
    CHECK(size == 0 || fread(b, 1, (size_t)size, f) == (size_t)size);
    fclose(f);
    *n = (size_t)size;
    return b;
}

uint64_t tap_profile_calls(int32_t op, int32_t fn, int32_t dtype)
{
    ts_profile_entry e[128];
    size_t n = ts_profile_read(e, 128);
    uint64_t c = 0;
    for (size_t i = 0; i < n && i < 128; i++)
        if (e[i].op == op && (fn < 0 || e[i].fn == fn) && (dtype < 0 || e[i].dtype == dtype))
            c += e[i].calls;
    return c;
}

int tap_count_entries(const char *dir, const char *needle)
{
    DIR *d = opendir(dir);
    CHECK_MSG(d, "opendir %s: %s", dir, strerror(errno));
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += strstr(e->d_name, needle) != NULL;
    closedir(d);
    return n;
}

const char *tap_write_safetensors(const char *dir, const char *name, uint64_t hlen,
                                  const char *header, size_t data_len)
{
    const char *path = tap_path_in(dir, name);
    size_t h = strlen(header);
    unsigned char *b = malloc(8 + h + data_len + 1);
    CHECK(b);
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(hlen >> (8 * i));
    memcpy(b + 8, header, h);
    memset(b + 8 + h, 0x11, data_len);
    tap_write_bytes(path, b, 8 + h + data_len);
    free(b);
    return path;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int cpu_count(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* The load average per CPU that lim says, or the machine's (0 if it cannot tell). */
static double load_per_cpu(const tap_limits *lim)
{
    double l;
    if (lim->load >= 0)
        return lim->load;
    return getloadavg(&l, 1) == 1 ? l / cpu_count() : 0;
}

/* CPU seconds (user and system, all threads, reaped children included) the running process
 * pid has used, from /proc; -1 where there is no /proc. */
static double live_cpu_s(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    /* Fields 14-17 (utime, stime, cutime, cstime), counted after the ')' ending field 2. */
    const char *p = strrchr(buf, ')');
    unsigned long long v[4];
    if (!p || sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %llu %llu",
                     &v[0], &v[1], &v[2], &v[3]) != 4)
        return -1;
    return (double)(v[0] + v[1] + v[2] + v[3]) / (double)sysconf(_SC_CLK_TCK);
}

/* The wall limit on a machine with load per CPU: limit_s when idle, stretched when busy. */
static double wall_limit(const tap_limits *lim, double load)
{
    double stretch = load >= 1 ? 2 * load : 1;
    stretch = stretch > lim->max_stretch ? lim->max_stretch : stretch;
    return lim->limit_s * (stretch > 1 ? stretch : 1);
}

/* What a test stopped after wall seconds, with cpu seconds of CPU time, says. */
static void explain_timeout(char *out, size_t len, const tap_limits *lim, double wall, double cpu,
                            double load)
{
    int n = cpu_count();
    int k = snprintf(out, len,
                     "timed out after %.1f s wall, %.1f s CPU (limit %g s, load %.1f "
                     "on %d CPUs): ",
                     wall, cpu, lim->limit_s, load * n, n);
    if (k < 0 || (size_t)k >= len)
        return;
    /* Its whole limit in CPU time, or most of the time on a CPU of an idle machine: it ran.
     * (On a busy machine OpenMP threads spin waiting for descheduled peers, so CPU time is
     * not a measure of the work done there; less than the limit says only "starved".) */
    if (cpu >= lim->limit_s || (load < 1 && cpu >= 0.5 * wall))
        snprintf(out + k, len - k, "the test is spinning or far too slow");
    else if (load >= 1)
        snprintf(out + k, len - k,
                 "the machine is busy; raise TS_TEST_TIMEOUT or "
                 "TS_TEST_TIMEOUT_SCALE, or run fewer jobs at once");
    else
        snprintf(out + k, len - k,
                 "the test is waiting, not running: a deadlock, or a wait "
                 "for something that never comes");
}

int tap_run_one(const tap_test *t, const tap_limits *lim, char *why, size_t whylen)
{
    why[0] = 0;
    int fds[2];
    if (pipe(fds) != 0) {
        snprintf(why, whylen, "pipe: %s", strerror(errno));
        return 1;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(why, whylen, "fork: %s", strerror(errno));
        close(fds[0]);
        close(fds[1]);
        return 1;
    }
    if (pid == 0) {
        close(fds[0]);
        report_fd = fds[1];
        /* The parent stops the test; this alarm only ends a child whose parent is gone. */
        double backstop = lim->limit_s * (lim->max_stretch > 1 ? lim->max_stretch : 1) + 10;
        alarm(backstop < 1e8 ? (unsigned)backstop : 100000000u);
        t->fn();
        fflush(NULL);
        tmpdir[0] ? rm_tmpdir() : (void)0;
#if defined(__SANITIZE_ADDRESS__)
        /* _exit skips LeakSanitizer's exit-time check: run it here, so every test is
         * leak-checked on its own. */
        if (!getenv("TS_NO_LSAN_CHECK") && __lsan_do_recoverable_leak_check())
            tap_fail(__FILE__, __LINE__, "LeakSanitizer found leaks (see the log above)");
#endif
        _exit(0);
    }
    close(fds[1]);
    /* Read the report while watching the clock: past limit_s of wall time, the test is
     * stopped unless the machine is busy and the test has had less than limit_s of CPU. */
    double t0 = now_s(), wall = 0, cpu = -1, load = 0;
    int rfd = fds[0], status = 0, stopped = 0;
    size_t got = 0;
    long nap_ns = 1000000;
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    for (;;) {
        if (rfd >= 0) {
            struct pollfd p = {.fd = rfd, .events = POLLIN};
            if (poll(&p, 1, 100) > 0) {
                char sink[512];
                int full = got + 1 >= whylen; /* drain the rest so the child never blocks */
                ssize_t r =
                    full ? read(rfd, sink, sizeof sink) : read(rfd, why + got, whylen - 1 - got);
                if (r > 0 && !full)
                    got += (size_t)r;
                else if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN))
                    close(rfd), rfd = -1;
            }
        } else {
            struct timespec nap = {0, nap_ns};
            nanosleep(&nap, NULL);
            nap_ns = nap_ns < 100000000 ? 2 * nap_ns : nap_ns;
        }
        pid_t w = wait4(pid, &status, WNOHANG, &ru);
        if (w == pid)
            break;
        if (w < 0 && errno != EINTR) {
            snprintf(why, whylen, "wait4: %s", strerror(errno));
            if (rfd >= 0)
                close(rfd);
            return 1;
        }
        wall = now_s() - t0;
        if (stopped || wall < lim->limit_s)
            continue;
        load = load_per_cpu(lim);
        cpu = live_cpu_s(pid);
        if (wall < wall_limit(lim, load) && (cpu < 0 || cpu < lim->limit_s))
            continue; /* a busy machine: what counts is the CPU time the test had */
        kill(pid, SIGKILL);
        stopped = 1;
    }
    wall = now_s() - t0;
    cpu = (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
          (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
    if (rfd >= 0) {
        /* The child is gone but something it started holds the pipe: take what is there. */
        fcntl(rfd, F_SETFL, O_NONBLOCK);
        ssize_t r;
        while (got + 1 < whylen && (r = read(rfd, why + got, whylen - 1 - got)) > 0)
            got += (size_t)r;
        close(rfd);
    }
    why[got] = 0;
    if (stopped || (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)) {
        size_t l = strlen(why);
        if (!stopped)
            snprintf(why + l, whylen - l, "%skilled by signal %d (%s): ", l ? "; " : "", SIGALRM,
                     strsignal(SIGALRM));
        else if (l)
            snprintf(why + l, whylen - l, "; ");
        l = strlen(why);
        explain_timeout(why + l, whylen - l, lim, wall, cpu, stopped ? load : load_per_cpu(lim));
        return 1;
    }
    if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        size_t l = strlen(why);
        snprintf(why + l, whylen - l, "%skilled by signal %d (%s)", l ? "; " : "", sig,
                 strsignal(sig));
        return 1;
    }
    int code = WEXITSTATUS(status);
    if (code == TAP_SKIP_STATUS)
        return TAP_SKIP_STATUS;
    if (code == 0 && wall >= lim->limit_s)
        snprintf(why, whylen,
                 "took %.1f s wall, %.1f s CPU, past its %g s limit: let run on, "
                 "the machine being busy (load %.1f on %d CPUs)",
                 wall, cpu, lim->limit_s, load_per_cpu(lim) * cpu_count(), cpu_count());
    return code == 0 ? 0 : 1;
}

/* A positive number from the environment variable name, or dflt. */
static double env_positive(const char *name, double dflt)
{
    const char *v = getenv(name);
    char *end;
    double d = v && *v ? strtod(v, &end) : 0;
    return v && *v && *end == 0 && d > 0 ? d : dflt;
}

int tap_run(const tap_test *tests, size_t n, int argc, char **argv)
{
    double timeout =
        env_positive("TS_TEST_TIMEOUT", 120) * env_positive("TS_TEST_TIMEOUT_SCALE", 1);
    size_t count = 0;
    for (size_t i = 0; i < n; i++) {
        int wanted = argc <= 1;
        for (int a = 1; a < argc; a++)
            wanted |= strcmp(argv[a], tests[i].name) == 0;
        count += wanted;
    }
    printf("1..%zu\n", count);
    int failed = 0, skipped = 0, num = 0;
    for (size_t i = 0; i < n; i++) {
        int wanted = argc <= 1;
        for (int a = 1; a < argc; a++)
            wanted |= strcmp(argv[a], tests[i].name) == 0;
        if (!wanted)
            continue;
        char why[4096];
        tap_limits lim = {.limit_s = timeout * (tests[i].limit > 0 ? tests[i].limit : 1),
                          .max_stretch = TAP_MAX_STRETCH,
                          .load = -1};
        int rc = tap_run_one(&tests[i], &lim, why, sizeof why);
        ++num;
        for (char *p = why; *p; p++)
            if (*p == '\n')
                *p = ' ';
        if (rc == 0) {
            printf("ok %d - %s\n", num, tests[i].name);
            if (why[0])
                printf("# %s: %s\n", tests[i].name, why);
        } else if (rc == TAP_SKIP_STATUS) {
            printf("ok %d - %s # SKIP %s\n", num, tests[i].name, why);
            skipped++;
        } else {
            printf("not ok %d - %s\n# %s\n", num, tests[i].name, why);
            failed++;
        }
        fflush(stdout);
    }
    if (failed)
        return 1;
    if (count > 0 && skipped == (int)count && !getenv("TS_TAP_DRIVER"))
        return TAP_SKIP_STATUS;
    return 0;
}

tap_live tap_live0;

static tap_live live_now(void)
{
    tap_live l = {ts_tensor_live_count(), ts_storage_live_count(), ts_memory_live_count(),
                  ts_autograd_live_nodes()};
    return l;
}

ts_device *tap_start(void)
{
    ts_status s = ts_init(NULL);
    if (s)
        tap_fail(__FILE__, __LINE__, "ts_init: %s", ts_last_error());
    tap_live0 = live_now();
    return ts_default_device();
}

void tap_end_at(const char *file, int line)
{
    tap_live l = live_now();
    if (l.tensors != tap_live0.tensors || l.storages != tap_live0.storages ||
        l.blocks != tap_live0.blocks || l.nodes != tap_live0.nodes)
        tap_fail(file, line,
                 "leak: %llu tensors, %llu storages, %llu pool blocks, %llu graph nodes alive; "
                 "%llu, %llu, %llu, %llu at the start",
                 (unsigned long long)l.tensors, (unsigned long long)l.storages,
                 (unsigned long long)l.blocks, (unsigned long long)l.nodes,
                 (unsigned long long)tap_live0.tensors, (unsigned long long)tap_live0.storages,
                 (unsigned long long)tap_live0.blocks, (unsigned long long)tap_live0.nodes);
    ts_shutdown();
}
