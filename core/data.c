/* core/data.c: datasets. The IDX reader (one gzip member through zlib's inflate, or plain;
 * every header field and the data length validated, nothing after the gzip member, bounded
 * chunked reads, big-endian to host conversion) and the Fashion-MNIST loader. The mini-batch
 * loader is core/batches.c. docs/data.md describes the design and the measured figures. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "internal.h"


/* ---- the IDX reader --------------------------------------------------------------------- */

/* A decoded tensor larger than this is refused as corrupt: no real IDX file comes close, and a
 * hostile header must not make us reserve terabytes. */
#define IDX_MAX_BYTES ((uint64_t)4 << 30)
/* Bytes read from the file, and decoded, per call (a multiple of every element size). */
#define IDX_CHUNK ((size_t)256 << 10)
/* The first output allocation; it doubles as data really arrives, up to the declared size, so
 * a short file that claims gigabytes costs little memory before it is found truncated. */
#define IDX_FIRST_CAP ((size_t)1 << 20)

/* An IDX file decoded on the host. */
typedef struct idx_host {
    int32_t dtype;
    int ndim;
    int64_t shape[TS_MAX_DIMS];
    int64_t numel;
    unsigned char *data; /* (transfer full) free() */
    size_t nbytes;
} idx_host;

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static uint64_t be64(const unsigned char *p)
{
    return (uint64_t)be32(p) << 32 | be32(p + 4);
}

/* The file's element type: its size in the file and the tensor dtype it becomes. */
static int idx_type(unsigned type, size_t *file_size, int32_t *dtype)
{
    switch (type) {
    case 0x08:
        *file_size = 1;
        *dtype = TS_U8;
        return 1;
    case 0x09:
        *file_size = 1;
        *dtype = TS_I32;
        return 1;
    case 0x0B:
        *file_size = 2;
        *dtype = TS_I32;
        return 1;
    case 0x0C:
        *file_size = 4;
        *dtype = TS_I32;
        return 1;
    case 0x0D:
        *file_size = 4;
        *dtype = TS_F32;
        return 1;
    case 0x0E:
        *file_size = 8;
        *dtype = TS_F64;
        return 1;
    default:
        return 0;
    }
}

/* Converts n big-endian file elements of type at src into host dtype elements at dst. */
static void idx_convert(unsigned type, const unsigned char *src, size_t n, unsigned char *dst)
{
    switch (type) {
    case 0x08:
        memcpy(dst, src, n);
        break;
    case 0x09:
        for (size_t i = 0; i < n; i++) {
            int32_t v = (int8_t)src[i];
            memcpy(dst + 4 * i, &v, 4);
        }
        break;
    case 0x0B:
        for (size_t i = 0; i < n; i++) {
            int32_t v = (int16_t)(uint16_t)((unsigned)src[2 * i] << 8 | src[2 * i + 1]);
            memcpy(dst + 4 * i, &v, 4);
        }
        break;
    case 0x0C: /* int32 and float32: the same 4 bytes, reordered */
    case 0x0D:
        for (size_t i = 0; i < n; i++) {
            uint32_t v = be32(src + 4 * i);
            memcpy(dst + 4 * i, &v, 4);
        }
        break;
    case 0x0E:
        for (size_t i = 0; i < n; i++) {
            uint64_t v = be64(src + 8 * i);
            memcpy(dst + 8 * i, &v, 8);
        }
        break;
    }
}

/* An IDX file being read: plain, or one gzip member decoded with zlib's inflate. inflate is
 * used rather than gzread because gzread reads past the end of a member: it decodes a second
 * member as more data and silently drops whatever garbage follows, where tessera wants to know
 * exactly where the gzip stream ended and refuse any byte after it. */
typedef struct idx_in {
    int fd;
    int gzip;          /* the file starts with the gzip magic 1f 8b */
    int zinit;         /* z holds inflate state (inflateEnd on close) */
    int ended;         /* gzip: inflate reached the end of the member (its CRC and length OK) */
    int eof;           /* read() returned 0 */
    z_stream z;
    unsigned char *in; /* IDX_CHUNK bytes read from the file */
    size_t pos, len;   /* plain: in[pos, len) not yet handed out */
} idx_in;

