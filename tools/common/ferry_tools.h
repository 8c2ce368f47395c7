/*
 * ferry_tools.h — the internal header of ferry_tools, the static library of what the ferry tool,
 * the tests and bench/ share: option parsing, errors, JSON output and progress (cli.h), the
 * placement options (runopts.h), layer sets (layers.h), synthetic models and adapters (synth.h,
 * gen_lora.h) and the machine-limit probes (limits.h). Like the tool it sees only ferry.h; it
 * is not installed.
 */
#ifndef FERRY_TOOLS_H
#define FERRY_TOOLS_H

#include "cli.h"
#include "gen_lora.h"
#include "layers.h"
#include "limits.h"
#include "runopts.h"
#include "synth.h"

#endif
