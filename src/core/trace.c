/*
 * trace.c — a timeline of what ferry does (reads, conversions, copies, waits) and of the engine's
 * own events, written as Chrome trace JSON ("X" complete events) that Perfetto and
 * chrome://tracing open. Recording is off unless ferry_trace_start was called; then each event
 * costs a lock and an append.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core.h"

typedef struct trace_event {
    const char *name; /* static, or owned when dyn */
    const char *cat;
    double t0, t1;
    int tid;
    int dyn;
} trace_event;

struct ferry__trace {
    pthread_mutex_t lock;
    char *path;
    trace_event *ev;
    size_t n, cap;
    double origin;
};

static int thread_number(void)
{
    static int next = 1;
    static __thread int mine;
    if (!mine)
        mine = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED);
    return mine;
}

double ferry_now(void)
{
    return ferry__now();
}

int ferry_trace_start(ferry *f, const char *path)
{
    if (!f || !path)
        return FERRY_EINVAL;
    ferry__trace *tr = calloc(1, sizeof *tr);
    if (!tr || !(tr->path = ferry__strdup(path))) {
        free(tr);
        return ferry__fail_thread(f, FERRY_ENOMEM, "out of memory");
    }
    pthread_mutex_init(&tr->lock, NULL);
    tr->origin = ferry__now();
    pthread_rwlock_wrlock(&f->trace.lock);
    ferry__trace *old = f->trace.tr;
    if (!old)
        __atomic_store_n(&f->trace.tr, tr, __ATOMIC_RELEASE);
    pthread_rwlock_unlock(&f->trace.lock);
    if (old) {
        ferry__trace_free(tr);
        return ferry__fail_thread(f, FERRY_EBUSY, "a trace is already being recorded (to %s)",
                                  old->path);
    }
    return 0;
}

static void add(ferry__trace *tr, const char *name, const char *cat, double t0, double t1, int dyn)
{
    pthread_mutex_lock(&tr->lock);
    if (tr->n == tr->cap) {
        size_t cap = tr->cap ? tr->cap * 2 : 1024;
        trace_event *ev = realloc(tr->ev, cap * sizeof *ev);
        if (!ev) {
            pthread_mutex_unlock(&tr->lock);
            if (dyn)
                free((char *)name);
            return;
        }
        tr->ev = ev;
        tr->cap = cap;
    }
    tr->ev[tr->n++] = (trace_event){name, cat, t0, t1, thread_number(), dyn};
    pthread_mutex_unlock(&tr->lock);
}

/* Appends under the read side of trace.lock: ferry_trace_stop takes the write side before it
 * frees the trace, so no append can be running on a freed one. */
static void add_locked(ferry *f, const char *name, const char *cat, double t0, double t1,
                       int dyn)
{
    pthread_rwlock_rdlock(&f->trace.lock);
    ferry__trace *tr = f->trace.tr;
    if (tr)
        add(tr, name, cat, t0, t1, dyn);
    else if (dyn)
        free((char *)name);
    pthread_rwlock_unlock(&f->trace.lock);
}

void ferry__trace_add(ferry *f, const char *name, const char *cat, double t0, double t1)
{
    if (ferry__tracing(f))
        add_locked(f, name, cat, t0, t1, 0);
}

void ferry__trace_addf(ferry *f, const char *cat, double t0, double t1, const char *fmt,
                       const char *arg)
{
    if (!ferry__tracing(f))
        return;
    char *name = ferry__asprintf(fmt, arg);
    if (name)
        add_locked(f, name, cat, t0, t1, 1);
}

void ferry_trace_event(ferry *f, const char *name, const char *cat, double t0, double t1)
{
    if (!f || !name || !ferry__tracing(f))
        return;
    char *copy = ferry__strdup(name);
    if (copy)
        add_locked(f, copy, cat ? cat : "engine", t0, t1, 1);
}

void ferry__trace_free(ferry__trace *tr)
{
    if (!tr)
        return;
    for (size_t i = 0; i < tr->n; i++)
        if (tr->ev[i].dyn)
            free((char *)tr->ev[i].name);
    free(tr->ev);
    free(tr->path);
    pthread_mutex_destroy(&tr->lock);
    free(tr);
}

static void put_str(FILE *out, const char *s)
{
    fputc('"', out);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(out, "\\%c", c);
        else if (c < 0x20)
            fprintf(out, "\\u%04x", c);
        else
            fputc(c, out);
    }
    fputc('"', out);
}

/* Opens the file the trace goes to: for a regular file (or none yet) a temporary file beside
 * it (*TMP, renamed onto *DEST when complete, so that a reader never sees half a trace and a
 * link keeps naming the trace); anything else (a FIFO, a terminal) is written in place. */
static FILE *trace_open(const char *path, char **tmp, char **dest)
{
    struct stat st;
    *tmp = *dest = NULL;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
        return fopen(path, "w");
    char *real = realpath(path, NULL); /* NULL when it does not exist yet */
    *dest = real ? real : ferry__strdup(path);
    int fd = -1;
    static _Atomic unsigned serial;
    /* created exclusively, 0666 less the umask, as the model writer does */
    for (int attempt = 0; *dest && fd < 0 && attempt < 100; attempt++) {
        free(*tmp);
        *tmp = ferry__asprintf("%s.tmp.%ld.%u", *dest, (long)getpid(), serial++);
        fd = *tmp ? open(*tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666) : -1;
        if (fd < 0 && errno != EEXIST && errno != EINTR)
            break;
    }
    FILE *out = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!out) {
        if (fd >= 0) {
            close(fd);
            unlink(*tmp);
        }
        free(*tmp), free(*dest);
        *tmp = *dest = NULL;
        return NULL;
    }
    return out;
}

int ferry__trace_write(ferry__trace *tr, ferry__err *err)
{
    char *tmp, *dest;
    FILE *out = trace_open(tr->path, &tmp, &dest);
    if (!out)
        return ferry__fail(err, FERRY_EIO, "%s: cannot write the trace", tr->path);
    fprintf(out, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
    fprintf(out, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"args\":{\"name\":\"ferry\"}}");
    pthread_mutex_lock(&tr->lock);
    for (size_t i = 0; i < tr->n; i++) {
        const trace_event *e = &tr->ev[i];
        fprintf(out, ",\n{\"name\":");
        put_str(out, e->name);
        fprintf(out, ",\"cat\":");
        put_str(out, e->cat);
        fprintf(out, ",\"ph\":\"X\",\"pid\":1,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f}", e->tid,
                (e->t0 - tr->origin) * 1e6, (e->t1 - e->t0) * 1e6);
    }
    pthread_mutex_unlock(&tr->lock);
    fprintf(out, "\n]}\n");
    int bad = ferror(out) != 0;
    bad |= fclose(out) != 0;
    if (tmp && !bad)
        bad = rename(tmp, dest) != 0;
    if (tmp && bad)
        unlink(tmp);
    free(tmp), free(dest);
    if (bad)
        return ferry__fail(err, FERRY_EIO, "%s: cannot write the trace", tr->path);
    return 0;
}

int ferry_trace_stop(ferry *f)
{
    if (!f)
        return FERRY_EINVAL;
    pthread_rwlock_wrlock(&f->trace.lock);
    ferry__trace *tr = f->trace.tr;
    __atomic_store_n(&f->trace.tr, NULL, __ATOMIC_RELEASE);
    pthread_rwlock_unlock(&f->trace.lock);
    if (!tr)
        return 0;
    ferry__err e[1];
    ferry__err_clear(e);
    int rc = ferry__trace_write(tr, e);
    ferry__trace_free(tr);
    return ferry__publish(f, rc, e);
}
