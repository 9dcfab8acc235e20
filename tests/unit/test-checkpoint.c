/* tests/unit/test-checkpoint.c: checkpoints round-trip byte-exact (every dtype, 0-d, empty and
 * non-contiguous tensors, metadata, insertion order), the file is plain safetensors (checked
 * byte by byte and with cJSON), every corrupt, truncated or hostile file is refused cleanly,
 * and saving is atomic, even when the saving process is SIGKILLed mid-write.
 * TS_CHECKPOINT_SKIP_KILL=1 skips the SIGKILL test; so does running under valgrind, where the
 * saver is too slow for the kills to land during its saves. */
#include <dirent.h>
#include <math.h>
#include <errno.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "../tap.h"

static ts_device *dev;

static void setup(void)
{
    dev = tap_start();
}

/* ---- helpers ------------------------------------------------------------------------- */

/* A file with the given header length field, header text and data_len bytes of data. */
static const char *write_raw(const char *dir, const char *name, uint64_t hlen,
                             const char *header, size_t data_len)
{
    return tap_write_safetensors(dir, name, hlen, header, data_len);
}

/* A well-formed file: the header's true length. */
static const char *write_ckpt(const char *dir, const char *name, const char *header,
                              size_t data_len)
{
    return write_raw(dir, name, strlen(header), header, data_len);
}

/* Files in dir whose name contains ".tmp.". */
static int count_tmp(const char *dir)
{
    return tap_count_entries(dir, ".tmp.");
}

static void remove_tmp(const char *dir)
{
    DIR *d = opendir(dir);
    CHECK(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (strstr(e->d_name, ".tmp."))
            unlink(p);
    }
    closedir(d);
}

/* The tensor's bytes, row-major. (malloc'd) */
static unsigned char *host_bytes(const ts_tensor *t, size_t *n)
{
    *n = (size_t)ts_tensor_numel(t) * ts_dtype_size(ts_tensor_dtype(t));
    unsigned char *b = malloc(*n + 1);
    CHECK(b);
    CHECK_OK(ts_tensor_to_host(t, b, *n));
    return b;
}

static void check_same_tensor(const ts_tensor *a, const ts_tensor *b)
{
    CHECK_INT_EQ(ts_tensor_dtype(a), ts_tensor_dtype(b));
    CHECK_INT_EQ(ts_tensor_ndim(a), ts_tensor_ndim(b));
    for (int d = 0; d < ts_tensor_ndim(a); d++)
        CHECK_INT_EQ(ts_tensor_shape(a)[d], ts_tensor_shape(b)[d]);
    size_t na, nb;
    unsigned char *x = host_bytes(a, &na), *y = host_bytes(b, &nb);
    CHECK(na == nb && memcmp(x, y, na) == 0);
    free(x);
    free(y);
}

/* A checkpoint of every dtype and awkward shape, each tensor also returned in t[] (owned). */
#define NSAMPLE 6
static const char *const sample_names[NSAMPLE] = {"fc1.weight", "scalar", "empty",
                                                   "steps",      "mask",   "transposed"};

static ts_checkpoint *sample(ts_tensor **t)
{
    float f[6] = {1.0f, -2.5f, 3.25f, 0.0f, -0.0f, 1e30f};
    double scalar = 3.141592653589793;
    int64_t steps[4] = {0, -1, INT64_MAX, INT64_MIN};
    uint8_t mask[5] = {0, 1, 255, 7, 128};
    double m[12];
    for (int i = 0; i < 12; i++)
        m[i] = i * 1.5 - 4;
    CHECK_OK(ts_tensor_from_host(dev, TS_F32, 2, (const int64_t[]){2, 3}, f, &t[0]));
    CHECK_OK(ts_tensor_from_host(dev, TS_F64, 0, NULL, &scalar, &t[1]));
    CHECK_OK(ts_tensor_zeros(dev, TS_I32, 3, (const int64_t[]){3, 0, 2}, &t[2]));
    CHECK_OK(ts_tensor_from_host(dev, TS_I64, 1, (const int64_t[]){4}, steps, &t[3]));
    CHECK_OK(ts_tensor_from_host(dev, TS_U8, 1, (const int64_t[]){5}, mask, &t[4]));
    ts_tensor *base;
    CHECK_OK(ts_tensor_from_host(dev, TS_F64, 2, (const int64_t[]){3, 4}, m, &base));
    CHECK_OK(ts_tensor_transpose(base, 0, 1, &t[5]));
    CHECK(!ts_tensor_is_contiguous(t[5]));
    ts_tensor_unref(base);
    ts_checkpoint *ck;
    CHECK_OK(ts_checkpoint_new(&ck));
    for (int i = 0; i < NSAMPLE; i++)
        CHECK_OK(ts_checkpoint_add(ck, sample_names[i], t[i]));
    CHECK_OK(ts_checkpoint_set_meta(ck, "epoch", "7"));
    CHECK_OK(ts_checkpoint_set_meta(ck, "note", "h\xc3\xa9llo \"quoted\"\n\ttab"));
    return ck;
}

static void unref_all(ts_tensor **t, int n)
{
    for (int i = 0; i < n; i++)
        ts_tensor_unref(t[i]);
}

/* ---- round trips --------------------------------------------------------------------- */

static void test_round_trip(void)
{
    setup();
    const char *dir = tap_tmpdir();
    const char *path = tap_path_in(dir, "model.ckpt");
    ts_tensor *t[NSAMPLE];
    ts_checkpoint *ck = sample(t), *back;
    CHECK_OK(ts_checkpoint_set_meta(ck, "epoch", "8")); /* replaces */
    CHECK_OK(ts_checkpoint_save(ck, path));
    CHECK_INT_EQ(count_tmp(dir), 0);
    CHECK_OK(ts_checkpoint_save(ck, path)); /* over an existing file */
    CHECK_INT_EQ(count_tmp(dir), 0);
    CHECK_OK(ts_checkpoint_load(path, NULL, &back));
    CHECK_INT_EQ(ts_checkpoint_count(back), NSAMPLE);
    for (int i = 0; i < NSAMPLE; i++) {
        CHECK(strcmp(ts_checkpoint_name(back, (size_t)i), sample_names[i]) == 0);
        ts_tensor *got = ts_checkpoint_get(back, sample_names[i]);
        CHECK(got && ts_tensor_device(got) == dev && ts_tensor_is_contiguous(got));
        check_same_tensor(got, t[i]);
    }
    CHECK(ts_checkpoint_name(back, NSAMPLE) == NULL);
    CHECK(ts_checkpoint_get(back, "nope") == NULL);
    CHECK(strcmp(ts_checkpoint_meta(back, "epoch"), "8") == 0);
    CHECK(strcmp(ts_checkpoint_meta(back, "note"), "h\xc3\xa9llo \"quoted\"\n\ttab") == 0);
    CHECK(ts_checkpoint_meta(back, "missing") == NULL);
    CHECK_INT_EQ(ts_tensor_ndim(ts_checkpoint_get(back, "scalar")), 0);
    CHECK_INT_EQ(ts_tensor_numel(ts_checkpoint_get(back, "empty")), 0);

    /* Save what was loaded: the same bytes again. */
    const char *path2 = tap_path_in(dir, "again.ckpt");
    CHECK_OK(ts_checkpoint_save(back, path2));
    size_t n1, n2;
    unsigned char *a = tap_read_all(path, &n1), *b = tap_read_all(path2, &n2);
    CHECK(n1 == n2 && memcmp(a, b, n1) == 0);
    free(a);
    free(b);

    /* An empty checkpoint round-trips too. */
    ts_checkpoint *none, *none2;
    CHECK_OK(ts_checkpoint_new(&none));
    CHECK_OK(ts_checkpoint_save(none, path2));
    CHECK_OK(ts_checkpoint_load(path2, dev, &none2));
    CHECK_INT_EQ(ts_checkpoint_count(none2), 0);
    ts_checkpoint_free(none);
    ts_checkpoint_free(none2);

    ts_checkpoint_free(back);
    ts_checkpoint_free(ck);
    unref_all(t, NSAMPLE);
    tap_end();
}

