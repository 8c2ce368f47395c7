/*
 * cli.c — helpers every command of the ferry tool shares: option parsing, argument numbers and
 * sizes, error lines in the form "ferry: FILE: what went wrong", a JSON writer whose output is
 * valid JSON whatever bytes it is given, and a progress bar for terminals.
 */
#include "cli.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- options ----------------------------------------------------------------------------- */

int cli_usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "ferry %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nTry 'ferry %s --help'.\n", cmd);
    return CLI_EXIT_USAGE;
}

static const cli_opt *find_long(const cli_opt *opts, size_t n, const char *name, size_t len)
{
    for (size_t i = 0; i < n; i++)
        if (strlen(opts[i].name) == len && memcmp(opts[i].name, name, len) == 0)
            return &opts[i];
    return NULL;
}

static const cli_opt *find_short(const cli_opt *opts, size_t n, char c)
{
    for (size_t i = 0; i < n; i++)
        if (opts[i].short_name && opts[i].short_name == c)
            return &opts[i];
    return NULL;
}

int cli_parse(const char *cmd, int argc, char **argv, const cli_opt *opts, size_t nopts,
              int *npos)
{
    /* --help wins over every other problem on the line. */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0)
            break;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return CLI_HELP;
    }
    int np = 0, only_pos = 0;
    for (int i = 1; i < argc; i++) {
        char *a = argv[i];
        if (only_pos || a[0] != '-' || a[1] == '\0') {
            argv[1 + np++] = a; /* np + 1 <= i: never overwrites an unread argument */
            continue;
        }
        if (strcmp(a, "--") == 0) {
            only_pos = 1;
            continue;
        }
        const cli_opt *o;
        const char *val = NULL;
        char shown[64];
        if (a[1] == '-') {
            const char *name = a + 2, *eq = strchr(name, '=');
            size_t len = eq ? (size_t)(eq - name) : strlen(name);
            o = find_long(opts, nopts, name, len);
            snprintf(shown, sizeof shown, "--%.*s", (int)(len > 40 ? 40 : len), name);
            if (!o)
                return cli_usage_error(cmd, "unknown option '%s'", shown);
            if (eq) {
                if (o->kind == CLI_OPT_FLAG)
                    return cli_usage_error(cmd, "option '%s' takes no value", shown);
                val = eq + 1;
            }
        } else {
            o = find_short(opts, nopts, a[1]);
            snprintf(shown, sizeof shown, "-%c", a[1]);
            if (!o)
                return cli_usage_error(cmd, "unknown option '%s'", shown);
            if (a[2] != '\0') {
                if (o->kind == CLI_OPT_FLAG)
                    return cli_usage_error(cmd, "option '%s' takes no value", shown);
                val = a + 2;
            }
        }
        if (o->kind == CLI_OPT_FLAG) {
            *(int *)o->dest = 1;
            continue;
        }
        if (!val) {
            if (i + 1 >= argc)
                return cli_usage_error(cmd, "option '%s' needs a value", shown);
            val = argv[++i];
        }
        *(const char **)o->dest = val;
    }
    *npos = np;
    return 0;
}

int cli_arg_size(const char *cmd, const char *opt, const char *s, uint64_t *out)
{
    if (ferry_parse_size(s, out) != 0)
        return cli_usage_error(cmd, "--%s: '%s' is not a size (like 4096, 512MiB, 2GB)", opt, s);
    return 0;
}

int cli_arg_u64(const char *cmd, const char *opt, const char *s, uint64_t min, uint64_t max,
                uint64_t *out)
{
    char *end;
    errno = 0;
    if (s[0] < '0' || s[0] > '9')
        return cli_usage_error(cmd, "--%s: '%s' is not a whole number", opt, s);
    unsigned long long v = strtoull(s, &end, 10);
    if (*end != '\0' || errno == ERANGE)
        return cli_usage_error(cmd, "--%s: '%s' is not a whole number", opt, s);
    if (v < min || v > max)
        return cli_usage_error(cmd, "--%s: %s is out of range (%" PRIu64 " to %" PRIu64 ")", opt,
                               s, min, max);
    *out = (uint64_t)v;
    return 0;
}

/* ---- errors -------------------------------------------------------------------------------- */

