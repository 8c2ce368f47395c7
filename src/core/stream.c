/*
 * stream.c — stream-ordered use: events of the public API over the devices' event operations,
 * prepares that do not wait (ferry_prepare_async) and releases that take effect when the engine's
 * event completes (ferry_release_after), which become fences (fence.c). Event
 * queries, creates, records and destroys never block and may run with the manager's lock held;
 * waits on events never do.
 */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "devices/devices.h"

static ferry_event *ev_new(ferry *f, int dev)
{
    ferry_event *ev = calloc(1, sizeof *ev);
    if (ev) {
        ev->f = f;
        ev->dev = dev;
        ev->refs = 1;
    }
    return ev;
}

int ferry_event_create(ferry *f, int device, ferry_event **out)
{
    if (!f || !out)
        return FERRY_EINVAL;
    *out = NULL;
    pthread_mutex_lock(&f->lock);
    int n_devs = f->n_devs;
    ferry_device *d = device >= 0 && device < n_devs ? f->devs[device].d : NULL;
    pthread_mutex_unlock(&f->lock);
    if (!d)
        return ferry__fail_thread(f, FERRY_ENOENT, "event: no device %d (%d devices)", device,
                                  n_devs);
    ferry_event *ev = ev_new(f, device);
    if (!ev)
        return ferry__fail_thread(f, FERRY_ENOMEM, "event: out of memory");
    if (ferry__device_has_events(d)) {
        int rc = d->ops->event_create(d, &ev->h[device]);
        if (rc) {
            char msg[256];
            free(ev);
            return ferry__fail_thread(f, rc, "%s: cannot create an event: %s",
                                      f->devs[device].p.name,
                                      ferry__device_errmsg(d, msg, sizeof msg));
        }
    }
    *out = ev;
    return 0;
}

int ferry_event_record(ferry_event *ev, void *stream)
{
    if (!ev)
        return FERRY_EINVAL;
    ferry *f = ev->f;
    if (ev->prepare)
        return ferry__fail_thread(f, FERRY_EINVAL, "event: a prepare's event cannot be recorded");
    void *h = ev->h[ev->dev];
    if (!h)
        return 0;
    ferry_device *d = f->devs[ev->dev].d;
    int rc = d->ops->event_record(d, h, stream);
    if (rc) {
        char msg[256];
        ferry__fail_thread(f, rc, "%s: cannot record an event: %s", f->devs[ev->dev].p.name,
                           ferry__device_errmsg(d, msg, sizeof msg));
    }
    return rc;
}

/* Waits until the prepare event's set is ready (or has failed), then records one handle per
 * device it is staged on, behind its copies. Lock held (dropped while waiting). A failure's
 * message is the event's (fail_msg), for every thread that waits on it: it goes into E. */
static int settle(ferry_event *ev, ferry__err *e)
{
    ferry *f = ev->f;
    while (ev->pending && ev->status == 1) /* another thread settles it */
        pthread_cond_wait(&f->cond, &f->lock);
    if (!ev->pending) {
        if (ev->status && ev->fail_msg)
            ferry__fail(e, ev->status, "%s", ev->fail_msg);
        return ev->status;
    }
    ev->status = 1;
    ferry__err *mine = malloc(sizeof *mine);
    ferry__err_clear(mine);
    int rc = ferry__prepare_finish(f, ev->ts, ev->n, ev->u, ev->nu, mine ? mine : e);
    if (rc && mine) {
        ev->fail_msg = ferry__strdup(mine->msg);
        ferry__fail(e, rc, "%s", mine->msg);
    }
    free(mine);
    int devs[FERRY_MAX_DEVICES] = {0};
    if (!rc)
        for (size_t i = 0; i < ev->nu; i++) {
            int d = ev->u[i]->comp.dev;
            if (d >= 0 && d < f->n_devs && !f->devs[d].p.host_accessible &&
                ferry__device_has_events(f->devs[d].d))
                devs[d] = 1;
        }
    pthread_mutex_unlock(&f->lock);
    for (int d = 0; d < FERRY_MAX_DEVICES && !rc; d++) {
        if (!devs[d])
            continue;
        ferry_device *dv = f->devs[d].d;
        void *h = NULL;
        /* a record that cannot be made leaves that device to the host's wait: the loader has
         * waited for its copies already */
        if (dv->ops->event_create(dv, &h) == 0 && dv->ops->event_record(dv, h, NULL) != 0) {
            dv->ops->event_destroy(dv, h);
            h = NULL;
        }
        ev->h[d] = h;
    }
    pthread_mutex_lock(&f->lock);
    ev->status = rc;
    ev->pending = 0;
    pthread_cond_broadcast(&f->cond);
    return rc;
}

int ferry_event_wait(ferry_event *ev, void *stream)
{
    if (!ev)
        return FERRY_EINVAL;
    ferry *f = ev->f;
    int rc = 0;
    if (ev->prepare) {
        ferry__err e[1];
        ferry__err_clear(e);
        pthread_mutex_lock(&f->lock);
        rc = settle(ev, e);
        pthread_mutex_unlock(&f->lock);
        if (rc)
            return ferry__publish(f, rc, e);
    }
    for (int d = 0; d < FERRY_MAX_DEVICES && !rc; d++) {
        if (!ev->h[d])
            continue;
        ferry_device *dv = f->devs[d].d;
        rc = dv->ops->event_wait(dv, ev->h[d], stream);
        if (rc == FERRY_EINVAL && stream)
            rc = dv->ops->event_wait(dv, ev->h[d], NULL); /* a stream of another device */
        if (rc) {
            char msg[256];
            ferry__fail_thread(f, rc, "%s: event wait failed: %s", f->devs[d].p.name,
                               ferry__device_errmsg(dv, msg, sizeof msg));
        }
    }
    return rc;
}

