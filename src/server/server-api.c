/* OpenAI endpoints of pagekv serve: /v1/models, /v1/completions,
 * /v1/chat/completions (JSON or SSE streams as OpenAI sends them), and
 * /tokenize, /detokenize. Requests are validated field by field: a wrong type
 * or a value out of range is a 400 naming the field; parameters pagekv does not
 * implement are a 400 saying so, never silently ignored. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/server-http.h"
#include "server/server-media.h"
#include "server/server-stream.h"
#include "server/server-tools.h"

/* ------------------------------------------------------------ parameters */

/* A present, non-null field that is not a number, or out of [lo, hi]: 400. */
static bool get_num(json_t *b, const char *k, double lo, double hi, double *out, srv_out *o) {
    json_t *v = json_object_get(b, k);
    if (!v || json_is_null(v)) return true;
    if (!json_is_number(v)) {
        srv_error(o, 400, "'%s' must be a number", k);
        return false;
    }
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) {
        srv_error(o, 400, "'%s' must be in [%g, %g], got %g", k, lo, hi, x);
        return false;
    }
    *out = x;
    return true;
}

static bool get_int(json_t *b, const char *k, long long lo, long long hi, long long *out, srv_out *o) {
    json_t *v = json_object_get(b, k);
    if (!v || json_is_null(v)) return true;
    if (!json_is_integer(v)) {
        srv_error(o, 400, "'%s' must be an integer", k);
        return false;
    }
    long long x = json_integer_value(v);
    if (x < lo || x > hi) {
        srv_error(o, 400, "'%s' must be in [%lld, %lld], got %lld", k, lo, hi, x);
        return false;
    }
    *out = x;
    return true;
}

static bool get_bool(json_t *b, const char *k, bool *out, srv_out *o) {
    json_t *v = json_object_get(b, k);
    if (!v || json_is_null(v)) return true;
    if (!json_is_boolean(v)) {
        srv_error(o, 400, "'%s' must be true or false", k);
        return false;
    }
    *out = json_is_true(v);
    return true;
}

static bool add_stop(srv_req *r, const char *s, size_t n, srv_out *o) {
    if (n == 0) return true; /* an empty stop string matches nothing useful */
    if (n > 256) {
        srv_error(o, 400, "'stop' strings are at most 256 bytes");
        return false;
    }
    char *c = malloc(n + 1);
    char **a = realloc(r->stop, (size_t)(r->n_stop + 1) * sizeof *a);
    if (!c || !a) {
        free(c);
        if (a) r->stop = a;
        srv_error(o, 500, "out of memory");
        return false;
    }
    memcpy(c, s, n);
    c[n] = 0;
    r->stop = a;
    r->stop[r->n_stop++] = c;
    return true;
}

/* The request fields of /v1/completions and /v1/chat/completions (issue 28: nothing is
 * silently ignored). Each key of the body must be one that pagekv reads, one of
 * llama-server's or vLLM's names for a parameter pagekv has (read below as an alias),
 * or a field that does not change the output; a field of OpenAI, llama-server or vLLM
 * that would change the output and is not implemented is a 400 naming it, and so is a
 * field none of the three knows (--lenient-fields ignores those). */
static const char *const k_fields_any[] = {
    "model", "temperature", "top_p", "min_p", "top_k", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "repeat_penalty", "repeat_last_n", "seed", "max_tokens", "n_predict", "n", "stream",
    "stream_options", "stop", "ignore_eos", "logprobs", "best_of", "echo", "grammar", "response_format",
    "return_token_ids", "logit_bias", "lora",
    /* accepted, no effect on the output: OpenAI's bookkeeping, llama-server's and vLLM's hints */
    "user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier", "cache_prompt", "id_slot",
    "timings_per_token", "request_id", "priority", NULL};
static const char *const k_fields_chat[] = {
    "messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls",
    "chat_template_kwargs", "add_generation_prompt", "continue_final_message", "reasoning_effort", NULL};
static const char *const k_fields_completion[] = {"prompt", NULL};
/* known to OpenAI, llama-server or vLLM, and they would change the output: not implemented */
static const char *const k_fields_unimplemented[] = {
    "suffix", "functions", "function_call", "typical_p", "mirostat", "mirostat_tau", "mirostat_eta",
    "tfs_z", "dynatemp_range", "dynatemp_exponent", "xtc_probability", "xtc_threshold", "dry_multiplier", "dry_base",
    "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breakers", "samplers", "n_probs", "min_keep",
    "penalize_nl", "n_keep", "json_schema", "min_tokens", "stop_token_ids", "guided_json", "guided_regex",
    "guided_choice", "guided_grammar", "guided_decoding_backend", "structured_outputs", "use_beam_search",
    "length_penalty", "truncate_prompt_tokens", "prompt_logprobs", "include_stop_str_in_output",
    "spaces_between_special_tokens", "skip_special_tokens", "add_special_tokens", "modalities", "audio", "prediction",
    "web_search_options", "verbosity", "post_sampling_probs", "documents", "chat_template", "mm_processor_kwargs",
    "bad_words", "allowed_token_ids", "t_max_predict_ms", "response_fields", "return_tokens", "image_data",
    "multi_modal_data", NULL};

static bool in_list(const char *const *l, const char *k) {
    for (int i = 0; l[i]; i++)
        if (!strcmp(l[i], k)) return true;
    return false;
}

static bool check_fields(srv *s, json_t *b, int fmt, srv_out *o) {
    if (fmt == SRV_FMT_CONTEXT) return true; /* the contexts API checks its own */
    const char *k;
    json_t *v;
    json_object_foreach(b, k, v) {
        if (in_list(k_fields_any, k) || in_list(fmt == SRV_FMT_CHAT ? k_fields_chat : k_fields_completion, k)) continue;
        if (fmt == SRV_FMT_COMPLETION && in_list(k_fields_chat, k)) {
            if (!strcmp(k, "tools") || !strcmp(k, "tool_choice") || !strcmp(k, "parallel_tool_calls"))
                continue; /* refused below with what to use instead */
            srv_error(o, 400, "'%s' is a field of /v1/chat/completions, not of /v1/completions", k);
            return false;
        }
        if (in_list(k_fields_unimplemented, k)) {
            if (json_is_null(v)) continue; /* null is the default everywhere */
            srv_error(o, 400, "'%s' is not implemented by pagekv serve (it would change the output; "
                              "docs/server.md lists what is)", k);
            return false;
        }
        if (s->o.lenient_fields) continue;
        srv_error(o, 400, "unknown field '%s' (neither OpenAI's, llama-server's nor vLLM's; "
                          "start the server with --lenient-fields to ignore unknown fields)", k);
        return false;
    }
    return true;
}

/* logit_bias: one bias for token id t, or for each token of a string's
 * tokenization (without special tokens), appended to r->bias. what names the key
 * or element in messages. */
static bool bias_add(srv *s, srv_req *r, json_t *key, const char *what, float bias, srv_out *o) {
    int32_t one, *ids = &one;
    int n = 1;
    if (json_is_integer(key)) {
        json_int_t t = json_integer_value(key);
        if (t < 0 || t >= s->info.n_vocab) {
            srv_error(o, 400, "'logit_bias' %s: token id %lld is outside the vocabulary [0, %d)", what, (long long)t,
                      s->info.n_vocab);
            return false;
        }
        one = (int32_t)t;
    } else if (!srv_tokenize(s, json_string_value(key), json_string_length(key), false, false, &ids, &n, o)) {
        return false;
    } else if (n == 0) {
        free(ids);
        srv_error(o, 400, "'logit_bias' %s: the string has no tokens", what);
        return false;
    }
    bool ok = r->sp.n_logit_bias + n <= PKV_SAMPLER_MAX_LOGIT_BIAS;
    pkv_logit_bias *nb = ok ? realloc(r->bias, (size_t)(r->sp.n_logit_bias + n) * sizeof *nb) : NULL;
    if (nb) {
        r->bias = nb;
        for (int i = 0; i < n; i++) nb[r->sp.n_logit_bias++] = (pkv_logit_bias){ids[i], bias};
    }
    if (ids != &one) free(ids);
    if (!ok) srv_error(o, 400, "'logit_bias' has more than %d token entries (strings count their tokens)",
                       PKV_SAMPLER_MAX_LOGIT_BIAS);
    else if (!nb) srv_error(o, 500, "out of memory");
    return nb != NULL;
}

