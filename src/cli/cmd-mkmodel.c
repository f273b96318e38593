/* pagekv mkmodel: write a GGUF test model with random weights. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli/cli.h"
#include "media/mkmmproj-audio.h"
#include "model/gguf.h"
#include "model/lora.h"
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

static void mkmodel_usage(FILE *f) {
    fprintf(f, "usage: pagekv mkmodel [--arch llama|qwen2|qwen3|qwen3moe|phi3|gemma2|gemma3|gemma4|gemma4-assistant|gpt-oss|qwen35|\n"
               "                       qwen35moe|smollm3|mistral3|deepseek2|llama4|glm4moe|granitehybrid|nemotron_h|\n"
               "                       lfm2|lfm2moe|voxtral]\n"
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
               "Qwen3.5-MoE (--arch qwen35moe): qwen35 with --experts N (default 4) experts of --ffn rows,\n"
               "--experts-used K (default 2), and a shared expert of --ffn rows with its sigmoid gate.\n"
               "GLM-4.5 (--arch glm4moe; default 3 layers, the first dense, then mixtures with a shared\n"
               "expert and the exp_probs_b routing bias; Q/K norms on the odd layers; half of each head\n"
               "rotated): --experts N --experts-used K (default 4, 2); --mtp N MTP layers (default 1)\n"
               "Granite 4.0-H (--arch granitehybrid; default 4 layers: Mamba-2, attention (no RoPE),\n"
               "Mamba-2, Mamba-2; every fourth layer from the second attends; Granite's multipliers):\n"
               "--ssm-head-dim N (head size, default 16), --ssm-state N (state size, default the head\n"
               "size), --ssm-v-heads N (Mamba heads, default 2 --dim / head size), --ssm-k-heads N (groups,\n"
               "default 2); --experts N --experts-used K: experts with a shared expert of --ffn rows\n"
               "Nemotron-H (--arch nemotron_h; default 6 layers: Mamba-2, squared-ReLU MLP, attention (no\n"
               "RoPE), twice): the --ssm-* options as granitehybrid's\n"
               "LFM2 (--arch lfm2; default 6 layers): gated short convolutions of 3 taps, GQA attention\n"
               "with Q/K norms in every 3rd layer (head_count_kv 0 marks the convolutions); --arch lfm2moe:\n"
               "the first layer dense, then --experts N (default 4) of --ffn rows, --experts-used K (2).\n"
               "SmolLM3 (--arch smollm3): llama with no RoPE on every fourth layer (--layers 4 or more).\n"
               "DeepSeek-V2/V3 (--arch deepseek2): multi-head latent attention, one latent KV head of\n"
               "  --kv-lora-rank N (default 64) + --head-dim / 2 rope dims; --head-dim is a query head's\n"
               "  nope + rope dims (and the value heads'); --q-lora-rank N: V3's attn_q_a/attn_q_b (default\n"
               "  0: V2-Lite's attn_q); YaRN by 4 over min(256, --ctx); every layer dense\n"
               "Ministral 3 (--arch mistral3): llama with YaRN by 16 over min(256, --ctx) original\n"
               "positions (yarn_log_multiplier 1) and Llama 4's attention temperature tuning (scale 0.1).\n"
               "Llama 4 (--arch llama4; default 4 layers): chunked attention in three of every four\n"
               "layers, NoPE with temperature tuning and no Q/K norm in the fourth, rope_freqs.weight:\n"
               "  --sliding-window N       the chunk (pagekv's key attention.chunk_size; default 8) and\n"
               "                           the temperature length; 8192 is llama.cpp's fixed value\n"
               "Phi-3 with LongRoPE (--arch phi3, as Phi-3-128k, Phi-3.5, Phi-4-mini):\n"
               "  --longrope N             rope_factors_short/long.weight (random factors) over an\n"
               "                           original context of N tokens, its attention factor from --ctx;\n"
               "                           a cache of more than N tokens a sequence turns with the long\n"
               "                           factors, any other with the short ones\n"
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
               "Embedding and reranker models ('pagekv serve': /v1/embeddings, /v1/rerank):\n"
               "  --pooling TYPE           ARCH.pooling_type TYPE: none, mean, cls, last (Qwen3-Embedding) or\n"
               "                           rank: a reranker as llama.cpp's converter writes Qwen3-Reranker\n"
               "                           (cls.output.weight of 2 random rows, labels yes/no, and\n"
               "                           tokenizer.chat_template.rerank; --arch qwen3 only); the generic\n"
               "                           architectures only\n"
               "LoRA adapters (docs/lora.md):\n"
               "  --lora-of BASE.gguf      write an adapter for BASE instead of a model: random A [in, r]\n"
               "                           and B [r, out] (llama.cpp's convert_lora_to_gguf.py layout) for\n"
               "                           every matrix pkv_lora_load covers: token_embd (flipped: A [r,\n"
               "                           n_vocab], B [r, n_embd]), output, attn_q/k/v/qkv/output,\n"
               "                           ffn_gate/up/down, the router and experts (3-D: [in, r, n_expert],\n"
               "                           [r, out, n_expert]), qwen35's delta-net matrices;\n"
               "                           --type f32 or f16 (default f16), --seed N\n"
               "  --lora-rank R            r (default 8)\n"
               "  --lora-alpha A           adapter.lora.alpha (default 0: the scale is the user's alone)\n"
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
}

/* What `pagekv mkmodel` was asked (the options table below fills it). */
typedef struct mk_opts {
    pkv_mkmodel_params p;
    const char *tpl_arg, *out, *mmproj_out;
    bool no_template, vision, vision_f32, help;
    int vision_size;
    int32_t kv_layers[256];
    int n_kv_layers;
    const char *lora_of; /* --lora-of BASE.gguf: write an adapter instead */
    int lora_rank;
    float lora_alpha;
} mk_opts;

