/*
 * hostmem.c — host memory for the device layer: aligned blocks, page locking (mlock) with a
 * clear refusal when RLIMIT_MEMLOCK forbids it, and how much RAM there is to use.
 *
 * Available memory is MemAvailable from /proc/meminfo, capped by the memory limit of the cgroup
 * the process runs in (v1 or v2, the tightest limit on the path to the root): in a container the
 * machine's free RAM is not what the process may use. The default host budget is made of these.
 *
 * Whether fresh huge pages are dear: a virtual machine whose kernel reports free memory to its
 * host (free page reporting, /sys/module/page_reporting) gives the host back every free block of
 * the reporting order, and a huge page is such a block: taken again, it faults in at the host's
 * speed, page by host page, while small pages still come from memory the guest holds.
 */
#include "devices/devices.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/sysinfo.h>
#include <unistd.h>

/* RAM + swap: no single block larger than this can ever be backed, so it is refused at once
 * rather than left to overcommit (or to a sanitizer's allocator, which aborts on absurd sizes). */
static pthread_once_t ceiling_once = PTHREAD_ONCE_INIT;
static uint64_t ceiling = UINT64_MAX;

static void find_ceiling(void)
{
    struct sysinfo si;
    if (sysinfo(&si) == 0 && si.mem_unit)
        ceiling = ((uint64_t)si.totalram + (uint64_t)si.totalswap) * si.mem_unit;
}

void *ferry__host_aligned_alloc(uint64_t size, uint64_t align)
{
    if (size == 0)
        size = 1;
    pthread_once(&ceiling_once, find_ceiling);
    if (size > SIZE_MAX || size > ceiling || align == 0 || (align & (align - 1)))
        return NULL;
    if (align < sizeof(void *))
        align = sizeof(void *);
    void *p = NULL;
    if (posix_memalign(&p, (size_t)align, (size_t)size) != 0)
        return NULL;
    return p;
}

void ferry__host_free(void *p)
{
    free(p);
}

/* VmLck of this process in bytes, 0 when unknown. */
static uint64_t locked_bytes(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return 0;
    char line[256];
    uint64_t kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmLck: %" SCNu64, &kb) == 1)
            break;
    fclose(f);
    return kb * 1024;
}

int ferry__host_lock(void *p, uint64_t n, ferry__err *e)
{
    if (n == 0)
        return 0;
    if (!p || n > SIZE_MAX)
        return ferry__fail(e, FERRY_EINVAL, "mlock: bad range %p + %" PRIu64, p, n);
    if (mlock(p, (size_t)n) == 0)
        return 0;
    int err = errno;
    struct rlimit rl;
    char a[32], b[32];
    int have_rl = getrlimit(RLIMIT_MEMLOCK, &rl) == 0;
    if (err == EPERM)
        return ferry__fail(e, FERRY_EUNSUPPORTED,
                           "mlock of %s not permitted (RLIMIT_MEMLOCK %s; raise it with "
                           "`ulimit -l` or grant CAP_IPC_LOCK)",
                           ferry__fmt_size(n, a),
                           have_rl && rl.rlim_cur != RLIM_INFINITY
                               ? ferry__fmt_size((uint64_t)rl.rlim_cur, b)
                               : "unlimited");
    if (err == ENOMEM && have_rl && rl.rlim_cur != RLIM_INFINITY) {
        uint64_t held = locked_bytes(), want;
        if (ferry__add_u64(held, n, &want) || want > (uint64_t)rl.rlim_cur)
            return ferry__fail(e, FERRY_EUNSUPPORTED,
                               "mlock of %s refused: RLIMIT_MEMLOCK is %s and %s is locked "
                               "already (raise it with `ulimit -l` or grant CAP_IPC_LOCK)",
                               ferry__fmt_size(n, a), ferry__fmt_size((uint64_t)rl.rlim_cur, b),
                               ferry__fmt_size(held, (char[32]){0}));
    }
    return ferry__fail(e, FERRY_ENOMEM, "mlock of %s failed: %s", ferry__fmt_size(n, a),
                       strerror(err));
}

void ferry__host_unlock(void *p, uint64_t n)
{
    if (p && n && n <= SIZE_MAX)
        munlock(p, (size_t)n);
}

/* ---- available memory --------------------------------------------------------------------------- */

static int read_u64_file(const char *path, uint64_t *out)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char buf[64];
    int ok = fgets(buf, sizeof buf, f) != NULL;
    fclose(f);
    if (!ok)
        return -1;
    if (strncmp(buf, "max", 3) == 0) {
        *out = UINT64_MAX;
        return 0;
    }
    char *end;
    errno = 0;
    unsigned long long v = strtoull(buf, &end, 10);
    if (end == buf || errno)
        return -1;
    *out = v;
    return 0;
}

static uint64_t stat_key(const char *path, const char *key)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    char line[256];
    size_t kl = strlen(key);
    uint64_t v = 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, key, kl) == 0 && line[kl] == ' ') {
            v = strtoull(line + kl + 1, NULL, 10);
            break;
        }
    }
    fclose(f);
    return v;
}

/* The tightest cgroup memory limit on the path from this process's cgroup to the root, and what
 * may still be charged under it (limit - usage + reclaimable inactive file pages). 0 when there is
 * no limit. */