int ferry_event_synchronize(ferry_event *ev)
{
    return ferry_event_wait(ev, NULL);
}

int ferry_event_query(ferry_event *ev)
{
    if (!ev)
        return FERRY_EINVAL;
    ferry *f = ev->f;
    if (ev->prepare) {
        ferry__err e[1];
        ferry__err_clear(e);
        pthread_mutex_lock(&f->lock);
        int rc = 0;
        if (ev->pending && ev->status != 1 && ferry__units_state(f, ev->u, ev->nu) != 0)
            rc = settle(ev, e); /* nothing in flight: settling queues again or reports */
        else if (ev->pending)
            rc = 1; /* loading */
        else
            rc = settle(ev, e); /* settled: its status and message */
        pthread_mutex_unlock(&f->lock);
        if (rc)
            return rc > 0 ? 0 : ferry__publish(f, rc, e);
    }
    for (int d = 0; d < FERRY_MAX_DEVICES; d++) {
        if (!ev->h[d])
            continue;
        ferry_device *dv = f->devs[d].d;
        int q = dv->ops->event_query(dv, ev->h[d]);
        if (q <= 0)
            return q;
    }
    return 1;
}

void ferry_event_destroy(ferry_event *ev)
{
    if (!ev)
        return;
    ferry *f = ev->f;
    pthread_mutex_lock(&f->lock);
    if (ev->prepare && ev->pending)
        (void)settle(ev, NULL);
    ferry__event_unref(ev);
    pthread_mutex_unlock(&f->lock);
}

int ferry_prepare_async(ferry *f, ferry_tensor *const *ts, size_t n, ferry_event **ready)
{
    if (!f || (n && !ts) || !ready)
        return FERRY_EINVAL;
    *ready = NULL;
    /* a file that changed since it was opened fails before anything of it is used */
    ferry__err e[1];
    ferry__err_clear(e);
    if (ferry__check_tensors(ts, n, FERRY__PATH_RATE, e))
        return ferry__publish(f, FERRY_ECHANGED, e);
    pthread_mutex_lock(&f->lock);
    ferry__fences_reap(f);
    ferry_tensor **u = NULL;
    size_t nu = 0;
    int rc = ferry__prepare_begin(f, ts, n, &u, &nu, e);
    if (rc) {
        pthread_mutex_unlock(&f->lock);
        return ferry__publish(f, rc, e);
    }
    ferry_event *ev = ev_new(f, -1);
    if (ev) {
        ev->ts = malloc((n ? n : 1) * sizeof *ev->ts);
        ev->u = malloc((nu ? nu : 1) * sizeof *ev->u);
    }
    if (!ev || !ev->ts || !ev->u) {
        ferry__prepare_undo(f, ts, n, u, nu);
        if (ev)
            free(ev->ts), free(ev->u), free(ev);
        if (u != ts)
            free(u);
        pthread_mutex_unlock(&f->lock);
        return ferry__fail_thread(f, FERRY_ENOMEM, "prepare: out of memory for the event");
    }
    if (n)
        memcpy(ev->ts, ts, n * sizeof *ts);
    if (nu)
        memcpy(ev->u, u, nu * sizeof *u);
    if (u != ts)
        free(u);
    ev->n = n;
    ev->nu = nu;
    ev->prepare = 1;
    ev->pending = 1;
    ferry__prepare_queue(f, ev->u, nu);
    /* ready already (cached, mapped): settled now, which waits for nothing */
    if (ferry__units_state(f, ev->u, nu) == 1)
        (void)settle(ev, NULL);
    pthread_mutex_unlock(&f->lock);
    *ready = ev;
    return 0;
}

int ferry_release_after(ferry *f, ferry_tensor *const *ts, size_t n, ferry_event *done)
{
    if (!done)
        return ferry_release(f, ts, n);
    if (!f || (n && !ts) || done->f != f || done->prepare)
        return f ? ferry__fail_thread(f, FERRY_EINVAL, "release: the event is not an engine "
                                      "event of this manager")
                 : FERRY_EINVAL;
    if (!done->h[done->dev])
        return ferry_release(f, ts, n); /* complete: nothing to wait for */
    ferry__err e[1];
    ferry__err_clear(e);
    pthread_mutex_lock(&f->lock);
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        ferry_tensor *t = ts[i];
        if (!t || t->refs - t->fenced <= 0) {
            rc = ferry__fail(e, FERRY_EINVAL, "release of tensor '%s' that is not prepared",
                             t ? t->info.name : "(null)");
            continue;
        }
        if (ferry__fence_add(f, done, t)) {
            /* no memory to remember it: wait for the event here */
            ferry_device *d = f->devs[done->dev].d;
            done->refs++;
            pthread_mutex_unlock(&f->lock);
            (void)d->ops->event_wait(d, done->h[done->dev], NULL);
            pthread_mutex_lock(&f->lock);
            ferry__event_unref(done);
            if (t->refs - t->fenced > 0)
                ferry__release_tensor(f, t);
        }
    }
    ferry__fences_reap(f);
    pthread_mutex_unlock(&f->lock);
    return ferry__publish(f, rc, e);
}
