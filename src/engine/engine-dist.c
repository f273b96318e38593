/* The serving engine over MPI ranks (engine-dist.h, docs/distributed.md). Rank 0
 * sends, before each step, one message: a header, then each request the step
 * takes from the queue (its parameters, prompt, stop tokens and logit bias) and
 * the ids cancelled since the last step. The other ranks submit and cancel the
 * same, in the same order, and step: the engine's choices (admission, batching,
 * preemption, sampling) are functions of these calls and of the logits, which
 * every rank receives alike, so the steps agree; the model's step digest checks it. */
#include <string.h>

#include "dist/dist.h"
#include "engine/engine-dist.h"
#include "engine/engine-impl.h"

#define DIST_MAGIC 0x706b7664u /* "pkvd" */

enum { MSG_STEP = 1, MSG_STOP = 2 };

typedef struct dist_msg {
    uint32_t magic, kind;
    int32_t n_req, n_cancel;
    uint64_t bytes; /* what follows: the requests' records and arrays, then the cancelled ids */
} dist_msg;

/* One request; its prompt [n_prompt], stop tokens [n_stop] and logit bias
 * [sampling.n_logit_bias] follow it. Every rank runs the same build (checked at
 * load), so the struct crosses as bytes. */
typedef struct dist_rec {
    uint64_t id;
    pkv_sampler_params sampling; /* logit_bias NULL */
    int32_t n_prompt, max_tokens, n_stop, n, priority, top_logprobs, pooling, n_keep;
    uint8_t ignore_eos, embed, has_lora, pad[5];
} dist_rec;

pkv_status pkv_engine_dist_lead(pkv_engine *e) {
    if (!e) return pkv_err(PKV_ERR_INVALID, "engine dist lead: engine is NULL");
    if (pkv_dist_size() > 1 && pkv_dist_rank() == 0) e->dist = ENG_DIST_LEAD;
    return PKV_OK;
}

pkv_status pkv_engine_dist_check(const pkv_engine *e, const pkv_request_params *rp) {
    (void)e;
    const char *what = rp->context ? "a request on a context" : rp->sampler ? "a request with its own sampler"
                       : rp->grammar ? "constrained output (a grammar, response_format, tool_choice)"
                       : rp->n_media ? "media in the prompt" : rp->lora && rp->n_lora ? "LoRA adapters" : NULL;
    if (!what) return PKV_OK;
    return pkv_err(PKV_ERR_UNSUPPORTED, "submit: %s under %d MPI ranks is not supported (docs/distributed.md)", what,
                   pkv_dist_size());
}

pkv_status pkv_engine_dist_log_cancel(pkv_engine *e, uint64_t id) {
    if (e->n_dist_cancel == e->dist_cancel_cap) {
        void *p = e->dist_cancel;
        size_t cap = (size_t)e->dist_cancel_cap;
        pkv_status s = pkv_grow(&p, &cap, (size_t)e->n_dist_cancel + 1, sizeof *e->dist_cancel);
        if (s) return s;
        e->dist_cancel = p;
        e->dist_cancel_cap = (int)cap;
    }
    e->dist_cancel[e->n_dist_cancel++] = id;
    return PKV_OK;
}

static size_t rec_bytes(const eng_req *r) {
    return sizeof(dist_rec) + sizeof(int32_t) * ((size_t)r->p.n_prompt + (size_t)r->p.n_stop) +
           sizeof(pkv_logit_bias) * (size_t)r->p.sampling.n_logit_bias;
}

static char *put(char *w, const void *p, size_t n) {
    if (n) memcpy(w, p, n);
    return w + n;
}

