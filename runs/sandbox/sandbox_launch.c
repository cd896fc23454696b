/*
 * The launcher: starts the sandbox's command already inside the run's cgroups,
 * without the runner ever writing a pid into a cgroup.procs.
 *
 *     sandbox_launch --status FD --parent PID [--report FD] [--cgroup2 DIR]
 *                    [--tasks FILE]... [--uid UID --gid GID] -- ARGV...
 *
 * Why: moving a whole process (a pid written to cgroup.procs) takes the kernel's
 * global cgroup_threadgroup_rwsem for writing, and the first such write after an
 * idle spell waits for an RCU grace period (~7 ms measured on this host, against
 * ~0.07 ms back-to-back). Two ways into a cgroup skip that lock, and this program
 * uses both:
 *
 * - clone3(CLONE_INTO_CGROUP) creates the child directly in the cgroup2 directory
 *   DIR (the fork path takes the rwsem only for reading);
 * - a single-threaded child writes "0" to each cgroup v1 `tasks` FILE: it moves
 *   only the calling thread, which the kernel does without the global lock. The
 *   child has one thread, so that thread is the whole process.
 *
 * With --uid/--gid (the runner is root) the child then drops to that uid/gid the
 * way `setpriv --reuid --regid --clear-groups --no-new-privs --inh-caps=-all` does
 * (no supplementary groups, real/effective/saved ids all set, no inheritable or
 * ambient capabilities, no_new_privs) and checks the result: setpriv is a
 * dynamically linked program that loads the locale, ~2.3 ms of exec here, where
 * these syscalls cost microseconds.
 *
 * Only then does the child exec ARGV (bubblewrap and the init), so the sandbox
 * and everything it forks are born inside every hierarchy. Any failure is
 * fail-closed: nothing is executed, {"launch_error":"..."} is written on FD and the
 * launcher exits 125.
 *
 * With --report FD the child is made a child of the runner itself (CLONE_PARENT):
 * the launcher writes the child's pid on FD and exits 0 at once, so that when the
 * sandbox ends, the runner is woken by bubblewrap's exit directly instead of by a
 * launcher waking up and exiting in turn. Without it the launcher stays as ARGV's
 * parent, waits for it and exits with its status (128 + signal if it was killed).
 * Either way the launcher dies with its parent PID (the runner), and the child
 * dies with its parent until bubblewrap's --die-with-parent takes over.
 *
 * Built by init_install.py like sandbox_init.c (`cc -O2 -static -Wall -Werror`).
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef CLONE_INTO_CGROUP
#define CLONE_INTO_CGROUP 0x200000000ULL
#endif

#define MAX_TASKS 16

static int status_fd = -1;

/* {"launch_error":"WHAT: strerror"} on the status fd, then exit 125. */
static void fail(const char *what, int err) {
    char record[512];
    char clean[400];
    size_t n = 0;
    char text[400];
    snprintf(text, sizeof(text), "%s: %s", what, strerror(err));
    for (const char *s = text; *s && n < sizeof(clean) - 1; s++) {
        unsigned char ch = (unsigned char)*s;
        /* Same character set as the init's records: no JSON escaping needed. */
        if (isalnum(ch) || strchr(" .,:-_/", ch) != NULL) {
            clean[n++] = (char)ch;
        }
    }
    clean[n] = '\0';
    int len = snprintf(record, sizeof(record), "{\"launch_error\":\"%s\"}", clean);
    if (status_fd >= 0 && len > 0) {
        ssize_t ignored = write(status_fd, record, (size_t)len);
        (void)ignored;
    }
    _exit(125);
}

static int parse_int(const char *text, long *out) {
    char *end;
    errno = 0;
    long value = strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || value < 0) {
        return -1;
    }
    *out = value;
    return 0;
}

/* Move the calling thread (the whole process: it has only this one) into the v1
 * cgroup whose `tasks` file is `path`; "0" means the caller, which needs no
 * global lock. */
static void join_tasks(const char *path) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
        fail(path, errno);
    }
    if (write(fd, "0", 1) != 1) {
        fail(path, errno);
    }
    close(fd);
}

