/* tests/unit/test-data.c: the IDX reader (round trips of every type, plain and gzip, and
 * hostile files: every defect must be a clean TS_ECORRUPT/TS_EIO naming the file), the
 * Fashion-MNIST loader (the real set when Debian's package is installed, a small fake one
 * always), and the batch loader (views, shuffle determinism, drop_last, seek, TS_ESTATE, no
 * pool growth). TS_TEST_SKIP_FMNIST=1 skips the full Fashion-MNIST load (for valgrind). */
#include <errno.h>
#include <zlib.h>

#include "../tap.h"

static ts_device *dev;

static void setup(void)
{
    dev = tap_start();
}

/* ---- writing IDX files ---------------------------------------------------------------- */

/* An IDX file image: header for (type, ndim, dims) then the big-endian payload as given. */
static size_t idx_bytes(unsigned char *buf, unsigned type, int ndim, const uint32_t *dims,
                        const unsigned char *payload, size_t npayload)
{
    size_t n = 0;
    buf[n++] = 0;
    buf[n++] = 0;
    buf[n++] = (unsigned char)type;
    buf[n++] = (unsigned char)ndim;
    for (int d = 0; d < ndim; d++) {
        buf[n++] = (unsigned char)(dims[d] >> 24);
        buf[n++] = (unsigned char)(dims[d] >> 16);
        buf[n++] = (unsigned char)(dims[d] >> 8);
        buf[n++] = (unsigned char)dims[d];
    }
    if (npayload) /* payload may be NULL for a header-only file */
        memcpy(buf + n, payload, npayload);
    return n + npayload;
}

static char pathbuf[4096];

static const char *write_plain(const char *name, const void *bytes, size_t n)
{
    snprintf(pathbuf, sizeof pathbuf, "%s/%s", tap_tmpdir(), name);
    FILE *f = fopen(pathbuf, "wb");
    CHECK_MSG(f, "fopen %s: %s", pathbuf, strerror(errno));
    CHECK(fwrite(bytes, 1, n, f) == n);
    CHECK(fclose(f) == 0);
    return pathbuf;
}

/* mode: "wb" (default level) or "wb0" (stored blocks). */
static const char *write_gzip(const char *name, const void *bytes, size_t n, const char *mode)
{
    snprintf(pathbuf, sizeof pathbuf, "%s/%s", tap_tmpdir(), name);
    gzFile gz = gzopen(pathbuf, mode);
    CHECK_MSG(gz, "gzopen %s", pathbuf);
    CHECK(n == 0 || gzwrite(gz, bytes, (unsigned)n) == (int)n);
    CHECK(gzclose(gz) == Z_OK);
    return pathbuf;
}

static const unsigned char *read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    CHECK(f);
    static unsigned char buf[1 << 16];
    *n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    return buf;
}

/* ---- IDX round trips ------------------------------------------------------------------ */

typedef struct idx_case {
    unsigned type;
    int32_t dtype;
    size_t file_es;
    unsigned char payload[48]; /* 6 elements, big-endian */
    double want[6];
} idx_case;

static void check_values(ts_tensor *t, int32_t dtype, const double *want, int n)
{
    unsigned char raw[6 * 8];
    CHECK_INT_EQ(ts_tensor_numel(t), n);
    CHECK_OK(ts_tensor_to_host(t, raw, (size_t)n * ts_dtype_size(dtype)));
    for (int i = 0; i < n; i++) {
        double v = dtype == TS_F32   ? ((float *)raw)[i]
                   : dtype == TS_F64 ? ((double *)raw)[i]
                   : dtype == TS_I32 ? ((int32_t *)raw)[i]
                                     : raw[i];
        CHECK_MSG(v == want[i], "element %d: %.17g, want %.17g", i, v, want[i]);
    }
}

