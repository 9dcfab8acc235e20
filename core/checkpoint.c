/* core/checkpoint.c: named tensors and string metadata saved in the safetensors format. Saves
 * go through the atomic writer of core/fileio.c (ts__save_atomic). Loads validate the
 * whole header (cJSON does the parsing) and the layout of the data region, then keep the file
 * open and read a tensor's bytes only when it is asked for, with bounded reads only. No global
 * state: every call works on its own buffers. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "internal.h"

/* Tensor bytes are written and read in host order; safetensors is little-endian. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "checkpoint.c assumes a little-endian host: add byte swapping for this one");

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

static const struct {
    int32_t dtype;
    const char *st; /* the safetensors name */
} dtype_names[] = {
    {TS_F32, "F32"}, {TS_F64, "F64"}, {TS_I32, "I32"}, {TS_I64, "I64"}, {TS_U8, "U8"},
};
#define NDTYPES (sizeof dtype_names / sizeof dtype_names[0])

/* safetensors dtypes tessera does not compute in, converted when a tensor is read: half and
 * bfloat16 to float32 (exactly: every value of both is a float32), BOOL to uint8 (0 or 1). */
enum { ST_NATIVE = 0, ST_F16, ST_BF16, ST_BOOL };
static const struct {
    const char *st;
    int32_t to;    /* the dtype it loads as */
    size_t esize;  /* bytes an element in the file */
} converted[] = {
    {NULL, 0, 0}, {"F16", TS_F32, 2}, {"BF16", TS_F32, 2}, {"BOOL", TS_U8, 1},
};

static int st_converted_parse(const char *s)
{
    for (int i = ST_F16; i <= ST_BOOL; i++)
        if (strcmp(converted[i].st, s) == 0)
            return i;
    return ST_NATIVE;
}

