/* Disk tier: full prefix pages kept in a directory, one file per page, below the
 * device pool (and its host swap pool). docs/kv-cache.md describes the tiers.
 *
 * A page is written when it becomes cached (the last sequence holding it lets go:
 * pkv_kv_seq_free flushes) and, at the latest, when the LRU evicts it from the
 * device pool; a page already on disk is never written again (the name is its
 * content address). A prefix match that runs out of cached pages goes on with
 * the files of the next pages, each verified before it is used, and loads them
 * into fresh device pages through the device transfer API (I1), indexing them as
 * if they had been computed here.
 *
 * Directory:
 *   PAGEKV-DISK     marker: "pagekv disk KV cache, page file format 1\n"; a
 *                   directory holding other entries without it is refused
 *   lock            flock()ed exclusively by the cache that uses the directory;
 *                   a second process is refused (the kernel drops the lock when
 *                   the holder dies, kill -9 included). It holds no data.
 *   KKKKKKKKKKKKKKKK-LLLLLLLLLLLLLLLL.kvp   a page: K = its chained prefix key
 *                   (seeded by the producer's fingerprint), L = the cache layout's
 *                   fingerprint, both 16 lowercase hex digits
 *   *.tmp-XXXXXX    a write in progress (src/base/file.c); left over only by a
 *                   crash, removed when a cache opens the directory
 *
 * A page file is a page image (kv-page-image.c: header with both fingerprints and
 * the chain keys, tokens, positions, every layer's rows, for recurrent layers the
 * state the page offered to prefix matching, a checksum), the format the remote
 * tier (kv-redis.c) stores too. A file is used only if pkv_kv_pimg_check passes;
 * otherwise it is counted as rejected and removed.
 *
 * Writes go through pkv_wfile (temporary file, fsync, rename), so a crash leaves
 * either the whole page or no page under the name. The first failed write (a full
 * disk, an I/O error) turns the tier off for the life of the cache: serving goes
 * on from memory, the log says so, pkv_kv_stats.disk_enabled turns false. */
#include "kv/kv-file.h"
#include "kv/kv-impl.h"

#include <dirent.h>
#include <pthread.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define DISK_VERSION 1u
#define DISK_MARKER "PAGEKV-DISK"
#define DISK_MARKER_HEAD "pagekv disk KV cache, page file format "
#define DISK_LOCK "lock"
#define DISK_EXT ".kvp"
#define DISK_NAME_LEN 37 /* 16 hex, '-', 16 hex, ".kvp" */
#define DISK_DEFAULT_BYTES (1ull << 30)

bool pkv_kv_test_disk_fail_write = false;
int64_t pkv_kv_test_disk_fail_after = -1;

typedef struct disk_entry {
    uint64_t key, lfp;
    uint64_t bytes;
    int64_t mtime_ns;   /* at open: orders the LRU */
    int32_t hnext;      /* bucket chain, or the free list */
    int32_t prev, next; /* LRU, oldest first */
    bool ready;         /* the file is complete (false while the writer has it queued) */
} disk_entry;

/* A page image waiting for the writer thread. */
typedef struct disk_job {
    uint8_t *img; /* [bytes] */
    size_t bytes; /* the image's (kv_pimg_plan.bytes) */
    uint64_t key, lfp;
    int32_t e;
    struct disk_job *next;
} disk_job;

typedef struct kv_disk {
    char *dir;
    int lock_fd;
    uint64_t cap, used;
    disk_entry *e; /* [cap_e] */
    size_t n_e, cap_e;
    int32_t free_e;
    int32_t *buckets; /* [n_buckets] */
    uint64_t n_buckets;
    int32_t head, tail;
    int64_t n_files;
    bool off;
    kv_pimg g;     /* the page files' geometry */
    uint8_t *rbuf; /* [g.max_bytes] */
    uint8_t *sbuf;  /* [g.state_bytes]: the deepest state a disk match has read */
    uint8_t *wtmp, *rtmp; /* one page of the largest array */
    /* The writer thread: the cache's thread reads a page from the device into an
     * image and queues it; the writer writes, fsyncs and renames it, so a request
     * never waits for the disk (unless the queue is full: queue_max bytes). mu
     * guards the index, the queue, `off` and st; the rest belongs to the cache's
     * thread. */
    pthread_t th;
    bool th_on, quit;
    pthread_mutex_t mu;
    pthread_cond_t cv, cv_idle;
    disk_job *q_head, *q_tail;
    size_t q_bytes, queue_max;
    bool busy; /* the writer holds a job */
    pkv_kv_stats st; /* the disk_ fields */
} kv_disk;

static uint64_t entry_hash(uint64_t key, uint64_t lfp) { return key ^ (lfp * 0x9e3779b97f4a7c15ull); }


static void entry_path(const kv_disk *d, uint64_t key, uint64_t lfp, char *out, size_t n) {
    snprintf(out, n, "%s/%016llx-%016llx" DISK_EXT, d->dir, (unsigned long long)key, (unsigned long long)lfp);
}

/* ------------------------------------------------------------ the index */

