/*
 * ioguard.c — the opt-in SIGBUS guard (ferry_guard_sigbus) and the registry of ferry's file
 * mappings it consults.
 *
 * A read of a mapped page whose file bytes are gone (the file was truncated, or the disk failed)
 * raises SIGBUS. With the guard on, a SIGBUS whose address lies in one of ferry's mappings maps
 * zero pages over the lost range (MAP_FIXED, anonymous, read-only), marks the file changed (the
 * next check of it fails with FERRY_ECHANGED) and returns, so the faulting read sees zeros. Any
 * other SIGBUS goes to the handler that was installed before.
 *
 * The registry is a fixed table of slots read by the handler without locks: a slot's fields are
 * written while its `base` is 0, then `base` is published; unregistering clears `base` before the
 * mapping goes. Only async-signal-safe calls are made in the handler (fstat, mmap, sigaction,
 * raise).
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/io_internal.h"

#define GUARD_SLOTS 1024 /* mappings beyond this many are not guarded (their faults chain) */

typedef struct guard_slot {
    _Atomic int taken;
    _Atomic uintptr_t base;   /* 0: not (yet) published */
    _Atomic size_t len;       /* bytes mapped */
    _Atomic int fd;           /* the file's descriptor, for its current size */
    _Atomic(_Atomic int *) changed;
} guard_slot;

static guard_slot slots[GUARD_SLOTS];
static _Atomic uintptr_t page_size; /* cached outside the handler (sysconf is not signal-safe) */

static pthread_mutex_t install_lock = PTHREAD_MUTEX_INITIALIZER;
static int installed;             /* under install_lock */
static struct sigaction previous; /* written before the handler is installed */

int ferry__guard_register(const ferry__iofile *f)
{
    if (!page_size)
        page_size = (uintptr_t)sysconf(_SC_PAGESIZE);
    for (int i = 0; i < GUARD_SLOTS; i++) {
        int expect = 0;
        if (!atomic_compare_exchange_strong(&slots[i].taken, &expect, 1))
            continue;
        guard_slot *s = &slots[i];
        atomic_store(&s->len, (size_t)f->size);
        atomic_store(&s->fd, f->fd);
        atomic_store(&s->changed, (_Atomic int *)&((ferry__iofile *)f)->changed);
        atomic_store(&s->base, (uintptr_t)f->map);
        return i;
    }
    return -1;
}

void ferry__guard_unregister(int slot)
{
    if (slot < 0 || slot >= GUARD_SLOTS)
        return;
    guard_slot *s = &slots[slot];
    atomic_store(&s->base, 0);
    atomic_store(&s->changed, NULL);
    atomic_store(&s->taken, 0);
}

/* Replaces the pages that can no longer be read with zeros: from the faulting page to the end of
 * the mapping when the file now ends before it (truncation), else the faulting page alone. */
static int cover(guard_slot *s, uintptr_t base, uintptr_t addr)
{
    uintptr_t pg = page_size ? page_size : 4096;
    size_t len = atomic_load(&s->len);
    uintptr_t end = base + len;
    end = (end + pg - 1) / pg * pg;
    uintptr_t start = addr / pg * pg, stop = start + pg;
    struct stat st;
    if (fstat(atomic_load(&s->fd), &st) == 0 && st.st_size >= 0) {
        uintptr_t eof = base + (uintptr_t)st.st_size;
        eof = (eof + pg - 1) / pg * pg;
        if (start >= eof)
            stop = end;
    }
    if (stop > end)
        stop = end;
    void *m = mmap((void *)start, stop - start, PROT_READ,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    return m == MAP_FAILED ? -1 : 0;
}

static void chain(int sig, siginfo_t *info, void *uctx)
{
    if (previous.sa_flags & SA_SIGINFO) {
        if (previous.sa_sigaction) {
            previous.sa_sigaction(sig, info, uctx);
            return;
        }
    } else if (previous.sa_handler == SIG_IGN) {
        /* a signal sent by kill or raise is ignored as asked; a real fault cannot be (it would
         * fault again forever), so it gets the default action, as the kernel gives it */
        if (info && info->si_code <= 0)
            return;
    } else if (previous.sa_handler != SIG_DFL) {
        previous.sa_handler(sig);
        return;
    }
    /* SIG_DFL: the default action, with the signal raised again for the case it was sent (a
     * fault would simply recur on return) */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
    raise(sig);
}

static void on_sigbus(int sig, siginfo_t *info, void *uctx)
{
    int saved = errno;
    uintptr_t addr = info ? (uintptr_t)info->si_addr : 0;
    if (addr && info->si_code > 0) {
        for (int i = 0; i < GUARD_SLOTS; i++) {
            guard_slot *s = &slots[i];
            uintptr_t base = atomic_load(&s->base);
            if (!base || addr < base || addr - base >= atomic_load(&s->len))
                continue;
            _Atomic int *changed = atomic_load(&s->changed);
            if (atomic_load(&s->base) != base || cover(s, base, addr) != 0)
                break; /* unregistered meanwhile, or no memory: not ours to fix */
            if (changed)
                atomic_fetch_or(changed, FERRY__CHANGED_LOST);
            errno = saved;
            return;
        }
    }
    chain(sig, info, uctx);
    errno = saved;
}

int ferry_guard_sigbus(int on)
{
    if (!page_size)
        page_size = (uintptr_t)sysconf(_SC_PAGESIZE);
    int rc = 0;
    pthread_mutex_lock(&install_lock);
    if (on && !installed) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_sigbus;
        sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
        sigemptyset(&sa.sa_mask);
        struct sigaction old;
        if (sigaction(SIGBUS, NULL, &old) != 0) {
            rc = FERRY_EIO;
        } else {
            previous = old;
            if (sigaction(SIGBUS, &sa, NULL) != 0)
                rc = FERRY_EIO;
            else
                installed = 1;
        }
    } else if (!on && installed) {
        struct sigaction cur;
        if (sigaction(SIGBUS, NULL, &cur) != 0) {
            rc = FERRY_EIO;
        } else if (!(cur.sa_flags & SA_SIGINFO) || cur.sa_sigaction != on_sigbus) {
            rc = FERRY_EBUSY; /* another handler replaced it: left alone */
        } else if (sigaction(SIGBUS, &previous, NULL) != 0) {
            rc = FERRY_EIO;
        } else {
            installed = 0;
        }
    }
    pthread_mutex_unlock(&install_lock);
    return rc;
}
