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

/*
 * ss_poll for a call that began earlier (a blocking read that waits more
 * than once): sig_base is ss_sig_any() when it began, and a handler run
 * since ends the wait with -EINTR.
 */
int ss_poll_since(struct pollfd *fds, nfds_t n, int timeout_ms, const sigset_t *mask,
		  unsigned sig_base, bool *handled);

/* select/pselect, as ss_poll(). */
int ss_select(int nfds, fd_set *rd, fd_set *wr, fd_set *ex, int timeout_ms, const sigset_t *mask,
	      bool *handled);

#endif
