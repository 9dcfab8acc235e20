/* core/checkpoint_load.c: ts_checkpoint_load. The whole safetensors header is validated
 * (cJSON does the parsing; metadata scanned key by key so duplicates are caught) and the layout
 * of the data region checked, then the file stays open and a tensor's bytes are read only when
 * asked for, with bounded reads only. */
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

#include "safetensors.h"

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
int ts__valid_utf8(const unsigned char *s, size_t n)
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
    if (!ts__st_dtype_parse(dt->valuestring, &e->dtype)) {
        e->stored = ts__st_converted_parse(dt->valuestring);
        if (e->stored == ST_NATIVE)
            return CORRUPT("%s: tensor '%s': unknown or unsupported dtype '%s' (tessera reads "
                           "F32, F64, I32, I64, U8, BF16, F16, and BOOL as U8)",
                           path, name, dt->valuestring);
        e->dtype = ts__st_converted[e->stored].to;
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
    size_t esize = e->stored ? ts__st_converted[e->stored].esize : ts_dtype_size(e->dtype);
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
                       e->stored ? ts__st_converted[e->stored].st : ts_dtype_name(e->dtype), sh, need);
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
        else if (ts__ck_find_meta(ck, key))
            CORRUPT("%s: duplicate metadata key '%s'", h->path, key);
        else if (!(value = ts__strdup(v->valuestring)) || ts__ck_put_meta(ck, key, value))
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
    if (ts__ck_ix_reserve(&ck->ie, ck->e, sizeof *ck->e, ck->n))
        return ts__fail(TS_ENOMEM, "%s: out of memory for %zu tensors", ck->path, ck->n + 1);
    ck_entry *e = &ck->e[ck->n++];
    memset(e, 0, sizeof *e);
    e->name = name;
    e->dtype = le->dtype;
    e->ndim = le->ndim;
    memcpy(e->shape, le->shape, sizeof e->shape);
    e->stored = le->stored;
    e->stored_bytes = le->end - le->begin;
    e->nbytes = le->stored ? e->stored_bytes / ts__st_converted[le->stored].esize *
                                 ts_dtype_size(le->dtype)
                           : e->stored_bytes;
    e->offset = base + le->begin;
    ts__ck_ix_put(&ck->ie, ck->e, sizeof *ck->e, ck->n - 1);
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
        else if (ts__ck_find_entry(ck, name))
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
    if (!ts__valid_utf8((const unsigned char *)header, hlen)) {
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
    size_t nbool = 0;
    for (size_t i = 0; i < ck->n; i++)
        nbool += ck->e[i].stored == ST_BOOL;
    if (nbool)
        ts__log(TS_LOG_WARN, "%s: %zu BOOL tensors load as uint8 (tessera's mask dtype); a save "
                "writes them so", path, nbool);
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

