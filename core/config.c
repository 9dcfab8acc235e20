/* core/config.c: the INI configuration. inih does the parsing; this file validates every
 * section, key and value with file:line messages, applies defaults, and resolves the
 * [plugin.NAME] settings against the keys a plugin declares. */
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

#include "internal.h"
#include "memtrace.h"

#define DEFAULTS_NAME "(built-in defaults)"

typedef struct entry {
    char *section, *key, *value;
    int line;  /* in the file of its layer */
    int layer; /* index into ts_config.layer */
} entry;

/* The installed file, then the user's on top of it, key by key. */
#define MAX_LAYERS 2

struct ts_config {
    struct layer {
        char *source; /* file path (or the name given to ts_config_parse) */
        char *dir;    /* directory of the file, for relative plugin paths; NULL if none */
    } layer[MAX_LAYERS];
    int nlayers; /* 0: built-in defaults */
    entry *e;
    size_t n, cap;
    /* every [plugin.NAME] section header, keys or not: NAME, its first line and layer */
    struct plugin_section {
        char *name;
        int line, layer;
    } *sec;
    size_t nsec, seccap;
};

/* The file a key (or section header) was set in. */
#define LAYER_FILE(cfg, i) ((cfg)->layer[i].source)

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

/* Keys every [plugin.NAME] section has; a plugin may redeclare them to change the default. */
static const ts_config_key common_keys[] = {
    {"memory_fraction", TS_SETTING_FRACTION, "0.5", 0, 0,
     "most bytes the pool may reserve, as a share of the device's memory"},
    {"cache_limit", TS_SETTING_SIZE, "512M", 0, 0, "most bytes kept in the pool's free lists"},
    {"caching", TS_SETTING_BOOL, "true", 0, 0,
     "false returns every free to the raw allocator (for sanitizers)"},
    {"expandable_segments", TS_SETTING_BOOL, "true", 0, 0,
     "blocks over 1 MiB share one address range that grows and shrinks at its end (plugins "
     "with address-space slots)"},
};
#define NCOMMON (sizeof common_keys / sizeof common_keys[0])

/* ---- value parsing ------------------------------------------------------------------- */

TS_API ts_status ts_parse_size(const char *text, unsigned long long *bytes)
{
    if (!text || !bytes)
        return ts__fail(TS_EINVAL, "ts_parse_size: NULL argument");
    const char *p = text;
    while (isspace((unsigned char)*p))
        p++;
    if (!isdigit((unsigned char)*p))
        goto bad;
    char *end;
    errno = 0;
    long double v = strtold(p, &end);
    if (errno || end == p)
        goto bad;
    long double mult = 1;
    switch (toupper((unsigned char)*end)) {
    case 'K': mult = 1024.0L; end++; break;
    case 'M': mult = 1024.0L * 1024; end++; break;
    case 'G': mult = 1024.0L * 1024 * 1024; end++; break;
    case 'T': mult = 1024.0L * 1024 * 1024 * 1024; end++; break;
    default: break;
    }
    if (mult > 1 && toupper((unsigned char)end[0]) == 'I' && toupper((unsigned char)end[1]) == 'B')
        end += 2;
    else if (toupper((unsigned char)*end) == 'B')
        end++;
    while (isspace((unsigned char)*end))
        end++;
    if (*end)
        goto bad;
    v *= mult;
    if (!(v >= 0) || v > (long double)ULLONG_MAX)
        goto bad;
    /* 0 is a size; a positive one under a byte would silently become 0. */
    if (v > 0 && v < 1)
        return ts__fail(TS_EINVAL, "'%s' is less than one byte: write 0 for none, or at least "
                                   "1 byte", text);
    *bytes = (unsigned long long)v;
    return TS_OK;
bad:
    return ts__fail(TS_EINVAL, "'%s' is not a size: expected bytes with an optional K/M/G/T "
                               "suffix, e.g. 512M",
                    text);
}

