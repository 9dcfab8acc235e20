/* tests/plugins/test-cuda.c: the cuda plugin against the CPU. Every op of the plugin ABI runs
 * on the device under test (cuda, or the plugin named by $TS_GPU_TEST_DEVICE, so that this
 * harness can itself be checked on a host plugin) with strided, transposed, offset and
 * broadcast operands, and on cpu_blas in float64 from the same values; outputs must agree to
 * float32 accuracy and no byte between strided elements may change. Error paths (integer
 * division by zero, out-of-range indices and targets) must fail alike. Also: large copies
 * through the pinned staging ring, and a small CNN whose steady-state training steps make no
 * raw (cudaMalloc) allocation.
 *
 * Without a GPU every test SKIPs (exit 77 when run alone), saying why; a plugin that is built
 * but does not load (undefined symbol, bad ABI) fails instead. */
#include "kt.h"

#include <math.h>
#include <time.h>

static const char *dut_name(void)
{
    const char *n = getenv("TS_GPU_TEST_DEVICE");
    return n && *n ? n : "cuda";
}

static ts_device *dut_dev;

static void unload_dut(void)
{
    ts_device_unload(dut_dev);
    dut_dev = NULL;
}

/* The device under test (loaded once, unloaded at exit), or a SKIP saying why there is none. */
static ts_device *load_dut(void)
{
    if (dut_dev)
        return dut_dev;
    const char *name = dut_name();
    char *path;
    if (ts_plugin_find(NULL, name, &path) != TS_OK)
        SKIP("the %s plugin is not built", name);
    free(path);
    ts_status s = ts_device_load(NULL, name, &dut_dev);
    if (s == TS_ENODEV)
        SKIP("no GPU: %s", ts_last_error());
    CHECK_MSG(s == TS_OK, "loading %s: %s", name, ts_last_error());
    atexit(unload_dut);
    return dut_dev;
}

/* ---------------------------------------------------------------------------------------- */
/* One op on the device under test and on cpu_blas (float64), compared.                     */

enum { K_RANDOM = 0, K_INDEX = 1 };

typedef struct spec {
    int32_t dtype;
    int ndim;
    int64_t shape[TS_MAX_DIMS];
    int layout;
    int kind;        /* K_RANDOM, or K_INDEX: integers in [0, hi) */
    int64_t hi;
    int bcast_ndim;  /* > 0: the operand is viewed broadcast to bcast_shape */
    int64_t bcast_shape[TS_MAX_DIMS];
} spec;

#define MAXOPS 5

typedef struct opcase {
    const char *name;
    int32_t op;
    const void *params;
    size_t params_size;
    int nin, nout;
    spec in[MAXOPS], out[MAXOPS];
    ts_status expect; /* TS_OK, or the status both backends must return */
} opcase;

static uint64_t seed_counter = 1;

static void fill_index(kt_buf *b, int64_t hi)
{
    int64_t n = kt_numel(&b->op), idx[TS_MAX_DIMS];
    uint64_t s = seed_counter++ * 2654435761u;
    for (int64_t i = 0; i < n; i++) {
        kt_unravel(&b->op, i, idx);
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        kt_set(&b->op, idx, (double)((s >> 33) % (uint64_t)hi));
    }
}

/* A host buffer per spec (the values both backends get). */
static kt_buf make_host(ts_device *host, const spec *sp)
{
    kt_buf b = kt_make(host, sp->dtype, sp->ndim, sp->shape, (kt_layout)sp->layout,
                       seed_counter++);
    if (sp->kind == K_INDEX)
        fill_index(&b, sp->hi);
    return b;
}

/* The same values in float64 when b is float32 (the reference's precision); else a copy. */
static kt_buf widen(ts_device *host, const kt_buf *b)
{
    int32_t dt = b->op.dtype == TS_F32 ? TS_F64 : b->op.dtype;
    kt_buf w = kt_make(host, dt, b->op.ndim, b->op.shape, KT_CONTIG, 0);
    int64_t n = kt_numel(&b->op), idx[TS_MAX_DIMS];
    for (int64_t i = 0; i < n; i++) {
        kt_unravel(&b->op, i, idx);
        kt_set(&w.op, idx, kt_get(&b->op, idx));
    }
    return w;
}

static ts_operand view(const kt_buf *b, const spec *sp)
{
    return sp->bcast_ndim ? kt_broadcast(&b->op, sp->bcast_ndim, sp->bcast_shape) : b->op;
}

static void run_case(ts_device *dut, ts_device *host, const opcase *c)
{
    kt_buf hin[MAXOPS], hout[MAXOPS], rin[MAXOPS], rout[MAXOPS], din[MAXOPS], dout[MAXOPS];
    ts_operand ri[MAXOPS], ro[MAXOPS], di[MAXOPS], dov[MAXOPS];
    for (int i = 0; i < c->nin; i++) {
        hin[i] = make_host(host, &c->in[i]);
        rin[i] = widen(host, &hin[i]);
        din[i] = kt_mirror(dut, &hin[i]);
        ri[i] = view(&rin[i], &c->in[i]);
        di[i] = view(&din[i], &c->in[i]);
    }
    for (int i = 0; i < c->nout; i++) {
        hout[i] = make_host(host, &c->out[i]);
        rout[i] = widen(host, &hout[i]);
        dout[i] = kt_mirror(dut, &hout[i]);
        ro[i] = rout[i].op;
        dov[i] = dout[i].op;
    }
    ts_status rs = kt_run(host, c->op, ri, c->nin, ro, c->nout, c->params, c->params_size);
    char rmsg[512];
    snprintf(rmsg, sizeof rmsg, "%s", ts_last_error());
    ts_status ds = kt_run(dut, c->op, di, c->nin, dov, c->nout, c->params, c->params_size);
    CHECK_MSG(rs == c->expect, "%s: the cpu_blas reference returned %s (%s), expected %s",
              c->name, ts_status_name(rs), rmsg, ts_status_name(c->expect));
    CHECK_MSG(ds == c->expect, "%s: %s returned %s (%s), expected %s", c->name, dut_name(),
              ts_status_name(ds), ts_last_error(), ts_status_name(c->expect));
    CHECK_OK(ts_device_synchronize(dut));
    for (int i = 0; i < c->nout; i++) {
        kt_fetch(&hout[i], &dout[i]);
        kt_check_gaps(&hout[i]);
        if (c->expect != TS_OK)
            continue;
        int32_t dt = hout[i].op.dtype;
        double rtol = dt == TS_F32 ? 1e-4 : dt == TS_F64 ? 1e-10 : 0;
        double atol = dt == TS_F32 ? 1e-4 : dt == TS_F64 ? 1e-10 : 0;
        int64_t n = kt_numel(&hout[i].op), idx[TS_MAX_DIMS];
        for (int64_t e = 0; e < n; e++) {
            kt_unravel(&hout[i].op, e, idx);
            double got = kt_get(&hout[i].op, idx), want = kt_get(&rout[i].op, idx);
            if (dt == TS_F32)
                want = (double)(float)want;
            CHECK_MSG(kt_close(got, want, rtol, atol),
                      "%s: output %d element %lld: %s gives %.9g, cpu_blas (float64) %.9g",
                      c->name, i, (long long)e, dut_name(), got, want);
        }
    }
    for (int i = 0; i < c->nin; i++) {
        kt_free(&din[i]);
        kt_free(&rin[i]);
        kt_free(&hin[i]);
    }
    for (int i = 0; i < c->nout; i++) {
        kt_free(&dout[i]);
        kt_free(&rout[i]);
        kt_free(&hout[i]);
    }
}