static void test_builder_errors(void)
{
    setup();
    ts_checkpoint *ck;
    ts_tensor *t;
    CHECK_OK(ts_checkpoint_new(&ck));
    CHECK_OK(ts_tensor_zeros(dev, TS_F32, 1, (const int64_t[]){2}, &t));
    CHECK_OK(ts_checkpoint_add(ck, "w", t));
    CHECK_FAILS(ts_checkpoint_add(ck, "w", t), TS_EINVAL, "duplicate", "'w'");
    CHECK_FAILS(ts_checkpoint_add(ck, "", t), TS_EINVAL, "empty");
    CHECK_FAILS(ts_checkpoint_add(ck, "__metadata__", t), TS_EINVAL, "reserved");
    CHECK_FAILS(ts_checkpoint_add(ck, NULL, t), TS_EINVAL, "NULL");
    CHECK_FAILS(ts_checkpoint_set_meta(ck, "", "x"), TS_EINVAL, "empty key");
    CHECK_FAILS(ts_checkpoint_save(ck, ""), TS_EINVAL, "empty path");
    ts_checkpoint *out = (ts_checkpoint *)1;
    CHECK_FAILS(ts_checkpoint_load(NULL, NULL, &out), TS_EINVAL, "NULL");
    CHECK(out == NULL);
    CHECK_INT_EQ(ts_checkpoint_count(ck), 1);
    ts_checkpoint_free(ck); /* drops the reference it kept */
    ts_tensor_unref(t);
    ts_checkpoint_free(NULL);
    tap_end();
}

static void test_restore(void)
{
    setup();
    const char *path = tap_path_in(tap_tmpdir(), "model.ckpt");
    ts_tensor *t[NSAMPLE];
    ts_checkpoint *ck = sample(t), *back;
    CHECK_OK(ts_checkpoint_save(ck, path));
    CHECK_OK(ts_checkpoint_load(path, dev, &back));

    /* Into a parameter that requires grad, with grad mode on: allowed, records nothing. */
    ts_tensor *w;
    CHECK_OK(ts_tensor_zeros(dev, TS_F32, 2, (const int64_t[]){2, 3}, &w));
    CHECK_OK(ts_tensor_set_requires_grad(w, 1));
    CHECK(ts_grad_enabled());
    uint64_t v0 = ts_tensor_version(w);
    CHECK_OK(ts_checkpoint_restore(back, "fc1.weight", w));
    check_same_tensor(w, t[0]);
    CHECK(ts_tensor_version(w) != v0);
    CHECK(ts_tensor_is_leaf(w) && ts_tensor_requires_grad(w));
    CHECK(ts_grad_enabled()); /* the no_grad scope was closed */

    /* Into a non-contiguous destination: a transposed view of a (3, 4) tensor. */
    ts_tensor *base, *view;
    CHECK_OK(ts_tensor_zeros(dev, TS_F64, 2, (const int64_t[]){3, 4}, &base));
    CHECK_OK(ts_tensor_transpose(base, 0, 1, &view));
    CHECK_OK(ts_checkpoint_restore(back, "transposed", view));
    check_same_tensor(view, t[5]);
    ts_tensor *s0d, *e;
    CHECK_OK(ts_tensor_zeros(dev, TS_F64, 0, NULL, &s0d));
    CHECK_OK(ts_checkpoint_restore(back, "scalar", s0d));
    check_same_tensor(s0d, t[1]);
    CHECK_OK(ts_tensor_zeros(dev, TS_I32, 3, (const int64_t[]){3, 0, 2}, &e));
    CHECK_OK(ts_checkpoint_restore(back, "empty", e));

    /* Mismatches name both sides; broadcasting or casting is never done. */
    ts_tensor *wrong_shape, *wrong_dtype, *bcast;
    CHECK_OK(ts_tensor_zeros(dev, TS_F32, 2, (const int64_t[]){3, 2}, &wrong_shape));
    CHECK_OK(ts_tensor_zeros(dev, TS_F64, 2, (const int64_t[]){2, 3}, &wrong_dtype));
    CHECK_OK(ts_tensor_zeros(dev, TS_F64, 0, NULL, &bcast));
    CHECK_FAILS(ts_checkpoint_restore(back, "fc1.weight", wrong_shape), TS_ESHAPE, "fc1.weight",
                "float32(2, 3)", "float32(3, 2)");
    CHECK_FAILS(ts_checkpoint_restore(back, "fc1.weight", wrong_dtype), TS_EDTYPE,
                "float32(2, 3)", "float64(2, 3)");
    CHECK_FAILS(ts_checkpoint_restore(back, "transposed", bcast), TS_ESHAPE, "(4, 3)",
                "float64()");
    CHECK_FAILS(ts_checkpoint_restore(back, "fc2.weight", w), TS_EINVAL, "no tensor",
                "fc2.weight");

    ts_tensor *list[] = {w, base, view, s0d, e, wrong_shape, wrong_dtype, bcast};
    unref_all(list, 8);
    ts_checkpoint_free(back);
    ts_checkpoint_free(ck);
    unref_all(t, NSAMPLE);
    tap_end();
}

/* ---- the bytes on disk --------------------------------------------------------------- */

