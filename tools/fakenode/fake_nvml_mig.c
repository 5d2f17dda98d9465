/*
 * NVML's MIG instance API for the fake libnvidia-ml.so.1: what NVIDIA's k8s-device-plugin
 * (through go-nvlib) asks to name a MIG device's profile: its attributes, the parent's GPU
 * instance profiles and their placements, the GPU and compute instances by id and their infos.
 * Compiled into the same library as fake_nvml.c by tools/fake-node.
 *
 * Everything is derived from what fake_nvml.c already reports through the public API: a MIG
 * device's name ends in its profile ("... MIG 3g.40gb"), its memory, its GPU and compute
 * instance ids. A profile of N slices has the GPU instance profile id and the compute instance
 * profile id NVML gives N slices (1, 2, 3, 4, 7 -> 0, 1, 2, 3, 4); its memory is that of a MIG
 * device of the parent with N slices, else N/8 of the parent's. Handles of GPU and compute
 * instances are entries of a fixed table, found again by (parent, ids).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define API __attribute__((visibility("default")))

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
};

typedef void *nvmlDevice_t;

typedef struct {
    unsigned long long total, free, used;
} fake_memory;

/* fake_nvml.c's public functions this file builds on */
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t, char *, unsigned int);
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t, fake_memory *);
nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t, unsigned int *);
nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t, unsigned int, nvmlDevice_t *);
nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t, unsigned int *);
nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t, nvmlDevice_t *);
nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t, unsigned int *);
nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t, unsigned int *);

