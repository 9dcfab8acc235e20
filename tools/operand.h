/* tools/operand.h: the operand harness shared by `tessera plugin-check` and the kernel tests
 * (tests/plugins/kt.c): strided operands in the layouts both use, element access by
 * multi-index in any dtype, and the comparison of results. Plain functions over plugin.h's
 * ts_operand; nothing here allocates. */
#ifndef TESSERA_TOOLS_OPERAND_H
#define TESSERA_TOOLS_OPERAND_H

#include <stddef.h>
#include <stdint.h>

#include <tessera/plugin.h>

typedef enum oph_layout {
    OPH_CONTIG = 0,     /* row-major, dense */
    OPH_TRANSPOSED = 1, /* the last two dims swapped in memory (column-major matrices) */
    OPH_STRIDED = 2,    /* every other element along each dim (a slice with step 2) */
    OPH_OFFSET = 3,     /* dense, but starting 5 elements into the storage */
    OPH_BCAST = 4,      /* dense, with dim 0 broadcast (stride 0) */
    OPH_NLAYOUTS
} oph_layout;

/* "contiguous", "transposed", "strided", "offset", "broadcast". */
const char *oph_layout_name(int layout);
/* Fills op's dtype, ndim, shape, strides and offset for a tensor of (dtype, ndim, shape) laid
 * out as layout (its data pointer is left alone) and returns the bytes its elements span from
 * the start of the storage (at least one element). */
size_t oph_lay_out(ts_operand *op, int32_t dtype, int ndim, const int64_t *shape, int layout);
int64_t oph_numel(const ts_operand *op);
/* Advances the multi-index idx row-major over op's shape; 0 when it wrapped around. */
int oph_next(const ts_operand *op, int64_t *idx);
/* Linear (row-major) index -> multi-index. */
void oph_unravel(const ts_operand *op, int64_t linear, int64_t *idx);
/* Offset in elements of the element at idx from the start of the storage. */
int64_t oph_offset(const ts_operand *op, const int64_t *idx);
/* The element at idx of op over the storage at base, as a double (set: converted like a C
 * cast, which the values the harness draws always fit). */
double oph_get(const ts_operand *op, const void *base, const int64_t *idx);
void oph_set(const ts_operand *op, void *base, const int64_t *idx, double v);
/* |a - b| <= atol + rtol * |b|, with NaN == NaN and equal infinities. */
int oph_close(double a, double b, double rtol, double atol);
/* The first byte of the nbytes at bytes that is not part of an element of op and no longer
 * holds fill (a kernel wrote between strided elements or before the offset); -1 if none (or
 * no memory to tell). */
int64_t oph_gap_written(const ts_operand *op, const unsigned char *bytes, size_t nbytes,
                        unsigned char fill);

#endif /* TESSERA_TOOLS_OPERAND_H */
