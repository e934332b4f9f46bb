/*
 * nvml_events.c: NVML's event sets on the simulated GPU, which never has an event: the device
 * supports XID critical-error events (nvmlDeviceGetSupportedEventTypes), registering them succeeds
 * and any other type is NOT_SUPPORTED, and nvmlEventSetWait_v2 waits its timeout and answers
 * NVML_ERROR_TIMEOUT, as NVML does when no event arrives. Return codes are nvml.h's.
 */
#include "nvml_internal.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#define SUPPORTED_EVENTS nvmlEventTypeXidCriticalError
#define EVENT_SET_MAGIC 0x46455653u /* "FEVS": a set this library made and has not freed */

struct nvmlEventSet_st {
    uint32_t magic;
    unsigned long long registered; /* event types registered (informational: none ever occurs) */
};

static nvmlReturn_t check_set(nvmlEventSet_t set)
{
    nvmlReturn_t r = fnvml_check_initialised();
    if (r == NVML_SUCCESS && (set == NULL || set->magic != EVENT_SET_MAGIC))
        r = NVML_ERROR_INVALID_ARGUMENT;
    return r;
}

NVML_EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    nvmlReturn_t r = fnvml_check_initialised();
    if (r == NVML_SUCCESS && set == NULL)
        r = NVML_ERROR_INVALID_ARGUMENT;
    if (r != NVML_SUCCESS)
        return r;
    struct nvmlEventSet_st *made = calloc(1, sizeof *made);
    if (made == NULL)
        return NVML_ERROR_UNKNOWN;
    made->magic = EVENT_SET_MAGIC;
    *set = made;
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes)
{
    nvmlReturn_t r = fnvml_check_device(device);
    if (r == NVML_SUCCESS && eventTypes == NULL)
        r = NVML_ERROR_INVALID_ARGUMENT;
    if (r == NVML_SUCCESS)
        *eventTypes = SUPPORTED_EVENTS;
    return r;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes,
                                                  nvmlEventSet_t set)
{
    nvmlReturn_t r = fnvml_check_device(device);
    if (r == NVML_SUCCESS)
        r = check_set(set);
    if (r == NVML_SUCCESS && (eventTypes & ~SUPPORTED_EVENTS) != 0)
        r = NVML_ERROR_NOT_SUPPORTED; /* "some of the requested event types" are not supported */
    if (r == NVML_SUCCESS)
        set->registered |= eventTypes;
    return r;
}

/* Sleeps timeoutms milliseconds, across signals. */
static void sleep_ms(unsigned int timeoutms)
{
    struct timespec left = {.tv_sec = timeoutms / 1000, .tv_nsec = (long)(timeoutms % 1000) * 1000000L};
    while (nanosleep(&left, &left) != 0 && errno == EINTR)
        ;
}

NVML_EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    nvmlReturn_t r = check_set(set);
    if (r == NVML_SUCCESS && data == NULL)
        r = NVML_ERROR_INVALID_ARGUMENT;
    if (r != NVML_SUCCESS)
        return r;
    sleep_ms(timeoutms);
    return NVML_ERROR_TIMEOUT; /* the simulated GPU has no events */
}

NVML_EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    nvmlReturn_t r = check_set(set);
    if (r == NVML_SUCCESS) {
        set->magic = 0;
        free(set);
    }
    return r;
}