int cli_fail(const char *path, const char *msg, int code)
{
    if (!msg || !*msg)
        fprintf(stderr, "ferry: %s: %s\n", path, ferry_strerror(code));
    else if (path && *path && !strstr(msg, path))
        fprintf(stderr, "ferry: %s: %s\n", path, msg);
    else
        fprintf(stderr, "ferry: %s\n", msg);
    return CLI_EXIT_FAIL;
}

int cli_error(const char *fmt, ...)
{
    va_list ap;
    fputs("ferry: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return CLI_EXIT_FAIL;
}

/* ---- outputs ------------------------------------------------------------------------------- */

static const char *kind_of(mode_t m)
{
    return S_ISDIR(m)    ? "a folder"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
           : S_ISFIFO(m) ? "a FIFO"
           : S_ISSOCK(m) ? "a socket"
                         : "not a regular file";
}

/* 1 when PATH exists and is the file whose stat is OS. */
static int same_file(const char *path, const struct stat *os)
{
    struct stat si;
    return stat(path, &si) == 0 && si.st_dev == os->st_dev && si.st_ino == os->st_ino;
}

int cli_check_output(const char *cmd, const char *what, const char *out,
                     const char *const *inputs, size_t n, const char *inputs_are,
                     const ferry_catalog *c, const char *catalog_is, char **real)
{
    *real = NULL;
    struct stat ls, os;
    if (lstat(out, &ls) != 0) {
        if (errno != ENOENT)
            return cli_error("%s %s: %s", what, out, strerror(errno));
        return (*real = strdup(out)) ? 0 : cli_error("out of memory");
    }
    if (S_ISLNK(ls.st_mode)) {
        /* written through: the link keeps naming the (new) file */
        if (stat(out, &os) != 0)
            return cli_error("%s %s: a symbolic link to nothing (%s); name the file to write",
                             what, out, strerror(errno));
        *real = realpath(out, NULL);
        if (!*real)
            return cli_error("%s %s: cannot resolve the link: %s", what, out, strerror(errno));
    } else {
        os = ls;
        if (!(*real = strdup(out)))
            return cli_error("out of memory");
    }
    const char *input = NULL, *role = NULL;
    for (size_t i = 0; !input && i < n; i++)
        if (inputs[i] && same_file(inputs[i], &os))
            input = inputs[i], role = inputs_are;
    for (size_t i = 0; !input && c && i < ferry_catalog_file_count(c); i++)
        if (same_file(ferry_catalog_file_path(c, i), &os))
            input = ferry_catalog_file_path(c, i), role = catalog_is;
    if (!input && S_ISREG(os.st_mode))
        return 0;
    free(*real);
    *real = NULL;
    if (input)
        return cli_usage_error(cmd, "%s %s is the same file as the %s %s; write to another file",
                               what, out, role ? role : "input", input);
    return cli_error("%s %s is %s; only a regular file is replaced", what, out,
                     kind_of(os.st_mode));
}

/* ---- output helpers ------------------------------------------------------------------------ */

double cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

char *cli_size(uint64_t n, char buf[32]) { return ferry_format_size(n, buf); }

uint64_t cli_status_bytes(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    uint64_t kb = 0;
    size_t klen = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, klen) && line[klen] == ':') {
            kb = strtoull(line + klen + 1, NULL, 10);
            break;
        }
    if (f)
        fclose(f);
    return kb * 1024;
}

uint64_t cli_peak_rss(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (uint64_t)ru.ru_maxrss * 1024;
}

/* Length of the well-formed UTF-8 sequence at S (N bytes left) of 2 to 4 bytes, or 0 when the
 * bytes there are not one (overlong forms, surrogates and values past U+10FFFF are not). */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t len;
    unsigned lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c >= 0xC2 && c <= 0xDF)
        len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;
    } else
        return 0;
    if (n < len || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t k = 2; k < len; k++)
        if (s[k] < 0x80 || s[k] > 0xBF)
            return 0;
    return len;
}

