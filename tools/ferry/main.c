/*
 * main.c — the ferry command-line tool's entry: `ferry CMD [ARGS]` dispatches to cmd_CMD through
 * a table, and handles --help, --version and unknown commands itself. Exit status: 0 success,
 * 1 failure, 2 usage error (see cli.h). The SIGBUS guard is on for every command.
 */
#include <stdio.h>
#include <string.h>

#include "commands.h"

static const cli_command commands[] = {
    {"inspect", cmd_inspect, "list a model's format, metadata and tensors (--json for scripts)"},
    {"gen", cmd_gen, "write a synthetic model with realistic names and shapes (llama, unet)"},
    {"run", cmd_run, "stream a model through a decode-shaped workload under budgets"},
    {"generate", cmd_generate, "greedy decoding of a llama model with the reference engine"},
    {"plan", cmd_plan, "where each tensor would live under a placement (dry run)"},
    {"devices", cmd_devices, "the devices ferry can use here, with their memory"},
    {"lora", cmd_lora, "merge LoRA adapters into a model file (merge), describe an adapter (info)"},
    {"bench", cmd_bench, "load and streaming throughput against this machine's own limits"},
    {"demo", cmd_demo, "generate a sample model in the cache folder and inspect it"},
};

#define N_COMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ferry COMMAND [ARGS...]\n"
            "\n"
            "ferry keeps a model's weights where they are cheapest to hold (disk, host RAM,\n"
            "accelerator memory) and moves them just in time.\n"
            "\n"
            "commands:\n");
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(f,
            "\n"
            "  ferry COMMAND --help    options of a command\n"
            "  ferry --version         the version\n"
            "\n"
            "Exit status: 0 success, 1 failure, 2 usage error.\n");
}

static const cli_command *find_command(const char *name)
{
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (strcmp(commands[i].name, name) == 0)
            return &commands[i];
    return NULL;
}

/* Output that could not be written (a full disk behind a redirection, a closed pipe) is a
 * failure, not a silent success. */
static int finish_stdout(int rc)
{
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "ferry: stdout: write error\n");
        return rc ? rc : CLI_EXIT_FAIL;
    }
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return CLI_EXIT_USAGE;
    }
    const char *name = argv[1];
    if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0 || strcmp(name, "help") == 0) {
        if (strcmp(name, "help") == 0 && argc > 2) {
            const cli_command *c = find_command(argv[2]);
            if (!c) {
                fprintf(stderr, "ferry: unknown command '%s'\nTry 'ferry --help'.\n", argv[2]);
                return CLI_EXIT_USAGE;
            }
            char *sub[] = {argv[2], "--help", NULL};
            return finish_stdout(c->fn(2, sub));
        }
        usage(stdout);
        return finish_stdout(CLI_EXIT_OK);
    }
    if (strcmp(name, "--version") == 0 || strcmp(name, "-V") == 0 ||
        strcmp(name, "version") == 0) {
        printf("ferry %s\n", ferry_version());
        return finish_stdout(CLI_EXIT_OK);
    }
    const cli_command *c = find_command(name);
    /* Every command is an engine that owns its process: a model file truncated under a
     * zero-copy tensor reads as zeros and fails the next prepare (or the ferry_check_files a
     * command makes after computing), so the command exits 1 naming the file, never of SIGBUS. */
    ferry_guard_sigbus(1);
    if (!c) {
        if (name[0] == '-')
            fprintf(stderr, "ferry: unknown option '%s'\nTry 'ferry --help'.\n", name);
        else
            fprintf(stderr, "ferry: unknown command '%s'\nTry 'ferry --help'.\n", name);
        return CLI_EXIT_USAGE;
    }
    return finish_stdout(c->fn(argc - 1, argv + 1));
}
