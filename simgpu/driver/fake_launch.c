/*
 * fake_launch.c: kernel launches, graphs and cuCtxSynchronize of the simulated driver.
 *
 * Launches are ASYNCHRONOUS, as on a real GPU: cuLaunchKernel (and _ptsz, cuLaunchKernelEx,
 * cuLaunchCooperativeKernel, cuGraphLaunch, each with _ptsz) checks its arguments, queues the
 * kernel on its stream (stream_engine.c; it blocks only while that stream already holds
 * FASTGSHARE_FAKE_GPU_QUEUE_DEPTH unfinished items) and returns. The stream's worker runs the
 * kernel in stream order on the simulated GPU: it waits for the process's SM units
 * (gpu_state.c: the partition is the process's, so its kernels run one at a time), holds them for
 * the run time, and accounts it. Nothing is computed.
 *
 * Run time: FASTGSHARE_FAKE_GPU_KERNEL_TIME's value for the kernel's name (or its default), plus
 * its per_block part x the grid's blocks (kernel_time.h); never the arguments. The exception is the
 * simulated GPU's own spin kernel, any kernel of a "FAKECUBIN" image: like a real spin kernel it
 * runs for what its first parameter says, *(unsigned long long *)kernelParams[0] microseconds
 * (with `extra`, the first 8 bytes of the CU_LAUNCH_PARAM_BUFFER_POINTER buffer; no parameters:
 * 0 us; more than 60 s: CUDA_ERROR_INVALID_VALUE).
 *
 * Graphs use the real API: cuGraphCreate, cuGraphAddKernelNode (both ABIs; the node's run time is
 * fixed when it is added, as the real driver copies the parameters), cuGraphInstantiate /
 * cuGraphInstantiateWithFlags, cuGraphLaunch, cuGraphExecDestroy, cuGraphDestroy. Dependencies
 * are ignored: a launched graph holds the process's SM units for the sum of its nodes' run times
 * and counts as one kernel (and one graph launch).
 *
 * cuCtxSynchronize (and _v2) waits for the work queued on every stream of the process before the
 * call, and counts in the state file (ctx_syncs).
 */
#include "fake_internal.h"

#include "gpu_state.h"
#include "kernel_time.h"
#include "modules.h"
#include "served.h"
#include "stream_engine.h"

#include <stdlib.h>
#include <string.h>

#define MAX_KERNEL_US (UINT64_C(60) * 1000 * 1000)

struct CUgraphNode_st {
    uint32_t magic;
    uint64_t duration_ns;
    struct CUgraphNode_st *next;
};

struct CUgraph_st {
    uint32_t magic;
    uint32_t node_count;
    uint64_t total_ns;
    struct CUgraphNode_st *nodes;
};

struct CUgraphExec_st {
    uint32_t magic;
    uint32_t node_count;
    uint64_t total_ns;
};

static CUresult spin_from_extra(void **extra, unsigned long long *us)
{
    const void *buffer = NULL;
    size_t size = 0;
    for (size_t i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
        if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
            buffer = extra[i + 1];
        else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE && extra[i + 1] != NULL)
            memcpy(&size, extra[i + 1], sizeof size);
        else
            return CUDA_ERROR_INVALID_VALUE;
    }
    if (buffer != NULL && size >= sizeof *us)
        memcpy(us, buffer, sizeof *us);
    return CUDA_SUCCESS;
}

