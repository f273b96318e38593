/* The model's vocabulary through the public API: thin wrappers over the
 * tokenizer that name the model in errors. */
#include "model/model-impl.h"

pkv_status pkv_model_tokenize(const pkv_model *m, const char *text, size_t len, bool add_special, bool parse_special,
                              int32_t *out, size_t max, size_t *n_out) {
    if (!m || (!text && len) || !n_out) return pkv_err(PKV_ERR_INVALID, "tokenize: NULL argument");
    return pkv_tokenize(m->tok, text ? text : "", len, add_special, parse_special, out, max, n_out);
}

pkv_status pkv_model_tokenize_spans(const pkv_model *m, const char *text, size_t len, bool add_special,
                                    const size_t *data_spans, size_t n_spans, int32_t *out, size_t max,
                                    size_t *n_out) {
    if (!m || (!text && len) || !n_out) return pkv_err(PKV_ERR_INVALID, "tokenize: NULL argument");
    return pkv_tokenize_spans(m->tok, text ? text : "", len, add_special, true, data_spans, n_spans, out, max, n_out);
}

pkv_status pkv_model_detokenize(const pkv_model *m, const int32_t *ids, size_t n, bool render_special, char *buf,
                                size_t size, size_t *n_out) {
    if (!m || (!ids && n) || !n_out) return pkv_err(PKV_ERR_INVALID, "detokenize: NULL argument");
    return pkv_detokenize(m->tok, ids, n, render_special, buf, size, n_out);
}

pkv_status pkv_model_token_piece(const pkv_model *m, int32_t id, bool render_special, char *buf, size_t size,
                                 size_t *n_out) {
    if (!m || !n_out) return pkv_err(PKV_ERR_INVALID, "token_piece: NULL argument");
    return pkv_token_piece(m->tok, id, render_special, buf, size, n_out);
}

int32_t pkv_model_bos(const pkv_model *m) { return m ? pkv_tokenizer_bos(m->tok) : -1; }
int32_t pkv_model_eos(const pkv_model *m) { return m ? pkv_tokenizer_eos(m->tok) : -1; }
bool pkv_model_is_eog(const pkv_model *m, int32_t id) { return m && pkv_tokenizer_is_eog(m->tok, id); }
