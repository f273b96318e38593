/* The model's own output formats for reasoning and tool calls, parsed into
 * OpenAI's message fields (reasoning_content, content, tool_calls), whole or as
 * a stream of deltas. The formats are those llama.cpp parses (common/chat.cpp);
 * docs/server.md, "Tool calls", lists them. */
#ifndef PKV_TOOL_CALLS_H
#define PKV_TOOL_CALLS_H

#include <stdbool.h>
#include <stddef.h>

typedef enum pkv_tc_format {
    PKV_TC_NONE = 0, /* content only (reasoning still parsed with think) */
    PKV_TC_HERMES,   /* Qwen 2.5/3, Hermes: <tool_call>{"name":..,"arguments":..}</tool_call> */
    PKV_TC_LLAMA3,   /* Llama 3.x: {"name":..,"parameters":..} or <|python_tag|>... */
    PKV_TC_MISTRAL,  /* [TOOL_CALLS][{"name":..,"arguments":..}] or [TOOL_CALLS]name[ARGS]{..} */
    PKV_TC_GPT_OSS,  /* harmony channels: analysis, commentary to=functions.NAME, final */
    PKV_TC_DEEPSEEK, /* <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>...<｜tool▁call▁end｜> */
    PKV_TC_JSON,     /* the whole output is one {"name":..,"arguments":..} object
                        (tool_choice required/named: constrained sampling) */
} pkv_tc_format;

typedef struct pkv_tc_opts {
    pkv_tc_format fmt;
    bool think;    /* <think>...</think> at the start is reasoning_content */
    bool in_think; /* the prompt opened <think>: the output starts inside it */
    bool calls;    /* parse tool calls (false: tool_choice none, or no tools) */
} pkv_tc_opts;

/* The family of a chat template's tool-call format, by its markers; *think: it
 * has <think> reasoning. */
pkv_tc_format pkv_tc_detect(const char *tmpl, size_t len, bool *think);
/* The texts that end a message in format fmt's turns where they are not the
 * vocabulary's end-of-generation tokens (gpt-oss's <|end|> ends a message, not
 * generation): NULL-terminated, empty for the other formats. */
const char *const *pkv_tc_message_ends(pkv_tc_format fmt);
const char *pkv_tc_name(pkv_tc_format f);

typedef struct pkv_tc_call {
    char *name;      /* NUL-terminated */
    char *args;      /* JSON text of the arguments (args_len bytes, NUL-terminated) */
    size_t args_len;
    bool complete;   /* the call's text ended (else cut by a length limit, or streaming) */
} pkv_tc_call;

typedef struct pkv_tc_result {
    char *reasoning;     /* reasoning_len bytes, NUL-terminated (never NULL after a parse) */
    size_t reasoning_len;
    char *content;
    size_t content_len;
    pkv_tc_call *calls;
    int n_calls;
} pkv_tc_result;

/* Split text into reasoning, content and tool calls. partial: more text may
 * follow, so text that may be the start of a marker is held back and the last
 * call may be incomplete; every field of a partial parse is a prefix of the same
 * field of any later parse. Returns false for out of memory (res is freed). */
bool pkv_tc_parse(const pkv_tc_opts *o, const char *text, size_t len, bool partial, pkv_tc_result *res);
void pkv_tc_result_free(pkv_tc_result *res);

/* ------------------------------------------------------------- streaming */

typedef enum { PKV_TC_D_REASONING, PKV_TC_D_CONTENT, PKV_TC_D_CALL, PKV_TC_D_ARGS } pkv_tc_dkind;

typedef struct pkv_tc_delta {
    pkv_tc_dkind kind;
    int index;         /* the call's index (CALL, ARGS) */
    const char *text;  /* REASONING, CONTENT, ARGS: the new bytes; CALL: the name */
    size_t len;
} pkv_tc_delta;

typedef struct pkv_tc_stream pkv_tc_stream;
pkv_tc_stream *pkv_tc_stream_new(const pkv_tc_opts *o);
void pkv_tc_stream_free(pkv_tc_stream *s);
/* Feed the whole text generated so far (final: it is all). *d gets the deltas
 * since the last call (valid until the next call): each call's CALL delta comes
 * before its ARGS deltas. Concatenated, the deltas equal pkv_tc_parse of the
 * final text. false for out of memory. */
bool pkv_tc_stream_update(pkv_tc_stream *s, const char *text, size_t len, bool final, const pkv_tc_delta **d, int *n);
/* Tool calls announced so far. */
int pkv_tc_stream_calls(const pkv_tc_stream *s);

#endif
