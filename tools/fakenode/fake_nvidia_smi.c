/*
 * A fake nvidia-smi for gpuhook's tests. Like the real one it learns everything from NVML: it is
 * dynamically linked against libnvidia-ml.so.1 (no rpath), so inside a container it works only when
 * the container's ld.so.cache or library path resolves that soname.
 *
 *   nvidia-smi                     header line, then the `-L` list
 *   nvidia-smi -L | --list-gpus    "GPU <i>: <name> (UUID: <uuid>)" and "  MIG <profile> Device <j>: (UUID: <uuid>)"
 *   nvidia-smi --query-gpu=F[,F...] [--format=csv[,noheader][,nounits]] [-i ID]
 *        fields: index, uuid, name, pci.bus_id, memory.total, driver_version, compute_mode,
 *                persistence_mode, mig.mode.current
 *   nvidia-smi [-i ID] -c MODE     set the compute mode (DEFAULT|PROHIBITED|EXCLUSIVE_PROCESS|0|2|3)
 *
 * Exit status: 0, or the NVML error code as the real tool does (9 when NVML cannot initialise).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef struct nvmlDevice_st *nvmlDevice_t;
typedef int nvmlReturn_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

nvmlReturn_t nvmlInit_v2(void);
nvmlReturn_t nvmlShutdown(void);
const char *nvmlErrorString(nvmlReturn_t);
nvmlReturn_t nvmlSystemGetDriverVersion(char *, unsigned int);
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *);
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *);
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int, nvmlDevice_t *);
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *, nvmlDevice_t *);
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t, char *, unsigned int);
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t, char *, unsigned int);
nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t, unsigned int *);
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t, nvmlPciInfo_t *);
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t, nvmlMemory_t *);
nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t, unsigned int *);
nvmlReturn_t nvmlDeviceSetComputeMode(nvmlDevice_t, unsigned int);
nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t, unsigned int *);
nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t, unsigned int *, unsigned int *);
nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t, unsigned int *);
nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t, unsigned int, nvmlDevice_t *);

static const char *compute_modes[] = {"Default", "Exclusive_Thread", "Prohibited",
                                      "Exclusive_Process"};
static const char *compute_mode_args[] = {"DEFAULT", "EXCLUSIVE_THREAD", "PROHIBITED",
                                          "EXCLUSIVE_PROCESS"};

static void usage(void) {
    printf("NVIDIA System Management Interface (fake, for gpuhook tests)\n\n"
           "    nvidia-smi [-L] [-i ID] [--query-gpu=FIELDS --format=csv[,noheader][,nounits]]\n"
           "    nvidia-smi [-i ID] -c MODE\n");
}

static void rule(void) {
    printf("+");
    for (int k = 0; k < 89; k++) putchar('-');
    printf("+\n");
}

static int invalid(void) {
    printf("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n");
    return 2;
}

/* "GPU 0: <name> (UUID: GPU-...)" and its MIG devices. */
static void list_gpu(nvmlDevice_t dev, unsigned int index) {
    char name[96] = "", uuid[96] = "";
    nvmlDeviceGetName(dev, name, sizeof name);
    nvmlDeviceGetUUID(dev, uuid, sizeof uuid);
    printf("GPU %u: %s (UUID: %s)\n", index, name, uuid);
    unsigned int cur = 0, pend = 0, max = 0;
    if (nvmlDeviceGetMigMode(dev, &cur, &pend) != 0 || !cur) return;
    if (nvmlDeviceGetMaxMigDeviceCount(dev, &max) != 0) return;
    for (unsigned int j = 0, shown = 0; j < max; j++) {
        nvmlDevice_t mig;
        if (nvmlDeviceGetMigDeviceHandleByIndex(dev, j, &mig) != 0) continue;
        char mname[96] = "", muuid[96] = "";
        nvmlDeviceGetName(mig, mname, sizeof mname);
        nvmlDeviceGetUUID(mig, muuid, sizeof muuid);
        const char *profile = strstr(mname, " MIG ");
        profile = profile ? profile + 5 : mname;
        printf("  MIG %s Device %u: (UUID: %s)\n", profile, shown++, muuid);
    }
}

