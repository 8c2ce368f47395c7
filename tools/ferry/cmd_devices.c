/*
 * cmd_devices.c — `ferry devices`: the devices ferry can use on this machine, with their memory.
 * The cpu (device 0 of every manager: host RAM), the simulated accelerator (shown through an
 * example spec, since its size and speed are whatever its spec says), and every CUDA device the
 * runtime opens: cuda:0, cuda:1, ... until one does not open. When cuda:0 does not open, the
 * library's reason is printed as it is (no driver, no runtime library, no device), and that is
 * no failure of this command. Specs given as arguments are tried as well, and one of those that
 * does not open is a failure (exit 1): that is what a script asking "can I use sim:64GiB?" needs.
 *
 * Everything is read through a manager and ferry_get_device_info, the same calls an engine makes.
 */
#include <stdlib.h>
#include <string.h>

#include "commands.h"

#define SIM_EXAMPLE "sim:8GiB@25GB/s"

/* One line of the listing: an opened device (ID >= 0) or a spec that did not open (REASON). */
typedef struct dev_row {
    char spec[128];
    int id;            /* manager device id, -1 when it did not open */
    int example;       /* the sim example, not a device of this machine */
    int requested;     /* given on the command line */
    ferry_device_info info;
    char reason[512];  /* why it did not open */
} dev_row;

typedef struct dev_list {
    dev_row *rows;
    size_t n, cap;
} dev_list;

static dev_row *add_row(dev_list *l, const char *spec)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 8;
        dev_row *r = realloc(l->rows, cap * sizeof *r);
        if (!r)
            return NULL;
        l->rows = r;
        l->cap = cap;
    }
    dev_row *r = &l->rows[l->n++];
    memset(r, 0, sizeof *r);
    snprintf(r->spec, sizeof r->spec, "%s", spec);
    r->id = -1;
    return r;
}

/* Opens SPEC on F into a new row; returns the row (NULL when out of memory). */
static dev_row *probe(ferry *f, dev_list *l, const char *spec)
{
    dev_row *r = add_row(l, spec);
    if (!r)
        return NULL;
    int id = -1, rc = ferry_add_device(f, spec, &id);
    if (rc == 0)
        rc = ferry_get_device_info(f, id, &r->info);
    if (rc == 0) {
        r->id = id;
    } else {
        const char *msg = ferry_errmsg(f);
        snprintf(r->reason, sizeof r->reason, "%s", msg && *msg ? msg : ferry_strerror(rc));
    }
    return r;
}

/* The reason without the "SPEC: " or "SPEC unavailable: " it may start with (the row names the
 * spec and says it is unavailable). */
static const char *bare_reason(const dev_row *r)
{
    size_t n = strlen(r->spec);
    const char *q = r->reason + n;
    if (strncmp(r->reason, r->spec, n) != 0)
        return r->reason;
    if (strncmp(q, " unavailable", 12) == 0)
        q += 12;
    return strncmp(q, ": ", 2) == 0 ? q + 2 : r->reason;
}

static const char *describe_kind(const dev_row *r)
{
    if (r->id < 0)
        return "";
    if (!strcmp(r->info.kind, "cpu"))
        return "host RAM";
    if (!strcmp(r->info.kind, "sim"))
        return r->example ? "simulated accelerator (example spec: any SIZE[@BANDWIDTH])"
                          : "simulated accelerator";
    if (!strcmp(r->info.kind, "cuda"))
        return "CUDA device";
    return r->info.kind;
}

static void print_text(const dev_list *l)
{
    char a[32], b[32], c[32];
    for (size_t i = 0; i < l->n; i++) {
        const dev_row *r = &l->rows[i];
        if (r->id < 0) {
            printf("%-18s unavailable: %s\n", r->spec, bare_reason(r));
            continue;
        }
        printf("%-18s %s\n", r->info.name ? r->info.name : r->spec, describe_kind(r));
        if (r->info.total_bytes)
            printf("%-18s   memory: %s free of %s\n", "", cli_size(r->info.free_bytes, a),
                   cli_size(r->info.total_bytes, b));
        else
            printf("%-18s   memory: not reported\n", "");
        if (r->info.budget && !strcmp(r->info.kind, "cpu"))
            printf("%-18s   budget: %s by default: what the host can give, less a margin "
                   "(ferry holds %s; ferry run --budget host=SIZE sets one)\n",
                   "", cli_size(r->info.budget, c), cli_size(r->info.used_bytes, a));
        else if (r->info.budget)
            printf("%-18s   budget: %s (ferry holds %s)\n", "", cli_size(r->info.budget, c),
                   cli_size(r->info.used_bytes, a));
        else if (!strcmp(r->info.kind, "cpu"))
            printf("%-18s   budget: no limit (ferry run --budget host=SIZE sets one)\n", "");
        else
            printf("%-18s   budget: no limit\n", "");
        if (r->example)
            printf("%-18s   use: --device %s (size and copy bandwidth as you choose)\n", "",
                   r->spec);
        else if (strcmp(r->info.kind, "cpu") != 0)
            printf("%-18s   use: --device %s\n", "", r->spec);
    }
}

