/* plugins/cuda/elementwise.cu: cast/copy, fill, unary, binary (with broadcasting through
 * stride-0 operands and a by-value scalar), where, and the pattern fill, as grid-stride
 * kernels over the collapsed iteration space of cu_ew_arg. One kernel per dtype (or dtype
 * pair for casts); the function code is a uniform switch inside, which keeps the number of
 * instantiations, and so nvcc's time, small. The arithmetic follows kernels/host/
 * elementwise.c: saturating float -> int casts, wrapping integer arithmetic, truncating
 * integer division, NaN-propagating maximum/minimum, erfc-based GELU. */
#include "common.cuh"

namespace {

/* Offsets (elements) of element i of the iteration space in each of the first NOPS
 * operands. */
template <int NOPS>
__device__ __forceinline__ void ew_offsets(const cu_ew_arg &a, int64_t i, int64_t *off)
{
    if (a.ndim == 1) {
        for (int k = 0; k < NOPS; k++)
            off[k] = i * a.strides[k][0];
        return;
    }
    for (int k = 0; k < NOPS; k++)
        off[k] = 0;
    for (int d = a.ndim - 1; d >= 0; d--) {
        int64_t c = i % a.shape[d];
        i /= a.shape[d];
        for (int k = 0; k < NOPS; k++)
            off[k] += c * a.strides[k][d];
    }
}

/* The 16-bit floats (ABI 2.5) as their patterns, kept apart as types so that a cast can tell
 * them from each other and from integers; conversions are plugin.h's, as on the host. */
struct bf16_t {
    uint16_t v;
};
struct f16_t {
    uint16_t v;
};

template <typename T> __host__ __device__ __forceinline__ T narrow16(float x)
{
    if constexpr (std::is_same<T, bf16_t>::value)
        return bf16_t{ts_plugin_f32_to_bf16(x)};
    else
        return f16_t{ts_plugin_f32_to_f16(x)};
}

template <typename T> __host__ __device__ __forceinline__ T narrow16d(double x)
{
    if constexpr (std::is_same<T, bf16_t>::value)
        return bf16_t{ts_plugin_f64_to_bf16(x)};
    else
        return f16_t{ts_plugin_f64_to_f16(x)};
}

__host__ __device__ __forceinline__ float widen16(bf16_t h)
{
    return ts_plugin_bf16_to_f32(h.v);
}

__host__ __device__ __forceinline__ float widen16(f16_t h)
{
    return ts_plugin_f16_to_f32(h.v);
}

template <typename T> struct is_half16 : std::false_type {};
template <> struct is_half16<bf16_t> : std::true_type {};
template <> struct is_half16<f16_t> : std::true_type {};

/* The type an element is computed in: float for the 16-bit floats (widened on load, rounded
 * once on store, as the host plugins do), the element type itself otherwise. */
template <typename T> struct calc {
    typedef T type;
};
template <> struct calc<bf16_t> {
    typedef float type;
};
template <> struct calc<f16_t> {
    typedef float type;
};

template <typename T> __device__ __forceinline__ typename calc<T>::type ld(T x)
{
    if constexpr (is_half16<T>::value)
        return widen16(x);
    else
        return x;
}

template <typename T> __device__ __forceinline__ T st(typename calc<T>::type x)
{
    if constexpr (is_half16<T>::value)
        return narrow16<T>(x);
    else
        return x;
}

template <typename TO, typename TI> __host__ __device__ __forceinline__ TO conv(TI x);

/* Casts that involve a 16-bit float: from one, widen exactly and convert the float32; to
 * one, round once (from float32, or from a double that holds any other dtype exactly, int64
 * past 2^53 aside). */
template <typename TO, typename TI> __host__ __device__ __forceinline__ TO conv16(TI x)
{
    if constexpr (std::is_same<TO, TI>::value)
        return x;
    else if constexpr (is_half16<TI>::value)
        return conv<TO, float>(widen16(x));
    else if constexpr (std::is_same<TI, float>::value)
        return narrow16<TO>(x);
    else
        return narrow16d<TO>((double)x);
}

template <typename TO, typename TI> __host__ __device__ __forceinline__ TO conv(TI x)
{
    if constexpr (is_half16<TO>::value || is_half16<TI>::value)
        return conv16<TO, TI>(x);
    else if constexpr (std::is_same<TO, TI>::value)
        return x;
    else if constexpr (std::is_same<TO, uint8_t>::value)
        return (uint8_t)(x != 0);
    else if constexpr (std::is_same<TO, int32_t>::value) {
        if constexpr (std::is_floating_point<TI>::value)
            return cu_sat_i32((double)x);
        else
            return (int32_t)(uint32_t)(uint64_t)(int64_t)x; /* int64 -> int32 wraps */
    } else if constexpr (std::is_same<TO, int64_t>::value) {
        if constexpr (std::is_floating_point<TI>::value)
            return cu_sat_i64((double)x);
        else
            return (int64_t)x;
    } else
        return (TO)x;
}

template <typename TO, typename TI> __global__ void k_cast(cu_ew_arg a)
{
    CU_GRID_LOOP(i, a.n)
    {
        int64_t off[2];
        ew_offsets<2>(a, i, off);
        ((TO *)a.base[0])[off[0]] = conv<TO, TI>(((const TI *)a.base[1])[off[1]]);
    }
}

template <typename T> __global__ void k_fill(cu_ew_arg a, T v)
{
    CU_GRID_LOOP(i, a.n)
    {
        int64_t off[1];
        ew_offsets<1>(a, i, off);
        ((T *)a.base[0])[off[0]] = v;
    }
}

/* ---- unary --------------------------------------------------------------------------- */

#define INV_SQRT2 0.70710678118654752440

template <typename T> __device__ __forceinline__ T unary_f(int fn, T x);

template <> __device__ __forceinline__ float unary_f<float>(int fn, float x)
{
    switch (fn) {
    case TS_UNARY_NEG: return -x;
    case TS_UNARY_ABS: return fabsf(x);
    case TS_UNARY_EXP: return expf(x);
    case TS_UNARY_LOG: return logf(x);
    case TS_UNARY_SQRT: return sqrtf(x);
    case TS_UNARY_RSQRT: return 1.0f / sqrtf(x);
    case TS_UNARY_TANH: return tanhf(x);
    case TS_UNARY_SIGMOID: {
        float e = expf(-fabsf(x));
        return x >= 0 ? 1.0f / (1.0f + e) : e / (1.0f + e);
    }
    case TS_UNARY_RELU: return x < 0 ? 0.0f : x;
    case TS_UNARY_GELU: return 0.5f * x * erfcf(-x * (float)INV_SQRT2);
    case TS_UNARY_ERF: return erff(x);
    case TS_UNARY_GELU_TANH:
        return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    case TS_UNARY_GELU_TANH_DERIV: {
        const float c = 0.7978845608028654f, k = 0.044715f;
        float x2 = x * x, t = tanhf(c * x * (1.0f + k * x2));
        return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * c * (1.0f + 3.0f * k * x2);
    }
    case TS_UNARY_SILU: {
        float e = expf(-fabsf(x));
        return x * (x >= 0 ? 1.0f / (1.0f + e) : e / (1.0f + e));
    }
    }
    return x;
}

template <> __device__ __forceinline__ double unary_f<double>(int fn, double x)
{
    switch (fn) {
    case TS_UNARY_NEG: return -x;
    case TS_UNARY_ABS: return fabs(x);
    case TS_UNARY_EXP: return exp(x);
    case TS_UNARY_LOG: return log(x);
    case TS_UNARY_SQRT: return sqrt(x);
    case TS_UNARY_RSQRT: return 1.0 / sqrt(x);
    case TS_UNARY_TANH: return tanh(x);
    case TS_UNARY_SIGMOID: {
        double e = exp(-fabs(x));
        return x >= 0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
    }
    case TS_UNARY_RELU: return x < 0 ? 0.0 : x;
    case TS_UNARY_GELU: return 0.5 * x * erfc(-x * INV_SQRT2);
    case TS_UNARY_ERF: return erf(x);
    case TS_UNARY_GELU_TANH:
        return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
    case TS_UNARY_GELU_TANH_DERIV: {
        const double c = 0.7978845608028654, k = 0.044715;
        double x2 = x * x, t = tanh(c * x * (1.0 + k * x2));
        return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * k * x2);
    }
    case TS_UNARY_SILU: {
        double e = exp(-fabs(x));
        return x * (x >= 0 ? 1.0 / (1.0 + e) : e / (1.0 + e));
    }
    }
    return x;
}

