/* A random-weight Voxtral projector file (mkmmproj-audio.h). */
#include "media/mkmmproj-audio.h"

#include "base/quant.h"
#include "model/gguf.h"

#include <math.h>
#include <stdio.h>

typedef struct {
    pkv_gguf_writer *w;
    uint64_t s;
    float *f;
    uint8_t *q;
} gen;

static double urand(gen *G) { /* [-1, 1) from splitmix64 */
    uint64_t z = (G->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) / 4503599627370496.0 - 1.0;
}

/* A tensor of n_dims dims ne[] of `type` with values center + scale * U(-1, 1). */
static pkv_status put(gen *G, const char *name, pkv_type type, uint32_t n_dims, const int64_t *ne, double center,
                      double scale) {
    int64_t n = 1;
    for (uint32_t i = 0; i < n_dims; i++) n *= ne[i];
    for (int64_t i = 0; i < n; i++) G->f[i] = (float)(center + scale * urand(G));
    pkv_status s = pkv_quantize_row(type, G->f, G->q, n);
    if (s) return pkv_err_prefix(s, "mkmmproj: tensor %s", name);
    return pkv_gguf_writer_add_tensor(G->w, name, type, n_dims, ne, G->q, pkv_type_row_bytes(type, (size_t)n));
}

#define TRY(x)                                                                                      \
    do {                                                                                            \
        pkv_status _s = (x);                                                                        \
        if (_s) goto done;                                                                          \
    } while (0)

