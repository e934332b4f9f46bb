/*
 * fake_launch.c: kernel launches and graphs of the fake driver.
 *
 * A fake kernel's run time is its first parameter: kernelParams[0] points to an
 * unsigned long long microsecond count (with `extra` instead, the first 8 bytes of the
 * CU_LAUNCH_PARAM_BUFFER_POINTER buffer). No parameters means a 0 µs kernel; more than 60 s
 * is rejected with CUDA_ERROR_INVALID_VALUE.
 *
 * Launches are SYNCHRONOUS, unlike a real GPU: the call waits for the process's SM units
 * (gpu_state.c; the partition is the process's, so its kernels run one at a time), holds them for
 * the run time, and returns when the "kernel" has finished. So the caller's wall time is GPU
 * time, and per-process busy time is exact.
 *
 * Graphs use the real API: cuGraphCreate, cuGraphAddKernelNode (both ABIs; the node's run time
 * is read from its parameters when it is added, as the real driver copies them),
 * cuGraphInstantiate / cuGraphInstantiateWithFlags, cuGraphLaunch, cuGraphExecDestroy,
 * cuGraphDestroy. Dependencies are ignored: a launched graph holds the process's SM units for
 * the sum of its nodes' run times and counts as one kernel (and one graph launch).
 */
#include "fake_internal.h"

#include "gpu_state.h"

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

static CUresult duration_from_extra(void **extra, unsigned long long *us)
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

static CUresult kernel_duration(void **kernelParams, void **extra, uint64_t *duration_ns)
{
    unsigned long long us = 0;
    if (kernelParams != NULL && extra != NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (kernelParams != NULL && kernelParams[0] != NULL)
        memcpy(&us, kernelParams[0], sizeof us);
    else if (extra != NULL && duration_from_extra(extra, &us) != CUDA_SUCCESS)
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
    return CUDA_SUCCESS;
}

static CUresult launch(CUfunction f, struct launch_shape shape, CUstream stream, void **kernelParams,
                       void **extra)
{
    CUresult r = fake_ready_with_context();
    if (r == CUDA_SUCCESS)
        r = check_kernel(f, &shape);
    if (r == CUDA_SUCCESS && !fake_stream_valid(stream))
        r = CUDA_ERROR_INVALID_HANDLE;
    uint64_t duration_ns = 0;
    if (r == CUDA_SUCCESS)
        r = kernel_duration(kernelParams, extra, &duration_ns);
    if (r == CUDA_SUCCESS)
        fgpu_run_kernel(duration_ns, 0);
    return r;
}

#define SHAPE(gx, gy, gz, bx, by, bz) ((struct launch_shape){{gx, gy, gz}, {bx, by, bz}})

CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                        unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                        unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                        void **kernelParams, void **extra)
{
    (void)sharedMemBytes;
    return launch(f, SHAPE(gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ), hStream,
                  kernelParams, extra);
}

CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                             unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                             unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                             void **kernelParams, void **extra)
{
    (void)sharedMemBytes;
    return launch(f, SHAPE(gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ), hStream,
                  kernelParams, extra);
}

static CUresult launch_ex(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)
{
    if (config == NULL || (config->numAttrs > 0 && config->attrs == NULL))
        return CUDA_ERROR_INVALID_VALUE;
    return launch(f,
                  SHAPE(config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX,
                        config->blockDimY, config->blockDimZ),
                  config->hStream, kernelParams, extra);
}

CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)
{
    return launch_ex(config, f, kernelParams, extra);
}

CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                               void **extra)
{
    return launch_ex(config, f, kernelParams, extra);
}

CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                   unsigned int gridDimZ, unsigned int blockDimX,
                                   unsigned int blockDimY, unsigned int blockDimZ,
                                   unsigned int sharedMemBytes, CUstream hStream, void **kernelParams)
{
    (void)sharedMemBytes;
    return launch(f, SHAPE(gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ), hStream,
                  kernelParams, NULL);
}

CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                        unsigned int gridDimZ, unsigned int blockDimX,
                                        unsigned int blockDimY, unsigned int blockDimZ,
                                        unsigned int sharedMemBytes, CUstream hStream,
                                        void **kernelParams)
{
    (void)sharedMemBytes;
    return launch(f, SHAPE(gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ), hStream,
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
        (r = kernel_duration(kernelParams, extra, &duration_ns)) != CUDA_SUCCESS)
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

static CUresult graph_launch(CUgraphExec hGraphExec, CUstream hStream)
{
    CUresult r = fake_ready_with_context();
    if (r != CUDA_SUCCESS)
        return r;
    if (hGraphExec == NULL || hGraphExec->magic != FAKE_EXEC_MAGIC || !fake_stream_valid(hStream))
        return CUDA_ERROR_INVALID_HANDLE;
    fgpu_run_kernel(hGraphExec->total_ns, 1);
    return CUDA_SUCCESS;
}

CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
    return graph_launch(hGraphExec, hStream);
}

CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
    return graph_launch(hGraphExec, hStream);
}

/* --- context synchronize ------------------------------------------------------------------ */

/* Waits for every launch of the process submitted before the call, one still waiting for its SM
 * units too (other threads' launches: the real call waits for all work submitted to the context). */
CUresult cuCtxSynchronize(void)
{
    CUresult r = fake_ready_with_context();
    if (r == CUDA_SUCCESS) {
        fgpu_wait_submitted();
        fgpu_count_ctx_sync();
    }
    return r;
}

#if CUDA_VERSION >= 13000
CUresult cuCtxSynchronize_v2(CUcontext ctx)
{
    CUresult r = fake_ready();
    if (r == CUDA_SUCCESS && ctx != NULL && ctx->magic != FAKE_CTX_MAGIC)
        r = CUDA_ERROR_INVALID_CONTEXT;
    if (r == CUDA_SUCCESS) {
        fgpu_wait_submitted();
        fgpu_count_ctx_sync();
    }
    return r;
}
#endif
