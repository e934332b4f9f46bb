/*
 * device_identity.h: what names the simulated GPU, answered alike by the driver (cuDeviceGetName,
 * cuDeviceGetPCIBusId) and by NVML (nvmlDeviceGetName, nvmlDeviceGetPciInfo_v3): its model name,
 * the setting FASTGSHARE_FAKE_GPU_NAME, and its PCI location. Its UUID is the state file's
 * (fake_gpu_state.h), so every process of one simulated GPU sees the same one.
 */
#ifndef FASTGSHARE_FAKE_DEVICE_IDENTITY_H
#define FASTGSHARE_FAKE_DEVICE_IDENTITY_H

#include <stddef.h>

#define FGPU_ENV_NAME "FASTGSHARE_FAKE_GPU_NAME"
#define FGPU_DEFAULT_NAME "FastGShare Fake GPU"
#define FGPU_NAME_MAX 95 /* NVML_DEVICE_NAME_V2_BUFFER_SIZE (96) less the NUL */

/* The PCI location: domain 0, bus 0, device 0, function 0 (one GPU a process). */
#define FGPU_PCI_DOMAIN 0u
#define FGPU_PCI_BUS 0u
#define FGPU_PCI_DEVICE 0u

/* The model name from FASTGSHARE_FAKE_GPU_NAME (unset or empty: FGPU_DEFAULT_NAME) into out:
 * 0, or -1 with one line in err naming the setting, its value and what is allowed
 * (1 to FGPU_NAME_MAX printable ASCII characters). */
int fgpu_read_name(char out[FGPU_NAME_MAX + 1], char *err, size_t err_len);

#endif