static void test_safetensors_layout(void)
{
    setup();
    const char *path = tap_path_in(tap_tmpdir(), "model.safetensors");
    ts_tensor *t[NSAMPLE];
    ts_checkpoint *ck = sample(t);
    CHECK_OK(ts_checkpoint_save(ck, path));
    size_t n;
    unsigned char *b = tap_read_all(path, &n);
    CHECK(n >= 8);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++)
        hlen |= (uint64_t)b[i] << (8 * i);
    CHECK(hlen <= n - 8);
    CHECK_INT_EQ((8 + hlen) % 8, 0); /* padded to 8-byte alignment, with spaces */
    CHECK(b[8] == '{');
    size_t last = 8 + hlen - 1;
    while (b[last] == ' ')
        last--;
    CHECK(b[last] == '}');

    cJSON *root = cJSON_ParseWithLength((const char *)b + 8, hlen);
    CHECK(root && cJSON_IsObject(root));
    cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "__metadata__");
    CHECK(cJSON_IsObject(meta));
    CHECK(strcmp(cJSON_GetObjectItemCaseSensitive(meta, "epoch")->valuestring, "7") == 0);
    static const char *const st_dtypes[NSAMPLE] = {"F32", "F64", "I32", "I64", "U8", "F64"};
    static const int64_t shapes[NSAMPLE][3] = {{2, 3}, {0}, {3, 0, 2}, {4}, {5}, {4, 3}};
    static const int ndims[NSAMPLE] = {2, 0, 3, 1, 1, 2};
    /* Entries in insertion order after the metadata, packed in that order from offset 0. */
    const cJSON *c = root->child;
    CHECK(c == meta);
    uint64_t at = 0;
    const unsigned char *data = b + 8 + hlen;
    for (int i = 0; i < NSAMPLE; i++) {
        c = c->next;
        CHECK(c && strcmp(c->string, sample_names[i]) == 0);
        CHECK(strcmp(cJSON_GetObjectItemCaseSensitive(c, "dtype")->valuestring, st_dtypes[i]) == 0);
        const cJSON *shape = cJSON_GetObjectItemCaseSensitive(c, "shape");
        CHECK_INT_EQ(cJSON_GetArraySize(shape), ndims[i]);
        for (int d = 0; d < ndims[i]; d++)
            CHECK_INT_EQ(cJSON_GetArrayItem(shape, d)->valuedouble, shapes[i][d]);
        const cJSON *offs = cJSON_GetObjectItemCaseSensitive(c, "data_offsets");
        CHECK_INT_EQ(cJSON_GetArraySize(offs), 2);
        uint64_t begin = (uint64_t)cJSON_GetArrayItem(offs, 0)->valuedouble;
        uint64_t end = (uint64_t)cJSON_GetArrayItem(offs, 1)->valuedouble;
        CHECK_INT_EQ(begin, at);
        size_t nb;
        unsigned char *want = host_bytes(t[i], &nb);
        CHECK_INT_EQ(end - begin, nb);
        CHECK(memcmp(data + begin, want, nb) == 0);
        free(want);
        at = end;
    }
    CHECK(c->next == NULL);
    CHECK_INT_EQ(8 + hlen + at, n); /* nothing after the last tensor */
    /* Little-endian, row-major: float32 1.0 first, the transposed view's (0, 1) is m[4] = 2. */
    static const unsigned char one_f32[4] = {0x00, 0x00, 0x80, 0x3f};
    CHECK(memcmp(data, one_f32, 4) == 0);
    double v;
    const cJSON *tr = cJSON_GetObjectItemCaseSensitive(root, "transposed");
    memcpy(&v, data + (size_t)cJSON_GetArrayItem(
                              cJSON_GetObjectItemCaseSensitive(tr, "data_offsets"), 0)
                              ->valuedouble + 8, 8);
    CHECK(v == 4 * 1.5 - 4);
    cJSON_Delete(root);
    free(b);
    ts_checkpoint_free(ck);
    unref_all(t, NSAMPLE);
    tap_end();
}

/* ---- hostile files ------------------------------------------------------------------- */

#define LOAD_FAILS(path, code, ...)                                                         \
    do {                                                                                    \
        ts_checkpoint *ck_ = (ts_checkpoint *)1;                                            \
        CHECK_FAILS(ts_checkpoint_load((path), dev, &ck_), code, __VA_ARGS__);              \
        CHECK(ck_ == NULL);                                                                 \
    } while (0)

#define A24 "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}"

