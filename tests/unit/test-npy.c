/* tests/unit/test-npy.c: NumPy .npy files. The fixtures in tests/data/npy were written by
 * numpy 1.24 (np.save, np.lib.format.write_array): every dtype, order, byte order and
 * format version tessera reads loads with the right values; ts_npy_save writes byte for byte
 * what numpy writes; and every defect of a hostile file is refused by name before anything
 * is read. */
#include <errno.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../tap.h"

static ts_device *dev;

static const char *fixture(const char *name)
{
    static char path[4][4096];
    static int k;
    k = (k + 1) % 4;
    snprintf(path[k], sizeof path[k], "%s/npy/%s", tap_srcdir(), name);
    return path[k];
}

/* Loads name and checks dtype, shape and every element (as doubles). */
static void expect(const char *name, int32_t dtype, int ndim, const int64_t *shape,
                   const double *want, size_t n)
{
    ts_tensor *t = NULL;
    CHECK_OK(ts_npy_load(fixture(name), dev, &t));
    if (!t)
        return;
    CHECK_MSG(ts_tensor_dtype(t) == dtype, "%s: dtype %s, want %s", name,
              ts_dtype_name(ts_tensor_dtype(t)), ts_dtype_name(dtype));
    CHECK_MSG(ts_tensor_ndim(t) == ndim, "%s: %d dims, want %d", name, ts_tensor_ndim(t), ndim);
    for (int d = 0; d < ndim && d < ts_tensor_ndim(t); d++)
        CHECK_MSG(ts_tensor_shape(t)[d] == shape[d], "%s: dim %d is %lld, want %lld", name, d,
                  (long long)ts_tensor_shape(t)[d], (long long)shape[d]);
    CHECK_INT_EQ(ts_tensor_numel(t), (int64_t)n);
    ts_tensor *d64 = NULL;
    CHECK_OK(ts_cast(t, TS_F64, &d64));
    double got[128];
    if (d64 && n <= 128) {
        CHECK_OK(ts_tensor_to_host(d64, got, n * sizeof *got));
        for (size_t i = 0; i < n; i++)
            CHECK_MSG(got[i] == want[i], "%s[%zu] = %.17g, want %.17g", name, i, got[i], want[i]);
    }
    ts_tensor_unref(d64);
    ts_tensor_unref(t);
}

static void test_numpy_files_load(void)
{
    dev = tap_start();
    expect("f32_2x3.npy", TS_F32, 2, (const int64_t[]){2, 3},
           (const double[]){1.5, -2, 3, 4, 5.25, -6}, 6);
    /* Fortran order: the file holds the columns; the tensor is the same matrix. */
    expect("f64_fortran_3x2.npy", TS_F64, 2, (const int64_t[]){3, 2},
           (const double[]){0, 0.5, 1, 1.5, 2, 2.5}, 6);
    expect("i4_big_endian.npy", TS_I32, 1, (const int64_t[]){4},
           (const double[]){1, -2, 70000, -2147483648.0}, 4);
    expect("i8_scalar.npy", TS_I64, 0, NULL, (const double[]){-1099511627779.0}, 1);
    expect("u1_empty_0x3.npy", TS_U8, 2, (const int64_t[]){0, 3}, NULL, 0);
    expect("bool_4.npy", TS_U8, 1, (const int64_t[]){4}, (const double[]){1, 0, 1, 1}, 4);
    expect("f2_3.npy", TS_F16, 1, (const int64_t[]){3}, (const double[]){1, -0.5, 65504}, 3);
    expect("i2_2x2.npy", TS_I32, 2, (const int64_t[]){2, 2},
           (const double[]){-32768, 7, 1, 32767}, 4);
    expect("u4_2.npy", TS_I64, 1, (const int64_t[]){2}, (const double[]){0, 4294967295.0}, 2);
    expect("f32_v2.npy", TS_F32, 2, (const int64_t[]){1, 2}, (const double[]){7, 8}, 2);
    double ar[120];
    for (int i = 0; i < 120; i++)
        ar[i] = i;
    expect("f32_4d.npy", TS_F32, 4, (const int64_t[]){2, 3, 4, 5}, ar, 120);
    expect("f32_4d_fortran.npy", TS_F32, 4, (const int64_t[]){2, 3, 4, 5}, ar, 120);
    tap_end();
}

