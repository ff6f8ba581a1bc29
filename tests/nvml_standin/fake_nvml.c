/*
 * A stand-in libnvidia-ml.so.1 for kvwatch's tests: the real nvml.h, no GPU.
 *
 * Build (the tests do this, see __init__.py):
 *   cc -shared -fPIC -Wl,-soname,libnvidia-ml.so.1 -DNVML_NO_UNVERSIONED_FUNC_DEFS \
 *      -I<dir of nvml.h> -o libnvidia-ml.so.1 fake_nvml.c
 * NVML_NO_UNVERSIONED_FUNC_DEFS makes nvml.h declare the old unversioned names
 * too, so every symbol defined here is checked against NVIDIA's prototype.
 *
 * The fake driver's state is a text file named by $NVML_STANDIN_STATE, read
 * again on every call, so a test can rewrite it (atomically) while a process
 * runs. One record per line, blank lines and '#' comments ignored:
 *
 *   driver <version>
 *   gpu <index> <uuid> <cc_major> <cc_minor> <total> <used> <reserved> <name...>
 *   proc <gpu index> <pid> <used bytes | NA>
 *   error <gpu index | *> <call | *> <NVML error name without NVML_ERROR_, or a number>
 *
 * gpu lines must be numbered 0..n-1. <call> is one of: init driver count
 * handle uuid name index cc memory_v1 memory_v2 processes_v1 processes_v2
 * processes_v3; "memory" and "processes" match all their versions, and '*'
 * every per-device call (handle included), which is how a lost GPU is
 * written: "error 1 * GPU_IS_LOST".
 * Memory: v1 "used" = used + reserved (as the real driver reports), v2 splits
 * them; free = total - used - reserved.
 *
 * If $NVML_STANDIN_CALLS names a file, each exported call appends its name
 * there, so tests can see what pynvml really called.
 */
#include <nvml.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_GPUS 16
#define MAX_PROCS 64
#define MAX_ERRORS 64

struct nvmlDevice_st {
    unsigned int index; /* a handle is a pointer into devices[]; it stays valid */
};

typedef struct {
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    int cc_major, cc_minor;
    unsigned long long total, used, reserved;
} gpu_t;

typedef struct {
    unsigned int gpu, pid;
    unsigned long long used;
} proc_t;

typedef struct {
    int gpu; /* -1: every GPU / global */
    char call[32];
    nvmlReturn_t code;
} error_t_;