/* Integers: neg, abs, relu (the host plugins' set); wrapping like two's complement. */
template <typename T, typename U> __device__ __forceinline__ T unary_i(int fn, T x)
{
    switch (fn) {
    case TS_UNARY_NEG: return (T)(U)(0u - (U)x);
    case TS_UNARY_ABS: return x < 0 ? (T)(U)(0u - (U)x) : x;
    case TS_UNARY_RELU: return x < 0 ? (T)0 : x;
    }
    return x;
}
template <> __device__ __forceinline__ int32_t unary_f<int32_t>(int fn, int32_t x)
{
    return unary_i<int32_t, uint32_t>(fn, x);
}
template <> __device__ __forceinline__ int64_t unary_f<int64_t>(int fn, int64_t x)
{
    return unary_i<int64_t, uint64_t>(fn, x);
}

template <typename T> __global__ void k_unary(cu_ew_arg a, int fn)
{
    CU_GRID_LOOP(i, a.n)
    {
        int64_t off[2];
        ew_offsets<2>(a, i, off);
        typedef typename calc<T>::type C;
        ((T *)a.base[0])[off[0]] = st<T>(unary_f<C>(fn, ld(((const T *)a.base[1])[off[1]])));
    }
}

/* ---- binary -------------------------------------------------------------------------- */

