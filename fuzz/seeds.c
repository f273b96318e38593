/* Writes the seed corpora of the fuzz harnesses, made by pagekv itself:
 *   <dir>/gguf/       mkmodel models (the code of `pagekv mkmodel`) of every
 *                     architecture and weight type, without vocabulary, tied, a
 *                     k-quant mixture, and a GGUF with one tensor of every type
 *                     and keys of every value type
 *   <dir>/kvfile/     sequences saved from the harness's model and cache
 *                     (fuzz_kv_model_params), from its model with sliding-window
 *                     layers (fuzz_kv_window_model_params) and from its cache with a
 *                     recurrent layer (fuzz_kv_state_params), each behind a flags byte
 *   <dir>/tokenizer/  texts (English, code, digits, whitespace, non-Latin
 *                     scripts, invalid UTF-8, special-token text) behind each
 *                     tokenizer selector, and a few input-made vocabularies
 *   <dir>/sampler/    params and logits in the harness's layout
 *   <dir>/grammar/    GBNF grammars and JSON schemas (fuzz/fuzz-grammar.c): the
 *                     costly shapes (x{0,60} over y{0,60}, ("a"{0,1000}){0,1000},
 *                     nested stars, left recursion), '(' groups and schemas nested
 *                     at, past and far past their limits (100000 deep, in the
 *                     harness's expanded form), $ref chains, cycles and "#"
 *   <dir>/server/     request sequences of every endpoint (completions, chat,
 *                     streams, tokenize, the contexts API, bad requests)
 *   <dir>/audio/      WAV (PCM 8/16/24, float, u-law, ADPCM, extensible, RF64),
 *                     FLAC and Ogg/Vorbis files written with libsndfile, each
 *                     behind a flags byte (fuzz/fuzz-audio.c)
 *   <dir>/image/      PNG in several color types (libspng) and JPEG baseline,
 *                     progressive, gray and CMYK (libjpeg), behind a flags byte
 * Usage: pkv-fuzz-seeds DIR. Small files only (the largest gguf is ~150 KB);
 * nothing here is committed: `make fuzz-corpus` regenerates it. */
#include "fuzz-common.h"

#include "model/gguf.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <sys/stat.h>

static const char *g_dir;
static int g_files;

static void mkdir_p(const char *sub) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", g_dir, sub);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "seeds: cannot create %s\n", path);
        exit(1);
    }
}

static void put(const char *sub, const char *name, const void *pre, size_t npre, const void *data, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s/%s", g_dir, sub, name);
    FILE *f = fopen(path, "wb");
    if (!f || (npre && fwrite(pre, 1, npre, f) != npre) || (n && fwrite(data, 1, n, f) != n) || fclose(f) != 0) {
        fprintf(stderr, "seeds: cannot write %s\n", path);
        exit(1);
    }
    g_files++;
}

static void need(pkv_status st, const char *what) {
    if (st) {
        fprintf(stderr, "seeds: %s: %s\n", what, pkv_errmsg());
        exit(1);
    }
}

/* ------------------------------------------------------------------ gguf */

static void gguf_model(const char *name, pkv_mkmodel_params p) {
    void *img;
    size_t n;
    need(pkv_mkmodel_memory(&p, &img, &n), name);
    put("gguf", name, NULL, 0, img, n);
    pkv_mkmodel_free_memory(img);
}

static pkv_mkmodel_params tiny(const char *arch, pkv_type t) {
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    bool k = t == PKV_TYPE_Q4_K || t == PKV_TYPE_Q5_K || t == PKV_TYPE_Q6_K;
    p.arch = arch;
    p.type = t;
    p.n_layer = 1;
    p.n_embd = k ? 256 : 32;
    p.n_head = 2;
    p.n_head_kv = 1;
    p.n_ff = k ? 256 : 64;
    p.n_vocab = 300;
    p.n_ctx = 64;
    p.tied = k; /* no output matrix: k-quant rows are 256 wide, keep the files small */
    return p;
}

/* Keys of every value type (arrays of each too) and a tensor of every type. */
static void gguf_all_types(void) {
    pkv_gguf_writer *w = pkv_gguf_writer_create();
    need(w ? PKV_OK : PKV_ERR_NOMEM, "writer");
    uint8_t raw[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    char key[64];
    for (int t = 0; t < PKV_GGUF_TYPE_COUNT; t++) {
        if (t == PKV_GGUF_STRING || t == PKV_GGUF_ARRAY) continue;
        uint8_t v[8];
        memcpy(v, raw, 8);
        if (t == PKV_GGUF_BOOL) v[0] = 1;
        snprintf(key, sizeof key, "fuzz.value.%s", pkv_gguf_type_name((pkv_gguf_type)t));
        need(pkv_gguf_writer_add(w, key, (pkv_gguf_type)t, v), key);
        uint8_t arr[3 * 8] = {0};
        for (int i = 0; i < 3 * 8; i++) arr[i] = t == PKV_GGUF_BOOL ? (uint8_t)(i & 1) : (uint8_t)(i * 37);
        snprintf(key, sizeof key, "fuzz.array.%s", pkv_gguf_type_name((pkv_gguf_type)t));
        need(pkv_gguf_writer_add_arr(w, key, (pkv_gguf_type)t, arr, 3), key);
    }
    need(pkv_gguf_writer_add_str(w, "general.name", "fuzz seed"), "str");
    const char *strs[] = {"a", "", "three"};
    need(pkv_gguf_writer_add_arr_str(w, "fuzz.array.string", strs, NULL, 3), "arr str");
    for (int t = 0; t < PKV_TYPE_COUNT; t++) {
        size_t be = pkv_type_block_elems((pkv_type)t), bb = pkv_type_block_bytes((pkv_type)t);
        if (!be || !bb) continue;
        int64_t ne[2] = {(int64_t)be * 2, 3};
        size_t bytes = pkv_type_row_bytes((pkv_type)t, (size_t)ne[0]) * 3;
        snprintf(key, sizeof key, "fuzz.%s", pkv_type_name((pkv_type)t));
        need(pkv_gguf_writer_add_tensor(w, key, (pkv_type)t, 2, ne, NULL, bytes), key);
    }
    void *img;
    size_t n;
    need(pkv_gguf_writer_write_memory(w, &img, &n), "write");
    put("gguf", "all-types.gguf", NULL, 0, img, n);
    pkv_free(img);
    pkv_gguf_writer_free(w);
}

static void gguf_seeds(void) {
    mkdir_p("gguf");
    static const pkv_type types[] = {PKV_TYPE_F32,  PKV_TYPE_F16,  PKV_TYPE_BF16, PKV_TYPE_Q8_0,
                                     PKV_TYPE_Q4_0, PKV_TYPE_Q4_K, PKV_TYPE_Q5_K, PKV_TYPE_Q6_K, PKV_TYPE_MXFP4};
    static const char *const archs[] = {"llama", "qwen2", "qwen3", "qwen3moe", "phi3", "gemma2", "gemma3"};
    char name[128];
    pkv_mkmodel_params p0;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        snprintf(name, sizeof name, "llama-%s.gguf", pkv_type_name(types[i]));
        gguf_model(name, tiny("llama", types[i]));
    }
    for (size_t a = 1; a < sizeof archs / sizeof archs[0]; a++) {
        snprintf(name, sizeof name, "%s-f16.gguf", archs[a]);
        gguf_model(name, tiny(archs[a], PKV_TYPE_F16));
    }
    p0 = tiny("qwen3moe", PKV_TYPE_MXFP4);
    gguf_model("qwen3moe-mxfp4.gguf", p0);
    /* qwen35: three delta-net layers, an attention layer, an MTP layer */
    p0 = tiny("qwen35", PKV_TYPE_F16);
    p0.n_layer = 4;
    p0.ssm_v_heads = 2;
    p0.ssm_k_heads = 1;
    p0.ssm_head_dim = 8;
    p0.n_mtp = 1;
    gguf_model("qwen35-mtp-f16.gguf", p0);
    /* phi3 with LongRoPE (long and short factors), smollm3 with a NoPE layer, mistral3 */
    p0 = tiny("phi3", PKV_TYPE_F16);
    p0.rope_orig_ctx = 16;
    gguf_model("phi3-longrope-f16.gguf", p0);
    p0 = tiny("smollm3", PKV_TYPE_F16);
    p0.n_layer = 4;
    gguf_model("smollm3-f16.gguf", p0);
    gguf_model("mistral3-f16.gguf", tiny("mistral3", PKV_TYPE_F16));
    pkv_mkmodel_params p = tiny("llama", PKV_TYPE_F32);
    p.no_vocab = true;
    gguf_model("llama-novocab.gguf", p);
    p = tiny("qwen2", PKV_TYPE_Q8_0);
    p.tied = true;
    gguf_model("qwen2-tied.gguf", p);
    p = tiny("llama", PKV_TYPE_Q4_K);
    p.k_mixture = true;
    p.tied = false;
    gguf_model("llama-q4_k_m.gguf", p);
    p = tiny("llama", PKV_TYPE_F16);
    int32_t shared[1] = {0};
    p.shared_kv_layers = shared;
    gguf_model("llama-shared-kv.gguf", p);
    gguf_all_types();
}