static void test_unsupported_dtypes_named(void)
{
    dev = tap_start();
    ts_tensor *t = (ts_tensor *)1;
    CHECK_FAILS(ts_npy_load(fixture("complex.npy"), dev, &t), TS_EDTYPE, "'<c8'",
                "complex numbers", "complex.npy");
    CHECK(t == NULL);
    CHECK_FAILS(ts_npy_load(fixture("structured.npy"), dev, &t), TS_EDTYPE, "structured");
    CHECK_FAILS(ts_npy_load(fixture("u8_big.npy"), dev, &t), TS_EDTYPE, "'<u8'", "uint64");
    tap_end();
}

/* What ts_npy_save writes is numpy's own file, byte for byte. */
static void same_bytes(const char *fixture_name, const char *written)
{
    size_t na = 0, nb = 0;
    unsigned char *a = tap_read_all(fixture(fixture_name), &na);
    unsigned char *b = tap_read_all(written, &nb);
    CHECK_MSG(a && b && na == nb && memcmp(a, b, na) == 0,
              "%s: %zu bytes written, numpy's file has %zu (or they differ)", fixture_name, nb,
              na);
    free(a);
    free(b);
}

static void test_save_is_numpys_file(void)
{
    dev = tap_start();
    const char *dir = tap_tmpdir();
    static const char *const names[] = {"f32_2x3.npy", "i8_scalar.npy", "u1_empty_0x3.npy",
                                        "f32_4d.npy", "i4_big_endian.npy"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        ts_tensor *t = NULL;
        CHECK_OK(ts_npy_load(fixture(names[i]), dev, &t));
        const char *out = tap_path_in(dir, names[i]);
        CHECK_OK(ts_npy_save(t, out));
        ts_tensor_unref(t);
        if (i < 4) /* the big-endian one comes back little-endian: compare values instead */
            same_bytes(names[i], out);
    }
    /* Fortran order in, C order out: numpy's C-order file of the same array. */
    ts_tensor *t = NULL;
    CHECK_OK(ts_npy_load(fixture("f32_4d_fortran.npy"), dev, &t));
    CHECK_OK(ts_npy_save(t, tap_path_in(dir, "c.npy")));
    same_bytes("f32_4d.npy", tap_path_in(dir, "c.npy"));
    ts_tensor_unref(t);
    /* A view with strides saves its elements in row-major order. */
    ts_tensor *m = NULL, *mt = NULL, *back = NULL;
    CHECK_OK(ts_tensor_from_host(dev, TS_F64, 2, (const int64_t[]){2, 3},
                                 (const double[]){1, 2, 3, 4, 5, 6}, &m));
    CHECK_OK(ts_tensor_transpose(m, 0, 1, &mt));
    CHECK_OK(ts_npy_save(mt, tap_path_in(dir, "t.npy")));
    CHECK_OK(ts_npy_load(tap_path_in(dir, "t.npy"), dev, &back));
    double v[6];
    CHECK_OK(ts_tensor_to_host(back, v, sizeof v));
    CHECK(ts_tensor_shape(back)[0] == 3 && ts_tensor_shape(back)[1] == 2);
    CHECK(v[0] == 1 && v[1] == 4 && v[2] == 2 && v[3] == 5 && v[4] == 3 && v[5] == 6);
    ts_tensor_unref(back);
    /* Never through a link, never over a directory; the old file stays on failure. */
    CHECK(symlink("/etc/passwd", tap_path_in(dir, "link.npy")) == 0);
    CHECK_FAILS(ts_npy_save(mt, tap_path_in(dir, "link.npy")), TS_EIO, "symbolic link");
    CHECK(mkdir(tap_path_in(dir, "d.npy"), 0700) == 0);
    CHECK_FAILS(ts_npy_save(mt, tap_path_in(dir, "d.npy")), TS_EIO, "directory");
    CHECK_FAILS(ts_npy_save(mt, "/nonexistent-dir/x.npy"), TS_EIO, "/nonexistent-dir/x.npy");
    CHECK_FAILS(ts_npy_save(NULL, "x.npy"), TS_EINVAL, "NULL");
    CHECK_INT_EQ(tap_count_entries(dir, ".tmp."), 0);
    ts_tensor_unref(mt);
    ts_tensor_unref(m);
    tap_end();
}

