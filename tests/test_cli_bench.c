/*
 * test_cli_bench.c — `ferry bench`, run as a user runs it (the binary FERRY_CLI through the
 * shell) with --quick on a small model that `ferry gen` writes: the JSON report has every key a
 * script reads, each measurement is a positive number, the stream entries follow from their own
 * definitions (budgets of M/4 and M/2, optimal = M - B + W capped at M, efficiency = bound /
 * measured), --device adds a device stream, --split a split one (its bound the slowest device's
 * share through its link), the table names every row, and
 * bad arguments are usage errors. Performance itself is never asserted: the machine is shared.
 */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <errno.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "check.h"
#include "ferry.h"
#include "formats/formats.h"

#include "cli_json.h"

/* ---- JSON (the library's strict parser: what parses is valid JSON) -------------------------- */

/* The number J (any JSON number), or NAN when J is absent or not a number. */
static double jnum(const ferry__json *j)
{
    if (!j || j->type != FERRY__JSON_NUMBER || j->num_len >= 64)
        return NAN;
    char buf[64];
    memcpy(buf, j->num, j->num_len);
    buf[j->num_len] = 0;
    char *end;
    double v = strtod(buf, &end);
    return *end ? NAN : v;
}

/* Key KEY of O is a finite number > 0; reports the key when not. */
static double positive(const ferry__json *o, const char *key)
{
    double v = jnum(jget(o, key));
    if (!(v > 0) || !isfinite(v))
        fprintf(stderr, "key '%s': %g, expected a positive number\n", key, v);
    CHECK(v > 0 && isfinite(v));
    return v;
}

static uint64_t max_u64(uint64_t a, uint64_t b) { return a > b ? a : b; }