/* ---------------------------------------------------------------- kvfile */

/* Sequence files of the fuzz model (version 1) and of the model with
 * sliding-window layers (version 2: some with released window pages, one whose
 * window layers are behind after a deep truncate). */
static void kv_seeds_of(pkv_mkmodel_params mp, const char *prefix) {
    void *img;
    size_t n;
    need(pkv_mkmodel_memory(&mp, &img, &n), "kv model");
    pkv_model *m = pkv_model_load_memory(img, n, "kv model", fuzz_model_params());
    pkv_mkmodel_free_memory(img);
    need(m ? PKV_OK : PKV_ERR_FORMAT, "kv model load");
    pkv_kv_cache *c = pkv_model_cache_create(m, fuzz_kv_cache_params());
    need(c ? PKV_OK : PKV_ERR_NOMEM, "kv cache");
    static const int lens[] = {0, 1, 4, 7, 17, 30};
    char path[4096], name[64];
    snprintf(path, sizeof path, "%s/kvfile/.tmp-seq", g_dir);
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        for (int op = 0; op < 4; op++) { /* 0 as decoded, 1 shifted, 2 truncated back to 3 tokens less than half,
                                            3 with a media chunk of 6 rows after 5 tokens (a media section) */
            if ((op == 1 && lens[i] < 7) || (op == 2 && lens[i] < 17) || (op == 3 && lens[i] != 17)) continue;
            pkv_context *ctx = pkv_context_create(m, c, 0);
            need(ctx ? PKV_OK : PKV_ERR_NOMEM, "context");
            int32_t toks[30];
            for (int t = 0; t < lens[i]; t++) toks[t] = (t * 37 + 11) % 300;
            if (lens[i] && op != 3) need(pkv_context_decode(ctx, toks, lens[i]), "decode");
            if (op == 3) {
                pkv_model_info mi;
                need(pkv_model_get_info(m, &mi), "model info");
                static float rows[6 * 4096];
                for (int k = 0; k < 6 * mi.n_embd && k < 6 * 4096; k++) rows[k] = (float)((k * 7) % 13) / 13.0f - 0.5f;
                pkv_media_rows r = {.key = 0x6d65646961ULL, .n_rows = 6, .embd = rows, .non_causal = true, .at = 5};
                need(mi.n_embd <= 4096 ? PKV_OK : PKV_ERR_INVALID, "media width");
                need(pkv_context_decode_prompt(ctx, toks, lens[i] - 6, &r, 1), "decode media");
            }
            if (op == 1) need(pkv_context_shift(ctx, 2, 3), "shift");
            if (op == 2) need(pkv_context_truncate(ctx, lens[i] / 2 - 3), "truncate");
            need(pkv_context_save(ctx, path), "save");
            FILE *f = fopen(path, "rb");
            need(f ? PKV_OK : PKV_ERR_IO, path);
            uint8_t buf[1 << 16];
            size_t got = fread(buf, 1, sizeof buf, f);
            fclose(f);
            remove(path);
            /* flags (fuzz-kvfile.c): 0 seq load, 1 fixed checksum, 2 context load,
             * 3 both, 5 with a busy sequence, 0x39 / 0x7b allocation failures */
            static const uint8_t flags[] = {0x00, 0x01, 0x02, 0x03, 0x05, 0x39, 0x7b};
            static const char *const ops[] = {"", "-shifted", "-truncated", "-media"};
            for (size_t k = 0; k < sizeof flags; k++) {
                snprintf(name, sizeof name, "%sseq%d%s-f%02x", prefix, lens[i], ops[op], flags[k]);
                put("kvfile", name, &flags[k], 1, buf, got);
            }
            pkv_context_free(ctx);
            need(pkv_kv_clear(c), "clear");
        }
    }
    pkv_kv_cache_free(c);
    pkv_model_free(m);
}

/* Version 3: sequences of the cache with a recurrent layer (no model: tokens
 * appended, a known state written into the live slot), as appended and with the
 * state behind after a truncate. */