/* Resolves -i: an index, a UUID or a PCI bus id. */
static int resolve(const char *id, nvmlDevice_t *dev) {
    char *end;
    unsigned long idx = strtoul(id, &end, 10);
    if (*id && !*end) return nvmlDeviceGetHandleByIndex_v2((unsigned int)idx, dev);
    if (nvmlDeviceGetHandleByUUID(id, dev) == 0) return 0;
    unsigned int count = 0;
    nvmlDeviceGetCount_v2(&count);
    for (unsigned int i = 0; i < count; i++) {
        nvmlPciInfo_t pci;
        nvmlDevice_t d;
        if (nvmlDeviceGetHandleByIndex_v2(i, &d) || nvmlDeviceGetPciInfo_v3(d, &pci)) continue;
        if (strcasecmp(pci.busId, id) == 0 || strcasecmp(pci.busIdLegacy, id) == 0) {
            *dev = d;
            return 0;
        }
    }
    return 6; /* NVML_ERROR_NOT_FOUND */
}

static void query_field(nvmlDevice_t dev, const char *field, int units) {
    char buf[96] = "";
    unsigned int u = 0, p = 0;
    if (strcmp(field, "index") == 0) {
        nvmlDeviceGetIndex(dev, &u);
        printf("%u", u);
    } else if (strcmp(field, "uuid") == 0 || strcmp(field, "gpu_uuid") == 0) {
        nvmlDeviceGetUUID(dev, buf, sizeof buf);
        printf("%s", buf);
    } else if (strcmp(field, "name") == 0 || strcmp(field, "gpu_name") == 0) {
        nvmlDeviceGetName(dev, buf, sizeof buf);
        printf("%s", buf);
    } else if (strcmp(field, "pci.bus_id") == 0 || strcmp(field, "gpu_bus_id") == 0) {
        nvmlPciInfo_t pci;
        nvmlDeviceGetPciInfo_v3(dev, &pci);
        printf("%s", pci.busId);
    } else if (strcmp(field, "memory.total") == 0) {
        nvmlMemory_t mem;
        nvmlDeviceGetMemoryInfo(dev, &mem);
        printf(units ? "%llu MiB" : "%llu", mem.total >> 20);
    } else if (strcmp(field, "driver_version") == 0) {
        nvmlSystemGetDriverVersion(buf, sizeof buf);
        printf("%s", buf);
    } else if (strcmp(field, "compute_mode") == 0) {
        nvmlDeviceGetComputeMode(dev, &u);
        printf("%s", u < 4 ? compute_modes[u] : "[Unknown Error]");
    } else if (strcmp(field, "persistence_mode") == 0) {
        nvmlDeviceGetPersistenceMode(dev, &u);
        printf("%s", u ? "Enabled" : "Disabled");
    } else if (strcmp(field, "mig.mode.current") == 0) {
        if (nvmlDeviceGetMigMode(dev, &u, &p) != 0) printf("[N/A]");
        else printf("%s", u ? "Enabled" : "Disabled");
    } else {
        printf("[N/A]");
    }
}

static int query(const char *fields, const char *format, const char *id) {
    int header = 1, units = 1;
    if (format) {
        if (strncmp(format, "csv", 3) != 0) return invalid();
        header = strstr(format, "noheader") == NULL;
        units = strstr(format, "nounits") == NULL;
    } else {
        return invalid(); /* the real tool insists on --format with --query-gpu */
    }
    char *list = strdup(fields);
    char *names[32];
    int n = 0;
    char *save = NULL;
    for (char *f = strtok_r(list, ",", &save); f && n < 32; f = strtok_r(NULL, ",", &save))
        names[n++] = f;
    if (header) {
        for (int k = 0; k < n; k++)
            printf("%s%s%s", k ? ", " : "", names[k],
                   units && strcmp(names[k], "memory.total") == 0 ? " [MiB]" : "");
        printf("\n");
    }
    unsigned int count = 0;
    nvmlDeviceGetCount_v2(&count);
    for (unsigned int i = 0; i < count; i++) {
        nvmlDevice_t dev;
        if (id) {
            int rc = resolve(id, &dev);
            if (rc) {
                printf("No devices were found\n");
                free(list);
                return rc;
            }
            i = count;
        } else if (nvmlDeviceGetHandleByIndex_v2(i, &dev) != 0) {
            continue;
        }
        for (int k = 0; k < n; k++) {
            if (k) printf(", ");
            query_field(dev, names[k], units);
        }
        printf("\n");
    }
    free(list);
    return 0;
}

