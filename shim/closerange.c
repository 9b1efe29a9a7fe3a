/*
 * The application's close_range and closefrom (intercept.c) close its fds
 * and leave open what the shim keeps: its own fds (ownfd.h) and the
 * transport's (its epoll set, the devices' command, async and channel
 * fds), which the transport lists at each call (worker_own_fds).
 */
#include <errno.h>
#include <linux/close_range.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>

#include "shim/closerange.h"
#include "shim/ownfd.h"
#include "shim/real.h"
#include "shim/shim.h"

void ss_kept_fill(struct ss_kept *k)
{
	struct ss_worker *w = atomic_load_explicit(&ss_w, memory_order_acquire);
	int n = w ? ss_tp->worker_own_fds(w, k->small, SS_KEPT_TP_SMALL) : 0;

	k->tp = k->small;
	k->n_tp = n < SS_KEPT_TP_SMALL ? n : SS_KEPT_TP_SMALL;
	if (n > SS_KEPT_TP_SMALL) {
		/* More devices than the small list holds (room for some opened meanwhile). */
		int cap = 2 * n, *big = malloc((size_t)cap * sizeof(*big));
		int m = big ? ss_tp->worker_own_fds(w, big, cap) : 0;

		if (big && m <= cap) {
			k->tp = big;
			k->n_tp = m;
		} else {
			free(big);
		}
	}
}

void ss_kept_free(struct ss_kept *k)
{
	if (k->tp != k->small)
		free(k->tp);
	k->tp = k->small;
	k->n_tp = 0;
}

bool ss_kept_one_thread(void)
{
	char line[128];
	int threads = 0;
	FILE *f = fopen("/proc/self/status", "re");

	if (!f)
		return false;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "Threads: %d", &threads) == 1)
			break;
	fclose(f);
	return threads == 1;
}

bool ss_kept_next(const struct ss_kept *k, unsigned from, unsigned last, unsigned *fd_p)
{
	unsigned best = 0;
	bool found = ss_ownfd_next(from, last, &best);

	for (int i = 0; i < k->n_tp; i++) {
		unsigned fd = (unsigned)k->tp[i];

		if (k->tp[i] >= 0 && fd >= from && fd <= last && (!found || fd < best)) {
			best = fd;
			found = true;
		}
	}
	if (found)
		*fd_p = best;
	return found;
}

int ss_kept_close_range(const struct ss_kept *k, unsigned first, unsigned last, int flags)
{
	unsigned from = first, kept;

	for (;;) {
		bool has = ss_kept_next(k, from, last, &kept);

		if (!has || kept > from) {
			if (ss_real.close_range(from, has ? kept - 1 : last, flags) != 0)
				return -1;
			flags &= ~(int)CLOSE_RANGE_UNSHARE; /* the table is this thread's now */
		}
		if (!has || kept == last)
			break;
		from = kept + 1;
	}
	/* Every fd of the range kept: the table is still to be made this thread's. */
	if ((flags & CLOSE_RANGE_UNSHARE) && unshare(CLONE_FILES) != 0)
		return -1;
	return 0;
}
