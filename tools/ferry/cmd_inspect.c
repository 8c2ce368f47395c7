/*
 * cmd_inspect.c — `ferry inspect FILE... [--json]`: opens every FILE into one catalog (as an engine
 * would load them together) and lists format, files, tensor count and bytes, metadata, and every
 * tensor (name, dtype, shape in the file's own order, size, absolute offset, file). The table view
 * abbreviates long arrays and strings; --json prints one complete, always valid JSON object.
 */
#include <stdlib.h>
#include <string.h>

#include "commands.h"

static const char *HELP =
    "usage: ferry inspect FILE... [--json]\n"
    "\n"
    "Lists what model files hold: format, tensor count, total bytes, metadata and every tensor\n"
    "(name, dtype, shape in the file's own order, size, absolute offset). A FILE may be a GGUF\n"
    "file, a safetensors file, a sharded safetensors index (*.index.json) or the first part of a\n"
    "split GGUF. All FILEs are opened together, as one model.\n"
    "\n"
    "options:\n"
    "  --json         one JSON object: format, files, n_tensors, total_bytes, metadata,\n"
    "                 tensors [{name, dtype, shape, offset, nbytes, file}]\n"
    "  --no-tensors   table view: leave out the tensor list\n"
    "  -h, --help     this text\n";

/* Table view: arrays show this many items, strings this many bytes. */
#define SHOW_ITEMS 6
#define SHOW_BYTES 120

static const char *catalog_format(const ferry_catalog *c)
{
    size_t nf = ferry_catalog_file_count(c);
    if (nf == 0)
        return "unknown";
    ferry_format f = ferry_catalog_file_format(c, 0);
    for (size_t i = 1; i < nf; i++)
        if (ferry_catalog_file_format(c, i) != f)
            return "mixed";
    return ferry_format_name(f);
}

static void print_value(FILE *out, const ferry_value *v, int top)
{
    switch (v->type) {
    case FERRY_VALUE_U8:
    case FERRY_VALUE_U16:
    case FERRY_VALUE_U32:
    case FERRY_VALUE_U64: fprintf(out, "%llu", (unsigned long long)v->v.u); break;
    case FERRY_VALUE_I8:
    case FERRY_VALUE_I16:
    case FERRY_VALUE_I32:
    case FERRY_VALUE_I64: fprintf(out, "%lld", (long long)v->v.i); break;
    case FERRY_VALUE_F32:
    case FERRY_VALUE_F64: fprintf(out, "%g", v->v.f); break;
    case FERRY_VALUE_BOOL: fputs(v->v.u ? "true" : "false", out); break;
    case FERRY_VALUE_STRING:
        fputc('"', out);
        cli_print_text(out, v->v.str.ptr ? v->v.str.ptr : "", (size_t)v->v.str.len,
                       top ? SHOW_BYTES : SHOW_BYTES / 4);
        fputc('"', out);
        break;
    case FERRY_VALUE_ARRAY: {
        uint64_t n = v->v.arr.n, shown = n > SHOW_ITEMS ? SHOW_ITEMS - 2 : n;
        fputc('[', out);
        for (uint64_t i = 0; i < shown; i++) {
            if (i)
                fputs(", ", out);
            print_value(out, &v->v.arr.items[i], 0);
        }
        if (shown < n)
            fprintf(out, ", \xE2\x80\xA6 (%llu items)", (unsigned long long)n);
        fputc(']', out);
        break;
    }
    default: fputs("?", out); break;
    }
}