static int set_compute_mode(const char *arg, const char *id) {
    int mode = -1;
    for (int m = 0; m < 4; m++)
        if (strcasecmp(arg, compute_mode_args[m]) == 0) mode = m;
    if (mode < 0 && arg[0] >= '0' && arg[0] <= '3' && !arg[1]) mode = arg[0] - '0';
    if (mode < 0) return invalid();
    unsigned int count = 0;
    nvmlDeviceGetCount_v2(&count);
    int status = 0;
    for (unsigned int i = 0; i < count; i++) {
        nvmlDevice_t dev;
        int rc = id ? resolve(id, &dev) : nvmlDeviceGetHandleByIndex_v2(i, &dev);
        if (id) i = count;
        if (rc) {
            printf("No devices were found\n");
            return rc;
        }
        nvmlPciInfo_t pci;
        nvmlDeviceGetPciInfo_v3(dev, &pci);
        rc = nvmlDeviceSetComputeMode(dev, (unsigned int)mode);
        if (rc) {
            printf("Unable to set the compute mode for GPU %s: %s\n", pci.busId,
                   nvmlErrorString(rc));
            status = rc;
        } else {
            printf("Set compute mode to %s for GPU %s.\n", compute_mode_args[mode], pci.busId);
        }
    }
    if (status) printf("Terminating early due to previous errors.\n");
    else printf("All done.\n");
    return status;
}

int main(int argc, char **argv) {
    int list_only = 0;
    const char *fields = NULL, *format = NULL, *id = NULL, *cmode = NULL;
    for (int a = 1; a < argc; a++) {
        const char *arg = argv[a];
        if (strcmp(arg, "-L") == 0 || strcmp(arg, "--list-gpus") == 0) list_only = 1;
        else if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            usage();
            return 0;
        } else if (strncmp(arg, "--query-gpu=", 12) == 0) fields = arg + 12;
        else if (strncmp(arg, "--format=", 9) == 0) format = arg + 9;
        else if (strncmp(arg, "--id=", 5) == 0) id = arg + 5;
        else if (strcmp(arg, "-i") == 0 && a + 1 < argc) id = argv[++a];
        else if (strncmp(arg, "--compute-mode=", 15) == 0) cmode = arg + 15;
        else if (strcmp(arg, "-c") == 0 && a + 1 < argc) cmode = argv[++a];
        else return invalid();
    }

    int rc = nvmlInit_v2();
    if (rc != 0) {
        printf("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
               "Make sure that the latest NVIDIA driver is installed and running.\n\n");
        return 9;
    }
    int status = 0;
    if (cmode) {
        status = set_compute_mode(cmode, id);
    } else if (fields) {
        status = query(fields, format, id);
    } else {
        unsigned int count = 0;
        nvmlDeviceGetCount_v2(&count);
        if (!list_only) {
            char version[80] = "";
            int cuda = 0;
            nvmlSystemGetDriverVersion(version, sizeof version);
            nvmlSystemGetCudaDriverVersion(&cuda);
            char line[256];
            snprintf(line, sizeof line, "NVIDIA-SMI %s  Driver Version: %s  CUDA Version: %d.%d",
                     version, version, cuda / 1000, cuda % 1000 / 10);
            rule();
            printf("| %-87s |\n", line);
            rule();
        }
        if (count == 0) printf("No devices were found\n");
        for (unsigned int i = 0; i < count; i++) {
            nvmlDevice_t dev;
            if (nvmlDeviceGetHandleByIndex_v2(i, &dev) == 0) list_gpu(dev, i);
        }
    }
    nvmlShutdown();
    return status;
}