static void test_corrupt_files(void)
{
    setup();
    const char *dir = tap_tmpdir();
    const char *p;

    /* Sanity: the base header loads, so each case below fails for its own defect. */
    ts_checkpoint *ok;
    CHECK_OK(ts_checkpoint_load(write_ckpt(dir, "ok.ckpt", "{" A24 "}", 24), dev, &ok));
    CHECK_INT_EQ(ts_checkpoint_count(ok), 1);
    ts_checkpoint_free(ok);

    p = tap_path_in(dir, "empty.ckpt");
    tap_write_bytes(p, "", 0);
    LOAD_FAILS(p, TS_ECORRUPT, "empty.ckpt", "0 bytes", "empty");
    p = tap_path_in(dir, "seven.ckpt");
    tap_write_bytes(p, "\x10\0\0\0\0\0\0", 7);
    LOAD_FAILS(p, TS_ECORRUPT, "seven.ckpt", "7 bytes");
    LOAD_FAILS(write_raw(dir, "long.ckpt", 1000, "{" A24 "}", 24), TS_ECORRUPT, "long.ckpt",
               "header length 1000", "larger than the file");
    LOAD_FAILS(write_raw(dir, "huge.ckpt", (uint64_t)1 << 63, "{" A24 "}", 24), TS_ECORRUPT,
               "header length 9223372036854775808", "larger than the file");
    LOAD_FAILS(write_raw(dir, "max.ckpt", UINT64_MAX, "{}", 0), TS_ECORRUPT,
               "header length 18446744073709551615");
    /* A header length within a (sparse) 101 MiB file but over the 100 MiB limit. */
    p = write_raw(dir, "big.ckpt", (uint64_t)101 << 20, "{}", 0);
    CHECK(truncate(p, ((off_t)101 << 20) + 8) == 0);
    LOAD_FAILS(p, TS_ECORRUPT, "big.ckpt", "exceeds the limit");

    LOAD_FAILS(write_ckpt(dir, "nojson.ckpt", "{not json}", 0), TS_ECORRUPT, "nojson.ckpt",
               "not valid JSON");
    LOAD_FAILS(write_ckpt(dir, "garbage.ckpt", "{" A24 "} x", 24), TS_ECORRUPT, "not valid JSON");
    LOAD_FAILS(write_ckpt(dir, "cut.ckpt", "{" A24, 24), TS_ECORRUPT, "not valid JSON");
    LOAD_FAILS(write_ckpt(dir, "array.ckpt", "[1, 2]", 0), TS_ECORRUPT, "array.ckpt",
               "not a JSON object");
    LOAD_FAILS(write_ckpt(dir, "string.ckpt", "\"{}\"", 0), TS_ECORRUPT, "not a JSON object");
    p = tap_path_in(dir, "nul.ckpt");
    tap_write_bytes(p, "\x04\0\0\0\0\0\0\0{}\0 ", 12);
    LOAD_FAILS(p, TS_ECORRUPT, "NUL");
    LOAD_FAILS(write_ckpt(dir, "utf8.ckpt", "{\"\xff\xfe\":{}}", 0), TS_ECORRUPT, "UTF-8");

    LOAD_FAILS(write_ckpt(dir, "dtype.ckpt",
                          "{\"a\":{\"dtype\":\"C64\",\"shape\":[2,3],"
                          "\"data_offsets\":[0,48]}}", 48),
               TS_ECORRUPT, "dtype.ckpt", "'a'", "unknown or unsupported dtype 'C64'");
    LOAD_FAILS(write_ckpt(dir, "f16size.ckpt",
                          "{\"a\":{\"dtype\":\"F16\",\"shape\":[2,3],"
                          "\"data_offsets\":[0,24]}}", 24),
               TS_ECORRUPT, "'a'", "hold 24 bytes but float16 (2, 3) needs 12");
    LOAD_FAILS(write_ckpt(dir, "dtype2.ckpt",
                          "{\"a\":{\"dtype\":4,\"shape\":[2,3],\"data_offsets\":[0,24]}}", 24),
               TS_ECORRUPT, "dtype is not a string");
    LOAD_FAILS(write_ckpt(dir, "neg.ckpt",
                          "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,-3],"
                          "\"data_offsets\":[0,24]}}", 24),
               TS_ECORRUPT, "neg.ckpt", "'a'", "negative size -3");
    LOAD_FAILS(write_ckpt(dir, "frac.ckpt",
                          "{\"a\":{\"dtype\":\"F32\",\"shape\":[2.5],"
                          "\"data_offsets\":[0,10]}}", 10),
               TS_ECORRUPT, "non-negative integer");
    LOAD_FAILS(write_ckpt(dir, "overflow.ckpt",
                          "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],"
                          "\"data_offsets\":[0,24]}}",
                          24),
               TS_ECORRUPT, "overflow.ckpt", "overflows");
    LOAD_FAILS(write_ckpt(dir, "overflow2.ckpt",
                          "{\"a\":{\"dtype\":\"F64\",\"shape\":[9007199254740992,32],"
                          "\"data_offsets\":[0,24]}}",
                          24),
               TS_ECORRUPT, "overflows");
    LOAD_FAILS(write_ckpt(dir, "dims.ckpt",
                          "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],"
                          "\"data_offsets\":[0,4]}}",
                          4),
               TS_ECORRUPT, "9 dims");
    LOAD_FAILS(write_ckpt(dir, "range.ckpt",
                          "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],"
                          "\"data_offsets\":[0,24]}}", 20),
               TS_ECORRUPT, "range.ckpt", "data_offsets [0, 24]", "past the end",
               "(20 bytes)");
    LOAD_FAILS(write_ckpt(dir, "range2.ckpt",
                          "{\"a\":{\"dtype\":\"U8\",\"shape\":[0],"
                          "\"data_offsets\":[9007199254740992,9007199254740992]}}",
                          0),
               TS_ECORRUPT, "past the end");
    LOAD_FAILS(write_ckpt(dir, "range3.ckpt",
                          "{\"a\":{\"dtype\":\"U8\",\"shape\":[0],"
                          "\"data_offsets\":[1e300,1e300]}}",
                          0),
               TS_ECORRUPT, "two non-negative integers");
    LOAD_FAILS(write_ckpt(dir, "backwards.ckpt",
                          "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],"
                          "\"data_offsets\":[24,0]}}", 24),
               TS_ECORRUPT, "backwards.ckpt", "[24, 0]", "end before");
    LOAD_FAILS(write_ckpt(dir, "negoff.ckpt",
                          "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],"
                          "\"data_offsets\":[-24,0]}}", 24),
               TS_ECORRUPT, "negative");
    LOAD_FAILS(write_ckpt(dir, "offs3.ckpt",
                          "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24,48]}}",
                          24),
               TS_ECORRUPT, "two integers");
    LOAD_FAILS(write_ckpt(dir, "model.ckpt",
                          "{\"fc1.weight\":{\"dtype\":\"F32\",\"shape\":[5,6],"
                          "\"data_offsets\":[0,100]}}",
                          100),
               TS_ECORRUPT,
               "model.ckpt: tensor 'fc1.weight': data_offsets [0, 100] hold 100 bytes but "
               "float32 (5, 6) needs 120");
    LOAD_FAILS(write_ckpt(dir, "overlap.ckpt",
                          "{" A24 ",\"b\":{\"dtype\":\"F32\",\"shape\":[6],"
                          "\"data_offsets\":[12,36]}}",
                          36),
               TS_ECORRUPT, "overlap.ckpt", "'a' and 'b' overlap");
    LOAD_FAILS(write_ckpt(dir, "same.ckpt",
                          "{" A24 ",\"b\":{\"dtype\":\"I32\",\"shape\":[6],"
                          "\"data_offsets\":[0,24]}}",
                          24),
               TS_ECORRUPT, "overlap");
    LOAD_FAILS(write_ckpt(dir, "hole.ckpt",
                          "{" A24 ",\"b\":{\"dtype\":\"F32\",\"shape\":[6],"
                          "\"data_offsets\":[32,56]}}",
                          56),
               TS_ECORRUPT, "hole.ckpt", "hole of 8 bytes", "'b'");
    LOAD_FAILS(write_ckpt(dir, "lead.ckpt",
                          "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],"
                          "\"data_offsets\":[4,28]}}", 28),
               TS_ECORRUPT, "hole of 4 bytes");
    LOAD_FAILS(write_ckpt(dir, "trailing.ckpt", "{" A24 "}", 30), TS_ECORRUPT, "trailing.ckpt",
               "6 trailing bytes");
    LOAD_FAILS(write_ckpt(dir, "trailing2.ckpt", "{}", 1), TS_ECORRUPT, "1 trailing bytes");
    LOAD_FAILS(write_ckpt(dir, "dup.ckpt", "{" A24 "," A24 "}", 24), TS_ECORRUPT, "dup.ckpt",
               "duplicate tensor name 'a'");
    LOAD_FAILS(write_ckpt(dir, "dupmeta.ckpt",
                          "{\"__metadata__\":{\"k\":\"1\"},\"__metadata__\":{\"k\":\"2\"}," A24 "}",
                          24),
               TS_ECORRUPT, "duplicate", "__metadata__");
    LOAD_FAILS(write_ckpt(dir, "dupkey.ckpt",
                          "{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}," A24 "}", 24),
               TS_ECORRUPT, "duplicate metadata key 'k'");
    LOAD_FAILS(write_ckpt(dir, "dupfield.ckpt",
                          "{\"a\":{\"dtype\":\"F32\",\"dtype\":\"U8\",\"shape\":[2,3],"
                          "\"data_offsets\":[0,24]}}",
                          24),
               TS_ECORRUPT, "duplicate key 'dtype'");
    LOAD_FAILS(write_ckpt(dir, "metaint.ckpt", "{\"__metadata__\":{\"epoch\":3}," A24 "}", 24),
               TS_ECORRUPT, "metaint.ckpt", "metadata 'epoch'", "not a string");
    LOAD_FAILS(write_ckpt(dir, "metaarr.ckpt", "{\"__metadata__\":[\"x\"]," A24 "}", 24),
               TS_ECORRUPT, "__metadata__ is not a JSON object");
    LOAD_FAILS(write_ckpt(dir, "noname.ckpt",
                          "{\"\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", 24),
               TS_ECORRUPT, "empty name");
    LOAD_FAILS(write_ckpt(dir, "notobj.ckpt", "{\"a\":5}", 0), TS_ECORRUPT, "'a'",
               "not a JSON object");
    LOAD_FAILS(write_ckpt(dir, "missing.ckpt", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3]}}", 24),
               TS_ECORRUPT, "missing key 'data_offsets'");
    LOAD_FAILS(write_ckpt(dir, "extra.ckpt",
                          "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24],"
                          "\"x\":1}}",
                          24),
               TS_ECORRUPT, "unknown key 'x'");
    LOAD_FAILS(write_ckpt(dir, "shapeobj.ckpt",
                          "{\"a\":{\"dtype\":\"F32\",\"shape\":{},\"data_offsets\":[0,4]}}", 4),
               TS_ECORRUPT, "shape is not an array");

    /* A valid file cut in the middle of its data. */
    ts_tensor *t[NSAMPLE];
    ts_checkpoint *ck = sample(t);
    const char *good = tap_path_in(dir, "good.ckpt");
    CHECK_OK(ts_checkpoint_save(ck, good));
    size_t n;
    unsigned char *b = tap_read_all(good, &n);
    p = tap_path_in(dir, "truncated.ckpt");
    tap_write_bytes(p, b, n - 20);
    LOAD_FAILS(p, TS_ECORRUPT, "truncated.ckpt", "truncated");
    free(b);
    ts_checkpoint_free(ck);
    unref_all(t, NSAMPLE);

    /* Cannot be read at all: TS_EIO. */
    LOAD_FAILS(tap_path_in(dir, "absent.ckpt"), TS_EIO, "absent.ckpt", "No such file");
    LOAD_FAILS(dir, TS_EIO, "not a regular file");
    tap_end();
}

