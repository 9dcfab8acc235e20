/* tools/cmd_info.c: `tessera info`: version, the configuration in force, the plugin search
 * path, every plugin found (loaded, or why not), its devices, memory and pool settings, and
 * the default device the runtime would pick. Text for people, --json for scripts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli.h"

static const char info_usage[] =
    "usage: tessera info [--json] [--config FILE] [--device NAME|PATH]\n"
    "\n"
    "Shows the version, the configuration file in use, the plugin search path, each plugin\n"
    "found (file, ABI version, loaded or the reason it failed), its devices and memory, the\n"
    "pool settings in force, and the default device (with its fallback, if used).\n"
    "  --json    one JSON object on stdout\n"
    "  --device  the device to describe as the one in use (as TESSERA_DEVICE does); a plugin\n"
    "            selected by path is listed with the plugins found on the search path\n";

static const char *str(const cJSON *o, const char *k);

static void add_dir(const char *dir, void *user)
{
    cJSON_AddItemToArray((cJSON *)user, cJSON_CreateString(dir));
}

static void add_u64(cJSON *o, const char *k, unsigned long long v)
{
    cJSON_AddNumberToObject(o, k, (double)v);
}

/* The host CPU's half-precision instruction sets (/proc/cpuinfo's flags), as "cpu_flags". */
static void cpu_flags(cJSON *root)
{
    FILE *f = fopen("/proc/cpuinfo", "re");
    if (!f)
        return;
    char line[8192];
    static const char *const want[] = {"f16c", "avx512_bf16", "avx512_fp16", "amx_bf16",
                                       "amx_tile"};
    cJSON *o = cJSON_AddObjectToObject(root, "cpu_flags");
    int found = 0;
    while (!found && fgets(line, sizeof line, f))
        if (!strncmp(line, "flags", 5)) {
            found = 1;
            for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
                char pat[40];
                snprintf(pat, sizeof pat, " %s", want[i]);
                const char *at = strstr(line, pat);
                size_t n = strlen(pat);
                cJSON_AddBoolToObject(o, want[i], at && (at[n] == ' ' || at[n] == '\n'));
            }
        }
    fclose(f);
    if (!found)
        cJSON_DeleteItemFromObject(root, "cpu_flags");
}

/* Loads one plugin and describes it; unloads it again. */
static void probe(const ts_config *cfg, const char *name, const char *path, void *user)
{
    cJSON *list = user, *p = cJSON_CreateObject();
    cJSON_AddItemToArray(list, p);
    cJSON_AddStringToObject(p, "name", name);
    cJSON_AddStringToObject(p, "file", path);
    ts_device *dev;
    ts_status s = ts_device_load(cfg, path, &dev);
    if (s) {
        cJSON_AddBoolToObject(p, "loaded", 0);
        cJSON_AddStringToObject(p, "status", ts_status_name(s));
        cJSON_AddStringToObject(p, "error", ts_last_error());
        cJSON *d = cJSON_AddObjectToObject(p, "devices");
        cJSON_AddNumberToObject(d, "count", 0);
        return;
    }
    const ts_plugin_desc *desc = ts_device_desc(dev);
    char abi[32];
    snprintf(abi, sizeof abi, "%u.%u", (unsigned)desc->abi_major, (unsigned)desc->abi_minor);
    cJSON_AddBoolToObject(p, "loaded", 1);
    cJSON_AddStringToObject(p, "abi", abi);
    cJSON_AddStringToObject(p, "version", desc->version ? desc->version : "");
    cJSON_AddStringToObject(p, "description", desc->description ? desc->description : "");
    ts_device_info info;
    cJSON *d = cJSON_AddObjectToObject(p, "devices");
    if (ts_device_info_get(dev, &info) == TS_OK) {
        cJSON_AddNumberToObject(d, "count", info.count);
        cJSON_AddNumberToObject(d, "index", info.index);
        cJSON_AddStringToObject(d, "name", info.name);
        if (info.valid & TS_DEVINFO_TOTAL)
            add_u64(d, "total_bytes", info.total_bytes);
        if (info.valid & TS_DEVINFO_FREE)
            add_u64(d, "free_bytes", info.free_bytes);
    } else {
        cJSON_AddNumberToObject(d, "count", 0);
        cJSON_AddStringToObject(d, "error", ts_last_error());
    }
    size_t n;
    const ts_setting *set = ts_device_settings(dev, &n);
    cJSON *so = cJSON_AddObjectToObject(p, "settings");
    char section[96], origin[4200];
    snprintf(section, sizeof section, "plugin.%s", ts_device_name(dev));
    for (size_t i = 0; i < n; i++) {
        cJSON *e = cJSON_AddObjectToObject(so, set[i].name);
        cJSON_AddStringToObject(e, "value", set[i].text);
        cJSON_AddBoolToObject(e, "from_file", set[i].from_file);
        int line = ts_config_line(cfg, section, set[i].name);
        const char *file = ts_config_file(cfg, section, set[i].name);
        if (set[i].from_file && file && line) /* where it was set: FILE:LINE */
            snprintf(origin, sizeof origin, "%s:%d", file, line);
        else
            snprintf(origin, sizeof origin, "default");
        cJSON_AddStringToObject(e, "origin", origin);
    }
    /* the 16-bit floats: which ops the plugin runs in each, and which of its float32 ops it
     * does not (those: cast to float32) */
    cJSON *half = cJSON_AddObjectToObject(p, "half_precision");
    cJSON *without = cJSON_AddObjectToObject(p, "half_precision_without");
    for (int32_t dt = TS_BF16; dt <= TS_F16; dt++) {
        cJSON *ops = cJSON_AddArrayToObject(half, ts_dtype_name(dt));
        cJSON *not = cJSON_AddArrayToObject(without, ts_dtype_name(dt));
        for (int32_t op = TS_OP_NONE + 1; op < TS_OP_COUNT; op++)
            if (ts_device_supports(dev, op, dt))
                cJSON_AddItemToArray(ops, cJSON_CreateString(ts_plugin_op_name(op)));
            else if (ts_device_supports(dev, op, TS_F32))
                cJSON_AddItemToArray(not, cJSON_CreateString(ts_plugin_op_name(op)));
    }
    ts_memory_stats st;
    ts_device_memory_stats(dev, &st);
    cJSON *po = cJSON_AddObjectToObject(p, "pool");
    cJSON_AddBoolToObject(po, "valid", (st.valid & TS_STATS_POOL) != 0);
    if (st.valid & TS_STATS_POOL) {
        add_u64(po, "reserve_limit", st.reserve_limit);
        add_u64(po, "cache_limit", st.cache_limit);
        add_u64(po, "in_use", st.in_use);
        add_u64(po, "peak_in_use", st.peak_in_use);
        add_u64(po, "reserved", st.reserved);
        add_u64(po, "peak_reserved", st.peak_reserved);
        add_u64(po, "cached", st.cached);
        add_u64(po, "n_alloc", st.n_alloc);
        add_u64(po, "n_raw_alloc", st.n_raw_alloc);
        add_u64(po, "n_oom", st.n_oom);
    }
    ts_device_unload(dev);
}

