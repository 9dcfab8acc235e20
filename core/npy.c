/* core/npy.c: NumPy's .npy format (format versions 1.0, 2.0 and 3.0): a magic string, a
 * version, a header length and a header that is a Python dict literal ({'descr': '<f4',
 * 'fortran_order': False, 'shape': (2, 3), }), then the elements. The header is parsed by a
 * small strict parser of exactly that literal (no Python evaluation exists in C, and no
 * library for it in Debian): every key once, nothing else, ints without signs or overflow.
 * A file is checked whole (header, shape bounds, byte count against the file's size) before
 * any element is read, so a hostile file costs nothing and never reads out of bounds. */
#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

#define NPY_MAGIC "\x93NUMPY"
#define NPY_MAX_HEADER (1u << 20) /* numpy itself refuses over 10,000 bytes by default */

#define CORRUPT(...) ts__fail(TS_ECORRUPT, __VA_ARGS__)

/* ---- element types -------------------------------------------------------------------- */

/* How a file's elements become a tessera dtype. */
enum { K_SAME, K_BOOL, K_INT, K_UINT };

typedef struct npy_type {
    char code;      /* numpy's kind letter: f, i, u, b */
    int size;       /* bytes in the file */
    int32_t dtype;  /* what it loads as */
    int kind;       /* K_*: how */
    const char *numpy; /* its numpy name, for messages */
} npy_type;

static const npy_type types[] = {
    {'f', 4, TS_F32, K_SAME, "float32"}, {'f', 8, TS_F64, K_SAME, "float64"},
    {'i', 4, TS_I32, K_SAME, "int32"},   {'i', 8, TS_I64, K_SAME, "int64"},
    {'u', 1, TS_U8, K_SAME, "uint8"},    {'f', 2, TS_F16, K_SAME, "float16"},
    {'b', 1, TS_U8, K_BOOL, "bool"},     {'i', 1, TS_I32, K_INT, "int8"},
    {'i', 2, TS_I32, K_INT, "int16"},    {'u', 2, TS_I32, K_UINT, "uint16"},
    {'u', 4, TS_I64, K_UINT, "uint32"},
};

/* ---- the header ----------------------------------------------------------------------- */

typedef struct header {
    const char *p, *end;
    char descr[64];
    int fortran, ndim;
    int64_t shape[TS_MAX_DIMS];
    int have_descr, have_fortran, have_shape;
} header;

static void skip_ws(header *h)
{
    while (h->p < h->end && (*h->p == ' ' || *h->p == '\t' || *h->p == '\n' || *h->p == '\r'))
        h->p++;
}

static int eat(header *h, char c)
{
    skip_ws(h);
    if (h->p < h->end && *h->p == c) {
        h->p++;
        return 1;
    }
    return 0;
}

/* A quoted string ('...' or "...") without escapes into out. */
static int string(header *h, char *out, size_t len)
{
    skip_ws(h);
    if (h->p >= h->end || (*h->p != '\'' && *h->p != '"'))
        return 0;
    char q = *h->p++;
    size_t n = 0;
    while (h->p < h->end && *h->p != q) {
        if (*h->p == '\\' || n + 1 >= len || (unsigned char)*h->p < 0x20)
            return 0;
        out[n++] = *h->p++;
    }
    if (h->p >= h->end)
        return 0;
    h->p++;
    out[n] = 0;
    return 1;
}

static int word(header *h, const char *w)
{
    skip_ws(h);
    size_t n = strlen(w);
    if ((size_t)(h->end - h->p) >= n && memcmp(h->p, w, n) == 0 &&
        (h->p + n == h->end || !isalnum((unsigned char)h->p[n]))) {
        h->p += n;
        return 1;
    }
    return 0;
}

/* (), (5,), (2, 3) or (2, 3,): a Python tuple of non-negative decimal ints (no sign, no
 * leading zero; a single one needs its comma: (5) is an int), at most TS_MAX_DIMS. */
