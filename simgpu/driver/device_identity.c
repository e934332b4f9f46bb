/*
 * device_identity.c: the simulated GPU's model name setting (device_identity.h), read by the driver
 * at cuInit and by NVML at nvmlInit. Linked into both libraries.
 */
#include "device_identity.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int printable_ascii(const char *text)
{
    for (; *text != '\0'; text++)
        if (*text < 0x20 || *text > 0x7e)
            return 0;
    return 1;
}

int fgpu_read_name(char out[FGPU_NAME_MAX + 1], char *err, size_t err_len)
{
    const char *text = getenv(FGPU_ENV_NAME);
    if (text == NULL || *text == '\0')
        text = FGPU_DEFAULT_NAME;
    if (strlen(text) > FGPU_NAME_MAX || !printable_ascii(text)) {
        snprintf(err, err_len, FGPU_ENV_NAME "=%.200s is not a GPU name: 1 to %d printable ASCII characters",
                 text, FGPU_NAME_MAX);
        return -1;
    }
    memcpy(out, text, strlen(text) + 1);
    return 0;
}