/* IEEE half to float32, exactly (subnormals, infinities and NaN included). */
float ts__half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13); /* inf, NaN (payload kept) */
    } else if (exp) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man) { /* subnormal: normalise */
        int e = -1;
        do {
            e++;
            man <<= 1;
        } while (!(man & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
    } else {
        bits = sign;
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* n stored elements of kind at src (little-endian) into dst as their loaded dtype. */
static void convert_stored(int kind, const unsigned char *src, void *dst, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) {
        if (kind == ST_BOOL) {
            ((unsigned char *)dst)[i] = src[i] != 0;
            continue;
        }
        uint16_t v = (uint16_t)(src[2 * i] | src[2 * i + 1] << 8);
        float f;
        if (kind == ST_F16) {
            f = ts__half_to_float(v);
        } else {
            uint32_t bits = (uint32_t)v << 16;
            memcpy(&f, &bits, sizeof f);
        }
        memcpy((char *)dst + 4 * i, &f, 4);
    }
}

static const char *st_dtype_name(int32_t dtype)
{
    for (size_t i = 0; i < NDTYPES; i++)
        if (dtype_names[i].dtype == dtype)
            return dtype_names[i].st;
    return NULL;
}

static int st_dtype_parse(const char *s, int32_t *dtype)
{
    for (size_t i = 0; i < NDTYPES; i++)
        if (strcmp(dtype_names[i].st, s) == 0)
            return *dtype = dtype_names[i].dtype, 1;
    return 0;
}

/* ---- building ------------------------------------------------------------------------ */

TS_API ts_status ts_checkpoint_new(ts_checkpoint **out)
{
    if (!out)
        return ts__fail(TS_EINVAL, "ts_checkpoint_new: out is NULL");
    *out = ts__calloc(1, sizeof **out);
    if (!*out)
        return ts__fail(TS_ENOMEM, "out of memory for a checkpoint");
    (*out)->fd = -1;
    return TS_OK;
}

TS_API void ts_checkpoint_free(ts_checkpoint *ck)
{
    if (!ck)
        return;
    for (size_t i = 0; i < ck->n; i++) {
        free(ck->e[i].name);
        ts_tensor_unref(ck->e[i].t);
    }
    for (size_t i = 0; i < ck->nm; i++) {
        free(ck->m[i].key);
        free(ck->m[i].value);
    }
    free(ck->e);
    free(ck->m);
    free(ck->ie.slot);
    free(ck->im.slot);
    if (ck->fd >= 0)
        close(ck->fd);
    free(ck->path);
    free(ck);
}

/* The name of item i of an array of ck_entry or ck_meta (stride bytes each). */
static const char *item_name(const void *items, size_t stride, size_t i)
{
    return *(char *const *)((const char *)items + i * stride);
}

static size_t name_hash(const char *s) /* FNV-1a */
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return (size_t)(h ^ h >> 32);
}

/* The position of name among the n indexed items, or n. */
static size_t ix_find(const name_index *ix, const void *items, size_t stride, size_t n,
                      const char *name)
{
    if (!ix->cap)
        return n;
    for (size_t h = name_hash(name) & (ix->cap - 1);; h = (h + 1) & (ix->cap - 1)) {
        size_t v = ix->slot[h];
        if (!v)
            return n;
        if (strcmp(item_name(items, stride, v - 1), name) == 0)
            return v - 1;
    }
}

static void ix_put(name_index *ix, const void *items, size_t stride, size_t i)
{
    size_t h = name_hash(item_name(items, stride, i)) & (ix->cap - 1);
    while (ix->slot[h])
        h = (h + 1) & (ix->cap - 1);
    ix->slot[h] = i + 1;
}

/* Room for item n (the n before it indexed): the slots grown, and rehashed, when needed.
 * 0, or -1 out of memory (the index unchanged). Call before adding item n, ix_put it after. */
static int ix_reserve(name_index *ix, const void *items, size_t stride, size_t n)
{
    if ((n + 1) * 2 <= ix->cap)
        return 0;
    size_t cap = ix->cap ? ix->cap * 2 : 32;
    while ((n + 1) * 2 > cap)
        cap *= 2;
    size_t *slot = ts__calloc(cap, sizeof *slot);
    if (!slot)
        return -1;
    free(ix->slot);
    ix->slot = slot;
    ix->cap = cap;
    for (size_t i = 0; i < n; i++)
        ix_put(ix, items, stride, i);
    return 0;
}

static ck_entry *find_entry(const ts_checkpoint *ck, const char *name)
{
    size_t i = ix_find(&ck->ie, ck->e, sizeof *ck->e, ck->n, name);
    return i < ck->n ? &ck->e[i] : NULL;
}

static ck_meta *find_meta(const ts_checkpoint *ck, const char *key)
{
    size_t i = ix_find(&ck->im, ck->m, sizeof *ck->m, ck->nm, key);
    return i < ck->nm ? &ck->m[i] : NULL;
}

/* Appends (name, t) without checks; takes over name on success. */
static ts_status push_entry(ts_checkpoint *ck, char *name, ts_tensor *t)
{
    if (ck->n == ck->cap) {
        size_t cap = ck->cap ? ck->cap * 2 : 16;
        ck_entry *e = ts__realloc(ck->e, cap * sizeof *e);
        if (!e)
            return ts__fail(TS_ENOMEM, "out of memory adding tensor '%s' to a checkpoint", name);
        ck->e = e;
        ck->cap = cap;
    }
    if (ix_reserve(&ck->ie, ck->e, sizeof *ck->e, ck->n))
        return ts__fail(TS_ENOMEM, "out of memory adding tensor '%s' to a checkpoint", name);
    ck_entry *e = &ck->e[ck->n++];
    memset(e, 0, sizeof *e);
    e->name = name;
    ix_put(&ck->ie, ck->e, sizeof *ck->e, ck->n - 1);
    e->t = ts_tensor_ref(t);
    e->dtype = ts_tensor_dtype(t);
    e->ndim = ts_tensor_ndim(t);
    memcpy(e->shape, ts_tensor_shape(t), sizeof(int64_t) * (size_t)e->ndim);
    e->nbytes = (uint64_t)ts_tensor_numel(t) * ts_dtype_size(e->dtype);
    return TS_OK;
}

static int valid_utf8(const unsigned char *s, size_t n);

TS_API ts_status ts_checkpoint_add(ts_checkpoint *ck, const char *name, ts_tensor *t)
{
    if (!ck || !name || !t)
        return ts__fail(TS_EINVAL, "ts_checkpoint_add: NULL argument");
    if (!*name)
        return ts__fail(TS_EINVAL, "ts_checkpoint_add: empty tensor name");
    if (!valid_utf8((const unsigned char *)name, strlen(name)))
        return ts__fail(TS_EINVAL, "ts_checkpoint_add: the tensor name is not valid UTF-8, "
                        "which a safetensors header (JSON) must be");
    if (strcmp(name, META_KEY) == 0)
        return ts__fail(TS_EINVAL, "ts_checkpoint_add: '%s' is reserved for the metadata",
                        META_KEY);
    if (find_entry(ck, name))
        return ts__fail(TS_EINVAL, "ts_checkpoint_add: duplicate tensor name '%s'", name);
    if (!st_dtype_name(ts_tensor_dtype(t)))
        return ts__fail(TS_EDTYPE, "ts_checkpoint_add: tensor '%s' has dtype %s, which "
                                   "checkpoints do not store",
                        name, ts_dtype_name(ts_tensor_dtype(t)));
    char *copy = ts__strdup(name);
    if (!copy)
        return ts__fail(TS_ENOMEM, "out of memory adding tensor '%s' to a checkpoint", name);
    ts_status s = push_entry(ck, copy, t);
    if (s)
        free(copy);
    return s;
}

/* Sets key to value, taking over both strings on success. */
static ts_status put_meta(ts_checkpoint *ck, char *key, char *value)
{
    ck_meta *m = find_meta(ck, key);
    if (m) {
        free(m->value);
        m->value = value;
        free(key);
        return TS_OK;
    }
    if (ck->nm == ck->capm) {
        size_t cap = ck->capm ? ck->capm * 2 : 8;
        ck_meta *n = ts__realloc(ck->m, cap * sizeof *n);
        if (!n)
            return ts__fail(TS_ENOMEM, "out of memory for checkpoint metadata");
        ck->m = n;
        ck->capm = cap;
    }
    if (ix_reserve(&ck->im, ck->m, sizeof *ck->m, ck->nm))
        return ts__fail(TS_ENOMEM, "out of memory for checkpoint metadata");
    ck->m[ck->nm].key = key;
    ck->m[ck->nm].value = value;
    ck->nm++;
    ix_put(&ck->im, ck->m, sizeof *ck->m, ck->nm - 1);
    return TS_OK;
}

TS_API ts_status ts_checkpoint_set_meta(ts_checkpoint *ck, const char *key, const char *value)
{
    if (!ck || !key || !value)
        return ts__fail(TS_EINVAL, "ts_checkpoint_set_meta: NULL argument");
    if (!*key)
        return ts__fail(TS_EINVAL, "ts_checkpoint_set_meta: empty key");
    if (!valid_utf8((const unsigned char *)key, strlen(key)) ||
        !valid_utf8((const unsigned char *)value, strlen(value)))
        return ts__fail(TS_EINVAL, "ts_checkpoint_set_meta: the %s is not valid UTF-8, which a "
                        "safetensors header (JSON) must be",
                        valid_utf8((const unsigned char *)key, strlen(key)) ? "value" : "key");
    char *k = ts__strdup(key), *v = ts__strdup(value);
    ts_status s = TS_OK;
    if (!k || !v) {
        s = ts__fail(TS_ENOMEM, "out of memory for checkpoint metadata");
        goto fail;
    }
    if ((s = put_meta(ck, k, v)))
        goto fail;
    return TS_OK;
fail:
    free(k);
    free(v);
    return s;
}

/* ---- queries ------------------------------------------------------------------------- */

TS_API size_t ts_checkpoint_count(const ts_checkpoint *ck)
{
    return ck ? ck->n : 0;
}

TS_API const char *ts_checkpoint_name(const ts_checkpoint *ck, size_t i)
{
    return ck && i < ck->n ? ck->e[i].name : NULL;
}

/* Reads entry e's bytes from the loaded file into buf (e->nbytes of them). */
static ts_status read_raw(const ts_checkpoint *ck, const ck_entry *e, void *buf,
                          uint64_t nbytes)
{
    unsigned char *p = buf;
    uint64_t done = 0;
    while (done < nbytes) {
        size_t want = nbytes - done > ((size_t)1 << 30) ? (size_t)1 << 30
                                                        : (size_t)(nbytes - done);
        ssize_t r = pread(ck->fd, p + done, want, (off_t)(e->offset + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return ts__fail(TS_EIO, "%s: reading tensor '%s': %s", ck->path, e->name,
                            strerror(errno));
        if (r == 0)
            return ts__fail(TS_ECORRUPT, "%s: tensor '%s': the file ends inside its bytes (%" PRIu64
                            " of %" PRIu64 " read): it was truncated after it was loaded",
                            ck->path, e->name, done, nbytes);
        done += (uint64_t)r;
    }
    return TS_OK;
}

/* Entry e's bytes as its dtype (e->nbytes into buf): straight from the file, or converted
 * from the file's F16, BF16 or BOOL. */
static ts_status read_bytes(const ts_checkpoint *ck, const ck_entry *e, void *buf)
{
    if (e->stored == ST_NATIVE)
        return read_raw(ck, e, buf, e->nbytes);
    unsigned char *raw = ts__malloc(e->stored_bytes ? (size_t)e->stored_bytes : 1);
    if (!raw)
        return ts__fail(TS_ENOMEM, "%s: out of memory reading tensor '%s'", ck->path, e->name);
    ts_status s = read_raw(ck, e, raw, e->stored_bytes);
    if (s == TS_OK)
        convert_stored(e->stored, raw, buf, e->stored_bytes / converted[e->stored].esize);
    free(raw);
    return s;
}

/* Entry e as a new tensor on dev: its own reference if it has one, else read from the file.
 * (transfer full) */
static ts_status entry_tensor(const ts_checkpoint *ck, ck_entry *e, ts_device *dev,
                              ts_tensor **out)
{
    ts_tensor *t = __atomic_load_n(&e->t, __ATOMIC_ACQUIRE);
    if (t) {
        *out = ts_tensor_ref(t);
        return TS_OK;
    }
    void *buf = ts__malloc(e->nbytes ? (size_t)e->nbytes : 1);
    if (!buf)
        return ts__fail(TS_ENOMEM, "%s: out of memory for tensor '%s' (%" PRIu64 " bytes)",
                        ck->path, e->name, e->nbytes);
    ts_status s = read_bytes(ck, e, buf);
    if (s == TS_OK && (s = ts_tensor_from_host(dev, e->dtype, e->ndim, e->shape, buf, out)))
        ts__fail_prefix(s, "%s: tensor '%s': ", ck->path, e->name);
    free(buf);
    return s;
}

TS_API ts_tensor *ts_checkpoint_get(const ts_checkpoint *ck, const char *name)
{
    if (!ck || !name)
        return NULL;
    ck_entry *e = find_entry(ck, name);
    if (!e)
        return NULL;
    ts_tensor *t = __atomic_load_n(&e->t, __ATOMIC_ACQUIRE), *expected = NULL;
    if (t)
        return t;
    if (entry_tensor(ck, e, ck->dev, &t))
        return NULL;
    /* Two threads may read it at once: the first to publish wins, the other drops its copy. */
    if (!__atomic_compare_exchange_n(&e->t, &expected, t, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE)) {
        ts_tensor_unref(t);
        t = expected;
    }
    return t;
}

TS_API ts_status ts_checkpoint_tensor_info(const ts_checkpoint *ck, const char *name,
                                           int32_t *dtype, int *ndim, int64_t *shape)
{
    if (!ck || !name)
        return ts__fail(TS_EINVAL, "ts_checkpoint_tensor_info: NULL argument");
    const ck_entry *e = find_entry(ck, name);
    if (!e)
        return ts__fail(TS_EINVAL, "the checkpoint has no tensor '%s'", name);
    if (dtype)
        *dtype = e->dtype;
    if (ndim)
        *ndim = e->ndim;
    if (shape)
        memcpy(shape, e->shape, sizeof(int64_t) * (size_t)e->ndim);
    return TS_OK;
}

TS_API const char *ts_checkpoint_stored_dtype(const ts_checkpoint *ck, const char *name)
{
    ck_entry *e = ck && name ? find_entry(ck, name) : NULL;
    if (!e)
        return NULL;
    return e->stored != ST_NATIVE ? converted[e->stored].st : st_dtype_name(e->dtype);
}

TS_API size_t ts_checkpoint_meta_count(const ts_checkpoint *ck)
{
    return ck ? ck->nm : 0;
}

TS_API const char *ts_checkpoint_meta_key(const ts_checkpoint *ck, size_t i)
{
    return ck && i < ck->nm ? ck->m[i].key : NULL;
}

TS_API const char *ts_checkpoint_meta(const ts_checkpoint *ck, const char *key)
{
    if (!ck || !key)
        return NULL;
    ck_meta *m = find_meta(ck, key);
    return m ? m->value : NULL;
}

TS_API ts_status ts_checkpoint_restore(const ts_checkpoint *ck, const char *name, ts_tensor *dst)
{
    if (!ck || !name || !dst)
        return ts__fail(TS_EINVAL, "ts_checkpoint_restore: NULL argument");
    ck_entry *e = find_entry(ck, name);
    if (!e)
        return ts__fail(TS_EINVAL, "ts_checkpoint_restore: the checkpoint has no tensor '%s'",
                        name);
    char a[200], b[200], sh[160];
    snprintf(a, sizeof a, "%s%s", ts_dtype_name(e->dtype),
             ts__shape_str(e->ndim, e->shape, sh, sizeof sh));
    ts_tensor_describe(dst, b, sizeof b);
    if (e->dtype != ts_tensor_dtype(dst))
        return ts__fail(TS_EDTYPE, "ts_checkpoint_restore: '%s' is %s in the checkpoint but the "
                                   "destination is %s",
                        name, a, b);
    int same = e->ndim == ts_tensor_ndim(dst);
    for (int d = 0; same && d < e->ndim; d++)
        same = e->shape[d] == ts_tensor_shape(dst)[d];
    if (!same)
        return ts__fail(TS_ESHAPE, "ts_checkpoint_restore: '%s' is %s in the checkpoint but the "
                                   "destination is %s",
                        name, a, b);
    /* Not cached: a restored tensor costs memory only for the copy. */
    ts_tensor *src = NULL;
    ts_status s = entry_tensor(ck, e, ts_tensor_device(dst), &src);
    if (s)
        return s;
    /* Restoring parameters is not a differentiable op: no graph, and no in-place refusal. */
    ts_no_grad_enter();
    s = ts_copy_(dst, src);
    ts_no_grad_exit();
    ts_tensor_unref(src);
    if (s)
        return ts__fail_prefix(s, "ts_checkpoint_restore: '%s': ", name);
    return TS_OK;
}

/* ---- saving -------------------------------------------------------------------------- */

/* An exact integer for the header: raw text, so cJSON never prints it as 1e+15. */
static int add_u64(cJSON *arr, uint64_t v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRIu64, v);
    cJSON *n = cJSON_CreateRaw(buf);
    return n && cJSON_AddItemToArray(arr, n);
}

/* The padded header text (length a multiple of 8) for the tensors in order. (transfer full) */
static ts_status build_header(const ts_checkpoint *ck, const char *path, char **out,
                              size_t *len)
{
    ts_status s = TS_OK;
    char *text = NULL;
    cJSON *root = cJSON_CreateObject();
    if (!root)
        goto nomem;
    if (ck->nm) {
        cJSON *meta = cJSON_AddObjectToObject(root, META_KEY);
        if (!meta)
            goto nomem;
        for (size_t i = 0; i < ck->nm; i++)
            if (!cJSON_AddStringToObject(meta, ck->m[i].key, ck->m[i].value))
                goto nomem;
    }
    uint64_t at = 0;
    for (size_t i = 0; i < ck->n; i++) {
        const ck_entry *e = &ck->e[i];
        uint64_t nbytes = e->nbytes;
        cJSON *o = cJSON_AddObjectToObject(root, e->name), *shape, *offs;
        if (!o || !cJSON_AddStringToObject(o, "dtype", st_dtype_name(e->dtype)) ||
            !(shape = cJSON_AddArrayToObject(o, "shape")))
            goto nomem;
        for (int d = 0; d < e->ndim; d++)
            if (!add_u64(shape, (uint64_t)e->shape[d]))
                goto nomem;
        if (!(offs = cJSON_AddArrayToObject(o, "data_offsets")) || !add_u64(offs, at) ||
            !add_u64(offs, at + nbytes))
            goto nomem;
        at += nbytes;
    }
    char *json = cJSON_PrintUnformatted(root);
    if (!json)
        goto nomem;
    size_t n = strlen(json), padded = (n + 7) / 8 * 8;
    text = ts__malloc(padded + 1);
    if (!text) {
        cJSON_free(json);
        goto nomem;
    }
    memcpy(text, json, n);
    memset(text + n, ' ', padded - n);
    text[padded] = 0;
    cJSON_free(json);
    if (padded > MAX_HEADER) {
        s = ts__fail(TS_EINVAL, "%s: the header would be %zu bytes; readers accept at most %"
                                PRIu64,
                     path, padded, MAX_HEADER);
        goto fail;
    }
    cJSON_Delete(root);
    *out = text;
    *len = padded;
    return TS_OK;
nomem:
    s = ts__fail(TS_ENOMEM, "%s: out of memory building the checkpoint header", path);
fail:
    free(text);
    cJSON_Delete(root);
    return s;
}

TS_API ts_status ts_checkpoint_check_path(const char *path)
{
    if (!path || !*path)
        return ts__fail(TS_EINVAL, "ts_checkpoint_check_path: NULL or empty path");
    return ts_file_check_path(path, "the checkpoint");
}

/* The checkpoint's bytes: length, header, every tensor (ts__save_body). */
typedef struct ck_body {
    const ts_checkpoint *ck;
    const char *header;
    size_t hlen, maxbytes;
} ck_body;

static int write_checkpoint(ts__saver *sv, int fd, void *user)
{
    ck_body *cb = user;
    const ts_checkpoint *ck = cb->ck;
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)((uint64_t)cb->hlen >> (8 * i));
    if (ts__save_write(sv, fd, len8, 8) || ts__save_write(sv, fd, cb->header, cb->hlen))
        return TS__SAVE_IO;
    void *buf = cb->maxbytes ? ts__malloc(cb->maxbytes) : NULL;
    if (cb->maxbytes && !buf)
        return ts__fail(TS_ENOMEM, "%s: out of memory saving the checkpoint", ts__save_path(sv));
    for (size_t i = 0; i < ck->n; i++) {
        ck_entry *e = &ck->e[i];
        ts_tensor *t = __atomic_load_n(&e->t, __ATOMIC_ACQUIRE);
        /* A loaded checkpoint's unread tensors go from file to file, never to a device. */
        ts_status s = t ? ts_tensor_to_host(t, buf, (size_t)e->nbytes) : read_bytes(ck, e, buf);
        if (s) {
            free(buf);
            return ts__fail_prefix(s, "%s: tensor '%s': ", ts__save_path(sv), e->name);
        }
        if (ts__save_write(sv, fd, buf, (size_t)e->nbytes)) {
            int err = errno;
            free(buf);
            errno = err;
            return TS__SAVE_IO;
        }
    }
    free(buf);
    return 0;
}

TS_API ts_status ts_checkpoint_save(const ts_checkpoint *ck, const char *path)
{
    if (!ck || !path || !*path)
        return ts__fail(TS_EINVAL, "ts_checkpoint_save: NULL argument or empty path");
    ck_body cb = {.ck = ck};
    char *header = NULL;
    ts_status s = build_header(ck, path, &header, &cb.hlen);
    if (s)
        return s;
    cb.header = header;
    for (size_t i = 0; i < ck->n; i++)
        cb.maxbytes = ck->e[i].nbytes > cb.maxbytes ? (size_t)ck->e[i].nbytes : cb.maxbytes;
    s = ts__save_atomic(path, "the checkpoint", write_checkpoint, &cb);
    free(header);
    return s;
}

/* ---- loading ------------------------------------------------------------------------- */

/* What load knows about one header entry while validating it. */
typedef struct ld_entry {
    int32_t dtype;
    int ndim;
    int64_t shape[TS_MAX_DIMS];
    uint64_t begin, end; /* data_offsets: from the start of the data region */
    int stored;          /* ST_NATIVE or the converted file dtype */
} ld_entry;

/* An exact non-negative integer in a JSON number: 0, or -1 not an integer, -2 negative. */
static int json_uint(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v))
        return -1;
    double d = v->valuedouble;
    if (!isfinite(d) || d != floor(d) || d > MAX_JSON_INT)
        return -1;
    if (d < 0)
        return -2;
    *out = (uint64_t)d;
    return TS_OK;
}