/* A bias value: a number in [-100, 100], or false (a ban: -infinity). */
static bool bias_value(json_t *v, const char *what, float *out, srv_out *o) {
    if (json_is_false(v)) {
        *out = -INFINITY;
        return true;
    }
    double x = json_is_number(v) ? json_number_value(v) : NAN;
    if (!(x >= -100 && x <= 100)) {
        srv_error(o, 400, "'logit_bias' %s: the bias must be a number in [-100, 100] or false (a ban)", what);
        return false;
    }
    *out = (float)x;
    return true;
}

/* OpenAI's logit_bias ({"token id": bias}) with llama-server's extensions: keys
 * that are not decimal token ids are strings whose every token gets the bias, the
 * list form [[id or string, bias or false], ...], and false for a ban. Entries add
 * up per token. Into r->sp.logit_bias (r->bias). */
static bool parse_logit_bias(srv *s, json_t *v, srv_req *r, srv_out *o) {
    r->sp.logit_bias = NULL;
    r->sp.n_logit_bias = 0;
    if (!v || json_is_null(v)) return true;
    char what[96];
    bool ok = true;
    if (json_is_object(v)) {
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x) {
            float bias;
            snprintf(what, sizeof what, "key '%.40s%s'", k, strlen(k) > 40 ? "..." : "");
            if (!(ok = bias_value(x, what, &bias, o))) break;
            const char *p = k + (*k == '-');
            bool id = *p && strlen(p) <= 18 && strspn(p, "0123456789") == strlen(p);
            json_t *key = id ? json_integer(strtoll(k, NULL, 10)) : json_string(k);
            ok = key && bias_add(s, r, key, what, bias, o);
            if (!key) srv_error(o, 500, "out of memory");
            json_decref(key);
            if (!ok) break;
        }
    } else if (json_is_array(v)) {
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e) {
            float bias;
            snprintf(what, sizeof what, "element %zu", i);
            json_t *key = json_array_get(e, 0);
            if (!json_is_array(e) || json_array_size(e) != 2 || !(json_is_integer(key) || json_is_string(key))) {
                srv_error(o, 400, "'logit_bias[%zu]' must be a pair [token id or string, bias or false]", i);
                ok = false;
                break;
            }
            if (!(ok = bias_value(json_array_get(e, 1), what, &bias, o) && bias_add(s, r, key, what, bias, o))) break;
        }
    } else {
        srv_error(o, 400, "'logit_bias' must be an object {\"token id or string\": bias} or a list of "
                          "[token id or string, bias or false] pairs");
        return false;
    }
    if (!ok) {
        free(r->bias);
        r->bias = NULL;
        r->sp.n_logit_bias = 0;
        return false;
    }
    r->sp.logit_bias = r->bias;
    /* a ban of every token leaves nothing to sample: refused here, not at the first token */
    int32_t banned = 0;
    uint8_t *seen = r->sp.n_logit_bias >= s->info.n_vocab ? calloc((size_t)s->info.n_vocab, 1) : NULL;
    for (int32_t i = 0; seen && i < r->sp.n_logit_bias; i++)
        if (r->bias[i].bias == -INFINITY && !seen[r->bias[i].token]++) banned++;
    free(seen);
    if (banned == s->info.n_vocab) {
        srv_error(o, 400, "'logit_bias' bans every token of the vocabulary (%d)", s->info.n_vocab);
        return false;
    }
    return true;
}

/* One {"id": i, "scale": s} entry of a 'lora' list (what is the field, for errors);
 * false with the 400 in o. */
static bool lora_entry(json_t *e, const char *what, size_t k, int n, int *id, float *scale, srv_out *o) {
    json_t *jid = json_object_get(e, "id"), *js = json_object_get(e, "scale");
    if (!json_is_object(e) || !json_is_integer(jid) || json_integer_value(jid) < 0 || json_integer_value(jid) >= n) {
        srv_error(o, 400, "'%s[%zu]' must be {\"id\": i, \"scale\": s} with id in [0, %d) (the adapters the server "
                          "was started with, GET /lora-adapters)", what, k, n);
        return false;
    }
    if (js && !json_is_null(js) && (!json_is_number(js) || !(fabs(json_number_value(js)) <= 1e6))) {
        srv_error(o, 400, "'%s[%zu].scale' must be a number in [-1e6, 1e6]", what, k);
        return false;
    }
    *id = (int)json_integer_value(jid);
    *scale = js && !json_is_null(js) ? (float)json_number_value(js) : 0.0f; /* llama-server's default */
    return true;
}

/* The request's LoRA set: its 'lora' (as llama-server: the adapters it lists at
 * their scales, the others 0; an empty list = none given), else the server's scales
 * when POST /lora-adapters changed them; the contexts API takes none. */
static bool parse_lora(srv *s, json_t *b, srv_req *r, int fmt, srv_out *o) {
    json_t *v = json_object_get(b, "lora");
    pthread_mutex_lock(&s->mu);
    const int n = s->n_lora;
    const bool set = s->lora_set;
    memcpy(r->lora, s->lora, sizeof r->lora);
    pthread_mutex_unlock(&s->mu);
    r->n_lora = n;
    if (!v || json_is_null(v) || (json_is_array(v) && !json_array_size(v))) {
        r->has_lora = set && fmt != SRV_FMT_CONTEXT;
        return true;
    }
    if (fmt == SRV_FMT_CONTEXT) {
        srv_error(o, 400, "'lora' is not supported by the contexts API (a context's KV has the adapters' startup scales)");
        return false;
    }
    if (!n) {
        srv_error(o, 400, "'lora': this server has no LoRA adapters (start it with --lora FILE)");
        return false;
    }
    if (!json_is_array(v) || json_array_size(v) > 64) {
        srv_error(o, 400, "'lora' must be an array of at most 64 {\"id\": i, \"scale\": s}");
        return false;
    }
    for (int i = 0; i < n; i++) r->lora[i].scale = 0.0f;
    size_t k;
    json_t *e;
    json_array_foreach(v, k, e) {
        int id;
        float sc;
        if (!lora_entry(e, "lora", k, n, &id, &sc, o)) return false;
        r->lora[id].scale = sc;
    }
    r->has_lora = true;
    return true;
}

void srv_api_lora_get(srv *s, srv_out *o) {
    json_t *a = json_array();
    pthread_mutex_lock(&s->mu);
    for (int i = 0; a && i < s->n_lora; i++) {
        pkv_lora_info li;
        pkv_lora_get_info(s->lora[i].lora, &li);
        json_array_append_new(a, json_pack("{s:i,s:s,s:f,s:i,s:f}", "id", i, "path", li.label, "scale",
                                           (double)s->lora[i].scale, "rank", li.rank, "alpha", (double)li.alpha));
    }
    pthread_mutex_unlock(&s->mu);
    if (!a) return srv_error(o, 500, "out of memory");
    o->status = 200;
    o->json = a;
}

/* llama-server's POST /lora-adapters: [{"id": i, "scale": s}], the adapters not
 * listed at 0, for the requests that do not name their own. */
void srv_api_lora_post(srv *s, json_t *body, srv_out *o) {
    if (!json_is_array(body) || json_array_size(body) > 64)
        return srv_error(o, 400, "the body must be an array of at most 64 {\"id\": i, \"scale\": s}");
    pthread_mutex_lock(&s->mu);
    const int n = s->n_lora;
    pthread_mutex_unlock(&s->mu);
    float sc[PKV_MAX_LORA] = {0};
    size_t k;
    json_t *e;
    json_array_foreach(body, k, e) {
        int id;
        float x;
        if (!lora_entry(e, "body", k, n, &id, &x, o)) return;
        sc[id] = x;
    }
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < n; i++) s->lora[i].scale = sc[i];
    s->lora_set = true;
    pthread_mutex_unlock(&s->mu);
    o->status = 200;
    o->json = json_pack("{s:b}", "success", 1);
}

