/*
 * fake_cuda.c: the fake libcuda.so.1's init, driver version, export tables, the one device and
 * contexts: the primary context (retain/release with a reference count, reset, state, flags), a
 * per-thread context stack (push/pop, get/set current), cuCtxCreate/Destroy and every per-context
 * query and setting (device, API version, flags, limits, cache and shared-memory configs, stream
 * priorities, id). The attribute table is device_attributes.c; modules and streams are
 * fake_resources.c, memory fake_memory.c, launches and graphs fake_launch.c, cuGetProcAddress
 * proc_address.c, the shared device gpu_state.c.
 *
 * Deviations from the real driver, on purpose: one device (ordinal 0) whose SM count is
 * FASTGSHARE_FAKE_GPU_SMS (default 80) and whose name is FASTGSHARE_FAKE_GPU_NAME (device_identity.h); contexts own no resources (memory, modules and streams
 * outlive the context they were made in, and a destroyed context's handle stays allocated so that
 * a stale handle is refused, never followed); a child forked after cuInit cannot use CUDA.
 */
#include "fake_internal.h"

#include "device_identity.h"
#include "gpu_state.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CONTEXT_API_VERSION 3020 /* what cuCtxGetApiVersion reports, as for every context since 3.2 */
#define STACK_DEPTH 128          /* contexts a thread may push */

/* --- init -------------------------------------------------------------------------------- */

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static CUresult init_result = CUDA_ERROR_NOT_INITIALIZED; /* written once, inside init_once */
static int initialised;                                   /* atomic: cuInit succeeded here */
static int forked_child;                                  /* atomic: this is a fork()ed child */
static char device_name[FGPU_NAME_MAX + 1];               /* written once, inside init_once */

static void after_fork_child(void)
{
    __atomic_store_n(&initialised, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&forked_child, 1, __ATOMIC_RELEASE);
    fgpu_forget_after_fork();
}

static void do_init(void)
{
    char err[512];
    if (fake_device_configure(err, sizeof err) != 0 || fgpu_read_name(device_name, err, sizeof err) != 0) {
        fprintf(stderr, "fake libcuda: %s\n", err);
        init_result = CUDA_ERROR_INVALID_VALUE;
        return;
    }
    enum fgpu_status status = fgpu_attach(err, sizeof err);
    if (status != FGPU_OK) {
        fprintf(stderr, "fake libcuda: %s\n", err);
        init_result = status == FGPU_BAD_CONFIG ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NO_DEVICE;
        return;
    }
    pthread_atfork(NULL, NULL, after_fork_child);
    init_result = CUDA_SUCCESS;
    __atomic_store_n(&initialised, 1, __ATOMIC_RELEASE);
}

CUresult cuInit(unsigned int Flags)
{
    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (__atomic_load_n(&forked_child, __ATOMIC_ACQUIRE))
        return CUDA_ERROR_NOT_INITIALIZED; /* like the real driver: no CUDA after fork */
    pthread_once(&init_once, do_init);
    return init_result;
}

CUresult fake_ready(void)
{
    return __atomic_load_n(&initialised, __ATOMIC_ACQUIRE) ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

CUresult cuDriverGetVersion(int *driverVersion)
{
    if (driverVersion == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = FAKE_DRIVER_VERSION;
    return CUDA_SUCCESS;
}

/* The runtime's and NVRTC's private tables are not simulated. It must exist: NVRTC calls it after
 * cuInit and reads through a NULL function pointer when the driver lacks it. */
CUresult cuGetExportTable(const void **ppExportTable, const CUuuid *pExportTableId)
{
    (void)pExportTableId;
    if (ppExportTable != NULL)
        *ppExportTable = NULL;
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* --- the device -------------------------------------------------------------------------- */

static CUresult check_device(CUdevice dev)
{
    CUresult r = fake_ready();
    if (r == CUDA_SUCCESS && dev != 0)
        r = CUDA_ERROR_INVALID_DEVICE;
    return r;
}

CUresult cuDeviceGetCount(int *count)
{
    CUresult r = fake_ready();
    if (r == CUDA_SUCCESS && count == NULL)
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS)
        *count = 1;
    return r;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (device == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (ordinal != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    *device = 0;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    CUresult r = check_device(dev);
    if (r == CUDA_SUCCESS && (name == NULL || len <= 0))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS)
        snprintf(name, (size_t)len, "%s", device_name);
    return r;
}

static CUresult device_uuid(CUuuid *uuid, CUdevice dev)
{
    CUresult r = check_device(dev);
    if (r == CUDA_SUCCESS && uuid == NULL)
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        uint8_t bytes[16];
        fgpu_uuid(bytes);
        memcpy(uuid->bytes, bytes, sizeof bytes);
    }
    return r;
}

CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    return device_uuid(uuid, dev);
}

CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
    return device_uuid(uuid, dev);
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    CUresult r = check_device(dev);
    if (r == CUDA_SUCCESS && bytes == NULL)
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        uint64_t free_bytes, total;
        fgpu_mem_info(&free_bytes, &total);
        *bytes = (size_t)total;
    }
    return r;
}

CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
    size_t total = 0;
    CUresult r = bytes != NULL ? cuDeviceTotalMem_v2(&total, dev) : CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS)
        *bytes = total > 0xffffffffu ? 0xffffffffu : (unsigned int)total; /* the v1 ABI's 32 bits */
    return r;
}

CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    CUresult r = check_device(dev);
    if (r != CUDA_SUCCESS)
        return r;
    if (pi == NULL || fake_device_attribute((int)attrib, pi) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

static int attribute(CUdevice_attribute attrib)
{
    int value = 0;
    fake_device_attribute((int)attrib, &value);
    return value;
}

CUresult cuDeviceComputeCapability(int *major, int *minor, CUdevice dev)
{
    CUresult r = check_device(dev);
    if (r == CUDA_SUCCESS && (major == NULL || minor == NULL))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        *major = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
        *minor = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
    }
    return r;
}

CUresult cuDeviceGetProperties(CUdevprop *prop, CUdevice dev)
{
    CUresult r = check_device(dev);
    if (r == CUDA_SUCCESS && prop == NULL)
        r = CUDA_ERROR_INVALID_VALUE;
    if (r != CUDA_SUCCESS)
        return r;
    *prop = (CUdevprop){
        .maxThreadsPerBlock = attribute(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK),
        .maxThreadsDim = {attribute(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X), attribute(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y),
                          attribute(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z)},
        .maxGridSize = {attribute(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X), attribute(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y),
                        attribute(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z)},
        .sharedMemPerBlock = attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK),
        .totalConstantMemory = attribute(CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY),
        .SIMDWidth = attribute(CU_DEVICE_ATTRIBUTE_WARP_SIZE),
        .memPitch = attribute(CU_DEVICE_ATTRIBUTE_MAX_PITCH),
        .regsPerBlock = attribute(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK),
        .clockRate = attribute(CU_DEVICE_ATTRIBUTE_CLOCK_RATE),
        .textureAlign = attribute(CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT),
    };
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev)
{
    CUresult r = check_device(dev);
    if (r == CUDA_SUCCESS && (pciBusId == NULL || len <= 0))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS)
        snprintf(pciBusId, (size_t)len, "%04x:%02x:%02x.0", FGPU_PCI_DOMAIN, FGPU_PCI_BUS, FGPU_PCI_DEVICE);
    return r;
}

/* "[domain]:[bus]:[device].[function]", "[domain]:[bus]:[device]" or "[bus]:[device].[function]",
 * in hexadecimal, as cuDeviceGetByPCIBusId accepts them. */
static int parse_pci_bus_id(const char *text, unsigned int *domain, unsigned int *bus, unsigned int *device)
{
    unsigned int a, b, c, d;
    char tail;
    if (sscanf(text, "%x:%x:%x.%x%c", &a, &b, &c, &d, &tail) == 4 ||
        sscanf(text, "%x:%x:%x%c", &a, &b, &c, &tail) == 3) {
        *domain = a, *bus = b, *device = c;
        return 0;
    }
    if (sscanf(text, "%x:%x.%x%c", &a, &b, &d, &tail) == 3) {
        *domain = 0, *bus = a, *device = b;
        return 0;
    }
    return -1;
}