/* Non-zero if s (n bytes) is valid UTF-8 (JSON text must be; safetensors checks it). */
static int valid_utf8(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        size_t k;
        uint32_t cp;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xe0) == 0xc0) {
            k = 1, cp = c & 0x1f;
        } else if ((c & 0xf0) == 0xe0) {
            k = 2, cp = c & 0x0f;
        } else if ((c & 0xf8) == 0xf0) {
            k = 3, cp = c & 0x07;
        } else {
            return 0;
        }
        if (n - i <= k)
            return 0;
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xc0) != 0x80)
                return 0;
            cp = cp << 6 | (s[i + j] & 0x3f);
        }
        if ((k == 1 && cp < 0x80) || (k == 2 && cp < 0x800) || (k == 3 && cp < 0x10000) ||
            cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return 0;
        i += k + 1;
    }
    return 1;
}

/* Whether the JSON text escapes a NUL (\u0000) inside a string. cJSON decodes it into the
 * middle of a C string, which would then end early: "a\u0000b" would become the name "a". */
static int has_nul_escape(const char *s, size_t n)
{
    int in_string = 0;
    for (size_t i = 0; i < n; i++) {
        if (!in_string) {
            in_string = s[i] == '"';
            continue;
        }
        if (s[i] == '"') {
            in_string = 0;
        } else if (s[i] == '\\' && i + 1 < n) {
            if (s[i + 1] == 'u' && i + 5 < n && s[i + 2] == '0' && s[i + 3] == '0' &&
                s[i + 4] == '0' && s[i + 5] == '0')
                return 1;
            i++; /* the escaped character: \\ and \" end nothing */
        }
    }
    return 0;
}

