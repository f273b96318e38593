/* The generation loop: sample, report, decode, repeat. */
#include "model/model-impl.h"

pkv_status pkv_generate(pkv_context *ctx, pkv_sampler *smp, int n_max, pkv_token_fn on_token, void *user, int *n_out) {
    if (n_out) *n_out = 0;
    if (!ctx || !smp || n_max < 0) return pkv_err(PKV_ERR_INVALID, "generate: NULL context or sampler, or n_max < 0");
    pkv_model_info info;
    pkv_status s0 = pkv_model_get_info(pkv_context_model(ctx), &info);
    if (s0) return s0;
    if (pkv_sampler_n_vocab(smp) != info.n_vocab)
        return pkv_err(PKV_ERR_MISMATCH, "generate: the sampler was made for a vocabulary of %d tokens, the model has %d",
                       (int)pkv_sampler_n_vocab(smp), info.n_vocab);
    for (int i = 0; i < n_max; i++) {
        const float *lg = pkv_context_logits(ctx);
        if (!lg) return pkv_err(PKV_ERR_INVALID, "generate: the context has no logits (decode a prompt first)");
        int32_t tok;
        pkv_status s = pkv_sampler_sample(smp, lg, &tok);
        if (s) return s;
        pkv_sampler_accept(smp, tok);
        if (n_out) (*n_out)++;
        bool go = on_token ? on_token(tok, user) : true;
        if (!go || pkv_model_is_eog(pkv_context_model(ctx), tok)) return PKV_OK;
        if (i + 1 == n_max) return PKV_OK; /* no need to decode a token nobody will sample after */
        if ((s = pkv_context_decode(ctx, &tok, 1))) return s;
    }
    return PKV_OK;
}