bool srv_parse_sampling(srv *s, json_t *b, srv_req *r, int fmt, bool *logprobs, srv_out *o) {
    if (!check_fields(s, b, fmt, o)) return false;
    double temp = 1.0, top_p = 1.0, min_p = 0.0, pres = 0, freq = 0, rep = 1.0;
    long long last_n = -1;
    long long top_k = 0, seed = -1, max_tokens = fmt == SRV_FMT_COMPLETION ? s->o.max_tokens_default : s->n_ctx,
              top_lp = 0;
    json_t *sv = json_object_get(b, "seed");
    if (!get_num(b, "temperature", 0, 2, &temp, o) || !get_num(b, "top_p", 1e-9, 1, &top_p, o) ||
        !get_num(b, "min_p", 0, 1, &min_p, o) || !get_int(b, "top_k", -1, 1 << 30, &top_k, o) ||
        !get_num(b, "presence_penalty", -2, 2, &pres, o) || !get_num(b, "frequency_penalty", -2, 2, &freq, o) ||
        !get_num(b, "repeat_penalty", 1e-3, 10, &rep, o) || /* llama-server's name */
        !get_num(b, "repetition_penalty", 1e-3, 10, &rep, o) || !get_int(b, "repeat_last_n", 0, 1 << 20, &last_n, o) ||
        !get_int(b, "seed", INT64_MIN, INT64_MAX, &seed, o) ||
        !get_int(b, "n_predict", -1, 1 << 30, &max_tokens, o) || /* llama-server's name; -1 = the default */
        !get_int(b, "max_tokens", 1, 1 << 30, &max_tokens, o) ||
        !get_int(b, "max_completion_tokens", 1, 1 << 30, &max_tokens, o))
        return false;
    if (max_tokens < 0) max_tokens = fmt == SRV_FMT_COMPLETION ? s->o.max_tokens_default : s->n_ctx;
    /* a limit the client asked for is kept or refused, never cut (vLLM's rule; see srv_api_completions) */
    json_t *np = json_object_get(b, "n_predict");
    r->max_tokens_asked = (json_object_get(b, "max_tokens") && !json_is_null(json_object_get(b, "max_tokens"))) ||
                          (json_object_get(b, "max_completion_tokens") &&
                           !json_is_null(json_object_get(b, "max_completion_tokens"))) ||
                          (json_is_integer(np) && json_integer_value(np) >= 0);
    r->sp = pkv_sampler_default_params();
    r->sp.temp = (float)temp;
    r->sp.top_p = (float)top_p;
    r->sp.min_p = (float)min_p;
    r->sp.top_k = top_k < 0 ? 0 : (int)top_k;
    r->sp.repeat_penalty = (float)rep;
    if (last_n >= 0) r->sp.repeat_last_n = (int)last_n;
    if (sv && !json_is_null(sv)) r->sp.seed = (uint64_t)seed;
    else if (s->o.seed >= 0) r->sp.seed = (uint64_t)s->o.seed; /* serve --seed */
    else r->sp.seed = (uint64_t)time(NULL) * 2654435761u ^ (uint64_t)(uintptr_t)r; /* no seed: a fresh one */
    r->sp.presence_penalty = (float)pres;
    r->sp.frequency_penalty = (float)freq;
    r->max_tokens = (int)max_tokens;
    *logprobs = false;
    /* logprobs: completions take an integer 0..20 (top alternatives); chat takes true with
     * top_logprobs; the contexts API takes either form */
    if (fmt == SRV_FMT_COMPLETION || (fmt == SRV_FMT_CONTEXT && json_is_integer(json_object_get(b, "logprobs")))) {
        long long lp = -1;
        if (!get_int(b, "logprobs", 0, SRV_MAX_TOP, &lp, o)) return false;
        if (lp >= 0) {
            *logprobs = true;
            top_lp = lp;
        }
    } else {
        if (!get_bool(b, "logprobs", logprobs, o) || !get_int(b, "top_logprobs", 0, SRV_MAX_TOP, &top_lp, o)) return false;
        if (top_lp > 0 && !*logprobs) {
            srv_error(o, 400, "'top_logprobs' needs 'logprobs': true");
            return false;
        }
    }
    r->top_logprobs = (int)top_lp;
    json_t *st = json_object_get(b, "stop");
    if (st && !json_is_null(st)) {
        if (json_is_string(st)) {
            if (!add_stop(r, json_string_value(st), json_string_length(st), o)) return false;
        } else if (json_is_array(st) && json_array_size(st) <= 16) {
            size_t i;
            json_t *e;
            json_array_foreach(st, i, e) {
                if (!json_is_string(e)) {
                    srv_error(o, 400, "'stop[%zu]' must be a string", i);
                    return false;
                }
                if (!add_stop(r, json_string_value(e), json_string_length(e), o)) return false;
            }
        } else {
            srv_error(o, 400, "'stop' must be a string or an array of at most 16 strings");
            return false;
        }
    }
    /* the last four are read by srv_output_request, for completions and chat only */
    static const char *const unsupported[] = {"functions", "suffix", "tools", "response_format", "grammar", "tool_choice", NULL};
    for (int i = 0; unsupported[i]; i++) {
        if (i >= 2 && fmt != SRV_FMT_CONTEXT) continue;
        json_t *v = json_object_get(b, unsupported[i]);
        if (!v || json_is_null(v) || (json_is_object(v) && !json_object_size(v)) || (json_is_array(v) && !json_array_size(v)) ||
            (json_is_string(v) && !json_string_length(v)))
            continue;
        if (!strcmp(unsupported[i], "response_format") && json_is_object(v) &&
            json_is_string(json_object_get(v, "type")) && !strcmp(json_string_value(json_object_get(v, "type")), "text"))
            continue;
        srv_error(o, 400, "'%s' is not supported by %s", unsupported[i], i >= 2 ? "the contexts API" : "pagekv serve");
        return false;
    }
    if (!parse_logit_bias(s, json_object_get(b, "logit_bias"), r, o)) return false;
    if (!get_bool(b, "ignore_eos", &r->ignore_eos, o) || !parse_lora(s, b, r, fmt, o)) return false;
    bool echo = false;
    long long best_of = 1;
    if (!get_bool(b, "echo", &echo, o) || !get_int(b, "best_of", 1, 1, &best_of, o)) return false;
    if (echo) {
        srv_error(o, 400, "'echo' is not supported by pagekv serve");
        return false;
    }
    return true;
}

/* ------------------------------------------------------------- tokens */

/* One tokenizer slot for a large text (SRV_TOK_SLOTS at a time); small texts pass. */
static void tok_gate(srv *s, size_t len, bool enter) {
    if (len < SRV_TOK_BIG) return;
    pthread_mutex_lock(&s->tok_mu);
    if (enter) {
        while (s->tok_busy >= SRV_TOK_SLOTS) pthread_cond_wait(&s->tok_cv, &s->tok_mu);
        s->tok_busy++;
    } else {
        s->tok_busy--;
        pthread_cond_signal(&s->tok_cv);
    }
    pthread_mutex_unlock(&s->tok_mu);
}

static pkv_status tok_call(srv *s, const char *text, size_t len, bool add_special, bool parse_special,
                           const size_t *spans, size_t n_spans, int32_t *ids, size_t cap, size_t *need) {
    if (spans && parse_special)
        return pkv_model_tokenize_spans(s->m, text, len, add_special, spans, n_spans, ids, cap, need);
    return pkv_model_tokenize(s->m, text, len, add_special, parse_special, ids, cap, need);
}

static bool tokenize_any(srv *s, const char *text, size_t len, bool add_special, bool parse_special,
                         const size_t *spans, size_t n_spans, int32_t **out, int *n, srv_out *o) {
    if (len > ((size_t)1 << 28)) {
        srv_error(o, 400, "the text is too long to tokenize (%zu bytes)", len);
        return false;
    }
    /* One pass: a text of len bytes has at most len + 2 tokens (BOS, EOS) with a
     * vocabulary that covers every byte; if not, the count needed comes back and a
     * second pass fits it. */
    size_t cap = len + 3, need = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids) {
        srv_error(o, 500, "out of memory");
        return false;
    }
    tok_gate(s, len, true);
    pkv_status st = tok_call(s, text, len, add_special, parse_special, spans, n_spans, ids, cap, &need);
    if (st == PKV_ERR_INVALID && need > cap && need <= ((size_t)1 << 28)) {
        int32_t *b = realloc(ids, (need + 1) * sizeof *b);
        if (b) {
            ids = b;
            cap = need + 1;
            st = tok_call(s, text, len, add_special, parse_special, spans, n_spans, ids, cap, &need);
        }
    }
    tok_gate(s, len, false);
    if (st) {
        free(ids);
        srv_error(o, 400, "cannot tokenize: %s", pkv_errmsg());
        return false;
    }
    int32_t *fit = realloc(ids, (need + 1) * sizeof *fit); /* give the slack back */
    *out = fit ? fit : ids;
    *n = (int)need;
    return true;
}

