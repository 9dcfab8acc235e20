/* core/checkpoint.c: named tensors and string metadata saved in the safetensors format:
 * building a checkpoint, its queries, reading a loaded tensor's bytes on demand, saving (through
 * the atomic writer of core/fileio.c, ts__save_atomic) and a module's state. Loading and the
 * header's validation are core/checkpoint_load.c; the layout both share is core/safetensors.h.
 * No global state: every call works on its own buffers. */
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

#include "safetensors.h"

static const struct {
    int32_t dtype;
    const char *st; /* the safetensors name */
} dtype_names[] = {
    {TS_F32, "F32"}, {TS_F64, "F64"}, {TS_I32, "I32"}, {TS_I64, "I64"}, {TS_U8, "U8"},
    {TS_BF16, "BF16"}, {TS_F16, "F16"},
};
#define NDTYPES (sizeof dtype_names / sizeof dtype_names[0])

const st_converted_kind ts__st_converted[2] = {
    {NULL, 0, 0},
    {"BOOL", TS_U8, 1},
};

int ts__st_converted_parse(const char *s)
{
    for (int i = ST_BOOL; i <= ST_BOOL; i++)
        if (strcmp(ts__st_converted[i].st, s) == 0)
            return i;
    return ST_NATIVE;
}

/* n stored elements of kind at src into dst as their loaded dtype (BOOL: 0 or 1). */
static void convert_stored(int kind, const unsigned char *src, void *dst, uint64_t n)
{
    (void)kind; /* ST_BOOL, the one converted kind */
    for (uint64_t i = 0; i < n; i++)
        ((unsigned char *)dst)[i] = src[i] != 0;
}

static const char *st_dtype_name(int32_t dtype)
{
    for (size_t i = 0; i < NDTYPES; i++)
        if (dtype_names[i].dtype == dtype)
            return dtype_names[i].st;
    return NULL;
}

int ts__st_dtype_parse(const char *s, int32_t *dtype)
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

void ts__ck_ix_put(name_index *ix, const void *items, size_t stride, size_t i)
{
    size_t h = name_hash(item_name(items, stride, i)) & (ix->cap - 1);
    while (ix->slot[h])
        h = (h + 1) & (ix->cap - 1);
    ix->slot[h] = i + 1;
}

/* Room for item n (the n before it indexed): the slots grown, and rehashed, when needed.
 * 0, or -1 out of memory (the index unchanged). Call before adding item n, ts__ck_ix_put it after. */
int ts__ck_ix_reserve(name_index *ix, const void *items, size_t stride, size_t n)
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
        ts__ck_ix_put(ix, items, stride, i);
    return 0;
}

ck_entry *ts__ck_find_entry(const ts_checkpoint *ck, const char *name)
{
    size_t i = ix_find(&ck->ie, ck->e, sizeof *ck->e, ck->n, name);
    return i < ck->n ? &ck->e[i] : NULL;
}

ck_meta *ts__ck_find_meta(const ts_checkpoint *ck, const char *key)
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
    if (ts__ck_ix_reserve(&ck->ie, ck->e, sizeof *ck->e, ck->n))
        return ts__fail(TS_ENOMEM, "out of memory adding tensor '%s' to a checkpoint", name);
    ck_entry *e = &ck->e[ck->n++];
    memset(e, 0, sizeof *e);
    e->name = name;
    ts__ck_ix_put(&ck->ie, ck->e, sizeof *ck->e, ck->n - 1);
    e->t = ts_tensor_ref(t);
    e->dtype = ts_tensor_dtype(t);
    e->ndim = ts_tensor_ndim(t);
    memcpy(e->shape, ts_tensor_shape(t), sizeof(int64_t) * (size_t)e->ndim);
    e->nbytes = (uint64_t)ts_tensor_numel(t) * ts_dtype_size(e->dtype);
    return TS_OK;
}


