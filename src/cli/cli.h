/* Small helpers shared by the subcommands: option parsing and errors. */
#ifndef PKV_CLI_H
#define PKV_CLI_H

#include <stdbool.h>
#include <stdio.h>
#include <stddef.h>
#include <stdint.h>

/* Parse a whole decimal integer in [lo, hi]; prints an error naming opt and
 * returns false otherwise. */
bool pkv_cli_int(const char *opt, const char *s, long long lo, long long hi, long long *out);
bool pkv_cli_float(const char *opt, const char *s, double lo, double hi, double *out);
/* --tokens 1,2,3: comma-separated token ids into *out (malloc'd, *n of them); false
 * when it is not that (said on stderr). cmd-logits.c. */
bool pkv_cli_parse_tokens(const char *s, int32_t **out, size_t *n);
/* The value of option argv[*i] (advancing *i), or NULL with an error printed. */
const char *pkv_cli_value(int argc, char **argv, int *i);
/* An options table (as git's parse-options): each row names an option, its
 * alias (NULL: none), what it takes and where the value goes in the command's
 * options struct (off = offsetof). INT stores an int in [lo, hi] (LLONG a long
 * long, INT64 an int64_t, SIZE a size_t; bounds a double holds exactly, 2^63 and
 * beyond meaning INT64_MAX), FLOAT a float in [lo, hi] (DOUBLE a double), STR the argument string, FLAG true, UNSET false; FN calls fn with the
 * whole struct and the value (NULL when `takes` is false) and fails when fn
 * returns false (fn says why). */
typedef enum {
    PKV_CLI_FLAG,
    PKV_CLI_UNSET,
    PKV_CLI_STR,
    PKV_CLI_INT,
    PKV_CLI_LLONG,
    PKV_CLI_INT64,
    PKV_CLI_SIZE,
    PKV_CLI_FLOAT,
    PKV_CLI_DOUBLE,
    PKV_CLI_FN
} pkv_cli_opt_kind;
typedef struct pkv_cli_opt {
    const char *name, *alias;
    pkv_cli_opt_kind kind;
    size_t off;
    double lo, hi;
    bool (*fn)(void *opts, const char *opt, const char *value);
    bool takes; /* PKV_CLI_FN: the option takes a value */
} pkv_cli_opt;
/* A row of a table that fills a field of the struct type T. */
#define PKV_CLI_OPT(T, name, alias, kind, field, lo, hi) {name, alias, kind, offsetof(T, field), lo, hi, NULL, false}
/* 1: argv[*i] is in the table (consumed with its value); 0: not in it; -1: a
 * missing or bad value (printed). */
int pkv_cli_opt_parse(const pkv_cli_opt *t, size_t n, int argc, char **argv, int *i, void *opts);
/* A command's options: its table, the flag -h/--help sets in it (help_off =
 * offsetof), its usage, and the shared options tried before the table (more:
 * pkv_cli_model_opt and the like, with pkv_cli_opt_parse's returns; NULL: none).
 * An unknown option is said as "pagekv NAME: unknown option 'X'", with
 * " (see 'pagekv NAME --help')" when see_help, the usage after it on stderr
 * when usage_on_unknown. stop_off (0: none) names a flag an option's handler
 * sets to end the parse there, as help does but without the usage. */
typedef struct pkv_cli_cmd {
    const char *name;
    const pkv_cli_opt *opts;
    size_t n_opts, help_off;
    void (*usage)(FILE *f);
    int (*more)(int argc, char **argv, int *i, void *opts);
    bool see_help, usage_on_unknown;
    size_t stop_off;
} pkv_cli_cmd;
/* Parse argv[1..argc) into opts. Returns -1 when every argument was taken, 0
 * when help was asked (the usage printed on stdout, the rest not parsed) or the
 * stop flag set, 2 on a bad value or an unknown option (said). */
int pkv_cli_parse(const pkv_cli_cmd *c, int argc, char **argv, void *opts);

/* Print "pagekv <cmd>: <what>: <status>: <errmsg>" to stderr. Returns 1. */
int pkv_cli_fail(const char *cmd, const char *what, int status);
/* Extra CPU devices for "all" (PKV_CPU_DEVICES, default 1). */
int pkv_cli_extra_cpus(void);

/* The whole text of PATH ("-" = standard input), NUL-terminated, length in *len;
 * NULL with an error printed. Free with free(). */
