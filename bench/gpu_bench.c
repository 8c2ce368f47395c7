/*
 * gpu_bench.c — host->device bandwidth of a device (pinned staging memory, the device's own copy
 * engine) beside ferry's streamed throughput to it: a model streamed through a device budget of a
 * quarter of its size, layer by layer, with a timed wait standing in for compute.
 *
 *   gpu_bench [--device cuda:0] [--compute-ms X] [--passes N] [--trace FILE] MODEL
 *
 * --trace writes the timeline of passes 2..N (Chrome trace format: each pass, layer, prepare and
 * release; each loader's staging, device allocations and frees, the waits in prepare) for finding
 * where a pass stalls.
 *
 * Written for bench/gpu-check.sh on a machine with a GPU; runs on a sim device anywhere
 * (--device sim:4GiB@20GB/s), which is how it is tested without one.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "benchlab.h"
#include "ferry.h"
#include "ferry_device.h"

/* ferry's clock, so that the trace's engine events line up with its own */
static double now(void)
{
    return ferry_now();
}

static void sleep_s(double s)
{
    if (s <= 0)
        return;
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

int main(int argc, char **argv)
{
    const char *spec = "cuda:0", *model = NULL, *trace = NULL;
    double compute_ms = 1.0;
    int passes = 3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc)
            spec = argv[++i];
        else if (!strcmp(argv[i], "--compute-ms") && i + 1 < argc)
            compute_ms = atof(argv[++i]);
        else if (!strcmp(argv[i], "--passes") && i + 1 < argc)
            passes = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--trace") && i + 1 < argc)
            trace = argv[++i];
        else
            model = argv[i];
    }
    if (!model || passes < 2) {
        fprintf(stderr, "usage: gpu_bench [--device SPEC] [--compute-ms X] [--passes N>=2] "
                        "[--trace FILE] MODEL\n");
        return 2;
    }
    double bw;
    char why[300] = "";
    if (benchlab_link_bandwidth(spec, &bw, why, sizeof why) || bw <= 0) {
        fprintf(stderr, "gpu_bench: %s\n", why[0] ? why : "cannot measure the link");
        return 1;
    }
    bw /= 1e9;
    ferry *f = ferry_create(NULL);
    int dev;
    if (!f || ferry_add_device(f, spec, &dev) || ferry_open(f, model, NULL)) {
        fprintf(stderr, "gpu_bench: %s\n", f ? ferry_errmsg(f) : "out of memory");
        return 1;
    }
    ferry_policy p = {.home = FERRY_HOME_HOST, .compute_device = dev};
    const ferry_catalog *c = ferry_catalog_of(f);
    uint64_t model_bytes = ferry_catalog_total_bytes(c);
    if (ferry_group_add(f, "all", "*", &p) || ferry_set_budget(f, dev, model_bytes / 4) ||
        ferry_load_group(f, NULL)) {
        fprintf(stderr, "gpu_bench: %s\n", ferry_errmsg(f));
        return 1;
    }
    /* Layers: tensors grouped by the component after "blk." (others one set each). */
    size_t n = ferry_catalog_count(c);
    ferry_tensor **ts = calloc(n, sizeof *ts);
    size_t *start = calloc(n + 1, sizeof *start), nsets = 0;
    char prev[256] = "";
    for (size_t i = 0; i < n; i++) {
        ferry_tensor_info info;
        ferry_catalog_tensor(c, i, &info);
        ts[i] = ferry_find(f, info.name);
        char key[256];
        const char *dot = strncmp(info.name, "blk.", 4) == 0 ? strchr(info.name + 4, '.') : NULL;
        snprintf(key, sizeof key, "%.*s", dot ? (int)(dot - info.name) : (int)strlen(info.name),
                 info.name);
        if (!i || strcmp(key, prev))
            start[nsets++] = i;
        snprintf(prev, sizeof prev, "%s", key);
    }
    start[nsets] = n;
    double best_pass = 1e30, stall = 0;
    uint64_t copied0 = 0;
    for (int pass = 0; pass < passes; pass++) {
        if (pass == 1 && trace && ferry_trace_start(f, trace)) {
            fprintf(stderr, "gpu_bench: %s\n", ferry_errmsg(f));
            return 1;
        }
        ferry_stats s0, s1;
        ferry_get_stats(f, &s0);
        double t0 = now(), tl = t0;
        for (size_t k = 0; k < nsets; k++) {
            size_t cnt = start[k + 1] - start[k];
            double tp = now();
            if (ferry_prepare(f, ts + start[k], cnt)) {
                fprintf(stderr, "gpu_bench: %s\n", ferry_errmsg(f));
                return 1;
            }
            double tc = now();
            sleep_s(compute_ms / 1e3);
            double tr = now();
            ferry_release(f, ts + start[k], cnt);
            double te = now();
            if (trace && pass > 0) {
                ferry_trace_event(f, "prepare", "engine", tp, tc);
                ferry_trace_event(f, "release", "engine", tr, te);
                ferry_trace_event(f, "layer", "engine", tl, te);
            }
            tl = te;
        }
        double el = now() - t0;
        if (trace && pass > 0)
            ferry_trace_event(f, "pass", "engine", t0, t0 + el);
        ferry_get_stats(f, &s1);
        if (pass > 0 && el < best_pass) {
            best_pass = el;
            stall = s1.wait_seconds - s0.wait_seconds;
            copied0 = s1.bytes_copied - s0.bytes_copied;
        }
    }
    if (trace && ferry_trace_stop(f)) {
        fprintf(stderr, "gpu_bench: %s\n", ferry_errmsg(f));
        return 1;
    }
    double compute = compute_ms / 1e3 * (double)nsets;
    double bound = copied0 / (bw * 1e9);
    if (compute > bound)
        bound = compute;
    printf("device %s: pinned host->device %.2f GB/s\n", spec, bw);
    printf("model %.2f GiB, %zu layers, device budget M/4, compute stand-in %.2f ms per layer\n",
           model_bytes / 1073741824.0, nsets, compute_ms);
    printf("streamed pass (best of passes 2..%d): %.3f s, copied %.2f GiB (%.2f GB/s), stalled %.3f s\n",
           passes, best_pass, copied0 / 1073741824.0, copied0 / best_pass / 1e9, stall);
    printf("bound max(compute %.3f s, copied / bandwidth %.3f s) = %.3f s; efficiency %.2f\n", compute,
           copied0 / (bw * 1e9), bound, bound / best_pass);
    free(ts);
    free(start);
    ferry_destroy(f);
    return 0;
}
