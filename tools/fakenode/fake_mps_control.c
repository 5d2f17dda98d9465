/*
 * Fake nvidia-cuda-mps-control for gpuhook's fake GPU node: the real program's interface, no GPU.
 *
 *   nvidia-cuda-mps-control -d   start the control daemon in the background. It creates
 *                                $CUDA_MPS_PIPE_DIRECTORY (default /tmp/nvidia-mps) with a unix
 *                                socket "control" and nvidia-cuda-mps-control.pid, and logs to
 *                                $CUDA_MPS_LOG_DIRECTORY/control.log (default /var/log/nvidia-mps):
 *                                a startup line, its argv and environment ("Env:" lines), and every
 *                                command it receives ("Cmd:" lines), so tests can assert the exact
 *                                command lines and environment the daemon got. The parent returns
 *                                once the daemon is listening; a second daemon on the same pipe
 *                                directory is refused (exit 1), as the real one does.
 *   nvidia-cuda-mps-control      client mode: each line of stdin is one command, sent to the
 *                                daemon of $CUDA_MPS_PIPE_DIRECTORY; its reply goes to stdout.
 *                                No daemon: a message on stderr and exit 1.
 *
 * Commands: get_server_list, start_server -uid <uid> (starts a server, below),
 * get_server_status <pid>, get_client_list <pid> (the live clients attached to that server),
 * set_default_active_thread_percentage <1..100>, get_default_active_thread_percentage,
 * set_default_device_pinned_mem_limit <dev> <limit>, get_default_device_pinned_mem_limit <dev>,
 * quit [-t <s>] (stops servers, removes the socket and pid file, exits). SIGTERM acts like quit.
 * Paths are bound and connected relative to the pipe directory (sun_path holds 108 bytes).
 *
 * Servers and clients, as the real daemon runs them: "attach" is what a CUDA client sends
 * (tools/fakenode/fake_cuda_client.c, standing in for libcuda's cuInit under MPS). The daemon
 * reads the client's uid and pid (SO_PEERCRED) and serves it from the one server it runs at a
 * time: a server of the client's uid (started if none runs: a forked process that drops to that
 * uid, with setgid/setuid as the real daemon does, and must then reach the pipe directory and
 * connect to its control socket as that uid, else it exits and the client gets an error); a
 * server of another uid with live clients queues the client (the real client waits; the fake
 * one is told "queued" and exits); an idle one is stopped first. A server takes the daemon's
 * defaults when it starts (later set_default_* only affect the next server, as documented).
 * The reply: "server <pid> uid <uid> percentage <p> shm <name> pinned <dev>=<limit>|none,...".
 *
 * Shared memory, as the real server shares it with its clients: a server whose /dev/shm is not
 * the host's (the daemon runs in a mount namespace of its own, gpuhook's mps.shm) creates
 * /dev/shm/cuda.mps.<server pid> as its uid, and the reply names it ("-": none made, so that
 * no test writes the host's /dev/shm); the client looks for it in its own /dev/shm.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <grp.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SOCKET_NAME "control"
#define PID_NAME "nvidia-cuda-mps-control.pid"
#define MAX_LINE 4096
#define MAX_DEVICES 64
#define MAX_SERVERS 16

extern char **environ;

static char pipe_dir[4096];
static char log_dir[4096];
static volatile sig_atomic_t stopping;
#define MAX_CLIENTS 64

static int percentage = 100;
static char pinned[MAX_DEVICES][64];
static int listener = -1;

/* one MPS server: its uid, the defaults it started with, its attached clients */
struct server {
    pid_t pid;
    uid_t uid;
    int percentage;
    char pinned[MAX_DEVICES][64];
    pid_t clients[MAX_CLIENTS];
};
static struct server servers[MAX_SERVERS];

static void dirs(void) {
    const char *p = getenv("CUDA_MPS_PIPE_DIRECTORY");
    const char *l = getenv("CUDA_MPS_LOG_DIRECTORY");
    snprintf(pipe_dir, sizeof pipe_dir, "%s", p && *p ? p : "/tmp/nvidia-mps");
    snprintf(log_dir, sizeof log_dir, "%s", l && *l ? l : "/var/log/nvidia-mps");
}

static void mkdirs(const char *path) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p == '/') {
            *p = 0;
            mkdir(buf, 0755);
            *p = '/';
        }
    }
    mkdir(buf, 0755);
}