TS_API ts_status ts_checkpoint_add(ts_checkpoint *ck, const char *name, ts_tensor *t)
{
    if (!ck || !name || !t)
        return ts__fail(TS_EINVAL, "ts_checkpoint_add: NULL argument");
    if (!*name)
        return ts__fail(TS_EINVAL, "ts_checkpoint_add: empty tensor name");
    if (!ts__valid_utf8((const unsigned char *)name, strlen(name)))
        return ts__fail(TS_EINVAL, "ts_checkpoint_add: the tensor name is not valid UTF-8, "
                        "which a safetensors header (JSON) must be");
    if (strcmp(name, META_KEY) == 0)
        return ts__fail(TS_EINVAL, "ts_checkpoint_add: '%s' is reserved for the metadata",
                        META_KEY);
    if (ts__ck_find_entry(ck, name))
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
ts_status ts__ck_put_meta(ts_checkpoint *ck, char *key, char *value)
{
    ck_meta *m = ts__ck_find_meta(ck, key);
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
    if (ts__ck_ix_reserve(&ck->im, ck->m, sizeof *ck->m, ck->nm))
        return ts__fail(TS_ENOMEM, "out of memory for checkpoint metadata");
    ck->m[ck->nm].key = key;
    ck->m[ck->nm].value = value;
    ck->nm++;
    ts__ck_ix_put(&ck->im, ck->m, sizeof *ck->m, ck->nm - 1);
    return TS_OK;
}

TS_API ts_status ts_checkpoint_set_meta(ts_checkpoint *ck, const char *key, const char *value)
{
    if (!ck || !key || !value)
        return ts__fail(TS_EINVAL, "ts_checkpoint_set_meta: NULL argument");
    if (!*key)
        return ts__fail(TS_EINVAL, "ts_checkpoint_set_meta: empty key");
    if (!ts__valid_utf8((const unsigned char *)key, strlen(key)) ||
        !ts__valid_utf8((const unsigned char *)value, strlen(value)))
        return ts__fail(TS_EINVAL, "ts_checkpoint_set_meta: the %s is not valid UTF-8, which a "
                        "safetensors header (JSON) must be",
                        ts__valid_utf8((const unsigned char *)key, strlen(key)) ? "value" : "key");
    char *k = ts__strdup(key), *v = ts__strdup(value);
    ts_status s = TS_OK;
    if (!k || !v) {
        s = ts__fail(TS_ENOMEM, "out of memory for checkpoint metadata");
        goto fail;
    }
    if ((s = ts__ck_put_meta(ck, k, v)))
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
        convert_stored(e->stored, raw, buf, e->stored_bytes / ts__st_converted[e->stored].esize);
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
    ck_entry *e = ts__ck_find_entry(ck, name);
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
    const ck_entry *e = ts__ck_find_entry(ck, name);
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
    ck_entry *e = ck && name ? ts__ck_find_entry(ck, name) : NULL;
    if (!e)
        return NULL;
    return e->stored != ST_NATIVE ? ts__st_converted[e->stored].st : st_dtype_name(e->dtype);
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
    ck_meta *m = ts__ck_find_meta(ck, key);
    return m ? m->value : NULL;
}

TS_API ts_status ts_checkpoint_restore(const ts_checkpoint *ck, const char *name, ts_tensor *dst)
{
    if (!ck || !name || !dst)
        return ts__fail(TS_EINVAL, "ts_checkpoint_restore: NULL argument");
    ck_entry *e = ts__ck_find_entry(ck, name);
    if (!e)
        return ts__fail(TS_EINVAL, "ts_checkpoint_restore: the checkpoint has no tensor '%s'",
                        name);
    char a[200], b[200], sh[160];
    snprintf(a, sizeof a, "%s%s", ts_dtype_name(e->dtype),
             ts__shape_str(e->ndim, e->shape, sh, sizeof sh));
    ts_tensor_describe(dst, b, sizeof b);
    /* a 16-bit float into a float32 or float64 tensor: widened, exactly */
    int widen = ts_plugin_dtype_is_half(e->dtype) && ts_plugin_dtype_is_float(ts_tensor_dtype(dst));
    if (e->dtype != ts_tensor_dtype(dst) && !widen)
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
    if (widen) {
        ts_tensor *w = NULL;
        ts_no_grad_enter();
        s = ts_cast(src, ts_tensor_dtype(dst), &w);
        ts_no_grad_exit();
        ts_tensor_unref(src);
        if (s)
            return ts__fail_prefix(s, "ts_checkpoint_restore: '%s': ", name);
        src = w;
    }
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
        if (!ts__ck_find_entry(ck, name)) {
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
