/* POST /v1/embeddings (/embeddings, /embedding) and /v1/rerank (/rerank,
 * /reranking, /v1/reranking): llama-server's and vLLM's conventions over the
 * serving engine's embedding requests (pkv_request_params.embed). Every input is
 * one engine request, submitted together so the engine batches them; the pooled
 * hidden state comes back in the request's final event. docs/server.md,
 * "Embeddings and rerank". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "server/server-http.h"

/* The pooling in force: --pooling, else the file's; -1 = none known. */
static int srv_pooling(const srv *s) { return s->o.pooling >= 0 ? s->o.pooling : s->info.pooling; }

static const char *pooling_name(int p) {
    static const char *const names[] = {"none", "mean", "cls", "last", "rank"};
    return p >= 0 && p <= 4 ? names[p] : "unknown";
}

/* Unknown fields are refused by name, as on the other endpoints (--lenient-fields: ignored). */
static bool fields_ok(const srv *s, json_t *b, const char *const *known, srv_out *o) {
    if (s->o.lenient_fields) return true;
    const char *k;
    json_t *v;
    json_object_foreach(b, k, v) {
        bool ok = false;
        for (int i = 0; known[i] && !ok; i++) ok = !strcmp(known[i], k);
        if (!ok) {
            srv_error(o, 400, "unknown field '%.80s' (start the server with --lenient-fields to ignore such fields)", k);
            return false;
        }
    }
    return true;
}

/* llama.cpp's common_embd_normalize semantics: -1 none, 0 max-abs scaled to the
 * int16 range, 2 Euclidean, p > 2 (or 1) the p-norm. */
static void normalize(float *v, int n, int mode) {
    double sum = 0;
    if (mode < 0) return;
    if (mode == 0) {
        for (int i = 0; i < n; i++) sum = fabs(v[i]) > sum ? fabs(v[i]) : sum;
        sum /= 32760.0;
    } else if (mode == 2) {
        for (int i = 0; i < n; i++) sum += (double)v[i] * v[i];
        sum = sqrt(sum);
    } else {
        for (int i = 0; i < n; i++) sum += pow(fabs(v[i]), mode);
        sum = pow(sum, 1.0 / mode);
    }
    double k = sum > 0 ? 1.0 / sum : 0.0;
    for (int i = 0; i < n; i++) v[i] = (float)(v[i] * k);
}

/* Submit the requests of rs (the engine batches those it holds together) and wait
 * for all. The server's queue (--queue) bounds what waits: when it is full, this
 * waits for its own earliest request still running and submits on; it answers 503
 * only when none of its own is in flight (the queue is full of others' requests).
 * false with the answer in o (the first failure's). */
static bool run_all(srv *s, srv_req **rs, int n, const char *prefix, const srv_conn *conn, srv_out *o) {
    char id[48];
    srv_next_id(s, prefix, id, sizeof id);
    int sub = 0, waited = 0, tries = 0;
    bool gone = false, busy = false;
    while (sub < n && !gone) {
        snprintf(rs[sub]->log_id, sizeof rs[sub]->log_id, "%s/%d", id, sub); /* the log line of each input */
        if (srv_gen_submit(s->g, rs[sub])) {
            sub++;
            tries = 0;
            continue;
        }
        if (waited < sub) {
            if (!srv_wait_done(s, rs[waited++], conn)) gone = true;
        } else if (sub > 0 && tries++ < 100 && !srv_conn_gone(conn)) {
            /* ours are done; the queue's count of them catches up after the worker's step */
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, NULL);
        } else { /* the queue is full of others' requests */
            busy = true;
        }
        if (busy) break;
    }
    for (int i = waited; i < sub; i++) {
        if (gone || busy) srv_gen_cancel(s->g, rs[i]);
        if (!srv_wait_done(s, rs[i], gone || busy ? NULL : conn)) gone = true;
    }
    if (gone) {
        srv_error(o, 499, "client closed the connection");
        return false;
    }
    if (busy) {
        srv_error(o, 503, "the server is busy: %d requests are waiting already (--queue); retry later", s->o.queue);
        return false;
    }
    for (int i = 0; i < n; i++)
        if (rs[i]->http_status) {
            srv_error(o, rs[i]->http_status, "input %d: %s", i, rs[i]->err);
            return false;
        }
    for (int i = 0; i < n; i++)
        if (!rs[i]->embd) {
            srv_error(o, 500, "input %d: the engine returned no embedding", i);
            return false;
        }
    return true;
}

