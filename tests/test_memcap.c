/*
 * test_memcap.c — the memory cgroup `ferry bench --cap` runs its stream in (tools/common/memcap.c),
 * on fake hierarchies in a temporary directory: every way it cannot be made says why and where
 * (no controller, a limit file that cannot be written, a bad name or size), and a v1 or v2 layout
 * whose files it can write gets the limit written. The real /sys/fs/cgroup is never touched.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "memcap.h"

static const char *tmp;

static void put(const char *dir, const char *file, const char *text)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    FILE *f = fopen(p, "w");
    CHECK(f != NULL);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static void get(const char *dir, const char *file, char *buf, size_t cap)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    buf[0] = 0;
    FILE *f = fopen(p, "r");
    if (f) {
        size_t n = fread(buf, 1, cap - 1, f);
        buf[n] = 0;
        fclose(f);
    }
}

static void sub(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", tmp, name);
    CHECK(mkdir(out, 0755) == 0 || errno == EEXIST);
}

int main(void)
{
    tmp = check_tmpdir("memcap");
    char why[768], root[600], d[900];
    memcap m;

    /* nothing there: neither v1 nor v2, and the message names both places looked at */
    sub(root, sizeof root, "empty");
    CHECK_EQ_INT(memcap_create(root, "x", 64u << 20, &m, why, sizeof why), -1);
    CHECK(strstr(why, "no memory cgroup controller") && strstr(why, root));
    CHECK(m.dir[0] == 0);
    memcap_remove(&m); /* no-op on an empty one */

    /* v2 without the memory controller */
    sub(root, sizeof root, "v2-nomem");
    put(root, "cgroup.controllers", "cpuset cpu io pids\n");
    CHECK_EQ_INT(memcap_create(root, "x", 64u << 20, &m, why, sizeof why), -1);
    CHECK(strstr(why, "cgroup.controllers") != NULL);

    /* bad name, too small a cap */
    CHECK_EQ_INT(memcap_create(root, "a/b", 64u << 20, &m, why, sizeof why), -1);
    CHECK(strstr(why, "bad name 'a/b'") != NULL);
    CHECK_EQ_INT(memcap_create(root, "x", 4096, &m, why, sizeof why), -1);
    CHECK(strstr(why, "below 16 MiB") != NULL);

    if (geteuid() == 0) {
        /* v1 whose new cgroup has no limit file (a plain directory): the write fails, says
         * which file, and the directory is removed again */
        sub(root, sizeof root, "v1");
        snprintf(d, sizeof d, "%s/memory", root);
        CHECK(mkdir(d, 0755) == 0 || errno == EEXIST);
        put(d, "memory.limit_in_bytes", "9223372036854771712\n");
        CHECK_EQ_INT(memcap_create(root, "cap", 64u << 20, &m, why, sizeof why), -1);
        CHECK(strstr(why, "memory.limit_in_bytes") && strstr(why, "cannot set"));
        snprintf(d, sizeof d, "%s/memory/cap", root);
        struct stat st;
        CHECK(stat(d, &st) != 0);

        /* v2 with memory: the controller enabled below the root, the limit written; joining a
         * fake cgroup writes the pid into its cgroup.procs */
        sub(root, sizeof root, "v2");
        put(root, "cgroup.controllers", "cpu memory io\n");
        put(root, "cgroup.subtree_control", "cpu\n");
        snprintf(d, sizeof d, "%s/cap", root);
        CHECK(mkdir(d, 0755) == 0 || errno == EEXIST);
        put(d, "memory.max", "max\n");
        put(d, "cgroup.procs", "");
        put(d, "memory.events", "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n");
        CHECK_EQ_INT(memcap_create(root, "cap", 64u << 20, &m, why, sizeof why), 0);
        CHECK(m.v2 == 1);
        char buf[256];
        get(d, "memory.max", buf, sizeof buf);
        CHECK(strncmp(buf, "67108864", 8) == 0);
        get(root, "cgroup.subtree_control", buf, sizeof buf);
        CHECK(strstr(buf, "+memory") != NULL);
        CHECK_EQ_INT(memcap_join(&m, 4242, why, sizeof why), 0);
        get(d, "cgroup.procs", buf, sizeof buf);
        CHECK(strncmp(buf, "4242", 4) == 0);
        long kills = 0;
        CHECK_EQ_INT(memcap_failures(&m, &kills), 3);
        CHECK_EQ_INT(kills, 1);
        /* a cgroup directory with files in it cannot be removed: remove empties M anyway */
        memcap_remove(&m);
        CHECK(m.dir[0] == 0);
        CHECK_EQ_INT(memcap_join(&m, 0, why, sizeof why), -1);
        CHECK(strstr(why, "none was made") != NULL);
    } else {
        fprintf(stderr, "note: not root: the write paths are not exercised\n");
    }
    if (!check_failed)
        check_rmdir(tmp);
    return check_finish();
}