typedef struct {
    char driver[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
    unsigned int ngpus, nprocs, nerrors;
    gpu_t gpus[MAX_GPUS];
    proc_t procs[MAX_PROCS];
    error_t_ errors[MAX_ERRORS];
} state_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static state_t st;              /* guarded by lock */
static unsigned int init_count; /* guarded by lock; nvmlInit/nvmlShutdown pairs */
static struct nvmlDevice_st devices[MAX_GPUS] = {
    {0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, {10}, {11}, {12}, {13}, {14}, {15}};

static const struct {
    const char *name;
    nvmlReturn_t code;
    const char *text;
} codes[] = {
    {"SUCCESS", NVML_SUCCESS, "Success"},
    {"UNINITIALIZED", NVML_ERROR_UNINITIALIZED, "Uninitialized"},
    {"INVALID_ARGUMENT", NVML_ERROR_INVALID_ARGUMENT, "Invalid Argument"},
    {"NOT_SUPPORTED", NVML_ERROR_NOT_SUPPORTED, "Not Supported"},
    {"NO_PERMISSION", NVML_ERROR_NO_PERMISSION, "Insufficient Permissions"},
    {"NOT_FOUND", NVML_ERROR_NOT_FOUND, "Not Found"},
    {"INSUFFICIENT_SIZE", NVML_ERROR_INSUFFICIENT_SIZE, "Insufficient Size"},
    {"DRIVER_NOT_LOADED", NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded"},
    {"TIMEOUT", NVML_ERROR_TIMEOUT, "Timeout"},
    {"LIBRARY_NOT_FOUND", NVML_ERROR_LIBRARY_NOT_FOUND, "NVML Shared Library Not Found"},
    {"FUNCTION_NOT_FOUND", NVML_ERROR_FUNCTION_NOT_FOUND, "Function Not Found"},
    {"GPU_IS_LOST", NVML_ERROR_GPU_IS_LOST, "GPU is lost"},
    {"RESET_REQUIRED", NVML_ERROR_RESET_REQUIRED, "GPU requires restart"},
    {"LIB_RM_VERSION_MISMATCH", NVML_ERROR_LIB_RM_VERSION_MISMATCH,
     "RM has detected an NVML/RM version mismatch."},
    {"ARGUMENT_VERSION_MISMATCH", NVML_ERROR_ARGUMENT_VERSION_MISMATCH, "Argument version mismatch"},
    {"UNKNOWN", NVML_ERROR_UNKNOWN, "Unknown Error"},
};

static void log_call(const char *name)
{
    const char *path = getenv("NVML_STANDIN_CALLS");
    if (!path || !*path)
        return;
    FILE *f = fopen(path, "a");
    if (f) {
        fprintf(f, "%s\n", name);
        fclose(f);
    }
}

static int parse_code(const char *s, nvmlReturn_t *out)
{
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
        if (strcmp(s, codes[i].name) == 0) {
            *out = codes[i].code;
            return 0;
        }
    char *end;
    long v = strtol(s, &end, 10);
    if (*s && !*end) {
        *out = (nvmlReturn_t)v;
        return 0;
    }
    return -1;
}

static int parse_bytes(const char *s, unsigned long long *out)
{
    if (strcmp(s, "NA") == 0) {
        *out = (unsigned long long)NVML_VALUE_NOT_AVAILABLE;
        return 0;
    }
    char *end;
    errno = 0;
    *out = strtoull(s, &end, 10);
    return (*s && !*end && !errno) ? 0 : -1;
}

/* Reads the state file into st. Returns NVML_SUCCESS, DRIVER_NOT_LOADED when
 * there is no state file (like a host without the driver), or UNKNOWN for a
 * malformed file (with a line on stderr: a malformed file is a test bug). */
static nvmlReturn_t load(void)
{
    const char *path = getenv("NVML_STANDIN_STATE");
    memset(&st, 0, sizeof st);
    if (!path || !*path)
        return NVML_ERROR_DRIVER_NOT_LOADED;
    FILE *f = fopen(path, "r");
    if (!f)
        return NVML_ERROR_DRIVER_NOT_LOADED;
    char line[512];
    int lineno = 0;
    nvmlReturn_t ret = NVML_SUCCESS;
    while (ret == NVML_SUCCESS && fgets(line, sizeof line, f)) {
        lineno++;
        line[strcspn(line, "\r\n")] = '\0';
        char kind[16] = "", a[128] = "", b[128] = "", c[128] = "", d[64] = "", e[64] = "",
             g[64] = "", h[64] = "";
        int name_at = 0;
        int n = sscanf(line, " %15s", kind);
        if (n < 1 || kind[0] == '#')
            continue;
        int ok = 0;
        if (strcmp(kind, "driver") == 0) {
            ok = sscanf(line, " %*s %79s", st.driver) == 1;
        } else if (strcmp(kind, "gpu") == 0 && st.ngpus < MAX_GPUS) {
            gpu_t *gp = &st.gpus[st.ngpus];
            unsigned int idx;
            ok = sscanf(line, " %*s %u %95s %d %d %63s %63s %63s %n", &idx, gp->uuid, &gp->cc_major,
                        &gp->cc_minor, d, e, g, &name_at) == 7 &&
                 idx == st.ngpus && parse_bytes(d, &gp->total) == 0 &&
                 parse_bytes(e, &gp->used) == 0 && parse_bytes(g, &gp->reserved) == 0 && name_at > 0;
            if (ok) {
                snprintf(gp->name, sizeof gp->name, "%s", line + name_at);
                st.ngpus++;
            }
        } else if (strcmp(kind, "proc") == 0 && st.nprocs < MAX_PROCS) {
            proc_t *p = &st.procs[st.nprocs];
            ok = sscanf(line, " %*s %u %u %63s", &p->gpu, &p->pid, h) == 3 &&
                 parse_bytes(h, &p->used) == 0;
            if (ok)
                st.nprocs++;
        } else if (strcmp(kind, "error") == 0 && st.nerrors < MAX_ERRORS) {
            error_t_ *er = &st.errors[st.nerrors];
            ok = sscanf(line, " %*s %127s %127s %127s", a, b, c) == 3 && strlen(b) < sizeof er->call &&
                 parse_code(c, &er->code) == 0;
            if (ok) {
                er->gpu = strcmp(a, "*") == 0 ? -1 : atoi(a);
                strcpy(er->call, b);
                st.nerrors++;
            }
        }
        if (!ok) {
            fprintf(stderr, "fake_nvml: %s:%d: cannot parse: %s\n", path, lineno, line);
            ret = NVML_ERROR_UNKNOWN;
        }
    }
    fclose(f);
    return ret;
}

/* The injected error for this call on this GPU (gpu -1: a global call). */
static nvmlReturn_t injected(int gpu, const char *call)
{
    for (unsigned int i = 0; i < st.nerrors; i++) {
        const error_t_ *er = &st.errors[i];
        if (er->gpu != -1 && er->gpu != gpu)
            continue;
        size_t len = strlen(er->call);
        /* "memory" matches memory_v1/_v2, "processes" every version */
        int match = strcmp(er->call, call) == 0 || (gpu >= 0 && strcmp(er->call, "*") == 0) ||
                    (strncmp(er->call, call, len) == 0 && call[len] == '_' &&
                     strchr(er->call, '_') == NULL);
        if (match)
            return er->code;
    }
    return NVML_SUCCESS;
}

/* Common prologue: log, lock, re-read the state, check init and injection. */
static nvmlReturn_t enter(const char *fn, int gpu, const char *call)
{
    log_call(fn);
    pthread_mutex_lock(&lock);
    if (init_count == 0)
        return NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t ret = load();
    if (ret != NVML_SUCCESS)
        return ret == NVML_ERROR_DRIVER_NOT_LOADED ? NVML_ERROR_UNKNOWN : ret;
    return injected(gpu, call);
}

static nvmlReturn_t leave(nvmlReturn_t ret)
{
    pthread_mutex_unlock(&lock);
    return ret;
}

/* Device calls: also check the handle is one of ours and still present. */
static nvmlReturn_t enter_device(const char *fn, nvmlDevice_t device, const char *call)
{
    if (device < devices || device >= devices + MAX_GPUS) {
        log_call(fn);
        pthread_mutex_lock(&lock);
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    nvmlReturn_t ret = enter(fn, (int)device->index, call);
    if (ret == NVML_SUCCESS && device->index >= st.ngpus)
        ret = NVML_ERROR_GPU_IS_LOST; /* its gpu line went away */
    return ret;
}

static nvmlReturn_t copy_string(char *dst, unsigned int length, const char *src)
{
    if (!dst)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(dst, src);
    return NVML_SUCCESS;
}

/* ---- init / shutdown / errors ---- */

static nvmlReturn_t do_init(const char *fn)
{
    log_call(fn);
    pthread_mutex_lock(&lock);
    nvmlReturn_t ret = load();
    if (ret == NVML_SUCCESS)
        ret = injected(-1, "init");
    if (ret == NVML_SUCCESS)
        init_count++;
    return leave(ret);
}

nvmlReturn_t nvmlInit(void) { return do_init("nvmlInit"); }
nvmlReturn_t nvmlInit_v2(void) { return do_init("nvmlInit_v2"); }
nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    return do_init("nvmlInitWithFlags");
}

nvmlReturn_t nvmlShutdown(void)
{
    log_call("nvmlShutdown");
    pthread_mutex_lock(&lock);
    if (init_count == 0)
        return leave(NVML_ERROR_UNINITIALIZED);
    init_count--;
    return leave(NVML_SUCCESS);
}

const char *nvmlErrorString(nvmlReturn_t result)
{
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
        if (codes[i].code == result)
            return codes[i].text;
    return "Unknown Error";
}

/* ---- system ---- */

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    nvmlReturn_t ret = enter("nvmlSystemGetDriverVersion", -1, "driver");
    if (ret == NVML_SUCCESS)
        ret = copy_string(version, length, st.driver);
    return leave(ret);
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    nvmlReturn_t ret = enter("nvmlSystemGetNVMLVersion", -1, "driver");
    if (ret == NVML_SUCCESS)
        ret = copy_string(version, length, "13.0.0-standin");
    return leave(ret);
}

/* ---- enumeration ---- */

static nvmlReturn_t get_count(const char *fn, unsigned int *count)
{
    nvmlReturn_t ret = enter(fn, -1, "count");
    if (ret == NVML_SUCCESS && !count)
        ret = NVML_ERROR_INVALID_ARGUMENT;
    if (ret == NVML_SUCCESS)
        *count = st.ngpus;
    return leave(ret);
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return get_count("nvmlDeviceGetCount", count); }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
    return get_count("nvmlDeviceGetCount_v2", count);
}

static nvmlReturn_t get_handle(const char *fn, unsigned int index, nvmlDevice_t *device)
{
    nvmlReturn_t ret = enter(fn, (int)index, "handle");
    if (ret == NVML_SUCCESS && (!device || index >= st.ngpus))
        ret = NVML_ERROR_INVALID_ARGUMENT;
    if (ret == NVML_SUCCESS)
        *device = &devices[index];
    return leave(ret);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return get_handle("nvmlDeviceGetHandleByIndex", index, device);
}
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    return get_handle("nvmlDeviceGetHandleByIndex_v2", index, device);
}

