/* The fake NVML's GPU instance API: what NVIDIA's DRA driver (its GPU kubelet plugin, through
 * go-nvlib) calls beside the rest of fake_nvml.c to publish MIG devices and prepare MIG claims
 * (../shared/k8s/README.md, "NVML calls"): GPU instance profiles and their possible placements
 * (the A100/H100 layout of 7 compute slices and 8 memory eighths), the GPU and compute instances
 * behind each of a MIG-mode GPU's MIG devices, and the architecture.
 *
 * Written against fake_nvml.c's exported functions only (its data is private to it): a MIG
 * device's GPU/compute instance ids, its profile (the last word of its name, "3g.40gb"), its
 * parent's memory. Compiled into the same libnvidia-ml.so by tools/fake-node.
 *
 * Profile ids: a GPU instance profile's id is its NVML enum value (NVML_GPU_INSTANCE_PROFILE_*:
 * 1 slice 0, 2 slices 1, 3 slices 2, 4 slices 3, 7 slices 4), and so is a compute instance
 * profile's (NVML_COMPUTE_INSTANCE_PROFILE_*, same numbering); each GPU instance holds one
 * compute instance of its whole size, shared engines (engine profile 0). */

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define API __attribute__((visibility("default")))

typedef int nvmlReturn_t;
typedef struct fake_device *nvmlDevice_t;

#define NVML_SUCCESS 0
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_DEVICE_ARCH_VOLTA 5
#define NVML_DEVICE_ARCH_TURING 6
#define NVML_DEVICE_ARCH_AMPERE 7
#define NVML_DEVICE_ARCH_ADA 8
#define NVML_DEVICE_ARCH_HOPPER 9
#define NVML_DEVICE_ARCH_BLACKWELL 10
#define NVML_DEVICE_ARCH_UNKNOWN 0xffffffff

#define N_PROFILES 5 /* 1, 2, 3, 4 and 7 slices */
#define MAX_INSTANCES 512
#define MAX_MIG 7

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct {
    unsigned int start;
    unsigned int size;
} nvmlGpuInstancePlacement_t;

typedef nvmlGpuInstancePlacement_t nvmlComputeInstancePlacement_t;

typedef struct {
    unsigned int id;
    unsigned int isP2pSupported;
    unsigned int sliceCount;
    unsigned int instanceCount;
    unsigned int multiprocessorCount;
    unsigned int copyEngineCount;
    unsigned int decoderCount;
    unsigned int encoderCount;
    unsigned int jpegCount;
    unsigned int ofaCount;
    unsigned long long memorySizeMB;
} nvmlGpuInstanceProfileInfo_t;

typedef struct {
    unsigned int id;
    unsigned int sliceCount;
    unsigned int instanceCount;
    unsigned int multiprocessorCount;
    unsigned int sharedCopyEngineCount;
    unsigned int sharedDecoderCount;
    unsigned int sharedEncoderCount;
    unsigned int sharedJpegCount;
    unsigned int sharedOfaCount;
} nvmlComputeInstanceProfileInfo_t;

typedef struct fake_instance {
    nvmlDevice_t parent;
    unsigned int gi, ci;   /* the GPU instance's id; the compute instance's (ci records only) */
    unsigned int profile;  /* profile enum value, as above */
    nvmlGpuInstancePlacement_t placement;
    int is_ci;
    struct fake_instance *gpu_instance; /* of a compute instance */
} fake_instance;

typedef fake_instance *nvmlGpuInstance_t;
typedef fake_instance *nvmlComputeInstance_t;

typedef struct {
    nvmlDevice_t device;
    unsigned int id;
    unsigned int profileId;
    nvmlGpuInstancePlacement_t placement;
} nvmlGpuInstanceInfo_t;

typedef struct {
    nvmlDevice_t device;
    nvmlGpuInstance_t gpuInstance;
    unsigned int id;
    unsigned int profileId;
    nvmlComputeInstancePlacement_t placement;
} nvmlComputeInstanceInfo_t;

/* fake_nvml.c's exported functions this file builds on */
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int length);
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *mem);
nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *current, unsigned int *pending);
nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned int i, nvmlDevice_t *m);
nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t d, unsigned int *id);
nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t d, unsigned int *id);
nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *major, int *minor);
nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t d, unsigned int *is_mig);

static const unsigned int SLICES[N_PROFILES] = {1, 2, 3, 4, 7};
static const unsigned int EIGHTHS[N_PROFILES] = {1, 2, 4, 4, 8};     /* memory per profile */
static const unsigned int PLACE_SIZE[N_PROFILES] = {1, 2, 4, 4, 8};  /* slots a placement spans */
static const unsigned int STARTS[N_PROFILES][7] = {
    {0, 1, 2, 3, 4, 5, 6}, {0, 2, 4}, {0, 4}, {0}, {0}};
