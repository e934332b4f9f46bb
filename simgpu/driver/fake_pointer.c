/*
 * fake_pointer.c: what the fake libcuda.so.1 says about a pointer: cuPointerGetAttribute,
 * cuPointerGetAttributes, cuPointerSetAttribute (SYNC_MEMOPS) and cuMemGetAddressRange (v1, v2),
 * from the allocation table of fake_memory.c.
 *
 * As with unified addressing on the real driver: device, managed and page-locked host memory have
 * one address, which is both their device and their host pointer (device memory here is host
 * memory of the process, but it answers no host pointer, as on a GPU). A pointer the driver does
 * not know is CUDA_ERROR_INVALID_VALUE for cuPointerGetAttribute and zeros (success) for
 * cuPointerGetAttributes, as documented.
 */
#include "fake_memory.h"

#include <string.h>

/* One attribute of a known allocation into data; CUDA_ERROR_INVALID_VALUE for an unknown one. */
static CUresult known_attribute(const struct fake_mem_info *m, CUpointer_attribute attribute, uint64_t ptr,
                                void *data)
{
    int host = m->kind == FAKE_MEM_HOST || m->managed;
    switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext *)data = m->ctx; return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned int *)data = m->kind == FAKE_MEM_HOST ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *(CUdeviceptr *)data = (CUdeviceptr)ptr; return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        if (!host)
            return CUDA_ERROR_INVALID_VALUE; /* device memory has no host address */
        *(void **)data = (void *)(uintptr_t)ptr;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_P2P_TOKENS: return CUDA_ERROR_NOT_SUPPORTED;
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS: *(int *)data = m->sync_memops; return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID: *(unsigned long long *)data = m->id; return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: *(int *)data = m->managed; return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data = 0; return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: *(int *)data = m->legacy_ipc; return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr *)data = (CUdeviceptr)m->start; return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)data = (size_t)m->size; return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPED: *(int *)data = 1; return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES: *(unsigned long long *)data = 0; return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE: *(int *)data = 0; return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
        *(unsigned int *)data = CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE: *(CUmemoryPool *)data = m->pool; return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE: *(size_t *)data = (size_t)m->mapping_size; return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR: *(void **)data = (void *)(uintptr_t)m->mapping_start; return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE: *(int *)data = 0; return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
}

CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    struct fake_mem_info m;
    if (data == NULL || fake_mem_query((uint64_t)ptr, &m) != 0)
        return CUDA_ERROR_INVALID_VALUE; /* a pointer the driver does not know */
    return known_attribute(&m, attribute, (uint64_t)ptr, data);
}

/* The bytes cuPointerGetAttributes writes for an attribute (its zero for an unknown pointer). */
static size_t attribute_size(CUpointer_attribute attribute)
{
    switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR: return sizeof(void *);
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: return sizeof(CUdeviceptr);
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES: return sizeof(unsigned long long);
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE: return sizeof(size_t);
    case CU_POINTER_ATTRIBUTE_P2P_TOKENS: return sizeof(CUDA_POINTER_ATTRIBUTE_P2P_TOKENS);
    default: return sizeof(int);
    }
}

CUresult cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute *attributes, void **data,
                                CUdeviceptr ptr)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (numAttributes == 0 || attributes == NULL || data == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    struct fake_mem_info m;
    int known = fake_mem_query((uint64_t)ptr, &m) == 0;
    for (unsigned int i = 0; i < numAttributes; i++) {
        if (attributes[i] < CU_POINTER_ATTRIBUTE_CONTEXT || attributes[i] > CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE)
            return CUDA_ERROR_INVALID_VALUE;
        if (data[i] == NULL)
            continue;
        memset(data[i], 0, attribute_size(attributes[i]));
        if (known)
            known_attribute(&m, attributes[i], (uint64_t)ptr, data[i]); /* an attribute it lacks stays 0 */
    }
    return CUDA_SUCCESS;
}

CUresult cuPointerSetAttribute(const void *value, CUpointer_attribute attribute, CUdeviceptr ptr)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (value == NULL || attribute != CU_POINTER_ATTRIBUTE_SYNC_MEMOPS)
        return CUDA_ERROR_INVALID_VALUE; /* the only settable attribute */
    return fake_mem_set_sync_memops((uint64_t)ptr, *(const int *)value) == 0 ? CUDA_SUCCESS
                                                                               : CUDA_ERROR_INVALID_VALUE;
}

static CUresult address_range(uint64_t ptr, uint64_t *base, uint64_t *size)
{
    CUresult r = fake_ready_with_context();
    if (r != CUDA_SUCCESS)
        return r;
    struct fake_mem_info m;
    if (fake_mem_query(ptr, &m) != 0)
        return CUDA_ERROR_NOT_FOUND;
    *base = m.mapping_start;
    *size = m.mapping_size;
    return CUDA_SUCCESS;
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    uint64_t base = 0, size = 0;
    CUresult r = address_range((uint64_t)dptr, &base, &size);
    if (r == CUDA_SUCCESS && pbase != NULL)
        *pbase = (CUdeviceptr)base;
    if (r == CUDA_SUCCESS && psize != NULL)
        *psize = (size_t)size;
    return r;
}

CUresult cuMemGetAddressRange(CUdeviceptr_v1 *pbase, unsigned int *psize, CUdeviceptr_v1 dptr)
{
    uint64_t base = 0, size = 0;
    CUresult r = address_range((uint64_t)dptr, &base, &size);
    if (r == CUDA_SUCCESS && (base > 0xffffffffu || size > 0xffffffffu))
        r = CUDA_ERROR_INVALID_VALUE; /* not expressible in the 32-bit ABI */
    if (r == CUDA_SUCCESS && pbase != NULL)
        *pbase = (CUdeviceptr_v1)base;
    if (r == CUDA_SUCCESS && psize != NULL)
        *psize = (unsigned int)size;
    return r;
}