/* Shorthands for specs. */
#define SP(dt, lay, ...)                                                                    \
    {                                                                                       \
        .dtype = (dt), .ndim = (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)),   \
        .shape = {__VA_ARGS__}, .layout = (lay)                                             \
    }
#define SPI(dt, hi_, ...)                                                                   \
    {                                                                                       \
        .dtype = (dt), .ndim = (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)),   \
        .shape = {__VA_ARGS__}, .layout = KT_STRIDED, .kind = K_INDEX, .hi = (hi_)          \
    }

static void run_all(const opcase *cases, size_t n)
{
    ts_device *dut = load_dut();
    ts_device *host = kt_load("cpu_blas");
    for (size_t i = 0; i < n; i++)
        run_case(dut, host, &cases[i]);
    kt_check_no_live_blocks(dut);
    kt_check_no_live_blocks(host);
}

/* ---------------------------------------------------------------------------------------- */

static void test_loads_or_skips(void)
{
    ts_device *dut = load_dut();
    ts_device_info info;
    CHECK_OK(ts_device_info_get(dut, &info));
    CHECK(info.count >= 1);
    printf("# %s: %s, %.1f GiB\n", dut_name(), info.name,
           (double)info.total_bytes / (1u << 30));
    CHECK(ts_device_supports(dut, TS_OP_MATMUL, TS_F32));
    CHECK(ts_device_supports(dut, TS_OP_CONV2D_BWD_WEIGHT, TS_F32));
    CHECK(ts_device_supports(dut, TS_OP_ADAM_STEP, TS_F32));
    CHECK(!ts_device_supports(dut, TS_OP_UNARY, TS_U8));
}

static void test_elementwise(void)
{
    static const ts_fill_params fill = {1.5}, fill_i = {-3.7};
    static ts_unary_params un[TS_UNARY_COUNT]; /* every function of the op table */
    static ts_binary_params bin[TS_BINARY_COUNT];
    for (int f = 0; f < TS_UNARY_COUNT; f++)
        un[f].fn = f;
    for (int f = 0; f < TS_BINARY_COUNT; f++)
        bin[f].fn = f;
    static const ts_scalar_params sc1 = {TS_BINARY_SUB, 1, 0.75}, sc2 = {TS_BINARY_POW, 0, 2.0},
                                  sc3 = {TS_BINARY_DIV, 0, 0.4};
    opcase cases[80];
    size_t n = 0;
    cases[n++] = (opcase){"copy transposed", TS_OP_COPY, NULL, 0, 1, 1,
                          {SP(TS_F32, KT_TRANSPOSED, 5, 7)}, {SP(TS_F32, KT_STRIDED, 5, 7)}, 0};
    cases[n++] = (opcase){"cast f32->i32", TS_OP_CAST, NULL, 0, 1, 1,
                          {SP(TS_F32, KT_STRIDED, 4, 6)}, {SP(TS_I32, KT_CONTIG, 4, 6)}, 0};
    cases[n++] = (opcase){"cast f32->u8", TS_OP_CAST, NULL, 0, 1, 1,
                          {SP(TS_F32, KT_OFFSET, 4, 6)}, {SP(TS_U8, KT_CONTIG, 4, 6)}, 0};
    cases[n++] = (opcase){"cast i64->f64", TS_OP_CAST, NULL, 0, 1, 1,
                          {SP(TS_I64, KT_TRANSPOSED, 3, 9)}, {SP(TS_F64, KT_CONTIG, 3, 9)}, 0};
    cases[n++] = (opcase){"cast u8->i64", TS_OP_CAST, NULL, 0, 1, 1,
                          {SP(TS_U8, KT_CONTIG, 17)}, {SP(TS_I64, KT_STRIDED, 17)}, 0};
    cases[n++] = (opcase){"fill f32", TS_OP_FILL, &fill, sizeof fill, 0, 1, {{0}},
                          {SP(TS_F32, KT_STRIDED, 3, 4, 5)}, 0};
    cases[n++] = (opcase){"fill i32", TS_OP_FILL, &fill_i, sizeof fill_i, 0, 1, {{0}},
                          {SP(TS_I32, KT_OFFSET, 33)}, 0};
    for (int f = 0; f < TS_UNARY_COUNT; f++) {
        cases[n++] = (opcase){"unary f32", TS_OP_UNARY, &un[f], sizeof un[f], 1, 1,
                              {SP(TS_F32, KT_TRANSPOSED, 6, 5)}, {SP(TS_F32, KT_STRIDED, 6, 5)}, 0};
        cases[n++] = (opcase){"unary f64", TS_OP_UNARY, &un[f], sizeof un[f], 1, 1,
                              {SP(TS_F64, KT_CONTIG, 40)}, {SP(TS_F64, KT_OFFSET, 40)}, 0};
    }
    cases[n++] = (opcase){"unary i32 abs", TS_OP_UNARY, &un[TS_UNARY_ABS], sizeof un[0], 1, 1,
                          {SP(TS_I32, KT_STRIDED, 20)}, {SP(TS_I32, KT_CONTIG, 20)}, 0};
    cases[n++] = (opcase){"unary i32 exp", TS_OP_UNARY, &un[TS_UNARY_EXP], sizeof un[0], 1, 1,
                          {SP(TS_I32, KT_CONTIG, 4)}, {SP(TS_I32, KT_CONTIG, 4)}, TS_ENOTSUP};
    for (int f = 0; f < TS_BINARY_COUNT; f++) {
        int cmp = f >= TS_BINARY_EQ;
        opcase b = {"binary f32 broadcast", TS_OP_BINARY, &bin[f], sizeof bin[f], 2, 1,
                    {SP(TS_F32, KT_TRANSPOSED, 4, 5), SP(TS_F32, KT_STRIDED, 1, 5)},
                    {SP(cmp ? TS_U8 : TS_F32, KT_CONTIG, 4, 5)}, 0};
        b.in[1].bcast_ndim = 2;
        b.in[1].bcast_shape[0] = 4;
        b.in[1].bcast_shape[1] = 5;
        cases[n++] = b;
    }
    cases[n++] = (opcase){"binary i32 add", TS_OP_BINARY, &bin[TS_BINARY_ADD], sizeof bin[0], 2,
                          1, {SP(TS_I32, KT_STRIDED, 30), SP(TS_I32, KT_CONTIG, 30)},
                          {SP(TS_I32, KT_OFFSET, 30)}, 0};
    cases[n++] = (opcase){"binary i64 div by zero", TS_OP_BINARY, &bin[TS_BINARY_DIV],
                          sizeof bin[0], 2, 1, {SP(TS_I64, KT_CONTIG, 30), SPI(TS_I64, 7, 30)},
                          {SP(TS_I64, KT_CONTIG, 30)}, TS_EINVAL}; /* [0, 7) holds zeros */
    cases[n++] = (opcase){"binary i32 pow", TS_OP_BINARY, &bin[TS_BINARY_POW], sizeof bin[0], 2,
                          1, {SP(TS_I32, KT_CONTIG, 30), SPI(TS_I32, 5, 30)},
                          {SP(TS_I32, KT_CONTIG, 30)}, 0};
    cases[n++] = (opcase){"binary i32 pow negative", TS_OP_BINARY, &bin[TS_BINARY_POW],
                          sizeof bin[0], 2, 1, {SP(TS_I32, KT_CONTIG, 30), SP(TS_I32, KT_CONTIG, 30)},
                          {SP(TS_I32, KT_CONTIG, 30)}, TS_EINVAL};
    cases[n++] = (opcase){"scalar first sub", TS_OP_BINARY_SCALAR, &sc1, sizeof sc1, 1, 1,
                          {SP(TS_F32, KT_STRIDED, 3, 7)}, {SP(TS_F32, KT_CONTIG, 3, 7)}, 0};
    cases[n++] = (opcase){"scalar pow", TS_OP_BINARY_SCALAR, &sc2, sizeof sc2, 1, 1,
                          {SP(TS_F64, KT_TRANSPOSED, 3, 7)}, {SP(TS_F64, KT_CONTIG, 3, 7)}, 0};
    cases[n++] = (opcase){"scalar int div by 0.4", TS_OP_BINARY_SCALAR, &sc3, sizeof sc3, 1, 1,
                          {SP(TS_I32, KT_CONTIG, 5)}, {SP(TS_I32, KT_CONTIG, 5)}, TS_EINVAL};
    cases[n++] = (opcase){"where", TS_OP_WHERE, NULL, 0, 3, 1,
                          {SP(TS_U8, KT_STRIDED, 6, 7), SP(TS_F32, KT_TRANSPOSED, 6, 7),
                           SP(TS_F32, KT_OFFSET, 6, 7)},
                          {SP(TS_F32, KT_CONTIG, 6, 7)}, 0};
    run_all(cases, n);
}

