/* tests/plugins/kt.c: see kt.h. */
#include "kt.h"

#include <math.h>

static ts_device *loaded[8];
static int nloaded;

static void unload_all(void)
{
    for (int i = 0; i < nloaded; i++)
        ts_device_unload(loaded[i]);
    nloaded = 0;
}

ts_device *kt_load(const char *name)
{
    char *path;
    if (ts_plugin_find(NULL, name, &path) != TS_OK)
        SKIP("plugin %s is not built", name);
    free(path);
    ts_device *dev;
    CHECK_OK(ts_device_load(NULL, name, &dev));
    if (nloaded == 0)
        atexit(unload_all);
    loaded[nloaded++] = dev;
    return dev;
}

const char *const *kt_plugins(void)
{
    static const char *names[3];
    static const char *const all[] = {"cpu_blas", "cpu_onednn"};
    int n = 0;
    for (int i = 0; i < 2; i++) {
        char *path;
        if (ts_plugin_find(NULL, all[i], &path) == TS_OK) {
            free(path);
            names[n++] = all[i];
        }
    }
    names[n] = NULL;
    return names;
}

int64_t kt_numel(const ts_operand *op)
{
    return oph_numel(op);
}

kt_buf kt_make(ts_device *dev, int32_t dtype, int ndim, const int64_t *shape, kt_layout layout,
               uint64_t seed)
{
    kt_buf b = {.dev = dev};
    CHECK(ts_dtype_size(dtype) > 0 && ndim >= 0 && ndim <= TS_MAX_DIMS);
    b.nbytes = oph_lay_out(&b.op, dtype, ndim, shape, (int)layout);
    CHECK_OK(ts_device_alloc(dev, b.nbytes, "kt", &b.base));
    memset(b.base, 0xA5, b.nbytes); /* garbage between strided elements */
    b.op.data = b.base;
    kt_fill_random(&b, seed);
    return b;
}

void kt_free(kt_buf *b)
{
    if (b->base)
        ts_device_free(b->dev, b->base);
    b->base = NULL;
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void kt_fill_random(kt_buf *b, uint64_t seed)
{
    uint64_t s = seed * 7919 + 1;
    int64_t n = kt_numel(&b->op), idx[TS_MAX_DIMS];
    for (int64_t i = 0; i < n; i++) {
        kt_unravel(&b->op, i, idx);
        uint64_t r = splitmix(&s);
        double v;
        switch (b->op.dtype) {
        case TS_F32:
        case TS_F64: v = (double)(r >> 11) / 9007199254740992.0 * 4.0 - 2.0; break;
        case TS_U8: v = (double)(r & 1); break;
        default: v = (double)(int64_t)(r % 19) - 9.0; break;
        }
        kt_set(&b->op, idx, v);
    }
}

void kt_unravel(const ts_operand *op, int64_t linear, int64_t *idx)
{
    oph_unravel(op, linear, idx);
}

double kt_get(const ts_operand *op, const int64_t *idx)
{
    CHECK_MSG(ts_dtype_size(op->dtype) > 0, "bad dtype %d", op->dtype);
    return oph_get(op, op->data, idx);
}

void kt_set(const ts_operand *op, const int64_t *idx, double v)
{
    CHECK_MSG(ts_dtype_size(op->dtype) > 0, "bad dtype %d", op->dtype);
    oph_set(op, op->data, idx, v);
}

ts_operand kt_broadcast(const ts_operand *op, int ndim, const int64_t *shape)
{
    ts_operand r = *op;
    int lead = ndim - op->ndim;
    CHECK(lead >= 0);
    r.ndim = ndim;
    for (int d = ndim - 1; d >= 0; d--) {
        int sd = d - lead;
        if (sd >= 0 && op->shape[sd] == shape[d]) {
            r.shape[d] = op->shape[sd];
            r.strides[d] = op->strides[sd];
        } else {
            CHECK(sd < 0 || op->shape[sd] == 1);
            r.shape[d] = shape[d];
            r.strides[d] = 0;
        }
    }
    return r;
}

ts_status kt_run(ts_device *dev, int32_t op, const ts_operand *in, int nin, const ts_operand *out,
                 int nout, const void *params, size_t params_size)
{
    ts_kernel_call call = {
        .struct_size = sizeof call,
        .op = op,
        .ninputs = nin,
        .noutputs = nout,
        .inputs = in,
        .outputs = out,
        .params = params,
        .params_size = (uint32_t)params_size,
    };
    return ts_device_run(dev, &call);
}

int kt_close(double a, double b, double rtol, double atol)
{
    return oph_close(a, b, rtol, atol);
}

double kt_rtol(int32_t dtype)
{
    return dtype == TS_F32 ? 1e-5 : dtype == TS_F64 ? 1e-12 : 0;
}

void kt_check_gaps(const kt_buf *b)
{
    int64_t at = oph_gap_written(&b->op, b->base, b->nbytes, 0xA5);
    CHECK_MSG(at < 0, "byte %lld of %zu outside the elements was written", (long long)at,
              b->nbytes);
}

void kt_check_no_live_blocks(ts_device *dev)
{
    ts_memory_stats st;
    CHECK_OK(ts_device_memory_stats(dev, &st));
    if (st.valid & TS_STATS_POOL)
        CHECK_INT_EQ(st.live_blocks, 0);
}

const char *kt_layout_name(int layout)
{
    return layout >= 0 && layout < KT_NLAYOUTS ? oph_layout_name(layout) : "unknown";
}

kt_buf kt_mirror(ts_device *dev, const kt_buf *b)
{
    kt_buf m = *b;
    m.dev = dev;
    CHECK_OK(ts_device_alloc(dev, b->nbytes, "kt", &m.base));
    CHECK_OK(ts_device_copy_from_host(dev, m.base, b->base, b->nbytes));
    m.op.data = m.base;
    return m;
}

void kt_fetch(kt_buf *h, const kt_buf *d)
{
    CHECK(h->nbytes == d->nbytes);
    CHECK_OK(ts_device_copy_to_host(d->dev, h->base, d->base, d->nbytes));
}
