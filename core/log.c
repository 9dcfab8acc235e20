/* core/log.c: the library's only way to say anything: a settable handler and a level.
 * Without a handler of the program's, warnings and errors go to stderr, one line each, so a
 * fallback to another device or a leak report never vanishes; the library never writes to
 * stdout. */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

static void to_stderr(int level, const char *message, void *user)
{
    (void)user;
    fprintf(stderr, "tessera: %s: %s\n", ts_log_level_name(level), message);
}

static ts_log_fn log_fn = to_stderr;
static void *log_user;
static atomic_int log_level = TS_LOG_WARN;

TS_API void ts_set_log_handler(ts_log_fn fn, void *user)
{
    log_fn = fn ? fn : to_stderr;
    log_user = fn ? user : NULL;
}

TS_API void ts_set_log_level(int level)
{
    atomic_store(&log_level, level);
}

TS_API int ts_log_level_get(void)
{
    return atomic_load(&log_level);
}

TS_API const char *ts_log_level_name(int level)
{
    static const char *const names[] = {"error", "warn", "info", "debug"};
    return level >= 0 && level <= TS_LOG_DEBUG ? names[level] : "unknown";
}

int ts__log_level_parse(const char *name)
{
    for (int l = TS_LOG_ERROR; l <= TS_LOG_DEBUG; l++)
        if (strcmp(name, ts_log_level_name(l)) == 0)
            return l;
    return -1;
}

void ts__vlog(int level, const char *fmt, va_list ap)
{
    ts_log_fn fn = log_fn;
    if (!fn || level > atomic_load(&log_level))
        return;
    char buf[2048];
    vsnprintf(buf, sizeof buf, fmt, ap);
    fn(level, buf, log_user);
}

void ts__log(int level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ts__vlog(level, fmt, ap);
    va_end(ap);
}
