// labels: kv model timeout=300
/* Media rows in the paged cache (src/kv/kv-media.c, the forward pass's media
 * rows, pkv_context_decode_prompt; docs/multimodal.md, "Media in the cache"), on a causal
 * llama (Voxtral's text model) and a gemma3 with a window pool and non-causal
 * chunks. The rows are made by the test (random, seeded) and keyed by
 * pkv_media_hash of a small synthetic image, so no encoder is needed.
 *
 * Prompt: 5 text tokens, a chunk of 6 rows, 3 text tokens (pages of 4 tokens,
 * so pages hold text and rows together). Checked, with logits compared bitwise
 * where the steps have the same shape (and also across shapes on the CPU, whose
 * kernels are batch-invariant; within nmse 1e-6 elsewhere):
 *   the media ids in the sequence, the chunk record;
 *   fork after the media prefix == replay; its records copied;
 *   truncate into the chunk keeps the tokens before it, then == replay;
 *   a shift cutting the chunk refused, nothing changed; one removing it whole
 *   drops the record; one before it moves the record and matches a fresh run
 *   of the shorter prompt (f32 KV: only rotation rounding);
 *   swap out/in and save/load: records back, next logits bit-identical; a file
 *   whose media section is corrupt or missing refused with its reason;
 *   prefix match with the same media == cold, with one pixel changed a miss,
 *   never ending inside the chunk, without records cut at the first media id;
 *   media ids refused as text tokens;
 *   gemma3: non-causal rows differ from causal ones, and a non-causal chunk
 *   that crosses the forward pass's 256-token step boundary is not split;
 *   with a window of 7, the logits after a chunk depend on exactly the tokens
 *   llama.cpp's sliding mask lets them see (window_reach). */
#include <math.h>
#include <string.h>

#include "kv/kv-file.h"
#include "testhelp.h"

#ifndef MEDIA_DEVICE
#define MEDIA_DEVICE "cpu"
#endif

enum { V = 320, E = 128, NA = 5, NR = 6, NB = 3, N = NA + NR + NB };

static const bool exact_across = !strcmp(MEDIA_DEVICE, "cpu"); /* batch-invariant kernels */
static const char *arch_name;

static pkv_model *make_w(const char *arch, int window) {
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    p.arch = arch;
    p.n_layer = 3;
    p.n_embd = E;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.n_ff = 128;
    p.n_vocab = V;
    if (!strcmp(arch, "gemma3")) p.sliding_window = window;
    void *img;
    size_t size;
    if (pkv_mkmodel_memory(&p, &img, &size)) return NULL;
    pkv_model_params mp = pkv_model_default_params();
    mp.device = MEDIA_DEVICE;
    mp.n_threads = 2;
    pkv_model *m = pkv_model_load_memory(img, size, arch, mp);
    pkv_mkmodel_free_memory(img);
    return m;
}

static pkv_model *make(const char *arch) { return make_w(arch, 64); }

static pkv_kv_cache *cache(pkv_model *m, pkv_type kv) {
    pkv_cache_params cp = pkv_cache_default_params();
    cp.n_ctx = 512;
    cp.n_seq_max = 12;
    cp.page_size = 4;
    cp.kv_type = kv;
    return pkv_model_cache_create(m, cp);
}

static int32_t A[NA] = {3, 17, 29, 41, 53}, B[NB] = {67, 79, 97}, X = 111;
static float rows[NR * E], rows2[NR * E];
static uint64_t key, key2; /* the picture, and the picture with one pixel changed */
static bool nc;            /* gemma3: non-causal chunks */

static void same(const float *a, const float *b, bool exact, const char *what) {
    if (!a || !b) {
        TH_FAIL("%s: no logits", what);
        return;
    }
    if (exact || exact_across) {
        if (memcmp(a, b, V * sizeof *a)) TH_FAIL("%s: logits differ (%s, %s)", what, arch_name, MEDIA_DEVICE);
        th_checks++;
    } else {
        double e = th_nmse(a, b, V);
        if (!(e <= 1e-6)) TH_FAIL("%s: nmse %g (%s, %s)", what, e, arch_name, MEDIA_DEVICE);
        th_checks++;
    }
}