static void test_reduce(void)
{
    static const ts_reduce_params sum = {TS_REDUCE_SUM, 0}, mean = {TS_REDUCE_MEAN, 0},
                                  mx = {TS_REDUCE_MAX, 0}, mn = {TS_REDUCE_MIN, 0},
                                  amax = {TS_REDUCE_ARGMAX, 1}, amin = {TS_REDUCE_ARGMIN, -1};
    static const ts_dim_params d1 = {1}, d0 = {0};
    opcase cases[] = {
        {"sum dims 0,2", TS_OP_REDUCE, &sum, sizeof sum, 1, 1, {SP(TS_F32, KT_STRIDED, 5, 6, 7)},
         {SP(TS_F32, KT_CONTIG, 1, 6, 1)}, 0},
        {"mean dim 1", TS_OP_REDUCE, &mean, sizeof mean, 1, 1,
         {SP(TS_F32, KT_TRANSPOSED, 5, 300)}, {SP(TS_F32, KT_STRIDED, 5, 1)}, 0},
        {"max dim 0", TS_OP_REDUCE, &mx, sizeof mx, 1, 1, {SP(TS_F64, KT_OFFSET, 40, 3)},
         {SP(TS_F64, KT_CONTIG, 1, 3)}, 0},
        {"min all", TS_OP_REDUCE, &mn, sizeof mn, 1, 1, {SP(TS_F32, KT_CONTIG, 9, 11)},
         {SP(TS_F32, KT_CONTIG, 1, 1)}, 0},
        {"sum all, split slices", TS_OP_REDUCE, &sum, sizeof sum, 1, 1,
         {SP(TS_F32, KT_STRIDED, 300001)}, {SP(TS_F32, KT_CONTIG, 1)}, 0},
        {"argmax dim 1", TS_OP_REDUCE, &amax, sizeof amax, 1, 1,
         {SP(TS_F32, KT_TRANSPOSED, 7, 33)}, {SP(TS_I64, KT_CONTIG, 7, 1)}, 0},
        {"argmin last, split", TS_OP_REDUCE, &amin, sizeof amin, 1, 1,
         {SP(TS_I32, KT_CONTIG, 2, 70000)}, {SP(TS_I64, KT_CONTIG, 2, 1)}, 0},
        {"int sum", TS_OP_REDUCE, &sum, sizeof sum, 1, 1, {SP(TS_I64, KT_STRIDED, 6, 50)},
         {SP(TS_I64, KT_CONTIG, 6, 1)}, 0},
        {"int max", TS_OP_REDUCE, &mx, sizeof mx, 1, 1, {SP(TS_I32, KT_CONTIG, 6, 50)},
         {SP(TS_I32, KT_CONTIG, 1, 50)}, 0},
        {"softmax dim 1", TS_OP_SOFTMAX, &d1, sizeof d1, 1, 1,
         {SP(TS_F32, KT_TRANSPOSED, 6, 1000)}, {SP(TS_F32, KT_CONTIG, 6, 1000)}, 0},
        {"softmax dim 0", TS_OP_SOFTMAX, &d0, sizeof d0, 1, 1, {SP(TS_F64, KT_STRIDED, 9, 4)},
         {SP(TS_F64, KT_OFFSET, 9, 4)}, 0},
        {"log_softmax", TS_OP_LOG_SOFTMAX, &d1, sizeof d1, 1, 1,
         {SP(TS_F32, KT_OFFSET, 3, 4, 10)}, {SP(TS_F32, KT_STRIDED, 3, 4, 10)}, 0},
    };
    run_all(cases, sizeof cases / sizeof cases[0]);
}

