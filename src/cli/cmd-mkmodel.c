/* pagekv mkmodel: write a GGUF test model with random weights. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli/cli.h"
#include "media/mkmmproj-audio.h"
#include "model/gguf.h"
#include "media/vision-impl.h"
#include "cli/commands.h"
#include "pagekv.h"

/* -------------------------------------------------------------- mkmodel */

/* "3,5" -> {3, 5}; false (printed) on a bad list. */
static bool parse_layers(const char *s, int32_t *out, int max, int *n) {
    *n = 0;
    for (const char *q = s; *q;) {
        char *end;
        long x = strtol(q, &end, 10);
        if (end == q || x < 0 || x > 4095 || *n == max || (*end && *end != ',')) {
            fprintf(stderr, "pagekv mkmodel: --shared-kv-layers expects up to %d comma-separated layer indices, got '%s'\n",
                    max, s);
            return false;
        }
        out[(*n)++] = (int32_t)x;
        q = *end ? end + 1 : end;
    }
    if (!*n) fprintf(stderr, "pagekv mkmodel: --shared-kv-layers is empty\n");
    return *n > 0;
}

/* The chat-template families mkmodel writes (pkv_mkmodel_params.chat_template). */
static bool family_known(const char *name) {
    static const char *const k[] = {"chatml", "llama3", "llama2", "mistral", "gemma", "phi3", "deepseek", "voxtral"};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (!strcmp(name, k[i])) return true;
    return false;
}