static pkv_media_rows chunk(int32_t at, uint64_t k, const float *embd) {
    return (pkv_media_rows){.key = k, .n_rows = NR, .embd = embd, .non_causal = nc, .at = at};
}

/* A fresh context holding A + chunk + B (one step). */
static pkv_context *cold(pkv_model *m, pkv_kv_cache *c) {
    pkv_context *ctx = pkv_context_create(m, c, 0);
    int32_t t[NA + NB];
    memcpy(t, A, sizeof A);
    memcpy(t + NA, B, sizeof B);
    pkv_media_rows r = chunk(NA, key, rows);
    if (ctx && pkv_context_decode_prompt(ctx, t, NA + NB, &r, 1)) {
        TH_FAIL("decode prompt: %s", pkv_errmsg());
        pkv_context_free(ctx);
        return NULL;
    }
    return ctx;
}

static void copy_logits(pkv_context *ctx, float *out) {
    const float *l = pkv_context_logits(ctx);
    if (l) memcpy(out, l, V * sizeof *out);
    else memset(out, 0, V * sizeof *out);
}

static void check_record(pkv_kv_cache *c, int32_t seq, int64_t start, const char *what) {
    pkv_kv_media r;
    CHECK_INT(pkv_kv_media_count(c, seq), 1);
    if (pkv_kv_media_get(c, seq, 0, &r)) {
        TH_FAIL("%s: no record", what);
        return;
    }
    CHECK(r.key == key);
    CHECK_INT(r.start, start);
    CHECK_INT(r.n_rows, NR);
    CHECK_INT(r.flags, nc ? PKV_MEDIA_NON_CAUSAL : 0u);
}

