/* poll, ppoll, select and pselect with upgraded sockets among their fds (mux.c). */
#ifndef SS_SHIM_MUX_H
#define SS_SHIM_MUX_H

#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <sys/select.h>

/*
 * poll/ppoll (mask: ppoll's, or NULL). *handled false: no upgraded socket
 * among fds (make the real call). Returns the count, or -errno.
 */
int ss_poll(struct pollfd *fds, nfds_t n, int timeout_ms, const sigset_t *mask, bool *handled);

/* select/pselect, as ss_poll(). */
int ss_select(int nfds, fd_set *rd, fd_set *wr, fd_set *ex, int timeout_ms, const sigset_t *mask,
	      bool *handled);

#endif
