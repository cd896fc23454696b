/*
 * The tiny init that runs inside the sandbox as pid 1 of its pid namespace: a port
 * of sandbox_init.py's main() for runs without a network bridge.
 *
 *     sandbox_init CONFIG -- ARGV...
 *
 * CONFIG is `key=value,...`: status=FD (where the status record goes), go=FD (wait
 * for the byte 'g' before anything is spawned; EOF: exit 2), and the rlimits core,
 * cpu, fsize, nofile, as as `soft:hard` (or `soft`, hard = soft). A failing rlimit
 * fails closed: {"setup_error":"..."} on the status fd and exit 1. Every fd above 2
 * is made close-on-exec, the workload is spawned as pid 2 with posix_spawnp (SIGPIPE
 * and SIGXFSZ back to default), orphans are reaped, and the workload's decoded
 * waitid() status and rusage are written as one JSON object on the status fd.
 * Why it exists, and why it is not Python: docs/sandbox.md ("The init").
 *
 * Built by init_install.py with `cc -O2 -static -Wall -Werror`; no allocation.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static char record[1024];
static size_t record_len = 1; /* record[0] is the opening brace */
static int record_items;

static void put_raw(const char *s) {
    while (*s && record_len < sizeof(record) - 2) {
        record[record_len++] = *s++;
    }
}

static void put_key(const char *key) {
    put_raw(record_items++ ? ",\"" : "\"");
    put_raw(key);
    put_raw("\":");
}

static void put_int(const char *key, long long value) {
    char buf[32];
    snprintf(buf, sizeof(buf), "%lld", value);
    put_key(key);
    put_raw(buf);
}

/* Strings keep only the characters the Python init keeps: no escaping needed. */
static void put_str(const char *key, const char *value) {
    char clean[256];
    size_t n = 0;
    for (; *value && n < sizeof(clean) - 1; value++) {
        unsigned char ch = (unsigned char)*value;
        if (isalnum(ch) || strchr(" .,:-_", ch) != NULL) {
            clean[n++] = (char)ch;
        }
    }
    clean[n] = '\0';
    put_key(key);
    put_raw("\"");
    put_raw(clean);
    put_raw("\"");
}

static void write_record(int fd) {
    size_t done = 0;
    record[0] = '{';
    record[record_len++] = '}';
    while (done < record_len) {
        ssize_t n = write(fd, record + done, record_len - done);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            return;
        }
        done += (size_t)n;
    }
}

/* A whole non-negative decimal number; 0 on success. */
static int parse_number(const char *text, size_t len, unsigned long long *out) {
    unsigned long long value = 0;
    if (len == 0 || len > 19) {
        return -1;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] < '0' || text[i] > '9') {
            return -1;
        }
        value = value * 10 + (unsigned long long)(text[i] - '0');
    }
    *out = value;
    return 0;
}

static int parse_fd(const char *text, int *out) {
    unsigned long long value;
    if (text == NULL || parse_number(text, strlen(text), &value) != 0 ||
        value > 0x7fffffff) {
        return -1;
    }
    *out = (int)value;
    return 0;
}

struct limit {
    const char *key;
    int resource;
    const char *value;
};

static struct limit limits[] = {
    {"core", RLIMIT_CORE, NULL},   {"cpu", RLIMIT_CPU, NULL},
    {"fsize", RLIMIT_FSIZE, NULL}, {"nofile", RLIMIT_NOFILE, NULL},
    {"as", RLIMIT_AS, NULL},
};
#define N_LIMITS (sizeof(limits) / sizeof(limits[0]))

/* 0, or -1 with `error` set (the status record's setup_error). */
static int apply_rlimits(char *error, size_t error_size) {
    for (size_t i = 0; i < N_LIMITS; i++) {
        const char *value = limits[i].value;
        if (value == NULL || *value == '\0') {
            continue;
        }
        const char *colon = strchr(value, ':');
        size_t soft_len = colon ? (size_t)(colon - value) : strlen(value);
        const char *hard_text = colon && colon[1] ? colon + 1 : value;
        size_t hard_len = colon && colon[1] ? strlen(colon + 1) : soft_len;
        unsigned long long soft, hard;
        if (parse_number(value, soft_len, &soft) != 0 ||
            parse_number(hard_text, hard_len, &hard) != 0) {
            snprintf(error, error_size, "invalid rlimit %s: %s", limits[i].key, value);
            return -1;
        }
        struct rlimit rl = {.rlim_cur = (rlim_t)soft, .rlim_max = (rlim_t)hard};
        if (setrlimit(limits[i].resource, &rl) != 0) {
            snprintf(error, error_size, "Errno %d %s: setrlimit %s", errno,
                     strerror(errno), limits[i].key);
            return -1;
        }
    }
    return 0;
}

