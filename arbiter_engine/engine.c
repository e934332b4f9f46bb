/*
 * engine.c: the arbiter's native engine; see engine_abi.h. The token path (token_request, pump,
 * detach) follows ArbiterServer._token, _pump and _disconnect as they were in Python.
 */
#define _GNU_SOURCE
#include "engine_abi.h"

#include "fastgshare_byteorder.h"
#include "fastgshare_protocol.h"
#include "grow.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define IN_CAPACITY (2 * FGS_MAX_FRAME)
#define READ_CHUNK 1024        /* bytes read from one connection per turn (see read_size) */
#define OUT_HIGH (64 * 1024)   /* a connection whose replies pile up over this is not read */
#define EVENTS_HIGH 64         /* nor one with this many events waiting for Python ... */
#define EVENTS_LOW 32          /* ... until they are down to this */
#define ACCEPT_RETRY_NS 100000000 /* out of descriptors: try accepting again after 100 ms */
#define TOKEN_FRAME (FGS_HEADER_SIZE + 8)
#define PING_REPLY_FRAME FGS_HEADER_SIZE
#define HEALTH_REPLY_FRAME (FGS_HEADER_SIZE + 8)
#define MAX_GROUP (1u << 20) /* the highest group number Python may give */
#define NO_GROUP UINT32_MAX

enum { TAG_LISTEN = 1, TAG_STOP = 2, TAG_TIMER = 3 };

typedef struct pod pod;
typedef struct gpu gpu;

typedef struct conn {
    uint64_t id;
    int fd;
    pod *pod;           /* set by fgs_engine_register */
    struct conn *next_in_queue;
    bool queued;        /* in its pod's queue, waiting for the pod's token */
    bool has_request;
    uint32_t request_id; /* of the unanswered TOKEN */
    bool closing;       /* Python closed it: close once the output has left */
    bool broken;        /* unframeable input was handed to Python: read no more */
    bool write_failed;
    bool health;        /* the liveness probe's private connection: PING only, no events */
    bool batching;      /* replies wait in out until the frames read are all handled */
    uint32_t group;     /* whose events these are (Python's number for the peer); 0: not yet said */
    uint32_t events_waiting; /* events of this connection in the queue for Python */
    uint32_t epoll_mask;
    uint32_t in_length;
    uint8_t in[IN_CAPACITY];
    uint8_t *out;
    uint32_t out_length, out_capacity;
} conn;

struct pod {
    pod *next;
    gpu *gpu;
    uint32_t client;    /* its id in the GPU's scheduler */
    fgs_share share;
    int connections;
    conn *queue_head, *queue_tail;
    conn *holder;
    int64_t granted_at, token_ns;
    bool unasked;
    fgs_pod_meter *meter;
    char name[FGS_MAX_POD_NAME];
};

struct gpu {
    int index;
    fgs_policy *policy;
    pod *pods;
    pod **unasked; /* pods that may have a connection queued that the scheduler does not see waiting */
    uint32_t unasked_count, unasked_capacity;
    uint32_t *free_clients;
    uint32_t free_count, free_capacity, next_client;
    pod **by_client; /* the pod of each scheduler client id */
    uint32_t by_client_capacity;
    int64_t wake_at;
};

typedef struct queued_event {
    struct queued_event *next;
    fgs_event event;
    uint8_t data[];
} queued_event;

/* The events of one peer (a pod, or a process outside pods) waiting for Python, oldest first. The
 * groups with events take turns (next_ready links them in a ring), so a peer with thousands of
 * events waiting delays another's next one by one event, not by all of its own. */
typedef struct group {
    queued_event *head, *tail;
    uint32_t next_ready;
    bool ready;
} group;

struct fgs_engine {
    pthread_mutex_t lock;
    pthread_t thread;
    bool started, stopped;
    int listen_fd, epoll_fd, event_fd, stop_fd, timer_fd;
    bool listen_paused;
    int64_t accept_retry_at, timer_at;
    conn **slots;
    uint32_t *generations;
    uint32_t slot_capacity;
    uint32_t *free_slots;
    uint32_t free_slot_count;
    gpu *gpus;
    int gpu_count;
    int64_t window_ns;
    fgs_meter *meter;
    group *groups;
    uint32_t group_capacity;
    uint32_t ready_head, ready_tail; /* the ring of groups with events, NO_GROUP when empty */
    uint64_t events_pending;
    int64_t pending_since, last_take; /* when the queue last stopped being empty; when Python last took one */
};

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* --- connections ---------------------------------------------------------------------------- */

static conn *find_conn(const fgs_engine *e, uint64_t id)
{
    uint32_t slot = (uint32_t)id, generation = (uint32_t)(id >> 32);
    if (slot >= e->slot_capacity || e->slots[slot] == NULL || e->generations[slot] != generation)
        return NULL;
    return e->slots[slot];
}