pkv_status pkv_mkmmproj_audio_write(const pkv_mkmmproj_audio_params *p, const char *path) {
    if (!p || !path || p->n_embd <= 0) return pkv_err(PKV_ERR_INVALID, "mkmmproj: no path or no text width");
    const int d = p->d ? p->d : 64, n_layer = p->n_layer ? p->n_layer : 2, n_head = p->n_head ? p->n_head : 4;
    const int n_mel = 128, n_pos = 1500, stack = 4, n_ff = stack * d, n_embd = p->n_embd;
    if (d <= 0 || n_layer <= 0 || n_head <= 0 || d % n_head)
        return pkv_err(PKV_ERR_INVALID, "mkmmproj: width %d, %d layers, %d heads", d, n_layer, n_head);
    size_t cap = (size_t)n_pos * d;
    const size_t sizes[] = {(size_t)d * n_mel * 3, (size_t)d * d * 3, (size_t)d * n_ff, (size_t)n_ff * n_embd,
                            (size_t)n_embd * n_embd};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (sizes[i] > cap) cap = sizes[i];
    gen G = {pkv_gguf_writer_create(), p->seed ? p->seed : 1, pkv_malloc(cap * 4), pkv_malloc(cap * 4)};
    pkv_status st = PKV_OK;
    if (!G.w || !G.f || !G.q) {
        st = pkv_err(PKV_ERR_NOMEM, "mkmmproj: out of memory");
        goto done;
    }
    pkv_gguf_writer *w = G.w;
    TRY(st = pkv_gguf_writer_add_str(w, "general.architecture", "clip"));
    TRY(st = pkv_gguf_writer_add_str(w, "general.type", "mmproj"));
    TRY(st = pkv_gguf_writer_add_str(w, "general.name", "pagekv test voxtral projector"));
    TRY(st = pkv_gguf_writer_add_u32(w, "general.file_type", 1)); /* mostly f16 */
    TRY(st = pkv_gguf_writer_add_bool(w, "clip.has_audio_encoder", true));
    TRY(st = pkv_gguf_writer_add_u32(w, "clip.audio.projection_dim", (uint32_t)n_embd));
    TRY(st = pkv_gguf_writer_add_u32(w, "clip.audio.embedding_length", (uint32_t)d));
    TRY(st = pkv_gguf_writer_add_u32(w, "clip.audio.feed_forward_length", (uint32_t)n_ff));
    TRY(st = pkv_gguf_writer_add_u32(w, "clip.audio.block_count", (uint32_t)n_layer));
    TRY(st = pkv_gguf_writer_add_u32(w, "clip.audio.attention.head_count", (uint32_t)n_head));
    TRY(st = pkv_gguf_writer_add_str(w, "clip.projector_type", "voxtral"));
    TRY(st = pkv_gguf_writer_add_u32(w, "clip.audio.num_mel_bins", (uint32_t)n_mel));
    TRY(st = pkv_gguf_writer_add_f32(w, "clip.audio.attention.layer_norm_epsilon", 1e-5f));
    TRY(st = pkv_gguf_writer_add_u32(w, "clip.audio.projector.stack_factor", (uint32_t)stack));
    {
        const int64_t c1[3] = {3, n_mel, d}, c2[3] = {3, d, d}, cb[2] = {1, d}, pos[2] = {d, n_pos};
        TRY(st = put(&G, "a.conv1d.1.weight", PKV_TYPE_F16, 3, c1, 0, 1.0 / sqrt(3.0 * n_mel)));
        TRY(st = put(&G, "a.conv1d.1.bias", PKV_TYPE_F32, 2, cb, 0, 0.1));
        TRY(st = put(&G, "a.conv1d.2.weight", PKV_TYPE_F16, 3, c2, 0, 1.0 / sqrt(3.0 * d)));
        TRY(st = put(&G, "a.conv1d.2.bias", PKV_TYPE_F32, 2, cb, 0, 0.1));
        TRY(st = put(&G, "a.position_embd.weight", PKV_TYPE_F16, 2, pos, 0, 0.5));
    }
    for (int i = 0; i < n_layer; i++) {
        char n[64];
        const int64_t vd[1] = {d}, vf[1] = {n_ff}, dd[2] = {d, d}, up[2] = {d, n_ff}, down[2] = {n_ff, d};
#define P(suffix, type, nd, ne, c, sc)                                                              \
    snprintf(n, sizeof n, "a.blk.%d." suffix, i);                                                   \
    TRY(st = put(&G, n, type, nd, ne, c, sc));
        P("attn_q.weight", PKV_TYPE_F16, 2, dd, 0, 1.0 / sqrt(d))
        P("attn_q.bias", PKV_TYPE_F32, 1, vd, 0, 0.1)
        P("attn_k.weight", PKV_TYPE_F16, 2, dd, 0, 1.0 / sqrt(d))
        P("attn_v.weight", PKV_TYPE_F16, 2, dd, 0, 1.0 / sqrt(d))
        P("attn_v.bias", PKV_TYPE_F32, 1, vd, 0, 0.1)
        P("attn_out.weight", PKV_TYPE_F16, 2, dd, 0, 1.0 / sqrt(d))
        P("attn_out.bias", PKV_TYPE_F32, 1, vd, 0, 0.1)
        P("ln1.weight", PKV_TYPE_F32, 1, vd, 1, 0.2)
        P("ln1.bias", PKV_TYPE_F32, 1, vd, 0, 0.1)
        P("ffn_up.weight", PKV_TYPE_F16, 2, up, 0, 1.0 / sqrt(d))
        P("ffn_up.bias", PKV_TYPE_F32, 1, vf, 0, 0.1)
        P("ffn_down.weight", PKV_TYPE_F16, 2, down, 0, 1.0 / sqrt(n_ff))
        P("ffn_down.bias", PKV_TYPE_F32, 1, vd, 0, 0.1)
        P("ln2.weight", PKV_TYPE_F32, 1, vd, 1, 0.2)
        P("ln2.bias", PKV_TYPE_F32, 1, vd, 0, 0.1)
#undef P
    }
    {
        const int64_t vd[1] = {d}, m1[2] = {n_ff, n_embd}, m2[2] = {n_embd, n_embd};
        TRY(st = put(&G, "a.post_ln.weight", PKV_TYPE_F32, 1, vd, 1, 0.2));
        TRY(st = put(&G, "a.post_ln.bias", PKV_TYPE_F32, 1, vd, 0, 0.1));
        /* Voxtral's projector linears have no bias (nn.Linear(..., bias=False)) */
        TRY(st = put(&G, "mm.a.mlp.1.weight", PKV_TYPE_F16, 2, m1, 0, 1.0 / sqrt(n_ff)));
        TRY(st = put(&G, "mm.a.mlp.2.weight", PKV_TYPE_F16, 2, m2, 0, 1.0 / sqrt(n_embd)));
    }
    st = pkv_gguf_writer_write(w, path);
done:
    pkv_gguf_writer_free(G.w);
    pkv_free(G.f);
    pkv_free(G.q);
    return st;
}