/* Sorts entries by where their bytes lie (ties: header order, so it is deterministic). */
static int cmp_offsets(const void *a, const void *b)
{
    const ck_entry *x = *(const ck_entry *const *)a, *y = *(const ck_entry *const *)b;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    if (x->stored_bytes != y->stored_bytes)
        return x->stored_bytes < y->stored_bytes ? -1 : 1;
    return x < y ? -1 : x > y;
}

#define CORRUPT(...) (s = ts__fail(TS_ECORRUPT, __VA_ARGS__))

/* Validates the header entry of tensor name (item: its value) into e. */
static ts_status parse_entry(const char *path, const char *name, const cJSON *item,
                             uint64_t data_len, ld_entry *e)
{
    ts_status s = TS_OK;
    const cJSON *dt = NULL, *shape = NULL, *offs = NULL;
    if (!cJSON_IsObject(item))
        return CORRUPT("%s: tensor '%s': the entry is not a JSON object", path, name);
    for (const cJSON *c = item->child; c; c = c->next) {
        const cJSON **slot = strcmp(c->string, "dtype") == 0    ? &dt
                             : strcmp(c->string, "shape") == 0  ? &shape
                             : strcmp(c->string, "data_offsets") == 0 ? &offs
                                                                       : NULL;
        if (!slot)
            return CORRUPT("%s: tensor '%s': unknown key '%s' (expected dtype, shape, "
                           "data_offsets)",
                           path, name, c->string);
        if (*slot)
            return CORRUPT("%s: tensor '%s': duplicate key '%s'", path, name, c->string);
        *slot = c;
    }
    if (!dt || !shape || !offs)
        return CORRUPT("%s: tensor '%s': missing key '%s'", path, name,
                       !dt ? "dtype" : !shape ? "shape" : "data_offsets");
    if (!cJSON_IsString(dt))
        return CORRUPT("%s: tensor '%s': dtype is not a string", path, name);
    e->stored = ST_NATIVE;
    if (!st_dtype_parse(dt->valuestring, &e->dtype)) {
        e->stored = st_converted_parse(dt->valuestring);
        if (e->stored == ST_NATIVE)
            return CORRUPT("%s: tensor '%s': unknown or unsupported dtype '%s' (tessera reads "
                           "F32, F64, I32, I64, U8, and F16, BF16 and BOOL converted)",
                           path, name, dt->valuestring);
        e->dtype = converted[e->stored].to;
    }
    if (!cJSON_IsArray(shape))
        return CORRUPT("%s: tensor '%s': shape is not an array", path, name);
    int nd = cJSON_GetArraySize(shape);
    if (nd > TS_MAX_DIMS)
        return CORRUPT("%s: tensor '%s': shape has %d dims; tensors have at most %d", path, name,
                       nd, TS_MAX_DIMS);
    e->ndim = 0;
    uint64_t numel = 1, nonzero = 1;
    for (const cJSON *c = shape->child; c; c = c->next) {
        uint64_t v = 0;
        int r = json_uint(c, &v);
        if (r == -2)
            return CORRUPT("%s: tensor '%s': negative size %g in shape", path, name,
                           c->valuedouble);
        if (r)
            return CORRUPT("%s: tensor '%s': shape holds something other than a non-negative "
                           "integer",
                           path, name);
        /* Zeros left out: (0, 2^40, 2^40) has no elements, but its strides would overflow. */
        if (v && nonzero > (uint64_t)MAX_BYTES / v)
            return CORRUPT("%s: tensor '%s': shape is too large: the product of its sizes "
                           "(zeros left out) overflows",
                           path, name);
        nonzero *= v ? v : 1;
        numel *= v;
        e->shape[e->ndim++] = (int64_t)v;
    }
    /* the file's element size; the loaded one (float32 for F16) must not overflow either */
    size_t esize = e->stored ? converted[e->stored].esize : ts_dtype_size(e->dtype);
    size_t lsize = ts_dtype_size(e->dtype);
    char sh[200];
    ts__shape_str(e->ndim, e->shape, sh, sizeof sh);
    if (numel > (uint64_t)MAX_BYTES / (esize > lsize ? esize : lsize))
        return CORRUPT("%s: tensor '%s': shape %s overflows: its byte count is too large", path,
                       name, sh);
    uint64_t need = numel * esize;
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2)
        return CORRUPT("%s: tensor '%s': data_offsets is not an array of two integers", path,
                       name);
    int r0 = json_uint(offs->child, &e->begin), r1 = json_uint(offs->child->next, &e->end);
    if (r0 || r1)
        return CORRUPT("%s: tensor '%s': data_offsets must be two non-negative integers%s", path,
                       name, r0 == -2 || r1 == -2 ? " (found a negative one)" : "");
    if (e->end < e->begin)
        return CORRUPT("%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] end before "
                       "they begin",
                       path, name, e->begin, e->end);
    if (e->end > data_len)
        return CORRUPT("%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] reach past the "
                       "end of the data region (%" PRIu64 " bytes): truncated or corrupt file",
                       path, name, e->begin, e->end, data_len);
    if (e->end - e->begin != need)
        return CORRUPT("%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] hold %" PRIu64
                       " bytes but %s %s needs %" PRIu64,
                       path, name, e->begin, e->end, e->end - e->begin,
                       e->stored ? converted[e->stored].st : ts_dtype_name(e->dtype), sh, need);
    return TS_OK;
}