static void update_epoll(fgs_engine *e, conn *c)
{
    uint32_t mask = 0;
    if (!c->broken && !c->closing && (c->group != 0 || c->health) && c->out_length <= OUT_HIGH
        && c->events_waiting < EVENTS_HIGH)
        mask |= EPOLLIN;
    if (c->out_length)
        mask |= EPOLLOUT;
    if (mask == c->epoll_mask)
        return;
    /* resume reading only once the events are down to EVENTS_LOW: no flapping at the threshold */
    if ((mask & EPOLLIN) && !(c->epoll_mask & EPOLLIN) && c->events_waiting > EVENTS_LOW)
        mask &= ~(uint32_t)EPOLLIN;
    if (mask == c->epoll_mask)
        return;
    struct epoll_event ev = {.events = mask, .data.u64 = c->id};
    epoll_ctl(e->epoll_fd, EPOLL_CTL_MOD, c->fd, &ev);
    c->epoll_mask = mask;
}

static void flush_out(fgs_engine *e, conn *c)
{
    uint32_t sent = 0;
    while (sent < c->out_length && !c->write_failed) {
        ssize_t k = send(c->fd, c->out + sent, c->out_length - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0)
            sent += (uint32_t)k;
        else if (k < 0 && errno == EINTR)
            continue;
        else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        else
            c->write_failed = true; /* the peer is gone: its hang-up comes through epoll */
    }
    if (c->write_failed)
        c->out_length = 0;
    else if (sent) {
        memmove(c->out, c->out + sent, c->out_length - sent);
        c->out_length -= sent;
    }
    update_epoll(e, c);
}

static int conn_write(fgs_engine *e, conn *c, const uint8_t *data, uint32_t length)
{
    if (c->write_failed)
        return 0;
    if (c->out_length == 0 && !c->batching) {
        ssize_t k;
        do
            k = send(c->fd, data, length, MSG_NOSIGNAL | MSG_DONTWAIT);
        while (k < 0 && errno == EINTR);
        if (k == (ssize_t)length)
            return 0;
        if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
            c->write_failed = true;
            return 0;
        }
        if (k > 0) {
            data += k;
            length -= (uint32_t)k;
        }
    }
    if (c->out_length + length > c->out_capacity) {
        uint32_t capacity = grown_capacity(c->out_capacity, c->out_length + length, 4096);
        uint8_t *out = resized(c->out, 1, c->out_capacity, capacity);
        if (out == NULL)
            return -2;
        c->out = out;
        c->out_capacity = capacity;
    }
    memcpy(c->out + c->out_length, data, length);
    c->out_length += length;
    if (!c->batching)
        update_epoll(e, c);
    return 0;
}

/* The group's place in the ring of groups with events: at its tail. */
static void make_ready(fgs_engine *e, uint32_t index)
{
    group *g = &e->groups[index];
    g->ready = true;
    g->next_ready = NO_GROUP;
    if (e->ready_tail == NO_GROUP)
        e->ready_head = index;
    else
        e->groups[e->ready_tail].next_ready = index;
    e->ready_tail = index;
}

static void push_event(fgs_engine *e, conn *c, int kind, int pid, const uint8_t *data, uint32_t length)
{
    queued_event *q = malloc(sizeof *q + length);
    if (q == NULL)
        return; /* no memory: the event is lost; the connection's hello deadline still applies */
    q->next = NULL;
    q->event = (fgs_event){.connection = c->id, .kind = kind, .pid = pid, .length = length};
    if (length)
        memcpy(q->data, data, length);
    bool was_empty = e->events_pending == 0;
    group *g = &e->groups[c->group];
    if (g->head == NULL)
        g->head = q;
    else
        g->tail->next = q;
    g->tail = q;
    if (!g->ready)
        make_ready(e, c->group);
    e->events_pending++;
    if (was_empty)
        e->pending_since = now_ns();
    if (kind != FGS_EVENT_CLOSED) {
        c->events_waiting++;
        update_epoll(e, c);
    }
    if (was_empty) {
        uint64_t one = 1;
        ssize_t ignored = write(e->event_fd, &one, sizeof one);
        (void)ignored; /* a full eventfd counter is still readable */
    }
}

/* --- the token path -------------------------------------------------------------------------- */

static void rearm_timer(fgs_engine *e)
{
    int64_t at = e->listen_paused ? e->accept_retry_at : FGS_NO_TIME;
    for (int i = 0; i < e->gpu_count; i++) {
        int64_t wake = e->gpus[i].wake_at;
        if (wake != FGS_NO_TIME && (at == FGS_NO_TIME || wake < at))
            at = wake;
    }
    if (at == e->timer_at)
        return;
    struct itimerspec spec = {0};
    if (at != FGS_NO_TIME) {
        if (at <= 0)
            at = 1; /* 0 would disarm */
        spec.it_value.tv_sec = at / 1000000000;
        spec.it_value.tv_nsec = at % 1000000000;
    }
    timerfd_settime(e->timer_fd, TFD_TIMER_ABSTIME, &spec, NULL);
    e->timer_at = at;
}