/* Entry of (key, lfp), queued or ready, or -1. */
static int32_t find(const kv_disk *d, uint64_t key, uint64_t lfp) {
    for (int32_t i = d->buckets[entry_hash(key, lfp) & (d->n_buckets - 1)]; i >= 0; i = d->e[i].hnext)
        if (d->e[i].key == key && d->e[i].lfp == lfp) return i;
    return -1;
}

/* The oldest entry whose file is complete (a queued one is not evicted under the writer), or -1. */
static int32_t oldest_ready(const kv_disk *d) {
    int32_t i = d->head;
    while (i >= 0 && !d->e[i].ready) i = d->e[i].next;
    return i;
}

static void lru_unlink(kv_disk *d, int32_t i) {
    disk_entry *x = &d->e[i];
    if (x->prev >= 0) d->e[x->prev].next = x->next;
    else d->head = x->next;
    if (x->next >= 0) d->e[x->next].prev = x->prev;
    else d->tail = x->prev;
    x->prev = x->next = -1;
}

static void lru_append(kv_disk *d, int32_t i) {
    disk_entry *x = &d->e[i];
    x->next = -1;
    x->prev = d->tail;
    if (d->tail >= 0) d->e[d->tail].next = i;
    else d->head = i;
    d->tail = i;
}

static pkv_status rehash(kv_disk *d, uint64_t nb) {
    int32_t *b = pkv_malloc((size_t)nb * sizeof *b);
    if (!b) return pkv_err(PKV_ERR_NOMEM, "KV disk tier: out of memory for its index");
    for (uint64_t i = 0; i < nb; i++) b[i] = -1;
    /* live entries are those on the LRU list */
    for (int32_t i = d->head; i >= 0; i = d->e[i].next) {
        uint64_t h = entry_hash(d->e[i].key, d->e[i].lfp) & (nb - 1);
        d->e[i].hnext = b[h];
        b[h] = i;
    }
    pkv_free(d->buckets);
    d->buckets = b;
    d->n_buckets = nb;
    return PKV_OK;
}

/* A new entry, appended to the LRU (newest). -1 when memory runs out. */
static int32_t add(kv_disk *d, uint64_t key, uint64_t lfp, uint64_t bytes, int64_t mtime_ns, bool link) {
    int32_t i = d->free_e;
    if (i >= 0) {
        d->free_e = d->e[i].hnext;
    } else {
        if (d->n_e == d->cap_e) {
            void *arr = d->e;
            size_t cap = d->cap_e;
            if (pkv_grow(&arr, &cap, d->n_e + 1, sizeof *d->e)) return -1;
            d->e = arr;
            d->cap_e = cap;
        }
        i = (int32_t)d->n_e++;
    }
    disk_entry *x = &d->e[i];
    x->key = key;
    x->lfp = lfp;
    x->bytes = bytes;
    x->mtime_ns = mtime_ns;
    x->prev = x->next = x->hnext = -1;
    x->ready = true;
    d->used += bytes;
    d->n_files++;
    if (!link) return i; /* scan: linked and hashed once all are known */
    lru_append(d, i);
    uint64_t h = entry_hash(key, lfp) & (d->n_buckets - 1);
    x->hnext = d->buckets[h];
    d->buckets[h] = i;
    if ((uint64_t)d->n_files > 2 * d->n_buckets) (void)rehash(d, d->n_buckets * 4); /* on failure: longer chains */
    return i;
}

/* Forget entry i and remove its file (mu held). */
static void drop_entry(kv_disk *d, int32_t i) {
    disk_entry *x = &d->e[i];
    char path[4096];
    entry_path(d, x->key, x->lfp, path, sizeof path);
    (void)unlink(path);
    int32_t *link = &d->buckets[entry_hash(x->key, x->lfp) & (d->n_buckets - 1)];
    while (*link != i) link = &d->e[*link].hnext;
    *link = x->hnext;
    lru_unlink(d, i);
    d->used -= x->bytes;
    d->n_files--;
    x->hnext = d->free_e;
    d->free_e = i;
}

/* drop_entry, on the cache's thread: pages in memory that thought they were on
 * disk under it will be written again when they leave. mu held. */
static void drop(pkv_kv_cache *c, int32_t i) {
    kv_disk *d = c->disk;
    uint64_t key = d->e[i].key;
    bool mine = d->e[i].lfp == c->layout.fingerprint;
    drop_entry(d, i);
    if (mine)
        for (int32_t q = c->buckets[key & (c->n_buckets - 1)]; q >= 0; q = c->pages[q].hnext)
            if (c->pages[q].key == key) c->pages[q].on_disk = false;
}

/* ------------------------------------------------------------ open */

static bool parse_name(const char *name, uint64_t *key, uint64_t *lfp) {
    if (strlen(name) != DISK_NAME_LEN || name[16] != '-' || strcmp(name + 33, DISK_EXT) != 0) return false;
    for (int i = 0; i < 33; i++)
        if (i != 16 && !((name[i] >= '0' && name[i] <= '9') || (name[i] >= 'a' && name[i] <= 'f'))) return false;
    char a[17], b[17];
    memcpy(a, name, 16);
    memcpy(b, name + 17, 16);
    a[16] = b[16] = 0;
    *key = strtoull(a, NULL, 16);
    *lfp = strtoull(b, NULL, 16);
    return true;
}

