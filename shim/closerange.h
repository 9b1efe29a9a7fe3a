/* close_range and closefrom of the application, around the fds the shim keeps. */
#ifndef SS_SHIM_CLOSERANGE_H
#define SS_SHIM_CLOSERANGE_H

#include <stdbool.h>

/* What a close_range must leave open: the shim's fds, and the transport's as it lists them. */
#define SS_KEPT_TP_MAX 64
struct ss_kept {
	int tp[SS_KEPT_TP_MAX];
	int n_tp;
};

/* Takes the transport's list (none before it is loaded). */
void ss_kept_fill(struct ss_kept *k);

/* The lowest fd in [from, last] kept (the shim's or the transport's): true with *fd_p. */
bool ss_kept_next(const struct ss_kept *k, unsigned from, unsigned last, unsigned *fd_p);

/*
 * The real close_range of [first, last] in pieces around the kept fds
 * (CLOSE_RANGE_UNSHARE with the first piece only). Returns 0, or -1 with
 * errno of the first piece that failed.
 */
int ss_kept_close_range(const struct ss_kept *k, unsigned first, unsigned last, int flags);

#endif