static void mark_unasked(gpu *g, pod *p)
{
    if (p->unasked)
        return;
    if (g->unasked_count == g->unasked_capacity) {
        uint32_t capacity = grown_capacity(g->unasked_capacity, g->unasked_count + 1, 16);
        pod **unasked = resized(g->unasked, sizeof *unasked, g->unasked_capacity, capacity);
        if (unasked == NULL)
            return;
        g->unasked = unasked;
        g->unasked_capacity = capacity;
    }
    g->unasked[g->unasked_count++] = p;
    p->unasked = true;
}

static void unmark_unasked(gpu *g, uint32_t index)
{
    g->unasked[index]->unasked = false;
    g->unasked[index] = g->unasked[--g->unasked_count];
}

/* The header of a reply the engine makes: the frame is `size` bytes in all. */
static void reply_header(uint8_t *frame, uint32_t size, uint16_t type, uint32_t request_id)
{
    fgs_put_le32(frame, size - 4);
    fgs_put_le16(frame + 4, FGS_PROTOCOL_VERSION);
    fgs_put_le16(frame + 6, (uint16_t)(type | FGS_REPLY_BIT));
    fgs_put_le32(frame + 8, request_id);
}

static void send_token(fgs_engine *e, conn *c, uint32_t request_id, int64_t token_ns)
{
    uint8_t frame[TOKEN_FRAME];
    reply_header(frame, sizeof frame, FGS_MSG_TOKEN, request_id);
    fgs_put_le64(frame + FGS_HEADER_SIZE, (uint64_t)token_ns);
    conn_write(e, c, frame, sizeof frame);
}

/* Take a connection out of its pod's queue (the first one, when the token goes to it). */
static void unqueue(pod *p, conn *c)
{
    conn **link = &p->queue_head;
    conn *previous = NULL;
    while (*link != c) {
        previous = *link;
        link = &(*link)->next_in_queue;
    }
    *link = c->next_in_queue;
    if (p->queue_tail == c)
        p->queue_tail = previous;
    c->queued = false;
    c->next_in_queue = NULL;
}

static pod *pod_of_client(gpu *g, uint32_t client)
{
    return client < g->by_client_capacity ? g->by_client[client] : NULL;
}

/* _pump: ask for the pods whose other processes wait, schedule, send the grants, arm the timer. */
static void pump(fgs_engine *e, gpu *g)
{
    for (;;) {
        int64_t now = now_ns();
        for (uint32_t i = 0; i < g->unasked_count;) {
            pod *p = g->unasked[i];
            if (p->queue_head == NULL || fgs_policy_is_waiting(g->policy, p->client) == 1) {
                unmark_unasked(g, i);
                continue;
            }
            /* Another process of the pod waits: the pod asks again once the holder's token is over
             * (the silent holder is charged its whole token). */
            int64_t holding = fgs_policy_holding_until(g->policy, p->client);
            if (p->holder == NULL || holding == FGS_NO_TIME || holding <= now) {
                unmark_unasked(g, i);
                fgs_policy_request(g->policy, p->client, now, p->token_ns);
                if (p->holder != NULL)
                    fgs_meter_used(e->meter, p->meter, p->granted_at, p->token_ns);
                continue;
            }
            i++;
        }
        const fgs_grant *grants;
        int64_t wake_at;
        int count = fgs_policy_schedule(g->policy, now, &grants, &wake_at);
        bool handed_back = false;
        for (int i = 0; i < count; i++) {
            pod *p = pod_of_client(g, grants[i].client);
            if (p == NULL)
                continue;
            if (p->queue_head == NULL) { /* every process that asked has left: the token goes back */
                fgs_policy_release(g->policy, p->client, now, 0);
                handed_back = true;
                continue;
            }
            conn *c = p->queue_head;
            unqueue(p, c);
            if (p->queue_head != NULL)
                mark_unasked(g, p);
            p->holder = c;
            p->granted_at = now;
            p->token_ns = grants[i].token_ns;
            fgs_meter_granted(e->meter, p->meter, now);
            uint32_t request_id = c->has_request ? c->request_id : 0;
            c->has_request = false;
            send_token(e, c, request_id, grants[i].token_ns);
        }
        if (handed_back)
            continue; /* its SMs are free again: whoever waits behind it may go now */
        /* _arm: no wake-up while nobody waits and no pod has a connection queued behind its holder */
        g->wake_at = wake_at != FGS_NO_TIME && (fgs_policy_anyone_waiting(g->policy) || g->unasked_count)
                         ? wake_at : FGS_NO_TIME;
        rearm_timer(e);
        return;
    }
}

/* _token. used_ns is what the client says it used of the token it returns (at most INT64_MAX:
 * larger reports go to Python, which refuses them); it is charged what fgs_token_charge says. */
