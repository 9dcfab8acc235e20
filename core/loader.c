/* core/loader.c: finding plugins on the search path, checking them against the trust rule,
 * dlopen'ing them, checking their ABI and descriptor, handing them the host-services table,
 * their settings and their pool. Every failure gives one message naming the plugin, the file
 * and the reason. The ts_device calls around a loaded plugin's vtable are core/device.c, the
 * pools built over it core/device_pool.c. */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "device.h"
#include "memtrace.h"
#include "pool.h"

/* ---- search path ---------------------------------------------------------------------- */

/* Calls fn for each entry of a colon-separated list. Relative entries are resolved against
 * base, or skipped with a warning when there is none: never the current directory. */
static void each_dir(const char *list, const char *base, const char *what,
                     void (*fn)(const char *, void *), void *user)
{
    if (!list)
        return;
    const char *p = list;
    while (*p) {
        const char *end = strchr(p, ':');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        while (len > 0 && (p[0] == ' ' || p[0] == '\t'))
            p++, len--;
        while (len > 0 && (p[len - 1] == ' ' || p[len - 1] == '\t'))
            len--;
        if (len > 0 && len < 4000) {
            char dir[4096];
            if (p[0] == '/')
                snprintf(dir, sizeof dir, "%.*s", (int)len, p);
            else if (base)
                snprintf(dir, sizeof dir, "%s/%.*s", base, (int)len, p);
            else
                dir[0] = 0;
            if (dir[0])
                fn(dir, user);
            else
                ts__log(TS_LOG_WARN, "%s: ignoring relative directory '%.*s' (never searched "
                        "relative to the current directory)", what, (int)len, p);
        }
        p += len;
        while (*p == ':' || *p == ' ' || *p == '\t')
            p++;
    }
}

/* The build tree this libtessera runs from, when it runs uninstalled (tests, quickstart's
 * train): libtool leaves it at BUILD/core/.libs/libtessera.so*, which no installed copy is,
 * so the layout says it, with no directory compiled in. Writes BUILD to out; 0 if installed. */
static int build_tree(char *out, size_t len)
{
    Dl_info info;
    if (!dladdr((void *)build_tree, &info) || !info.dli_fname)
        return 0;
    char *lib = realpath(info.dli_fname, NULL);
    if (!lib)
        return 0;
    char *slash = strrchr(lib, '/');
    static const char tail[] = "/core/.libs";
    size_t n = slash ? (size_t)(slash - lib) : 0;
    int r = n > sizeof tail - 1 &&
            strncmp(lib + n - (sizeof tail - 1), tail, sizeof tail - 1) == 0 &&
            strncmp(slash + 1, "libtessera.so", 13) == 0 && n - (sizeof tail - 1) < len;
    if (r)
        snprintf(out, len, "%.*s", (int)(n - (sizeof tail - 1)), lib);
    free(lib);
    return r;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void build_tree_dirs(const char *build, void (*fn)(const char *, void *), void *user)
{
    char base[4200];
    snprintf(base, sizeof base, "%s/plugins", build);
    DIR *d = opendir(base);
    if (!d)
        return;
    char *names[64];
    size_t n = 0;
    struct dirent *de;
    while ((de = readdir(d)) && n < 64)
        if (de->d_name[0] != '.')
            names[n] = ts__strdup(de->d_name), n += names[n] != NULL;
    closedir(d);
    qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 0; i < n; i++) {
        /* Only plugin folders: plugins/NAME/.libs/NAME.so. */
        char dir[4600], so[4900];
        snprintf(dir, sizeof dir, "%s/%s/.libs", base, names[i]);
        snprintf(so, sizeof so, "%s/%s.so", dir, names[i]);
        if (access(so, F_OK) == 0)
            fn(dir, user);
        free(names[i]);
    }
}

TS_API void ts_plugin_search_path(const ts_config *cfg, void (*fn)(const char *dir, void *user),
                                  void *user)
{
    each_dir(ts_config_get(cfg, "core", "plugin_path"), ts__config_dir_of(cfg, "core", "plugin_path"),
             "[core] plugin_path", fn, user);
    each_dir(ts__getenv("TESSERA_PLUGIN_PATH"), NULL, "TESSERA_PLUGIN_PATH", fn, user);
    char build[4096];
    if (build_tree(build, sizeof build))
        build_tree_dirs(build, fn, user);
    const char *sys = ts__getenv("TESSERA_SYSTEM_PLUGIN_DIR");
    each_dir(sys ? sys : TS_PLUGIN_DIR, NULL, "TESSERA_SYSTEM_PLUGIN_DIR", fn, user);
}