static bool is_temp(const char *name) { return strstr(name, ".tmp-") != NULL; }

typedef struct scan_item {
    int64_t mtime_ns;
    int32_t e;
} scan_item;

static int cmp_item(const void *a, const void *b) {
    const scan_item *x = a, *y = b;
    return (x->mtime_ns > y->mtime_ns) - (x->mtime_ns < y->mtime_ns);
}

/* Is the directory ours (the marker) or empty? Reads only: a foreign directory
 * is refused before anything is created in it. */
static pkv_status check_dir(const char *dir, bool *has_marker) {
    DIR *dh = opendir(dir);
    if (!dh) return pkv_err(PKV_ERR_IO, "KV disk tier: cannot read the directory %s: %s", dir, strerror(errno));
    *has_marker = false;
    char other[256] = "";
    int n_other = 0;
    struct dirent *de;
    while ((de = readdir(dh))) {
        const char *nm = de->d_name;
        if (!strcmp(nm, ".") || !strcmp(nm, "..")) continue;
        if (!strcmp(nm, DISK_MARKER)) *has_marker = true;
        else if (!strcmp(nm, DISK_LOCK)) continue; /* an open interrupted before the marker was written */
        else if (n_other++ == 0) snprintf(other, sizeof other, "%s", nm);
    }
    closedir(dh);
    pkv_status st = PKV_OK;
    if (!*has_marker && n_other > 0)
        return pkv_err(PKV_ERR_IO, "KV disk tier: %s is not a pagekv disk cache: it holds %d entr%s (e.g. %s) and no %s "
                       "marker; give an empty or new directory", dir, n_other, n_other == 1 ? "y" : "ies", other,
                       DISK_MARKER);
    if (*has_marker) {
        char path[4096], buf[128] = "";
        snprintf(path, sizeof path, "%s/" DISK_MARKER, dir);
        FILE *f = fopen(path, "rb");
        size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        if (f) fclose(f);
        buf[n] = 0;
        size_t hl = strlen(DISK_MARKER_HEAD);
        if (!f)
            st = pkv_err(PKV_ERR_IO, "KV disk tier: cannot read %s: %s", path, strerror(errno));
        else if (strncmp(buf, DISK_MARKER_HEAD, hl) != 0)
            st = pkv_err(PKV_ERR_IO, "KV disk tier: %s is not a pagekv marker; %s is not a pagekv disk cache", path, dir);
        else if (strtoul(buf + hl, NULL, 10) != DISK_VERSION)
            st = pkv_err(PKV_ERR_IO, "KV disk tier: %s holds page files of format %lu, this build reads format %u: give "
                         "another directory or empty this one", dir, strtoul(buf + hl, NULL, 10), DISK_VERSION);
    }
    return st;
}

static pkv_status write_marker(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/" DISK_MARKER, dir);
    pkv_wfile w;
    pkv_status st = pkv_wfile_open(&w, path);
    if (st) return pkv_err_prefix(st, "KV disk tier");
    fprintf(w.f, DISK_MARKER_HEAD "%u\n", DISK_VERSION);
    if ((st = pkv_wfile_commit(&w))) return pkv_err_prefix(st, "KV disk tier");
    return PKV_OK;
}