CUresult cuDeviceGetByPCIBusId(CUdevice *dev, const char *pciBusId)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    unsigned int domain, bus, device;
    if (dev == NULL || pciBusId == NULL || parse_pci_bus_id(pciBusId, &domain, &bus, &device) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (domain != FGPU_PCI_DOMAIN || bus != FGPU_PCI_BUS || device != FGPU_PCI_DEVICE)
        return CUDA_ERROR_INVALID_DEVICE;
    *dev = 0;
    return CUDA_SUCCESS;
}

CUresult cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev)
{
    CUresult r = check_device(dev);
    if (r == CUDA_SUCCESS)
        r = check_device(peerDev);
    if (r == CUDA_SUCCESS && canAccessPeer == NULL)
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS)
        *canAccessPeer = 0; /* one device: no peer */
    return r;
}

CUresult cuDeviceGetP2PAttribute(int *value, CUdevice_P2PAttribute attrib, CUdevice srcDevice, CUdevice dstDevice)
{
    (void)attrib;
    CUresult r = check_device(srcDevice);
    if (r == CUDA_SUCCESS)
        r = check_device(dstDevice);
    if (r == CUDA_SUCCESS && value == NULL)
        r = CUDA_ERROR_INVALID_VALUE;
    return r == CUDA_SUCCESS ? CUDA_ERROR_INVALID_DEVICE : r; /* the same device on both sides */
}

CUresult cuDeviceGetExecAffinitySupport(int *pi, CUexecAffinityType type, CUdevice dev)
{
    CUresult r = check_device(dev);
    if (r == CUDA_SUCCESS && (pi == NULL || type != CU_EXEC_AFFINITY_TYPE_SM_COUNT))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS)
        *pi = 0;
    return r;
}

CUresult cuDeviceGetTexture1DLinearMaxWidth(size_t *maxWidthInElements, CUarray_format format, unsigned numChannels,
                                            CUdevice dev)
{
    (void)format;
    CUresult r = check_device(dev);
    if (r == CUDA_SUCCESS && (maxWidthInElements == NULL || (numChannels != 1 && numChannels != 2 && numChannels != 4)))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS)
        *maxWidthInElements = (size_t)attribute(CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_LINEAR_WIDTH);
    return r;
}

/* Graphs allocate no memory of their own here: every graph-memory figure is 0. */
static int graph_mem_attr_valid(CUgraphMem_attribute attr)
{
    return attr == CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT || attr == CU_GRAPH_MEM_ATTR_USED_MEM_HIGH ||
           attr == CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT || attr == CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH;
}

CUresult cuDeviceGetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr, void *value)
{
    CUresult r = check_device(device);
    if (r == CUDA_SUCCESS && (value == NULL || !graph_mem_attr_valid(attr)))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS)
        *(cuuint64_t *)value = 0;
    return r;
}

CUresult cuDeviceSetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr, void *value)
{
    CUresult r = check_device(device);
    int high = attr == CU_GRAPH_MEM_ATTR_USED_MEM_HIGH || attr == CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH;
    if (r == CUDA_SUCCESS && (value == NULL || !high || *(cuuint64_t *)value != 0))
        r = CUDA_ERROR_INVALID_VALUE; /* only the high watermarks can be set, and only to 0 */
    return r;
}

CUresult cuDeviceGraphMemTrim(CUdevice device)
{
    return check_device(device);
}

/* --- contexts ------------------------------------------------------------------------------ */

enum { LIMIT_COUNT = CU_LIMIT_CIG_SHMEM_FALLBACK_ENABLED + 1 };

struct fake_context {
    struct CUctx_st base; /* what the other files see (magic, device); first, so the handle casts */
    int is_primary;
    unsigned int flags;
    unsigned long long id;
    size_t limits[LIMIT_COUNT];
    CUfunc_cache cache_config;
    CUsharedconfig shared_config;
};

static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER; /* guards the primary's state, ids */
static unsigned long long next_ctx_id = 1;
static struct fake_context primary = {.base = {FAKE_CTX_MAGIC, 0}, .is_primary = 1};
static unsigned int primary_refs; /* retains not yet released; active while > 0 */

static __thread CUcontext ctx_stack[STACK_DEPTH];
static __thread int ctx_depth;