/* One stream entry: every key, positive, and consistent with its definitions. */
static void check_stream(const ferry__json *s, uint64_t model, uint64_t want_budget,
                         const char *device, double fresh, double overlap_r, double overlap_c)
{
    static const char *keys[] = {"budget_bytes",   "bytes_read_per_pass",
                                 "optimal_bytes_per_pass", "working_set_bytes",
                                 "seconds_per_pass", "bound_seconds_per_pass", "efficiency"};
    CHECK(s && s->type == FERRY__JSON_OBJECT);
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        positive(s, keys[i]);
    const ferry__json *dev = jget(s, "device");
    CHECK(dev && dev->type == FERRY__JSON_STRING && strcmp(dev->str, device) == 0);
    uint64_t budget = (uint64_t)jnum(jget(s, "budget_bytes"));
    uint64_t w = (uint64_t)jnum(jget(s, "working_set_bytes"));
    uint64_t opt = (uint64_t)jnum(jget(s, "optimal_bytes_per_pass"));
    CHECK(w > 0 && w <= model);
    /* B = the asked budget, raised to the working set when smaller (never, for this model). */
    CHECK_EQ_INT(budget, max_u64(want_budget, w));
    CHECK(w < want_budget);
    const ferry__json *raised = jget(s, "budget_raised_to_working_set");
    CHECK(raised && raised->type == FERRY__JSON_BOOL && raised->b == 0);
    /* optimal = M - B + W, never more than M */
    uint64_t want_opt = (model > budget ? model - budget : 0) + w;
    CHECK_EQ_INT(opt, want_opt < model ? want_opt : model);
    double eff = jnum(jget(s, "efficiency")), bound = jnum(jget(s, "bound_seconds_per_pass")),
           secs = jnum(jget(s, "seconds_per_pass"));
    CHECK(fabs(eff - bound / secs) <= 1e-9 * eff + 1e-12);
    const ferry__json *ps = jget(s, "pass_seconds");
    CHECK(ps && ps->type == FERRY__JSON_ARRAY && ps->n >= 3);
    /* the stream's own I/O settings, and its first pass against max(M / O_DIRECT, compute) */
    static const char *more[] = {"request_bytes", "readers", "first_pass_seconds",
                                 "first_pass_bound_seconds", "first_pass_efficiency"};
    for (size_t i = 0; i < sizeof more / sizeof more[0]; i++)
        positive(s, more[i]);
    double f_eff = jnum(jget(s, "first_pass_efficiency")),
           f_bound = jnum(jget(s, "first_pass_bound_seconds")),
           f_secs = jnum(jget(s, "first_pass_seconds"));
    CHECK(fabs(f_eff - f_bound / f_secs) <= 1e-9 * f_eff + 1e-12);
    CHECK(fabs(f_secs - jnum(&ps->items[0])) <= 1e-12 + 1e-9 * f_secs);
    /* what ferry faulted in before the first pass: within its budget, none for a device */
    const ferry__json *ahead = jget(s, "first_pass_faulted_ahead_bytes");
    CHECK(ahead && ahead->type == FERRY__JSON_NUMBER && jnum(ahead) >= 0 && jnum(ahead) <= budget);
    if (strcmp(device, "cpu") != 0)
        CHECK(jnum(ahead) == 0);
    /* the kept memory faulted in at the rate of fresh 2 MiB pages (cpu streams) */
    double fault = jnum(jget(s, "first_pass_fault_seconds"));
    double f_mach = jnum(jget(s, "first_pass_machine_efficiency"));
    if (fresh > 0 && strcmp(device, "cpu") == 0)
        CHECK(fabs(fault - (double)(budget < model ? budget : model) / (fresh * 1e9)) <=
              1e-9 * fault + 1e-12);
    else
        CHECK(fault == 0);
    /* and against its own limit: the same read by a plain program, B bytes kept in fresh
     * memory, the fastest of huge pages faulted by the readers or by two threads ahead and small
     * pages faulted by the readers (cpu streams) */
    double f_lim = jnum(jget(s, "first_pass_limit_seconds"));
    double f_ways = jnum(jget(s, "first_pass_limit_faulters"));
    const ferry__json *fp = jget(s, "first_pass_limit_pages");
    const char *f_pages = fp && fp->type == FERRY__JSON_STRING ? fp->str : NULL;
    CHECK(f_pages && (strcmp(f_pages, "huge") == 0 || strcmp(f_pages, "small") == 0));
    if (strcmp(device, "cpu") == 0 && overlap_r > 0) /* O_DIRECT works: it was measured */
        CHECK(f_lim > 0 && (f_ways == 0 || (f_ways == 2 && f_pages && !strcmp(f_pages, "huge"))));
    else
        CHECK(f_lim == 0 && f_ways == 0 && f_pages && !strcmp(f_pages, "huge"));
    CHECK(fabs(f_mach - fmax(f_bound, f_lim) / f_secs) <= 1e-9 * f_mach + 1e-12);
    /* the bound with the CPUs shared: read and compute at once at the measured ratios (at most
     * 1) until one is done, then the other alone; between the max and the sum of the two */
    double ob = jnum(jget(s, "overlap_bound_seconds_per_pass")),
           oe = jnum(jget(s, "overlap_efficiency"));
    double tr = jnum(jget(s, "transfer_seconds_per_pass")),
           tc = jnum(jget(s, "compute_seconds_per_pass"));
    /* the disk between the passes (cpu streams): the faster of the O_DIRECT read and the relayed
     * one, so never below the former; the transfer reads M - B + W at it */
    if (strcmp(device, "cpu") == 0) {
        double disk = jnum(jget(s, "disk_read_gbps_between_passes")),
               direct = jnum(jget(s, "direct_read_gbps_between_passes"));
        CHECK(disk >= direct * (1 - 1e-9));
        if (disk > 0)
            CHECK(fabs(tr - (double)opt / (disk * 1e9)) <= 1e-9 * tr + 1e-12);
    }
    if (overlap_r > 0 && overlap_c > 0 && tc > 0) {
        double rr = fmin(overlap_r, 1), rc = fmin(overlap_c, 1);
        double busy_r = tr / rr, busy_c = tc / rc; /* each alone at its busy rate */
        double want = busy_r <= busy_c ? busy_r + (1 - busy_r / busy_c) * tc
                                       : busy_c + tr * (1 - busy_c / busy_r);
        want = fmin(want, tr + tc); /* never worse than one after the other */
        CHECK(fabs(ob - want) <= 1e-9 * want + 1e-12);
        CHECK(ob >= fmax(tr, tc) * (1 - 1e-9) && ob <= (tr + tc) * (1 + 1e-9));
        CHECK(fabs(oe - ob / secs) <= 1e-9 * oe + 1e-12);
    } else {
        CHECK(ob == 0 && oe == 0);
    }
}

