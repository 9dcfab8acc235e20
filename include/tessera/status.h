/* tessera/status.h: status codes shared by the library API and the plugin ABI, and the
 * thread-local last-error message. Plain C, no dependencies: plugin.h includes it. */
#ifndef TESSERA_STATUS_H
#define TESSERA_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

/* The codes are ABI: append only, never renumber. */
#define TS_STATUS_MAP(X)                                                        \
    X(EINVAL,   -1, "invalid argument")                                         \
    X(ENOMEM,   -2, "out of memory")                                            \
    X(ESHAPE,   -3, "incompatible shapes")                                      \
    X(ENOTSUP,  -4, "operation not supported by this plugin")                   \
    X(EPLUGIN,  -5, "plugin missing, invalid or incompatible")                  \
    X(ECONFIG,  -6, "invalid configuration")                                    \
    X(EIO,      -7, "input/output error")                                       \
    X(ENODEV,   -8, "no usable device")                                         \
    X(EDTYPE,   -9, "unsupported or mismatched dtype")                          \
    X(EDEVICE, -10, "tensors on different devices")                             \
    X(ESTATE,  -11, "operation not valid in the current state")                 \
    X(ECORRUPT,-12, "corrupt or truncated data")                                \
    X(EKERNEL, -13, "a kernel failed on the device")

typedef enum ts_status {
    TS_OK = 0,
#define TS__STATUS_ENUM(name, code, text) TS_##name = (code),
    TS_STATUS_MAP(TS__STATUS_ENUM)
#undef TS__STATUS_ENUM
} ts_status;

/* "TS_ESHAPE" for a code; "TS_UNKNOWN" for one not in the list. (transfer none, static) */
const char *ts_status_name(ts_status s);

/* Short generic text for a code ("incompatible shapes"). (transfer none, static) */
const char *ts_status_text(ts_status s);

/* The message recorded by the last failing call on this thread: what went wrong and, where it
 * helps, what to do. Empty string if none. Valid until the next tessera call on this thread.
 * (transfer none) Thread safe: each thread has its own. */
const char *ts_last_error(void);

/* Forget the last error of this thread. */
void ts_clear_error(void);

/* Records a message (printf-like) as this thread's last error and returns code: for code of
 * your own that tessera calls back (a module's forward) or that reports like tessera does,
 * `return ts_fail(TS_ESHAPE, "gpt: %lld tokens, more than the context of %lld", t, c);`. */
ts_status ts_fail(ts_status code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

#ifdef __cplusplus
}
#endif
#endif /* TESSERA_STATUS_H */