/* ---- per-device ---- */

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    nvmlReturn_t ret = enter_device("nvmlDeviceGetUUID", device, "uuid");
    if (ret == NVML_SUCCESS)
        ret = copy_string(uuid, length, st.gpus[device->index].uuid);
    return leave(ret);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    nvmlReturn_t ret = enter_device("nvmlDeviceGetName", device, "name");
    if (ret == NVML_SUCCESS)
        ret = copy_string(name, length, st.gpus[device->index].name);
    return leave(ret);
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    nvmlReturn_t ret = enter_device("nvmlDeviceGetIndex", device, "index");
    if (ret == NVML_SUCCESS && !index)
        ret = NVML_ERROR_INVALID_ARGUMENT;
    if (ret == NVML_SUCCESS)
        *index = device->index;
    return leave(ret);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    nvmlReturn_t ret = enter_device("nvmlDeviceGetMemoryInfo", device, "memory_v1");
    if (ret == NVML_SUCCESS && !memory)
        ret = NVML_ERROR_INVALID_ARGUMENT;
    if (ret == NVML_SUCCESS) {
        const gpu_t *gp = &st.gpus[device->index];
        memory->total = gp->total;
        memory->used = gp->used + gp->reserved;
        memory->free = gp->total - memory->used;
    }
    return leave(ret);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    nvmlReturn_t ret = enter_device("nvmlDeviceGetMemoryInfo_v2", device, "memory_v2");
    if (ret == NVML_SUCCESS && !memory)
        ret = NVML_ERROR_INVALID_ARGUMENT;
    if (ret == NVML_SUCCESS && memory->version != nvmlMemory_v2)
        ret = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (ret == NVML_SUCCESS) {
        const gpu_t *gp = &st.gpus[device->index];
        memory->total = gp->total;
        memory->reserved = gp->reserved;
        memory->used = gp->used;
        memory->free = gp->total - gp->used - gp->reserved;
    }
    return leave(ret);
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    nvmlReturn_t ret = enter_device("nvmlDeviceGetCudaComputeCapability", device, "cc");
    if (ret == NVML_SUCCESS && (!major || !minor))
        ret = NVML_ERROR_INVALID_ARGUMENT;
    if (ret == NVML_SUCCESS) {
        *major = st.gpus[device->index].cc_major;
        *minor = st.gpus[device->index].cc_minor;
    }
    return leave(ret);
}

