/* A streamed answer (server-api.c): the request it follows and what of it has
 * been sent. Shared with server-messages.c, which writes the Anthropic Messages
 * API's events over the same stream. */
#ifndef PKV_SERVER_STREAM_H
#define PKV_SERVER_STREAM_H

#include "server/server-tools.h"

struct srv_stream {
    srv *s;
    srv_req *r;
    int fmt;
    bool logprobs, include_usage;
    char id[64];
    srv_conn conn;
    size_t *sent;     /* [n] text bytes sent */
    int *sent_toks;   /* [n] tokens sent */
    bool *fin_sent;   /* [n] */
    bool role_sent, ended;
    char *pend;
    size_t pend_len, pend_pos;
    pkv_tc_stream **tcs; /* [n] chat answers parsed for reasoning and tool calls; NULL: raw text */
    bool short_call_ids; /* calls get srv_short_id ids (Mistral Nemo's format) */
    /* SRV_FMT_MESSAGES: the content block open now (index blk, -1 = none), of kind blk_kind */
    int blk, n_blk, blk_kind;
};

/* SRV_FMT_MESSAGES: the events for whatever progressed since the last call
 * (server-messages.c); r->mu held. */
void srv_messages_events(srv_stream *st);

#endif
