/* tests/unit/test-checkpoint-scale.c: a checkpoint's cost stays linear in its entries. A header
 * of 200,000 tensors and 50,000 metadata keys loads and every name and key is looked up (as
 * `tessera inspect` does), and a checkpoint of 200,000 tensors is built and read back by name,
 * well inside the test's time limit: a lookup that walks the list, as one did, makes 200,000^2
 * string compares a pass, minutes. Loading holds a small multiple of the header, never a tree
 * of the whole of it (checked outside sanitizer and valgrind builds, whose allocators pad every
 * block). Every host allocation of a load failing in turn gives TS_ENOMEM and a message. */
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <tessera/fault.h>

#include "../tap.h"

#define NT 200000 /* tensors */
#define NM 50000  /* metadata keys */

/* A header of nt one-element F32 tensors "tensor.I" (in reverse data order, so the tiling
 * check sorts) and nm metadata keys, one with an escape; its length in *hlen. */
static char *big_header(int nt, int nm, size_t *hlen)
{
    size_t cap = (size_t)nt * 80 + (size_t)nm * 40 + 64, n = 0;
    char *h = malloc(cap);
    CHECK(h);
    n += (size_t)snprintf(h + n, cap - n, "{\"__metadata__\":{\"k\\u00e9\":\"v\"");
    for (int i = 0; i < nm; i++)
        n += (size_t)snprintf(h + n, cap - n, ",\"key.%d\":\"value %d\"", i, i);
    n += (size_t)snprintf(h + n, cap - n, "}");
    for (int i = 0; i < nt; i++)
        n += (size_t)snprintf(h + n, cap - n,
                              ",\"tensor.%d\":{\"dtype\":\"F32\",\"shape\":[1],"
                              "\"data_offsets\":[%d,%d]}",
                              i, 4 * (nt - 1 - i), 4 * (nt - i));
    n += (size_t)snprintf(h + n, cap - n, "}");
    CHECK(n < cap);
    *hlen = n;
    return h;
}

static const char *write_big(int nt, int nm, size_t *hlen)
{
    char *h = big_header(nt, nm, hlen);
    const char *path = tap_write_safetensors(tap_tmpdir(), "big.safetensors", *hlen, h,
                                             (size_t)nt * 4);
    free(h);
    return path;
}

static void test_load_and_list(void)
{
    tap_start();
    size_t hlen;
    const char *path = write_big(NT, NM, &hlen);
    ts_checkpoint *ck = NULL;
    CHECK_OK(ts_checkpoint_load(path, NULL, &ck));
    CHECK_INT_EQ(ts_checkpoint_count(ck), NT);
    CHECK_INT_EQ(ts_checkpoint_meta_count(ck), NM + 1);
    for (size_t i = 0; i < NT; i++) { /* what tessera inspect does for every tensor */
        const char *name = ts_checkpoint_name(ck, i);
        char want[32];
        snprintf(want, sizeof want, "tensor.%zu", i);
        CHECK(name && strcmp(name, want) == 0);
        int32_t dtype = -1;
        int ndim = -1;
        int64_t shape[TS_MAX_DIMS];
        CHECK_OK(ts_checkpoint_tensor_info(ck, name, &dtype, &ndim, shape));
        CHECK(dtype == TS_F32 && ndim == 1 && shape[0] == 1);
        CHECK(strcmp(ts_checkpoint_stored_dtype(ck, name), "F32") == 0);
    }
    for (size_t i = 0; i < NM + 1; i++)
        CHECK(ts_checkpoint_meta(ck, ts_checkpoint_meta_key(ck, i)));
    CHECK(strcmp(ts_checkpoint_meta(ck, "k\xc3\xa9"), "v") == 0);
    CHECK(strcmp(ts_checkpoint_meta(ck, "key.49999"), "value 49999") == 0);
    CHECK(!ts_checkpoint_get(ck, "tensor.200000") && !ts_checkpoint_meta(ck, "key.50000"));
    ts_tensor *t = ts_checkpoint_get(ck, "tensor.123");
    CHECK(t && ts_tensor_numel(t) == 1);
    ts_checkpoint_free(ck);
    tap_end();
}