/* Index the page files; remove writes a crash left behind. Holds the lock. */
static pkv_status scan(pkv_kv_cache *c) {
    kv_disk *d = c->disk;
    DIR *dh = opendir(d->dir);
    if (!dh) return pkv_err(PKV_ERR_IO, "KV disk tier: cannot read the directory %s: %s", d->dir, strerror(errno));
    int dfd = dirfd(dh);
    int64_t n_tmp = 0;
    pkv_status st = PKV_OK;
    struct dirent *de;
    while ((de = readdir(dh)) && !st) {
        const char *nm = de->d_name;
        uint64_t key, lfp;
        struct stat sb;
        if (is_temp(nm)) {
            n_tmp += unlinkat(dfd, nm, 0) == 0;
            continue;
        }
        if (!parse_name(nm, &key, &lfp)) continue;
        if (fstatat(dfd, nm, &sb, AT_SYMLINK_NOFOLLOW) != 0) continue;
        if (!S_ISREG(sb.st_mode)) { /* planted: never followed, never written through */
            d->st.disk_rejected_files++;
            PKV_WARN("KV disk tier %s: %s is not a regular file (%s); skipped", d->dir, nm,
                     S_ISLNK(sb.st_mode) ? "a symbolic link" : "a directory, FIFO or device");
            continue;
        }
        int64_t ns = (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec;
        if (add(d, key, lfp, (uint64_t)sb.st_size, ns, false) < 0)
            st = pkv_err(PKV_ERR_NOMEM, "KV disk tier: out of memory indexing %s", d->dir);
    }
    closedir(dh);
    if (st) return st;
    /* LRU order: oldest modification first (a read hit touches its file) */
    size_t n = 0;
    scan_item *it = pkv_malloc((d->n_e ? d->n_e : 1) * sizeof *it);
    if (!it) return pkv_err(PKV_ERR_NOMEM, "KV disk tier: out of memory indexing %s", d->dir);
    for (size_t i = 0; i < d->n_e; i++) it[n++] = (scan_item){d->e[i].mtime_ns, (int32_t)i};
    qsort(it, n, sizeof *it, cmp_item);
    for (size_t i = 0; i < n; i++) lru_append(d, it[i].e);
    pkv_free(it);
    uint64_t nb = 64;
    while (nb < d->n_e) nb <<= 1;
    if ((st = rehash(d, nb))) return st;
    if (n_tmp) PKV_INFO("KV disk tier %s: removed %lld unfinished page write(s) of an earlier process", d->dir,
                        (long long)n_tmp);
    while (d->used > d->cap && d->head >= 0) {
        drop_entry(d, d->head);
        d->st.disk_evicted_files++;
    }
    return PKV_OK;
}

/* ------------------------------------------------------------ the writer */

static bool disk_off(kv_disk *d) {
    pthread_mutex_lock(&d->mu);
    bool off = d->off;
    pthread_mutex_unlock(&d->mu);
    return off;
}

static void *writer_main(void *arg) {
    pkv_kv_cache *c = arg;
    kv_disk *d = c->disk;
    char path[4096];
#ifdef __linux__
    /* The writer yields the CPU to the forward pass: on a machine whose cores the
     * compute threads fill, a writer of equal priority (hashing and copying 1.8 MB
     * per page) takes a core from them, and a thread pool that splits each kernel
     * evenly then waits for the thread that was descheduled (docs/BENCHMARKS.md,
     * the KV disk tier: warm in memory was slower than warm from disk). Nice 19
     * on Linux is per thread; it still runs whenever a core is idle, and an
     * eviction waiting for room in the queue idles the engine's cores. */
    (void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19);
#endif
    pthread_mutex_lock(&d->mu);
    for (;;) {
        while (!d->q_head && !d->quit) pthread_cond_wait(&d->cv, &d->mu);
        if (!d->q_head) break; /* quit with nothing left */
        disk_job *j = d->q_head;
        d->q_head = j->next;
        if (!d->q_head) d->q_tail = NULL;
        d->busy = true;
        bool skip = d->off;
        pthread_mutex_unlock(&d->mu);
        pkv_status st = PKV_OK;
        bool planted = false;
        double t0 = pkv_time_now();
        if (!skip) {
            pkv_kv_pimg_seal(&d->g, j->img, j->bytes);
            entry_path(d, j->key, j->lfp, path, sizeof path);
            pkv_wfile w;
            st = pkv_wfile_open(&w, path);
            struct stat lsb;
            /* something planted at this page's name (a symlink, a FIFO): that one
             * page is not kept on disk, the tier goes on */
            planted = st && lstat(path, &lsb) == 0 && !S_ISREG(lsb.st_mode);
            bool fail = pkv_kv_test_disk_fail_write;
            if (pkv_kv_test_disk_fail_after >= 0) { /* test hook: the disk fills after that many writes */
                pthread_mutex_lock(&d->mu);
                fail = fail || d->st.disk_written_pages >= (uint64_t)pkv_kv_test_disk_fail_after;
                pthread_mutex_unlock(&d->mu);
            }
            if (!st && fail) {
                pkv_wfile_abort(&w);
                st = pkv_err(PKV_ERR_IO, "%s: write failed: %s", path, strerror(ENOSPC));
            } else if (!st) {
                if (fwrite(j->img, 1, j->bytes, w.f) != j->bytes) {
                    int e = errno ? errno : EIO;
                    pkv_wfile_abort(&w);
                    st = pkv_err(PKV_ERR_IO, "%s: write failed: %s", path, strerror(e));
                } else {
                    st = pkv_wfile_commit(&w);
                }
            }
        }
        double dt = pkv_time_now() - t0;
        pthread_mutex_lock(&d->mu);
        d->q_bytes -= j->bytes;
        d->busy = false;
        if (skip || st) {
            if (planted) {
                d->st.disk_rejected_files++;
                PKV_WARN("KV disk tier %s: %s; this page is not written, the disk tier goes on", d->dir, pkv_errmsg());
            } else if (st && !d->off) {
                d->off = true;
                d->st.disk_enabled = false;
                d->st.disk_write_errors++;
                PKV_WARN("KV disk tier %s: %s; the disk tier is off from now on (serving goes on from memory)", d->dir,
                         pkv_errmsg());
            }
            drop_entry(d, j->e); /* nothing there (the temporary file is gone) */
        } else {
            d->e[j->e].ready = true;
            d->st.disk_written_pages++;
            d->st.disk_bytes_written += j->bytes;
            d->st.disk_write_seconds += dt;
        }
        pkv_free(j->img);
        pkv_free(j);
        pthread_cond_broadcast(&d->cv_idle);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

/* Wait until the writer has written everything queued. mu held. */
static void drain(kv_disk *d) {
    while (d->q_head || d->busy) pthread_cond_wait(&d->cv_idle, &d->mu);
}

static void disk_free(kv_disk *d) {
    pkv_kv_pimg_release(&d->g);
    pkv_free(d->dir);
    pkv_free(d->e);
    pkv_free(d->buckets);
    pkv_free(d->rbuf);
    pkv_free(d->sbuf);
    pkv_free(d->wtmp);
    pkv_free(d->rtmp);
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->cv);
    pthread_cond_destroy(&d->cv_idle);
    pkv_free(d);
}

pkv_status pkv_kv_disk_open(pkv_kv_cache *c, const pkv_kv_params *p) {
    if (!p->disk_dir) return PKV_OK;
    const char *dir = p->disk_dir;
    if (!*dir) return pkv_err(PKV_ERR_INVALID, "KV disk tier: the directory name is empty");
    if (strlen(dir) > 4000) return pkv_err(PKV_ERR_INVALID, "KV disk tier: the directory name is too long");
    {
        char what[4096 + 32];
        snprintf(what, sizeof what, "KV disk tier (%s)", dir);
        pkv_status us = pkv_kv_pimg_supported(c, what);
        if (us) return us;
    }
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return pkv_err(PKV_ERR_IO, "KV disk tier: cannot create the directory %s: %s", dir, strerror(errno));
    struct stat sb;
    if (stat(dir, &sb) != 0) return pkv_err(PKV_ERR_IO, "KV disk tier: %s: %s", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode)) return pkv_err(PKV_ERR_IO, "KV disk tier: %s is not a directory", dir);
    if (access(dir, R_OK | W_OK | X_OK) != 0)
        return pkv_err(PKV_ERR_IO, "KV disk tier: cannot read and write the directory %s: %s", dir, strerror(errno));
    bool marker = false;
    pkv_status st = check_dir(dir, &marker);
    if (st) return st;
    kv_disk *d = pkv_calloc(1, sizeof *d);
    if (!d) return pkv_err(PKV_ERR_NOMEM, "KV disk tier: out of memory");
    d->lock_fd = -1;
    d->free_e = d->head = d->tail = -1;
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv, NULL);
    pthread_cond_init(&d->cv_idle, NULL);
    d->cap = p->disk_bytes ? p->disk_bytes : DISK_DEFAULT_BYTES;
    c->disk = d;
    char path[4096];
    snprintf(path, sizeof path, "%s/" DISK_LOCK, dir);
    if (!(d->dir = pkv_strdup(dir))) {
        st = pkv_err(PKV_ERR_NOMEM, "KV disk tier: out of memory");
        goto fail;
    }
    d->lock_fd = pkv_file_open_lock(path);
    if (d->lock_fd < 0) {
        st = pkv_err_prefix(PKV_ERR_IO, "KV disk tier");
        goto fail;
    }
    if (flock(d->lock_fd, LOCK_EX | LOCK_NB) != 0) {
        st = errno == EWOULDBLOCK
                 ? pkv_err(PKV_ERR_IO, "KV disk tier: %s is in use by another process (it holds the lock on %s); give "
                           "each server its own directory", dir, path)
                 : pkv_err(PKV_ERR_IO, "KV disk tier: cannot lock %s: %s", path, strerror(errno));
        goto fail;
    }
    if (!marker && (st = write_marker(dir))) goto fail;
    if ((st = pkv_kv_pimg_init(&d->g, c, "KV disk tier"))) goto fail;
    d->queue_max = PKV_MAX((size_t)256 << 20, 4 * d->g.base_bytes);
    d->rbuf = pkv_malloc(d->g.max_bytes);
    if (d->g.state_bytes && !(d->sbuf = pkv_malloc(d->g.state_bytes))) {
        st = pkv_err(PKV_ERR_NOMEM, "KV disk tier: out of memory for a state buffer of %zu bytes", d->g.state_bytes);
        goto fail;
    }
    d->wtmp = pkv_malloc(d->g.tmp_bytes);
    d->rtmp = pkv_malloc(d->g.tmp_bytes);
    if (!d->rbuf || !d->wtmp || !d->rtmp) {
        st = pkv_err(PKV_ERR_NOMEM, "KV disk tier: out of memory for page buffers of %zu bytes", d->g.base_bytes);
        goto fail;
    }
    if ((st = scan(c))) goto fail;
    if (pthread_create(&d->th, NULL, writer_main, c) != 0) {
        st = pkv_err(PKV_ERR_NOMEM, "KV disk tier: cannot start its writer thread");
        goto fail;
    }
    d->th_on = true;
    d->st.disk_enabled = true;
    PKV_INFO("KV disk tier %s: %lld page files, %.1f of %.1f MiB (pages of this cache: %zu bytes each)", dir,
             (long long)d->n_files, (double)d->used / 1048576.0, (double)d->cap / 1048576.0, d->g.base_bytes);
    return PKV_OK;
fail:
    c->disk = NULL;
    if (d->lock_fd >= 0) close(d->lock_fd);
    disk_free(d);
    return st;
}

