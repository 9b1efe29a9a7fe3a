/*
 * The progress thread's wake-up rules (transport/worker.c), with no
 * device: its eventfd is written for a timer due before the thread's
 * current sleep ends and for deferred work (lazy work: once
 * SS_DEFER_LAZY_MAX of it waits), so that neither waits for a later
 * deadline the thread sleeps until, or for nothing. Each case makes the thread sleep first (on
 * nothing, or until a far deadline), then asks for something sooner and requires it to happen long
 * before that far deadline. A missed wake-up leaves the thread asleep: the case fails at its bound
 * (seconds, against tens of milliseconds asked for; a bound on correctness, not a speed figure).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <cmocka.h>

#include "handshake/clock.h"
#include "transport/conn.h"

/* What a wait for an event may take before it counts as missed. */
#define WORKER_BOUND_MS 5000
/* A deadline the thread would sleep until if nobody woke it. */
#define WORKER_FAR_MS 600000

struct worker_probe {
	struct ss_timer t;
	struct ss_defer d;
	atomic_int fired;
	struct ss_worker *w;
	struct worker_probe *then; /* armed (timer) or queued (work) from the callback, once */
	int then_ms;
};

static void worker_sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};

	nanosleep(&ts, NULL);
}

/* Whether p fired within the bound. */
static bool worker_fired(struct worker_probe *p)
{
	uint64_t end = ss_now_ms() + WORKER_BOUND_MS;

	while (atomic_load(&p->fired) == 0 && ss_now_ms() < end)
		worker_sleep_ms(2);
	return atomic_load(&p->fired) != 0;
}

static void worker_timer_cb(struct ss_timer *t, uint64_t now_ms)
{
	struct worker_probe *p =
		(struct worker_probe *)((char *)t - offsetof(struct worker_probe, t));
	struct worker_probe *then = p->then;

	p->then = NULL;
	if (then)
		ss_worker_timer_arm(p->w, &then->t, now_ms + (uint64_t)p->then_ms);
	atomic_fetch_add(&p->fired, 1);
}

static void worker_defer_cb(struct ss_defer *d)
{
	struct worker_probe *p =
		(struct worker_probe *)((char *)d - offsetof(struct worker_probe, d));
	struct worker_probe *then = p->then;

	p->then = NULL;
	if (then)
		ss_worker_defer(p->w, &then->d);
	atomic_fetch_add(&p->fired, 1);
}

static struct ss_worker *worker_the(void)
{
	struct ss_worker *w = NULL;

	assert_int_equal(ss_worker_get(&w), 0);
	assert_non_null(w);
	return w;
}

static void worker_probe_init(struct worker_probe *p, struct ss_worker *w)
{
	*p = (struct worker_probe){.w = w};
	p->t.fire = worker_timer_cb;
	p->d.fn = worker_defer_cb;
}

enum worker_step_op { W_END, W_ARM, W_CANCEL, W_DEFER, W_LAZY, W_SLEEP, W_FIRED, W_NOT_FIRED };

struct worker_step {
	enum worker_step_op op;
	int id;            /* the probe */
	int ms;            /* W_ARM: from now; W_SLEEP: how long */
	int then, then_ms; /* W_ARM, W_DEFER: a probe the callback arms or queues (-1: none) */
};

struct worker_script {
	const char *what;
	struct worker_step steps[12];
};

