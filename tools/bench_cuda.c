/* tools/bench_cuda.c: `tessera bench cuda`: the cuda plugin against raw CUDA in the same run:
 * matmul TFLOP/s vs a direct cublasSgemm, elementwise add GB/s vs cudaMemcpy device to
 * device, pool alloc+free vs cudaMalloc/cudaFree, and LeNet-5 / CNN training steps per second
 * at batch 256 on cuda and on the CPU backends. Without a GPU it says so and exits 1. */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"

static const char usage[] =
    "usage: tessera bench cuda [--steps N] [--cpu-steps N] [--no-cpu]\n"
    "\n"
    "On the GPU that [plugin.cuda] device_index selects, each next to its raw CUDA baseline:\n"
    "  matmul 1024^3 and 4096^3 float32: TFLOP/s through tessera vs cublasSgemm\n"
    "  add of 64M float32: GB/s (3 x 4 bytes per element) vs cudaMemcpy device to device\n"
    "  1 MiB alloc+free: ns through the pool vs cudaMalloc + cudaFree\n"
    "  lenet5 and cnn training steps/s at batch 256 (Adam) on cuda, cpu_blas, cpu_onednn\n"
    "  --steps N       timed GPU training steps (default 50)\n"
    "  --cpu-steps N   timed CPU training steps (default 3)\n"
    "  --no-cpu        skip the CPU backends\n";

#ifdef TS_HAVE_CUDA
#endif

#ifdef TS_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

/* The raw baselines call the CUDA runtime and cuBLAS through dlopen, so that the tessera
 * command itself never depends on CUDA's libraries (only the cuda plugin does): on a machine
 * where they are missing, every other command still runs and this one says why. */
static struct {
    __typeof__(cudaSetDevice) *SetDevice;
    __typeof__(cudaMalloc) *Malloc;
    __typeof__(cudaFree) *Free;
    __typeof__(cudaMemset) *Memset;
    __typeof__(cudaMemcpy) *Memcpy;
    __typeof__(cudaDeviceSynchronize) *DeviceSynchronize;
    __typeof__(cudaGetErrorString) *GetErrorString;
    __typeof__(cublasCreate_v2) *BlasCreate;
    __typeof__(cublasDestroy_v2) *BlasDestroy;
    __typeof__(cublasSgemm_v2) *Sgemm;
} cu;

static void *open_first(const char *const *names)
{
    for (; *names; names++) {
        void *h = dlopen(*names, RTLD_NOW | RTLD_LOCAL);
        if (h)
            return h;
    }
    return NULL;
}

