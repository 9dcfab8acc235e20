/* core/config.c: the INI configuration. inih does the parsing; this file validates every
 * section, key and value with file:line messages, loads the installed and the user's files
 * (each passing the trust rule) as layers and answers lookups. Values and a plugin's resolved
 * settings are core/settings.c. */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <linux/magic.h>
#include <unistd.h>

#include <ini.h>


#define DEFAULTS_NAME "(built-in defaults)"

#include "config_impl.h"

/* [core] keys and their defaults. */
static const struct {
    const char *key, *def, *expected;
} core_keys[] = {
    {"device", "cpu_blas", "a plugin name such as cpu_blas, or a path to a .so"},
    {"fallback", "cpu_blas", "a plugin name or path, or empty for none"},
    {"plugin_path", "", "a colon-separated list of directories"},
    {"log_level", "warn", "one of error, warn, info, debug"},
    {"allow_insecure_plugin_path", "false", "a boolean (true/false)"},
};

/* ---- parsing ------------------------------------------------------------------------- */

typedef struct parse_state {
    ts_config *cfg;
    const char *name;
    /* the line reader */
    FILE *file;
    const char *text;
    int line;          /* number of the line the last chunk belongs to */
    int at_line_start; /* the last chunk ended with '\n' */
    int long_line;     /* first line longer than the reader's buffer */
    /* the first error */
    ts_status status;
    int err_line;
} parse_state;

static void check_section_line(parse_state *ps, const char *str);

static char *reader(char *str, int num, void *stream)
{
    parse_state *ps = stream;
    char *r;
    if (ps->file) {
        r = fgets(str, num, ps->file);
    } else {
        if (!*ps->text)
            return NULL;
        int i = 0;
        while (i < num - 1 && ps->text[i] && ps->text[i] != '\n')
            i++;
        if (i < num - 1 && ps->text[i] == '\n')
            i++;
        memcpy(str, ps->text, (size_t)i);
        str[i] = 0;
        ps->text += i;
        r = str;
    }
    if (!r)
        return NULL;
    if (ps->at_line_start)
        ps->line++;
    size_t len = strlen(str);
    ps->at_line_start = len > 0 && str[len - 1] == '\n';
    if (!ps->at_line_start && len == (size_t)num - 1 && !ps->long_line)
        ps->long_line = ps->line;
    check_section_line(ps, str);
    return r;
}

