/*
 * cli.h — what the ferry tool's commands, the tests and bench/ share: exit codes, option parsing,
 * numbers and sizes from arguments, error printing, a JSON writer and a progress bar.
 *
 * Like the tool, it includes only the public header ferry.h; nothing here reaches into src/.
 */
#ifndef FERRY_CLI_H
#define FERRY_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ferry.h"

/* Exit statuses of every command. */
enum { CLI_EXIT_OK = 0, CLI_EXIT_FAIL = 1, CLI_EXIT_USAGE = 2 };

/* ---- options ----------------------------------------------------------------------------- */

typedef enum cli_opt_kind {
    CLI_OPT_FLAG,   /* no value: *(int *)dest = 1 */
    CLI_OPT_STRING, /* a value: *(const char **)dest = the argument (points into argv) */
} cli_opt_kind;

typedef struct cli_opt {
    const char *name;  /* long name without the dashes: "json" for --json */
    char short_name;   /* 'o' for -o, 0 for none */
    cli_opt_kind kind;
    void *dest;
} cli_opt;

/* Returned by cli_parse when --help or -h was given. */
#define CLI_HELP (-1)

/* Parses ARGV[1..ARGC) of command CMD against OPTS: "--name VALUE", "--name=VALUE", "-x VALUE",
 * "-xVALUE", flags "--name" / "-x"; "--" ends the options; a later repeat of an option wins.
 * Positional arguments are moved, in order, to ARGV[1..1+*NPOS). Returns 0, CLI_HELP, or
 * CLI_EXIT_USAGE after printing what was wrong on stderr. */
int cli_parse(const char *cmd, int argc, char **argv, const cli_opt *opts, size_t nopts,
              int *npos);

/* Prints "ferry CMD: MESSAGE" and a pointer to --help on stderr; returns CLI_EXIT_USAGE. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Parse an option's value; on a bad value print a usage error naming --OPT and return
 * CLI_EXIT_USAGE, else 0. cli_arg_u64 accepts decimal integers in [min, max]. */
int cli_arg_size(const char *cmd, const char *opt, const char *s, uint64_t *out);
int cli_arg_u64(const char *cmd, const char *opt, const char *s, uint64_t min, uint64_t max,
                uint64_t *out);

/* ---- errors -------------------------------------------------------------------------------- */

/* Prints a failure of a library call on PATH: the library's message MSG as it is when it already
 * names PATH ("ferry: MSG"), "ferry: PATH: MSG" when it does not, "ferry: PATH: <strerror(CODE)>"
 * when MSG is empty. Returns CLI_EXIT_FAIL. */
int cli_fail(const char *path, const char *msg, int code);
/* Prints "ferry: MESSAGE" on stderr; returns CLI_EXIT_FAIL. */
int cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Checks OUT, a file command CMD is about to write (a temporary file beside it, then a rename
 * onto it). When it is the same file (device and inode, so any spelling or hard link) as one of
 * the N paths of INPUTS (each one INPUTS_ARE, e.g. "adapter") or one of the files of catalog C
 * (when not NULL; CATALOG_IS, e.g. "base model"): CLI_EXIT_USAGE. When it exists and is not a
 * regular file (a folder, device node, FIFO or socket, which a rename would replace):
 * CLI_EXIT_FAIL. A symbolic link is followed: the file written is its target, whose path *REAL
 * then holds; otherwise *REAL is a copy of OUT (malloc'd either way; the caller frees it). 0, or
 * the exit status after printing why (WHAT names OUT's option, e.g. "-o"). */
int cli_check_output(const char *cmd, const char *what, const char *out,
                     const char *const *inputs, size_t n, const char *inputs_are,
                     const ferry_catalog *c, const char *catalog_is, char **real);

/* ---- output helpers ------------------------------------------------------------------------ */

/* Monotonic clock, seconds. */
double cli_now(void);
/* "1.50 GiB" into BUF (the library's formatting); returns BUF. */
char *cli_size(uint64_t n, char buf[32]);
/* A field of /proc/self/status ("RssAnon", "RssFile") in bytes, 0 when unknown. */
uint64_t cli_status_bytes(const char *key);
/* The process's peak resident memory, bytes (getrusage). */
uint64_t cli_peak_rss(void);
/* Writes S (N bytes, may hold NULs and invalid UTF-8) as printable text for a table: control
 * characters as \n, \t, \xNN; invalid UTF-8 bytes as \xNN. At most MAX bytes of S are shown,
 * then "… (N bytes)". */
void cli_print_text(FILE *f, const char *s, size_t n, size_t max);

/* ---- JSON writer ------------------------------------------------------------------------- */

#define CLI_JSON_MAX_DEPTH 128 /* deeper than any metadata ferry reads (GGUF nests 8) */

/* Writes one JSON document to F with two-space indentation; an object or array opened compact
 * stays on one line with everything inside it. Every string is escaped (quotes, backslash,
 * control characters, and invalid UTF-8 replaced by U+FFFD), so the output is always valid
 * JSON; non-finite numbers are written as null. */
typedef struct cli_json {
    FILE *f;
    int depth;
    int after_key;                              /* a key was written; its value comes next */
    unsigned char count[CLI_JSON_MAX_DEPTH];    /* nonzero once the scope has an item */
    unsigned char compact[CLI_JSON_MAX_DEPTH];  /* the scope is written on one line */
} cli_json;

void cli_json_init(cli_json *j, FILE *f);
void cli_json_begin_object(cli_json *j, int compact);
void cli_json_end_object(cli_json *j);
void cli_json_begin_array(cli_json *j, int compact);
void cli_json_end_array(cli_json *j);
void cli_json_key(cli_json *j, const char *key);
void cli_json_string(cli_json *j, const char *s);
void cli_json_string_n(cli_json *j, const char *s, size_t n);
void cli_json_u64(cli_json *j, uint64_t v);
void cli_json_i64(cli_json *j, int64_t v);
void cli_json_f64(cli_json *j, double v);
void cli_json_f32(cli_json *j, double v); /* shortest text that round-trips a float */
void cli_json_bool(cli_json *j, int v);
void cli_json_null(cli_json *j);
/* A metadata value, arrays recursively. */
void cli_json_value(cli_json *j, const ferry_value *v);
/* Ends the document with a newline. */
void cli_json_finish(cli_json *j);
/* S (N bytes) as a JSON string literal, quotes included. */
void cli_json_escape(FILE *f, const char *s, size_t n);

/* ---- progress ------------------------------------------------------------------------------ */

/* A one-line progress bar on stderr, redrawn at most ten times a second; drawn only when ENABLED
 * was nonzero at start and stderr is a terminal. */
typedef struct cli_progress {
    int on;
    const char *label;
    uint64_t total;
    double t0, last_draw;
} cli_progress;

void cli_progress_start(cli_progress *p, const char *label, uint64_t total, int enabled);
void cli_progress_update(cli_progress *p, uint64_t done);
/* Erases the bar. */
void cli_progress_end(cli_progress *p);

#endif