/* Every prefix of a valid file fails cleanly; so does every single-byte corruption that
 * leaves the header invalid (the others load). */
static void test_every_truncation(void)
{
    setup();
    const char *dir = tap_tmpdir();
    ts_tensor *t[2];
    CHECK_OK(ts_tensor_arange(dev, TS_F32, 0, 6, 1, &t[0]));
    CHECK_OK(ts_tensor_arange(dev, TS_I64, 0, 3, 1, &t[1]));
    ts_checkpoint *ck;
    CHECK_OK(ts_checkpoint_new(&ck));
    CHECK_OK(ts_checkpoint_add(ck, "w", t[0]));
    CHECK_OK(ts_checkpoint_add(ck, "step", t[1]));
    CHECK_OK(ts_checkpoint_set_meta(ck, "epoch", "1"));
    const char *good = tap_path_in(dir, "good.ckpt");
    CHECK_OK(ts_checkpoint_save(ck, good));
    size_t n;
    unsigned char *b = tap_read_all(good, &n);
    const char *p = tap_path_in(dir, "prefix.ckpt");
    for (size_t len = 0; len < n; len++) {
        tap_write_bytes(p, b, len);
        ts_checkpoint *out = (ts_checkpoint *)1;
        ts_status s = ts_checkpoint_load(p, dev, &out);
        CHECK_MSG(s == TS_ECORRUPT && out == NULL, "prefix of %zu of %zu bytes: %s: %s", len, n,
                  ts_status_name(s), ts_last_error());
        CHECK_STR_CONTAINS(ts_last_error(), "prefix.ckpt");
    }
    /* Flipping any one byte: either still a valid file or TS_ECORRUPT, never anything else. */
    int refused = 0;
    for (size_t i = 0; i < n; i++) {
        for (int bit = 0; bit < 8; bit += 3) {
            b[i] ^= (unsigned char)(1u << bit);
            tap_write_bytes(p, b, n);
            b[i] ^= (unsigned char)(1u << bit);
            ts_checkpoint *out = NULL;
            ts_status s = ts_checkpoint_load(p, dev, &out);
            CHECK_MSG(s == TS_OK || s == TS_ECORRUPT, "byte %zu bit %d: %s: %s", i, bit,
                      ts_status_name(s), ts_last_error());
            CHECK((s == TS_OK) == (out != NULL));
            refused += s != TS_OK;
            ts_checkpoint_free(out);
        }
    }
    CHECK(refused > 0);
    free(b);
    ts_checkpoint_free(ck);
    unref_all(t, 2);
    tap_end();
}

/* ---- atomic saves -------------------------------------------------------------------- */

static void test_save_failures(void)
{
    setup();
    const char *dir = tap_tmpdir();
    ts_tensor *small, *big;
    CHECK_OK(ts_tensor_full(dev, TS_F32, 1, (const int64_t[]){4}, 1.5, &small));
    CHECK_OK(ts_tensor_full(dev, TS_F64, 2, (const int64_t[]){256, 64}, 2.5, &big)); /* 128 KiB */
    ts_checkpoint *old_ck, *new_ck, *back;
    CHECK_OK(ts_checkpoint_new(&old_ck));
    CHECK_OK(ts_checkpoint_add(old_ck, "w", small));
    CHECK_OK(ts_checkpoint_new(&new_ck));
    CHECK_OK(ts_checkpoint_add(new_ck, "w", big));
    const char *path = tap_path_in(dir, "model.ckpt");
    CHECK_OK(ts_checkpoint_save(old_ck, path));
    size_t n_old;
    unsigned char *old_bytes = tap_read_all(path, &n_old);

    /* A directory that does not exist, and a "directory" that is a file. */
    const char *nodir = tap_path_in(dir, "no/such/dir/model.ckpt");
    CHECK_FAILS(ts_checkpoint_save(new_ck, nodir), TS_EIO, "no/such/dir/model.ckpt",
                "No such file or directory");
    const char *notdir = tap_path_in(dir, "model.ckpt/inner.ckpt");
    CHECK_FAILS(ts_checkpoint_save(new_ck, notdir), TS_EIO, "model.ckpt/inner.ckpt",
                "Not a directory");

    /* A write that fails halfway (the file size limit, as a full disk would): TS_EIO, the old
     * file intact, no temporary left. */
    struct rlimit rl = {.rlim_cur = 64 * 1024, .rlim_max = RLIM_INFINITY};
    struct rlimit saved;
    CHECK(getrlimit(RLIMIT_FSIZE, &saved) == 0);
    rl.rlim_max = saved.rlim_max;
    signal(SIGXFSZ, SIG_IGN);
    CHECK(setrlimit(RLIMIT_FSIZE, &rl) == 0);
    CHECK_FAILS(ts_checkpoint_save(new_ck, path), TS_EIO, "model.ckpt", "File too large");
    CHECK(setrlimit(RLIMIT_FSIZE, &saved) == 0);
    CHECK_INT_EQ(count_tmp(dir), 0);
    size_t n;
    unsigned char *now = tap_read_all(path, &n);
    CHECK(n == n_old && memcmp(now, old_bytes, n) == 0);
    free(now);

    /* A directory in the way of the rename. */
    const char *isdir = tap_path_in(dir, "adir");
    CHECK(mkdir(isdir, 0755) == 0);
    CHECK(mkdir(tap_path_in(dir, "adir/x"), 0755) == 0);
    CHECK_FAILS(ts_checkpoint_save(new_ck, isdir), TS_EIO, "adir");
    CHECK_INT_EQ(count_tmp(dir), 0);

    /* A read-only directory (not for root, who may write anyway). */
    if (geteuid() != 0) {
        const char *ro = tap_path_in(dir, "ro");
        CHECK(mkdir(ro, 0755) == 0);
        const char *rpath = tap_path_in(ro, "model.ckpt");
        CHECK_OK(ts_checkpoint_save(old_ck, rpath));
        CHECK(chmod(ro, 0555) == 0);
        CHECK_FAILS(ts_checkpoint_save(new_ck, rpath), TS_EIO, "Permission denied");
        CHECK(chmod(ro, 0755) == 0);
        now = tap_read_all(rpath, &n);
        CHECK(n == n_old && memcmp(now, old_bytes, n) == 0);
        free(now);
        CHECK_INT_EQ(count_tmp(ro), 0);
    }

    CHECK_OK(ts_checkpoint_load(path, dev, &back));
    check_same_tensor(ts_checkpoint_get(back, "w"), small);
    ts_checkpoint_free(back);
    /* And a successful save replaces it, leaving no temporary. */
    CHECK_OK(ts_checkpoint_save(new_ck, path));
    CHECK_INT_EQ(count_tmp(dir), 0);
    CHECK_OK(ts_checkpoint_load(path, dev, &back));
    check_same_tensor(ts_checkpoint_get(back, "w"), big);
    ts_checkpoint_free(back);

    free(old_bytes);
    ts_checkpoint_free(old_ck);
    ts_checkpoint_free(new_ck);
    ts_tensor_unref(small);
    ts_tensor_unref(big);
    tap_end();
}