static int cgroup_limit(uint64_t *limit, uint64_t *room)
{
    /* $FERRY_CGROUP_ROOT stands for /sys/fs/cgroup, and its file proc_self_cgroup for
     * /proc/self/cgroup: a test builds a limited cgroup there without privileges */
    const char *fake = getenv("FERRY_CGROUP_ROOT");
    char membership[800];
    snprintf(membership, sizeof membership, "%s", "/proc/self/cgroup");
    if (fake && *fake && strlen(fake) < 200)
        snprintf(membership, sizeof membership, "%s/proc_self_cgroup", fake);
    else
        fake = NULL;
    FILE *f = fopen(membership, "r");
    if (!f)
        return 0;
    char line[1024], v1path[768] = "", v2path[768] = "";
    int have_v1 = 0, have_v2 = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *c1 = strchr(line, ':');
        char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2)
            continue;
        *c1 = 0;
        *c2 = 0;
        const char *ctrl = c1 + 1, *path = c2 + 1;
        if (strcmp(line, "0") == 0 && !*ctrl) {
            snprintf(v2path, sizeof v2path, "%s", path);
            have_v2 = 1;
        } else {
            /* v1: the controller list may be "memory" or a comma list containing it */
            char ctl[256];
            snprintf(ctl, sizeof ctl, ",%s,", ctrl);
            if (strstr(ctl, ",memory,")) {
                snprintf(v1path, sizeof v1path, "%s", path);
                have_v1 = 1;
            }
        }
    }
    fclose(f);

    uint64_t best = UINT64_MAX, best_room = UINT64_MAX;
    for (int version = 1; version <= 2; version++) {
        if ((version == 1 && !have_v1) || (version == 2 && !have_v2))
            continue;
        char path[800];
        snprintf(path, sizeof path, "%s", version == 1 ? v1path : v2path);
        char root[256];
        snprintf(root, sizeof root, "%s%s", fake ? fake : "/sys/fs/cgroup",
                 version == 1 ? "/memory" : "");
        const char *limf = version == 1 ? "memory.limit_in_bytes" : "memory.max";
        const char *usef = version == 1 ? "memory.usage_in_bytes" : "memory.current";
        const char *inact = version == 1 ? "total_inactive_file" : "inactive_file";
        for (;;) {
            char file[1100];
            uint64_t lim, use;
            snprintf(file, sizeof file, "%s%s/%s", root, strcmp(path, "/") ? path : "", limf);
            if (read_u64_file(file, &lim) == 0 && lim < best && lim < (UINT64_C(1) << 62)) {
                snprintf(file, sizeof file, "%s%s/%s", root, strcmp(path, "/") ? path : "",
                         usef);
                if (read_u64_file(file, &use) == 0) {
                    snprintf(file, sizeof file, "%s%s/memory.stat", root,
                             strcmp(path, "/") ? path : "");
                    uint64_t reclaim = stat_key(file, inact);
                    best = lim;
                    best_room = use >= lim ? 0 : lim - use;
                    if (reclaim < lim - best_room)
                        best_room += reclaim;
                    else
                        best_room = lim;
                }
            }
            char *slash = strrchr(path, '/');
            if (!slash || slash == path) {
                if (strcmp(path, "/") == 0 || !*path)
                    break;
                strcpy(path, "/");
                continue;
            }
            *slash = 0;
        }
    }
    if (best == UINT64_MAX)
        return 0;
    *limit = best;
    *room = best_room;
    return 1;
}

int ferry__host_room_probe(ferry__host_room *out)
{
    memset(out, 0, sizeof *out);
    out->cg_limit = out->cg_room = UINT64_MAX;
    uint64_t lim, room;
    if (cgroup_limit(&lim, &room)) {
        out->cg_limit = lim;
        out->cg_room = room;
    }
    return ferry__host_mem_info(&out->avail, &out->total);
}

int ferry__host_huge_pages_dear(void)
{
    /* $FERRY_SYSFS_ROOT stands for /sys (tests) */
    const char *root = getenv("FERRY_SYSFS_ROOT");
    if (!root || !*root || strlen(root) > 200)
        root = "/sys";
    char path[320];
    uint64_t order = 0, reported = 0;
    snprintf(path, sizeof path, "%s/module/page_reporting/parameters/page_reporting_order", root);
    if (read_u64_file(path, &order))
        return 0;
    snprintf(path, sizeof path, "%s/module/page_reporting/parameters/reported_kib", root);
    if (read_u64_file(path, &reported))
        return 0;
    long pg = sysconf(_SC_PAGESIZE);
    /* a reported block of at most a huge page */
    return reported > 0 && pg > 0 && order < 32 &&
           ((uint64_t)pg << order) <= FERRY__HUGE_PAGE;
}

void ferry__host_small_pages(void *p, uint64_t len)
{
#if defined(__linux__) && defined(MADV_NOHUGEPAGE)
    if (p && len)
        (void)madvise(p, (size_t)len, MADV_NOHUGEPAGE);
#else
    (void)p, (void)len;
#endif
}

int ferry__host_mem_info(uint64_t *avail, uint64_t *total)
{
    uint64_t t = 0, a = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        uint64_t kb;
        while (fgets(line, sizeof line, f)) {
            if (sscanf(line, "MemTotal: %" SCNu64, &kb) == 1)
                t = kb * 1024;
            else if (sscanf(line, "MemAvailable: %" SCNu64, &kb) == 1)
                a = kb * 1024;
        }
        fclose(f);
    }
    long page = sysconf(_SC_PAGESIZE);
    if (!t) {
        long pages = sysconf(_SC_PHYS_PAGES);
        if (pages > 0 && page > 0)
            t = (uint64_t)pages * (uint64_t)page;
    }
    if (!a) {
        long pages = sysconf(_SC_AVPHYS_PAGES);
        if (pages > 0 && page > 0)
            a = (uint64_t)pages * (uint64_t)page;
    }
    if (!t)
        return FERRY_EUNSUPPORTED;
    uint64_t lim, room;
    if (cgroup_limit(&lim, &room)) {
        if (lim < t)
            t = lim;
        if (room < a)
            a = room;
    }
    if (a > t)
        a = t;
    if (avail)
        *avail = a;
    if (total)
        *total = t;
    return 0;
}
