/*
 * moelab.c — `ferry bench --moe` (see moelab.h): routing traces, the offline optimum, and the
 * replay of a trace through each of ferry's expert policies (ferry_cache_sim) at several cache
 * sizes. Everything is counted, nothing timed: the figures are the same on every machine.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "moelab.h"

/* ---- traces ---------------------------------------------------------------------------------- */

void moelab_trace_free(moelab_trace *t)
{
    free(t->step_start);
    free(t->ids);
    free(t->draw_p);
    memset(t, 0, sizeof *t);
}

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 256;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q)
        return -1;
    *p = q;
    *cap = c;
    return 0;
}

/* Opens a step; ids follow with add_id; close_step drops it again when it got none. */
static int open_step(moelab_trace *t)
{
    if (grow((void **)&t->step_start, &t->cap_steps, t->n_steps + 2, sizeof *t->step_start))
        return -1;
    t->step_start[t->n_steps] = t->n_ids;
    return 0;
}

static int add_id(moelab_trace *t, uint32_t id)
{
    if (grow((void **)&t->ids, &t->cap_ids, t->n_ids + 1, sizeof *t->ids))
        return -1;
    t->ids[t->n_ids++] = id;
    return 0;
}

static void close_step(moelab_trace *t)
{
    size_t n = t->n_ids - t->step_start[t->n_steps];
    if (n == 0)
        return;
    if (n > t->used)
        t->used = (uint32_t)n;
    t->n_steps++;
    t->step_start[t->n_steps] = t->n_ids;
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_unit(uint64_t *s) { return (double)(rng_next(s) >> 11) / 9007199254740992.0; }

int moelab_synth(moelab_trace *t, uint32_t layers, uint32_t experts, uint32_t k, size_t tokens,
                 double zipf, double locality, uint64_t seed)
{
    memset(t, 0, sizeof *t);
    if (k == 0 || k > experts || layers == 0)
        return -1;
    t->layers = layers;
    t->experts = experts;
    t->tokens = tokens;
    double *cdf = malloc(experts * sizeof *cdf);
    uint32_t *perm = malloc((size_t)layers * experts * sizeof *perm);
    uint32_t *prev = malloc((size_t)layers * k * sizeof *prev);
    uint32_t *cur = malloc(k * sizeof *cur);
    int rc = -1;
    if (!cdf || !perm || !prev || !cur)
        goto out;
    double sum = 0;
    for (uint32_t r = 0; r < experts; r++)
        cdf[r] = (sum += pow(r + 1.0, -zipf));
    for (uint32_t r = 0; r < experts; r++)
        cdf[r] /= sum;
    uint64_t s = seed;
    for (uint32_t l = 0; l < layers; l++) {
        uint32_t *p = perm + (size_t)l * experts;
        for (uint32_t e = 0; e < experts; e++)
            p[e] = e;
        for (uint32_t e = experts - 1; e > 0; e--) {
            uint32_t j = (uint32_t)(rng_next(&s) % (e + 1));
            uint32_t x = p[e];
            p[e] = p[j];
            p[j] = x;
        }
    }
    for (size_t tok = 0; tok < tokens; tok++) {
        for (uint32_t l = 0; l < layers; l++) {
            const uint32_t *p = perm + (size_t)l * experts;
            uint32_t *pv = prev + (size_t)l * k;
            for (uint32_t j = 0; j < k; j++) {
                uint32_t e;
                int again;
                int keep = tok > 0 && rng_unit(&s) < locality;
                do {
                    if (keep) {
                        e = pv[j];
                        keep = 0;
                    } else {
                        double u = rng_unit(&s);
                        uint32_t lo = 0, hi = experts - 1;
                        while (lo < hi) {
                            uint32_t mid = (lo + hi) / 2;
                            if (cdf[mid] < u)
                                lo = mid + 1;
                            else
                                hi = mid;
                        }
                        e = p[lo];
                    }
                    again = 0;
                    for (uint32_t i = 0; i < j; i++)
                        again |= cur[i] == e;
                } while (again);
                cur[j] = e;
            }
            if (open_step(t))
                goto out;
            for (uint32_t j = 0; j < k; j++) {
                pv[j] = cur[j];
                if (add_id(t, l * experts + cur[j]))
                    goto out;
            }
            close_step(t);
        }
    }
    t->draw_p = malloc((size_t)layers * experts * sizeof *t->draw_p);
    if (!t->draw_p)
        goto out;
    for (uint32_t l = 0; l < layers; l++)
        for (uint32_t r = 0; r < experts; r++)
            t->draw_p[(size_t)l * experts + perm[(size_t)l * experts + r]] =
                cdf[r] - (r ? cdf[r - 1] : 0);
    t->locality = locality;
    rc = 0;
out:
    free(cdf);
    free(perm);
    free(prev);
    free(cur);
    if (rc)
        moelab_trace_free(t);
    return rc;
}

/* One parsed field "L<layer>:<e>,<e>": 0, or -1 with WHY set. */
static int parse_field(const char *f, size_t len, uint32_t *layer, uint32_t *ex, size_t *n,
                       size_t max, const char **why)
{
    const char *p = f, *end = f + len;
    if (p == end || *p != 'L') {
        *why = "expected L<layer>:<experts>";
        return -1;
    }
    p++;
    uint64_t v = 0;
    const char *d = p;
    while (p < end && isdigit((unsigned char)*p) && v < MOELAB_MAX_LAYERS)
        v = v * 10 + (uint64_t)(*p++ - '0');
    if (p == d || v >= MOELAB_MAX_LAYERS || p == end || *p != ':') {
        *why = p == d || (p < end && *p != ':' && !isdigit((unsigned char)*p))
                   ? "expected L<layer>:<experts>"
                   : "layer number too large or ':' missing";
        return -1;
    }
    *layer = (uint32_t)v;
    p++;
    *n = 0;
    while (p < end) {
        v = 0;
        d = p;
        while (p < end && isdigit((unsigned char)*p) && v < MOELAB_MAX_EXPERTS)
            v = v * 10 + (uint64_t)(*p++ - '0');
        if (p == d || v >= MOELAB_MAX_EXPERTS) {
            *why = p == d ? "expected an expert number" : "expert number too large";
            return -1;
        }
        if (*n == max) {
            *why = "too many experts in one field";
            return -1;
        }
        ex[(*n)++] = (uint32_t)v;
        if (p < end) {
            if (*p != ',' || p + 1 == end) {
                *why = "expected ',' and an expert number";
                return -1;
            }
            p++;
        }
    }
    if (*n == 0) {
        *why = "no experts after ':'";
        return -1;
    }
    return 0;
}

int moelab_read(moelab_trace *t, const char *path, uint32_t experts)
{
    memset(t, 0, sizeof *t);
    FILE *f = fopen(path, "r");
    if (!f)
        return cli_error("%s: %s", path, strerror(errno));
    /* first the fields as read (layer, local expert), global ids once the expert count is known */
    char *line = NULL;
    size_t cap = 0, lineno = 0;
    ssize_t got;
    uint32_t max_layer = 0, max_expert = 0;
    uint32_t ex[256];
    int rc = CLI_EXIT_FAIL;
    unsigned char *seen = calloc(MOELAB_MAX_LAYERS, 1);
    uint32_t *layer_of = NULL; /* per step */
    size_t cap_layer = 0;
    if (!seen)
        goto oom;
    while ((got = getline(&line, &cap, f)) >= 0) {
        lineno++;
        char *p = line;
        while (*p == ' ' || *p == '\t')
            p++;
        if (*p == '#' || *p == '\n' || *p == '\r' || *p == 0)
            continue;
        memset(seen, 0, MOELAB_MAX_LAYERS);
        while (*p && *p != '\n' && *p != '\r') {
            size_t len = strcspn(p, " \t\r\n");
            uint32_t layer;
            size_t n;
            const char *why;
            if (parse_field(p, len, &layer, ex, &n, sizeof ex / sizeof ex[0], &why)) {
                cli_error("%s:%zu: '%.*s': %s", path, lineno, (int)(len > 40 ? 40 : len), p, why);
                rc = CLI_EXIT_USAGE;
                goto done;
            }
            if (seen[layer]) {
                cli_error("%s:%zu: layer %u appears twice on the line", path, lineno, layer);
                rc = CLI_EXIT_USAGE;
                goto done;
            }
            seen[layer] = 1;
            if (open_step(t) || grow((void **)&layer_of, &cap_layer, t->n_steps + 1,
                                     sizeof *layer_of))
                goto oom;
            for (size_t i = 0; i < n; i++) {
                int dup = 0;
                for (size_t j = 0; j < i; j++)
                    dup |= ex[j] == ex[i];
                if (dup)
                    continue;
                if (experts && ex[i] >= experts) {
                    cli_error("%s:%zu: expert %u of layer %u, but --experts is %u", path, lineno,
                              ex[i], layer, experts);
                    rc = CLI_EXIT_USAGE;
                    goto done;
                }
                if (ex[i] > max_expert)
                    max_expert = ex[i];
                if (add_id(t, ex[i]))
                    goto oom;
            }
            layer_of[t->n_steps] = layer;
            if (layer > max_layer)
                max_layer = layer;
            close_step(t);
            p += len;
            while (*p == ' ' || *p == '\t')
                p++;
        }
        t->tokens++;
    }
    if (ferror(f)) {
        cli_error("%s: %s", path, strerror(errno));
        goto done;
    }
    if (t->n_steps == 0) {
        cli_error("%s: no routing in the trace (lines of L<layer>:<experts>)", path);
        rc = CLI_EXIT_USAGE;
        goto done;
    }
    t->layers = max_layer + 1;
    t->experts = experts ? experts : max_expert + 1;
    if ((uint64_t)t->layers * t->experts > MOELAB_MAX_UNITS) {
        cli_error("%s: %u layers x %u experts: more than %u experts to simulate", path, t->layers,
                  t->experts, MOELAB_MAX_UNITS);
        rc = CLI_EXIT_USAGE;
        goto done;
    }
    for (size_t s = 0; s < t->n_steps; s++)
        for (size_t i = t->step_start[s]; i < t->step_start[s + 1]; i++)
            t->ids[i] += layer_of[s] * t->experts;
    rc = 0;
    goto done;
oom:
    cli_error("out of memory reading %s", path);
done:
    free(line);
    free(seen);
    free(layer_of);
    fclose(f);
    if (rc)
        moelab_trace_free(t);
    return rc;
}

/* ---- replay ------------------------------------------------------------------------------------ */

/* Pins the units of trace entries [A, B) (one step: they must all be held at once) and returns
 * their bytes. */
static uint64_t pin_step(const moelab_trace *t, size_t a, size_t b, const uint64_t *bytes,
                         unsigned char *pin)
{
    uint64_t need = 0;
    for (size_t i = a; i < b; i++) {
        pin[t->ids[i]] = 1;
        need += bytes[t->ids[i]];
    }
    return need;
}

static void finish(const moelab_trace *t, moelab_result *r)
{
    r->hit_rate = r->uses ? (double)r->hits / (double)r->uses : 0;
    r->bytes_per_token = t->tokens ? (double)r->bytes_read / (double)t->tokens : 0;
}

int moelab_belady(const moelab_trace *t, const uint64_t *bytes, uint64_t cap, moelab_result *r)
{
    memset(r, 0, sizeof *r);
    size_t units = (size_t)t->layers * t->experts;
    size_t *next = malloc((t->n_ids ? t->n_ids : 1) * sizeof *next);
    size_t *last = malloc(units * sizeof *last);
    size_t *nu = malloc(units * sizeof *nu);  /* per resident unit: its next use */
    uint32_t *res = malloc(units * sizeof *res);
    unsigned char *in = calloc(units, 1), *pin = calloc(units, 1);
    int rc = -1;
    if (!next || !last || !nu || !res || !in || !pin)
        goto out;
    for (size_t u = 0; u < units; u++)
        last[u] = SIZE_MAX; /* never again */
    for (size_t i = t->n_ids; i-- > 0;) {
        next[i] = last[t->ids[i]];
        last[t->ids[i]] = i;
    }
    size_t n_res = 0;
    uint64_t used = 0;
    for (size_t s = 0; s < t->n_steps; s++) {
        size_t a = t->step_start[s], b = t->step_start[s + 1];
        if (pin_step(t, a, b, bytes, pin) > cap)
            goto out;
        for (size_t i = a; i < b; i++) {
            uint32_t id = t->ids[i];
            r->uses++;
            if (in[id]) {
                r->hits++;
                nu[id] = next[i];
                continue;
            }
            while (used + bytes[id] > cap) {
                size_t best = SIZE_MAX;
                for (size_t j = 0; j < n_res; j++)
                    if (!pin[res[j]] && (best == SIZE_MAX || nu[res[j]] > nu[res[best]]))
                        best = j;
                if (best == SIZE_MAX)
                    goto out;
                in[res[best]] = 0;
                used -= bytes[res[best]];
                res[best] = res[--n_res];
            }
            in[id] = 1;
            res[n_res++] = id;
            nu[id] = next[i];
            used += bytes[id];
            r->bytes_read += bytes[id];
        }
        for (size_t i = a; i < b; i++)
            pin[t->ids[i]] = 0;
    }
    finish(t, r);
    rc = 0;
out:
    free(next);
    free(last);
    free(nu);
    free(res);
    free(in);
    free(pin);
    return rc;
}

/* The probabilities of the online bound, from the generating model (moelab_synth): a step keeps
 * each slot's expert of the layer's last step with probability P and fills the other slots by
 * Zipf draws that skip the experts already chosen. A unit is taken by those fresh draws with
 * G = 1 - (1 - q)^A, q its probability in one draw and A set per layer so that the G sum to the
 * expected fresh slots K (1 - P) (drawing without replacement, as in Brewer's approximation). */
static void fresh_probs(const moelab_trace *t, double *g)
{
    double want = t->used * (1 - t->locality);
    for (uint32_t l = 0; l < t->layers; l++) {
        const double *q = t->draw_p + (size_t)l * t->experts;
        double *gl = g + (size_t)l * t->experts;
        double lo = 0, hi = 1;
        for (;;) { /* the sum grows with A: find an upper end, then bisect */
            double sum = 0;
            for (uint32_t e = 0; e < t->experts; e++)
                sum += 1 - pow(1 - q[e], hi);
            if (sum >= want || hi > 1e9)
                break;
            hi *= 2;
        }
        for (int it = 0; it < 60; it++) {
            double a = (lo + hi) / 2, sum = 0;
            for (uint32_t e = 0; e < t->experts; e++)
                sum += 1 - pow(1 - q[e], a);
            if (sum < want)
                lo = a;
            else
                hi = a;
        }
        for (uint32_t e = 0; e < t->experts; e++)
            gl[e] = q[e] >= 1 ? 1 : 1 - pow(1 - q[e], hi);
    }
}

/* A unit's value: its first next use discounted by GAMMA per step of the trace, D steps until
 * its layer's next step, L steps between its layer's steps; used at a layer step with
 * G = fresh_probs', at the first with 1 - (1 - P)(1 - G) for a unit of the layer's last step. */
int moelab_online_bound(const moelab_trace *t, const uint64_t *bytes, uint64_t cap,
                        double horizon, moelab_result *r)
{
    memset(r, 0, sizeof *r);
    if (!t->draw_p || !(horizon > 0))
        return -1;
    double L = t->layers, gamma = exp2(-1 / (horizon * L)), gl = pow(gamma, L);
    size_t units = (size_t)t->layers * t->experts;
    double *g = malloc(units * sizeof *g), *miss_h = malloc(units * sizeof *miss_h);
    uint32_t *res = malloc(units * sizeof *res);
    unsigned char *in = calloc(units, 1), *pin = calloc(units, 1), *last = calloc(units, 1);
    uint32_t *prev = malloc((size_t)t->layers * (t->used + 1) * sizeof *prev);
    uint32_t *n_prev = calloc(t->layers, sizeof *n_prev);
    int rc = -1;
    if (!g || !miss_h || !res || !in || !pin || !last || !prev || !n_prev)
        goto out;
    fresh_probs(t, g);
    for (size_t u = 0; u < units; u++) /* from a layer step on, out of its last step */
        miss_h[u] = g[u] / (1 - (1 - g[u]) * gl);
    size_t n_res = 0;
    uint64_t used = 0;
    for (size_t s = 0; s < t->n_steps; s++) {
        size_t a = t->step_start[s], b = t->step_start[s + 1];
        uint32_t layer = t->ids[a] / t->experts;
        if (pin_step(t, a, b, bytes, pin) > cap)
            goto out;
        for (size_t i = a; i < b; i++) {
            uint32_t id = t->ids[i];
            r->uses++;
            if (in[id]) {
                r->hits++;
                continue;
            }
            while (used + bytes[id] > cap) {
                size_t best = SIZE_MAX;
                double best_v = 0;
                for (size_t j = 0; j < n_res; j++) {
                    uint32_t u = res[j];
                    if (pin[u])
                        continue;
                    uint32_t ul = u / t->experts;
                    double d = ul > layer ? ul - layer : ul + L - layer;
                    double p1 = last[u] && ul != layer
                                    ? 1 - (1 - t->locality) * (1 - g[u]) : g[u];
                    double v = pow(gamma, d) * (p1 + (1 - p1) * gl * miss_h[u]) /
                               (double)bytes[u];
                    if (best == SIZE_MAX || v < best_v) {
                        best = j;
                        best_v = v;
                    }
                }
                if (best == SIZE_MAX)
                    goto out;
                uint32_t v = res[best];
                in[v] = 0;
                used -= bytes[v];
                res[best] = res[--n_res];
            }
            in[id] = 1;
            res[n_res++] = id;
            used += bytes[id];
            r->bytes_read += bytes[id];
        }
        /* this step becomes the layer's last */
        uint32_t *pv = prev + (size_t)layer * (t->used + 1);
        for (uint32_t j = 0; j < n_prev[layer]; j++)
            last[pv[j]] = 0;
        n_prev[layer] = 0;
        for (size_t i = a; i < b; i++) {
            pin[t->ids[i]] = 0;
            last[t->ids[i]] = 1;
            if (n_prev[layer] <= t->used)
                pv[n_prev[layer]++] = t->ids[i];
        }
    }
    finish(t, r);
    rc = 0;
out:
    free(g);
    free(miss_h);
    free(res);
    free(in);
    free(pin);
    free(last);
    free(prev);
    free(n_prev);
    return rc;
}

int moelab_replay(const moelab_trace *t, const uint64_t *bytes, uint64_t cap,
                  ferry_cache_policy policy, uint32_t floor, moelab_result *r)
{
    memset(r, 0, sizeof *r);
    size_t units = (size_t)t->layers * t->experts;
    uint32_t *group = malloc(units * sizeof *group);
    if (!group)
        return FERRY_ENOMEM;
    for (size_t u = 0; u < units; u++)
        group[u] = (uint32_t)(u / t->experts);
    ferry_cache_sim *s;
    int rc = ferry_cache_sim_create(&s, policy, units, bytes, group, t->layers, cap, floor);
    free(group);
    if (rc)
        return rc;
    for (size_t i = 0; i < t->n_steps && !rc; i++)
        rc = ferry_cache_sim_use(s, t->ids + t->step_start[i],
                                 t->step_start[i + 1] - t->step_start[i]);
    ferry_cache_sim_stats st;
    ferry_cache_sim_get_stats(s, &st);
    ferry_cache_sim_destroy(s);
    r->uses = st.uses;
    r->hits = st.hits;
    r->bytes_read = st.bytes_read;
    finish(t, r);
    return rc;
}

/* ---- the bench ------------------------------------------------------------------------------- */

/* The block number of a tensor name ("blk.3.", "layers.3."), or -1. */
static long block_of(const char *name)
{
    const char *keys[] = {"blk.", "layers.", "h."};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        const char *p = strstr(name, keys[k]);
        if (p && (p == name || p[-1] == '.') && isdigit((unsigned char)p[strlen(keys[k])]))
            return strtol(p + strlen(keys[k]), NULL, 10);
    }
    return -1;
}

