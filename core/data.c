/* core/data.c: datasets. The IDX reader (one gzip member through zlib's inflate, or plain;
 * every header field and the data length validated, nothing after the gzip member, bounded
 * chunked reads, big-endian to host conversion), the Fashion-MNIST loader, and the mini-batch
 * loader: zero-copy views in order, or one index_select per batch into reused buffers along a
 * Philox permutation of (seed, epoch).
 * docs/data.md describes the design and the measured figures. */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "internal.h"
#include "philox.h"

/* Exposed by core/random.c. */

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

/* ---- the batch loader ------------------------------------------------------------------- */

struct ts_loader {
    ts_tensor *data, *labels; /* owned references; labels may be NULL */
    ts_device *dev;
    int64_t n, batch_size, nbatches;
    int shuffle, drop_last;
    uint64_t seed;
    uint64_t epoch; /* the current epoch */
    int64_t batch;  /* the next batch of it */
    /* shuffled only */
    int64_t *perm; /* host permutation of 0..n-1 for perm_epoch; also the index
                    * staging buffer: a batch uploads a slice of it */
    uint64_t perm_epoch;
    int perm_valid;
    ts_tensor *idx;         /* device int64 (cap) */
    ts_tensor *xbuf, *ybuf; /* (cap, ...) gather targets, reused every batch */
    int64_t cap;            /* min(batch_size, n) */
    /* ts_loader_set_device: batches go to target through two slots used in turn, each a
     * (cap, ...) tensor on target per stream (x, y) and a host staging buffer (pinned memory
     * of target, or malloc'd), with the ticket of the upload that last read the buffer. */
    ts_device *target;
    int pinned, slot;
    struct {
        ts_tensor *t[2];  /* x, y on target */
        void *host[2];    /* their staging buffers */
        size_t bytes[2];  /* staging bytes */
        uint64_t ticket;  /* the last upload from host[] (pinned only) */
    } up[2];
};