static void test_idx_round_trips(void)
{
    setup();
    /* 1.5f = 0x3FC00000, -2.25f = 0xC0100000; 1.5 = 0x3FF8000000000000. */
    static const idx_case cases[] = {
        {0x08, TS_U8, 1, {0, 1, 2, 0x7F, 0x80, 0xFF}, {0, 1, 2, 127, 128, 255}},
        {0x09, TS_I32, 1, {0, 1, 0x7F, 0x80, 0xFF, 0xFE}, {0, 1, 127, -128, -1, -2}},
        {0x0B,
         TS_I32,
         2,
         {1, 2, 0xFF, 0xFF, 0x80, 0, 0x7F, 0xFF, 0, 0, 0xFF, 0xFE},
         {0x0102, -1, -32768, 32767, 0, -2}},
        {0x0C,
         TS_I32,
         4,
         {1,    2,    3,    4,    0xFF, 0xFF, 0xFF, 0xFF, 0x80, 0,    0,    0,
          0x7F, 0xFF, 0xFF, 0xFF, 0,    0,    0,    0,    0xFF, 0xFF, 0xFF, 0xFE},
         {0x01020304, -1, -2147483648.0, 2147483647, 0, -2}},
        {0x0D,
         TS_F32,
         4,
         {0x3F, 0xC0, 0, 0, 0xC0, 0x10, 0, 0, 0,    0,    0,    0,
          0x3F, 0x80, 0, 0, 0x80, 0,    0, 0, 0x47, 0x7F, 0xFF, 0},
         {1.5, -2.25, 0, 1, -0.0, 65535}},
        {0x0E,
         TS_F64,
         8,
         {0x3F, 0xF8, 0, 0, 0, 0, 0, 0, 0xC0, 0x02, 0, 0, 0, 0, 0, 0, 0,    0,    0, 0, 0, 0, 0, 0,
          0x3F, 0xF0, 0, 0, 0, 0, 0, 1, 0x40, 0x59, 0, 0, 0, 0, 0, 0, 0xBF, 0xF0, 0, 0, 0, 0, 0, 0},
         {1.5, -2.25, 0, 1.0000000000000002, 100, -1}},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const idx_case *c = &cases[k];
        unsigned char file[128];
        uint32_t dims[2] = {2, 3};
        size_t n = idx_bytes(file, c->type, 2, dims, c->payload, 6 * c->file_es);
        for (int gz = 0; gz < 2; gz++) {
            char name[32];
            snprintf(name, sizeof name, "t%02x%s", c->type, gz ? ".gz" : "");
            const char *p = gz ? write_gzip(name, file, n, "wb") : write_plain(name, file, n);
            ts_tensor *t;
            CHECK_OK(ts_idx_load(p, dev, &t));
            CHECK_INT_EQ(ts_tensor_dtype(t), c->dtype);
            CHECK_INT_EQ(ts_tensor_ndim(t), 2);
            CHECK(ts_tensor_shape(t)[0] == 2 && ts_tensor_shape(t)[1] == 3);
            check_values(t, c->dtype, c->want, 6);
            ts_tensor_unref(t);
        }
    }
    /* The most dims, a 1-D file, and an empty tensor (a zero size) are all valid. */
    unsigned char file[256], payload[4] = {9, 8, 7, 6};
    uint32_t dims8[8] = {1, 1, 2, 1, 1, 2, 1, 1};
    size_t n = idx_bytes(file, 0x08, 8, dims8, payload, 4);
    ts_tensor *t;
    CHECK_OK(ts_idx_load(write_plain("eight", file, n), NULL, &t));
    CHECK_INT_EQ(ts_tensor_ndim(t), 8);
    check_values(t, TS_U8, (const double[]){9, 8, 7, 6}, 4);
    ts_tensor_unref(t);
    uint32_t dims0[3] = {0, 4000000, 5};
    n = idx_bytes(file, 0x0D, 3, dims0, NULL, 0);
    CHECK_OK(ts_idx_load(write_gzip("empty.gz", file, n, "wb"), dev, &t));
    CHECK_INT_EQ(ts_tensor_numel(t), 0);
    CHECK(ts_tensor_shape(t)[1] == 4000000);
    ts_tensor_unref(t);
    /* A larger file crosses the reader's chunk and growth boundaries. */
    enum { BIG = 3 << 20 };
    unsigned char *big = malloc(BIG + 16);
    CHECK(big);
    uint32_t bd[1] = {BIG / 4};
    n = idx_bytes(big, 0x0C, 1, bd, NULL, 0);
    for (uint32_t i = 0; i < BIG / 4; i++) {
        uint32_t v = i * 2654435761u;
        big[n + 4 * i] = (unsigned char)(v >> 24);
        big[n + 4 * i + 1] = (unsigned char)(v >> 16);
        big[n + 4 * i + 2] = (unsigned char)(v >> 8);
        big[n + 4 * i + 3] = (unsigned char)v;
    }
    for (int gz = 0; gz < 2; gz++) {
        const char *p =
            gz ? write_gzip("big.gz", big, n + BIG, "wb1") : write_plain("big", big, n + BIG);
        CHECK_OK(ts_idx_load(p, dev, &t));
        int32_t *v = malloc(BIG);
        CHECK(v);
        CHECK_OK(ts_tensor_to_host(t, v, BIG));
        for (uint32_t i = 0; i < BIG / 4; i++)
            CHECK((uint32_t)v[i] == i * 2654435761u);
        free(v);
        ts_tensor_unref(t);
    }
    free(big);
    tap_end();
}

/* ---- hostile files -------------------------------------------------------------------- */

static void check_corrupt(const char *path, const char *defect)
{
    ts_tensor *t = (ts_tensor *)1;
    CHECK_FAILS(ts_idx_load(path, dev, &t), TS_ECORRUPT, path, defect);
    CHECK(t == NULL);
}

/* Writes bytes plain and gzip-compressed; both must fail with defect. */
static void check_both(const char *name, const void *bytes, size_t n, const char *defect)
{
    char gzname[64];
    check_corrupt(write_plain(name, bytes, n), defect);
    snprintf(gzname, sizeof gzname, "%s.gz", name);
    check_corrupt(write_gzip(gzname, bytes, n, "wb"), defect);
}

