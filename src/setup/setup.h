/* Model and cache setup shared by the CLI (src/cli/) and the server
 * (src/server/): the options that say which model to load where and how its KV
 * cache is shaped, and the load itself with the messages a user reads. It sits
 * below both, so the server does not include the CLI's header. Not part of the
 * library: it prints to stderr (never to stdout). */
#ifndef PKV_SETUP_H
#define PKV_SETUP_H

#include <stdbool.h>

#include "pagekv.h"

/* Options shared by the model commands (run, logits, tokenize, demo, bench, serve). */
typedef struct pkv_setup_model_opts {
    const char *model;   /* -m; NULL = the built-in model */
    const char *device;  /* -d; NULL = cpu */
    const char *devices; /* --devices: tensor parallelism over a comma list */
    const char *split;   /* --split: proportions */
    const char *rank_split; /* --rank-split: proportions of the layers over MPI ranks */
    bool kv_on_host;     /* --kv-on-host */
    bool no_mmap;        /* --no-mmap: copy the weights instead of using the mapped file */
    int threads;         /* -t; 0 = all cores */
    int n_ctx;           /* -c; 0 = default */
    int page_size;       /* --page-size; 0 = 16 */
    int kv_type;         /* --kv-type / --kv-type-k (pkv_type of K pages) */
    int kv_type_v;       /* --kv-type / --kv-type-v (pkv_type of V pages) */
    /* --lora FILE[:SCALE] (repeatable, scale default 1): adapters loaded with the model and
     * applied to every sequence (pkv_model_lora_apply) */
    char lora[PKV_MAX_LORA][1024];
    float lora_scale[PKV_MAX_LORA];
    int n_lora;
} pkv_setup_model_opts;

/* Load the model o names (the built-in tiny model without o->model) with its
 * device options; a progress line on a terminal for large files. NULL with the
 * reason printed to stderr as "pagekv <cmd>: ...". */
pkv_model *pkv_setup_open_model(const char *cmd, const pkv_setup_model_opts *o);

/* The cache parameters o gives (n_ctx, page size, K and V page types); the pool
 * sizes are left at 0 (the caller's). */
pkv_cache_params pkv_setup_cache_params(const pkv_setup_model_opts *o);

#endif