static int valid_name(const char *s)
{
    if (!*s || strlen(s) > 64)
        return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '_'))
            return 0;
    return 1;
}

typedef struct find_state {
    const char *name;
    char *found;
    char tried[1024];
} find_state;

static void find_in(const char *dir, void *user)
{
    find_state *fs = user;
    if (fs->found)
        return;
    char path[4200];
    snprintf(path, sizeof path, "%s/%s.so", dir, fs->name);
    if (access(path, F_OK) == 0) {
        fs->found = ts__strdup(path);
        return;
    }
    size_t l = strlen(fs->tried);
    snprintf(fs->tried + l, sizeof fs->tried - l, "%s%s", l ? ", " : "", dir);
}

TS_API ts_status ts_plugin_find(const ts_config *cfg, const char *name, char **path)
{
    if (!path || !name)
        return ts__fail(TS_EINVAL, "ts_plugin_find: NULL argument");
    *path = NULL;
    if (strchr(name, '/')) {
        /* A path: relative ones are relative to the working directory. The absolute form is
         * what every later message (and ts_device_path) shows. */
        char cwd[4096];
        const char *rel = name;
        while (rel[0] == '.' && rel[1] == '/')
            rel += 2;
        if (name[0] == '/')
            *path = ts__strdup(name);
        else if (getcwd(cwd, sizeof cwd))
            *path = ts__asprintf("%s/%s", strcmp(cwd, "/") ? cwd : "", rel);
        else
            return ts__fail(TS_EPLUGIN, "plugin '%s': a relative path, and the working "
                            "directory cannot be read (%s); give an absolute path", name,
                            strerror(errno));
        if (!*path)
            return ts__fail(TS_ENOMEM, "out of memory");
        if (access(*path, F_OK) != 0) {
            int e = errno;
            ts_status st = ts__fail(TS_EPLUGIN, "plugin '%s': %s: %s%s", name,
                                    e == ENOENT ? "no such file" : strerror(e), *path,
                                    name[0] == '/' ? ""
                                                   : " (a relative path is resolved against "
                                                     "the working directory; in the INI file, "
                                                     "against the file's directory)");
            free(*path);
            *path = NULL;
            return st;
        }
        return TS_OK;
    }
    if (!valid_name(name))
        return ts__fail(TS_EPLUGIN,
                        "'%s' is neither a plugin name (lower-case letters, digits, '_') nor a "
                        "path to a .so (it has no '/')",
                        name);
    find_state fs = {.name = name};
    ts_plugin_search_path(cfg, find_in, &fs);
    if (!fs.found)
        return ts__fail(TS_EPLUGIN,
                        "plugin '%s' not found: no %s.so in %s; set [core] plugin_path or "
                        "TESSERA_PLUGIN_PATH, or check that tessera was built with it "
                        "(configure prints the plugins it builds)",
                        name, name, fs.tried[0] ? fs.tried : "(empty search path)");
    *path = fs.found;
    return TS_OK;
}

typedef struct scan_state {
    void (*fn)(const char *, const char *, void *);
    void *user;
    char *seen[128];
    size_t nseen;
} scan_state;

static void scan_dir(const char *dir, void *user)
{
    scan_state *ss = user;
    DIR *d = opendir(dir);
    if (!d)
        return;
    char *names[128];
    size_t n = 0;
    struct dirent *de;
    while ((de = readdir(d)) && n < 128) {
        size_t len = strlen(de->d_name);
        if (len > 3 && strcmp(de->d_name + len - 3, ".so") == 0)
            names[n] = ts__strdup(de->d_name), n += names[n] != NULL;
    }
    closedir(d);
    qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 0; i < n; i++) {
        names[i][strlen(names[i]) - 3] = 0;
        int dup = 0;
        for (size_t j = 0; j < ss->nseen; j++)
            dup |= strcmp(ss->seen[j], names[i]) == 0;
        /* comm_NAME.so: communication plugins (tessera/comm.h), not devices */
        if (!dup && valid_name(names[i]) && strncmp(names[i], "comm_", 5) != 0 &&
            ss->nseen < 128) {
            char path[4200];
            snprintf(path, sizeof path, "%s/%s.so", dir, names[i]);
            ss->seen[ss->nseen++] = names[i];
            ss->fn(names[i], path, ss->user);
        } else {
            free(names[i]);
        }
    }
}

