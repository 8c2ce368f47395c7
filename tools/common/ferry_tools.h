/*
 * ferry_tools.h — the internal header of ferry_tools (tools/common/), the static library of what
 * the ferry tool, the tests and bench/ share: option parsing, errors, JSON output and progress
 * (cli.h), the placement options (runopts.h), layer sets (layers.h), synthetic models and
 * adapters (synth.h, gen_lora.h), the machine-limit probes (limits.h), the measuring protocol of
 * `ferry bench` (benchlab.h), the measurements of `ferry demo` (demolab.h), the expert-policy
 * replay of `ferry bench --moe` (moelab.h), the workload of
 * `ferry run` and its --verify check (workload.h, verify.h), and the merged-model writer and
 * adapter scan of `ferry lora` (lora_merge.h, lora_scan.h). Like the tool it sees only ferry.h;
 * it is not installed. The commands themselves are tools/ferry/.
 */
#ifndef FERRY_TOOLS_H
#define FERRY_TOOLS_H

#include "benchlab.h"
#include "cli.h"
#include "demolab.h"
#include "gen_lora.h"
#include "layers.h"
#include "limits.h"
#include "lora_merge.h"
#include "lora_scan.h"
#include "moelab.h"
#include "runopts.h"
#include "synth.h"
#include "verify.h"
#include "workload.h"

#endif