static void free_all(srv_req **rs, int n) {
    for (int i = 0; rs && i < n; i++) srv_req_release(rs[i]);
    free(rs);
}

/* A new embedding request over ids (taken over), or NULL (o set). */
static srv_req *embed_req(srv *s, int32_t *ids, int n_ids, int pooling, const char *what, srv_out *o) {
    if (n_ids < 1) {
        free(ids);
        srv_error(o, 400, "'%s' is empty (no tokens)", what);
        return NULL;
    }
    if (n_ids > s->n_ctx) {
        free(ids);
        srv_error(o, 400, "'%s' has %d tokens, more than the context size of %lld (-c/--ctx-size)", what, n_ids,
                  (long long)s->n_ctx);
        return NULL;
    }
    srv_req *r = srv_req_new(1);
    if (!r) {
        free(ids);
        srv_error(o, 500, "out of memory");
        return NULL;
    }
    r->prompt = ids;
    r->n_prompt = n_ids;
    r->embed = true;
    r->pooling = (pkv_pooling)pooling;
    return r;
}

/* One input of "input": a string or an array of token ids. */
static srv_req *embed_input(srv *s, json_t *v, int pooling, const char *what, srv_out *o) {
    int32_t *ids = NULL;
    int n = 0;
    if (json_is_string(v)) {
        if (!s->info.has_vocab) {
            srv_error(o, 400, "'%s' is text, but the model has no vocabulary: send token ids", what);
            return NULL;
        }
        /* request text is data: special-token text stays text (--special-in-content: parsed) */
        if (!srv_tokenize(s, json_string_value(v), json_string_length(v), true, s->o.special_in_content, &ids, &n, o))
            return NULL;
    } else if (json_is_array(v)) {
        if (!srv_json_tokens(s, v, what, &ids, &n, o)) return NULL;
    } else {
        srv_error(o, 400, "'%s' must be a string or an array of token ids", what);
        return NULL;
    }
    return embed_req(s, ids, n, pooling, what, o);
}

/* Base64 of n bytes (standard alphabet, padded), malloc'd. */
static char *b64(const unsigned char *p, size_t n) {
    static const char t[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *out = malloc((n + 2) / 3 * 4 + 1), *q = out;
    if (!out) return NULL;
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)p[i] << 16 | (i + 1 < n ? (unsigned)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        *q++ = t[v >> 18 & 63];
        *q++ = t[v >> 12 & 63];
        *q++ = i + 1 < n ? t[v >> 6 & 63] : '=';
        *q++ = i + 2 < n ? t[v & 63] : '=';
    }
    *q = 0;
    return out;
}