/* --stream-io fixes the streams' settings (no sweep); --cap where no memory controller can be
 * found says why and runs the rest; --streams measures no loads. */
static void test_cap_and_io(const char *model_path)
{
    char root[2100];
    snprintf(root, sizeof root, "%s/no-cgroups", tmp);
    CHECK(mkdir(root, 0755) == 0 || errno == EEXIST);
    setenv("FERRY_BENCH_CGROUP_ROOT", root, 1);
    int rc = run("bench --quick --json --streams --stream-io 2x4MiB --cap 512MiB '%s'", model_path);
    unsetenv("FERRY_BENCH_CGROUP_ROOT");
    CHECK_EQ_INT(rc, 0);
    ferry__json doc;
    if (parse_stdout(&doc) != 0) {
        CHECK(0);
        return;
    }
    const ferry__json *st = jget(&doc, "stream");
    CHECK(st && st->type == FERRY__JSON_ARRAY && st->n == 2);
    for (size_t i = 0; st && st->type == FERRY__JSON_ARRAY && i < st->n; i++) {
        CHECK_EQ_INT((uint64_t)jnum(jget(&st->items[i], "readers")), 2);
        CHECK_EQ_INT((uint64_t)jnum(jget(&st->items[i], "request_bytes")), 4u << 20);
    }
    const ferry__json *sw = jget(&doc, "stream_io_sweep");
    CHECK(sw && sw->type == FERRY__JSON_ARRAY && sw->n == 0);
    const ferry__json *cap = jget(&doc, "cap");
    CHECK(cap && cap->type == FERRY__JSON_OBJECT);
    const ferry__json *ran = jget(cap, "ran"), *why = jget(cap, "why_not");
    CHECK(ran && ran->type == FERRY__JSON_BOOL && ran->b == 0);
    CHECK(why && why->type == FERRY__JSON_STRING && strstr(why->str, "no memory cgroup") &&
          strstr(why->str, root));
    CHECK(jget(&doc, "cold_load_gbps") != NULL);
    ferry__json_free(&doc);
    /* the table says why too */
    setenv("FERRY_BENCH_CGROUP_ROOT", root, 1);
    CHECK_EQ_INT(run("bench --quick --streams --stream-io 2x4MiB --cap 512MiB '%s'", model_path),
                 0);
    unsetenv("FERRY_BENCH_CGROUP_ROOT");
    CHECK(strstr(out_text, "capped stream (--cap 512.00 MiB): not run: no memory cgroup") != NULL);
    CHECK(strstr(out_text, "2 x 4.00 MiB") != NULL);
    /* the default sweeps the streams' settings and says which pair it used */
    CHECK_EQ_INT(run("bench --quick --streams '%s'", model_path), 0);
    CHECK(strstr(out_text, "<- used") != NULL);
    CHECK_EQ_INT(run("bench --stream-io 4 '%s'", model_path), 2);
    CHECK(strstr(err_text, "READERSxSIZE") != NULL);
    CHECK_EQ_INT(run("bench --cap lots '%s'", model_path), 2);
    CHECK_EQ_INT(run("bench --cap-only '%s'", model_path), 2);
    CHECK(strstr(err_text, "--cap-only needs --cap") != NULL);
}

