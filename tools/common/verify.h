/*
 * verify.h — the independent check of prepared tensors behind `ferry run --verify`. Uses only
 * the public header ferry.h; part of ferry_tools.
 */
#ifndef FERRY_VERIFY_H
#define FERRY_VERIFY_H

#include <stddef.h>

#include "ferry.h"

/* Independent check of T, prepared on a device the host reads: exact bytes when nothing
 * transforms it; otherwise the file's values converted (and, with MERGE_MODE and adapters on T,
 * merged in double) compared within the rounding of the staged type. Returns 1 when it matches;
 * 0 with the reason in WHY (WHYLEN bytes) when it does not or cannot be read back. */
int verify_prepared(ferry *f, ferry_tensor *t, int merge_mode, char *why, size_t whylen);

#endif
