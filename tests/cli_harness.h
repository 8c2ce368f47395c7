/*
 * cli_harness.h — running the ferry tool as a user does, for the CLI tests: `run("ARGS...")`
 * executes FERRY_CLI with ARGS through the shell, captures stdout and stderr (out_text,
 * err_text), and returns the exit status; expect_usage checks a usage error. The including test
 * sets `tmp` to its scratch folder first.
 */
#ifndef FERRY_CLI_HARNESS_H
#define FERRY_CLI_HARNESS_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "check.h"

static const char *tmp;
static char *out_text, *err_text; /* stdout and stderr of the last run */
static size_t out_len;

/* The whole of PATH, NUL-terminated (malloc'd), or NULL; *LEN its length. */
static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 4096, n = 0, k;
    char *buf = malloc(cap + 1);
    while (buf && (k = fread(buf + n, 1, cap - n, f)) > 0) {
        n += k;
        if (n == cap) {
            char *nb = realloc(buf, cap * 2 + 1);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (buf)
        buf[n] = 0;
    if (len)
        *len = buf ? n : 0;
    return buf;
}

/* Runs `FERRY_CLI ARGS` (ARGS formatted, passed to the shell) with stdout and stderr captured;
 * returns the exit status (or -1 when it did not exit normally). */
static int run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int run(const char *fmt, ...)
{
    char args[8192], cmd[17000], op[4200], ep[4200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(op, sizeof op, "%s/stdout.txt", tmp);
    snprintf(ep, sizeof ep, "%s/stderr.txt", tmp);
    snprintf(cmd, sizeof cmd, "%s %s >'%s' 2>'%s'", FERRY_CLI, args, op, ep);
    int st = system(cmd);
    free(out_text);
    free(err_text);
    out_text = slurp(op, &out_len);
    err_text = slurp(ep, NULL);
    if (!out_text)
        out_text = calloc(1, 1);
    if (!err_text)
        err_text = calloc(1, 1);
    if (st == -1 || !WIFEXITED(st))
        return -1;
    return WEXITSTATUS(st);
}

/* Lines of the last command's stderr. */
static inline int err_lines(void)
{
    int n = 0;
    for (const char *p = err_text; *p; p++)
        n += *p == '\n';
    return n;
}

/* The last command exited 2 with one message (and the pointer to --help) containing WANT. */
static inline void expect_usage(int rc, const char *want)
{
    CHECK_EQ_INT(rc, 2);
    CHECK(strstr(err_text, want) != NULL);
    CHECK(err_lines() <= 2);
    if (rc != 2 || !strstr(err_text, want) || err_lines() > 2)
        fprintf(stderr, "expected exit 2 and '%s', got %d:\n%s", want, rc, err_text);
}

#endif