/* The spin kernel's run time: its first parameter, in microseconds. */
static CUresult spin_duration(void **kernelParams, void **extra, uint64_t *duration_ns)
{
    unsigned long long us = 0;
    if (kernelParams != NULL && kernelParams[0] != NULL)
        memcpy(&us, kernelParams[0], sizeof us);
    else if (extra != NULL && spin_from_extra(extra, &us) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_VALUE;
    if (us > MAX_KERNEL_US)
        return CUDA_ERROR_INVALID_VALUE;
    *duration_ns = (uint64_t)us * 1000;
    return CUDA_SUCCESS;
}

struct launch_shape {
    unsigned int grid[3];
    unsigned int block[3];
};

static CUresult check_kernel(CUfunction f, const struct launch_shape *shape)
{
    if (!fake_function_valid(f))
        return CUDA_ERROR_INVALID_HANDLE;
    for (int i = 0; i < 3; i++)
        if (shape->grid[i] == 0 || shape->block[i] == 0)
            return CUDA_ERROR_INVALID_VALUE;
    if ((uint64_t)shape->block[0] * shape->block[1] * shape->block[2] > 1024)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

/* How long the kernel runs on the simulated GPU: the setting's, or the spin kernel's parameter. */
static CUresult kernel_duration(CUfunction f, const struct launch_shape *shape, void **kernelParams, void **extra,
                                uint64_t *duration_ns)
{
    if (kernelParams != NULL && extra != NULL)
        return CUDA_ERROR_INVALID_VALUE;
    const struct fake_function *fn = fake_function_of(f);
    if (fn->spin)
        return spin_duration(kernelParams, extra, duration_ns);
    uint64_t blocks = (uint64_t)shape->grid[0] * shape->grid[1] * shape->grid[2];
    *duration_ns = fake_kernel_duration_ns(fn->base_ns, fake_kernel_per_block_ns(), blocks);
    return CUDA_SUCCESS;
}

static CUresult launch(CUfunction f, struct launch_shape shape, CUstream hStream, int per_thread,
                       void **kernelParams, void **extra)
{
    struct fake_stream *s;
    CUresult r = fake_ready_with_context();
    if (r == CUDA_SUCCESS)
        r = check_kernel(f, &shape);
    if (r == CUDA_SUCCESS)
        r = engine_resolve(hStream, per_thread, &s);
    uint64_t duration_ns = 0;
    if (r == CUDA_SUCCESS)
        r = kernel_duration(f, &shape, kernelParams, extra, &duration_ns);
    if (r == CUDA_SUCCESS)
        r = engine_submit_kernel(s, duration_ns, 0);
    return r;
}

#define SHAPE(gx, gy, gz, bx, by, bz) ((struct launch_shape){{gx, gy, gz}, {bx, by, bz}})

CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                        unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                        unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                        void **kernelParams, void **extra)
{
    FAKE_SERVED();
    (void)sharedMemBytes;
    return launch(f, SHAPE(gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ), hStream, 0,
                  kernelParams, extra);
}

CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                             unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                             unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                             void **kernelParams, void **extra)
{
    FAKE_SERVED();
    (void)sharedMemBytes;
    return launch(f, SHAPE(gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ), hStream, 1,
                  kernelParams, extra);
}

static CUresult launch_ex(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra,
                          int per_thread)
{
    if (config == NULL || (config->numAttrs > 0 && config->attrs == NULL))
        return fake_ready() != CUDA_SUCCESS ? fake_ready() : CUDA_ERROR_INVALID_VALUE;
    return launch(f,
                  SHAPE(config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX,
                        config->blockDimY, config->blockDimZ),
                  config->hStream, per_thread, kernelParams, extra);
}

CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)
{
    FAKE_SERVED();
    return launch_ex(config, f, kernelParams, extra, 0);
}

CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                               void **extra)
{
    FAKE_SERVED();
    return launch_ex(config, f, kernelParams, extra, 1);
}

CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                   unsigned int gridDimZ, unsigned int blockDimX,
                                   unsigned int blockDimY, unsigned int blockDimZ,
                                   unsigned int sharedMemBytes, CUstream hStream, void **kernelParams)
{
    FAKE_SERVED();
    (void)sharedMemBytes;
    return launch(f, SHAPE(gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ), hStream, 0,
                  kernelParams, NULL);
}

CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                        unsigned int gridDimZ, unsigned int blockDimX,
                                        unsigned int blockDimY, unsigned int blockDimZ,
                                        unsigned int sharedMemBytes, CUstream hStream,
                                        void **kernelParams)
{
    FAKE_SERVED();
    (void)sharedMemBytes;
    return launch(f, SHAPE(gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ), hStream, 1,
                  kernelParams, NULL);
}

/* --- graphs ------------------------------------------------------------------------------- */

static int graph_valid(CUgraph graph)
{
    return graph != NULL && graph->magic == FAKE_GRAPH_MAGIC;
}

CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags)
{
    CUresult r = fake_ready_with_context();
    if (r != CUDA_SUCCESS)
        return r;
    if (phGraph == NULL || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUgraph graph = calloc(1, sizeof *graph);
    if (graph == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    graph->magic = FAKE_GRAPH_MAGIC;
    *phGraph = graph;
    return CUDA_SUCCESS;
}

static CUresult add_kernel_node(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                size_t numDependencies, CUfunction f, struct launch_shape shape,
                                void **kernelParams, void **extra)
{
    CUresult r = fake_ready_with_context();
    if (r != CUDA_SUCCESS)
        return r;
    if (phGraphNode == NULL || (numDependencies > 0 && dependencies == NULL))
        return CUDA_ERROR_INVALID_VALUE;
    if (!graph_valid(hGraph))
        return CUDA_ERROR_INVALID_HANDLE;
    uint64_t duration_ns = 0;
    if ((r = check_kernel(f, &shape)) != CUDA_SUCCESS ||
        (r = kernel_duration(f, &shape, kernelParams, extra, &duration_ns)) != CUDA_SUCCESS)
        return r;
    CUgraphNode node = calloc(1, sizeof *node);
    if (node == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    node->magic = FAKE_NODE_MAGIC;
    node->duration_ns = duration_ns;
    node->next = hGraph->nodes;
    hGraph->nodes = node;
    hGraph->node_count++;
    hGraph->total_ns += duration_ns;
    *phGraphNode = node;
    return CUDA_SUCCESS;
}

/* The v1 and v2 kernel-node parameter structs name these fields alike. */
#define ADD_KERNEL_NODE_FROM(p)                                                                    \
    ((p) == NULL ? CUDA_ERROR_INVALID_VALUE                                                        \
                 : add_kernel_node(phGraphNode, hGraph, dependencies, numDependencies, (p)->func,  \
                                   SHAPE((p)->gridDimX, (p)->gridDimY, (p)->gridDimZ, (p)->blockDimX,  \
                                         (p)->blockDimY, (p)->blockDimZ),                          \
                                   (p)->kernelParams, (p)->extra))

CUresult cuGraphAddKernelNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                              size_t numDependencies, const CUDA_KERNEL_NODE_PARAMS_v1 *nodeParams)
{
    return ADD_KERNEL_NODE_FROM(nodeParams);
}

CUresult cuGraphAddKernelNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                 size_t numDependencies, const CUDA_KERNEL_NODE_PARAMS_v2 *nodeParams)
{
    return ADD_KERNEL_NODE_FROM(nodeParams);
}

static CUresult instantiate(CUgraphExec *phGraphExec, CUgraph hGraph)
{
    CUresult r = fake_ready_with_context();
    if (r != CUDA_SUCCESS)
        return r;
    if (phGraphExec == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (!graph_valid(hGraph))
        return CUDA_ERROR_INVALID_HANDLE;
    CUgraphExec exec = calloc(1, sizeof *exec);
    if (exec == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    exec->magic = FAKE_EXEC_MAGIC;
    exec->node_count = hGraph->node_count;
    exec->total_ns = hGraph->total_ns;
    *phGraphExec = exec;
    return CUDA_SUCCESS;
}

CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags)
{
    (void)flags;
    return instantiate(phGraphExec, hGraph);
}

CUresult cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                            char *logBuffer, size_t bufferSize)
{
    (void)phErrorNode;
    if (logBuffer != NULL && bufferSize > 0)
        logBuffer[0] = '\0';
    return instantiate(phGraphExec, hGraph);
}

CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                               char *logBuffer, size_t bufferSize)
{
    return cuGraphInstantiate(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize);
}

CUresult cuGraphExecDestroy(CUgraphExec hGraphExec)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (hGraphExec == NULL || hGraphExec->magic != FAKE_EXEC_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    hGraphExec->magic = 0;
    free(hGraphExec);
    return CUDA_SUCCESS;
}

CUresult cuGraphDestroy(CUgraph hGraph)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (!graph_valid(hGraph))
        return CUDA_ERROR_INVALID_HANDLE;
    CUgraphNode node = hGraph->nodes;
    while (node != NULL) {
        CUgraphNode next = node->next;
        node->magic = 0;
        free(node);
        node = next;
    }
    hGraph->magic = 0;
    free(hGraph);
    return CUDA_SUCCESS;
}

static CUresult graph_launch(CUgraphExec hGraphExec, CUstream hStream, int per_thread)
{
    CUresult r = fake_ready_with_context();
    if (r != CUDA_SUCCESS)
        return r;
    if (hGraphExec == NULL || hGraphExec->magic != FAKE_EXEC_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    struct fake_stream *s;
    if ((r = engine_resolve(hStream, per_thread, &s)) != CUDA_SUCCESS)
        return r;
    return engine_submit_kernel(s, hGraphExec->total_ns, 1);
}

CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
    FAKE_SERVED();
    return graph_launch(hGraphExec, hStream, 0);
}

CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
    FAKE_SERVED();
    return graph_launch(hGraphExec, hStream, 1);
}

/* --- context synchronize ------------------------------------------------------------------ */

/* Waits for the work queued on every stream of the process before the call (all of the
 * process's contexts: one device, one queue of work). */
CUresult cuCtxSynchronize(void)
{
    CUresult r = fake_ready_with_context();
    if (r == CUDA_SUCCESS) {
        engine_wait_all();
        fgpu_count_ctx_sync();
    }
    return r;
}

#if CUDA_VERSION >= 13000
CUresult cuCtxSynchronize_v2(CUcontext ctx)
{
    CUresult r = fake_ready();
    if (r == CUDA_SUCCESS && ctx == NULL)
        r = fake_ready_with_context();
    if (r == CUDA_SUCCESS && ctx != NULL && !fake_context_valid(ctx))
        r = CUDA_ERROR_INVALID_CONTEXT;
    if (r == CUDA_SUCCESS) {
        engine_wait_all();
        fgpu_count_ctx_sync();
    }
    return r;
}
#endif
