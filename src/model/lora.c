/* LoRA adapters: loading a GGUF adapter against its base model, the sets a
 * sequence applies, and the delta a covered matrix adds in the forward pass
 * (pkv_blk_matmul calls pkv_lora_delta after the base product). docs/lora.md.
 *
 * The file's pairs "<base>.lora_a" ne [in, r] and "<base>.lora_b" ne [r, out] are
 * matrices of r rows of in and of out rows of r: x·Aᵀ then ·Bᵀ is B (A x), the same
 * product the base's x·Wᵀ is. Both are kept as f32 on the model's device; B is
 * multiplied by alpha / r at load (alpha 0: by 1), so at run time a sequence's
 * delta is B' (scale · A x) with its own user scale. */
#include <math.h>
#include <string.h>

#include "base/quant.h"
#include "model/arch/arch.h"
#include "model/blocks.h"
#include "model/lora.h"

/* How a pair's product reaches its matrix's users. */
typedef enum lora_kind {
    LORA_MAT,  /* y = W x + s B (A x) after pkv_blk_matmul, or per expert (A and B hold n_mat blocks) */
    LORA_ROWS, /* the token embedding: x = W[id] + s B a_id, a_id row id of A [n_vocab][r] */
    LORA_TIED, /* the tied output from token_embd's pair: y = W x + s A (Bᵀ x); here a = Bᵀ, b = A */
} lora_kind;

typedef struct lora_pair {
    const pkv_weight *base; /* the model's matrix [out][in] (or its part a fused matrix maps onto) */
    lora_kind kind;
    int64_t r;              /* rank */
    int64_t n_mat;          /* 1, or the experts: A's rows [e r, e r + r), B's [e out, e out + out) are expert e's */
    pkv_weight a;           /* f32 [n_mat r][in]; LORA_ROWS [n_vocab][r] */
    pkv_weight b;           /* f32 [n_mat out][r], times alpha / r */
} lora_pair;

struct pkv_lora {
    const pkv_model *m;
    char label[256];
    float alpha;
    int rank;   /* the largest r */
    int n_file; /* the file's pairs */
    int n, cap;
    lora_pair *p; /* [n] of [cap]: a file's pair makes one per matrix it maps onto */
    uint64_t fp;
    pkv_lora *next; /* the model's list (pkv_model.loras) */
};

/* A base tensor an adapter pair names: its shape in the file (ne [in, out, n_mat]) and
 * the matrices of the model it maps onto, each with the rows of the file's (fused)
 * matrix it holds (rblock > 0: rblock rows every rstride from r0). */
typedef struct lora_map {
    int64_t in, out, n_mat;
    bool embd; /* token_embd: the pair is flipped (A [r, n_vocab], B [r, n_embd]) */
    int n;
    struct {
        const pkv_weight *w;
        lora_kind kind;
        int64_t r0, nr, rblock, rstride;
    } t[3];
} lora_map;

static void map_add(lora_map *mp, const pkv_weight *w, lora_kind kind, int64_t r0, int64_t nr, int64_t rblock, int64_t rstride) {
    if (!w->buf) return; /* (a KV-sharing layer has no K, V of its own: those rows are never computed) */
    mp->t[mp->n].w = w;
    mp->t[mp->n].kind = kind;
    mp->t[mp->n].r0 = r0;
    mp->t[mp->n].nr = nr;
    mp->t[mp->n].rblock = rblock;
    mp->t[mp->n].rstride = rstride;
    mp->n++;
}

/* A plain matrix (one device: the weight is the file's whole tensor). */
static bool map_plain(lora_map *mp, const pkv_weight *w, const char **why) {
    if (!w->buf) {
        *why = "the model's layer has no such matrix";
        return false;
    }
    mp->in = w->ne0;
    mp->out = w->ne1;
    mp->n_mat = 1;
    map_add(mp, w, LORA_MAT, 0, w->ne1, 0, 0);
    return true;
}

/* The matrices a tensor name stands for, or false with *why saying why not.
 * Fused and split matrices take the rows of the adapter's product that their part of
 * the fused product has (llama.cpp applies the adapter to the fused product, then
 * splits it); the experts' take expert e's A and B for expert e's rows. */
