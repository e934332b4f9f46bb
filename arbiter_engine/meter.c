/*
 * meter.c: UsageMeter (fastgshare/usage.py) in C; see engine_abi.h.
 */
#include "engine_abi.h"

#include "grow.h"

#include <stdlib.h>
#include <string.h>

#define SLOT_NS 1000000 /* uses ending in the same millisecond are kept as one */
#define BUSY_COMPACT 4096 /* a GPU with this many busy intervals drops those out of every window */
#define MAX_USE_NS ((int64_t)1 << 61) /* 73 years: more than any window, far from overflowing */

typedef struct use {
    int64_t end, used;
} use;

typedef struct interval {
    int64_t start, end;
} interval;

struct fgs_pod_meter {
    fgs_pod_meter *next;
    int gpu;
    char pod[FGS_MAX_POD_NAME];
    use *uses; /* a ring, oldest first */
    uint32_t head, count, capacity;
    int64_t used_ns_total, throttled_ns_total, wait_sum_ns;
    int64_t wait_counts[FGS_MAX_WAIT_BUCKETS + 1];
    bool asked, asked_throttled;
    int64_t asked_at;
    int64_t last_use_ns;
    bool present;
};

typedef struct busy {
    bool known;
    interval *intervals;
    uint32_t count, capacity;
} busy;

struct fgs_meter {
    int64_t window_ns;
    int64_t bounds_ns[FGS_MAX_WAIT_BUCKETS];
    int buckets, gpus;
    fgs_pod_meter *pods;
    busy *busy;
    fgs_pod_usage *out;
    uint32_t out_capacity;
};

int64_t fgs_token_charge(int64_t granted_at, int64_t token_ns, int64_t now, uint64_t reported)
{
    if (granted_at > now || (granted_at < 0 && now > INT64_MAX + granted_at))
        return 0; /* a clock that went back, or times no clock gives */
    int64_t since = now - granted_at;
    int64_t held = token_ns < since ? (token_ns > 0 ? token_ns : 0) : since;
    int64_t overrun = reported < (uint64_t)since ? (int64_t)reported : since;
    return overrun > held ? overrun : held;
}

/* a + b for b >= 0, at most INT64_MAX */
static int64_t saturating_add(int64_t a, int64_t b) { return a > INT64_MAX - b ? INT64_MAX : a + b; }

fgs_meter *fgs_meter_new(int64_t window_ns, const int64_t *bounds_ns, int32_t buckets, int32_t gpus)
{
    if (window_ns <= 0 || buckets < 0 || buckets > FGS_MAX_WAIT_BUCKETS || gpus < 0)
        return NULL;
    fgs_meter *m = calloc(1, sizeof *m);
    if (m == NULL)
        return NULL;
    m->busy = calloc((size_t)gpus + 1, sizeof *m->busy);
    if (m->busy == NULL) {
        free(m);
        return NULL;
    }
    m->window_ns = window_ns;
    memcpy(m->bounds_ns, bounds_ns, (size_t)buckets * sizeof *bounds_ns);
    m->buckets = buckets;
    m->gpus = gpus;
    return m;
}

void fgs_meter_free(fgs_meter *m)
{
    if (m == NULL)
        return;
    for (fgs_pod_meter *pod = m->pods, *next; pod != NULL; pod = next) {
        next = pod->next;
        free(pod->uses);
        free(pod);
    }
    for (int i = 0; i < m->gpus; i++)
        free(m->busy[i].intervals);
    free(m->busy);
    free(m->out);
    free(m);
}

fgs_pod_meter *fgs_meter_join(fgs_meter *m, int32_t gpu, const char *name)
{
    if (gpu < 0 || gpu >= m->gpus)
        return NULL;
    m->busy[gpu].known = true;
    for (fgs_pod_meter *pod = m->pods; pod != NULL; pod = pod->next)
        if (pod->gpu == gpu && strcmp(pod->pod, name) == 0) {
            pod->present = true;
            return pod;
        }
    fgs_pod_meter *pod = calloc(1, sizeof *pod);
    if (pod == NULL)
        return NULL;
    pod->gpu = gpu;
    strncpy(pod->pod, name, sizeof pod->pod - 1);
    pod->present = true;
    pod->next = m->pods;
    m->pods = pod;
    return pod;
}