static void rec_write(const eng_req *r, char **w) {
    dist_rec d;
    memset(&d, 0, sizeof d);
    d.id = r->id;
    d.sampling = r->p.sampling;
    d.sampling.logit_bias = NULL;
    d.n_prompt = r->p.n_prompt;
    d.max_tokens = r->p.max_tokens;
    d.n_stop = r->p.n_stop;
    d.n = r->p.n;
    d.priority = r->p.priority;
    d.top_logprobs = r->p.top_logprobs;
    d.pooling = (int32_t)r->p.pooling;
    d.n_keep = r->p.n_keep;
    d.ignore_eos = r->p.ignore_eos;
    d.embed = r->p.embed;
    d.has_lora = r->has_lora;
    *w = put(*w, &d, sizeof d);
    *w = put(*w, r->prompt, sizeof(int32_t) * (size_t)d.n_prompt);
    *w = put(*w, r->stop, sizeof(int32_t) * (size_t)d.n_stop);
    *w = put(*w, r->bias, sizeof(pkv_logit_bias) * (size_t)d.sampling.n_logit_bias);
}

pkv_status pkv_engine_dist_send(const eng_req *head, const uint64_t *cancel, int n_cancel) {
    dist_msg h = {DIST_MAGIC, MSG_STEP, 0, n_cancel, sizeof(uint64_t) * (size_t)n_cancel};
    for (const eng_req *r = head; r; r = r->next) h.n_req++, h.bytes += rec_bytes(r);
    char *buf = pkv_malloc(h.bytes ? h.bytes : 1), *w = buf;
    if (!buf) return pkv_err(PKV_ERR_NOMEM, "engine: out of memory for the step's %llu bytes to the other ranks",
                             (unsigned long long)h.bytes);
    for (const eng_req *r = head; r; r = r->next) rec_write(r, &w);
    put(w, cancel, sizeof(uint64_t) * (size_t)n_cancel);
    pkv_status s = pkv_dist_bcast(&h, sizeof h);
    if (!s && h.bytes) s = pkv_dist_bcast(buf, h.bytes);
    pkv_free(buf);
    return s ? pkv_err_prefix(s, "engine: sending the step's requests to the other ranks") : PKV_OK;
}

void pkv_engine_dist_stop(pkv_engine *e) {
    if (e->dist != ENG_DIST_LEAD) return;
    e->dist = ENG_DIST_NONE;
    dist_msg h = {DIST_MAGIC, MSG_STOP, 0, 0, 0};
    if (!pkv_dist_broken() && pkv_dist_bcast(&h, sizeof h))
        PKV_WARN("engine: telling the other ranks to stop: %s", pkv_errmsg());
}

/* Submit one record of rank 0's at *rd (advanced past it) as rank 0 did. */
static pkv_status follow_submit(pkv_engine *e, const char **rd, const char *end) {
    dist_rec d;
    if ((size_t)(end - *rd) < sizeof d) return pkv_err(PKV_ERR_FORMAT, "rank %d: rank 0's step message is cut short", pkv_dist_rank());
    memcpy(&d, *rd, sizeof d);
    size_t n = sizeof(int32_t) * ((size_t)d.n_prompt + (size_t)d.n_stop) +
               sizeof(pkv_logit_bias) * (size_t)d.sampling.n_logit_bias;
    if (d.n_prompt < 0 || d.n_stop < 0 || d.sampling.n_logit_bias < 0 || (size_t)(end - *rd) - sizeof d < n)
        return pkv_err(PKV_ERR_FORMAT, "rank %d: rank 0's request %llu does not fit its step message", pkv_dist_rank(),
                       (unsigned long long)d.id);
    const char *p = *rd + sizeof d;
    *rd = p + n;
    /* the arrays may be unaligned in the message: copies */
    int32_t *arr = pkv_malloc(n ? n : 1);
    if (!arr) return pkv_err(PKV_ERR_NOMEM, "rank %d: out of memory for rank 0's request", pkv_dist_rank());
    memcpy(arr, p, n);
    pkv_request_params rp = pkv_request_default_params();
    rp.prompt = arr;
    rp.n_prompt = d.n_prompt;
    rp.stop_tokens = arr + d.n_prompt;
    rp.n_stop = d.n_stop;
    rp.sampling = d.sampling;
    rp.sampling.logit_bias = d.sampling.n_logit_bias ? (const pkv_logit_bias *)(arr + d.n_prompt + d.n_stop) : NULL;
    rp.max_tokens = d.max_tokens;
    rp.n = d.n;
    rp.priority = d.priority;
    rp.top_logprobs = d.top_logprobs;
    rp.pooling = (pkv_pooling)d.pooling;
    rp.n_keep = d.n_keep;
    rp.ignore_eos = d.ignore_eos;
    rp.embed = d.embed;
    pkv_lora_use none[1];
    rp.lora = d.has_lora ? none : NULL;
    uint64_t id = 0;
    pkv_status s = pkv_engine_submit(e, &rp, &id);
    pkv_free(arr);
    if (s) return pkv_err_prefix(s, "rank %d: rank 0's request %llu", pkv_dist_rank(), (unsigned long long)d.id);
    if (id != d.id)
        return pkv_err(PKV_ERR_INTERNAL, "rank %d: rank 0's request %llu is request %llu here: the ranks diverged",
                       pkv_dist_rank(), (unsigned long long)d.id, (unsigned long long)id);
    return PKV_OK;
}