static bool map_of(const pkv_model *m, const char *name, lora_map *mp, const char **why) {
    memset(mp, 0, sizeof *mp);
    *why = "the model has no such matrix";
    if (!strcmp(name, "token_embd.weight")) {
        if (pkv_arch_ops_of(m->hp.arch)->foreign_embd) {
            *why = "the model's input rows are its target's token embedding, not its own: adapters on it are not supported";
            return false;
        }
        if (!m->tok_embd.buf) return false;
        mp->in = m->tok_embd.ne0;
        mp->out = m->tok_embd.ne1;
        mp->n_mat = 1;
        mp->embd = true;
        map_add(mp, &m->tok_embd, LORA_ROWS, 0, mp->in, 0, 0);
        if (m->tied) map_add(mp, &m->output, LORA_TIED, 0, mp->out, 0, 0);
        return true;
    }
    if (!strcmp(name, "output.weight")) {
        if (m->tied) {
            *why = "the model has no output.weight (its output is the token embedding: an adapter for it names "
                   "token_embd.weight)";
            return false;
        }
        return map_plain(mp, &m->output, why);
    }
    int il, n = 0;
    char rest[64];
    if (sscanf(name, "blk.%d.%63s%n", &il, rest, &n) != 2 || name[n] || il < m->hp.layer_base ||
        il - m->hp.layer_base >= m->hp.n_layer)
        return false;
    const pkv_layer *ly = &m->layers[il - m->hp.layer_base];
    const pkv_shard_w *sw = &ly->sh[0];
    const int64_t hk = ly->head_dim_k, qd = (int64_t)ly->n_head * hk, kd = (int64_t)ly->n_head_kv * hk,
                  vd = (int64_t)ly->n_head_kv * ly->head_dim_v, F = ly->n_ff;
    static const char *const k_split = "the model holds this matrix fused (an adapter for it names the fused matrix)";
    if (!strcmp(rest, "attn_qkv.weight")) {
        if (ly->recurrent) return map_plain(mp, &sw->ssm.qkv, why);
        if (!ly->fused_qkv) return false;
        mp->in = sw->wq.ne0;
        mp->out = qd + kd + vd;
        mp->n_mat = 1;
        map_add(mp, &sw->wq, LORA_MAT, 0, qd, 0, 0);
        map_add(mp, &sw->wk, LORA_MAT, qd, kd, 0, 0);
        map_add(mp, &sw->wv, LORA_MAT, qd + kd, vd, 0, 0);
        return true;
    }
    if (!strcmp(rest, "attn_q.weight")) {
        if (ly->fused_qkv) {
            *why = k_split;
            return false;
        }
        if (!sw->wq_gate.buf) return map_plain(mp, &sw->wq, why);
        /* qwen35: per head, its hk query rows then its hk gate rows */
        mp->in = sw->wq.ne0;
        mp->out = 2 * qd;
        mp->n_mat = 1;
        map_add(mp, &sw->wq, LORA_MAT, 0, qd, hk, 2 * hk);
        map_add(mp, &sw->wq_gate, LORA_MAT, hk, qd, hk, 2 * hk);
        return true;
    }
    if (!strcmp(rest, "attn_k.weight") || !strcmp(rest, "attn_v.weight")) {
        if (ly->fused_qkv) {
            *why = k_split;
            return false;
        }
        return map_plain(mp, rest[5] == 'k' ? &sw->wk : &sw->wv, why);
    }
    if (!strcmp(rest, "attn_output.weight")) return map_plain(mp, &sw->wo, why);
    if (!strcmp(rest, "ffn_down.weight")) return map_plain(mp, &sw->w_down, why);
    if (!strcmp(rest, "ffn_gate.weight")) {
        if (ly->fused_up) {
            *why = k_split;
            return false;
        }
        return map_plain(mp, &sw->w_gate, why);
    }
    if (!strcmp(rest, "ffn_up.weight")) {
        if (!ly->fused_up) return map_plain(mp, &sw->w_up, why);
        /* phi3: the gate's F rows, then the up projection's */
        mp->in = sw->w_up.ne0;
        mp->out = 2 * F;
        mp->n_mat = 1;
        map_add(mp, &sw->w_gate, LORA_MAT, 0, F, 0, 0);
        map_add(mp, &sw->w_up, LORA_MAT, F, F, 0, 0);
        return true;
    }
    /* qwen35's gated delta-net layers: plain matrices */
    if (ly->recurrent && !strcmp(rest, "attn_gate.weight")) return map_plain(mp, &sw->ssm.z, why);
    if (ly->recurrent && !strcmp(rest, "ssm_beta.weight")) return map_plain(mp, &sw->ssm.beta, why);
    if (ly->recurrent && !strcmp(rest, "ssm_alpha.weight")) return map_plain(mp, &sw->ssm.alpha, why);
    if (ly->recurrent && !strcmp(rest, "ssm_out.weight")) return map_plain(mp, &sw->ssm.out, why);
    /* lfm2's short convolutions: in_proj's B, C and u rows (one device: E each), out_proj */
    if (ly->recurrent && sw->sc.in_b.buf && !strcmp(rest, "shortconv.in_proj.weight")) {
        const int64_t E = sw->sc.in_b.ne1;
        mp->in = sw->sc.in_b.ne0;
        mp->out = 3 * E;
        mp->n_mat = 1;
        map_add(mp, &sw->sc.in_b, LORA_MAT, 0, E, 0, 0);
        map_add(mp, &sw->sc.in_c, LORA_MAT, E, E, 0, 0);
        map_add(mp, &sw->sc.in_x, LORA_MAT, 2 * E, E, 0, 0);
        return true;
    }
    if (ly->recurrent && sw->sc.out.buf && !strcmp(rest, "shortconv.out_proj.weight")) return map_plain(mp, &sw->sc.out, why);
    /* a mixture of experts: the router, and each expert's matrices */
    const int64_t X = m->hp.moe.n_expert, FE = m->hp.moe.n_ff, E = m->hp.n_embd;
    if (!strcmp(rest, "ffn_gate_inp.weight")) return ly->moe.router.buf && map_plain(mp, &ly->moe.router, why);
    const bool gate_e = !strcmp(rest, "ffn_gate_exps.weight"), up_e = !strcmp(rest, "ffn_up_exps.weight"),
               gate_up_e = !strcmp(rest, "ffn_gate_up_exps.weight"), down_e = !strcmp(rest, "ffn_down_exps.weight");
    if (gate_e || up_e || gate_up_e || down_e) {
        if (X <= 0 || !ly->moe.ep[0].gate.buf) {
            *why = "the model's layer has no experts";
            return false;
        }
        if (gate_up_e != ly->fused_exps && !down_e) {
            *why = ly->fused_exps ? "the model holds the experts' gate and up fused (an adapter for them names "
                                    "ffn_gate_up_exps.weight)"
                                  : "the model has ffn_gate_exps and ffn_up_exps, not ffn_gate_up_exps";
            return false;
        }
        mp->n_mat = X;
        mp->in = down_e ? FE : E;
        mp->out = down_e ? E : gate_up_e ? 2 * FE : FE;
        if (gate_up_e) { /* expert e's 2F rows: its gate's F, then its up's F */
            map_add(mp, &ly->moe.ep[0].gate, LORA_MAT, 0, X * FE, FE, 2 * FE);
            map_add(mp, &ly->moe.ep[0].up, LORA_MAT, FE, X * FE, FE, 2 * FE);
        } else {
            map_add(mp, down_e ? &ly->moe.ep[0].down : gate_e ? &ly->moe.ep[0].gate : &ly->moe.ep[0].up, LORA_MAT, 0,
                    X * mp->out, 0, 0); /* one device: part 0 holds every expert */
        }
        return true;
    }
    *why = "adapters cover token_embd, attn_q, attn_k, attn_v, attn_qkv, attn_output, ffn_gate, ffn_up, ffn_down, "
           "ffn_gate_inp, the experts' ffn_*_exps, qwen35's attn_gate and ssm_beta/alpha/out, lfm2's "
           "shortconv.in_proj/out_proj, and output only";
    return false;
}