/* A contiguous tensor shaped like t with dim 0 of size rows. (transfer full) */
static ts_status rows_like(const ts_tensor *t, int64_t rows, ts_tensor **out)
{
    int64_t shape[TS_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    shape[0] = rows;
    return ts_tensor_empty(t->storage->dev, t->dtype, t->ndim, shape, out);
}

TS_API ts_status ts_loader_new(ts_tensor *data, ts_tensor *labels, int64_t batch_size, int shuffle,
                               uint64_t seed, int drop_last, ts_loader **out)
{
    if (!out)
        return ts__fail(TS_EINVAL, "ts_loader_new: out is NULL");
    *out = NULL;
    if (!data)
        return ts__fail(TS_EINVAL, "ts_loader_new: data is NULL");
    if (batch_size < 1)
        return ts__fail(TS_EINVAL, "ts_loader_new: batch_size is %lld; it must be >= 1",
                        (long long)batch_size);
    if (data->ndim < 1)
        return ts__fail(TS_ESHAPE, "ts_loader_new: data is 0-d; batches run over dim 0");
    if (labels) {
        ts_status s = ts__check_pair("ts_loader_new", data, labels, 0);
        if (s)
            return s;
        if (labels->ndim < 1 || labels->shape[0] != data->shape[0]) {
            char b1[160], b2[160];
            return ts__fail(TS_ESHAPE, "ts_loader_new: data %s and labels %s differ in dim 0",
                            ts__shape_str(data->ndim, data->shape, b1, sizeof b1),
                            ts__shape_str(labels->ndim, labels->shape, b2, sizeof b2));
        }
    }
    ts_loader *l = ts__calloc(1, sizeof *l);
    if (!l)
        return ts__fail(TS_ENOMEM, "ts_loader_new: out of host memory");
    l->data = ts_tensor_ref(data);
    l->labels = ts_tensor_ref(labels);
    l->dev = data->storage->dev;
    l->n = data->shape[0];
    l->batch_size = batch_size;
    l->shuffle = shuffle != 0;
    l->drop_last = drop_last != 0;
    l->seed = seed;
    l->nbatches = drop_last ? l->n / batch_size : l->n / batch_size + (l->n % batch_size != 0);
    if (l->nbatches == 0) {
        ts_status s = l->n == 0
                          ? ts__fail(TS_EINVAL, "ts_loader_new: the data has 0 samples: an epoch "
                                     "would take no step")
                          : ts__fail(TS_EINVAL, "ts_loader_new: no batch: %lld samples, batch "
                                     "size %lld and drop_last leave no whole batch",
                                     (long long)l->n, (long long)batch_size);
        ts_loader_free(l);
        return s;
    }
    l->cap = batch_size < l->n ? batch_size : l->n;
    ts_status s = TS_OK;
    if (l->shuffle && l->cap > 0) {
        l->perm = ts__malloc((size_t)l->n * sizeof *l->perm);
        if (!l->perm) {
            s = ts__fail(TS_ENOMEM,
                         "ts_loader_new: out of host memory for a permutation of "
                         "%lld",
                         (long long)l->n);
            goto fail;
        }
        if ((s = ts_tensor_empty(l->dev, TS_I64, 1, &l->cap, &l->idx)) ||
            (s = rows_like(data, l->cap, &l->xbuf)) ||
            (labels && (s = rows_like(labels, l->cap, &l->ybuf))))
            goto fail;
    }
    *out = l;
    return TS_OK;
fail:
    ts_loader_free(l);
    return s;
}

static ts_status buf_rows(const ts_tensor *buf, int64_t len, ts_tensor **out);
static long storage_refs(const ts_tensor *t);

/* Frees the upload slots (waiting for uploads in flight first). */
static void upload_free(ts_loader *l)
{
    for (int k = 0; k < 2; k++) {
        if (l->pinned)
            ts_device_wait_copy(l->target, l->up[k].ticket);
        for (int j = 0; j < 2; j++) {
            ts_tensor_unref(l->up[k].t[j]);
            if (l->pinned)
                ts_device_pinned_free(l->target, l->up[k].host[j]);
            else
                free(l->up[k].host[j]);
        }
    }
    memset(l->up, 0, sizeof l->up);
    l->target = NULL;
    l->pinned = 0;
}

TS_API ts_status ts_loader_set_device(ts_loader *l, ts_device *dev, int pinned)
{
    if (!l)
        return ts__fail(TS_EINVAL, "ts_loader_set_device: loader is NULL");
    upload_free(l);
    if (!dev || dev == l->dev)
        return TS_OK; /* batches stay where the data is */
    l->target = dev;
    l->pinned = pinned != 0;
    l->slot = 0;
    ts_status s = TS_OK;
    for (int k = 0; k < 2 && !s; k++) {
        for (int j = 0; j < 2 && !s; j++) {
            ts_tensor *src = j ? l->labels : l->data;
            if (!src)
                continue;
            int64_t shape[TS_MAX_DIMS];
            memcpy(shape, src->shape, sizeof shape);
            shape[0] = l->cap;
            size_t bytes = (size_t)ts_tensor_numel(src) / (size_t)l->n * (size_t)l->cap *
                           ts_dtype_size(src->dtype);
            l->up[k].bytes[j] = bytes;
            if ((s = ts_tensor_empty(dev, src->dtype, src->ndim, shape, &l->up[k].t[j])))
                break;
            if (l->pinned)
                s = ts_device_pinned_alloc(dev, bytes ? bytes : 1, "loader staging",
                                           &l->up[k].host[j]);
            else if (!(l->up[k].host[j] = ts__malloc(bytes ? bytes : 1)))
                s = ts__fail(TS_ENOMEM, "out of host memory for a %zu-byte staging buffer",
                             bytes);
        }
    }
    if (s) {
        upload_free(l);
        return ts__fail_prefix(s, "ts_loader_set_device: ");
    }
    return TS_OK;
}

/* Sends the host-side batch (bx, by) of len rows to the target through the next slot and
 * replaces them with views of the slot's tensors. */
static ts_status upload(ts_loader *l, ts_tensor **bx, ts_tensor **by, int64_t len)
{
    int k = l->slot;
    for (int j = 0; j < 2; j++) {
        long r = storage_refs(l->up[k].t[j]);
        if (r > 1)
            return ts__fail(TS_ESTATE,
                            "ts_loader_next: the batch before the previous one is still "
                            "referenced (%ld extra references): release each batch with "
                            "ts_tensor_unref before asking for the one after the next; the "
                            "loader uploads into two buffers used in turn",
                            r - 1);
    }
    ts_status s;
    if (l->pinned && (s = ts_device_wait_copy(l->target, l->up[k].ticket)))
        return s;
    l->up[k].ticket = 0;
    for (int j = 0; j < 2; j++) {
        ts_tensor **b = j ? by : bx, *dst = l->up[k].t[j], *view;
        if (!*b || !dst)
            continue;
        size_t nbytes = (size_t)ts_tensor_numel(*b) * ts_dtype_size((*b)->dtype);
        void *host = l->up[k].host[j], *dev_ptr = ts_tensor_data(dst);
        uint64_t ticket = 0;
        if ((s = ts_tensor_to_host(*b, host, nbytes)) ||
            (s = l->pinned ? ts_device_copy_from_pinned(l->target, dev_ptr, host, nbytes, &ticket)
                           : ts_device_copy_from_host(l->target, dev_ptr, host, nbytes)) ||
            (s = buf_rows(dst, len, &view)))
            return s;
        if (ticket)
            l->up[k].ticket = ticket;
        ts__bump_version(dst);
        ts_tensor_unref(*b);
        *b = view;
    }
    l->slot ^= 1;
    return TS_OK;
}

TS_API void ts_loader_free(ts_loader *l)
{
    if (!l)
        return;
    upload_free(l);
    ts_tensor_unref(l->data);
    ts_tensor_unref(l->labels);
    ts_tensor_unref(l->idx);
    ts_tensor_unref(l->xbuf);
    ts_tensor_unref(l->ybuf);
    free(l->perm);
    free(l);
}

TS_API int64_t ts_loader_batches(const ts_loader *l)
{
    return l ? l->nbatches : 0;
}

TS_API void ts_loader_position(const ts_loader *l, uint64_t *epoch, int64_t *batch)
{
    if (epoch)
        *epoch = l ? l->epoch : 0;
    if (batch)
        *batch = l ? l->batch : 0;
}

TS_API ts_status ts_loader_start_epoch(ts_loader *l, uint64_t epoch)
{
    return ts_loader_seek(l, epoch, 0);
}

TS_API ts_status ts_loader_seek(ts_loader *l, uint64_t epoch, int64_t batch)
{
    if (!l)
        return ts__fail(TS_EINVAL, "ts_loader_seek: loader is NULL");
    if (batch < 0 || batch > l->nbatches)
        return ts__fail(TS_EINVAL,
                        "ts_loader_seek: batch %lld is outside 0..%lld (the batches "
                        "of an epoch)",
                        (long long)batch, (long long)l->nbatches);
    l->epoch = epoch;
    l->batch = batch;
    return TS_OK;
}

/* Fisher-Yates over 0..n-1. Step i (from n-1 down to 1) swaps i with j uniform in [0, i], drawn
 * from Philox block (key = seed, counter = (epoch, i)): its first 64 bits, rejected (in favour
 * of the next 64) when below 2^64 mod (i + 1), which makes j exactly uniform unless both draws
 * fall there (probability below (n / 2^64)^2); then the modulo bias is at most n / 2^64. */
static void make_perm(ts_loader *l)
{
    int64_t *p = l->perm;
    for (int64_t i = 0; i < l->n; i++)
        p[i] = i;
    uint32_t key[2] = {(uint32_t)l->seed, (uint32_t)(l->seed >> 32)};
    for (int64_t i = l->n - 1; i > 0; i--) {
        uint32_t ctr[4] = {(uint32_t)l->epoch, (uint32_t)(l->epoch >> 32), (uint32_t)i,
                           (uint32_t)((uint64_t)i >> 32)};
        uint32_t r[4];
        ts__philox4x32_10(ctr, key, r);
        uint64_t range = (uint64_t)i + 1;
        uint64_t below = (0 - range) % range; /* 2^64 mod range */
        uint64_t v = (uint64_t)r[0] | (uint64_t)r[1] << 32;
        if (v < below)
            v = (uint64_t)r[2] | (uint64_t)r[3] << 32;
        int64_t j = (int64_t)(v % range);
        int64_t t = p[i];
        p[i] = p[j];
        p[j] = t;
    }
    l->perm_epoch = l->epoch;
    l->perm_valid = 1;
}

/* The rows [start, start + len) of buf as a new tensor: buf's layout (a fresh struct, so the
 * caller's tensor is never the loader's own). (transfer full) */
static ts_status buf_rows(const ts_tensor *buf, int64_t len, ts_tensor **out)
{
    int64_t shape[TS_MAX_DIMS];
    memcpy(shape, buf->shape, sizeof shape);
    shape[0] = len;
    return ts__view(buf, buf->ndim, shape, buf->strides, buf->offset, out);
}

/* t's operand; when each dim-0 row of t is contiguous, as (rows, row elements): the gather
 * then copies whole rows in one pass instead of walking every inner dim per index. */
static void row_operand(const ts_tensor *t, ts_operand *op)
{
    ts__operand(t, op);
    int64_t row = 1;
    for (int d = t->ndim - 1; d >= 1; d--) {
        if (t->shape[d] != 1 && t->strides[d] != row)
            return; /* not contiguous: the kernel walks the strides */
        row *= t->shape[d];
    }
    if (t->ndim >= 2) {
        op->ndim = 2;
        op->shape[1] = row;
        op->strides[1] = 1;
        for (int d = 2; d < TS_MAX_DIMS; d++)
            op->shape[d] = op->strides[d] = 0;
    }
}

/* Gathers src rows at idx[0..len) into the first len rows of buf with one kernel. */
static ts_status gather(ts_loader *l, const ts_tensor *src, ts_tensor *buf, int64_t len)
{
    ts_operand in[2], op;
    row_operand(src, &in[0]);
    ts__operand(l->idx, &in[1]);
    in[1].shape[0] = len;
    row_operand(buf, &op);
    op.shape[0] = len;
    if (in[0].ndim != op.ndim) { /* src rows are strided: both at full rank */
        ts__operand(src, &in[0]);
        ts__operand(buf, &op);
        op.shape[0] = len;
    }
    ts_dim_params p = {0};
    ts_status s = ts__run(l->dev, TS_OP_INDEX_SELECT, in, 2, &op, 1, &p, sizeof p);
    if (s == TS_OK)
        ts__bump_version(buf);
    return s;
}

static long storage_refs(const ts_tensor *t)
{
    return t ? atomic_load(&t->storage->refcount) : 1;
}

TS_API ts_status ts_loader_next(ts_loader *l, ts_tensor **x, ts_tensor **y)
{
    if (x)
        *x = NULL;
    if (y)
        *y = NULL;
    if (!l || !x)
        return ts__fail(TS_EINVAL, "ts_loader_next: loader or x is NULL");
    if (l->batch >= l->nbatches)
        return TS_OK; /* the end of the epoch */
    int64_t start = l->batch * l->batch_size;
    int64_t len = l->n - start < l->batch_size ? l->n - start : l->batch_size;
    ts_status s;
    ts_tensor *bx = NULL, *by = NULL;
    if (!l->shuffle) {
        ts_no_grad_enter(); /* views of data that requires grad must not join its graph */
        s = ts_tensor_narrow(l->data, 0, start, len, &bx);
        if (s == TS_OK && l->labels)
            s = ts_tensor_narrow(l->labels, 0, start, len, &by);
        ts_no_grad_exit();
        if (s)
            goto fail;
    } else {
        long rx = storage_refs(l->xbuf), ry = storage_refs(l->ybuf);
        if (rx > 1 || ry > 1)
            return ts__fail(TS_ESTATE,
                            "ts_loader_next: the previous shuffled batch is still "
                            "referenced (%ld extra references to its buffers); "
                            "release it with ts_tensor_unref first: shuffled batches "
                            "are gathered into buffers the loader reuses",
                            (rx - 1) + (ry - 1));
        if (!l->perm_valid || l->perm_epoch != l->epoch)
            make_perm(l);
        if ((s = ts_device_copy_from_host(l->dev, l->idx->storage->data, l->perm + start,
                                          (size_t)len * sizeof *l->perm)) ||
            (s = gather(l, l->data, l->xbuf, len)) ||
            (l->labels && (s = gather(l, l->labels, l->ybuf, len))))
            return ts__fail_prefix(s,
                                   "ts_loader_next: gathering batch %lld: ", (long long)l->batch);
        if ((s = buf_rows(l->xbuf, len, &bx)) || (l->labels && (s = buf_rows(l->ybuf, len, &by))))
            goto fail;
    }
    if (l->target && (s = upload(l, &bx, &by, len)))
        goto fail;
    l->batch++;
    *x = bx;
    if (y)
        *y = by;
    else
        ts_tensor_unref(by);
    return TS_OK;
fail:
    ts_tensor_unref(bx);
    ts_tensor_unref(by);
    return s;
}