int ts__config_bool(const char *t, int32_t *out)
{
    static const char *const yes[] = {"true", "yes", "on", "1"}, *const no[] = {"false", "no", "off", "0"};
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(t, yes[i]) == 0)
            return *out = 1, 1;
        if (strcasecmp(t, no[i]) == 0)
            return *out = 0, 1;
    }
    return 0;
}

/* Parses text as kind into s->v. On failure returns 0 and sets *expected. */
static int parse_setting(const ts_config_key *k, const char *text, ts_setting *s,
                         char *expected, size_t elen)
{
    char *end;
    switch (k->kind) {
    case TS_SETTING_STRING:
        return 1;
    case TS_SETTING_INT: {
        errno = 0;
        long long v = strtoll(text, &end, 10);
        if (!*text || *end || errno || v < k->min || v > k->max) {
            snprintf(expected, elen, "an integer from %lld to %lld", (long long)k->min,
                     (long long)k->max);
            return 0;
        }
        s->v.i = v;
        return 1;
    }
    case TS_SETTING_SIZE: {
        unsigned long long b;
        if (ts_parse_size(text, &b) != TS_OK) {
            if (strstr(ts_last_error(), "less than one byte"))
                snprintf(expected, elen, "0 or at least 1 byte (this is less than one byte, "
                         "which would round to 0)");
            else
                snprintf(expected, elen, "a size in bytes with an optional K/M/G/T suffix, "
                         "e.g. 512M");
            return 0;
        }
        s->v.size = b;
        return 1;
    }
    case TS_SETTING_FRACTION: {
        errno = 0;
        double v = strtod(text, &end);
        /* At least 1e-6: a smaller share of a device's bytes can round to a limit of 0 bytes,
         * and a 0-byte limit would mean no limit at all. */
        int digit = (*text >= '0' && *text <= '9') || *text == '.';
        if (!digit || *end || errno || !isfinite(v) || v < 1e-6 || v > 1.0) {
            snprintf(expected, elen, "a fraction in (0, 1], at least 1e-06 (a smaller one could "
                     "round the limit to 0 bytes, which would mean no limit), e.g. 0.5");
            return 0;
        }
        s->v.fraction = v;
        return 1;
    }
    case TS_SETTING_BOOL:
        if (!ts__config_bool(text, &s->v.boolean)) {
            snprintf(expected, elen, "a boolean: true/false, yes/no, on/off or 1/0");
            return 0;
        }
        return 1;
    }
    snprintf(expected, elen, "a value of a kind this tessera does not know (%d)", (int)k->kind);
    return 0;
}

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

static const entry *find_entry(const ts_config *cfg, const char *section, const char *key)
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
        if (strcmp(key, "backend") != 0)
            return fail_at(ps, TS_ECONFIG, "[dist] unknown key '%s'; known keys: backend", key);
        if (!*value || strlen(value) > 64 ||
            strspn(value, "abcdefghijklmnopqrstuvwxyz0123456789_") != strlen(value))
            return fail_at(ps, TS_ECONFIG, "[dist] backend = '%s': expected auto (a launcher's "
                           "backend, else none), none, or a backend name such as mpi", value);
    } else if (section_ok(ps, section)) {
        for (size_t i = 0; i < NCOMMON; i++) {
            if (strcmp(key, common_keys[i].name) == 0) {
                ts_setting s;
                if (!parse_setting(&common_keys[i], value, &s, expected, sizeof expected))
                    return fail_at(ps, TS_ECONFIG, "[%s] %s = '%s': expected %s", section, key,
                                   value, expected);
            }
        }
        /* Other keys are the plugin's to declare; checked when it loads. */
    } else {
        return 0;
    }
    const entry *dup = find_entry(cfg, section, key);
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
    const entry *e = s ? NULL : find_entry(cfg, "core", "allow_insecure_plugin_path");
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
        entry *l = (entry *)find_entry(lower, u->section, u->key);
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
    const entry *e = cfg && section && key ? find_entry(cfg, section, key) : NULL;
    return e ? LAYER_FILE(cfg, e->layer) : NULL;
}

const char *ts__config_dir_of(const ts_config *cfg, const char *section, const char *key)
{
    const entry *e = cfg ? find_entry(cfg, section, key) : NULL;
    return e ? cfg->layer[e->layer].dir : NULL;
}

