/*
 * fence.c — releases that wait on an engine event (ferry_release_after, stream.c).
 *
 * A release after an event becomes a fence: the tensor keeps that reference (so nothing evicts,
 * frees or reuses its memory) until a query finds the event complete. Fences are reaped at every
 * prepare and release; a load that finds no room waits for the oldest one (prepare.c). Lock held
 * by all; waits on events drop it.
 */
#include <stdlib.h>

#include "core/core.h"
#include "devices/devices.h"

/* Drops one reference; the last frees the device handles. Lock held. */
void ferry__event_unref(ferry_event *ev)
{
    if (--ev->refs > 0)
        return;
    ferry *f = ev->f;
    for (int d = 0; d < f->n_devs; d++)
        if (ev->h[d])
            f->devs[d].d->ops->event_destroy(f->devs[d].d, ev->h[d]);
    free(ev->ts);
    free(ev->u);
    free(ev->fail_msg);
    free(ev);
}

/* Ends fence *PP (its event done): the reference goes. Lock held. */
static void fence_end(ferry *f, ferry__fence **pp, ferry__fence *prev)
{
    ferry__fence *fc = *pp;
    *pp = fc->next;
    if (f->fences.tail == fc)
        f->fences.tail = prev;
    fc->t->fenced--;
    ferry__release_tensor(f, fc->t);
    ferry__event_unref(fc->ev);
    free(fc);
}

void ferry__fences_reap(ferry *f)
{
    ferry__fence **pp = &f->fences.head, *prev = NULL;
    int ended = 0;
    while (*pp) {
        ferry_event *ev = (*pp)->ev;
        ferry_device *d = f->devs[ev->dev].d;
        /* an error means the engine's work is over all the same */
        if (d->ops->event_query(d, ev->h[ev->dev]) != 0) {
            fence_end(f, pp, prev);
            ended = 1;
        } else {
            prev = *pp;
            pp = &(*pp)->next;
        }
    }
    if (ended)
        pthread_cond_broadcast(&f->cond);
}

void ferry__fences_wait_oldest(ferry *f)
{
    ferry__fence *first = f->fences.head;
    if (!first)
        return;
    ferry_event *ev = first->ev;
    ferry_device *d = f->devs[ev->dev].d;
    ev->refs++;
    pthread_mutex_unlock(&f->lock);
    (void)d->ops->event_wait(d, ev->h[ev->dev], NULL);
    pthread_mutex_lock(&f->lock);
    /* every fence on EV had its record covered by this wait (a later record only delays them) */
    ferry__fence **pp = &f->fences.head, *prev = NULL;
    while (*pp) {
        if ((*pp)->ev == ev) {
            fence_end(f, pp, prev);
        } else {
            prev = *pp;
            pp = &(*pp)->next;
        }
    }
    ferry__event_unref(ev);
    ferry__fences_reap(f);
}

void ferry__fences_wait_all(ferry *f)
{
    while (f->fences.head)
        ferry__fences_wait_oldest(f);
}

int ferry__fence_add(ferry *f, ferry_event *ev, ferry_tensor *t)
{
    ferry__fence *fc = malloc(sizeof *fc);
    if (!fc)
        return FERRY_ENOMEM;
    *fc = (ferry__fence){.ev = ev, .t = t};
    ev->refs++;
    t->fenced++;
    if (f->fences.tail)
        f->fences.tail->next = fc;
    else
        f->fences.head = fc;
    f->fences.tail = fc;
    return 0;
}