bool srv_tokenize(srv *s, const char *text, size_t len, bool add_special, bool parse_special, int32_t **out, int *n,
                  srv_out *o) {
    return tokenize_any(s, text, len, add_special, parse_special, NULL, 0, out, n, o);
}

bool srv_tokenize_spans(srv *s, const char *text, size_t len, const size_t *spans, size_t n_spans, int32_t **out,
                        int *n, srv_out *o) {
    if (s->o.special_in_content) return tokenize_any(s, text, len, true, true, NULL, 0, out, n, o);
    return tokenize_any(s, text, len, true, true, spans, n_spans, out, n, o);
}

bool srv_tokenize_part(srv *s, const char *text, size_t len, bool add_special, const size_t *spans, size_t n_spans,
                       int32_t **out, int *n, srv_out *o) {
    if (s->o.special_in_content) return tokenize_any(s, text, len, add_special, true, NULL, 0, out, n, o);
    return tokenize_any(s, text, len, add_special, true, spans, n_spans, out, n, o);
}

bool srv_json_tokens(srv *s, json_t *a, const char *field, int32_t **out, int *n, srv_out *o) {
    if (!json_is_array(a)) {
        srv_error(o, 400, "'%s' must be an array of token ids", field);
        return false;
    }
    size_t k = json_array_size(a);
    if (k > (size_t)1 << 24) {
        srv_error(o, 400, "'%s' is too long", field);
        return false;
    }
    int32_t *ids = malloc((k + 1) * sizeof *ids);
    if (!ids) {
        srv_error(o, 500, "out of memory");
        return false;
    }
    for (size_t i = 0; i < k; i++) {
        json_t *e = json_array_get(a, i);
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) >= s->info.n_vocab) {
            free(ids);
            srv_error(o, 400, "'%s[%zu]' must be a token id in [0, %d)", field, i, s->info.n_vocab);
            return false;
        }
        ids[i] = (int32_t)json_integer_value(e);
    }
    *out = ids;
    *n = (int)k;
    return true;
}

json_t *srv_text_json(const char *p, size_t n) {
    size_t m;
    char *c = pkv_utf8_sanitize(p ? p : "", p ? n : 0, &m);
    if (!c) return json_null();
    json_t *j = json_stringn_nocheck(c, m);
    free(c);
    return j ? j : json_null();
}

static size_t piece(srv *s, int32_t id, char *buf, size_t size) {
    size_t n = 0;
    if (pkv_model_token_piece(s->m, id, true, buf, size, &n)) return 0;
    return n;
}

json_t *srv_token_string(srv *s, int32_t id) {
    char buf[512];
    return srv_text_json(buf, piece(s, id, buf, sizeof buf));
}

static json_t *token_bytes(srv *s, int32_t id) {
    char buf[512];
    size_t n = piece(s, id, buf, sizeof buf);
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer((unsigned char)buf[i]));
    return a;
}

/* One token of chat logprobs: {"token", "logprob", "bytes", "top_logprobs": [...]}. */
static json_t *lp_chat_entry(srv *s, const srv_tok *t) {
    json_t *top = json_array();
    for (int k = 0; k < t->n_top; k++)
        json_array_append_new(top, json_pack("{s:o,s:f,s:o}", "token", srv_token_string(s, t->top_id[k]), "logprob",
                                             (double)t->top_lp[k], "bytes", token_bytes(s, t->top_id[k])));
    return json_pack("{s:o,s:f,s:o,s:o}", "token", srv_token_string(s, t->id), "logprob", (double)t->logprob, "bytes",
                     token_bytes(s, t->id), "top_logprobs", top);
}

/* The completions syntax's top alternatives of one token: {piece: logprob}. */
static json_t *lp_top_object(srv *s, const srv_tok *t) {
    json_t *top = json_object();
    for (int k = 0; k < t->n_top; k++) {
        char buf[512];
        size_t n = piece(s, t->top_id[k], buf, sizeof buf), m;
        char *key = pkv_utf8_sanitize(buf, n, &m);
        if (key && !memchr(key, 0, m)) json_object_set_new(top, key, json_real(t->top_lp[k]));
        free(key);
    }
    return top;
}

/* Logprobs of tokens [from, to) of a choice, in the chat or the completions syntax. */
static json_t *logprobs_json(srv *s, const srv_choice *c, int from, int to, int fmt, size_t text_base) {
    if (fmt == SRV_FMT_CHAT) {
        json_t *content = json_array();
        for (int i = from; i < to; i++) json_array_append_new(content, lp_chat_entry(s, &c->toks[i]));
        return json_pack("{s:o}", "content", content);
    }
    json_t *toks = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    for (int i = from; i < to; i++) {
        const srv_tok *t = &c->toks[i];
        json_array_append_new(toks, srv_token_string(s, t->id));
        json_array_append_new(lps, json_real(t->logprob));
        json_array_append_new(tops, lp_top_object(s, t));
        json_array_append_new(offs, json_integer((json_int_t)(text_base + t->text_off)));
    }
    return json_pack("{s:o,s:o,s:o,s:o}", "tokens", toks, "token_logprobs", lps, "top_logprobs", tops, "text_offset", offs);
}

/* Media rows count as prompt tokens (each takes a position in the cache), and
 * prompt_tokens_details says how many were audio (OpenAI's audio_tokens) and
 * image rows (image_tokens). */
static json_t *usage_json(const srv_req *r) {
    int completion = 0;
    for (int i = 0; i < r->n; i++) completion += r->ch[i].n_toks;
    const int prompt = r->n_prompt + r->media_rows_audio + r->media_rows_image;
    json_t *u = json_pack("{s:i,s:i,s:i,s:{s:i}}", "prompt_tokens", prompt, "completion_tokens", completion,
                          "total_tokens", prompt + completion, "prompt_tokens_details", "cached_tokens", r->cached_tokens);
    if (u && r->n_media) {
        json_t *d = json_object_get(u, "prompt_tokens_details");
        json_object_set_new(d, "audio_tokens", json_integer(r->media_rows_audio));
        json_object_set_new(d, "image_tokens", json_integer(r->media_rows_image));
    }
    return u;
}

/* --------------------------------------------------------------- models */

static json_t *model_json(srv *s) {
    return json_pack("{s:s,s:s,s:I,s:s,s:{s:s,s:i,s:i,s:I,s:s}}", "id", s->model_id, "object", "model", "created",
                     (json_int_t)s->created, "owned_by", "pagekv", "meta", "arch", s->info.arch, "n_vocab",
                     s->info.n_vocab, "n_layer", s->info.n_layer, "n_ctx", (json_int_t)s->n_ctx, "chat_template",
                     s->tpl_name);
}

void srv_api_models(srv *s, srv_out *o) {
    o->status = 200;
    o->json = json_pack("{s:s,s:[o]}", "object", "list", "data", model_json(s));
}

void srv_api_model(srv *s, const char *id, srv_out *o) {
    if (strcmp(id, s->model_id))
        return srv_error(o, 404, "the model '%s' is not served here; this server serves '%s'", id, s->model_id);
    o->status = 200;
    o->json = model_json(s);
}

/* GET /props: llama-server's model and server properties, the chat template included. */
void srv_api_props(srv *s, srv_out *o) {
    const char *src = s->chat ? pkv_chat_source(s->chat) : NULL;
    o->status = 200;
    o->json = json_pack("{s:s,s:s,s:I,s:i,s:s?,s:s,s:{s:s,s:i,s:i,s:i,s:I,s:s},s:{s:b,s:b}}", "model_alias",
                        s->model_id, "model_path", s->model_path, "n_ctx", (json_int_t)s->n_ctx, "total_slots",
                        s->o.parallel, "chat_template", src, "chat_template_name", s->tpl_name, "meta", "arch",
                        s->info.arch, "n_vocab", s->info.n_vocab, "n_layer", s->info.n_layer, "n_embd", s->info.n_embd,
                        "weight_bytes", (json_int_t)s->info.weight_bytes, "weight_type", s->info.weight_type,
                        "modalities", "vision", s->mm && s->mm_info.kind == PKV_MEDIA_IMAGE, "audio",
                        s->mm && s->mm_info.kind == PKV_MEDIA_AUDIO);
    if (!o->json) srv_error(o, 500, "out of memory");
}

