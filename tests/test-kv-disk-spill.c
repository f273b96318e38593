// labels: kv
/* Preemption that spills to the disk tier (pkv_engine_params.spill, issue 31 item
 * 3): an engine whose host swap pool holds one page runs a load its device pool
 * holds a fraction of, with a disk tier under its cache. Preempted sequences
 * cannot be swapped, so their full pages are spilled to disk and the sequences
 * dropped; each comes back by a prefix match that loads the pages from disk. Every
 * request's tokens, logprobs and top alternatives must equal the same request
 * served alone (a fresh engine without a disk tier), bit for bit, and the spill
 * counters must show pages written and read back. Faults: every page write
 * failing (a full disk from the start) and the disk filling after a few pages
 * (mid-spill) turn the tier off; the sequence is then recomputed, the output is
 * still identical and the failure counted. PKV_SPILL_AUTO (whatever it picks) and
 * PKV_SPILL_NEVER give identical output too. Then a qwen35 hybrid spills always:
 * its page files of two sizes (some carry the recurrent state offered at their
 * end), the spill's bytes those of the files, every response still its own alone. */
#include "base/base.h"
#include "engine-testlib.h"

#include <dirent.h>
#include <sys/stat.h>
#include "kv/kv-impl.h"

static pkv_model *g_m;
static bool g_hybrid;           /* g_m has recurrent layers */
static char logbuf[16384];

static void log_fn(pkv_log_level lv, const char *msg, void *user) {
    (void)lv;
    (void)user;
    size_t n = strlen(logbuf);
    snprintf(logbuf + n, sizeof logbuf - n, "%s\n", msg);
}

static void rm_rf(const char *dir) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

enum { NP = 10 };
/* The smallest and largest page file in dir. */
static void file_sizes(const char *dir, uint64_t *lo, uint64_t *hi) {
    DIR *dh = opendir(dir);
    REQUIRE_VOID(dh != NULL);
    struct dirent *de;
    char path[1024];
    while ((de = readdir(dh))) {
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        if (!strstr(de->d_name, ".kvp") || stat(path, &sb)) continue;
        if ((uint64_t)sb.st_size < *lo) *lo = (uint64_t)sb.st_size;
        if ((uint64_t)sb.st_size > *hi) *hi = (uint64_t)sb.st_size;
    }
    closedir(dh);
}

static int32_t prompt[NP][40];
static pkv_request_params rp[NP];
static et_rec alone[NP], got[NP];

typedef struct cfg {
    const char *name;
    pkv_spill_mode mode;
    bool fail_all;     /* every page write fails (ENOSPC from the first) */
    int64_t fail_after; /* -1, or writes fail after that many pages (the disk fills mid-spill) */
} cfg;