/* NVML's two-call protocol: with too small a buffer (or none) report the
 * count and INSUFFICIENT_SIZE; no processes at all is SUCCESS with 0. */
static nvmlReturn_t get_processes(const char *fn, const char *call, nvmlDevice_t device,
                                  unsigned int *count, void *infos, size_t stride,
                                  int has_instance_ids)
{
    nvmlReturn_t ret = enter_device(fn, device, call);
    if (ret == NVML_SUCCESS && !count)
        ret = NVML_ERROR_INVALID_ARGUMENT;
    if (ret != NVML_SUCCESS)
        return leave(ret);
    unsigned int n = 0;
    for (unsigned int i = 0; i < st.nprocs; i++)
        n += st.procs[i].gpu == device->index;
    if (n == 0) {
        *count = 0;
        return leave(NVML_SUCCESS);
    }
    if (!infos || *count < n) {
        *count = n;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    unsigned int k = 0;
    for (unsigned int i = 0; i < st.nprocs; i++) {
        if (st.procs[i].gpu != device->index)
            continue;
        /* v1 is a prefix of v2/v3, which add the MIG instance ids */
        nvmlProcessInfo_v2_t *out = (nvmlProcessInfo_v2_t *)((char *)infos + k++ * stride);
        out->pid = st.procs[i].pid;
        out->usedGpuMemory = st.procs[i].used;
        if (has_instance_ids) {
            out->gpuInstanceId = 0xFFFFFFFFu; /* not MIG */
            out->computeInstanceId = 0xFFFFFFFFu;
        }
    }
    *count = n;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                  nvmlProcessInfo_v1_t *infos)
{
    return get_processes("nvmlDeviceGetComputeRunningProcesses", "processes_v1", device,
                         infoCount, infos, sizeof *infos, 0);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_v2_t *infos)
{
    return get_processes("nvmlDeviceGetComputeRunningProcesses_v2", "processes_v2", device,
                         infoCount, infos, sizeof *infos, 1);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos)
{
    return get_processes("nvmlDeviceGetComputeRunningProcesses_v3", "processes_v3", device,
                         infoCount, infos, sizeof *infos, 1);
}