static void token_request(fgs_engine *e, conn *c, uint32_t request_id, uint64_t used_ns)
{
    pod *p = c->pod;
    gpu *g = p->gpu;
    int64_t now = now_ns();
    c->request_id = request_id;
    c->has_request = true;
    if (!c->queued) {
        c->queued = true;
        c->next_in_queue = NULL;
        if (p->queue_tail != NULL)
            p->queue_tail->next_in_queue = c;
        else
            p->queue_head = c;
        p->queue_tail = c;
    }
    if (p->holder == c) { /* it returns its token, and asks again */
        p->holder = NULL;
        int64_t charged = fgs_token_charge(p->granted_at, p->token_ns, now, used_ns);
        fgs_policy_request(g->policy, p->client, now, charged);
        fgs_meter_used(e->meter, p->meter, p->granted_at, charged);
    } else {
        mark_unasked(g, p);
    }
    int64_t limit = (int64_t)p->share.limit_permille * e->window_ns / 1000;
    bool at_limit = fgs_policy_usage(g->policy, p->client, now) >= limit;
    fgs_meter_asked(p->meter, now, at_limit);
    pump(e, g);
}

static void free_client_id(gpu *g, uint32_t client)
{
    if (g->free_count == g->free_capacity) {
        uint32_t capacity = grown_capacity(g->free_capacity, g->free_count + 1, 16);
        uint32_t *ids = resized(g->free_clients, sizeof *ids, g->free_capacity, capacity);
        if (ids == NULL)
            return; /* the id is not reused */
        g->free_clients = ids;
        g->free_capacity = capacity;
    }
    g->free_clients[g->free_count++] = client;
}

/* _disconnect, the scheduler's part: the connection's place in the queue and its token go back. */
static void detach(fgs_engine *e, conn *c)
{
    pod *p = c->pod;
    if (p == NULL)
        return;
    c->pod = NULL;
    gpu *g = p->gpu;
    if (c->queued)
        unqueue(p, c);
    if (p->queue_head != NULL)
        mark_unasked(g, p);
    if (p->holder == c) { /* it cannot report its use: charge the time held, at most the token */
        p->holder = NULL;
        int64_t now = now_ns();
        int64_t held = now - p->granted_at < p->token_ns ? now - p->granted_at : p->token_ns;
        fgs_policy_release(g->policy, p->client, now, held);
        fgs_meter_used(e->meter, p->meter, p->granted_at, held);
    }
    if (--p->connections == 0) {
        fgs_policy_remove(g->policy, p->client);
        g->by_client[p->client] = NULL;
        free_client_id(g, p->client);
        fgs_meter_leave(p->meter);
        for (uint32_t i = 0; i < g->unasked_count; i++)
            if (g->unasked[i] == p) {
                unmark_unasked(g, i);
                break;
            }
        for (pod **link = &g->pods; *link != NULL; link = &(*link)->next)
            if (*link == p) {
                *link = p->next;
                break;
            }
        free(p);
    }
    pump(e, g);
}

