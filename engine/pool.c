/*
 * pool.c — the engine's compute threads (pool.h). A job is published with a new generation
 * number; the workers run their share, and the last one to finish tells the caller. A decode
 * step runs jobs back to back, so a thread waiting for the next job or for the others first
 * polls for a short while (POOL_SPIN polls) and only then blocks on a condition variable: a
 * wake-up through the kernel costs more than most jobs' imbalance, but the engine also shares the
 * cores with ferry's I/O threads, whose reads it may be waiting for, so it never spins for long.
 *
 * Blocking without a lost wake-up: a waiter counts itself in (sleepers) under the mutex and then
 * checks the condition again before it waits; a publisher changes the condition and then looks
 * at sleepers, both sequentially consistent, and takes the mutex to wake them when there are any.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "pool.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

enum { POOL_SPIN = 4000 }; /* polls before blocking: 50-100 microseconds on x86 */

struct pool {
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    pthread_t *threads;
    int n;                    /* threads counting the caller */
    int started;              /* workers started */
    atomic_uint gen;          /* bumped by every job */
    atomic_int pending;       /* workers still running the current job */
    atomic_int quit;
    atomic_int sleepers;      /* workers blocked on go */
    atomic_int caller_asleep; /* the caller blocked on done */
    pool_fn fn;               /* the job: written before gen is bumped */
    void *arg;
};

typedef struct worker_arg {
    pool *p;
    int ith;
} worker_arg;

/* Waits until the generation differs from SEEN or quit is set. */
static void wait_job(pool *p, unsigned seen)
{
    for (int i = 0; i < POOL_SPIN; i++) {
        if (atomic_load(&p->gen) != seen || atomic_load(&p->quit))
            return;
        cpu_relax();
    }
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->sleepers, 1);
    while (atomic_load(&p->gen) == seen && !atomic_load(&p->quit))
        pthread_cond_wait(&p->go, &p->mu);
    atomic_fetch_sub(&p->sleepers, 1);
    pthread_mutex_unlock(&p->mu);
}

static void *worker(void *v)
{
    worker_arg *wa = v;
    pool *p = wa->p;
    int ith = wa->ith;
    free(wa);
    unsigned seen = 0;
    for (;;) {
        wait_job(p, seen);
        if (atomic_load(&p->quit))
            break;
        seen = atomic_load(&p->gen);
        p->fn(p->arg, ith, p->n);
        if (atomic_fetch_sub(&p->pending, 1) == 1 && atomic_load(&p->caller_asleep)) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
    return NULL;
}

pool *pool_create(int n_threads)
{
    if (n_threads < 1)
        n_threads = 1;
    pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->n = n_threads;
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    if (!p->threads || pthread_mutex_init(&p->mu, NULL)) {
        free(p->threads);
        free(p);
        return NULL;
    }
    pthread_cond_init(&p->go, NULL);
    pthread_cond_init(&p->done, NULL);
    atomic_init(&p->gen, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->quit, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->caller_asleep, 0);
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (!wa)
            break;
        wa->p = p;
        wa->ith = i;
        if (pthread_create(&p->threads[i], NULL, worker, wa)) {
            free(wa);
            break;
        }
        p->started++;
    }
    if (p->started != n_threads - 1) {
        pool_destroy(p);
        return NULL;
    }
    return p;
}

/* Wakes the workers blocked on go, if any (after gen or quit changed). */
static void wake_workers(pool *p)
{
    if (atomic_load(&p->sleepers)) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->go);
        pthread_mutex_unlock(&p->mu);
    }
}

void pool_destroy(pool *p)
{
    if (!p)
        return;
    atomic_store(&p->quit, 1);
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i <= p->started; i++)
        pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->done);
    pthread_mutex_destroy(&p->mu);
    free(p->threads);
    free(p);
}

int pool_size(const pool *p) { return p->n; }

void pool_run(pool *p, pool_fn fn, void *arg)
{
    if (p->n == 1) {
        fn(arg, 0, 1);
        return;
    }
    p->fn = fn;
    p->arg = arg;
    atomic_store(&p->pending, p->n - 1);
    atomic_fetch_add(&p->gen, 1); /* publishes fn, arg and pending */
    wake_workers(p);
    fn(arg, 0, p->n);
    for (int i = 0; i < POOL_SPIN; i++) {
        if (atomic_load(&p->pending) == 0)
            return;
        cpu_relax();
    }
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->caller_asleep, 1);
    while (atomic_load(&p->pending) > 0)
        pthread_cond_wait(&p->done, &p->mu);
    atomic_store(&p->caller_asleep, 0);
    pthread_mutex_unlock(&p->mu);
}
