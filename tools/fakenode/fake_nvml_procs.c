/*
 * The fake NVML's running processes (compiled into the same libnvidia-ml.so.1 as fake_nvml.c):
 * nvmlDeviceGet{Compute,Graphics,MPSCompute}RunningProcesses (v1, _v2, _v3) of a GPU or MIG
 * device handle, answered from a plain-text file a test writes and may rewrite at any time (it
 * is read at every call):
 *
 *   <data file>.procs   (the data file: $FAKE_NVML_DATA, else FAKE_NVML_DATA_PATH)
 *
 *   # type uuid pid memory
 *   compute GPU-1234... 4711 1073741824
 *   graphics MIG-abcd... 4712 0
 *   mps GPU-1234... 4713 268435456
 *
 * One line per process and device: ``type`` is compute, graphics or mps (an MPS client, listed by
 * the MPS query only), ``uuid`` the GPU or MIG device it runs on (a process on a MIG device is
 * reported by that MIG device's handle only), ``pid`` its pid as the host sees it, ``memory`` the
 * bytes it holds. No file: no process anywhere, as on an idle node.
 *
 * Only the exported NVML entry points of fake_nvml.c are used (the handle's UUID), so that this
 * file needs nothing of its internals.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef FAKE_NVML_DATA_PATH
#define FAKE_NVML_DATA_PATH "/nonexistent/fake-nvml-data"
#endif

#define API __attribute__((visibility("default")))
#define SUCCESS 0
#define ERROR_INVALID_ARGUMENT 2
#define ERROR_INSUFFICIENT_SIZE 7
#define MAX_PROCS 256

typedef void *nvmlDevice_t;
typedef int nvmlReturn_t;

/* nvmlProcessInfo_v1_t: what the unversioned and _v1 calls fill. */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} proc_v1_t;

/* nvmlProcessInfo_v2_t == nvmlProcessInfo_t (_v3): with the MIG instance ids. */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} proc_v2_t;

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int length);
nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t d, unsigned int *is_mig);
nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t d, unsigned int *id);
nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t d, unsigned int *id);

typedef struct {
    unsigned int pid;
    unsigned long long memory;
} fake_proc;

/* The processes of ``kind`` on the device ``uuid``; returns how many (at most ``max``). */
static unsigned int read_procs(const char *kind, const char *uuid, fake_proc *out,
                               unsigned int max) {
    const char *env = getenv("FAKE_NVML_DATA");
    char path[4200];
    snprintf(path, sizeof path, "%s.procs", env ? env : FAKE_NVML_DATA_PATH);
    FILE *f = fopen(path, "re");
    if (!f) return 0;
    unsigned int n = 0;
    char line[512];
    while (n < max && fgets(line, sizeof line, f)) {
        char type[16], id[128];
        unsigned int pid;
        unsigned long long memory;
        if (line[0] == '#') continue;
        if (sscanf(line, "%15s %127s %u %llu", type, id, &pid, &memory) != 4) continue;
        if (strcmp(type, kind) != 0 || strcmp(id, uuid) != 0) continue;
        out[n].pid = pid;
        out[n].memory = memory;
        n++;
    }
    fclose(f);
    return n;
}

/* The NVML convention: *count in = the array's room; out = how many there are. With room for
 * fewer than there are (or no array), INSUFFICIENT_SIZE and the count needed. */
static nvmlReturn_t fill(nvmlDevice_t d, const char *kind, unsigned int *count, void *infos,
                         int versioned) {
    char uuid[128];
    fake_proc found[MAX_PROCS];
    if (!count) return ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = nvmlDeviceGetUUID(d, uuid, sizeof uuid);
    if (rc != SUCCESS) return rc;
    unsigned int n = read_procs(kind, uuid, found, MAX_PROCS);
    unsigned int room = *count;
    *count = n;
    if (n == 0) return SUCCESS;
    if (!infos || room < n) return ERROR_INSUFFICIENT_SIZE;
    unsigned int is_mig = 0, gi = 0xFFFFFFFFu, ci = 0xFFFFFFFFu;
    nvmlDeviceIsMigDeviceHandle(d, &is_mig);
    if (is_mig) {
        nvmlDeviceGetGpuInstanceId(d, &gi);
        nvmlDeviceGetComputeInstanceId(d, &ci);
    }
    for (unsigned int i = 0; i < n; i++) {
        if (versioned) {
            proc_v2_t *p = (proc_v2_t *)infos + i;
            p->pid = found[i].pid;
            p->usedGpuMemory = found[i].memory;
            p->gpuInstanceId = gi;
            p->computeInstanceId = ci;
        } else {
            proc_v1_t *p = (proc_v1_t *)infos + i;
            p->pid = found[i].pid;
            p->usedGpuMemory = found[i].memory;
        }
    }
    return SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t d, unsigned int *c, void *i) {
    return fill(d, "compute", c, i, 0);
}
API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, void *i) {
    return fill(d, "compute", c, i, 1);
}
API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, void *i) {
    return fill(d, "compute", c, i, 1);
}
API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t d, unsigned int *c, void *i) {
    return fill(d, "graphics", c, i, 0);
}
API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, void *i) {
    return fill(d, "graphics", c, i, 1);
}
API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, void *i) {
    return fill(d, "graphics", c, i, 1);
}
API nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses(nvmlDevice_t d, unsigned int *c, void *i) {
    return fill(d, "mps", c, i, 0);
}
API nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *c,
                                                             void *i) {
    return fill(d, "mps", c, i, 1);
}
API nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *c,
                                                             void *i) {
    return fill(d, "mps", c, i, 1);
}
