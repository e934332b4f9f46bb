/*
 * nvml_internal.h: what the simulated libnvidia-ml.so.1's files share. fake_nvml.c owns
 * initialisation (the state file, the settings) and the one device handle; nvml_device.c and
 * nvml_events.c answer from what it read.
 */
#ifndef FASTGSHARE_NVML_INTERNAL_H
#define FASTGSHARE_NVML_INTERNAL_H

#include "nvml_device_api.h"

#include <stdint.h>

#define NVML_EXPORT __attribute__((visibility("default")))

#define FNVML_ENV_MIG "FASTGSHARE_FAKE_GPU_MIG"
#define FNVML_NO_MIG (-1) /* a GPU without MIG: nvmlDeviceGetMigMode answers NOT_SUPPORTED */

/* NVML_SUCCESS for the simulated device after nvmlInit; NVML_ERROR_UNINITIALIZED before it (or
 * after the last nvmlShutdown); NVML_ERROR_INVALID_ARGUMENT for any other handle. */
nvmlReturn_t fnvml_check_device(nvmlDevice_t device);

/* NVML_SUCCESS after nvmlInit, else NVML_ERROR_UNINITIALIZED. */
nvmlReturn_t fnvml_check_initialised(void);

/* Set by the first successful nvmlInit, fixed afterwards. */
const char *fnvml_name(void);
void fnvml_uuid(uint8_t out[16]);
int fnvml_mig_mode(void); /* NVML_DEVICE_MIG_DISABLE, NVML_DEVICE_MIG_ENABLE or FNVML_NO_MIG */

#endif
