/* core/internal.h: what core files share. Never installed. Names are ts__ (double underscore)
 * and hidden from the library's exported symbols by -fvisibility=hidden. */
#ifndef TESSERA_CORE_INTERNAL_H
#define TESSERA_CORE_INTERNAL_H

#include "config.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <tessera/tessera.h>

#define TS_API __attribute__((visibility("default")))

/* Broken internal invariant: abort with file:line in every build. Never for user input. */
#define TS_ASSERT(cond)                                                                     \
    do {                                                                                    \
        if (!(cond))                                                                        \
            ts__assert_fail(#cond, __FILE__, __LINE__);                                     \
    } while (0)
_Noreturn void ts__assert_fail(const char *cond, const char *file, int line);

/* ---- status.c -------------------------------------------------------------------------- */

/* Records a printf-formatted message as this thread's last error and returns code. */
ts_status ts__fail(ts_status code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
ts_status ts__vfail(ts_status code, const char *fmt, va_list ap);
/* Prepends "prefix" to the current last error (adding context at an outer level), returns code. */
ts_status ts__fail_prefix(ts_status code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- log.c ----------------------------------------------------------------------------- */
void ts__log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ts__vlog(int level, const char *fmt, va_list ap);
/* "warn" -> TS_LOG_WARN; -1 if not a level name. */
int ts__log_level_parse(const char *name);

/* ---- config.c -------------------------------------------------------------------------- */

/* Resolves the settings of [plugin.NAME] against the plugin's declared keys plus the common
 * ones, validating unknown keys and values with file:line messages (TS_ECONFIG).
 * (transfer full) on *out: ts__settings_free. */
ts_status ts__config_plugin_settings(const ts_config *cfg, const char *name,
                                     const ts_config_key *keys, ts_setting **out, size_t *n);
void ts__settings_free(ts_setting *s, size_t n);
/* The directory of the config file, or NULL for defaults/in-memory text. (transfer none) */
const char *ts__config_dir(const ts_config *cfg);

/* ---- hostmem.c ------------------------------------------------------------------------- */
ts_status ts__host_memory(uint64_t *total, uint64_t *available);

/* ---- pool.c ---------------------------------------------------------------------------- */
extern const ts_pool_api ts__pool_api;

/* ---- util ------------------------------------------------------------------------------ */
/* getenv, but NULL in setuid/setgid programs (secure_getenv) where the platform has it. */
const char *ts__getenv(const char *name);
char *ts__strdup(const char *s);
char *ts__asprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif /* TESSERA_CORE_INTERNAL_H */