static void test_index_loss(void)
{
    static const ts_dim_params d0 = {0}, d1 = {1};
    opcase cases[] = {
        {"index_select dim 0", TS_OP_INDEX_SELECT, &d0, sizeof d0, 2, 1,
         {SP(TS_F32, KT_TRANSPOSED, 9, 5), SPI(TS_I64, 9, 12)}, {SP(TS_F32, KT_STRIDED, 12, 5)}, 0},
        {"index_select dim 1 i32", TS_OP_INDEX_SELECT, &d1, sizeof d1, 2, 1,
         {SP(TS_I32, KT_CONTIG, 4, 9), SPI(TS_I32, 9, 3)}, {SP(TS_I32, KT_CONTIG, 4, 3)}, 0},
        {"index_select out of range", TS_OP_INDEX_SELECT, &d0, sizeof d0, 2, 1,
         {SP(TS_F32, KT_CONTIG, 3, 5), SPI(TS_I64, 4, 40)}, {SP(TS_F32, KT_CONTIG, 40, 5)},
         TS_EINVAL},
        {"index_add duplicates", TS_OP_INDEX_ADD, &d0, sizeof d0, 2, 1,
         {SP(TS_F32, KT_STRIDED, 50, 6), SPI(TS_I64, 4, 50)}, {SP(TS_F32, KT_TRANSPOSED, 4, 6)}, 0},
        {"index_add f64 dim 1", TS_OP_INDEX_ADD, &d1, sizeof d1, 2, 1,
         {SP(TS_F64, KT_CONTIG, 3, 20), SPI(TS_I32, 5, 20)}, {SP(TS_F64, KT_OFFSET, 3, 5)}, 0},
        {"index_add u8", TS_OP_INDEX_ADD, &d0, sizeof d0, 2, 1,
         {SP(TS_U8, KT_CONTIG, 30, 3), SPI(TS_I64, 3, 30)}, {SP(TS_U8, KT_STRIDED, 3, 3)}, 0},
        {"index_add i64", TS_OP_INDEX_ADD, &d0, sizeof d0, 2, 1,
         {SP(TS_I64, KT_CONTIG, 30, 3), SPI(TS_I64, 3, 30)}, {SP(TS_I64, KT_CONTIG, 3, 3)}, 0},
        {"cross_entropy", TS_OP_CROSS_ENTROPY, NULL, 0, 2, 1,
         {SP(TS_F32, KT_TRANSPOSED, 33, 10), SPI(TS_I64, 10, 33)}, {SP(TS_F32, KT_STRIDED, 33)}, 0},
        {"cross_entropy wide f64", TS_OP_CROSS_ENTROPY, NULL, 0, 2, 1,
         {SP(TS_F64, KT_CONTIG, 3, 1000), SPI(TS_I32, 1000, 3)}, {SP(TS_F64, KT_CONTIG, 3)}, 0},
        {"cross_entropy bad target", TS_OP_CROSS_ENTROPY, NULL, 0, 2, 1,
         {SP(TS_F32, KT_CONTIG, 40, 3), SPI(TS_I64, 4, 40)}, {SP(TS_F32, KT_CONTIG, 40)}, TS_EINVAL},
        {"cross_entropy_bwd", TS_OP_CROSS_ENTROPY_BWD, NULL, 0, 3, 1,
         {SP(TS_F32, KT_CONTIG, 17, 10), SPI(TS_I64, 10, 17), SP(TS_F32, KT_STRIDED, 17)},
         {SP(TS_F32, KT_TRANSPOSED, 17, 10)}, 0},
    };
    run_all(cases, sizeof cases / sizeof cases[0]);
}

static void test_pool(void)
{
    static const ts_pool2d_params p2 = {2, 2, 2, 2, 0, 0, 0}, p3 = {3, 3, 2, 2, 1, 1, 0},
                                  p3i = {3, 3, 1, 1, 1, 1, 1};
    opcase cases[] = {
        {"maxpool 2x2 with indices", TS_OP_MAXPOOL2D, &p2, sizeof p2, 1, 2,
         {SP(TS_F32, KT_STRIDED, 2, 3, 8, 8)},
         {SP(TS_F32, KT_CONTIG, 2, 3, 4, 4), SP(TS_I64, KT_CONTIG, 2, 3, 4, 4)}, 0},
        {"maxpool 3x3 pad", TS_OP_MAXPOOL2D, &p3, sizeof p3, 1, 1,
         {SP(TS_F64, KT_TRANSPOSED, 2, 2, 7, 9)}, {SP(TS_F64, KT_OFFSET, 2, 2, 4, 5)}, 0},
        {"avgpool exclude pad", TS_OP_AVGPOOL2D, &p3, sizeof p3, 1, 1,
         {SP(TS_F32, KT_CONTIG, 2, 2, 7, 9)}, {SP(TS_F32, KT_STRIDED, 2, 2, 4, 5)}, 0},
        {"avgpool include pad", TS_OP_AVGPOOL2D, &p3i, sizeof p3i, 1, 1,
         {SP(TS_F32, KT_CONTIG, 1, 3, 6, 5)}, {SP(TS_F32, KT_CONTIG, 1, 3, 6, 5)}, 0},
        {"maxpool_bwd", TS_OP_MAXPOOL2D_BWD, &p2, sizeof p2, 2, 1,
         {SP(TS_F32, KT_TRANSPOSED, 2, 3, 4, 4), SPI(TS_I64, 64, 2, 3, 4, 4)},
         {SP(TS_F32, KT_STRIDED, 2, 3, 8, 8)}, 0},
        {"maxpool_bwd bad index", TS_OP_MAXPOOL2D_BWD, &p2, sizeof p2, 2, 1,
         {SP(TS_F32, KT_CONTIG, 1, 1, 4, 4), SPI(TS_I64, 100, 1, 1, 4, 4)},
         {SP(TS_F32, KT_CONTIG, 1, 1, 8, 8)}, TS_EINVAL},
        {"avgpool_bwd", TS_OP_AVGPOOL2D_BWD, &p3, sizeof p3, 1, 1,
         {SP(TS_F32, KT_STRIDED, 2, 2, 4, 5)}, {SP(TS_F32, KT_TRANSPOSED, 2, 2, 7, 9)}, 0},
        {"avgpool_bwd include pad", TS_OP_AVGPOOL2D_BWD, &p3i, sizeof p3i, 1, 1,
         {SP(TS_F64, KT_CONTIG, 1, 3, 6, 5)}, {SP(TS_F64, KT_OFFSET, 1, 3, 6, 5)}, 0},
    };
    run_all(cases, sizeof cases / sizeof cases[0]);
}