/* The SIGKILL test: a saver process writes 32 MiB checkpoints over one path in a loop,
 * alternating two versions (metadata "seq" says which: seq % 2), and is killed at random
 * moments; after each kill a verifier process must load the file in full and find one of the
 * two versions byte-exact. Children leave with _exit (exit would run the runner's cleanup). */
#define KILL_TENSORS 4
#define KILL_ELEMS (2 * 1024 * 1024) /* int32: 8 MiB per tensor, 32 MiB in all */

static int32_t kill_value(int version, int k, int64_t i)
{
    return (int32_t)((uint32_t)i * 2654435761u ^ (uint32_t)(version ? 0x5bd1e995 : 0) ^
                     (uint32_t)k * 40503u);
}

static void kill_build(ts_tensor **t, int version)
{
    int32_t *buf = malloc(KILL_ELEMS * sizeof *buf);
    CHECK(buf);
    for (int k = 0; k < KILL_TENSORS; k++) {
        for (int64_t i = 0; i < KILL_ELEMS; i++)
            buf[i] = kill_value(version, k, i);
        CHECK_OK(ts_tensor_from_host(NULL, TS_I32, 1, (const int64_t[]){KILL_ELEMS}, buf, &t[k]));
    }
    free(buf);
}

static void kill_save(const char *path, ts_tensor **t, long seq)
{
    ts_checkpoint *ck;
    char s[32];
    CHECK_OK(ts_checkpoint_new(&ck));
    for (int k = 0; k < KILL_TENSORS; k++) {
        char name[32];
        snprintf(name, sizeof name, "layer%d.weight", k);
        CHECK_OK(ts_checkpoint_add(ck, name, t[k]));
    }
    snprintf(s, sizeof s, "%ld", seq);
    CHECK_OK(ts_checkpoint_set_meta(ck, "seq", s));
    CHECK_OK(ts_checkpoint_save(ck, path));
    ts_checkpoint_free(ck);
}

static int kill_ready_fd = -1; /* the saver writes one byte here once it starts saving */

_Noreturn static void kill_saver(const char *path, int forever)
{
    ts_tensor *v[2][KILL_TENSORS];
    CHECK_OK(ts_init(NULL));
    kill_build(v[0], 0);
    if (!forever) {
        kill_save(path, v[0], 0);
        _exit(0);
    }
    kill_build(v[1], 1);
    if (kill_ready_fd >= 0)
        CHECK(write(kill_ready_fd, "r", 1) == 1);
    for (long seq = 1;; seq++)
        kill_save(path, v[seq % 2], seq);
}

_Noreturn static void kill_verifier(const char *path)
{
    CHECK_OK(ts_init(NULL));
    ts_checkpoint *ck;
    CHECK_OK(ts_checkpoint_load(path, NULL, &ck));
    const char *seq = ts_checkpoint_meta(ck, "seq");
    CHECK(seq);
    int version = (int)(atol(seq) % 2);
    CHECK_INT_EQ(ts_checkpoint_count(ck), KILL_TENSORS);
    int32_t *buf = malloc(KILL_ELEMS * sizeof *buf);
    CHECK(buf);
    for (int k = 0; k < KILL_TENSORS; k++) {
        ts_tensor *t = ts_checkpoint_get(ck, ts_checkpoint_name(ck, (size_t)k));
        CHECK_OK(ts_tensor_to_host(t, buf, KILL_ELEMS * sizeof *buf));
        for (int64_t i = 0; i < KILL_ELEMS; i++)
            CHECK_MSG(buf[i] == kill_value(version, k, i), "seq %s tensor %d element %lld", seq,
                      k, (long long)i);
    }
    free(buf);
    ts_checkpoint_free(ck);
    ts_shutdown();
    _exit(0);
}

/* Forks a saver (role 0: one save; 1: saves forever) or a verifier (2). For role 1, returns
 * once the saver has started its save loop, so that a kill after that lands mid-save however
 * slow start-up is (sanitizers, a loaded machine). */
static int run_child(const char *path, int role)
{
    int fds[2] = {-1, -1};
    if (role == 1)
        CHECK(pipe(fds) == 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        if (role == 2)
            kill_verifier(path);
        if (role == 1) {
            close(fds[0]);
            kill_ready_fd = fds[1];
        }
        kill_saver(path, role);
    }
    if (role == 1) {
        char c;
        ssize_t n;
        close(fds[1]);
        while ((n = read(fds[0], &c, 1)) < 0 && errno == EINTR)
            ;
        close(fds[0]);
        CHECK_MSG(n == 1, "the saver died before it started saving");
    }
    return pid;
}

static int wait_child(pid_t pid)
{
    int status;
    while (waitpid(pid, &status, 0) < 0)
        CHECK(errno == EINTR);
    return status;
}