/* The header is scanned one top-level member at a time: the scanner below walks the object's
 * punctuation and keys, and cJSON parses each member's value alone, its tree freed before the
 * next. A tree of the whole header costs about 12 times its text (a 20 MB header of small
 * entries took 320 MB); this way a load holds the text, the entries and one value's tree. */
typedef struct hdr_scan {
    const char *path, *text; /* text: len bytes, NUL after them */
    size_t len, at;          /* at: the next byte to read */
} hdr_scan;

static void scan_ws(hdr_scan *h)
{
    while (h->at < h->len && (h->text[h->at] == ' ' || h->text[h->at] == '\t' ||
                              h->text[h->at] == '\n' || h->text[h->at] == '\r'))
        h->at++;
}

static ts_status scan_error(const hdr_scan *h, size_t at)
{
    return ts__fail(TS_ECORRUPT, "%s: the header is not valid JSON (error near byte %zu of %zu)",
                    h->path, at, h->len);
}

/* The JSON value at the scan position, parsed by cJSON. (transfer full) *out. */
static ts_status scan_value(hdr_scan *h, cJSON **out)
{
    const char *end = NULL;
    scan_ws(h);
    *out = h->at < h->len ? cJSON_ParseWithLengthOpts(h->text + h->at, h->len - h->at, &end, 0)
                          : NULL;
    if (!*out)
        return scan_error(h, end && end > h->text + h->at ? (size_t)(end - h->text) : h->at);
    h->at = (size_t)(end - h->text);
    return TS_OK;
}