static void kv_state_seeds(void) {
    pkv_device_params dp = pkv_device_default_params();
    dp.n_threads = 1;
    pkv_device *dev = pkv_device_open("cpu", dp);
    need(dev ? PKV_OK : PKV_ERR_NOT_FOUND, "cpu device");
    pkv_kv_cache *c = pkv_kv_cache_create(fuzz_kv_state_params(dev));
    need(c ? PKV_OK : PKV_ERR_NOMEM, "state cache");
    static const int lens[] = {0, 1, 4, 7, 17, 30};
    char path[4096], name[64];
    snprintf(path, sizeof path, "%s/kvfile/.tmp-seq", g_dir);
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++)
        for (int op = 0; op < 2; op++) { /* 0 as appended, 1 truncated to half: the state behind */
            if (op == 1 && lens[i] < 4) continue;
            int32_t seq, toks[30], rows[30], slot;
            need(pkv_kv_seq_create(c, 9, &seq), "create");
            for (int t = 0; t < lens[i]; t++) toks[t] = (t * 37 + 11) % 300;
            if (lens[i]) need(pkv_kv_append(c, seq, lens[i], toks, NULL, rows), "append");
            need(pkv_kv_state_slots(c, 1, &seq, &slot), "state slots");
            pkv_kv_shard_info si;
            need(pkv_kv_shard(c, 1, 0, &si), "shard");
            float st[12];
            for (int k = 0; k < 12; k++) st[k] = (float)(lens[i] * 16 + k) * 0.125f;
            need(pkv_buffer_write(si.state, si.state_off + (size_t)slot * si.state_slot_bytes, st, sizeof st), "state");
            need(pkv_kv_state_step_done(c, 1, &seq, &lens[i]), "step done");
            if (op == 1) need(pkv_kv_truncate(c, seq, lens[i] / 2), "truncate");
            need(pkv_kv_seq_save(c, seq, path), "save");
            FILE *f = fopen(path, "rb");
            need(f ? PKV_OK : PKV_ERR_IO, path);
            uint8_t buf[1 << 16];
            size_t got = fread(buf, 1, sizeof buf, f);
            fclose(f);
            remove(path);
            static const uint8_t flags[] = {0x00, 0x01, 0x05, 0x39, 0x7b};
            for (size_t k = 0; k < sizeof flags; k++) {
                snprintf(name, sizeof name, "state-seq%d%s-f%02x", lens[i], op ? "-behind" : "", flags[k]);
                put("kvfile", name, &flags[k], 1, buf, got);
            }
            need(pkv_kv_clear(c), "clear");
            need(pkv_kv_seq_free(c, seq), "free");
        }
    pkv_kv_cache_free(c);
    pkv_device_close(dev);
}

static void kv_seeds(void) {
    mkdir_p("kvfile");
    kv_seeds_of(fuzz_kv_model_params(), "");
    kv_seeds_of(fuzz_kv_window_model_params(), "window-");
    kv_state_seeds();
}

/* ------------------------------------------------------------- tokenizer */

static const char *const k_texts[] = {
    "Hello world! How are you today?",
    "The quick brown fox jumps over the lazy dog. It's 12:45, and they've said I'll go.",
    "int main(void) {\n\treturn a[i] + b->c * 3.14159;\n}\n",
    "  leading and trailing spaces   \n\n\r\n  \t ",
    "1234567890 3.14 1e-9 0x1F 1,000,000",
    "caf\xc3\xa9 na\xc3\xafve \xc3\x9c" "ber stra\xc3\x9f" "e",
    "\xe4\xbd\xa0\xe5\xa5\xbd\xe4\xb8\x96\xe7\x95\x8c \xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82 "
    "\xd9\x85\xd8\xb1\xd8\xad\xd8\xa8\xd8\xa7 \xf0\x9f\x98\x80\xf0\x9f\x91\x8d",
    "\xff\xfe invalid \xc3 utf8 \xed\xa0\x80 \xf4\x90\x80\x80 \x80",
    "<|begin_of_text|>Hello<|end_of_text|><|reserved_3|>",
    "<s> the and</s><unk><tool> x",
    "\xe2\x96\x81the\xe2\x96\x81" "and",
    "'s 're 'VE 'Ll 'd \xc5\xbf's",
    "",
};

static void tok_seeds(void) {
    mkdir_p("tokenizer");
    char name[64];
    for (int sel = 0; sel < 7; sel++)
        for (size_t i = 0; i < sizeof k_texts / sizeof k_texts[0]; i++) {
            uint8_t cfg = (uint8_t)(sel | ((i & 3) << 3) | ((i & 4) << 3));
            snprintf(name, sizeof name, "t%d-%02zu", sel, i);
            put("tokenizer", name, &cfg, 1, k_texts[i], strlen(k_texts[i]));
        }
    /* input-made vocabularies (make_vocab in fuzz-tokenizer.c) */
    static const char *const vocabs[] = {
        "\x10\x00\x01\xff" "!<s>\n!</s>\na\nb\nab\nc\n=a b\n?<x>\n\nab c<x>abab</s>",
        "\x11\x00\x01\x02" "!<s>\n!</s>\n<unk>\n\xe2\x96\x81\n\xe2\x96\x81" "a\nb\nab\n#<0x41>\n\nab b A",
        "\x52\xff\xff\xff" "h\ne\nl\no\nhe\nll\nhell\nhello\n=h e\n=l l\n=he ll\n=hell o\n\nhello hell",
        "\x71\x00\xff\x02" "~x\n!y\n\xc4\xa0\nz\n\n yz xz",
    };
    for (size_t i = 0; i < sizeof vocabs / sizeof vocabs[0]; i++) {
        uint8_t cfg = (uint8_t)(7 | (i << 3));
        snprintf(name, sizeof name, "vocab-%zu", i);
        const char *v = vocabs[i];
        size_t len = 4 + strlen(v + 4);
        put("tokenizer", name, &cfg, 1, v, len);
    }
}

/* --------------------------------------------------------------- sampler */

static void smp_seeds(void) {
    mkdir_p("sampler");
    struct {
        float temp;
        int16_t top_k;
        float top_p, min_p, pen;
        int16_t last_n;
        uint16_t nv;
        uint8_t mode;
    } cases[] = {
        {0.8f, 40, 0.95f, 0.05f, 1.0f, 64, 300, 1},  {0.0f, 0, 1.0f, 0.0f, 1.0f, 0, 10, 1},
        {1.5f, 0, 0.9f, 0.0f, 1.3f, 16, 2500, 5},    {0.7f, 5, 1.0f, 0.3f, 0.8f, 8, 50, 3},
        {-1.0f, 0, 0.5f, 0.0f, 1.0f, 0, 1, 1},       {1e-30f, 3, 1e-7f, 1.0f, 1e30f, 4, 100, 1},
    };
    char name[64];
    uint8_t buf[31 + 96];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memcpy(buf, &cases[i].temp, 4);
        memcpy(buf + 4, &cases[i].top_k, 2);
        memcpy(buf + 6, &cases[i].top_p, 4);
        memcpy(buf + 10, &cases[i].min_p, 4);
        memcpy(buf + 14, &cases[i].pen, 4);
        memcpy(buf + 18, &cases[i].last_n, 2);
        uint64_t seed = i * 1234567;
        memcpy(buf + 20, &seed, 8);
        memcpy(buf + 28, &cases[i].nv, 2);
        buf[30] = cases[i].mode;
        /* operations: sample, probs, accept, sample, new logits, probs, reset, ... */
        for (size_t k = 0; k < 96; k++) buf[31 + k] = (uint8_t)((k * 7 + i) % 6 == 5 ? 1 : (k * 7 + i) % 5);
        snprintf(name, sizeof name, "params-%zu", i);
        put("sampler", name, NULL, 0, buf, sizeof buf);
    }
}

