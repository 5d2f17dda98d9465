/*
 * A fake libnvidia-ml.so.1 for gpuhook's tests: the subset of the NVML C API that gpuhook (through
 * pynvml) and the fake nvidia-smi use, answering from a plain-text data file instead of a GPU.
 *
 * Where the data comes from (see README.md for the format):
 *   1. the file named by $FAKE_NVML_DATA when that variable is set, else
 *   2. the file compiled in as FAKE_NVML_DATA_PATH (tools/fake-node: DIR/nvml/data);
 *   3. when that file cannot be read (inside a container it is not visible), a copy of the same
 *      data embedded at build time as FAKE_NVML_EMBEDDED, with dev_root "/".
 *
 * As with a real driver, a GPU is reported only when its device node <dev_root>/dev/nvidia<minor>
 * is a character device, and visible GPUs are numbered 0..n-1 in data order. A MIG device is
 * reported when its parent is visible, MIG mode is on, and either the mig/monitor capability node
 * or both of its gi/ci access capability nodes exist under <dev_root>/dev/nvidia-caps.
 *
 * tools/fake-node compiles this with -include <generated header> defining FAKE_NVML_DATA_PATH and
 * FAKE_NVML_EMBEDDED (C string literals).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#ifndef FAKE_NVML_DATA_PATH
#define FAKE_NVML_DATA_PATH "/nonexistent/fake-nvml-data"
#endif
#ifndef FAKE_NVML_EMBEDDED
#define FAKE_NVML_EMBEDDED "version 1\ndriver_version 0.0.0\ncuda_version 0\ndev_root /\n"
#endif

#define API __attribute__((visibility("default")))

/* nvmlReturn_t values (nvml.h / pynvml). */
typedef enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_INSUFFICIENT_POWER = 8,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_IRQ_ISSUE = 11,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_CORRUPTED_INFOROM = 14,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_OPERATING_SYSTEM = 17,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_NO_DATA = 21,
    NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22,
    NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
    NVML_ERROR_FREQ_NOT_SUPPORTED = 24,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_DEPRECATED = 26,
    NVML_ERROR_NOT_READY = 27,
    NVML_ERROR_GPU_NOT_FOUND = 28,
    NVML_ERROR_INVALID_STATE = 29,
    NVML_ERROR_UNKNOWN = 999
} nvmlReturn_t;

enum {
    NVML_COMPUTEMODE_DEFAULT = 0,
    NVML_COMPUTEMODE_EXCLUSIVE_THREAD = 1,
    NVML_COMPUTEMODE_PROHIBITED = 2,
    NVML_COMPUTEMODE_EXCLUSIVE_PROCESS = 3,
    NVML_COMPUTEMODE_COUNT = 4
};

#define NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE 32
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE 16
#define NVML_MAX_MIG_DEVICES 7 /* what an H100/A100 reports as its max MIG device count */
#define MAX_GPUS 64
#define MAX_MIGS (MAX_GPUS * NVML_MAX_MIG_DEVICES)

