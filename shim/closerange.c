/*
 * The application's close_range and closefrom (intercept.c) close its fds
 * and leave open what the shim keeps: its own fds (ownfd.h) and the
 * transport's (its epoll set, the devices' command, async and channel
 * fds), which the transport lists at each call (worker_own_fds).
 */
#include <errno.h>
#include <linux/close_range.h>

#include "shim/closerange.h"
#include "shim/ownfd.h"
#include "shim/real.h"
#include "shim/shim.h"

void ss_kept_fill(struct ss_kept *k)
{
	struct ss_worker *w = atomic_load_explicit(&ss_w, memory_order_acquire);

	k->n_tp = w ? ss_tp->worker_own_fds(w, k->tp, SS_KEPT_TP_MAX) : 0;
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
	int ret = 0, err = 0;

	for (;;) {
		bool has = ss_kept_next(k, from, last, &kept);

		if (!has || kept > from) {
			if (ss_real.close_range(from, has ? kept - 1 : last, flags) != 0 && !err)
				err = errno, ret = -1;
			flags &= ~(int)CLOSE_RANGE_UNSHARE; /* the table is this thread's now */
		}
		if (!has || kept == last)
			break;
		from = kept + 1;
	}
	errno = err ? err : errno;
	return ret;
}