/* gemma4's sizes where 0 means none (the params' 0 is the default, < 0 none) */
static bool mk_int0(const char *opt, const char *v, int *dst) {
    long long x;
    if (!pkv_cli_int(opt, v, 0, 1 << 16, &x)) return false;
    *dst = x ? (int)x : -1;
    return true;
}
static bool mk_opt_per_layer_embd(void *opts, const char *opt, const char *v) {
    return mk_int0(opt, v, &((mk_opts *)opts)->p.n_embd_per_layer);
}
static bool mk_opt_shared_kv(void *opts, const char *opt, const char *v) {
    return mk_int0(opt, v, &((mk_opts *)opts)->p.n_shared_kv);
}

static bool mk_opt_type(void *opts, const char *opt, const char *v) {
    pkv_mkmodel_params *p = &((mk_opts *)opts)->p;
    (void)opt;
    /* the mixtures: q4_k_m, q3_k_m, q5_k_m, iq3_m (iq3_s base), iq2_m (iq2_s base) */
    const char *mix = !strcasecmp(v, "iq3_m") ? "iq3_s" : !strcasecmp(v, "iq2_m") ? "iq2_s" : NULL;
    char base[16];
    size_t vl = strlen(v);
    if (!mix && vl > 2 && vl < sizeof base && !strcasecmp(v + vl - 2, "_m") && strcasecmp(v, "iq1_m")) {
        memcpy(base, v, vl - 2);
        base[vl - 2] = 0;
        mix = base;
    }
    if (mix && !pkv_type_from_name(mix, &p->type)) {
        p->k_mixture = true;
    } else if (pkv_type_from_name(v, &p->type)) {
        fprintf(stderr, "pagekv mkmodel: unknown type '%s'\n", v);
        return false;
    }
    return true;
}

static bool mk_opt_seed(void *opts, const char *opt, const char *v) {
    long long x;
    if (!pkv_cli_int(opt, v, 0, INT64_MAX, &x)) return false;
    ((mk_opts *)opts)->p.seed = (uint64_t)x;
    return true;
}

static bool mk_opt_kv_layers(void *opts, const char *opt, const char *v) {
    mk_opts *k = opts;
    (void)opt;
    return parse_layers(v, k->kv_layers, 256, &k->n_kv_layers);
}