/* An f32 copy of t's elements (n = all of them), or NULL with the error set. */
static float *host_f32(const char *lab, const pkv_gguf_tensor *t, size_t n) {
    float *x = pkv_malloc(n * sizeof *x);
    if (!x) {
        pkv_err(PKV_ERR_NOMEM, "%s: tensor '%s': out of memory", lab, t->name);
        return NULL;
    }
    pkv_status s = pkv_dequantize_row(t->type, t->data, x, (int64_t)n);
    for (size_t i = 0; !s && i < n; i++)
        if (!isfinite(x[i])) s = pkv_err(PKV_ERR_FORMAT, "%s: tensor '%s': element %zu is not finite", lab, t->name, i);
    if (s) {
        pkv_free(x);
        return NULL;
    }
    return x;
}

/* Upload rows x cols of f32 to a new buffer of w. */
static pkv_status upload(const pkv_model *m, const char *lab, const char *name, const float *x, int64_t rows, int64_t cols,
                         pkv_weight *w) {
    const size_t bytes = (size_t)rows * (size_t)cols * sizeof *x;
    w->buf = pkv_buffer_alloc(m->dev, bytes);
    if (!w->buf) return pkv_err(PKV_ERR_NOMEM, "%s: tensor '%s': out of device memory", lab, name);
    w->type = PKV_TYPE_F32;
    w->ne0 = cols;
    w->ne1 = rows;
    return pkv_buffer_write(w->buf, 0, x, bytes);
}

/* One target's pair from the file's A and B (f32 on the host): its rows of B times
 * mul, or for the tied output Bᵀ and A. */
static pkv_status make_pair(const pkv_model *m, const char *lab, const char *name, const lora_map *mp, int k, const float *A,
                            const float *B, int64_t r, float mul, lora_pair *p) {
    const lora_kind kind = mp->t[k].kind;
    p->base = mp->t[k].w;
    p->kind = kind;
    p->r = r;
    p->n_mat = mp->n_mat;
    pkv_status s;
    if (kind == LORA_ROWS) { /* A [n_vocab][r] as it is, B [n_embd][r] */
        float *b = pkv_malloc((size_t)(mp->in * r) * sizeof *b);
        if (!b) return pkv_err(PKV_ERR_NOMEM, "%s: tensor '%s': out of memory", lab, name);
        for (int64_t i = 0; i < mp->in * r; i++) b[i] = B[i] * mul;
        s = upload(m, lab, name, A, mp->out, r, &p->a);
        if (!s) s = upload(m, lab, name, b, mp->in, r, &p->b);
        pkv_free(b);
        return s;
    }
    if (kind == LORA_TIED) { /* a = Bᵀ [r][n_embd], b = A [n_vocab][r] times mul */
        const int64_t E = mp->in, V = mp->out;
        float *t = pkv_malloc((size_t)(PKV_MAX(E, V) * r) * sizeof *t);
        if (!t) return pkv_err(PKV_ERR_NOMEM, "%s: tensor '%s': out of memory", lab, name);
        for (int64_t e = 0; e < E; e++)
            for (int64_t j = 0; j < r; j++) t[j * E + e] = B[e * r + j];
        s = upload(m, lab, name, t, r, E, &p->a);
        for (int64_t i = 0; !s && i < V * r; i++) t[i] = A[i] * mul;
        if (!s) s = upload(m, lab, name, t, V, r, &p->b);
        pkv_free(t);
        return s;
    }
    /* LORA_MAT: A [n_mat r][in] as it is; B's rows of this part */
    const int64_t nr = mp->t[k].nr, r0 = mp->t[k].r0, rb = mp->t[k].rblock, rs = mp->t[k].rstride;
    float *b = pkv_malloc((size_t)(nr * r) * sizeof *b);
    if (!b) return pkv_err(PKV_ERR_NOMEM, "%s: tensor '%s': out of memory", lab, name);
    for (int64_t i = 0; i < nr; i++) {
        const int64_t src = rb > 0 ? r0 + (i / rb) * rs + i % rb : r0 + i;
        for (int64_t j = 0; j < r; j++) b[i * r + j] = B[src * r + j] * mul;
    }
    s = upload(m, lab, name, A, mp->n_mat * r, mp->in, &p->a);
    if (!s) s = upload(m, lab, name, b, nr, r, &p->b);
    pkv_free(b);
    return s;
}