static void test_kill_during_save(void)
{
    const char *skip = getenv("TS_CHECKPOINT_SKIP_KILL");
    if (skip && *skip && strcmp(skip, "0") != 0)
        SKIP("TS_CHECKPOINT_SKIP_KILL is set");
    if (RUNNING_ON_VALGRIND)
        SKIP("under valgrind the saver is too slow for kills to land mid-save");
    const char *dir = tap_tmpdir(); /* before forking: the children share it */
    char path[4096];
    snprintf(path, sizeof path, "%s/model.ckpt", dir);
    unsigned seed = (unsigned)time(NULL) ^ (unsigned)getpid();
    srand(seed);
    int status = wait_child(run_child(path, 0)); /* version 0, seq 0, saved once */
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the first save failed");
    int kills = 0, mid_save = 0;
    while (mid_save < 6 && kills < 40) {
        pid_t saver = run_child(path, 1);
        /* 0 .. 200 ms into the save loop: most of it is spent inside a save. */
        struct timespec ts = {0, (rand() % 200) * 1000000L};
        nanosleep(&ts, NULL);
        CHECK(kill(saver, SIGKILL) == 0);
        status = wait_child(saver);
        CHECK_MSG(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
                  "the saver ended before it was killed (status %d)", status);
        kills++;
        int tmp = count_tmp(dir);
        mid_save += tmp > 0;
        status = wait_child(run_child(path, 2));
        CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "after kill %d (seed %u, %s a temporary file), %s does not hold a complete "
                  "checkpoint",
                  kills, seed, tmp ? "with" : "without", path);
        remove_tmp(dir); /* a killed save leaves its temporary file behind */
    }
    CHECK_MSG(mid_save >= 3, "only %d of %d kills landed during a save (seed %u)", mid_save,
              kills, seed);
}

static char logged_ck[2048];
static void capture_ck(int level, const char *msg, void *user)
{
    (void)level, (void)user;
    snprintf(logged_ck + strlen(logged_ck), sizeof logged_ck - strlen(logged_ck), "%s\n", msg);
}

/* F16, BF16 and BOOL tensors (as PyTorch and Hugging Face write them) load as float32,
 * float32 and uint8, exactly, with a warning; the stored dtype is reported; a save of the
 * loaded checkpoint writes the loaded dtypes and reads back the same values. */
static void test_converted_dtypes(void)
{
    setup();
    const char *dir = tap_tmpdir();
    const char *hdr = "{\"h\":{\"dtype\":\"F16\",\"shape\":[8],\"data_offsets\":[0,16]},"
                      "\"b\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[16,22]},"
                      "\"m\":{\"dtype\":\"BOOL\",\"shape\":[2,2],\"data_offsets\":[22,26]},"
                      "\"__metadata__\":{\"format\":\"pt\"}}";
    /* 1, -2, 65504 (largest), 2^-24 (smallest subnormal), 2^-14 (smallest normal), +inf,
     * -0, 0.333251953125 */
    static const uint16_t h[8] = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x0400, 0x7C00, 0x8000, 0x3555};
    static const float hv[8] = {1.0f, -2.0f, 65504.0f, 5.9604644775390625e-8f,
                                6.103515625e-5f, INFINITY, -0.0f, 0.333251953125f};
    static const uint16_t bf[3] = {0x3F80, 0xC0A0, 0x4049}; /* 1, -5, 3.140625 */
    static const float bv[3] = {1.0f, -5.0f, 3.140625f};
    static const unsigned char m[4] = {0, 1, 7, 0}; /* 7: any non-zero byte is true */
    unsigned char file[512];
    size_t hl = strlen(hdr), at = 8 + hl;
    for (int i = 0; i < 8; i++)
        file[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(file + 8, hdr, hl);
    for (int i = 0; i < 8; i++, at += 2)
        file[at] = (unsigned char)(h[i] & 0xff), file[at + 1] = (unsigned char)(h[i] >> 8);
    for (int i = 0; i < 3; i++, at += 2)
        file[at] = (unsigned char)(bf[i] & 0xff), file[at + 1] = (unsigned char)(bf[i] >> 8);
    memcpy(file + at, m, 4);
    at += 4;
    const char *p = tap_path_in(dir, "half.safetensors");
    tap_write_bytes(p, (const char *)file, at);
    ts_checkpoint *ck = NULL;
    logged_ck[0] = 0;
    ts_set_log_handler(capture_ck, NULL);
    ts_status s = ts_checkpoint_load(p, dev, &ck);
    ts_set_log_handler(NULL, NULL);
    CHECK_OK(s);
    if (!ck)
        return;
    CHECK_STR_CONTAINS(logged_ck, "1 BOOL tensors load as uint8");
    int32_t dt = -1;
    CHECK_OK(ts_checkpoint_tensor_info(ck, "h", &dt, NULL, NULL));
    CHECK_INT_EQ(dt, TS_F16); /* the 16-bit floats load as such */
    CHECK_OK(ts_checkpoint_tensor_info(ck, "b", &dt, NULL, NULL));
    CHECK_INT_EQ(dt, TS_BF16);
    CHECK(!strcmp(ts_checkpoint_stored_dtype(ck, "h"), "F16"));
    CHECK(!strcmp(ts_checkpoint_stored_dtype(ck, "b"), "BF16"));
    CHECK(!strcmp(ts_checkpoint_stored_dtype(ck, "m"), "BOOL"));
    CHECK_INT_EQ(ts_checkpoint_meta_count(ck), 1);
    CHECK(!strcmp(ts_checkpoint_meta_key(ck, 0), "format"));
    CHECK(ts_checkpoint_meta_key(ck, 1) == NULL);
    /* a save of the loaded checkpoint, its tensors unread: F16, BF16 and U8 on disk */
    const char *p2 = tap_path_in(dir, "half-as-f32.safetensors");
    CHECK_OK(ts_checkpoint_save(ck, p2));
    ts_checkpoint *ck2 = NULL;
    CHECK_OK(ts_checkpoint_load(p2, dev, &ck2));
    for (int pass = 0; pass < 2; pass++) {
        const ts_checkpoint *c = pass ? ck2 : ck;
        float fh[8], fb[3];
        uint16_t raw[8];
        unsigned char fm[4];
        ts_tensor *th = ts_checkpoint_get(c, "h"), *wh = NULL, *wb = NULL;
        CHECK_MSG(th, "pass %d: get 'h': %s", pass, ts_last_error());
        CHECK_OK(ts_tensor_to_host(th, raw, sizeof raw));
        CHECK(!memcmp(raw, h, sizeof raw)); /* the patterns as stored */
        CHECK_OK(ts_cast(th, TS_F32, &wh)); /* widened exactly */
        CHECK_OK(ts_cast(ts_checkpoint_get(c, "b"), TS_F32, &wb));
        CHECK_OK(ts_tensor_to_host(wh, fh, sizeof fh));
        CHECK_OK(ts_tensor_to_host(wb, fb, sizeof fb));
        ts_tensor_unref(wh), ts_tensor_unref(wb);
        CHECK_OK(ts_tensor_to_host(ts_checkpoint_get(c, "m"), fm, sizeof fm));
        for (int i = 0; i < 8; i++)
            CHECK_MSG(memcmp(&fh[i], &hv[i], 4) == 0, "pass %d: F16 %04x -> %.9g, not %.9g",
                      pass, h[i], fh[i], hv[i]);
        for (int i = 0; i < 3; i++)
            CHECK(fb[i] == bv[i]);
        CHECK(fm[0] == 0 && fm[1] == 1 && fm[2] == 1 && fm[3] == 0);
    }
    CHECK(ck2 && !strcmp(ts_checkpoint_stored_dtype(ck2, "h"), "F16"));
    CHECK(ck2 && !strcmp(ts_checkpoint_stored_dtype(ck2, "m"), "U8"));
    /* restored into float32: widened exactly; into the other 16-bit format: refused */
    ts_tensor *f32 = NULL, *bft = NULL;
    CHECK_OK(ts_tensor_empty(dev, TS_F32, 1, (const int64_t[]){8}, &f32));
    CHECK_OK(ts_checkpoint_restore(ck, "h", f32));
    float fr[8];
    CHECK_OK(ts_tensor_to_host(f32, fr, sizeof fr));
    CHECK(!memcmp(fr, hv, sizeof fr));
    CHECK_OK(ts_tensor_empty(dev, TS_BF16, 1, (const int64_t[]){8}, &bft));
    CHECK_FAILS(ts_checkpoint_restore(ck, "h", bft), TS_EDTYPE, "float16", "bfloat16");
    ts_tensor_unref(f32), ts_tensor_unref(bft);
    /* NaN keeps being NaN */
    static const char nh[] = "{\"n\":{\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[0,2]}}";
    size_t nl = strlen(nh);
    for (int i = 0; i < 8; i++)
        file[i] = (unsigned char)((uint64_t)nl >> (8 * i));
    memcpy(file + 8, nh, nl);
    file[8 + nl] = 0x00, file[9 + nl] = 0x7E;
    p = tap_path_in(dir, "nan.safetensors");
    tap_write_bytes(p, (const char *)file, 10 + nl);
    ts_checkpoint *ck3 = NULL;
    ts_set_log_level(TS_LOG_ERROR);
    CHECK_OK(ts_checkpoint_load(p, dev, &ck3));
    ts_set_log_level(TS_LOG_WARN);
    float f = 0;
    ts_tensor *nw = NULL;
    if (ck3) {
        CHECK_OK(ts_cast(ts_checkpoint_get(ck3, "n"), TS_F32, &nw));
        CHECK_OK(ts_tensor_to_host(nw, &f, sizeof f));
    }
    ts_tensor_unref(nw);
    CHECK(isnan(f));
    ts_checkpoint_free(ck3);
    ts_checkpoint_free(ck2);
    ts_checkpoint_free(ck);
}

