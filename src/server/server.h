/* pagekv serve: an OpenAI-compatible HTTP server (libmicrohttpd + jansson).
 * Internal header of src/server/ (the CLI sees only setup/serve.h).
 *
 * Threads: libmicrohttpd runs one thread per connection; those threads parse
 * requests, tokenize (the tokenizer is read-only after load) and format
 * responses. Everything that touches the model or the KV cache (prefill,
 * decode, fork, truncate, swap, cache statistics) runs on ONE worker thread
 * (server-gen.c), because a model and its cache are used by one thread at a
 * time. Connection threads hand work to it and wait on a condition variable. */
#ifndef PKV_SERVER_H
#define PKV_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pagekv.h"
#include "chat/chat.h"   /* chat templates (src/chat/) */
#include "setup/serve.h" /* the entry point and options, shared with the CLI */

#endif