static void test_conv(void)
{
    static const ts_conv2d_params pa = {1, 1, 2, 2, 1, 1, 1}, pb = {2, 1, 1, 0, 1, 2, 2};
    opcase cases[] = {
        {"conv2d lenet conv1 + bias", TS_OP_CONV2D, &pa, sizeof pa, 3, 1,
         {SP(TS_F32, KT_CONTIG, 3, 1, 12, 12), SP(TS_F32, KT_CONTIG, 6, 1, 5, 5),
          SP(TS_F32, KT_STRIDED, 6)},
         {SP(TS_F32, KT_CONTIG, 3, 6, 12, 12)}, 0},
        {"conv2d strided groups dilation", TS_OP_CONV2D, &pb, sizeof pb, 2, 1,
         {SP(TS_F32, KT_TRANSPOSED, 2, 4, 9, 10), SP(TS_F32, KT_STRIDED, 6, 2, 3, 3)},
         {SP(TS_F32, KT_STRIDED, 2, 6, 5, 6)}, 0},
        {"conv2d f64", TS_OP_CONV2D, &pb, sizeof pb, 3, 1,
         {SP(TS_F64, KT_OFFSET, 2, 4, 9, 10), SP(TS_F64, KT_CONTIG, 6, 2, 3, 3),
          SP(TS_F64, KT_CONTIG, 6)},
         {SP(TS_F64, KT_CONTIG, 2, 6, 5, 6)}, 0},
        {"conv2d_bwd_data", TS_OP_CONV2D_BWD_DATA, &pa, sizeof pa, 2, 1,
         {SP(TS_F32, KT_STRIDED, 3, 6, 12, 12), SP(TS_F32, KT_TRANSPOSED, 6, 1, 5, 5)},
         {SP(TS_F32, KT_OFFSET, 3, 1, 12, 12)}, 0},
        {"conv2d_bwd_data groups", TS_OP_CONV2D_BWD_DATA, &pb, sizeof pb, 2, 1,
         {SP(TS_F32, KT_CONTIG, 2, 6, 5, 6), SP(TS_F32, KT_CONTIG, 6, 2, 3, 3)},
         {SP(TS_F32, KT_STRIDED, 2, 4, 9, 10)}, 0},
        {"conv2d_bwd_weight", TS_OP_CONV2D_BWD_WEIGHT, &pa, sizeof pa, 2, 1,
         {SP(TS_F32, KT_CONTIG, 3, 6, 12, 12), SP(TS_F32, KT_TRANSPOSED, 3, 1, 12, 12)},
         {SP(TS_F32, KT_CONTIG, 6, 1, 5, 5)}, 0},
        {"conv2d_bwd_weight groups strided gw", TS_OP_CONV2D_BWD_WEIGHT, &pb, sizeof pb, 2, 1,
         {SP(TS_F32, KT_STRIDED, 2, 6, 5, 6), SP(TS_F32, KT_CONTIG, 2, 4, 9, 10)},
         {SP(TS_F32, KT_STRIDED, 6, 2, 3, 3)}, 0},
    };
    run_all(cases, sizeof cases / sizeof cases[0]);
}

static void test_matmul(void)
{
    static const ts_matmul_params p1 = {1.0, 0.0}, p2 = {0.5, 2.0};
    opcase cases[] = {
        {"matmul contig", TS_OP_MATMUL, &p1, sizeof p1, 2, 1,
         {SP(TS_F32, KT_CONTIG, 64, 96), SP(TS_F32, KT_CONTIG, 96, 80)},
         {SP(TS_F32, KT_CONTIG, 64, 80)}, 0},
        {"matmul transposed a, c", TS_OP_MATMUL, &p2, sizeof p2, 2, 1,
         {SP(TS_F32, KT_TRANSPOSED, 13, 17), SP(TS_F32, KT_CONTIG, 17, 9)},
         {SP(TS_F32, KT_TRANSPOSED, 13, 9)}, 0},
        {"matmul strided (packed)", TS_OP_MATMUL, &p2, sizeof p2, 2, 1,
         {SP(TS_F32, KT_STRIDED, 7, 5), SP(TS_F32, KT_STRIDED, 5, 6)},
         {SP(TS_F32, KT_STRIDED, 7, 6)}, 0},
        {"matmul batched", TS_OP_MATMUL, &p1, sizeof p1, 2, 1,
         {SP(TS_F32, KT_OFFSET, 2, 3, 5, 7), SP(TS_F32, KT_TRANSPOSED, 2, 3, 7, 4)},
         {SP(TS_F32, KT_CONTIG, 2, 3, 5, 4)}, 0},
        {"matmul f64 vector", TS_OP_MATMUL, &p2, sizeof p2, 2, 1,
         {SP(TS_F64, KT_CONTIG, 1, 9), SP(TS_F64, KT_STRIDED, 9, 1)},
         {SP(TS_F64, KT_CONTIG, 1, 1)}, 0},
        {"matmul K = 0", TS_OP_MATMUL, &p2, sizeof p2, 2, 1,
         {SP(TS_F32, KT_CONTIG, 2, 3, 0), SP(TS_F32, KT_CONTIG, 2, 0, 4)},
         {SP(TS_F32, KT_STRIDED, 2, 3, 4)}, 0},
    };
    /* A broadcast batch: b (1, 7, 4) seen as (3, 7, 4) with batch stride 0. */
    opcase bc = {"matmul broadcast batch", TS_OP_MATMUL, &p1, sizeof p1, 2, 1,
                 {SP(TS_F32, KT_CONTIG, 3, 5, 7), SP(TS_F32, KT_CONTIG, 1, 7, 4)},
                 {SP(TS_F32, KT_CONTIG, 3, 5, 4)}, 0};
    bc.in[1].bcast_ndim = 3;
    bc.in[1].bcast_shape[0] = 3;
    bc.in[1].bcast_shape[1] = 7;
    bc.in[1].bcast_shape[2] = 4;
    run_all(cases, sizeof cases / sizeof cases[0]);
    run_all(&bc, 1);
}