/* NULL when out of memory or a value is not finite (JSON has no NaN). */
static json_t *float_array(const float *v, int n) {
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++)
        if (!isfinite(v[i]) || json_array_append_new(a, json_real(v[i]))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

/* The most floats a pooling-none answer carries (n_embd per token of every input). */
#define EMBD_NONE_MAX_FLOATS ((long long)1 << 22)

void srv_api_embeddings(srv *s, json_t *b, bool oai, const srv_conn *conn, srv_out *o) {
    static const char *const known[] = {"input", "content", "model", "encoding_format", "dimensions", "user",
                                        "embd_normalize", "normalize", "truncate_prompt_tokens", NULL};
    if (!fields_ok(s, b, known, o)) return;
    int pooling = srv_pooling(s);
    if (pooling < 0)
        return srv_error(o, 400, "the model has no pooling type (ARCH.pooling_type): it is not an embedding model; "
                                 "start the server with --pooling mean|cls|last to embed with it");
    json_t *in = json_object_get(b, "input");
    if (!in) {
        in = json_object_get(b, "content");
        oai = false; /* llama-server: "content" is its own format */
    }
    if (!in) return srv_error(o, 400, "'input' is missing");
    if (oai && pooling == PKV_POOLING_NONE)
        return srv_error(o, 400, "pooling 'none' gives one vector per token, which /v1/embeddings cannot return: "
                                 "use /embeddings, or start the server with another --pooling");
    json_t *m = json_object_get(b, "model");
    if (m && !json_is_string(m)) return srv_error(o, 400, "'model' must be a string");
    json_t *dims = json_object_get(b, "dimensions");
    if (dims && !json_is_null(dims)) /* Matryoshka truncation is not implemented */
        if (!json_is_integer(dims) || json_integer_value(dims) != s->info.n_embd)
            return srv_error(o, 400, "'dimensions' is not supported: the model's embeddings have %d dimensions "
                                     "(give %d or leave it out)", s->info.n_embd, s->info.n_embd);
    if (json_object_get(b, "truncate_prompt_tokens") && !json_is_null(json_object_get(b, "truncate_prompt_tokens")))
        return srv_error(o, 400, "'truncate_prompt_tokens' is not supported: an input longer than the context is refused");
    bool base64 = false;
    json_t *ef = json_object_get(b, "encoding_format");
    if (ef && !json_is_null(ef)) {
        if (!json_is_string(ef) || (strcmp(json_string_value(ef), "float") && strcmp(json_string_value(ef), "base64")))
            return srv_error(o, 400, "'encoding_format' must be \"float\" or \"base64\"");
        base64 = !strcmp(json_string_value(ef), "base64");
    }
    int norm = s->o.embd_normalize;
    json_t *en = json_object_get(b, "embd_normalize"), *nb = json_object_get(b, "normalize");
    if (en && !json_is_null(en)) {
        if (!json_is_integer(en) || json_integer_value(en) < -1 || json_integer_value(en) > 64)
            return srv_error(o, 400, "'embd_normalize' must be an integer in -1..64 (-1 none, 0 max-abs, 2 Euclidean)");
        norm = (int)json_integer_value(en);
    }
    if (nb && !json_is_null(nb)) { /* vLLM's */
        if (!json_is_boolean(nb)) return srv_error(o, 400, "'normalize' must be a boolean");
        norm = json_is_true(nb) ? 2 : -1;
    }
    /* the inputs: a string, an array of token ids, or an array of those */
    int n = 1;
    bool many = json_is_array(in) && json_array_size(in) > 0 && !json_is_integer(json_array_get(in, 0));
    if (json_is_array(in) && json_array_size(in) == 0) return srv_error(o, 400, "'input' is an empty array");
    if (many) n = (int)PKV_MIN(json_array_size(in), (size_t)1 << 30);
    if (n > s->o.max_embed_inputs)
        return srv_error(o, 400, "'input' has %d inputs, more than the limit of %d (--max-embed-inputs)", n,
                         s->o.max_embed_inputs);
    srv_req **rs = calloc((size_t)n, sizeof *rs);
    if (!rs) return srv_error(o, 500, "out of memory");
    for (int i = 0; i < n; i++) {
        char what[48];
        if (many) snprintf(what, sizeof what, "input[%d]", i);
        else snprintf(what, sizeof what, "input");
        json_t *v = many ? json_array_get(in, (size_t)i) : in;
        if (many && json_is_array(v) && json_array_size(v) && !json_is_integer(json_array_get(v, 0))) {
            free_all(rs, i);
            return srv_error(o, 400, "'%s' must be a string or an array of token ids", what);
        }
        if (!(rs[i] = embed_input(s, v, pooling, what, o))) {
            free_all(rs, i);
            return;
        }
    }
    if (pooling == PKV_POOLING_NONE) {
        long long fl = 0;
        for (int i = 0; i < n; i++) fl += (long long)rs[i]->n_prompt * s->info.n_embd;
        if (fl > EMBD_NONE_MAX_FLOATS) {
            free_all(rs, n);
            return srv_error(o, 400, "pooling 'none': %lld floats (a vector per token) exceed the limit of %lld; send "
                                     "fewer tokens", fl, EMBD_NONE_MAX_FLOATS);
        }
    }
    if (!run_all(s, rs, n, "embd", conn, o)) {
        free_all(rs, n);
        return;
    }
    json_t *data = json_array();
    bool broken = !data;
    long long tokens = 0;
    int E = s->info.n_embd;
    for (int i = 0; i < n; i++) {
        srv_req *r = rs[i];
        tokens += r->n_prompt;
        json_t *e = json_object();
        if (pooling == PKV_POOLING_NONE) { /* /embeddings only: a vector per token, as they are */
            json_t *rows = json_array();
            for (int t = 0; rows && t < r->n_embd / E; t++) {
                json_t *row = float_array(r->embd + (size_t)t * E, E);
                broken |= !row;
                json_array_append_new(rows, row);
            }
            broken |= !rows;
            json_object_set_new(e, "embedding", rows);
        } else {
            normalize(r->embd, r->n_embd, norm);
            json_t *vec;
            if (base64) {
                char *t = b64((const unsigned char *)r->embd, (size_t)r->n_embd * sizeof(float));
                vec = t ? json_string(t) : NULL;
                free(t);
            } else {
                vec = float_array(r->embd, r->n_embd);
            }
            broken |= !vec;
            if (!oai && vec) { /* llama-server's /embeddings: [[...]] */
                json_t *one = json_array();
                json_array_append_new(one, vec);
                vec = one;
            }
            json_object_set_new(e, "embedding", vec);
        }
        json_object_set_new(e, "index", json_integer(i));
        if (oai) json_object_set_new(e, "object", json_string("embedding"));
        json_array_append_new(data, e);
    }
    free_all(rs, n);
    if (broken) {
        json_decref(data);
        return srv_error(o, 500, "an embedding has a value that is not finite (or the server ran out of memory)");
    }
    if (!oai) {
        o->status = 200;
        o->json = data;
        return;
    }
    json_t *res = json_object();
    json_object_set_new(res, "object", json_string("list"));
    json_object_set_new(res, "data", data);
    json_object_set_new(res, "model", json_string(m ? json_string_value(m) : s->model_id));
    json_t *u = json_object();
    json_object_set_new(u, "prompt_tokens", json_integer(tokens));
    json_object_set_new(u, "total_tokens", json_integer(tokens));
    json_object_set_new(res, "usage", u);
    o->status = 200;
    o->json = res;
}

/* -------------------------------------------------------------- rerank */

/* The tokens of one query/document pair: the file's rerank template
 * (tokenizer.chat_template.rerank, {query} and {document} replaced; special tokens
 * only from the template's own text), else llama-server's default layout: BOS query
 * EOS document EOS, BOS and EOS where the vocabulary adds them (no SEP). */
static srv_req *rerank_input(srv *s, const char *tpl, json_t *q, json_t *d, int i, srv_out *o) {
    char what[48];
    snprintf(what, sizeof what, "documents[%d]", i);
    const char *qs = json_string_value(q), *ds = json_string_value(d);
    size_t ql = json_string_length(q), dl = json_string_length(d);
    int32_t *ids = NULL;
    int n = 0;
    if (tpl) {
        size_t tl = strlen(tpl), cap = tl + 1, len = 0, ns = 0;
        /* each occurrence adds at most the longer text */
        size_t occ = 0;
        for (const char *p = tpl; (p = strchr(p, '{')); p++) occ++;
        cap += occ * (ql > dl ? ql : dl);
        char *text = malloc(cap);
        size_t *spans = malloc((2 * occ + 2) * sizeof *spans);
        if (!text || !spans) {
            free(text);
            free(spans);
            srv_error(o, 500, "out of memory");
            return NULL;
        }
        for (const char *p = tpl; *p;) {
            const char *v = NULL;
            size_t vl = 0, kl = 0;
            if (!strncmp(p, "{query}", 7)) v = qs, vl = ql, kl = 7;
            else if (!strncmp(p, "{document}", 10)) v = ds, vl = dl, kl = 10;
            if (v) {
                spans[ns++] = len;
                memcpy(text + len, v, vl);
                len += vl;
                spans[ns++] = len;
                p += kl;
            } else {
                text[len++] = *p++;
            }
        }
        bool ok = srv_tokenize_part(s, text, len, false, spans, ns / 2, &ids, &n, o);
        free(text);
        free(spans);
        if (!ok) return NULL;
    } else {
        /* which special tokens the vocabulary adds: those of an empty text */
        int32_t *sp = NULL, *a = NULL, *c = NULL;
        int nsp = 0, na = 0, nc = 0;
        int32_t bos = pkv_model_bos(s->m), eos = pkv_model_eos(s->m);
        if (!srv_tokenize(s, "", 0, true, false, &sp, &nsp, o)) return NULL;
        bool add_bos = nsp > 0 && bos >= 0 && sp[0] == bos, add_eos = nsp > 0 && eos >= 0 && sp[nsp - 1] == eos;
        free(sp);
        if (!srv_tokenize(s, qs, ql, false, s->o.special_in_content, &a, &na, o)) return NULL;
        if (!srv_tokenize(s, ds, dl, false, s->o.special_in_content, &c, &nc, o)) {
            free(a);
            return NULL;
        }
        ids = malloc(((size_t)na + (size_t)nc + 3) * sizeof *ids);
        if (!ids) {
            free(a);
            free(c);
            srv_error(o, 500, "out of memory");
            return NULL;
        }
        if (add_bos) ids[n++] = bos;
        memcpy(ids + n, a, (size_t)na * sizeof *ids);
        n += na;
        if (add_eos) ids[n++] = eos;
        memcpy(ids + n, c, (size_t)nc * sizeof *ids);
        n += nc;
        if (add_eos) ids[n++] = eos;
        free(a);
        free(c);
    }
    return embed_req(s, ids, n, PKV_POOLING_RANK, what, o);
}

typedef struct rank_item {
    int index;
    float score;
} rank_item;

static int rank_cmp(const void *a, const void *b) {
    const rank_item *x = a, *y = b;
    if (x->score != y->score) return x->score < y->score ? 1 : -1;
    return x->index - y->index; /* ties: the earlier document first */
}

void srv_api_rerank(srv *s, json_t *b, const srv_conn *conn, srv_out *o) {
    static const char *const known[] = {"query", "documents", "texts", "top_n", "return_documents", "return_text",
                                        "model", "user", NULL};
    if (!fields_ok(s, b, known, o)) return;
    int pooling = srv_pooling(s);
    if (pooling != PKV_POOLING_RANK)
        return srv_error(o, 400, "the server's pooling is '%s', not 'rank': this model is not a reranker (start the "
                                 "server with --pooling rank (--reranking) on a model with a classification head)",
                         pooling_name(pooling));
    if (!s->info.n_cls_out)
        return srv_error(o, 400, "the model has no classification head (cls.output.weight): it cannot rerank");
    if (!s->info.has_vocab) return srv_error(o, 400, "the model has no vocabulary: rerank takes text");
    json_t *q = json_object_get(b, "query");
    if (!json_is_string(q)) return srv_error(o, 400, "'query' must be a string");
    bool tei = !json_object_get(b, "documents") && json_object_get(b, "texts");
    json_t *docs = tei ? json_object_get(b, "texts") : json_object_get(b, "documents");
    const char *dname = tei ? "texts" : "documents";
    if (!json_is_array(docs) || json_array_size(docs) == 0)
        return srv_error(o, 400, "'%s' must be a non-empty array of strings", dname);
    size_t nd = json_array_size(docs);
    if (nd > (size_t)s->o.max_embed_inputs)
        return srv_error(o, 400, "'%s' has %zu documents, more than the limit of %d (--max-embed-inputs)", dname, nd,
                         s->o.max_embed_inputs);
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(docs, i);
        if (json_is_object(d) && json_is_string(json_object_get(d, "text"))) continue; /* Cohere's {"text": ...} */
        if (!json_is_string(d)) return srv_error(o, 400, "'%s[%zu]' must be a string", dname, i);
    }
    long long top_n = (long long)nd;
    json_t *tn = json_object_get(b, "top_n");
    if (tn && !json_is_null(tn)) {
        if (!json_is_integer(tn) || json_integer_value(tn) < 1)
            return srv_error(o, 400, "'top_n' must be an integer >= 1");
        top_n = PKV_MIN(json_integer_value(tn), (long long)nd);
    }
    json_t *rd = json_object_get(b, "return_documents"), *rt = json_object_get(b, "return_text");
    if ((rd && !json_is_null(rd) && !json_is_boolean(rd)) || (rt && !json_is_null(rt) && !json_is_boolean(rt)))
        return srv_error(o, 400, "'%s' must be a boolean", rd && !json_is_boolean(rd) ? "return_documents" : "return_text");
    bool ret_docs = json_is_true(rd) || json_is_true(rt);
    json_t *m = json_object_get(b, "model");
    if (m && !json_is_string(m)) return srv_error(o, 400, "'model' must be a string");
    const char *tpl = s->rerank_tpl;
    srv_req **rs = calloc(nd, sizeof *rs);
    rank_item *it = malloc(nd * sizeof *it);
    if (!rs || !it) {
        free(rs);
        free(it);
        return srv_error(o, 500, "out of memory");
    }
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(docs, i);
        if (json_is_object(d)) d = json_object_get(d, "text");
        if (!(rs[i] = rerank_input(s, tpl, q, d, (int)i, o))) {
            free_all(rs, (int)i);
            free(it);
            return;
        }
    }
    if (!run_all(s, rs, (int)nd, "rerank", conn, o)) {
        free_all(rs, (int)nd);
        free(it);
        return;
    }
    long long tokens = 0;
    for (size_t i = 0; i < nd; i++) {
        if (!isfinite(rs[i]->embd[0])) {
            free_all(rs, (int)nd);
            free(it);
            return srv_error(o, 500, "the score of 'documents[%zu]' is not finite", i);
        }
        it[i].index = (int)i;
        it[i].score = rs[i]->embd[0]; /* llama-server's score: the head's first row (Qwen3: p(yes)) */
        tokens += rs[i]->n_prompt;
    }
    free_all(rs, (int)nd);
    qsort(it, nd, sizeof *it, rank_cmp);
    json_t *results = json_array();
    for (long long k = 0; k < top_n; k++) {
        json_t *e = json_object();
        json_object_set_new(e, "index", json_integer(it[k].index));
        json_object_set_new(e, tei ? "score" : "relevance_score", json_real(it[k].score));
        if (ret_docs) {
            json_t *d = json_array_get(docs, (size_t)it[k].index);
            if (json_is_object(d)) d = json_object_get(d, "text");
            if (tei) {
                json_object_set(e, "text", d);
            } else {
                json_t *dd = json_object();
                json_object_set(dd, "text", d);
                json_object_set_new(e, "document", dd);
            }
        }
        json_array_append_new(results, e);
    }
    free(it);
    if (tei) {
        o->status = 200;
        o->json = results;
        return;
    }
    json_t *res = json_object();
    json_object_set_new(res, "object", json_string("list"));
    json_object_set_new(res, "model", json_string(m ? json_string_value(m) : s->model_id));
    json_object_set_new(res, "results", results);
    json_t *u = json_object();
    json_object_set_new(u, "prompt_tokens", json_integer(tokens));
    json_object_set_new(u, "total_tokens", json_integer(tokens));
    json_object_set_new(res, "usage", u);
    o->status = 200;
    o->json = res;
}