static struct fake_context *as_fake(CUcontext ctx)
{
    return (struct fake_context *)ctx;
}

static void reset_context_state(struct fake_context *c)
{
    static const size_t defaults[LIMIT_COUNT] = {
        [CU_LIMIT_STACK_SIZE] = 1024,
        [CU_LIMIT_PRINTF_FIFO_SIZE] = 1048576,
        [CU_LIMIT_MALLOC_HEAP_SIZE] = 8388608,
        [CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH] = 2,
        [CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT] = 2048,
        [CU_LIMIT_MAX_L2_FETCH_GRANULARITY] = 64,
        [CU_LIMIT_PERSISTING_L2_CACHE_SIZE] = 0,
        [CU_LIMIT_SHMEM_SIZE] = 0,
        [CU_LIMIT_CIG_ENABLED] = 0,
        [CU_LIMIT_CIG_SHMEM_FALLBACK_ENABLED] = 1,
    };
    memcpy(c->limits, defaults, sizeof defaults);
    c->cache_config = CU_FUNC_CACHE_PREFER_NONE;
    c->shared_config = CU_SHARED_MEM_CONFIG_FOUR_BYTE_BANK_SIZE;
}

static unsigned long long new_context_id(void)
{
    pthread_mutex_lock(&ctx_lock);
    unsigned long long id = next_ctx_id++;
    pthread_mutex_unlock(&ctx_lock);
    return id;
}

static int primary_active(void)
{
    pthread_mutex_lock(&ctx_lock);
    int active = primary_refs > 0;
    pthread_mutex_unlock(&ctx_lock);
    return active;
}

int fake_context_valid(CUcontext ctx)
{
    if (ctx == NULL || ctx->magic != FAKE_CTX_MAGIC)
        return 0;
    return !as_fake(ctx)->is_primary || primary_active();
}

CUcontext fake_current_context(void)
{
    return ctx_depth > 0 ? ctx_stack[ctx_depth - 1] : NULL;
}

CUresult fake_ready_with_context(void)
{
    CUresult r = fake_ready();
    CUcontext ctx = fake_current_context();
    if (r == CUDA_SUCCESS && (ctx == NULL || ctx->magic != FAKE_CTX_MAGIC))
        r = CUDA_ERROR_INVALID_CONTEXT;
    if (r == CUDA_SUCCESS && as_fake(ctx)->is_primary && !primary_active())
        r = CUDA_ERROR_CONTEXT_IS_DESTROYED; /* released to zero while still current */
    return r;
}

/* ctx, or the current context when ctx is NULL: the context a query names. */
static CUresult named_context(CUcontext ctx, struct fake_context **out)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (ctx == NULL)
        ctx = fake_current_context();
    if (!fake_context_valid(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    *out = as_fake(ctx);
    return CUDA_SUCCESS;
}

/* The current context for a query or setting of "the current context". */
static CUresult current(struct fake_context **out)
{
    CUresult r = fake_ready_with_context();
    if (r == CUDA_SUCCESS)
        *out = as_fake(fake_current_context());
    return r;
}

static int context_flags_valid(unsigned int flags)
{
    unsigned int sched = flags & CU_CTX_SCHED_MASK;
    return (flags & ~(unsigned int)CU_CTX_FLAGS_MASK) == 0 && sched != 3 && sched <= CU_CTX_SCHED_BLOCKING_SYNC;
}

static CUresult push(CUcontext ctx)
{
    if (ctx_depth == STACK_DEPTH)
        return CUDA_ERROR_OUT_OF_MEMORY;
    ctx_stack[ctx_depth++] = ctx;
    return CUDA_SUCCESS;
}

/* cuCtxCreate: a new context, pushed on the calling thread's stack. */
static CUresult context_create(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    CUresult r = check_device(dev);
    if (r != CUDA_SUCCESS)
        return r;
    if (pctx == NULL || !context_flags_valid(flags))
        return CUDA_ERROR_INVALID_VALUE;
    if (ctx_depth == STACK_DEPTH)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct fake_context *c = calloc(1, sizeof *c);
    if (c == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    c->base = (struct CUctx_st){.magic = FAKE_CTX_MAGIC, .device = dev};
    c->flags = flags;
    c->id = new_context_id();
    reset_context_state(c);
    push(&c->base);
    *pctx = &c->base;
    return CUDA_SUCCESS;
}

CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    return context_create(pctx, flags, dev);
}

CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    return context_create(pctx, flags, dev);
}

CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams, unsigned int flags,
                        CUdevice dev)
{
    if (numParams < 0 || (numParams > 0 && paramsArray == NULL))
        return CUDA_ERROR_INVALID_VALUE;
    if (numParams > 0)
        return CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY; /* cuDeviceGetExecAffinitySupport says 0 */
    return context_create(pctx, flags, dev);
}

CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags, CUdevice dev)
{
    if (ctxCreateParams != NULL && ctxCreateParams->numExecAffinityParams > 0)
        return CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY;
    if (ctxCreateParams != NULL && ctxCreateParams->cigParams != NULL)
        return CUDA_ERROR_NOT_SUPPORTED; /* no graphics interop */
    return context_create(pctx, flags, dev);
}

static CUresult context_destroy(CUcontext ctx)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (ctx == NULL || ctx->magic != FAKE_CTX_MAGIC || as_fake(ctx)->is_primary)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (fake_current_context() == ctx)
        ctx_depth--;
    ctx->magic = 0; /* kept allocated: a stale handle elsewhere is refused, not followed */
    return CUDA_SUCCESS;
}

CUresult cuCtxDestroy(CUcontext ctx)
{
    return context_destroy(ctx);
}

CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    return context_destroy(ctx);
}

CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    CUresult r = fake_ready();
    if (r == CUDA_SUCCESS && pctx == NULL)
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS)
        *pctx = fake_current_context();
    return r;
}

/* Replaces the top of the stack (pushes onto an empty one); NULL pops. */
CUresult cuCtxSetCurrent(CUcontext ctx)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (ctx == NULL) {
        if (ctx_depth > 0)
            ctx_depth--;
        return CUDA_SUCCESS;
    }
    if (!fake_context_valid(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx_depth == 0)
        return push(ctx);
    ctx_stack[ctx_depth - 1] = ctx;
    return CUDA_SUCCESS;
}

static CUresult push_current(CUcontext ctx)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (!fake_context_valid(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    return push(ctx);
}

CUresult cuCtxPushCurrent(CUcontext ctx)
{
    return push_current(ctx);
}

CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    return push_current(ctx);
}

static CUresult pop_current(CUcontext *pctx)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (ctx_depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    CUcontext top = ctx_stack[--ctx_depth];
    if (pctx != NULL)
        *pctx = top;
    return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent(CUcontext *pctx)
{
    return pop_current(pctx);
}

CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
    return pop_current(pctx);
}

CUresult cuCtxGetDevice(CUdevice *device)
{
    struct fake_context *c = NULL;
    CUresult r = current(&c);
    if (r == CUDA_SUCCESS && device == NULL)
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS)
        *device = c->base.device;
    return r;
}

CUresult cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx)
{
    struct fake_context *c = NULL;
    CUresult r = named_context(ctx, &c);
    if (r == CUDA_SUCCESS && device == NULL)
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS)
        *device = c->base.device;
    return r;
}

CUresult cuCtxGetApiVersion(CUcontext ctx, unsigned int *version)
{
    struct fake_context *c = NULL;
    CUresult r = named_context(ctx, &c);
    if (r == CUDA_SUCCESS && version == NULL)
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS)
        *version = CONTEXT_API_VERSION;
    return r;
}

CUresult cuCtxGetId(CUcontext ctx, unsigned long long *ctxId)
{
    struct fake_context *c = NULL;
    CUresult r = named_context(ctx, &c);
    if (r == CUDA_SUCCESS && ctxId == NULL)
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        pthread_mutex_lock(&ctx_lock);
        *ctxId = c->id;
        pthread_mutex_unlock(&ctx_lock);
    }
    return r;
}

CUresult cuCtxGetFlags(unsigned int *flags)
{
    struct fake_context *c = NULL;
    CUresult r = current(&c);
    if (r == CUDA_SUCCESS && flags == NULL)
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        pthread_mutex_lock(&ctx_lock);
        *flags = c->flags;
        pthread_mutex_unlock(&ctx_lock);
    }
    return r;
}