static void test_optim(void)
{
    static const ts_sgd_params sgd = {0.1, 0.9, 0.0, 1e-4, 1, 0};
    static const ts_adam_params adam = {1e-3, 0.9, 0.999, 1e-8, 0.01, 0, 3},
                                adamw = {1e-3, 0.9, 0.999, 1e-8, 0.01, 1, 1};
    opcase cases[] = {
        {"sgd nesterov", TS_OP_SGD_STEP, &sgd, sizeof sgd, 1, 2, {SP(TS_F32, KT_CONTIG, 1000)},
         {SP(TS_F32, KT_CONTIG, 1000), SP(TS_F32, KT_CONTIG, 1000)}, 0},
        {"adam", TS_OP_ADAM_STEP, &adam, sizeof adam, 1, 3, {SP(TS_F32, KT_CONTIG, 3, 333)},
         {SP(TS_F32, KT_CONTIG, 3, 333), SP(TS_F32, KT_CONTIG, 3, 333),
          SP(TS_F32, KT_CONTIG, 3, 333)}, 0},
        {"adamw f64", TS_OP_ADAM_STEP, &adamw, sizeof adamw, 1, 3, {SP(TS_F64, KT_CONTIG, 77)},
         {SP(TS_F64, KT_CONTIG, 77), SP(TS_F64, KT_CONTIG, 77), SP(TS_F64, KT_CONTIG, 77)}, 0},
    };
    /* The second moments start from random values in [-2, 2) on both sides alike; where the
     * update takes sqrt of a negative, both give NaN, which kt_close accepts as equal. */
    run_all(cases, sizeof cases / sizeof cases[0]);
}

/* Fused layer norm each way (contiguous, the ABI promises it), with and without the affine
 * parameters, over one and two trailing dims, float32 and float64. */
static void test_layer_norm(void)
{
    static const ts_layer_norm_params p1 = {1e-5, 1}, p2 = {1e-5, 2};
    opcase cases[] = {
        {"layer_norm affine", TS_OP_LAYER_NORM, &p1, sizeof p1, 3, 3,
         {SP(TS_F32, KT_CONTIG, 37, 300), SP(TS_F32, KT_CONTIG, 300),
          SP(TS_F32, KT_CONTIG, 300)},
         {SP(TS_F32, KT_CONTIG, 37, 300), SP(TS_F32, KT_CONTIG, 37), SP(TS_F32, KT_CONTIG, 37)},
         0},
        {"layer_norm f64 2 dims", TS_OP_LAYER_NORM, &p2, sizeof p2, 1, 3,
         {SP(TS_F64, KT_CONTIG, 3, 5, 7)},
         {SP(TS_F64, KT_CONTIG, 3, 5, 7), SP(TS_F64, KT_CONTIG, 3), SP(TS_F64, KT_CONTIG, 3)},
         0},
        {"layer_norm_bwd affine", TS_OP_LAYER_NORM_BWD, &p1, sizeof p1, 5, 3,
         {SP(TS_F32, KT_CONTIG, 37, 300), SP(TS_F32, KT_CONTIG, 37, 300),
          SP(TS_F32, KT_CONTIG, 37), SP(TS_F32, KT_CONTIG, 37), SP(TS_F32, KT_CONTIG, 300)},
         {SP(TS_F32, KT_CONTIG, 37, 300), SP(TS_F32, KT_CONTIG, 300),
          SP(TS_F32, KT_CONTIG, 300)},
         0},
        {"layer_norm_bwd f64", TS_OP_LAYER_NORM_BWD, &p1, sizeof p1, 4, 1,
         {SP(TS_F64, KT_CONTIG, 4, 33), SP(TS_F64, KT_CONTIG, 4, 33), SP(TS_F64, KT_CONTIG, 4),
          SP(TS_F64, KT_CONTIG, 4)},
         {SP(TS_F64, KT_CONTIG, 4, 33)}, 0},
    };
    run_all(cases, sizeof cases / sizeof cases[0]);
}

/* Host <-> device copies larger than the staging ring (4 x 4 MiB), odd sizes, and d2d. */
static void test_copies(void)
{
    ts_device *dut = load_dut();
    size_t n = (size_t)37 << 20 | 123;
    unsigned char *a = malloc(n), *b = malloc(n);
    CHECK(a && b);
    for (size_t i = 0; i < n; i++)
        a[i] = (unsigned char)(i * 2654435761u >> 13);
    void *d1, *d2;
    CHECK_OK(ts_device_alloc(dut, n, "test", &d1));
    CHECK_OK(ts_device_alloc(dut, n, "test", &d2));
    CHECK_OK(ts_device_copy_from_host(dut, d1, a, n));
    memset(a, 0, 1000); /* the call consumed a: changing it now must not matter */
    /* Device to device through the copy kernel, as one n-byte uint8 vector. */
    ts_operand src = {.data = d1, .dtype = TS_U8, .ndim = 1, .shape = {(int64_t)n}, .strides = {1}};
    ts_operand dst = src;
    dst.data = d2;
    CHECK_OK(kt_run(dut, TS_OP_COPY, &src, 1, &dst, 1, NULL, 0));
    CHECK_OK(ts_device_copy_to_host(dut, b, d2, n));
    for (size_t i = 1000; i < n; i++)
        CHECK_MSG(a[i] == b[i], "byte %zu differs after the round trip", i);
    for (size_t i = 0; i < 1000; i++)
        CHECK_MSG(b[i] == (unsigned char)(i * 2654435761u >> 13), "byte %zu differs", i);
    /* Small copies interleaved, each landing at an offset. */
    for (int k = 0; k < 20; k++) {
        unsigned char small[100];
        memset(small, k, sizeof small);
        CHECK_OK(ts_device_copy_from_host(dut, (char *)d2 + k * 100, small, sizeof small));
    }
    unsigned char back[2000];
    CHECK_OK(ts_device_copy_to_host(dut, back, d2, sizeof back));
    for (int i = 0; i < 2000; i++)
        CHECK_INT_EQ(back[i], i / 100);
    ts_device_free(dut, d1);
    ts_device_free(dut, d2);
    free(a);
    free(b);
    kt_check_no_live_blocks(dut);
}

/* A small CNN on the device: after warm-up, a training step obtains no memory from the raw
 * allocator (cudaMalloc): everything comes from the pool's cache. */