void pkv_kv_disk_close(pkv_kv_cache *c) {
    kv_disk *d = c ? c->disk : NULL;
    if (!d) return;
    pkv_kv_disk_flush(c); /* queues the cached pages not on disk and waits for the writer */
    pthread_mutex_lock(&d->mu);
    d->quit = true;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
    pthread_join(d->th, NULL);
    close(d->lock_fd); /* releases the lock */
    disk_free(d);
    c->disk = NULL;
}

/* ------------------------------------------------------------ write */

/* Queue page id's image for the writer. When the queue is full: wait for room
 * (wait, an eviction: the page is about to be reused) or leave it pending and
 * return false (a sequence free: the next one, an eviction or the cache's end
 * will queue it). */
static bool put(pkv_kv_cache *c, int32_t id, bool wait) {
    kv_disk *d = c->disk;
    kv_page *pg = &c->pages[id];
    if (!d || !pg->indexed || pg->on_disk) return true;
    const uint64_t lfp = c->layout.fingerprint;
    pthread_mutex_lock(&d->mu);
    const kv_pimg_plan plan = pkv_kv_pimg_plan(c, &d->g, id);
    const size_t fb = plan.bytes;
    bool skip = d->off || find(d, pg->key, lfp) >= 0 || fb > d->cap;
    pthread_mutex_unlock(&d->mu);
    if (skip) {
        pg->on_disk = true; /* there already (or queued), or never will be */
        return true;
    }
    if (!wait) {
        pthread_mutex_lock(&d->mu);
        bool full = d->q_bytes + fb > d->queue_max;
        pthread_mutex_unlock(&d->mu);
        if (full) return false;
    }
    double t0 = pkv_time_now();
    disk_job *j = pkv_malloc(sizeof *j);
    uint8_t *img = pkv_malloc(fb);
    if (!j || !img) {
        pkv_free(j);
        pkv_free(img);
        return true; /* not written now; tried again when it leaves memory */
    }
    pkv_status st = pkv_kv_pimg_encode(c, &d->g, id, plan, img, d->wtmp); /* the checksum is the writer's */
    if (st) {
        PKV_WARN("KV disk tier %s: reading page %d from the device failed (%s); not written", d->dir, id, pkv_errmsg());
        pkv_free(j);
        pkv_free(img);
        return true;
    }
    pthread_mutex_lock(&d->mu);
    while (!d->off && d->q_bytes + fb > d->queue_max) /* back-pressure: the writer is behind */
        pthread_cond_wait(&d->cv_idle, &d->mu);
    while (d->used + fb > d->cap) { /* room: the least recently used complete files go */
        int32_t victim = oldest_ready(d);
        if (victim < 0 && (d->q_head || d->busy)) { /* only queued ones: let the writer finish them */
            drain(d);
            continue;
        }
        if (victim < 0) break;
        drop_entry(d, victim); /* its page, if still in memory, is not written again: the cap chose */
        d->st.disk_evicted_files++;
    }
    int32_t e = d->off ? -1 : add(d, pg->key, lfp, fb, 0, true);
    if (e >= 0) {
        d->e[e].ready = false;
        j->img = img;
        j->bytes = fb;
        j->key = pg->key;
        j->lfp = lfp;
        j->e = e;
        j->next = NULL;
        if (d->q_tail) d->q_tail->next = j;
        else d->q_head = j;
        d->q_tail = j;
        d->q_bytes += fb;
        pthread_cond_signal(&d->cv);
    }
    d->st.disk_queue_seconds += pkv_time_now() - t0;
    pthread_mutex_unlock(&d->mu);
    if (e < 0) {
        pkv_free(j);
        pkv_free(img);
    }
    pg->on_disk = true;
    return true;
}

