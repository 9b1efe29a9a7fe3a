/*
 * Moves back to TCP that the caller waits for (down.c runs the move): an
 * exec (or a posix_spawn) whose new image inherits upgraded connections,
 * an io_uring ring (every connection, and none upgraded after it), an fd passed to
 * another process (SCM_RIGHTS), stdio on a socket (fdopen), urgent data
 * (MSG_OOB). Application threads, no lock of ours held.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdatomic.h>
#include <spawn.h>
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
		/* Before the commit point (-EAGAIN): asked again at the next look. */
		if (st == SS_SOCK_UPGRADED && (err = ss_down_begin(s)) == -EAGAIN &&
		    ss_now_ms() < end)
			err = 0;
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
		if (err || (st != SS_SOCK_FALLBACK && st != SS_SOCK_UPGRADED))
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
	else if (s && ss_sock_state(s) == SS_SOCK_LATE)
		r = ss_move_pin(s); /* it stays on TCP for good */
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

/* The file actions of the posix_spawn this thread prepares, or NULL (an exec). */
static __thread const posix_spawn_file_actions_t *handover_fa;
/* An io_uring ring is being set up: every connection moves (this thread). */
static __thread bool handover_all;
/* A ring was set up in this process: connections stay on TCP from then on. */
static atomic_bool handover_ring;

bool ss_image_inherits(struct ss_sock *s)
{
	bool inherited = false;

	pthread_mutex_lock(&s->fd_lock);
	for (int i = 0; i < s->n_fds && !inherited; i++) {
		int fl = ss_real.fcntl(s->fds[i], F_GETFD);

		inherited =
			(fl >= 0 && !(fl & FD_CLOEXEC)) || ss_spawn_dups(handover_fa, s->fds[i]);
	}
	pthread_mutex_unlock(&s->fd_lock);
	return inherited;
}

/* Whether an upgraded (or moving) connection has a name the new image inherits. */
static bool handover_inherited(struct ss_sock *s)
{
	int st = ss_sock_state(s);

	return (st == SS_SOCK_UPGRADED || st == SS_SOCK_FALLBACK || st == SS_SOCK_LATE) &&
	       (handover_all || ss_image_inherits(s));
}

/* First pass: every move starts (a connection before its commit point is asked again later). */
static void handover_exec_start(struct ss_sock *s)
{
	if (!handover_inherited(s))
		return;
	pthread_mutex_lock(&s->lock);
	if (ss_sock_state(s) == SS_SOCK_UPGRADED)
		ss_down_begin(s);
	pthread_mutex_unlock(&s->lock);
}

/* Second pass: each is waited for; they went on meanwhile, so the waits overlap. */
static void handover_exec_wait(struct ss_sock *s)
{
	if (!handover_inherited(s))
		return;
	/* On TCP still: pinned there, so that no mark can reach the new image. */
	if (ss_sock_state(s) == SS_SOCK_LATE ? ss_move_pin(s) != 0 : ss_down_now(s) != 0)
		ss_log_warn("fd %d: could not move back to TCP: the %s gets a connection it cannot "
			    "use",
			    s->fds[0], handover_all ? "io_uring ring" : "new program");
}

/* Moves every connection the new image (or ring) gets, in the two passes above. */
static void handover_move_inherited(void)
{
	ss_sock_for_each_held(handover_exec_start);
	ss_sock_for_each_held(handover_exec_wait);
}

void ss_down_before_exec(const posix_spawn_file_actions_t *fa)
{
	ss_asking_finish_all();
	handover_fa = fa;
	handover_move_inherited();
	/* A forked child's: the owner moves them (inherit.c). */
	ss_inherit_before_exec();
	handover_fa = NULL;
}

bool ss_ring_seen(void)
{
	return atomic_load_explicit(&handover_ring, memory_order_relaxed);
}

void ss_down_before_ring(void)
{
	/* Its I/O goes past libc: nothing the shim carries may be on it. */
	if (!atomic_exchange(&handover_ring, true))
		ss_log_info("an io_uring ring: every connection moves back to TCP, and new ones "
			    "stay there");
	handover_all = true;
	ss_asking_finish_all();
	handover_move_inherited();
	handover_all = false;
}