static void test_steady_state_no_raw_alloc(void)
{
    load_dut(); /* SKIPs without a GPU */
    tap_start();
    ts_device *dev = NULL;
    CHECK_OK(ts_device_get(dut_name(), &dev));
    ts_rng rng;
    ts_rng_init(&rng, 7);
    ts_weight_init init = {TS_INIT_KAIMING_UNIFORM, 0, &rng};
    ts_conv2d_params c1 = {1, 1, 2, 2, 1, 1, 1};
    ts_pool2d_params pool = {2, 2, 2, 2, 0, 0, 0};
    ts_module *seq, *m;
    CHECK_OK(ts_nn_sequential(&seq));
    CHECK_OK(ts_nn_conv2d(dev, 1, 6, 5, 5, &c1, 1, &init, &m));
    CHECK_OK(ts_nn_sequential_add(seq, "conv1", m));
    CHECK_OK(ts_nn_relu(&m));
    CHECK_OK(ts_nn_sequential_add(seq, "relu1", m));
    CHECK_OK(ts_nn_max_pool2d(&pool, &m));
    CHECK_OK(ts_nn_sequential_add(seq, "pool1", m));
    CHECK_OK(ts_nn_flatten(&m));
    CHECK_OK(ts_nn_sequential_add(seq, "flatten", m));
    CHECK_OK(ts_nn_linear(dev, 6 * 14 * 14, 10, 1, &init, &m));
    CHECK_OK(ts_nn_sequential_add(seq, "fc", m));
    ts_named_tensor params[8];
    size_t np = ts_module_parameters(seq, params, 8);
    ts_adam_options ao = {1e-3, 0.9, 0.999, 1e-8, 0};
    ts_optim *opt;
    CHECK_OK(ts_optim_adam(params, np, &ao, &opt));
    int64_t labels[32];
    for (int i = 0; i < 32; i++)
        labels[i] = i % 10;
    ts_tensor *x, *y;
    CHECK_OK(ts_tensor_rand(dev, TS_F32, 4, (const int64_t[]){32, 1, 28, 28}, 0, 1, &rng, &x));
    CHECK_OK(ts_tensor_from_host(dev, TS_I64, 1, (const int64_t[]){32}, labels, &y));
    ts_memory_stats st;
    uint64_t raw_after_warmup = 0;
    float first = 0, last = 0;
    for (int step = 0; step < 12; step++) {
        ts_tensor *logits = NULL, *loss = NULL;
        CHECK_OK(ts_module_forward(seq, x, &logits));
        CHECK_OK(ts_cross_entropy(logits, y, TS_REDUCTION_MEAN, &loss));
        CHECK_OK(ts_backward(loss, NULL, 0));
        CHECK_OK(ts_optim_step(opt));
        ts_optim_zero_grad(opt);
        float lv;
        CHECK_OK(ts_tensor_to_host(loss, &lv, sizeof lv));
        CHECK_MSG(isfinite(lv), "step %d: loss %g", step, (double)lv);
        if (step == 0)
            first = lv;
        last = lv;
        ts_tensor_unref(logits);
        ts_tensor_unref(loss);
        CHECK_OK(ts_device_memory_stats(dev, &st));
        CHECK(st.valid & TS_STATS_POOL);
        if (step == 2)
            raw_after_warmup = st.n_raw_alloc;
        if (step > 2)
            CHECK_MSG(st.n_raw_alloc == raw_after_warmup,
                      "step %d made %llu raw allocations (cudaMalloc) after warm-up", step,
                      (unsigned long long)(st.n_raw_alloc - raw_after_warmup));
    }
    /* The same batch 12 times: the loss must fall, or the steps computed nothing. */
    CHECK_MSG(last < first, "loss went from %g to %g over 12 steps on one batch", (double)first,
              (double)last);
    printf("# %llu raw allocations in warm-up, none in 9 steady-state steps; loss %.4f -> %.4f\n",
           (unsigned long long)raw_after_warmup, (double)first, (double)last);
    ts_tensor_unref(x);
    ts_tensor_unref(y);
    ts_optim_free(opt);
    ts_module_free(seq);
    tap_end();
}

/* expandable_segments = true: blocks over 1 MiB come from one reserved range mapped granule by
 * granule (cuMemMap), so two freed neighbours merge into one block a larger request reuses at
 * the same address, the data survives, kernels run on it, and empty_cache gives the mapped
 * tail back. On a plugin without the vm_* slots the key changes nothing and only the data
 * checks apply. */