static void test_json(const char *model_path)
{
    CHECK_EQ_INT(run("bench --quick --json '%s'", model_path), 0);
    if (*err_text)
        fprintf(stderr, "stderr: %s\n", err_text);
    ferry__json doc;
    int rc = parse_stdout(&doc);
    CHECK_EQ_INT(rc, 0);
    if (rc)
        return;
    static const char *keys[] = {
        "direct_read_gbps",      "memcpy_gbps",         "fresh_memory_gbps",
        "fresh_huge_memory_gbps",
        "cold_load_gbps",        "warm_load_gbps",      "mmap_fault_load_gbps",
        "mmap_populate_load_gbps", "cold_load_ratio",   "warm_load_ratio",
        "buffered_read_gbps",    "cold_load_direct_gbps", "resident_compute_seconds",
        "warm_auto_seconds",     "model_bytes",         "read_bandwidth_gbps",
        "resident_compute_ratio", "resident_compute_threads", "read_bandwidth_threads"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        positive(&doc, keys[i]);
    /* the ratios are what they say they are */
    double direct = jnum(jget(&doc, "direct_read_gbps")), fresh = jnum(jget(&doc, "fresh_memory_gbps")),
           mc = jnum(jget(&doc, "memcpy_gbps"));
    double cold = jnum(jget(&doc, "cold_load_gbps")), warm = jnum(jget(&doc, "warm_load_gbps"));
    double cr = jnum(jget(&doc, "cold_load_ratio")), wr = jnum(jget(&doc, "warm_load_ratio"));
    /* the disk: the faster of the O_DIRECT read and, where relaying gained at the start, the
     * relayed read, both measured before each cold load: its median never below the O_DIRECT
     * reads' (no figure of it is), and the same where relaying did not gain */
    double relayed = jnum(jget(&doc, "direct_relayed_read_gbps"));
    double gain = jnum(jget(&doc, "direct_relayed_gain"));
    double disk = jnum(jget(&doc, "disk_read_gbps"));
    CHECK(relayed >= 0 && gain >= 0);
    CHECK(gain > 1 ? disk >= direct * (1 - 1e-9) : fabs(disk - direct) <= 1e-9 * disk);
    CHECK(fabs(cr - cold / fmin(disk, fresh)) <= 1e-9 * cr);
    CHECK(fabs(wr - warm / fmin(mc, fresh)) <= 1e-9 * wr);
    double cg = jnum(jget(&doc, "resident_compute_gbps")), rb = jnum(jget(&doc, "read_bandwidth_gbps"));
    CHECK(fabs(jnum(jget(&doc, "resident_compute_ratio")) - cg / rb) <= 1e-9 * cg / rb);
    /* the read and the compute at once: measured where the filesystem takes O_DIRECT (the read
     * is the O_DIRECT limit's), else 0 and no shared bound */
    const ferry__json *dsup = jget(&doc, "direct_read_supported");
    CHECK(dsup && dsup->type == FERRY__JSON_BOOL);
    double o_r = jnum(jget(&doc, "overlap_read_ratio")), o_c = jnum(jget(&doc, "overlap_compute_ratio"));
    if (dsup && dsup->type == FERRY__JSON_BOOL && dsup->b)
        CHECK(o_r > 0 && o_c > 0 && isfinite(o_r) && isfinite(o_c));
    else
        CHECK(o_r == 0 && o_c == 0);
    /* a plain program's cold load (the model into fresh memory with O_DIRECT), where O_DIRECT
     * works, and the cold load against the lower of it and min(O_DIRECT, fresh memory) */
    double cl = jnum(jget(&doc, "cold_load_limit_gbps"));
    double cm = jnum(jget(&doc, "cold_load_machine_ratio"));
    const ferry__json *cp = jget(&doc, "cold_load_limit_pages");
    CHECK(cp && cp->type == FERRY__JSON_STRING);
    int direct_ok = dsup && dsup->type == FERRY__JSON_BOOL && dsup->b;
    if (cp && cp->type == FERRY__JSON_STRING)
        CHECK(direct_ok ? cl > 0 && (!strcmp(cp->str, "small") || !strcmp(cp->str, "huge") ||
                                     !strcmp(cp->str, "relayed"))
                        : cl == 0 && !strcmp(cp->str, "none"));
    /* the read through relay slots is measured where O_DIRECT works, and only there */
    CHECK(direct_ok ? relayed > 0 && gain > 0 : relayed == 0 && gain == 0);
    /* with the faster of 16 and 32 readers, which it names */
    double relay_readers = jnum(jget(&doc, "direct_relayed_readers"));
    CHECK(direct_ok ? relay_readers == 16 || relay_readers == 32 : relay_readers == 0);
    double cold_den = cl > 0 ? fmin(fmin(disk, fresh), cl) : fmin(disk, fresh);
    CHECK(fabs(cm - cold / cold_den) <= 1e-9 * cm);
    uint64_t model = (uint64_t)jnum(jget(&doc, "model_bytes"));
    CHECK(jnum(jget(&doc, "runs")) == 1); /* --quick */
    CHECK(jnum(jget(&doc, "settle_seconds")) == 0); /* --quick rests nowhere */
    const ferry__json *st = jget(&doc, "stream");
    CHECK(st && st->type == FERRY__JSON_ARRAY && st->n == 2);
    if (st && st->type == FERRY__JSON_ARRAY && st->n == 2) {
        double huge = jnum(jget(&doc, "fresh_huge_memory_gbps"));
        check_stream(&st->items[0], model, model / 4, "cpu", huge, o_r, o_c);
        check_stream(&st->items[1], model, model / 2, "cpu", huge, o_r, o_c);
    }
    CHECK(jget(&doc, "device_stream") == NULL); /* only with --device */
    ferry__json_free(&doc);
}

static void test_device(const char *model_path)
{
    CHECK_EQ_INT(run("bench --quick --json --threads 1 --device sim:256MiB@4GB/s '%s'", model_path), 0);
    ferry__json doc;
    int rc = parse_stdout(&doc);
    CHECK_EQ_INT(rc, 0);
    if (rc)
        return;
    uint64_t model = (uint64_t)jnum(jget(&doc, "model_bytes"));
    CHECK(jnum(jget(&doc, "resident_compute_threads")) == 1);
    const ferry__json *ds = jget(&doc, "device_stream");
    CHECK(ds && ds->type == FERRY__JSON_ARRAY && ds->n == 1);
    if (ds && ds->type == FERRY__JSON_ARRAY && ds->n == 1) {
        const ferry__json *s = &ds->items[0];
        check_stream(s, model, model / 4, "sim:256MiB@4GB/s", 0, 0, 0); /* no compute on it */
        /* nothing is computed on the device: the bound is the link's time for optimal bytes */
        double bound = jnum(jget(s, "bound_seconds_per_pass"));
        double opt = jnum(jget(s, "optimal_bytes_per_pass"));
        CHECK(fabs(bound - opt / 4e9) <= 1e-9 * bound);
        CHECK(jnum(jget(s, "link_gbps")) == 4); /* the spec's */
        const ferry__json *m = jget(s, "link_measured");
        CHECK(m && m->type == FERRY__JSON_BOOL && !m->b);
    }
    ferry__json_free(&doc);
    /* a spec without a bandwidth (as cuda:0): the link is measured, and the bound is its time */
    CHECK_EQ_INT(run("bench --quick --json --streams --device sim:256MiB '%s'", model_path), 0);
    rc = parse_stdout(&doc);
    CHECK_EQ_INT(rc, 0);
    if (rc)
        return;
    ds = jget(&doc, "device_stream");
    CHECK(ds && ds->type == FERRY__JSON_ARRAY && ds->n == 1);
    if (ds && ds->type == FERRY__JSON_ARRAY && ds->n == 1) {
        const ferry__json *s = &ds->items[0];
        const ferry__json *m = jget(s, "link_measured");
        CHECK(m && m->type == FERRY__JSON_BOOL && m->b);
        double link = positive(s, "link_gbps") * 1e9;
        double bound = jnum(jget(s, "bound_seconds_per_pass"));
        double opt = jnum(jget(s, "optimal_bytes_per_pass"));
        CHECK(fabs(bound - opt / link) <= 1e-6 * bound);
    }
    ferry__json_free(&doc);
}

/* --split: one device_stream entry "split" whose bound follows from its per-device figures. */
static void test_split(const char *model_path, const char *spec, int with_cpu)
{
    CHECK_EQ_INT(run("bench --quick --json --split %s '%s'", spec, model_path), 0);
    ferry__json doc;
    int rc = parse_stdout(&doc);
    CHECK_EQ_INT(rc, 0);
    if (rc)
        return;
    uint64_t model = (uint64_t)jnum(jget(&doc, "model_bytes"));
    const ferry__json *ds = jget(&doc, "device_stream");
    CHECK(ds && ds->type == FERRY__JSON_ARRAY && ds->n == 1);
    const ferry__json *s = ds && ds->type == FERRY__JSON_ARRAY && ds->n == 1 ? &ds->items[0]
                                                                               : NULL;
    const ferry__json *dev = jget(s, "device");
    CHECK(dev && dev->type == FERRY__JSON_STRING && strcmp(dev->str, "split") == 0);
    const ferry__json *sd = jget(s, "split_devices");
    CHECK(sd && sd->type == FERRY__JSON_ARRAY && sd->n == 2);
    if (!sd || sd->type != FERRY__JSON_ARRAY || sd->n != 2) {
        ferry__json_free(&doc);
        return;
    }
    uint64_t sum_b = 0, sum_opt = 0, share[2] = {0, 0};
    double worst = 0;
    for (size_t i = 0; i < 2; i++) {
        const ferry__json *d = &sd->items[i];
        uint64_t m = (uint64_t)jnum(jget(d, "share_bytes")), b = (uint64_t)jnum(jget(d, "budget_bytes"));
        uint64_t w = (uint64_t)jnum(jget(d, "working_set_bytes"));
        uint64_t opt = (uint64_t)jnum(jget(d, "optimal_bytes_per_pass"));
        double bw = jnum(jget(d, "bandwidth_bytes_per_second"));
        double tr = jnum(jget(d, "transfer_seconds_per_pass"));
        share[i] = m;
        if (with_cpu && i == 0) {
            /* the cpu's rows are read in place: no budget, no transfer */
            CHECK(bw == 0 && tr == 0 && opt == 0 && b == 0);
            continue;
        }
        CHECK(m > 0 && w > 0 && w <= m && bw > 0);
        /* B_i = M_i / 4, raised to W_i; optimal = M_i - B_i + W_i, at most M_i */
        CHECK_EQ_INT(b, max_u64(m / 4, w));
        uint64_t want = m - (b < m ? b : m) + w;
        CHECK_EQ_INT(opt, want < m ? want : m);
        CHECK(fabs(tr - (double)opt / bw) <= 1e-9 * tr);
        worst = fmax(worst, tr);
        sum_b += b;
        sum_opt += opt;
    }
    /* the second device holds three quarters of every split tensor's rows */
    if (!with_cpu)
        CHECK(share[1] > share[0] * 5 / 2 && share[1] < share[0] * 7 / 2);
    CHECK(share[0] + share[1] <= model + model / 50);
    CHECK(share[0] + share[1] >= (with_cpu ? model * 2 / 5 : model));
    CHECK_EQ_INT((uint64_t)jnum(jget(s, "budget_bytes")), sum_b);
    CHECK_EQ_INT((uint64_t)jnum(jget(s, "optimal_bytes_per_pass")), sum_opt);
    /* the slowest device's share through its own link */
    double bound = jnum(jget(s, "bound_seconds_per_pass"));
    CHECK(bound > 0 && fabs(bound - worst) <= 1e-9 * bound);
    double eff = jnum(jget(s, "efficiency")), secs = jnum(jget(s, "seconds_per_pass"));
    CHECK(secs > 0 && fabs(eff - bound / secs) <= 1e-9 * eff + 1e-12);
    CHECK(jnum(jget(s, "bytes_read_per_pass")) > 0); /* bytes copied to the devices */
    ferry__json_free(&doc);
}

static void test_table(const char *model_path)
{
    CHECK_EQ_INT(run("bench --quick --split sim:256MiB@2GB/s,sim:256MiB@4GB/s:3 '%s'",
                     model_path), 0);
    /* the split stream's rows and how its bound is defined */
    CHECK(strstr(out_text, "streams: split over sim:256MiB@2GB/s (weight 1), sim:256MiB@4GB/s "
                           "(weight 3)") != NULL);
    CHECK(strstr(out_text, "max over its devices of (M_i - B_i + W_i) / BW_i") != NULL);
    static const char *rows[] = {"O_DIRECT read", "cold buffered read", "memcpy",
                                 "fresh memory",  "resident compute",   "cold, auto",
                                 "memory read (",
                                 "cold, direct",  "mmap page faults",   "mmap + populate",
                                 "warm, read",    "no copy",            "streams:",
                                 "efficiency"};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        int found = strstr(out_text, rows[i]) != NULL;
        if (!found)
            fprintf(stderr, "table lacks '%s':\n%s\n", rows[i], out_text);
        CHECK(found);
    }
    CHECK(strstr(err_text, "\033[") == NULL); /* no progress bar off a terminal */
}

