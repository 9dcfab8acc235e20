/* tessera/config.h: the INI configuration (parsed with inih). A ts_config is an immutable,
 * validated snapshot of one file (or of the built-in defaults); docs/configuration.md lists
 * every key. */
#ifndef TESSERA_CONFIG_H
#define TESSERA_CONFIG_H

#include <stddef.h>

#include <tessera/status.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ts_config ts_config;

/* Loads and validates a configuration: the installed $(sysconfdir)/tessera/tessera.ini (if it
 * exists; $TESSERA_SYSTEM_CONFIG replaces its path, empty for none), with the user's file on
 * top of it key by key (a key the user's file sets replaces the installed value; every other
 * installed value stays), over the built-in defaults. The user's file is path when non-NULL
 * (it must exist), else $TESSERA_CONFIG (must exist if set), else
 * $XDG_CONFIG_HOME/tessera/tessera.ini (or ~/.config/tessera/tessera.ini) if it exists.
 * Within one file a key set twice is an error.
 * Errors: TS_ECONFIG naming file, line, key and the expected form; TS_EIO for an unreadable
 * file; TS_ENOMEM. (transfer full) on *out: free with ts_config_free. */
ts_status ts_config_load(const char *path, ts_config **out);

/* Same as ts_config_load for INI text in memory; name stands for the file in messages and
 * relative plugin paths resolve against base_dir (NULL: they are an error). (transfer full) */
ts_status ts_config_parse(const char *text, const char *name, const char *base_dir,
                          ts_config **out);

/* The built-in defaults (no file). (transfer full) */
ts_status ts_config_defaults(ts_config **out);

/* NULL is a no-op. */
void ts_config_free(ts_config *cfg);

/* The topmost file of the configuration (the user's when there is one), or
 * "(built-in defaults)". (transfer none) */
const char *ts_config_source(const ts_config *cfg);
/* The i-th file of the configuration, the installed one first; NULL past the last.
 * (transfer none) */
const char *ts_config_layer(const ts_config *cfg, size_t i);
/* Where section.key came from: the file that set it (NULL when no file did and its value is
 * the default) and the line in that file (0 then). For tessera info. (transfer none) */
const char *ts_config_file(const ts_config *cfg, const char *section, const char *key);
int ts_config_line(const ts_config *cfg, const char *section, const char *key);

/* The value of section.key as written in the file, or the default for [core] keys and the
 * common plugin keys (memory_fraction, cache_limit, caching); NULL if neither. Sections of
 * plugins are named "plugin.NAME". (transfer none, valid until ts_config_free) */
const char *ts_config_get(const ts_config *cfg, const char *section, const char *key);

/* Parses "512", "64K", "512M", "4G", "1T" (powers of 1024, optional trailing B/iB) into bytes.
 * TS_EINVAL on anything else or on overflow. */
ts_status ts_parse_size(const char *text, unsigned long long *bytes);

#ifdef __cplusplus
}
#endif
#endif /* TESSERA_CONFIG_H */
