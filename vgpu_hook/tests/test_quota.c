/*
 * test_quota.c: unit test of the hook's token bookkeeping (src/quota.c) with an injected clock.
 * Host-only: built without any CUDA header. Run by `make -C vgpu_hook test`; exits non-zero
 * and names each failed check.
 */
#include "check.h"
#include "quota.h"

#include <pthread.h>
#include <stdio.h>


struct fake_clock {
    uint64_t now;
};

static uint64_t fake_now(void *ctx)
{
    return __atomic_load_n(&((struct fake_clock *)ctx)->now, __ATOMIC_RELAXED);
}

static void set_now(struct fake_clock *clock, uint64_t now)
{
    __atomic_store_n(&clock->now, now, __ATOMIC_RELAXED);
}

static void test_no_token_before_the_first_grant(void)
{
    struct fake_clock clock = {1000};
    struct fgs_quota q;
    fgs_quota_init(&q, fake_now, &clock);
    CHECK(!fgs_quota_valid(&q));
    CHECK(!fgs_quota_granted(&q));
    CHECK(fgs_quota_used_ns(&q) == 0); /* the first TOKEN request reports nothing used */
}

static void test_token_valid_until_grant_plus_length(void)
{
    struct fake_clock clock = {1000};
    struct fgs_quota q;
    fgs_quota_init(&q, fake_now, &clock);
    fgs_quota_grant(&q, 500);
    CHECK(fgs_quota_granted(&q));
    CHECK(fgs_quota_valid(&q));
    set_now(&clock, 1499);
    CHECK(fgs_quota_valid(&q));
    set_now(&clock, 1500);
    CHECK(!fgs_quota_valid(&q));
}

static void test_used_runs_to_the_last_activity_overruns_included(void)
{
    struct fake_clock clock = {1000};
    struct fgs_quota q;
    fgs_quota_init(&q, fake_now, &clock);
    fgs_quota_grant(&q, 500);
    set_now(&clock, 1200);
    CHECK(!fgs_quota_active(&q));
    CHECK(fgs_quota_used_ns(&q) == 0); /* nothing launched yet */
    fgs_quota_note_activity(&q);
    CHECK(fgs_quota_active(&q));
    set_now(&clock, 1400);
    CHECK(fgs_quota_used_ns(&q) == 200); /* idle since 1200: credited back */
    set_now(&clock, 1700);
    fgs_quota_note_activity(&q); /* a launch that ran past the token's end at 1500 */
    set_now(&clock, 900000);
    CHECK(fgs_quota_used_ns(&q) == 700); /* the overrun is charged, the idle time after it is not */
}

static void test_activity_before_a_grant_does_not_count(void)
{
    struct fake_clock clock = {1000};
    struct fgs_quota q;
    fgs_quota_init(&q, fake_now, &clock);
    fgs_quota_grant(&q, 100);
    set_now(&clock, 1050);
    fgs_quota_note_activity(&q);
    set_now(&clock, 2000);
    fgs_quota_grant(&q, 100);
    CHECK(!fgs_quota_active(&q));
    CHECK(fgs_quota_used_ns(&q) == 0);
    fgs_quota_reset(&q);
    CHECK(!fgs_quota_active(&q));
}

static void test_a_sync_that_found_nothing_charges_at_most_the_token(void)
{
    struct fake_clock clock = {1000};
    struct fgs_quota q;
    fgs_quota_init(&q, fake_now, &clock);
    fgs_quota_grant(&q, 500);
    set_now(&clock, 1100);
    fgs_quota_note_activity(&q); /* a launch returned at 1100; its kernel may run on */
    set_now(&clock, 1300);
    fgs_quota_note_until_token_end(&q); /* the token has not ended: its work ran until now */
    CHECK(fgs_quota_used_ns(&q) == 300);
    set_now(&clock, 900000); /* the pod idled long after the token ended */
    fgs_quota_note_until_token_end(&q);
    CHECK(fgs_quota_used_ns(&q) == 500); /* the whole token, not the idle time after it */
    fgs_quota_grant(&q, 500);
    set_now(&clock, 900800);
    fgs_quota_note_activity(&q); /* a launch that overran the token's end */
    set_now(&clock, 950000);
    fgs_quota_note_until_token_end(&q);
    CHECK(fgs_quota_used_ns(&q) == 800); /* the overrun stays charged */
}

