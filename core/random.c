/* core/random.c: the counter-based generator (Philox4x32-10, Salmon et al., SC'11). Numbers
 * are made on the host by the core from (seed, counter) alone and uploaded, so the same seed
 * gives the same tensors on every backend. Element i of a call uses Philox block
 * (rng->offset + i): one block per element, whatever the dtype, keeps the mapping simple. */
#include <math.h>
#include <stdlib.h>

#include "internal.h"

/* One Philox4x32-10 block: ctr encrypted under key. Exposed for the known-answer test. */
TS_API void ts__philox4x32_10(const uint32_t ctr_in[4], const uint32_t key_in[2],
                              uint32_t out[4]);

TS_API void ts__philox4x32_10(const uint32_t ctr_in[4], const uint32_t key_in[2],
                              uint32_t out[4])
{
    uint32_t c0 = ctr_in[0], c1 = ctr_in[1], c2 = ctr_in[2], c3 = ctr_in[3];
    uint32_t k0 = key_in[0], k1 = key_in[1];
    for (int r = 0; r < 10; r++) {
        if (r > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

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