/* ---------------------------------------------------------- completions */

typedef struct render_watch {
    srv *s;
    const srv_conn *conn;
} render_watch;

/* a render stops when its client has gone away or the server is stopping */
static bool render_cancelled(void *ud) {
    render_watch *w = ud;
    return atomic_load(&w->s->stopping) || srv_conn_gone(w->conn);
}

static char *chat_prompt(srv *s, json_t *b, const srv_conn *conn, size_t *len, size_t **spans, size_t *n_spans, srv_out *o) {
    json_t *msgs = json_object_get(b, "messages");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0 || json_array_size(msgs) > 4096) {
        srv_error(o, 400, "'messages' must be a non-empty array of messages");
        return NULL;
    }
    if (!s->chat) {
        srv_error(o, 400, "the model has no chat template (tokenizer.chat_template): start the server with "
                          "--chat-template NAME (%s) or FILE (a Jinja template), or use /v1/completions",
                  pkv_tpl_names());
        return NULL;
    }
    char err[600];
    int status = 0;
    render_watch w = {s, conn};
    pkv_jinja_limits lim = {.max_time_ms = s->o.template_time_ms,
                            .max_memory = (size_t)s->o.template_mem_mib << 20,
                            .cancel = render_cancelled,
                            .cancel_ud = &w,
                            .shared = &s->tpl_budget};
    char *out = pkv_chat_apply_ex(s->chat, b, 0, &lim, len, spans, n_spans, &status, err, sizeof err);
    if (!out) {
        if (status == 499) {
            pthread_mutex_lock(&s->mu);
            s->disconnects++;
            pthread_mutex_unlock(&s->mu);
        }
        /* the server's options behind the interpreter's limits */
        const char *opt = strstr(err, "render time limit") ? " (--template-time)"
                          : strstr(err, "than the render limit allows") && strstr(err, "memory") ? " (--template-memory)"
                          : status == 503 ? " (--template-budget)" : "";
        size_t el = strlen(err);
        if (*opt && el + strlen(opt) < sizeof err) memcpy(err + el, opt, strlen(opt) + 1);
        srv_error(o, status ? status : 400, "%s", err);
        return NULL;
    }
    if (memchr(out, 0, *len)) { /* a NUL in a message: the tokenizer takes text */
        free(out);
        free(*spans);
        *spans = NULL;
        srv_error(o, 400, "the rendered prompt contains a NUL character");
        return NULL;
    }
    return out;
}

char *srv_chat_prompt(srv *s, json_t *b, const srv_conn *conn, size_t *len, size_t **spans, size_t *n_spans,
                      srv_out *o) {
    return chat_prompt(s, b, conn, len, spans, n_spans, o);
}

void srv_api_apply_template(srv *s, json_t *body, srv_out *o) {
    size_t len = 0, *spans = NULL, n_spans = 0;
    char *text = chat_prompt(s, body, NULL, &len, &spans, &n_spans, o);
    free(spans);
    if (!text) return;
    o->status = 200;
    o->json = json_pack("{s:o}", "prompt", srv_text_json(text, len));
    free(text);
}

/* ---------------------------------------------------------- lazy bodies */

/* A body written piece by piece as the client reads it (srv_body): fill appends
 * the next pieces (about LAZY_PIECE bytes) to pend, so what is in memory at once is
 * one piece plus the records the answer is made from, never the whole JSON text
 * or a JSON tree of it (a 22 MB logprobs answer was ~300 MB as a tree). */
#define LAZY_PIECE ((size_t)32 << 10)

typedef struct lazy {
    srv_body base;
    char *pend;
    size_t len, pos, cap;
    bool end, oom;
    void (*fill)(struct lazy *z); /* appends; sets end after the last piece */
    void (*drop)(struct lazy *z); /* frees what the kind holds (not z) */
} lazy;

static void lz_put(lazy *z, const char *p, size_t n) {
    if (z->oom) return;
    if (z->len + n > z->cap) {
        size_t nc = (z->len + n) * 2;
        char *q = realloc(z->pend, nc);
        if (!q) {
            z->oom = true;
            return;
        }
        z->pend = q;
        z->cap = nc;
    }
    memcpy(z->pend + z->len, p, n);
    z->len += n;
}

static void lz_str(lazy *z, const char *t) { lz_put(z, t, strlen(t)); }

