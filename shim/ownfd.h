/* The shim's own long-lived fds, which the application's close_range and closefrom leave open. */
#ifndef SS_SHIM_OWNFD_H
#define SS_SHIM_OWNFD_H

#include <stdbool.h>

/* Remembers fd (and the identity of its open file) as the shim's. */
void ss_ownfd_add(int fd);

/* Forgets fd (the shim is closing it). */
void ss_ownfd_forget(int fd);

/*
 * The lowest fd in [from, last] that is the shim's (remembered, and still
 * naming the same file): true with *fd_p, or false.
 */
bool ss_ownfd_next(unsigned from, unsigned last, unsigned *fd_p);

/* In a forked child: the lock is made anew (the entries stay, checked at each look). */
void ss_ownfd_after_fork(void);

#endif