/* Fills in->in from the file; 0 bytes at the end of the file. */
static ts_status idx_fill(idx_in *in, const char *path)
{
    ssize_t r;
    do
        r = read(in->fd, in->in, IDX_CHUNK);
    while (r < 0 && errno == EINTR);
    if (r < 0)
        return ts__fail(TS_EIO, "IDX file '%s': cannot read: %s", path, strerror(errno));
    in->eof = r == 0;
    in->pos = 0;
    in->len = (size_t)r;
    in->z.next_in = in->in;
    in->z.avail_in = (uInt)r;
    return TS_OK;
}

/* Opens the stream over fd (owned by in from here: idx_close closes it). */
static ts_status idx_open(idx_in *in, int fd, const char *path)
{
    memset(in, 0, sizeof *in);
    in->fd = fd;
    in->in = ts__malloc(IDX_CHUNK);
    if (!in->in)
        return ts__fail(TS_ENOMEM, "IDX file '%s': out of host memory", path);
    ts_status s = idx_fill(in, path);
    if (s)
        return s;
    /* An IDX file starts 00 00, so the gzip magic cannot be mistaken for one. */
    in->gzip = in->len >= 2 && in->in[0] == 0x1f && in->in[1] == 0x8b;
    if (in->gzip) {
        int r = inflateInit2(&in->z, 15 + 16); /* a gzip wrapper only */
        if (r != Z_OK)
            return ts__fail(r == Z_MEM_ERROR ? TS_ENOMEM : TS_EIO,
                            "IDX file '%s': cannot start zlib: %s", path,
                            in->z.msg ? in->z.msg : zError(r));
        in->zinit = 1;
        in->z.next_in = in->in;
        in->z.avail_in = (uInt)in->len;
    }
    return TS_OK;
}

static void idx_close(idx_in *in)
{
    if (in->zinit)
        inflateEnd(&in->z);
    free(in->in);
    in->in = NULL;
    if (in->fd >= 0)
        close(in->fd);
    in->fd = -1;
}

/* Reads up to len bytes; *got receives how many (fewer only at the end of the file, or of the
 * gzip member). A damaged or cut-short gzip stream is TS_ECORRUPT; a failing read() TS_EIO. */
static ts_status idx_read_bytes(idx_in *in, const char *path, void *buf, size_t len, size_t *got)
{
    unsigned char *out = buf;
    ts_status s;
    *got = 0;
    if (!in->gzip) {
        while (*got < len) {
            if (in->pos == in->len) {
                if (in->eof)
                    return TS_OK;
                if ((s = idx_fill(in, path)))
                    return s;
                continue;
            }
            size_t n = in->len - in->pos < len - *got ? in->len - in->pos : len - *got;
            memcpy(out + *got, in->in + in->pos, n);
            in->pos += n;
            *got += n;
        }
        return TS_OK;
    }
    while (*got < len && !in->ended) {
        if (in->z.avail_in == 0 && !in->eof && (s = idx_fill(in, path)))
            return s;
        size_t want = len - *got < IDX_CHUNK ? len - *got : IDX_CHUNK;
        in->z.next_out = out + *got;
        in->z.avail_out = (uInt)want;
        int r = inflate(&in->z, Z_NO_FLUSH);
        *got += want - in->z.avail_out;
        switch (r) {
        case Z_STREAM_END:
            in->ended = 1;
            break;
        case Z_OK:
            break;
        case Z_BUF_ERROR: /* no progress possible: the input is used up */
            if (in->z.avail_in == 0 && in->eof)
                return ts__fail(TS_ECORRUPT, "IDX file '%s': truncated gzip stream: unexpected "
                                "end of file", path);
            break;
        case Z_MEM_ERROR:
            return ts__fail(TS_ENOMEM, "IDX file '%s': out of memory decompressing", path);
        default: /* Z_DATA_ERROR, Z_NEED_DICT, Z_STREAM_ERROR */
            return ts__fail(TS_ECORRUPT, "IDX file '%s': corrupt gzip stream: %s", path,
                            in->z.msg ? in->z.msg : "invalid data");
        }
    }
    return TS_OK;
}

/* After the whole stream was read: nothing may follow the end of the gzip member (garbage,
 * padding, a second member), though zlib's own gzread would skip or decode it. A plain file
 * has already been read to its end. */
static ts_status idx_check_end(idx_in *in, const char *path)
{
    if (!in->gzip)
        return TS_OK;
    TS_ASSERT(in->ended);
    uint64_t after = in->z.avail_in;
    while (!in->eof && after == 0) {
        ts_status s = idx_fill(in, path);
        if (s)
            return s;
        after = in->len;
    }
    if (after)
        return ts__fail(TS_ECORRUPT, "IDX file '%s': bytes after the end of the gzip stream "
                        "(trailing garbage, padding or a second gzip member; an IDX .gz file is "
                        "one gzip member): remove them, or recompress the data with gzip", path);
    return TS_OK;
}

