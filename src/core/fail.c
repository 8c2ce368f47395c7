/*
 * fail.c — each thread's last failure per manager (ferry_errmsg).
 *
 * Internal functions fail into a ferry__err the public call owns; the call publishes it here, to
 * the calling thread's slot for its manager. Slots are found by the manager's serial, never by
 * its address: a manager destroyed and another created at the same address inherits nothing.
 * A thread's slots are freed when it exits (a pthread key's destructor); a slot of a manager that
 * is gone is dropped when the thread's table needs room (the registry of live serials says which).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

typedef struct tslot {
    uint64_t serial;
    ferry__err e;
    char *long_msg; /* a report longer than e.msg (ferry_validate), or NULL */
    size_t long_len;
} tslot;

typedef struct tslots {
    tslot **v;
    size_t n, cap;
} tslots;

static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static pthread_key_t key;
static int key_failed;

/* Without memory for a slot, the code alone: ferry_errmsg then says ferry_strerror(code). */
static _Thread_local struct {
    uint64_t serial;
    int code;
} t_bare;

/* Serials of the managers alive, ascending (serials only grow), under reg_lock. */
static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t *reg;
static size_t reg_n, reg_cap;
static uint64_t next_serial = 1;

static void slot_free(tslot *s)
{
    if (s) {
        free(s->long_msg);
        free(s);
    }
}

static void table_free(void *p)
{
    tslots *t = p;
    for (size_t i = 0; i < t->n; i++)
        slot_free(t->v[i]);
    free(t->v);
    free(t);
}

static void key_make(void)
{
    key_failed = pthread_key_create(&key, table_free) != 0;
}

static tslots *table(int create)
{
    pthread_once(&key_once, key_make);
    if (key_failed)
        return NULL;
    tslots *t = pthread_getspecific(key);
    if (!t && create && (t = calloc(1, sizeof *t)) != NULL && pthread_setspecific(key, t) != 0) {
        free(t);
        t = NULL;
    }
    return t;
}

static size_t reg_find(uint64_t serial)
{
    size_t lo = 0, hi = reg_n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (reg[mid] < serial)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

int ferry__serial_register(uint64_t *serial)
{
    pthread_mutex_lock(&reg_lock);
    int rc = 0;
    if (reg_n == reg_cap) {
        size_t cap = reg_cap ? reg_cap * 2 : 16;
        uint64_t *r = realloc(reg, cap * sizeof *r);
        if (r) {
            reg = r;
            reg_cap = cap;
        } else {
            rc = FERRY_ENOMEM;
        }
    }
    if (!rc) {
        *serial = next_serial++;
        reg[reg_n++] = *serial;
    }
    pthread_mutex_unlock(&reg_lock);
    return rc;
}

static tslot **find(tslots *t, uint64_t serial)
{
    for (size_t i = 0; t && i < t->n; i++)
        if (t->v[i]->serial == serial)
            return &t->v[i];
    return NULL;
}

void ferry__serial_unregister(uint64_t serial)
{
    if (!serial)
        return;
    pthread_mutex_lock(&reg_lock);
    size_t i = reg_find(serial);
    if (i < reg_n && reg[i] == serial) {
        memmove(reg + i, reg + i + 1, (reg_n - i - 1) * sizeof *reg);
        reg_n--;
    }
    pthread_mutex_unlock(&reg_lock);
    /* the destroying thread's own slot goes now; other threads drop theirs later */
    tslots *t = table(0);
    tslot **s = find(t, serial);
    if (s) {
        slot_free(*s);
        *s = t->v[--t->n];
    }
    if (t_bare.serial == serial)
        t_bare.serial = 0;
}

/* Drops T's slots of managers no longer alive. */
static void purge(tslots *t)
{
    pthread_mutex_lock(&reg_lock);
    for (size_t i = 0; i < t->n;) {
        size_t k = reg_find(t->v[i]->serial);
        if (k < reg_n && reg[k] == t->v[i]->serial) {
            i++;
            continue;
        }
        slot_free(t->v[i]);
        t->v[i] = t->v[--t->n];
    }
    pthread_mutex_unlock(&reg_lock);
}

/* The calling thread's slot for SERIAL, made when missing; NULL without memory. */
static tslot *slot_get(uint64_t serial)
{
    tslots *t = table(1);
    if (!t)
        return NULL;
    tslot **s = find(t, serial);
    if (s)
        return *s;
    if (t->n == t->cap)
        purge(t);
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 4;
        tslot **v = realloc(t->v, cap * sizeof *v);
        if (!v)
            return NULL;
        t->v = v;
        t->cap = cap;
    }
    tslot *n = calloc(1, sizeof *n);
    if (!n)
        return NULL;
    n->serial = serial;
    t->v[t->n++] = n;
    return n;
}

int ferry__publish_long(const ferry *f, int code, const ferry__err *e, char *long_msg,
                        size_t long_len)
{
    if (!code) {
        free(long_msg);
        return 0;
    }
    tslot *s = slot_get(f->serial);
    if (!s) {
        free(long_msg);
        t_bare.serial = f->serial;
        t_bare.code = code;
        return code;
    }
    if (t_bare.serial == f->serial)
        t_bare.serial = 0;
    s->e.code = code;
    if (e && e->msg[0])
        memcpy(s->e.msg, e->msg, strlen(e->msg) + 1);
    else
        snprintf(s->e.msg, sizeof s->e.msg, "%s", ferry_strerror(code));
    free(s->long_msg);
    s->long_msg = long_msg;
    s->long_len = long_msg ? long_len : 0;
    return code;
}

int ferry__publish(const ferry *f, int code, const ferry__err *e)
{
    return ferry__publish_long(f, code, e, NULL, 0);
}

int ferry__fail_thread(const ferry *f, int code, const char *fmt, ...)
{
    ferry__err e;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.msg, sizeof e.msg, fmt, ap);
    va_end(ap);
    e.code = code;
    return ferry__publish(f, code, &e);
}

const char *ferry_errmsg(const ferry *f)
{
    if (!f)
        return "no manager";
    if (t_bare.serial && t_bare.serial == f->serial)
        return ferry_strerror(t_bare.code);
    tslot **s = find(table(0), f->serial);
    if (!s)
        return "";
    /* validate's full report, of which msg holds the (cut) beginning */
    return (*s)->long_msg ? (*s)->long_msg : (*s)->e.msg;
}