/* -------------------------------------------------------------- grammar */

/* fuzz-grammar's layout: flags, ops count, text, ops. The ops walk a few tokens,
 * refuse one, clone and reset (see fuzz/fuzz-grammar.c). */
static const uint8_t k_gops[] = {0, 4, 8, 1, 12, 0, 2, 'a', 0, 5, 0, 3, 0, 0, 9, 0, 1, 0, 0, 0};

enum { G_SCHEMA = 1, G_EXPAND = 2, G_LOW = 4, G_NOMEM = 8 };

static void gram_put(const char *name, uint8_t flags, const char *text, size_t len) {
    uint8_t *buf = malloc(2 + len + sizeof k_gops);
    if (!buf) exit(1);
    buf[0] = flags;
    buf[1] = (uint8_t)sizeof k_gops;
    memcpy(buf + 2, text, len);
    memcpy(buf + 2 + len, k_gops, sizeof k_gops);
    put("grammar", name, NULL, 0, buf, 2 + len + sizeof k_gops);
    free(buf);
}

/* PRE + OPEN x reps + MID + CLOSE x reps, in the expanded form (a few bytes on disk). */
static void gram_nest(const char *name, uint8_t flags, uint32_t reps, const char *pre, const char *open,
                      const char *mid, const char *close) {
    char buf[512];
    const char *part[4] = {pre, open, mid, close};
    size_t n = 3;
    buf[0] = (char)(reps & 255), buf[1] = (char)(reps >> 8 & 255), buf[2] = (char)(reps >> 16 & 255);
    for (int k = 0; k < 4; k++) {
        size_t l = strlen(part[k]);
        if (n + l + 1 > sizeof buf) exit(1);
        memcpy(buf + n, part[k], l);
        n += l;
        if (k < 3) buf[n++] = 0;
    }
    gram_put(name, flags | G_EXPAND, buf, n);
}

