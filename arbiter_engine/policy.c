/*
 * policy.c: GpuArbiter (fastgshare/arbitration.py) in C; see engine_abi.h. Each function names the
 * Python method it follows; the comments there explain the rules.
 */
#include "engine_abi.h"

#include "grow.h"

#include <stdlib.h>
#include <string.h>

#define TIME_UNITS 1000 /* keys.TIME_UNITS: permille */
#define SM_UNITS 100    /* keys.SM_UNITS: percent */

typedef struct span {
    int64_t start, end;
} span;

enum { WAITING, HOLDING, SETS }; /* the clients that wait for a token, and those that hold one */

typedef struct member_set {
    uint32_t *ids;
    uint32_t count;
} member_set;

typedef struct client {
    bool present;
    fgs_share share;
    uint64_t arrival;
    /* history: a ring of grants, oldest first; never overlapping */
    span *history;
    uint32_t head, count, capacity;
    int64_t history_ns;
    int64_t waiting_since;
    int64_t holding_until;
    int64_t credit; /* ns x TIME_UNITS */
    bool credit_started;
    int64_t credit_at;
    int32_t slot[SETS]; /* its position in each of the policy's sets, -1 outside it */
} client;

typedef struct ranked {
    int group; /* 0: below its request, 1: the others */
    double starvation;
    int64_t usage;
    int64_t since;
    uint64_t arrival;
    uint32_t client;
} ranked;

struct fgs_policy {
    int64_t window_ns, min_token_ns;
    bool mps_enabled;
    uint64_t arrivals;
    client *clients;
    uint32_t client_capacity;
    member_set sets[SETS];
    uint32_t set_capacity;
    /* scratch for schedule() */
    ranked *ranked;
    fgs_grant *grants;
    int64_t *points;
    uint32_t points_capacity;
};

