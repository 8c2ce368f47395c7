/*
 * test_header_memory.c — what a large safetensors header costs the reader: `ferry inspect` on a
 * header of 1M tensor entries (about 68 MB of JSON, refused for holding more than 2^22 values)
 * peaks at twice the header's size, and on one of 300k entries (about 20 MB, accepted) at eight
 * times, measured as the child's peak resident set (wait4) above that of a one-tensor file. The header is parsed member by member,
 * never as one DOM of the whole document.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "ferry.h"

static const char *g_dir;

/* Writes a safetensors file of N one-byte U8 tensors "tNNNNNN"; returns the header's length. */
static uint64_t write_header(const char *path, unsigned n)
{
    FILE *fp = fopen(path, "wb");
    if (!fp)
        return 0;
    /* the length is patched in once the JSON is written */
    uint64_t len = 0;
    unsigned char z[8] = {0};
    fwrite(z, 1, 8, fp);
    len += (uint64_t)fprintf(fp, "{");
    for (unsigned i = 0; i < n; i++)
        len += (uint64_t)fprintf(fp, "%s\"t%06u\":{\"dtype\":\"U8\",\"shape\":[1],"
                                 "\"data_offsets\":[%u,%u]}",
                                 i ? "," : "", i, i, i + 1);
    len += (uint64_t)fprintf(fp, "}");
    while (len % 8)
        len += (uint64_t)fprintf(fp, " ");
    for (unsigned i = 0; i < n; i++)
        fputc(0, fp);
    for (int i = 0; i < 8; i++)
        z[i] = (unsigned char)(len >> (8 * i));
    if (fseek(fp, 0, SEEK_SET) != 0 || fwrite(z, 1, 8, fp) != 8 || fclose(fp) != 0)
        return 0;
    return len;
}

/* Runs `ferry inspect --json PATH` (output discarded); its exit status, *PEAK its peak RSS. */
static int inspect_peak(const char *path, uint64_t *peak)
{
    fflush(stdout); /* or the child would print it again */
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stdout) || !freopen("/dev/null", "w", stderr))
            _exit(126);
        execl(FERRY_CLI, FERRY_CLI, "inspect", "--json", path, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    if (pid < 0 || wait4(pid, &st, 0, &ru) != pid)
        return -1;
    *peak = (uint64_t)ru.ru_maxrss * 1024;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The peak of a model with one tensor: what the tool costs before any header. */
static uint64_t baseline(void)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/one.safetensors", g_dir);
    uint64_t peak = 0;
    if (!write_header(path, 1) || inspect_peak(path, &peak) != 0)
        return 0;
    return peak;
}

/* N entries: exit WANT_RC, a peak within BASE + TIMES x the header's length. */
static void check_case(unsigned n, int want_rc, uint64_t base, unsigned times)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/h%u.safetensors", g_dir, n);
    uint64_t len = write_header(path, n);
    CHECK(len > (uint64_t)n * 50);
    uint64_t peak = 0;
    int rc = inspect_peak(path, &peak);
    CHECK_EQ_INT(rc, want_rc);
    uint64_t allowed = base + times * len;
    printf("header of %u entries (%.1f MB): peak RSS %.1f MB (tool alone %.1f MB, allowed %.1f)\n",
           n, (double)len / 1e6, (double)peak / 1e6, (double)base / 1e6, (double)allowed / 1e6);
    CHECK(peak > 0 && peak <= allowed);
    unlink(path);
}

int main(void)
{
    g_dir = check_tmpdir("header_memory");
    if (SANITIZED) {
        /* the runtime's shadow memory and freed-memory quarantine are in the peak too */
        printf("peak RSS bounds not checked in a sanitizer build (its shadow and quarantine "
               "count in the peak)\n");
    } else {
        uint64_t base = baseline();
        CHECK(base > 0);
        /* refused (more than 2^22 JSON values): the mapped header and one member at a time */
        check_case(1000000, 1, base, 2);
        /* accepted: the header, and each tensor's description and catalog entry (a few hundred
         * bytes each, for about 67 bytes of JSON) */
        check_case(300000, 0, base, 8);
    }
    int rc = check_finish();
    if (!rc)
        check_rmdir(g_dir);
    return rc;
}