typedef struct {
    unsigned int multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount,
        sharedEncoderCount, sharedJpegCount, sharedOfaCount, gpuInstanceSliceCount,
        computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;

typedef struct {
    unsigned int id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount,
        copyEngineCount, decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
} nvmlGpuInstanceProfileInfo_t;

typedef struct {
    unsigned int start, size;
} nvmlPlacement_t;

typedef struct {
    unsigned int id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount,
        sharedDecoderCount, sharedEncoderCount, sharedJpegCount, sharedOfaCount;
} nvmlComputeInstanceProfileInfo_t;

typedef struct fake_instance {
    nvmlDevice_t parent;
    nvmlDevice_t mig;
    unsigned int gi, ci, slices;
    int is_ci;
} fake_instance;

typedef fake_instance *nvmlGpuInstance_t;
typedef fake_instance *nvmlComputeInstance_t;

typedef struct {
    nvmlDevice_t device;
    unsigned int id, profileId;
    nvmlPlacement_t placement;
} nvmlGpuInstanceInfo_t;

typedef struct {
    nvmlDevice_t device;
    nvmlGpuInstance_t gpuInstance;
    unsigned int id, profileId;
    nvmlPlacement_t placement;
} nvmlComputeInstanceInfo_t;

#define MAX_INSTANCES 256
#define SLICES 8 /* the parent's memory in eighths, as NVML sizes MIG memory */
static const unsigned int PROFILE_SLICES[] = {1, 2, 3, 4, 7}; /* index = profile id */
#define PROFILES (sizeof(PROFILE_SLICES) / sizeof(PROFILE_SLICES[0]))

static fake_instance instances[MAX_INSTANCES];
static unsigned int used;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* "... MIG 3g.40gb" -> 3; 0 when the name has no profile. */
static unsigned int slices_of(nvmlDevice_t mig) {
    char name[96];
    if (nvmlDeviceGetName(mig, name, sizeof(name)) != NVML_SUCCESS)
        return 0;
    const char *p = strstr(name, "MIG ");
    return p ? (unsigned int)strtoul(p + 4, NULL, 10) : 0;
}

static int profile_of(unsigned int slices) {
    for (unsigned int i = 0; i < PROFILES; i++)
        if (PROFILE_SLICES[i] == slices)
            return (int)i;
    return -1;
}

static unsigned long long memory_mb(nvmlDevice_t d) {
    fake_memory m;
    return nvmlDeviceGetMemoryInfo(d, &m) == NVML_SUCCESS ? m.total >> 20 : 0;
}

/* The parent's MIG device with GPU instance gi (ci: compute instance, -1 for any). */
static nvmlDevice_t find_mig(nvmlDevice_t parent, unsigned int gi, int ci) {
    unsigned int count = 0, id;
    if (nvmlDeviceGetMaxMigDeviceCount(parent, &count) != NVML_SUCCESS)
        return NULL;
    for (unsigned int i = 0; i < count; i++) {
        nvmlDevice_t mig;
        if (nvmlDeviceGetMigDeviceHandleByIndex(parent, i, &mig) != NVML_SUCCESS)
            continue;
        if (nvmlDeviceGetGpuInstanceId(mig, &id) != NVML_SUCCESS || id != gi)
            continue;
        if (ci >= 0 && (nvmlDeviceGetComputeInstanceId(mig, &id) != NVML_SUCCESS ||
                        id != (unsigned int)ci))
            continue;
        return mig;
    }
    return NULL;
}

static fake_instance *instance(nvmlDevice_t parent, nvmlDevice_t mig, unsigned int gi,
                               unsigned int ci, int is_ci) {
    fake_instance *out = NULL;
    pthread_mutex_lock(&lock);
    for (unsigned int i = 0; i < used && !out; i++)
        if (instances[i].parent == parent && instances[i].gi == gi && instances[i].ci == ci &&
            instances[i].is_ci == is_ci)
            out = &instances[i];
    if (!out && used < MAX_INSTANCES) {
        out = &instances[used++];
        *out = (fake_instance){parent, mig, gi, ci, slices_of(mig), is_ci};
    }
    pthread_mutex_unlock(&lock);
    return out;
}

API nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t d, nvmlDeviceAttributes_t *a) {
    unsigned int is_mig = 0;
    if (!d || !a || nvmlDeviceIsMigDeviceHandle(d, &is_mig) != NVML_SUCCESS)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!is_mig)
        return NVML_ERROR_NOT_SUPPORTED;
    unsigned int slices = slices_of(d);
    memset(a, 0, sizeof(*a));
    a->multiprocessorCount = slices * 16;
    a->sharedCopyEngineCount = a->sharedDecoderCount = slices;
    a->gpuInstanceSliceCount = a->computeInstanceSliceCount = slices;
    a->memorySizeMB = memory_mb(d);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetAttributes(nvmlDevice_t d, nvmlDeviceAttributes_t *a) {
    return nvmlDeviceGetAttributes_v2(d, a);
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t parent, unsigned int profile,
                                                     nvmlGpuInstanceProfileInfo_t *info) {
    if (!parent || !info)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (profile >= PROFILES)
        return NVML_ERROR_NOT_SUPPORTED;
    unsigned int slices = PROFILE_SLICES[profile], count = 0;
    unsigned long long mb = memory_mb(parent) * slices / SLICES;
    nvmlDeviceGetMaxMigDeviceCount(parent, &count);
    for (unsigned int i = 0; i < count; i++) {
        nvmlDevice_t mig;
        if (nvmlDeviceGetMigDeviceHandleByIndex(parent, i, &mig) == NVML_SUCCESS &&
            slices_of(mig) == slices) {
            mb = memory_mb(mig);
            break;
        }
    }
    memset(info, 0, sizeof(*info));
    info->id = profile;
    info->sliceCount = slices;
    info->instanceCount = 7 / slices;
    info->multiprocessorCount = slices * 16;
    info->copyEngineCount = info->decoderCount = slices;
    info->memorySizeMB = mb;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(nvmlDevice_t parent,
                                                               unsigned int profile,
                                                               nvmlPlacement_t *placements,
                                                               unsigned int *count) {
    if (!parent || !count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (profile >= PROFILES)
        return NVML_ERROR_NOT_SUPPORTED;
    unsigned int size = PROFILE_SLICES[profile], n = 0;
    unsigned int step = size == 3 ? 4 : size == 7 ? 8 : size; /* the A100/H100 layout */
    for (unsigned int start = 0; start + size <= 7; start += step) {
        if (placements && n < *count)
            placements[n] = (nvmlPlacement_t){start, size};
        n++;
    }
    if (placements && n > *count) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *count = n;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements(nvmlDevice_t parent,
                                                            unsigned int profile,
                                                            nvmlPlacement_t *placements,
                                                            unsigned int *count) {
    return nvmlDeviceGetGpuInstancePossiblePlacements_v2(parent, profile, placements, count);
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t parent, unsigned int id,
                                              nvmlGpuInstance_t *gi) {
    if (!parent || !gi)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlDevice_t mig = find_mig(parent, id, -1);
    if (!mig)
        return NVML_ERROR_NOT_FOUND;
    *gi = instance(parent, mig, id, 0, 0);
    return *gi ? NVML_SUCCESS : NVML_ERROR_NOT_FOUND;
}

API nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gi, nvmlGpuInstanceInfo_t *info) {
    if (!gi || !info)
        return NVML_ERROR_INVALID_ARGUMENT;
    int profile = profile_of(gi->slices);
    if (profile < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    *info = (nvmlGpuInstanceInfo_t){gi->parent, gi->gi, (unsigned int)profile, {0, gi->slices}};
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t gi, unsigned int id,
                                                       nvmlComputeInstance_t *ci) {
    if (!gi || !ci)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlDevice_t mig = find_mig(gi->parent, gi->gi, (int)id);
    if (!mig)
        return NVML_ERROR_NOT_FOUND;
    *ci = instance(gi->parent, mig, gi->gi, id, 1);
    return *ci ? NVML_SUCCESS : NVML_ERROR_NOT_FOUND;
}

API nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(
    nvmlGpuInstance_t gi, unsigned int profile, unsigned int engine,
    nvmlComputeInstanceProfileInfo_t *info) {
    if (!gi || !info)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (profile >= PROFILES || engine != 0 || PROFILE_SLICES[profile] > gi->slices)
        return NVML_ERROR_NOT_SUPPORTED;
    unsigned int slices = PROFILE_SLICES[profile];
    memset(info, 0, sizeof(*info));
    info->id = profile;
    info->sliceCount = slices;
    info->instanceCount = gi->slices / slices;
    info->multiprocessorCount = slices * 16;
    info->sharedCopyEngineCount = info->sharedDecoderCount = gi->slices;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t ci,
                                               nvmlComputeInstanceInfo_t *info) {
    if (!ci || !info)
        return NVML_ERROR_INVALID_ARGUMENT;
    int profile = profile_of(ci->slices);
    if (profile < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    nvmlGpuInstance_t gi = instance(ci->parent, ci->mig, ci->gi, 0, 0);
    *info = (nvmlComputeInstanceInfo_t){ci->parent, gi, ci->ci, (unsigned int)profile,
                                        {0, ci->slices}};
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlComputeInstanceGetInfo(nvmlComputeInstance_t ci,
                                            nvmlComputeInstanceInfo_t *info) {
    return nvmlComputeInstanceGetInfo_v2(ci, info);
}