/* Unit sizes from M->model: tensors holding every expert of a layer ("*_exps*", GGUF) are split
 * evenly over the experts; tensors of one expert (".experts.<e>.") count for that one. */
static int sizes_from_model(moelab *m)
{
    moelab_trace *t = &m->trace;
    ferry_catalog *c = ferry_catalog_create();
    if (!c)
        return cli_error("out of memory");
    if (ferry_catalog_add(c, m->model, NULL)) {
        int rc = cli_fail(m->model, ferry_catalog_errmsg(c), -1);
        ferry_catalog_destroy(c);
        return rc;
    }
    size_t found = 0;
    for (size_t i = 0; i < ferry_catalog_count(c); i++) {
        ferry_tensor_info ti;
        if (ferry_catalog_tensor(c, i, &ti))
            continue;
        long blk = block_of(ti.name);
        if (blk < 0 || (uint64_t)blk >= t->layers)
            continue;
        const char *e = strstr(ti.name, ".experts.");
        if (strstr(ti.name, "_exps")) {
            for (uint32_t x = 0; x < t->experts; x++)
                m->bytes[(size_t)blk * t->experts + x] += ti.nbytes / t->experts;
            found++;
        } else if (e && isdigit((unsigned char)e[9])) {
            unsigned long x = strtoul(e + 9, NULL, 10);
            if (x < t->experts) {
                m->bytes[(size_t)blk * t->experts + x] += ti.nbytes;
                found++;
            }
        }
    }
    ferry_catalog_destroy(c);
    if (!found)
        return cli_error("%s: no expert tensors for the trace's layers (names with '_exps' or "
                         "'.experts.<n>.' in blk.<layer> / layers.<layer>)", m->model);
    for (size_t u = 0; u < (size_t)t->layers * t->experts; u++)
        if (!m->bytes[u])
            return cli_error("%s: no expert tensors for layer %zu, expert %zu of the trace",
                             m->model, u / t->experts, u % t->experts);
    return 0;
}