/* ts_checkpoint_check_path: a writable target passes and leaves nothing behind; a link, a
 * directory, a FIFO and a missing directory are refused with the reason. */
static void test_check_path(void)
{
    char dir[4200], p[4400];
    snprintf(dir, sizeof dir, "%s/chk", tap_tmpdir());
    CHECK(mkdir(dir, 0755) == 0);
    snprintf(p, sizeof p, "%s/new.ckpt", dir);
    CHECK_OK(ts_checkpoint_check_path(p));
    DIR *d = opendir(dir);
    int entries = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        entries += e->d_name[0] != '.';
    if (d)
        closedir(d);
    CHECK_INT_EQ(entries, 0); /* the probe file is gone */
    CHECK_FAILS(ts_checkpoint_check_path(dir), TS_EIO, "the path is a directory");
    snprintf(p, sizeof p, "%s/fifo", dir);
    CHECK(mkfifo(p, 0600) == 0);
    CHECK_FAILS(ts_checkpoint_check_path(p), TS_EIO, "fifo");
    snprintf(p, sizeof p, "%s/link", dir);
    CHECK(symlink("new.ckpt", p) == 0);
    CHECK_FAILS(ts_checkpoint_check_path(p), TS_EIO, "symbolic link");
    snprintf(p, sizeof p, "%s/missing/x.ckpt", dir);
    CHECK_FAILS(ts_checkpoint_check_path(p), TS_EIO, "cannot save the checkpoint there",
                "No such file or directory");
    CHECK_FAILS(ts_checkpoint_check_path(""), TS_EINVAL, "empty path");
    /* A name ending in '/' names a directory, whether or not one is there now (another user
     * could put their directory there between the check and the write). */
    snprintf(p, sizeof p, "%s/new/", dir);
    CHECK_FAILS(ts_checkpoint_check_path(p), TS_EIO, "ends with '/'");
    CHECK_FAILS(ts_file_check_path(p, "the picture"), TS_EIO, "the picture", "ends with '/'");
}

/* Saving a loaded checkpoint copies its unread tensors from the file: when that file was cut
 * short meanwhile, the save fails saying so and naming the tensor (not as an I/O error of
 * the new file), leaves no temporary file, and a name or metadata value that is not UTF-8
 * (which no reader could parse) is refused when it is added. */
static void test_save_source_errors(void)
{
    setup();
    const char *dir = tap_tmpdir();
    ts_tensor *w;
    CHECK_OK(ts_tensor_full(dev, TS_F32, 2, (const int64_t[]){64, 64}, 0.5, &w));
    ts_checkpoint *ck, *lazy;
    CHECK_OK(ts_checkpoint_new(&ck));
    CHECK_OK(ts_checkpoint_add(ck, "weight", w));
    const char *src = tap_path_in(dir, "src.ckpt"), *dst = tap_path_in(dir, "dst.ckpt");
    CHECK_OK(ts_checkpoint_save(ck, src));
    CHECK_OK(ts_checkpoint_load(src, dev, &lazy));
    struct stat st;
    CHECK(stat(src, &st) == 0 && truncate(src, st.st_size - 100) == 0);
    CHECK_FAILS(ts_checkpoint_save(lazy, dst), TS_ECORRUPT, "dst.ckpt", "tensor 'weight'");
    CHECK(access(dst, F_OK) != 0);
    CHECK_INT_EQ(count_tmp(dir), 0);
    ts_checkpoint_free(lazy);

    CHECK_FAILS(ts_checkpoint_add(ck, "bad\xff\x01name", w), TS_EINVAL, "UTF-8");
    CHECK_FAILS(ts_checkpoint_set_meta(ck, "k", "\xc3("), TS_EINVAL, "UTF-8");
    CHECK_FAILS(ts_checkpoint_set_meta(ck, "\xed\xa0\x80", "v"), TS_EINVAL, "UTF-8");
    CHECK_OK(ts_checkpoint_add(ck, "caf\xc3\xa9 \xe2\x82\xac", w)); /* real UTF-8 is fine */
    CHECK_OK(ts_checkpoint_save(ck, dst));
    ts_checkpoint_free(ck);
    CHECK_OK(ts_checkpoint_load(dst, dev, &ck));
    CHECK(ts_checkpoint_get(ck, "caf\xc3\xa9 \xe2\x82\xac") != NULL);
    ts_checkpoint_free(ck);
    ts_tensor_unref(w);
    tap_end();
}

int main(int argc, char **argv)
{
    static const tap_test tests[] = {
        TAP_TEST(test_round_trip),        TAP_TEST(test_builder_errors),
        TAP_TEST(test_check_path),
        TAP_TEST(test_converted_dtypes),
        TAP_TEST(test_restore),           TAP_TEST(test_safetensors_layout),
        TAP_TEST(test_corrupt_files),     TAP_TEST(test_every_truncation),
        TAP_TEST(test_save_failures),     TAP_TEST(test_kill_during_save),
        TAP_TEST(test_save_source_errors),
    };
    return tap_run(tests, sizeof tests / sizeof tests[0], argc, argv);
}
