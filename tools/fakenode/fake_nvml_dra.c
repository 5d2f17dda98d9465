/* What NVIDIA's DRA driver (its GPU kubelet plugin, through go-nvlib) calls beyond fake_nvml.c,
 * fake_nvml_plugin.c and fake_nvml_mig.c (whose MIG instance API, placements included, it uses
 * to publish MIG devices: ../shared/k8s/README.md, "NVML calls"): the GPU's architecture, an
 * attribute of every device it publishes. Written against fake_nvml.c's exported functions only;
 * compiled into the same libnvidia-ml.so by tools/fake-node. */

#define API __attribute__((visibility("default")))

typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;

#define NVML_SUCCESS 0
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_DEVICE_ARCH_VOLTA 5
#define NVML_DEVICE_ARCH_TURING 6
#define NVML_DEVICE_ARCH_AMPERE 7
#define NVML_DEVICE_ARCH_ADA 8
#define NVML_DEVICE_ARCH_HOPPER 9
#define NVML_DEVICE_ARCH_BLACKWELL 10
#define NVML_DEVICE_ARCH_UNKNOWN 0xffffffff

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *major, int *minor);

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