/* nvmlPciInfo_t as nvml.h >= 9.0 lays it out (pynvml nvmlPciInfo_t; _v3 fills busId). */
typedef struct {
    char busIdLegacy[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
} nvmlPciInfo_t;

/* The legacy layout nvmlDeviceGetPciInfo (v1) and _v2 fill (pynvml nvmlPciInfo_v2_t). */
typedef struct {
    char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    unsigned int reserved0, reserved1, reserved2, reserved3;
} nvmlPciInfo_v2_t;

typedef struct {
    unsigned int version;
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    unsigned int baseClass;
    unsigned int subClass;
    char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
} nvmlPciInfoExt_v1_t;
#define nvmlPciInfoExt_v1 ((unsigned int)(sizeof(nvmlPciInfoExt_v1_t) | (1 << 24)))

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;
#define nvmlMemory_v2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2 << 24)))

typedef struct fake_device {
    int is_mig;
    int visible;
    unsigned int visible_index;
    unsigned int node_index; /* index on the whole node (the data file's index) */
    unsigned int minor;
    char uuid[96];
    char name[96];
    unsigned long long memory;
    char pci[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
    unsigned int pci_device_id;
    unsigned int pci_subsys_id;
    int cc_major, cc_minor;
    unsigned int mig_mode;
    unsigned int persistence;
    unsigned int compute_mode;
    unsigned int brand; /* nvmlBrandType_t */
    int compute_mode_set; /* set in this process by nvmlDeviceSetComputeMode */
    /* MIG devices */
    struct fake_device *parent;
    unsigned int slot, gi, ci, gi_minor, ci_minor;
    char profile[32];
    struct fake_device *slots[NVML_MAX_MIG_DEVICES]; /* on a GPU: its visible MIG devices */
} fake_device;

typedef fake_device *nvmlDevice_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int refcount;
static char data_path[4096];
static int data_from_file;
static char driver_version[80];
static char nvml_version[80];
static int cuda_version;
static char dev_root[4096];
static unsigned int monitor_minor;
static int have_monitor;
static fake_device gpus[MAX_GPUS];
static unsigned int n_gpus;
static fake_device migs[MAX_MIGS];
static unsigned int n_migs;
static fake_device *visible[MAX_GPUS];
static unsigned int n_visible;

/* ---- data ------------------------------------------------------------------------------------ */

static void copy_str(char *dst, size_t size, const char *src) {
    snprintf(dst, size, "%s", src);
}

/* Parses "key=value" tokens of one gpu/mig line; "name=" takes the rest of the line. */
static int parse_fields(char *rest, fake_device *d, unsigned int *gpu_index) {
    char *p = rest;
    while (*p) {
        while (*p == ' ' || *p == '\t') p++;
        if (!*p) break;
        char *eq = strchr(p, '=');
        if (!eq) return -1;
        *eq = '\0';
        char *key = p;
        char *val = eq + 1;
        if (strcmp(key, "name") == 0) {
            copy_str(d->name, sizeof d->name, val);
            return 0;
        }
        char *end = val;
        while (*end && *end != ' ' && *end != '\t') end++;
        if (*end) *end++ = '\0';
        p = end;
        if (strcmp(key, "index") == 0) d->node_index = (unsigned)strtoul(val, NULL, 10);
        else if (strcmp(key, "gpu") == 0) *gpu_index = (unsigned)strtoul(val, NULL, 10);
        else if (strcmp(key, "minor") == 0) d->minor = (unsigned)strtoul(val, NULL, 10);
        else if (strcmp(key, "uuid") == 0) copy_str(d->uuid, sizeof d->uuid, val);
        else if (strcmp(key, "memory") == 0) d->memory = strtoull(val, NULL, 10);
        else if (strcmp(key, "pci") == 0) copy_str(d->pci, sizeof d->pci, val);
        else if (strcmp(key, "device_id") == 0) d->pci_device_id = (unsigned)strtoul(val, NULL, 0);
        else if (strcmp(key, "subsys_id") == 0) d->pci_subsys_id = (unsigned)strtoul(val, NULL, 0);
        else if (strcmp(key, "cc") == 0) {
            if (sscanf(val, "%d.%d", &d->cc_major, &d->cc_minor) != 2) return -1;
        } else if (strcmp(key, "mig") == 0) d->mig_mode = (unsigned)strtoul(val, NULL, 10);
        else if (strcmp(key, "persistence") == 0) d->persistence = (unsigned)strtoul(val, NULL, 10);
        else if (strcmp(key, "compute_mode") == 0) d->compute_mode = (unsigned)strtoul(val, NULL, 10);
        else if (strcmp(key, "brand") == 0) d->brand = (unsigned)strtoul(val, NULL, 10);
        else if (strcmp(key, "slot") == 0) d->slot = (unsigned)strtoul(val, NULL, 10);
        else if (strcmp(key, "gi") == 0) d->gi = (unsigned)strtoul(val, NULL, 10);
        else if (strcmp(key, "ci") == 0) d->ci = (unsigned)strtoul(val, NULL, 10);
        else if (strcmp(key, "gi_minor") == 0) d->gi_minor = (unsigned)strtoul(val, NULL, 10);
        else if (strcmp(key, "ci_minor") == 0) d->ci_minor = (unsigned)strtoul(val, NULL, 10);
        else if (strcmp(key, "profile") == 0) copy_str(d->profile, sizeof d->profile, val);
        /* unknown keys are ignored, so the format can grow */
    }
    return 0;
}

static int parse_line(char *line) {
    size_t len = strlen(line);
    while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = '\0';
    if (!len || line[0] == '#') return 0;
    char *sp = strchr(line, ' ');
    char *rest = sp ? sp + 1 : line + len;
    if (sp) *sp = '\0';
    if (strcmp(line, "version") == 0) return strcmp(rest, "1") == 0 ? 0 : -1;
    if (strcmp(line, "driver_version") == 0) copy_str(driver_version, sizeof driver_version, rest);
    else if (strcmp(line, "nvml_version") == 0) copy_str(nvml_version, sizeof nvml_version, rest);
    else if (strcmp(line, "cuda_version") == 0) cuda_version = atoi(rest);
    else if (strcmp(line, "dev_root") == 0) copy_str(dev_root, sizeof dev_root, rest);
    else if (strcmp(line, "caps") == 0) {
        char *m = strstr(rest, "monitor=");
        if (m) {
            monitor_minor = (unsigned)strtoul(m + 8, NULL, 10);
            have_monitor = 1;
        }
    } else if (strcmp(line, "gpu") == 0) {
        if (n_gpus >= MAX_GPUS) return -1;
        fake_device *d = &gpus[n_gpus];
        memset(d, 0, sizeof *d);
        unsigned int unused = 0;
        if (parse_fields(rest, d, &unused) != 0) return -1;
        n_gpus++;
    } else if (strcmp(line, "mig") == 0) {
        if (n_migs >= MAX_MIGS) return -1;
        fake_device *d = &migs[n_migs];
        memset(d, 0, sizeof *d);
        unsigned int gpu_index = 0;
        if (parse_fields(rest, d, &gpu_index) != 0) return -1;
        d->is_mig = 1;
        for (unsigned int i = 0; i < n_gpus; i++)
            if (gpus[i].node_index == gpu_index) d->parent = &gpus[i];
        if (!d->parent || d->slot >= NVML_MAX_MIG_DEVICES) return -1;
        n_migs++;
    }
    return 0;
}

static void reset_data(void) {
    n_gpus = n_migs = n_visible = 0;
    driver_version[0] = nvml_version[0] = '\0';
    cuda_version = 0;
    have_monitor = 0;
    copy_str(dev_root, sizeof dev_root, "/");
}

static int load_from_memory(const char *text) {
    char *copy = strdup(text);
    if (!copy) return -1;
    int rc = 0;
    char *save = NULL;
    for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
        if (parse_line(line) != 0) rc = -1;
    free(copy);
    return rc;
}

static int load_data(void) {
    reset_data();
    const char *env = getenv("FAKE_NVML_DATA");
    copy_str(data_path, sizeof data_path, env ? env : FAKE_NVML_DATA_PATH);
    data_from_file = 0;
    FILE *f = fopen(data_path, "re");
    if (f) {
        char line[1024];
        int rc = 0;
        while (fgets(line, sizeof line, f))
            if (parse_line(line) != 0) rc = -1;
        fclose(f);
        if (rc == 0) {
            data_from_file = 1;
            return 0;
        }
        reset_data();
    }
    return load_from_memory(FAKE_NVML_EMBEDDED);
}

static int is_char_device(const char *rel) {
    char path[8192];
    const char *root = strcmp(dev_root, "/") == 0 ? "" : dev_root;
    snprintf(path, sizeof path, "%s%s", root, rel);
    struct stat st;
    return stat(path, &st) == 0 && S_ISCHR(st.st_mode);
}

static int cap_node(unsigned int minor) {
    char rel[64];
    snprintf(rel, sizeof rel, "/dev/nvidia-caps/nvidia-cap%u", minor);
    return is_char_device(rel);
}

static void enumerate(void) {
    n_visible = 0;
    for (unsigned int i = 0; i < n_gpus; i++) {
        char rel[64];
        snprintf(rel, sizeof rel, "/dev/nvidia%u", gpus[i].minor);
        gpus[i].visible = is_char_device(rel);
        memset(gpus[i].slots, 0, sizeof gpus[i].slots);
        if (gpus[i].visible) {
            gpus[i].visible_index = n_visible;
            visible[n_visible++] = &gpus[i];
        }
    }
    int monitor = have_monitor && cap_node(monitor_minor);
    for (unsigned int j = 0; j < n_migs; j++) {
        fake_device *m = &migs[j];
        fake_device *p = m->parent;
        m->visible = p->visible && p->mig_mode &&
                     (monitor || (cap_node(m->gi_minor) && cap_node(m->ci_minor)));
        m->minor = p->minor;
        m->visible_index = p->visible_index;
        m->node_index = p->node_index;
        if (m->visible) p->slots[m->slot] = m;
    }
}

/* ---- handles --------------------------------------------------------------------------------- */

static int valid_gpu(nvmlDevice_t d) {
    return d >= &gpus[0] && d < &gpus[n_gpus] && d->visible;
}

static int valid_mig(nvmlDevice_t d) {
    return d >= &migs[0] && d < &migs[n_migs] && d->visible;
}

/* Common entry check: initialised, and a live handle. */
static nvmlReturn_t check(nvmlDevice_t d) {
    if (refcount == 0) return NVML_ERROR_UNINITIALIZED;
    if (!valid_gpu(d) && !valid_mig(d)) return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

static nvmlReturn_t put_string(char *buf, unsigned int length, const char *value) {
    if (!buf) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, value, strlen(value) + 1);
    return NVML_SUCCESS;
}

/* ---- init ------------------------------------------------------------------------------------ */

API nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    nvmlReturn_t rc = NVML_SUCCESS;
    pthread_mutex_lock(&lock);
    if (refcount == 0) {
        if (load_data() != 0 || !driver_version[0]) rc = NVML_ERROR_DRIVER_NOT_LOADED;
        else enumerate();
    }
    if (rc == NVML_SUCCESS) refcount++;
    pthread_mutex_unlock(&lock);
    return rc;
}

API nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
API nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

API nvmlReturn_t nvmlShutdown(void) {
    nvmlReturn_t rc = NVML_SUCCESS;
    pthread_mutex_lock(&lock);
    if (refcount == 0) rc = NVML_ERROR_UNINITIALIZED;
    else refcount--;
    pthread_mutex_unlock(&lock);
    return rc;
}

API const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupted by the system (IRQ)";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_VGPU_ECC_NOT_SUPPORTED:
        return "The requested vgpu operation is not available on target device, because ECC is enabled";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient resources";
    case NVML_ERROR_FREQ_NOT_SUPPORTED: return "Frequency not supported";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Version mismatch";
    case NVML_ERROR_DEPRECATED: return "Deprecated";
    case NVML_ERROR_NOT_READY: return "Not ready";
    case NVML_ERROR_GPU_NOT_FOUND: return "GPU not found";
    case NVML_ERROR_INVALID_STATE: return "Invalid state";
    default: return "Unknown Error";
    }
}