static void run(const char *arch, bool non_causal) {
    arch_name = arch;
    nc = non_causal;
    pkv_model *m = make(arch);
    REQUIRE_VOID(m);
    pkv_kv_cache *c = cache(m, PKV_TYPE_F16);
    REQUIRE_VOID(c);
    float lc[V], l1[V], l2[V];

    /* cold, and its ids and record */
    pkv_context *ctx = cold(m, c);
    REQUIRE_VOID(ctx);
    copy_logits(ctx, lc);
    int32_t toks[N];
    CHECK_OK(pkv_context_tokens(ctx, 0, N, toks));
    for (int r = 0; r < NR; r++) {
        CHECK_INT(toks[NA + r], pkv_media_token(key, r));
        CHECK(pkv_token_is_media(toks[NA + r]));
    }
    CHECK(!pkv_token_is_media(toks[0]) && !pkv_token_is_media(-1));
    check_record(c, pkv_context_seq(ctx), NA, "cold");
    pkv_context *again = cold(m, c);
    REQUIRE_VOID(again);
    copy_logits(again, l1);
    same(lc, l1, true, "cold twice");
    pkv_context_free(again);

    /* media ids are not text */
    CHECK_STATUS(pkv_context_decode(ctx, &toks[NA], 1), PKV_ERR_INVALID);
    CHECK_INT(pkv_context_n_tokens(ctx), N);

    /* fork after the media prefix == replay */
    {
        pkv_context *p = pkv_context_create(m, c, 0), *q = pkv_context_create(m, c, 0);
        pkv_media_rows r = chunk(NA, key, rows);
        CHECK_OK(pkv_context_decode_prompt(p, A, NA, &r, 1));
        pkv_context *child = pkv_context_fork(p);
        REQUIRE_VOID(child);
        check_record(c, pkv_context_seq(child), NA, "fork");
        CHECK_OK(pkv_context_decode(child, B, NB));
        CHECK_OK(pkv_context_decode_prompt(q, A, NA, &r, 1));
        CHECK_OK(pkv_context_decode(q, B, NB));
        copy_logits(child, l1);
        copy_logits(q, l2);
        same(l1, l2, true, "fork == replay");
        same(lc, l1, false, "fork == cold");
        pkv_context_free(child);
        pkv_context_free(p);
        pkv_context_free(q);
    }

    /* truncate into the chunk: the whole chunk goes */
    {
        pkv_context *f = pkv_context_fork(ctx), *ref = pkv_context_create(m, c, 0);
        REQUIRE_VOID(f && ref);
        CHECK_OK(pkv_context_truncate(f, NA + 3));
        CHECK_INT(pkv_context_n_tokens(f), NA);
        CHECK_INT(pkv_kv_media_count(c, pkv_context_seq(f)), 0);
        pkv_media_rows r = chunk(0, key, rows);
        CHECK_OK(pkv_context_decode_media(f, &r));
        CHECK_OK(pkv_context_decode(f, B, NB));
        check_record(c, pkv_context_seq(f), NA, "truncate");
        CHECK_OK(pkv_context_decode(ref, A, NA));
        CHECK_OK(pkv_context_decode_media(ref, &r));
        CHECK_OK(pkv_context_decode(ref, B, NB));
        copy_logits(f, l1);
        copy_logits(ref, l2);
        same(l1, l2, true, "truncate into the chunk, decoded again == replay");
        same(lc, l1, false, "truncate into the chunk, decoded again == cold");
        pkv_context_free(f);
        pkv_context_free(ref);
    }

    /* shifts */
    {
        pkv_context *f = pkv_context_fork(ctx);
        REQUIRE_VOID(f);
        CHECK_STATUS(pkv_context_shift(f, NA + 2, 2), PKV_ERR_INVALID);
        CHECK_MSG("would cut media chunk");
        CHECK_STATUS(pkv_context_shift(f, NA - 1, 2), PKV_ERR_INVALID);
        CHECK_STATUS(pkv_kv_shift(c, pkv_context_seq(f), NA + 2, 0, 5), PKV_ERR_INVALID); /* positions only, from inside */
        CHECK_INT(pkv_context_n_tokens(f), N);
        check_record(c, pkv_context_seq(f), NA, "refused shift");
        CHECK_OK(pkv_context_shift(f, NA, NR)); /* the chunk whole */
        CHECK_INT(pkv_context_n_tokens(f), NA + NB);
        CHECK_INT(pkv_kv_media_count(c, pkv_context_seq(f)), 0);
        pkv_context_free(f);
    }
    {
        /* Removing tokens before the chunk moves its record. Content, on f32 pages:
         * every position moved by +3 (rows of the chunk included) gives the logits
         * of the unmoved twin up to rotation rounding (RoPE is relative). */
        pkv_kv_cache *c32 = cache(m, PKV_TYPE_F32);
        REQUIRE_VOID(c32);
        pkv_context *f = pkv_context_create(m, c32, 0), *ref = NULL, *moved = NULL;
        int32_t t[NA + NB];
        memcpy(t, A, sizeof A);
        memcpy(t + NA, B, sizeof B);
        pkv_media_rows r = chunk(NA, key, rows);
        CHECK_OK(pkv_context_decode_prompt(f, t, NA + NB, &r, 1));
        ref = pkv_context_fork(f);
        moved = pkv_context_fork(f);
        REQUIRE_VOID(ref && moved);
        CHECK_OK(pkv_kv_shift(c32, pkv_context_seq(moved), 0, 0, 3));
        check_record(c32, pkv_context_seq(moved), NA, "shift of positions");
        CHECK_OK(pkv_context_decode(moved, &X, 1));
        CHECK_OK(pkv_context_decode(ref, &X, 1));
        copy_logits(moved, l1);
        copy_logits(ref, l2);
        double e = th_nmse(l2, l1, V);
        if (!(e <= 1e-9)) TH_FAIL("positions shifted by 3: nmse %g against the unshifted twin (%s)", e, arch);
        th_checks++;
        CHECK_OK(pkv_context_shift(f, 0, 2));
        check_record(c32, pkv_context_seq(f), NA - 2, "shift");
        pkv_context_free(f);
        pkv_context_free(ref);
        pkv_context_free(moved);
        pkv_kv_cache_free(c32);
    }

    /* swap round trip */
    {
        pkv_context *f = pkv_context_fork(ctx), *g = pkv_context_fork(ctx);
        REQUIRE_VOID(f && g);
        CHECK_OK(pkv_context_swap_out(f));
        CHECK_OK(pkv_context_swap_in(f));
        check_record(c, pkv_context_seq(f), NA, "swap");
        CHECK_OK(pkv_context_decode(f, &X, 1));
        CHECK_OK(pkv_context_decode(g, &X, 1));
        copy_logits(f, l1);
        copy_logits(g, l2);
        same(l1, l2, true, "swap round trip");
        pkv_context_free(f);
        pkv_context_free(g);
    }

    /* save / load */
    {
        const char *path = th_tmp("media-kv.seq");
        CHECK_OK(pkv_context_save(ctx, path));
        pkv_context *l = pkv_context_load(m, c, path, 0), *g = pkv_context_fork(ctx);
        REQUIRE_VOID(l && g);
        check_record(c, pkv_context_seq(l), NA, "load");
        int32_t lt[N];
        CHECK_OK(pkv_context_tokens(l, 0, N, lt));
        CHECK_MEM(lt, toks, sizeof toks);
        copy_logits(l, l1);
        same(lc, l1, false, "load: the last token's logits");
        CHECK_OK(pkv_context_decode(l, &X, 1));
        CHECK_OK(pkv_context_decode(g, &X, 1));
        copy_logits(l, l1);
        copy_logits(g, l2);
        same(l1, l2, false, "save/load round trip");
        pkv_context_free(l);
        pkv_context_free(g);
        /* the file: a flipped byte in the media section, the section missing */
        FILE *fp = fopen(path, "rb");
        REQUIRE_VOID(fp);
        static uint8_t img[1 << 20];
        size_t n = fread(img, 1, sizeof img, fp);
        fclose(fp);
        const size_t trailer = 16 + 24 + 8;
        REQUIRE_VOID(n > trailer && !memcmp(img + n - trailer, "PKVMEDIA", 8));
        int32_t s;
        img[n - trailer + 16] ^= 1; /* the key */
        CHECK_STATUS(pkv_kv_seq_load_memory(c, "flipped", img, n, 0, &s), PKV_ERR_FORMAT);
        CHECK_MSG("media section checksum mismatch");
        img[n - trailer + 16] ^= 1;
        CHECK_STATUS(pkv_kv_seq_load_memory(c, "no media section", img, n - trailer, 0, &s), PKV_ERR_FORMAT);
        CHECK_MSG("outside every recorded media chunk");
        CHECK_OK(pkv_kv_seq_load_memory(c, "intact", img, n, 0, &s));
        CHECK_OK(pkv_kv_seq_free(c, s));
    }

    /* prefix cache */
    {
        pkv_kv_media rec = {.key = key, .start = NA, .n_rows = NR, .flags = nc ? PKV_MEDIA_NON_CAUSAL : 0};
        pkv_context *h = pkv_context_create(m, c, 0);
        REQUIRE_VOID(h);
        int64_t got = -1;
        CHECK_OK(pkv_kv_prefix_match_media(c, pkv_context_seq(h), toks, NULL, N - 1, &rec, 1, &got));
        CHECK_INT(got, 12);
        check_record(c, pkv_context_seq(h), NA, "prefix hit");
        CHECK_OK(pkv_context_decode(h, toks + 12, N - 12));
        copy_logits(h, l1);
        same(lc, l1, false, "prefix hit == cold");
        pkv_context_free(h);

        h = pkv_context_create(m, c, 0); /* one pixel changed: a miss after the text page */
        int32_t t2[N];
        memcpy(t2, toks, sizeof t2);
        for (int r = 0; r < NR; r++) t2[NA + r] = pkv_media_token(key2, r);
        pkv_kv_media rec2 = rec;
        rec2.key = key2;
        CHECK_OK(pkv_kv_prefix_match_media(c, pkv_context_seq(h), t2, NULL, N - 1, &rec2, 1, &got));
        CHECK_INT(got, 4);
        CHECK_INT(pkv_kv_media_count(c, pkv_context_seq(h)), 0);
        pkv_media_rows r2 = chunk(1, key2, rows2);
        CHECK_OK(pkv_context_decode_prompt(h, t2 + 4, 1, &r2, 1));
        CHECK_OK(pkv_context_decode(h, B, NB));
        copy_logits(h, l1);
        bool differ = memcmp(lc, l1, sizeof lc) != 0;
        CHECK(differ);
        pkv_context_free(h);

        h = pkv_context_create(m, c, 0); /* would end inside the chunk: back to before it */
        CHECK_OK(pkv_kv_prefix_match_media(c, pkv_context_seq(h), toks, NULL, 8, &rec, 1, &got));
        CHECK_INT(got, 4);
        CHECK_OK(pkv_context_truncate(h, 0));
        pkv_kv_media rec_long = rec; /* a chunk that the tokens do not hold: refused */
        rec_long.key = key2;
        CHECK_STATUS(pkv_kv_prefix_match_media(c, pkv_context_seq(h), toks, NULL, N - 1, &rec_long, 1, &got),
                     PKV_ERR_INVALID);
        CHECK_OK(pkv_kv_prefix_match(c, pkv_context_seq(h), toks, NULL, N - 1, &got)); /* no records: up to the first id */
        CHECK_INT(got, 4);
        CHECK_INT(pkv_kv_media_count(c, pkv_context_seq(h)), 0);
        pkv_context_free(h);
    }
    pkv_context_free(ctx);

    if (nc) { /* non-causal: differs from causal; never split by the 256-token steps */
        pkv_context *a = pkv_context_create(m, c, 0), *b = pkv_context_create(m, c, 0);
        pkv_media_rows r = chunk(0, key, rows);
        r.non_causal = false;
        CHECK_OK(pkv_context_decode_media(a, &r));
        r.non_causal = true;
        CHECK_OK(pkv_context_decode_media(b, &r));
        CHECK_OK(pkv_context_decode(a, B, NB));
        CHECK_OK(pkv_context_decode(b, B, NB));
        copy_logits(a, l1);
        copy_logits(b, l2);
        CHECK(memcmp(l1, l2, sizeof l1) != 0);
        pkv_context_free(a);
        pkv_context_free(b);

        enum { NT = 252 };
        int32_t t[NT + NB];
        for (int i = 0; i < NT; i++) t[i] = (i * 37 + 5) % V;
        memcpy(t + NT, B, sizeof B);
        a = pkv_context_create(m, c, 0);
        b = pkv_context_create(m, c, 0);
        r = chunk(NT, key, rows);
        CHECK_OK(pkv_context_decode_prompt(a, t, NT + NB, &r, 1)); /* the chunk crosses token 256 */
        CHECK_OK(pkv_context_decode(b, t, NT));
        r.at = 0;
        CHECK_OK(pkv_context_decode_prompt(b, t + NT, NB, &r, 1));
        copy_logits(a, l1);
        copy_logits(b, l2);
        same(l1, l2, false, "a non-causal chunk across the step boundary");
        pkv_context_free(a);
        pkv_context_free(b);
    }
    pkv_kv_cache_free(c);
    pkv_model_free(m);
}