static void test_idx_hostile(void)
{
    setup();
    unsigned char f[256], pay[64];
    for (int i = 0; i < 64; i++)
        pay[i] = (unsigned char)(i * 37 + 11);
    uint32_t dims[9] = {2, 3, 1, 1, 1, 1, 1, 1, 1};
    check_both("empty", "", 0, "empty");
    check_both("three", "\0\0\x08", 3, "truncated header");
    size_t n = idx_bytes(f, 0x08, 2, dims, pay, 6);
    f[0] = 0x12;
    check_both("magic", f, n, "magic");
    n = idx_bytes(f, 0x0A, 2, dims, pay, 6);
    check_both("type", f, n, "unknown data type 0x0a");
    n = idx_bytes(f, 0x08, 0, dims, pay, 6);
    check_both("dims0", f, n, "0 dims");
    n = idx_bytes(f, 0x08, 9, dims, pay, 6);
    check_both("dims9", f, n, "9 dims");
    n = idx_bytes(f, 0x08, 2, dims, pay, 6);
    check_both("dimscut", f, 9, "truncated header");
    uint32_t huge[4] = {0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu, 0};
    n = idx_bytes(f, 0x08, 4, huge, pay, 6);
    check_both("overflow", f, n, "overflow");
    uint32_t big[2] = {65536, 65537}; /* 4 GiB + 64 KiB of bytes: over the cap */
    n = idx_bytes(f, 0x08, 2, big, pay, 6);
    check_both("cap", f, n, "limit");
    uint32_t zbig[3] = {0, 4000000000u, 5}; /* empty, but its strides would pass the cap */
    n = idx_bytes(f, 0x0D, 3, zbig, pay, 0);
    check_both("zerobig", f, n, "limit");
    uint32_t big32[2] = {32768, 32769}; /* 1 GiB elements of 8 bytes */
    n = idx_bytes(f, 0x0E, 2, big32, pay, 64);
    check_both("cap64", f, n, "limit");
    /* A header that claims 1 GiB of data in a tiny file: truncated, quickly, without
     * reserving the gigabyte first. */
    uint32_t gig[1] = {1u << 30};
    n = idx_bytes(f, 0x08, 1, gig, pay, 64);
    check_both("gig", f, n, "truncated data: 64 of the 1073741824 bytes");

    /* Every proper prefix of a valid file fails cleanly, plain and gzip. */
    uint32_t d3[2] = {3, 4};
    n = idx_bytes(f, 0x0C, 2, d3, pay, 48);
    for (size_t len = 0; len < n; len++) {
        char name[32];
        snprintf(name, sizeof name, "prefix%zu", len);
        check_corrupt(write_plain(name, f, len), len == 0 ? "empty" : "truncated");
    }
    size_t gzn;
    const char *gzp = write_gzip("whole.gz", f, n, "wb");
    unsigned char gzbytes[512];
    const unsigned char *got = read_all(gzp, &gzn);
    memcpy(gzbytes, got, gzn);
    CHECK(gzn > 20 && gzn < sizeof gzbytes);
    for (size_t len = 0; len < gzn; len++) {
        char name[32];
        snprintf(name, sizeof name, "gzprefix%zu", len);
        check_corrupt(write_plain(name, gzbytes, len), "");
    }
    /* Trailing bytes after the declared data, plain and gzip. */
    check_both("trail", f, n + 1, "1 trailing bytes");
    check_both("trail7", f, n + 7, "7 trailing bytes");

    /* A gzip stream damaged in the middle: stored blocks make the damage reach the check
     * value (deterministic across zlib versions); a compressed stream breaks its decoder. */
    unsigned char *bigf = malloc(8192);
    CHECK(bigf);
    uint32_t d1[1] = {8000};
    n = idx_bytes(bigf, 0x08, 1, d1, NULL, 0);
    for (int i = 0; i < 8000; i++)
        bigf[n + (size_t)i] = (unsigned char)((i * 7919) >> 3);
    gzp = write_gzip("stored.gz", bigf, n + 8000, "wb0");
    unsigned char *g = malloc(16384);
    CHECK(g);
    got = read_all(gzp, &gzn);
    memcpy(g, got, gzn);
    g[gzn / 2] ^= 0x55;
    check_corrupt(write_plain("stored-bad.gz", g, gzn), "corrupt gzip stream");
    char deflated[4096];
    snprintf(deflated, sizeof deflated, "%s", write_gzip("deflated.gz", bigf, n + 8000, "wb9"));
    got = read_all(deflated, &gzn);
    memcpy(g, got, gzn);
    CHECK(gzn > 200);
    memset(g + gzn / 2, 0xFF, 16);
    check_corrupt(write_plain("deflated-bad.gz", g, gzn), "gzip");
    /* Its last 8 bytes (the CRC and length) cut off: the data is all there, the file is not. */
    got = read_all(deflated, &gzn);
    check_corrupt(write_plain("deflated-cut.gz", got, gzn - 8), "truncated gzip stream");
    /* Bytes after the end of the gzip stream (zlib's gzread ignores them): garbage, zeros, a
     * second member holding part of the data. Every one is an error naming the file. */
    got = read_all(deflated, &gzn);
    memcpy(g, got, gzn);
    memcpy(g + gzn, "GARBAGE", 7);
    check_corrupt(write_plain("deflated-garbage.gz", g, gzn + 7), "after the end of the gzip");
    memset(g + gzn, 0, 4);
    check_corrupt(write_plain("deflated-zeros.gz", g, gzn + 4), "after the end of the gzip");
    /* Eight trailing bytes that end with the right length: the CRC still gives them away. */
    uint32_t total = (uint32_t)(n + 8000);
    unsigned char fake[8] = {0xde, 0xad, 0xbe, 0xef, (unsigned char)total,
                             (unsigned char)(total >> 8), (unsigned char)(total >> 16),
                             (unsigned char)(total >> 24)};
    memcpy(g + gzn, fake, 8);
    check_corrupt(write_plain("deflated-fake-trailer.gz", g, gzn + 8), "after the end of the gzip");
    /* Garbage followed by a copy of the member's own trailer, and an empty second member
     * followed by that trailer: the file's last eight bytes match what was decoded, but the
     * stream ended before them. */
    memcpy(g + gzn, "GARBAGE", 7);
    memcpy(g + gzn + 7, got + gzn - 8, 8);
    check_corrupt(write_plain("deflated-garbage-trailer.gz", g, gzn + 15),
                  "after the end of the gzip");
    {
        size_t ne;
        unsigned char e[64]; /* read_all's buffer is reused below */
        const unsigned char *ep = read_all(write_gzip("empty-member.gz", "", 0, "wb"), &ne);
        CHECK(ne > 8 && ne < sizeof e);
        memcpy(e, ep, ne);
        got = read_all(deflated, &gzn);
        memcpy(g, got, gzn);
        memcpy(g + gzn, e, ne);
        memcpy(g + gzn + ne, got + gzn - 8, 8);
        check_corrupt(write_plain("deflated-empty-member.gz", g, gzn + ne + 8),
                      "after the end of the gzip");
        check_corrupt(write_plain("deflated-then-empty.gz", g, gzn + ne),
                      "after the end of the gzip");
    }
    /* One trailing byte of every value: none is taken for the end of the file. */
    got = read_all(deflated, &gzn);
    memcpy(g, got, gzn);
    for (int b = 0; b < 256; b += 51) {
        g[gzn] = (unsigned char)b;
        char name[64];
        snprintf(name, sizeof name, "deflated-byte%d.gz", b);
        check_corrupt(write_plain(name, g, gzn + 1), "after the end of the gzip");
    }
    {
        size_t half = (n + 8000) / 2, n1, n2;
        unsigned char *two = malloc(32768);
        CHECK(two);
        got = read_all(write_gzip("m1.gz", bigf, half, "wb"), &n1);
        memcpy(two, got, n1);
        got = read_all(write_gzip("m2.gz", bigf + half, n + 8000 - half, "wb"), &n2);
        memcpy(two + n1, got, n2);
        check_corrupt(write_plain("two-members.gz", two, n1 + n2), "after the end of the gzip");
        free(two);
    }
    free(g);
    free(bigf);

    /* Unreadable: TS_EIO with the system's reason. */
    ts_tensor *t;
    snprintf(pathbuf, sizeof pathbuf, "%s/no-such-file", tap_tmpdir());
    CHECK_FAILS(ts_idx_load(pathbuf, dev, &t), TS_EIO, pathbuf, strerror(ENOENT));
    CHECK_FAILS(ts_idx_load(tap_tmpdir(), dev, &t), TS_EIO, tap_tmpdir(), "is a directory, not a regular file");
    CHECK_FAILS(ts_idx_load(NULL, dev, &t), TS_EINVAL, "NULL");
    tap_end();
}