/* ---- system ---------------------------------------------------------------------------------- */

API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (refcount == 0) return NVML_ERROR_UNINITIALIZED;
    return put_string(version, length, driver_version);
}

API nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    /* Real NVML answers this without nvmlInit. */
    if (!driver_version[0]) {
        pthread_mutex_lock(&lock);
        if (refcount == 0) load_data();
        pthread_mutex_unlock(&lock);
    }
    return put_string(version, length, nvml_version);
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) {
    if (!v) return NVML_ERROR_INVALID_ARGUMENT;
    if (refcount == 0) return NVML_ERROR_UNINITIALIZED;
    *v = cuda_version;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) {
    return nvmlSystemGetCudaDriverVersion(v);
}

/* ---- enumeration ----------------------------------------------------------------------------- */

API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (refcount == 0) return NVML_ERROR_UNINITIALIZED;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = n_visible;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (refcount == 0) return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= n_visible) return NVML_ERROR_INVALID_ARGUMENT;
    *device = visible[index];
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    if (refcount == 0) return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < n_visible; i++)
        if (strcmp(visible[i]->uuid, uuid) == 0) {
            *device = visible[i];
            return NVML_SUCCESS;
        }
    for (unsigned int j = 0; j < n_migs; j++)
        if (migs[j].visible && strcmp(migs[j].uuid, uuid) == 0) {
            *device = &migs[j];
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_FOUND;
}