/* A non-causal chunk on sliding-window layers sees what llama.cpp's mask shows:
 * a row at position p sees [p + 1 - W, chunk end), not the chunk's last W
 * tokens. gemma3 of three layers, all sliding, W = 7; 16 text tokens, the 6 rows
 * at [16, 22), one text token at 22 (its logits). That token's last layer sees
 * [16, 23) (rows only); the first row sees back to 10 in layer 1, token 10's
 * causal row back to 4 in layer 0: the logits depend on token 4 and not on token
 * 3. Measured from the chunk's end instead ([15, 22) for every row) they would
 * depend on nothing before token 9 (and on 3 with no window at all). */
static void window_reach(void) {
    arch_name = "gemma3 (window 7)";
    nc = true;
    pkv_model *m = make_w("gemma3", 7);
    REQUIRE_VOID(m);
    pkv_kv_cache *c = cache(m, PKV_TYPE_F32);
    REQUIRE_VOID(c);
    enum { NT = 16 };
    float l[3][V];
    for (int v = 0; v < 3; v++) {
        int32_t t[NT + 1];
        for (int i = 0; i < NT; i++) t[i] = (i * 37 + 5) % V;
        t[NT] = B[0];
        if (v == 1) t[4] = X; /* the earliest token the logits see */
        if (v == 2) t[3] = X; /* one before it */
        pkv_context *ctx = pkv_context_create(m, c, 0);
        REQUIRE_VOID(ctx);
        pkv_media_rows r = chunk(NT, key, rows);
        CHECK_OK(pkv_context_decode_prompt(ctx, t, NT + 1, &r, 1));
        copy_logits(ctx, l[v]);
        pkv_context_free(ctx);
    }
    CHECK(memcmp(l[0], l[1], sizeof l[0]) != 0); /* token 4 is seen through the chunk's first row */
    same(l[0], l[2], true, "token 3, outside every row's window");
    pkv_kv_cache_free(c);
    pkv_model_free(m);
}

