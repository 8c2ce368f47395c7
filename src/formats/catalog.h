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

/* File I of C (0 .. ferry_catalog_file_count - 1), open and mapped, or NULL when out of range.
 * The object does not move and stays open until ferry_catalog_destroy (later adds do not move
 * it). */
const ferry__iofile *ferry__catalog_file(const ferry_catalog *c, size_t i);
/* Index of the file that holds tensor I (as ferry__catalog_file takes it); UINT32_MAX when I is out
 * of range. */
uint32_t ferry__catalog_tensor_file(const ferry_catalog *c, size_t i);

/* A test seam: when set, called on the adding thread before each read of a header's bytes, with
 * the file's path and the range about to be read (a test truncates the file there). Set it only
 * while no catalog is being added to; NULL otherwise. */
extern void (*ferry__catalog_read_hook)(const char *path, uint64_t offset, uint64_t len);

#endif