void cli_print_text(FILE *f, const char *s, size_t n, size_t max)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t shown = n > max ? max : n, i = 0;
    while (i < shown) {
        unsigned c = p[i];
        if (c >= 0x80) {
            size_t len = utf8_seq(p + i, n - i);
            if (len && i + len <= shown) {
                fwrite(p + i, 1, len, f);
                i += len;
            } else if (len) {
                break; /* a character cut by the limit is left out whole */
            } else {
                fprintf(f, "\\x%02x", c);
                i++;
            }
            continue;
        }
        switch (c) {
        case '\n': fputs("\\n", f); break;
        case '\t': fputs("\\t", f); break;
        case '\r': fputs("\\r", f); break;
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        default:
            if (c < 0x20 || c == 0x7f)
                fprintf(f, "\\x%02x", c);
            else
                fputc((int)c, f);
        }
        i++;
    }
    if (n > max)
        fprintf(f, "\xE2\x80\xA6 (%zu bytes)", n);
}

/* ---- JSON writer ------------------------------------------------------------------------- */

void cli_json_escape(FILE *f, const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    fputc('"', f);
    size_t i = 0;
    while (i < n) {
        unsigned c = p[i];
        if (c >= 0x80) {
            size_t len = utf8_seq(p + i, n - i);
            if (len) {
                fwrite(p + i, 1, len, f);
                i += len;
            } else {
                fputs("\\ufffd", f); /* JSON text must be UTF-8: a stray byte becomes U+FFFD */
                i++;
            }
            continue;
        }
        switch (c) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\t': fputs("\\t", f); break;
        case '\r': fputs("\\r", f); break;
        case '\b': fputs("\\b", f); break;
        case '\f': fputs("\\f", f); break;
        default:
            if (c < 0x20 || c == 0x7f)
                fprintf(f, "\\u%04x", c);
            else
                fputc((int)c, f);
        }
        i++;
    }
    fputc('"', f);
}

void cli_json_init(cli_json *j, FILE *f)
{
    memset(j, 0, sizeof *j);
    j->f = f;
}

static void json_newline(cli_json *j)
{
    fputc('\n', j->f);
    for (int d = 0; d < j->depth; d++)
        fputs("  ", j->f);
}

/* Called before every value and key: the separator and line break the position needs. */
static void json_pre(cli_json *j)
{
    if (j->after_key) {
        j->after_key = 0;
        return;
    }
    if (j->depth == 0)
        return;
    int d = j->depth - 1;
    if (d >= CLI_JSON_MAX_DEPTH)
        d = CLI_JSON_MAX_DEPTH - 1; /* past the limit, scopes share the last slot */
    if (j->count[d])
        fputc(',', j->f);
    if (j->compact[d]) {
        if (j->count[d])
            fputc(' ', j->f);
    } else {
        json_newline(j);
    }
    j->count[d] = 1;
}

static void json_open(cli_json *j, char c, int compact)
{
    json_pre(j);
    fputc(c, j->f);
    if (j->depth < CLI_JSON_MAX_DEPTH) {
        j->count[j->depth] = 0;
        /* everything inside a compact scope is compact */
        j->compact[j->depth] = (unsigned char)(compact || (j->depth && j->compact[j->depth - 1]));
    }
    j->depth++;
}

static void json_close(cli_json *j, char c)
{
    if (j->depth == 0)
        return;
    j->depth--;
    if (j->depth < CLI_JSON_MAX_DEPTH && j->count[j->depth] && !j->compact[j->depth])
        json_newline(j);
    fputc(c, j->f);
}

void cli_json_begin_object(cli_json *j, int compact) { json_open(j, '{', compact); }
void cli_json_end_object(cli_json *j) { json_close(j, '}'); }
void cli_json_begin_array(cli_json *j, int compact) { json_open(j, '[', compact); }
void cli_json_end_array(cli_json *j) { json_close(j, ']'); }

void cli_json_key(cli_json *j, const char *key)
{
    json_pre(j);
    cli_json_escape(j->f, key, strlen(key));
    fputs(": ", j->f);
    j->after_key = 1;
}

void cli_json_string(cli_json *j, const char *s) { cli_json_string_n(j, s, strlen(s)); }

void cli_json_string_n(cli_json *j, const char *s, size_t n)
{
    json_pre(j);
    cli_json_escape(j->f, s, n);
}

void cli_json_u64(cli_json *j, uint64_t v)
{
    json_pre(j);
    fprintf(j->f, "%" PRIu64, v);
}