/* The next member of the object at the scan position: its key in *key, (transfer full), the
 * scan left at its value; *key NULL after the closing brace. *first is 1 before the opening
 * brace, and scan_member clears it. */
static ts_status scan_member(hdr_scan *h, int *first, char **key)
{
    ts_status s;
    *key = NULL;
    scan_ws(h);
    int opening = *first;
    if (opening) {
        if (h->at >= h->len || h->text[h->at] != '{')
            return scan_error(h, h->at);
        h->at++;
        scan_ws(h);
        *first = 0;
    }
    if (h->at < h->len && h->text[h->at] == '}') {
        h->at++;
        return TS_OK;
    }
    if (!opening) {
        if (h->at >= h->len || h->text[h->at] != ',')
            return scan_error(h, h->at);
        h->at++;
        scan_ws(h);
    }
    if (h->at >= h->len || h->text[h->at] != '"')
        return scan_error(h, h->at);
    /* A key without escapes is its bytes (the header is valid UTF-8 without NUL); one with
     * escapes is decoded by cJSON like every other string. */
    const char *k = h->text + h->at + 1, *q = memchr(k, '"', h->len - h->at - 1);
    if (q && !memchr(k, '\\', (size_t)(q - k))) {
        if (!(*key = ts__malloc((size_t)(q - k) + 1)))
            return ts__fail(TS_ENOMEM, "%s: out of memory reading the header", h->path);
        memcpy(*key, k, (size_t)(q - k));
        (*key)[q - k] = 0;
        h->at = (size_t)(q + 1 - h->text);
    } else {
        cJSON *v;
        if ((s = scan_value(h, &v)))
            return s;
        *key = ts__strdup(v->valuestring);
        cJSON_Delete(v);
        if (!*key)
            return ts__fail(TS_ENOMEM, "%s: out of memory reading the header", h->path);
    }
    scan_ws(h);
    if (h->at >= h->len || h->text[h->at] != ':') {
        free(*key);
        *key = NULL;
        return scan_error(h, h->at);
    }
    h->at++;
    return TS_OK;
}

/* The __metadata__ object at the scan position into ck: string values, no key twice. */
static ts_status scan_meta(hdr_scan *h, ts_checkpoint *ck)
{
    ts_status s = TS_OK;
    scan_ws(h);
    if (h->at < h->len && h->text[h->at] != '{') {
        cJSON *v = NULL;
        if (!(s = scan_value(h, &v)))
            s = ts__fail(TS_ECORRUPT, "%s: %s is not a JSON object", h->path, META_KEY);
        cJSON_Delete(v);
        return s;
    }
    int first = 1;
    for (;;) {
        char *key = NULL, *value = NULL;
        cJSON *v = NULL;
        if ((s = scan_member(h, &first, &key)) || !key)
            return s;
        if ((s = scan_value(h, &v)))
            ;
        else if (!cJSON_IsString(v))
            CORRUPT("%s: metadata '%s': the value is not a string", h->path, key);
        else if (find_meta(ck, key))
            CORRUPT("%s: duplicate metadata key '%s'", h->path, key);
        else if (!(value = ts__strdup(v->valuestring)) || put_meta(ck, key, value))
            s = ts__fail(TS_ENOMEM, "%s: out of memory reading the metadata", h->path);
        cJSON_Delete(v);
        if (s) {
            free(key);
            free(value);
            return s;
        }
    }
}

/* Appends the validated entry le of tensor name (taken over on success) to a loaded ck;
 * base: where the data region starts in the file. */
static ts_status add_loaded(ts_checkpoint *ck, char *name, const ld_entry *le, uint64_t base)
{
    if (ck->n == ck->cap) {
        size_t cap = ck->cap ? ck->cap * 2 : 64;
        ck_entry *e = ts__realloc(ck->e, cap * sizeof *e);
        if (!e)
            return ts__fail(TS_ENOMEM, "%s: out of memory for %zu tensors", ck->path, cap);
        ck->e = e;
        ck->cap = cap;
    }
    if (ix_reserve(&ck->ie, ck->e, sizeof *ck->e, ck->n))
        return ts__fail(TS_ENOMEM, "%s: out of memory for %zu tensors", ck->path, ck->n + 1);
    ck_entry *e = &ck->e[ck->n++];
    memset(e, 0, sizeof *e);
    e->name = name;
    e->dtype = le->dtype;
    e->ndim = le->ndim;
    memcpy(e->shape, le->shape, sizeof e->shape);
    e->stored = le->stored;
    e->stored_bytes = le->end - le->begin;
    e->nbytes = le->stored ? e->stored_bytes / converted[le->stored].esize *
                                 ts_dtype_size(le->dtype)
                           : e->stored_bytes;
    e->offset = base + le->begin;
    ix_put(&ck->ie, ck->e, sizeof *ck->e, ck->n - 1);
    return TS_OK;
}