TS_API int ts_config_line(const ts_config *cfg, const char *section, const char *key)
{
    const entry *e = cfg && section && key ? find_entry(cfg, section, key) : NULL;
    return e ? e->line : 0;
}

TS_API const char *ts_config_get(const ts_config *cfg, const char *section, const char *key)
{
    if (!section || !key)
        return NULL;
    const entry *e = cfg ? find_entry(cfg, section, key) : NULL;
    if (e)
        return e->value;
    if (strcmp(section, "core") == 0) {
        for (size_t i = 0; i < sizeof core_keys / sizeof core_keys[0]; i++)
            if (strcmp(key, core_keys[i].key) == 0)
                return core_keys[i].def;
    } else if (strcmp(section, "dist") == 0 && strcmp(key, "backend") == 0) {
        return "auto";
    } else if (strncmp(section, "plugin.", 7) == 0) {
        for (size_t i = 0; i < NCOMMON; i++)
            if (strcmp(key, common_keys[i].name) == 0)
                return common_keys[i].default_value;
    }
    return NULL;
}

/* ---- plugin settings ------------------------------------------------------------------ */

void ts__settings_free(ts_setting *s, size_t n)
{
    if (!s)
        return;
    for (size_t i = 0; i < n; i++)
        free((char *)s[i].text);
    free(s);
}

ts_status ts__config_plugin_settings(const ts_config *cfg, const char *name,
                                     const ts_config_key *keys, ts_setting **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    size_t nkeys = 0;
    for (const ts_config_key *k = keys; k && k->name; k++)
        nkeys++;
    /* The key list: common keys (with the plugin's default if it redeclares them), then the
     * plugin's own. */
    const ts_config_key **list = ts__calloc(NCOMMON + nkeys, sizeof *list);
    ts_setting *s = ts__calloc(NCOMMON + nkeys, sizeof *s);
    size_t count = 0;
    char section[160], expected[160];
    ts_status st = TS_OK;
    if (!list || !s) {
        st = ts__fail(TS_ENOMEM, "out of memory resolving plugin settings");
        goto fail;
    }
    for (size_t i = 0; i < NCOMMON; i++)
        list[count++] = &common_keys[i];
    for (size_t j = 0; j < nkeys; j++) {
        size_t i;
        for (i = 0; i < count; i++)
            if (strcmp(list[i]->name, keys[j].name) == 0)
                break;
        if (i < NCOMMON && keys[j].kind != common_keys[i].kind) {
            st = ts__fail(TS_EPLUGIN, "plugin '%s' redeclares common key '%s' with another kind",
                          name, keys[j].name);
            goto fail;
        }
        list[i] = &keys[j];
        if (i == count)
            count++;
    }
    snprintf(section, sizeof section, "plugin.%s", name);
    /* Every key in the file must be known. */
    for (size_t e = 0; cfg && e < cfg->n; e++) {
        if (strcmp(cfg->e[e].section, section) != 0)
            continue;
        size_t i;
        for (i = 0; i < count; i++)
            if (strcmp(list[i]->name, cfg->e[e].key) == 0)
                break;
        if (i == count) {
            char known[512] = "";
            for (size_t k = 0; k < count; k++)
                snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s",
                         k ? ", " : "", list[k]->name);
            st = ts__fail(TS_ECONFIG, "%s:%d: [%s] unknown key '%s'; plugin '%s' accepts: %s",
                          LAYER_FILE(cfg, cfg->e[e].layer), cfg->e[e].line, section, cfg->e[e].key, name, known);
            goto fail;
        }
    }
    for (size_t i = 0; i < count; i++) {
        const ts_config_key *k = list[i];
        const entry *e = cfg ? find_entry(cfg, section, k->name) : NULL;
        const char *text = e ? e->value : k->default_value;
        s[i].name = k->name;
        s[i].kind = k->kind;
        s[i].from_file = e != NULL;
        s[i].text = ts__strdup(text ? text : "");
        if (!s[i].text) {
            st = ts__fail(TS_ENOMEM, "out of memory resolving plugin settings");
            goto fail_count;
        }
        if (!text)
            continue;
        if (!parse_setting(k, text, &s[i], expected, sizeof expected)) {
            if (e)
                st = ts__fail(TS_ECONFIG, "%s:%d: [%s] %s = '%s': expected %s",
                              LAYER_FILE(cfg, e->layer), e->line, section, k->name, text, expected);
            else
                st = ts__fail(TS_EPLUGIN, "plugin '%s': default of '%s' ('%s') is not %s", name,
                              k->name, text, expected);
            count = i + 1;
            goto fail_count;
        }
    }
    free(list);
    *out = s;
    *n = count;
    return TS_OK;