static nvmlReturn_t by_bus_id(const char *bus_id, nvmlDevice_t *device) {
    if (refcount == 0) return NVML_ERROR_UNINITIALIZED;
    if (!bus_id || !device) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < n_visible; i++) {
        const char *mine = visible[i]->pci;
        /* accept the 8-digit and the legacy 4-digit domain forms, any case */
        if (strcasecmp(mine, bus_id) == 0 ||
            (strlen(mine) > 4 && strcasecmp(mine + 4, bus_id) == 0)) {
            *device = visible[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

API nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus_id, nvmlDevice_t *device) {
    return by_bus_id(bus_id, device);
}

API nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *bus_id, nvmlDevice_t *device) {
    return by_bus_id(bus_id, device);
}

/* ---- identity -------------------------------------------------------------------------------- */

API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *index) {
    nvmlReturn_t rc = check(d);
    if (rc) return rc;
    if (!index) return NVML_ERROR_INVALID_ARGUMENT;
    *index = d->visible_index; /* on a MIG handle: its parent's */
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t d, unsigned int *minor) {
    nvmlReturn_t rc = check(d);
    if (rc) return rc;
    if (!minor) return NVML_ERROR_INVALID_ARGUMENT;
    *minor = d->minor;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int length) {
    nvmlReturn_t rc = check(d);
    if (rc) return rc;
    return put_string(uuid, length, d->uuid);
}

