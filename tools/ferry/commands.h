/*
 * commands.h — the commands of the ferry tool: one function per `ferry NAME`, each in its own
 * cmd_NAME.c, which parses the options, calls into ferry.h and the tools library (tools/common/)
 * and prints. main.c dispatches to them.
 */
#ifndef FERRY_COMMANDS_H
#define FERRY_COMMANDS_H

#include "cli.h"

/* One command of the tool: `ferry NAME ARGS...` calls fn(argc, argv) with argv[0] = NAME. */
typedef struct cli_command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary; /* one line for `ferry --help` */
} cli_command;

int cmd_inspect(int argc, char **argv);
int cmd_gen(int argc, char **argv);
int cmd_demo(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_devices(int argc, char **argv);
int cmd_lora(int argc, char **argv);
int cmd_generate(int argc, char **argv);

#endif
