// labels: unit kv
/* The memory kinds (src/kv/kv-memory.c, pkv_mem_kind in kv-impl.h):
 *  - which kinds a cache holds: the full pool and media records always, the window
 *    pool with window layers, the recurrent state with recurrent layers, in table
 *    order (the full pool first: it owns the sequences);
 *  - every kind names itself and says when it is present; the first kind has every
 *    hook a public operation needs from it; a hook that takes something has the
 *    hook that gives it back (prefix_begin / prefix_end, *_prepare / *_abort,
 *    load / load_undo); a kind holding layers has every save/load hook, and
 *    each layer is held by exactly one kind (its part of a saved file); the
 *    snapshot's pools are the kinds' page pools (0 full, 1 window);
 *  - pkv_kv_seq_bytes adds up the kinds' costs: per token for the full layers, per
 *    sequence for the window (window + page_size kept, plus the page being filled)
 *    and for the state (one slot), as the stats report them.
 * The operations themselves are tested through the public API by test-kv-basic,
 * -shift, -window, -state, -faults, -random and test-media-kv. */
#include "kv-testlib.h"

enum { PS = 4, WINDOW = 8 };

static pkv_kv_cache *make(kt_env *e, int window, int state_per_head) {
    kt_layout_sharded(e);
    e->layers[1].window = window;
    if (state_per_head > 0) {
        e->layers[2] = (pkv_kv_layer_desc){.n_kv_heads = 2, .state_per_head = state_per_head};
        e->n_layers = 3;
    }
    pkv_kv_params p = kt_params(e, PS, 16, 0);
    if (state_per_head > 0) p.state_slots = 4;
    pkv_kv_cache *c = pkv_kv_cache_create(p);
    if (!c) TH_FAIL("cache: %s", pkv_errmsg());
    return c;
}

static void check_names(const pkv_kv_cache *c, const char *want) {
    const pkv_mem_kind *k[PKV_MEM_KINDS];
    int n = pkv_kv_kinds(c, k);
    char got[256] = "";
    for (int i = 0; i < n; i++) {
        CHECK(k[i]->name && k[i]->present && k[i]->present(c));
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s%s", i ? ", " : "", k[i]->name);
    }
    if (strcmp(got, want)) TH_FAIL("kinds \"%s\", want \"%s\"", got, want);
}

static void test_table(kt_env *e) {
    pkv_kv_cache *c = make(e, WINDOW, 5);
    if (!c) return;
    const pkv_mem_kind *k[PKV_MEM_KINDS];
    int n = pkv_kv_kinds(c, k);
    CHECK_INT(n, PKV_MEM_KINDS); /* every kind: window and recurrent layers both */
    const pkv_mem_kind *f = k[0];
    CHECK(f->present(NULL)); /* the first kind reports a NULL cache */
    CHECK(f->create && f->fork && f->drop && f->seq_free && f->append && f->append_undo && f->truncate &&
          f->shift && f->seq_clear_check && f->seq_clear && f->clear_check && f->clear && f->swap_out &&
          f->swap_in && f->prefix_match && f->prefix_undo && f->stats);
    for (int i = 0; i < n; i++) {
        CHECK(i == 0 || !k[i]->present(NULL));
        CHECK(i == 0 || !k[i]->prefix_match); /* one kind finds the pages */
        CHECK(!k[i]->prefix_begin || k[i]->prefix_end);
        CHECK(!k[i]->swap_out_prepare || (k[i]->swap_out_abort && k[i]->swap_out_commit));
        CHECK(!k[i]->swap_in_prepare || (k[i]->swap_in_abort && k[i]->swap_in_commit));
        CHECK(i == 0 || !k[i]->swap_out || k[i]->swap_out_undo); /* a later kind's failure undoes it */
        CHECK(i == 0 || !k[i]->create || k[i]->fork);             /* a child holds what the parent holds */
        /* save/load: a kind that holds layers writes, checks, sizes and loads them;
         * what a load takes, a later kind's failure gives back; a version names what it holds */
        CHECK(!k[i]->holds_layer || (k[i]->save && k[i]->load_check && k[i]->file_bytes && k[i]->load));
        CHECK(!k[i]->load || k[i]->load_undo);
        CHECK(!k[i]->file_version == !k[i]->file_what);
    }
    CHECK(f->holds_layer && f->load); /* the first kind makes the loaded sequence */
    CHECK(f->file_version == 0);
    for (int il = 0; il < e->n_layers; il++) { /* each layer's part of a file is one kind's */
        int holders = 0;
        for (int i = 0; i < n; i++) holders += k[i]->holds_layer && k[i]->holds_layer(c, il);
        CHECK_INT(holders, 1);
    }
    CHECK(k[1]->holds_layer(c, 1) && k[3]->holds_layer(c, 2) && f->holds_layer(c, 0)); /* window, state, full */
    /* the snapshot's pools are the kinds' page pools: 0 full, 1 window, no 2 */
    pkv_kv_stats st;
    pkv_kv_stats_get(c, &st);
    for (int pool = 0; pool < 3; pool++) {
        pkv_kv_snapshot *s = pkv_kv_snapshot_take(c, pool);
        CHECK((s != NULL) == (pool < 2));
        if (s) CHECK_INT(s->n_pages, pool ? st.window_pages : st.n_pages);
        pkv_kv_snapshot_free(s);
    }
    CHECK_MSG("no pool 2");
    pkv_kv_cache_free(c);
    check_names(NULL, "full attention");
}

static void test_kinds_and_bytes(kt_env *e) {
    struct {
        int window, sph;
        const char *names;
    } cases[] = {
        {0, 0, "full attention, media chunks"},
        {WINDOW, 0, "full attention, sliding window, media chunks"},
        {0, 5, "full attention, media chunks, recurrent state"},
        {WINDOW, 5, "full attention, sliding window, media chunks, recurrent state"},
    };
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
        pkv_kv_cache *c = make(e, cases[t].window, cases[t].sph);
        if (!c) continue;
        check_names(c, cases[t].names);
        pkv_kv_stats st;
        pkv_kv_stats_get(c, &st);
        for (int64_t n = 0; n <= 40; n += 13) {
            uint64_t want = (uint64_t)n * st.page_bytes / PS;
            if (cases[t].window) want += st.window_page_bytes * ((cases[t].window + PS + PS - 1) / PS + 1);
            if (cases[t].sph) want += st.state_slot_bytes;
            CHECK_INT(pkv_kv_seq_bytes(c, n), want);
        }
        CHECK(cases[t].window == 0 || st.window_page_bytes > 0);
        CHECK(cases[t].sph == 0 || st.state_slot_bytes >= 2 * 5 * sizeof(float));
        pkv_kv_cache_free(c);
    }
    CHECK_INT(pkv_kv_seq_bytes(NULL, 10), 0);
}

int main(void) {
    kt_env e;
    if (!kt_open(&e)) return th_skip("cannot open cpu and cpu:1");
    test_table(&e);
    test_kinds_and_bytes(&e);
    kt_close(&e);
    return th_done();
}