static void free_conn(fgs_engine *e, conn *c)
{
    uint32_t slot = (uint32_t)c->id;
    epoll_ctl(e->epoll_fd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    e->slots[slot] = NULL;
    e->generations[slot]++;
    e->free_slots[e->free_slot_count++] = slot;
    free(c->out);
    free(c);
}

/* The peer is gone: the token goes back, and Python hears of it. */
static void drop_conn(fgs_engine *e, conn *c)
{
    detach(e, c);
    if (!c->closing && !c->health)
        push_event(e, c, FGS_EVENT_CLOSED, 0, NULL, 0);
    free_conn(e, c);
}

/* PING: answered here, whatever the connection, so it never waits behind Python. */
static void answer_ping(fgs_engine *e, conn *c, uint32_t request_id)
{
    uint8_t frame[PING_REPLY_FRAME];
    reply_header(frame, sizeof frame, FGS_MSG_PING, request_id);
    conn_write(e, c, frame, sizeof frame);
}

/* How long Python has not taken an event while some waited: 0 while it keeps up. */
static int64_t python_stalled_ns(const fgs_engine *e, int64_t now)
{
    if (e->events_pending == 0)
        return 0;
    int64_t since = e->last_take > e->pending_since ? e->last_take : e->pending_since;
    return now > since ? now - since : 0;
}

/* The probe's PING: the reply's payload says how long Python has stalled (u64 ns). */
static void answer_health(fgs_engine *e, conn *c, uint32_t request_id)
{
    uint8_t frame[HEALTH_REPLY_FRAME];
    reply_header(frame, sizeof frame, FGS_MSG_PING, request_id);
    fgs_put_le64(frame + FGS_HEADER_SIZE, (uint64_t)python_stalled_ns(e, now_ns()));
    conn_write(e, c, frame, sizeof frame);
}

/* Every whole frame read; the replies the engine makes leave together, in one send, at the end. */
static void handle_frames(fgs_engine *e, conn *c)
{
    uint32_t offset = 0;
    while (c->in_length - offset >= 4) {
        const uint8_t *frame = c->in + offset;
        uint32_t length = fgs_get_le32(frame);
        if (length < FGS_HEADER_SIZE - 4 || length > FGS_MAX_FRAME - 4) {
            if (c->health) {
                drop_conn(e, c);
                return;
            }
            push_event(e, c, FGS_EVENT_BAD, 0, frame, c->in_length - offset);
            c->broken = true;
            offset = c->in_length;
            update_epoll(e, c);
            break;
        }
        if (c->in_length - offset < length + 4)
            break;
        bool current = fgs_get_le16(frame + 4) == FGS_PROTOCOL_VERSION;
        uint16_t type = fgs_get_le16(frame + 6);
        if (c->health) {
            if (!current || type != FGS_MSG_PING) {
                drop_conn(e, c); /* the probe sends nothing else */
                return;
            }
            answer_health(e, c, fgs_get_le32(frame + 8));
        } else if (current && type == FGS_MSG_PING) {
            answer_ping(e, c, fgs_get_le32(frame + 8));
        } else if (c->pod != NULL && length == TOKEN_FRAME - 4 && current && type == FGS_MSG_TOKEN
                   && fgs_get_le64(frame + FGS_HEADER_SIZE) <= (uint64_t)INT64_MAX) {
            token_request(e, c, fgs_get_le32(frame + 8), fgs_get_le64(frame + FGS_HEADER_SIZE));
        } else {
            push_event(e, c, FGS_EVENT_FRAME, 0, frame, length + 4);
        }
        offset += length + 4;
    }
    if (offset) {
        memmove(c->in, c->in + offset, c->in_length - offset);
        c->in_length -= offset;
    }
}

/* A connection reads at most READ_CHUNK bytes per turn (what one frame needs, if more): the engine's
 * turn over every ready connection stays short, however many connections one pod floods it from. */
static uint32_t read_size(const conn *c)
{
    uint32_t room = IN_CAPACITY - c->in_length;
    uint32_t needed = READ_CHUNK;
    if (c->in_length >= 4) {
        uint32_t length = fgs_get_le32(c->in);
        if (length <= FGS_MAX_FRAME - 4 && length + 4 > c->in_length + READ_CHUNK)
            needed = length + 4 - c->in_length; /* the rest of a long frame, in one read */
    }
    return needed < room ? needed : room;
}

static void read_conn(fgs_engine *e, conn *c)
{
    ssize_t k;
    do
        k = recv(c->fd, c->in + c->in_length, read_size(c), MSG_DONTWAIT);
    while (k < 0 && errno == EINTR);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return;
    if (k <= 0) {
        drop_conn(e, c);
        return;
    }
    c->in_length += (uint32_t)k;
    uint64_t id = c->id;
    c->batching = true;
    handle_frames(e, c); /* may drop it */
    if (find_conn(e, id) != NULL) {
        c->batching = false;
        flush_out(e, c);
    }
}

static int add_slot(fgs_engine *e)
{
    if (e->free_slot_count)
        return (int)e->free_slots[--e->free_slot_count];
    uint32_t old = e->slot_capacity, capacity = grown_capacity(old, old + 1, 64);
    conn **slots = resized(e->slots, sizeof *slots, old, capacity); /* the new ones NULL */
    if (slots == NULL)
        return -1;
    e->slots = slots;
    uint32_t *generations = resized(e->generations, sizeof *generations, old, capacity);
    if (generations == NULL)
        return -1;
    e->generations = generations;
    uint32_t *free_slots = resized(e->free_slots, sizeof *free_slots, old, capacity);
    if (free_slots == NULL)
        return -1;
    e->free_slots = free_slots;
    for (uint32_t i = old; i < capacity; i++)
        e->generations[i] = 1;
    for (uint32_t i = capacity; i > e->slot_capacity + 1; i--)
        e->free_slots[e->free_slot_count++] = i - 1;
    uint32_t slot = e->slot_capacity;
    e->slot_capacity = capacity;
    return (int)slot;
}

static void pause_listening(fgs_engine *e, bool paused)
{
    struct epoll_event ev = {.events = paused ? 0 : EPOLLIN, .data.u64 = TAG_LISTEN};
    epoll_ctl(e->epoll_fd, EPOLL_CTL_MOD, e->listen_fd, &ev);
    e->listen_paused = paused;
    e->accept_retry_at = paused ? now_ns() + ACCEPT_RETRY_NS : FGS_NO_TIME;
    rearm_timer(e);
}

static void accept_all(fgs_engine *e)
{
    for (;;) {
        int fd = accept4(e->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
                pause_listening(e, true); /* out of descriptors: others' closing makes room */
            return;
        }
        struct ucred peer = {0};
        socklen_t size = sizeof peer;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &size) != 0)
            peer.pid = 0;
        conn *c = calloc(1, sizeof *c);
        int slot = c == NULL ? -1 : add_slot(e);
        if (slot < 0) {
            free(c);
            close(fd);
            continue;
        }
        c->fd = fd;
        c->id = (uint64_t)e->generations[slot] << 32 | (uint32_t)slot;
        c->epoll_mask = EPOLLIN;
        struct epoll_event ev = {.events = EPOLLIN, .data.u64 = c->id};
        if (epoll_ctl(e->epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) {
            free(c);
            close(fd);
            e->free_slots[e->free_slot_count++] = (uint32_t)slot;
            continue;
        }
        e->slots[slot] = c;
        push_event(e, c, FGS_EVENT_ACCEPTED, peer.pid, NULL, 0);
    }
}

