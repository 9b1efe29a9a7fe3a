/* close_range and closefrom of the application, around the fds the shim keeps. */
#ifndef SS_SHIM_CLOSERANGE_H
#define SS_SHIM_CLOSERANGE_H

#include <stdbool.h>

/* What a close_range must leave open: the shim's fds, and the transport's as it lists them. */
#define SS_KEPT_TP_SMALL 64
struct ss_kept {
	int small[SS_KEPT_TP_SMALL];
	int *tp; /* small, or allocated for a longer list */
	int n_tp;
};

/* Takes the transport's list (none before it is loaded). */
void ss_kept_fill(struct ss_kept *k);

/* Frees what ss_kept_fill allocated. */
void ss_kept_free(struct ss_kept *k);

/* True when the process has one thread (CLOSE_RANGE_UNSHARE then unshares nothing). */
bool ss_kept_one_thread(void);

/* The lowest fd in [from, last] kept (the shim's or the transport's): true with *fd_p. */
bool ss_kept_next(const struct ss_kept *k, unsigned from, unsigned last, unsigned *fd_p);

/*
 * The real close_range of [first, last] in pieces around the kept fds
 * (CLOSE_RANGE_UNSHARE with the first piece only; unshare(CLONE_FILES)
 * when every fd of the range is kept). Returns 0, or -1 with errno at the
 * first piece that failed (no later piece is closed).
 */
int ss_kept_close_range(const struct ss_kept *k, unsigned first, unsigned last, int flags);

#endif