template <typename T> __device__ __forceinline__ T fmax_nan(T x, T y)
{
    return x != x ? x : y != y ? y : x > y ? x : y;
}
template <typename T> __device__ __forceinline__ T fmin_nan(T x, T y)
{
    return x != x ? x : y != y ? y : x < y ? x : y;
}

template <typename T, typename U> __device__ __forceinline__ T ipow(T x, T y)
{
    U r = 1, b = (U)x;
    for (U e = y < 0 ? 0 : (U)y; e; e >>= 1, b *= b)
        if (e & 1)
            r *= b;
    return (T)r;
}

template <typename T> __device__ __forceinline__ T arith(int fn, T x, T y)
{
    if constexpr (std::is_floating_point<T>::value) {
        switch (fn) {
        case TS_BINARY_ADD: return x + y;
        case TS_BINARY_SUB: return x - y;
        case TS_BINARY_MUL: return x * y;
        case TS_BINARY_DIV: return x / y;
        case TS_BINARY_POW: return pow(x, y);
        case TS_BINARY_MAXIMUM: return fmax_nan(x, y);
        case TS_BINARY_MINIMUM: return fmin_nan(x, y);
        }
        return x;
    } else {
        typedef typename std::make_unsigned<T>::type U;
        switch (fn) {
        case TS_BINARY_ADD: return (T)((U)x + (U)y);
        case TS_BINARY_SUB: return (T)((U)x - (U)y);
        case TS_BINARY_MUL: return (T)((U)x * (U)y);
        /* y == 0 is rejected before the launch; -1 negates so INT_MIN / -1 wraps. */
        case TS_BINARY_DIV: return y == 0 ? (T)0 : y == -1 ? (T)(U)(0u - (U)x) : (T)(x / y);
        case TS_BINARY_POW: return ipow<T, U>(x, y);
        case TS_BINARY_MAXIMUM: return x > y ? x : y;
        case TS_BINARY_MINIMUM: return x < y ? x : y;
        }
        return x;
    }
}

