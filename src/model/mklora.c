/* pagekv mkmodel --lora-of: a LoRA adapter with random A and B for a base GGUF, in
 * the layout llama.cpp's convert_lora_to_gguf.py writes (docs/lora.md). */
#include <math.h>
#include <string.h>

#include "base/quant.h"
#include "model/gguf.h"
#include "model/lora.h"

static float urand(uint64_t *rng) { /* [-1, 1) from splitmix64 */
    uint64_t z = (*rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)((double)(z >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* The base tensors an adapter made here covers: what pkv_lora_load accepts. */
static bool covered(const pkv_gguf_tensor *t) {
    static const char *const k[] = {"attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_qkv.weight",
                                    "attn_output.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight",
                                    "ffn_gate_inp.weight", "attn_gate.weight", "ssm_beta.weight", "ssm_alpha.weight",
                                    "ssm_out.weight", "shortconv.in_proj.weight", "shortconv.out_proj.weight"};
    static const char *const k_exps[] = {"ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_gate_up_exps.weight",
                                         "ffn_down_exps.weight"};
    if (!strcmp(t->name, "output.weight") || !strcmp(t->name, "token_embd.weight")) return t->n_dims == 2;
    int il, n = 0;
    char rest[64];
    if (sscanf(t->name, "blk.%d.%63s%n", &il, rest, &n) != 2 || t->name[n]) return false;
    for (size_t i = 0; t->n_dims == 2 && i < sizeof k / sizeof k[0]; i++)
        if (!strcmp(rest, k[i])) return true;
    for (size_t i = 0; t->n_dims == 3 && i < sizeof k_exps / sizeof k_exps[0]; i++)
        if (!strcmp(rest, k_exps[i])) return true;
    return false;
}

/* One tensor of ne [cols, rows, n_mat], entries uniform in [-amp, amp), as type. */
static pkv_status add_random(pkv_gguf_writer *w, const char *name, pkv_type type, int64_t cols, int64_t rows, int64_t n_mat,
                             float amp, uint64_t *rng) {
    size_t n = (size_t)cols * (size_t)rows * (size_t)n_mat,
           bytes = pkv_type_row_bytes(type, (size_t)cols) * (size_t)rows * (size_t)n_mat;
    float *x = pkv_malloc(n * sizeof *x);
    void *q = pkv_malloc(bytes);
    pkv_status s = !x || !q ? pkv_err(PKV_ERR_NOMEM, "mkmodel: out of memory for '%s'", name) : PKV_OK;
    for (size_t i = 0; !s && i < n; i++) x[i] = amp * urand(rng);
    if (!s) s = pkv_quantize_row(type, x, q, (int64_t)n);
    const int64_t ne[3] = {cols, rows, n_mat};
    if (!s) s = pkv_gguf_writer_add_tensor(w, name, type, n_mat > 1 ? 3 : 2, ne, q, bytes);
    pkv_free(x);
    pkv_free(q);
    return s;
}

pkv_status pkv_mklora_write(const pkv_mklora_params *p, const char *path) {
    if (!p || !p->base || !path || p->rank < 1 || p->rank > 4096 || !(p->alpha >= 0) || !isfinite(p->alpha) ||
        (p->type != PKV_TYPE_F32 && p->type != PKV_TYPE_F16))
        return pkv_err(PKV_ERR_INVALID, "mkmodel: --lora-of needs a base file, --lora-rank in [1, 4096], --lora-alpha >= 0 "
                       "and --type f32 or f16");
    pkv_gguf *g = pkv_gguf_open(p->base);
    if (!g) return pkv_err_prefix(PKV_ERR_IO, "mkmodel: --lora-of");
    pkv_gguf_writer *w = pkv_gguf_writer_create();
    const char *arch;
    size_t alen;
    char archz[64];
    pkv_status s = !w ? pkv_err(PKV_ERR_NOMEM, "mkmodel: out of memory") : PKV_OK;
    if (!s && pkv_gguf_get_str(g, "general.architecture", &arch, &alen))
        s = pkv_err(PKV_ERR_FORMAT, "mkmodel: %s has no general.architecture", p->base);
    if (!s) snprintf(archz, sizeof archz, "%.*s", (int)PKV_MIN(alen, sizeof archz - 1), arch);
    if (!s) s = pkv_gguf_writer_add_str(w, "general.architecture", archz);
    if (!s) s = pkv_gguf_writer_add_str(w, "general.type", "adapter");
    if (!s) s = pkv_gguf_writer_add_str(w, "general.name", "pagekv mkmodel lora");
    if (!s) s = pkv_gguf_writer_add_str(w, "adapter.type", "lora");
    if (!s) s = pkv_gguf_writer_add_f32(w, "adapter.lora.alpha", p->alpha);
    uint64_t rng = p->seed * 0x9e3779b97f4a7c15ull + 0x6c6f7261ull;
    int n = 0;
    for (int64_t i = 0; !s && i < pkv_gguf_n_tensors(g); i++) {
        const pkv_gguf_tensor *t = pkv_gguf_tensor_at(g, i);
        if (!covered(t)) continue;
        char name[64];
        const int64_t in = t->ne[0], out = t->ne[1], r = p->rank, X = t->n_dims == 3 ? t->ne[2] : 1;
        /* A x has entries of about |x|; B's make the delta a fraction of W x's. The
         * token embedding's pair is flipped as the converter writes it: A [r, n_vocab]
         * (a row of r per token), B [r, n_embd] */
        const bool embd = !strcmp(t->name, "token_embd.weight");
        snprintf(name, sizeof name, "%s.lora_a", t->name);
        s = embd ? add_random(w, name, p->type, r, out, 1, 1.0f, &rng)
                 : add_random(w, name, p->type, in, r, X, 1.0f / sqrtf((float)in), &rng);
        snprintf(name, sizeof name, "%s.lora_b", t->name);
        if (!s) s = add_random(w, name, p->type, r, embd ? in : out, X, 0.5f / sqrtf((float)r), &rng);
        n++;
    }
    if (!s && !n) s = pkv_err(PKV_ERR_FORMAT, "mkmodel: %s has no matrix an adapter covers", p->base);
    if (!s) s = pkv_gguf_writer_write(w, path);
    pkv_gguf_writer_free(w);
    pkv_gguf_close(g);
    return s;
}
