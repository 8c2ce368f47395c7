/*
 * pool.c — the engine's compute threads (pool.h). A job is published under the mutex with a new
 * generation number; workers wake on the condition variable, run their share, and the last one to
 * finish wakes the caller. Blocking waits rather than spinning: the engine shares the cores with
 * ferry's I/O threads, whose reads it is waiting for.
 */
#include <pthread.h>
#include <stdlib.h>

#include "pool.h"

struct pool {
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    pthread_t *threads;
    int n;            /* threads counting the caller */
    int started;      /* workers started */
    unsigned gen;     /* bumped by every job; guarded by mu */
    int pending;      /* workers still running the current job; guarded by mu */
    int quit;         /* guarded by mu */
    pool_fn fn;
    void *arg;
};

typedef struct worker_arg {
    pool *p;
    int ith;
} worker_arg;

static void *worker(void *v)
{
    worker_arg *wa = v;
    pool *p = wa->p;
    int ith = wa->ith;
    free(wa);
    unsigned seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->quit && p->gen == seen)
            pthread_cond_wait(&p->go, &p->mu);
        if (p->quit)
            break;
        seen = p->gen;
        pool_fn fn = p->fn;
        void *arg = p->arg;
        pthread_mutex_unlock(&p->mu);
        fn(arg, ith, p->n);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0)
            pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
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

void pool_destroy(pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
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
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->pending = p->n - 1;
    p->gen++;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    fn(arg, 0, p->n);
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0)
        pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
