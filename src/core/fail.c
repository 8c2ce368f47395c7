/*
 * fail.c — setting the manager's error message from code that runs without the lock.
 */
#include <stdarg.h>
#include <stdio.h>

#include "core/core.h"

int ferry__fail_lock(ferry *f, int code, const char *fmt, ...)
{
    char msg[FERRY__ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&f->lock);
    ferry__fail(&f->err, code, "%s", msg);
    pthread_mutex_unlock(&f->lock);
    return code;
}