template <typename T> __device__ __forceinline__ uint8_t compare(int fn, T x, T y)
{
    switch (fn) {
    case TS_BINARY_EQ: return x == y;
    case TS_BINARY_NE: return x != y;
    case TS_BINARY_LT: return x < y;
    case TS_BINARY_LE: return x <= y;
    case TS_BINARY_GT: return x > y;
    case TS_BINARY_GE: return x >= y;
    }
    return 0;
}

/* SCALAR 0: operands (out, x, y); 1: (out, y), x = s; 2: (out, x), y = s. CMP: uint8 out. */
template <typename T, int SCALAR, bool CMP>
__global__ void k_binary(cu_ew_arg a, int fn, typename calc<T>::type s)
{
    typedef typename calc<T>::type C;
    constexpr int NOPS = SCALAR ? 2 : 3;
    CU_GRID_LOOP(i, a.n)
    {
        int64_t off[NOPS];
        ew_offsets<NOPS>(a, i, off);
        C x, y;
        if constexpr (SCALAR == 1) {
            x = s;
            y = ld(((const T *)a.base[1])[off[1]]);
        } else if constexpr (SCALAR == 2) {
            x = ld(((const T *)a.base[1])[off[1]]);
            y = s;
        } else {
            x = ld(((const T *)a.base[1])[off[1]]);
            y = ld(((const T *)a.base[2])[off[NOPS - 1]]);
        }
        if constexpr (CMP)
            ((uint8_t *)a.base[0])[off[0]] = compare<C>(fn, x, y);
        else
            ((T *)a.base[0])[off[0]] = st<T>(arith<C>(fn, x, y));
    }
}

template <typename T> __global__ void k_where(cu_ew_arg a)
{
    CU_GRID_LOOP(i, a.n)
    {
        int64_t off[4];
        ew_offsets<4>(a, i, off);
        ((T *)a.base[0])[off[0]] = ((const uint8_t *)a.base[1])[off[1]]
                                       ? ((const T *)a.base[2])[off[2]]
                                       : ((const T *)a.base[3])[off[3]];
    }
}

template <typename T> __global__ void k_find_bad(cu_ew_arg a, int kind, unsigned long long *flag)
{
    CU_GRID_LOOP(i, a.n)
    {
        int64_t off[1];
        ew_offsets<1>(a, i, off);
        T v = ((const T *)a.base[0])[off[0]];
        if (kind == 0 ? v == 0 : v < 0)
            atomicMin(flag, (unsigned long long)i);
    }
}

template <typename T> __global__ void k_pattern(T *dst, int64_t n, T v)
{
    CU_GRID_LOOP(i, n)
    dst[i] = v;
}

/* ---- dispatch ------------------------------------------------------------------------ */

template <typename TO, typename TI> cudaError_t launch_cast(cudaStream_t st, const cu_ew_arg *a)
{
    k_cast<TO, TI><<<cu_blocks(a->n, CU_THREADS), CU_THREADS, 0, st>>>(*a);
    return cu_launched();
}

template <typename TO> cudaError_t cast_from(cudaStream_t st, const cu_ew_arg *a, int32_t in)
{
    switch (in) {
    case TS_F32: return launch_cast<TO, float>(st, a);
    case TS_F64: return launch_cast<TO, double>(st, a);
    case TS_I32: return launch_cast<TO, int32_t>(st, a);
    case TS_I64: return launch_cast<TO, int64_t>(st, a);
    case TS_U8: return launch_cast<TO, uint8_t>(st, a);
    case TS_BF16: return launch_cast<TO, bf16_t>(st, a);
    case TS_F16: return launch_cast<TO, f16_t>(st, a);
    }
    return cudaErrorInvalidValue;
}