static void test_expandable_segments(void)
{
    load_dut(); /* SKIPs without a GPU */
    tap_start();
    ts_config *cfg;
    char ini[256];
    snprintf(ini, sizeof ini, "[plugin.%s]\nexpandable_segments = true\ncache_limit = 1G\n",
             dut_name());
    CHECK_OK(ts_config_parse(ini, "expandable.ini", NULL, &cfg));
    ts_device *dev;
    CHECK_OK(ts_device_load(cfg, dut_name(), &dev));
    int vm = strcmp(dut_name(), "cuda") == 0;
    size_t mib = (size_t)1 << 20, n = 6 * mib;
    unsigned char *h = malloc(2 * n), *back = malloc(2 * n);
    CHECK(h && back);
    for (size_t i = 0; i < 2 * n; i++)
        h[i] = (unsigned char)(i * 2654435761u >> 11);
    void *a, *b, *c, *keep;
    CHECK_OK(ts_device_alloc(dev, 3 * mib, "test", &keep)); /* stays: the range is in use */
    CHECK_OK(ts_device_alloc(dev, n, "test", &a));
    CHECK_OK(ts_device_alloc(dev, n, "test", &b));
    CHECK_OK(ts_device_copy_from_host(dev, a, h, n));
    CHECK_OK(ts_device_copy_from_host(dev, b, h + n, n));
    ts_device_free(dev, a);
    ts_device_free(dev, b);
    CHECK_OK(ts_device_alloc(dev, 2 * n, "test", &c));
    if (vm)
        CHECK_MSG(c == a || c == b,
                  "a %zu-byte block did not reuse two freed %zu-byte neighbours (%p, %p -> %p)",
                  2 * n, n, a, b, c);
    CHECK_OK(ts_device_copy_from_host(dev, c, h, 2 * n));
    /* A kernel on the mapped memory: copy the first half over the second, read it back. */
    ts_operand src = {.data = c, .dtype = TS_U8, .ndim = 1, .shape = {(int64_t)n}, .strides = {1}};
    ts_operand dst = src;
    dst.offset = (int64_t)n;
    CHECK_OK(kt_run(dev, TS_OP_COPY, &src, 1, &dst, 1, NULL, 0));
    CHECK_OK(ts_device_copy_to_host(dev, back, c, 2 * n));
    for (size_t i = 0; i < 2 * n; i++)
        CHECK_MSG(back[i] == h[i % n], "byte %zu differs on the mapped range", i);
    ts_memory_stats before = {.struct_size = sizeof before}, after = {.struct_size = sizeof after};
    CHECK_OK(ts_device_memory_stats(dev, &before));
    ts_device_free(dev, c);
    ts_device_empty_cache(dev);
    CHECK_OK(ts_device_memory_stats(dev, &after));
    CHECK_MSG(after.reserved + 2 * n <= before.reserved,
              "empty_cache kept %llu of %llu reserved bytes after a %zu-byte block was freed",
              (unsigned long long)after.reserved, (unsigned long long)before.reserved, 2 * n);
    /* The range grows again after the cut. */
    CHECK_OK(ts_device_alloc(dev, 4 * n, "test", &c));
    CHECK_OK(ts_device_copy_from_host(dev, c, h, 2 * n));
    CHECK_OK(ts_device_copy_to_host(dev, back, c, 2 * n));
    CHECK(memcmp(back, h, 2 * n) == 0);
    ts_device_free(dev, c);
    ts_device_free(dev, keep);
    printf("# reserved %llu bytes before empty_cache, %llu after\n",
           (unsigned long long)before.reserved, (unsigned long long)after.reserved);
    ts_device_unload(dev);
    ts_config_free(cfg);
    free(h);
    free(back);
    tap_end();
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Pinned host memory: an asynchronous upload lands intact, its ticket waits for it, and the
 * loader's pinned path gives the same batches as cpu_blas's own. Prints the upload rate from
 * pinned memory next to the staged copy from ordinary memory. */
static void test_pinned_upload(void)
{
    ts_device *dut = load_dut();
    size_t n = (size_t)64 << 20;
    unsigned char *plain = malloc(n), *back = malloc(n), *pin;
    CHECK(plain && back);
    CHECK_OK(ts_device_pinned_alloc(dut, n, "test", (void **)&pin));
    for (size_t i = 0; i < n; i++)
        plain[i] = pin[i] = (unsigned char)(i * 2654435761u >> 9);
    void *d;
    CHECK_OK(ts_device_alloc(dut, n, "test", &d));
    uint64_t t;
    double t0 = now_s();
    for (int r = 0; r < 4; r++) {
        CHECK_OK(ts_device_copy_from_pinned(dut, d, pin, n, &t));
        CHECK_OK(ts_device_wait_copy(dut, t));
    }
    double t_pin = (now_s() - t0) / 4;
    CHECK_OK(ts_device_synchronize(dut));
    t0 = now_s();
    for (int r = 0; r < 4; r++)
        CHECK_OK(ts_device_copy_from_host(dut, d, plain, n));
    CHECK_OK(ts_device_synchronize(dut));
    double t_plain = (now_s() - t0) / 4;
    CHECK_OK(ts_device_copy_from_pinned(dut, d, pin, n, &t));
    CHECK_OK(ts_device_wait_copy(dut, t));
    CHECK_OK(ts_device_copy_to_host(dut, back, d, n));
    CHECK(memcmp(back, plain, n) == 0);
    printf("# upload of 64 MiB: %.1f GB/s from pinned memory, %.1f GB/s from ordinary memory\n",
           n / t_pin / 1e9, n / t_plain / 1e9);
    /* Many small uploads: more than the ring of events, each waited for out of order. */
    uint64_t tickets[40];
    for (int i = 0; i < 40; i++)
        CHECK_OK(ts_device_copy_from_pinned(dut, (char *)d + i * 4096, pin + i * 4096, 4096,
                                            &tickets[i]));
    for (int i = 39; i >= 0; i -= 7)
        CHECK_OK(ts_device_wait_copy(dut, tickets[i]));
    CHECK_OK(ts_device_copy_to_host(dut, back, d, 40 * 4096));
    CHECK(memcmp(back, plain, 40 * 4096) == 0);
    ts_memory_stats st;
    CHECK_OK(ts_device_pinned_stats(dut, &st));
    CHECK(st.valid & TS_STATS_POOL && st.in_use >= n && st.n_raw_alloc >= 1);
    ts_device_free(dut, d);
    ts_device_pinned_free(dut, pin);

    /* The loader: Fashion-MNIST-shaped data on cpu_blas, batches to the device pinned. */
    ts_device *cpu = kt_load("cpu_blas");
    ts_rng rng;
    ts_rng_init(&rng, 3);
    ts_tensor *x, *y;
    CHECK_OK(ts_tensor_rand(cpu, TS_F32, 4, (const int64_t[]){1000, 1, 28, 28}, 0, 1, &rng, &x));
    int64_t labels[1000];
    for (int i = 0; i < 1000; i++)
        labels[i] = (i * 7) % 10;
    CHECK_OK(ts_tensor_from_host(cpu, TS_I64, 1, (const int64_t[]){1000}, labels, &y));
    ts_loader *ref, *up;
    CHECK_OK(ts_loader_new(x, y, 64, 1, 5, 0, &ref));
    CHECK_OK(ts_loader_new(x, y, 64, 1, 5, 0, &up));
    CHECK_OK(ts_loader_set_device(up, dut, 1));
    float *a = malloc(64 * 784 * sizeof(float)), *c = malloc(64 * 784 * sizeof(float));
    CHECK(a && c);
    for (;;) {
        ts_tensor *rx, *ry, *ux, *uy;
        CHECK_OK(ts_loader_next(ref, &rx, &ry));
        CHECK_OK(ts_loader_next(up, &ux, &uy));
        if (!rx) {
            CHECK(!ux);
            break;
        }
        CHECK(ts_tensor_device(ux) == dut);
        size_t bytes = (size_t)ts_tensor_numel(rx) * sizeof(float);
        CHECK_OK(ts_tensor_to_host(rx, a, bytes));
        CHECK_OK(ts_tensor_to_host(ux, c, bytes));
        CHECK(memcmp(a, c, bytes) == 0);
        ts_tensor_unref(rx);
        ts_tensor_unref(ry);
        ts_tensor_unref(ux);
        ts_tensor_unref(uy);
    }
    free(a);
    free(c);
    ts_loader_free(ref);
    ts_loader_free(up);
    ts_tensor_unref(x);
    ts_tensor_unref(y);
    free(plain);
    free(back);
}

/* A training step recorded as a CUDA graph and replayed gives the eager step's bytes. */
static void test_graph_step(void)
{
    ts_device *dut = load_dut();
    if (!ts_device_can_capture(dut))
        SKIP("%s cannot record graphs", dut_name());
    kt_check_graph_step(dut, 30);
}

int main(int argc, char **argv)
{
    static const tap_test tests[] = {
        TAP_TEST(test_loads_or_skips),
        TAP_TEST(test_elementwise),
        TAP_TEST(test_reduce),
        TAP_TEST(test_index_loss),
        TAP_TEST(test_pool),
        TAP_TEST(test_conv),
        TAP_TEST(test_matmul),
        TAP_TEST(test_optim),
        TAP_TEST(test_layer_norm),
        TAP_TEST(test_copies),
        TAP_TEST(test_steady_state_no_raw_alloc),
        TAP_TEST(test_expandable_segments),
        TAP_TEST(test_pinned_upload),
        TAP_TEST(test_graph_step),
    };
    return tap_run(tests, sizeof tests / sizeof tests[0], argc, argv);
}