/* ---- Fashion-MNIST -------------------------------------------------------------------- */

static void test_fmnist_missing(void)
{
    setup();
    ts_tensor *x = (ts_tensor *)1, *y = (ts_tensor *)1;
    CHECK_FAILS(ts_fashion_mnist_load("/nonexistent/fashion", 1, dev, &x, &y), TS_EIO,
                "/nonexistent/fashion", "dataset-fashion-mnist");
    CHECK(x == NULL && y == NULL);
    CHECK_FAILS(ts_fashion_mnist_load(tap_tmpdir(), 0, dev, &x, &y), TS_EIO,
                "t10k-images-idx3-ubyte.gz", "install the Debian package dataset-fashion-mnist");
    tap_end();
}

/* A fake set of 5 images in tmpdir (uncompressed file names, as the loader also accepts). */
static void write_fake_fmnist(int nimg, int nlab, unsigned char badlabel)
{
    static unsigned char f[5 * 784 + 64];
    unsigned char px[5 * 784], lab[5] = {3, 0, 9, 1, badlabel};
    for (int i = 0; i < 5 * 784; i++)
        px[i] = (unsigned char)(i % 256);
    uint32_t di[3] = {(uint32_t)nimg, 28, 28}, dl[1] = {(uint32_t)nlab};
    size_t n = idx_bytes(f, 0x08, 3, di, px, (size_t)nimg * 784);
    write_plain("train-images-idx3-ubyte", f, n);
    n = idx_bytes(f, 0x08, 1, dl, lab, (size_t)nlab);
    write_plain("train-labels-idx1-ubyte", f, n);
}

static void test_fmnist_fake(void)
{
    setup();
    ts_tensor *x, *y;
    write_fake_fmnist(5, 5, 4);
    CHECK_OK(ts_fashion_mnist_load(tap_tmpdir(), 1, dev, &x, &y));
    CHECK_INT_EQ(ts_tensor_ndim(x), 4);
    CHECK(ts_tensor_shape(x)[0] == 5 && ts_tensor_shape(x)[1] == 1 && ts_tensor_shape(x)[2] == 28 &&
          ts_tensor_shape(x)[3] == 28);
    CHECK_INT_EQ(ts_tensor_dtype(x), TS_F32);
    CHECK_INT_EQ(ts_tensor_dtype(y), TS_I64);
    float *px = malloc(5 * 784 * sizeof *px);
    CHECK(px);
    CHECK_OK(ts_tensor_to_host(x, px, 5 * 784 * sizeof *px));
    for (int i = 0; i < 5 * 784; i++)
        CHECK(px[i] == (float)(i % 256) * (1.0f / 255.0f));
    CHECK(px[255] == 1.0f && px[0] == 0.0f);
    free(px);
    int64_t lab[5];
    CHECK_OK(ts_tensor_to_host(y, lab, sizeof lab));
    CHECK(lab[0] == 3 && lab[2] == 9 && lab[4] == 4);
    ts_tensor_unref(x);
    ts_tensor_unref(y);
    write_fake_fmnist(5, 4, 4);
    CHECK_FAILS(ts_fashion_mnist_load(tap_tmpdir(), 1, dev, &x, &y), TS_ECORRUPT, "5 images",
                "4 labels");
    write_fake_fmnist(5, 5, 10);
    CHECK_FAILS(ts_fashion_mnist_load(tap_tmpdir(), 1, dev, &x, &y), TS_ECORRUPT, "label 10");
    CHECK(x == NULL && y == NULL);
    /* A set of zero images is valid IDX but nothing to train or test on. */
    write_fake_fmnist(0, 0, 0);
    CHECK_FAILS(ts_fashion_mnist_load(tap_tmpdir(), 1, dev, &x, &y), TS_ECORRUPT, "0 images",
                "train-images-idx3-ubyte");
    CHECK(x == NULL && y == NULL);
    tap_end();
}