void pkv_lora_free(pkv_lora *a) {
    if (!a) return;
    if (a->m) /* off the model's list */
        for (pkv_lora **p = &((pkv_model *)a->m)->loras; *p; p = &(*p)->next)
            if (*p == a) {
                *p = a->next;
                break;
            }
    for (int i = 0; i < a->n; i++) {
        pkv_buffer_free(a->p[i].a.buf);
        pkv_buffer_free(a->p[i].b.buf);
    }
    pkv_free(a->p);
    pkv_free(a);
}

static pkv_lora *load(pkv_model *m, pkv_gguf *g) {
    const char *lab = pkv_gguf_label(g);
    pkv_lora *a = NULL;
    pkv_status s = PKV_OK;
    const char *str;
    size_t len;
    /* the delta uses the generic matmul, unary and add kernels; tested on the CPU and
     * Vulkan (test-lora-vulkan), not on CUDA */
    const pkv_device_kind kind = pkv_device_get_caps(m->dev)->kind;
    if (m->n_dev != 1 || (kind != PKV_DEVICE_CPU && kind != PKV_DEVICE_VULKAN)) {
        s = pkv_err(PKV_ERR_UNSUPPORTED, "%s: LoRA adapters run on a model on one CPU or Vulkan device; %s is on %s%s", lab,
                    m->label, pkv_device_name(m->dev), m->n_dev != 1 ? " and others" : "");
        goto fail;
    }
    if (pkv_gguf_get_str(g, "general.type", &str, &len) || len != 7 || memcmp(str, "adapter", 7)) {
        s = pkv_err(PKV_ERR_FORMAT, "%s: not a LoRA adapter (general.type is not \"adapter\")", lab);
        goto fail;
    }
    if (pkv_gguf_get_str(g, "adapter.type", &str, &len) || len != 4 || memcmp(str, "lora", 4)) {
        s = pkv_err(PKV_ERR_FORMAT, "%s: adapter.type is not \"lora\"", lab);
        goto fail;
    }
    if (pkv_gguf_find_key(g, "adapter.alora.invocation_tokens") >= 0) { /* applied only after those tokens: not here */
        s = pkv_err(PKV_ERR_UNSUPPORTED, "%s: an activated LoRA (adapter.alora.invocation_tokens) is not supported", lab);
        goto fail;
    }
    const char *arch = pkv_arch_name(m->hp.arch);
    if (pkv_gguf_get_str(g, "general.architecture", &str, &len) || len != strlen(arch) || memcmp(str, arch, len)) {
        s = pkv_err(PKV_ERR_MISMATCH, "%s: the adapter's general.architecture is not the model's (%s)", lab, arch);
        goto fail;
    }
    a = pkv_calloc(1, sizeof *a);
    const int64_t nt = pkv_gguf_n_tensors(g);
    if (!a) {
        s = pkv_err(PKV_ERR_NOMEM, "%s: out of memory", lab);
        goto fail;
    }
    snprintf(a->label, sizeof a->label, "%s", lab);
    if (pkv_gguf_find_key(g, "adapter.lora.alpha") >= 0 && (s = pkv_gguf_get_f32(g, "adapter.lora.alpha", &a->alpha))) {
        s = pkv_err_prefix(s, "%s", lab);
        goto fail;
    }
    if (!isfinite(a->alpha) || a->alpha < 0) {
        s = pkv_err(PKV_ERR_FORMAT, "%s: adapter.lora.alpha %g is not a finite value >= 0", lab, (double)a->alpha);
        goto fail;
    }
    uint64_t h = pkv_hash64(&a->alpha, sizeof a->alpha, 0x6c6f7261ull);
    for (int64_t i = 0; i < nt; i++) {
        const pkv_gguf_tensor *ta = pkv_gguf_tensor_at(g, i), *tb;
        size_t nl = strlen(ta->name);
        char name[256];
        if (nl > 7 && !strcmp(ta->name + nl - 7, ".lora_b")) {
            snprintf(name, sizeof name, "%.*s.lora_a", (int)(nl - 7), ta->name);
            if (!pkv_gguf_find_tensor(g, name)) {
                s = pkv_err(PKV_ERR_FORMAT, "%s: tensor '%s' has no '%s'", lab, ta->name, name);
                goto fail;
            }
            continue; /* taken with its lora_a */
        }
        if (nl <= 7 || strcmp(ta->name + nl - 7, ".lora_a") || nl - 7 >= sizeof name) {
            s = pkv_err(PKV_ERR_FORMAT, "%s: tensor '%s' is not a '<matrix>.lora_a' or '.lora_b'", lab, ta->name);
            goto fail;
        }
        snprintf(name, sizeof name, "%.*s.lora_b", (int)(nl - 7), ta->name);
        if (!(tb = pkv_gguf_find_tensor(g, name))) {
            s = pkv_err(PKV_ERR_FORMAT, "%s: tensor '%s' has no '%s'", lab, ta->name, name);
            goto fail;
        }
        name[nl - 7] = 0;
        const char *why;
        lora_map mp;
        if (!map_of(m, name, &mp, &why)) {
            s = pkv_err(PKV_ERR_MISMATCH, "%s: tensor '%s': %s (%s)", lab, ta->name, why, m->label);
            goto fail;
        }
        for (const pkv_gguf_tensor *t = ta; t; t = t == ta ? tb : NULL)
            if (t->type != PKV_TYPE_F32 && t->type != PKV_TYPE_F16 && t->type != PKV_TYPE_BF16 && t->type != PKV_TYPE_Q8_0) {
                s = pkv_err(PKV_ERR_UNSUPPORTED, "%s: tensor '%s' has type %s; adapters may be f32, f16, bf16 or q8_0", lab,
                            t->name, pkv_type_name(t->type));
                goto fail;
            }
        /* llama.cpp's shapes: A [in, r(, experts)], B [r, out(, experts)]; the token
         * embedding's pair flipped: A [r, n_vocab], B [r, n_embd] */
        const int dims = mp.n_mat > 1 ? 3 : 2;
        const int64_t r = mp.embd ? ta->ne[0] : ta->ne[1];
        const int64_t ea[3] = {mp.embd ? r : mp.in, mp.embd ? mp.out : r, mp.n_mat},
                      eb[3] = {r, mp.embd ? mp.in : mp.out, mp.n_mat};
        bool fits = (int)ta->n_dims <= dims && (int)tb->n_dims <= dims && r >= 1;
        for (int d = 0; d < 3 && fits; d++) fits = ta->ne[d] == (d < dims ? ea[d] : 1) && tb->ne[d] == (d < dims ? eb[d] : 1);
        if (!fits) {
            char want[128];
            if (mp.n_mat > 1)
                snprintf(want, sizeof want, "lora_a [%lld, r, %lld] and lora_b [r, %lld, %lld]", (long long)mp.in,
                         (long long)mp.n_mat, (long long)mp.out, (long long)mp.n_mat);
            else if (mp.embd)
                snprintf(want, sizeof want, "lora_a [r, %lld] and lora_b [r, %lld]", (long long)mp.out, (long long)mp.in);
            else
                snprintf(want, sizeof want, "lora_a [%lld, r] and lora_b [r, %lld]", (long long)mp.in, (long long)mp.out);
            char experts[32] = "";
            if (mp.n_mat > 1) snprintf(experts, sizeof experts, ", %lld experts", (long long)mp.n_mat);
            s = pkv_err(PKV_ERR_MISMATCH, "%s: tensor '%s' pair has shapes lora_a [%lld, %lld, %lld], lora_b [%lld, %lld, "
                        "%lld]; the base matrix [%lld, %lld%s] expects %s (another base model?)", lab, name,
                        (long long)ta->ne[0], (long long)ta->ne[1], (long long)ta->ne[2], (long long)tb->ne[0],
                        (long long)tb->ne[1], (long long)tb->ne[2], (long long)mp.in, (long long)mp.out, experts, want);
            goto fail;
        }
        for (int k = 0; k < a->n; k++)
            for (int j = 0; j < mp.n; j++)
                if (a->p[k].base == mp.t[j].w) {
                    s = pkv_err(PKV_ERR_FORMAT, "%s: tensor '%s' covers a matrix another pair of the file covers", lab,
                                ta->name);
                    goto fail;
                }
        if (a->n + mp.n > a->cap) {
            int cap = PKV_MAX(a->cap * 2, a->n + mp.n);
            lora_pair *np = pkv_realloc(a->p, (size_t)cap * sizeof *np);
            if (!np) {
                s = pkv_err(PKV_ERR_NOMEM, "%s: out of memory", lab);
                goto fail;
            }
            memset(np + a->cap, 0, (size_t)(cap - a->cap) * sizeof *np);
            a->p = np;
            a->cap = cap;
        }
        const size_t n_a = (size_t)(ta->ne[0] * ta->ne[1] * ta->ne[2]), n_b = (size_t)(tb->ne[0] * tb->ne[1] * tb->ne[2]);
        float *A = host_f32(lab, ta, n_a), *B = A ? host_f32(lab, tb, n_b) : NULL;
        const float mul = a->alpha != 0 ? a->alpha / (float)r : 1.0f;
        s = B ? PKV_OK : pkv_errcode();
        for (int k = 0; !s && k < mp.n; k++) {
            s = make_pair(m, lab, name, &mp, k, A, B, r, mul, &a->p[a->n]);
            a->n++; /* (a failed pair's buffers are freed with the rest) */
        }
        pkv_free(A);
        pkv_free(B);
        if (s) goto fail;
        a->n_file++;
        a->rank = PKV_MAX(a->rank, (int)r);
        h = pkv_hash64(ta->name, nl, h);
        h = pkv_hash64_bulk(ta->data, ta->n_bytes, h);
        h = pkv_hash64_bulk(tb->data, tb->n_bytes, h);
    }
    if (!a->n) {
        s = pkv_err(PKV_ERR_FORMAT, "%s: the adapter has no tensors", lab);
        goto fail;
    }
    a->fp = h ? h : 1;
    a->m = m;
    a->next = m->loras;
    m->loras = a;
    return a;
fail:
    pkv_lora_free(a);
    (void)s;
    return NULL;
}