/* The uid drop of `setpriv --reuid=U --regid=G --clear-groups --no-new-privs
 * --inh-caps=-all`, checked afterwards; any failure is fatal. */
static void drop_to(uid_t uid, gid_t gid) {
    struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct caps[_LINUX_CAPABILITY_U32S_3];
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0) {
        fail("clear ambient capabilities", errno);
    }
    if (syscall(SYS_capget, &header, caps) != 0) {
        fail("capget", errno);
    }
    for (int k = 0; k < _LINUX_CAPABILITY_U32S_3; k++) {
        caps[k].inheritable = 0;
    }
    if (syscall(SYS_capset, &header, caps) != 0) {
        fail("clear inheritable capabilities", errno);
    }
    if (setgroups(0, NULL) != 0) {
        fail("setgroups", errno);
    }
    if (setresgid(gid, gid, gid) != 0) {
        fail("setresgid", errno);
    }
    if (setresuid(uid, uid, uid) != 0) {
        fail("setresuid", errno);
    }
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
        fail("no_new_privs", errno);
    }
    /* Check, rather than trust, what the kernel did: with a securebit such as
     * SECBIT_NO_SETUID_FIXUP inherited, setresuid would keep the capabilities. */
    uid_t ru, eu, su;
    gid_t rg, eg, sg;
    if (getresuid(&ru, &eu, &su) != 0 || getresgid(&rg, &eg, &sg) != 0 ||
        ru != uid || eu != uid || su != uid || rg != gid || eg != gid || sg != gid ||
        getgroups(0, NULL) != 0) {
        fail("uid drop not in effect", EPERM);
    }
    if (syscall(SYS_capget, &header, caps) != 0) {
        fail("capget", errno);
    }
    for (int k = 0; k < _LINUX_CAPABILITY_U32S_3; k++) {
        if (caps[k].effective || caps[k].permitted || caps[k].inheritable) {
            fail("capabilities left after the uid drop", EPERM);
        }
    }
    if (prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 1) {
        fail("no_new_privs not in effect", EPERM);
    }
}

/* A fork-like child (own copy of everything, same stack); with `sibling`, a child
 * of our parent rather than of us (CLONE_PARENT: it inherits our exit signal). */
static pid_t fork_child(int sibling) {
    if (!sibling) {
        return fork();
    }
    return (pid_t)syscall(SYS_clone, CLONE_PARENT, NULL, NULL, NULL, 0);
}

/* clone3 into `cgroup_fd`; falls back to a fork + a cgroup.procs write of the
 * child's own pid (before exec, so still fail-closed, only slower) where clone3 or
 * CLONE_INTO_CGROUP is missing. Returns the child's pid in the parent, 0 in the
 * child. */
static pid_t spawn_into(int cgroup_fd, const char *cgroup_dir, int sibling) {
    if (cgroup_fd < 0) {
        return fork_child(sibling);
    }
    struct clone_args args;
    memset(&args, 0, sizeof(args));
    args.flags = CLONE_INTO_CGROUP | (sibling ? CLONE_PARENT : 0);
    args.exit_signal = sibling ? 0 : SIGCHLD; /* CLONE_PARENT: must be 0 */
    args.cgroup = (unsigned long long)cgroup_fd;
    long pid = syscall(SYS_clone3, &args, sizeof(args));
    if (pid >= 0) {
        return (pid_t)pid;
    }
    if (errno != ENOSYS && errno != EINVAL && errno != E2BIG) {
        fail("clone3 into cgroup2", errno);
    }
    pid = fork_child(sibling);
    if (pid == 0) {
        char path[4096];
        char own[32];
        snprintf(path, sizeof(path), "%s/cgroup.procs", cgroup_dir);
        snprintf(own, sizeof(own), "%d", (int)getpid());
        int fd = open(path, O_WRONLY | O_CLOEXEC);
        if (fd < 0 || write(fd, own, strlen(own)) != (ssize_t)strlen(own)) {
            fail(path, errno);
        }
        close(fd);
    }
    return (pid_t)pid;
}