TS_API void ts_plugin_scan(const ts_config *cfg,
                           void (*fn)(const char *name, const char *path, void *user), void *user)
{
    scan_state ss = {.fn = fn, .user = user};
    ts_plugin_search_path(cfg, scan_dir, &ss);
    for (size_t i = 0; i < ss.nseen; i++)
        free(ss.seen[i]);
}

/* ---- host services -------------------------------------------------------------------- */

static ts_status host_fail(const ts_host *self, ts_status code, const char *fmt, ...)
{
    const ts_device *dev = self->host_private;
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ts__fail(code, "plugin '%s': %s", dev->name, msg);
}

static void host_log(const ts_host *self, int level, const char *fmt, ...)
{
    const ts_device *dev = self->host_private;
    char msg[1800];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ts__log(level, "plugin '%s': %s", dev->name, msg);
}

static ts_status host_scratch_alloc(const ts_host *self, size_t nbytes, const char *tag,
                                    void **ptr)
{
    const ts_device *dev = self->host_private;
    if (!ptr)
        return ts__fail(TS_EINVAL, "plugin '%s': scratch_alloc: ptr is NULL", dev->name);
    *ptr = NULL;
    if (!dev->pool)
        return ts__fail(TS_EINVAL, "plugin '%s': scratch_alloc called before init returned",
                        dev->name);
    return ts__pool_alloc(dev->pool, nbytes, tag ? tag : "kernel scratch", ptr);
}

static void host_scratch_free(const ts_host *self, void *ptr)
{
    ts_device *dev = (ts_device *)self->host_private;
    if (dev->pool)
        ts__device_pool_free(dev, ptr);
}

/* ---- loading -------------------------------------------------------------------------- */

/* Members every 2.x plugin must fill; a NULL one is named in the refusal. */
static const struct {
    const char *name;
    size_t offset;
} required[] = {
#define R(m) {#m, offsetof(ts_plugin_desc, m)}
    R(init), R(shutdown), R(device_info), R(mem_alloc), R(mem_free), R(copy_h2d), R(copy_d2h),
    R(copy_d2d), R(fill), R(synchronize),
#undef R
};

/* Whether [core] allow_insecure_plugin_path is set. */
static int insecure_allowed(const ts_config *cfg)
{
    const char *allow = ts_config_get(cfg, "core", "allow_insecure_plugin_path");
    int32_t on = 0;
    return allow && ts__config_bool(allow, &on) && on; /* as the configuration parsed it */
}