pkv_lora *pkv_lora_load(pkv_model *m, const char *path) {
    if (!m || !path) {
        pkv_err(PKV_ERR_INVALID, "pkv_lora_load: NULL model or path");
        return NULL;
    }
    pkv_gguf *g = pkv_gguf_open(path);
    if (!g) return NULL;
    pkv_lora *a = load(m, g);
    pkv_gguf_close(g);
    return a;
}

pkv_lora *pkv_lora_load_memory(pkv_model *m, const void *data, size_t size, const char *label) {
    if (!m || !data) {
        pkv_err(PKV_ERR_INVALID, "pkv_lora_load_memory: NULL model or data");
        return NULL;
    }
    pkv_gguf *g = pkv_gguf_open_memory(data, size, label);
    if (!g) return NULL;
    pkv_lora *a = load(m, g);
    pkv_gguf_close(g);
    return a;
}

pkv_status pkv_lora_get_info(const pkv_lora *a, pkv_lora_info *info) {
    if (!a || !info) return pkv_err(PKV_ERR_INVALID, "pkv_lora_get_info: NULL argument");
    *info = (pkv_lora_info){.n_pairs = a->n_file, .rank = a->rank, .alpha = a->alpha, .fingerprint = a->fp, .label = a->label};
    return PKV_OK;
}

