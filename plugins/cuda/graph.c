/* plugins/cuda/graph.c: the graph_* slots through CUDA graphs. graph_begin starts capturing
 * the instance's stream (relaxed mode: the pool may still cudaMalloc a new segment while a
 * step is recorded); every kernel, cuBLAS call, fill and device copy queued meanwhile becomes
 * a node. A copy from host memory while recording goes through a pinned buffer of its own,
 * kept with the graph, so a replay uploads the bytes given at capture (the staging ring's
 * buffers are rewritten by later copies). graph_end instantiates the graph; graph_launch
 * replays it on the stream. */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "cuda_plugin.h"

struct cuda_graph {
    cudaGraphExec_t exec;
    void **bufs; /* cudaHostAlloc'd copies of host data uploaded while recording */
    size_t nbufs, cap;
};

static void graph_release(cuda_ctx *c, cuda_graph *g)
{
    if (!g)
        return;
    cudaSetDevice(c->device);
    if (!c->rec) /* replays in flight; none can be while another graph is recorded */
        cudaStreamSynchronize(c->stream);
    if (g->exec)
        cudaGraphExecDestroy(g->exec);
    for (size_t i = 0; i < g->nbufs; i++)
        cudaFreeHost(g->bufs[i]);
    free(g->bufs);
    free(g);
}

ts_status cuda_graph_begin(void *ctx)
{
    cuda_ctx *c = ctx;
    if (c->rec)
        return c->host->fail(c->host, TS_ESTATE, "already recording a graph");
    cuda_graph *g = calloc(1, sizeof *g);
    if (!g)
        return c->host->fail(c->host, TS_ENOMEM, "out of host memory for a graph");
    CU_CHECK(c, cudaSetDevice(c->device));
    /* Nothing queued before may still run while recording: frees during the recording (the
     * pool trimming its cache) cannot wait on the capturing stream. */
    cudaError_t e = cudaStreamSynchronize(c->stream);
    if (e == cudaSuccess)
        e = cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeRelaxed);
    if (e != cudaSuccess) {
        free(g);
        return cuda_fail_cu(c, "cudaStreamBeginCapture", e);
    }
    c->rec = g;
    return TS_OK;
}

ts_status cuda_graph_end(void *ctx, void **graph)
{
    cuda_ctx *c = ctx;
    cuda_graph *g = c->rec;
    *graph = NULL;
    if (!g)
        return c->host->fail(c->host, TS_ESTATE, "not recording a graph");
    c->rec = NULL;
    cudaGraph_t raw = NULL;
    cudaSetDevice(c->device);
    const char *what = "cudaStreamEndCapture";
    cudaError_t e = cudaStreamEndCapture(c->stream, &raw); /* whatever else failed */
    if (e == cudaSuccess) {
        what = "cudaGraphInstantiate";
        e = cudaGraphInstantiate(&g->exec, raw, 0);
    }
    if (raw)
        cudaGraphDestroy(raw);
    if (e != cudaSuccess) {
        cudaGetLastError();
        g->exec = NULL;
        graph_release(c, g);
        return cuda_fail_cu(c, what, e);
    }
    *graph = g;
    return TS_OK;
}

ts_status cuda_graph_launch(void *ctx, void *graph)
{
    cuda_ctx *c = ctx;
    cuda_graph *g = graph;
    CU_CHECK(c, cudaSetDevice(c->device));
    CU_CHECK(c, cudaGraphLaunch(g->exec, c->stream));
    return TS_OK;
}

void cuda_graph_free(void *ctx, void *graph)
{
    graph_release(ctx, graph);
}

ts_status cuda_graph_h2d(cuda_ctx *c, void *dst, const void *src, size_t n)
{
    cuda_graph *g = c->rec;
    if (g->nbufs == g->cap) {
        size_t cap = g->cap ? 2 * g->cap : 16;
        void **b = realloc(g->bufs, cap * sizeof *b);
        if (!b)
            return c->host->fail(c->host, TS_ENOMEM, "out of host memory while recording");
        g->bufs = b;
        g->cap = cap;
    }
    void *buf;
    CU_CHECK(c, cudaHostAlloc(&buf, n, cudaHostAllocDefault));
    g->bufs[g->nbufs++] = buf;
    memcpy(buf, src, n);
    CU_CHECK(c, cudaMemcpyAsync(dst, buf, n, cudaMemcpyHostToDevice, c->stream));
    return TS_OK;
}