static void grammar_seeds(void) {
    mkdir_p("grammar");
    static const struct {
        const char *name;
        uint8_t flags;
        const char *text;
    } one[] = {
        /* GBNF: the attacker shapes of issues 43.6 and 50.2, under both limit sets */
        {"atk-x60-y60", 0, "root ::= x{0,60}\nx ::= y{0,60}\ny ::= [a-z ]\n"},
        {"atk-x60-y60-low", G_LOW, "root ::= x{0,60}\nx ::= y{0,60}\ny ::= [a-z ]\n"},
        {"atk-rep1000", 0, "root ::= (\"a\"{0,1000}){0,1000}\n"},
        {"atk-rep1000-low", G_LOW, "root ::= (\"a\"{0,1000}){0,1000}\n"},
        {"atk-rep-big", 0, "root ::= \"a\"{100000}\n"},
        {"atk-rep-over", 0, "root ::= (\"ab\"{0,2000}){0,2000}\n"},
        {"stars-nested", 0, "root ::= (((\"a\"*)*)*)*\n"},
        {"stars-rules", 0, "root ::= (x*)* \"b\"\nx ::= (y* \"a\"?)*\ny ::= [a-c]*\n"},
        {"stars-ambiguous", 0, "root ::= (\"a\" | \"a\" | \"aa\")* (\"a\"* | [a-z]*)*\n"},
        {"leftrec-direct", 0, "root ::= root \"a\" | \"a\"\n"},
        {"leftrec-indirect", 0, "root ::= x\nx ::= y \"a\" | \"b\"\ny ::= x? x\n"},
        {"leftrec-empty", 0, "root ::= e root \"a\" | \"b\"\ne ::= \"\"?\n"},
        {"rightrec", 0, "root ::= \"a\" root | \"b\"\n"},
        {"json", 0,
         "root ::= value\nvalue ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
         "object ::= \"{\" ws (string \":\" ws value (\",\" ws string \":\" ws value)*)? \"}\" ws\n"
         "array ::= \"[\" ws (value (\",\" ws value)*)? \"]\" ws\n"
         "string ::= \"\\\"\" ([^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}))* "
         "\"\\\"\" ws\nnumber ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [0-9]{1,3})? ws\n"
         "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n"},
        {"utf8", 0, "root ::= [\\u00e9-\\U0001F600]+ \"\xe2\x82\xac\" [^a-z\\x80-\\xff]\n"},
        {"json-nomem", G_NOMEM, "root ::= (\"a\" | [b-z]{2,5})+ x\nx ::= \"{\" x? \"}\"\n"},
        /* JSON schemas */
        {"s-object", G_SCHEMA,
         "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"minLength\":1},"
         "\"age\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":"
         "{\"enum\":[\"a\",\"b\",1,null]},\"maxItems\":3}},\"required\":[\"name\"]}"},
        {"s-ref-root", G_SCHEMA, "{\"$ref\":\"#\"}"},
        {"s-ref-root-prop", G_SCHEMA, "{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#\"}}}"},
        {"s-ref-root-anyof", G_SCHEMA, "{\"anyOf\":[{\"$ref\":\"#\"},{\"type\":\"null\"}]}"},
        {"s-ref-root-items", G_SCHEMA, "{\"type\":\"array\",\"items\":{\"$ref\":\"#\"}}"},
        {"s-ref-cycle", G_SCHEMA,
         "{\"$ref\":\"#/$defs/a\",\"$defs\":{\"a\":{\"$ref\":\"#/$defs/b\"},\"b\":{\"$ref\":\"#/$defs/a\"}}}"},
        {"s-ref-pct", G_SCHEMA, "{\"$defs\":{\"a b\":{\"type\":\"string\"},\"c~d/e\":{}},"
                               "\"anyOf\":[{\"$ref\":\"#/$defs/a%20b\"},{\"$ref\":\"#/$defs/c~0d~1e\"}]}"},
        {"s-any", G_SCHEMA, "{}"},
        /* ranges, multiples, patterns, formats, tuples, records, allOf, nullable */
        {"s-int-range", G_SCHEMA, "{\"type\":\"integer\",\"minimum\":-9007199254740991,\"maximum\":9007199254740991}"},
        {"s-int-mult", G_SCHEMA, "{\"type\":\"integer\",\"exclusiveMinimum\":-50,\"maximum\":1234,\"multipleOf\":7}"},
        {"s-num-range", G_SCHEMA, "{\"type\":\"number\",\"exclusiveMinimum\":0,\"exclusiveMaximum\":100,\"nullable\":true}"},
        {"s-num-dec", G_SCHEMA, "{\"type\":\"number\",\"exclusiveMinimum\":-2.25e0,\"maximum\":0.12345678901234567891}"},
        {"s-num-mult", G_SCHEMA, "{\"type\":\"number\",\"minimum\":-1.3,\"exclusiveMaximum\":7.6E1,\"multipleOf\":0.25}"},
        {"s-num-mult-big", G_SCHEMA, "{\"anyOf\":[{\"type\":\"integer\",\"multipleOf\":4001,\"maximum\":1e5},"
                                    "{\"type\":\"number\",\"multipleOf\":3e-20,\"minimum\":1e-300}]}"},
        {"s-pattern", G_SCHEMA, "{\"type\":\"string\",\"pattern\":\"^(?:[A-Z]{2}|x+?)-\\\\d{3}[^\\\\s\\\"]*(a|b|)$\"}"},
        {"s-pattern-open", G_SCHEMA, "{\"pattern\":\"[.][\\\\]-]{2,}|^\\\\u00e9.?$\"}"},
        {"s-formats", G_SCHEMA, "{\"prefixItems\":[{\"format\":\"email\"},{\"format\":\"uri\"},{\"format\":\"ipv4\"},"
                               "{\"format\":\"ipv6\"},{\"format\":\"hostname\"},{\"format\":\"date\"}],\"items\":false}"},
        {"s-tuple7", G_SCHEMA, "{\"items\":[{\"type\":\"integer\"},{\"const\":1}],\"additionalItems\":{\"type\":\"null\"},"
                              "\"minItems\":1,\"maxItems\":4}"},
        {"s-record", G_SCHEMA, "{\"type\":\"object\",\"propertyNames\":{\"pattern\":\"^[a-z]{1,3}$\"},"
                              "\"additionalProperties\":{\"type\":\"integer\",\"minimum\":0}}"},
        {"s-pattern-props", G_SCHEMA, "{\"properties\":{\"id\":{}},\"patternProperties\":{\"^x-\":{\"type\":\"boolean\"}}}"},
        {"s-allof-merge", G_SCHEMA, "{\"allOf\":[{\"properties\":{\"a\":{}},\"required\":[\"a\"]},{\"$ref\":\"#/$defs/b\"}],"
                                   "\"$defs\":{\"b\":{\"type\":\"object\",\"properties\":{\"b\":{\"$ref\":\"#\"}}}}}"},
    };
    for (size_t i = 0; i < sizeof one / sizeof one[0]; i++) gram_put(one[i].name, one[i].flags, one[i].text, strlen(one[i].text));

    /* '(' groups: at, past and far past PKV_GRAMMAR_MAX_NESTING (256), closed or not */
    const char *R = "root ::= ";
    gram_nest("nest-256", 0, 256, R, "(", "\"a\"", ")");
    gram_nest("nest-257", 0, 257, R, "(", "\"a\"", ")");
    gram_nest("nest-100000", 0, 100000, R, "(", "\"a\"", ")");
    gram_nest("nest-open-100000", 0, 100000, R, "(", "\"a\"", "");
    gram_nest("nest-close-100000", 0, 100000, R, "", "\"a\"", ")");
    gram_nest("nest-alt-100000", 0, 100000, R, "(\"a\" | ", "\"b\"", ")*");
    gram_nest("nest-alt-200", 0, 200, R, "(\"a\" | ", "\"b\"", ")");
    gram_nest("nest-star-200", 0, 200, R, "(\"a\" ", "\"b\"", ")*");
    gram_nest("nest-star-nullable-200", 0, 200, R, "(", "\"a\"", ")*");
    gram_nest("nest-rep-200", G_LOW, 200, R, "(", "[ab]", "){0,2}");
    gram_nest("rules-long", 0, 30000, R, "x ", "\nx ::= \"a\"?", "");
    /* schemas: nested past the depth limit (64) in each keyword (as deep as the 1 MiB
     * text limit allows), and right at it */
    gram_nest("s-items-100000", G_SCHEMA, 100000, "", "{\"items\":", "{}", "}");
    gram_nest("s-items-62", G_SCHEMA, 62, "", "{\"type\":\"array\",\"items\":", "{\"type\":\"integer\"}", "}");
    gram_nest("s-items-64", G_SCHEMA, 64, "", "{\"items\":", "{}", "}");
    gram_nest("s-anyof-80000", G_SCHEMA, 80000, "", "{\"anyOf\":[", "{}", "]}");
    gram_nest("s-anyof-30", G_SCHEMA, 30, "", "{\"anyOf\":[{\"type\":\"null\"},", "{\"type\":\"string\"}", "]}");
    gram_nest("s-allof-80000", G_SCHEMA, 80000, "", "{\"allOf\":[", "{}", "]}");
    gram_nest("s-props-25000", G_SCHEMA, 25000, "", "{\"type\":\"object\",\"properties\":{\"a\":", "{}", "}}");
    gram_nest("s-props-30", G_SCHEMA, 30, "", "{\"type\":\"object\",\"required\":[\"a\"],\"properties\":{\"a\":",
              "{\"type\":\"boolean\"}", "}}");
    gram_nest("s-const-100000", G_SCHEMA, 100000, "{\"const\":", "[", "1", "]");
    gram_nest("s-json-100000", G_SCHEMA, 100000, "", "[", "", "]");
    gram_nest("s-nullable-100000", G_SCHEMA, 100000, "", "{\"nullable\":true,\"items\":", "{}", "}");
    gram_nest("s-prefix-100000", G_SCHEMA, 100000, "", "{\"prefixItems\":[", "{}", "]}");
    /* $ref: "#" at every level of a deep schema; chains of 1000 and 20 definitions */
    gram_nest("s-ref-nest-60000", G_SCHEMA, 60000, "", "{\"$ref\":\"#\",\"x\":", "{}", "}");
    gram_nest("s-ref-anyof-30", G_SCHEMA, 30, "", "{\"anyOf\":[{\"$ref\":\"#\"},", "{\"type\":\"null\"}", "]}");
    {
        static char buf[256 << 10]; /* the largest below is ~70 KB */
        size_t n = (size_t)snprintf(buf, sizeof buf, "{\"$ref\":\"#/$defs/a0\",\"$defs\":{");
        for (int i = 0; i < 1000; i++)
            n += (size_t)snprintf(buf + n, sizeof buf - n, "\"a%d\":{\"$ref\":\"#/$defs/a%d\"},", i, i + 1);
        n += (size_t)snprintf(buf + n, sizeof buf - n, "\"a1000\":{\"type\":\"integer\"}}}");
        gram_put("s-ref-chain-1000", G_SCHEMA, buf, n);
        n = (size_t)snprintf(buf, sizeof buf, "{\"$ref\":\"#/$defs/a0\",\"$defs\":{");
        for (int i = 0; i < 20; i++)
            n += (size_t)snprintf(buf + n, sizeof buf - n, "\"a%d\":{\"anyOf\":[{\"$ref\":\"#/$defs/a%d\"},{\"type\":\"null\"}]},", i, i + 1);
        n += (size_t)snprintf(buf + n, sizeof buf - n, "\"a20\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/a0\"}}}}");
        gram_put("s-ref-chain-20", G_SCHEMA, buf, n);
        n = (size_t)snprintf(buf, sizeof buf, "{\"enum\":[");
        for (int i = 0; i < 5000; i++) n += (size_t)snprintf(buf + n, sizeof buf - n, "%s\"v%d\"", i ? "," : "", i);
        n += (size_t)snprintf(buf + n, sizeof buf - n, "]}");
        gram_put("s-enum-5000", G_SCHEMA, buf, n);
        /* a pattern with groups nested past its limit (32) */
        n = (size_t)snprintf(buf, sizeof buf, "{\"pattern\":\"");
        for (int i = 0; i < 40; i++) n += (size_t)snprintf(buf + n, sizeof buf - n, "(a|");
        for (int i = 0; i < 40; i++) n += (size_t)snprintf(buf + n, sizeof buf - n, ")*");
        n += (size_t)snprintf(buf + n, sizeof buf - n, "\"}");
        gram_put("s-pattern-groups-40", G_SCHEMA, buf, n);
        /* a chain of 3000 rules, each the next one twice */
        n = (size_t)snprintf(buf, sizeof buf, "root ::= r0\n");
        for (int i = 0; i < 3000; i++) n += (size_t)snprintf(buf + n, sizeof buf - n, "r%d ::= r%d r%d?\n", i, i + 1, i + 1);
        n += (size_t)snprintf(buf + n, sizeof buf - n, "r3000 ::= [a-z]\n");
        gram_put("rules-chain-3000", 0, buf, n);
    }
}

