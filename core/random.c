/* core/random.c: the counter-based generator (Philox4x32-10, Salmon et al., SC'11). Numbers
 * are made on the host by the core from (seed, counter) alone and uploaded, so the same seed
 * gives the same tensors on every backend. Element i of a call uses Philox block
 * (rng->offset + i): one block per element, whatever the dtype, keeps the mapping simple. */
#include <math.h>
#include <stdlib.h>

#include "internal.h"
#include "philox.h"

TS_API void ts_rng_init(ts_rng *rng, uint64_t seed)
{
    rng->seed = seed;
    rng->offset = 0;
}

static void block(const ts_rng *rng, uint64_t index, uint32_t out[4])
{
    uint32_t ctr[4] = {(uint32_t)index, (uint32_t)(index >> 32), 0, 0};
    uint32_t key[2] = {(uint32_t)rng->seed, (uint32_t)(rng->seed >> 32)};
    ts__philox4x32_10(ctr, key, out);
}

/* [0, 1) with 24 (float32) or 53 (float64) random bits. */
static double unit(int32_t dtype, uint32_t a, uint32_t b)
{
    if (dtype == TS_F32)
        return (double)(a >> 8) * (1.0 / 16777216.0);
    return ((double)(a >> 5) * 67108864.0 + (double)(b >> 6)) * (1.0 / 9007199254740992.0);
}

static ts_status generate(ts_device *dev, int32_t dtype, int ndim, const int64_t *shape,
                          double p0, double p1, int normal, ts_rng *rng, ts_tensor **out)
{
    if (!out)
        return ts__fail(TS_EINVAL, "random: out is NULL");
    *out = NULL;
    if (!rng)
        return ts__fail(TS_EINVAL, "random: rng is NULL (ts_rng_init one)");
    if (dtype != TS_F32 && dtype != TS_F64)
        return ts__fail(TS_EDTYPE, "random: %s tensors; only float32 and float64",
                        ts_dtype_name(dtype));
    ts_tensor *t;
    ts_status s = ts_tensor_empty(dev, dtype, ndim, shape, &t);
    if (s)
        return s;
    int64_t n = ts_tensor_numel(t);
    size_t es = ts_dtype_size(dtype);
    unsigned char *buf = ts__malloc((size_t)n * es + 1);
    if (!buf) {
        ts_tensor_unref(t);
        return ts__fail(TS_ENOMEM, "out of host memory for %lld random numbers", (long long)n);
    }
    for (int64_t i = 0; i < n; i++) {
        uint32_t r[4];
        block(rng, rng->offset + (uint64_t)i, r);
        double v;
        if (normal) {
            double u1 = 1.0 - unit(dtype, r[0], r[1]); /* (0, 1]: log is finite */
            double u2 = unit(dtype, r[2], r[3]);
            v = p0 + p1 * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
        } else {
            v = p0 + (p1 - p0) * unit(dtype, r[0], r[1]);
            if (v >= p1 && p1 > p0) /* rounding in float32 must not reach high */
                v = nextafter(p1, p0);
        }
        ts__scalar_bytes(dtype, v, buf + (size_t)i * es);
    }
    rng->offset += (uint64_t)n;
    s = ts_device_copy_from_host(ts_tensor_device(t), ts_tensor_data(t), buf, (size_t)n * es);
    free(buf);
    if (s) {
        ts_tensor_unref(t);
        return s;
    }
    *out = t;
    return TS_OK;
}

TS_API ts_status ts_tensor_rand(ts_device *dev, int32_t dtype, int ndim, const int64_t *shape,
                                double low, double high, ts_rng *rng, ts_tensor **out)
{
    if (!(low < high) || !isfinite(low) || !isfinite(high))
        return ts__fail(TS_EINVAL, "rand: need finite low < high, got [%g, %g)", low, high);
    return generate(dev, dtype, ndim, shape, low, high, 0, rng, out);
}

TS_API ts_status ts_tensor_randn(ts_device *dev, int32_t dtype, int ndim, const int64_t *shape,
                                 double mean, double std, ts_rng *rng, ts_tensor **out)
{
    if (!(std >= 0) || !isfinite(mean) || !isfinite(std))
        return ts__fail(TS_EINVAL, "randn: need a finite mean and std >= 0, got %g, %g", mean,
                        std);
    return generate(dev, dtype, ndim, shape, mean, std, 1, rng, out);
}
