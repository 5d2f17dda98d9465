/*
 * The part of the fake libnvidia-ml.so.1 that NVIDIA's k8s-device-plugin (v0.20.0) calls beyond
 * what gpuhook itself uses (fake_nvml.c): its health check's event sets, and the topology and
 * NvLink queries of its preferred allocation. Compiled into the same library by tools/fake-node.
 *
 * go-nvml resolves each NVML function at its first call and the plugin dies on a missing one
 * (symbol lookup error), so every function it reaches must exist; a query with no meaning on the
 * fake node answers NVML_ERROR_NOT_SUPPORTED, as a real driver does for a feature a GPU lacks.
 *
 * Event sets: the fake node never raises an event. nvmlEventSetWait sleeps its timeout and
 * answers NVML_ERROR_TIMEOUT, which the plugin's health check reads as "all healthy" (any other
 * error marks every device unhealthy).
 *
 * Device handles are fake_nvml.c's; here they are opaque and only compared with NULL.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <time.h>

#define API __attribute__((visibility("default")))

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_TIMEOUT = 10,
};

typedef void *nvmlDevice_t;

/* nvmlEventType*: what a real data center GPU supports and the health check registers for. */
#define EVENT_SINGLE_BIT_ECC 0x0001ULL
#define EVENT_DOUBLE_BIT_ECC 0x0002ULL
#define EVENT_XID_CRITICAL 0x0008ULL
#define SUPPORTED_EVENTS (EVENT_SINGLE_BIT_ECC | EVENT_DOUBLE_BIT_ECC | EVENT_XID_CRITICAL)

#define NVML_TOPOLOGY_SYSTEM 50 /* across the CPU interconnect: the fake node has no topology */

typedef struct fake_event_set {
    unsigned long long registered;
} *nvmlEventSet_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

API nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    if (!set)
        return NVML_ERROR_INVALID_ARGUMENT;
    *set = calloc(1, sizeof(**set));
    return *set ? NVML_SUCCESS : NVML_ERROR_MEMORY;
}

API nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    free(set);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device,
                                                  unsigned long long *types) {
    if (!device || !types)
        return NVML_ERROR_INVALID_ARGUMENT;
    *types = SUPPORTED_EVENTS;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types,
                                          nvmlEventSet_t set) {
    if (!device || !set)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (types & ~SUPPORTED_EVENTS)
        return NVML_ERROR_NOT_SUPPORTED;
    set->registered |= types;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data,
                                     unsigned int timeoutms) {
    if (!set || !data)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct timespec ts = {timeoutms / 1000, (long)(timeoutms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
    return NVML_ERROR_TIMEOUT;
}

API nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data,
                                  unsigned int timeoutms) {
    return nvmlEventSetWait_v2(set, data, timeoutms);
}

API nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t a, nvmlDevice_t b,
                                                     int *level) {
    if (!a || !b || !level)
        return NVML_ERROR_INVALID_ARGUMENT;
    *level = NVML_TOPOLOGY_SYSTEM;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, int *active) {
    return NVML_ERROR_NOT_SUPPORTED;
}