/* Validates the header (len bytes of text, NUL-terminated) into ck: the tensors in header
 * order, the metadata, and that the tensors tile the data region (data_len bytes from base). */
static ts_status parse_header(ts_checkpoint *ck, const char *text, size_t len, uint64_t base,
                              uint64_t data_len)
{
    ts_status s = TS_OK;
    const char *path = ck->path;
    hdr_scan h = {path, text, len, 0};
    ck_entry **sorted = NULL;
    int first = 1, seen_meta = 0;
    scan_ws(&h);
    if (h.at < len && text[h.at] != '{') {
        const char *end = NULL;
        cJSON *v = cJSON_ParseWithLengthOpts(text, len + 1, &end, 1);
        cJSON_Delete(v);
        if (!v)
            return scan_error(&h, end ? (size_t)(end - text) : 0);
        return CORRUPT("%s: the header is valid JSON but not a JSON object", path);
    }
    for (;;) {
        char *name = NULL;
        cJSON *item = NULL;
        ld_entry le;
        if ((s = scan_member(&h, &first, &name)))
            return s;
        if (!name)
            break;
        if (strcmp(name, META_KEY) == 0) {
            free(name);
            if (seen_meta++)
                return CORRUPT("%s: duplicate tensor name '%s' in the header", path, META_KEY);
            if ((s = scan_meta(&h, ck)))
                return s;
            continue;
        }
        if (!name[0])
            CORRUPT("%s: a tensor has an empty name", path);
        else if (find_entry(ck, name))
            CORRUPT("%s: duplicate tensor name '%s' in the header", path, name);
        else if (!(s = scan_value(&h, &item)) && !(s = parse_entry(path, name, item, data_len,
                                                                    &le)))
            s = add_loaded(ck, name, &le, base);
        cJSON_Delete(item);
        if (s) {
            free(name);
            return s;
        }
    }
    scan_ws(&h);
    if (h.at != len)
        return scan_error(&h, h.at);
    /* The tensors must tile the data region exactly: no overlaps, holes or trailing bytes. */
    if (ck->n && !(sorted = ts__malloc(ck->n * sizeof *sorted)))
        return ts__fail(TS_ENOMEM, "%s: out of memory reading the header", path);
    for (size_t i = 0; i < ck->n; i++)
        sorted[i] = &ck->e[i];
    if (ck->n)
        qsort(sorted, ck->n, sizeof *sorted, cmp_offsets);
    uint64_t at = 0;
    const char *prev = NULL;
    for (size_t i = 0; i < ck->n; i++) {
        const ck_entry *e = sorted[i];
        uint64_t begin = e->offset - base, end = begin + e->stored_bytes;
        if (begin < at) {
            CORRUPT("%s: tensors '%s' and '%s' overlap (data_offsets [%" PRIu64 ", %" PRIu64
                    "] begin before %" PRIu64 ")",
                    path, prev, e->name, begin, end, at);
            goto fail;
        }
        if (begin > at) {
            CORRUPT("%s: a hole of %" PRIu64 " bytes at data offset %" PRIu64 " before tensor "
                    "'%s': tensors must be packed with no gaps",
                    path, begin - at, at, e->name);
            goto fail;
        }
        at = end;
        prev = e->name;
    }
    if (at != data_len)
        CORRUPT("%s: %" PRIu64 " trailing bytes after the last tensor (the data region is %" PRIu64
                " bytes, the tensors cover %" PRIu64 ")",
                path, data_len - at, data_len, at);
fail:
    free(sorted);
    return s;
}