#define MK_OPT(...) PKV_CLI_OPT(mk_opts, __VA_ARGS__)
#define MK_SIZE(name, field) MK_OPT(name, NULL, PKV_CLI_INT, p.field, 1, 1 << 24)
#define MK_FN(name, fn) {name, NULL, PKV_CLI_FN, 0, 0, 0, fn, true}
static const pkv_cli_opt mk_options[] = {
    MK_SIZE("--layers", n_layer),
    MK_SIZE("--dim", n_embd),
    MK_SIZE("--heads", n_head),
    MK_SIZE("--kv-heads", n_head_kv),
    MK_SIZE("--head-dim", head_dim),
    MK_SIZE("--ffn", n_ff),
    MK_SIZE("--vocab", n_vocab),
    MK_SIZE("--ctx", n_ctx),
    MK_SIZE("--experts", n_expert),
    MK_SIZE("--experts-used", n_expert_used),
    MK_SIZE("--sliding-window", sliding_window),
    MK_SIZE("--ssm-v-heads", ssm_v_heads),
    MK_SIZE("--ssm-k-heads", ssm_k_heads),
    MK_SIZE("--ssm-head-dim", ssm_head_dim),
    MK_SIZE("--ssm-state", ssm_state),
    MK_SIZE("--mtp", n_mtp),
    MK_SIZE("--longrope", rope_orig_ctx),
    MK_SIZE("--head-dim-swa", head_dim_swa),
    MK_SIZE("--kv-heads-full", n_head_kv_full),
    MK_SIZE("--q-lora-rank", q_lora_rank),
    MK_SIZE("--kv-lora-rank", kv_lora_rank),
    MK_FN("--per-layer-embd", mk_opt_per_layer_embd),
    MK_FN("--shared-kv", mk_opt_shared_kv),
    MK_OPT("-h", "--help", PKV_CLI_FLAG, help, 0, 0),
    MK_OPT("--arch", NULL, PKV_CLI_STR, p.arch, 0, 0),
    MK_FN("--type", mk_opt_type),
    MK_FN("--seed", mk_opt_seed),
    MK_OPT("--no-vocab", NULL, PKV_CLI_FLAG, p.no_vocab, 0, 0),
    MK_OPT("--tied", NULL, PKV_CLI_FLAG, p.tied, 0, 0),
    MK_OPT("--chat-template", NULL, PKV_CLI_STR, tpl_arg, 0, 0),
    MK_OPT("--pre", NULL, PKV_CLI_STR, p.pre, 0, 0),
    MK_OPT("--pooling", NULL, PKV_CLI_STR, p.pooling, 0, 0),
    MK_OPT("--no-template", NULL, PKV_CLI_FLAG, no_template, 0, 0),
    MK_OPT("--swa-layers", NULL, PKV_CLI_STR, p.swa_layers, 0, 0),
    MK_OPT("--vision", NULL, PKV_CLI_FLAG, vision, 0, 0),
    MK_OPT("--vision-f32", NULL, PKV_CLI_FLAG, vision_f32, 0, 0),
    MK_OPT("--image-size", NULL, PKV_CLI_INT, vision_size, 1, 2048),
    MK_OPT("--mmproj-out", NULL, PKV_CLI_STR, mmproj_out, 0, 0),
    MK_OPT("--draft-of", NULL, PKV_CLI_STR, p.draft_of, 0, 0),
    MK_FN("--shared-kv-layers", mk_opt_kv_layers),
    MK_OPT("--lora-of", NULL, PKV_CLI_STR, lora_of, 0, 0),
    MK_OPT("--lora-rank", NULL, PKV_CLI_INT, lora_rank, 1, 4096),
    MK_OPT("--lora-alpha", NULL, PKV_CLI_FLOAT, lora_alpha, 0, 1e6),
    MK_OPT("-o", "--output", PKV_CLI_STR, out, 0, 0),
};
#undef MK_FN
#undef MK_SIZE
#undef MK_OPT
static const pkv_cli_cmd mk_cmd = {"mkmodel", mk_options, sizeof mk_options / sizeof mk_options[0],
                                   offsetof(mk_opts, help), mkmodel_usage, NULL, true, false, 0};

/* A --chat-template FILE's text (at most 64 MiB), or NULL (said). */
static char *mk_read_template(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "pagekv mkmodel: --chat-template '%s' is neither a family (chatml, llama3, llama2, "
                        "mistral, gemma, phi3, deepseek) nor a readable file\n", path);
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *text = malloc(cap + 1);
    size_t got;
    while (text && (got = fread(text + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            char *t = cap < (64u << 20) ? realloc(text, 2 * cap + 1) : NULL;
            if (!t) {
                free(text);
                text = NULL;
                break;
            }
            text = t;
            cap *= 2;
        }
    }
    fclose(f);
    if (!text) {
        fprintf(stderr, "pagekv mkmodel: --chat-template '%s': too large or out of memory\n", path);
        return NULL;
    }
    text[n] = 0;
    return text;
}

