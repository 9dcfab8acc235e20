/* core/config_impl.h: the configuration's layout, shared by core/config.c (parsing, layers,
 * lookups) and core/settings.c (value parsing and a plugin's resolved settings); never
 * installed. */
#ifndef TESSERA_CORE_CONFIG_IMPL_H
#define TESSERA_CORE_CONFIG_IMPL_H
#include "internal.h"

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

/* Keys every [plugin.NAME] section has; a plugin may redeclare them to change the default. */
#define TS__NCOMMON 4
extern const ts_config_key ts__common_keys[TS__NCOMMON];

/* The entry for section.key in the merged layers, or NULL. */
const entry *ts__config_find_entry(const ts_config *cfg, const char *section, const char *key);
/* Parses text as key k's type into *s; 0 with what was expected in expected[] on failure. */
int ts__parse_setting(const ts_config_key *k, const char *text, ts_setting *s, char *expected,
                      size_t len);

#endif /* TESSERA_CORE_CONFIG_IMPL_H */
