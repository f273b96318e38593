/* smollm3: SmolLM3. Llama's layer (RoPE on adjacent pairs, SwiGLU, Q/K/V biases
 * where a file has them) except that every fourth layer, (il + 1) % 4 == 0, gives
 * Q and K no RoPE ("NoPE"): llama.cpp fixes the step at 4 and reads no key for it
 * (its converter writes none; the model's config has no_rope_layer_interval 4),
 * and so does this file. The cache keeps those layers' K unrotated
 * (pkv_kv_layer_desc.rope_none): a shift moves it without turning it.
 *
 *   x += o(attention(q', k', v))    q, k, v = projections of attn_norm(x);
 *                                   q', k' = rope(q), rope(k), or q, k on a NoPE layer
 *   x += down(silu(gate·h) * (up·h))            h = ffn_norm(x)                      */
#include "model/arch/arch.h"
#include "model/arch/mk.h"

enum { NOPE_STEP = 4 }; /* llama.cpp's n_no_rope_layer_step for smollm3 */

/* Llama's tensors and layer; only the NoPE flag is this file's */
static pkv_status load_layer(pkv_loader *L, int il) {
    pkv_loader_model(L)->layers[il].nope = (il + 1) % NOPE_STEP == 0;
    return pkv_arch_llama.load_layer(L, il);
}

static pkv_status layer(pkv_fwd *f, int il) { return pkv_arch_llama.layer(f, il); }

/* ------------------------------------------------------- pagekv mkmodel */

static pkv_status mk_layer(pkv_mk *b, int l) { return pkv_arch_llama.mk->layer(b, l); }

/* SmolLM3-3B's RoPE base and norm epsilon */
static const pkv_arch_mk mk = {.rope_base = 5000000.0f, .rms_eps = 1e-6f, .layer = mk_layer};

const pkv_arch_ops pkv_arch_smollm3 = {.name = "smollm3", .load_layer = load_layer, .layer = layer, .mk = &mk};
