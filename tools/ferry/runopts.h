/*
 * runopts.h — the options that say where weights live, shared by `run`, `plan` and `bench`:
 * device, home, load mode, lazy, budgets, compute dtype, adapters; and building a manager from
 * them.
 */
#ifndef FERRY_RUNOPTS_H
#define FERRY_RUNOPTS_H

#include "cli.h"

#define RUNOPTS_MAX_ADAPTERS 8

typedef struct runopts {
    const char *device, *home, *load, *lazy, *budget, *compute_dtype, *lora_mode, *split;
    const char *adapters[RUNOPTS_MAX_ADAPTERS];
    int n_adapters;
    /* parsed */
    ferry_policy policy;
    uint64_t host_budget, device_budget;
    int have_device_budget;
    /* Called by runopts_open once the files are open, before group "all" is added: groups of the
     * command's own, which take precedence (NULL: none). Returns 0 or CLI_EXIT_FAIL after
     * printing why. */
    int (*groups_first)(ferry *f, const ferry_policy *policy, void *arg);
    void *groups_arg;
} runopts;

/* The options above as cli_opt entries, appended to OPTS at *N (room for 8 needed). The -a option
 * is collected separately by runopts_collect_adapters. */
void runopts_add(runopts *r, cli_opt *opts, size_t *n);
/* Moves every "-a X" / "--adapter X" / "-aX" out of ARGV into R before cli_parse runs. Returns 0
 * or CLI_EXIT_USAGE. */
int runopts_collect_adapters(const char *cmd, runopts *r, int *argc, char **argv);
/* Parses the strings into the policy and budgets; CLI_EXIT_USAGE on a bad value. */
int runopts_parse(const char *cmd, runopts *r);
/* A manager with the device, budgets, policy (group "all" for every tensor), the files and the
 * adapters. Returns 0 or CLI_EXIT_FAIL after printing why. */
int runopts_open(runopts *r, char **files, int nfiles, ferry **out);
/* Adds the devices of a --split value (SPEC,SPEC[:WEIGHT]...) to F and fills POLICY's split
 * fields (and compute_device: the first of them). Returns 0 or CLI_EXIT_FAIL after printing why. */
int runopts_split(const char *split, ferry *f, ferry_policy *policy);
/* The help text of these options. */
extern const char runopts_help[];

#endif