static void check_fmnist_split(int train)
{
    int64_t n = train ? 60000 : 10000;
    ts_tensor *x, *y;
    CHECK_OK(ts_fashion_mnist_load(NULL, train, dev, &x, &y));
    CHECK_INT_EQ(ts_tensor_ndim(x), 4);
    CHECK(ts_tensor_shape(x)[0] == n && ts_tensor_shape(x)[1] == 1 && ts_tensor_shape(x)[2] == 28 &&
          ts_tensor_shape(x)[3] == 28);
    CHECK(ts_tensor_ndim(y) == 1 && ts_tensor_shape(y)[0] == n);
    int64_t *lab = malloc((size_t)n * sizeof *lab);
    CHECK(lab);
    CHECK_OK(ts_tensor_to_host(y, lab, (size_t)n * sizeof *lab));
    int64_t count[10] = {0};
    for (int64_t i = 0; i < n; i++) {
        CHECK(lab[i] >= 0 && lab[i] <= 9);
        count[lab[i]]++;
    }
    for (int c = 0; c < 10; c++)
        CHECK_INT_EQ(count[c], n / 10);
    free(lab);
    float *px = malloc((size_t)n * 784 * sizeof *px);
    CHECK(px);
    CHECK_OK(ts_tensor_to_host(x, px, (size_t)n * 784 * sizeof *px));
    float lo = 1, hi = 0;
    for (int64_t i = 0; i < n * 784; i++) {
        lo = px[i] < lo ? px[i] : lo;
        hi = px[i] > hi ? px[i] : hi;
    }
    CHECK(lo == 0.0f && hi == 1.0f);
    free(px);
    ts_tensor_unref(x);
    ts_tensor_unref(y);
}

static void test_fmnist_real(void)
{
    const char *skip = getenv("TS_TEST_SKIP_FMNIST");
    if (skip && *skip && strcmp(skip, "0") != 0)
        SKIP("TS_TEST_SKIP_FMNIST is set");
    FILE *probe = fopen(TS_FASHION_MNIST_DIR "/train-images-idx3-ubyte.gz", "rb");
    if (!probe)
        SKIP("%s not found: install the Debian package dataset-fashion-mnist",
             TS_FASHION_MNIST_DIR);
    fclose(probe);
    setup();
    check_fmnist_split(1);
    check_fmnist_split(0);
    tap_end();
}

/* ---- the batch loader ----------------------------------------------------------------- */

/* x (n, 2) with rows (i, -i) as float32, y (n) = i as int64. */
static void make_data(int64_t n, ts_tensor **x, ts_tensor **y)
{
    float *xs = malloc((size_t)n * 2 * sizeof *xs);
    int64_t *ys = malloc((size_t)n * sizeof *ys + 1);
    CHECK(xs && ys);
    for (int64_t i = 0; i < n; i++) {
        xs[2 * i] = (float)i;
        xs[2 * i + 1] = (float)-i;
        ys[i] = i;
    }
    CHECK_OK(ts_tensor_from_host(dev, TS_F32, 2, (const int64_t[]){n, 2}, xs, x));
    CHECK_OK(ts_tensor_from_host(dev, TS_I64, 1, &n, ys, y));
    free(xs);
    free(ys);
}

/* Reads a batch's labels into out and checks x's rows agree with them. Returns its length. */
static int64_t batch_ids(ts_tensor *bx, ts_tensor *by, int64_t *out)
{
    int64_t len = ts_tensor_shape(by)[0];
    CHECK_INT_EQ(ts_tensor_shape(bx)[0], len);
    CHECK_INT_EQ(ts_tensor_shape(bx)[1], 2);
    CHECK_OK(ts_tensor_to_host(by, out, (size_t)len * sizeof *out));
    float *xs = malloc((size_t)len * 2 * sizeof *xs + 1);
    CHECK(xs);
    CHECK_OK(ts_tensor_to_host(bx, xs, (size_t)len * 2 * sizeof *xs));
    for (int64_t i = 0; i < len; i++)
        CHECK(xs[2 * i] == (float)out[i] && xs[2 * i + 1] == (float)-out[i]);
    free(xs);
    CHECK(ts_tensor_grad_fn_name(bx) == NULL && !ts_tensor_requires_grad(bx));
    return len;
}

/* Runs the loader's current epoch to its end: the ids in order into ids (n of them at most),
 * the batch lengths into lens. Returns the number of batches. */
static int64_t run_epoch(ts_loader *l, int64_t *ids, int64_t *lens)
{
    int64_t nb = 0, at = 0;
    for (;;) {
        ts_tensor *bx, *by;
        CHECK_OK(ts_loader_next(l, &bx, &by));
        if (!bx) {
            CHECK(by == NULL);
            break;
        }
        int64_t len = batch_ids(bx, by, ids + at);
        at += len;
        if (lens)
            lens[nb] = len;
        nb++;
        ts_tensor_unref(bx);
        ts_tensor_unref(by);
    }
    CHECK_INT_EQ(nb, ts_loader_batches(l));
    return nb;
}

static uint64_t pool_in_use(void)
{
    ts_memory_stats st = {.struct_size = sizeof st};
    CHECK_OK(ts_device_memory_stats(dev, &st));
    return st.in_use;
}

static uint64_t pool_raw_allocs(void)
{
    ts_memory_stats st = {.struct_size = sizeof st};
    CHECK_OK(ts_device_memory_stats(dev, &st));
    CHECK(st.valid & TS_STATS_POOL);
    return st.n_raw_alloc;
}