void moelab_free(moelab *m)
{
    moelab_trace_free(&m->trace);
    free(m->bytes);
    m->bytes = NULL;
}

int moelab_run(moelab *m)
{
    moelab_trace *t = &m->trace;
    int rc;
    if (m->trace_path) {
        if ((rc = moelab_read(t, m->trace_path, m->experts)))
            return rc;
    } else {
        uint32_t L = m->layers ? m->layers : 8, N = m->experts ? m->experts : 64,
                 K = m->used ? m->used : 2;
        if (K > N)
            return cli_usage_error("bench", "--experts-used %u is more than --experts %u", K, N);
        size_t T = m->tokens ? m->tokens : 4000;
        double s = m->zipf >= 0 ? m->zipf : 1.0, p = m->locality >= 0 ? m->locality : 0.5;
        if (moelab_synth(t, L, N, K, T, s, p, m->seed ? m->seed : 1))
            return cli_error("out of memory making the trace");
    }
    size_t units = (size_t)t->layers * t->experts;
    m->bytes = calloc(units, sizeof *m->bytes);
    if (!m->bytes)
        return cli_error("out of memory");
    if (m->model) {
        if ((rc = sizes_from_model(m)))
            return rc;
    } else {
        for (size_t u = 0; u < units; u++)
            m->bytes[u] = m->expert_bytes ? m->expert_bytes : 1u << 20;
    }
    m->total_bytes = 0;
    uint64_t largest_step = 0;
    for (size_t u = 0; u < units; u++) {
        m->total_bytes += m->bytes[u];
        m->sizes_differ |= m->bytes[u] != m->bytes[0];
    }
    for (size_t s = 0; s < t->n_steps; s++) {
        uint64_t b = 0;
        for (size_t i = t->step_start[s]; i < t->step_start[s + 1]; i++)
            b += m->bytes[t->ids[i]];
        if (b > largest_step)
            largest_step = b;
    }
    m->ferry_kind = ferry_cache_policy_name(FERRY_CACHE_FERRY);
    uint64_t slots[MOELAB_MAX_SIZES] = {units / 8, units / 4, units / 2, m->cache_slots};
    size_t n = m->cache_slots ? 4 : 3;
    double mean = (double)m->total_bytes / (double)units;
    m->n_sizes = 0;
    for (size_t i = 0; i < n; i++) {
        moelab_size *z = &m->sizes[m->n_sizes];
        z->slots = slots[i] ? slots[i] : 1;
        z->capacity = (uint64_t)((double)z->slots * mean + 0.5);
        if (z->capacity < largest_step) {
            if (i == 3)
                return cli_usage_error("bench", "--cache %llu: %s holds fewer bytes than the "
                                       "experts one layer uses for one token",
                                       (unsigned long long)m->cache_slots,
                                       m->cache_slots == 1 ? "one expert" : "that many experts");
            continue; /* the fraction is too small for this trace */
        }
        for (int p = 0; p < FERRY_CACHE_POLICY_COUNT; p++)
            if ((rc = moelab_replay(t, m->bytes, z->capacity, (ferry_cache_policy)p, m->floor,
                                    &z->r[p])))
                return cli_error("replay with %s: %s", ferry_cache_policy_name(p),
                                 ferry_strerror(rc));
        if (moelab_belady(t, m->bytes, z->capacity, &z->r[MOELAB_BELADY]))
            return cli_error("out of memory replaying the trace");
        if (t->draw_p && moelab_online_bound(t, m->bytes, z->capacity, MOELAB_BOUND_HORIZON,
                                             &z->bound))
            return cli_error("out of memory replaying the trace");
        m->n_sizes++;
    }
    m->has_bound = t->draw_p != NULL;
    if (!m->n_sizes)
        return cli_usage_error("bench", "half of the %zu experts holds fewer bytes than the "
                               "experts one layer uses for one token", units);
    return 0;
}