static void lz_fmt(lazy *z, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void lz_fmt(lazy *z, const char *fmt, ...) {
    char b[256];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(b, sizeof b, fmt, ap);
    va_end(ap);
    if (k > 0) lz_put(z, b, (size_t)k < sizeof b ? (size_t)k : sizeof b - 1);
}

/* A JSON value (taken over), compact. */
static void lz_json(lazy *z, json_t *v) {
    char *t = v ? json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    json_decref(v);
    if (!t) {
        z->oom = true;
        return;
    }
    lz_str(z, t);
    free(t);
}

static ssize_t lz_read(srv_body *b, char *buf, size_t max) {
    lazy *z = (lazy *)b;
    while (z->pos >= z->len) {
        if (z->end) return 0;
        z->len = z->pos = 0;
        z->fill(z);
        if (z->oom) return -1;
    }
    size_t n = z->len - z->pos < max ? z->len - z->pos : max;
    memcpy(buf, z->pend + z->pos, n);
    z->pos += n;
    return (ssize_t)n;
}

static void lz_free(srv_body *b) {
    lazy *z = (lazy *)b;
    if (z->drop) z->drop(z);
    free(z->pend);
    free(z);
}

static lazy *lz_new(size_t size, void (*fill)(lazy *), void (*drop)(lazy *)) {
    lazy *z = calloc(1, size);
    if (!z) return NULL;
    z->base.read = lz_read;
    z->base.free = lz_free;
    z->fill = fill;
    z->drop = drop;
    return z;
}

/* A finished completion: the object OpenAI answers, written choice by choice and,
 * with logprobs, token by token. */
typedef struct cbody {
    lazy z;
    srv *s;
    srv_req *r; /* a reference; finished, so nothing changes it any more */
    bool chat, logprobs, token_ids;
    char id[64];
    int phase, ci, ti, arr;
    srv_outfmt of;
    int n_calls; /* tool calls of the current choice */
} cbody;

enum { CB_HEAD, CB_CHOICE, CB_TOKENS, CB_CHOICE_END, CB_TAIL };

static void cbody_fill(lazy *z) {
    cbody *b = (cbody *)z;
    srv_req *r = b->r;
    while (!z->end && !z->oom && z->len < LAZY_PIECE) {
        switch (b->phase) {
        case CB_HEAD:
            lz_str(z, "{\"id\":");
            lz_json(z, json_string(b->id));
            lz_fmt(z, ",\"object\":\"%s\",\"created\":%lld,\"model\":", b->chat ? "chat.completion" : "text_completion",
                   (long long)time(NULL));
            lz_json(z, json_string(b->s->model_id));
            lz_str(z, ",\"system_fingerprint\":\"pagekv\",\"choices\":[");
            b->phase = CB_CHOICE;
            break;
        case CB_CHOICE: {
            if (b->ci >= r->n) {
                b->phase = CB_TAIL;
                break;
            }
            srv_choice *c = &r->ch[b->ci];
            if (b->ci) lz_str(z, ",");
            if (b->chat) {
                lz_fmt(z, "{\"index\":%d,\"message\":", b->ci);
                lz_json(z, srv_output_message(b->s, &b->of, c->text, c->len, &b->n_calls));
                lz_str(z, ",\"logprobs\":");
            } else {
                lz_str(z, "{\"text\":");
                lz_json(z, srv_text_json(c->text, c->len));
                lz_fmt(z, ",\"index\":%d,\"logprobs\":", b->ci);
            }
            if (!b->logprobs) {
                lz_str(z, "null");
                b->phase = CB_CHOICE_END;
            } else {
                lz_str(z, b->chat ? "{\"content\":[" : "{\"tokens\":[");
                b->ti = b->arr = 0;
                b->phase = CB_TOKENS;
            }
            break;
        }
        case CB_TOKENS: {
            srv_choice *c = &r->ch[b->ci];
            if (b->ti < c->n_toks) {
                const srv_tok *t = &c->toks[b->ti];
                if (b->ti) lz_str(z, ",");
                if (b->chat) lz_json(z, lp_chat_entry(b->s, t));
                else if (b->arr == 0) lz_json(z, srv_token_string(b->s, t->id));
                else if (b->arr == 1) lz_json(z, json_real(t->logprob));
                else if (b->arr == 2) lz_json(z, lp_top_object(b->s, t));
                else lz_fmt(z, "%zu", t->text_off);
                b->ti++;
                break;
            }
            static const char *const next[] = {"],\"token_logprobs\":[", "],\"top_logprobs\":[", "],\"text_offset\":["};
            if (!b->chat && b->arr < 3) {
                lz_str(z, next[b->arr++]);
                b->ti = 0;
                break;
            }
            lz_str(z, "]}");
            b->phase = CB_CHOICE_END;
            break;
        }
        case CB_CHOICE_END: {
            srv_choice *c = &r->ch[b->ci];
            const char *fin = c->finish ? c->finish : "length";
            lz_fmt(z, ",\"finish_reason\":\"%s\"", b->n_calls && !strcmp(fin, "stop") ? "tool_calls" : fin);
            if (b->token_ids) { /* the generated ids too (a choice has at most the context's tokens) */
                lz_str(z, ",\"token_ids\":[");
                for (int k = 0; k < c->n_toks; k++) lz_fmt(z, k ? ",%d" : "%d", c->toks[k].id);
                lz_str(z, "]");
            }
            lz_str(z, "}");
            b->ci++;
            b->ti = 0;
            b->phase = CB_CHOICE;
            break;
        }
        default:
            if (b->token_ids && b->ti >= 0) { /* vLLM's return_token_ids: the prompt as the model saw it */
                lz_str(z, b->ti == 0 ? "],\"prompt_token_ids\":[" : "");
                for (int k = 0; b->ti < r->n_prompt && k < 4096; k++, b->ti++)
                    lz_fmt(z, b->ti ? ",%d" : "%d", r->prompt[b->ti]);
                if (b->ti < r->n_prompt) break;
                b->ti = -1;
                lz_str(z, "],\"usage\":");
            } else {
                lz_str(z, "],\"usage\":");
            }
            lz_json(z, usage_json(r));
            lz_str(z, "}");
            z->end = true;
        }
    }
}

static void cbody_drop(lazy *z) { srv_req_release(((cbody *)z)->r); }

static srv_body *completion_body(srv *s, srv_req *r, bool chat, bool logprobs, bool token_ids, const char *id,
                                 const srv_outfmt *of) {
    cbody *b = (cbody *)lz_new(sizeof *b, cbody_fill, cbody_drop);
    if (!b) return NULL;
    b->of = *of;
    b->s = s;
    b->r = r;
    pthread_mutex_lock(&r->mu);
    r->refs++;
    pthread_mutex_unlock(&r->mu);
    b->chat = chat;
    b->logprobs = logprobs;
    b->token_ids = token_ids;
    snprintf(b->id, sizeof b->id, "%s", id);
    return &b->z.base;
}

bool srv_submit_and_wait(srv *s, srv_req *r, int fmt, bool logprobs, bool include_usage, const char *id,
                         const srv_conn *conn, srv_out *o) {
    snprintf(r->log_id, sizeof r->log_id, "%s", id ? id : "");
    if (!srv_gen_submit(s->g, r)) {
        srv_error(o, 503, "the server is busy: %d requests are waiting already (--queue); retry later", s->o.queue);
        return false;
    }
    if (fmt >= 0) { /* streamed: the stream owns the answer from here */
        o->stream = srv_stream_new(s, r, fmt, logprobs, include_usage, id, conn);
        if (!o->stream) {
            srv_gen_cancel(s->g, r);
            srv_error(o, 500, "out of memory");
        } else {
            o->status = 200;
        }
        return false;
    }
    if (!srv_wait_done(s, r, conn)) {
        srv_error(o, 499, "client closed the connection");
        return false;
    }
    if (r->http_status) {
        srv_error(o, r->http_status, "%s", r->err);
        return false;
    }
    return true;
}

void srv_api_completions(srv *s, json_t *b, bool chat, const srv_conn *conn, srv_out *o) {
    srv_api_generate(s, b, chat ? SRV_FMT_CHAT : SRV_FMT_COMPLETION, conn, o);
}

void srv_api_generate(srv *s, json_t *b, int api, const srv_conn *conn, srv_out *o) {
    const bool chat = api != SRV_FMT_COMPLETION, msgs = api == SRV_FMT_MESSAGES;
    json_t *model = json_object_get(b, "model");
    if (model && !json_is_string(model)) return srv_error(o, 400, "'model' must be a string");
    bool stream = false, include_usage = false, logprobs = false, token_ids = false;
    if (!get_bool(b, "stream", &stream, o) || !get_bool(b, "return_token_ids", &token_ids, o)) return;
    if (stream && token_ids) return srv_error(o, 400, "'return_token_ids' is for answers that are not streamed");
    json_t *so = json_object_get(b, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) return srv_error(o, 400, "'stream_options' must be an object");
        if (!get_bool(so, "include_usage", &include_usage, o)) return;
    }
    long long n = 1;
    if (!get_int(b, "n", 1, 16, &n, o)) return;
    srv_req *r = srv_req_new((int)n);
    if (!r) return srv_error(o, 500, "out of memory");
    int fmt = chat ? SRV_FMT_CHAT : SRV_FMT_COMPLETION;
    srv_outfmt of;
    if (!srv_parse_sampling(s, b, r, fmt, &logprobs, o) || !srv_output_request(s, b, chat, r, &of, o)) goto out;
    if (msgs) r->max_tokens_asked = false; /* Anthropic's max_tokens is required: a cap, cut to the context */
    if (chat) {
        /* audio and image parts: decoded, each replaced by the request's marker */
        srv_media_opts mo;
        srv_media_list ml;
        int mst = 0;
        char merr[600];
        srv_media_opts_get(s, &mo, conn);
        if (!srv_media_extract(b, &mo, &ml, &mst, merr, sizeof merr)) {
            srv_error(o, mst, "%s", merr);
            goto out;
        }
        if (ml.n && n > 1) {
            srv_media_list_free(&ml);
            srv_error(o, 400, "'n' > 1 with audio or images is not supported");
            goto out;
        }
        size_t *spans = NULL, n_spans = 0, tlen = 0;
        char *text = chat_prompt(s, b, conn, &tlen, &spans, &n_spans, o);
        if (!text) {
            srv_media_list_free(&ml);
            goto out;
        }
        srv_output_prompt(&of, text, tlen);
        bool ok = ml.n ? srv_media_chat_prompt(s, text, tlen, spans, n_spans, &ml, r, conn, o)
                       : srv_tokenize_spans(s, text, tlen, spans, n_spans, &r->prompt, &r->n_prompt, o);
        srv_media_list_free(&ml);
        free(spans);
        free(text);
        if (!ok) goto out;
        r->stop_ids = s->stop_ids;
        r->n_stop_ids = s->n_stop_ids;
    } else {
        json_t *p = json_object_get(b, "prompt");
        if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0))) p = json_array_get(p, 0);
        if (json_is_string(p)) {
            if (!srv_tokenize(s, json_string_value(p), json_string_length(p), true, true, &r->prompt, &r->n_prompt, o))
                goto out;
        } else if (json_is_array(p) && json_array_size(p) > 0 && json_is_integer(json_array_get(p, 0))) {
            if (!srv_json_tokens(s, p, "prompt", &r->prompt, &r->n_prompt, o)) goto out;
        } else if (json_is_array(p) && json_array_size(p) > 1) {
            srv_error(o, 400, "'prompt': several prompts in one request are not supported; send one request each");
            goto out;
        } else {
            srv_error(o, 400, "'prompt' must be a string or an array of token ids");
            goto out;
        }
    }
    if (r->n_prompt == 0 && !r->n_media) {
        srv_error(o, 400, "the prompt is empty (and the model adds no BOS token)");
        goto out;
    }
    if (r->n_prompt >= s->n_ctx) {
        srv_error(o, 400, "the prompt has %d tokens; the context holds %lld (start the server with a larger -c)",
                  r->n_prompt, (long long)s->n_ctx);
        goto out;
    }
    const int64_t n_pos = (int64_t)r->n_prompt + r->media_rows_audio + r->media_rows_image;
    if (r->max_tokens_asked && n_pos + r->max_tokens > s->n_ctx) {
        srv_error(o, 400, "the context holds %lld tokens: the prompt has %lld and max_tokens asks for %d more "
                          "(ask for at most %lld, or start the server with a larger -c)",
                  (long long)s->n_ctx, (long long)n_pos, r->max_tokens, (long long)(s->n_ctx - n_pos));
        goto out;
    }
    char id[64];
    srv_next_id(s, msgs ? "msg" : chat ? "chatcmpl" : "cmpl", id, sizeof id);
    if (msgs) id[3] = '_'; /* Anthropic's ids: msg_... */
    if (!srv_submit_and_wait(s, r, stream ? api : -1, logprobs, include_usage, id, conn, o)) {
        if (o->stream && of.parse && !srv_stream_parse(o->stream, &of.tc)) {
            srv_stream_free(o->stream);
            o->stream = NULL;
            srv_error(o, 500, "out of memory");
        }
        goto out;
    }
    if (msgs) {
        if (!(o->json = srv_messages_body(s, r, &of, id))) {
            srv_error(o, 500, "out of memory");
            goto out;
        }
    } else if (!(o->body = completion_body(s, r, chat, logprobs, token_ids, id, &of))) {
        srv_error(o, 500, "out of memory");
        goto out;
    }
    o->status = 200;
    o->ctype = "application/json";