void pkv_kv_disk_put(pkv_kv_cache *c, int32_t id) { (void)put(c, id, true); }

pkv_status pkv_kv_disk_flush(pkv_kv_cache *c) {
    if (!c || !c->disk) return PKV_OK;
    c->tier_pending = 0;
    kv_disk *d = c->disk;
    for (int32_t q = c->lru_head; q >= 0 && !disk_off(d); q = c->pages[q].lru_next)
        if (!c->pages[q].on_disk) (void)put(c, q, true);
    pthread_mutex_lock(&d->mu);
    drain(d);
    pthread_mutex_unlock(&d->mu);
    return PKV_OK;
}

bool pkv_kv_disk_queue(pkv_kv_cache *c) {
    if (!c || !c->disk) return true;
    for (int32_t q = c->lru_head; q >= 0 && !disk_off(c->disk); q = c->pages[q].lru_next)
        if (!c->pages[q].on_disk && !put(c, q, false)) return false; /* the queue is full: the rest at the next call */
    return true;
}

/* ------------------------------------------------------------ spill */

/* The leading full pages of s that are in the prefix index (the pages a spill can
 * put on disk and a prefix match can find again); ids into out (may be NULL) when
 * it has room for them. */
static int64_t spill_pages(pkv_kv_cache *c, kv_seq *s, int32_t **out) {
    int64_t n = PKV_MIN(s->pub_n, s->n_tokens / c->page_size);
    *out = NULL;
    if (n <= 0) return 0;
    int32_t *ids = pkv_malloc((size_t)n * sizeof *ids);
    if (!ids) return 0;
    pkv_kv_seq_flatten(s, n, ids);
    int64_t k = 0;
    while (k < n && ids[k] >= 0 && c->pages[ids[k]].indexed) k++;
    *out = ids;
    return k;
}