uint64_t pkv_lora_set_fingerprint(const pkv_model *m, const pkv_lora_set *set) {
    uint64_t h = m->fingerprint_base;
    bool any = false;
    for (int i = 0; set && i < set->n; i++) {
        if (set->u[i].scale == 0.0f) continue;
        h = pkv_hash64(&set->u[i].lora->fp, sizeof set->u[i].lora->fp, h);
        h = pkv_hash64(&set->u[i].scale, sizeof set->u[i].scale, h);
        any = true;
    }
    return !any ? m->fingerprint_base : h ? h : 1;
}

pkv_status pkv_lora_set_check(const pkv_model *m, const pkv_lora_use *uses, int n, const char *what) {
    if (n < 0 || n > PKV_MAX_LORA || (n && !uses))
        return pkv_err(PKV_ERR_INVALID, "%s: %d LoRA adapters (at most %d, PKV_MAX_LORA)", what, n, PKV_MAX_LORA);
    for (int i = 0; i < n; i++) {
        if (!uses[i].lora || uses[i].lora->m != m)
            return pkv_err(PKV_ERR_INVALID, "%s: LoRA adapter %d is %s", what, i, uses[i].lora ? "another model's" : "NULL");
        if (!isfinite(uses[i].scale))
            return pkv_err(PKV_ERR_INVALID, "%s: LoRA adapter %d's scale is not finite", what, i);
    }
    return PKV_OK;
}

pkv_status pkv_model_lora_apply(pkv_model *m, const pkv_lora_use *uses, int n) {
    if (!m) return pkv_err(PKV_ERR_INVALID, "pkv_model_lora_apply: NULL model");
    pkv_status s = pkv_lora_set_check(m, uses, n, "pkv_model_lora_apply");
    if (s) return s;
    pkv_lora_set set = {.n = n};
    if (n) memcpy(set.u, uses, (size_t)n * sizeof *uses);
    m->n_lora = n;
    memcpy(m->lora, set.u, sizeof m->lora);
    m->fingerprint = pkv_lora_set_fingerprint(m, &set);
    return PKV_OK;
}

int pkv_model_lora_get(const pkv_model *m, pkv_lora_use *out, int max) {
    if (!m) return 0;
    for (int i = 0; out && i < m->n_lora && i < max; i++) out[i] = m->lora[i];
    return m->n_lora;
}

/* The pair of a covering w, or NULL. */
static const lora_pair *pair_of(const pkv_lora *a, const pkv_weight *w) {
    for (int i = 0; i < a->n; i++)
        if (a->p[i].base == w) return &a->p[i];
    return NULL;
}

static pkv_status grow(pkv_device *dev, pkv_buffer **b, size_t *cap, size_t bytes) {
    if (bytes <= *cap) return PKV_OK;
    size_t c = PKV_MAX(bytes, *cap * 2);
    pkv_buffer *nb = pkv_buffer_alloc(dev, c);
    if (!nb) return pkv_err(PKV_ERR_NOMEM, "forward: LoRA workspace of %zu bytes", c);
    pkv_buffer_free(*b);
    *b = nb;
    *cap = c;
    return PKV_OK;
}