static ts_status shape(header *h, const char *path)
{
    if (!eat(h, '('))
        return CORRUPT("%s: the header's 'shape' is not a tuple of integers", path);
    h->ndim = 0;
    for (;;) {
        if (eat(h, ')'))
            return TS_OK;
        skip_ws(h);
        if (h->p >= h->end || !isdigit((unsigned char)*h->p))
            return CORRUPT("%s: the header's 'shape' is not a tuple of non-negative integers",
                           path);
        if (*h->p == '0' && h->p + 1 < h->end && isdigit((unsigned char)h->p[1]))
            return CORRUPT("%s: a dimension of the header's 'shape' has a leading zero, which "
                           "is no Python integer", path);
        const uint64_t limit = (uint64_t)1 << 62;
        uint64_t v = 0;
        while (h->p < h->end && isdigit((unsigned char)*h->p)) {
            uint64_t dgt = (uint64_t)(*h->p++ - '0');
            if (v > (limit - dgt) / 10) /* checked before it could wrap */
                return CORRUPT("%s: a dimension of the header's 'shape' is too large", path);
            v = v * 10 + dgt;
        }
        if (h->ndim == TS_MAX_DIMS)
            return ts__fail(TS_EINVAL, "%s: the array has more than %d dimensions, the most a "
                            "tessera tensor has", path, TS_MAX_DIMS);
        h->shape[h->ndim++] = (int64_t)v;
        if (eat(h, ','))
            continue;
        if (eat(h, ')')) {
            if (h->ndim == 1)
                return CORRUPT("%s: the header's 'shape' (%llu) is an integer, not a tuple "
                               "(numpy writes (%llu,))", path, (unsigned long long)v,
                               (unsigned long long)v);
            return TS_OK;
        }
        return CORRUPT("%s: the header's 'shape' is not a tuple of integers", path);
    }
}

static ts_status parse_header(header *h, const char *path)
{
    if (!eat(h, '{'))
        return CORRUPT("%s: the header is not a Python dict ({'descr': ..., 'fortran_order': "
                       "..., 'shape': ...})", path);
    for (;;) {
        if (eat(h, '}'))
            break;
        char key[32];
        if (!string(h, key, sizeof key) || !eat(h, ':'))
            return CORRUPT("%s: the header is not a Python dict of 'descr', 'fortran_order' and "
                           "'shape'", path);
        if (strcmp(key, "descr") == 0 && !h->have_descr) {
            skip_ws(h);
            if (h->p < h->end && (*h->p == '[' || *h->p == '('))
                return ts__fail(TS_EDTYPE, "%s: a structured array (fields); tessera reads "
                                "arrays of one numeric dtype", path);
            if (!string(h, h->descr, sizeof h->descr))
                return CORRUPT("%s: the header's 'descr' is not a dtype string", path);
            h->have_descr = 1;
        } else if (strcmp(key, "fortran_order") == 0 && !h->have_fortran) {
            if (word(h, "True"))
                h->fortran = 1;
            else if (word(h, "False"))
                h->fortran = 0;
            else
                return CORRUPT("%s: the header's 'fortran_order' is not True or False", path);
            h->have_fortran = 1;
        } else if (strcmp(key, "shape") == 0 && !h->have_shape) {
            ts_status s = shape(h, path);
            if (s)
                return s;
            h->have_shape = 1;
        } else {
            return CORRUPT("%s: the header has %s key '%s'; a .npy header has 'descr', "
                           "'fortran_order' and 'shape' once each", path,
                           (!strcmp(key, "descr") || !strcmp(key, "fortran_order") ||
                            !strcmp(key, "shape")) ? "a repeated" : "an unknown", key);
        }
        if (eat(h, ','))
            continue;
        if (eat(h, '}'))
            break;
        return CORRUPT("%s: the header is not a Python dict (expected ',' or '}')", path);
    }
    skip_ws(h);
    if (h->p != h->end)
        return CORRUPT("%s: the header has text after its dict", path);
    if (!h->have_descr || !h->have_fortran || !h->have_shape)
        return CORRUPT("%s: the header lacks '%s'", path,
                       !h->have_descr ? "descr" : !h->have_fortran ? "fortran_order" : "shape");
    return TS_OK;
}