/* 0 when every symbol was found; else prints why. The handles stay open until exit. */
static int cuda_syms_load(void)
{
    static const char *const rt[] = {TS_CUDA_LIBDIR "/libcudart.so", "libcudart.so.13",
                                     "libcudart.so.12", "libcudart.so", NULL};
    static const char *const blas[] = {TS_CUDA_LIBDIR "/libcublas.so", "libcublas.so.13",
                                       "libcublas.so.12", "libcublas.so", NULL};
    void *hr = open_first(rt), *hb = hr ? open_first(blas) : NULL;
    if (!hr || !hb) {
        fprintf(stderr, "tessera bench cuda: cannot load %s for the baselines: %s\n",
                hr ? "cuBLAS" : "the CUDA runtime", dlerror());
        return 1;
    }
#define SYM(h, field, name)                                                                 \
    if (!(*(void **)&cu.field = dlsym(h, name))) {                                          \
        fprintf(stderr, "tessera bench cuda: %s has no %s\n", #h, name);                    \
        return 1;                                                                           \
    }
    SYM(hr, SetDevice, "cudaSetDevice")
    SYM(hr, Malloc, "cudaMalloc")
    SYM(hr, Free, "cudaFree")
    SYM(hr, Memset, "cudaMemset")
    SYM(hr, Memcpy, "cudaMemcpy")
    SYM(hr, DeviceSynchronize, "cudaDeviceSynchronize")
    SYM(hr, GetErrorString, "cudaGetErrorString")
    SYM(hb, BlasCreate, "cublasCreate_v2")
    SYM(hb, BlasDestroy, "cublasDestroy_v2")
    SYM(hb, Sgemm, "cublasSgemm_v2")
#undef SYM
    return 0;
}

#undef cublasCreate
#undef cublasDestroy
#undef cublasSgemm
#define cudaSetDevice cu.SetDevice
#define cudaMalloc cu.Malloc
#define cudaFree cu.Free
#define cudaMemset cu.Memset
#define cudaMemcpy cu.Memcpy
#define cudaDeviceSynchronize cu.DeviceSynchronize
#define cudaGetErrorString cu.GetErrorString
#define cublasCreate cu.BlasCreate
#define cublasDestroy cu.BlasDestroy
#define cublasSgemm cu.Sgemm

/* Training steps per second of `model` at batch 256 on dev: warm-up, then `steps` timed. */
static ts_status train_rate(ts_device *dev, const char *model, int steps, double *rate)
{
    ts_rng rng;
    ts_rng_init(&rng, 1);
    ts_module *m = NULL;
    ts_optim *o = NULL;
    ts_tensor *x = NULL, *y = NULL;
    ts_named_tensor p[16];
    int64_t labels[256];
    for (int i = 0; i < 256; i++)
        labels[i] = i % 10;
    ts_adam_options ao = {1e-3, 0.9, 0.999, 1e-8, 0};
    size_t np;
    ts_status s;
    if ((s = cli_build_model(model, dev, &rng, &m)) ||
        (np = ts_module_parameters(m, p, 16), (s = ts_optim_adam(p, np, &ao, &o))) ||
        (s = ts_tensor_rand(dev, TS_F32, 4, (const int64_t[]){256, 1, 28, 28}, 0, 1, &rng, &x)) ||
        (s = ts_tensor_from_host(dev, TS_I64, 1, (const int64_t[]){256}, labels, &y)))
        goto out;
    double t0 = 0;
    for (int i = 0; i < steps + 2 && !s; i++) {
        if (i == 2) { /* two warm-up steps fill the pool and caches */
            if ((s = ts_device_synchronize(dev)))
                break;
            t0 = cli_now();
        }
        ts_tensor *logits = NULL, *loss = NULL;
        if ((s = ts_module_forward(m, x, &logits)) == TS_OK &&
            (s = ts_cross_entropy(logits, y, TS_REDUCTION_MEAN, &loss)) == TS_OK &&
            (s = ts_backward(loss, NULL, 0)) == TS_OK)
            s = ts_optim_step(o);
        ts_optim_zero_grad(o);
        ts_tensor_unref(logits);
        ts_tensor_unref(loss);
    }
    if (!s && (s = ts_device_synchronize(dev)) == TS_OK)
        *rate = steps / (cli_now() - t0);
out:
    ts_tensor_unref(x);
    ts_tensor_unref(y);
    ts_optim_free(o);
    ts_module_free(m);
    return s;
}

#define CUDA_OR_FAIL(call)                                                                  \
    do {                                                                                    \
        cudaError_t e_ = (call);                                                            \
        if (e_ != cudaSuccess) {                                                            \
            fprintf(stderr, "tessera: error: %s failed: %s\n", #call, cudaGetErrorString(e_)); \
            return 1;                                                                       \
        }                                                                                   \
    } while (0)

static int bench_matmul(ts_device *dev, int device_index, int64_t n)
{
    const int64_t sh[2] = {n, n};
    ts_rng rng;
    ts_rng_init(&rng, 2);
    ts_tensor *a = NULL, *b = NULL, *c = NULL;
    ts_status s;
    if ((s = ts_tensor_randn(dev, TS_F32, 2, sh, 0, 1, &rng, &a)) ||
        (s = ts_tensor_randn(dev, TS_F32, 2, sh, 0, 1, &rng, &b)) ||
        (s = ts_tensor_empty(dev, TS_F32, 2, sh, &c)))
        goto fail;
    int reps = n >= 4096 ? 10 : 50;
    double flops = 2.0 * (double)n * (double)n * (double)n * reps;
    if ((s = ts_matmul_out(a, b, c)) || (s = ts_device_synchronize(dev)))
        goto fail;
    double t0 = cli_now();
    for (int i = 0; i < reps && !s; i++)
        s = ts_matmul_out(a, b, c);
    if (s || (s = ts_device_synchronize(dev)))
        goto fail;
    double tt = cli_now() - t0;
    /* Raw cuBLAS on buffers of its own, same shapes, same run. */
    CUDA_OR_FAIL(cudaSetDevice(device_index));
    float *da, *db, *dc;
    size_t bytes = (size_t)(n * n) * sizeof(float);
    CUDA_OR_FAIL(cudaMalloc((void **)&da, bytes));
    CUDA_OR_FAIL(cudaMalloc((void **)&db, bytes));
    CUDA_OR_FAIL(cudaMalloc((void **)&dc, bytes));
    CUDA_OR_FAIL(cudaMemset(da, 0, bytes));
    CUDA_OR_FAIL(cudaMemset(db, 0, bytes));
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "tessera: error: cublasCreate failed\n");
        return 1;
    }
    float one = 1, zero = 0;
    cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, (int)n, (int)n, (int)n, &one, da, (int)n, db,
                (int)n, &zero, dc, (int)n);
    CUDA_OR_FAIL(cudaDeviceSynchronize());
    t0 = cli_now();
    for (int i = 0; i < reps; i++)
        cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, (int)n, (int)n, (int)n, &one, da, (int)n, db,
                    (int)n, &zero, dc, (int)n);
    CUDA_OR_FAIL(cudaDeviceSynchronize());
    double tr = cli_now() - t0;
    cublasDestroy(h);
    cudaFree(da);
    cudaFree(db);
    cudaFree(dc);
    printf("matmul %lldx%lldx%lld f32   tessera %8.2f TFLOP/s   cublasSgemm %8.2f TFLOP/s   "
           "(%.0f%%)\n",
           (long long)n, (long long)n, (long long)n, flops / tt * 1e-12, flops / tr * 1e-12,
           100.0 * tr / tt);
    ts_tensor_unref(a), ts_tensor_unref(b), ts_tensor_unref(c);
    return 0;