pkv_status pkv_lora_step(pkv_fwd *f, const pkv_lora_set **sets) {
    const pkv_fwd_batch *b = f->b;
    const pkv_model *m = f->m;
    f->lora = NULL;
    bool any = false;
    for (int i = 0; i < b->n_seqs; i++) {
        const pkv_lora_set *s = b->lora && b->lora[i] ? b->lora[i] : NULL;
        sets[i] = s ? s : NULL;
        int n = s ? s->n : m->n_lora;
        const pkv_lora_use *u = s ? s->u : m->lora;
        for (int j = 0; j < n; j++) any |= u[j].scale != 0.0f;
    }
    if (!any) return PKV_OK;
    if (m->n_dev != 1) return pkv_err(PKV_ERR_UNSUPPORTED, "forward: LoRA adapters on a model split over devices");
    /* every sequence's scales, [n_seqs][PKV_MAX_LORA], and room for the products */
    pkv_fwd_ws *ws = f->ws;
    const size_t ns = (size_t)b->n_seqs;
    float *sc = pkv_calloc(ns * PKV_MAX_LORA, sizeof *sc);
    if (!sc) return pkv_err(PKV_ERR_NOMEM, "forward: LoRA scales");
    int64_t rmax = 1, omax = 1;
    for (size_t i = 0; i < ns; i++) {
        int n = sets[i] ? sets[i]->n : m->n_lora;
        const pkv_lora_use *u = sets[i] ? sets[i]->u : m->lora;
        for (int j = 0; j < n; j++) {
            sc[i * PKV_MAX_LORA + (size_t)j] = u[j].scale;
            rmax = PKV_MAX(rmax, u[j].lora->rank);
            for (int k = 0; k < u[j].lora->n; k++) omax = PKV_MAX(omax, u[j].lora->p[k].b.ne1 / u[j].lora->p[k].n_mat);
        }
    }
    const int64_t rows = PKV_MAX(f->T, f->pl->n_out);
    pkv_status s;
    if ((s = grow(m->dev, &ws->lora_s, &ws->lora_s_cap, ns * PKV_MAX_LORA * sizeof *sc)) ||
        (s = grow(m->dev, &ws->lora_t, &ws->lora_t_cap, (size_t)rows * (size_t)rmax * 4)) ||
        (s = grow(m->dev, &ws->lora_d, &ws->lora_d_cap, (size_t)rows * (size_t)omax * 4)) ||
        (s = pkv_buffer_write(ws->lora_s, 0, sc, ns * PKV_MAX_LORA * sizeof *sc))) {
        pkv_free(sc);
        return s;
    }
    pkv_free(sc);
    f->lora = sets;
    return PKV_OK;
}

/* Sequence i's set: its own, or the model's default. */
static const pkv_lora_use *uses_of(const pkv_fwd *f, int i, int *n) {
    const pkv_lora_set *set = f->lora[i];
    *n = set ? set->n : f->m->n_lora;
    return set ? set->u : f->m->lora;
}

static bool same_uses(const pkv_lora_use *a, int na, const pkv_lora_use *b, int nb) {
    if (na != nb) return false;
    for (int j = 0; j < na; j++)
        if (a[j].lora != b[j].lora || memcmp(&a[j].scale, &b[j].scale, sizeof a[j].scale)) return false;
    return true;
}

/* y's n rows += scale (sequence i, use j) · B_e (A_e x) for pair p (expert e's
 * blocks; LORA_ROWS: A's rows of the ids, times the embedding's scale). */
static pkv_status run_delta(const pkv_fwd *f, pkv_device *dev, const lora_pair *p, int64_t e, int i, int j, pkv_tref x,
                            pkv_tref ids, pkv_tref y, int64_t n) {
    pkv_fwd_ws *ws = f->ws;
    const int64_t r = p->r, out = p->b.ne1 / p->n_mat, in = p->a.ne0;
    pkv_status s;
    if (p->kind == LORA_ROWS) {
        pkv_k_get_rows_args g = {.w = pkv_tref_make(p->a.buf, 0), .wtype = PKV_TYPE_F32, .n_vocab = p->a.ne1, .cols = r,
                                 .ids = ids, .out = pkv_tref_make(ws->lora_t, 0), .n = n, .scale = f->m->hp.embd_scale};
        s = pkv_k_get_rows(dev, &g);
    } else {
        pkv_k_matmul_args ma = {.w = pkv_tref_make(p->a.buf, (size_t)(e * r * in) * 4), .wtype = PKV_TYPE_F32, .rows = r,
                                .cols = in, .x = x, .y = pkv_tref_make(ws->lora_t, 0), .n = n};
        s = pkv_k_matmul(dev, &ma);
    }
    pkv_k_unary_args sa = {.x = pkv_tref_make(ws->lora_t, 0), .y = pkv_tref_make(ws->lora_t, 0), .n = n * r,
                           .op = PKV_UNARY_ID, .mul = pkv_tref_make(ws->lora_s, ((size_t)i * PKV_MAX_LORA + (size_t)j) * 4),
                           .mul_len = 1};
    pkv_k_matmul_args mb = {.w = pkv_tref_make(p->b.buf, (size_t)(e * out * r) * 4), .wtype = PKV_TYPE_F32, .rows = out,
                            .cols = r, .x = pkv_tref_make(ws->lora_t, 0), .y = pkv_tref_make(ws->lora_d, 0), .n = n};
    pkv_k_add_args ad = {.a = y, .b = pkv_tref_make(ws->lora_d, 0), .y = y, .n = n * out, .b_len = n * out};
    if (s || (s = pkv_k_unary(dev, &sa)) || (s = pkv_k_matmul(dev, &mb)) || (s = pkv_k_add(dev, &ad))) return s;
    return PKV_OK;
}