/* Parses and validates the header after the 4 magic bytes. */
static ts_status idx_header(idx_in *in, const char *path, idx_host *h, unsigned *type,
                            size_t *file_es)
{
    unsigned char head[4 + 4 * 255];
    size_t got;
    ts_status s = idx_read_bytes(in, path, head, 4, &got);
    if (s)
        return s;
    if (got == 0)
        return ts__fail(TS_ECORRUPT, "IDX file '%s': empty file (an IDX header needs 4 bytes)",
                        path);
    if (got < 4)
        return ts__fail(TS_ECORRUPT, "IDX file '%s': truncated header: %zu of 4 bytes", path, got);
    if (head[0] != 0 || head[1] != 0)
        return ts__fail(TS_ECORRUPT,
                        "IDX file '%s': bad magic bytes %02x %02x (an IDX file "
                        "starts 00 00): not an IDX file",
                        path, head[0], head[1]);
    *type = head[2];
    if (!idx_type(*type, file_es, &h->dtype))
        return ts__fail(TS_ECORRUPT,
                        "IDX file '%s': unknown data type 0x%02x (known: 0x08 "
                        "u8, 0x09 i8, 0x0B i16, 0x0C i32, 0x0D f32, 0x0E f64)",
                        path, *type);
    int ndim = head[3];
    if (ndim < 1 || ndim > TS_MAX_DIMS)
        return ts__fail(TS_ECORRUPT, "IDX file '%s': %d dims; an IDX tensor has 1 to %d", path,
                        ndim, TS_MAX_DIMS);
    if ((s = idx_read_bytes(in, path, head + 4, 4 * (size_t)ndim, &got)))
        return s;
    if (got < 4 * (size_t)ndim)
        return ts__fail(TS_ECORRUPT,
                        "IDX file '%s': truncated header: the %d dims need %d "
                        "bytes, the file has %zu",
                        path, ndim, 4 * ndim, got);
    /* The product of the sizes, zeros counted as ones: it bounds every stride too. */
    size_t out_es = ts_dtype_size(h->dtype);
    uint64_t bound = 1, numel = 1;
    h->ndim = ndim;
    for (int d = 0; d < ndim; d++) {
        uint64_t n = be32(head + 4 + 4 * d);
        h->shape[d] = (int64_t)n;
        numel *= n;
        if (n > 1 && bound > UINT64_MAX / n) {
            char b[200];
            return ts__fail(TS_ECORRUPT, "IDX file '%s': sizes %s overflow", path,
                            ts__shape_str(ndim, h->shape, b, sizeof b));
        }
        bound *= n > 1 ? n : 1;
    }
    if (bound > IDX_MAX_BYTES / out_es) {
        char b[200];
        return ts__fail(TS_ECORRUPT,
                        "IDX file '%s': sizes %s exceed the %llu-byte limit of the "
                        "reader",
                        path, ts__shape_str(ndim, h->shape, b, sizeof b),
                        (unsigned long long)IDX_MAX_BYTES);
    }
    h->numel = (int64_t)numel;
    h->nbytes = (size_t)numel * out_es;
    return TS_OK;
}

