/*
 * catalog.h — internal accessors of the catalog (catalog.c) for the manager: the open files behind
 * the tensors. The public side of the catalog is declared in ferry.h.
 */
#ifndef FERRY_CATALOG_H
#define FERRY_CATALOG_H

#include <stddef.h>
#include <stdint.h>

#include "ferry.h"
#include "io/io.h"
#include "util/util.h"

/* File I of C (0 .. ferry_catalog_file_count - 1), open and mapped, or NULL when out of range.
 * The object does not move and stays open until ferry_catalog_destroy (later adds do not move
 * it). */
const ferry__iofile *ferry__catalog_file(const ferry_catalog *c, size_t i);
/* Index of the file that holds tensor I (as ferry__catalog_file takes it); UINT32_MAX when I is out
 * of range. */
uint32_t ferry__catalog_tensor_file(const ferry_catalog *c, size_t i);

/* A model parsed but not yet in any catalog: its files open, its entries built. */
typedef struct ferry__catalog_pending ferry__catalog_pending;

/* Opens the model at PATH (as ferry_catalog_add takes it: a file, an index and its shards, a split
 * GGUF's parts), reads and checks every header and builds its entries under PREFIX (NULL or "":
 * none), reading no catalog. On success *OUT is the pending model, the caller's to commit and
 * free; on failure *OUT is NULL and E says what and where. Any thread, no lock needed. */
int ferry__catalog_parse(const char *path, const char *prefix, ferry__catalog_pending **out,
                         ferry__err *e);
/* Appends P to C, all or nothing: FERRY_EDUP (naming both files) when a name is already in C or
 * twice in P, FERRY_ENOMEM when C cannot grow; C is then as it was and P unchanged. On success C
 * owns P's files and entries and P is left empty (still to be freed). No I/O. */
int ferry__catalog_commit(ferry_catalog *c, ferry__catalog_pending *p, ferry__err *e);
/* Frees P, closing the files no commit took. NULL is a no-op. */
void ferry__catalog_pending_free(ferry__catalog_pending *p);

/* A test seam: when set, called on the parsing thread before each read of a header's bytes, with
 * the file's path and the range about to be read (a test truncates the file there). Set it only
 * while no model is being parsed; NULL otherwise. */
extern void (*ferry__catalog_read_hook)(const char *path, uint64_t offset, uint64_t len);

#endif
