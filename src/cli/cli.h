/* Small helpers shared by the subcommands: option parsing and errors. */
#ifndef PKV_CLI_H
#define PKV_CLI_H

#include <stdbool.h>
#include <stdint.h>

/* Parse a whole decimal integer in [lo, hi]; prints an error naming opt and
 * returns false otherwise. */
bool pkv_cli_int(const char *opt, const char *s, long long lo, long long hi, long long *out);
bool pkv_cli_float(const char *opt, const char *s, double lo, double hi, double *out);
/* The value of option argv[*i] (advancing *i), or NULL with an error printed. */
const char *pkv_cli_value(int argc, char **argv, int *i);
/* Print "pagekv <cmd>: <what>: <status>: <errmsg>" to stderr. Returns 1. */
int pkv_cli_fail(const char *cmd, const char *what, int status);
/* Extra CPU devices for "all" (PKV_CPU_DEVICES, default 1). */
int pkv_cli_extra_cpus(void);

#endif