/* ---------------------------------------------------------------- engine */

enum { NG = 6 };
typedef struct got {
    int32_t tok[2][NG];
    int n[2];
    int32_t n_prompt, n_cached;
    bool err;
} got;

static bool on_event(const pkv_engine_event *ev, void *user) {
    got *g = user;
    if (ev->finish == PKV_FINISH_ERROR) {
        fprintf(stderr, "engine error: %s\n", ev->message);
        g->err = true;
    }
    if (ev->token >= 0 && g->n[ev->sample] < NG) g->tok[ev->sample][g->n[ev->sample]++] = ev->token;
    g->n_prompt = ev->n_prompt;
    g->n_cached = ev->n_cached;
    return true;
}

/* The engine with a media request (chunked prefill of 8 tokens a step, so a
 * non-causal chunk must wait for a step of its own; n = 2 forks): greedy tokens ==
 * a context's; the same request again is a prefix hit with the same tokens; one
 * pixel changed, fewer cached tokens. */
static void engine_case(pkv_model *m, const float *embd, uint64_t k, got *g) {
    pkv_engine_params ep = pkv_engine_default_params();
    ep.cache.n_ctx = 128;
    ep.cache.page_size = 4;
    ep.max_batch_tokens = 8;
    static pkv_engine *e;
    static pkv_model *em;
    if (em != m) {
        pkv_engine_free(e);
        e = m ? pkv_engine_create(m, ep) : NULL;
        em = m;
    }
    if (!m) return;
    REQUIRE_VOID(e);
    int32_t t[NA + NB];
    memcpy(t, A, sizeof A);
    memcpy(t + NA, B, sizeof B);
    pkv_media_rows r = chunk(NA, k, embd);
    pkv_request_params rp = pkv_request_default_params();
    rp.prompt = t;
    rp.n_prompt = NA + NB;
    rp.media = &r;
    rp.n_media = 1;
    rp.max_tokens = NG;
    rp.ignore_eos = true;
    rp.n = 2;
    rp.sampling.temp = 0;
    rp.on_event = on_event;
    rp.user = g;
    memset(g, 0, sizeof *g);
    CHECK_OK(pkv_engine_submit(e, &rp, NULL));
    int pending = 1;
    for (int i = 0; i < 200 && pending; i++) CHECK_OK(pkv_engine_step(e, &pending));
    CHECK(!g->err);
}

