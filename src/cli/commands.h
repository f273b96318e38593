/* Entry points of the pagekv subcommands; each returns the process exit code. */
#ifndef PKV_CLI_COMMANDS_H
#define PKV_CLI_COMMANDS_H

int pkv_cli_devices(int argc, char **argv);
int pkv_cli_check(int argc, char **argv);
int pkv_cli_run(int argc, char **argv);
int pkv_cli_logits(int argc, char **argv);
int pkv_cli_tokenize(int argc, char **argv);
int pkv_cli_mkmodel(int argc, char **argv);
int pkv_cli_demo(int argc, char **argv);
int pkv_cli_bench(int argc, char **argv);
int pkv_cli_bench_kv(int argc, char **argv);    /* src/cli/cmd-bench-kv.c */
int pkv_cli_bench_model(int argc, char **argv); /* src/cli/cmd-bench-model.c */
int pkv_cli_bench_spec(int argc, char **argv);  /* src/cli/cmd-bench-spec.c */
int pkv_cli_bench_serve(int argc, char **argv); /* src/cli/cmd-bench-serve.c */
int pkv_cli_bench_server(int argc, char **argv); /* src/cli/cmd-bench-server.c */
int pkv_cli_bench_grammar(int argc, char **argv); /* src/cli/cmd-bench-grammar.c */
int pkv_cli_serve(int argc, char **argv);       /* src/cli/cmd-serve.c over setup/serve.h */
int pkv_cli_bench_kv_accuracy(int argc, char **argv); /* src/cli/cmd-bench-kvq.c */
int pkv_cli_bench_kv_speed(int argc, char **argv);    /* src/cli/cmd-bench-kvq.c */

#endif
