/* A fixed pthread pool. pkv_pool_run hands out task indices through an atomic
 * counter; the calling thread works too, so a pool of n threads starts n-1.
 *
 * A decode step runs a few hundred short kernels back to back, so waking a
 * sleeping worker through a futex for each (several microseconds, ~10% of a
 * decode step in a profile) is avoided: workers spin for a short while on the
 * job counter before they sleep, and the caller spins before it sleeps waiting
 * for them. Sleeping and waking go through the mutex, so no wake-up is lost. */
#include "base/base.h"

#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
/* ISB stalls for tens of cycles, as PAUSE does on x86; YIELD is a no-op on most
 * ARM cores, so a spin with it would be much shorter than SPIN_ROUNDS intends. */
#define CPU_RELAX() __asm__ __volatile__("isb" ::: "memory")
#else
#define CPU_RELAX() ((void)0)
#endif

#define SPIN_ROUNDS 4000 /* pause instructions before sleeping: ~20-200 us */

struct pkv_pool {
    int n_threads; /* including the caller */
    pthread_t *threads;
    int n_started;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    _Atomic uint64_t generation; /* bumped (release) after a job is set up */
    atomic_bool quit;
    /* current job: written before the generation bump */
    pkv_pool_fn fn;
    void *arg;
    int n_tasks;
    atomic_int next;
    atomic_int n_active; /* workers still inside the current job */
    int n_sleeping;      /* workers waiting on cv_work (under mu) */
    bool done_waiting;   /* the caller waits on cv_done (under mu) */
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

/* Wait for a generation other than `seen` (or quit): spin, then sleep. */
static uint64_t wait_job(pkv_pool *p, uint64_t seen) {
    uint64_t g;
    for (int spins = 0; spins < SPIN_ROUNDS; spins++) {
        g = atomic_load_explicit(&p->generation, memory_order_acquire);
        if (g != seen || atomic_load(&p->quit)) return g;
        CPU_RELAX();
    }
    pthread_mutex_lock(&p->mu);
    p->n_sleeping++;
    while ((g = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen && !atomic_load(&p->quit))
        pthread_cond_wait(&p->cv_work, &p->mu);
    p->n_sleeping--;
    pthread_mutex_unlock(&p->mu);
    return g;
}

static void *worker(void *v) {
    pkv_pool *p = v;
    uint64_t seen = 0;
    for (;;) {
        seen = wait_job(p, seen);
        if (atomic_load(&p->quit)) break;
        drain(p);
        if (atomic_fetch_sub(&p->n_active, 1) == 1) { /* the last one out tells a sleeping caller */
            pthread_mutex_lock(&p->mu);
            if (p->done_waiting) pthread_cond_signal(&p->cv_done);
            pthread_mutex_unlock(&p->mu);
        }
    }
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
    atomic_store(&p->quit, true);
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
    p->fn = fn;
    p->arg = arg;
    p->n_tasks = n_tasks;
    atomic_store(&p->next, 0);
    atomic_store(&p->n_active, p->n_started);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    pthread_mutex_lock(&p->mu);
    if (p->n_sleeping) pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    drain(p);
    for (int spins = 0; atomic_load(&p->n_active) > 0; spins++) {
        if (spins < SPIN_ROUNDS) {
            CPU_RELAX();
            continue;
        }
        pthread_mutex_lock(&p->mu);
        p->done_waiting = true;
        while (atomic_load(&p->n_active) > 0) pthread_cond_wait(&p->cv_done, &p->mu);
        p->done_waiting = false;
        pthread_mutex_unlock(&p->mu);
    }
}