out:
    srv_req_release(r);
}

/* --------------------------------------------------------------- stream */

bool srv_stream_parse(srv_stream *st, const pkv_tc_opts *tc) {
    st->tcs = calloc((size_t)st->r->n, sizeof *st->tcs);
    if (!st->tcs) return false;
    st->short_call_ids = tc->fmt == PKV_TC_MISTRAL;
    for (int i = 0; i < st->r->n; i++)
        if (!(st->tcs[i] = pkv_tc_stream_new(tc))) return false;
    return true;
}

srv_stream *srv_stream_new(srv *s, srv_req *r, int fmt, bool logprobs, bool include_usage, const char *id,
                           const srv_conn *conn) {
    srv_stream *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    st->sent = calloc((size_t)r->n, sizeof *st->sent);
    st->sent_toks = calloc((size_t)r->n, sizeof *st->sent_toks);
    st->fin_sent = calloc((size_t)r->n, sizeof *st->fin_sent);
    if (!st->sent || !st->sent_toks || !st->fin_sent) {
        free(st->sent);
        free(st->sent_toks);
        free(st->fin_sent);
        free(st);
        return NULL;
    }
    st->s = s;
    st->r = r;
    pthread_mutex_lock(&r->mu);
    r->refs++;
    pthread_mutex_unlock(&r->mu);
    st->fmt = fmt;
    st->blk = -1;
    st->logprobs = logprobs;
    st->include_usage = include_usage;
    snprintf(st->id, sizeof st->id, "%s", id);
    st->conn = conn ? *conn : (srv_conn){-1, NULL, 0, NULL, NULL};
    st->conn.content_type = NULL; /* the request's header, gone when the stream outlives the handler */
    return st;
}

void srv_stream_free(srv_stream *st) {
    if (!st) return;
    pthread_mutex_lock(&st->r->mu);
    bool done = st->r->done, failed = st->r->http_status != 0;
    pthread_mutex_unlock(&st->r->mu);
    if (!done) { /* the client went away mid-stream (or a choice failed): stop the rest */
        srv_gen_cancel(st->s->g, st->r);
        if (!failed) {
            pthread_mutex_lock(&st->s->mu);
            st->s->disconnects++;
            pthread_mutex_unlock(&st->s->mu);
        }
    }
    for (int i = 0; st->tcs && i < st->r->n; i++) pkv_tc_stream_free(st->tcs[i]);
    free(st->tcs);
    srv_req_release(st->r);
    free(st->pend);
    free(st->sent);
    free(st->sent_toks);
    free(st->fin_sent);
    free(st);
}

static void emit(srv_stream *st, json_t *j) {
    char *t = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!t) return;
    size_t n = strlen(t);
    char *p = realloc(st->pend, st->pend_len + n + 9);
    if (p) {
        st->pend = p;
        memcpy(p + st->pend_len, "data: ", 6);
        memcpy(p + st->pend_len + 6, t, n);
        memcpy(p + st->pend_len + 6 + n, "\n\n", 2);
        st->pend_len += n + 8;
    }
    free(t);
}

static void emit_raw(srv_stream *st, const char *text) {
    size_t n = strlen(text);
    char *p = realloc(st->pend, st->pend_len + n + 1);
    if (p) {
        st->pend = p;
        memcpy(p + st->pend_len, text, n);
        st->pend_len += n;
    }
}

static json_t *chunk(srv_stream *st, json_t *choices) {
    const char *obj = st->fmt == SRV_FMT_CHAT ? "chat.completion.chunk" : st->fmt == SRV_FMT_COMPLETION ? "text_completion"
                                                                                                          : "context.generation.chunk";
    json_t *j = json_pack("{s:s,s:s,s:I,s:s,s:s,s:o}", "id", st->id, "object", obj, "created", (json_int_t)time(NULL),
                          "model", st->s->model_id, "system_fingerprint", "pagekv", "choices", choices);
    if (st->include_usage && j) json_object_set_new(j, "usage", json_null());
    return j;
}

/* Chat deltas of choice i parsed for reasoning and tool calls (the text up to
 * its stable end; final: all of it), logprobs on the first; r->mu held. */
static void tc_events(srv_stream *st, int i, bool any, bool final) {
    srv_choice *c = &st->r->ch[i];
    if (!any && !final) return;
    const pkv_tc_delta *d = NULL;
    int nd = 0;
    if (!pkv_tc_stream_update(st->tcs[i], c->text, final ? c->len : c->stable, final, &d, &nd)) nd = 0;
    json_t *lp = st->logprobs && c->n_toks > st->sent_toks[i] ? logprobs_json(st->s, c, st->sent_toks[i], c->n_toks, SRV_FMT_CHAT, 0)
                                                              : NULL;
    for (int k = 0; k < nd || (k == 0 && lp); k++) {
        json_t *delta = k < nd ? srv_output_delta(st->s, &d[k], st->short_call_ids) : json_object();
        emit(st, chunk(st, json_pack("[{s:i,s:o,s:o,s:n}]", "index", i, "delta", delta, "logprobs", lp ? lp : json_null(),
                                     "finish_reason")));
        lp = NULL;
    }
    st->sent[i] = final ? c->len : c->stable;
    st->sent_toks[i] = c->n_toks;
}

