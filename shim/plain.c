/*
 * A connection decided plain after our socketpair end went on the
 * application's fd: what the application wrote meanwhile (held, or taken by
 * a connection that never sent it) goes to the TCP socket first, then the
 * TCP socket goes back on the application's fd. And the handshake messages
 * that a crossing decision may leave at the head of the TCP stream are
 * taken off before the application reads (docs/protocol.md, "Rules").
 */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "shim/epoll.h"
#include "shim/ready.h"
#include "shim/real.h"
#include "shim/shim.h"
#include "transport/log.h"

size_t ss_hold_append(struct ss_sock *s, const struct iovec *iov, int n)
{
	size_t room = s->hold_max > s->hold_len ? s->hold_max - s->hold_len : 0, taken = 0;

	if (!room)
		return 0;
	if (!s->hold && !(s->hold = malloc(s->hold_max)))
		return 0;
	for (int i = 0; i < n && taken < room; i++) {
		size_t k = iov[i].iov_len < room - taken ? iov[i].iov_len : room - taken;

		memcpy(s->hold + s->hold_len + taken, iov[i].iov_base, k);
		taken += k;
	}
	s->hold_len += taken;
	return taken;
}

int ss_hold_to_tcp(struct ss_sock *s)
{
	while (s->hold_len) {
		ssize_t n =
			ss_real.send(s->tcp_fd, s->hold, s->hold_len, MSG_DONTWAIT | MSG_NOSIGNAL);

		if (n > 0) {
			ss_hold_drop_front(s, (size_t)n);
			continue;
		}
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
			return -EAGAIN;
		return n < 0 ? errno : 0;
	}
	return 0;
}

void ss_hold_to_conn(struct ss_sock *s)
{
	uint64_t end = ss_deadline_in(SS_HOLD_TO_CONN_MS);
	size_t off = 0;

	while (off < s->hold_len) {
		struct iovec iov = {s->hold + off, s->hold_len - off};
		ssize_t r = ss_tp->conn_send(s->conn, &iov, 1, s->cork);

		if (r > 0) {
			off += (size_t)r;
			continue;
		}
		if (r != -EAGAIN || ss_now_ms() >= end) {
			/* Never a byte lost without a word: the application sees a reset. */
			ss_log_error("fd %d: %zu held bytes could not go over RDMA (%s): the "
				     "connection is reset",
				     s->fds[0], s->hold_len - off,
				     r == -EAGAIN ? "no send buffer in time" : strerror((int)-r));
			ss_tp->conn_peer_gone(s->conn);
			break;
		}
		/* The device's send pool is dry: its completions free blocks. */
		ss_tp->worker_poll(ss_w);
		usleep(200);
	}
	free(s->hold);
	s->hold = NULL;
	s->hold_len = 0;
}

int ss_hold_reserve(struct ss_sock *s, size_t max)
{
	uint8_t *p;

	if (max <= s->hold_max)
		return 0;
	/* A hold made for a smaller bound grows with it: appends trust hold_max. */
	if (s->hold) {
		if (!(p = realloc(s->hold, max)))
			return -ENOMEM;
		s->hold = p;
	}
	s->hold_max = max;
	return 0;
}

int ss_hold_prepend(struct ss_sock *s, const uint8_t *p, size_t n)
{
	size_t max = n + s->hold_len > s->hold_max ? n + s->hold_len : s->hold_max;
	uint8_t *buf;

	if (!n)
		return 0;
	if (!(buf = malloc(max)))
		return -ENOMEM;
	memcpy(buf, p, n);
	if (s->hold_len)
		memcpy(buf + n, s->hold, s->hold_len);
	free(s->hold);
	s->hold = buf;
	s->hold_len += n;
	s->hold_max = max;
	return 0;
}

void ss_hold_drop_front(struct ss_sock *s, size_t n)
{
	if (n > s->hold_len)
		n = s->hold_len;
	if (!n)
		return; /* the hold may not even be made */
	memmove(s->hold, s->hold + n, s->hold_len - n);
	s->hold_len -= n;
}

void ss_fallback_enter(struct ss_sock *s, enum ss_reason why)
{
	s->reason = why;
	/*
	 * From here the connection's readiness no longer drives the mirror.
	 * Sequentially consistent, as the pollers' count read after it
	 * (ss_ready_wake_pollers) and their look at it after counting (mux.c).
	 */
	atomic_store(&s->state, SS_SOCK_FALLBACK);
	/* Its registrations go back to the kernel, where the mirror (then TCP) answers them. */
	ss_epoll_leaving(s);
	/* Threads asleep in poll, select or a blocking call on it look again (mux.c). */
	ss_ready_wake_pollers();
}