static void test_usage(const char *model_path)
{
    CHECK_EQ_INT(run("bench"), 2);
    CHECK(strstr(err_text, "no model file") != NULL);
    CHECK_EQ_INT(run("bench --passes 2 '%s'", model_path), 2);
    CHECK_EQ_INT(run("bench --runs 0 '%s'", model_path), 2);
    CHECK_EQ_INT(run("bench --threads 0 '%s'", model_path), 2);
    CHECK(strstr(err_text, "--threads") != NULL);
    CHECK_EQ_INT(run("bench --device sim:64MiB@fastGB/s '%s'", model_path), 2);
    CHECK(strstr(err_text, "bandwidth") != NULL);
    /* a device whose link cannot be measured (it does not open): said before anything runs */
    setenv("FERRY_CUDART", "/nonexistent/libcudart.so", 1);
    CHECK_EQ_INT(run("bench --device cuda:0 '%s'", model_path), 1);
    unsetenv("FERRY_CUDART");
    CHECK(strstr(err_text, "cuda:0") != NULL && strstr(err_text, "FERRY_CUDART") != NULL);
    CHECK_EQ_INT(run("bench '%s' '%s'", model_path, model_path), 2);
    CHECK_EQ_INT(run("bench --split sim:64MiB@2GB/s '%s'", model_path), 2);
    CHECK(strstr(err_text, "two devices") != NULL);
    CHECK_EQ_INT(run("bench --split sim:64MiB@2GB/s,sim:64MiB:3 '%s'", model_path), 2);
    CHECK(strstr(err_text, "'sim:64MiB' gives no bandwidth") != NULL);
    CHECK_EQ_INT(run("bench --split sim:64MiB@2GB/s,sim:lots '%s'", model_path), 2);
    CHECK(strstr(err_text, "sim:lots") != NULL);
    CHECK_EQ_INT(run("bench --help"), 0);
    CHECK(strstr(out_text, "usage: ferry bench") != NULL);
    CHECK_EQ_INT(run("bench --quick '%s/missing.gguf'", tmp), 1);
    CHECK(strstr(err_text, "missing.gguf") != NULL);
}

int main(void)
{
    tmp = check_tmpdir("cli_bench");
    char model_path[2048];
    snprintf(model_path, sizeof model_path, "%s/small.gguf", tmp);
    /* 8 blocks of width 256, a small vocabulary: about 13 MiB whose working set (two blocks)
     * is less than a quarter of it, so that every budget is exactly M/4 or M/2. */
    int rc = run("gen -o '%s' --layers 8 --dim 256 --vocab 1000 -q", model_path);
    CHECK_EQ_INT(rc, 0);
    if (rc == 0) {
        test_json(model_path);
        test_device(model_path);
        test_split(model_path, "sim:256MiB@2GB/s,sim:256MiB@4GB/s:3", 0);
        test_split(model_path, "cpu,sim:256MiB@4GB/s", 1);
        test_table(model_path);
        test_usage(model_path);
        test_cap_and_io(model_path);
    }
    free(out_text);
    free(err_text);
    if (!check_failed)
        check_rmdir(tmp);
    return check_finish();
}