static void print_json(const dev_list *l)
{
    cli_json j;
    cli_json_init(&j, stdout);
    cli_json_begin_object(&j, 0);
    cli_json_key(&j, "devices");
    cli_json_begin_array(&j, 0);
    for (size_t i = 0; i < l->n; i++) {
        const dev_row *r = &l->rows[i];
        cli_json_begin_object(&j, 1);
        cli_json_key(&j, "spec");
        cli_json_string(&j, r->spec);
        cli_json_key(&j, "available");
        cli_json_bool(&j, r->id >= 0);
        if (r->id >= 0) {
            cli_json_key(&j, "name");
            cli_json_string(&j, r->info.name ? r->info.name : r->spec);
            cli_json_key(&j, "kind");
            cli_json_string(&j, r->info.kind ? r->info.kind : "");
            cli_json_key(&j, "example");
            cli_json_bool(&j, r->example);
            cli_json_key(&j, "total_bytes");
            cli_json_u64(&j, r->info.total_bytes);
            cli_json_key(&j, "free_bytes");
            cli_json_u64(&j, r->info.free_bytes);
            cli_json_key(&j, "budget");
            cli_json_u64(&j, r->info.budget);
            cli_json_key(&j, "used_bytes");
            cli_json_u64(&j, r->info.used_bytes);
            cli_json_key(&j, "host_accessible");
            cli_json_bool(&j, r->info.host_accessible);
        } else {
            cli_json_key(&j, "reason");
            cli_json_string(&j, bare_reason(r));
        }
        cli_json_end_object(&j);
    }
    cli_json_end_array(&j);
    cli_json_end_object(&j);
    cli_json_finish(&j);
}

int cmd_devices(int argc, char **argv)
{
    static const char *help =
        "usage: ferry devices [--json] [SPEC...]\n"
        "\n"
        "Lists the devices ferry can use here with their memory: the cpu (host RAM, device 0),\n"
        "the simulated accelerator (shown with an example spec; its size and speed are what the\n"
        "spec says), and each CUDA device the runtime opens (cuda:0, cuda:1, ...). When no CUDA\n"
        "device opens, the reason is printed; that is not a failure.\n"
        "SPECs (as --device takes them: sim:64GiB@10GB/s, cuda:1) are tried too; exit status 1\n"
        "when one of them does not open.\n"
        "\n"
        "options:\n"
        "  --json                 one JSON object on stdout: {\"devices\": [...]}, each with\n"
        "                         spec, available, and name, kind, example, total_bytes,\n"
        "                         free_bytes, budget, used_bytes, host_accessible, or reason\n"
        "  -h, --help             this text\n";
    int json = 0, npos = 0;
    cli_opt opts[] = {{"json", 0, CLI_OPT_FLAG, &json}};
    int rc = cli_parse("devices", argc, argv, opts, sizeof opts / sizeof opts[0], &npos);
    if (rc == CLI_HELP) {
        fputs(help, stdout);
        return CLI_EXIT_OK;
    }
    if (rc)
        return rc;
    for (int i = 1; i <= npos; i++)
        if (!argv[i][0] || strlen(argv[i]) >= sizeof((dev_row *)0)->spec)
            return cli_usage_error("devices", "'%s' is not a device spec", argv[i]);

    ferry *f = ferry_create(NULL);
    if (!f)
        return cli_error("out of memory");
    dev_list l = {NULL, 0, 0};
    int ret = CLI_EXIT_OK;

    /* the cpu is device 0 of every manager */
    dev_row *r = add_row(&l, "cpu");
    if (!r)
        goto oom;
    if ((rc = ferry_get_device_info(f, 0, &r->info)) != 0) {
        snprintf(r->reason, sizeof r->reason, "%s", ferry_errmsg(f));
        ret = CLI_EXIT_FAIL;
    } else {
        r->id = 0;
    }

    /* CUDA devices in order until one does not open; only cuda:0's reason is news */
    for (int k = 0; ferry_device_count(f) < FERRY_MAX_DEVICES - 1; k++) {
        char spec[32];
        snprintf(spec, sizeof spec, "cuda:%d", k);
        if (!(r = probe(f, &l, spec)))
            goto oom;
        if (r->id < 0) {
            if (k > 0)
                l.n--;
            break;
        }
    }

    if (!(r = probe(f, &l, SIM_EXAMPLE)))
        goto oom;
    r->example = 1;

    for (int i = 1; i <= npos; i++) {
        if (!(r = probe(f, &l, argv[i])))
            goto oom;
        r->requested = 1;
        if (r->id < 0)
            ret = CLI_EXIT_FAIL;
    }

    if (json)
        print_json(&l);
    else
        print_text(&l);
    for (size_t i = 0; i < l.n; i++)
        if (l.rows[i].requested && l.rows[i].id < 0)
            fprintf(stderr, "ferry: %s\n", l.rows[i].reason);
    free(l.rows);
    ferry_destroy(f);
    return ret;
oom:
    free(l.rows);
    ferry_destroy(f);
    return cli_error("out of memory");
}
