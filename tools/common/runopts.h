/*
 * runopts.h — the options that say where weights live, shared by `run`, `plan` and `bench`:
 * device, home, load mode, lazy, budgets, compute dtype, adapters, per-group placements
 * (--group); and building a manager from them.
 */
#ifndef FERRY_RUNOPTS_H
#define FERRY_RUNOPTS_H

#include "cli.h"

#define RUNOPTS_MAX_ADAPTERS 8
#define RUNOPTS_MAX_GROUPS 16

/* One --group NAME=GLOB:KEY=VALUE,... : tensors matching GLOB (and no earlier --group) get the
 * plain options' policy with the keys given replacing its fields. */
typedef struct runopts_group {
    char *spec;            /* malloc'd copy of the value; NAME and GLOB point into it */
    const char *name, *glob;
    ferry_policy policy;
    int device;            /* device=N: compute device id N; -1: the plain options' */
} runopts_group;

typedef struct runopts {
    const char *device, *home, *load, *lazy, *budget, *compute_dtype, *lora_mode, *split;
    const char *adapters[RUNOPTS_MAX_ADAPTERS];
    int n_adapters;
    const char *group_args[RUNOPTS_MAX_GROUPS]; /* the --group values, in order (into argv) */
    int n_groups;
    /* parsed */
    const char *cmd; /* the command, for messages */
    ferry_policy policy;
    uint64_t host_budget, device_budget;
    int have_device_budget;
    runopts_group groups[RUNOPTS_MAX_GROUPS];
    /* Called by runopts_open once the files are open, after the --group groups and before group
     * "all" is added: groups of the command's own (NULL: none). Returns 0 or CLI_EXIT_FAIL after
     * printing why. */
    int (*own_groups)(ferry *f, const ferry_policy *policy, void *arg);
    void *groups_arg;
} runopts;

/* The options above as cli_opt entries, appended to OPTS at *N (room for 8 needed). The -a option
 * is collected separately by runopts_collect_adapters. */
void runopts_add(runopts *r, cli_opt *opts, size_t *n);
/* Moves every "-a X" / "--adapter X" / "-aX" out of ARGV into R before cli_parse runs. Returns 0
 * or CLI_EXIT_USAGE. */
int runopts_collect_adapters(const char *cmd, runopts *r, int *argc, char **argv);
/* Moves every "--group X" / "--group=X" out of ARGV into R (they repeat, so cli_parse cannot
 * take them). Returns 0 or CLI_EXIT_USAGE. */
int runopts_collect_groups(const char *cmd, runopts *r, int *argc, char **argv);
/* An adapter argument "PATH" or "PATH:MULT" into a fresh *PATH (free it) and *MULT (1 when not
 * given). A name that exists as given is taken whole (file names may hold colons); otherwise
 * what follows the last ':' must be a finite number. 0, or CLI_EXIT_USAGE ("bad multiplier")
 * after saying why. */
int runopts_adapter(const char *cmd, const char *spec, char **path, float *mult);
/* Parses the strings into the policy, budgets and groups; CLI_EXIT_USAGE on a bad value. */
int runopts_parse(const char *cmd, runopts *r);
/* Parses only the --group values (for a command with its own plain placement, as bench): each
 * group's policy starts from BASE. CLI_EXIT_USAGE on a bad value. */
int runopts_parse_groups(const char *cmd, runopts *r, const ferry_policy *base);
/* The whole command line of a command that places weights: collects -a and --group, parses
 * ARGV against the placement options plus EXTRA[0..N_EXTRA), then the values. Positional
 * arguments end up in ARGV[1..1+*NPOS). Returns 0, CLI_HELP, or CLI_EXIT_USAGE after printing
 * why. The entry point for run, plan and any later command that streams a model. */
int runopts_parse_args(const char *cmd, runopts *r, int *argc, char **argv,
                       const cli_opt *extra, size_t n_extra, int *npos);
/* Adds R's groups to F, in order, ahead of any catch-all (first match wins): F must already hold
 * the devices their device= keys name. Returns 0 or CLI_EXIT_FAIL after printing why. */
int runopts_add_groups(runopts *r, ferry *f);
/* A manager with the device, budgets, the groups, policy (group "all" for every other tensor),
 * the files and the adapters. Returns 0 or CLI_EXIT_FAIL after printing why. */
int runopts_open(runopts *r, char **files, int nfiles, ferry **out);
/* cli_check_output for OUT, a file command CMD writes (WHAT names its option), against every
 * model file open in F and every adapter of R: 0, or the exit status after printing why. *REAL
 * as cli_check_output's (the caller frees it). */
int runopts_check_output(const runopts *r, const char *cmd, const char *what, const char *out,
                         ferry *f, char **real);
/* Frees what runopts_parse allocated (the groups' copies); R may be parsed again after. */
void runopts_free(runopts *r);
/* Checks a --device SPEC by adding it to a scratch manager: 0, CLI_EXIT_USAGE when the spec does
 * not parse, CLI_EXIT_FAIL when the device is not there (each after printing why). */
int runopts_check_device(const char *spec);
/* Adds the devices of a --split value (SPEC,SPEC[:WEIGHT]...) to F and fills POLICY's split
 * fields (and compute_device: the first of them). Returns 0, CLI_EXIT_USAGE (a spec or weight
 * that does not parse) or CLI_EXIT_FAIL, after printing why. */
int runopts_split(const char *cmd, const char *split, ferry *f, ferry_policy *policy);
/* The help text of these options; runopts_group_help is the --group part alone. */
extern const char runopts_help[];
extern const char runopts_group_help[];

#endif