CUresult cuCtxSetFlags(unsigned int flags)
{
    struct fake_context *c = NULL;
    CUresult r = current(&c);
    if (r == CUDA_SUCCESS && !context_flags_valid(flags))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        pthread_mutex_lock(&ctx_lock);
        c->flags = flags;
        pthread_mutex_unlock(&ctx_lock);
    }
    return r;
}

CUresult cuCtxGetLimit(size_t *pvalue, CUlimit limit)
{
    struct fake_context *c = NULL;
    CUresult r = current(&c);
    if (r == CUDA_SUCCESS && pvalue == NULL)
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS && ((int)limit < 0 || (int)limit >= LIMIT_COUNT))
        r = CUDA_ERROR_UNSUPPORTED_LIMIT;
    if (r == CUDA_SUCCESS) {
        pthread_mutex_lock(&ctx_lock);
        *pvalue = c->limits[limit];
        pthread_mutex_unlock(&ctx_lock);
    }
    return r;
}

static CUresult check_limit_value(CUlimit limit, size_t value)
{
    switch (limit) {
    case CU_LIMIT_SHMEM_SIZE:
    case CU_LIMIT_CIG_ENABLED: return CUDA_ERROR_UNSUPPORTED_LIMIT; /* query only */
    case CU_LIMIT_MAX_L2_FETCH_GRANULARITY: return value <= 128 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    case CU_LIMIT_PERSISTING_L2_CACHE_SIZE:
        return value <= (size_t)attribute(CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE) ? CUDA_SUCCESS
                                                                                           : CUDA_ERROR_INVALID_VALUE;
    default: return (int)limit >= 0 && (int)limit < LIMIT_COUNT ? CUDA_SUCCESS : CUDA_ERROR_UNSUPPORTED_LIMIT;
    }
}

CUresult cuCtxSetLimit(CUlimit limit, size_t value)
{
    struct fake_context *c = NULL;
    CUresult r = current(&c);
    if (r == CUDA_SUCCESS)
        r = check_limit_value(limit, value);
    if (r == CUDA_SUCCESS) {
        pthread_mutex_lock(&ctx_lock);
        c->limits[limit] = value;
        pthread_mutex_unlock(&ctx_lock);
    }
    return r;
}

CUresult cuCtxGetCacheConfig(CUfunc_cache *pconfig)
{
    struct fake_context *c = NULL;
    CUresult r = current(&c);
    if (r == CUDA_SUCCESS && pconfig == NULL)
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        pthread_mutex_lock(&ctx_lock);
        *pconfig = c->cache_config;
        pthread_mutex_unlock(&ctx_lock);
    }
    return r;
}

CUresult cuCtxSetCacheConfig(CUfunc_cache config)
{
    struct fake_context *c = NULL;
    CUresult r = current(&c);
    if (r == CUDA_SUCCESS && (config < CU_FUNC_CACHE_PREFER_NONE || config > CU_FUNC_CACHE_PREFER_EQUAL))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        pthread_mutex_lock(&ctx_lock);
        c->cache_config = config;
        pthread_mutex_unlock(&ctx_lock);
    }
    return r;
}

CUresult cuCtxGetSharedMemConfig(CUsharedconfig *pConfig)
{
    struct fake_context *c = NULL;
    CUresult r = current(&c);
    if (r == CUDA_SUCCESS && pConfig == NULL)
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        pthread_mutex_lock(&ctx_lock);
        *pConfig = c->shared_config;
        pthread_mutex_unlock(&ctx_lock);
    }
    return r;
}

CUresult cuCtxSetSharedMemConfig(CUsharedconfig config)
{
    struct fake_context *c = NULL;
    CUresult r = current(&c);
    if (r == CUDA_SUCCESS && (config < CU_SHARED_MEM_CONFIG_DEFAULT_BANK_SIZE ||
                              config > CU_SHARED_MEM_CONFIG_EIGHT_BYTE_BANK_SIZE))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        pthread_mutex_lock(&ctx_lock);
        c->shared_config = config;
        pthread_mutex_unlock(&ctx_lock);
    }
    return r;
}