static int fail_at(parse_state *ps, ts_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail_at(parse_state *ps, ts_status code, const char *fmt, ...)
{
    if (ps->status != TS_OK)
        return 0; /* keep the first error */
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ps->status = ts__fail(code, "%s:%d: %s", ps->name, ps->line, msg);
    ps->err_line = ps->line;
    return 0;
}

static int valid_plugin_name(const char *s)
{
    if (!*s)
        return 0;
    for (; *s; s++)
        if (!(islower((unsigned char)*s) || isdigit((unsigned char)*s) || *s == '_'))
            return 0;
    return 1;
}

static int section_ok(parse_state *ps, const char *section)
{
    if (strcmp(section, "core") == 0 || strcmp(section, "dist") == 0)
        return 1;
    if (strncmp(section, "plugin.", 7) == 0) {
        if (valid_plugin_name(section + 7))
            return 1;
        return fail_at(ps, TS_ECONFIG,
                       "[%s]: plugin names are lower-case letters, digits and '_'", section);
    }
    return fail_at(ps, TS_ECONFIG, "unknown section [%s]; expected [core], [dist] or "
                   "[plugin.NAME]", section);
}

/* Remembers [plugin.NAME] at the current line, once per NAME, for
 * ts__config_check_plugin_sections (which also reports sections with no key). */
static void note_plugin_section(parse_state *ps, const char *name)
{
    ts_config *cfg = ps->cfg;
    for (size_t i = 0; i < cfg->nsec; i++)
        if (strcmp(cfg->sec[i].name, name) == 0)
            return;
    if (cfg->nsec == cfg->seccap) {
        size_t cap = cfg->seccap ? cfg->seccap * 2 : 8;
        struct plugin_section *p = ts__realloc(cfg->sec, cap * sizeof *p);
        if (!p) {
            fail_at(ps, TS_ENOMEM, "out of memory reading the configuration");
            return;
        }
        cfg->sec = p;
        cfg->seccap = cap;
    }
    if (!(cfg->sec[cfg->nsec].name = ts__strdup(name))) {
        fail_at(ps, TS_ENOMEM, "out of memory reading the configuration");
        return;
    }
    cfg->sec[cfg->nsec].layer = 0;
    cfg->sec[cfg->nsec++].line = ps->line;
}

/* inih only reports sections that hold keys; an empty misspelt section must fail too. */
static void check_section_line(parse_state *ps, const char *str)
{
    while (isspace((unsigned char)*str))
        str++;
    if (*str != '[')
        return;
    const char *end = strchr(str, ']');
    if (!end)
        return; /* inih reports the syntax error */
    char name[200];
    const char *b = str + 1;
    while (b < end && isspace((unsigned char)*b))
        b++;
    while (end > b && isspace((unsigned char)end[-1]))
        end--;
    snprintf(name, sizeof name, "%.*s", (int)(end - b), b);
    if (section_ok(ps, name) && strncmp(name, "plugin.", 7) == 0)
        note_plugin_section(ps, name + 7);
}

const entry *ts__config_find_entry(const ts_config *cfg, const char *section, const char *key)
{
    for (size_t i = 0; i < cfg->n; i++)
        if (strcmp(cfg->e[i].section, section) == 0 && strcmp(cfg->e[i].key, key) == 0)
            return &cfg->e[i];
    return NULL;
}

static int handler(void *user, const char *section, const char *key, const char *value)
{
    parse_state *ps = user;
    ts_config *cfg = ps->cfg;
    char expected[160];
    if (ps->status != TS_OK)
        return 0;
    if (strcmp(section, "core") == 0) {
        size_t i;
        for (i = 0; i < sizeof core_keys / sizeof core_keys[0]; i++)
            if (strcmp(key, core_keys[i].key) == 0)
                break;
        if (i == sizeof core_keys / sizeof core_keys[0])
            return fail_at(ps, TS_ECONFIG,
                           "[core] unknown key '%s'; known keys: device, fallback, plugin_path, "
                           "log_level, allow_insecure_plugin_path",
                           key);
        int32_t b;
        if (strcmp(key, "log_level") == 0 && ts__log_level_parse(value) < 0)
            return fail_at(ps, TS_ECONFIG, "[core] log_level = '%s': expected %s", value,
                           core_keys[i].expected);
        if (strcmp(key, "allow_insecure_plugin_path") == 0 && !ts__config_bool(value, &b))
            return fail_at(ps, TS_ECONFIG, "[core] %s = '%s': expected %s", key, value,
                           core_keys[i].expected);
        if (strcmp(key, "device") == 0 && !*value)
            return fail_at(ps, TS_ECONFIG, "[core] device is empty: expected %s",
                           core_keys[i].expected);
    } else if (strcmp(section, "dist") == 0) {
        if (strcmp(key, "hierarchical") == 0) {
            if (strcmp(value, "auto") && strcmp(value, "on") && strcmp(value, "off"))
                return fail_at(ps, TS_ECONFIG, "[dist] hierarchical = '%s': expected auto (across "
                               "machines when a job spans several), on or off", value);
        } else if (strcmp(key, "ranks_per_node") == 0) {
            char *end;
            errno = 0;
            long v = strtol(value, &end, 10);
            if (!*value || *end || errno || v < 1 || v > 65536)
                return fail_at(ps, TS_ECONFIG, "[dist] ranks_per_node = '%s': expected a whole "
                               "number from 1 to 65536 (consecutive ranks per machine; unset: "
                               "from the host names)", value);
        } else if (strcmp(key, "shard_optimizer") == 0) {
            int32_t b;
            if (!ts__config_bool(value, &b))
                return fail_at(ps, TS_ECONFIG, "[dist] shard_optimizer = '%s': expected true or "
                               "false (each rank keeping 1/N of the optimizer's state)", value);
        } else if (strcmp(key, "backend") != 0) {
            return fail_at(ps, TS_ECONFIG, "[dist] unknown key '%s'; known keys: backend, "
                           "hierarchical, ranks_per_node, shard_optimizer", key);
        } else if (!*value || strlen(value) > 64 ||
                   strspn(value, "abcdefghijklmnopqrstuvwxyz0123456789_") != strlen(value)) {
            return fail_at(ps, TS_ECONFIG, "[dist] backend = '%s': expected auto (a launcher's "
                           "backend, else none), none, or a backend name such as mpi", value);
        }
    } else if (section_ok(ps, section)) {
        for (size_t i = 0; i < TS__NCOMMON; i++) {
            if (strcmp(key, ts__common_keys[i].name) == 0) {
                ts_setting s;
                if (!ts__parse_setting(&ts__common_keys[i], value, &s, expected, sizeof expected))
                    return fail_at(ps, TS_ECONFIG, "[%s] %s = '%s': expected %s", section, key,
                                   value, expected);
            }
        }
        /* Other keys are the plugin's to declare; checked when it loads. */
    } else {
        return 0;
    }
    const entry *dup = ts__config_find_entry(cfg, section, key);
    if (dup)
        return fail_at(ps, TS_ECONFIG, "[%s] %s is set twice (first on line %d)", section, key,
                       dup->line);
    if (cfg->n == cfg->cap) {
        size_t cap = cfg->cap ? cfg->cap * 2 : 16;
        entry *e = ts__realloc(cfg->e, cap * sizeof *e);
        if (!e)
            return fail_at(ps, TS_ENOMEM, "out of memory reading the configuration");
        cfg->e = e;
        cfg->cap = cap;
    }
    entry *e = &cfg->e[cfg->n];
    e->section = ts__strdup(section);
    e->key = ts__strdup(key);
    e->value = ts__strdup(value);
    e->line = ps->line;
    e->layer = 0;
    if (!e->section || !e->key || !e->value) {
        free(e->section), free(e->key), free(e->value);
        return fail_at(ps, TS_ENOMEM, "out of memory reading the configuration");
    }
    cfg->n++;
    return 1;
}

static ts_status config_new(const char *source, const char *dir, ts_config **out)
{
    ts_config *cfg = ts__calloc(1, sizeof *cfg);
    if (!cfg)
        return ts__fail(TS_ENOMEM, "out of memory creating a configuration");
    if (!source) { /* the built-in defaults: no file */
        *out = cfg;
        return TS_OK;
    }
    cfg->nlayers = 1;
    cfg->layer[0].source = ts__strdup(source);
    cfg->layer[0].dir = dir ? ts__strdup(dir) : NULL;
    if (!cfg->layer[0].source || (dir && !cfg->layer[0].dir)) {
        ts_config_free(cfg);
        return ts__fail(TS_ENOMEM, "out of memory creating a configuration");
    }
    *out = cfg;
    return TS_OK;
}

static ts_status parse(parse_state *ps)
{
    ps->status = TS_OK;
    ps->line = 0;
    ps->at_line_start = 1;
    int r = ini_parse_stream(reader, ps, handler, ps);
    if (ps->long_line && (ps->status == TS_OK || ps->long_line <= ps->err_line))
        return ts__fail(TS_ECONFIG, "%s:%d: line too long (at most 198 characters)", ps->name,
                        ps->long_line);
    if (ps->status != TS_OK)
        return ps->status;
    if (r > 0)
        return ts__fail(TS_ECONFIG,
                        "%s:%d: syntax error: expected '[section]', 'key = value' or a comment "
                        "starting with ';' or '#'",
                        ps->name, r);
    if (r == -2)
        return ts__fail(TS_ENOMEM, "out of memory reading %s", ps->name);
    if (r != 0)
        return ts__fail(TS_EIO, "cannot read %s", ps->name);
    return TS_OK;
}

TS_API ts_status ts_config_parse(const char *text, const char *name, const char *base_dir,
                                 ts_config **out)
{
    if (!out)
        return ts__fail(TS_EINVAL, "ts_config_parse: out is NULL");
    *out = NULL;
    if (!text)
        return ts__fail(TS_EINVAL, "ts_config_parse: text is NULL");
    ts_config *cfg;
    ts_status s = config_new(name ? name : "(string)", base_dir, &cfg);
    if (s)
        return s;
    parse_state ps = {.cfg = cfg, .name = LAYER_FILE(cfg, 0), .text = text};
    s = parse(&ps);
    if (s) {
        ts_config_free(cfg);
        return s;
    }
    *out = cfg;
    return TS_OK;
}

/* A configuration file decides which code runs in this process (device, fallback,
 * plugin_path, [dist] backend), so it passes the plugins' trust rule before a byte of it is
 * read: a regular file owned by root or this user, writable by no one else, in directories
 * no one else can change. Pseudo-files (/proc, /sys and the like, whose sizes are not their
 * contents: /proc/self/mem) and files over CONFIG_MAX bytes are refused unread. */
#define CONFIG_MAX (1 << 20)

static int pseudo_fs(int fd)
{
    struct statfs fs;
    if (fstatfs(fd, &fs) != 0)
        return 0;
    switch ((unsigned long)fs.f_type) {
    case PROC_SUPER_MAGIC: case SYSFS_MAGIC: case DEBUGFS_MAGIC: case TRACEFS_MAGIC:
    case SECURITYFS_MAGIC: case CGROUP_SUPER_MAGIC: case CGROUP2_SUPER_MAGIC:
    case EFIVARFS_MAGIC: case BPF_FS_MAGIC:
        return 1;
    default:
        return 0;
    }
}

static ts_status open_trusted(const char *path, FILE **out, char **real_out)
{
    *out = NULL;
    *real_out = NULL;
    int fd;
    struct stat got, want;
    ts_status s = ts__open_input(path, "configuration file", &fd, &got);
    if (s)
        return s;
    char why[1024];
    char *real = realpath(path, NULL);
    int r = real ? ts__trust_check(real, &want, why, sizeof why) : -1;
    if (!real)
        snprintf(why, sizeof why, "cannot resolve the path: %s", strerror(errno));
    if (r == 0 && (got.st_dev != want.st_dev || got.st_ino != want.st_ino))
        r = 1, snprintf(why, sizeof why, "'%s' changed while it was being checked", real);
    if (r == 0 && pseudo_fs(fd))
        r = 1, snprintf(why, sizeof why, "it is a pseudo-file of the kernel (/proc, /sys), "
                                         "not a configuration file");
    if (r == 0 && got.st_size > CONFIG_MAX)
        r = 1, snprintf(why, sizeof why, "it is %lld bytes; a configuration file is at most "
                                         "%d", (long long)got.st_size, CONFIG_MAX);
    if (r != 0) {
        close(fd);
        free(real);
        if (r < 0)
            return ts__fail(errno == ENOMEM ? TS_ENOMEM : TS_ECONFIG,
                            "configuration file '%s': %s", path, why);
        return ts__fail(TS_ECONFIG,
                        "refusing the configuration file '%s': %s. A configuration file "
                        "chooses which plugin code runs, so it must belong to root or to you "
                        "and be writable by no one else, in directories no one else can "
                        "change; fix its ownership or permissions (chmod go-w), or name "
                        "another file",
                        path, why);
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        int err = errno;
        close(fd);
        free(real);
        return ts__fail(err == ENOMEM ? TS_ENOMEM : TS_EIO,
                        "configuration file '%s': cannot open: %s", path, strerror(err));
    }
    *out = f;
    *real_out = real;
    return TS_OK;
}

/* installed: the installed file at its built-in path, the only file that may turn the plugin
 * trust rule off. Not one $TESSERA_SYSTEM_CONFIG names: an environment a root shell kept from
 * another user (sudo -E, su without -, mpirun -x) could name any root-owned file that happens
 * to set the key, with $TESSERA_DEVICE naming that user's plugin. */
static ts_status load_file(const char *path, int installed, ts_config **out)
{
    FILE *f;
    char *abs;
    ts_status os = open_trusted(path, &f, &abs);
    if (os)
        return os;
    char *dir = ts__strdup(abs);
    if (dir) {
        char *slash = strrchr(dir, '/');
        if (slash)
            slash == dir ? (void)(slash[1] = 0) : (void)(*slash = 0);
    }
    ts_config *cfg;
    ts_status s = config_new(path, dir, &cfg);
    free(abs);
    free(dir);
    if (s) {
        fclose(f);
        return s;
    }
    parse_state ps = {.cfg = cfg, .name = LAYER_FILE(cfg, 0), .file = f};
    s = parse(&ps);
    fclose(f);
    const entry *e = s ? NULL : ts__config_find_entry(cfg, "core", "allow_insecure_plugin_path");
    int32_t on = 0;
    if (!installed && e && ts__config_bool(e->value, &on) && on)
        s = ts__fail(TS_ECONFIG,
                     "%s:%d: allow_insecure_plugin_path = %s is honoured only in the installed "
                     "configuration file (%s/tessera/tessera.ini, not one named by "
                     "$TESSERA_SYSTEM_CONFIG), which only its owner can change; remove the line "
                     "from this file",
                     path, e->line, e->value, TS_SYSCONFDIR);
    if (s) {
        ts_config_free(cfg);
        return s;
    }
    *out = cfg;
    return TS_OK;
}

TS_API ts_status ts_config_defaults(ts_config **out)
{
    if (!out)
        return ts__fail(TS_EINVAL, "ts_config_defaults: out is NULL");
    return config_new(NULL, NULL, out);
}

/* Puts upper (one file) on top of lower, key by key; upper is consumed. */
static void merge(ts_config *lower, ts_config *upper)
{
    int L = lower->nlayers++;
    lower->layer[L] = upper->layer[0];
    upper->layer[0].source = upper->layer[0].dir = NULL;
    for (size_t i = 0; i < upper->n; i++) {
        entry *u = &upper->e[i];
        entry *l = (entry *)ts__config_find_entry(lower, u->section, u->key);
        if (l) {
            free(l->value);
            l->value = u->value;
            free(u->section), free(u->key);
        } else {
            /* lower->e has room: the caller reserved upper->n more entries */
            l = &lower->e[lower->n++];
            l->section = u->section;
            l->key = u->key;
            l->value = u->value;
        }
        l->line = u->line;
        l->layer = L;
    }
    upper->n = 0;
    for (size_t i = 0; i < upper->nsec; i++) {
        struct plugin_section *u = &upper->sec[i], *l = NULL;
        for (size_t j = 0; j < lower->nsec && !l; j++)
            if (strcmp(lower->sec[j].name, u->name) == 0)
                l = &lower->sec[j];
        if (l) {
            free(u->name);
        } else {
            l = &lower->sec[lower->nsec++];
            l->name = u->name;
        }
        l->line = u->line;
        l->layer = L;
    }
    upper->nsec = 0;
    ts_config_free(upper);
}

/* Room in lower for every entry and section of upper, so that merge cannot fail. */
static ts_status reserve_for(ts_config *lower, const ts_config *upper)
{
    if (lower->n + upper->n > lower->cap) {
        entry *e = ts__realloc(lower->e, (lower->n + upper->n) * sizeof *e);
        if (!e)
            return ts__fail(TS_ENOMEM, "out of memory reading the configuration");
        lower->e = e;
        lower->cap = lower->n + upper->n;
    }
    if (lower->nsec + upper->nsec > lower->seccap) {
        struct plugin_section *p = ts__realloc(lower->sec,
                                               (lower->nsec + upper->nsec) * sizeof *p);
        if (!p)
            return ts__fail(TS_ENOMEM, "out of memory reading the configuration");
        lower->sec = p;
        lower->seccap = lower->nsec + upper->nsec;
    }
    return TS_OK;
}

/* The same file by another name (a symlink, ./x, a hard link). */
static int same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

TS_API ts_status ts_config_load(const char *path, ts_config **out)
{
    if (!out)
        return ts__fail(TS_EINVAL, "ts_config_load: out is NULL");
    *out = NULL;
    /* The user's file: --config / the argument, $TESSERA_CONFIG, or the XDG one if there. */
    char user[4096] = "", sys[4096];
    int from_env = 0;
    const char *env = ts__getenv("TESSERA_CONFIG");
    if (path && !*path)
        return ts__fail(TS_EINVAL, "the configuration file's name is empty: name a file, or "
                                   "leave the option out for the default configuration");
    if (path) {
        snprintf(user, sizeof user, "%s", path);
    } else if (env && *env) {
        snprintf(user, sizeof user, "%s", env);
        from_env = 1;
    } else {
        /* A relative $XDG_CONFIG_HOME is invalid and ignored, as the XDG specification says
         * (it would name a file under whatever directory this runs in). */
        const char *xdg = ts__getenv("XDG_CONFIG_HOME"), *home = ts__getenv("HOME");
        if (xdg && xdg[0] == '/')
            snprintf(user, sizeof user, "%s/tessera/tessera.ini", xdg);
        else if (home && home[0] == '/')
            snprintf(user, sizeof user, "%s/.config/tessera/tessera.ini", home);
        if (user[0] && access(user, F_OK) != 0)
            user[0] = 0;
    }
    /* The installed file under it ($TESSERA_SYSTEM_CONFIG replaces its path; empty: none).
     * Skipped when it does not exist; anything else there (a directory, a FIFO, no read
     * permission) is an error rather than a silently different configuration. */
    const char *senv = ts__getenv("TESSERA_SYSTEM_CONFIG");
    if (senv)
        snprintf(sys, sizeof sys, "%s", senv);
    else
        snprintf(sys, sizeof sys, "%s/tessera/tessera.ini", TS_SYSCONFDIR);
    struct stat st;
    if (sys[0] && stat(sys, &st) != 0 && errno == ENOENT)
        sys[0] = 0;
    if (sys[0] && user[0] && same_file(sys, user))
        sys[0] = 0;

    ts_config *cfg = NULL, *top = NULL;
    ts_status s;
    if (sys[0]) {
        s = load_file(sys, !senv, &cfg);
        if (s) {
            ts__fail_prefix(s, "the installed configuration: ");
            return s;
        }
    }
    if (user[0]) {
        s = load_file(user, 0, &top);
        if (s) {
            if (from_env)
                ts__fail_prefix(s, "TESSERA_CONFIG: ");
            ts_config_free(cfg);
            return s;
        }
        if (!cfg) {
            cfg = top;
        } else if ((s = reserve_for(cfg, top)) != TS_OK) {
            ts_config_free(top);
            ts_config_free(cfg);
            return s;
        } else {
            merge(cfg, top);
        }
    }
    if (!cfg)
        return ts_config_defaults(out);
    *out = cfg;
    return TS_OK;
}

TS_API void ts_config_free(ts_config *cfg)
{
    if (!cfg)
        return;
    for (size_t i = 0; i < cfg->n; i++) {
        free(cfg->e[i].section);
        free(cfg->e[i].key);
        free(cfg->e[i].value);
    }
    free(cfg->e);
    for (size_t i = 0; i < cfg->nsec; i++)
        free(cfg->sec[i].name);
    free(cfg->sec);
    for (int i = 0; i < cfg->nlayers; i++) {
        free(cfg->layer[i].source);
        free(cfg->layer[i].dir);
    }
    free(cfg);
}

TS_API const char *ts_config_source(const ts_config *cfg)
{
    return cfg && cfg->nlayers ? LAYER_FILE(cfg, cfg->nlayers - 1) : DEFAULTS_NAME;
}

TS_API const char *ts_config_layer(const ts_config *cfg, size_t i)
{
    return cfg && i < (size_t)cfg->nlayers ? LAYER_FILE(cfg, i) : NULL;
}

TS_API const char *ts_config_file(const ts_config *cfg, const char *section, const char *key)
{
    const entry *e = cfg && section && key ? ts__config_find_entry(cfg, section, key) : NULL;
    return e ? LAYER_FILE(cfg, e->layer) : NULL;
}

const char *ts__config_dir_of(const ts_config *cfg, const char *section, const char *key)
{
    const entry *e = cfg ? ts__config_find_entry(cfg, section, key) : NULL;
    return e ? cfg->layer[e->layer].dir : NULL;
}

TS_API int ts_config_line(const ts_config *cfg, const char *section, const char *key)
{
    const entry *e = cfg && section && key ? ts__config_find_entry(cfg, section, key) : NULL;
    return e ? e->line : 0;
}

TS_API const char *ts_config_get(const ts_config *cfg, const char *section, const char *key)
{
    if (!section || !key)
        return NULL;
    const entry *e = cfg ? ts__config_find_entry(cfg, section, key) : NULL;
    if (e)
        return e->value;
    if (strcmp(section, "core") == 0) {
        for (size_t i = 0; i < sizeof core_keys / sizeof core_keys[0]; i++)
            if (strcmp(key, core_keys[i].key) == 0)
                return core_keys[i].def;
    } else if (strcmp(section, "dist") == 0 && strcmp(key, "backend") == 0) {
        return "auto";
    } else if (strncmp(section, "plugin.", 7) == 0) {
        for (size_t i = 0; i < TS__NCOMMON; i++)
            if (strcmp(key, ts__common_keys[i].name) == 0)
                return ts__common_keys[i].default_value;
    }
    return NULL;
}