/* The chat template the model gets (a family, a file's text into *tpl_text, or
 * none) and the combinations that do not go together: 0, or the exit code 2
 * (said). */
static int mk_resolve(mk_opts *k, bool voxtral, char **tpl_text) {
    static const char *const image_tokens[] = {"<start_of_image>", "<end_of_image>", NULL};
    pkv_mkmodel_params *p = &k->p;
    if (k->mmproj_out && !voxtral && !k->vision) { /* (branches audio and vision both added --mmproj-out) */
        fprintf(stderr, "pagekv mkmodel: --mmproj-out is for --arch voxtral (or --arch gemma3 --vision)\n");
        return 2;
    }
    if (k->tpl_arg && k->no_template) {
        fprintf(stderr, "pagekv mkmodel: --chat-template and --no-template contradict each other\n");
        return 2;
    }
    if (k->tpl_arg && !family_known(k->tpl_arg)) {
        /* not a family: a Jinja file, over chatml's special tokens */
        if (!(*tpl_text = mk_read_template(k->tpl_arg))) return 2;
        p->chat_template_text = *tpl_text;
    } else if (k->tpl_arg) {
        p->chat_template = k->tpl_arg;
    } else if (k->vision && !k->no_template) {
        p->chat_template = PKV_MKMMPROJ_VISION_TEMPLATE; /* its model's turns, with the image tokens below */
    } else if (!k->no_template && !p->no_vocab && !p->draft_of) {
        p->chat_template = "chatml"; /* a newcomer's model serves chat (issue 28) */
    }
    const char *why = NULL;
    if (k->vision && (!p->arch || strcmp(p->arch, PKV_MKMMPROJ_VISION_TEXT_ARCH) || !k->mmproj_out || !p->chat_template ||
                      p->draft_of))
        why = "--vision makes a Gemma 3 pair: it needs --arch gemma3, --mmproj-out PROJ.gguf and a vocabulary with a chat "
              "template (not --no-template, --no-vocab or --draft-of)";
    else if (!k->vision && (k->vision_f32 || k->vision_size)) why = "--vision-f32 and --image-size go with --vision";
    else if (p->chat_template && p->no_vocab) why = "--chat-template needs a vocabulary: leave out --no-vocab";
    else if (p->chat_template && p->draft_of)
        why = "--chat-template does not go with --draft-of: a draft takes its target's vocabulary and chat template";
    else if (k->n_kv_layers && !p->draft_of) why = "--shared-kv-layers needs --draft-of TARGET.gguf";
    if (why) {
        fprintf(stderr, "pagekv mkmodel: %s\n", why);
        return 2;
    }
    if (k->vision) p->extra_specials = image_tokens;
    if (k->n_kv_layers) {
        p->n_layer = k->n_kv_layers;
        p->shared_kv_layers = k->kv_layers;
    }
    return 0;
}

/* --vision: the Gemma 3 projector beside the model; false (said) on error. */
static bool mk_write_vision(const mk_opts *k) {
    const pkv_mkmodel_params *p = &k->p;
    int size = k->vision_size ? k->vision_size : 224;
    pkv_mkmmproj_vision_params vp = {.n_embd_text = p->n_embd ? p->n_embd : 128, .image_size = k->vision_size,
                                     .f32 = k->vision_f32, .seed = p->seed};
    if (pkv_mkmmproj_vision_write(&vp, k->mmproj_out)) {
        fprintf(stderr, "pagekv mkmodel: %s\n", pkv_errmsg());
        return false;
    }
    fprintf(stderr, "pagekv mkmodel: wrote %s (gemma3 vision projector: SigLIP %d blocks of width 64, %dx%d images, "
                    "%s, %d rows of width %d per image)\n",
            k->mmproj_out, 2, size, size, k->vision_f32 ? "f32" : "f16", (size / 14 / 4) * (size / 14 / 4),
            p->n_embd ? p->n_embd : 128);
    return true;
}

/* Say what was written as the file says it (a draft takes its target's arch);
 * its width into *embd. */
