/* A random-weight Gemma 3 projector (`pagekv mkmodel --arch gemma3 --vision
 * --mmproj-out P`) in the layout llama.cpp's convert_hf_to_gguf.py --mmproj writes:
 * the same keys in the same order, the same tensor names, shapes and types
 * (patch and position embeddings f32, the input projection f16, the blocks'
 * matrices f16 for --outtype f16 or f32, vectors f32), soft_emb_norm stored as the
 * converter stores it (1 + w). Weights are scaled so activations stay near unit size. */
#include "media/vision-impl.h"
#include "model/gguf.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct wr {
    pkv_gguf_writer *w;
    uint64_t s;
    float *f;
    uint16_t *h;
} wr;

static double urand(wr *r) { /* [-1, 1), splitmix64 */
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) / 4503599627370496.0 - 1.0;
}

/* A tensor of ne (ggml order) with values base + scale * U(-1, 1). */
static pkv_status put(wr *r, const char *name, pkv_type t, int n_dims, const int64_t *ne, double base, double scale) {
    size_t n = 1;
    for (int i = 0; i < n_dims; i++) n *= (size_t)ne[i];
    for (size_t i = 0; i < n; i++) r->f[i] = (float)(base + scale * urand(r));
    if (t == PKV_TYPE_F16) {
        for (size_t i = 0; i < n; i++) r->h[i] = pkv_f32_to_f16(r->f[i]);
        return pkv_gguf_writer_add_tensor(r->w, name, t, (uint32_t)n_dims, ne, r->h, n * 2);
    }
    return pkv_gguf_writer_add_tensor(r->w, name, PKV_TYPE_F32, (uint32_t)n_dims, ne, r->f, n * 4);
}

#define TRY(x)                                                                 \
    do {                                                                       \
        if ((st = (x))) goto done;                                             \
    } while (0)