/* '<f4', '>i8', '|u1', '=f8', 'b1' ... -> the type and whether the file is big-endian. */
static ts_status lookup(const char *path, const char *descr, const npy_type **t, int *swap)
{
    const char *d = descr;
    char order = '|';
    if (*d == '<' || *d == '>' || *d == '|' || *d == '=')
        order = *d++;
    char code = d[0];
    char *end = NULL;
    long size = d[0] && isdigit((unsigned char)d[1]) ? strtol(d + 1, &end, 10) : 0;
    if (code == '?' && !d[1]) /* numpy's character code for bool */
        code = 'b', size = 1, end = (char *)d + 1;
    for (size_t i = 0; end && !*end && i < sizeof types / sizeof *types; i++) {
        if (types[i].code == code && types[i].size == size) {
            *t = &types[i];
            *swap = order == '>' && size > 1;
            return TS_OK;
        }
    }
    const char *what = code == 'c'   ? "complex numbers"
                       : code == 'O' ? "Python objects"
                       : code == 'U' || code == 'S' || code == 'a' ? "strings"
                       : code == 'M' || code == 'm' ? "dates or time deltas"
                       : code == 'V' ? "raw bytes (void)"
                       : code == 'u' && size == 8 ? "uint64 (values above int64's range would "
                                                    "not fit)"
                       : code == 'f' && size > 8 ? "extended-precision floats"
                                                   : NULL;
    return ts__fail(TS_EDTYPE, "%s: dtype '%s'%s%s%s is not one tessera reads: float16/32/64, "
                    "int8/16/32/64, uint8/16/32 and bool", path, descr, what ? " (" : "",
                    what ? what : "", what ? ")" : "");
}

/* ---- loading -------------------------------------------------------------------------- */

static int read_exact(int fd, void *buf, size_t n, off_t at)
{
    char *p = buf;
    while (n) {
        ssize_t r = pread(fd, p, n, at);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            if (r == 0)
                errno = 0; /* end of file: the caller says "truncated" */
            return -1;
        }
        p += r;
        at += r;
        n -= (size_t)r;
    }
    return 0;
}

/* One element of the file (after any byte swap) as the loaded dtype, at dst. */
static void convert(const npy_type *t, const unsigned char *src, unsigned char *dst)
{
    switch (t->kind) {
    case K_BOOL:
        *dst = *src != 0;
        break;
    case K_INT:
    case K_UINT: {
        int64_t v = 0;
        if (t->size == 1)
            v = t->kind == K_INT ? (int8_t)src[0] : src[0];
        else if (t->size == 2) {
            uint16_t u;
            memcpy(&u, src, 2);
            v = t->kind == K_INT ? (int16_t)u : u;
        } else {
            uint32_t u;
            memcpy(&u, src, 4);
            v = u; /* only uint32 comes here with 4 bytes */
        }
        if (t->dtype == TS_I32) {
            int32_t w = (int32_t)v;
            memcpy(dst, &w, 4);
        } else {
            memcpy(dst, &v, 8);
        }
        break;
    }
    default:
        memcpy(dst, src, (size_t)t->size);
    }
}

