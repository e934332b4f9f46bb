/*
 * fake_occupancy.c: the occupancy calculator of the fake libcuda.so.1 (cuOccupancy*): blocks per
 * SM, the block size of best occupancy, the dynamic shared memory left per block and cluster
 * figures, from the block size, the dynamic shared memory and the modelled GPU's attribute table
 * (device_attributes.c), the way CUDA's occupancy calculator computes them.
 *
 * A function's own resources come from its attributes (fake_function_attribute, what
 * cuFuncGetAttribute answers) where it has them: registers, static shared memory, its thread and
 * dynamic shared-memory limits. Where it does not, a kernel is assumed to use 32 registers a
 * thread, no static shared memory, up to 1024 threads a block and 48 KiB of dynamic shared memory
 * (the limit without an opt-in). Registers are allocated per warp in
 * units of 256, and every block also takes the 1 KiB of shared memory the system reserves.
 */
#include "fake_internal.h"

#include <stddef.h>

#define DEFAULT_REGS_PER_THREAD 32
#define DEFAULT_MAX_DYNAMIC_SMEM 49152
#define REGISTER_UNIT 256
#define PORTABLE_CLUSTER 8
#define MAX_CLUSTER 16

/* What a kernel takes: registers a thread, static shared memory and its own limits. */
struct kernel_model {
    int regs;
    size_t static_smem, max_dynamic_smem;
    int max_threads;
};

static int attr(CUdevice_attribute a)
{
    int value = 0;
    fake_device_attribute((int)a, &value);
    return value;
}

static void model_of(CUfunction f, struct kernel_model *m)
{
    *m = (struct kernel_model){DEFAULT_REGS_PER_THREAD, 0, DEFAULT_MAX_DYNAMIC_SMEM,
                               attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)};
    int v;
    if (fake_function_attribute(f, CU_FUNC_ATTRIBUTE_NUM_REGS, &v) == CUDA_SUCCESS && v > 0)
        m->regs = v;
    if (fake_function_attribute(f, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, &v) == CUDA_SUCCESS && v >= 0)
        m->static_smem = (size_t)v;
    if (fake_function_attribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, &v) == CUDA_SUCCESS && v >= 0)
        m->max_dynamic_smem = (size_t)v;
    if (fake_function_attribute(f, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, &v) == CUDA_SUCCESS && v > 0 &&
        v < m->max_threads)
        m->max_threads = v;
}

static int min_int(int a, int b)
{
    return a < b ? a : b;
}

/* Resident blocks of block_size threads with dynamic_smem bytes each on one SM (0: none fits). */
static int blocks_per_sm(const struct kernel_model *m, int block_size, size_t dynamic_smem)
{
    if (block_size <= 0 || block_size > m->max_threads || dynamic_smem > m->max_dynamic_smem)
        return 0;
    int warp = attr(CU_DEVICE_ATTRIBUTE_WARP_SIZE);
    int warps = (block_size + warp - 1) / warp;
    int regs_per_warp = (m->regs * warp + REGISTER_UNIT - 1) / REGISTER_UNIT * REGISTER_UNIT;
    size_t smem = m->static_smem + dynamic_smem;
    if (warps * regs_per_warp > attr(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK) ||
        smem > (size_t)attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN))
        return 0;
    smem += (size_t)attr(CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK);
    int by_threads = attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR) / (warps * warp);
    int by_regs = attr(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR) / (warps * regs_per_warp);
    int by_smem = (int)((size_t)attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR) / smem);
    return min_int(min_int(attr(CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR), by_threads),
                   min_int(by_regs, by_smem));
}

static CUresult check(CUfunction func, unsigned int flags)
{
    CUresult r = fake_ready();
    if (r == CUDA_SUCCESS && !fake_function_valid(func))
        r = CUDA_ERROR_INVALID_HANDLE;
    if (r == CUDA_SUCCESS && flags != CU_OCCUPANCY_DEFAULT && flags != CU_OCCUPANCY_DISABLE_CACHING_OVERRIDE)
        r = CUDA_ERROR_INVALID_VALUE;
    return r;
}

static CUresult max_active_blocks(int *numBlocks, CUfunction func, int blockSize, size_t dynamicSMemSize,
                                  unsigned int flags)
{
    CUresult r = check(func, flags);
    if (r == CUDA_SUCCESS && numBlocks == NULL)
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        struct kernel_model m;
        model_of(func, &m);
        *numBlocks = blocks_per_sm(&m, blockSize, dynamicSMemSize);
    }
    return r;
}

CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, CUfunction func, int blockSize,
                                                     size_t dynamicSMemSize)
{
    return max_active_blocks(numBlocks, func, blockSize, dynamicSMemSize, CU_OCCUPANCY_DEFAULT);
}

CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *numBlocks, CUfunction func, int blockSize,
                                                              size_t dynamicSMemSize, unsigned int flags)
{
    return max_active_blocks(numBlocks, func, blockSize, dynamicSMemSize, flags);
}