/* The rows of the step's runs: sequences i..k-1 share one set and n rows. */
static int64_t run_rows(const pkv_fwd *f, int i, bool out_rows, int *k_end) {
    const pkv_fwd_batch *b = f->b;
    int nu, k = i;
    const pkv_lora_use *u = uses_of(f, i, &nu);
    int64_t n = 0;
    for (;;) {
        const int64_t nt = b->n_tokens[k];
        n += !out_rows ? nt : b->n_logits ? b->n_logits[k] : b->all_logits ? nt : 1;
        if (++k == b->n_seqs) break;
        int nk;
        const pkv_lora_use *uk = uses_of(f, k, &nk);
        if (!same_uses(u, nu, uk, nk)) break;
    }
    *k_end = k;
    return n;
}

pkv_status pkv_lora_delta(const pkv_fwd *f, pkv_device *dev, const pkv_weight *w, pkv_buffer *x, pkv_tref y, int64_t T) {
    const pkv_fwd_batch *b = f->b;
    const bool out_rows = T != f->T; /* the head's: each sequence's logits rows */
    if (out_rows && T != f->pl->n_out) return PKV_OK; /* (no other row sets take adapters) */
    const size_t in = (size_t)w->ne0, out = (size_t)w->ne1;
    int64_t r0 = 0;
    /* runs of consecutive sequences with the same set take their deltas together
     * (the kernels are batch-invariant: a row's result does not depend on the run) */
    for (int i = 0; i < b->n_seqs;) {
        int nu, k;
        const pkv_lora_use *u = uses_of(f, i, &nu);
        const int64_t n = run_rows(f, i, out_rows, &k);
        for (int j = 0; j < nu; j++) {
            const lora_pair *p;
            if (u[j].scale == 0.0f || !(p = pair_of(u[j].lora, w))) continue;
            pkv_status s = run_delta(f, dev, p, 0, i, j, pkv_tref_make(x, (size_t)r0 * in * 4), pkv_tref_make(NULL, 0),
                                     pkv_tref_make(y.buf, y.off + (size_t)r0 * out * 4), n);
            if (s) return s;
        }
        r0 += n;
        i = k;
    }
    return PKV_OK;
}

pkv_status pkv_lora_embed(const pkv_fwd *f, pkv_device *dev, pkv_tref ids, pkv_buffer *x) {
    const pkv_fwd_batch *b = f->b;
    const size_t E = (size_t)f->m->hp.n_embd;
    int64_t r0 = 0;
    for (int i = 0; i < b->n_seqs;) {
        int nu, k;
        const pkv_lora_use *u = uses_of(f, i, &nu);
        const int64_t n = run_rows(f, i, false, &k);
        for (int j = 0; j < nu; j++) {
            const lora_pair *p;
            if (u[j].scale == 0.0f || !(p = pair_of(u[j].lora, &f->m->tok_embd))) continue;
            pkv_tref id = ids;
            id.off += (size_t)r0 * 4;
            pkv_status s = run_delta(f, dev, p, 0, i, j, pkv_tref_make(NULL, 0), id, pkv_tref_make(x, (size_t)r0 * E * 4), n);
            if (s) return s;
        }
        r0 += n;
        i = k;
    }
    return PKV_OK;
}

pkv_status pkv_lora_delta_expert(const pkv_fwd *f, pkv_device *dev, const pkv_weight *w, int64_t e, pkv_buffer *x,
                                 pkv_buffer *y, const int32_t *rows, int64_t n) {
    const pkv_fwd_batch *b = f->b;
    const size_t in = (size_t)w->ne0;
    /* row i is token rows[i] (ascending): runs of rows whose sequences share a set */
    int seq = 0;
    int64_t seq_end = b->n_tokens[0], i0 = 0;
    while (i0 < n) {
        while (rows[i0] >= seq_end) seq_end += b->n_tokens[++seq];
        int nu, k;
        const pkv_lora_use *u = uses_of(f, seq, &nu);
        (void)run_rows(f, seq, false, &k); /* sequences seq..k-1 share the set */
        int64_t last = seq_end;
        for (int q = seq + 1; q < k; q++) last += b->n_tokens[q];
        int64_t i1 = i0;
        while (i1 < n && rows[i1] < last) i1++;
        for (int j = 0; j < nu; j++) {
            const lora_pair *p;
            if (u[j].scale == 0.0f || !(p = pair_of(u[j].lora, w))) continue;
            const size_t out = (size_t)(p->b.ne1 / p->n_mat);
            pkv_status s = run_delta(f, dev, p, e, seq, j, pkv_tref_make(x, (size_t)i0 * in * 4), pkv_tref_make(NULL, 0),
                                     pkv_tref_make(y, (size_t)i0 * out * 4), i1 - i0);
            if (s) return s;
        }
        i0 = i1;
    }
    return PKV_OK;
}