TS_API ts_status ts_npy_load(const char *path, ts_device *dev, ts_tensor **out)
{
    if (!out)
        return ts__fail(TS_EINVAL, "ts_npy_load: out is NULL");
    *out = NULL;
    if (!path || !*path)
        return ts__fail(TS_EINVAL, "ts_npy_load: NULL or empty path");
    int fd;
    struct stat st;
    ts_status s = ts__open_input(path, ".npy file", &fd, &st);
    if (s)
        return s;
    unsigned char pre[12];
    char *text = NULL;
    unsigned char *raw = NULL, *buf = NULL;
    uint64_t fsize = (uint64_t)st.st_size;
    if (fsize < 10 || read_exact(fd, pre, 10, 0) != 0) {
        s = CORRUPT("%s: not a .npy file: %llu bytes, shorter than the 10-byte preamble", path,
                    (unsigned long long)fsize);
        goto out;
    }
    if (memcmp(pre, NPY_MAGIC, 6) != 0) {
        s = CORRUPT("%s: not a .npy file: it does not start with \\x93NUMPY", path);
        goto out;
    }
    int major = pre[6], minor = pre[7];
    if (major < 1 || major > 3 || minor != 0) {
        s = CORRUPT("%s: .npy format version %d.%d; tessera reads 1.0, 2.0 and 3.0", path, major,
                    minor);
        goto out;
    }
    uint64_t hlen, hstart = major == 1 ? 10 : 12;
    if (major == 1) {
        hlen = (uint64_t)pre[8] | (uint64_t)pre[9] << 8;
    } else {
        if (fsize < 12 || read_exact(fd, pre + 10, 2, 10) != 0) {
            s = CORRUPT("%s: truncated in the .npy preamble", path);
            goto out;
        }
        hlen = (uint64_t)pre[8] | (uint64_t)pre[9] << 8 | (uint64_t)pre[10] << 16 |
               (uint64_t)pre[11] << 24;
    }
    if (hlen > NPY_MAX_HEADER) {
        s = CORRUPT("%s: the header claims %llu bytes, over the %u accepted", path,
                    (unsigned long long)hlen, NPY_MAX_HEADER);
        goto out;
    }
    if (hstart + hlen > fsize) {
        s = CORRUPT("%s: truncated: the header claims %llu bytes but the file has %llu after "
                    "the preamble", path, (unsigned long long)hlen,
                    (unsigned long long)(fsize - hstart));
        goto out;
    }
    if (!(text = ts__malloc(hlen + 1))) {
        s = ts__fail(TS_ENOMEM, "%s: out of memory reading the header", path);
        goto out;
    }
    if (read_exact(fd, text, hlen, (off_t)hstart) != 0) {
        s = ts__fail(TS_EIO, "%s: cannot read the header: %s", path,
                     errno ? strerror(errno) : "the file shrank while being read");
        goto out;
    }
    text[hlen] = 0;
    if (memchr(text, 0, hlen)) {
        s = CORRUPT("%s: the header holds a NUL byte", path);
        goto out;
    }
    header h = {.p = text, .end = text + hlen};
    const npy_type *t = NULL;
    int swap = 0;
    int64_t numel;
    if ((s = parse_header(&h, path)) || (s = lookup(path, h.descr, &t, &swap)) ||
        (s = ts__shape_bound(path, h.ndim, h.shape, &numel)))
        goto out;
    /* the file's bytes and the loaded ones must both be countable */
    uint64_t esz = (uint64_t)t->size, lsz = ts_dtype_size(t->dtype);
    if ((uint64_t)numel > ((uint64_t)1 << 62) / (esz > lsz ? esz : lsz)) {
        s = CORRUPT("%s: the shape's byte count overflows", path);
        goto out;
    }
    uint64_t nbytes = (uint64_t)numel * esz, data = hstart + hlen;
    if (fsize - data != nbytes) {
        s = CORRUPT("%s: %s: %llu bytes of data for %lld elements of %s need %llu", path,
                    fsize - data < nbytes ? "truncated" : "trailing bytes after the data",
                    (unsigned long long)(fsize - data), (long long)numel, t->numpy,
                    (unsigned long long)nbytes);
        goto out;
    }
    if (!(raw = ts__malloc(nbytes + 1)) || !(buf = ts__malloc((size_t)numel * lsz + 1))) {
        s = ts__fail(TS_ENOMEM, "%s: out of host memory for %lld elements", path,
                     (long long)numel);
        goto out;
    }
    if (nbytes && read_exact(fd, raw, nbytes, (off_t)data) != 0) {
        s = ts__fail(TS_EIO, "%s: cannot read the data: %s", path,
                     errno ? strerror(errno) : "the file shrank while being read");
        goto out;
    }
    /* C order: element i of the tensor is element i of the file. Fortran order: the file
     * runs the first index fastest; walk the tensor's indices and find each one's place. */
    int64_t idx[TS_MAX_DIMS] = {0}, fstride[TS_MAX_DIMS];
    int64_t acc = 1;
    for (int d = 0; d < h.ndim; d++) {
        fstride[d] = acc;
        acc *= h.shape[d] > 0 ? h.shape[d] : 1;
    }
    for (int64_t i = 0; i < numel; i++) {
        int64_t at = i;
        if (h.fortran && h.ndim > 1) {
            at = 0;
            for (int d = 0; d < h.ndim; d++)
                at += idx[d] * fstride[d];
            for (int d = h.ndim - 1; d >= 0; d--) { /* next C-order index */
                if (++idx[d] < h.shape[d])
                    break;
                idx[d] = 0;
            }
        }
        unsigned char *src = raw + (size_t)at * esz;
        if (swap)
            for (int a = 0, b = t->size - 1; a < b; a++, b--) {
                unsigned char c = src[a];
                src[a] = src[b];
                src[b] = c;
            }
        convert(t, src, buf + (size_t)i * lsz);
    }
    s = ts_tensor_from_host(dev, t->dtype, h.ndim, h.shape, buf, out);
    if (s == TS_OK && t->kind != K_SAME)
        ts__log(TS_LOG_INFO, "%s: %s elements loaded as %s", path, t->numpy,
                ts_dtype_name(t->dtype));
out:
    close(fd);
    free(text);
    free(raw);
    free(buf);
    return s;
}