static void test_loader_views(void)
{
    setup();
    ts_tensor *x, *y;
    make_data(10, &x, &y);
    ts_loader *l;
    CHECK_OK(ts_loader_new(x, y, 4, 0, 0, 0, &l));
    CHECK_INT_EQ(ts_loader_batches(l), 3);
    uint64_t in_use = pool_in_use();
    ts_tensor *bx[3], *by[3];
    for (int b = 0; b < 3; b++) {
        uint64_t e;
        int64_t pos;
        ts_loader_position(l, &e, &pos);
        CHECK(e == 0 && pos == b);
        CHECK_OK(ts_loader_next(l, &bx[b], &by[b]));
        CHECK(bx[b] && by[b]);
        CHECK(ts_tensor_shares_storage(bx[b], x) && ts_tensor_shares_storage(by[b], y));
        int64_t ids[4];
        CHECK_INT_EQ(batch_ids(bx[b], by[b], ids), b < 2 ? 4 : 2);
        for (int i = 0; i < (b < 2 ? 4 : 2); i++)
            CHECK_INT_EQ(ids[i], 4 * b + i);
    }
    CHECK_INT_EQ(pool_in_use(), in_use); /* all three held: still no device memory */
    ts_tensor *end = (ts_tensor *)1, *endy = (ts_tensor *)1;
    CHECK_OK(ts_loader_next(l, &end, &endy));
    CHECK(end == NULL && endy == NULL);
    CHECK_OK(ts_loader_next(l, &end, NULL)); /* stays at the end */
    CHECK(end == NULL);
    for (int b = 0; b < 3; b++) {
        ts_tensor_unref(bx[b]);
        ts_tensor_unref(by[b]);
    }
    ts_loader_free(l);

    /* drop_last: the short batch goes; an exact multiple has none to drop. */
    int64_t ids[16], lens[16];
    CHECK_OK(ts_loader_new(x, y, 4, 0, 0, 1, &l));
    CHECK_INT_EQ(run_epoch(l, ids, lens), 2);
    CHECK(lens[0] == 4 && lens[1] == 4 && ids[7] == 7);
    ts_loader_free(l);
    CHECK_OK(ts_loader_new(x, y, 5, 0, 0, 1, &l));
    CHECK_INT_EQ(run_epoch(l, ids, lens), 2);
    ts_loader_free(l);
    CHECK_OK(ts_loader_new(x, y, 5, 0, 0, 0, &l));
    CHECK_INT_EQ(run_epoch(l, ids, lens), 2);
    ts_loader_free(l);
    /* Larger than the set: one short batch, or none with drop_last. */
    CHECK_OK(ts_loader_new(x, y, 64, 0, 0, 0, &l));
    CHECK_INT_EQ(run_epoch(l, ids, lens), 1);
    CHECK_INT_EQ(lens[0], 10);
    ts_loader_free(l);
    /* With drop_last a batch larger than the set leaves no batch at all: an error, not an
     * epoch of zero steps. So is a set of zero samples. */
    l = (ts_loader *)1;
    CHECK_FAILS(ts_loader_new(x, y, 64, 1, 0, 1, &l), TS_EINVAL, "no batch", "10 samples",
                "batch size 64");
    CHECK(l == NULL);
    {
        ts_tensor *ex, *ey;
        CHECK_OK(ts_tensor_empty(dev, TS_F32, 2, (const int64_t[]){0, 3}, &ex));
        CHECK_OK(ts_tensor_empty(dev, TS_I64, 1, (const int64_t[]){0}, &ey));
        CHECK_FAILS(ts_loader_new(ex, ey, 4, 1, 0, 0, &l), TS_EINVAL, "0 samples");
        ts_tensor_unref(ex);
        ts_tensor_unref(ey);
    }

    /* Data that requires grad: batches still record nothing. */
    CHECK_OK(ts_tensor_set_requires_grad(x, 1));
    CHECK_OK(ts_loader_new(x, NULL, 3, 0, 0, 0, &l));
    ts_tensor *b, *nob = (ts_tensor *)1;
    CHECK_OK(ts_loader_next(l, &b, &nob));
    CHECK(b && nob == NULL);
    CHECK(ts_tensor_grad_fn_name(b) == NULL && !ts_tensor_requires_grad(b));
    ts_tensor_unref(b);
    ts_loader_free(l);

    /* Bad arguments. */
    ts_tensor *y9, *s0d;
    CHECK_OK(ts_tensor_zeros(dev, TS_I64, 1, (const int64_t[]){9}, &y9));
    CHECK_OK(ts_tensor_zeros(dev, TS_F32, 0, NULL, &s0d));
    CHECK_FAILS(ts_loader_new(x, y, 0, 0, 0, 0, &l), TS_EINVAL, "batch_size");
    CHECK_FAILS(ts_loader_new(x, y9, 2, 0, 0, 0, &l), TS_ESHAPE, "(10, 2)", "(9)");
    CHECK_FAILS(ts_loader_new(s0d, NULL, 2, 0, 0, 0, &l), TS_ESHAPE, "0-d");
    CHECK(l == NULL);
    ts_tensor_unref(y9);
    ts_tensor_unref(s0d);
    ts_tensor_unref(x);
    ts_tensor_unref(y);
    tap_end();
}

static int is_permutation(const int64_t *ids, int64_t n, int64_t m)
{
    char *seen = calloc((size_t)m, 1);
    CHECK(seen);
    int ok = 1;
    for (int64_t i = 0; i < n && ok; i++) {
        ok = ids[i] >= 0 && ids[i] < m && !seen[ids[i]];
        if (ok)
            seen[ids[i]] = 1;
    }
    free(seen);
    return ok;
}

enum { N = 1003, BS = 10 };

