/*
 * memcap.h — a memory cgroup of a given size for one process, so that `ferry bench --cap` can run
 * a stream where the kernel, not ferry, enforces the memory limit. cgroup v1 (the memory
 * controller's own hierarchy, ROOT/memory) and v2 (ROOT with "memory" in cgroup.controllers).
 * Every failure says why in the caller's buffer: not root, no memory controller, a file that
 * could not be written. Plain POSIX; part of ferry_tools.
 */
#ifndef FERRY_MEMCAP_H
#define FERRY_MEMCAP_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct memcap {
    char dir[512]; /* the cgroup's directory ("" when none was made) */
    int v2;        /* 1: cgroup v2 (memory.max), 0: v1 (memory.limit_in_bytes) */
    uint64_t bytes;
} memcap;

/* Makes a memory cgroup of BYTES (swap included where the kernel counts it) named NAME under ROOT
 * (NULL: /sys/fs/cgroup) into *M. Returns 0, or -1 with the reason in WHY (what was tried, where,
 * and the system's error). *M is then empty; memcap_remove is a no-op on it. */
int memcap_create(const char *root, const char *name, uint64_t bytes, memcap *m, char *why,
                  size_t why_cap);

/* Moves process PID (0: the caller) into M. 0, or -1 with the reason in WHY. */
int memcap_join(const memcap *m, pid_t pid, char *why, size_t why_cap);

/* Times the kernel refused memory in M (v1 memory.failcnt, v2 memory.events "max"), or -1 when
 * unknown; *OOM_KILLS (may be NULL) gets the processes its OOM killer killed (v2 "oom_kill", v1
 * memory.oom_control "oom_kill"), -1 when unknown. */
long memcap_failures(const memcap *m, long *oom_kills);

/* Removes M's directory (its processes must have left or exited) and empties *M. */
void memcap_remove(memcap *m);

#endif