int main(int argc, char **argv) {
    const char *tasks[MAX_TASKS];
    int n_tasks = 0;
    const char *cgroup2 = NULL;
    long parent = -1;
    long report = -1;
    long uid = -1;
    long gid = -1;
    long value;
    int i = 1;
    for (; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) {
            i++;
            break;
        }
        if (i + 1 >= argc) {
            break;
        }
        if (strcmp(argv[i], "--status") == 0 && parse_int(argv[i + 1], &value) == 0) {
            status_fd = (int)value;
        } else if (strcmp(argv[i], "--parent") == 0 &&
                   parse_int(argv[i + 1], &value) == 0) {
            parent = value;
        } else if (strcmp(argv[i], "--report") == 0 &&
                   parse_int(argv[i + 1], &value) == 0) {
            report = value;
        } else if (strcmp(argv[i], "--uid") == 0 &&
                   parse_int(argv[i + 1], &value) == 0) {
            uid = value;
        } else if (strcmp(argv[i], "--gid") == 0 &&
                   parse_int(argv[i + 1], &value) == 0) {
            gid = value;
        } else if (strcmp(argv[i], "--cgroup2") == 0) {
            cgroup2 = argv[i + 1];
        } else if (strcmp(argv[i], "--tasks") == 0 && n_tasks < MAX_TASKS) {
            tasks[n_tasks++] = argv[i + 1];
        } else {
            fputs("sandbox_launch: bad option\n", stderr);
            return 125;
        }
        i++;
    }
    if (i >= argc || i < 2 || strcmp(argv[i - 1], "--") != 0) {
        fputs("usage: sandbox_launch --status FD --parent PID [--report FD] "
              "[--cgroup2 DIR] [--tasks FILE]... [--uid UID --gid GID] -- ARGV...\n",
              stderr);
        return 125;
    }
    if ((uid < 0) != (gid < 0)) {
        fputs("sandbox_launch: --uid and --gid go together\n", stderr);
        return 125;
    }
    /* Die with the runner; if it is already gone, start nothing. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) {
        fail("prctl PDEATHSIG", errno);
    }
    if (parent >= 0 && getppid() != (pid_t)parent) {
        return 125;
    }
    int cgroup_fd = -1;
    if (cgroup2 != NULL) {
        cgroup_fd = open(cgroup2, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (cgroup_fd < 0) {
            fail(cgroup2, errno);
        }
    }
    pid_t child = spawn_into(cgroup_fd, cgroup2, report >= 0);
    if (child < 0) {
        fail("fork", errno);
    }
    if (child == 0) {
        /* Our parent: the launcher, or with --report the runner. */
        pid_t launcher = getppid();
        if (report >= 0) {
            close((int)report); /* EOF for the runner if the launcher dies first */
        }
        for (int t = 0; t < n_tasks; t++) {
            join_tasks(tasks[t]); /* as root, before the drop */
        }
        if (uid >= 0) {
            drop_to((uid_t)uid, (gid_t)gid);
        }
        /* Die with that parent too, until bubblewrap's --die-with-parent takes
         * over (set after the drop, which clears it; kept across this exec). */
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) {
            fail("prctl PDEATHSIG", errno);
        }
        if (getppid() != launcher) {
            _exit(125);
        }
        execvp(argv[i], argv + i);
        fail(argv[i], errno);
    }
    if (cgroup_fd >= 0) {
        close(cgroup_fd);
    }
    if (report >= 0) {
        /* The runner reaps the child itself: report its pid, and go. */
        char text[32];
        int len = snprintf(text, sizeof(text), "%d\n", (int)child);
        if (write((int)report, text, (size_t)len) != len) {
            kill(child, SIGKILL); /* the runner would not know what to wait for */
            return 125;
        }
        return 0;
    }
    /* Only the sandbox's init may still hold the status pipe: the runner reads it
     * to EOF once everything has exited. */
    if (status_fd >= 0) {
        close(status_fd);
    }
    int status;
    while (waitpid(child, &status, 0) < 0) {
        if (errno != EINTR) {
            return 125;
        }
    }
    if (WIFSIGNALED(status)) {
        return 128 + WTERMSIG(status);
    }
    return WEXITSTATUS(status);
}