/* Reads exactly n bytes at offset; TS_ECORRUPT naming the file if it ends early. */
static ts_status read_exact(int fd, const char *path, void *buf, size_t n, uint64_t offset,
                            const char *what)
{
    unsigned char *p = buf;
    size_t done = 0;
    while (done < n) {
        ssize_t r = pread(fd, p + done, n - done, (off_t)(offset + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return ts__fail(TS_EIO, "%s: reading %s: %s", path, what, strerror(errno));
        if (r == 0)
            return ts__fail(TS_ECORRUPT, "%s: truncated file: it ends inside %s", path, what);
        done += (size_t)r;
    }
    return TS_OK;
}

TS_API ts_status ts_checkpoint_load(const char *path, ts_device *dev, ts_checkpoint **out)
{
    if (!out)
        return ts__fail(TS_EINVAL, "ts_checkpoint_load: out is NULL");
    *out = NULL;
    if (!path)
        return ts__fail(TS_EINVAL, "ts_checkpoint_load: path is NULL");
    ts_status s = TS_OK;
    ts_checkpoint *ck = NULL;
    char *header = NULL;
    struct stat st;
    int fd = -1;
    if ((s = ts__open_input(path, "checkpoint", &fd, &st)))
        goto fail;
    uint64_t size = (uint64_t)st.st_size;
    if (size < 8) {
        CORRUPT("%s: the file is %" PRIu64 " bytes; a safetensors file starts with an 8-byte "
                "header length (empty or truncated file)",
                path, size);
        goto fail;
    }
    unsigned char len8[8];
    if ((s = read_exact(fd, path, len8, 8, 0, "the header length")))
        goto fail;
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++)
        hlen |= (uint64_t)len8[i] << (8 * i);
    if (hlen > size - 8) {
        CORRUPT("%s: header length %" PRIu64 " is larger than the file (%" PRIu64 " bytes "
                "after the length): truncated or not a safetensors file",
                path, hlen, size - 8);
        goto fail;
    }
    if (hlen > MAX_HEADER) {
        CORRUPT("%s: header length %" PRIu64 " exceeds the limit of %" PRIu64 " bytes", path,
                hlen, MAX_HEADER);
        goto fail;
    }
    if (hlen < 2) {
        CORRUPT("%s: header length %" PRIu64 " is too small for a JSON object", path, hlen);
        goto fail;
    }
    if (!(header = ts__malloc(hlen + 1)) || !(ck = ts__calloc(1, sizeof *ck))) {
        s = ts__fail(TS_ENOMEM, "%s: out of memory for a %" PRIu64 "-byte header", path, hlen);
        goto fail;
    }
    ck->fd = -1;
    if ((s = read_exact(fd, path, header, hlen, 8, "the header")))
        goto fail;
    header[hlen] = 0;
    if (memchr(header, 0, hlen)) {
        CORRUPT("%s: the header contains a NUL byte: not JSON", path);
        goto fail;
    }
    if (!valid_utf8((const unsigned char *)header, hlen)) {
        CORRUPT("%s: the header is not valid UTF-8, so not JSON", path);
        goto fail;
    }
    if (has_nul_escape(header, hlen)) {
        CORRUPT("%s: the header escapes a NUL character (\\u0000) in a string: names, dtypes "
                "and metadata may not contain NUL",
                path);
        goto fail;
    }
    /* The header says everything. No tensor is read here: ts_checkpoint_get and
     * ts_checkpoint_restore read one when it is asked for, so a tensor nobody uses costs
     * nothing however large the header says it is. */
    if (!(ck->path = ts__strdup(path))) {
        s = ts__fail(TS_ENOMEM, "%s: out of memory", path);
        goto fail;
    }
    if ((s = parse_header(ck, header, (size_t)hlen, 8 + hlen, size - 8 - hlen)))
        goto fail;
    size_t nconv[4] = {0};
    for (size_t i = 0; i < ck->n; i++)
        nconv[ck->e[i].stored]++;
    if (nconv[ST_F16] + nconv[ST_BF16] + nconv[ST_BOOL])
        ts__log(TS_LOG_WARN, "%s: %zu F16 and %zu BF16 tensors load as float32, %zu BOOL as "
                "uint8 (the dtypes tessera computes in); a save writes them so", path,
                nconv[ST_F16], nconv[ST_BF16], nconv[ST_BOOL]);
    ck->fd = fd;
    ck->dev = dev;
    fd = -1;
    *out = ck;
    ck = NULL;
fail:
    if (fd >= 0)
        close(fd);
    ts_checkpoint_free(ck);
    free(header);
    return s;
}

/* ---- a module's state ---------------------------------------------------------------- */

/* Every parameter and buffer of m, parameters first. (transfer full) *out, *n of them. */
static ts_status module_state(ts_module *m, ts_named_tensor **out, size_t *n)
{
    size_t np = ts_module_parameters(m, NULL, 0), nb = ts_module_buffers(m, NULL, 0);
    ts_named_tensor *all = ts__calloc(np + nb + 1, sizeof *all);
    if (!all)
        return ts__fail(TS_ENOMEM, "out of memory listing a module's tensors");
    ts_module_parameters(m, all, np);
    ts_module_buffers(m, all + np, nb);
    *out = all;
    *n = np + nb;
    return TS_OK;
}

/* prefix + name into buf; TS_EINVAL when it does not fit. */
static ts_status state_name(const char *prefix, const char *name, char *buf, size_t len)
{
    if ((size_t)snprintf(buf, len, "%s%s", prefix ? prefix : "", name) >= len)
        return ts__fail(TS_EINVAL, "tensor name '%s%s' is too long", prefix ? prefix : "",
                        name);
    return TS_OK;
}

TS_API ts_status ts_module_save(ts_module *m, const char *prefix, ts_checkpoint *ck)
{
    if (!m || !ck)
        return ts__fail(TS_EINVAL, "ts_module_save: NULL argument");
    ts_named_tensor *all;
    size_t n;
    ts_status s = module_state(m, &all, &n);
    char name[512];
    for (size_t i = 0; i < n && s == TS_OK; i++)
        if (!(s = state_name(prefix, all[i].name, name, sizeof name)))
            s = ts_checkpoint_add(ck, name, all[i].tensor);
    free(all);
    return s;
}

TS_API ts_status ts_module_load(ts_module *m, const char *prefix, const ts_checkpoint *ck)
{
    if (!m || !ck)
        return ts__fail(TS_EINVAL, "ts_module_load: NULL argument");
    ts_named_tensor *all;
    size_t n;
    ts_status s = module_state(m, &all, &n);
    char name[512], b1[160], b2[160];
    /* Everything checked before anything is copied: a mismatched file leaves m as it was. */
    for (size_t i = 0; i < n && s == TS_OK; i++) {
        int32_t dt;
        int nd;
        int64_t sh[TS_MAX_DIMS];
        const ts_tensor *t = all[i].tensor;
        if ((s = state_name(prefix, all[i].name, name, sizeof name)))
            break;
        if (!find_entry(ck, name)) {
            s = ts__fail(TS_EINVAL, "%s: no tensor '%s' for the module's '%s' (%zu tensors "
                         "there; saved with another prefix or another model?)",
                         ck->path ? ck->path : "checkpoint", name, all[i].name, ck->n);
            break;
        }
        ts_checkpoint_tensor_info(ck, name, &dt, &nd, sh);
        if (dt != t->dtype || nd != t->ndim ||
            memcmp(sh, t->shape, sizeof sh[0] * (size_t)nd) != 0)
            s = ts__fail(TS_ESHAPE, "%s: '%s' is %s %s there but %s %s in the module",
                         ck->path ? ck->path : "checkpoint", name, ts_dtype_name(dt),
                         ts__shape_str(nd, sh, b1, sizeof b1), ts_dtype_name(t->dtype),
                         ts__shape_str(t->ndim, t->shape, b2, sizeof b2));
    }
    for (size_t i = 0; i < n && s == TS_OK; i++)
        if (!(s = state_name(prefix, all[i].name, name, sizeof name)))
            s = ts_checkpoint_restore(ck, name, all[i].tensor);
    free(all);
    return s;
}

TS_API ts_status ts_module_save_file(ts_module *m, const char *path)
{
    ts_checkpoint *ck = NULL;
    ts_status s = ts_checkpoint_new(&ck);
    if (s == TS_OK && (s = ts_module_save(m, NULL, ck)) == TS_OK)
        s = ts_checkpoint_save(ck, path);
    ts_checkpoint_free(ck);
    return s;
}

TS_API ts_status ts_module_load_file(ts_module *m, const char *path)
{
    if (!m || !path)
        return ts__fail(TS_EINVAL, "ts_module_load_file: NULL argument");
    ts_checkpoint *ck = NULL;
    ts_named_tensor first;
    /* tensors are read onto the module's own device */
    ts_device *dev = ts_module_parameters(m, &first, 1) ? ts_tensor_device(first.tensor) : NULL;
    ts_status s = ts_checkpoint_load(path, dev, &ck);
    if (s == TS_OK)
        s = ts_module_load(m, NULL, ck);
    ts_checkpoint_free(ck);
    return s;
}
