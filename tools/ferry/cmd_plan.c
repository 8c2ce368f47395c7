/*
 * cmd_plan.c — `ferry plan`: the dry run as a table. Where each group lives and is computed, and
 * the bytes each device would hold, from the same decisions the real load makes, with no
 * allocation and no I/O; exit 1 when the budgets cannot hold it (ferry_plan_check).
 */
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "runopts.h"

static const char *home_name(ferry_home h)
{
    return h == FERRY_HOME_DISK ? "disk" : h == FERRY_HOME_DEVICE ? "device" : "host";
}

int cmd_plan(int argc, char **argv)
{
    static const char *help = "usage: ferry plan FILE... [options]\n"
                              "\n"
                              "Where each tensor would live under the given placement, with no\n"
                              "allocation and no I/O (the same decisions `ferry run` makes); then\n"
                              "the budget check the load makes: exit 1 naming the device and the\n"
                              "shortfall when the kept copies and the largest staged one do not\n"
                              "fit.\n"
                              "\n"
                              "options:\n"
                              "%s"
                              "  --tensors              one line per tensor, not per group\n"
                              "  --json                 one JSON object on stdout\n";
    runopts r;
    memset(&r, 0, sizeof r);
    int json = 0, per_tensor = 0;
    const cli_opt opts[] = {
        {"json", 0, CLI_OPT_FLAG, &json},
        {"tensors", 0, CLI_OPT_FLAG, &per_tensor},
    };
    int npos = 0;
    int prc = runopts_parse_args("plan", &r, &argc, argv, opts, 2, &npos);
    if (prc == CLI_HELP) {
        printf(help, runopts_help);
        runopts_free(&r);
        return CLI_EXIT_OK;
    }
    if (!prc && npos < 1)
        prc = cli_usage_error("plan", "no model file given");
    ferry *f = NULL;
    if (!prc)
        prc = runopts_open(&r, argv + 1, npos, &f);
    runopts_free(&r);
    if (prc)
        return prc;
    ferry_placement *pl = NULL;
    size_t n = 0;
    ferry_plan_totals tot;
    if (ferry_plan(f, &pl, &n, &tot)) {
        int rc = cli_error("%s", ferry_errmsg(f));
        ferry_destroy(f);
        return rc;
    }
    int ndev = ferry_device_count(f);
    if (json) {
        cli_json j;
        cli_json_init(&j, stdout);
        cli_json_begin_object(&j, 0);
        cli_json_key(&j, "totals");
        cli_json_begin_object(&j, 0);
        cli_json_key(&j, "host_bytes");
        cli_json_u64(&j, tot.host_bytes);
        cli_json_key(&j, "mapped_bytes");
        cli_json_u64(&j, tot.mapped_bytes);
        cli_json_key(&j, "disk_bytes");
        cli_json_u64(&j, tot.disk_bytes);
        cli_json_key(&j, "device_bytes");
        cli_json_begin_array(&j, 1);
        for (int d = 0; d < ndev; d++)
            cli_json_u64(&j, tot.device_bytes[d]);
        cli_json_end_array(&j);
        cli_json_key(&j, "staged_bytes");
        cli_json_begin_array(&j, 1);
        for (int d = 0; d < ndev; d++)
            cli_json_u64(&j, tot.staged_bytes[d]);
        cli_json_end_array(&j);
        cli_json_end_object(&j);
        cli_json_key(&j, "tensors");
        cli_json_begin_array(&j, 0);
        for (size_t i = 0; i < n; i++) {
            cli_json_begin_object(&j, 1);
            cli_json_key(&j, "name");
            cli_json_string(&j, pl[i].name);
            cli_json_key(&j, "group");
            cli_json_string(&j, pl[i].group);
            cli_json_key(&j, "home");
            cli_json_string(&j, home_name(pl[i].home));
            cli_json_key(&j, "compute_device");
            cli_json_i64(&j, pl[i].compute_device);
            cli_json_key(&j, "lazy");
            cli_json_bool(&j, pl[i].lazy);
            cli_json_key(&j, "zero_copy");
            cli_json_bool(&j, pl[i].zero_copy);
            cli_json_key(&j, "home_bytes");
            cli_json_u64(&j, pl[i].home_bytes);
            cli_json_key(&j, "compute_bytes");
            cli_json_u64(&j, pl[i].compute_bytes);
            cli_json_end_object(&j);
        }
        cli_json_end_array(&j);
        cli_json_end_object(&j);
        cli_json_finish(&j);
    } else {
        char b1[32], b2[32], b3[32];
        printf("%-40s %-7s %-7s %-5s %-9s %12s %12s\n", per_tensor ? "tensor" : "group", "home",
               "device", "lazy", "zero-copy", "home bytes", "staged");
        if (per_tensor) {
            for (size_t i = 0; i < n; i++)
                printf("%-40s %-7s %-7d %-5s %-9s %12s %12s\n", pl[i].name,
                       home_name(pl[i].home), pl[i].compute_device, pl[i].lazy ? "yes" : "no",
                       pl[i].zero_copy ? "yes" : "no", cli_size(pl[i].home_bytes, b1),
                       cli_size(pl[i].compute_bytes, b2));
        } else {
            /* one line per (group, home, device, lazy, zero-copy) combination */
            uint8_t *done = calloc(n ? n : 1, 1);
            for (size_t i = 0; done && i < n; i++) {
                if (done[i])
                    continue;
                uint64_t hb = 0, cb = 0, cnt = 0, pieces = 0, units = 0;
                const char *parent = NULL; /* of the last piece counted */
                size_t parent_len = 0;
                for (size_t k = i; k < n; k++) {
                    if (done[k] || strcmp(pl[k].group, pl[i].group) || pl[k].home != pl[i].home ||
                        pl[k].compute_device != pl[i].compute_device ||
                        pl[k].lazy != pl[i].lazy || pl[k].zero_copy != pl[i].zero_copy)
                        continue;
                    done[k] = 1;
                    hb += pl[k].home_bytes;
                    cb += pl[k].compute_bytes;
                    units++;
                    /* a split part or an expert, "NAME[A:B]", is a piece of tensor NAME; the
                     * pieces of one tensor are neighbours in the plan */
                    const char *nm = pl[k].name, *br = strrchr(nm, '[');
                    size_t len = strlen(nm);
                    if (br && len && nm[len - 1] == ']') {
                        size_t plen = (size_t)(br - nm);
                        if (!parent || plen != parent_len || strncmp(nm, parent, plen))
                            cnt++;
                        parent = nm;
                        parent_len = plen;
                        pieces++;
                    } else {
                        cnt++;
                    }
                }
                char label[96];
                if (pieces)
                    snprintf(label, sizeof label, "%s (%llu tensors, %llu units)", pl[i].group,
                             (unsigned long long)cnt, (unsigned long long)units);
                else
                    snprintf(label, sizeof label, "%s (%llu tensors)", pl[i].group,
                             (unsigned long long)cnt);
                printf("%-40s %-7s %-7d %-5s %-9s %12s %12s\n", label, home_name(pl[i].home),
                       pl[i].compute_device, pl[i].lazy ? "yes" : "no",
                       pl[i].zero_copy ? "yes" : "no", cli_size(hb, b1), cli_size(cb, b2));
            }
            free(done);
        }
        printf("\nhost RAM %s, mapped (page cache) %s, read from disk at each use %s\n",
               cli_size(tot.host_bytes, b1), cli_size(tot.mapped_bytes, b2),
               cli_size(tot.disk_bytes, b3));
        printf("staged on the host at once (all prepared): %s\n",
               cli_size(tot.staged_bytes[0], b1));
        for (int d = 1; d < ndev; d++)
            printf("device %d: kept %s, staged at once (all prepared) %s\n", d,
                   cli_size(tot.device_bytes[d], b1), cli_size(tot.staged_bytes[d], b2));
    }
    /* the budget check the load itself makes: a plan that cannot load fails here */
    int rc = CLI_EXIT_OK;
    if (ferry_plan_check(f))
        rc = cli_error("%s", ferry_errmsg(f));
    free(pl);
    ferry_destroy(f);
    return rc;
}
