/* tests/plugins/kt.h: helpers for kernel tests that call a plugin directly (ts_device_run)
 * with hand-built strided operands on host-memory plugins, and check against float64
 * references computed in the test. Layouts make inputs and outputs non-contiguous. The
 * operands themselves come from the operand harness of `tessera plugin-check`
 * (tools/operand.h), so both lay out, read and compare tensors the same way. */
#ifndef TESSERA_TESTS_KT_H
#define TESSERA_TESTS_KT_H

#include "../tap.h"
#include "../../tools/operand.h" /* the operand harness plugin-check uses too */

typedef enum kt_layout {
    KT_CONTIG = OPH_CONTIG,         /* row-major, dense */
    KT_TRANSPOSED = OPH_TRANSPOSED, /* the last two dims swapped in memory */
    KT_STRIDED = OPH_STRIDED,       /* every other element along each dim (step 2) */
    KT_OFFSET = OPH_OFFSET          /* dense, but starting 5 elements into the storage */
} kt_layout;
#define KT_NLAYOUTS 4

typedef struct kt_buf {
    ts_device *dev;
    void *base;     /* from ts_device_alloc */
    size_t nbytes;
    ts_operand op;  /* describes the tensor inside base */
} kt_buf;

/* Loads a plugin by name for the test's life; SKIPs the test if it is not built. */
ts_device *kt_load(const char *name);
/* The host-memory plugins that are built: "cpu_blas", "cpu_onednn" (NULL-terminated). */
const char *const *kt_plugins(void);
/* A tensor of dtype and shape in the given layout, filled by kt_fill_random. */
kt_buf kt_make(ts_device *dev, int32_t dtype, int ndim, const int64_t *shape, kt_layout layout,
               uint64_t seed);
void kt_free(kt_buf *b);
/* Random values: floats uniform in [-2, 2), ints in [-9, 9], u8 in {0, 1}. */
void kt_fill_random(kt_buf *b, uint64_t seed);
/* Unary function fn of plugin.h's table at v, in float64: the tests' reference (NAN for a
 * function it does not know, so a new one fails until it is written here). */
double kt_unary_ref(int32_t fn, double v);
/* Element at a multi-index, as a double. */
double kt_get(const ts_operand *op, const int64_t *idx);
void kt_set(const ts_operand *op, const int64_t *idx, double v);
/* Linear index -> multi-index (row-major over shape). */
void kt_unravel(const ts_operand *op, int64_t linear, int64_t *idx);
int64_t kt_numel(const ts_operand *op);
/* A copy of op viewed as broadcast to (ndim, shape): leading dims added, size-1 dims stride 0. */
ts_operand kt_broadcast(const ts_operand *op, int ndim, const int64_t *shape);
/* Runs one op; returns the status. */
ts_status kt_run(ts_device *dev, int32_t op, const ts_operand *in, int nin, const ts_operand *out,
                 int nout, const void *params, size_t params_size);
/* |a - b| <= atol + rtol * |b|, with NaN == NaN and equal infinities. */
int kt_close(double a, double b, double rtol, double atol);
/* Fails unless every byte of b's allocation that is not part of an element still holds the
 * 0xA5 kt_make wrote: kernels must not write between strided elements or before the offset. */
void kt_check_gaps(const kt_buf *b);
/* Fails unless the device's pool has no live block (kernel scratch included). */
void kt_check_no_live_blocks(ts_device *dev);
/* "contiguous", "transposed", "strided", "offset". (transfer none, static) */
const char *kt_layout_name(int layout);
/* A device that need not be host-addressable (cuda): b copied byte for byte (gaps included)
 * into a new allocation on dev, with the same layout. kt_free frees it. */
kt_buf kt_mirror(ts_device *dev, const kt_buf *b);
/* Copies mirror d's bytes back over host buffer h (made by kt_make, the same size), so that
 * kt_get and kt_check_gaps can read what the device wrote. */
void kt_fetch(kt_buf *h, const kt_buf *d);

/* Tolerances for a dtype: float32 1e-5 rel, float64 1e-12 rel, ints exact. */
double kt_rtol(int32_t dtype);

/* Graph capture against eager execution on dev: two identical small CNNs trained with Adam
 * for `steps` steps on changing batches written into a fixed input tensor, one eagerly, one
 * by recording its forward and backward at step 1 and replaying it after (the optimizer step
 * runs eagerly in both); every loss and every final weight must be bit for bit the same. The
 * recording's held blocks stay out of the pool until the graph is freed. Prints the time per
 * step of each. */
void kt_check_graph_step(ts_device *dev, int steps);

#endif
