// labels: kv
/* The disk tier (kv-disk.c): full prefix pages written to a directory come back
 * bit-identical into another cache (other devices for the shards) after the
 * first one is gone; the lock refuses a second cache on one directory; a foreign,
 * unusable or other-format directory is a clear error; a write failure (a full
 * disk) turns the tier off and everything else goes on; the size cap evicts the
 * least recently used files; pages evicted from the device LRU are written; and
 * every damaged file (truncated at every byte of its header and in its payload,
 * any single flipped byte, a file from another model or layout under a page's
 * name, a crash's temporary file) is rejected, counted and never used. */
#include "kv-testlib.h"

#include <sys/stat.h>

#define PS 4
#define NT 14 /* 3 full pages + 2 tokens */

static char logbuf[8192];
static void log_fn(pkv_log_level lv, const char *msg, void *user) {
    (void)lv;
    (void)user;
    size_t n = strlen(logbuf);
    snprintf(logbuf + n, sizeof logbuf - n, "%s\n", msg);
}

typedef struct snap {
    float kv[2][2][NT * 32];
} snap;

static int32_t toks[NT];

static void fill_seq(pkv_kv_cache *c, int32_t seq, uint64_t seed) { kt_fill(c, seq, NT, toks, seed); }

static void take(pkv_kv_cache *c, int32_t seq, snap *s) {
    memset(s, 0, sizeof *s);
    for (int il = 0; il < 2; il++)
        for (int v = 0; v < 2; v++) CHECK_OK(kt_read_seq(c, seq, il, v, s->kv[il][v]));
}

static pkv_kv_cache *make(kt_env *e, const char *dir, uint64_t cap, int64_t n_pages) {
    pkv_kv_params p = kt_params(e, PS, n_pages, 0);
    p.disk_dir = dir;
    p.disk_bytes = cap;
    return pkv_kv_cache_create(p);
}

static void rm_rf(const char *dir) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

static size_t read_file(const char *path, uint8_t *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(buf, 1, cap, f) : 0;
    if (f) fclose(f);
    return n;
}

static void write_file(const char *path, const uint8_t *buf, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, n, f) != n) TH_FAIL("cannot write %s", path);
    if (f) fclose(f);
}

/* The file name of page i of the chain of producer fp over toks. */
static void page_name(const pkv_kv_cache *c, const char *dir, uint64_t fp, int i, char *out, size_t n) {
    int32_t pos[NT];
    for (int t = 0; t < NT; t++) pos[t] = t;
    uint64_t k = pkv_kv_fp_seed(fp);
    for (int j = 0; j <= i; j++) k = pkv_kv_page_key(c, k, toks + j * PS, pos + j * PS);
    snprintf(out, n, "%s/%016llx-%016llx.kvp", dir, (unsigned long long)k,
             (unsigned long long)pkv_kv_layout_fingerprint(pkv_kv_cache_layout(c)));
}

/* Open a cache on dir, match toks with producer fp; the tokens matched. */
static int64_t match_once(kt_env *e, const char *dir, uint64_t fp, pkv_kv_stats *st) {
    pkv_kv_cache *c = make(e, dir, 0, 12);
    if (!c) {
        TH_FAIL("%s", pkv_errmsg());
        return -1;
    }
    int32_t s;
    int64_t m = -1;
    CHECK_OK(pkv_kv_seq_create(c, fp, &s));
    CHECK_OK(pkv_kv_prefix_match(c, s, toks, NULL, NT, &m));
    pkv_kv_stats_get(c, st);
    pkv_kv_cache_free(c);
    return m;
}