static void on_timer(fgs_engine *e)
{
    uint64_t expirations;
    ssize_t ignored = read(e->timer_fd, &expirations, sizeof expirations);
    (void)ignored;
    e->timer_at = FGS_NO_TIME; /* it fired */
    int64_t now = now_ns();
    if (e->listen_paused && e->accept_retry_at <= now)
        pause_listening(e, false);
    for (int i = 0; i < e->gpu_count; i++) {
        gpu *g = &e->gpus[i];
        if (g->wake_at != FGS_NO_TIME && g->wake_at <= now) {
            g->wake_at = FGS_NO_TIME;
            pump(e, g);
        }
    }
    rearm_timer(e);
}

static void on_conn(fgs_engine *e, uint64_t id, uint32_t events)
{
    conn *c = find_conn(e, id);
    if (c == NULL)
        return;
    if (events & EPOLLOUT) {
        flush_out(e, c);
        if (c->closing && c->out_length == 0) {
            free_conn(e, c);
            return;
        }
    }
    if ((events & EPOLLIN) && (c->epoll_mask & EPOLLIN)) {
        read_conn(e, c); /* may drop it */
        return;
    }
    if (events & (EPOLLHUP | EPOLLERR)) { /* not reading it now, and the peer is gone */
        if (c->closing)
            free_conn(e, c);
        else
            drop_conn(e, c);
    }
}

static void *run(void *argument)
{
    fgs_engine *e = argument;
    struct epoll_event events[256];
    pthread_mutex_lock(&e->lock);
    for (;;) {
        pthread_mutex_unlock(&e->lock);
        int n = epoll_wait(e->epoll_fd, events, 256, -1);
        pthread_mutex_lock(&e->lock);
        if (n < 0 && errno != EINTR)
            break;
        bool stop = false;
        for (int i = 0; i < n; i++) {
            uint64_t tag = events[i].data.u64;
            if (tag == TAG_STOP)
                stop = true;
            else if (tag == TAG_LISTEN)
                accept_all(e);
            else if (tag == TAG_TIMER)
                on_timer(e);
            else
                on_conn(e, tag, events[i].events);
        }
        if (stop)
            break;
    }
    pthread_mutex_unlock(&e->lock);
    return NULL;
}

/* --- the API ----------------------------------------------------------------------------------- */

static int add_fd(int epoll_fd, int fd, uint64_t tag)
{
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = tag};
    return epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev);
}

fgs_engine *fgs_engine_new(int32_t listen_fd, int32_t gpus, const uint8_t *mps, int64_t window_ns,
                           int64_t min_token_ns, int64_t meter_window_ns, const int64_t *wait_bounds_ns,
                           int32_t buckets)
{
    if (gpus < 0)
        return NULL;
    fgs_engine *e = calloc(1, sizeof *e);
    if (e == NULL)
        return NULL;
    pthread_mutex_init(&e->lock, NULL);
    e->listen_fd = listen_fd;
    e->epoll_fd = e->event_fd = e->stop_fd = e->timer_fd = -1;
    e->timer_at = e->accept_retry_at = FGS_NO_TIME;
    e->ready_head = e->ready_tail = NO_GROUP;
    e->window_ns = window_ns;
    e->gpu_count = gpus;
    e->gpus = calloc((size_t)gpus + 1, sizeof *e->gpus);
    e->meter = fgs_meter_new(meter_window_ns, wait_bounds_ns, buckets, gpus);
    e->groups = calloc(1, sizeof *e->groups); /* group 0: new connections, until Python says whose */
    e->group_capacity = 1;
    if (e->gpus == NULL || e->meter == NULL || e->groups == NULL)
        goto fail;
    for (int i = 0; i < gpus; i++) {
        e->gpus[i].index = i;
        e->gpus[i].wake_at = FGS_NO_TIME;
        e->gpus[i].policy = fgs_policy_new(window_ns, min_token_ns, mps[i] != 0);
        if (e->gpus[i].policy == NULL)
            goto fail;
    }
    e->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    e->event_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    e->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    e->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
    if (e->epoll_fd < 0 || e->event_fd < 0 || e->stop_fd < 0 || e->timer_fd < 0
        || add_fd(e->epoll_fd, listen_fd, TAG_LISTEN) != 0 || add_fd(e->epoll_fd, e->stop_fd, TAG_STOP) != 0
        || add_fd(e->epoll_fd, e->timer_fd, TAG_TIMER) != 0)
        goto fail;
    return e;
fail:
    fgs_engine_free(e);
    return NULL;
}

int32_t fgs_engine_start(fgs_engine *e)
{
    /* The thread blocks every signal (it inherits the mask): they go to Python's threads, which
     * handle them, and the engine's calls are not interrupted. */
    sigset_t all, previous;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &previous);
    int error = pthread_create(&e->thread, NULL, run, e);
    pthread_sigmask(SIG_SETMASK, &previous, NULL);
    if (error == 0) {
        e->started = true;
        pthread_setname_np(e->thread, "fgs-arbiter"); /* as top -H and /proc/<pid>/task/<tid>/comm show it */
    }
    return error;
}

