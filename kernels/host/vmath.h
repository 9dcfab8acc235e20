/* kernels/host/vmath.h: float exp and tanh written so that loops over them vectorize (no
 * branches, no calls, no errno): glibc's expf and tanhf are scalar calls, and in a GPT step
 * GELU's tanh, its derivative and softmax's exp spent 5 ns an element in them. Polynomials
 * after Cephes (Moshier): exp by 2^n e^r with |r| <= ln2/2 and a degree-6 polynomial; tanh
 * by an odd polynomial below 0.625 and 1 - 2 / (e^2|x| + 1) above. Both are within 2 ulp of
 * the correctly rounded result over the float range (tests/unit/test-vmath checks them
 * against double precision on every float in a sweep), handle +-inf, NaN and the subnormal
 * tail of exp, and are deterministic: the same bits on every x86-64, whatever its vector
 * width. Float only; double precision uses libm. Loops vectorize with -fno-trapping-math
 * (the selects then need not be branches), which the host kernels build with. */
#ifndef TESSERA_KERNELS_HOST_VMATH_H
#define TESSERA_KERNELS_HOST_VMATH_H

#include <stdint.h>
#include <string.h>

/* Always inlined: a call from a loop compiled for AVX2 or AVX-512 (hostkern.h's HK_CLONES)
 * into a function GCC kept out of line would run that function's baseline SSE2 code. */
#if defined(__GNUC__)
#define HK_VINLINE static inline __attribute__((always_inline))
#else
#define HK_VINLINE static inline
#endif

HK_VINLINE float hk_bits_float(int32_t i)
{
    float f;
    memcpy(&f, &i, sizeof f);
    return f;
}

HK_VINLINE int32_t hk_float_bits(float f)
{
    int32_t i;
    memcpy(&i, &f, sizeof i);
    return i;
}

/* e^x. Overflows to +inf above 88.7228, underflows through the subnormals to +0 below
 * -103.98, NaN in gives NaN. */
HK_VINLINE float hk_expf(float x)
{
    /* Clamp first so that every lane's arithmetic stays finite; the selects at the end give
     * the out-of-range results. */
    float xc = x > 89.0f ? 89.0f : x;
    /* NaN, and x below the underflow bound (a softmax's masked -inf): 0, any lane whose
     * result a select replaces; computing them would run on subnormals, which cost x86 CPUs
     * a microcode assist per operation (a causal mask made softmax 3x slower). */
    xc = x >= -103.97208404541015625f ? xc : 0.0f; /* false for NaN too */
    /* n = round(x / ln 2) by the 1.5 * 2^23 trick (exact for |v| < 2^22; no rint call). */
    const float shifter = 12582912.0f;
    float n = (xc * 1.44269504088896341f + shifter) - shifter;
    /* r = x - n ln2, ln2 split so that n * hi is exact. */
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float r2 = r * r;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r2 + r + 1.0f;
    /* 2^n as two factors, so that n down to -150 (subnormal results) and up to 128 stay
     * normal in each: n1 = floor(n / 2), n2 = n - n1, both in [-75, 65]. */
    int32_t ni = (int32_t)n, n1 = ni >> 1, n2 = ni - n1;
    /* the biased exponents are in [52, 192]: shifted as unsigned, no signed overflow */
    float y = p * hk_bits_float((int32_t)((uint32_t)(n1 + 127) << 23)) *
              hk_bits_float((int32_t)((uint32_t)(n2 + 127) << 23));
    y = x > 88.72283935546875f ? __builtin_inff() : y;
    y = x < -103.97208404541015625f ? 0.0f : y;
    return x != x ? x : y;
}

/* tanh(x): odd, correctly signed zero, exactly +-1 where tanh rounds to it, NaN in
 * gives NaN. */
HK_VINLINE float hk_tanhf(float x)
{
    int32_t sign = hk_float_bits(x) & (int32_t)0x80000000u;
    float a = hk_bits_float(hk_float_bits(x) & 0x7fffffff);
    /* |x| < 0.625: x + x^3 P(x^2) */
    float z = x * x;
    float ps = -5.70498872745e-3f;
    ps = ps * z + 2.06390887954e-2f;
    ps = ps * z - 5.37397155531e-2f;
    ps = ps * z + 1.33314422036e-1f;
    ps = ps * z - 3.33332819422e-1f;
    ps = ps * z * x + x;
    /* above: 1 - 2 / (e^2a + 1), the sign put back; a is capped at 10, where the result
     * already rounds to 1 (tanh 10 = 1 - 4e-9) */
    float e = hk_expf(2.0f * (a < 10.0f ? a : 10.0f));
    float pl = 1.0f - 2.0f / (e + 1.0f);
    pl = hk_bits_float(hk_float_bits(pl) | sign);
    float y = a < 0.625f ? ps : pl;
    y = hk_bits_float((hk_float_bits(y) & 0x7fffffff) | sign); /* odd: -0 stays -0 */
    return x != x ? x : y;
}