/* clang-format off */
static const struct worker_script worker_scripts[] = {
	{"a timer armed while the thread sleeps on nothing fires",
	 {{W_SLEEP, 0, 50, -1, 0}, {W_ARM, 0, 30, -1, 0}, {W_FIRED, 0, 0, -1, 0}}},
	{"an earlier timer wakes a thread asleep until a far deadline",
	 {{W_ARM, 0, WORKER_FAR_MS, -1, 0}, {W_SLEEP, 0, 100, -1, 0}, {W_ARM, 1, 30, -1, 0},
	  {W_FIRED, 1, 0, -1, 0}, {W_NOT_FIRED, 0, 0, -1, 0}, {W_CANCEL, 0, 0, -1, 0}}},
	{"after the earliest seen fired, a later one still fires",
	 {{W_ARM, 0, 20, -1, 0}, {W_FIRED, 0, 0, -1, 0}, {W_SLEEP, 0, 50, -1, 0},
	  {W_ARM, 1, 40, -1, 0}, {W_FIRED, 1, 0, -1, 0}}},
	{"the earliest seen cancelled, an earlier one than it still fires",
	 {{W_ARM, 0, 2000, -1, 0}, {W_SLEEP, 0, 50, -1, 0}, {W_CANCEL, 0, 0, -1, 0},
	  {W_ARM, 1, 30, -1, 0}, {W_FIRED, 1, 0, -1, 0}, {W_NOT_FIRED, 0, 0, -1, 0}}},
	{"a timer armed by a timer's callback fires (the thread looks again before it sleeps)",
	 {{W_ARM, 0, WORKER_FAR_MS, -1, 0}, {W_SLEEP, 0, 50, -1, 0}, {W_ARM, 1, 20, 2, 30},
	  {W_FIRED, 1, 0, -1, 0}, {W_FIRED, 2, 0, -1, 0}, {W_CANCEL, 0, 0, -1, 0}}},
	{"deferred work queued while the thread sleeps until a far deadline runs",
	 {{W_ARM, 0, WORKER_FAR_MS, -1, 0}, {W_SLEEP, 0, 50, -1, 0}, {W_DEFER, 1, 0, -1, 0},
	  {W_FIRED, 1, 0, -1, 0}, {W_CANCEL, 0, 0, -1, 0}}},
	{"a timer due after the thread's sleep ends fires (no wake-up needed)",
	 {{W_ARM, 0, 60, -1, 0}, {W_SLEEP, 0, 10, -1, 0}, {W_ARM, 1, 120, -1, 0},
	  {W_FIRED, 0, 0, -1, 0}, {W_FIRED, 1, 0, -1, 0}}},
	{"the timer the thread sleeps until cancelled, a later one still fires",
	 {{W_ARM, 0, 60, -1, 0}, {W_SLEEP, 0, 10, -1, 0}, {W_CANCEL, 0, 0, -1, 0},
	  {W_ARM, 1, 100, -1, 0}, {W_FIRED, 1, 0, -1, 0}, {W_NOT_FIRED, 0, 0, -1, 0}}},
	{"lazy work runs at the thread's next pass (a timer's)",
	 {{W_SLEEP, 0, 50, -1, 0}, {W_LAZY, 1, 0, -1, 0}, {W_NOT_FIRED, 1, 0, -1, 0},
	  {W_ARM, 0, 30, -1, 0}, {W_FIRED, 0, 0, -1, 0}, {W_FIRED, 1, 0, -1, 0}}},
	{"work queued behind queued work, and work queued by work, all run",
	 {{W_SLEEP, 0, 50, -1, 0}, {W_DEFER, 0, 0, 2, 0}, {W_DEFER, 1, 0, -1, 0},
	  {W_FIRED, 0, 0, -1, 0}, {W_FIRED, 1, 0, -1, 0}, {W_FIRED, 2, 0, -1, 0},
	  {W_SLEEP, 0, 50, -1, 0}, {W_DEFER, 3, 0, -1, 0}, {W_FIRED, 3, 0, -1, 0}}},
};
/* clang-format on */

static void test_worker_scripts(void **state)
{
	struct ss_worker *w = worker_the();

	(void)state;
	for (size_t i = 0; i < sizeof(worker_scripts) / sizeof(worker_scripts[0]); i++) {
		const struct worker_script *sc = &worker_scripts[i];
		struct worker_probe probes[4];

		print_message("worker: %s\n", sc->what);
		for (int k = 0; k < 4; k++)
			worker_probe_init(&probes[k], w);
		for (const struct worker_step *st = sc->steps; st->op != W_END; st++) {
			struct worker_probe *p = &probes[st->id];

			switch (st->op) {
			case W_ARM:
			case W_DEFER:
				p->then = st->then >= 0 ? &probes[st->then] : NULL;
				p->then_ms = st->then_ms;
				if (st->op == W_ARM)
					ss_worker_timer_arm(w, &p->t,
							    ss_now_ms() + (uint64_t)st->ms);
				else
					ss_worker_defer(w, &p->d);
				break;
			case W_LAZY: ss_worker_defer_lazy(w, &p->d); break;
			case W_CANCEL: ss_worker_timer_cancel(w, &p->t); break;
			case W_SLEEP: worker_sleep_ms(st->ms); break;
			case W_FIRED:
				if (!worker_fired(p))
					fail_msg("%s: probe %d did not fire within %d ms", sc->what,
						 st->id, WORKER_BOUND_MS);
				break;
			case W_NOT_FIRED: assert_int_equal(atomic_load(&p->fired), 0); break;
			case W_END: break;
			}
		}
	}
}

/*
 * Lazy work wakes the thread once SS_DEFER_LAZY_MAX of it waits: queued
 * while the thread sleeps on nothing, all of it runs (one short of the
 * bound, none did: nothing else woke the thread).
 */
static void test_worker_lazy_bound(void **state)
{
	struct ss_worker *w = worker_the();
	struct worker_probe probes[SS_DEFER_LAZY_MAX];

	(void)state;
	worker_sleep_ms(50); /* whatever ran before is done: the thread sleeps on nothing */
	for (int k = 0; k < SS_DEFER_LAZY_MAX; k++) {
		worker_probe_init(&probes[k], w);
		ss_worker_defer_lazy(w, &probes[k].d);
		if (k == SS_DEFER_LAZY_MAX - 2) {
			worker_sleep_ms(50);
			assert_int_equal(atomic_load(&probes[0].fired), 0);
		}
	}
	for (int k = 0; k < SS_DEFER_LAZY_MAX; k++)
		if (!worker_fired(&probes[k]))
			fail_msg("lazy work %d of %d did not run within %d ms", k,
				 SS_DEFER_LAZY_MAX, WORKER_BOUND_MS);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_worker_scripts),
		cmocka_unit_test(test_worker_lazy_bound),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