template <typename T>
cudaError_t launch_binary(cudaStream_t st, const cu_ew_arg *a, int32_t fn, int pos, double sv)
{
    typename calc<T>::type s; /* the 16-bit floats take the scalar as float32, as on the host */
    if constexpr (std::is_floating_point<typename calc<T>::type>::value)
        s = (typename calc<T>::type)sv;
    else
        s = conv<T, double>(sv);
    unsigned b = cu_blocks(a->n, CU_THREADS);
    bool cmp = fn >= TS_BINARY_EQ && fn <= TS_BINARY_GE;
#define LB(P, C) k_binary<T, P, C><<<b, CU_THREADS, 0, st>>>(*a, fn, s)
    if (cmp) {
        if (pos == 0)
            LB(0, true);
        else if (pos == 1)
            LB(1, true);
        else
            LB(2, true);
    } else {
        if constexpr (std::is_same<T, uint8_t>::value)
            return cudaErrorInvalidValue; /* no arithmetic on uint8 */
        else if (pos == 0)
            LB(0, false);
        else if (pos == 1)
            LB(1, false);
        else
            LB(2, false);
    }
#undef LB
    return cu_launched();
}

} // namespace

extern "C" cudaError_t cu_ew_cast(cudaStream_t st, const cu_ew_arg *a, int32_t out, int32_t in)
{
    if (a->n == 0)
        return cudaSuccess;
    switch (out) {
    case TS_F32: return cast_from<float>(st, a, in);
    case TS_F64: return cast_from<double>(st, a, in);
    case TS_I32: return cast_from<int32_t>(st, a, in);
    case TS_I64: return cast_from<int64_t>(st, a, in);
    case TS_U8: return cast_from<uint8_t>(st, a, in);
    case TS_BF16: return cast_from<bf16_t>(st, a, in);
    case TS_F16: return cast_from<f16_t>(st, a, in);
    }
    return cudaErrorInvalidValue;
}

extern "C" cudaError_t cu_ew_fill(cudaStream_t st, const cu_ew_arg *a, int32_t dtype, double v)
{
    if (a->n == 0)
        return cudaSuccess;
    unsigned b = cu_blocks(a->n, CU_THREADS);
    switch (dtype) {
    case TS_F32: k_fill<float><<<b, CU_THREADS, 0, st>>>(*a, (float)v); break;
    case TS_F64: k_fill<double><<<b, CU_THREADS, 0, st>>>(*a, v); break;
    case TS_I32: k_fill<int32_t><<<b, CU_THREADS, 0, st>>>(*a, conv<int32_t, double>(v)); break;
    case TS_I64: k_fill<int64_t><<<b, CU_THREADS, 0, st>>>(*a, conv<int64_t, double>(v)); break;
    case TS_U8: k_fill<uint8_t><<<b, CU_THREADS, 0, st>>>(*a, (uint8_t)(v != 0)); break;
    case TS_BF16: k_fill<bf16_t><<<b, CU_THREADS, 0, st>>>(*a, narrow16d<bf16_t>(v)); break;
    case TS_F16: k_fill<f16_t><<<b, CU_THREADS, 0, st>>>(*a, narrow16d<f16_t>(v)); break;
    default: return cudaErrorInvalidValue;
    }
    return cu_launched();
}

extern "C" cudaError_t cu_ew_unary(cudaStream_t st, const cu_ew_arg *a, int32_t dtype, int32_t fn)
{
    if (a->n == 0)
        return cudaSuccess;
    unsigned b = cu_blocks(a->n, CU_THREADS);
    switch (dtype) {
    case TS_F32: k_unary<float><<<b, CU_THREADS, 0, st>>>(*a, fn); break;
    case TS_F64: k_unary<double><<<b, CU_THREADS, 0, st>>>(*a, fn); break;
    case TS_I32: k_unary<int32_t><<<b, CU_THREADS, 0, st>>>(*a, fn); break;
    case TS_I64: k_unary<int64_t><<<b, CU_THREADS, 0, st>>>(*a, fn); break;
    case TS_BF16: k_unary<bf16_t><<<b, CU_THREADS, 0, st>>>(*a, fn); break;
    case TS_F16: k_unary<f16_t><<<b, CU_THREADS, 0, st>>>(*a, fn); break;
    default: return cudaErrorInvalidValue;
    }
    return cu_launched();
}