pkv_status pkv_mkmmproj_vision_write(const pkv_mkmmproj_vision_params *pp, const char *path) {
    pkv_mkmmproj_vision_params p = *pp;
    if (!p.image_size) p.image_size = 224;
    if (!p.patch_size) p.patch_size = 14;
    if (!p.n_embd) p.n_embd = 64;
    if (!p.n_ff) p.n_ff = 128;
    if (!p.n_layer) p.n_layer = 2;
    if (!p.n_head) p.n_head = 4;
    if (!p.n_merge) p.n_merge = 4;
    if (!p.seed) p.seed = 1;
    if (p.n_embd_text < 1 || p.image_size < 1 || p.patch_size < 1 || p.image_size % p.patch_size ||
        (p.image_size / p.patch_size) % p.n_merge || p.n_embd % p.n_head || p.n_ff < 1 || p.n_layer < 1 ||
        p.image_size > 2048)
        return pkv_err(PKV_ERR_INVALID,
                       "mkmodel --vision: image size %d, patch %d, pooling %d, width %d, heads %d, text width %d: the "
                       "patch grid must be a multiple of the pooling and the width of the heads",
                       p.image_size, p.patch_size, p.n_merge, p.n_embd, p.n_head, p.n_embd_text);
    const int64_t D = p.n_embd, F = p.n_ff, P = p.patch_size, G = p.image_size / p.patch_size, T = p.n_embd_text;
    size_t cap = (size_t)PKV_MAX(PKV_MAX(D * D, D * F), PKV_MAX(D * G * G, PKV_MAX(D * 3 * P * P, D * T)));
    wr r = {pkv_gguf_writer_create(), p.seed * 0x5851f42d4c957f2dull + 7, pkv_malloc(cap * 4), pkv_malloc(cap * 2)};
    pkv_status st = PKV_OK;
    if (!r.w || !r.f || !r.h) {
        st = pkv_err(PKV_ERR_NOMEM, "mkmodel --vision: out of memory");
        goto done;
    }
    const pkv_type mt = p.f32 ? PKV_TYPE_F32 : PKV_TYPE_F16;
    /* keys, in the converter's order (MmprojModel, then Gemma3VisionModel) */
    TRY(pkv_gguf_writer_add_str(r.w, "general.architecture", "clip"));
    TRY(pkv_gguf_writer_add_str(r.w, "general.type", "mmproj"));
    TRY(pkv_gguf_writer_add_str(r.w, "general.name", "pagekv test gemma3 vision"));
    TRY(pkv_gguf_writer_add_u32(r.w, "general.file_type", p.f32 ? 0 : 1));
    TRY(pkv_gguf_writer_add_bool(r.w, "clip.has_vision_encoder", true));
    TRY(pkv_gguf_writer_add_u32(r.w, "clip.vision.projection_dim", (uint32_t)T));
    TRY(pkv_gguf_writer_add_u32(r.w, "clip.vision.image_size", (uint32_t)p.image_size));
    TRY(pkv_gguf_writer_add_u32(r.w, "clip.vision.patch_size", (uint32_t)P));
    TRY(pkv_gguf_writer_add_u32(r.w, "clip.vision.embedding_length", (uint32_t)D));
    TRY(pkv_gguf_writer_add_u32(r.w, "clip.vision.feed_forward_length", (uint32_t)F));
    TRY(pkv_gguf_writer_add_u32(r.w, "clip.vision.block_count", (uint32_t)p.n_layer));
    TRY(pkv_gguf_writer_add_u32(r.w, "clip.vision.attention.head_count", (uint32_t)p.n_head));
    /* Gemma 3 has 0.5 for each; distinct values per channel here, so a test sees a channel mix-up */
    const float mean[3] = {0.48f, 0.5f, 0.52f}, sd[3] = {0.27f, 0.26f, 0.28f};
    TRY(pkv_gguf_writer_add_arr(r.w, "clip.vision.image_mean", PKV_GGUF_FLOAT32, mean, 3));
    TRY(pkv_gguf_writer_add_arr(r.w, "clip.vision.image_std", PKV_GGUF_FLOAT32, sd, 3));
    TRY(pkv_gguf_writer_add_str(r.w, "clip.projector_type", "gemma3"));
    TRY(pkv_gguf_writer_add_f32(r.w, "clip.vision.attention.layer_norm_epsilon", 1e-6f));
    TRY(pkv_gguf_writer_add_bool(r.w, "clip.use_gelu", true));
    if (p.n_merge != 4) TRY(pkv_gguf_writer_add_u32(r.w, "clip.vision.projector.scale_factor", (uint32_t)p.n_merge));

    /* tensors, in the order the HF checkpoint lists them (projector first) */
    const double lin_d = sqrt(3.0 / (double)D), lin_f = sqrt(3.0 / (double)F);
    int64_t v[1], m[2];
    m[0] = T, m[1] = D;
    TRY(put(&r, "mm.input_projection.weight", PKV_TYPE_F16, 2, m, 0.0, lin_d));
    v[0] = D;
    TRY(put(&r, "mm.soft_emb_norm.weight", PKV_TYPE_F32, 1, v, 1.0, 0.2)); /* 1 + w, w ~ 0.2 U */
    int64_t pe[4] = {P, P, 3, D};
    TRY(put(&r, "v.patch_embd.weight", PKV_TYPE_F32, 4, pe, 0.0, sqrt(3.0 / (double)(3 * P * P))));
    TRY(put(&r, "v.patch_embd.bias", PKV_TYPE_F32, 1, v, 0.0, 0.1));
    m[0] = D, m[1] = G * G;
    TRY(put(&r, "v.position_embd.weight", PKV_TYPE_F32, 2, m, 0.0, 0.5));
    for (int l = 0; l < p.n_layer; l++) {
        char nm[64];
#define VEC(what, n, base, sc)                                                 \
    snprintf(nm, sizeof nm, "v.blk.%d.%s", l, what);                           \
    v[0] = n;                                                                  \
    TRY(put(&r, nm, PKV_TYPE_F32, 1, v, base, sc));
#define MAT(what, rows, cols, sc)                                              \
    snprintf(nm, sizeof nm, "v.blk.%d.%s", l, what);                           \
    m[0] = cols, m[1] = rows;                                                  \
    TRY(put(&r, nm, mt, 2, m, 0.0, sc));
        MAT("attn_k.weight", D, D, lin_d) VEC("attn_k.bias", D, 0.0, 0.1)
        MAT("attn_out.weight", D, D, lin_d) VEC("attn_out.bias", D, 0.0, 0.1)
        MAT("attn_q.weight", D, D, lin_d) VEC("attn_q.bias", D, 0.0, 0.1)
        MAT("attn_v.weight", D, D, lin_d) VEC("attn_v.bias", D, 0.0, 0.1)
        VEC("ln1.bias", D, 0.0, 0.1) VEC("ln1.weight", D, 1.0, 0.2)
        MAT("ffn_up.weight", F, D, lin_d) VEC("ffn_up.bias", F, 0.0, 0.1)
        MAT("ffn_down.weight", D, F, lin_f) VEC("ffn_down.bias", D, 0.0, 0.1)
        VEC("ln2.bias", D, 0.0, 0.1) VEC("ln2.weight", D, 1.0, 0.2)
#undef VEC
#undef MAT
    }
    v[0] = D;
    TRY(put(&r, "v.post_ln.bias", PKV_TYPE_F32, 1, v, 0.0, 0.1));
    TRY(put(&r, "v.post_ln.weight", PKV_TYPE_F32, 1, v, 1.0, 0.2));
    st = pkv_gguf_writer_write(r.w, path);
done:
    pkv_gguf_writer_free(r.w);
    pkv_free(r.f);
    pkv_free(r.h);
    return st;
}