void fgs_meter_leave(fgs_pod_meter *pod)
{
    pod->present = false;
    pod->asked = false;
}

void fgs_meter_asked(fgs_pod_meter *pod, int64_t now, bool at_limit)
{
    if (!pod->asked) {
        pod->asked = true;
        pod->asked_at = now;
        pod->asked_throttled = at_limit;
    }
}

void fgs_meter_granted(const fgs_meter *m, fgs_pod_meter *pod, int64_t now)
{
    if (!pod->asked)
        return;
    int64_t wait = now - pod->asked_at;
    if (wait < 0)
        wait = 0;
    pod->asked = false;
    pod->wait_sum_ns += wait;
    int index = 0; /* the first bucket whose bound is >= the wait (bisect_left) */
    while (index < m->buckets && m->bounds_ns[index] < wait)
        index++;
    pod->wait_counts[index]++;
    if (pod->asked_throttled)
        pod->throttled_ns_total = saturating_add(pod->throttled_ns_total, wait);
}

static use *use_at(fgs_pod_meter *pod, uint32_t index) { return &pod->uses[(pod->head + index) % pod->capacity]; }

static void add_busy(busy *b, int64_t start, int64_t end, int64_t window);

void fgs_meter_used(fgs_meter *m, fgs_pod_meter *pod, int64_t start, int64_t used)
{
    if (used <= 0)
        return;
    if (used > MAX_USE_NS)
        used = MAX_USE_NS; /* a report the engine never passes (fgs_token_charge) */
    if (start > 0 && used > INT64_MAX - start)
        used = INT64_MAX - start; /* so that start + used cannot overflow */
    int64_t end = start + used;
    pod->used_ns_total = saturating_add(pod->used_ns_total, used);
    if (end > pod->last_use_ns)
        pod->last_use_ns = end;
    add_busy(&m->busy[pod->gpu], start, end, m->window_ns);
    m->busy[pod->gpu].known = true;
    /* Uses that ended a window before this one started are outside every later snapshot's window
     * (a snapshot is taken at or after the start of every use reported): drop them now, so a meter
     * nobody reads stays bounded. */
    while (pod->count && use_at(pod, 0)->end <= start - m->window_ns) {
        pod->head = (pod->head + 1) % pod->capacity;
        pod->count--;
    }
    if (pod->count) {
        use *last = use_at(pod, pod->count - 1);
        if (end >= last->end && end / SLOT_NS == last->end / SLOT_NS) {
            last->end = end;
            last->used = saturating_add(last->used, used);
            return;
        }
    }
    if (pod->count == pod->capacity) {
        uint32_t capacity = pod->capacity ? pod->capacity * 2 : 16;
        use *uses = malloc(capacity * sizeof *uses);
        if (uses == NULL)
            return; /* no memory: this use is not in the window's share (it is in the totals) */
        for (uint32_t i = 0; i < pod->count; i++)
            uses[i] = *use_at(pod, i);
        free(pod->uses);
        pod->uses = uses;
        pod->head = 0;
        pod->capacity = capacity;
    }
    *use_at(pod, pod->count++) = (use){end, used};
}

/* Drop the intervals that ended by `after` (from the front: they are sorted and disjoint). */
static void drop_busy_before(busy *b, int64_t after)
{
    uint32_t first = 0;
    while (first < b->count && b->intervals[first].end <= after)
        first++;
    if (first) {
        memmove(b->intervals, b->intervals + first, (b->count - first) * sizeof *b->intervals);
        b->count -= first;
    }
}

/* Keep the union: the intervals stay sorted by start and disjoint. Uses arrive nearly in order of
 * their start, so the place is found from the end in a step or two, and nothing is ever sorted. */
