/* tools/operand.c: the operand harness (operand.h). */
#include "operand.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *oph_layout_name(int layout)
{
    static const char *const names[] = {"contiguous", "transposed", "strided", "offset",
                                        "broadcast"};
    return layout >= 0 && layout < OPH_NLAYOUTS ? names[layout] : "unknown";
}

size_t oph_lay_out(ts_operand *op, int32_t dtype, int ndim, const int64_t *shape, int layout)
{
    op->dtype = dtype;
    op->ndim = ndim;
    int order[TS_MAX_DIMS];
    for (int d = 0; d < ndim; d++) {
        op->shape[d] = shape[d];
        order[d] = d;
    }
    if (layout == OPH_TRANSPOSED && ndim >= 2) {
        order[ndim - 2] = ndim - 1;
        order[ndim - 1] = ndim - 2;
    }
    int64_t mult = layout == OPH_STRIDED ? 2 : 1, acc = 1;
    for (int k = ndim - 1; k >= 0; k--) {
        int d = order[k];
        if (layout == OPH_BCAST && d == 0) {
            op->strides[d] = 0;
            continue;
        }
        op->strides[d] = acc * mult;
        acc *= shape[d] > 0 ? shape[d] * mult : mult;
    }
    op->offset = layout == OPH_OFFSET ? 5 : 0;
    int64_t span = op->offset + 1;
    for (int d = 0; d < ndim; d++)
        if (shape[d] > 0)
            span += (shape[d] - 1) * op->strides[d];
    return (size_t)span * ts_plugin_dtype_size(dtype);
}

int64_t oph_numel(const ts_operand *op)
{
    int64_t n = 1;
    for (int d = 0; d < op->ndim; d++)
        n *= op->shape[d];
    return n;
}

int oph_next(const ts_operand *op, int64_t *idx)
{
    for (int d = op->ndim - 1; d >= 0; d--) {
        if (++idx[d] < op->shape[d])
            return 1;
        idx[d] = 0;
    }
    return 0;
}

void oph_unravel(const ts_operand *op, int64_t linear, int64_t *idx)
{
    for (int d = op->ndim - 1; d >= 0; d--) {
        int64_t s = op->shape[d] > 0 ? op->shape[d] : 1;
        idx[d] = linear % s;
        linear /= s;
    }
}

int64_t oph_offset(const ts_operand *op, const int64_t *idx)
{
    int64_t off = op->offset;
    for (int d = 0; d < op->ndim; d++)
        off += idx[d] * op->strides[d];
    return off;
}

double oph_get(const ts_operand *op, const void *base, const int64_t *idx)
{
    const char *p =
        (const char *)base + oph_offset(op, idx) * (int64_t)ts_plugin_dtype_size(op->dtype);
    switch (op->dtype) {
    case TS_F32: { float f; memcpy(&f, p, 4); return f; }
    case TS_F64: { double f; memcpy(&f, p, 8); return f; }
    case TS_I32: { int32_t i; memcpy(&i, p, 4); return i; }
    case TS_I64: { int64_t i; memcpy(&i, p, 8); return (double)i; }
    case TS_BF16: { uint16_t h; memcpy(&h, p, 2); return ts_plugin_bf16_to_f32(h); }
    case TS_F16: { uint16_t h; memcpy(&h, p, 2); return ts_plugin_f16_to_f32(h); }
    default: return *(const unsigned char *)p;
    }
}

void oph_set(const ts_operand *op, void *base, const int64_t *idx, double v)
{
    char *p = (char *)base + oph_offset(op, idx) * (int64_t)ts_plugin_dtype_size(op->dtype);
    switch (op->dtype) {
    case TS_F32: { float f = (float)v; memcpy(p, &f, 4); break; }
    case TS_F64: memcpy(p, &v, 8); break;
    case TS_I32: { int32_t i = (int32_t)v; memcpy(p, &i, 4); break; }
    case TS_I64: { int64_t i = (int64_t)v; memcpy(p, &i, 8); break; }
    case TS_BF16: { uint16_t h = ts_plugin_f64_to_bf16(v); memcpy(p, &h, 2); break; }
    case TS_F16: { uint16_t h = ts_plugin_f64_to_f16(v); memcpy(p, &h, 2); break; }
    default: *(unsigned char *)p = (unsigned char)v; break;
    }
}

int oph_close(double a, double b, double rtol, double atol)
{
    if (isnan(a) || isnan(b))
        return isnan(a) && isnan(b);
    if (isinf(a) || isinf(b))
        return a == b;
    return fabs(a - b) <= atol + rtol * fabs(b);
}

int64_t oph_gap_written(const ts_operand *op, const unsigned char *bytes, size_t nbytes,
                        unsigned char fill)
{
    size_t es = ts_plugin_dtype_size(op->dtype);
    unsigned char *mark = calloc(nbytes ? nbytes : 1, 1);
    if (!mark)
        return -1;
    int64_t n = oph_numel(op), idx[TS_MAX_DIMS] = {0};
    for (int64_t i = 0; i < n; i++, oph_next(op, idx)) {
        int64_t off = oph_offset(op, idx);
        if (off >= 0 && (size_t)(off + 1) * es <= nbytes)
            memset(mark + (size_t)off * es, 1, es);
    }
    int64_t at = -1;
    for (size_t i = 0; i < nbytes && at < 0; i++)
        if (!mark[i] && bytes[i] != fill)
            at = (int64_t)i;
    free(mark);
    return at;
}