static ts_status refuse(const char *path, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static ts_status refuse(const char *path, const char *fmt, ...)
{
    char why[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    ts_status s = ts__fail(TS_EPLUGIN,
                           "refusing to load '%s': %s; anyone who can change it can run code "
                           "in this process. Fix the ownership or permissions, or set [core] "
                           "allow_insecure_plugin_path = true",
                           path, why);
    return s; /* the caller says it (the runtime's fallback logs it when it goes on) */
}

/* The trust rule (ts__trust_check) for a plugin file; *st gets the file's lstat, for the
 * descriptor check after the open. */
static ts_status check_chain(const char *path, const char *real, struct stat *st)
{
    char why[1024];
    int r = ts__trust_check(real, st, why, sizeof why);
    if (r > 0)
        return refuse(path, "%s", why);
    if (r < 0)
        return ts__fail(errno == ENOMEM ? TS_ENOMEM : TS_EPLUGIN, "plugin '%s': %s", path, why);
    return TS_OK;
}

/* Opens the plugin file for dlopen: resolves path, checks the trust rule (unless the config
 * allows insecure paths), opens the file once without following links or blocking, and checks
 * that the descriptor is the file that was checked. *fd_out is then loaded through
 * /proc/self/fd, so nothing can be swapped in between the check and the load. */
static ts_status open_plugin(const ts_config *cfg, const char *path, int *fd_out)
{
    *fd_out = -1;
    char *real = realpath(path, NULL);
    if (!real)
        return ts__fail(TS_EPLUGIN, "plugin '%s': cannot resolve the path: %s", path,
                        strerror(errno));
    int insecure = insecure_allowed(cfg);
    struct stat want, got;
    ts_status s = TS_OK;
    if (insecure) {
        if (stat(real, &want) != 0)
            s = ts__fail(TS_EPLUGIN, "plugin '%s': cannot stat '%s': %s", path, real,
                         strerror(errno));
        else if (!S_ISREG(want.st_mode))
            s = ts__fail(TS_EPLUGIN, "plugin '%s': '%s' is %s, not a regular file", path, real,
                         ts__file_kind(want.st_mode));
    } else {
        s = check_chain(path, real, &want);
    }
    if (s) {
        free(real);
        return s;
    }
    if (ts__loader_after_check_hook) /* tests only: a swap between the check and the open */
        ts__loader_after_check_hook(real);
    int fd = open(real, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) {
        s = ts__fail(TS_EPLUGIN, "plugin '%s': cannot open '%s': %s", path, real,
                     strerror(errno));
    } else if (fstat(fd, &got) != 0) {
        s = ts__fail(TS_EPLUGIN, "plugin '%s': cannot stat '%s': %s", path, real,
                     strerror(errno));
    } else if (got.st_dev != want.st_dev || got.st_ino != want.st_ino ||
               !S_ISREG(got.st_mode) ||
               (!insecure && (!ts__trusted_owner(got.st_uid) ||
                              (got.st_mode & (S_IWGRP | S_IWOTH))))) {
        s = refuse(path, "'%s' changed between its check and its open", real);
    }
    free(real);
    if (s) {
        if (fd >= 0)
            close(fd);
        return s;
    }
    *fd_out = fd;
    return TS_OK;
}

/* The name each plugin file was dlopen'ed by. A plugin is loaded through /proc/self/fd/N of
 * the descriptor open_plugin checked; ld.so then knows the object by that name for good (it is
 * RTLD_NODELETE, and ld.so also adds the name of every later dlopen that finds the same file).
 * So a descriptor that named a loaded object stays open for the life of the process: were its
 * number reused for another file, dlopen of that name would return the old object. The same
 * file (device and inode) loaded again is opened by its first name and the new descriptor
 * closed: one descriptor per distinct plugin file, never one per load. */
typedef struct fd_name {
    dev_t dev;
    ino_t ino;
    int fd;
} fd_name;
static fd_name *fd_names;
static size_t n_fd_names, cap_fd_names;
static pthread_mutex_t fd_names_lock = PTHREAD_MUTEX_INITIALIZER;

/* The name to dlopen for the checked descriptor fd: /proc/self/fd/N of the descriptor that
 * first loaded the same file, or of fd itself (written into buf). Without /proc (or out of
 * memory for the table) the resolved path, checked just before. Holds fd_names_lock until
 * loaded_done. */
static const char *loaded_name(int fd, const char *path, char *buf, size_t len)
{
    pthread_mutex_lock(&fd_names_lock);
    struct stat st;
    if (fstat(fd, &st) != 0)
        return path;
    int use = fd;
    for (size_t i = 0; i < n_fd_names; i++)
        if (fd_names[i].dev == st.st_dev && fd_names[i].ino == st.st_ino)
            use = fd_names[i].fd;
    snprintf(buf, len, "/proc/self/fd/%d", use);
    if (access(buf, F_OK) != 0)
        return path;
    if (use == fd && n_fd_names == cap_fd_names) {
        size_t cap = cap_fd_names ? 2 * cap_fd_names : 8;
        fd_name *p = ts__realloc(fd_names, cap * sizeof *p);
        if (!p)
            return path;
        fd_names = p;
        cap_fd_names = cap;
    }
    return buf;
}

/* After the dlopen: keeps fd as a name when it is a new one that ld.so now holds, else closes
 * it (the mapping stays). Releases fd_names_lock. */
static void loaded_done(int fd, int named)
{
    struct stat st;
    int fresh = named && fstat(fd, &st) == 0;
    for (size_t i = 0; fresh && i < n_fd_names; i++)
        if (fd_names[i].fd == fd || (fd_names[i].dev == st.st_dev && fd_names[i].ino == st.st_ino))
            fresh = 0;
    if (fresh)
        fd_names[n_fd_names++] = (fd_name){st.st_dev, st.st_ino, fd};
    else
        close(fd);
    pthread_mutex_unlock(&fd_names_lock);
}

ts_status ts__plugin_dlopen(const ts_config *cfg, const char *name, const char *path,
                           void **handle)
{
    *handle = NULL;
    int fd;
    ts_status s = open_plugin(cfg, path, &fd);
    if (s)
        return s;
    char fdpath[64];
    const char *load = loaded_name(fd, path, fdpath, sizeof fdpath);
    dlerror();
    /* RTLD_NODELETE: ts_device_unload shuts the plugin down and dlcloses it, but its code
     * stays mapped. A plugin's libraries may leave threads behind that no API stops (libgomp's
     * pool spins in its own code for a while after each parallel region); unmapping that code
     * under them crashed `tessera train` at exit under valgrind (docs/reliability.md). */
    *handle = dlopen(load, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    loaded_done(fd, load == fdpath && *handle);
    if (!*handle) {
        const char *e = dlerror();
        return ts__fail(TS_EPLUGIN, "plugin '%s': cannot load %s: %s", name, path,
                        e ? e : "unknown dlopen error");
    }
    return TS_OK;
}

TS_API ts_status ts_device_load(const ts_config *cfg, const char *name_or_path, ts_device **out)
{
    if (!out || !name_or_path)
        return ts__fail(TS_EINVAL, "ts_device_load: NULL argument");
    *out = NULL;
    char *path = NULL;
    ts_status s = ts_plugin_find(cfg, name_or_path, &path);
    if (s)
        return s;
    ts_device *dev = ts__calloc(1, sizeof *dev);
    if (!dev) {
        free(path);
        return ts__fail(TS_ENOMEM, "out of memory loading plugin '%s'", name_or_path);
    }
    dev->path = path;
    if ((s = ts__plugin_dlopen(cfg, name_or_path, path, &dev->handle)))
        goto fail;
    ts_plugin_entry_fn entry;
    *(void **)&entry = dlsym(dev->handle, TS_PLUGIN_ENTRY_SYMBOL);
    if (!entry) {
        s = ts__fail(TS_EPLUGIN,
                     "plugin '%s': %s is not a tessera plugin: it does not export '%s' "
                     "(define it with TS_PLUGIN_DEFINE)",
                     name_or_path, path, TS_PLUGIN_ENTRY_SYMBOL);
        goto fail;
    }
    const ts_plugin_desc *d = entry(TS_PLUGIN_ABI_MAJOR, TS_PLUGIN_ABI_MINOR);
    if (!d) {
        s = ts__fail(TS_EPLUGIN, "plugin '%s' (%s) refused this tessera's plugin ABI %d.%d",
                     name_or_path, path, TS_PLUGIN_ABI_MAJOR, TS_PLUGIN_ABI_MINOR);
        goto fail;
    }
    if (d->abi_major != TS_PLUGIN_ABI_MAJOR) {
        s = ts__fail(TS_EPLUGIN,
                     "plugin '%s' (%s) was built for plugin ABI %u.%u, but this tessera speaks "
                     "ABI %d.%d; rebuild the plugin against this tessera's headers%s",
                     name_or_path, path, (unsigned)d->abi_major, (unsigned)d->abi_minor,
                     TS_PLUGIN_ABI_MAJOR, TS_PLUGIN_ABI_MINOR,
                     d->abi_major < 2 ? " (ABI 2 moved the caching pool into the host: a "
                     "plugin supplies mem_alloc/mem_free instead of a pool; see 'Porting from "
                     "ABI 1' in writing-a-plugin.md)" : "");
        goto fail;
    }
    size_t min_size = offsetof(ts_plugin_desc, synchronize) + sizeof d->synchronize;
    if (d->struct_size < min_size) {
        s = ts__fail(TS_EPLUGIN,
                     "plugin '%s' (%s): descriptor is %u bytes, smaller than the %zu bytes of "
                     "ABI %d.0; it is corrupt or was built against broken headers",
                     name_or_path, path, (unsigned)d->struct_size, min_size, TS_PLUGIN_ABI_MAJOR);
        goto fail;
    }
    dev->desc = d;
    memcpy(&dev->vt, d, d->struct_size < sizeof dev->vt ? d->struct_size : sizeof dev->vt);
    if (!dev->vt.name || !valid_name(dev->vt.name)) {
        s = ts__fail(TS_EPLUGIN, "plugin at %s has an invalid name '%s' (lower-case letters, "
                     "digits and '_')", path, dev->vt.name ? dev->vt.name : "(null)");
        goto fail;
    }
    uint32_t al = dev->vt.alignment;
    if (al < 16 || al > ((uint32_t)1 << 20) || (al & (al - 1))) {
        s = ts__fail(TS_EPLUGIN, "plugin '%s' (%s) declares an alignment of %u bytes: it must "
                     "be a power of two from 16 to 1 MiB (64 for CPU memory, 256 for CUDA)",
                     dev->vt.name, path, (unsigned)al);
        goto fail;
    }
    int nvm = !!dev->vt.vm_granularity + !!dev->vt.vm_reserve + !!dev->vt.vm_release +
              !!dev->vt.vm_commit + !!dev->vt.vm_decommit;
    if (nvm != 0 && nvm != 5) {
        s = ts__fail(TS_EPLUGIN, "plugin '%s' (%s) fills %d of the five vm_* members of its "
                     "descriptor: fill all five (an expandable segment) or none", dev->vt.name,
                     path, nvm);
        goto fail;
    }
    int ngraph = !!dev->vt.graph_begin + !!dev->vt.graph_end + !!dev->vt.graph_launch +
                 !!dev->vt.graph_free;
    if (ngraph != 0 && ngraph != 4) {
        s = ts__fail(TS_EPLUGIN, "plugin '%s' (%s) fills %d of the four graph_* members of "
                     "its descriptor: fill all four (graph capture) or none", dev->vt.name,
                     path, ngraph);
        goto fail;
    }
    if (!dev->vt.host_alloc != !dev->vt.host_free ||
        !dev->vt.copy_h2d_async != !dev->vt.wait_copy) {
        s = ts__fail(TS_EPLUGIN, "plugin '%s' (%s) fills only one of %s: fill both or neither",
                     dev->vt.name, path,
                     !dev->vt.host_alloc != !dev->vt.host_free ? "host_alloc / host_free"
                                                               : "copy_h2d_async / wait_copy");
        goto fail;
    }
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
        void *fnp;
        memcpy(&fnp, (const char *)&dev->vt + required[i].offset, sizeof fnp);
        if (!fnp) {
            s = ts__fail(TS_EPLUGIN,
                         "plugin '%s' (%s) leaves the required member '%s' of its descriptor "
                         "NULL",
                         dev->vt.name, path, required[i].name);
            goto fail;
        }
    }
    if (!strchr(name_or_path, '/') && strcmp(name_or_path, dev->vt.name) != 0) {
        s = ts__fail(TS_EPLUGIN, "%s calls itself '%s', not '%s'", path, dev->vt.name,
                     name_or_path);
        goto fail;
    }
    if (!(dev->name = ts__strdup(dev->vt.name))) {
        s = ts__fail(TS_ENOMEM, "out of memory");
        goto fail;
    }
    s = ts__config_plugin_settings(cfg, dev->name, dev->vt.config_keys, &dev->settings,
                                   &dev->nsettings);
    if (s)
        goto fail;
    dev->host = (ts_host){
        .abi_major = TS_PLUGIN_ABI_MAJOR,
        .abi_minor = TS_PLUGIN_ABI_MINOR,
        .struct_size = sizeof(ts_host),
        .fail = host_fail,
        .log = host_log,
        .host_memory = ts__host_memory,
        .scratch_alloc = host_scratch_alloc,
        .scratch_free = host_scratch_free,
        .host_private = dev,
    };
    ts_clear_error();
    s = dev->vt.init(&dev->host, dev->settings, dev->nsettings, &dev->ctx);
    if (s) {
        if (!ts_last_error()[0])
            ts__fail(s, "plugin '%s': init failed with %s and no message", dev->name,
                     ts_status_name(s));
        goto fail;
    }
    if ((s = ts__device_build_pool(cfg, dev)))
        goto fail_unload;
    *out = dev;
    return TS_OK;
fail:
    dev->ctx = NULL;
fail_unload:
    if (s) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", ts_last_error());
        ts_device_unload(dev);
        return ts__fail(s, "%s", msg);
    }
    ts_device_unload(dev);
    return s;
}

TS_API void ts_device_unload(ts_device *dev)
{
    if (!dev)
        return;
    /* The pool first: its segments go back through the plugin's mem_free / vm_release, which
     * need the instance alive. */
    if (dev->capturing) { /* a recording left open: dropped */
        ts_graph *g = NULL;
        ts_graph_capture_end(dev, &g);
        ts_graph_free(g);
    }
    ts__pool_destroy(dev->pinned);
    dev->pinned = NULL;
    free(dev->pinned_name);
    ts__pool_destroy(dev->pool);
    dev->pool = NULL;
    if (dev->ctx)
        dev->vt.shutdown(dev->ctx);
    /* Under AddressSanitizer the object stays mapped: LeakSanitizer would otherwise report
     * the C++ runtime's emergency pool, pulled in by oneDNN or CUDA, as leaked once its module
     * is gone, and could not symbolize reports from it. The plugin is shut down either way. */
#if !defined(__SANITIZE_ADDRESS__)
    if (dev->handle)
        dlclose(dev->handle);
#endif
    ts__settings_free(dev->settings, dev->nsettings);
    free(dev->name);
    free(dev->path);
    free(dev);
}