fail:
    count = 0;
fail_count:
    free(list);
    ts__settings_free(s, count);
    return st;
}

/* ---- memory_fraction as bytes ------------------------------------------------------------ */

ts_status ts__config_check_reserve(const ts_config *cfg, const char *name, const ts_setting *s,
                                   size_t n, uint64_t total_bytes)
{
    const ts_setting *frac = ts_setting_find(s, n, "memory_fraction");
    if (!frac || frac->kind != TS_SETTING_FRACTION || total_bytes == 0)
        return TS_OK;
    /* As the loader turns it into the pool's reserve limit (reserve_limit in loader.c). */
    uint64_t limit = (uint64_t)((double)total_bytes * frac->v.fraction);
    if (limit >= TS_MIN_RESERVE_BYTES)
        return TS_OK;
    char where[600], lim[32], tot[32], least[64] = "";
    char section[160];
    snprintf(section, sizeof section, "plugin.%s", name);
    const entry *e = cfg ? find_entry(cfg, section, "memory_fraction") : NULL;
    if (e)
        snprintf(where, sizeof where, "%s:%d: [%s] memory_fraction = %s",
                 LAYER_FILE(cfg, e->layer), e->line,
                 section, e->value);
    else
        snprintf(where, sizeof where, "[%s] memory_fraction (not set in any file: the "
                 "default, %s)", section, frac->text);
    ts__fmt_bytes(lim, limit);
    ts__fmt_bytes(tot, total_bytes);
    if (total_bytes < TS_MIN_RESERVE_BYTES)
        return ts__fail(TS_ECONFIG, "%s gives a pool limit of %llu bytes (%s): this device has "
                        "only %s in all, under the 1 MiB minimum of a pool; no fraction can "
                        "give a usable pool here", where, (unsigned long long)limit, lim, tot);
    /* The smallest fraction with a 1 MiB limit, rounded up to two significant digits, and
     * checked as the parser and the plugin will see it. */
    double f = (double)TS_MIN_RESERVE_BYTES / (double)total_bytes;
    double step = pow(10.0, floor(log10(f)) - 1.0), m = ceil(f / step) * step;
    for (int i = 0; i < 100; i++, m += step) {
        snprintf(least, sizeof least, "%.3g", m < 1e-6 ? 1e-6 : m);
        if ((uint64_t)((double)total_bytes * strtod(least, NULL)) >= TS_MIN_RESERVE_BYTES)
            break;
    }
    return ts__fail(TS_ECONFIG, "%s gives a pool limit of %llu bytes (%s) on this device (%s in "
                    "all), under the 1 MiB minimum of a pool (a limit that rounds to 0 bytes "
                    "would mean no limit at all); the smallest accepted on this device is %s",
                    where, (unsigned long long)limit, lim, tot, least);
}

/* ---- sections for plugins that are not there ------------------------------------------- */

typedef struct known_plugins {
    char names[64][64];
    size_t n;
} known_plugins;

static void collect_plugin(const char *name, const char *path, void *user)
{
    (void)path;
    known_plugins *k = user;
    if (k->n < sizeof k->names / sizeof k->names[0])
        snprintf(k->names[k->n++], sizeof k->names[0], "%s", name);
}