int pkv_cli_mkmodel(int argc, char **argv) {
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    const char *tpl_arg = NULL;
    char *tpl_text = NULL;
    bool no_template = false;
    const char *out = NULL, *mmproj_out = NULL;
    int32_t kv_layers[256];
    int n_kv_layers = 0;
    bool vision = false, vision_f32 = false;
    int vision_size = 0;
    static const char *const image_tokens[] = {"<start_of_image>", "<end_of_image>", NULL};
    struct {
        const char *opt;
        int *dst;
    } ints[] = {{"--layers", &p.n_layer}, {"--dim", &p.n_embd}, {"--heads", &p.n_head}, {"--kv-heads", &p.n_head_kv},
                {"--head-dim", &p.head_dim}, {"--ffn", &p.n_ff}, {"--vocab", &p.n_vocab}, {"--ctx", &p.n_ctx},
                {"--experts", &p.n_expert}, {"--experts-used", &p.n_expert_used}, {"--sliding-window", &p.sliding_window},
                {"--ssm-v-heads", &p.ssm_v_heads}, {"--ssm-k-heads", &p.ssm_k_heads}, {"--ssm-head-dim", &p.ssm_head_dim}, {"--mtp", &p.n_mtp},
                {"--head-dim-swa", &p.head_dim_swa}, {"--kv-heads-full", &p.n_head_kv_full}};
    /* gemma4's sizes where 0 means none (the params' 0 is the default, < 0 none) */
    struct {
        const char *opt;
        int *dst;
    } ints0[] = {{"--per-layer-embd", &p.n_embd_per_layer}, {"--shared-kv", &p.n_shared_kv}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        long long x;
        bool done = false;
        for (size_t k = 0; k < sizeof ints / sizeof ints[0]; k++)
            if (!strcmp(a, ints[k].opt)) {
                if (!(v = pkv_cli_value(argc, argv, &i)) || !pkv_cli_int(a, v, 1, 1 << 24, &x)) return 2;
                *ints[k].dst = (int)x;
                done = true;
            }
        for (size_t k = 0; k < sizeof ints0 / sizeof ints0[0]; k++)
            if (!strcmp(a, ints0[k].opt)) {
                if (!(v = pkv_cli_value(argc, argv, &i)) || !pkv_cli_int(a, v, 0, 1 << 16, &x)) return 2;
                *ints0[k].dst = x ? (int)x : -1;
                done = true;
            }
        if (done) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: pagekv mkmodel [--arch llama|qwen2|qwen3|qwen3moe|phi3|gemma2|gemma3|gemma4|gemma4-assistant|gpt-oss|qwen35|voxtral]\n"
                   "                      [--type TYPE]\n"
                   "                      [--layers N --dim N --heads N --kv-heads N --head-dim N --ffn N\n"
                   "                       --vocab N --ctx N --seed N --no-vocab --tied] [--chat-template NAME|FILE | --no-template]\n"
                   "                      [--pre NAME]\n"
                   "                      -o FILE.gguf\n"
                   "Writes a GGUF model with random weights (scaled so activations stay sane) and a small\n"
                   "byte-level BPE vocabulary of printable words (or none with --no-vocab).\n"
                   "TYPE: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q2_k q3_k q4_k q5_k q6_k q4_k_m iq1_s iq1_m\n"
                   "iq2_xxs iq2_xs iq2_s iq3_xxs iq3_s iq4_nl iq4_xs tq1_0 tq2_0 mxfp4 (quantized by nearest\n"
                   "rounding: valid blocks, less accurate than llama-quantize's for the 1-3 bit types).\n"
                   "Mixtures as llama-quantize's _M files: q4_k_m: q4_k with q6_k for the output matrix and\n"
                   "every other layer's attn_v and ffn_down; q3_k_m, q5_k_m, iq3_m (iq3_s), iq2_m (iq2_s), or\n"
                   "any TYPE_m: TYPE with q6_k output, q4_k attn_v/ffn_down and q5_k attn_k on alternate layers\n"
                   "(dims then multiples of 256).\n"
                   "Defaults: llama f16, 2 layers, dim 128, 4 heads, 2 KV heads, ffn 256, vocab 512;\n"
                   "for the types of 256-element blocks (k-quants, iq2/iq3/iq1, iq4_xs, tq1_0, tq2_0) dim 256\n"
                   "and ffn 512.\n"
                   "The vocabulary's special tokens are chatml's (below), or with --no-template\n"
                   "<|begin_of_text|> 256 (BOS, added) and <|end_of_text|> 257.\n"
                   "Mixture of experts (--arch qwen3moe: qwen3 attention, experts in place of the FFN;\n"
                   "--arch gpt-oss: below):\n"
                   "  --experts N              experts per layer (default 4); --ffn is one expert's rows\n"
                   "  --experts-used K         experts each token is routed to (default 2)\n"
                   "gpt-oss (--arch gpt-oss: Q/K/V/O biases, attention sinks, every other layer sliding\n"
                   "(--sliding-window, default 8), RoPE base 150000 with YaRN factor 4 over an original\n"
                   "context of 256, biased experts with the clamped SwiGLU; --type mxfp4 gives MXFP4 experts)\n"
                   "Gemma 2 (--arch gemma2: embedding scale, post-norms, GeGLU, soft-caps 50/30, tied output)\n"
                   "and Gemma 3 (--arch gemma3: gemma2 with Q/K norms and no soft-caps; RoPE base 1e6 and\n"
                   "linear scaling by 4 on the global layers, base 10000 on the sliding ones):\n"
                   "  --sliding-window N       tokens the sliding layers see (default 8): gemma2's even\n"
                   "                           layers; gemma3's five of every six (--layers 6 or more\n"
                   "                           for a global layer)\n"
                   "  --vision --mmproj-out PROJ.gguf\n"
                   "                           (gemma3) also write a Gemma 3 vision projector for it, as\n"
                   "                           llama.cpp's convert_hf_to_gguf.py --mmproj writes one: SigLIP,\n"
                   "                           2 blocks of width 64, 14-pixel patches, 4x4 pooling, f16 blocks;\n"
                   "                           the model gets the gemma chat template and the control tokens\n"
                   "                           <start_of_image>, <end_of_image>\n"
                   "  --image-size N           the projector's square input (default 224: a 16x16 patch grid\n"
                   "                           pooled to 4x4 = 16 rows; a multiple of 56)\n"
                   "  --vision-f32             the projector's block matrices in f32 (--outtype f32)\n"
                   "Gemma 4 (--arch gemma4, llama.cpp's keys and tensors: per-layer head sizes and KV heads,\n"
                   "proportional RoPE on the full layers (a quarter of their pairs turn, base 1e6; 1e4 on the\n"
                   "sliding ones), V = K on the full layers (no attn_v), V norm, layer_output_scale, final\n"
                   "soft-cap 30, tied output; the sharing layers' FFN twice --ffn; default 6 layers,\n"
                   "--head-dim 64):\n"
                   "  --swa-layers sfssf       one s (sliding) or f (full) per layer (default: a full layer every\n"
                   "                           third counting back from the last layer with its own KV, the\n"
                   "                           sharing layers alternating s and f)\n"
                   "  --sliding-window N       tokens the sliding layers see (default 8)\n"
                   "  --head-dim-swa N         head size of the sliding layers (default --head-dim / 2)\n"
                   "  --kv-heads-full N        KV heads of the full layers (default 1; --kv-heads: sliding)\n"
                   "  --per-layer-embd N       per-layer embedding size (default 16; 0 = none)\n"
                   "  --shared-kv N            the last N layers reuse the KV of the last sliding / full layer\n"
                   "                           before them (default 2; 0 = none)\n"
                   "  --experts N --experts-used K  every layer a mixture-of-experts layer as in 26B-A4B: N\n"
                   "                           experts of --ffn / 2 rows beside the dense FFN, K per token\n"
                   "Qwen3.5 (--arch qwen35: gated delta-net layers, with full attention (gated output,\n"
                   "Q/K norms, half of each head rotated) in every 4th layer; default 4 layers):\n"
                   "  --ssm-v-heads N          value heads of the delta-net layers (default 4)\n"
                   "  --ssm-k-heads N          key heads (default 2; divides the value heads)\n"
                   "  --ssm-head-dim N         head size of both (default 16); the conv kernel is 4\n"
                   "  --mtp N                  N MTP (nextn) layers after the trunk: 'pagekv run --mtp'\n"
                   "Chat models (for 'pagekv serve' and special-token tests):\n"
                   "  --chat-template NAME     family NAME: chatml (Qwen), llama3, llama2, mistral, gemma, phi3,\n"
                   "                           deepseek. Its special tokens become control tokens at ids 256..\n"
                   "                           in place of the two above (chatml: <|endoftext|> 256,\n"
                   "                           <|im_start|> 257, <|im_end|> 258), with the family's BOS, EOS,\n"
                   "                           EOT and add-BOS settings; tokenizer.chat_template gets a Jinja\n"
                   "                           template of its turn format. Default: chatml (no template\n"
                   "                           with --no-vocab or --draft-of)\n"
                   "  --chat-template FILE     a Jinja file (any name that is not a family) written as\n"
                   "                           tokenizer.chat_template, over chatml's special tokens\n"
                   "  --no-template            no chat template: the vocabulary's specials are\n"
                   "                           <|begin_of_text|> 256 and <|end_of_text|> 257\n"
                   "  --pre NAME               tokenizer.ggml.pre NAME (deepseek-v3, gpt-4o, kimi-k2, ...:\n"
                   "                           docs/tokenizer.md) in place of the family's (llama-bpe without\n"
                   "                           one), to compare pre-tokenizers with llama-tokenize on one file\n"
                   "Drafts for speculative decoding ('pagekv run --draft'):\n"
                   "  --draft-of TARGET.gguf   a draft with the target's vocabulary, architecture, width,\n"
                   "                           heads and head size (random weights; --layers N, default 1)\n"
                   "  --shared-kv-layers 3,5   with --draft-of: a shared-KV draft, one layer per entry,\n"
                   "                           whose layer j attends over the target's cache layer [j]\n"
                   "                           (GGUF key pagekv.shared_kv_layers; see docs/speculative.md)\n"
                   "  --arch voxtral --mmproj-out PROJ.gguf\n"
                   "                           Voxtral: the text model as the converter writes it (llama, with\n"
                   "                           [INST], [/INST], [BEGIN_AUDIO], [TRANSCRIBE]) and a tiny random\n"
                   "                           audio encoder in llama.cpp's mmproj layout (docs/multimodal.md)\n"
                   "  --arch gemma4-assistant --draft-of GEMMA4.gguf\n"
                   "                           Gemma 4's assistant (MTP drafter) for that target, as\n"
                   "                           llama.cpp's converter writes it: query-only layers over\n"
                   "                           the target's KV (--layers N, default 4; --dim, default half\n"
                   "                           the target's; --swa-layers, default all sliding but the last)\n");
            return 0;
        } else if (!strcmp(a, "--arch")) {
            if (!(p.arch = pkv_cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--type")) {
            if (!(v = pkv_cli_value(argc, argv, &i))) return 2;
            /* the mixtures: q4_k_m, q3_k_m, q5_k_m, iq3_m (iq3_s base), iq2_m (iq2_s base) */
            const char *mix = !strcasecmp(v, "iq3_m") ? "iq3_s" : !strcasecmp(v, "iq2_m") ? "iq2_s" : NULL;
            char base[16];
            size_t vl = strlen(v);
            if (!mix && vl > 2 && vl < sizeof base && !strcasecmp(v + vl - 2, "_m") && strcasecmp(v, "iq1_m")) {
                memcpy(base, v, vl - 2);
                base[vl - 2] = 0;
                mix = base;
            }
            if (mix && !pkv_type_from_name(mix, &p.type)) {
                p.k_mixture = true;
            } else if (pkv_type_from_name(v, &p.type)) {
                fprintf(stderr, "pagekv mkmodel: unknown type '%s'\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--seed")) {
            if (!(v = pkv_cli_value(argc, argv, &i)) || !pkv_cli_int(a, v, 0, INT64_MAX, &x)) return 2;
            p.seed = (uint64_t)x;
        } else if (!strcmp(a, "--no-vocab")) {
            p.no_vocab = true;
        } else if (!strcmp(a, "--tied")) {
            p.tied = true;
        } else if (!strcmp(a, "--chat-template")) {
            if (!(tpl_arg = pkv_cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--pre")) {
            if (!(p.pre = pkv_cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--no-template")) {
            no_template = true;
        } else if (!strcmp(a, "--swa-layers")) {
            if (!(p.swa_layers = pkv_cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--vision")) {
            vision = true;
        } else if (!strcmp(a, "--vision-f32")) {
            vision_f32 = true;
        } else if (!strcmp(a, "--image-size")) {
            if (!(v = pkv_cli_value(argc, argv, &i)) || !pkv_cli_int(a, v, 1, 2048, &x)) return 2;
            vision_size = (int)x;
        } else if (!strcmp(a, "--mmproj-out")) {
            if (!(mmproj_out = pkv_cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--draft-of")) {
            if (!(p.draft_of = pkv_cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--shared-kv-layers")) {
            if (!(v = pkv_cli_value(argc, argv, &i)) || !parse_layers(v, kv_layers, 256, &n_kv_layers)) return 2;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            if (!(out = pkv_cli_value(argc, argv, &i))) return 2;
        } else {
            fprintf(stderr, "pagekv mkmodel: unknown option '%s' (see 'pagekv mkmodel --help')\n", a);
            return 2;
        }
    }
    if (!out) {
        fprintf(stderr, "pagekv mkmodel: -o FILE.gguf is required\n");
        return 2;
    }
    /* Voxtral: its text model is what the converter writes for it, a llama with the
     * transcription prompt's special tokens (family "voxtral"); the audio encoder is
     * the projector file (--mmproj-out) */
    const bool voxtral = p.arch && !strcmp(p.arch, "voxtral");
    if (voxtral) {
        p.arch = "llama";
        if (!tpl_arg && !no_template) tpl_arg = "voxtral";
    }
    if (mmproj_out && !voxtral && !vision) { /* (branches audio and vision both added --mmproj-out) */
        fprintf(stderr, "pagekv mkmodel: --mmproj-out is for --arch voxtral (or --arch gemma3 --vision)\n");
        return 2;
    }
    if (tpl_arg && no_template) {
        fprintf(stderr, "pagekv mkmodel: --chat-template and --no-template contradict each other\n");
        return 2;
    }
    if (tpl_arg && !family_known(tpl_arg)) {
        /* not a family: a Jinja file, over chatml's special tokens */
        FILE *f = fopen(tpl_arg, "rb");
        if (!f) {
            fprintf(stderr, "pagekv mkmodel: --chat-template '%s' is neither a family (chatml, llama3, llama2, "
                            "mistral, gemma, phi3, deepseek) nor a readable file\n", tpl_arg);
            return 2;
        }
        size_t cap = 1 << 16, n = 0;
        tpl_text = malloc(cap + 1);
        size_t got;
        while (tpl_text && (got = fread(tpl_text + n, 1, cap - n, f)) > 0) {
            n += got;
            if (n == cap) {
                char *t = cap < (64u << 20) ? realloc(tpl_text, 2 * cap + 1) : NULL;
                if (!t) {
                    free(tpl_text);
                    tpl_text = NULL;
                    break;
                }
                tpl_text = t;
                cap *= 2;
            }
        }
        fclose(f);
        if (!tpl_text) {
            fprintf(stderr, "pagekv mkmodel: --chat-template '%s': too large or out of memory\n", tpl_arg);
            return 2;
        }
        tpl_text[n] = 0;
        p.chat_template_text = tpl_text;
    } else if (tpl_arg) {
        p.chat_template = tpl_arg;
    } else if (vision && !no_template) {
        p.chat_template = "gemma"; /* Gemma 3's turns, with the image tokens below */
    } else if (!no_template && !p.no_vocab && !p.draft_of) {
        p.chat_template = "chatml"; /* a newcomer's model serves chat (issue 28) */
    }
    if (vision && (!p.arch || strcmp(p.arch, "gemma3") || !mmproj_out || !p.chat_template || p.draft_of)) {
        fprintf(stderr, "pagekv mkmodel: --vision makes a Gemma 3 pair: it needs --arch gemma3, --mmproj-out PROJ.gguf "
                        "and a vocabulary with a chat template (not --no-template, --no-vocab or --draft-of)\n");
        return 2;
    }
    if (!vision && (vision_f32 || vision_size)) {
        fprintf(stderr, "pagekv mkmodel: --vision-f32 and --image-size go with --vision\n");
        return 2;
    }
    if (vision) p.extra_specials = image_tokens;
    if (p.chat_template && p.no_vocab) {
        fprintf(stderr, "pagekv mkmodel: --chat-template needs a vocabulary: leave out --no-vocab\n");
        return 2;
    }
    if (p.chat_template && p.draft_of) {
        fprintf(stderr, "pagekv mkmodel: --chat-template does not go with --draft-of: a draft takes its target's "
                        "vocabulary and chat template\n");
        return 2;
    }
    if (n_kv_layers) {
        if (!p.draft_of) {
            fprintf(stderr, "pagekv mkmodel: --shared-kv-layers needs --draft-of TARGET.gguf\n");
            return 2;
        }
        p.n_layer = n_kv_layers;
        p.shared_kv_layers = kv_layers;
    }
    pkv_status s = pkv_mkmodel_write(&p, out);
    free(tpl_text);
    p.chat_template_text = NULL;
    if (s) {
        const char *msg = pkv_errmsg();
        if (!strncmp(msg, "mkmodel: ", 9)) msg += 9; /* the command name is said once */
        fprintf(stderr, "pagekv mkmodel: %s\n", msg);
        return 1;
    }
    if (vision) {
        pkv_mkmmproj_vision_params vp = {.n_embd_text = p.n_embd ? p.n_embd : 128, .image_size = vision_size,
                                         .f32 = vision_f32, .seed = p.seed};
        if ((s = pkv_mkmmproj_vision_write(&vp, mmproj_out))) {
            fprintf(stderr, "pagekv mkmodel: %s\n", pkv_errmsg());
            return 1;
        }
        fprintf(stderr, "pagekv mkmodel: wrote %s (gemma3 vision projector: SigLIP %d blocks of width 64, %dx%d images, "
                        "%s, %d rows of width %d per image)\n",
                mmproj_out, 2, vision_size ? vision_size : 224, vision_size ? vision_size : 224,
                vision_f32 ? "f32" : "f16", ((vision_size ? vision_size : 224) / 14 / 4) * ((vision_size ? vision_size : 224) / 14 / 4),
                p.n_embd ? p.n_embd : 128);
    }
    /* say what was written as the file says it (a draft takes its target's arch) */
    pkv_gguf *g = pkv_gguf_open(out);
    const char *arch = "?";
    size_t alen = 1;
    uint32_t layers = 0, embd = 0;
    char key[96];
    if (g && !pkv_gguf_get_str(g, "general.architecture", &arch, &alen)) {
        snprintf(key, sizeof key, "%.*s.block_count", (int)alen, arch);
        pkv_gguf_get_u32(g, key, &layers);
        snprintf(key, sizeof key, "%.*s.embedding_length", (int)alen, arch);
        pkv_gguf_get_u32(g, key, &embd);
    }
    fprintf(stderr, "pagekv mkmodel: wrote %s (%.*s, %s%s, %u layers, width %u%s%s)\n", out, (int)alen, arch,
            pkv_type_name(p.type), p.k_mixture ? "_m mixture" : "", layers, embd,
            tpl_arg || p.chat_template ? ", chat template " : "", tpl_arg ? tpl_arg : p.chat_template ? p.chat_template : "");
    pkv_gguf_close(g);
    if (mmproj_out && voxtral) {
        pkv_mkmmproj_audio_params mp = {.n_embd = (int)embd, .seed = p.seed};
        if ((s = pkv_mkmmproj_audio_write(&mp, mmproj_out))) {
            fprintf(stderr, "pagekv mkmodel: %s\n", pkv_errmsg());
            return 1;
        }
        fprintf(stderr, "pagekv mkmodel: wrote %s (voxtral projector into width %u)\n", mmproj_out, embd);
    }
    return 0;
}