/* Events for whatever progressed since the last call; r->mu held. */
static void build_events(srv_stream *st) {
    srv_req *r = st->r;
    srv *s = st->s;
    if (st->fmt == SRV_FMT_MESSAGES) return srv_messages_events(st);
    if (r->http_status) { /* failed mid-stream: an error event, then the end */
        srv_out eo = {0};
        srv_error(&eo, r->http_status, "%s", r->err);
        emit(st, eo.json);
        st->ended = true;
        return;
    }
    if (st->fmt == SRV_FMT_CHAT && !st->role_sent) {
        json_t *cs = json_array();
        for (int i = 0; i < r->n; i++)
            json_array_append_new(cs, json_pack("{s:i,s:{s:s,s:s},s:n,s:n}", "index", i, "delta", "role", "assistant",
                                                "content", "", "logprobs", "finish_reason"));
        emit(st, chunk(st, cs));
        st->role_sent = true;
    }
    bool all = true;
    for (int i = 0; i < r->n; i++) {
        srv_choice *c = &r->ch[i];
        size_t upto = c->stable;
        bool text_new = upto > st->sent[i], toks_new = c->n_toks > st->sent_toks[i];
        if (st->tcs) {
            tc_events(st, i, text_new || (toks_new && st->logprobs), false);
        } else if (text_new || (toks_new && (st->logprobs || st->fmt == SRV_FMT_CONTEXT))) {
            json_t *text = srv_text_json(c->text + st->sent[i], upto - st->sent[i]);
            json_t *lp = st->logprobs ? logprobs_json(s, c, st->sent_toks[i], c->n_toks, st->fmt == SRV_FMT_CHAT ? SRV_FMT_CHAT : SRV_FMT_COMPLETION, 0)
                                      : json_null();
            json_t *ch;
            if (st->fmt == SRV_FMT_CHAT) {
                ch = json_pack("{s:i,s:{s:o},s:o,s:n}", "index", i, "delta", "content", text, "logprobs", lp, "finish_reason");
            } else if (st->fmt == SRV_FMT_COMPLETION) {
                ch = json_pack("{s:o,s:i,s:o,s:n}", "text", text, "index", i, "logprobs", lp, "finish_reason");
            } else {
                json_t *ids = json_array();
                for (int k = st->sent_toks[i]; k < c->n_toks; k++) json_array_append_new(ids, json_integer(c->toks[k].id));
                ch = json_pack("{s:o,s:i,s:o,s:o,s:n}", "text", text, "index", i, "tokens", ids, "logprobs", lp,
                               "finish_reason");
            }
            emit(st, chunk(st, json_pack("[o]", ch)));
            st->sent[i] = upto;
            st->sent_toks[i] = c->n_toks;
        }
        /* A context's last chunk names its length: it waits until the worker has
         * finished the request (and recorded the length), not just the choice. */
        if (c->finish && !st->fin_sent[i] && st->sent[i] == c->len &&
            (r->done || (c->stable == c->len && st->fmt != SRV_FMT_CONTEXT))) {
            json_t *ch;
            const char *fin = c->finish;
            if (st->tcs) {
                tc_events(st, i, true, true); /* what was held back as a possible marker */
                if (pkv_tc_stream_calls(st->tcs[i]) && !strcmp(fin, "stop")) fin = "tool_calls";
            }
            if (st->fmt == SRV_FMT_CHAT)
                ch = json_pack("{s:i,s:{},s:n,s:s}", "index", i, "delta", "logprobs", "finish_reason", fin);
            else if (st->fmt == SRV_FMT_COMPLETION)
                ch = json_pack("{s:s,s:i,s:n,s:s}", "text", "", "index", i, "logprobs", "finish_reason", c->finish);
            else
                ch = json_pack("{s:s,s:i,s:[],s:n,s:s,s:I}", "text", "", "index", i, "tokens", "logprobs", "finish_reason",
                               c->finish, "n_tokens", (json_int_t)r->ctx_len);
            emit(st, chunk(st, json_pack("[o]", ch)));
            st->fin_sent[i] = true;
        }
        if (!st->fin_sent[i]) all = false;
    }
    if (r->done && all) {
        if (st->include_usage) {
            json_t *j = json_pack("{s:s,s:s,s:I,s:s,s:s,s:[],s:o}", "id", st->id, "object",
                                  st->fmt == SRV_FMT_CHAT ? "chat.completion.chunk" : "text_completion", "created",
                                  (json_int_t)time(NULL), "model", s->model_id, "system_fingerprint", "pagekv", "choices",
                                  "usage", usage_json(r));
            emit(st, j);
        }
        emit_raw(st, "data: [DONE]\n\n");
        st->ended = true;
    }
}

static bool progressed(const srv_stream *st) {
    const srv_req *r = st->r;
    if (r->done || r->http_status || ((st->fmt == SRV_FMT_CHAT || st->fmt == SRV_FMT_MESSAGES) && !st->role_sent))
        return true;
    for (int i = 0; i < r->n; i++) {
        const srv_choice *c = &r->ch[i];
        if (c->stable > st->sent[i] || (c->finish && !st->fin_sent[i] && st->fmt != SRV_FMT_CONTEXT)) return true;
        if (c->n_toks > st->sent_toks[i] && (st->logprobs || st->fmt == SRV_FMT_CONTEXT)) return true;
    }
    return false;
}

ssize_t srv_stream_read(srv_stream *st, char *buf, size_t max) {
    while (st->pend_pos >= st->pend_len) {
        free(st->pend);
        st->pend = NULL;
        st->pend_len = st->pend_pos = 0;
        if (st->ended) return 0;
        srv_req *r = st->r;
        pthread_mutex_lock(&r->mu);
        bool waited = !progressed(st);
        if (waited) srv_conn_waiting(&st->conn, true); /* generating is not the client being idle */
        while (!progressed(st)) {
            srv_req_wait_200ms(r);
            if (!progressed(st) && srv_conn_gone(&st->conn)) {
                pthread_mutex_unlock(&r->mu);
                return -1; /* srv_stream_free cancels it */
            }
        }
        build_events(st);
        pthread_mutex_unlock(&r->mu);
        if (waited) srv_conn_waiting(&st->conn, false);
    }
    size_t n = st->pend_len - st->pend_pos;
    if (n > max) n = max;
    memcpy(buf, st->pend + st->pend_pos, n);
    st->pend_pos += n;
    return (ssize_t)n;
}

/* ------------------------------------------------------------ tokenize */

/* /tokenize's answer, written as it is sent: {"tokens": [ids]}, or with pieces as
 * llama-server writes them, {"tokens": [{"id": id, "piece": text}]} (a piece that is
 * not whole UTF-8 is an array of its bytes). */
typedef struct tbody {
    lazy z;
    srv *s;
    int32_t *ids;
    int n, i, phase;
    bool pieces;
} tbody;

static void tbody_fill(lazy *z) {
    tbody *b = (tbody *)z;
    while (!z->end && !z->oom && z->len < LAZY_PIECE) {
        if (b->phase == 0) {
            lz_str(z, "{\"tokens\":[");
            b->phase = 1;
        } else if (b->i < b->n) {
            if (b->i) lz_str(z, ",");
            if (!b->pieces) {
                lz_fmt(z, "%d", b->ids[b->i]);
            } else {
                lz_fmt(z, "{\"id\":%d,\"piece\":", b->ids[b->i]);
                lz_json(z, srv_token_string(b->s, b->ids[b->i]));
                lz_str(z, "}");
            }
            b->i++;
        } else {
            lz_str(z, "]}");
            z->end = true;
        }
    }
}

static void tbody_drop(lazy *z) { free(((tbody *)z)->ids); }

void srv_api_tokenize(srv *s, json_t *b, srv_out *o) {
    json_t *t = json_object_get(b, "content");
    if (!t) t = json_object_get(b, "text");
    if (!t) t = json_object_get(b, "prompt");
    if (!json_is_string(t)) return srv_error(o, 400, "'content' must be a string");
    bool add_special = false, parse_special = true, with_pieces = false; /* llama-server's defaults */
    if (!get_bool(b, "add_special", &add_special, o) || !get_bool(b, "parse_special", &parse_special, o) ||
        !get_bool(b, "with_pieces", &with_pieces, o))
        return;
    int32_t *ids = NULL;
    int n = 0;
    if (!srv_tokenize(s, json_string_value(t), json_string_length(t), add_special, parse_special, &ids, &n, o)) return;
    tbody *tb = (tbody *)lz_new(sizeof *tb, tbody_fill, tbody_drop);
    if (!tb) {
        free(ids);
        return srv_error(o, 500, "out of memory");
    }
    tb->s = s;
    tb->ids = ids;
    tb->n = n;
    tb->pieces = with_pieces;
    o->status = 200;
    o->body = &tb->z.base;
    o->ctype = "application/json";
}

void srv_api_detokenize(srv *s, json_t *b, srv_out *o) {
    int32_t *ids = NULL;
    int n = 0;
    if (!srv_json_tokens(s, json_object_get(b, "tokens"), "tokens", &ids, &n, o)) return;
    size_t need = 0;
    pkv_status st = pkv_model_detokenize(s->m, ids, (size_t)n, false, NULL, 0, &need);
    char *text = (st == PKV_OK || st == PKV_ERR_INVALID) ? malloc(need + 1) : NULL;
    if (!text || pkv_model_detokenize(s->m, ids, (size_t)n, false, text, need + 1, &need)) {
        free(ids);
        free(text);
        return srv_error(o, 400, "cannot detokenize: %s", pkv_errmsg());
    }
    free(ids);
    o->status = 200;
    o->json = json_pack("{s:o}", "content", srv_text_json(text, need));
    free(text);
}