static void run_engine(const char *arch, bool non_causal) {
    arch_name = arch;
    nc = non_causal;
    pkv_model *m = make(arch);
    REQUIRE_VOID(m);
    pkv_kv_cache *c = cache(m, PKV_TYPE_F16);
    pkv_context *ctx = cold(m, c);
    REQUIRE_VOID(ctx);
    int32_t want[NG];
    for (int i = 0; i < NG; i++) {
        const float *l = pkv_context_logits(ctx);
        int32_t best = 0;
        for (int32_t v = 1; v < V; v++)
            if (l[v] > l[best]) best = v;
        want[i] = best;
        CHECK_OK(pkv_context_decode(ctx, &best, 1));
    }
    got g;
    engine_case(m, rows, key, &g);
    CHECK_INT(g.n_prompt, N);
    CHECK_INT(g.n_cached, 0);
    CHECK_INT(g.n[0], NG);
    CHECK_INT(g.n[1], NG);
    if (exact_across) {
        CHECK_MEM(g.tok[0], want, sizeof want);
        CHECK_MEM(g.tok[1], want, sizeof want);
    }
    engine_case(m, rows, key, &g); /* again: the prompt from the prefix cache */
    CHECK_INT(g.n_cached, 12);
    if (exact_across) CHECK_MEM(g.tok[0], want, sizeof want);
    engine_case(m, rows2, key2, &g); /* another picture: only the first page */
    CHECK_INT(g.n_cached, 4);
    { /* refused at submit: a non-causal chunk larger than a step, media on a context, bad placement */
        pkv_engine_params ep = pkv_engine_default_params();
        ep.cache.n_ctx = 128;
        ep.max_batch_tokens = 4;
        pkv_engine *e = pkv_engine_create(m, ep);
        REQUIRE_VOID(e);
        pkv_media_rows r = chunk(1, key, rows);
        r.non_causal = true;
        pkv_request_params rp = pkv_request_default_params();
        rp.prompt = A;
        rp.n_prompt = NA;
        rp.media = &r;
        rp.n_media = 1;
        rp.max_tokens = 2;
        CHECK_STATUS(pkv_engine_submit(e, &rp, NULL), PKV_ERR_INVALID);
        CHECK_MSG("max_batch_tokens");
        r.non_causal = false; /* a causal chunk may be split: accepted */
        CHECK_OK(pkv_engine_submit(e, &rp, NULL));
        r.at = NA + 1;
        CHECK_STATUS(pkv_engine_submit(e, &rp, NULL), PKV_ERR_INVALID);
        CHECK_MSG("at must be in");
        r.at = 0;
        int32_t bad[2] = {3, pkv_media_token(key, 0)}; /* media ids as text: refused */
        rp.prompt = bad;
        rp.n_prompt = 2;
        CHECK_STATUS(pkv_engine_submit(e, &rp, NULL), PKV_ERR_INVALID);
        rp.n_media = 0;
        CHECK_STATUS(pkv_engine_submit(e, &rp, NULL), PKV_ERR_INVALID);
        pkv_context *cx = pkv_context_create(m, pkv_engine_cache(e), 0);
        REQUIRE_VOID(cx);
        CHECK_OK(pkv_context_decode(cx, A, NA));
        rp.prompt = B;
        rp.n_prompt = NB;
        rp.n_media = 1;
        rp.context = cx;
        CHECK_STATUS(pkv_engine_submit(e, &rp, NULL), PKV_ERR_UNSUPPORTED);
        int pending = 1;
        for (int i = 0; i < 100 && pending; i++) CHECK_OK(pkv_engine_step(e, &pending));
        pkv_context_free(cx);
        pkv_engine_free(e);
    }
    engine_case(NULL, NULL, 0, &g);
    pkv_context_free(ctx);
    pkv_kv_cache_free(c);
    pkv_model_free(m);
}