int64_t pkv_kv_disk_spill_plan(pkv_kv_cache *c, int32_t seq, int64_t *n_unwritten) {
    *n_unwritten = 0;
    if (!c || !c->disk || disk_off(c->disk)) return 0;
    kv_seq *s = pkv_kv_seq_get(c, seq, "spill");
    if (!s || s->swapped || !s->fp) return 0;
    pkv_kv_seq_publish(c, s);
    int32_t *ids;
    int64_t n = spill_pages(c, s, &ids);
    for (int64_t i = 0; i < n; i++) *n_unwritten += !c->pages[ids[i]].on_disk;
    pkv_free(ids);
    return n;
}

pkv_status pkv_kv_disk_spill(pkv_kv_cache *c, int32_t seq, int64_t *n_pages, int64_t *n_written, uint64_t *bytes) {
    *n_pages = *n_written = 0;
    *bytes = 0;
    kv_disk *d = c ? c->disk : NULL;
    if (!d) return pkv_err(PKV_ERR_INVALID, "spill of sequence %d: the cache has no disk tier", seq);
    kv_seq *s = pkv_kv_seq_resident(c, seq, "spill");
    if (!s) return PKV_ERR_INVALID;
    if (!s->fp) return pkv_err(PKV_ERR_INVALID, "spill of sequence %d: it has no fingerprint (its pages are not "
                               "published, so nothing could find them again)", seq);
    if (disk_off(d))
        return pkv_err(PKV_ERR_IO, "spill of sequence %d: the disk tier %s is off (a write failed)", seq, d->dir);
    pkv_kv_seq_publish(c, s);
    int32_t *ids;
    int64_t n = spill_pages(c, s, &ids);
    if (n == 0) {
        pkv_free(ids);
        return PKV_OK;
    }
    bool *mine = pkv_calloc((size_t)n, sizeof *mine);
    if (!mine) {
        pkv_free(ids);
        return pkv_err(PKV_ERR_NOMEM, "spill of sequence %d: out of memory", seq);
    }
    for (int64_t i = 0; i < n; i++) {
        kv_page *pg = &c->pages[ids[i]];
        if (pg->on_disk) continue;
        mine[i] = true;
        (void)put(c, ids[i], true);
    }
    /* Wait for the writer: the pages must be files before their device pages can
     * be reused, or the resume would find them neither in memory nor on disk. */
    const uint64_t lfp = c->layout.fingerprint;
    pthread_mutex_lock(&d->mu);
    drain(d);
    int64_t k = 0, w = 0;
    uint64_t wb = 0; /* the files' bytes: a page with a recurrent state has the larger file */
    for (; k < n; k++) {
        int32_t e = find(d, c->pages[ids[k]].key, lfp);
        if (e < 0 || !d->e[e].ready) break;
        w += mine[k];
        wb += mine[k] ? d->e[e].bytes : 0;
    }
    bool off = d->off;
    pthread_mutex_unlock(&d->mu);
    pkv_free(ids);
    pkv_free(mine);
    *n_pages = k;
    *n_written = w;
    *bytes = wb;
    if (k < n && off)
        return pkv_err(PKV_ERR_IO, "spill of sequence %d: a page write failed, the disk tier %s is off (see the log); "
                       "%lld of its %lld pages are on disk", seq, d->dir, (long long)k, (long long)n);
    return PKV_OK;
}

bool pkv_kv_disk_on(const pkv_kv_cache *c) { return c && c->disk && !disk_off(c->disk); }

/* ------------------------------------------------------------ read */

/* mu held */
static void reject(pkv_kv_cache *c, int32_t e, const char *path, const char *why) {
    c->disk->st.disk_rejected_files++;
    PKV_WARN("KV disk tier: %s rejected (%s); ignored and removed", path, why);
    drop(c, e);
}

/* pkv_kv_disk_match's pages; *st_page: the deepest one loaded whose file had a
 * state at its end (then in d->sbuf, its position *st_pos), else -1. */