/* Levenshtein distance of two short names, capped at 9. */
static int name_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63)
        return 9;
    int row[64];
    for (size_t j = 0; j <= lb; j++)
        row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int up = row[j], best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb] < 9 ? row[lb] : 9;
}

/* The plugin found on cfg's search path closest to name (ties: the first in sorted order), and
 * its distance; NULL (distance 9) when none is found. */
static const char *closest_plugin(const known_plugins *k, const char *name, int *distance)
{
    const char *closest = NULL;
    int best = 9;
    for (size_t j = 0; j < k->n; j++) {
        int d = name_distance(name, k->names[j]);
        if (d < best)
            best = d, closest = k->names[j];
    }
    *distance = best;
    return closest;
}

/* A likely misspelling: within two edits, and fewer edits than the name has characters. */
static int misspelling(const char *name, int distance)
{
    return distance <= 2 && (size_t)distance < strlen(name);
}

int ts__config_plugin_guess(const ts_config *cfg, const char *name, char *out, size_t len)
{
    known_plugins k = {.n = 0};
    ts_plugin_scan(cfg, collect_plugin, &k);
    int d;
    const char *c = closest_plugin(&k, name, &d);
    if (!c || d == 0 || !misspelling(name, d))
        return 0;
    snprintf(out, len, "%s", c);
    return 1;
}

/* The plugins tessera itself ships (plugins/): a section for one this installation lacks (not
 * built here, as cuda on a machine without the CUDA toolkit) is expected, not a mistake. */
static const char *const shipped_plugins[] = {"cpu_blas", "cpu_onednn", "cuda"};

/* Whether the device the configuration (or TESSERA_DEVICE) selects is a path to NAME.so. */
static int selected_by_path(const ts_config *cfg, const char *name)
{
    const char *env = ts__getenv("TESSERA_DEVICE");
    const char *dev = env && *env ? env : ts_config_get(cfg, "core", "device");
    const char *base = dev && strchr(dev, '/') ? strrchr(dev, '/') + 1 : NULL;
    size_t n = strlen(name);
    return base && strncmp(base, name, n) == 0 && strcmp(base + n, ".so") == 0;
}

void ts__config_check_plugin_sections(const ts_config *cfg)
{
    if (!cfg || cfg->nsec == 0)
        return;
    known_plugins k = {.n = 0};
    ts_plugin_scan(cfg, collect_plugin, &k);
    char list[1024] = "";
    for (size_t j = 0; j < k.n; j++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", j ? ", " : "",
                 k.names[j]);
    for (size_t i = 0; i < cfg->nsec; i++) {
        const char *name = cfg->sec[i].name;
        int line = cfg->sec[i].line, found = 0, shipped = 0, best;
        const char *file = LAYER_FILE(cfg, cfg->sec[i].layer);
        for (size_t j = 0; j < k.n && !found; j++)
            found = strcmp(k.names[j], name) == 0;
        if (found) /* there, whether or not it loads: its load reports its own problems */
            continue;
        if (selected_by_path(cfg, name)) /* device = ./NAME.so: its settings are used */
            continue;
        for (size_t j = 0; j < sizeof shipped_plugins / sizeof *shipped_plugins; j++)
            shipped |= strcmp(shipped_plugins[j], name) == 0;
        const char *closest = closest_plugin(&k, name, &best);
        if (shipped)
            ts__log(TS_LOG_INFO, "%s:%d: [plugin.%s]: tessera's %s plugin is not on the search "
                    "path here (not built or not installed); its settings are unused (plugins "
                    "found: %s)", file, line, name, name, k.n ? list : "none");
        else if (closest && misspelling(name, best))
            ts__log(TS_LOG_WARN, "%s:%d: [plugin.%s] names no plugin on the search path: did "
                    "you mean [plugin.%s]? Its settings are unused (plugins found: %s)",
                    file, line, name, closest, list);
        else
            ts__log(TS_LOG_WARN, "%s:%d: [plugin.%s] names no plugin on the search path; its "
                    "settings are unused until that plugin is installed (plugins found: %s; "
                    "closest: %s)", file, line, name, k.n ? list : "none",
                    closest ? closest : "none");
    }
}