/* The block size (a multiple of the warp, at most the limit) with the most resident threads. */
static CUresult potential_block_size(int *minGridSize, int *blockSize, CUfunction func,
                                     CUoccupancyB2DSize blockSizeToDynamicSMemSize, size_t dynamicSMemSize,
                                     int blockSizeLimit, unsigned int flags)
{
    CUresult r = check(func, flags);
    if (r == CUDA_SUCCESS && (minGridSize == NULL || blockSize == NULL || blockSizeLimit < 0))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r != CUDA_SUCCESS)
        return r;
    struct kernel_model m;
    model_of(func, &m);
    int warp = attr(CU_DEVICE_ATTRIBUTE_WARP_SIZE);
    int limit = blockSizeLimit > 0 && blockSizeLimit < m.max_threads ? blockSizeLimit : m.max_threads;
    int best_size = 0, best_blocks = 0;
    for (int size = limit; size > 0; size = (size - 1) / warp * warp) {
        size_t smem = blockSizeToDynamicSMemSize != NULL ? blockSizeToDynamicSMemSize(size) : dynamicSMemSize;
        int blocks = blocks_per_sm(&m, size, smem);
        if ((long)blocks * size > (long)best_blocks * best_size) {
            best_size = size;
            best_blocks = blocks;
        }
    }
    *blockSize = best_size;
    *minGridSize = best_blocks * attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
    return CUDA_SUCCESS;
}

CUresult cuOccupancyMaxPotentialBlockSize(int *minGridSize, int *blockSize, CUfunction func,
                                          CUoccupancyB2DSize blockSizeToDynamicSMemSize, size_t dynamicSMemSize,
                                          int blockSizeLimit)
{
    return potential_block_size(minGridSize, blockSize, func, blockSizeToDynamicSMemSize, dynamicSMemSize,
                                blockSizeLimit, CU_OCCUPANCY_DEFAULT);
}

CUresult cuOccupancyMaxPotentialBlockSizeWithFlags(int *minGridSize, int *blockSize, CUfunction func,
                                                   CUoccupancyB2DSize blockSizeToDynamicSMemSize,
                                                   size_t dynamicSMemSize, int blockSizeLimit, unsigned int flags)
{
    return potential_block_size(minGridSize, blockSize, func, blockSizeToDynamicSMemSize, dynamicSMemSize,
                                blockSizeLimit, flags);
}

CUresult cuOccupancyAvailableDynamicSMemPerBlock(size_t *dynamicSmemSize, CUfunction func, int numBlocks,
                                                 int blockSize)
{
    CUresult r = check(func, CU_OCCUPANCY_DEFAULT);
    if (r == CUDA_SUCCESS && (dynamicSmemSize == NULL || numBlocks <= 0 || blockSize <= 0))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r != CUDA_SUCCESS)
        return r;
    struct kernel_model m;
    model_of(func, &m);
    m.max_dynamic_smem = (size_t)attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
    size_t per_block = (size_t)attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR) / (size_t)numBlocks;
    size_t fixed = m.static_smem + (size_t)attr(CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK);
    size_t available = per_block > fixed ? per_block - fixed : 0;
    size_t cap = m.max_dynamic_smem > m.static_smem ? m.max_dynamic_smem - m.static_smem : 0;
    if (available > cap)
        available = cap;
    *dynamicSmemSize = blocks_per_sm(&m, blockSize, 0) >= numBlocks ? available : 0;
    return CUDA_SUCCESS;
}

/* The cluster size a launch configuration asks for (1 when it asks none). */
static int cluster_size(const CUlaunchConfig *config)
{
    for (unsigned int i = 0; i < config->numAttrs && config->attrs != NULL; i++) {
        if (config->attrs[i].id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) {
            const CUlaunchAttributeValue *v = &config->attrs[i].value;
            return (int)(v->clusterDim.x * v->clusterDim.y * v->clusterDim.z);
        }
    }
    return 1;
}

CUresult cuOccupancyMaxPotentialClusterSize(int *clusterSize, CUfunction func, const CUlaunchConfig *config)
{
    CUresult r = check(func, CU_OCCUPANCY_DEFAULT);
    if (r == CUDA_SUCCESS && (clusterSize == NULL || config == NULL))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        struct kernel_model m;
        model_of(func, &m);
        int threads = (int)(config->blockDimX * config->blockDimY * config->blockDimZ);
        *clusterSize = blocks_per_sm(&m, threads, config->sharedMemBytes) > 0 ? PORTABLE_CLUSTER : 0;
    }
    return r;
}

CUresult cuOccupancyMaxActiveClusters(int *numClusters, CUfunction func, const CUlaunchConfig *config)
{
    CUresult r = check(func, CU_OCCUPANCY_DEFAULT);
    if (r == CUDA_SUCCESS && (numClusters == NULL || config == NULL))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r != CUDA_SUCCESS)
        return r;
    int cluster = cluster_size(config);
    if (cluster <= 0 || cluster > MAX_CLUSTER)
        return CUDA_ERROR_INVALID_CLUSTER_SIZE;
    struct kernel_model m;
    model_of(func, &m);
    int threads = (int)(config->blockDimX * config->blockDimY * config->blockDimZ);
    int blocks = blocks_per_sm(&m, threads, config->sharedMemBytes);
    *numClusters = blocks * attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) / cluster;
    return CUDA_SUCCESS;
}
