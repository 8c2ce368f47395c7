/*
 * memcap.c — a memory cgroup for one process (memcap.h). v1 first when its memory hierarchy is
 * mounted (a machine with both has its memory controller there, not in v2), else v2.
 */
#include "memcap.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Writes TEXT to DIR/FILE: 0, or an errno. */
static int write_file(const char *dir, const char *file, const char *text)
{
    char path[640];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return errno;
    size_t n = strlen(text);
    ssize_t w = write(fd, text, n);
    int err = w == (ssize_t)n ? 0 : w < 0 ? errno : EIO;
    if (close(fd) != 0 && !err)
        err = errno;
    return err;
}

/* Reads DIR/FILE (at most CAP - 1 bytes) into BUF: 0, or an errno. */
static int read_file(const char *dir, const char *file, char *buf, size_t cap)
{
    char path[640];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno;
    ssize_t r = read(fd, buf, cap - 1);
    int err = r < 0 ? errno : 0;
    buf[r > 0 ? r : 0] = 0;
    close(fd);
    return err;
}

static int exists(const char *dir, const char *file)
{
    char path[640];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, file);
    return stat(path, &st) == 0;
}

/* Whether the space-separated LIST names WORD. */
static int lists(const char *list, const char *word)
{
    size_t n = strlen(word);
    for (const char *p = list; (p = strstr(p, word)) != NULL; p += n)
        if ((p == list || p[-1] == ' ' || p[-1] == '+') &&
            (p[n] == 0 || p[n] == ' ' || p[n] == '\n'))
            return 1;
    return 0;
}

int memcap_create(const char *root, const char *name, uint64_t bytes, memcap *m, char *why,
                  size_t why_cap)
{
    memset(m, 0, sizeof *m);
    if (!root)
        root = "/sys/fs/cgroup";
    if (!name || !*name || strchr(name, '/')) {
        snprintf(why, why_cap, "memory cgroup: bad name '%s'", name ? name : "(null)");
        return -1;
    }
    if (bytes < (UINT64_C(16) << 20)) {
        snprintf(why, why_cap, "memory cgroup: a cap of %llu bytes is below 16 MiB",
                 (unsigned long long)bytes);
        return -1;
    }
    char parent[512], ctl[256] = "";
    snprintf(parent, sizeof parent, "%s/memory", root);
    int v2 = 0;
    if (!exists(parent, "memory.limit_in_bytes")) {
        snprintf(parent, sizeof parent, "%s", root);
        if (read_file(parent, "cgroup.controllers", ctl, sizeof ctl) != 0 || !lists(ctl, "memory")) {
            snprintf(why, why_cap, "no memory cgroup controller: neither %s/memory/"
                     "memory.limit_in_bytes (cgroup v1) nor \"memory\" in %s/cgroup.controllers "
                     "(cgroup v2)", root, root);
            return -1;
        }
        v2 = 1;
    }
    if (geteuid() != 0) {
        snprintf(why, why_cap, "a memory cgroup needs root (effective uid %ld) to be made under %s",
                 (long)geteuid(), parent);
        return -1;
    }
    if (v2) {
        char sub[256] = "";
        int err = read_file(parent, "cgroup.subtree_control", sub, sizeof sub);
        if (!err && !lists(sub, "memory"))
            err = write_file(parent, "cgroup.subtree_control", "+memory");
        if (err) {
            snprintf(why, why_cap, "cgroup v2: cannot enable the memory controller in "
                     "%s/cgroup.subtree_control: %s", parent, strerror(err));
            return -1;
        }
    }
    int n = snprintf(m->dir, sizeof m->dir, "%s/%s", parent, name);
    if (n < 0 || (size_t)n >= sizeof m->dir) {
        snprintf(why, why_cap, "memory cgroup: path too long under %s", parent);
        m->dir[0] = 0;
        return -1;
    }
    if (mkdir(m->dir, 0755) != 0 && errno != EEXIST) {
        snprintf(why, why_cap, "cannot make the memory cgroup %s: %s", m->dir, strerror(errno));
        m->dir[0] = 0;
        return -1;
    }
    m->v2 = v2;
    m->bytes = bytes;
    char num[32];
    snprintf(num, sizeof num, "%llu", (unsigned long long)bytes);
    const char *limit = v2 ? "memory.max" : "memory.limit_in_bytes";
    int err = write_file(m->dir, limit, num);
    if (err) {
        snprintf(why, why_cap, "cannot set %s/%s to %s: %s", m->dir, limit, num, strerror(err));
        memcap_remove(m);
        return -1;
    }
    /* swap would let the cgroup hold more than its cap: none (where the kernel counts it) */
    if (v2)
        (void)write_file(m->dir, "memory.swap.max", "0");
    else if (exists(m->dir, "memory.memsw.limit_in_bytes"))
        (void)write_file(m->dir, "memory.memsw.limit_in_bytes", num);
    return 0;
}

int memcap_join(const memcap *m, pid_t pid, char *why, size_t why_cap)
{
    if (!m->dir[0]) {
        snprintf(why, why_cap, "memory cgroup: none was made");
        return -1;
    }
    char num[32];
    snprintf(num, sizeof num, "%ld", (long)(pid ? pid : getpid()));
    int err = write_file(m->dir, "cgroup.procs", num);
    if (err) {
        snprintf(why, why_cap, "cannot move process %s into %s (cgroup.procs): %s", num, m->dir,
                 strerror(err));
        return -1;
    }
    return 0;
}

/* The number after KEY in the "key value" lines of TEXT, or -1. */
static long field(const char *text, const char *key)
{
    size_t n = strlen(key);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (strncmp(p, key, n) == 0 && p[n] == ' ')
            return strtol(p + n + 1, NULL, 10);
    return -1;
}

long memcap_failures(const memcap *m, long *oom_kills)
{
    char buf[1024];
    long fails = -1, kills = -1;
    if (m->dir[0] && m->v2) {
        if (read_file(m->dir, "memory.events", buf, sizeof buf) == 0) {
            fails = field(buf, "max");
            kills = field(buf, "oom_kill");
        }
    } else if (m->dir[0]) {
        if (read_file(m->dir, "memory.failcnt", buf, sizeof buf) == 0)
            fails = strtol(buf, NULL, 10);
        if (read_file(m->dir, "memory.oom_control", buf, sizeof buf) == 0)
            kills = field(buf, "oom_kill");
    }
    if (oom_kills)
        *oom_kills = kills;
    return fails;
}

void memcap_remove(memcap *m)
{
    if (m->dir[0])
        (void)rmdir(m->dir);
    memset(m, 0, sizeof *m);
}