/* "[2024-03-05 22:23:56.123 Control 4242] message", appended to control.log */
static void logf_(const char *fmt, ...) {
    char path[4200], stamp[64], msg[MAX_LINE + 256];
    struct timeval tv;
    struct tm tm;
    gettimeofday(&tv, NULL);
    localtime_r(&tv.tv_sec, &tm);
    strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", &tm);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(path, sizeof path, "%s/control.log", log_dir);
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return;
    dprintf(fd, "[%s.%03ld Control %ld] %s\n", stamp, (long)(tv.tv_usec / 1000), (long)getpid(), msg);
    close(fd);
}

/* Bind or connect a unix socket named SOCKET_NAME inside pipe_dir. */
static int control_socket(int do_bind) {
    int cwd = open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (cwd < 0 || chdir(pipe_dir) != 0) {
        if (cwd >= 0) close(cwd);
        return -1;
    }
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    strcpy(addr.sun_path, SOCKET_NAME);
    int rc = -1;
    if (s >= 0) {
        if (do_bind) {
            unlink(SOCKET_NAME);
            rc = bind(s, (struct sockaddr *)&addr, sizeof addr);
            if (rc == 0) {
                chmod(SOCKET_NAME, 0666);
                rc = listen(s, 16);
            }
        } else {
            rc = connect(s, (struct sockaddr *)&addr, sizeof addr);
        }
    }
    if (fchdir(cwd) != 0) rc = -1;
    close(cwd);
    if (rc != 0) {
        if (s >= 0) close(s);
        return -1;
    }
    return s;
}

static int pid_alive(pid_t pid) { return pid > 1 && (kill(pid, 0) == 0 || errno == EPERM); }

static void reap(void) {
    pid_t pid;
    while ((pid = waitpid(-1, NULL, WNOHANG)) > 0) {
        for (int i = 0; i < MAX_SERVERS; i++)
            if (servers[i].pid == pid) memset(&servers[i], 0, sizeof servers[i]);
    }
    for (int i = 0; i < MAX_SERVERS; i++)
        for (int c = 0; c < MAX_CLIENTS; c++)
            if (servers[i].clients[c] > 0 && !pid_alive(servers[i].clients[c])) servers[i].clients[c] = 0;
}

static int live_clients(const struct server *s) {
    int n = 0;
    for (int c = 0; c < MAX_CLIENTS; c++)
        if (s->clients[c] > 0) n++;
    return n;
}

/* Whether /dev/shm is a folder mounted there for this process (the same filesystem is also
 * mounted elsewhere: gpuhook's <mps.root>/<group>/shm), not the host's own /dev/shm. */
static int private_shm(void) {
    FILE *f = fopen("/proc/self/mountinfo", "r");
    if (!f) return 0;
    char line[8192], dev[64] = "", devs[256][64], points[256][512];
    int n = 0;
    while (fgets(line, sizeof line, f) && n < 256) {
        char d[64], point[512];
        if (sscanf(line, "%*s %*s %63s %*s %511s", d, point) != 2) continue;
        if (!strcmp(point, "/dev/shm")) snprintf(dev, sizeof dev, "%s", d);
        snprintf(devs[n], sizeof devs[n], "%s", d);
        snprintf(points[n], sizeof points[n], "%s", point);
        n++;
    }
    fclose(f);
    for (int i = 0; *dev && i < n; i++)
        if (!strcmp(devs[i], dev) && strcmp(points[i], "/dev/shm")) return 1;
    return 0;
}

/* the server's shared memory file, "" when it makes none (its /dev/shm is the host's) */
static void shm_name(pid_t pid, char *out, size_t size) {
    if (private_shm())
        snprintf(out, size, "cuda.mps.%ld", (long)pid);
    else
        *out = 0;
}

static void stop_server(struct server *s) {
    kill(s->pid, SIGTERM);
    waitpid(s->pid, NULL, 0);
    char name[64], path[128];
    shm_name(s->pid, name, sizeof name);
    snprintf(path, sizeof path, "/dev/shm/%s", name);
    if (*name) unlink(path);
    logf_("Server %ld (uid %u) exited", (long)s->pid, (unsigned)s->uid);
    memset(s, 0, sizeof *s);
}

static void on_term(int sig) {
    (void)sig;
    stopping = 1;
}