extern "C" cudaError_t cu_ew_binary(cudaStream_t st, const cu_ew_arg *a, int32_t dtype,
                                    int32_t fn, int pos, double s)
{
    if (a->n == 0)
        return cudaSuccess;
    switch (dtype) {
    case TS_F32: return launch_binary<float>(st, a, fn, pos, s);
    case TS_F64: return launch_binary<double>(st, a, fn, pos, s);
    case TS_I32: return launch_binary<int32_t>(st, a, fn, pos, s);
    case TS_I64: return launch_binary<int64_t>(st, a, fn, pos, s);
    case TS_U8: return launch_binary<uint8_t>(st, a, fn, pos, s);
    case TS_BF16: return launch_binary<bf16_t>(st, a, fn, pos, s);
    case TS_F16: return launch_binary<f16_t>(st, a, fn, pos, s);
    }
    return cudaErrorInvalidValue;
}

extern "C" cudaError_t cu_ew_where(cudaStream_t st, const cu_ew_arg *a, int32_t dtype)
{
    if (a->n == 0)
        return cudaSuccess;
    unsigned b = cu_blocks(a->n, CU_THREADS);
    switch (dtype) {
    case TS_F32: k_where<float><<<b, CU_THREADS, 0, st>>>(*a); break;
    case TS_F64: k_where<double><<<b, CU_THREADS, 0, st>>>(*a); break;
    case TS_I32: k_where<int32_t><<<b, CU_THREADS, 0, st>>>(*a); break;
    case TS_I64: k_where<int64_t><<<b, CU_THREADS, 0, st>>>(*a); break;
    case TS_U8: k_where<uint8_t><<<b, CU_THREADS, 0, st>>>(*a); break;
    case TS_BF16: k_where<bf16_t><<<b, CU_THREADS, 0, st>>>(*a); break;
    case TS_F16: k_where<f16_t><<<b, CU_THREADS, 0, st>>>(*a); break;
    default: return cudaErrorInvalidValue;
    }
    return cu_launched();
}

extern "C" cudaError_t cu_ew_find_bad_int(cudaStream_t st, const cu_ew_arg *a, int32_t dtype,
                                          int kind, unsigned long long *flag)
{
    if (a->n == 0)
        return cudaSuccess;
    unsigned b = cu_blocks(a->n, CU_THREADS);
    if (dtype == TS_I32)
        k_find_bad<int32_t><<<b, CU_THREADS, 0, st>>>(*a, kind, flag);
    else if (dtype == TS_I64)
        k_find_bad<int64_t><<<b, CU_THREADS, 0, st>>>(*a, kind, flag);
    else
        return cudaErrorInvalidValue;
    return cu_launched();
}

extern "C" cudaError_t cu_fill_pattern(cudaStream_t st, void *dst, size_t nbytes, uint64_t pat,
                                       int size)
{
    if (nbytes == 0)
        return cudaSuccess;
    int64_t n = (int64_t)(nbytes / (size_t)size);
    unsigned b = cu_blocks(n, CU_THREADS);
    switch (size) {
    case 1: k_pattern<uint8_t><<<b, CU_THREADS, 0, st>>>((uint8_t *)dst, n, (uint8_t)pat); break;
    case 2: k_pattern<uint16_t><<<b, CU_THREADS, 0, st>>>((uint16_t *)dst, n, (uint16_t)pat); break;
    case 4: k_pattern<uint32_t><<<b, CU_THREADS, 0, st>>>((uint32_t *)dst, n, (uint32_t)pat); break;
    case 8: k_pattern<uint64_t><<<b, CU_THREADS, 0, st>>>((uint64_t *)dst, n, pat); break;
    default: return cudaErrorInvalidValue;
    }
    return cu_launched();
}