fail:
    ts_tensor_unref(a), ts_tensor_unref(b), ts_tensor_unref(c);
    return cli_fail(s, "bench cuda: matmul");
}

static int bench_add(ts_device *dev, int device_index)
{
    const int64_t n = (int64_t)64 << 20, sh[1] = {n};
    ts_rng rng;
    ts_rng_init(&rng, 3);
    ts_tensor *a = NULL, *b = NULL, *c = NULL;
    ts_status s;
    if ((s = ts_tensor_rand(dev, TS_F32, 1, sh, 0, 1, &rng, &a)) ||
        (s = ts_tensor_rand(dev, TS_F32, 1, sh, 0, 1, &rng, &b)) ||
        (s = ts_tensor_empty(dev, TS_F32, 1, sh, &c)) || (s = ts_add_out(a, b, c)) ||
        (s = ts_device_synchronize(dev)))
        goto fail;
    int reps = 20;
    double t0 = cli_now();
    for (int i = 0; i < reps && !s; i++)
        s = ts_add_out(a, b, c);
    if (s || (s = ts_device_synchronize(dev)))
        goto fail;
    double tt = cli_now() - t0;
    CUDA_OR_FAIL(cudaSetDevice(device_index));
    void *src, *dst;
    size_t bytes = (size_t)n * sizeof(float);
    CUDA_OR_FAIL(cudaMalloc(&src, bytes));
    CUDA_OR_FAIL(cudaMalloc(&dst, bytes));
    CUDA_OR_FAIL(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
    CUDA_OR_FAIL(cudaDeviceSynchronize());
    t0 = cli_now();
    for (int i = 0; i < reps; i++)
        CUDA_OR_FAIL(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
    CUDA_OR_FAIL(cudaDeviceSynchronize());
    double tr = cli_now() - t0;
    cudaFree(src);
    cudaFree(dst);
    printf("add 64M f32              tessera %8.1f GB/s      cudaMemcpy D2D %8.1f GB/s     "
           "(read + write bytes)\n",
           3.0 * (double)bytes * reps / tt * 1e-9, 2.0 * (double)bytes * reps / tr * 1e-9);
    ts_tensor_unref(a), ts_tensor_unref(b), ts_tensor_unref(c);
    return 0;
fail:
    ts_tensor_unref(a), ts_tensor_unref(b), ts_tensor_unref(c);
    return cli_fail(s, "bench cuda: add");
}

static int bench_alloc(ts_device *dev, int device_index)
{
    const size_t sz = (size_t)1 << 20;
    const int reps = 2000;
    void *p;
    ts_status s;
    if ((s = ts_device_alloc(dev, sz, "bench", &p)))
        return cli_fail(s, "bench cuda: alloc");
    ts_device_free(dev, p);
    double t0 = cli_now();
    for (int i = 0; i < reps; i++) {
        if ((s = ts_device_alloc(dev, sz, "bench", &p)))
            return cli_fail(s, "bench cuda: alloc");
        ts_device_free(dev, p);
    }
    double tt = cli_now() - t0;
    CUDA_OR_FAIL(cudaSetDevice(device_index));
    t0 = cli_now();
    for (int i = 0; i < reps / 10; i++) {
        CUDA_OR_FAIL(cudaMalloc(&p, sz));
        CUDA_OR_FAIL(cudaFree(p));
    }
    double tr = cli_now() - t0;
    printf("alloc+free 1 MiB         pool    %8.0f ns        cudaMalloc+cudaFree %8.0f ns\n",
           tt / reps * 1e9, tr / (reps / 10) * 1e9);
    return 0;
}
#endif /* TS_HAVE_CUDA */

int cli_bench_cuda(int argc, char **argv, const cli_common *common)
{
    int steps = 50, cpu_steps = 3, cpu = 1;
    for (int i = 1; i < argc; i++) {
        int64_t n;
        if (!strcmp(argv[i], "--steps") || !strcmp(argv[i], "--cpu-steps")) {
            if (cli_parse_i64("bench cuda", argv[i], i + 1 < argc ? argv[i + 1] : NULL, 1,
                              1000000, &n))
                return 2;
            *(!strcmp(argv[i], "--steps") ? &steps : &cpu_steps) = (int)n, i++;
        }
        else if (!strcmp(argv[i], "--no-cpu"))
            cpu = 0;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(usage, stdout);
            return 0;
        } else
            return cli_usage_error("bench cuda", "unknown or incomplete option '%s'", argv[i]);
    }
#ifndef TS_HAVE_CUDA
    (void)common, (void)steps, (void)cpu_steps, (void)cpu;
    fprintf(stderr, "tessera bench cuda: no GPU benchmarks in this build (configure found no "
                    "CUDA Toolkit; see --with-cuda)\n");
    return 1;
#else
    ts_status s = ts_init(common->config);
    if (s)
        return cli_fail(s, "bench cuda");
    ts_device *dev = NULL;
    if ((s = ts_device_get("cuda", &dev))) {
        fprintf(stderr, "tessera bench cuda: no GPU: %s\nnothing measured\n", ts_last_error());
        ts_shutdown();
        return 1;
    }
    if (cuda_syms_load()) {
        ts_shutdown();
        return 1;
    }
    ts_device_info info;
    int rc = 0, device_index = 0;
    if ((s = ts_device_info_get(dev, &info)) == TS_OK)
        device_index = info.index;
    printf("tessera bench cuda on %s (device %d)\n", s ? "?" : info.name, device_index);
    rc |= bench_matmul(dev, device_index, 1024);
    rc |= bench_matmul(dev, device_index, 4096);
    rc |= bench_add(dev, device_index);
    rc |= bench_alloc(dev, device_index);
    static const char *const models[] = {"lenet5", "cnn"};
    static const char *const cpus[] = {"cpu_blas", "cpu_onednn"};
    for (int m = 0; m < 2; m++) {
        double r = 0;
        if ((s = train_rate(dev, models[m], steps, &r))) {
            rc |= cli_fail(s, "bench cuda: training step");
            continue;
        }
        printf("%-6s batch 256 steps/s   cuda %8.2f", models[m], r);
        for (int k = 0; cpu && k < 2; k++) {
            ts_device *cd = NULL;
            double rc2 = 0;
            if (ts_device_get(cpus[k], &cd) || train_rate(cd, models[m], cpu_steps, &rc2))
                printf("   %s n/a", cpus[k]);
            else
                printf("   %s %8.2f (cuda %.1fx)", cpus[k], rc2, r / rc2);
            if (cd)
                ts_empty_cache(cd);
        }
        printf("\n");
    }
    ts_shutdown();
    return rc ? 1 : 0;
#endif
}