/* A valid file's bytes with its header replaced by text (format 1.0, padded to 64). */
static const char *with_header(const char *dir, const char *name, const char *dict,
                               const void *data, size_t n)
{
    unsigned char buf[4096];
    size_t dl = strlen(dict), total = (10 + dl + 1 + 63) / 64 * 64;
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (unsigned char)((total - 10) & 0xff);
    buf[9] = (unsigned char)((total - 10) >> 8);
    memcpy(buf + 10, dict, dl);
    memset(buf + 10 + dl, ' ', total - 10 - dl - 1);
    buf[total - 1] = '\n';
    memcpy(buf + total, data, n);
    const char *p = tap_path_in(dir, name);
    tap_write_bytes(p, buf, total + n);
    return p;
}

static void test_hostile_files_refused(void)
{
    dev = tap_start();
    const char *dir = tap_tmpdir();
    ts_tensor *t = NULL;
    float six[6] = {1, 2, 3, 4, 5, 6};
    const char *good = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
    CHECK_OK(ts_npy_load(with_header(dir, "good.npy", good, six, sizeof six), dev, &t));
    ts_tensor_unref(t);
    /* Python's other spellings numpy accepts: double quotes, no trailing comma, no spaces. */
    CHECK_OK(ts_npy_load(with_header(dir, "dq.npy",
                                     "{\"shape\":(2,3),\"fortran_order\":False,\"descr\":\"<f4\"}",
                                     six, sizeof six), dev, &t));
    ts_tensor_unref(t);

    size_t n = 0;
    unsigned char *bytes = tap_read_all(fixture("f32_2x3.npy"), &n);
    tap_write_bytes(tap_path_in(dir, "short.npy"), bytes, n - 1);
    CHECK_FAILS(ts_npy_load(tap_path_in(dir, "short.npy"), dev, &t), TS_ECORRUPT, "truncated",
                "short.npy");
    CHECK(t == NULL);
    unsigned char *longer = calloc(1, n + 1);
    memcpy(longer, bytes, n);
    tap_write_bytes(tap_path_in(dir, "long.npy"), longer, n + 1);
    CHECK_FAILS(ts_npy_load(tap_path_in(dir, "long.npy"), dev, &t), TS_ECORRUPT, "trailing");
    free(longer);
    bytes[0] = 'x';
    tap_write_bytes(tap_path_in(dir, "magic.npy"), bytes, n);
    CHECK_FAILS(ts_npy_load(tap_path_in(dir, "magic.npy"), dev, &t), TS_ECORRUPT, "\\x93NUMPY");
    bytes[0] = 0x93;
    bytes[6] = 4;
    tap_write_bytes(tap_path_in(dir, "v4.npy"), bytes, n);
    CHECK_FAILS(ts_npy_load(tap_path_in(dir, "v4.npy"), dev, &t), TS_ECORRUPT, "version 4.0");
    bytes[6] = 1;
    bytes[8] = 0xff, bytes[9] = 0xff; /* header length past the end */
    tap_write_bytes(tap_path_in(dir, "hlen.npy"), bytes, n);
    CHECK_FAILS(ts_npy_load(tap_path_in(dir, "hlen.npy"), dev, &t), TS_ECORRUPT, "claims");
    free(bytes);
    /* version 2.0 with a 4 GiB header length */
    tap_write_bytes(tap_path_in(dir, "huge.npy"), "\x93NUMPY\x02\x00\xff\xff\xff\xff{}", 14);
    CHECK_FAILS(ts_npy_load(tap_path_in(dir, "huge.npy"), dev, &t), TS_ECORRUPT, "claims",
                "over");
    tap_write_bytes(tap_path_in(dir, "tiny.npy"), "\x93NUM", 4);
    CHECK_FAILS(ts_npy_load(tap_path_in(dir, "tiny.npy"), dev, &t), TS_ECORRUPT, "preamble");

    static const struct {
        const char *dict, *want;
        ts_status code;
    } bad[] = {
        {"{'descr': '<f4', 'fortran_order': False}", "lacks 'shape'", TS_ECORRUPT},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'x': 1}", "unknown key 'x'",
         TS_ECORRUPT},
        {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}",
         "repeated key 'descr'", TS_ECORRUPT},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (-2, 3)}", "non-negative",
         TS_ECORRUPT},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3.0)}", "'shape'", TS_ECORRUPT},
        {"{'descr': '<f4', 'fortran_order': 0, 'shape': (2, 3)}", "True or False", TS_ECORRUPT},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)} junk", "after its dict",
         TS_ECORRUPT},
        {"['descr', '<f4']", "not a Python dict", TS_ECORRUPT},
        {"{'descr': '<f3', 'fortran_order': False, 'shape': (2, 3)}", "'<f3'", TS_EDTYPE},
        {"{'descr': 'O', 'fortran_order': False, 'shape': (2, 3)}", "Python objects", TS_EDTYPE},
        {"{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,)}", "structured",
         TS_EDTYPE},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1, 1, 1, 1, 1)}",
         "more than", TS_EINVAL},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, "
         "4611686018427387904)}", "", TS_EINVAL},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}",
         "too large", TS_ECORRUPT},
        /* 2^64 + 4: would wrap around to 4 (and match 16 bytes of data) */
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (18446744073709551620,)}",
         "too large", TS_ECORRUPT},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (6)}", "an integer, not a tuple",
         TS_ECORRUPT},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (0006,)}", "leading zero",
         TS_ECORRUPT},
        {"{'descr': '<f4\\x00', 'fortran_order': False, 'shape': (2, 3)}", "'descr'",
         TS_ECORRUPT},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (100000, 100000)}",
         "truncated", TS_ECORRUPT},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char name[32];
        snprintf(name, sizeof name, "bad%zu.npy", i);
        const char *p = with_header(dir, name, bad[i].dict, six, sizeof six);
        t = (ts_tensor *)1;
        ts_clear_error();
        ts_status s = ts_npy_load(p, dev, &t);
        CHECK_MSG(s == bad[i].code && strstr(ts_last_error(), bad[i].want) &&
                      strstr(ts_last_error(), name) && t == NULL,
                  "%s: %s, %s; want %s with '%s'", bad[i].dict, ts_status_name(s),
                  ts_last_error(), ts_status_name(bad[i].code), bad[i].want);
    }
    /* special files: refused by name without blocking */
    CHECK(mkfifo(tap_path_in(dir, "fifo.npy"), 0600) == 0);
    CHECK_FAILS(ts_npy_load(tap_path_in(dir, "fifo.npy"), dev, &t), TS_EIO, "FIFO");
    CHECK_FAILS(ts_npy_load(dir, dev, &t), TS_EIO, "directory");
    CHECK_FAILS(ts_npy_load(tap_path_in(dir, "missing.npy"), dev, &t), TS_EIO, "missing.npy",
                "No such file");
    CHECK_FAILS(ts_npy_load("/dev/zero", dev, &t), TS_EIO, "character device");
    CHECK_FAILS(ts_npy_load(NULL, dev, &t), TS_EINVAL, "path");
    tap_end();
}

int main(int argc, char **argv)
{
    static const tap_test tests[] = {
        TAP_TEST(test_numpy_files_load),
        TAP_TEST(test_unsupported_dtypes_named),
        TAP_TEST(test_save_is_numpys_file),
        TAP_TEST(test_hostile_files_refused),
    };
    return tap_run(tests, sizeof tests / sizeof tests[0], argc, argv);
}
