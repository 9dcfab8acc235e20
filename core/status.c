/* core/status.c: status names and texts (from the X-macro list in status.h) and the
 * thread-local last-error message every failing call records. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define TS_ERRMSG_MAX 8192 /* room for a PATH_MAX path and the reason after it */

static _Thread_local char last_error[TS_ERRMSG_MAX];

TS_API const char *ts_status_name(ts_status s)
{
    switch (s) {
    case TS_OK:
        return "TS_OK";
#define X(name, code, text) \
    case TS_##name:         \
        return "TS_" #name;
        TS_STATUS_MAP(X)
#undef X
    }
    return "TS_UNKNOWN";
}

TS_API const char *ts_status_text(ts_status s)
{
    switch (s) {
    case TS_OK:
        return "success";
#define X(name, code, text) \
    case TS_##name:         \
        return text;
        TS_STATUS_MAP(X)
#undef X
    }
    return "unknown status";
}

TS_API const char *ts_last_error(void)
{
    return last_error;
}

TS_API void ts_clear_error(void)
{
    last_error[0] = '\0';
}

ts_status ts__vfail(ts_status code, const char *fmt, va_list ap)
{
    /* Formatted aside first: an argument may be ts_last_error() itself ("%s: %s", what,
     * ts_last_error()), which writing in place would overlap. */
    char msg[sizeof last_error];
    vsnprintf(msg, sizeof msg, fmt, ap);
    memcpy(last_error, msg, sizeof msg);
    return code;
}

TS_API ts_status ts_fail(ts_status code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ts__vfail(code, fmt, ap);
    va_end(ap);
    return code;
}

ts_status ts__fail(ts_status code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ts__vfail(code, fmt, ap);
    va_end(ap);
    return code;
}

ts_status ts__fail_prefix(ts_status code, const char *fmt, ...)
{
    char prefix[TS_ERRMSG_MAX], old[TS_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, last_error, sizeof old);
    snprintf(last_error, sizeof last_error, "%s%s", prefix,
             old[0] ? old : ts_status_text(code));
    return code;
}

_Noreturn void ts__assert_fail(const char *cond, const char *file, int line)
{
    fprintf(stderr, "tessera: internal error: assertion '%s' failed at %s:%d\n", cond, file,
            line);
    abort();
}

char *ts__strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = ts__malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

char *ts__asprintf(const char *fmt, ...)
{
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *s = n < 0 ? NULL : ts__malloc((size_t)n + 1);
    if (s)
        vsnprintf(s, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    return s;
}

const char *ts__getenv(const char *name)
{
#ifdef HAVE_SECURE_GETENV
    return secure_getenv(name);
#else
    return getenv(name);
#endif
}