typedef struct scan_ctx {
    const ts_config *cfg;
    cJSON *list;
} scan_ctx;

static void on_found(const char *name, const char *path, void *user)
{
    scan_ctx *sc = user;
    probe(sc->cfg, name, path, sc->list);
}

static void on_comm(const char *name, const char *path, const char *description,
                    const char *error, void *user)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", name);
    cJSON_AddStringToObject(o, "file", path);
    if (description)
        cJSON_AddStringToObject(o, "description", description);
    else
        cJSON_AddStringToObject(o, "error", error ? error : "unusable");
    cJSON_AddItemToArray(user, o);
}

static const char *str(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : "";
}

static double num(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

/* lead, then text broken at spaces into lines of at most 80 columns, indented as lead. */
static void print_wrapped(const char *lead, const char *text)
{
    size_t ind = strlen(lead), col = ind;
    printf("%s", lead);
    while (*text) {
        size_t w = strcspn(text, " ");
        if (col > ind && col + 1 + w > 80) {
            printf("\n%*s", (int)ind, "");
            col = ind;
        } else if (col > ind) {
            putchar(' ');
            col++;
        }
        printf("%.*s", (int)w, text);
        col += w;
        text += w;
        text += strspn(text, " ");
    }
    putchar('\n');
}

static void print_text(const cJSON *root)
{
    char b1[32], b2[32];
    const cJSON *cfg = cJSON_GetObjectItem(root, "config");
    printf("tessera %s (plugin ABI %s)\n", str(root, "version"), str(root, "plugin_abi"));
    /* The user's file, then the installed one under it, if any. */
    const cJSON *files = cJSON_GetObjectItem(cfg, "files");
    int nf = cJSON_GetArraySize(files);
    printf("config:          %s", str(cfg, "file"));
    for (int i = nf - 2; i >= 0; i--)
        printf(" over %s", cJSON_GetStringValue(cJSON_GetArrayItem(files, i)));
    printf("\n");
    printf("device:          %s (from %s; fallback: %s)\n", str(cfg, "device"),
           str(cfg, "device_origin"), *str(cfg, "fallback") ? str(cfg, "fallback") : "none");
    const cJSON *dd = cJSON_GetObjectItem(root, "default_device");
    if (cJSON_IsString(dd))
        printf("in use:          %s (%s)\n", dd->valuestring, str(root, "default_device_file"));
    else
        printf("in use:          none (%s)\n", str(root, "default_device_error"));
    const cJSON *fl = cJSON_GetObjectItem(root, "cpu_flags"), *f;
    if (fl) { /* what the CPU could run natively in the 16-bit floats */
        printf("host CPU:       ");
        int k = 0;
        cJSON_ArrayForEach(f, fl)
            printf("%s %s %s", k++ ? "," : "", f->string, cJSON_IsTrue(f) ? "yes" : "no");
        printf("\n");
    }
    printf("plugin path:\n");
    const cJSON *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(root, "search_path"))
        printf("  %s\n", it->valuestring);
    printf("plugins:\n");
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(root, "plugins"))
    {
        const cJSON *d = cJSON_GetObjectItem(it, "devices");
        if (!cJSON_IsTrue(cJSON_GetObjectItem(it, "loaded"))) {
            printf("  %s: %s (%s)\n    file: %s\n", str(it, "name"),
                   strcmp(str(it, "status"), "TS_ENODEV") == 0 ? "0 devices" : "not loaded",
                   str(it, "error"), str(it, "file"));
            continue;
        }
        printf("  %s: %d device%s: %s%s\n", str(it, "name"), (int)num(d, "count"),
               num(d, "count") == 1 ? "" : "s", str(d, "name"),
               cJSON_IsTrue(cJSON_GetObjectItem(it, "selected_by_path"))
                   ? " (selected by path, not on the search path)"
                   : "");
        printf("    file: %s (ABI %s, version %s)\n", str(it, "file"), str(it, "abi"),
               str(it, "version"));
        if (cJSON_GetObjectItem(d, "total_bytes"))
            printf("    memory: %s total, %s free\n",
                   cli_bytes((unsigned long long)num(d, "total_bytes"), b1, sizeof b1),
                   cli_bytes((unsigned long long)num(d, "free_bytes"), b2, sizeof b2));
        printf("    settings:");
        const cJSON *s;
        cJSON_ArrayForEach(s, cJSON_GetObjectItem(it, "settings"))
            printf(" %s=%s(%s)", s->string, str(s, "value"), str(s, "origin"));
        printf("\n");
        const cJSON *half = cJSON_GetObjectItem(it, "half_precision"), *h;
        const cJSON *without = cJSON_GetObjectItem(it, "half_precision_without");
        if (half) {
            /* the shorter of the two lists: what it runs, or what it does not */
            printf("    half precision:");
            int nh = 0;
            cJSON_ArrayForEach(h, half)
            {
                const cJSON *not = cJSON_GetObjectItem(without, h->string), *op;
                int k = 0, has = cJSON_GetArraySize(h), nnot = cJSON_GetArraySize(not);
                printf("%s %s:", nh++ ? ";" : "", h->string);
                if (!has)
                    printf(" none (cast to float32 on another device)");
                else if (!nnot)
                    printf(" every op it runs in float32");
                else if (nnot < has) {
                    printf(" every op it runs in float32 but");
                    cJSON_ArrayForEach(op, not)
                        printf("%s %s", k++ ? "," : "", op->valuestring);
                } else {
                    cJSON_ArrayForEach(op, h)
                        printf("%s %s", k++ ? "," : "", op->valuestring);
                    printf(" (the others: cast to float32)");
                }
            }
            printf("\n");
            const char *how = strchr(str(it, "description"), ';'); /* the plugin's own words */
            if (how)
                print_wrapped("    how: ", how + 2);
        }
        const cJSON *po = cJSON_GetObjectItem(it, "pool");
        if (cJSON_IsTrue(cJSON_GetObjectItem(po, "valid"))) {
            char b3[32], b4[32];
            printf("    pool: limit %s reserved, cache %s; in use %s, reserved %s\n",
                   cli_bytes((unsigned long long)num(po, "reserve_limit"), b1, sizeof b1),
                   cli_bytes((unsigned long long)num(po, "cache_limit"), b2, sizeof b2),
                   cli_bytes((unsigned long long)num(po, "in_use"), b3, sizeof b3),
                   cli_bytes((unsigned long long)num(po, "reserved"), b4, sizeof b4));
        }
    }
    printf("communication plugins ([dist] backend = %s):\n", str(cfg, "dist_backend"));
    const cJSON *cp = cJSON_GetObjectItem(root, "comm_plugins");
    if (!cJSON_GetArraySize(cp))
        printf("  none (tessera builds comm_mpi when Open MPI is installed: Debian package "
               "libopenmpi-dev)\n");
    cJSON_ArrayForEach(it, cp) {
        if (cJSON_GetObjectItem(it, "description"))
            printf("  %s: %s\n    file: %s\n", str(it, "name"), str(it, "description"),
                   str(it, "file"));
        else
            printf("  %s: unusable: %s\n    file: %s\n", str(it, "name"), str(it, "error"),
                   str(it, "file"));
    }
}