/* One message of rank 0's: *stop when it says stop. */
static pkv_status follow_one(pkv_engine *e, bool *stop) {
    dist_msg h;
    pkv_status s = pkv_dist_bcast(&h, sizeof h);
    if (s) return pkv_err_prefix(s, "rank %d: waiting for rank 0's next step (rank 0 stopped or died?)", pkv_dist_rank());
    if (h.magic != DIST_MAGIC || (h.kind != MSG_STEP && h.kind != MSG_STOP) || h.n_req < 0 || h.n_cancel < 0)
        return pkv_err(PKV_ERR_FORMAT, "rank %d: rank 0 sent no engine step (magic %08x, kind %u)", pkv_dist_rank(),
                       h.magic, h.kind);
    if (h.kind == MSG_STOP) {
        *stop = true;
        return PKV_OK;
    }
    char *buf = pkv_malloc(h.bytes ? h.bytes : 1);
    if (!buf) return pkv_err(PKV_ERR_NOMEM, "rank %d: out of memory for rank 0's step (%llu bytes)", pkv_dist_rank(),
                             (unsigned long long)h.bytes);
    s = h.bytes ? pkv_dist_bcast(buf, h.bytes) : PKV_OK;
    const char *rd = buf, *end = buf + h.bytes;
    for (int i = 0; i < h.n_req && !s; i++) s = follow_submit(e, &rd, end);
    if (!s && (size_t)(end - rd) != sizeof(uint64_t) * (size_t)h.n_cancel)
        s = pkv_err(PKV_ERR_FORMAT, "rank %d: rank 0's step message has %lld bytes of cancels for %d ids", pkv_dist_rank(),
                    (long long)(end - rd), h.n_cancel);
    for (int i = 0; i < h.n_cancel && !s; i++) {
        uint64_t id;
        memcpy(&id, rd + sizeof id * (size_t)i, sizeof id);
        if (ENG_STOP_SAMPLE(id) >= 0) /* a sample rank 0's callback stopped */
            pkv_engine_end_sample(e, ENG_STOP_ID(id), ENG_STOP_SAMPLE(id));
        else
            pkv_engine_cancel(e, id); /* NOT_FOUND: it finished here as on rank 0 */
    }
    pkv_free(buf);
    if (s) return s;
    /* a failed step failed alike on every rank (its status crossed with it), unless the ranks broke */
    if ((s = pkv_engine_step(e, NULL)) && !pkv_dist_broken()) {
        PKV_WARN("engine: rank %d: step failed: %s", pkv_dist_rank(), pkv_errmsg());
        s = PKV_OK;
    }
    return s;
}

pkv_status pkv_engine_dist_follow(pkv_engine *e) {
    if (!e) return pkv_err(PKV_ERR_INVALID, "engine dist follow: engine is NULL");
    if (pkv_dist_rank() == 0) return pkv_err(PKV_ERR_INVALID, "engine dist follow: rank 0 leads, it does not follow");
    e->dist = ENG_DIST_FOLLOW;
    pkv_status s = PKV_OK;
    for (bool stop = false; !stop && !s;) s = follow_one(e, &stop);
    e->dist = ENG_DIST_NONE;
    return s;
}