/* ---- saving --------------------------------------------------------------------------- */

static const char *descr_of(int32_t dtype)
{
    switch (dtype) {
    case TS_F32: return "<f4";
    case TS_F64: return "<f8";
    case TS_I32: return "<i4";
    case TS_I64: return "<i8";
    case TS_U8: return "|u1";
    case TS_F16: return "<f2"; /* NumPy's float16; it has no bfloat16 */
    default: return NULL;
    }
}

typedef struct npy_body {
    const char *head;
    size_t hlen;
    const void *data;
    size_t nbytes;
} npy_body;

static int write_npy(ts__saver *sv, int fd, void *user)
{
    npy_body *b = user;
    if (ts__save_write(sv, fd, b->head, b->hlen) ||
        (b->nbytes && ts__save_write(sv, fd, b->data, b->nbytes)))
        return TS__SAVE_IO;
    return 0;
}

TS_API ts_status ts_npy_save(const ts_tensor *t, const char *path)
{
    if (!t || !path || !*path)
        return ts__fail(TS_EINVAL, "ts_npy_save: NULL tensor or empty path");
    const char *descr = descr_of(ts_tensor_dtype(t));
    if (!descr)
        return ts__fail(TS_EDTYPE, "ts_npy_save: dtype %s has no .npy form here",
                        ts_dtype_name(ts_tensor_dtype(t)));
    /* numpy's own header: the dict, padded with spaces and a newline so that the data
     * starts at a multiple of 64 bytes; version 2.0 only when it needs over 65535 bytes. */
    char dict[512], dims[TS_MAX_DIMS * 22 + 8] = "";
    int nd = ts_tensor_ndim(t);
    const int64_t *sh = ts_tensor_shape(t);
    for (int d = 0; d < nd; d++)
        snprintf(dims + strlen(dims), sizeof dims - strlen(dims), "%s%lld%s", d ? " " : "",
                 (long long)sh[d], nd == 1 || d < nd - 1 ? "," : "");
    int n = snprintf(dict, sizeof dict,
                     "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }", descr, dims);
    size_t pre = 10, total = pre + (size_t)n + 1;
    total = (total + 63) / 64 * 64;
    char head[640];
    memcpy(head, NPY_MAGIC "\x01\x00", 8);
    size_t hl = total - pre;
    head[8] = (char)(hl & 0xff);
    head[9] = (char)(hl >> 8);
    memcpy(head + pre, dict, (size_t)n);
    memset(head + pre + n, ' ', total - pre - (size_t)n - 1);
    head[total - 1] = '\n';
    size_t nbytes = (size_t)ts_tensor_numel(t) * ts_dtype_size(ts_tensor_dtype(t));
    void *data = ts__malloc(nbytes + 1);
    if (!data)
        return ts__fail(TS_ENOMEM, "%s: out of host memory for the array", path);
    ts_status s = ts_tensor_to_host(t, data, nbytes);
    if (s == TS_OK) {
        npy_body b = {.head = head, .hlen = total, .data = data, .nbytes = nbytes};
        s = ts__save_atomic(path, "the array", write_npy, &b);
    }
    free(data);
    return s;
}