static void test_regrant_restarts_from_now(void)
{
    struct fake_clock clock = {1000};
    struct fgs_quota q;
    fgs_quota_init(&q, fake_now, &clock);
    fgs_quota_grant(&q, 100);
    set_now(&clock, 5000);
    CHECK(!fgs_quota_valid(&q));
    fgs_quota_grant(&q, 300);
    CHECK(fgs_quota_valid(&q));
    set_now(&clock, 5100);
    fgs_quota_note_activity(&q);
    CHECK(fgs_quota_used_ns(&q) == 100);
    set_now(&clock, 5300);
    CHECK(!fgs_quota_valid(&q));
}

static void test_zero_token_is_granted_but_never_valid(void)
{
    struct fake_clock clock = {1000};
    struct fgs_quota q;
    fgs_quota_init(&q, fake_now, &clock);
    fgs_quota_grant(&q, 0);
    CHECK(fgs_quota_granted(&q));
    CHECK(!fgs_quota_valid(&q));
    set_now(&clock, 2000);
    CHECK(fgs_quota_used_ns(&q) == 0);
}

static void test_huge_token_saturates_instead_of_wrapping(void)
{
    struct fake_clock clock = {1000};
    struct fgs_quota q;
    fgs_quota_init(&q, fake_now, &clock);
    fgs_quota_grant(&q, UINT64_MAX);
    CHECK(fgs_quota_valid(&q));
    set_now(&clock, UINT64_MAX - 1);
    CHECK(fgs_quota_valid(&q));
}

static void test_clock_going_backwards_reports_zero(void)
{
    struct fake_clock clock = {1000};
    struct fgs_quota q;
    fgs_quota_init(&q, fake_now, &clock);
    fgs_quota_grant(&q, 500);
    set_now(&clock, 10);
    CHECK(fgs_quota_used_ns(&q) == 0);
}

static void test_reset_drops_the_token(void)
{
    struct fake_clock clock = {1000};
    struct fgs_quota q;
    fgs_quota_init(&q, fake_now, &clock);
    fgs_quota_grant(&q, 500);
    fgs_quota_reset(&q);
    CHECK(!fgs_quota_valid(&q));
    CHECK(!fgs_quota_granted(&q));
    CHECK(fgs_quota_used_ns(&q) == 0);
}

/* Readers on other threads see either no token or the whole new one, never a torn deadline. */
struct reader_args {
    struct fgs_quota *q;
    int stop;
    long valid_seen;
};

static void *reader(void *arg)
{
    struct reader_args *a = arg;
    while (!__atomic_load_n(&a->stop, __ATOMIC_ACQUIRE))
        a->valid_seen += fgs_quota_valid(a->q);
    return NULL;
}

static void test_valid_check_is_safe_without_a_lock(void)
{
    struct fake_clock clock = {1000};
    struct fgs_quota q;
    fgs_quota_init(&q, fake_now, &clock);
    struct reader_args args = {&q, 0, 0};
    pthread_t thread;
    CHECK(pthread_create(&thread, NULL, reader, &args) == 0);
    for (int i = 0; i < 100000; i++) {
        fgs_quota_grant(&q, (uint64_t)1 << 40);
        fgs_quota_reset(&q);
    }
    fgs_quota_grant(&q, (uint64_t)1 << 40);
    __atomic_store_n(&args.stop, 1, __ATOMIC_RELEASE);
    pthread_join(thread, NULL);
    CHECK(fgs_quota_valid(&q));
}

static void test_real_clock_is_monotonic(void)
{
    uint64_t a = fgs_clock_monotonic(NULL), b = fgs_clock_monotonic(NULL);
    CHECK(a > 0);
    CHECK(b >= a);
}

int main(void)
{
    test_a_sync_that_found_nothing_charges_at_most_the_token();
    test_no_token_before_the_first_grant();
    test_token_valid_until_grant_plus_length();
    test_used_runs_to_the_last_activity_overruns_included();
    test_activity_before_a_grant_does_not_count();
    test_regrant_restarts_from_now();
    test_zero_token_is_granted_but_never_valid();
    test_huge_token_saturates_instead_of_wrapping();
    test_clock_going_backwards_reports_zero();
    test_reset_drops_the_token();
    test_valid_check_is_safe_without_a_lock();
    test_real_clock_is_monotonic();
    return check_report("test_quota");
}
