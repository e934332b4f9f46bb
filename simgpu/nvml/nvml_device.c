/*
 * nvml_device.c: the simulated device's identity and MIG mode, as NVML answers them:
 * nvmlDeviceGetName (FASTGSHARE_FAKE_GPU_NAME, as the driver's cuDeviceGetName), nvmlDeviceGetUUID
 * (the state file's UUID, as cuDeviceGetUuid), nvmlDeviceGetPciInfo_v3 (the driver's PCI location),
 * nvmlDeviceGetIndex (0), nvmlDeviceGetMigMode (FASTGSHARE_FAKE_GPU_MIG) and
 * nvmlDeviceGetAttributes_v2 (NOT_SUPPORTED: NVML answers it for MIG device handles only, and the
 * simulation has none). Return codes are those nvml.h documents for each call.
 */
#include "nvml_internal.h"

#include "device_identity.h"

#include <stdio.h>
#include <string.h>

#define NVIDIA_VENDOR_ID 0x10deu
#define SIMULATED_DEVICE_ID 0x0000u /* no real product's PCI device id */
#define UUID_TEXT_LENGTH 40         /* "GPU-" and 8-4-4-4-12 hex digits */

/* text into out[length] as NVML copies strings: INSUFFICIENT_SIZE when it does not fit whole. */
static nvmlReturn_t copy_text(const char *text, char *out, unsigned int length)
{
    size_t needed = strlen(text) + 1;
    if (needed > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, text, needed);
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    nvmlReturn_t r = fnvml_check_device(device);
    if (r == NVML_SUCCESS && name == NULL)
        r = NVML_ERROR_INVALID_ARGUMENT;
    return r == NVML_SUCCESS ? copy_text(fnvml_name(), name, length) : r;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    nvmlReturn_t r = fnvml_check_device(device);
    if (r == NVML_SUCCESS && uuid == NULL)
        r = NVML_ERROR_INVALID_ARGUMENT;
    if (r != NVML_SUCCESS)
        return r;
    uint8_t b[16];
    char text[UUID_TEXT_LENGTH + 1];
    fnvml_uuid(b);
    snprintf(text, sizeof text, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
    return copy_text(text, uuid, length);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    nvmlReturn_t r = fnvml_check_device(device);
    if (r == NVML_SUCCESS && pci == NULL)
        r = NVML_ERROR_INVALID_ARGUMENT;
    if (r != NVML_SUCCESS)
        return r;
    *pci = (nvmlPciInfo_t){.domain = FGPU_PCI_DOMAIN, .bus = FGPU_PCI_BUS, .device = FGPU_PCI_DEVICE,
                           .pciDeviceId = SIMULATED_DEVICE_ID << 16 | NVIDIA_VENDOR_ID, .pciSubSystemId = 0};
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT, FGPU_PCI_DOMAIN,
             FGPU_PCI_BUS, FGPU_PCI_DEVICE);
    snprintf(pci->busId, sizeof pci->busId, NVML_DEVICE_PCI_BUS_ID_FMT, FGPU_PCI_DOMAIN, FGPU_PCI_BUS,
             FGPU_PCI_DEVICE);
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    nvmlReturn_t r = fnvml_check_device(device);
    if (r == NVML_SUCCESS && index == NULL)
        r = NVML_ERROR_INVALID_ARGUMENT;
    if (r == NVML_SUCCESS)
        *index = 0;
    return r;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
                                              unsigned int *pendingMode)
{
    nvmlReturn_t r = fnvml_check_device(device);
    if (r == NVML_SUCCESS && (currentMode == NULL || pendingMode == NULL))
        r = NVML_ERROR_INVALID_ARGUMENT;
    if (r != NVML_SUCCESS)
        return r;
    int mode = fnvml_mig_mode();
    if (mode == FNVML_NO_MIG)
        return NVML_ERROR_NOT_SUPPORTED;
    *currentMode = *pendingMode = (unsigned int)mode; /* no change pending */
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes)
{
    nvmlReturn_t r = fnvml_check_device(device);
    if (r == NVML_SUCCESS && attributes == NULL)
        r = NVML_ERROR_INVALID_ARGUMENT;
    return r == NVML_SUCCESS ? NVML_ERROR_NOT_SUPPORTED : r; /* a whole GPU, not a MIG device */
}