char *pkv_cli_read_text(const char *cmd, const char *path, size_t *len);

/* Host memory read bandwidth (bench-bandwidth.c): a buffer of at least 4x the
 * last-level cache, several passes; all zero when the buffer cannot be had. */
typedef struct pkv_cli_bw {
    double best_gbps, median_gbps;
    uint64_t llc_bytes, buffer_bytes;
    int passes;
} pkv_cli_bw;
void pkv_cli_measure_bandwidth(int threads, pkv_cli_bw *r);

/* Monotonic seconds. */
double pkv_time_now_cli(void);

/* Options shared by the model commands (run, logits, tokenize, demo, bench,
 * serve): the setup layer's (src/setup/setup.h), which the server uses too. */
#include "pagekv.h"
#include "setup/setup.h"
typedef pkv_setup_model_opts pkv_cli_model_opts;
pkv_cli_model_opts pkv_cli_model_defaults(void);
/* 1: argv[*i] was a shared option (consumed); 0: not one; -1: bad value (printed). */
int pkv_cli_model_opt(int argc, char **argv, int *i, pkv_cli_model_opts *o);
pkv_model *pkv_cli_open_model(const char *cmd, const pkv_cli_model_opts *o);
/* pkv_cli_cmd.more for an options struct whose first member is its
 * pkv_cli_model_opts. */
int pkv_cli_model_more(int argc, char **argv, int *i, void *opts);
/* A KV page type named on the command line: f16, f32, q8_0, q4_0. Prints an
 * error naming opt and returns false otherwise. */
bool pkv_cli_kv_type(const char *opt, const char *v, int *out);
/* KV bytes one token takes in c (every layer and shard, K and V), and the most
 * tokens (whole pages) that fit in mem bytes. */
/* KV bytes per token of context: the layers that keep every token (with
 * sliding-window layers, those add a fixed pkv_cli_kv_window_bytes_per_seq per
 * sequence instead); _all: what every layer would cost keeping every token. */
double pkv_cli_kv_bytes_per_token(const pkv_kv_cache *c);
double pkv_cli_kv_bytes_per_token_all(const pkv_kv_cache *c);
double pkv_cli_kv_window_bytes_per_seq(const pkv_kv_cache *c);
long long pkv_cli_kv_max_tokens(const pkv_kv_cache *c, double mem);
/* "K q8_0 V f16 KV" or "q8_0 KV" for messages (static buffer). */
const char *pkv_cli_kv_desc(const pkv_cli_model_opts *o);
/* The names of the weight types among `types` (bit t for pkv_type t; all weight
 * types when 0) that dev runs at speed `speed` (pkv_device_weight_speed), as
 * "a, b" or, with json, "\"a\", \"b\"" into buf; buf is "" when there are none. */
void pkv_cli_weight_types(const pkv_device *dev, uint64_t types, pkv_weight_speed speed, bool json, char *buf,
                          size_t size);
pkv_kv_cache *pkv_cli_open_cache(const char *cmd, pkv_model *m, const pkv_cli_model_opts *o, int n_seq);
/* The same with an explicit page count (0 = n_seq sequences of the full context). */
pkv_kv_cache *pkv_cli_open_cache_pages(const char *cmd, pkv_model *m, const pkv_cli_model_opts *o, int n_seq,
                                       int64_t n_pages);

/* pagekv run -cnv (src/cli/cmd-run-chat.c, built with the server's chat layer). */
typedef struct {
    const char *model_path;     /* the GGUF whose tokenizer.chat_template renders turns (NULL: ChatML) */
    const char *system;         /* the system message (NULL: none) */
    const pkv_cli_model_opts *kv; /* for the banner */
    pkv_sampler_params sp;
    long long n_predict;        /* tokens per answer at most */
    bool verbose_prompt;        /* each turn's prompt and answer ids on stderr */
    int64_t n_ctx;              /* the conversation's limit in tokens (ctx has one position more) */
} pkv_cli_chat_opts;
/* Read user turns from stdin until EOF or /exit, answering each with a request of
 * engine e on ctx (on e's cache, kept across turns: only the part of a prompt the
 * context does not hold is computed). Returns the exit code. */
int pkv_cli_run_chat(pkv_engine *e, pkv_context *ctx, const pkv_cli_chat_opts *o);

#endif