void fgs_engine_stop(fgs_engine *e)
{
    if (e->stopped)
        return;
    if (e->started) {
        uint64_t one = 1;
        ssize_t ignored = write(e->stop_fd, &one, sizeof one);
        (void)ignored;
        pthread_join(e->thread, NULL);
    }
    pthread_mutex_lock(&e->lock);
    e->stopped = true;
    for (uint32_t i = 0; i < e->slot_capacity; i++)
        if (e->slots[i] != NULL) {
            e->slots[i]->closing = true; /* no events */
            detach(e, e->slots[i]);
            free_conn(e, e->slots[i]);
        }
    epoll_ctl(e->epoll_fd, EPOLL_CTL_DEL, e->listen_fd, NULL);
    pthread_mutex_unlock(&e->lock);
}

void fgs_engine_free(fgs_engine *e)
{
    if (e == NULL)
        return;
    fgs_engine_stop(e);
    for (int i = 0; e->gpus != NULL && i < e->gpu_count; i++) {
        gpu *g = &e->gpus[i];
        for (pod *p = g->pods, *next; p != NULL; p = next) {
            next = p->next;
            free(p);
        }
        fgs_policy_free(g->policy);
        free(g->unasked);
        free(g->free_clients);
        free(g->by_client);
    }
    free(e->gpus);
    fgs_meter_free(e->meter);
    for (uint32_t i = 0; i < e->group_capacity; i++)
        for (queued_event *q = e->groups[i].head, *next; q != NULL; q = next) {
            next = q->next;
            free(q);
        }
    free(e->groups);
    int fds[] = {e->epoll_fd, e->event_fd, e->stop_fd, e->timer_fd};
    for (size_t i = 0; i < sizeof fds / sizeof *fds; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    free(e->slots);
    free(e->generations);
    free(e->free_slots);
    pthread_mutex_destroy(&e->lock);
    free(e);
}

int32_t fgs_engine_event_fd(const fgs_engine *e) { return e->event_fd; }

int32_t fgs_engine_next_event(fgs_engine *e, fgs_event *event, uint8_t *buffer, uint32_t capacity)
{
    pthread_mutex_lock(&e->lock);
    if (e->ready_head == NO_GROUP) {
        pthread_mutex_unlock(&e->lock);
        return 0;
    }
    /* The group at the ring's head gives one event, then goes to the tail if it has more. */
    uint32_t index = e->ready_head;
    group *g = &e->groups[index];
    queued_event *q = g->head;
    g->head = q->next;
    if (g->head == NULL)
        g->tail = NULL;
    e->ready_head = g->next_ready;
    if (e->ready_head == NO_GROUP)
        e->ready_tail = NO_GROUP;
    g->ready = false;
    if (g->head != NULL)
        make_ready(e, index);
    e->events_pending--;
    e->last_take = now_ns();
    *event = q->event;
    if (event->length > capacity)
        event->length = capacity;
    memcpy(buffer, q->data, event->length);
    conn *c = event->kind == FGS_EVENT_CLOSED ? NULL : find_conn(e, event->connection);
    if (c != NULL) {
        c->events_waiting--;
        if (!e->stopped)
            update_epoll(e, c);
    }
    pthread_mutex_unlock(&e->lock);
    free(q);
    return 1;
}

int32_t fgs_engine_send(fgs_engine *e, uint64_t id, const uint8_t *data, uint32_t length)
{
    pthread_mutex_lock(&e->lock);
    conn *c = e->stopped ? NULL : find_conn(e, id);
    int result = c == NULL || c->closing ? -1 : conn_write(e, c, data, length);
    pthread_mutex_unlock(&e->lock);
    return result;
}

int32_t fgs_engine_close(fgs_engine *e, uint64_t id)
{
    pthread_mutex_lock(&e->lock);
    conn *c = e->stopped ? NULL : find_conn(e, id);
    if (c == NULL || c->closing) {
        pthread_mutex_unlock(&e->lock);
        return -1;
    }
    c->closing = true;
    detach(e, c);
    if (c->out_length == 0 || c->write_failed)
        free_conn(e, c);
    else
        update_epoll(e, c); /* reading stops; EPOLLOUT closes it once the output has left */
    pthread_mutex_unlock(&e->lock);
    return 0;
}

int32_t fgs_engine_set_group(fgs_engine *e, uint64_t id, uint32_t group_number)
{
    pthread_mutex_lock(&e->lock);
    conn *c = e->stopped ? NULL : find_conn(e, id);
    int result = 0;
    if (c == NULL || c->closing || c->health) {
        result = -1;
    } else if (group_number == 0 || group_number > MAX_GROUP) {
        result = -3;
    } else {
        if (group_number >= e->group_capacity) {
            uint32_t capacity = grown_capacity(e->group_capacity, group_number + 1, 16);
            group *groups = resized(e->groups, sizeof *groups, e->group_capacity, capacity);
            if (groups == NULL) {
                result = -2;
                goto done;
            }
            e->groups = groups;
            e->group_capacity = capacity;
        }
        c->group = group_number; /* its events from now on; those already queued stay where they are */
        update_epoll(e, c);      /* reading starts */
    }
done:
    pthread_mutex_unlock(&e->lock);
    return result;
}

int32_t fgs_engine_add_probe(fgs_engine *e, int32_t fd)
{
    pthread_mutex_lock(&e->lock);
    int result = -1;
    conn *c = e->stopped ? NULL : calloc(1, sizeof *c);
    int slot = c == NULL ? -1 : add_slot(e);
    if (slot >= 0) {
        c->fd = fd;
        c->health = true;
        c->id = (uint64_t)e->generations[slot] << 32 | (uint32_t)slot;
        c->epoll_mask = EPOLLIN;
        struct epoll_event ev = {.events = EPOLLIN, .data.u64 = c->id};
        if (epoll_ctl(e->epoll_fd, EPOLL_CTL_ADD, fd, &ev) == 0) {
            e->slots[slot] = c;
            result = 0;
        } else {
            e->free_slots[e->free_slot_count++] = (uint32_t)slot;
        }
    }
    if (result != 0) {
        free(c);
        close(fd);
    }
    pthread_mutex_unlock(&e->lock);
    return result;
}

static pod *find_pod(gpu *g, const char *name)
{
    for (pod *p = g->pods; p != NULL; p = p->next)
        if (strcmp(p->name, name) == 0)
            return p;
    return NULL;
}

int32_t fgs_engine_register(fgs_engine *e, uint64_t id, int32_t gpu_index, const char *name, fgs_share share)
{
    pthread_mutex_lock(&e->lock);
    conn *c = e->stopped ? NULL : find_conn(e, id);
    int result = 0;
    if (c == NULL || c->closing) {
        result = -1;
        goto done;
    }
    if (gpu_index < 0 || gpu_index >= e->gpu_count || c->pod != NULL || strlen(name) >= FGS_MAX_POD_NAME) {
        result = -3;
        goto done;
    }
    gpu *g = &e->gpus[gpu_index];
    pod *p = find_pod(g, name);
    if (p == NULL) {
        p = calloc(1, sizeof *p);
        if (p == NULL) {
            result = -2;
            goto done;
        }
        p->gpu = g;
        memcpy(p->name, name, strlen(name) + 1);
        p->share = share;
        p->client = g->free_count ? g->free_clients[--g->free_count] : g->next_client++;
        p->meter = fgs_meter_join(e->meter, gpu_index, name);
        if (p->client >= g->by_client_capacity) {
            uint32_t capacity = grown_capacity(g->by_client_capacity, p->client + 1, 16);
            pod **by_client = resized(g->by_client, sizeof *by_client, g->by_client_capacity, capacity);
            if (by_client != NULL) {
                g->by_client = by_client;
                g->by_client_capacity = capacity;
            }
        }
        if (p->meter == NULL || p->client >= g->by_client_capacity
            || fgs_policy_add(g->policy, p->client, p->share) != 0) {
            free_client_id(g, p->client);
            free(p);
            result = -2;
            goto done;
        }
        g->by_client[p->client] = p;
        p->next = g->pods;
        g->pods = p;
    }
    p->connections++;
    c->pod = p;
done:
    pthread_mutex_unlock(&e->lock);
    return result;
}

int32_t fgs_engine_token(fgs_engine *e, uint64_t id, uint32_t request_id, uint64_t used_ns)
{
    pthread_mutex_lock(&e->lock);
    conn *c = e->stopped ? NULL : find_conn(e, id);
    int result = c == NULL || c->closing || c->pod == NULL ? -1 : 0;
    if (result == 0)
        token_request(e, c, request_id, used_ns);
    pthread_mutex_unlock(&e->lock);
    return result;
}

int32_t fgs_engine_set_share(fgs_engine *e, int32_t gpu_index, const char *name, fgs_share share)
{
    pthread_mutex_lock(&e->lock);
    int result = -1;
    if (!e->stopped && gpu_index >= 0 && gpu_index < e->gpu_count) {
        gpu *g = &e->gpus[gpu_index];
        pod *p = find_pod(g, name);
        if (p != NULL) {
            result = memcmp(&p->share, &share, sizeof share) != 0;
            if (result) {
                p->share = share;
                fgs_policy_set_share(g->policy, p->client, share);
                pump(e, g);
            }
        }
    }
    pthread_mutex_unlock(&e->lock);
    return result;
}

int32_t fgs_engine_snapshot(fgs_engine *e, const fgs_pod_usage **pods, int64_t *busy_ns, int64_t *now)
{
    pthread_mutex_lock(&e->lock);
    *now = now_ns();
    int result = fgs_meter_snapshot(e->meter, *now, pods, busy_ns);
    pthread_mutex_unlock(&e->lock);
    return result;
}