static void add_busy(busy *b, int64_t start, int64_t end, int64_t window)
{
    uint32_t i = b->count;
    while (i > 0 && b->intervals[i - 1].start > start)
        i--;
    if (i > 0 && b->intervals[i - 1].end >= start) { /* joins the one before it */
        i--;
        if (end > b->intervals[i].end)
            b->intervals[i].end = end;
    } else {
        if (b->count >= BUSY_COMPACT && b->count == b->capacity) {
            drop_busy_before(b, start - window); /* as for a pod's uses: what no later snapshot can see goes */
            i = b->count;
            while (i > 0 && b->intervals[i - 1].start > start)
                i--;
        }
        if (b->count == b->capacity) {
            uint32_t capacity = grown_capacity(b->capacity, b->count + 1, 64);
            interval *intervals = resized(b->intervals, sizeof *intervals, b->capacity, capacity);
            if (intervals == NULL)
                return;
            b->intervals = intervals;
            b->capacity = capacity;
        }
        memmove(b->intervals + i + 1, b->intervals + i, (b->count - i) * sizeof *b->intervals);
        b->intervals[i] = (interval){start, end};
        b->count++;
    }
    /* it may now reach the ones after it */
    uint32_t next = i + 1;
    while (next < b->count && b->intervals[next].start <= b->intervals[i].end) {
        if (b->intervals[next].end > b->intervals[i].end)
            b->intervals[i].end = b->intervals[next].end;
        next++;
    }
    if (next > i + 1) {
        memmove(b->intervals + i + 1, b->intervals + next, (b->count - next) * sizeof *b->intervals);
        b->count -= next - i - 1;
    }
}

int32_t fgs_meter_snapshot(fgs_meter *m, int64_t now, const fgs_pod_usage **pods, int64_t *busy_ns)
{
    int64_t start = now - m->window_ns;
    uint32_t n = 0;
    for (fgs_pod_meter **link = &m->pods; *link != NULL;) {
        fgs_pod_meter *pod = *link;
        while (pod->count && use_at(pod, 0)->end <= start) {
            pod->head = (pod->head + 1) % pod->capacity;
            pod->count--;
        }
        if (!pod->present && !pod->count && pod->last_use_ns <= start) {
            *link = pod->next;
            free(pod->uses);
            free(pod);
            continue;
        }
        link = &pod->next;
        n++;
    }
    if (n > m->out_capacity) {
        fgs_pod_usage *out = realloc(m->out, n * sizeof *out);
        if (out == NULL)
            return -1;
        m->out = out;
        m->out_capacity = n;
    }
    uint32_t i = 0;
    for (fgs_pod_meter *pod = m->pods; pod != NULL; pod = pod->next, i++) {
        fgs_pod_usage *u = &m->out[i];
        memset(u, 0, sizeof *u);
        u->gpu = pod->gpu;
        memcpy(u->pod, pod->pod, sizeof u->pod);
        for (uint32_t k = 0; k < pod->count; k++) {
            use *x = use_at(pod, k);
            if (x->end > start)
                u->in_window_ns += x->used < x->end - start ? x->used : x->end - start;
        }
        u->used_ns_total = pod->used_ns_total;
        u->throttled_ns_total = pod->throttled_ns_total;
        u->wait_sum_ns = pod->wait_sum_ns;
        memcpy(u->wait_counts, pod->wait_counts, sizeof u->wait_counts);
    }
    for (int g = 0; g < m->gpus; g++) {
        busy *b = &m->busy[g];
        if (!b->known) {
            busy_ns[g] = -1;
            continue;
        }
        drop_busy_before(b, start);
        int64_t total = 0;
        for (uint32_t k = 0; k < b->count; k++) {
            int64_t from = b->intervals[k].start > start ? b->intervals[k].start : start;
            int64_t to = b->intervals[k].end < now ? b->intervals[k].end : now;
            if (to > from)
                total += to - from;
        }
        busy_ns[g] = total;
    }
    *pods = m->out;
    return (int)n;
}