/* ---------------------------------------------------------- a real encoder */

int main(void) {
#ifdef MEDIA_NEEDS_DEVICE
    pkv_device *d = pkv_device_open(MEDIA_DEVICE, pkv_device_default_params());
    if (!d) return th_skip(MEDIA_DEVICE " does not open");
    pkv_device_close(d);
#endif
    uint64_t rs = 7;
    for (int i = 0; i < NR * E; i++) rows[i] = 0.5f * th_randf(&rs);
    for (int i = 0; i < NR * E; i++) rows2[i] = rows[i];
    rows2[3] += 0.25f; /* what the changed pixel would change */
    uint8_t rgb[4 * 4 * 3];
    for (int i = 0; i < (int)sizeof rgb; i++) rgb[i] = (uint8_t)(i * 13);
    pkv_media im = {.kind = PKV_MEDIA_IMAGE, .rgb = rgb, .width = 4, .height = 4};
    key = pkv_media_key(pkv_media_hash(&im), 0x1234);
    rgb[7] ^= 1;
    key2 = pkv_media_key(pkv_media_hash(&im), 0x1234);
    CHECK(key != key2);
    CHECK(pkv_media_key(pkv_media_hash(&im), 0x1235) != key2); /* another projector, other rows */
    run("llama", false);
    run("gemma3", true);
    window_reach();
    run_engine("llama", false);
    run_engine("gemma3", true);
    return th_done();
}