static void shape_text(const ferry_tensor_info *t, char *buf, size_t len)
{
    size_t k = 0;
    k += (size_t)snprintf(buf + k, len - k, "[");
    for (uint32_t d = 0; d < t->ndim && k < len; d++)
        k += (size_t)snprintf(buf + k, len - k, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    if (k < len)
        snprintf(buf + k, len - k, "]");
}

static int print_json(const ferry_catalog *c)
{
    cli_json j;
    cli_json_init(&j, stdout);
    cli_json_begin_object(&j, 0);
    cli_json_key(&j, "format");
    cli_json_string(&j, catalog_format(c));
    cli_json_key(&j, "files");
    cli_json_begin_array(&j, 0);
    for (size_t i = 0; i < ferry_catalog_file_count(c); i++)
        cli_json_string(&j, ferry_catalog_file_path(c, i));
    cli_json_end_array(&j);
    cli_json_key(&j, "n_tensors");
    cli_json_u64(&j, ferry_catalog_count(c));
    cli_json_key(&j, "total_bytes");
    cli_json_u64(&j, ferry_catalog_total_bytes(c));
    cli_json_key(&j, "metadata");
    cli_json_begin_object(&j, 0);
    for (size_t i = 0; i < ferry_catalog_meta_count(c); i++) {
        const char *key = ferry_catalog_meta_key(c, i);
        const ferry_value *v = ferry_catalog_meta_value(c, i);
        if (!key || !v)
            continue;
        cli_json_key(&j, key);
        cli_json_value(&j, v);
    }
    cli_json_end_object(&j);
    cli_json_key(&j, "tensors");
    cli_json_begin_array(&j, 0);
    for (size_t i = 0; i < ferry_catalog_count(c); i++) {
        ferry_tensor_info t;
        if (ferry_catalog_tensor(c, i, &t) != 0)
            continue;
        cli_json_begin_object(&j, 1);
        cli_json_key(&j, "name");
        cli_json_string(&j, t.name);
        cli_json_key(&j, "dtype");
        cli_json_string(&j, ferry_dtype_name(t.dtype));
        cli_json_key(&j, "shape");
        cli_json_begin_array(&j, 1);
        for (uint32_t d = 0; d < t.ndim; d++)
            cli_json_i64(&j, t.shape[d]);
        cli_json_end_array(&j);
        cli_json_key(&j, "offset");
        cli_json_u64(&j, t.offset);
        cli_json_key(&j, "nbytes");
        cli_json_u64(&j, t.nbytes);
        cli_json_key(&j, "file");
        cli_json_string(&j, t.file ? t.file : "");
        cli_json_end_object(&j);
    }
    cli_json_end_array(&j);
    cli_json_end_object(&j);
    cli_json_finish(&j);
    return CLI_EXIT_OK;
}

static int print_table(const ferry_catalog *c, int no_tensors)
{
    char a[32];
    size_t nf = ferry_catalog_file_count(c), nt = ferry_catalog_count(c);
    uint64_t total = ferry_catalog_total_bytes(c);
    const char *fmt = catalog_format(c);

    printf("format    %s%s\n", fmt,
           strcmp(fmt, "gguf") == 0 ? "  (shapes innermost dimension first)" : "");
    printf("files     %zu\n", nf);
    for (size_t i = 0; i < nf; i++) {
        printf("          ");
        const char *p = ferry_catalog_file_path(c, i);
        cli_print_text(stdout, p, strlen(p), 4096);
        if (nf > 1)
            printf("  (%s)", ferry_format_name(ferry_catalog_file_format(c, i)));
        putchar('\n');
    }
    printf("tensors   %zu\n", nt);
    printf("total     %s (%llu bytes)\n", cli_size(total, a), (unsigned long long)total);

    size_t nm = ferry_catalog_meta_count(c), kw = 0;
    for (size_t i = 0; i < nm; i++) {
        const char *k = ferry_catalog_meta_key(c, i);
        size_t l = k ? strlen(k) : 0;
        if (l > kw && l <= 48)
            kw = l;
    }
    printf("\nmetadata (%zu)\n", nm);
    for (size_t i = 0; i < nm; i++) {
        const char *k = ferry_catalog_meta_key(c, i);
        const ferry_value *v = ferry_catalog_meta_value(c, i);
        if (!k || !v)
            continue;
        printf("  ");
        cli_print_text(stdout, k, strlen(k), 200);
        for (size_t l = strlen(k); l < kw; l++)
            putchar(' ');
        printf("  ");
        print_value(stdout, v, 1);
        putchar('\n');
    }
    if (no_tensors)
        return CLI_EXIT_OK;

    /* column widths from the data */
    size_t wn = 4, wd = 5, ws = 5, wz = 4;
    for (size_t i = 0; i < nt; i++) {
        ferry_tensor_info t;
        char shape[256];
        if (ferry_catalog_tensor(c, i, &t) != 0)
            continue;
        shape_text(&t, shape, sizeof shape);
        size_t l = strlen(t.name);
        wn = l > wn ? (l > 64 ? 64 : l) : wn;
        l = strlen(ferry_dtype_name(t.dtype));
        wd = l > wd ? l : wd;
        l = strlen(shape);
        ws = l > ws ? l : ws;
        l = strlen(cli_size(t.nbytes, a));
        wz = l > wz ? l : wz;
    }
    printf("\ntensors (%zu)\n", nt);
    printf("  %-*s  %-*s  %-*s  %*s  %12s%s\n", (int)wn, "name", (int)wd, "dtype", (int)ws,
           "shape", (int)wz, "size", "offset", nf > 1 ? "  file" : "");
    for (size_t i = 0; i < nt; i++) {
        ferry_tensor_info t;
        char shape[256];
        if (ferry_catalog_tensor(c, i, &t) != 0)
            continue;
        shape_text(&t, shape, sizeof shape);
        printf("  ");
        cli_print_text(stdout, t.name, strlen(t.name), 200);
        for (size_t l = strlen(t.name); l < wn; l++)
            putchar(' ');
        printf("  %-*s  %-*s  %*s  %12llu", (int)wd, ferry_dtype_name(t.dtype), (int)ws, shape,
               (int)wz, cli_size(t.nbytes, a), (unsigned long long)t.offset);
        if (nf > 1 && t.file) {
            const char *base = strrchr(t.file, '/');
            printf("  %s", base ? base + 1 : t.file);
        }
        putchar('\n');
    }
    return CLI_EXIT_OK;
}

int cmd_inspect(int argc, char **argv)
{
    int json = 0, no_tensors = 0, npos = 0;
    cli_opt opts[] = {
        {"json", 0, CLI_OPT_FLAG, &json},
        {"no-tensors", 0, CLI_OPT_FLAG, &no_tensors},
    };
    int rc = cli_parse("inspect", argc, argv, opts, sizeof opts / sizeof opts[0], &npos);
    if (rc == CLI_HELP) {
        fputs(HELP, stdout);
        return CLI_EXIT_OK;
    }
    if (rc)
        return rc;
    if (npos == 0)
        return cli_usage_error("inspect", "no model file given");

    ferry_catalog *c = ferry_catalog_create();
    if (!c)
        return cli_error("out of memory");
    for (int i = 0; i < npos; i++) {
        const char *path = argv[1 + i];
        int e = ferry_catalog_add(c, path, NULL);
        if (e != 0) {
            rc = cli_fail(path, ferry_catalog_errmsg(c), e);
            ferry_catalog_destroy(c);
            return rc;
        }
    }
    rc = json ? print_json(c) : print_table(c, no_tensors);
    ferry_catalog_destroy(c);
    return rc;
}
