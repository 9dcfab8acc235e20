/* core/settings.c: values in the configuration: sizes (ts_parse_size) and typed settings, the
 * keys every [plugin.NAME] section has, a plugin's settings resolved against the keys it
 * declares (its defaults, then the files'), memory_fraction checked as bytes, and sections for
 * plugins that are not there (with the nearest name that is). */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config_impl.h"
#include "memtrace.h"

/* Keys every [plugin.NAME] section has; a plugin may redeclare them to change the default. */
const ts_config_key ts__common_keys[TS__NCOMMON] = {
    {"memory_fraction", TS_SETTING_FRACTION, "0.5", 0, 0,
     "most bytes the pool may reserve, as a share of the device's memory"},
    {"cache_limit", TS_SETTING_SIZE, "512M", 0, 0, "most bytes kept in the pool's free lists"},
    {"caching", TS_SETTING_BOOL, "true", 0, 0,
     "false returns every free to the raw allocator (for sanitizers)"},
    {"expandable_segments", TS_SETTING_BOOL, "true", 0, 0,
     "blocks over 1 MiB share one address range that grows and shrinks at its end (plugins "
     "with address-space slots)"},
};

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
int ts__parse_setting(const ts_config_key *k, const char *text, ts_setting *s,
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
    const ts_config_key **list = ts__calloc(TS__NCOMMON + nkeys, sizeof *list);
    ts_setting *s = ts__calloc(TS__NCOMMON + nkeys, sizeof *s);
    size_t count = 0;
    char section[160], expected[160];
    ts_status st = TS_OK;
    if (!list || !s) {
        st = ts__fail(TS_ENOMEM, "out of memory resolving plugin settings");
        goto fail;
    }
    for (size_t i = 0; i < TS__NCOMMON; i++)
        list[count++] = &ts__common_keys[i];
    for (size_t j = 0; j < nkeys; j++) {
        size_t i;
        for (i = 0; i < count; i++)
            if (strcmp(list[i]->name, keys[j].name) == 0)
                break;
        if (i < TS__NCOMMON && keys[j].kind != ts__common_keys[i].kind) {
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
        const entry *e = cfg ? ts__config_find_entry(cfg, section, k->name) : NULL;
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
        if (!ts__parse_setting(k, text, &s[i], expected, sizeof expected)) {
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
    const entry *e = cfg ? ts__config_find_entry(cfg, section, "memory_fraction") : NULL;
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