static const unsigned int N_STARTS[N_PROFILES] = {7, 3, 2, 1, 1};

static pthread_mutex_t dra_lock = PTHREAD_MUTEX_INITIALIZER;
static fake_instance instances[MAX_INSTANCES];
static unsigned int n_instances;

static int mig_enabled(nvmlDevice_t d) {
    unsigned int current = 0, pending = 0, is_mig = 0;
    if (!d || nvmlDeviceIsMigDeviceHandle(d, &is_mig) != NVML_SUCCESS || is_mig) return 0;
    return nvmlDeviceGetMigMode(d, &current, &pending) == NVML_SUCCESS && current == 1;
}

/* The profile enum value of a MIG device, from the "<n>g." of its name's last word; -1 if none. */
static int mig_profile(nvmlDevice_t mig) {
    char name[128];
    if (nvmlDeviceGetName(mig, name, sizeof name) != NVML_SUCCESS) return -1;
    const char *word = strrchr(name, ' ');
    word = word ? word + 1 : name;
    unsigned int slices = (unsigned int)strtoul(word, NULL, 10);
    for (int p = 0; p < N_PROFILES; p++)
        if (SLICES[p] == slices) return p;
    return -1;
}

/* The parent's MIG devices in slot order, each placed at the first free placement of its
 * profile (the order a MIG layout is created in); fills gi ids, ci ids, profiles, starts. */
static unsigned int layout(nvmlDevice_t parent, unsigned int gi[], unsigned int ci[], int prof[],
                           unsigned int start[]) {
    unsigned int n = 0, used = 0; /* bit i: memory eighth i taken */
    for (unsigned int i = 0; i < MAX_MIG; i++) {
        nvmlDevice_t mig = NULL;
        if (nvmlDeviceGetMigDeviceHandleByIndex(parent, i, &mig) != NVML_SUCCESS || !mig) continue;
        int p = mig_profile(mig);
        if (p < 0 || nvmlDeviceGetGpuInstanceId(mig, &gi[n]) != NVML_SUCCESS ||
            nvmlDeviceGetComputeInstanceId(mig, &ci[n]) != NVML_SUCCESS)
            continue;
        prof[n] = p;
        start[n] = 0;
        for (unsigned int s = 0; s < N_STARTS[p]; s++) {
            unsigned int bits = ((1u << PLACE_SIZE[p]) - 1) << STARTS[p][s];
            if (!(used & bits)) {
                start[n] = STARTS[p][s];
                used |= bits;
                break;
            }
        }
        n++;
    }
    return n;
}

static fake_instance *instance(nvmlDevice_t parent, unsigned int gi, unsigned int ci, int is_ci,
                               int profile, unsigned int start) {
    pthread_mutex_lock(&dra_lock);
    fake_instance *found = NULL;
    for (unsigned int i = 0; i < n_instances && !found; i++) {
        fake_instance *x = &instances[i];
        if (x->parent == parent && x->gi == gi && x->is_ci == is_ci && (!is_ci || x->ci == ci))
            found = x;
    }
    if (!found && n_instances < MAX_INSTANCES) {
        found = &instances[n_instances++];
        found->parent = parent;
        found->gi = gi;
        found->ci = is_ci ? ci : 0;
        found->is_ci = is_ci;
        found->profile = (unsigned int)profile;
        found->placement.start = is_ci ? 0 : start;
        found->placement.size = is_ci ? SLICES[profile] : PLACE_SIZE[profile];
    }
    pthread_mutex_unlock(&dra_lock);
    return found;
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t d, unsigned int profile,
                                                     nvmlGpuInstanceProfileInfo_t *info) {
    nvmlMemory_t mem;
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    if (!mig_enabled(d) || profile >= N_PROFILES) return NVML_ERROR_NOT_SUPPORTED;
    if (nvmlDeviceGetMemoryInfo(d, &mem) != NVML_SUCCESS) return NVML_ERROR_INVALID_ARGUMENT;
    memset(info, 0, sizeof *info);
    info->id = profile;
    info->sliceCount = SLICES[profile];
    info->instanceCount = N_STARTS[profile];
    info->multiprocessorCount = 16 * SLICES[profile];
    info->copyEngineCount = SLICES[profile];
    info->decoderCount = SLICES[profile] / 2;
    info->jpegCount = SLICES[profile] == 7 ? 1 : 0;
    info->ofaCount = SLICES[profile] == 7 ? 1 : 0;
    info->memorySizeMB = (mem.total >> 20) * EIGHTHS[profile] / 8;
    return NVML_SUCCESS;
}

