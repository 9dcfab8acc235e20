/* tests/tap.c: the runner behind tap.h. Each test runs in a forked child so that a crash, an
 * abort or a hang fails that test alone; a pipe carries the failure or skip reason back. */
#include "tap.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
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

static int run_one(const tap_test *t, int num, int timeout, char *why, size_t whylen)
{
    int fds[2];
    if (pipe(fds) != 0) {
        snprintf(why, whylen, "pipe: %s", strerror(errno));
        return 1;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(why, whylen, "fork: %s", strerror(errno));
        return 1;
    }
    if (pid == 0) {
        close(fds[0]);
        report_fd = fds[1];
        alarm((unsigned)timeout);
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
    size_t got = 0;
    ssize_t r;
    while (got + 1 < whylen && (r = read(fds[0], why + got, whylen - 1 - got)) > 0)
        got += (size_t)r;
    why[got] = 0;
    close(fds[0]);
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    (void)num;
    if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        size_t l = strlen(why);
        snprintf(why + l, whylen - l, "%skilled by signal %d (%s)%s", l ? "; " : "", sig,
                 strsignal(sig), sig == SIGALRM ? ": timed out" : "");
        return 1;
    }
    int code = WEXITSTATUS(status);
    if (code == TAP_SKIP_STATUS)
        return TAP_SKIP_STATUS;
    return code == 0 ? 0 : 1;
}

int tap_run(const tap_test *tests, size_t n, int argc, char **argv)
{
    const char *to = getenv("TS_TEST_TIMEOUT");
    int timeout = to && atoi(to) > 0 ? atoi(to) : 120;
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
        int rc = run_one(&tests[i], ++num, timeout, why, sizeof why);
        for (char *p = why; *p; p++)
            if (*p == '\n')
                *p = ' ';
        if (rc == 0) {
            printf("ok %d - %s\n", num, tests[i].name);
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
