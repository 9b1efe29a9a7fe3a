/*
 * Moves back to TCP that the caller waits for (down.c runs the move): an
 * exec whose new image inherits upgraded connections, an fd passed to
 * another process (SCM_RIGHTS), stdio on a socket (fdopen), urgent data
 * (MSG_OOB). Application threads, no lock of ours held.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>

#include "shim/real.h"
#include "shim/shim.h"
#include "transport/log.h"

/* How often a waiting caller looks again without an event on the TCP socket. */
#define HANDOVER_POLL_MS 2

int ss_down_now(struct ss_sock *s)
{
	/* The move's own bound, then as long again for its bytes to go to TCP. */
	uint64_t end = ss_deadline_in(2 * ss_cfg.linger_ms);
	int st, err = 0;

	for (;;) {
		struct pollfd p = {.fd = -1};

		pthread_mutex_lock(&s->lock);
		st = ss_sock_state(s);
		if (st == SS_SOCK_UPGRADED)
			err = ss_down_begin(s);
		if (err == 0 && ss_sock_state(s) == SS_SOCK_FALLBACK) {
			if (ss_now_ms() >= end)
				ss_down_give_up(s);
			else
				ss_fallback_flush(s);
		}
		st = ss_sock_state(s);
		if (st == SS_SOCK_FALLBACK && s->tcp_fd >= 0) {
			p.fd = s->tcp_fd;
			p.events = (short)(s->down ? ss_down_events(s) : EPOLLOUT);
		}
		pthread_mutex_unlock(&s->lock);
		if (err || st != SS_SOCK_FALLBACK)
			break;
		/* Its TCP side, or the peer's end of stream on the CQs (down_build_return). */
		ss_real.poll(&p, 1, HANDOVER_POLL_MS);
	}
	return err ? err : st == SS_SOCK_PLAIN ? 0 : -EIO;
}

int ss_down_fd(int fd)
{
	struct ss_sock *s = ss_sock_get(fd);
	int r = 0;

	if (s && (ss_sock_state(s) == SS_SOCK_UPGRADED || ss_sock_state(s) == SS_SOCK_FALLBACK))
		r = ss_down_now(s);
	ss_sock_put(s);
	return r;
}

void ss_down_passed_fds(const struct msghdr *msg)
{
	for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c; c = CMSG_NXTHDR((struct msghdr *)msg, c)) {
		size_t n;

		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS ||
		    c->cmsg_len < CMSG_LEN(0))
			continue;
		n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < n; i++) {
			int fd;

			memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
			ss_down_fd(fd);
		}
	}
}

/* Connections whose fd survives the exec (a name without close-on-exec), with a reference. */
static struct ss_sock **down_exec_list;
static size_t down_exec_n, down_exec_cap;

static void down_exec_pick(struct ss_sock *s)
{
	bool inherited = false;
	struct ss_sock **p;

	if (ss_sock_state(s) != SS_SOCK_UPGRADED)
		return;
	pthread_mutex_lock(&s->fd_lock);
	for (int i = 0; i < s->n_fds && !inherited; i++) {
		int fl = ss_real.fcntl(s->fds[i], F_GETFD);

		inherited = fl >= 0 && !(fl & FD_CLOEXEC);
	}
	pthread_mutex_unlock(&s->fd_lock);
	if (!inherited || !ss_sock_tryget(s))
		return;
	if (down_exec_n == down_exec_cap) {
		size_t cap = down_exec_cap ? 2 * down_exec_cap : 16;

		if (!(p = realloc(down_exec_list, cap * sizeof(*p)))) {
			ss_sock_put(s);
			return;
		}
		down_exec_list = p;
		down_exec_cap = cap;
	}
	down_exec_list[down_exec_n++] = s;
}

void ss_down_before_exec(void)
{
	down_exec_n = 0;
	ss_sock_for_each(down_exec_pick);
	/* All start at once, then each is waited for: the waits overlap. */
	for (size_t i = 0; i < down_exec_n; i++) {
		struct ss_sock *s = down_exec_list[i];

		pthread_mutex_lock(&s->lock);
		if (ss_sock_state(s) == SS_SOCK_UPGRADED && ss_down_begin(s) != 0)
			ss_log_warn("fd %d: the new program gets a connection it cannot read "
				    "(the peer cannot move it back to TCP)",
				    s->fds[0]);
		pthread_mutex_unlock(&s->lock);
	}
	for (size_t i = 0; i < down_exec_n; i++) {
		ss_down_now(down_exec_list[i]);
		ss_sock_put(down_exec_list[i]);
	}
	down_exec_n = 0;
}