static void test_loader_shuffle(void)
{
    setup();
    ts_tensor *x, *y;
    make_data(N, &x, &y);
    static int64_t e0[N], e1[N], again[N], other[N], lens[N];
    ts_loader *l, *l2, *l3;
    CHECK_OK(ts_loader_new(x, y, BS, 1, 42, 0, &l));
    CHECK_OK(ts_loader_new(x, y, BS, 1, 42, 0, &l2));
    CHECK_OK(ts_loader_new(x, y, BS, 1, 43, 0, &l3));
    CHECK_INT_EQ(run_epoch(l, e0, lens), 101);
    CHECK_INT_EQ(lens[100], 3);
    CHECK(is_permutation(e0, N, N));
    int64_t fixed = 0;
    for (int64_t i = 0; i < N; i++)
        fixed += e0[i] == i;
    CHECK_MSG(fixed < 20, "%lld fixed points: not shuffled", (long long)fixed);
    CHECK_OK(ts_loader_start_epoch(l, 1));
    run_epoch(l, e1, NULL);
    CHECK(is_permutation(e1, N, N));
    CHECK(memcmp(e0, e1, sizeof e0) != 0);
    /* The same (seed, epoch) again, in this loader and in another one. */
    CHECK_OK(ts_loader_start_epoch(l, 0));
    run_epoch(l, again, NULL);
    CHECK(memcmp(e0, again, sizeof e0) == 0);
    CHECK_OK(ts_loader_start_epoch(l2, 1));
    run_epoch(l2, again, NULL);
    CHECK(memcmp(e1, again, sizeof e1) == 0);
    CHECK_OK(ts_loader_start_epoch(l2, 0));
    run_epoch(l2, again, NULL);
    CHECK(memcmp(e0, again, sizeof e0) == 0);
    run_epoch(l3, other, NULL); /* another seed */
    CHECK(is_permutation(other, N, N));
    CHECK(memcmp(e0, other, sizeof e0) != 0);
    ts_loader_free(l);
    ts_loader_free(l2);
    ts_loader_free(l3);

    /* drop_last: 100 full batches of distinct rows. */
    CHECK_OK(ts_loader_new(x, y, BS, 1, 42, 1, &l));
    CHECK_INT_EQ(run_epoch(l, again, lens), 100);
    CHECK_INT_EQ(lens[99], BS);
    CHECK(is_permutation(again, N - 3, N));
    CHECK(memcmp(again, e0, (N - 3) * sizeof *e0) == 0); /* the same order, minus the tail */
    ts_loader_free(l);
    /* Data whose rows are strided (a transposed view): the gather walks its strides, the
     * unshuffled batches stay views of it. */
    float *cols = malloc(2 * N * sizeof *cols);
    CHECK(cols);
    for (int i = 0; i < N; i++) {
        cols[i] = (float)i;
        cols[N + i] = (float)-i;
    }
    ts_tensor *c2, *xt;
    CHECK_OK(ts_tensor_from_host(dev, TS_F32, 2, (const int64_t[]){2, N}, cols, &c2));
    free(cols);
    CHECK_OK(ts_tensor_transpose(c2, 0, 1, &xt));
    CHECK(!ts_tensor_is_contiguous(xt));
    CHECK_OK(ts_loader_new(xt, y, BS, 1, 42, 0, &l));
    run_epoch(l, again, NULL);
    CHECK(memcmp(e0, again, sizeof e0) == 0);
    ts_loader_free(l);
    CHECK_OK(ts_loader_new(xt, y, BS, 0, 42, 0, &l));
    run_epoch(l, again, NULL);
    for (int64_t i = 0; i < N; i++)
        CHECK(again[i] == i);
    ts_loader_free(l);
    ts_tensor_unref(xt);
    ts_tensor_unref(c2);
    /* No labels: y stays NULL. */
    CHECK_OK(ts_loader_new(x, NULL, BS, 1, 42, 0, &l));
    ts_tensor *bx, *by = (ts_tensor *)1;
    CHECK_OK(ts_loader_next(l, &bx, &by));
    CHECK(by == NULL && ts_tensor_shape(bx)[0] == BS);
    float row[2];
    ts_tensor *r0;
    CHECK_OK(ts_tensor_narrow(bx, 0, 0, 1, &r0));
    CHECK_OK(ts_tensor_to_host(r0, row, sizeof row));
    CHECK(row[0] == (float)e0[0]);
    ts_tensor_unref(r0);
    ts_tensor_unref(bx);
    ts_loader_free(l);
    ts_tensor_unref(x);
    ts_tensor_unref(y);
    tap_end();
}

