/*
 * iosys.c — the system calls of ferry's file reading, behind a table tests can override (as
 * SQLite's aSyscall[]): ferry_set_syscall("pread", fn) makes every later pread of the I/O engine
 * call FN, so a test can fail the N-th one and check that the error is clear and the manager
 * recovers. Entries are atomic: a replacement may be installed while other threads read.
 * The SIGBUS guard's handler (ioguard.c) keeps calling the system directly.
 */
#include "io/io_internal.h"

#include <fcntl.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static int sys_open(const char *path, int flags)
{
    return open(path, flags);
}

typedef int (*open_fn)(const char *, int);
typedef int (*close_fn)(int);
typedef int (*fstat_fn)(int, struct stat *);
typedef ssize_t (*pread_fn)(int, void *, size_t, off_t);
typedef void *(*mmap_fn)(void *, size_t, int, int, int, off_t);
typedef int (*munmap_fn)(void *, size_t);

static struct {
    const char *name;
    ferry_syscall_ptr system;
    _Atomic(ferry_syscall_ptr) now;
} table[] = {
    {"open", (ferry_syscall_ptr)sys_open, NULL},
    {"close", (ferry_syscall_ptr)close, NULL},
    {"fstat", (ferry_syscall_ptr)fstat, NULL},
    {"pread", (ferry_syscall_ptr)pread, NULL},
    {"mmap", (ferry_syscall_ptr)mmap, NULL},
    {"munmap", (ferry_syscall_ptr)munmap, NULL},
};
enum { SYS_OPEN, SYS_CLOSE, SYS_FSTAT, SYS_PREAD, SYS_MMAP, SYS_MUNMAP, SYS_COUNT };

static ferry_syscall_ptr current(int i)
{
    ferry_syscall_ptr p = atomic_load_explicit(&table[i].now, memory_order_acquire);
    return p ? p : table[i].system;
}

FERRY_API int ferry_set_syscall(const char *name, ferry_syscall_ptr fn)
{
    for (int i = 0; name && i < SYS_COUNT; i++) {
        if (strcmp(name, table[i].name) == 0) {
            atomic_store_explicit(&table[i].now, fn, memory_order_release);
            return 0;
        }
    }
    return FERRY_ENOENT;
}

FERRY_API ferry_syscall_ptr ferry_get_syscall(const char *name)
{
    for (int i = 0; name && i < SYS_COUNT; i++)
        if (strcmp(name, table[i].name) == 0)
            return current(i);
    return NULL;
}

int ferry__sys_open(const char *path, int flags)
{
    return ((open_fn)current(SYS_OPEN))(path, flags);
}

int ferry__sys_close(int fd)
{
    return ((close_fn)current(SYS_CLOSE))(fd);
}

int ferry__sys_fstat(int fd, struct stat *st)
{
    return ((fstat_fn)current(SYS_FSTAT))(fd, st);
}

ssize_t ferry__sys_pread(int fd, void *buf, size_t n, off_t off)
{
    return ((pread_fn)current(SYS_PREAD))(fd, buf, n, off);
}

void *ferry__sys_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    return ((mmap_fn)current(SYS_MMAP))(addr, len, prot, flags, fd, off);
}

int ferry__sys_munmap(void *addr, size_t len)
{
    return ((munmap_fn)current(SYS_MUNMAP))(addr, len);
}