static void test_build_and_get(void)
{
    ts_device *dev = tap_start();
    ts_checkpoint *ck = NULL;
    ts_tensor *t = NULL;
    CHECK_OK(ts_checkpoint_new(&ck));
    CHECK_OK(ts_tensor_zeros(dev, TS_F32, 1, (int64_t[]){1}, &t));
    char name[32];
    for (int i = 0; i < NT; i++) {
        snprintf(name, sizeof name, "w.%d", i);
        CHECK_OK(ts_checkpoint_add(ck, name, t));
    }
    CHECK_FAILS(ts_checkpoint_add(ck, "w.777", t), TS_EINVAL, "duplicate tensor name 'w.777'");
    for (int i = 0; i < NT; i++) {
        snprintf(name, sizeof name, "w.%d", i);
        CHECK(ts_checkpoint_get(ck, name) == t);
    }
    for (int i = 0; i < NM; i++) {
        snprintf(name, sizeof name, "m.%d", i % (NM / 2)); /* each key set twice */
        CHECK_OK(ts_checkpoint_set_meta(ck, name, name));
    }
    CHECK_INT_EQ(ts_checkpoint_meta_count(ck), NM / 2);
    ts_tensor_unref(t);
    ts_checkpoint_free(ck);
    tap_end();
}

/* The peak memory of a load, measured in a child (whose high-water mark starts at the size
 * it was forked at) so the header built to write the file does not count. */
static void test_load_memory(void)
{
    tap_start();
    const char *san = getenv("TS_SANITIZERS");
    if ((san && strcmp(san, "yes") == 0) || RUNNING_ON_VALGRIND) {
        printf("# skipped: sanitizer and valgrind allocators pad every block\n");
        tap_end();
        return;
    }
    size_t hlen;
    const char *path = write_big(NT, 0, &hlen);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        struct rusage r0, r1;
        getrusage(RUSAGE_SELF, &r0);
        ts_checkpoint *ck = NULL;
        ts_status s = ts_checkpoint_load(path, NULL, &ck);
        getrusage(RUSAGE_SELF, &r1);
        long kb = r1.ru_maxrss - r0.ru_maxrss;
        printf("# a %zu-byte header of %d tensors: load peak +%ld KiB (%.1f times the header)\n",
               hlen, NT, kb, kb * 1024.0 / (double)hlen);
        fflush(stdout);
        _exit(s == TS_OK && (double)kb * 1024 < 8.0 * (double)hlen ? 0 : 1);
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "loading a header of %d tensors peaked at 8 or more times its size", NT);
    tap_end();
}

/* Each host allocation of a load with metadata, escaped and plain keys failing in turn. */
static void test_load_out_of_memory(void)
{
    tap_start();
    size_t hlen;
    const char *path = write_big(20, 5, &hlen);
    ts_checkpoint *ck = NULL;
    ts_fault_arm(TS_FAULT_HOST, 0);
    CHECK_OK(ts_checkpoint_load(path, NULL, &ck));
    uint64_t sites = ts_fault_count();
    ts_fault_disarm();
    ts_checkpoint_free(ck);
    CHECK(sites > 20);
    for (uint64_t k = 1; k <= sites; k++) {
        ts_clear_error();
        ck = (ts_checkpoint *)1;
        ts_fault_arm(TS_FAULT_HOST, k);
        ts_status s = ts_checkpoint_load(path, NULL, &ck);
        ts_fault_disarm();
        CHECK_MSG(s == TS_ENOMEM && ck == NULL && strstr(ts_last_error(), "out of memory"),
                  "allocation %llu of %llu: %s: %s", (unsigned long long)k,
                  (unsigned long long)sites, ts_status_name(s), ts_last_error());
    }
    tap_end();
}

int main(int argc, char **argv)
{
    static const tap_test tests[] = {TAP_TEST(test_load_and_list), TAP_TEST(test_build_and_get),
                                     TAP_TEST(test_load_memory),
                                     TAP_TEST(test_load_out_of_memory)};
    return tap_run(tests, sizeof tests / sizeof tests[0], argc, argv);
}