API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int length) {
    nvmlReturn_t rc = check(d);
    if (rc) return rc;
    return put_string(name, length, d->name);
}

static void pci_fields(const fake_device *g, unsigned int *domain, unsigned int *bus,
                       unsigned int *dev) {
    *domain = *bus = *dev = 0;
    sscanf(g->pci, "%x:%x:%x", domain, bus, dev);
}

API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *pci) {
    nvmlReturn_t rc = check(d);
    if (rc) return rc;
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    const fake_device *g = d->is_mig ? d->parent : d;
    memset(pci, 0, sizeof *pci);
    pci_fields(g, &pci->domain, &pci->bus, &pci->device);
    pci->pciDeviceId = g->pci_device_id;
    pci->pciSubSystemId = g->pci_subsys_id;
    snprintf(pci->busId, sizeof pci->busId, "%s", g->pci);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.0", pci->domain & 0xffff,
             pci->bus, pci->device);
    return NVML_SUCCESS;
}

static nvmlReturn_t pci_legacy(nvmlDevice_t d, nvmlPciInfo_v2_t *pci) {
    nvmlPciInfo_t full;
    nvmlReturn_t rc = check(d);
    if (rc) return rc;
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlDeviceGetPciInfo_v3(d, &full);
    memset(pci, 0, sizeof *pci);
    memcpy(pci->busId, full.busIdLegacy, sizeof pci->busId);
    pci->domain = full.domain;
    pci->bus = full.bus;
    pci->device = full.device;
    pci->pciDeviceId = full.pciDeviceId;
    pci->pciSubSystemId = full.pciSubSystemId;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t d, nvmlPciInfo_v2_t *pci) {
    return pci_legacy(d, pci);
}

API nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t d, nvmlPciInfo_v2_t *pci) {
    return pci_legacy(d, pci);
}