static void check_seek(int shuffle)
{
    ts_tensor *x, *y;
    make_data(N, &x, &y);
    static int64_t straight[N], lens[N];
    ts_loader *l, *r;
    CHECK_OK(ts_loader_new(x, y, BS, shuffle, 7, 0, &l));
    CHECK_OK(ts_loader_start_epoch(l, 3));
    int64_t nb = run_epoch(l, straight, lens);
    uint64_t e;
    int64_t b;
    ts_loader_position(l, &e, &b);
    CHECK(e == 3 && b == nb);
    CHECK_OK(ts_loader_new(x, y, BS, shuffle, 7, 0, &r));
    const int64_t ks[] = {0, 1, 57, 99, 100, 3, 100};
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
        int64_t k = ks[i], ids[BS];
        if (i == 2) { /* pass through another epoch first: the seek must not care */
            CHECK_OK(ts_loader_start_epoch(r, 4));
            ts_tensor *bx, *by;
            CHECK_OK(ts_loader_next(r, &bx, &by));
            ts_tensor_unref(bx);
            ts_tensor_unref(by);
        }
        CHECK_OK(ts_loader_seek(r, 3, k));
        ts_loader_position(r, &e, &b);
        CHECK(e == 3 && b == k);
        ts_tensor *bx, *by;
        CHECK_OK(ts_loader_next(r, &bx, &by));
        CHECK(bx);
        int64_t len = batch_ids(bx, by, ids);
        CHECK_INT_EQ(len, lens[k]);
        CHECK(memcmp(ids, straight + k * BS, (size_t)len * sizeof *ids) == 0);
        ts_tensor_unref(bx);
        ts_tensor_unref(by);
        ts_loader_position(r, &e, &b);
        CHECK(e == 3 && b == k + 1);
    }
    ts_tensor *bx = (ts_tensor *)1, *by;
    CHECK_OK(ts_loader_seek(r, 3, nb)); /* the end of the epoch */
    CHECK_OK(ts_loader_next(r, &bx, &by));
    CHECK(bx == NULL);
    CHECK_FAILS(ts_loader_seek(r, 3, nb + 1), TS_EINVAL, "batch 102");
    CHECK_FAILS(ts_loader_seek(r, 3, -1), TS_EINVAL, "batch -1");
    ts_loader_free(l);
    ts_loader_free(r);
    ts_tensor_unref(x);
    ts_tensor_unref(y);
}

static void test_loader_seek(void)
{
    setup();
    check_seek(1);
    check_seek(0);
    tap_end();
}

static void test_loader_held_batch(void)
{
    setup();
    ts_tensor *x, *y, *bx, *by, *bx2, *by2, *v;
    make_data(25, &x, &y);
    ts_loader *l;
    CHECK_OK(ts_loader_new(x, y, 10, 1, 1, 0, &l));
    CHECK_OK(ts_loader_next(l, &bx, &by));
    CHECK(!ts_tensor_shares_storage(bx, x)); /* gathered, not a view */
    uint64_t v1 = ts_tensor_version(bx);     /* each gather is an in-place write of the buffer */
    CHECK_FAILS(ts_loader_next(l, &bx2, &by2), TS_ESTATE, "still referenced", "ts_tensor_unref");
    CHECK(bx2 == NULL && by2 == NULL);
    ts_tensor_unref(bx);
    CHECK_FAILS(ts_loader_next(l, &bx2, &by2), TS_ESTATE, "still referenced");
    CHECK_OK(ts_tensor_view(by, 2, (const int64_t[]){2, 5}, &v)); /* a view of it counts too */
    ts_tensor_unref(by);
    CHECK_FAILS(ts_loader_next(l, &bx2, &by2), TS_ESTATE, "still referenced");
    ts_tensor_unref(v);
    int64_t e;
    uint64_t ep;
    ts_loader_position(l, &ep, &e);
    CHECK(e == 1); /* the refused calls did not advance */
    CHECK_OK(ts_loader_next(l, &bx2, &by2));
    CHECK(bx2 && ts_tensor_shape(bx2)[0] == 10);
    CHECK(ts_tensor_version(bx2) > v1);
    ts_tensor_unref(by2);
    /* Values stay right in a short last batch (narrowed buffers). */
    CHECK_FAILS(ts_loader_next(l, &bx, &by), TS_ESTATE, "still referenced");
    ts_tensor_unref(bx2);
    CHECK_OK(ts_loader_next(l, &bx, &by));
    int64_t ids[5];
    CHECK_INT_EQ(batch_ids(bx, by, ids), 5);
    /* Freeing the loader while a batch is held: the batch stays valid. */
    ts_loader_free(l);
    int64_t again[5];
    CHECK_INT_EQ(batch_ids(bx, by, again), 5);
    CHECK(memcmp(ids, again, sizeof ids) == 0);
    ts_tensor_unref(bx);
    ts_tensor_unref(by);
    ts_tensor_unref(x);
    ts_tensor_unref(y);
    tap_end();
}

static void test_loader_steady_state(void)
{
    setup();
    ts_tensor *x, *y;
    make_data(N, &x, &y);
    ts_loader *l;
    static int64_t ids[N];
    CHECK_OK(ts_loader_new(x, y, 32, 1, 9, 0, &l));
    run_epoch(l, ids, NULL);
    uint64_t raw = pool_raw_allocs(), in_use = pool_in_use(), live = ts_memory_live_count();
    uint64_t tensors = ts_tensor_live_count();
    for (uint64_t e = 1; e <= 3; e++) {
        CHECK_OK(ts_loader_start_epoch(l, e));
        run_epoch(l, ids, NULL);
        CHECK(is_permutation(ids, N, N));
        CHECK_INT_EQ(pool_raw_allocs(), raw);
        CHECK_INT_EQ(pool_in_use(), in_use);
        CHECK_INT_EQ(ts_memory_live_count(), live);
        CHECK_INT_EQ(ts_tensor_live_count(), tensors);
    }
    ts_loader_free(l);
    ts_tensor_unref(x);
    ts_tensor_unref(y);
    tap_end();
}

int main(int argc, char **argv)
{
    static const tap_test tests[] = {
        TAP_TEST(test_idx_round_trips),   TAP_TEST(test_idx_hostile),
        TAP_TEST(test_fmnist_missing),    TAP_TEST(test_fmnist_fake),
        TAP_TEST(test_fmnist_real),       TAP_TEST(test_loader_views),
        TAP_TEST(test_loader_shuffle),    TAP_TEST(test_loader_seek),
        TAP_TEST(test_loader_held_batch), TAP_TEST(test_loader_steady_state),
    };
    return tap_run(tests, sizeof tests / sizeof tests[0], argc, argv);
}