/* ---------------------------------------------------------------- jinja */

/* fuzz-jinja: the shapes of issues 43.4 and 50.6 (at the harness's 64 KB input
 * limit): one long chain of each kind, nesting at and past the limit, many
 * small tags (the lexer), long elif chains, integer overflow, work-heavy loops.
 * The real model templates are copied next to these (make fuzz-corpus). */
static void jinja_chain(const char *name, const char *head, const char *unit, int count, const char *tail) {
    static char buf[65536];
    size_t n = (size_t)snprintf(buf, sizeof buf, "%s", head), ul = strlen(unit), tl = strlen(tail);
    for (int i = 0; i < count && n + ul + tl < sizeof buf; i++, n += ul) memcpy(buf + n, unit, ul);
    memcpy(buf + n, tail, tl);
    put("jinja", name, NULL, 0, buf, n + tl);
}

static void jinja_seeds(void) {
    mkdir_p("jinja");
    jinja_chain("chain-attr", "{{ x", ".y", 30000, " }}");
    jinja_chain("chain-index", "{{ x", "[0]", 20000, " }}");
    jinja_chain("chain-add", "{{ 1", "+1", 30000, " }}");
    jinja_chain("chain-not", "{{ ", "not ", 15000, "x }}");
    jinja_chain("chain-neg", "{{ ", "-", 60000, "1 }}");
    jinja_chain("chain-filter", "{{ x", "|trim", 12000, " }}");
    jinja_chain("chain-concat", "{{ 'a'", " ~ 'a'", 10000, " }}");
    jinja_chain("chain-call", "{{ f", "()", 30000, " }}");
    jinja_chain("nest-200", "{{ ", "(", 199, "1");
    jinja_chain("nest-parens", "{{ ", "(", 30000, "1 }}");
    jinja_chain("nest-lists", "{{ ", "[", 30000, "1 }}");
    jinja_chain("nest-blocks", "", "{% if x %}", 6000, "{% endif %}");
    jinja_chain("nest-for", "", "{% for i in x %}", 4000, "");
    jinja_chain("tags-small", "", "{{ a }}\n", 8000, "");
    jinja_chain("strings-many", "", "{{ 'aa' }}", 6000, "");
    jinja_chain("elif-chain", "{% if x == 0 %}0", "{% elif x == 1 %}1", 3500, "{% else %}e{% endif %}");
    jinja_chain("chain-add-199", "{{ 0", "+1", 198, " }}");
    static const char *const one[][2] = {
        {"overflow", "{{ 9223372036854775807 + 1 }}{{ (-9223372036854775807 - 1) // -1 }}{{ -(-9223372036854775807 - 1) }}"
                     "{{ 2 ** 63 }}{{ [9223372036854775807, 1]|sum }}{{ (-9223372036854775807 - 1)|abs }}"},
        {"overflow-seq", "{{ range(9223372036854775800, 9223372036854775807, 5)|list }}{{ 'abc'[::9223372036854775807] }}"
                         "{{ 'abc'[-9223372036854775807 - 1] }}{{ 'ab' * 9223372036854775807 }}{{ 1e300|int }}"},
        {"work-scan", "{% set a = 'az' * 500 %}{% set s = a * 500 %}{% for i in range(100000) %}{% if 'zz' in s %}{% endif %}"
                      "{% endfor %}"},
        {"work-dict", "{% set ns = namespace(d={}) %}{% for i in range(100000) %}{% set _ = ns.d.update({i: i}) %}{% endfor %}"},
        {"loop-nested", "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"},
    };
    for (size_t i = 0; i < sizeof one / sizeof one[0]; i++) put("jinja", one[i][0], NULL, 0, one[i][1], strlen(one[i][1]));
}

/* ---------------------------------------------------------------- server */

/* One input of fuzz-server: requests "selector byte + body", NUL separated. */
static void server_input(const char *name, int n, const int *sel, const char *const *body) {
    char buf[4096];
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        size_t b = strlen(body[i]);
        if (len + b + 2 > sizeof buf) exit(1);
        if (i) buf[len++] = 0;
        buf[len++] = (char)sel[i];
        memcpy(buf + len, body[i], b);
        len += b;
    }
    put("server", name, NULL, 0, buf, len);
}

