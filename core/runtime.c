/* core/runtime.c: the process-wide runtime: the configuration in force, the default device
 * (with its fallback), and every device loaded by name, unloaded at ts_shutdown. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define MAX_DEVICES 32

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static ts_config *config;
static ts_device *devices[MAX_DEVICES];
static int ndevices;
static ts_device *default_device;

TS_API const char *ts_version(void)
{
    return PACKAGE_VERSION;
}

/* A device value from the INI file ([core] key, NULL when not from a file): relative paths
 * are relative to the file that set it, not the cwd. */
static char *resolve(const char *value, const char *key)
{
    const char *dir = key ? ts__config_dir_of(config, "core", key) : NULL;
    if (strchr(value, '/') && value[0] != '/' && dir)
        return ts__asprintf("%s/%s", dir, value);
    return ts__strdup(value);
}

/* A device name that is no plugin on the search path but close to one: the message says
 * which one was probably meant. Returns s. */
static ts_status guess_device(const char *want, ts_status s)
{
    char *path = NULL, msg[1024], guess[64];
    if (strchr(want, '/'))
        return s;
    snprintf(msg, sizeof msg, "%s", ts_last_error());
    ts_status found = ts_plugin_find(config, want, &path);
    free(path);
    if (found != TS_OK && ts__config_plugin_guess(config, want, guess, sizeof guess))
        return ts__fail(s, "%s; did you mean '%s'?", msg, guess);
    return ts__fail(s, "%s", msg);
}

/* Loads (or finds loaded) the device named by value; lock held. */
static ts_status get_locked(const char *value, const char *key, ts_device **out)
{
    char *want = resolve(value, key);
    if (!want)
        return ts__fail(TS_ENOMEM, "out of memory");
    for (int i = 0; i < ndevices; i++) {
        if (strcmp(ts_device_name(devices[i]), want) == 0 ||
            strcmp(ts_device_path(devices[i]), want) == 0) {
            *out = devices[i];
            free(want);
            return TS_OK;
        }
    }
    if (ndevices == MAX_DEVICES) {
        free(want);
        return ts__fail(TS_ENOMEM, "at most %d devices can be loaded at once", MAX_DEVICES);
    }
    ts_device *dev;
    ts_status s = ts_device_load(config, want, &dev);
    if (s) {
        s = guess_device(want, s);
        free(want);
        return s;
    }
    free(want);
    devices[ndevices++] = dev;
    *out = dev;
    return TS_OK;
}

TS_API ts_status ts_init(const char *config_path)
{
    pthread_mutex_lock(&lock);
    ts_status s = TS_OK;
    if (config) {
        s = ts__fail(TS_ESTATE, "ts_init: already initialised; call ts_shutdown first");
        goto out;
    }
    if ((s = ts_config_load(config_path, &config)))
        goto out;
    ts_set_log_level(ts__log_level_parse(ts_config_get(config, "core", "log_level")));
    ts__config_check_plugin_sections(config);
    const char *envdev = ts__getenv("TESSERA_DEVICE");
    int from_file = !(envdev && *envdev);
    const char *want = from_file ? ts_config_get(config, "core", "device") : envdev;
    const char *fallback = ts_config_get(config, "core", "fallback");
    s = get_locked(want, from_file ? "device" : NULL, &default_device);
    if (s && fallback && *fallback && strcmp(fallback, want) != 0) {
        char first[1024];
        snprintf(first, sizeof first, "%s", ts_last_error());
        ts_status s2 = get_locked(fallback, "fallback", &default_device);
        if (s2 == TS_OK) {
            ts__log(TS_LOG_WARN, "%s; falling back to '%s'", first, fallback);
            s = TS_OK;
        } else {
            s = ts__fail_prefix(s2, "%s; the fallback failed too: ", first);
        }
    }
out:
    if (s) {
        /* Keep the message: shutting down must not overwrite it. */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", ts_last_error());
        pthread_mutex_unlock(&lock);
        ts_shutdown();
        return ts__fail(s, "%s", msg);
    }
    pthread_mutex_unlock(&lock);
    return s;
}

TS_API void ts_shutdown(void)
{
    pthread_mutex_lock(&lock);
    for (int i = ndevices - 1; i >= 0; i--)
        ts_device_unload(devices[i]);
    ndevices = 0;
    default_device = NULL;
    ts_config_free(config);
    config = NULL;
    pthread_mutex_unlock(&lock);
}

TS_API const ts_config *ts_runtime_config(void)
{
    return config;
}

TS_API ts_device *ts_default_device(void)
{
    return default_device;
}

TS_API ts_status ts_device_get(const char *name, ts_device **out)
{
    if (!out || !name)
        return ts__fail(TS_EINVAL, "ts_device_get: NULL argument");
    *out = NULL;
    pthread_mutex_lock(&lock);
    ts_status s = config ? get_locked(name, NULL, out)
                         : ts__fail(TS_ESTATE, "ts_device_get('%s'): call ts_init first", name);
    pthread_mutex_unlock(&lock);
    return s;
}

TS_API void ts_empty_cache(ts_device *dev)
{
    if (dev) {
        ts_device_empty_cache(dev);
        return;
    }
    pthread_mutex_lock(&lock);
    for (int i = 0; i < ndevices; i++)
        ts_device_empty_cache(devices[i]);
    pthread_mutex_unlock(&lock);
}