int cmd_info(int argc, char **argv, const cli_common *common)
{
    int json = common->json;
    const char *config_path = common->config, *device = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            json = 1;
        } else if (strcmp(argv[i], "--config") == 0 && i + 1 < argc) {
            config_path = argv[++i];
        } else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc) {
            device = argv[++i];
        } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            fputs(info_usage, stdout);
            return 0;
        } else {
            return cli_usage_error("info", "unexpected argument '%s'", argv[i]);
        }
    }
    ts_config *cfg;
    ts_status s = ts_config_load(config_path, &cfg);
    if (s)
        return cli_fail(s, "cannot load the configuration");

    cJSON *root = cJSON_CreateObject();
    char abi[32];
    snprintf(abi, sizeof abi, "%d.%d", TS_PLUGIN_ABI_MAJOR, TS_PLUGIN_ABI_MINOR);
    cJSON_AddStringToObject(root, "version", ts_version());
    cJSON_AddStringToObject(root, "plugin_abi", abi);
    cJSON *c = cJSON_AddObjectToObject(root, "config");
    cJSON_AddStringToObject(c, "file", ts_config_source(cfg));
    cJSON *layers = cJSON_AddArrayToObject(c, "files"); /* installed first, the user's on top */
    for (size_t i = 0; ts_config_layer(cfg, i); i++)
        cJSON_AddItemToArray(layers, cJSON_CreateString(ts_config_layer(cfg, i)));
    if (device && setenv("TESSERA_DEVICE", device, 1) != 0)
        return cli_fail(TS_ENOMEM, "info --device");
    const char *envdev = getenv("TESSERA_DEVICE");
    cJSON_AddStringToObject(c, "device",
                            envdev && *envdev ? envdev : ts_config_get(cfg, "core", "device"));
    {
        char origin[4200];
        int line = ts_config_line(cfg, "core", "device");
        if (device)
            snprintf(origin, sizeof origin, "--device");
        else if (envdev && *envdev)
            snprintf(origin, sizeof origin, "TESSERA_DEVICE");
        else if (line && ts_config_file(cfg, "core", "device"))
            snprintf(origin, sizeof origin, "%s:%d", ts_config_file(cfg, "core", "device"), line);
        else
            snprintf(origin, sizeof origin, "default");
        cJSON_AddStringToObject(c, "device_origin", origin);
    }
    cJSON_AddStringToObject(c, "fallback", ts_config_get(cfg, "core", "fallback"));
    cJSON_AddStringToObject(c, "log_level", ts_config_get(cfg, "core", "log_level"));

    /* The device the runtime picks, fallback included, exactly as a program would get it. */
    char *in_use_path = NULL, *in_use_name = NULL;
    if (ts_init(config_path) == TS_OK) {
        cJSON_AddStringToObject(root, "default_device", ts_device_name(ts_default_device()));
        cJSON_AddStringToObject(root, "default_device_file", ts_device_path(ts_default_device()));
        in_use_path = strdup(ts_device_path(ts_default_device()));
        in_use_name = strdup(ts_device_name(ts_default_device()));
        ts_shutdown();
    } else {
        cJSON_AddNullToObject(root, "default_device");
        cJSON_AddStringToObject(root, "default_device_error", ts_last_error());
    }

    cpu_flags(root);
    cJSON *sp = cJSON_AddArrayToObject(root, "search_path");
    ts_plugin_search_path(cfg, add_dir, sp);
    scan_ctx sc = {cfg, cJSON_AddArrayToObject(root, "plugins")};
    ts_plugin_scan(cfg, on_found, &sc);
    /* The device in use, when it was selected by a path outside the search path (device =
     * ./x.so, --device ./x.so): listed too, so that every plugin that can run is shown. */
    int listed = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, sc.list)
        listed |= in_use_path && strcmp(str(it, "file"), in_use_path) == 0;
    if (in_use_path && !listed) {
        probe(cfg, in_use_name, in_use_path, sc.list);
        cJSON_AddBoolToObject(cJSON_GetArrayItem(sc.list, cJSON_GetArraySize(sc.list) - 1),
                              "selected_by_path", 1);
    }
    free(in_use_path);
    free(in_use_name);

    cJSON *comm = cJSON_AddArrayToObject(root, "comm_plugins");
    ts_dist_scan(cfg, on_comm, comm);
    const char *backend = ts_config_get(cfg, "dist", "backend");
    cJSON_AddStringToObject(c, "dist_backend", backend ? backend : "auto");

    if (json) {
        char *out = cJSON_Print(root);
        if (out)
            puts(out);
        free(out);
    } else {
        print_text(root);
    }
    cJSON_Delete(root);
    ts_config_free(cfg);
    return 0;
}