/* Make every fd above 2 close-on-exec so the workload sees only 0, 1, 2 (FS-11). */
static void close_inherited_fds(void) {
    DIR *dir = opendir("/proc/self/fd");
    if (dir == NULL) {
        for (int fd = 3; fd < 1024; fd++) {
            int flags = fcntl(fd, F_GETFD);
            if (flags >= 0) {
                fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
            }
        }
        return;
    }
    int own = dirfd(dir);
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL) {
        int fd;
        if (parse_fd(entry->d_name, &fd) != 0 || fd <= 2 || fd == own) {
            continue;
        }
        int flags = fcntl(fd, F_GETFD);
        if (flags >= 0) {
            fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
        }
    }
    closedir(dir);
}

int main(int argc, char **argv) {
    const char *status_text = NULL;
    const char *go_text = NULL;
    const char *bridge = NULL;
    if (argc < 2) {
        fputs("usage: sandbox_init CONFIG -- ARGV...\n", stderr);
        return 1;
    }
    /* Split a copy of CONFIG (the original stays readable in /proc/1/cmdline):
     * key=value items separated by commas; the last of a key wins. */
    static char config[4096];
    if (strlen(argv[1]) >= sizeof(config)) {
        fputs("sandbox_init: CONFIG too long\n", stderr);
        return 1;
    }
    strcpy(config, argv[1]);
    for (char *item = config; item != NULL && *item != '\0';) {
        char *next = strchr(item, ',');
        if (next != NULL) {
            *next++ = '\0';
        }
        if (*item != '\0') {
            char *eq = strchr(item, '=');
            const char *value = "";
            if (eq != NULL) {
                *eq = '\0';
                value = eq + 1;
            }
            if (strcmp(item, "status") == 0) {
                status_text = value;
            } else if (strcmp(item, "go") == 0) {
                go_text = value;
            } else if (strcmp(item, "bridge") == 0) {
                bridge = value;
            } else {
                for (size_t i = 0; i < N_LIMITS; i++) {
                    if (strcmp(item, limits[i].key) == 0) {
                        limits[i].value = value;
                    }
                }
            }
        }
        item = next;
    }
    int status_fd;
    if (parse_fd(status_text, &status_fd) != 0) {
        fputs("sandbox_init: CONFIG needs status=FD\n", stderr);
        return 1;
    }
    if (go_text != NULL && *go_text != '\0') {
        /* The runner moves this process into the run's cgroups, then releases it;
         * nothing is spawned before that (EOF: the runner gave up). */
        int go_fd;
        char byte = 0;
        ssize_t n;
        if (parse_fd(go_text, &go_fd) != 0) {
            return 1;
        }
        do {
            n = read(go_fd, &byte, 1);
        } while (n < 0 && errno == EINTR);
        if (n != 1 || byte != 'g') {
            return 2;
        }
        close(go_fd);
    }
    char error[200];
    int failed = apply_rlimits(error, sizeof(error));
    if (failed == 0 && bridge != NULL && *bridge != '\0') {
        /* The network bridge lives in the Python init only; never run without it. */
        snprintf(error, sizeof(error), "this init has no network bridge");
        failed = -1;
    }
    if (failed != 0) {
        /* Fail closed: a workload never runs with a limit silently missing. */
        put_str("setup_error", error);
        write_record(status_fd);
        return 1;
    }
    if (argc < 4 || strcmp(argv[2], "--") != 0) {
        fputs("usage: sandbox_init CONFIG -- ARGV...\n", stderr);
        return 1;
    }
    close_inherited_fds();

    posix_spawnattr_t attr;
    sigset_t defaults;
    pid_t child = 0;
    sigemptyset(&defaults);
    sigaddset(&defaults, SIGPIPE);
    sigaddset(&defaults, SIGXFSZ);
    posix_spawnattr_init(&attr);
    posix_spawnattr_setsigdefault(&attr, &defaults);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF);
    int rc = posix_spawnp(&child, argv[3], NULL, &attr, argv + 3, environ);
    posix_spawnattr_destroy(&attr);
    if (rc != 0) {
        put_int("spawn_errno", rc);
        put_str("spawn_error", strerror(rc));
        child = 0;
    }
    put_int("pid", child);
    while (child > 0) {
        siginfo_t info;
        memset(&info, 0, sizeof(info));
        if (waitid(P_ALL, 0, &info, WEXITED | WNOWAIT) != 0) {
            if (errno == EINTR) {
                continue;
            }
            break; /* ECHILD: nothing left to wait for */
        }
        if (info.si_pid == 0) {
            continue;
        }
        if (info.si_pid != child) {
            /* An orphan re-parented to us: reap it. */
            while (waitpid(info.si_pid, NULL, 0) < 0 && errno == EINTR) {
            }
            continue;
        }
        put_int("si_code", info.si_code);
        put_int("si_status", info.si_status);
        struct rusage usage;
        int status;
        memset(&usage, 0, sizeof(usage));
        while (wait4(child, &status, 0, &usage) < 0 && errno == EINTR) {
        }
        put_int("utime_ms", (long long)usage.ru_utime.tv_sec * 1000 +
                                usage.ru_utime.tv_usec / 1000);
        put_int("stime_ms", (long long)usage.ru_stime.tv_sec * 1000 +
                                usage.ru_stime.tv_usec / 1000);
        put_int("maxrss_kb", usage.ru_maxrss);
        break;
    }
    write_record(status_fd);
    return 0;
}
