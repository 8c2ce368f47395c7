/*
 * changes.c — noticing a model file that changed under ferry: the check of the files a call
 * touches (one fstat per file per call, never per tensor, and a lookup of its path at most every
 * 100 ms), ferry_check_files (every file, its path looked up each time), and
 * ferry_tensor_read_file (the file's bytes through ferry's own descriptor).
 *
 * The checks run without the manager's lock: a tensor's file is fixed when it is opened and stays
 * open until ferry_destroy, and ferry__iofile_check writes only the file's atomic fields.
 */
#include <stdlib.h>

#include "core/core.h"

#define SEEN_MAX 16 /* distinct files remembered per call; more are checked again, not skipped */

int ferry__check_tensors(ferry_tensor *const *ts, size_t n, int path_too, ferry__err *e)
{
    const ferry__iofile *seen[SEEN_MAX];
    size_t nseen = 0;
    for (size_t i = 0; i < n; i++) {
        const ferry__iofile *file = ts[i] ? ts[i]->file : NULL;
        if (!file)
            continue;
        size_t k = 0;
        while (k < nseen && seen[k] != file)
            k++;
        if (k < nseen)
            continue;
        if (nseen < SEEN_MAX)
            seen[nseen++] = file;
        ferry__err_clear(e);
        int rc = ferry__iofile_check(file, path_too, e);
        if (rc) {
            ferry__fail_prefix(e, "tensor '%s': ", ts[i]->info.name);
            return rc;
        }
    }
    return 0;
}

int ferry__check_after_eio(ferry_tensor *const *ts, size_t n, ferry__err *e)
{
    ferry__err *why = malloc(sizeof *why);
    if (!why)
        return FERRY_EIO; /* the read's own failure stands */
    int changed = ferry__check_tensors(ts, n, FERRY__PATH_NONE, why) != 0;
    if (changed && e) {
        e->code = FERRY_ECHANGED;
        ferry__fail_append(e, 0, "%s", why->msg);
    }
    free(why);
    return changed ? FERRY_ECHANGED : FERRY_EIO;
}

int ferry_check_files(ferry *f)
{
    if (!f)
        return FERRY_EINVAL;
    pthread_mutex_lock(&f->lock);
    size_t n = ferry_catalog_file_count(f->cat);
    const ferry__iofile **files = malloc((n ? n : 1) * sizeof *files);
    for (size_t i = 0; files && i < n; i++)
        files[i] = ferry__catalog_file(f->cat, i);
    pthread_mutex_unlock(&f->lock);
    if (!files)
        return ferry__fail_thread(f, FERRY_ENOMEM, "out of memory");
    int rc = 0;
    ferry__err e[1];
    ferry__err_clear(e);
    for (size_t i = 0; i < n && !rc; i++)
        rc = ferry__iofile_check(files[i], FERRY__PATH_ALWAYS, e);
    free(files);
    return ferry__publish(f, rc, e);
}

int ferry_tensor_read_file(ferry *f, const ferry_tensor *t, uint64_t off, uint64_t n, void *dst)
{
    if (!f || !t || (n && !dst) || t->owner != f)
        return FERRY_EINVAL;
    if (!t->file)
        return ferry__fail_thread(f, FERRY_EINVAL, "tensor '%s' has no file", t->info.name);
    if (off > t->info.nbytes || n > t->info.nbytes - off)
        return ferry__fail_thread(f, FERRY_EINVAL, "tensor '%s': file bytes [%llu, %llu) of %llu",
                                  t->info.name, (unsigned long long)off,
                                  (unsigned long long)(off + n),
                                  (unsigned long long)t->info.nbytes);
    /* the bytes of the file ferry opened: a path renamed over does not change them */
    ferry_tensor *const one[1] = {(ferry_tensor *)t};
    ferry__err e[1];
    ferry__err_clear(e);
    int rc = ferry__check_tensors(one, 1, FERRY__PATH_NONE, e);
    if (rc)
        return ferry__publish(f, rc, e);
    rc = ferry__io_read(t->file, t->info.offset + off, n, dst, FERRY_LOAD_READ, e);
    if (rc)
        ferry__fail_prefix(e, "tensor '%s': ", t->info.name);
    return ferry__publish(f, rc, e);
}