static void mk_report(const mk_opts *k, uint32_t *embd) {
    const pkv_mkmodel_params *p = &k->p;
    pkv_gguf *g = pkv_gguf_open(k->out);
    const char *arch = "?";
    size_t alen = 1;
    uint32_t layers = 0;
    char key[96];
    *embd = 0;
    if (g && !pkv_gguf_get_str(g, "general.architecture", &arch, &alen)) {
        snprintf(key, sizeof key, "%.*s.block_count", (int)alen, arch);
        pkv_gguf_get_u32(g, key, &layers);
        snprintf(key, sizeof key, "%.*s.embedding_length", (int)alen, arch);
        pkv_gguf_get_u32(g, key, embd);
    }
    const char *tpl = k->tpl_arg ? k->tpl_arg : p->chat_template;
    fprintf(stderr, "pagekv mkmodel: wrote %s (%.*s, %s%s, %u layers, width %u%s%s)\n", k->out, (int)alen, arch,
            pkv_type_name(p->type), p->k_mixture ? "_m mixture" : "", layers, *embd, tpl ? ", chat template " : "",
            tpl ? tpl : "");
    pkv_gguf_close(g);
}

int pkv_cli_mkmodel(int argc, char **argv) {
    mk_opts k;
    memset(&k, 0, sizeof k);
    k.p = pkv_mkmodel_default_params();
    int rc = pkv_cli_parse(&mk_cmd, argc, argv, &k);
    if (rc >= 0) return rc;
    if (!k.out) {
        fprintf(stderr, "pagekv mkmodel: -o FILE.gguf is required\n");
        return 2;
    }
    if (k.lora_of) { /* an adapter for a base file, nothing else */
        pkv_mklora_params lp = {.base = k.lora_of, .rank = k.lora_rank ? k.lora_rank : 8, .alpha = k.lora_alpha,
                                .type = k.p.type, .seed = k.p.seed};
        if (pkv_mklora_write(&lp, k.out)) {
            const char *msg = pkv_errmsg();
            if (!strncmp(msg, "mkmodel: ", 9)) msg += 9;
            fprintf(stderr, "pagekv mkmodel: %s\n", msg);
            return 1;
        }
        fprintf(stderr, "pagekv mkmodel: wrote %s (LoRA adapter of %s, rank %d, alpha %g, %s)\n", k.out, k.lora_of, lp.rank,
                (double)lp.alpha, pkv_type_name(lp.type));
        return 0;
    }
    /* Voxtral: its text model is what the converter writes for it, a llama with the
     * transcription prompt's special tokens (family "voxtral"); the audio encoder is
     * the projector file (--mmproj-out) */
    const bool voxtral = k.p.arch && !strcmp(k.p.arch, PKV_MKMMPROJ_AUDIO_PAIR);
    if (voxtral) {
        k.p.arch = PKV_MKMMPROJ_AUDIO_TEXT_ARCH;
        if (!k.tpl_arg && !k.no_template) k.tpl_arg = PKV_MKMMPROJ_AUDIO_TEMPLATE;
    }
    char *tpl_text = NULL;
    rc = mk_resolve(&k, voxtral, &tpl_text);
    if (rc) {
        free(tpl_text);
        return rc;
    }
    pkv_status s = pkv_mkmodel_write(&k.p, k.out);
    free(tpl_text);
    k.p.chat_template_text = NULL;
    if (s) {
        const char *msg = pkv_errmsg();
        if (!strncmp(msg, "mkmodel: ", 9)) msg += 9; /* the command name is said once */
        fprintf(stderr, "pagekv mkmodel: %s\n", msg);
        return 1;
    }
    if (k.vision && !mk_write_vision(&k)) return 1;
    uint32_t embd;
    mk_report(&k, &embd);
    if (k.mmproj_out && voxtral) {
        pkv_mkmmproj_audio_params mp = {.n_embd = (int)embd, .seed = k.p.seed};
        if (pkv_mkmmproj_audio_write(&mp, k.mmproj_out)) {
            fprintf(stderr, "pagekv mkmodel: %s\n", pkv_errmsg());
            return 1;
        }
        fprintf(stderr, "pagekv mkmodel: wrote %s (voxtral projector into width %u)\n", k.mmproj_out, embd);
    }
    return 0;
}
