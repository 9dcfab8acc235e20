/* core/safetensors.h: the checkpoint's layout shared by core/checkpoint.c (building, queries,
 * saving, a module's state) and core/checkpoint_load.c (reading and validating a file's header);
 * never installed. */
#ifndef TESSERA_CORE_SAFETENSORS_H
#define TESSERA_CORE_SAFETENSORS_H
#include "internal.h"

#define META_KEY "__metadata__"
#define MAX_HEADER ((uint64_t)100 << 20) /* safetensors' own bound is 100 MB */
#define MAX_JSON_INT 9007199254740992.0  /* 2^53: larger integers are not exact in a double */
#define MAX_BYTES (INT64_MAX / 16)       /* the bound ts_tensor_empty puts on numel */

typedef struct ck_entry {
    char *name;
    /* Owned reference. In a loaded checkpoint NULL until ts_checkpoint_get reads it (set once,
     * atomically, so concurrent gets are safe); always set in a built one. */
    ts_tensor *t;
    int32_t dtype;
    int ndim;
    int64_t shape[TS_MAX_DIMS];
    uint64_t nbytes; /* as dtype: what a tensor of it holds */
    uint64_t offset; /* loaded: where the bytes start, from the start of the file */
    int stored;      /* loaded: ST_NATIVE, or the file's dtype that converts to dtype */
    uint64_t stored_bytes; /* loaded: its bytes in the file */
} ck_entry;

typedef struct ck_meta {
    char *key, *value;
} ck_meta;

/* Positions of the tensors (or metadata keys) by name: open addressing, linear probing, so that
 * adding, finding and loading stay linear in the count. A list walk per lookup made `tessera
 * inspect` of a 300,000-tensor header 300,000^2 string compares. Both ck_entry and ck_meta
 * start with their name, which is how a slot's name is read. */
typedef struct name_index {
    size_t *slot; /* position + 1, 0 when empty; cap of them, a power of two, under half full */
    size_t cap;
} name_index;

struct ts_checkpoint {
    ck_entry *e;
    size_t n, cap;
    ck_meta *m;
    size_t nm, capm;
    name_index ie, im; /* e and m by name */
    /* A loaded checkpoint keeps its file open, to read tensors on demand: */
    int fd;           /* -1 for a built one */
    char *path;       /* for messages */
    ts_device *dev;   /* where ts_checkpoint_get creates tensors (NULL: the default) */
};


/* safetensors dtypes tessera has no dtype for, converted when a tensor is read: BOOL to uint8
 * (0 or 1). (F16 and BF16 are tessera's float16 and bfloat16, read as they are.) */
enum { ST_NATIVE = 0, ST_BOOL };
typedef struct st_converted_kind {
    const char *st;
    int32_t to;    /* the dtype it loads as */
    size_t esize;  /* bytes an element in the file */
} st_converted_kind;
extern const st_converted_kind ts__st_converted[2]; /* by ST_* */

/* The ST_* kind a safetensors dtype name converts from, or ST_NATIVE. */
int ts__st_converted_parse(const char *s);
/* A native safetensors dtype name's ts_dtype: 1 and *dtype set, else 0. */
int ts__st_dtype_parse(const char *s, int32_t *dtype);
/* The name index: room for n items (-1 out of memory), and item i entered. */
int ts__ck_ix_reserve(name_index *ix, const void *items, size_t stride, size_t n);
void ts__ck_ix_put(name_index *ix, const void *items, size_t stride, size_t i);
/* The entry or metadata item of that name, or NULL. */
ck_entry *ts__ck_find_entry(const ts_checkpoint *ck, const char *name);
ck_meta *ts__ck_find_meta(const ts_checkpoint *ck, const char *key);
/* Whether s[0..n) is valid UTF-8 (core/checkpoint_load.c). */
int ts__valid_utf8(const unsigned char *s, size_t n);
/* Adds metadata key = value (both owned from here on). */
ts_status ts__ck_put_meta(ts_checkpoint *ck, char *key, char *value);

#endif /* TESSERA_CORE_SAFETENSORS_H */
