/* tools/kernel_cases.h: the kernel-case table that `tessera plugin-check` and the kernel tests
 * of `make check` (tests/plugins/test-kernel-cases.c) both run, in the manner of ggml's
 * test-backend-ops: for each op family a builder of cases (shapes, scalars and empty tensors,
 * every function of the op, parameter variants, input dtypes), each run in every layout of
 * the operand harness (operand.h) on a device against a float64 reference with a tolerance
 * derived from the computation (kc_run). */
#ifndef TESSERA_TOOLS_KERNEL_CASES_H
#define TESSERA_TOOLS_KERNEL_CASES_H

#include <stddef.h>
#include <stdint.h>

#include <tessera/device.h>
#include <tessera/plugin.h>

#include "operand.h"

/* How an operand's values are drawn. */
typedef enum kc_values {
    V_RANDOM,   /* floats in [-2, 2), ints in [-9, 9], u8 {0, 1} */
    V_POSITIVE, /* floats in [0.5, 2.5), ints in [1, 9] */
    V_INDEX,    /* ints in [0, range) */
    V_BADINDEX  /* like V_INDEX with one element == range (out of range) */
} kc_values;

typedef struct opspec {
    int32_t dtype;
    int ndim;
    int64_t shape[TS_MAX_DIMS];
    kc_values v;
    int64_t range;
    int contig_only; /* optimizer operands: the ABI promises contiguous */
    int no_bcast;    /* outputs, indices, operands whose every dim matters */
} opspec;

/* The most inputs and outputs a case has (attention's backward: six and three). */
#define KC_MAX_IN 6
#define KC_MAX_OUT 3

typedef struct kcase {
    int32_t op;
    int nin, nout;
    opspec in[KC_MAX_IN], out[KC_MAX_OUT];
    unsigned char params[96];
    uint32_t params_size;
    char what[160];
} kcase;

/* One operand on the device and its twin in host memory for the reference. */
typedef struct kc_buf {
    void *dptr;        /* device block */
    unsigned char *host, *ref; /* host images of the block: uploaded / reference */
    size_t nbytes;
    ts_operand op;     /* layout inside the block (data filled per side) */
} kc_buf;

typedef struct caselist {
    kcase *v;
    int n, cap;
} caselist;

#define SHAPE(...) (sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__}

/* The cases of op for output dtype dt that dev's plugin may be handed (by its ABI minor and
 * its claims; dev NULL: this header's), appended to l (free l->v); none for an op without a
 * builder. Not thread-safe: build before running cases from several threads. */
void kc_build(ts_device *dev, int32_t op, int32_t dt, caselist *l);

/* Runs case k on dev in layout l, operand values drawn from seed, against the reference:
 * 1 agrees, 0 differs (why says where and by how much), -1 the reference does not do it,
 * 2 declined by a host-memory plugin (TS_ENOTSUP without a message: the host's reference
 * kernels run it, as the plugin guide allows). Reads nothing shared: threads may run cases
 * at once. */
int kc_run(ts_device *dev, const kcase *k, oph_layout l, uint64_t seed, char *why,
           size_t whylen);

/* The pieces the error-path and thread suites build their own calls from. */
opspec kc_spec(int32_t dt, int nd, const int64_t *shape);
void kc_set_params(kcase *k, const void *p, size_t n);
kcase *kc_add(caselist *l, int32_t op, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int kc_is_float(int32_t dt);
/* spec laid out as l in a new block of dev, both host images filled with the same values. */
ts_status kc_make_buf(ts_device *dev, const opspec *sp, oph_layout l, uint64_t *rng,
                      kc_buf *b);
void kc_free_buf(ts_device *dev, kc_buf *b);
/* splitmix64: the same values on every machine. */
uint64_t kc_rand(uint64_t *state);

#endif /* TESSERA_TOOLS_KERNEL_CASES_H */