static void shutdown_daemon(void) {
    for (int i = 0; i < MAX_SERVERS; i++)
        if (servers[i].pid > 0) stop_server(&servers[i]);
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", pipe_dir, SOCKET_NAME);
    unlink(path);
    snprintf(path, sizeof path, "%s/%s", pipe_dir, PID_NAME);
    unlink(path);
    logf_("Shutdown");
}

static void reply(int fd, const char *fmt, ...) {
    char buf[MAX_LINE];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n > 0) {
        ssize_t off = 0;
        while (off < n) {
            ssize_t w = write(fd, buf + off, (size_t)(n - off));
            if (w <= 0) break;
            off += w;
        }
    }
}

/* Start a server as uid/gid (the real daemon forks, drops to the client's ids and execs
 * nvidia-cuda-mps-server): the child must reach the pipe directory and connect to the control
 * socket as that uid, and tells the daemon through a pipe. NULL (and why) when it could not. */
static struct server *spawn_server(int client, uid_t uid, gid_t gid, char *why, size_t size) {
    int slot = -1;
    for (int i = 0; i < MAX_SERVERS; i++)
        if (servers[i].pid <= 0) { slot = i; break; }
    if (slot < 0) {
        snprintf(why, size, "too many servers");
        return NULL;
    }
    int status[2];
    if (pipe2(status, O_CLOEXEC) != 0) {
        snprintf(why, size, "pipe: %s", strerror(errno));
        return NULL;
    }
    pid_t pid = fork();
    if (pid == 0) {
        close(listener);
        close(client); /* the caller's connection: its reply ends when the daemon closes it */
        close(status[0]);
        signal(SIGTERM, SIG_DFL);
        prctl(PR_SET_NAME, "nvidia-cuda-mps-server");
        int err = 0;
        if (setgroups(0, NULL) != 0 || setgid(gid) != 0 || setuid(uid) != 0) err = errno;
        int s = err ? -1 : control_socket(0); /* chdir into the pipe directory, then connect */
        if (!err && s < 0) err = errno ? errno : EACCES;
        if (s >= 0) close(s);
        char name[64], path[128];
        shm_name(getpid(), name, sizeof name);
        snprintf(path, sizeof path, "/dev/shm/%s", name);
        int shm = !err && *name ? open(path, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600) : -1;
        if (shm >= 0) close(shm);
        if (write(status[1], &err, sizeof err) != (ssize_t)sizeof err || err) _exit(1);
        close(status[1]);
        for (;;) pause();
    }
    close(status[1]);
    int err = EIO;
    if (pid < 0 || read(status[0], &err, sizeof err) != (ssize_t)sizeof err) err = pid < 0 ? errno : EIO;
    close(status[0]);
    if (err) {
        if (pid > 0) waitpid(pid, NULL, 0);
        snprintf(why, size, "cannot reach %s/%s as uid %u: %s", pipe_dir, SOCKET_NAME, (unsigned)uid,
                 strerror(err));
        logf_("Server for uid %u failed: %s", (unsigned)uid, why);
        return NULL;
    }
    struct server *srv = &servers[slot];
    memset(srv, 0, sizeof *srv);
    srv->pid = pid;
    srv->uid = uid;
    srv->percentage = percentage;
    memcpy(srv->pinned, pinned, sizeof pinned);
    logf_("Server %ld for uid %u started", (long)pid, (unsigned)uid);
    return srv;
}

static struct server *active_server(void) {
    for (int i = 0; i < MAX_SERVERS; i++)
        if (servers[i].pid > 0) return &servers[i];
    return NULL;
}

/* A CUDA client attaches: serve it from a server of its uid (see the top of this file). */
static void attach(int fd) {
    struct ucred cred;
    socklen_t len = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
        reply(fd, "error cannot read the client's credentials\n");
        return;
    }
    logf_("NEW CLIENT %ld from user %u", (long)cred.pid, (unsigned)cred.uid);
    reap();
    struct server *srv = active_server();
    if (srv && srv->uid != cred.uid) {
        int n = live_clients(srv);
        if (n > 0) {
            reply(fd, "queued behind server %ld of uid %u (%d client(s))\n", (long)srv->pid,
                  (unsigned)srv->uid, n);
            return;
        }
        stop_server(srv);
        srv = NULL;
    }
    if (!srv) {
        char why[8192];
        srv = spawn_server(fd, cred.uid, cred.gid, why, sizeof why);
        if (!srv) {
            reply(fd, "error the MPS server failed to start: %s\n", why);
            return;
        }
    }
    for (int c = 0; c < MAX_CLIENTS; c++)
        if (srv->clients[c] <= 0) { srv->clients[c] = cred.pid; break; }
    char name[64], path[128];
    shm_name(srv->pid, name, sizeof name);
    snprintf(path, sizeof path, "/dev/shm/%s", name);
    if (!*name || access(path, F_OK) != 0) snprintf(name, sizeof name, "-");
    reply(fd, "server %ld uid %u percentage %d shm %s pinned", (long)srv->pid, (unsigned)srv->uid,
          srv->percentage, name);
    for (int d = 0; d < MAX_DEVICES; d++)
        if (srv->pinned[d][0]) reply(fd, " %d=%s", d, srv->pinned[d]);
    reply(fd, "\n");
}