static ts_status idx_read_host(const char *path, idx_host *h)
{
    memset(h, 0, sizeof *h);
    if (!path)
        return ts__fail(TS_EINVAL, "ts_idx_load: path is NULL");
    int fd;
    ts_status os = ts__open_input(path, "IDX file", &fd, NULL);
    if (os)
        return os;
    idx_in in;
    unsigned char *chunk = NULL;
    unsigned type = 0;
    size_t file_es = 0;
    ts_status s = idx_open(&in, fd, path);
    if (s || (s = idx_header(&in, path, h, &type, &file_es)))
        goto fail;
    uint64_t want = (uint64_t)h->numel * file_es; /* bytes of data the header declares */
    size_t cap = h->nbytes < IDX_FIRST_CAP ? h->nbytes : IDX_FIRST_CAP;
    h->data = ts__malloc(cap ? cap : 1);
    chunk = ts__malloc(IDX_CHUNK);
    if (!h->data || !chunk) {
        s = ts__fail(TS_ENOMEM, "IDX file '%s': out of host memory", path);
        goto fail;
    }
    size_t out_es = ts_dtype_size(h->dtype);
    uint64_t have = 0; /* data bytes read and converted */
    while (have < want) {
        size_t len = want - have < IDX_CHUNK ? (size_t)(want - have) : IDX_CHUNK, got;
        if ((s = idx_read_bytes(&in, path, chunk, len, &got)))
            goto fail;
        size_t n = got / file_es; /* whole elements */
        size_t end = (size_t)(have / file_es + n) * out_es;
        if (end > cap) {
            while (cap < end)
                cap = cap > h->nbytes / 2 ? h->nbytes : cap * 2;
            unsigned char *p = ts__realloc(h->data, cap);
            if (!p) {
                s = ts__fail(TS_ENOMEM, "IDX file '%s': out of host memory for %zu bytes", path,
                             cap);
                goto fail;
            }
            h->data = p;
        }
        idx_convert(type, chunk, n, h->data + (size_t)(have / file_es) * out_es);
        have += got;
        if (got < len) {
            /* A member that ends early with more after it: say so (a second member, say). */
            if (in.gzip && in.ended && (s = idx_check_end(&in, path)))
                goto fail;
            s = ts__fail(TS_ECORRUPT,
                         "IDX file '%s': truncated data: %llu of the %llu bytes "
                         "the header declares",
                         path, (unsigned long long)have, (unsigned long long)want);
            goto fail;
        }
    }
    size_t extra;
    if ((s = idx_read_bytes(&in, path, chunk, IDX_CHUNK, &extra)))
        goto fail;
    if (extra) {
        s = ts__fail(TS_ECORRUPT,
                     "IDX file '%s': %zu%s trailing bytes after the %llu bytes of "
                     "data the header declares",
                     path, extra, extra == IDX_CHUNK ? " or more" : "", (unsigned long long)want);
        goto fail;
    }
    if ((s = idx_check_end(&in, path)))
        goto fail;
    free(chunk);
    idx_close(&in);
    return TS_OK;
fail:
    free(chunk);
    free(h->data);
    h->data = NULL;
    idx_close(&in);
    return s;
}

TS_API ts_status ts_idx_load(const char *path, ts_device *dev, ts_tensor **out)
{
    if (!out)
        return ts__fail(TS_EINVAL, "ts_idx_load: out is NULL");
    *out = NULL;
    idx_host h;
    ts_status s = idx_read_host(path, &h);
    if (s)
        return s;
    s = ts_tensor_from_host(dev, h.dtype, h.ndim, h.shape, h.data, out);
    free(h.data);
    return s;
}

/* ---- Fashion-MNIST ---------------------------------------------------------------------- */

#define FMNIST_PACKAGE "install the Debian package dataset-fashion-mnist"

/* dir/name.gz, or dir/name if only the uncompressed file is there. TS_EIO naming the .gz path
 * and the package if neither exists. (transfer full) on *path: free(). */
static ts_status fmnist_path(const char *dir, const char *name, char **path)
{
    struct stat st;
    *path = ts__asprintf("%s/%s.gz", dir, name);
    if (!*path)
        return ts__fail(TS_ENOMEM, "out of host memory");
    if (stat(*path, &st) == 0)
        return TS_OK;
    int err = errno;
    char *plain = ts__asprintf("%s/%s", dir, name);
    if (plain && stat(plain, &st) == 0) {
        free(*path);
        *path = plain;
        return TS_OK;
    }
    free(plain);
    ts_status s = ts__fail(TS_EIO, "Fashion-MNIST: cannot open '%s': %s; %s", *path, strerror(err),
                           FMNIST_PACKAGE);
    free(*path);
    *path = NULL;
    return s;
}

/* Pixels converted to float32 on the host in slices of this many, then uploaded. */
#define FMNIST_SLICE ((size_t)64 << 10)

