/*
 * Fake CUDA client for gpuhook's fake GPU node: what libcuda's cuInit does under MPS, no GPU.
 *
 *   fake-cuda-client [--hold SECONDS]
 *
 * With CUDA_MPS_PIPE_DIRECTORY (default /tmp/nvidia-mps) holding a control daemon's socket, it
 * connects and sends "attach" (tools/fakenode/fake_mps_control.c serves it from an MPS server of
 * the caller's uid, started as that uid), then prints what the process gets, one "key value"
 * line each:
 *
 *   mps yes
 *   server <pid>                   the MPS server it was attached to
 *   server_uid <uid>
 *   active_thread_percentage <p>   its own CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, at most the server's
 *   pinned_mem_limit <dev>=<MiB>M  its own CUDA_MPS_PINNED_DEVICE_MEM_LIMIT per device, at most
 *                                  the server's default (none: not limited)
 *   shm yes|no|none                whether the server's shared memory file is in this process's
 *                                  /dev/shm (none: the server made none, its /dev/shm the host's)
 *
 * As the real client, a process may lower its limits below the daemon's defaults, never raise
 * them above. A daemon that refuses or queues it: "mps error <the daemon's words>", exit 1. No
 * daemon (no pipe directory, or unset): "mps no" (the process would open the GPU directly).
 * --hold keeps the process (an attached client: get_client_list names it) alive that long.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define MAX_DEVICES 64

static long long mib(const char *text) {
    char *end = NULL;
    double v = strtod(text, &end);
    if (end == text || v < 0) return -1;
    switch (*end) {
    case 'T': case 't': return (long long)(v * 1024 * 1024);
    case 'G': case 'g': return (long long)(v * 1024);
    case 'M': case 'm': case 0: return (long long)v;
    case 'K': case 'k': return (long long)(v / 1024);
    default: return -1;
    }
}

/* "0=512M,1=1G" or "2G" (every device) -> per-device MiB, -1 where not given */
static void parse_limits(const char *text, long long out[MAX_DEVICES]) {
    for (int d = 0; d < MAX_DEVICES; d++) out[d] = -1;
    if (!text || !*text) return;
    if (!strchr(text, '=')) {
        long long v = mib(text);
        for (int d = 0; d < MAX_DEVICES; d++) out[d] = v;
        return;
    }
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", text);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        char *eq = strchr(tok, '=');
        if (!eq) continue;
        *eq = 0;
        int dev = atoi(tok);
        if (dev >= 0 && dev < MAX_DEVICES) out[dev] = mib(eq + 1);
    }
}

static int attach(const char *pipe_dir, char *reply, size_t size) {
    int cwd = open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (cwd < 0 || chdir(pipe_dir) != 0) return -1;
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    strcpy(addr.sun_path, "control");
    int rc = s >= 0 ? connect(s, (struct sockaddr *)&addr, sizeof addr) : -1;
    if (fchdir(cwd) != 0) rc = -1;
    close(cwd);
    if (rc != 0) {
        if (s >= 0) close(s);
        return -1;
    }
    dprintf(s, "attach\n");
    shutdown(s, SHUT_WR);
    size_t n = 0;
    ssize_t r;
    while (n + 1 < size && (r = read(s, reply + n, size - 1 - n)) > 0) n += (size_t)r;
    reply[n] = 0;
    close(s);
    while (n > 0 && reply[n - 1] == '\n') reply[--n] = 0;
    return 0;
}

int main(int argc, char **argv) {
    int hold = argc == 3 && !strcmp(argv[1], "--hold") ? atoi(argv[2]) : 0;
    const char *pipe_dir = getenv("CUDA_MPS_PIPE_DIRECTORY");
    char reply[4096];
    if (attach(pipe_dir && *pipe_dir ? pipe_dir : "/tmp/nvidia-mps", reply, sizeof reply) != 0) {
        printf("mps no\n");
        return 0;
    }
    long server = 0;
    unsigned uid = 0;
    int pct = 100, used = 0;
    char shm[256];
    if (sscanf(reply, "server %ld uid %u percentage %d shm %255s pinned%n", &server, &uid, &pct, shm,
               &used) != 4) {
        printf("mps error %s\n", reply);
        return 1;
    }
    long long defaults[MAX_DEVICES], own[MAX_DEVICES];
    for (int d = 0; d < MAX_DEVICES; d++) defaults[d] = -1;
    char *rest = reply + used;
    for (char *tok = strtok(rest, " "); tok; tok = strtok(NULL, " ")) {
        char *eq = strchr(tok, '=');
        if (!eq) continue;
        *eq = 0;
        int dev = atoi(tok);
        if (dev >= 0 && dev < MAX_DEVICES) defaults[dev] = mib(eq + 1);
    }
    const char *env_pct = getenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE");
    if (env_pct && *env_pct && atoi(env_pct) >= 1 && atoi(env_pct) < pct) pct = atoi(env_pct);
    parse_limits(getenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), own);
    printf("mps yes\nserver %ld\nserver_uid %u\nactive_thread_percentage %d\n", server, uid, pct);
    char shm_path[300];
    snprintf(shm_path, sizeof shm_path, "/dev/shm/%s", shm);
    printf("shm %s\n", !strcmp(shm, "-") ? "none" : access(shm_path, F_OK) == 0 ? "yes" : "no");
    for (int d = 0; d < MAX_DEVICES; d++) {
        long long v = defaults[d];
        if (own[d] >= 0 && (v < 0 || own[d] < v)) v = own[d];
        if (v >= 0) printf("pinned_mem_limit %d=%lldM\n", d, v);
        else if (defaults[d] < 0 && own[d] < 0 && d == 0) printf("pinned_mem_limit none\n");
    }
    fflush(stdout);
    if (hold > 0) sleep((unsigned)hold);
    return 0;
}