int main(void) {
    kt_env e, e2;
    if (!kt_open_twins(&e, &e2)) return th_skip("no cpu devices");
    pkv_log_set(log_fn, NULL, PKV_LOG_INFO);
    uint64_t seed = 5;
    for (int i = 0; i < NT; i++) toks[i] = (int32_t)(th_rand(&seed) % 50);
    char dir[512];
    snprintf(dir, sizeof dir, "%s", th_tmp("kvdisk"));
    rm_rf(dir);

    /* write: freeing the sequence writes its 3 full pages */
    static snap s0, s1;
    pkv_kv_stats st;
    char p0[1024], p1[1024];
    size_t fsize = 0;
    {
        pkv_kv_cache *c = make(&e, dir, 0, 12);
        REQUIRE(c != NULL);
        int32_t s;
        CHECK_OK(pkv_kv_seq_create(c, 7, &s));
        fill_seq(c, s, 11);
        take(c, s, &s0);
        CHECK_OK(pkv_kv_seq_free(c, s));
        CHECK_OK(pkv_kv_disk_flush(c)); /* waits for the writer thread */
        pkv_kv_stats_get(c, &st);
        CHECK(st.disk_enabled);
        CHECK_INT(st.disk_written_pages, 3);
        CHECK_INT(st.disk_files, 3);
        CHECK(st.disk_bytes_written == st.disk_bytes_used && st.disk_bytes_used > 0);
        fsize = (size_t)(st.disk_bytes_used / 3);
        page_name(c, dir, 7, 0, p0, sizeof p0);
        page_name(c, dir, 7, 1, p1, sizeof p1);
        struct stat sb;
        CHECK(stat(p0, &sb) == 0 && (size_t)sb.st_size == fsize);

        /* a second cache on the same directory is refused while this one lives */
        CHECK(make(&e, dir, 0, 12) == NULL);
        CHECK_MSG("in use by another process");
        pkv_kv_cache_free(c);
    }

    /* read: a new cache (shards on the other devices) gets the pages back, bit for bit */
    {
        pkv_kv_cache *c = make(&e2, dir, 0, 12);
        REQUIRE(c != NULL);
        int32_t s;
        int64_t m = 0;
        CHECK_OK(pkv_kv_seq_create(c, 7, &s));
        CHECK_OK(pkv_kv_prefix_match(c, s, toks, NULL, NT, &m));
        CHECK_INT(m, 12);
        pkv_kv_stats_get(c, &st);
        CHECK_INT(st.disk_hit_pages, 3);
        CHECK_INT(st.disk_rejected_files, 0);
        CHECK_INT(st.disk_bytes_read, 3 * fsize);
        take(c, s, &s1);
        for (int il = 0; il < 2; il++)
            for (int v = 0; v < 2; v++)
                CHECK_MEM(s1.kv[il][v], s0.kv[il][v], (size_t)12 * kt_dim(c, il, v) * sizeof(float));
        int32_t tk[NT], ps[NT];
        CHECK_OK(pkv_kv_seq_tokens(c, s, 0, 12, tk, ps));
        CHECK_MEM(tk, toks, 12 * sizeof(int32_t));
        for (int t = 0; t < 12; t++) CHECK_INT(ps[t], t);
        /* the loaded pages are indexed: the next match is served from memory */
        int32_t s2;
        CHECK_OK(pkv_kv_seq_create(c, 7, &s2));
        CHECK_OK(pkv_kv_prefix_match(c, s2, toks, NULL, NT, &m));
        CHECK_INT(m, 12);
        pkv_kv_stats_get(c, &st);
        CHECK_INT(st.disk_hit_pages, 3);
        CHECK_INT(st.prefix_hit_pages, 3);
        CHECK_INT(st.disk_written_pages, 0); /* already on disk: never written twice */
        CHECK_OK(pkv_kv_seq_free(c, s));
        CHECK_OK(pkv_kv_seq_free(c, s2));
        CHECK_OK(pkv_kv_disk_flush(c));
        pkv_kv_stats_get(c, &st);
        CHECK_INT(st.disk_written_pages, 0);
        /* another producer finds nothing (its chain has other names) */
        CHECK_OK(pkv_kv_seq_create(c, 8, &s));
        CHECK_OK(pkv_kv_prefix_match(c, s, toks, NULL, NT, &m));
        CHECK_INT(m, 0);
        pkv_kv_cache_free(c);
    }

    /* damaged files: each is rejected, counted, removed, never used */
    static uint8_t good[1 << 16], bad[1 << 16];
    REQUIRE(read_file(p0, good, sizeof good) == fsize);
    const size_t header = 72 + 8 * PS;
    for (size_t len = 0; len <= header; len++) { /* truncated at every byte of its header */
        write_file(p0, good, len);
        CHECK_INT(match_once(&e, dir, 7, &st), 0);
        CHECK_INT(st.disk_rejected_files, 1);
        CHECK(access(p0, F_OK) != 0);
    }
    write_file(p0, good, fsize - 1); /* one byte short of the checksum's end */
    CHECK_INT(match_once(&e, dir, 7, &st), 0);
    CHECK_INT(st.disk_rejected_files, 1);
    for (size_t i = 0; i < fsize; i++) { /* one flipped byte anywhere */
        memcpy(bad, good, fsize);
        bad[i] ^= 0x10;
        write_file(p0, bad, fsize);
        int64_t m = match_once(&e, dir, 7, &st);
        if (m != 0 || st.disk_rejected_files != 1) TH_FAIL("byte %zu flipped: matched %lld, rejected %llu", i,
                                                           (long long)m, (unsigned long long)st.disk_rejected_files);
        th_checks++;
    }
    write_file(p0, good, fsize); /* intact again */
    CHECK_INT(match_once(&e, dir, 7, &st), 12);
    CHECK_INT(st.disk_rejected_files, 0);
    { /* a file of another model under this model's page name */
        pkv_kv_cache *c = make(&e, dir, 0, 12);
        REQUIRE(c != NULL);
        char q0[1024];
        page_name(c, dir, 8, 0, q0, sizeof q0);
        pkv_kv_cache_free(c);
        write_file(q0, good, fsize);
        CHECK_INT(match_once(&e, dir, 8, &st), 0);
        CHECK_INT(st.disk_rejected_files, 1);
        CHECK(access(q0, F_OK) != 0);
        /* page 1's file under page 0's name: another chain, other tokens */
        static uint8_t g1[1 << 16];
        REQUIRE(read_file(p1, g1, sizeof g1) == fsize);
        write_file(p0, g1, fsize);
        CHECK_INT(match_once(&e, dir, 7, &st), 0);
        CHECK_INT(st.disk_rejected_files, 1);
        write_file(p0, good, fsize);
    }
    { /* a crash's temporary file is removed at open; a file of another layout is kept, never read */
        char tmp[1100], other[1100];
        snprintf(tmp, sizeof tmp, "%s.tmp-abc123", p0);
        write_file(tmp, good, 10);
        snprintf(other, sizeof other, "%s/%016llx-%016llx.kvp", dir, 1ull, 2ull);
        write_file(other, good, fsize);
        logbuf[0] = 0;
        CHECK_INT(match_once(&e, dir, 7, &st), 12);
        CHECK(access(tmp, F_OK) != 0);
        CHECK(strstr(logbuf, "unfinished page write") != NULL);
        CHECK(access(other, F_OK) == 0);
        CHECK_INT(st.disk_files, 4);
        unlink(other);
    }

    { /* planted symlinks (issue 50.10): a page file's name or the lock; never
       * followed, the one file is skipped (logged, counted), the tier goes on */
        char d3[600], victim[600], pl[1024], lk[700];
        snprintf(d3, sizeof d3, "%s-planted", dir);
        snprintf(victim, sizeof victim, "%s", th_tmp("kvdisk-victim"));
        rm_rf(d3);
        write_file(victim, (const uint8_t *)"precious", 8);
        pkv_kv_cache *c = make(&e, d3, 0, 12);
        REQUIRE(c != NULL);
        page_name(c, d3, 9, 1, pl, sizeof pl);
        CHECK(symlink(victim, pl) == 0);
        logbuf[0] = 0;
        int32_t s;
        CHECK_OK(pkv_kv_seq_create(c, 9, &s));
        fill_seq(c, s, 11);
        CHECK_OK(pkv_kv_seq_free(c, s));
        CHECK_OK(pkv_kv_disk_flush(c));
        pkv_kv_stats_get(c, &st);
        CHECK(st.disk_enabled);
        CHECK_INT(st.disk_write_errors, 0);
        CHECK_INT(st.disk_written_pages, 2);
        CHECK_INT(st.disk_rejected_files, 1);
        CHECK(strstr(logbuf, "is a symbolic link") != NULL && strstr(logbuf, "the disk tier goes on") != NULL);
        /* the tier still writes: another producer's three pages */
        CHECK_OK(pkv_kv_seq_create(c, 10, &s));
        fill_seq(c, s, 12);
        CHECK_OK(pkv_kv_seq_free(c, s));
        CHECK_OK(pkv_kv_disk_flush(c));
        pkv_kv_stats_get(c, &st);
        CHECK(st.disk_enabled);
        CHECK_INT(st.disk_written_pages, 5);
        pkv_kv_cache_free(c);
        uint8_t vb[16] = {0};
        CHECK_INT(read_file(victim, vb, sizeof vb), 8);
        CHECK_MEM(vb, "precious", 8);
        /* one planted when the cache opens: skipped and counted, the rest indexed */
        unlink(pl);
        CHECK(symlink(victim, pl) == 0);
        logbuf[0] = 0;
        CHECK_INT(match_once(&e, d3, 9, &st), 4); /* page 0 from disk, page 1 is the symlink */
        CHECK(st.disk_enabled);
        CHECK_INT(st.disk_rejected_files, 1);
        CHECK(strstr(logbuf, "not a regular file (a symbolic link); skipped") != NULL);
        CHECK_INT(read_file(victim, vb, sizeof vb), 8);
        CHECK_MEM(vb, "precious", 8);
        /* a symlinked lock: refused, saying so */
        snprintf(lk, sizeof lk, "%s/lock", d3);
        unlink(lk);
        CHECK(symlink(victim, lk) == 0);
        CHECK(make(&e, d3, 0, 12) == NULL);
        CHECK_MSG("lock file");
        CHECK_MSG("is a symbolic link, not a regular file: refused");
        CHECK_INT(read_file(victim, vb, sizeof vb), 8);
        unlink(lk);
        rm_rf(d3);
        unlink(victim);
    }

    /* size cap: room for two files keeps the two most recently used */
    {
        char d2[600];
        snprintf(d2, sizeof d2, "%s-cap", dir);
        rm_rf(d2);
        pkv_kv_cache *c = make(&e, d2, 2 * fsize + 1, 12);
        REQUIRE(c != NULL);
        int32_t s;
        CHECK_OK(pkv_kv_seq_create(c, 7, &s));
        fill_seq(c, s, 11);
        CHECK_OK(pkv_kv_seq_free(c, s));
        CHECK_OK(pkv_kv_disk_flush(c)); /* waits for the writer thread */
        pkv_kv_stats_get(c, &st);
        CHECK_INT(st.disk_written_pages, 3);
        CHECK_INT(st.disk_files, 2);
        CHECK_INT(st.disk_evicted_files, 1);
        CHECK(st.disk_bytes_used <= st.disk_bytes_max);
        pkv_kv_cache_free(c);
        CHECK_INT(match_once(&e, d2, 7, &st), 0); /* page 0 went first: the chain starts there */
        CHECK_INT(st.disk_miss_pages, 1);
        rm_rf(d2);
    }

    /* the device LRU's evictions are written (no sequence free flushed them) */
    {
        char d2[600];
        snprintf(d2, sizeof d2, "%s-evict", dir);
        rm_rf(d2);
        pkv_kv_cache *c = make(&e, d2, 0, 4);
        REQUIRE(c != NULL);
        int32_t s, s2;
        CHECK_OK(pkv_kv_seq_create(c, 7, &s));
        fill_seq(c, s, 11);
        int32_t one = 3, row; /* the next step publishes what the last one wrote */
        CHECK_OK(pkv_kv_append(c, s, 1, &one, NULL, &row));
        CHECK_OK(pkv_kv_truncate(c, s, 0)); /* 3 published pages become cached */
        pkv_kv_stats_get(c, &st);
        CHECK_INT(st.disk_written_pages, 0);
        CHECK_INT(st.pages_cached, 3);
        CHECK_OK(pkv_kv_seq_create(c, 9, &s2));
        int32_t rows[16], t2[16] = {0};
        CHECK_OK(pkv_kv_append(c, s2, 16, t2, NULL, rows)); /* 4 pages: evicts all 3 */
        CHECK_OK(pkv_kv_disk_flush(c));
        pkv_kv_stats_get(c, &st);
        CHECK_INT(st.evicted_pages, 3);
        CHECK_INT(st.disk_written_pages, 3);
        pkv_kv_cache_free(c);
        CHECK_INT(match_once(&e, d2, 7, &st), 12);
        rm_rf(d2);
    }

    /* a write failure (full disk): the tier turns off, the log and stats say so, the cache goes on */
    {
        char d2[600];
        snprintf(d2, sizeof d2, "%s-full", dir);
        rm_rf(d2);
        pkv_kv_cache *c = make(&e, d2, 0, 12);
        REQUIRE(c != NULL);
        pkv_kv_test_disk_fail_write = true;
        logbuf[0] = 0;
        int32_t s;
        CHECK_OK(pkv_kv_seq_create(c, 7, &s));
        fill_seq(c, s, 11);
        CHECK_OK(pkv_kv_seq_free(c, s));
        CHECK_OK(pkv_kv_disk_flush(c));
        pkv_kv_test_disk_fail_write = false;
        pkv_kv_stats_get(c, &st);
        CHECK(!st.disk_enabled);
        CHECK_INT(st.disk_write_errors, 1);
        CHECK_INT(st.disk_written_pages, 0);
        CHECK_INT(st.disk_files, 0);
        CHECK(strstr(logbuf, "No space left on device") != NULL);
        CHECK(strstr(logbuf, "off from now on") != NULL);
        int64_t m = 0;
        CHECK_OK(pkv_kv_seq_create(c, 7, &s)); /* memory still serves the prefix */
        CHECK_OK(pkv_kv_prefix_match(c, s, toks, NULL, NT, &m));
        CHECK_INT(m, 12);
        CHECK_OK(pkv_kv_seq_free(c, s));
        pkv_kv_cache_free(c);
        rm_rf(d2);
    }

    /* directories that cannot be used: clear errors, nothing created in them */
    {
        char d2[600], f2[700];
        snprintf(d2, sizeof d2, "%s-foreign", dir);
        rm_rf(d2);
        CHECK(mkdir(d2, 0755) == 0);
        snprintf(f2, sizeof f2, "%s/notes.txt", d2);
        write_file(f2, (const uint8_t *)"hi", 2);
        CHECK(make(&e, d2, 0, 12) == NULL);
        CHECK_MSG("is not a pagekv disk cache");
        CHECK_MSG("notes.txt");
        snprintf(f2, sizeof f2, "%s/lock", d2);
        CHECK(access(f2, F_OK) != 0);
        rm_rf(d2);
        CHECK(mkdir(d2, 0755) == 0); /* a marker of another format */
        snprintf(f2, sizeof f2, "%s/PAGEKV-DISK", d2);
        write_file(f2, (const uint8_t *)"pagekv disk KV cache, page file format 9\n", 41);
        CHECK(make(&e, d2, 0, 12) == NULL);
        CHECK_MSG("format 9, this build reads format 1");
        rm_rf(d2);
        write_file(d2, (const uint8_t *)"x", 1); /* a regular file */
        CHECK(make(&e, d2, 0, 12) == NULL);
        CHECK_MSG("is not a directory");
        unlink(d2);
        CHECK(mkdir(d2, 0555) == 0); /* read-only */
        if (geteuid() != 0) {
            CHECK(make(&e, d2, 0, 12) == NULL);
            CHECK_MSG("cannot read and write the directory");
        } else { /* root writes anywhere the mode allows nobody: make it immutable instead (ext4, xfs...) */
            char cmd[1100];
            snprintf(cmd, sizeof cmd, "chattr +i '%s' 2>/dev/null", d2);
            if (system(cmd) == 0) {
                CHECK(make(&e, d2, 0, 12) == NULL);
                CHECK_MSG("cannot read and write the directory");
                snprintf(cmd, sizeof cmd, "chattr -i '%s'", d2);
                if (system(cmd) != 0) TH_FAIL("could not make %s mutable again", d2);
            } else {
                fprintf(stderr, "note: running as root where chattr +i does not work, a read-only directory is "
                                "writable; the write-failure case above stands for it\n");
            }
        }
        rmdir(d2);
        snprintf(f2, sizeof f2, "%s/a/b", d2); /* the parent does not exist */
        CHECK(make(&e, f2, 0, 12) == NULL);
        CHECK_MSG("cannot create the directory");
    }

    /* layouts the disk tier does not serve: refused, naming the layer */
    {
        kt_env w = e;
        w.layers[1].chunk = 8;
        pkv_kv_params p = kt_params(&w, PS, 12, 0);
        p.disk_dir = dir;
        CHECK(pkv_kv_cache_create(p) == NULL);
        CHECK_MSG("layer 1 is a chunked-attention layer");
    }

    rm_rf(dir);
    pkv_log_set(NULL, NULL, PKV_LOG_INFO);
    kt_close(&e2);
    kt_close(&e);
    return th_done();
}
