/*
 * check.h — the tests' minimal harness: CHECK macros that count and report failures with file and
 * line, and a closing line "N passed, N failed" that test_main prints.
 */
#ifndef FERRY_CHECK_H
#define FERRY_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* SANITIZED: 1 in ASan/TSan builds (gcc or clang), where timing, fault counts and address-space
 * limits mean other things. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

static int check_passed, check_failed;

#define CHECK(cond)                                                                        \
    do {                                                                                   \
        if (cond) {                                                                        \
            check_passed++;                                                                \
        } else {                                                                           \
            check_failed++;                                                                \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);      \
        }                                                                                  \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                                 \
    do {                                                                                   \
        long long check_a_ = (long long)(a), check_b_ = (long long)(b);                    \
        if (check_a_ == check_b_) {                                                        \
            check_passed++;                                                                \
        } else {                                                                           \
            check_failed++;                                                                \
            fprintf(stderr, "%s:%d: CHECK failed: %s == %s (%lld vs %lld)\n", __FILE__,   \
                    __LINE__, #a, #b, check_a_, check_b_);                                 \
        }                                                                                  \
    } while (0)

#define CHECK_STR(a, b)                                                                    \
    do {                                                                                   \
        const char *check_a_ = (a), *check_b_ = (b);                                       \
        if (check_a_ && check_b_ && strcmp(check_a_, check_b_) == 0) {                    \
            check_passed++;                                                                \
        } else {                                                                           \
            check_failed++;                                                                \
            fprintf(stderr, "%s:%d: CHECK failed: %s == %s (\"%s\" vs \"%s\")\n",         \
                    __FILE__, __LINE__, #a, #b, check_a_ ? check_a_ : "(null)",            \
                    check_b_ ? check_b_ : "(null)");                                       \
        }                                                                                  \
    } while (0)

/* A fresh scratch folder for this test binary: $FERRY_TEST_TMP/NAME (or /tmp/ferry-test-NAME). */
static inline const char *check_tmpdir(const char *name)
{
    static char dir[1024];
    const char *base = getenv("FERRY_TEST_TMP");
    char cmd[2200];
    if (!base || !*base)
        base = "/tmp/ferry-tests";
    snprintf(dir, sizeof dir, "%s/%s.%d", base, name, (int)getpid());
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", dir, dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "cannot create %s\n", dir);
        exit(2);
    }
    return dir;
}

static inline void check_rmdir(const char *dir)
{
    char cmd[2200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", dir);
}

/* Writes N bytes to PATH; returns 0 on success. */
static inline int check_write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t w = fwrite(data, 1, n, f);
    return (fclose(f) == 0 && w == n) ? 0 : -1;
}

/* Prints the closing line and returns the exit status. */
static inline int check_finish(void)
{
    printf("%d passed, %d failed\n", check_passed, check_failed);
    return check_failed ? 1 : 0;
}

#endif
