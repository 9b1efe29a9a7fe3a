/*
 * Timers: a binary min-heap of deadlines with a real remove. Pure (no
 * locking, no clock): the worker keeps one under its lock and fires what is
 * due from the progress thread. A timer is embedded in its owner; a timer is
 * in at most one heap, and is armed exactly while it is in it.
 */
#ifndef SS_TRANSPORT_TIMER_H
#define SS_TRANSPORT_TIMER_H

#include <stdbool.h>
#include <stdint.h>

struct ss_timer {
	uint64_t at;  /* deadline, ms on the one clock (handshake/clock.h) */
	uint32_t pos; /* 1 + index in the heap; 0: not armed */
	/* Called by the worker once the deadline has passed (progress thread, no lock held). */
	void (*fire)(struct ss_timer *t, uint64_t now_ms);
};

struct ss_timers {
	struct ss_timer **heap;
	uint32_t n, cap;
};

/* True while t is armed. */
static inline bool ss_timer_armed(const struct ss_timer *t)
{
	return t->pos != 0;
}

/*
 * Arms t to fire at at or earlier: an unarmed timer is armed for at, an
 * armed one moves only earlier (a deadline already asked for is never
 * postponed: whoever asked for it may depend on it). Returns 0 or -ENOMEM.
 */
int ss_timers_arm(struct ss_timers *h, struct ss_timer *t, uint64_t at);

/* Disarms t; nothing happens if it is not armed. */
void ss_timers_cancel(struct ss_timers *h, struct ss_timer *t);

/* Removes and returns the earliest timer due at now_ms, or NULL. */
struct ss_timer *ss_timers_pop_due(struct ss_timers *h, uint64_t now_ms);

/* The earliest deadline, or UINT64_MAX when nothing is armed. */
uint64_t ss_timers_next(const struct ss_timers *h);

/* Frees the heap; armed timers are simply forgotten. */
void ss_timers_fini(struct ss_timers *h);

#endif