/* Python's // for a positive divisor: rounds towards minus infinity. */
static int64_t floor_div(int64_t a, int64_t b)
{
    int64_t q = a / b;
    return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

static client *lookup(const fgs_policy *p, uint32_t id)
{
    if (id >= p->client_capacity || !p->clients[id].present)
        return NULL;
    return &p->clients[id];
}

fgs_policy *fgs_policy_new(int64_t window_ns, int64_t min_token_ns, bool mps_enabled)
{
    if (window_ns <= 0 || min_token_ns <= 0 || min_token_ns > window_ns)
        return NULL;
    fgs_policy *p = calloc(1, sizeof *p);
    if (p == NULL)
        return NULL;
    p->window_ns = window_ns;
    p->min_token_ns = min_token_ns;
    p->mps_enabled = mps_enabled;
    return p;
}

void fgs_policy_free(fgs_policy *p)
{
    if (p == NULL)
        return;
    for (uint32_t i = 0; i < p->client_capacity; i++)
        free(p->clients[i].history);
    free(p->clients);
    for (int set = 0; set < SETS; set++)
        free(p->sets[set].ids);
    free(p->ranked);
    free(p->grants);
    free(p->points);
    free(p);
}

/* --- the client table and the waiting/holder sets ---------------------------------------- */

static int grow_sets(fgs_policy *p, uint32_t needed)
{
    if (needed <= p->set_capacity)
        return 0;
    uint32_t old = p->set_capacity, capacity = grown_capacity(old, needed, 16);
    for (int set = 0; set < SETS; set++) {
        uint32_t *ids = resized(p->sets[set].ids, sizeof *ids, old, capacity);
        if (ids == NULL)
            return -2;
        p->sets[set].ids = ids;
    }
    ranked *r = resized(p->ranked, sizeof *r, old, capacity);
    if (r == NULL)
        return -2;
    p->ranked = r;
    fgs_grant *g = resized(p->grants, sizeof *g, old, capacity);
    if (g == NULL)
        return -2;
    p->grants = g;
    p->set_capacity = capacity;
    return 0;
}

/* Sets without order: a member leaves by swapping the last one into its place. */
static void join_set(fgs_policy *p, int set, uint32_t id)
{
    member_set *members = &p->sets[set];
    p->clients[id].slot[set] = (int32_t)members->count;
    members->ids[members->count++] = id;
}

static void leave_set(fgs_policy *p, int set, client *c)
{
    member_set *members = &p->sets[set];
    uint32_t slot = (uint32_t)c->slot[set];
    uint32_t last = members->ids[--members->count];
    members->ids[slot] = last;
    p->clients[last].slot[set] = (int32_t)slot;
    c->slot[set] = -1;
}

static bool in_set(const client *c, int set) { return c->slot[set] >= 0; }

int32_t fgs_policy_add(fgs_policy *p, uint32_t id, fgs_share share)
{
    if (lookup(p, id) != NULL)
        return -1;
    if (id >= p->client_capacity) {
        uint32_t capacity = grown_capacity(p->client_capacity, id + 1, 16);
        client *clients = resized(p->clients, sizeof *clients, p->client_capacity, capacity);
        if (clients == NULL)
            return -2;
        p->clients = clients;
        p->client_capacity = capacity;
    }
    uint32_t members = 0;
    for (uint32_t i = 0; i < p->client_capacity; i++)
        members += p->clients[i].present;
    if (grow_sets(p, members + 1) != 0)
        return -2;
    client *c = &p->clients[id];
    span *history = c->history; /* a slot's ring is kept for its next client */
    uint32_t capacity = c->capacity;
    memset(c, 0, sizeof *c);
    c->history = history;
    c->capacity = capacity;
    c->present = true;
    c->share = share;
    c->arrival = ++p->arrivals;
    c->slot[WAITING] = c->slot[HOLDING] = -1;
    return 0;
}

int32_t fgs_policy_set_share(fgs_policy *p, uint32_t id, fgs_share share)
{
    client *c = lookup(p, id);
    if (c == NULL)
        return -1;
    c->share = share;
    return 0;
}

int32_t fgs_policy_get_share(const fgs_policy *p, uint32_t id, fgs_share *share)
{
    client *c = lookup(p, id);
    if (c == NULL)
        return -1;
    *share = c->share;
    return 0;
}

void fgs_policy_remove(fgs_policy *p, uint32_t id)
{
    client *c = lookup(p, id);
    if (c == NULL)
        return;
    if (in_set(c, WAITING))
        leave_set(p, WAITING, c);
    if (in_set(c, HOLDING))
        leave_set(p, HOLDING, c);
    c->present = false;
    c->head = c->count = 0;
    c->history_ns = 0;
}

/* --- one client's history and credit (_Client) -------------------------------------------- */

static span *history_at(client *c, uint32_t index) { return &c->history[(c->head + index) % c->capacity]; }

static int add_grant(client *c, int64_t start, int64_t end)
{
    if (c->count == c->capacity) {
        uint32_t capacity = c->capacity ? c->capacity * 2 : 8;
        span *history = malloc(capacity * sizeof *history);
        if (history == NULL)
            return -2;
        for (uint32_t i = 0; i < c->count; i++)
            history[i] = *history_at(c, i);
        free(c->history);
        c->history = history;
        c->head = 0;
        c->capacity = capacity;
    }
    *history_at(c, c->count++) = (span){start, end};
    c->history_ns += end - start;
    c->credit -= (end - start) * TIME_UNITS;
    return 0;
}

static void set_last_grant_end(client *c, int64_t end)
{
    span *last = history_at(c, c->count - 1);
    int64_t old_end = last->end;
    last->end = end;
    c->history_ns -= old_end - end;
    c->credit += (old_end - end) * TIME_UNITS;
}

static int64_t earn(client *c, int64_t now, int64_t window)
{
    int64_t limit = c->share.limit_permille;
    if (limit == 0) /* parked: earns nothing, loses nothing; the gap is earned at the share it wakes to */
        return c->credit;
    int64_t cap = limit * window;
    if (!c->credit_started) {
        c->credit = cap;
    } else if (now > c->credit_at) {
        int64_t gap = now - c->credit_at;
        /* min(cap, credit + gap * limit) without overflowing on a long idle gap */
        if (c->credit >= cap)
            c->credit = cap;
        else if (gap >= (cap - c->credit) / limit + 1)
            c->credit = cap;
        else
            c->credit = min64(cap, c->credit + gap * limit);
    }
    if (!c->credit_started || now > c->credit_at) {
        c->credit_started = true;
        c->credit_at = now;
    }
    return c->credit;
}

static void forget_before(client *c, int64_t time)
{
    while (c->count && history_at(c, 0)->end <= time) {
        span *first = history_at(c, 0);
        c->history_ns -= first->end - first->start;
        c->head = (c->head + 1) % c->capacity;
        c->count--;
    }
}

static int64_t client_usage(client *c, int64_t now, int64_t window)
{
    int64_t cutoff = now - window;
    if (!c->count)
        return 0;
    if (history_at(c, 0)->end <= cutoff) {
        forget_before(c, cutoff);
        if (!c->count)
            return 0;
    }
    int64_t usage = c->history_ns;
    span first = *history_at(c, 0);
    if (first.start < cutoff)
        usage -= (first.end < cutoff ? first.end : cutoff) - first.start;
    span last = *history_at(c, c->count - 1);
    if (last.end > now)
        usage -= last.end - (last.start > now ? last.start : now);
    return usage > 0 ? usage : 0;
}

/* _usage: the plain sum over the history, for _when_usage_at_most */
static int64_t sum_usage(client *c, int64_t now, int64_t window)
{
    int64_t start = now - window, total = 0;
    for (uint32_t i = 0; i < c->count; i++) {
        span *g = history_at(c, i);
        total += max64(0, min64(g->end, now) - max64(g->start, start));
    }
    return total;
}

static int compare_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* _when_usage_at_most: the earliest time >= now at which the window's usage has fallen to target. */
static int64_t when_usage_at_most(fgs_policy *p, client *c, int64_t target, int64_t now, int64_t window)
{
    if (sum_usage(c, now, window) <= target)
        return now;
    uint32_t needed = 2 * c->count;
    if (needed > p->points_capacity) {
        int64_t *points = realloc(p->points, needed * sizeof *points);
        if (points == NULL)
            return now; /* no memory: look again at once */
        p->points = points;
        p->points_capacity = needed;
    }
    uint32_t n = 0;
    for (uint32_t i = 0; i < c->count; i++) {
        span *g = history_at(c, i);
        if (g->start + window > now)
            p->points[n++] = g->start + window;
        if (g->end + window > now)
            p->points[n++] = g->end + window;
    }
    qsort(p->points, n, sizeof *p->points, compare_i64);
    int64_t previous = now;
    for (uint32_t i = 0; i < n; i++) {
        int64_t point = p->points[i];
        if (i > 0 && point == p->points[i - 1])
            continue;
        if (sum_usage(c, point, window) <= target) {
            int64_t high = sum_usage(c, previous, window), low = sum_usage(c, point, window);
            if (high == low)
                return point;
            return previous - floor_div(-(high - target) * (point - previous), high - low);
        }
        previous = point;
    }
    return n ? p->points[n - 1] : now;
}

/* --- the protocol (GpuArbiter) ------------------------------------------------------------ */

int32_t fgs_policy_release(fgs_policy *p, uint32_t id, int64_t now, int64_t used)
{
    client *c = lookup(p, id);
    if (c == NULL)
        return -1;
    if (c->count) {
        int64_t start = history_at(c, c->count - 1)->start;
        earn(c, now, p->window_ns);
        /* max(start, min(start + max(used, 0), now)), without overflowing on a huge report */
        int64_t end = used <= 0 || now <= start ? start : used >= now - start ? now : start + used;
        set_last_grant_end(c, end);
    }
    if (in_set(c, HOLDING))
        leave_set(p, HOLDING, c);
    return 0;
}

int32_t fgs_policy_request(fgs_policy *p, uint32_t id, int64_t now, int64_t used)
{
    if (fgs_policy_release(p, id, now, used) != 0)
        return -1;
    client *c = &p->clients[id];
    if (!in_set(c, WAITING)) {
        c->waiting_since = now;
        join_set(p, WAITING, id);
    }
    return 0;
}

int32_t fgs_policy_is_waiting(const fgs_policy *p, uint32_t id)
{
    client *c = lookup(p, id);
    return c == NULL ? -1 : in_set(c, WAITING);
}

int64_t fgs_policy_holding_until(const fgs_policy *p, uint32_t id)
{
    client *c = lookup(p, id);
    return c == NULL || !in_set(c, HOLDING) ? FGS_NO_TIME : c->holding_until;
}

int64_t fgs_policy_usage(fgs_policy *p, uint32_t id, int64_t now)
{
    client *c = lookup(p, id);
    return c == NULL ? -1 : client_usage(c, now, p->window_ns);
}

bool fgs_policy_anyone_waiting(const fgs_policy *p) { return p->sets[WAITING].count > 0; }

static int64_t request_ns(const fgs_policy *p, fgs_share s) { return s.request_permille * p->window_ns / TIME_UNITS; }
static int64_t limit_ns(const fgs_policy *p, fgs_share s) { return s.limit_permille * p->window_ns / TIME_UNITS; }

static int64_t token_ns(const fgs_policy *p, fgs_share s, int64_t usage)
{
    int64_t base = max64(request_ns(p, s), p->min_token_ns);
    if (s.limit_permille >= TIME_UNITS)
        return base;
    int64_t limit = limit_ns(p, s);
    return max64(min64(base, limit - usage), min64(p->min_token_ns, limit));
}

static int compare_ranked(const void *a, const void *b)
{
    const ranked *x = a, *y = b;
    if (x->group != y->group)
        return x->group - y->group;
    if (x->group == 0) {
        if (x->starvation != y->starvation)
            return x->starvation > y->starvation ? -1 : 1; /* most starved first */
    } else if (x->usage != y->usage) {
        return x->usage < y->usage ? -1 : 1;
    }
    if (x->since != y->since)
        return x->since < y->since ? -1 : 1;
    return (x->arrival > y->arrival) - (x->arrival < y->arrival);
}

typedef struct wake {
    int64_t now, at; /* the earliest candidate after now, FGS_NO_TIME if none */
} wake;

static void wake_candidate(wake *w, int64_t t)
{
    if (t != FGS_NO_TIME && t > w->now && (w->at == FGS_NO_TIME || t < w->at))
        w->at = t;
}

/* _eligible_in_order: fills p->ranked; returns how many. */
static uint32_t eligible_in_order(fgs_policy *p, int64_t now, wake *w)
{
    uint32_t n = 0;
    int64_t window = p->window_ns, min_token = p->min_token_ns;
    for (uint32_t i = 0; i < p->sets[WAITING].count; i++) {
        uint32_t id = p->sets[WAITING].ids[i];
        client *c = &p->clients[id];
        int64_t usage = client_usage(c, now, window);
        fgs_share s = c->share;
        if (s.limit_permille < TIME_UNITS) {
            int64_t limit = s.limit_permille * window / TIME_UNITS;
            int64_t need = (min_token < limit ? min_token : limit) / 2;
            if (limit - usage < (need > 1 ? need : 1)) {
                wake_candidate(w, when_usage_at_most(p, c, limit - need, now, window));
                continue;
            }
            int64_t credit = earn(c, now, window);
            if (credit < 0) { /* a kernel ran past its token: paid back before the next one */
                wake_candidate(w, now - floor_div(credit, s.limit_permille));
                continue;
            }
        }
        int64_t request = s.request_permille * window / TIME_UNITS;
        ranked *r = &p->ranked[n++];
        r->usage = usage;
        r->since = c->waiting_since;
        r->arrival = c->arrival;
        r->client = id;
        if (usage < request) {
            r->group = 0;
            r->starvation = (double)(request - usage) / (double)request;
        } else {
            r->group = 1;
            r->starvation = 0;
        }
    }
    if (n > 1)
        qsort(p->ranked, n, sizeof *p->ranked, compare_ranked);
    return n;
}

int32_t fgs_policy_schedule(fgs_policy *p, int64_t now, const fgs_grant **grants, int64_t *wake_at_ns)
{
    wake w = {now, FGS_NO_TIME};
    int32_t sm_taken = 0;
    bool anyone_holding = false;
    /* _release_expired */
    for (uint32_t i = 0; i < p->sets[HOLDING].count;) {
        client *c = &p->clients[p->sets[HOLDING].ids[i]];
        if (c->holding_until <= now) {
            leave_set(p, HOLDING, c); /* moves the last holder into slot i */
            continue;
        }
        sm_taken += c->share.sm_percent;
        wake_candidate(&w, c->holding_until);
        anyone_holding = true;
        i++;
    }
    int count = 0;
    if (p->sets[WAITING].count) {
        uint32_t n = eligible_in_order(p, now, &w);
        for (uint32_t i = 0; i < n; i++) {
            uint32_t id = p->ranked[i].client;
            client *c = &p->clients[id];
            fgs_share s = c->share;
            int64_t usage = p->ranked[i].usage;
            bool fits = p->mps_enabled ? sm_taken + s.sm_percent <= SM_UNITS : !anyone_holding;
            if (!fits) {
                if (usage < request_ns(p, s))
                    break; /* a starved client waits for the GPU to drain; nobody jumps ahead of it */
                continue;
            }
            int64_t token = token_ns(p, s, usage), end = now + token;
            earn(c, now, p->window_ns);
            if (add_grant(c, now, end) != 0)
                return -2;
            leave_set(p, WAITING, c);
            c->holding_until = end;
            join_set(p, HOLDING, id);
            sm_taken += s.sm_percent;
            anyone_holding = true;
            p->grants[count++] = (fgs_grant){id, token};
            wake_candidate(&w, end);
        }
    }
    *grants = p->grants;
    *wake_at_ns = w.at;
    return count;
}
