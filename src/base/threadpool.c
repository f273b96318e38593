/* A fixed pthread pool. pkv_pool_run hands out task indices through an atomic
 * counter; the calling thread works too, so a pool of n threads starts n-1. */
#include "base/base.h"

#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

struct pkv_pool {
    int n_threads; /* including the caller */
    pthread_t *threads;
    int n_started;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    uint64_t generation; /* bumped for each run */
    bool quit;
    /* current job */
    pkv_pool_fn fn;
    void *arg;
    int n_tasks;
    atomic_int next;
    int n_active; /* workers still inside the current job */
};

int pkv_cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

static void drain(pkv_pool *p) {
    for (;;) {
        int i = atomic_fetch_add(&p->next, 1);
        if (i >= p->n_tasks) break;
        p->fn(i, p->n_tasks, p->arg);
    }
}

static void *worker(void *v) {
    pkv_pool *p = v;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->quit && p->generation == seen) pthread_cond_wait(&p->cv_work, &p->mu);
        if (p->quit) break;
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        drain(p);
        pthread_mutex_lock(&p->mu);
        if (--p->n_active == 0) pthread_cond_signal(&p->cv_done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

pkv_pool *pkv_pool_create(int n_threads) {
    if (n_threads <= 0) n_threads = pkv_cpu_count();
    pkv_pool *p = pkv_calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n_threads = n_threads;
    if (pthread_mutex_init(&p->mu, NULL) != 0) goto fail_mu;
    if (pthread_cond_init(&p->cv_work, NULL) != 0) goto fail_cv1;
    if (pthread_cond_init(&p->cv_done, NULL) != 0) goto fail_cv2;
    if (n_threads > 1) {
        p->threads = pkv_calloc((size_t)n_threads - 1, sizeof(pthread_t));
        if (!p->threads) goto fail_threads;
        for (int i = 0; i < n_threads - 1; i++) {
            if (pthread_create(&p->threads[i], NULL, worker, p) != 0) break;
            p->n_started++;
        }
        /* Fewer threads than asked is not an error: work still completes. */
        p->n_threads = p->n_started + 1;
    }
    return p;
fail_threads:
    pthread_cond_destroy(&p->cv_done);
fail_cv2:
    pthread_cond_destroy(&p->cv_work);
fail_cv1:
    pthread_mutex_destroy(&p->mu);
fail_mu:
    pkv_free(p);
    pkv_err(PKV_ERR_NOMEM, "cannot create a thread pool of %d threads", n_threads);
    return NULL;
}

void pkv_pool_free(pkv_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->quit = true;
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_started; i++) pthread_join(p->threads[i], NULL);
    pkv_free(p->threads);
    pthread_cond_destroy(&p->cv_done);
    pthread_cond_destroy(&p->cv_work);
    pthread_mutex_destroy(&p->mu);
    pkv_free(p);
}

int pkv_pool_threads(const pkv_pool *p) { return p ? p->n_threads : 1; }

void pkv_pool_run(pkv_pool *p, int n_tasks, pkv_pool_fn fn, void *arg) {
    if (n_tasks <= 0) return;
    if (!p || p->n_started == 0 || n_tasks == 1) {
        for (int i = 0; i < n_tasks; i++) fn(i, n_tasks, arg);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->n_tasks = n_tasks;
    atomic_store(&p->next, 0);
    p->n_active = p->n_started;
    p->generation++;
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    drain(p);
    pthread_mutex_lock(&p->mu);
    while (p->n_active > 0) pthread_cond_wait(&p->cv_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