TS_API ts_status ts_fashion_mnist_load(const char *dir, int train, ts_device *dev,
                                       ts_tensor **images, ts_tensor **labels)
{
    if (!images || !labels)
        return ts__fail(TS_EINVAL, "ts_fashion_mnist_load: images or labels is NULL");
    *images = *labels = NULL;
    if (!dir)
        dir = TS_FASHION_MNIST_DIR;
    ts_status s = ts__pick_device(dev, &dev);
    if (s)
        return s;
    struct stat st;
    int missing = stat(dir, &st) != 0;
    if (missing || !S_ISDIR(st.st_mode))
        return ts__fail(TS_EIO, "Fashion-MNIST: directory '%s': %s; %s", dir,
                        missing ? strerror(errno) : "not a directory", FMNIST_PACKAGE);
    const char *pre = train ? "train" : "t10k";
    char name[64], *ipath = NULL, *lpath = NULL;
    idx_host im = {0}, lb = {0};
    float *slice = NULL;
    int64_t *lab = NULL;
    ts_tensor *x = NULL, *y = NULL;
    snprintf(name, sizeof name, "%s-images-idx3-ubyte", pre);
    if ((s = fmnist_path(dir, name, &ipath)))
        goto fail;
    snprintf(name, sizeof name, "%s-labels-idx1-ubyte", pre);
    if ((s = fmnist_path(dir, name, &lpath)))
        goto fail;
    if ((s = idx_read_host(ipath, &im)) || (s = idx_read_host(lpath, &lb)))
        goto fail;
    if (im.dtype != TS_U8 || im.ndim != 3 || im.shape[1] != 28 || im.shape[2] != 28) {
        char b[200];
        s = ts__fail(TS_ECORRUPT, "Fashion-MNIST: '%s' holds %s %s; expected uint8 (N, 28, 28)",
                     ipath, ts_dtype_name(im.dtype), ts__shape_str(im.ndim, im.shape, b, sizeof b));
        goto fail;
    }
    if (lb.dtype != TS_U8 || lb.ndim != 1) {
        char b[200];
        s = ts__fail(TS_ECORRUPT, "Fashion-MNIST: '%s' holds %s %s; expected uint8 (N)", lpath,
                     ts_dtype_name(lb.dtype), ts__shape_str(lb.ndim, lb.shape, b, sizeof b));
        goto fail;
    }
    int64_t n = im.shape[0];
    if (n == 0) {
        s = ts__fail(TS_ECORRUPT, "Fashion-MNIST: '%s' holds 0 images: nothing to %s on; "
                     "point at a directory with the real set (the Debian package "
                     "dataset-fashion-mnist installs it)", ipath, train ? "train" : "test");
        goto fail;
    }
    if (lb.shape[0] != n) {
        s = ts__fail(TS_ECORRUPT, "Fashion-MNIST: %lld images in '%s' but %lld labels in '%s'",
                     (long long)n, ipath, (long long)lb.shape[0], lpath);
        goto fail;
    }
    lab = ts__malloc((size_t)n * sizeof *lab + 1);
    slice = ts__malloc(FMNIST_SLICE * sizeof *slice);
    if (!lab || !slice) {
        s = ts__fail(TS_ENOMEM, "Fashion-MNIST: out of host memory");
        goto fail;
    }
    for (int64_t i = 0; i < n; i++) {
        if (lb.data[i] > 9) {
            s = ts__fail(TS_ECORRUPT,
                         "Fashion-MNIST: '%s': label %u of image %lld is not a "
                         "class 0..9",
                         lpath, lb.data[i], (long long)i);
            goto fail;
        }
        lab[i] = lb.data[i];
    }
    if ((s = ts_tensor_from_host(dev, TS_I64, 1, &n, lab, &y)))
        goto fail;
    /* Scaled on the host, slice by slice, so the values are the same on every backend and
     * the host never holds the whole float32 copy. */
    int64_t shape[4] = {n, 1, 28, 28};
    if ((s = ts_tensor_empty(dev, TS_F32, 4, shape, &x)))
        goto fail;
    ts_tensor_set_role(x, TS_ROLE_DATA);
    ts_tensor_set_role(y, TS_ROLE_DATA);
    const float k = 1.0f / 255.0f;
    for (size_t at = 0; at < im.nbytes; at += FMNIST_SLICE) {
        size_t len = im.nbytes - at < FMNIST_SLICE ? im.nbytes - at : FMNIST_SLICE;
        for (size_t i = 0; i < len; i++)
            slice[i] = (float)im.data[at + i] * k;
        if ((s = ts_device_copy_from_host(dev, (float *)x->storage->data + at, slice,
                                          len * sizeof *slice)))
            goto fail;
    }
    *images = x;
    *labels = y;
    x = y = NULL;
fail:
    ts_tensor_unref(x);
    ts_tensor_unref(y);
    free(slice);
    free(lab);
    free(im.data);
    free(lb.data);
    free(ipath);
    free(lpath);
    return s;
}