API nvmlReturn_t nvmlDeviceGetPciInfoExt(nvmlDevice_t d, nvmlPciInfoExt_v1_t *pci) {
    nvmlPciInfo_t full;
    nvmlReturn_t rc = check(d);
    if (rc) return rc;
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    if (pci->version != nvmlPciInfoExt_v1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlDeviceGetPciInfo_v3(d, &full);
    pci->domain = full.domain;
    pci->bus = full.bus;
    pci->device = full.device;
    pci->pciDeviceId = full.pciDeviceId;
    pci->pciSubSystemId = full.pciSubSystemId;
    pci->baseClass = 0x3; /* display controller */
    pci->subClass = 0x2;  /* 3D controller */
    memcpy(pci->busId, full.busId, sizeof pci->busId);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *major, int *minor) {
    nvmlReturn_t rc = check(d);
    if (rc) return rc;
    if (!major || !minor) return NVML_ERROR_INVALID_ARGUMENT;
    const fake_device *g = d->is_mig ? d->parent : d;
    *major = g->cc_major;
    *minor = g->cc_minor;
    return NVML_SUCCESS;
}

/* ---- memory ---------------------------------------------------------------------------------- */

/* What the driver keeps for itself on an idle GPU, and what an idle GPU shows as used. */
static unsigned long long reserved_of(const fake_device *d) { return d->is_mig ? 0 : d->memory / 160; }
static unsigned long long used_of(const fake_device *d) { return d->is_mig ? 13ULL << 20 : 0; }

API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *mem) {
    nvmlReturn_t rc = check(d);
    if (rc) return rc;
    if (!mem) return NVML_ERROR_INVALID_ARGUMENT;
    /* v1 counts the reserved memory as used */
    mem->total = d->memory;
    mem->used = reserved_of(d) + used_of(d);
    mem->free = mem->total - mem->used;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *mem) {
    nvmlReturn_t rc = check(d);
    if (rc) return rc;
    if (!mem) return NVML_ERROR_INVALID_ARGUMENT;
    if (mem->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    mem->total = d->memory;
    mem->reserved = reserved_of(d);
    mem->used = used_of(d);
    mem->free = mem->total - mem->reserved - mem->used;
    return NVML_SUCCESS;
}

/* ---- modes ----------------------------------------------------------------------------------- */

static void compute_mode_file(const fake_device *g, char *out, size_t size) {
    snprintf(out, size, "%s.computemode.%u", data_path, g->node_index);
}

API nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t d, unsigned int *mode) {
    nvmlReturn_t rc = check(d);
    if (rc) return rc;
    if (!mode) return NVML_ERROR_INVALID_ARGUMENT;
    fake_device *g = d->is_mig ? d->parent : d;
    *mode = g->compute_mode;
    if (data_from_file) {
        /* the node-wide state another process may have set */
        char path[8192];
        compute_mode_file(g, path, sizeof path);
        FILE *f = fopen(path, "re");
        if (f) {
            unsigned int m;
            if (fscanf(f, "%u", &m) == 1 && m < NVML_COMPUTEMODE_COUNT) *mode = m;
            fclose(f);
        }
    }
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceSetComputeMode(nvmlDevice_t d, unsigned int mode) {
    nvmlReturn_t rc = check(d);
    if (rc) return rc;
    if (d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    if (mode >= NVML_COMPUTEMODE_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    if (mode == NVML_COMPUTEMODE_EXCLUSIVE_THREAD) return NVML_ERROR_NOT_SUPPORTED;
    if (geteuid() != 0) return NVML_ERROR_NO_PERMISSION;
    d->compute_mode = mode;
    d->compute_mode_set = 1;
    if (data_from_file) {
        char path[8192], tmp[8300];
        compute_mode_file(d, path, sizeof path);
        snprintf(tmp, sizeof tmp, "%s.%ld", path, (long)getpid());
        FILE *f = fopen(tmp, "we");
        if (f) {
            int ok = fprintf(f, "%u\n", mode) > 0;
            ok = (fclose(f) == 0) && ok;
            if (!ok || rename(tmp, path) != 0) unlink(tmp);
        }
    }
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t d, unsigned int *mode) {
    nvmlReturn_t rc = check(d);
    if (rc) return rc;
    if (!mode) return NVML_ERROR_INVALID_ARGUMENT;
    *mode = (d->is_mig ? d->parent : d)->persistence;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t d, unsigned int *brand) {
    nvmlReturn_t rc = check(d);
    if (rc) return rc;
    if (!brand) return NVML_ERROR_INVALID_ARGUMENT;
    *brand = (d->is_mig ? d->parent : d)->brand;
    return NVML_SUCCESS;
}

/* ---- MIG ------------------------------------------------------------------------------------- */

API nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *current, unsigned int *pending) {
    nvmlReturn_t rc = check(d);
    if (rc) return rc;
    if (!current || !pending) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    *current = *pending = d->mig_mode ? 1 : 0;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned int *count) {
    nvmlReturn_t rc = check(d);
    if (rc) return rc;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    *count = d->mig_mode ? NVML_MAX_MIG_DEVICES : 0; /* zero when MIG is off, as documented */
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned int index,
                                                     nvmlDevice_t *mig) {
    nvmlReturn_t rc = check(d);
    if (rc) return rc;
    if (d->is_mig || !mig) return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->mig_mode) return NVML_ERROR_NOT_SUPPORTED;
    if (index >= NVML_MAX_MIG_DEVICES) return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->slots[index]) return NVML_ERROR_NOT_FOUND;
    *mig = d->slots[index];
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t d, unsigned int *is_mig) {
    nvmlReturn_t rc = check(d);
    if (rc) return rc;
    if (!is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    *is_mig = d->is_mig ? 1 : 0;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t d, nvmlDevice_t *parent) {
    nvmlReturn_t rc = check(d);
    if (rc) return rc;
    if (!d->is_mig || !parent) return NVML_ERROR_INVALID_ARGUMENT;
    *parent = d->parent;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t d, unsigned int *id) {
    nvmlReturn_t rc = check(d);
    if (rc) return rc;
    if (!d->is_mig || !id) return NVML_ERROR_INVALID_ARGUMENT;
    *id = d->gi;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t d, unsigned int *id) {
    nvmlReturn_t rc = check(d);
    if (rc) return rc;
    if (!d->is_mig || !id) return NVML_ERROR_INVALID_ARGUMENT;
    *id = d->ci;
    return NVML_SUCCESS;
}
