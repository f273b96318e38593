/* Tool calls, reasoning and constrained output of pagekv serve's OpenAI
 * endpoints (server-tools.c): the request fields tools, tool_choice,
 * parallel_tool_calls, response_format and grammar, and the answer's message
 * (content, reasoning_content, tool_calls) in whole and streamed form. */
#ifndef PKV_SERVER_TOOLS_H
#define PKV_SERVER_TOOLS_H

#include "server/server-http.h"
#include "chat/tool-calls.h"

typedef struct srv_outfmt {
    bool parse;     /* the chat answer is parsed with tc (else the text is the content) */
    pkv_tc_opts tc;
} srv_outfmt;

/* Validate the output fields of body (chat: /v1/chat/completions) and set
 * r->grammar and r->special_text; *of says how the answer is read. false with a
 * 400 in o. */
bool srv_output_request(srv *s, json_t *body, bool chat, srv_req *r, srv_outfmt *of, srv_out *o);
/* The rendered prompt opened a <think> block the output continues. */
void srv_output_prompt(srv_outfmt *of, const char *prompt, size_t len);
/* A choice's message: {"role","content","reasoning_content"?,"tool_calls"?};
 * *n_calls gets the calls found. NULL for out of memory. */
json_t *srv_output_message(srv *s, const srv_outfmt *of, const char *text, size_t len, int *n_calls);
/* The delta object of one streamed piece. */
json_t *srv_output_delta(srv *s, const pkv_tc_delta *d, bool short_ids); /* short_ids: srv_short_id call ids */

/* A finished /v1/messages request's answer: Anthropic's message object
 * (server-messages.c). NULL for out of memory. */
json_t *srv_messages_body(srv *s, srv_req *r, const srv_outfmt *of, const char *id);

/* Parse a chat stream's answers with tc (server-api.c); false for out of memory. */
bool srv_stream_parse(srv_stream *st, const pkv_tc_opts *tc);

#endif