static void run(const cfg *c) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s", th_tmp("spill"));
    rm_rf(dir);
    logbuf[0] = 0;
    pkv_kv_test_disk_fail_write = c->fail_all;
    pkv_kv_test_disk_fail_after = c->fail_after;
    /* 24 pages of 4 tokens: the longest request needs 20 alone, all together ~170 */
    pkv_engine_params ep = et_params(128, 4, 24);
    ep.cache.host_pages = 1; /* the host pool is (nearly) always full: swap fails */
    ep.cache.disk_dir = dir;
    ep.max_batch_tokens = 32;
    ep.spill = c->mode;
    pkv_engine *e = pkv_engine_create(g_m, ep);
    REQUIRE_VOID(e);
    for (int i = 0; i < NP; i++) {
        memset(&got[i], 0, sizeof got[i]);
        pkv_request_params r = rp[i];
        r.on_event = et_on_event;
        r.user = &got[i];
        CHECK_OK(pkv_engine_submit(e, &r, NULL));
        if (i % 2) CHECK_OK(pkv_engine_step(e, NULL));
    }
    et_drain(e);
    int bad = 0;
    for (int i = 0; i < NP; i++) bad += !et_same(&alone[i], &got[i], 1, c->name, i);
    pkv_engine_stats st;
    pkv_engine_stats_get(e, &st);
    pkv_kv_stats ks;
    pkv_kv_stats_get(pkv_engine_cache(e), &ks);
    fprintf(stderr,
            "%s: preemptions %llu swap, %llu recompute (%llu spilled, %llu spills failed); spill wrote %llu pages "
            "(%llu bytes, %.2f ms each), resumes found %llu pages, %llu from disk (%.2f ms each); prefill %.3f ms "
            "per token; disk: %llu written, %llu loaded, %llu write errors, enabled %d; %d differ\n",
            c->name, (unsigned long long)st.preemptions_swap, (unsigned long long)st.preemptions_recompute,
            (unsigned long long)st.preemptions_spill, (unsigned long long)st.spill_failed,
            (unsigned long long)st.spill_pages_written, (unsigned long long)st.spill_bytes_written,
            st.spill_pages_written ? st.spill_write_seconds * 1e3 / (double)st.spill_pages_written : 0.0,
            (unsigned long long)st.spill_pages_resumed, (unsigned long long)st.spill_pages_read,
            st.spill_pages_read ? st.spill_read_seconds * 1e3 / (double)st.spill_pages_read : 0.0,
            st.prefill_seconds_per_token * 1e3, (unsigned long long)ks.disk_written_pages,
            (unsigned long long)ks.disk_hit_pages, (unsigned long long)ks.disk_write_errors, (int)ks.disk_enabled, bad);
    CHECK_INT(bad, 0);
    CHECK_INT(st.requests_finished, NP);
    CHECK_INT(st.requests_failed, 0);
    CHECK(st.preemptions_recompute > 0); /* the load did not fit: sequences were dropped */
    CHECK(st.preemptions_spill <= st.preemptions_recompute);
    CHECK(st.prefill_seconds_per_token > 0);
    if (c->mode == PKV_SPILL_ALWAYS && !c->fail_all && c->fail_after < 0) {
        CHECK(st.preemptions_spill > 0);
        CHECK_INT(st.spill_failed, 0);
        CHECK(st.spill_pages_written > 0);
        if (!g_hybrid) /* files of one size */
            CHECK(st.spill_bytes_written == st.spill_pages_written * (uint64_t)(ks.disk_bytes_used / (uint64_t)ks.disk_files));
        else { /* some carry a recurrent state: files of two sizes */
            uint64_t lo = UINT64_MAX, hi = 0;
            file_sizes(dir, &lo, &hi);
            CHECK(hi > lo);
            CHECK(st.spill_bytes_written >= st.spill_pages_written * lo);
            CHECK(st.spill_bytes_written <= st.spill_pages_written * hi);
        }
        CHECK(st.spill_pages_resumed > 0);
        CHECK(st.spill_pages_read > 0); /* pages that left memory came back from disk */
        CHECK(st.spill_pages_read <= ks.disk_hit_pages);
        CHECK(ks.disk_enabled);
    }
    if (c->fail_all) { /* the first spill fails, the tier is off, nothing is spilled */
        CHECK_INT(st.preemptions_spill, 0);
        CHECK(st.spill_failed >= 1);
        CHECK_INT(st.spill_pages_written, 0);
        CHECK_INT(st.spill_pages_read, 0);
        CHECK(!ks.disk_enabled);
        CHECK_INT(ks.disk_write_errors, 1);
        CHECK(strstr(logbuf, "the disk tier is off from now on") != NULL);
        CHECK(strstr(logbuf, "is dropped and recomputed") != NULL);
    }
    if (c->fail_after >= 0) { /* some pages made it; the spill that met the full disk was recomputed */
        CHECK(st.spill_failed >= 1);
        CHECK(!ks.disk_enabled);
        CHECK_INT(ks.disk_write_errors, 1);
        CHECK_INT(ks.disk_written_pages, (uint64_t)c->fail_after);
        CHECK(strstr(logbuf, "is dropped and recomputed") != NULL);
    }
    if (c->mode == PKV_SPILL_NEVER) {
        CHECK_INT(st.preemptions_spill, 0);
        CHECK_INT(st.spill_pages_written, 0);
    }
    CHECK_INT(st.pages_used, 0);
    CHECK_INT(st.n_swapped + st.n_recompute + st.n_running + st.n_waiting, 0);
    CHECK_INT(ks.n_seqs, 0);
    pkv_engine_free(e);
    pkv_kv_test_disk_fail_write = false;
    pkv_kv_test_disk_fail_after = -1;
    rm_rf(dir);
}

int main(void) {
    g_m = et_model("llama", PKV_TYPE_F16, 7);
    if (!g_m) return th_done();
    pkv_log_set(log_fn, NULL, PKV_LOG_INFO);
    uint64_t rs = 31;
    for (int i = 0; i < NP; i++) {
        int n = 14 + (int)(et_rand(&rs) % 25), mt = 24 + (int)(et_rand(&rs) % 17);
        for (int k = 0; k < n; k++) prompt[i][k] = (int32_t)(et_rand(&rs) % 320);
        if (i % 3 == 1) /* some share their first pages with the previous request */
            for (int k = 0; k < 8; k++) prompt[i][k] = prompt[i - 1][k];
        rp[i] = pkv_request_default_params();
        rp[i].prompt = prompt[i];
        rp[i].n_prompt = n;
        rp[i].max_tokens = mt;
        rp[i].ignore_eos = true;
        rp[i].top_logprobs = 2;
        rp[i].sampling.temp = 0;
        if (i % 3 == 2) {
            rp[i].sampling.temp = 0.8f;
            rp[i].sampling.seed = (uint64_t)i;
        }
        rp[i].priority = i % 4 == 0 ? 1 : 0;
        et_alone(g_m, &rp[i], &alone[i]);
    }
    /* a bad mode is refused */
    pkv_engine_params bad = et_params(128, 4, 24);
    bad.spill = (pkv_spill_mode)7;
    CHECK(pkv_engine_create(g_m, bad) == NULL);
    CHECK(strstr(pkv_errmsg(), "spill") != NULL);

    const cfg cfgs[] = {
        {"spill always", PKV_SPILL_ALWAYS, false, -1},
        {"spill, every write fails", PKV_SPILL_ALWAYS, true, -1},
        {"spill, the disk fills after 3 pages", PKV_SPILL_ALWAYS, false, 3},
        {"spill auto", PKV_SPILL_AUTO, false, -1},
        {"spill never", PKV_SPILL_NEVER, false, -1},
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) run(&cfgs[i]);
    pkv_model_free(g_m);
    /* A hybrid (qwen35: delta-net layers with a recurrent state per sequence): the
     * spilled pages carry the states offered at their ends, a resume matches up to
     * the deepest one and recomputes the rest; every response still equals its run
     * alone. */
    g_m = et_model("qwen35", PKV_TYPE_F16, 7);
    REQUIRE(g_m != NULL);
    g_hybrid = true;
    for (int i = 0; i < NP; i++) et_alone(g_m, &rp[i], &alone[i]);
    run(&cfgs[0]);
    pkv_log_set(NULL, NULL, PKV_LOG_WARN);
    pkv_model_free(g_m);
    return th_done();
}