int ss_fallback(struct ss_sock *s, enum ss_reason why)
{
	uint8_t *unsent = NULL;
	ssize_t n = 0;

	ss_fallback_enter(s, why);
	if (s->conn)
		n = ss_tp->conn_take_unsent(s->conn, &unsent);
	/* What the connection took came before anything held since. */
	if (n > 0 && ss_hold_prepend(s, unsent, (size_t)n) != 0)
		ss_log_error("fd %d: no memory for %zd unsent bytes: they are lost", s->fds[0], n);
	free(unsent);
	ss_hold_reserve(s, SS_HOLD_MAX);
	ss_log_info("fd %d: falling back to TCP (%s), %zu bytes to send first", s->fds[0],
		    ss_reason_str(why), s->hold_len);
	return ss_fallback_flush(s);
}

void ss_flush_end(struct ss_sock *s, int err)
{
	/*
	 * A send that failed took the connection's error (the kernel reports
	 * it once): the application's next call gets it from us (io.c), as
	 * from the kernel. EPIPE is no error of the peer: the kernel says it
	 * again.
	 */
	if (err && err != EPIPE)
		atomic_store(&s->plain_err, err);
	if (s->shut_wr_held)
		ss_real.shutdown(s->tcp_fd, SHUT_WR);
	if (atomic_load(&s->shut_rd))
		ss_real.shutdown(s->tcp_fd, SHUT_RD);
}

int ss_fallback_flush(struct ss_sock *s)
{
	int err;

	/* After a live downgrade: the TCP exchange first, then the held bytes. */
	if (s->down && ss_down_step(s) != 0) {
		/* Writable while the hold has room (writes wait for the move meanwhile). */
		ss_mirror_show(s, s->hold_len < s->hold_max ? SS_RDY_OUT : 0);
		return -EAGAIN;
	}
	err = ss_hold_to_tcp(s);
	if (err == -EAGAIN) {
		ss_bg_watch(s, EPOLLOUT);
		ss_mirror_show(s, s->hold_len < s->hold_max ? SS_RDY_OUT : 0);
		return -EAGAIN;
	}
	/* The connection broke: its error is the application's (ss_flush_end). */
	free(s->hold);
	s->hold = NULL;
	s->hold_len = 0;
	ss_flush_end(s, err);
	/* Before the TCP socket changes hands: the progress thread must not watch it any more. */
	if (s->bg)
		ss_tp->worker_unwatch(ss_w, &s->watch);
	ss_leave_pair(s, false);
	ss_become_plain(s, s->reason);
	/*
	 * Threads asleep in the shim's waits look again: a kernel wait that
	 * began on our socketpair end would not see the TCP socket's events
	 * (Linux's poll joins the wait queues of its first pass only).
	 */
	ss_ready_wake_pollers();
	return 0;
}

/* Whether m is one that the strip rule of s takes off the stream. */
static bool plain_strips(struct ss_sock *s, const struct ss_msg *m)
{
	if (s->strip == SS_STRIP_HELLO)
		return m->type == SS_MSG_HELLO;
	return m->nonce == s->nonce;
}

int ss_strip(struct ss_sock *s, int fd)
{
	while (s->strip != SS_STRIP_NONE) {
		struct ss_msg m;
		size_t used;

		switch (ss_hs_peek(&ss_real_io, fd, &m, 0, NULL, &used)) {
		case SS_HSR_MSG:
			s->partial_ms = 0;
			if (!plain_strips(s, &m)) {
				s->strip = SS_STRIP_NONE;
				break;
			}
			if (ss_hs_consume(&ss_real_io, fd, used) != 0)
				return -EIO;
			if (s->strip == SS_STRIP_HELLO) {
				/* A HELLO after our application wrote first: no upgrade, and it is
				 * told so. */
				struct ss_msg d = {.type = SS_MSG_DECLINE,
						   .nonce = m.nonce,
						   .reason = SS_REASON_TIMEOUT};

				ss_send_msg(fd, &d, 1000);
				s->nonce = m.nonce;
				s->strip = SS_STRIP_NONCE;
			}
			continue;
		case SS_HSR_TIMEOUT: return 0; /* nothing there yet: the next read looks again */
		case SS_HSR_PARTIAL:
			/* Part of a message: the rest comes with it, or it is the peer's. */
			if (!ss_partial_lasted(&s->partial_ms))
				return -EAGAIN;
			s->strip = SS_STRIP_NONE;
			break;
		case SS_HSR_EOF:
			if (ss_read_end_is_ours(s, fd))
				return 0; /* shut for reading: a late message may still come */
			s->strip = SS_STRIP_NONE;
			break;
		default:
			/* Application bytes, or the end: nothing more is ever stripped. */
			s->strip = SS_STRIP_NONE;
			break;
		}
	}
	return 0;
}
