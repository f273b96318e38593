/* nemotron_h: NVIDIA Nemotron-H and Nemotron Nano 2 (dense), as llama.cpp's
 * nemotron-h reads them. Every layer is one block behind its attn_norm, of the kind
 * its per-layer keys say: head_count_kv 0 and feed_forward_length 0 a Mamba-2 layer
 * (granitehybrid's, state in the cache's state slots), head_count_kv 0 with FFN rows
 * an MLP (up, squared ReLU, down; no gate), head_count_kv > 0 GQA attention without
 * RoPE (scores times attention.scale where given). No multipliers.
 *
 *   Mamba-2:    x += mamba2(attn_norm(x))                  (blocks.h: pkv_blk_mamba2)
 *   attention:  x += o(attention(q, k, v))                 of attn_norm(x)
 *   MLP:        x += down(relu(up·h)^2)                    h = attn_norm(x)
 *
 * The norm epsilon is attention.layer_norm_rms_epsilon, else attention.layer_norm_epsilon
 * (one of them required). Split over several devices as granitehybrid: Mamba-2 by SSM
 * groups, attention by KV-head groups, the MLP by rows. The MoE files (nemotron_h_moe)
 * are another architecture, not read. */
#include <math.h>
#include <string.h>

#include "model/arch/arch.h"
#include "model/arch/mk.h"

static pkv_status hparams(const pkv_gguf *g, const char *arch, pkv_hparams *hp, const int *n_head) {
    (void)n_head;
    pkv_status s = pkv_mamba2_hparams(g, arch, hp);
    if (s) return s;
    char k[128];
    snprintf(k, sizeof k, "%s.attention.layer_norm_rms_epsilon", arch);
    if (pkv_gguf_find_key(g, k) >= 0) return PKV_OK; /* read by hparams.c */
    snprintf(k, sizeof k, "%s.attention.layer_norm_epsilon", arch);
    if ((s = pkv_gguf_get_f32(g, k, &hp->rms_eps))) return s;
    if (!(hp->rms_eps > 0 && hp->rms_eps < 1))
        return pkv_err(PKV_ERR_FORMAT, "%s: key '%s' is %g, outside (0, 1)", pkv_gguf_label(g), k, (double)hp->rms_eps);
    return PKV_OK;
}

static bool ffn_only(const pkv_hparams *hp, int il) { return il < 64 && (hp->kinds.ffn_only >> il & 1); }

static pkv_status load_layer(pkv_loader *L, int il) {
    pkv_model *m = pkv_loader_model(L);
    pkv_layer *ly = &m->layers[il];
    ly->recurrent = m->hp.recurrent >> il & 1;
    ly->nope = true;
    pkv_status s = pkv_load_norm(L, il, "attn_norm.weight", &ly->attn_norm);
    if (s) return s;
    if (ly->recurrent) return pkv_load_mamba2(L, il);
    return ffn_only(&m->hp, il) ? pkv_load_ffn_up(L, il) : pkv_load_hybrid_attention(L, il);
}

static pkv_status layer(pkv_fwd *f, int il) {
    const pkv_layer *ly = &f->m->layers[il];
    if (ly->recurrent) return pkv_blk_mamba2(f, il, &(pkv_mamba2_kind){.norm = &ly->attn_norm});
    if (ffn_only(&f->m->hp, il))
        return pkv_blk_ffn(f, il, &(pkv_ffn_kind){.norm = &ly->attn_norm, .ungated = true, .up_act = PKV_UNARY_RELU_SQR});
    return pkv_blk_attention(f, il, &(pkv_attn_kind){.norm = &ly->attn_norm});
}

/* ------------------------------------------------------- pagekv mkmodel */

/* Layer l by l % 3: Mamba-2, MLP, attention (Nemotron-H's pattern "M-*"). */
static char mk_kind(int l) { return "M-*"[l % 3]; }

/* Six layers by default; Mamba-2 sizes as granitehybrid's. */
static pkv_status mk_check(pkv_mkmodel_params *p) {
    if (!p->n_layer) p->n_layer = 6;
    return pkv_mk_mamba2_check(p);
}

/* Per-layer head_count_kv and feed_forward_length mark the kinds. */
static pkv_status mk_sizes(pkv_mk *b) {
    const pkv_mkmodel_params *p = b->p;
    int32_t kv[64], ff[64];
    for (int l = 0; l < p->n_layer; l++) {
        kv[l] = mk_kind(l) == '*' ? p->n_head_kv : 0;
        ff[l] = mk_kind(l) == '-' ? p->n_ff : 0;
    }
    PKV_MK_TRY(pkv_mk_arr(b, "feed_forward_length", PKV_GGUF_INT32, ff, (uint64_t)p->n_layer));
    PKV_MK_TRY(pkv_mk_u32(b, "attention.head_count", (uint32_t)p->n_head));
    return pkv_mk_arr(b, "attention.head_count_kv", PKV_GGUF_INT32, kv, (uint64_t)p->n_layer);
}

static pkv_status mk_keys(pkv_mk *b) {
    const pkv_mkmodel_params *p = b->p;
    PKV_MK_TRY(pkv_mk_ssm_keys(b, 4, p->ssm_state, p->ssm_k_heads, p->ssm_v_heads, p->ssm_v_heads * p->ssm_head_dim));
    PKV_MK_TRY(pkv_mk_f32(b, "attention.layer_norm_epsilon", 1e-5f)); /* llama.cpp requires it */
    return pkv_gguf_writer_add_bool(b->w, pkv_mk_key(b, "rope.scaling.finetuned"), false);
}

static pkv_status mk_layer(pkv_mk *b, int l) {
    const pkv_mkmodel_params *p = b->p;
    const int64_t E = b->E;
    switch (mk_kind(l)) {
    case 'M': return pkv_mk_mamba2(b, l);
    case '-':
        PKV_MK_TRY(pkv_mk_norm(b, l, "attn_norm.weight", E));
        PKV_MK_TRY(pkv_mk_blk(b, l, "ffn_up.weight", p->type, E, p->n_ff, 0.0, b->lin_e));
        return pkv_mk_blk(b, l, "ffn_down.weight", p->type, p->n_ff, E, 0.0, b->lin_f);
    default: return pkv_mk_attention(b, l, &(pkv_attn_tensors){0});
    }
}

static const pkv_arch_mk mk = {.takes = PKV_MK_DELTANET,
                               .rope_base = 10000.0f,
                               .rms_eps = 1e-5f,
                               .head_keys = true,
                               .check = mk_check,
                               .check_rows = pkv_mk_ssm_rows,
                               .sizes = mk_sizes,
                               .keys = mk_keys,
                               .layer = mk_layer};

const pkv_arch_ops pkv_arch_nemotron_h = {.name = "nemotron_h",
                                          .kv0_recurrent = true,
                                             .rec_first = true,
                                          .ff0_layers = true,
                                          .hparams = hparams,
                                          .load_layer = load_layer,
                                          .layer = layer,
                                          .state_desc = pkv_mamba2_layer_state,
                                          .mk = &mk};