static void server_seeds(void) {
    mkdir_p("server");
    /* selectors: see fuzz/fuzz-server.c (low 4 bits: endpoint; bits 4-6: template or context) */
    enum { CHAT = 0, COMPL = 1, TOK = 2, DETOK = 3, CREATE = 4, LIST = 5, INFO = 6, FORK = 7, APPEND = 8,
           TRUNC = 9, GEN = 10, DEL = 11, MODELS = 12, METRICS = 13, HEALTH = 14, RAW = 15 };
    static const struct {
        const char *name;
        int n;
        int sel[8];
        const char *body[8];
    } in[] = {
        {"completion", 1, {COMPL}, {"{\"prompt\":\"hello world\",\"max_tokens\":8,\"temperature\":0}"}},
        {"completion-simple", 1, {COMPL | 0x80}, {"{\"prompt\":\"hello\",\"max_tokens\":4,\"seed\":3,\"top_k\":5}"}},
        {"completion-ids", 1, {COMPL}, {"{\"prompt\":[1,2,3,250],\"max_tokens\":3,\"logprobs\":3,\"n\":2}"}},
        {"completion-stream", 1, {COMPL},
         {"{\"prompt\":\"a b c\",\"max_tokens\":6,\"stream\":true,\"stream_options\":{\"include_usage\":true},"
          "\"stop\":[\"e\",\"xy\"],\"top_p\":0.9,\"min_p\":0.05,\"presence_penalty\":0.5}"}},
        {"chat-chatml", 1, {CHAT | 0x10},
         {"{\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},{\"role\":\"user\",\"content\":\"hi\"}],"
          "\"max_tokens\":5,\"temperature\":0}"}},
        {"chat-llama3-stream", 1, {CHAT | 0x20},
         {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"x\"}]}],\"stream\":true,"
          "\"max_completion_tokens\":4,\"logprobs\":true,\"top_logprobs\":2,\"n\":3}"}},
        {"chat-notemplate", 1, {CHAT | 0x80}, {"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"}},
        {"tokenize", 2, {TOK, DETOK},
         {"{\"content\":\"<|im_start|>hello\",\"with_pieces\":true,\"add_special\":false}", "{\"tokens\":[1,2,299]}"}},
        {"contexts", 8, {CREATE, FORK, APPEND | 0x10, GEN | 0x10, TRUNC, INFO | 0x10, LIST, DEL},
         {"{\"prompt\":\"once upon a time\"}", "{}", "{\"text\":\" there was\"}",
          "{\"max_tokens\":4,\"temperature\":0}", "{\"n_tokens\":2}", "", "", ""}},
        {"contexts-stream", 3, {CREATE, GEN, GEN | 0x60},
         {"{\"tokens\":[5,6,7,8,9]}", "{\"max_tokens\":5,\"stream\":true,\"seed\":1}", "{\"max_tokens\":1}"}},
        {"misc", 4, {MODELS, METRICS, HEALTH, RAW},
         {"", "", "", "POST /v1/completions\n{\"prompt\":\"x\",\"max_tokens\":2}"}},
        {"raw-context", 2, {RAW, RAW}, {"POST /v1/contexts\n{\"prompt\":\"abc\"}", "GET /v1/contexts/ctx-1\n"}},
        {"raw-kv", 4, {RAW, RAW, RAW, RAW},
         {"POST /v1/contexts\n{\"prompt\":\"abc def ghi\"}", "POST /v1/contexts/ctx-1/fork\n", "GET /v1/kv\n",
          "POST /v1/kv\n"}},
        {"bad", 3, {COMPL, COMPL, CHAT | 0x10},
         {"{\"prompt\":\"x\",\"prompt\":\"y\"}", "{\"prompt\":\"x\",\"temperature\":7,\"logit_bias\":{\"1\":2}}",
          "{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}"}},
        /* constrained output: a schema, a costly grammar beside a plain request (the
         * harness's servers have low grammar work limits), recursion through "#" */
        {"grammar", 3, {CHAT | 0x10, COMPL, COMPL},
         {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":12,\"response_format\":"
          "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"a\",\"schema\":{\"type\":\"object\","
          "\"properties\":{\"a\":{\"type\":\"array\",\"items\":{\"$ref\":\"#\"}}}}}}}",
          "{\"prompt\":\"x\",\"max_tokens\":40,\"grammar\":\"root ::= x{0,60}\\nx ::= y{0,60}\\ny ::= [a-z ]\"}",
          "{\"prompt\":\"y\",\"max_tokens\":4}"}},
        {"grammar-bad", 3, {COMPL, CHAT, COMPL},
         {"{\"prompt\":\"x\",\"grammar\":\"root ::= ((((((((((\\\"a\\\"))))))))))\"}",
          "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_object\","
          "\"schema\":{\"$ref\":\"#\"}}}",
          "{\"prompt\":\"x\",\"max_tokens\":20,\"grammar\":\"root ::= (\\\"a\\\"{0,1000}){0,1000}\"}"}},
    };
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++) server_input(in[i].name, in[i].n, in[i].sel, in[i].body);
    /* a grammar nested 2000 deep (the limit is 256; deeper ones are fuzz-grammar's,
     * as a seed this large would raise libFuzzer's input size for every request) */
    {
        enum { D = 2000 };
        static char body[2 * D + 64];
        size_t n = 0;
        body[n++] = (char)COMPL;
        n += (size_t)snprintf(body + n, sizeof body - n, "{\"prompt\":\"x\",\"grammar\":\"root ::= ");
        memset(body + n, '(', D), n += D;
        n += (size_t)snprintf(body + n, sizeof body - n, "[a]");
        memset(body + n, ')', D), n += D;
        n += (size_t)snprintf(body + n, sizeof body - n, "\"}");
        put("server", "grammar-deep", NULL, 0, body, n);
    }
}

/* ---------------------------------------------------------------- media */

#ifdef PKV_HAVE_SNDFILE
#include <sndfile.h>
typedef struct seed_buf {
    uint8_t d[1 << 16];
    sf_count_t n, pos;
} seed_buf;
static sf_count_t sb_len(void *u) { return ((seed_buf *)u)->n; }
static sf_count_t sb_seek(sf_count_t off, int wh, void *u) {
    seed_buf *b = u;
    sf_count_t base = wh == SEEK_SET ? 0 : wh == SEEK_CUR ? b->pos : b->n;
    if (base + off < 0 || base + off > (sf_count_t)sizeof b->d) return -1;
    b->pos = base + off;
    return b->pos;
}
static sf_count_t sb_read(void *p, sf_count_t c, void *u) {
    seed_buf *b = u;
    sf_count_t k = b->n - b->pos < c ? b->n - b->pos : c;
    if (k <= 0) return 0;
    memcpy(p, b->d + b->pos, (size_t)k);
    b->pos += k;
    return k;
}
static sf_count_t sb_write(const void *p, sf_count_t c, void *u) {
    seed_buf *b = u;
    if (b->pos + c > (sf_count_t)sizeof b->d) return 0;
    memcpy(b->d + b->pos, p, (size_t)c);
    b->pos += c;
    if (b->pos > b->n) b->n = b->pos;
    return c;
}
static sf_count_t sb_tell(void *u) { return ((seed_buf *)u)->pos; }

/* A file of n frames of a 440 Hz tone in `format` at `rate`, behind flags. */
static void audio_seed(const char *name, uint8_t flags, int format, int rate, int ch, int n) {
    static seed_buf b;
    memset(&b, 0, sizeof b);
    SF_VIRTUAL_IO vio = {sb_len, sb_seek, sb_read, sb_write, sb_tell};
    SF_INFO info = {.samplerate = rate, .channels = ch, .format = format};
    SNDFILE *sf = sf_open_virtual(&vio, SFM_WRITE, &info, &b);
    if (!sf) {
        fprintf(stderr, "seeds: %s: %s\n", name, sf_strerror(NULL));
        exit(1);
    }
    float x[2 * 4096];
    for (int i = 0; i < n * ch && i < 2 * 4096; i++) x[i] = 0.5f * (float)sin(6.2831853 * 440.0 * (i / ch) / rate);
    sf_writef_float(sf, x, n);
    sf_close(sf);
    put("audio", name, &flags, 1, b.d, (size_t)b.n);
}
#endif

/* A 16-bit mono WAV at 16 kHz written byte by byte (the seed exists without
 * libsndfile too). */