static nvmlReturn_t placements(nvmlDevice_t d, unsigned int profile,
                               nvmlGpuInstancePlacement_t *out, unsigned int *count) {
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    if (!mig_enabled(d) || profile >= N_PROFILES) return NVML_ERROR_NOT_SUPPORTED;
    unsigned int n = N_STARTS[profile];
    if (!out) {
        *count = n;
        return NVML_SUCCESS;
    }
    if (*count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned int i = 0; i < n; i++) {
        out[i].start = STARTS[profile][i];
        out[i].size = PLACE_SIZE[profile];
    }
    *count = n;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements(
    nvmlDevice_t d, unsigned int profile, nvmlGpuInstancePlacement_t *out, unsigned int *count) {
    return placements(d, profile, out, count);
}

API nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    nvmlDevice_t d, unsigned int profile, nvmlGpuInstancePlacement_t *out, unsigned int *count) {
    return placements(d, profile, out, count);
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t d, unsigned int id,
                                              nvmlGpuInstance_t *gi) {
    unsigned int gis[MAX_MIG], cis[MAX_MIG], starts[MAX_MIG];
    int profs[MAX_MIG];
    if (!gi) return NVML_ERROR_INVALID_ARGUMENT;
    if (!mig_enabled(d)) return NVML_ERROR_NOT_SUPPORTED;
    unsigned int n = layout(d, gis, cis, profs, starts);
    for (unsigned int i = 0; i < n; i++) {
        if (gis[i] == id) {
            *gi = instance(d, id, 0, 0, profs[i], starts[i]);
            return *gi ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

API nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gi, nvmlGpuInstanceInfo_t *info) {
    if (!gi || !info || gi->is_ci) return NVML_ERROR_INVALID_ARGUMENT;
    info->device = gi->parent;
    info->id = gi->gi;
    info->profileId = gi->profile;
    info->placement = gi->placement;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t gi, unsigned int id,
                                                       nvmlComputeInstance_t *ci) {
    unsigned int gis[MAX_MIG], cis[MAX_MIG], starts[MAX_MIG];
    int profs[MAX_MIG];
    if (!gi || !ci || gi->is_ci) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int n = layout(gi->parent, gis, cis, profs, starts);
    for (unsigned int i = 0; i < n; i++) {
        if (gis[i] == gi->gi && cis[i] == id) {
            *ci = instance(gi->parent, gi->gi, id, 1, profs[i], 0);
            if (!*ci) return NVML_ERROR_INSUFFICIENT_SIZE;
            (*ci)->gpu_instance = gi;
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

API nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(
    nvmlGpuInstance_t gi, unsigned int profile, unsigned int engine,
    nvmlComputeInstanceProfileInfo_t *info) {
    if (!gi || !info || gi->is_ci) return NVML_ERROR_INVALID_ARGUMENT;
    if (engine != 0 || profile >= N_PROFILES || SLICES[profile] > SLICES[gi->profile])
        return NVML_ERROR_NOT_SUPPORTED;
    memset(info, 0, sizeof *info);
    info->id = profile;
    info->sliceCount = SLICES[profile];
    info->instanceCount = SLICES[gi->profile] / SLICES[profile];
    info->multiprocessorCount = 16 * SLICES[profile];
    info->sharedCopyEngineCount = SLICES[gi->profile];
    info->sharedDecoderCount = SLICES[gi->profile] / 2;
    return NVML_SUCCESS;
}

static nvmlReturn_t ci_info(nvmlComputeInstance_t ci, nvmlComputeInstanceInfo_t *info) {
    if (!ci || !info || !ci->is_ci) return NVML_ERROR_INVALID_ARGUMENT;
    info->device = ci->parent;
    info->gpuInstance = ci->gpu_instance;
    info->id = ci->ci;
    info->profileId = ci->profile;
    info->placement = ci->placement;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlComputeInstanceGetInfo(nvmlComputeInstance_t ci,
                                            nvmlComputeInstanceInfo_t *info) {
    return ci_info(ci, info);
}

API nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t ci,
                                               nvmlComputeInstanceInfo_t *info) {
    return ci_info(ci, info);
}

/* The architecture of the GPU's compute capability (9.0: Hopper). */
API nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t d, unsigned int *arch) {
    int major = 0, minor = 0;
    if (!arch) return NVML_ERROR_INVALID_ARGUMENT;
    if (nvmlDeviceGetCudaComputeCapability(d, &major, &minor) != NVML_SUCCESS)
        return NVML_ERROR_INVALID_ARGUMENT;
    switch (major) {
    case 7: *arch = minor >= 5 ? NVML_DEVICE_ARCH_TURING : NVML_DEVICE_ARCH_VOLTA; break;
    case 8: *arch = minor >= 9 ? NVML_DEVICE_ARCH_ADA : NVML_DEVICE_ARCH_AMPERE; break;
    case 9: *arch = NVML_DEVICE_ARCH_HOPPER; break;
    case 10: case 12: *arch = NVML_DEVICE_ARCH_BLACKWELL; break;
    default: *arch = NVML_DEVICE_ARCH_UNKNOWN;
    }
    return NVML_SUCCESS;
}
