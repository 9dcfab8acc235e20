/* tests/fuzz/fuzz-config.c: libFuzzer target for the INI configuration loader (core/config.c
 * over inih): any text must give TS_OK or TS_ECONFIG with a message, never a crash or leak;
 * what parsed must answer lookups. */
#include <string.h>

#include "fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = 0;
    ts_config *cfg = NULL;
    ts_status s = ts_config_parse(text, "fuzz.ini", "/nonexistent", &cfg);
    if (s == TS_OK) {
        static const char *keys[] = {"device", "fallback", "log_level",
                                     "allow_insecure_plugin_path", "plugin_path"};
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
            (void)ts_config_get(cfg, "core", keys[i]);
        (void)ts_config_get(cfg, "plugin.cpu_blas", "memory_fraction");
        (void)ts_config_source(cfg);
        ts_config_free(cfg);
    } else if (cfg != NULL || !ts_last_error()[0]) {
        abort(); /* a failure must leave *out NULL and say why */
    }
    unsigned long long bytes;
    (void)ts_parse_size(text, &bytes);
    free(text);
    return 0;
}