/* Handle one command; returns 1 when the daemon must quit. */
static int handle(int fd, char *line) {
    if (!*line) return 0; /* a server checking that it reaches the socket */
    logf_("Cmd:%s", line);
    char *argv[8] = {0};
    int argc = 0;
    for (char *tok = strtok(line, " \t"); tok && argc < 8; tok = strtok(NULL, " \t")) argv[argc++] = tok;
    if (argc == 0) return 0;
    const char *cmd = argv[0];
    if (!strcmp(cmd, "quit")) return 1;
    if (!strcmp(cmd, "attach")) {
        attach(fd);
    } else if (!strcmp(cmd, "get_server_list")) {
        reap();
        for (int i = 0; i < MAX_SERVERS; i++)
            if (servers[i].pid > 0) reply(fd, "%ld\n", (long)servers[i].pid);
    } else if (!strcmp(cmd, "start_server")) {
        if (argc != 3 || strcmp(argv[1], "-uid")) {
            reply(fd, "Usage: start_server -uid <user id>\n");
            return 0;
        }
        char why[8192];
        uid_t uid = (uid_t)strtoul(argv[2], NULL, 10);
        if (!spawn_server(fd, uid, (gid_t)uid, why, sizeof why)) reply(fd, "%s\n", why);
    } else if (!strcmp(cmd, "get_server_status")) {
        reap();
        long want = argc > 1 ? atol(argv[1]) : 0;
        int found = 0;
        for (int i = 0; i < MAX_SERVERS; i++)
            if (servers[i].pid > 0 && servers[i].pid == want) found = 1;
        reply(fd, found ? "ACTIVE\n" : "Server %ld not found\n", want);
    } else if (!strcmp(cmd, "get_client_list")) {
        reap();
        long want = argc > 1 ? atol(argv[1]) : 0;
        for (int i = 0; i < MAX_SERVERS; i++)
            if (servers[i].pid > 0 && servers[i].pid == want)
                for (int c = 0; c < MAX_CLIENTS; c++)
                    if (servers[i].clients[c] > 0) reply(fd, "%ld\n", (long)servers[i].clients[c]);
    } else if (!strcmp(cmd, "set_default_active_thread_percentage")) {
        char *end = NULL;
        long v = argc == 2 ? strtol(argv[1], &end, 10) : -1;
        if (argc != 2 || !end || *end || v < 1 || v > 100) {
            reply(fd, "Invalid active thread percentage\n");
            return 0;
        }
        percentage = (int)v;
        reply(fd, "%d.0\n", percentage);
    } else if (!strcmp(cmd, "get_default_active_thread_percentage")) {
        reply(fd, "%d.0\n", percentage);
    } else if (!strcmp(cmd, "set_default_device_pinned_mem_limit")) {
        long dev = argc == 3 ? atol(argv[1]) : -1;
        if (argc != 3 || dev < 0 || dev >= MAX_DEVICES) {
            reply(fd, "Usage: set_default_device_pinned_mem_limit <dev> <value>\n");
            return 0;
        }
        snprintf(pinned[dev], sizeof pinned[dev], "%s", argv[2]);
    } else if (!strcmp(cmd, "get_default_device_pinned_mem_limit")) {
        long dev = argc == 2 ? atol(argv[1]) : -1;
        if (dev < 0 || dev >= MAX_DEVICES) {
            reply(fd, "Usage: get_default_device_pinned_mem_limit <dev>\n");
            return 0;
        }
        reply(fd, "%s\n", pinned[dev][0] ? pinned[dev] : "none");
    } else {
        reply(fd, "Unrecognized command: %s\n", cmd);
    }
    return 0;
}