static void wav_by_hand(void) {
    uint8_t f[44 + 64];
    const uint8_t h[44] = {'R', 'I', 'F', 'F', 36 + 64, 0, 0, 0, 'W', 'A', 'V', 'E', 'f', 'm', 't', ' ', 16, 0, 0, 0, 1, 0,
                           1, 0, 0x80, 0x3e, 0, 0, 0, 0x7d, 0, 0, 2, 0, 16, 0, 'd', 'a', 't', 'a', 64, 0, 0, 0};
    memcpy(f, h, 44);
    for (int i = 0; i < 64; i++) f[44 + i] = (uint8_t)(i * 37);
    uint8_t flags = 0;
    put("audio", "wav-hand", &flags, 1, f, sizeof f);
}

static void audio_seeds(void) {
    mkdir_p("audio");
    wav_by_hand();
#ifdef PKV_HAVE_SNDFILE
    audio_seed("wav16", 0, SF_FORMAT_WAV | SF_FORMAT_PCM_16, 16000, 1, 800);
    audio_seed("wav16-stereo-44k", 0, SF_FORMAT_WAV | SF_FORMAT_PCM_16, 44100, 2, 2000);
    audio_seed("wav-float-8k", 1, SF_FORMAT_WAV | SF_FORMAT_FLOAT, 16000, 1, 400);
    audio_seed("wav-u8", 2, SF_FORMAT_WAV | SF_FORMAT_PCM_U8, 11025, 1, 500);
    audio_seed("wav24-ext", 3, SF_FORMAT_WAVEX | SF_FORMAT_PCM_24, 16000, 2, 300);
    audio_seed("wav-ulaw", 0, SF_FORMAT_WAV | SF_FORMAT_ULAW, 8000, 1, 400);
    audio_seed("wav-adpcm", 0, SF_FORMAT_WAV | SF_FORMAT_IMA_ADPCM, 16000, 1, 400);
    audio_seed("rf64", 0, SF_FORMAT_RF64 | SF_FORMAT_PCM_16, 16000, 1, 300);
    audio_seed("flac16", 0, SF_FORMAT_FLAC | SF_FORMAT_PCM_16, 16000, 1, 1200);
    audio_seed("flac24-stereo", 4, SF_FORMAT_FLAC | SF_FORMAT_PCM_24, 22050, 2, 900);
    audio_seed("ogg-vorbis", 0, SF_FORMAT_OGG | SF_FORMAT_VORBIS, 16000, 1, 2000);
    audio_seed("ogg-vorbis-stereo", 1, SF_FORMAT_OGG | SF_FORMAT_VORBIS, 22050, 2, 1500);
#endif
}

#ifdef PKV_HAVE_SPNG
#include <spng.h>
static void png_seed(const char *name, int ct, int depth, int interlace) {
    const uint32_t W = 7, H = 5;
    const int ch = ct == 0 || ct == 3 ? 1 : ct == 4 ? 2 : ct == 2 ? 3 : 4;
    const size_t stride = ((size_t)W * ch * depth + 7) / 8;
    uint8_t raw[7 * 4 * 2 * 5];
    for (size_t i = 0; i < stride * H; i++) raw[i] = (uint8_t)(i * 29 + 3);
    spng_ctx *c = spng_ctx_new(SPNG_CTX_ENCODER);
    spng_set_option(c, SPNG_ENCODE_TO_BUFFER, 1);
    struct spng_ihdr ih = {.width = W, .height = H, .bit_depth = (uint8_t)depth, .color_type = (uint8_t)ct,
                           .interlace_method = (uint8_t)interlace};
    int e = spng_set_ihdr(c, &ih);
    if (!e && ct == 3) {
        struct spng_plte p = {.n_entries = 1u << (depth < 8 ? depth : 8)};
        for (uint32_t i = 0; i < p.n_entries; i++) p.entries[i].red = (uint8_t)i, p.entries[i].green = (uint8_t)(255 - i), p.entries[i].blue = 7;
        e = spng_set_plte(c, &p);
    }
    if (!e) e = spng_encode_image(c, raw, stride * H, SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE);
    size_t n = 0;
    void *png = e ? NULL : spng_get_png_buffer(c, &n, &e);
    spng_ctx_free(c);
    if (e) {
        fprintf(stderr, "seeds: %s: %s\n", name, spng_strerror(e));
        exit(1);
    }
    uint8_t flags = 0;
    put("image", name, &flags, 1, png, n);
    free(png);
}
#endif

#ifdef PKV_HAVE_JPEG
#include <jpeglib.h>
static void jpeg_seed(const char *name, int comp, J_COLOR_SPACE cs, bool progressive) {
    const int W = 19, H = 11;
    uint8_t px[19 * 11 * 4];
    for (int i = 0; i < W * H * comp; i++) px[i] = (uint8_t)(i * 7 + (i / 19) * 3);
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr err;
    c.err = jpeg_std_error(&err);
    jpeg_create_compress(&c);
    unsigned char *buf = NULL;
    unsigned long n = 0;
    jpeg_mem_dest(&c, &buf, &n);
    c.image_width = W, c.image_height = H, c.input_components = comp, c.in_color_space = cs;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, 80, TRUE);
    if (progressive) jpeg_simple_progression(&c);
    jpeg_start_compress(&c, TRUE);
    while (c.next_scanline < c.image_height) {
        JSAMPROW row = px + (size_t)c.next_scanline * W * comp;
        jpeg_write_scanlines(&c, &row, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    uint8_t flags = 0;
    put("image", name, &flags, 1, buf, n);
    free(buf);
}
#endif

static void image_seeds(void) {
    mkdir_p("image");
#ifdef PKV_HAVE_SPNG
    png_seed("png-gray1", 0, 1, 0);
    png_seed("png-gray16", 0, 16, 0);
    png_seed("png-ga8", 4, 8, 0);
    png_seed("png-palette4", 3, 4, 0);
    png_seed("png-palette8", 3, 8, 0);
    png_seed("png-rgb8", 2, 8, 0);
    png_seed("png-rgb16-interlaced", 2, 16, 1);
    png_seed("png-rgba8", 6, 8, 0);
#endif
#ifdef PKV_HAVE_JPEG
    jpeg_seed("jpeg-baseline", 3, JCS_RGB, false);
    jpeg_seed("jpeg-progressive", 3, JCS_RGB, true);
    jpeg_seed("jpeg-gray", 1, JCS_GRAYSCALE, false);
    jpeg_seed("jpeg-cmyk", 4, JCS_CMYK, false);
#endif
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    g_dir = argv[1];
    pkv_log_set(NULL, NULL, PKV_LOG_WARN);
    mkdir_p("");
    gguf_seeds();
    kv_seeds();
    tok_seeds();
    smp_seeds();
    grammar_seeds();
    server_seeds();
    jinja_seeds();
    audio_seeds();
    image_seeds();
    printf("pkv-fuzz-seeds: %d files under %s\n", g_files, g_dir);
    return 0;
}