static int64_t match_pages(pkv_kv_cache *c, kv_seq *s, const int32_t *tokens, const int32_t *pos, int64_t m,
                           int64_t n_full, const uint64_t *keys, int32_t *st_page, int64_t *st_pos) {
    kv_disk *d = c->disk;
    const int ps = c->page_size;
    const uint64_t lfp = c->layout.fingerprint;
    uint64_t key2 = pkv_kv_fp_seed2(s->fp);
    for (int64_t i = 0; i < m; i++) key2 = pkv_kv_page_key2(c, key2, tokens + i * ps, pos + i * ps);
    char path[4096];
    for (int64_t dep = m; dep < n_full; dep++) {
        const int32_t *tk = tokens + dep * ps, *pp = pos + dep * ps;
        key2 = pkv_kv_page_key2(c, key2, tk, pp);
        pthread_mutex_lock(&d->mu);
        int32_t e = d->off ? -1 : find(d, keys[dep], lfp);
        if (e < 0 || !d->e[e].ready) { /* none, or still in the writer's queue */
            d->st.disk_miss_pages++;
            pthread_mutex_unlock(&d->mu);
            return dep;
        }
        pthread_mutex_unlock(&d->mu); /* the writer only adds entries and completes queued ones */
        if (pkv_kv_pool_available(c) < 1) return dep;
        entry_path(d, keys[dep], lfp, path, sizeof path);
        double t0 = pkv_time_now();
        int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC), open_err = fd < 0 ? errno : 0;
        struct stat sb;
        size_t got = 0, fb = 0; /* the file's size: with or without window and state sections */
        if (fd >= 0 && fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && (uint64_t)sb.st_size >= d->g.base_bytes &&
            (uint64_t)sb.st_size <= d->g.max_bytes)
            fb = (size_t)sb.st_size;
        while (got < fb) {
            ssize_t r = read(fd, d->rbuf + got, fb - got);
            if (r <= 0) break;
            got += (size_t)r;
        }
        if (fd >= 0) close(fd);
        pthread_mutex_lock(&d->mu);
        d->st.disk_read_seconds += pkv_time_now() - t0;
        d->st.disk_bytes_read += got;
        pthread_mutex_unlock(&d->mu);
        const uint8_t *b = d->rbuf;
        const char *why = NULL;
        if (fd < 0) why = "cannot open it";
        else if (!fb || got != fb) why = "wrong size or short read";
        else why = pkv_kv_pimg_check(c, &d->g, b, fb, s->fp, keys[dep], dep ? keys[dep - 1] : pkv_kv_fp_seed(s->fp),
                                     key2, tk, pp);
        if (why) {
            pthread_mutex_lock(&d->mu);
            if (fd < 0 && open_err == ENOENT) { /* removed behind our back: a miss */
                drop(c, e);
                d->st.disk_miss_pages++;
            } else {
                reject(c, e, path, why);
            }
            pthread_mutex_unlock(&d->mu);
            return dep;
        }
        pthread_mutex_lock(&d->mu);
        lru_unlink(d, e); /* most recently used, here and for the next process */
        lru_append(d, e);
        d->st.disk_hit_pages++;
        pthread_mutex_unlock(&d->mu);
        (void)utimensat(AT_FDCWD, path, NULL, 0);
        int32_t id; /* e is not used below: taking a page may evict, write and drop files */
        pkv_status st = pkv_kv_pimg_install(c, &d->g, s, b, dep, keys, key2, d->rtmp, &id);
        if (st) {
            PKV_WARN("KV disk tier %s: writing a loaded page to the device failed (%s)", d->dir, pkv_errmsg());
            return dep;
        }
        c->pages[id].on_disk = true;
        c->pages[id].on_remote = false;
        /* the state at the page's end, kept for the deepest such page (one at
         * another position is not this chain's boundary and is not used) */
        const uint8_t *state = pkv_kv_pimg_state(&d->g, b, fb, (dep + 1) * ps);
        if (state) {
            memcpy(d->sbuf, state - 8, d->g.state_bytes);
            *st_page = id;
            *st_pos = (dep + 1) * ps;
        }
    }
    return n_full;
}

int64_t pkv_kv_disk_match(pkv_kv_cache *c, kv_seq *s, const int32_t *tokens, const int32_t *pos, int64_t m,
                          int64_t n_full, const uint64_t *keys) {
    kv_disk *d = c->disk;
    if (!d || !s->fp) return m;
    int32_t st_page = -1;
    int64_t st_pos = 0;
    m = match_pages(c, s, tokens, pos, m, n_full, keys, &st_page, &st_pos);
    /* A hit needs the state at its end (the memory kinds narrow the match to the
     * deepest page offering one): only the deepest disk page's is installed. */
    if (st_page >= 0) {
        pkv_status st = pkv_kv_state_page_offer(c, st_page, d->sbuf + 8, st_pos);
        if (st) PKV_WARN("KV disk tier %s: installing a page's recurrent state failed (%s); matched without it", d->dir,
                         pkv_errmsg());
    }
    return m;
}

void pkv_kv_disk_stats(const pkv_kv_cache *c, pkv_kv_stats *out) {
    kv_disk *d = c->disk;
    if (!d) return;
    pthread_mutex_lock(&d->mu);
    out->disk_enabled = d->st.disk_enabled;
    out->disk_hit_pages = d->st.disk_hit_pages;
    out->disk_miss_pages = d->st.disk_miss_pages;
    out->disk_rejected_files = d->st.disk_rejected_files;
    out->disk_written_pages = d->st.disk_written_pages;
    out->disk_write_errors = d->st.disk_write_errors;
    out->disk_evicted_files = d->st.disk_evicted_files;
    out->disk_bytes_read = d->st.disk_bytes_read;
    out->disk_bytes_written = d->st.disk_bytes_written;
    out->disk_read_seconds = d->st.disk_read_seconds;
    out->disk_write_seconds = d->st.disk_write_seconds;
    out->disk_files = d->n_files;
    out->disk_bytes_used = d->used;
    out->disk_bytes_max = d->cap;
    out->disk_queue_seconds = d->st.disk_queue_seconds;
    pthread_mutex_unlock(&d->mu);
}
