/*
 * copy.c — the states of a tensor's copies: EMPTY -> LOADING (a job or a group read fills it)
 * -> READY, or EMPTY again with the failure; READY at once for a copy that is the file mapping.
 * Every state change goes through these functions (dropping a copy is memory.c's
 * ferry__drop_copy), and each keeps the device's evictable set in step. Lock held by all.
 */
#include <string.h>

#include "core/core.h"

void ferry__copy_map(ferry *f, ferry_tensor *t, ferry__copy *c, void *ptr)
{
    c->state = FERRY__READY;
    c->ptr = ptr;
    c->mapped = 1;
    c->permanent = 1;
    ferry__evictable_note(f, t);
}

void ferry__copy_loading(ferry *f, ferry_tensor *t, ferry__copy *c, ferry__mem m)
{
    c->mem = m;
    c->state = FERRY__LOADING;
    c->status = 0;
    ferry__evictable_note(f, t);
}

void ferry__copy_ready(ferry *f, ferry_tensor *t, ferry__copy *c)
{
    c->state = FERRY__READY;
    ferry__evictable_note(f, t);
}

void ferry__copy_failed(ferry *f, ferry_tensor *t, ferry__copy *c, int rc)
{
    int dev = c->dev;
    ferry__unreserve(f, dev, &c->mem);
    memset(c, 0, sizeof *c);
    c->dev = dev;
    c->status = rc;
    ferry__evictable_note(f, t);
}

void ferry__copy_move(ferry *f, ferry_tensor *t, ferry__copy *dst, ferry__copy *src)
{
    *dst = *src;
    memset(src, 0, sizeof *src);
    ferry__evictable_note(f, t);
}
