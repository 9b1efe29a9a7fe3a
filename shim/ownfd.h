/* The shim's own long-lived fds, which the application's close_range and closefrom leave open. */
#ifndef SS_SHIM_OWNFD_H
#define SS_SHIM_OWNFD_H

#include <stdbool.h>

/* Remembers fd as the shim's (made by ss_private_fd). */
void ss_ownfd_add(int fd);

/* Forgets fd (the shim is closing it: ss_private_close, before the close). */
void ss_ownfd_forget(int fd);

/* The lowest fd in [from, last] that is the shim's: true with *fd_p, or false. */
bool ss_ownfd_next(unsigned from, unsigned last, unsigned *fd_p);

#endif