void cli_json_i64(cli_json *j, int64_t v)
{
    json_pre(j);
    fprintf(j->f, "%" PRId64, v);
}

/* The shortest %.*g text of V that reads back as V (as a float when IS_F32). */
static void json_number(cli_json *j, double v, int is_f32)
{
    json_pre(j);
    if (!isfinite(v)) {
        fputs("null", j->f);
        return;
    }
    char buf[40];
    for (int prec = is_f32 ? 6 : 15; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, v);
        double back = strtod(buf, NULL);
        if (is_f32 ? (float)back == (float)v : back == v)
            break;
    }
    fputs(buf, j->f);
}

void cli_json_f64(cli_json *j, double v) { json_number(j, v, 0); }
void cli_json_f32(cli_json *j, double v) { json_number(j, v, 1); }

void cli_json_bool(cli_json *j, int v)
{
    json_pre(j);
    fputs(v ? "true" : "false", j->f);
}

void cli_json_null(cli_json *j)
{
    json_pre(j);
    fputs("null", j->f);
}

void cli_json_value(cli_json *j, const ferry_value *v)
{
    switch (v->type) {
    case FERRY_VALUE_U8:
    case FERRY_VALUE_U16:
    case FERRY_VALUE_U32:
    case FERRY_VALUE_U64: cli_json_u64(j, v->v.u); break;
    case FERRY_VALUE_I8:
    case FERRY_VALUE_I16:
    case FERRY_VALUE_I32:
    case FERRY_VALUE_I64: cli_json_i64(j, v->v.i); break;
    case FERRY_VALUE_F32: cli_json_f32(j, v->v.f); break;
    case FERRY_VALUE_F64: cli_json_f64(j, v->v.f); break;
    case FERRY_VALUE_BOOL: cli_json_bool(j, v->v.u != 0); break;
    case FERRY_VALUE_STRING:
        if (v->v.str.ptr)
            cli_json_string_n(j, v->v.str.ptr, (size_t)v->v.str.len);
        else
            cli_json_string(j, "");
        break;
    case FERRY_VALUE_ARRAY: {
        /* arrays of scalars on one line, arrays of arrays one item per line */
        int nested = v->v.arr.elem == FERRY_VALUE_ARRAY;
        cli_json_begin_array(j, !nested);
        for (uint64_t i = 0; i < v->v.arr.n; i++)
            cli_json_value(j, &v->v.arr.items[i]);
        cli_json_end_array(j);
        break;
    }
    default: cli_json_null(j); break;
    }
}

void cli_json_finish(cli_json *j) { fputc('\n', j->f); }

/* ---- progress ------------------------------------------------------------------------------ */

#define BAR_WIDTH 30

void cli_progress_start(cli_progress *p, const char *label, uint64_t total, int enabled)
{
    memset(p, 0, sizeof *p);
    p->on = enabled && isatty(STDERR_FILENO);
    p->label = label;
    p->total = total;
    p->t0 = cli_now();
}

void cli_progress_update(cli_progress *p, uint64_t done)
{
    if (!p->on)
        return;
    double now = cli_now();
    if (now - p->last_draw < 0.1 && done < p->total)
        return;
    p->last_draw = now;
    double frac = p->total ? (double)done / (double)p->total : 1.0;
    if (frac > 1.0)
        frac = 1.0;
    int fill = (int)(frac * BAR_WIDTH + 0.5);
    char bar[BAR_WIDTH + 1];
    for (int i = 0; i < BAR_WIDTH; i++)
        bar[i] = i < fill ? '#' : '-';
    bar[BAR_WIDTH] = '\0';
    char a[32], b[32];
    double secs = now - p->t0;
    fprintf(stderr, "\r\033[K%s [%s] %3d%%  %s / %s", p->label, bar, (int)(frac * 100.0),
            cli_size(done, a), cli_size(p->total, b));
    if (secs > 0.2)
        fprintf(stderr, "  %.0f MB/s", (double)done / secs / 1e6);
    fflush(stderr);
}

void cli_progress_end(cli_progress *p)
{
    if (!p->on)
        return;
    fputs("\r\033[K", stderr);
    fflush(stderr);
    p->on = 0;
}