CUresult cuCtxGetStreamPriorityRange(int *leastPriority, int *greatestPriority)
{
    struct fake_context *c = NULL;
    CUresult r = current(&c);
    if (r == CUDA_SUCCESS && leastPriority != NULL)
        *leastPriority = FAKE_STREAM_LEAST_PRIORITY;
    if (r == CUDA_SUCCESS && greatestPriority != NULL)
        *greatestPriority = FAKE_STREAM_GREATEST_PRIORITY;
    return r;
}

CUresult cuCtxResetPersistingL2Cache(void)
{
    struct fake_context *c = NULL;
    return current(&c);
}

CUresult cuCtxGetExecAffinity(CUexecAffinityParam *pExecAffinity, CUexecAffinityType type)
{
    struct fake_context *c = NULL;
    CUresult r = current(&c);
    if (r == CUDA_SUCCESS && (pExecAffinity == NULL || type != CU_EXEC_AFFINITY_TYPE_SM_COUNT))
        r = CUDA_ERROR_INVALID_VALUE;
    return r == CUDA_SUCCESS ? CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY : r;
}

/* One device: a context's peer is on its own device. */
CUresult cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags)
{
    struct fake_context *c = NULL;
    CUresult r = current(&c);
    if (r == CUDA_SUCCESS && Flags != 0)
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS && !fake_context_valid(peerContext))
        r = CUDA_ERROR_INVALID_CONTEXT;
    return r == CUDA_SUCCESS ? CUDA_ERROR_INVALID_DEVICE : r;
}

CUresult cuCtxDisablePeerAccess(CUcontext peerContext)
{
    struct fake_context *c = NULL;
    CUresult r = current(&c);
    if (r == CUDA_SUCCESS && !fake_context_valid(peerContext))
        r = CUDA_ERROR_INVALID_CONTEXT;
    return r == CUDA_SUCCESS ? CUDA_ERROR_PEER_ACCESS_NOT_ENABLED : r;
}

/* --- the primary context --------------------------------------------------------------------- */

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    CUresult r = check_device(dev);
    if (r == CUDA_SUCCESS && pctx == NULL)
        r = CUDA_ERROR_INVALID_VALUE;
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&ctx_lock);
    if (primary_refs++ == 0) { /* (re)activated: a new context as far as ids and state go */
        primary.id = next_ctx_id++;
        reset_context_state(&primary);
    }
    pthread_mutex_unlock(&ctx_lock);
    *pctx = &primary.base;
    return CUDA_SUCCESS;
}

static CUresult primary_release(CUdevice dev)
{
    CUresult r = check_device(dev);
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&ctx_lock);
    if (primary_refs == 0)
        r = CUDA_ERROR_INVALID_CONTEXT;
    else
        primary_refs--;
    pthread_mutex_unlock(&ctx_lock);
    return r;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    return primary_release(dev);
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    return primary_release(dev);
}

/* Resets the state and flags; the retains stand (a retained context must still be released). */
static CUresult primary_reset(CUdevice dev)
{
    CUresult r = check_device(dev);
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&ctx_lock);
    primary.flags = 0;
    reset_context_state(&primary);
    pthread_mutex_unlock(&ctx_lock);
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxReset(CUdevice dev)
{
    return primary_reset(dev);
}

CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    return primary_reset(dev);
}

CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    CUresult r = check_device(dev);
    if (r == CUDA_SUCCESS && (flags == NULL || active == NULL))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        pthread_mutex_lock(&ctx_lock);
        *flags = primary.flags;
        *active = primary_refs > 0;
        pthread_mutex_unlock(&ctx_lock);
    }
    return r;
}

static CUresult primary_set_flags(CUdevice dev, unsigned int flags)
{
    CUresult r = check_device(dev);
    if (r == CUDA_SUCCESS && !context_flags_valid(flags))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        pthread_mutex_lock(&ctx_lock);
        primary.flags = flags;
        pthread_mutex_unlock(&ctx_lock);
    }
    return r;
}

CUresult cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags)
{
    return primary_set_flags(dev, flags);
}

CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags)
{
    return primary_set_flags(dev, flags);
}