/* GELU's tanh form, GPT-2's 0.5 x (1 + tanh u) with u = c (x + k x^3), c = sqrt(2 / pi),
 * k = 0.044715, evaluated as x sigma(2u) = x / (1 + e^-2u), the same function: one exp and
 * one division where tanh takes a polynomial, an exp and a division, and no cancellation in
 * 1 + tanh u for negative x (which cost that form every bit of the result below x = -4).
 * Within 4 ulp of the result for the float u it computes (tests/unit/test-vmath). */
HK_VINLINE float hk_gelu_tanhf(float x)
{
    const float c = 0.7978845608028654f, k = 0.044715f;
    return x / (1.0f + hk_expf(-2.0f * (c * (x + k * x * x * x))));
}

/* Its derivative in the same form: with s = sigma(2u), s + 2 x s (1 - s) c (1 + 3 k x^2)
 * (= (1 + t) / 2 + x (1 - t^2) c (1 + 3 k x^2) / 2 for t = tanh u = 2 s - 1). */
HK_VINLINE float hk_gelu_tanh_derivf(float x)
{
    const float c = 0.7978845608028654f, k = 0.044715f;
    float x2 = x * x;
    float s = 1.0f / (1.0f + hk_expf(-2.0f * (c * x * (1.0f + k * x2))));
    return s + 2.0f * x * s * (1.0f - s) * c * (1.0f + 3.0f * k * x2);
}

/* The largest of x[0..n) (n >= 1), or NaN when any is NaN (as a strided loop that stops at
 * the first NaN gives); a vectorized reduction, for softmax-like rows. */
HK_VINLINE float hk_max_nan_f32(const float *x, int64_t n)
{
    float m = -__builtin_inff();
    int nan = 0;
#pragma omp simd reduction(max : m) reduction(| : nan)
    for (int64_t i = 0; i < n; i++) {
        m = x[i] > m ? x[i] : m;
        nan |= x[i] != x[i];
    }
    return nan ? __builtin_nanf("") : m;
}

/* y[i] = e^(x[i] - m) (y may be NULL: the sum only); returns their sum, accumulated in
 * double lanes. */
HK_VINLINE double hk_exp_shift_sum_f32(const float *x, float m, float *y, int64_t n)
{
    double sum = 0;
    if (!y) {
#pragma omp simd reduction(+ : sum)
        for (int64_t i = 0; i < n; i++)
            sum += (double)hk_expf(x[i] - m);
        return sum;
    }
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < n; i++) {
        float e = hk_expf(x[i] - m);
        y[i] = e;
        sum += (double)e;
    }
    return sum;
}

/* The 16-bit float conversions of plugin.h (ts_plugin_f16_to_f32, ts_plugin_f32_to_f16,
 * ts_plugin_f32_to_bf16), the same bits, written as selects instead of early returns so that
 * a loop over them vectorizes: every case is computed and the one that applies kept. */
HK_VINLINE float hk_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    uint32_t normal = sign | ((exp + 112u) << 23) | (man << 13);
    uint32_t special = sign | 0x7f800000u | (man << 13); /* infinity, NaN (payload kept) */
    float sub = (float)man * 5.9604644775390625e-8f;     /* zero, subnormal: exact */
    uint32_t subb;
    memcpy(&subb, &sub, sizeof subb);
    uint32_t r = exp == 0x1fu ? special : exp ? normal : (subb | sign);
    float f;
    memcpy(&f, &r, sizeof f);
    return f;
}

HK_VINLINE uint16_t hk_f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint32_t a = u & 0x7fffffffu, sign = (u >> 16) & 0x8000u;
    uint32_t nan = sign | 0x7e00u | ((a >> 13) & 0x3ffu);
    uint32_t r = a - 0x38000000u;
    uint32_t normal = sign | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13);
    /* subnormal: k units of 2^-24, k = m 2^(e - 126) rounded to even (shift clamped so the
     * unused lanes stay defined) */
    uint32_t e = a >> 23, sh = 126u - e;
    sh = sh > 31u ? 31u : sh < 1u ? 1u : sh;
    uint32_t m = (a & 0x7fffffu) | 0x800000u, k = m >> sh, rem = m & ((1u << sh) - 1u);
    uint32_t half = 1u << (sh - 1u);
    k += (rem > half) | ((rem == half) & (k & 1u));
    uint32_t res = a > 0x7f800000u    ? nan
                   : a >= 0x477ff000u ? (sign | 0x7c00u)
                   : a >= 0x38800000u ? normal
                   : a <= 0x33000000u ? sign
                                      : (sign | k);
    return (uint16_t)res;
}

HK_VINLINE uint16_t hk_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x0040u : r);
}

/* 64-byte vectors of doubles (GCC's and clang's vector extension) for sums kept in registers:
 * lane by lane, so every clone adds the same doubles in the same order. d = the 8 float32
 * values at x, as doubles (exact); a macro, as a function returning a 64-byte vector changes
 * the ABI between the clones. */
typedef double hk_v8d __attribute__((vector_size(64)));
typedef float hk_v8f __attribute__((vector_size(32)));
#define HK_LOAD8_F32(d, x)                                                                         \
    do {                                                                                           \
        hk_v8f f_;                                                                                 \
        memcpy(&f_, (x), sizeof f_);                                                               \
        (d) = __builtin_convertvector(f_, hk_v8d);                                                 \
    } while (0)

#endif /* TESSERA_KERNELS_HOST_VMATH_H */
