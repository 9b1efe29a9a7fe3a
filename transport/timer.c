#include "transport/timer.h"

#include <errno.h>
#include <stdlib.h>

static void timer_place(struct ss_timers *h, uint32_t i, struct ss_timer *t)
{
	h->heap[i] = t;
	t->pos = i + 1;
}

static void timer_sift_up(struct ss_timers *h, uint32_t i)
{
	struct ss_timer *t = h->heap[i];

	while (i > 0 && h->heap[(i - 1) / 2]->at > t->at) {
		timer_place(h, i, h->heap[(i - 1) / 2]);
		i = (i - 1) / 2;
	}
	timer_place(h, i, t);
}

static void timer_sift_down(struct ss_timers *h, uint32_t i)
{
	struct ss_timer *t = h->heap[i];

	for (;;) {
		uint32_t c = 2 * i + 1;

		if (c >= h->n)
			break;
		if (c + 1 < h->n && h->heap[c + 1]->at < h->heap[c]->at)
			c++;
		if (h->heap[c]->at >= t->at)
			break;
		timer_place(h, i, h->heap[c]);
		i = c;
	}
	timer_place(h, i, t);
}

int ss_timers_arm(struct ss_timers *h, struct ss_timer *t, uint64_t at)
{
	if (ss_timer_armed(t)) {
		if (at < t->at) {
			t->at = at;
			timer_sift_up(h, t->pos - 1);
		}
		return 0;
	}
	if (h->n == h->cap) {
		uint32_t cap = h->cap ? 2 * h->cap : 64;
		struct ss_timer **heap = realloc(h->heap, cap * sizeof(*heap));

		if (!heap)
			return -ENOMEM;
		h->heap = heap;
		h->cap = cap;
	}
	t->at = at;
	h->heap[h->n++] = t;
	timer_sift_up(h, h->n - 1);
	return 0;
}

void ss_timers_cancel(struct ss_timers *h, struct ss_timer *t)
{
	uint32_t i;
	struct ss_timer *last;

	if (!ss_timer_armed(t))
		return;
	i = t->pos - 1;
	t->pos = 0;
	last = h->heap[--h->n];
	if (i == h->n)
		return;
	/* The last entry fills the hole and moves whichever way restores the order. */
	timer_place(h, i, last);
	if (i > 0 && h->heap[(i - 1) / 2]->at > last->at)
		timer_sift_up(h, i);
	else
		timer_sift_down(h, i);
}

struct ss_timer *ss_timers_pop_due(struct ss_timers *h, uint64_t now_ms)
{
	struct ss_timer *t;

	if (h->n == 0 || h->heap[0]->at > now_ms)
		return NULL;
	t = h->heap[0];
	ss_timers_cancel(h, t);
	return t;
}

uint64_t ss_timers_next(const struct ss_timers *h)
{
	return h->n ? h->heap[0]->at : UINT64_MAX;
}

void ss_timers_fini(struct ss_timers *h)
{
	for (uint32_t i = 0; i < h->n; i++)
		h->heap[i]->pos = 0;
	free(h->heap);
	h->heap = NULL;
	h->n = h->cap = 0;
}