static int read_line(int fd, char *buf, size_t size) {
    size_t n = 0;
    while (n + 1 < size) {
        ssize_t r = read(fd, buf + n, 1);
        if (r <= 0 || buf[n] == '\n') break;
        n++;
    }
    buf[n] = 0;
    while (n > 0 && (buf[n - 1] == '\r' || buf[n - 1] == ' ')) buf[--n] = 0;
    return (int)n;
}

static int daemon_main(int argc, char **argv) {
    char path[4200];
    mkdirs(pipe_dir);
    mkdirs(log_dir);
    snprintf(path, sizeof path, "%s/%s", pipe_dir, PID_NAME);
    FILE *f = fopen(path, "re");
    if (f) {
        long old = 0;
        if (fscanf(f, "%ld", &old) == 1 && pid_alive((pid_t)old)) {
            fclose(f);
            fprintf(stderr, "An instance of this daemon is already running\n");
            return 1;
        }
        fclose(f);
    }
    int ready[2];
    if (pipe2(ready, O_CLOEXEC) != 0) return 1;
    pid_t child = fork();
    if (child < 0) return 1;
    if (child > 0) { /* the caller: return once the daemon listens */
        close(ready[1]);
        char ok = 0;
        ssize_t r = read(ready[0], &ok, 1);
        waitpid(child, NULL, 0);
        if (r != 1 || ok != '1') {
            fprintf(stderr, "Failed to start the MPS control daemon (see %s/control.log)\n", log_dir);
            return 1;
        }
        return 0;
    }
    close(ready[0]);
    setsid();
    pid_t daemon_pid = fork(); /* the daemon is not a session leader, as a classic daemon */
    if (daemon_pid < 0) _exit(1);
    if (daemon_pid > 0) _exit(0);
    umask(022);
    int devnull = open("/dev/null", O_RDWR);
    if (devnull >= 0) {
        dup2(devnull, 0);
        dup2(devnull, 1);
        dup2(devnull, 2);
        if (devnull > 2) close(devnull);
    }
    if (chdir("/") != 0) _exit(1);
    listener = control_socket(1);
    if (listener < 0) {
        logf_("Cannot listen on %s/%s: %s", pipe_dir, SOCKET_NAME, strerror(errno));
        _exit(1);
    }
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s.%ld", path, (long)getpid());
    f = fopen(tmp, "we");
    if (!f || fprintf(f, "%ld\n", (long)getpid()) < 0 || fclose(f) != 0 || rename(tmp, path) != 0) {
        logf_("Cannot write %s", path);
        _exit(1);
    }
    logf_("Starting control daemon using socket %s/%s", pipe_dir, SOCKET_NAME);
    for (int i = 0; i < argc; i++) logf_("Argv:%s", argv[i]);
    for (char **e = environ; *e; e++) logf_("Env:%s", *e);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_term; /* no SA_RESTART: accept() returns EINTR */
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    char one = '1';
    if (write(ready[1], &one, 1) != 1) _exit(1);
    close(ready[1]);

    for (;;) {
        if (stopping) break;
        int c = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
        reap();
        if (c < 0) {
            if (errno == EINTR) continue;
            break;
        }
        char line[MAX_LINE];
        read_line(c, line, sizeof line);
        int quit = handle(c, line);
        close(c);
        if (quit) break;
    }
    close(listener);
    shutdown_daemon();
    _exit(0);
}

static int client_main(void) {
    char line[MAX_LINE];
    int n;
    while (fgets(line, sizeof line, stdin)) {
        n = (int)strlen(line);
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r' || line[n - 1] == ' ')) line[--n] = 0;
        if (n == 0) continue;
        int s = control_socket(0);
        if (s < 0) {
            fprintf(stderr, "Cannot find MPS control daemon process\n");
            return 1;
        }
        dprintf(s, "%s\n", line);
        shutdown(s, SHUT_WR);
        char buf[4096];
        ssize_t r;
        while ((r = read(s, buf, sizeof buf)) > 0) fwrite(buf, 1, (size_t)r, stdout);
        close(s);
        fflush(stdout);
    }
    return 0;
}

int main(int argc, char **argv) {
    dirs();
    if (argc >= 2 && !strcmp(argv[1], "-d")) return daemon_main(argc, argv);
    if (argc >= 2) {
        fprintf(stderr, "Usage: nvidia-cuda-mps-control [-d]\n");
        return argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) ? 0 : 1;
    }
    return client_main();
}
