/*
 * pool.h — the engine's compute threads: N-1 workers and the calling thread run one job together,
 * each given its index, and pool_run returns when all have finished. A job is split by the job
 * itself (the matrix-vector products split their rows by index).
 */
#ifndef FERRY_ENGINE_POOL_H
#define FERRY_ENGINE_POOL_H

typedef struct pool pool;
typedef void (*pool_fn)(void *arg, int ith, int nth);

/* A pool of N_THREADS (>= 1) threads counting the caller; NULL when a thread cannot start. */
pool *pool_create(int n_threads);
/* Joins the workers. NULL is a no-op. */
void pool_destroy(pool *p);
int pool_size(const pool *p);
/* Runs FN(ARG, i, n) for i in 0..n on the n threads (i = 0 on the caller); returns when all are
 * done. Not reentrant: one job at a time. */
void pool_run(pool *p, pool_fn fn, void *arg);

#endif
