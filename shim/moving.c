/*
 * A connection on TCP that may move to RDMA (docs/design.md, "Connections
 * that start on TCP"): after LATER, both sides keep the socket as LATE.
 * The application's fd stays the TCP socket; its reads go through
 * handshake/lateio.c (peek, then take: the peer's urgent mark is never read
 * past), and once the connection is old and busy enough
 * (SRQSHIM_MOVE_AFTER_*), either side starts the move: its writes are held,
 * the marks and the handshake behind them decide, and the socket becomes
 * UPGRADED (our socketpair on the application's names, the peer's bytes
 * that came over TCP before its mark read first) or PLAIN.
 *
 * Whoever comes first moves it on, under the socket's lock: the
 * application's reads and writes (io.c), its waits, or the progress thread,
 * which looks at the connection once it is 50 ms old and from then on
 * watches a private name of the socket (tcp_fd) for the peer's mark
 * (EPOLLPRI) and, while the move is under way, for its messages.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include "handshake/clock.h"
#include "handshake/lateio.h"
#include "shim/io.h"
#include "shim/real.h"
#include "shim/shim.h"
#include "transport/log.h"

/* ---- the decisions that need a QP (lateio's hooks; lock held) ---- */

/* The held bytes must fit the connection's send slots at once, as at an upgrade at connect. */
static enum ss_reason move_fit_hold(struct ss_sock *s)
{
	size_t cap = ss_tp->conn_send_capacity(s->conn);

	if (cap < s->hold_len)
		return SS_REASON_PARAMS;
	/* From now on the hold stays within what the connection takes. */
	s->hold_max = cap < SS_HOLD_MAX ? cap : SS_HOLD_MAX;
	return SS_REASON_NONE;
}

static enum ss_reason move_prepare(void *ctx, struct ss_params *mine)
{
	struct ss_sock *s = ctx;
	enum ss_reason r = ss_tcp_bound(s) ? SS_REASON_POLICY : ss_make_conn(s, s->tcp_fd, NULL);

	if (r == SS_REASON_NONE)
		r = move_fit_hold(s);
	*mine = s->mine;
	return r;
}

static enum ss_reason move_decide(void *ctx, const struct ss_msg *hello, struct ss_params *mine)
{
	struct ss_sock *s = ctx;
	enum ss_reason r = ss_tcp_bound(s) ? SS_REASON_POLICY : ss_make_conn(s, s->tcp_fd, NULL);

	if (r == SS_REASON_NONE)
		r = ss_agree(s, s->tcp_fd, hello);
	if (r == SS_REASON_NONE)
		r = move_fit_hold(s);
	*mine = s->mine;
	s->late_peer = hello->params;
	return r;
}

static enum ss_reason move_check(void *ctx, const struct ss_msg *accept)
{
	struct ss_sock *s = ctx;
	enum ss_reason r = ss_agree(s, s->tcp_fd, accept);

	/* The connect sized the send slots to the peer's buffers: the hold must fit them. */
	if (r == SS_REASON_NONE)
		r = move_fit_hold(s);
	s->late_peer = accept->params;
	return r;
}

static const struct ss_late_hooks move_hooks = {
	.prepare = move_prepare,
	.decide = move_decide,
	.check = move_check,
};

/* ---- the ends of a move (lock held) ---- */

static void move_drop(struct ss_sock *s)
{
	ss_move_free(s);
	if (s->conn && ss_sock_state(s) != SS_SOCK_UPGRADED) {
		ss_tp->conn_destroy(s->conn); /* never started: no call can hold it */
		s->conn = NULL;
	}
}

/* Plain for good: no more marks either way, nothing held, nothing taken. */
static void move_plain(struct ss_sock *s, enum ss_reason why)
{
	move_drop(s);
	free(s->hold);
	s->hold = NULL;
	s->hold_len = 0;
	ss_bg_stop_private(s);
	ss_become_plain(s, why);
}

/* The peer broke the exchange (or we cannot go on): Linux's disconnect resets the connection. */
static void move_reset(struct ss_sock *s, const char *why)
{
	struct sockaddr unspec = {.sa_family = AF_UNSPEC};

	ss_log_warn("fd %d: the move to RDMA failed (%s): the connection is reset", s->fds[0], why);
	ss_real.connect(s->tcp_fd, &unspec, sizeof(unspec));
	move_plain(s, SS_REASON_MALFORMED);
}

/* Decided for RDMA and our last message sent: the socket becomes an upgraded one. */
static void move_to_rdma(struct ss_sock *s)
{
	struct ss_lateio *x = s->late;

	/* The peer's bytes that came over TCP before its mark are read first. */
	if (x->taken_len) {
		uint8_t *buf = malloc(x->taken_len);

		if (!buf || (memcpy(buf, x->taken + x->taken_off, x->taken_len),
			     ss_tp->conn_put_front(s->conn, buf, x->taken_len) != 0)) {
			ss_tp->conn_peer_gone(s->conn);
			ss_log_error("fd %d: no memory for the bytes read before the move: the "
				     "connection is reset",
				     s->fds[0]);
		}
	}
	if (s->n_fds > 0 && ss_enter_pair(s) != 0) {
		/* No socketpair (no fds left): the peer sends over RDMA now, which we cannot show.
		 */
		ss_log_error("fd %d: cannot move to RDMA (no socketpair): the connection is reset",
			     s->fds[0]);
		ss_tp->conn_peer_gone(s->conn);
	}
	ss_move_free(s);
	/* Both QPs receive: the client sent READY, the server read it. */
	s->committed = true;
	ss_start_upgraded(s, &s->late_peer);
}

/*
 * Decided for TCP: the held bytes go to TCP (as much as it takes now), then
 * a held shutdown. Returns true while bytes are left.
 */
static bool move_flush(struct ss_sock *s)
{
	int err = ss_hold_to_tcp(s);

	if (err == -EAGAIN)
		return true;
	if (s->hold_len || err || s->shut_wr_held) {
		free(s->hold);
		s->hold = NULL;
		s->hold_len = 0;
		ss_flush_end(s, err);
	}
	return false;
}

/* Acts on what the exchange decided. */
static void move_settle(struct ss_sock *s, int r)
{
	struct ss_lateio *x = s->late;

	if (ss_sock_state(s) != SS_SOCK_LATE)
		return;
	if (r < 0 || x->rules.state >= SS_LATE_RDMA)
		ss_log_info("fd %d: move %s (%d), %zu held, %zu taken", s->fds[0],
			    ss_late_state_str(x->rules.state), r, s->hold_len, x->taken_len);
	if (x->rules.state == SS_LATE_BROKEN || r == -ECONNRESET) {
		move_reset(s, x->rules.state == SS_LATE_BROKEN ? "the peer broke the exchange"
							       : "connection reset");
		return;
	}
	if (x->rules.state == SS_LATE_RDMA && !ss_lateio_owes(x)) {
		move_to_rdma(s);
		return;
	}
	if (x->rules.state != SS_LATE_TCP)
		return;
	if (s->conn) {
		ss_tp->conn_destroy(s->conn); /* declined: never started */
		s->conn = NULL;
	}
	if (move_flush(s))
		return;
	/* What the application has not read of the peer's taken bytes is still ours. */
	if (!x->taken_len && !x->taken_eof)
		move_plain(s, x->rules.reason ? (enum ss_reason)x->rules.reason : SS_REASON_LATER);
}

/*
 * Starts the move when the connection has done enough (a side that waits
 * to move). The counts first, then the age on the coarse clock: no system
 * call for a connection that has not done enough (a guest's precise clock
 * is one).
 */
static void move_ripen(struct ss_sock *s)
{
	struct ss_late_use use, min;

	if (s->late->rules.state != SS_LATE_QUIET || ss_cfg.move_after_ms < 0 ||
	    (s->late_bytes < (uint64_t)ss_cfg.move_after_bytes &&
	     s->late_calls < (uint64_t)ss_cfg.move_after_calls))
		return;
	use = (struct ss_late_use){.age_ms = ss_now_coarse_ms() - s->late_born_ms,
				   .bytes = s->late_bytes,
				   .calls = s->late_calls};
	min = (struct ss_late_use){.age_ms = (uint64_t)ss_cfg.move_after_ms,
				   .bytes = (uint64_t)ss_cfg.move_after_bytes,
				   .calls = (uint64_t)ss_cfg.move_after_calls};
	if (!ss_late_ripe(&use, &min)) {
		/* Busy enough, held back by its age alone: the process's first device opens
		 * meanwhile. */
		ss_tp_warm(s, s->tcp_fd);
		return;
	}
	ss_log_info("fd %d: moving after %llu ms, %llu bytes, %llu calls", s->fds[0],
		    (unsigned long long)use.age_ms, (unsigned long long)use.bytes,
		    (unsigned long long)use.calls);
	move_settle(s, ss_lateio_event(s->late, SS_LATE_EV_MOVE));
}

/*
 * Moves the exchange on, then starts the move if it is ripe. quiet_look:
 * also look for the peer's lone mark while nothing is under way (a poll:
 * the progress thread's look, whose watch fired). The application's reads
 * find that mark at the head anyway, and its writes may go on until they
 * do, so their calls skip that system call.
 */
static void move_step(struct ss_sock *s, bool quiet_look)
{
	if (ss_sock_state(s) != SS_SOCK_LATE)
		return;
	if (quiet_look || s->late->rules.state != SS_LATE_QUIET || ss_lateio_owes(s->late))
		move_settle(s, ss_lateio_step(s->late));
	if (ss_sock_state(s) == SS_SOCK_LATE)
		move_ripen(s);
}

void ss_move_step(struct ss_sock *s)
{
	move_step(s, true);
}

void ss_move_look(struct ss_sock *s)
{
	/*
	 * The first look arms the watch of EPOLLPRI (decide.c), which reports
	 * a mark already there at once: no quiet look of its own.
	 */
	move_step(s, s->late_looked);
	s->late_looked = true;
}

/* ---- entering, and what the waits wait for ---- */

/* The progress thread's first look at a connection on TCP: a peer with the default thresholds
 * (SRQSHIM_MOVE_AFTER_MS) marks no sooner. */
#define MOVE_FIRST_LOOK_MS 50

bool ss_move_allowed(const struct ss_sock *s)
{
	return ss_cfg.move_after_ms >= 0 && !atomic_load(&s->urg_app);
}

/*
 * A client answered LATER enters LATE even with urg_app: the server is LATE
 * already, and only a pin tells it not to mark (ss_move_urg_app pins it).
 */
static bool move_may_enter(const struct ss_sock *s, bool client)
{
	return client ? ss_cfg.move_after_ms >= 0 : ss_move_allowed(s);
}

enum ss_reason ss_move_enter(struct ss_sock *s, int fd, bool client, uint32_t nonce)
{
	struct ss_lateio *x;
	int look;

	if (!move_may_enter(s, client))
		return SS_REASON_POLICY;
	if (s->n_fds == 0 || s->shut_wr || s->shut_wr_held || atomic_load(&s->shut_rd) ||
	    atomic_load(&s->plain_err) || s->strip != SS_STRIP_NONE || ss_bg_start(s) != 0)
		return SS_REASON_RESOURCE;
	if (s->tcp_fd < 0 && (s->tcp_fd = ss_private_fd(fd)) < 0) {
		s->tcp_fd = -1;
		return SS_REASON_RESOURCE;
	}
	if (!(x = malloc(sizeof(*x))))
		return SS_REASON_RESOURCE;
	ss_lateio_init(x, &ss_real_io, s->tcp_fd, client, nonce, &move_hooks, s);
	s->late = x;
	s->nonce = nonce;
	s->late_born_ms = ss_now_coarse_ms();
	s->late_bytes = s->late_calls = 0;
	s->late_looked = false;
	s->hold_max = SS_HOLD_MAX;
	s->reason = SS_REASON_LATER;
	ss_sock_set_state(s, SS_SOCK_LATE);
	ss_log_info("fd %d: on TCP, may move (%s, private name %d)", s->fds[0],
		    client ? "client" : "server", s->tcp_fd);
	/*
	 * The peer's mark, whether or not the application reads: the progress
	 * thread looks once the connection is MOVE_FIRST_LOOK_MS old (or our
	 * own SRQSHIM_MOVE_AFTER_MS, if sooner), and watches from then on
	 * (decide.c). Not before: a short connection costs it no watch and no
	 * look (its timer is cancelled when the socket goes). The
	 * application's own reads find an earlier mark at the head; one that
	 * waits without reading leaves a peer that moves sooner waiting for
	 * that look. On the nudges' grid (connections share the wake-up),
	 * after the age on the precise clock (the coarse one lags it by a
	 * tick).
	 */
	look = ss_cfg.move_after_ms < MOVE_FIRST_LOOK_MS ? ss_cfg.move_after_ms
							 : MOVE_FIRST_LOOK_MS;
	ss_bg_rest(s, ss_nudge_at(s->late_born_ms + (uint64_t)look));
	return SS_REASON_NONE;
}

void ss_move_leave(struct ss_sock *s, enum ss_reason why)
{
	move_plain(s, why);
}

/* True while the application's writes wait in the hold. */
static bool move_holds(const struct ss_sock *s)
{
	const struct ss_lateio *x = s->late;

	return ss_late_holds(&x->rules) || x->rules.state == SS_LATE_RDMA || s->hold_len > 0;
}

unsigned ss_move_events(struct ss_sock *s)
{
	struct ss_lateio *x = s->late;
	unsigned ev = EPOLLPRI;

	if (ss_sock_state(s) != SS_SOCK_LATE)
		return 0;
	if (ss_lateio_owes(x) || (x->rules.state == SS_LATE_TCP && s->hold_len))
		ev |= EPOLLOUT;
	/* Past our mark the peer's bytes are taken (up to the bound) and its messages read. */
	if (x->rules.state != SS_LATE_QUIET && x->rules.state != SS_LATE_TCP && !ss_lateio_full(x))
		ev |= EPOLLIN;
	return ev;
}

/* ---- the application's calls ---- */

/* Reads into one buffer. Returns the count, -EAGAIN, -SS_REDO or -errno. Lock held. */
static ssize_t move_read(struct ss_sock *s, void *buf, size_t len, int flags)
{
	size_t got = 0;
	int r;

	move_step(s, false);
	if (ss_sock_state(s) != SS_SOCK_LATE)
		return -SS_REDO;
	/* Nothing there: no look for a lone mark (the waits' and the progress thread's). */
	r = ss_lateio_read(s->late, buf, len, flags & ~(MSG_WAITALL | MSG_DONTWAIT), false, &got);
	if (r == SS_LATEIO_BYTES && !(flags & MSG_PEEK) && got) {
		s->late_bytes += got;
		s->late_calls++;
	}
	move_settle(s, r < 0 ? r : 0);
	if (r == SS_LATEIO_BYTES)
		return (ssize_t)got;
	if (r == SS_LATEIO_DECIDED || ss_sock_state(s) != SS_SOCK_LATE)
		return -SS_REDO;
	return r == SS_LATEIO_WAIT ? -EAGAIN : r;
}

ssize_t ss_move_recv(struct ss_sock *s, const struct iovec *iov, int n, int flags)
{
	size_t total = ss_iov_total(iov, n);
	uint8_t *tmp = NULL, *buf = n > 0 ? iov[0].iov_base : NULL;
	ssize_t r;

	/* Several buffers: one read (a peek must not see the same bytes twice), then scattered. */
	if (n > 1) {
		total = total < (1u << 20) ? total : (1u << 20);
		if (!(tmp = malloc(total ? total : 1)))
			return -ENOMEM;
		buf = tmp;
	} else if (n == 1) {
		total = iov[0].iov_len;
	}
	pthread_mutex_lock(&s->lock);
	r = ss_sock_state(s) == SS_SOCK_LATE ? move_read(s, buf, total, flags) : -SS_REDO;
	pthread_mutex_unlock(&s->lock);
	/* (MSG_TRUNC: nothing was copied, and nothing is to be.) */
	for (int i = 0, off = 0; tmp && !(flags & MSG_TRUNC) && r > 0 && i < n && off < r; i++) {
		size_t k = iov[i].iov_len < (size_t)(r - off) ? iov[i].iov_len : (size_t)(r - off);

		memcpy(iov[i].iov_base, tmp + off, k);
		off += (int)k;
	}
	free(tmp);
	return r;
}

ssize_t ss_move_send(struct ss_sock *s, const struct iovec *iov, int n, int flags)
{
	ssize_t r;

	pthread_mutex_lock(&s->lock);
	move_step(s, false);
	if (ss_sock_state(s) != SS_SOCK_LATE) {
		r = -SS_REDO;
	} else if (move_holds(s)) {
		/* Behind our mark (or behind held bytes): held, as a socket buffer would. */
		r = (ssize_t)ss_hold_append(s, iov, n);
		if (r == 0 && ss_iov_total(iov, n))
			r = -EAGAIN;
		move_step(s, false);
	} else {
		struct msghdr mh = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)n};

		r = ss_real.sendmsg(s->tcp_fd, &mh,
				    (flags & ~MSG_DONTWAIT) | MSG_DONTWAIT | MSG_NOSIGNAL);
		r = r < 0 ? -errno : r;
		if (r > 0) {
			s->late_bytes += (uint64_t)r;
			s->late_calls++;
			move_ripen(s);
		}
	}
	pthread_mutex_unlock(&s->lock);
	return r;
}

short ss_move_wait_events(struct ss_sock *s, bool out, bool pri, uint32_t *takes_p)
{
	short ev = 0;

	pthread_mutex_lock(&s->lock);
	move_step(s, pri);
	if (ss_sock_state(s) == SS_SOCK_LATE) {
		*takes_p = ss_lateio_takes(s->late);
		/* Holding: the move's end is looked for between slices (and by the progress
		 * thread). */
		if (!out)
			ev = s->late->taken_len || s->late->taken_eof ? SS_MOVE_NOW
								      : POLLIN | POLLPRI;
		else if (!move_holds(s))
			ev = POLLOUT | POLLPRI;
		else if (s->hold_len < s->hold_max)
			ev = SS_MOVE_NOW; /* as a socket buffer with room */
		else if (ss_lateio_owes(s->late))
			ev = POLLOUT;
	}
	pthread_mutex_unlock(&s->lock);
	return ev;
}

bool ss_move_reads_tcp(struct ss_sock *s)
{
	bool r;

	pthread_mutex_lock(&s->lock);
	r = ss_sock_state(s) == SS_SOCK_LATE && s->late->rules.state == SS_LATE_QUIET &&
	    !s->late->taken_len && !s->late->taken_eof;
	pthread_mutex_unlock(&s->lock);
	return r;
}

void ss_move_shown(struct ss_sock *s, uint32_t takes, short revents)
{
	pthread_mutex_lock(&s->lock);
	/* A socket is LATE once: the same exchange as when the poll began. */
	if (ss_sock_state(s) == SS_SOCK_LATE)
		ss_lateio_shown(s->late, takes, revents);
	pthread_mutex_unlock(&s->lock);
}

/* ---- the ends the application asks for: pins, shutdown, close ---- */

/* True while a move is under way (lock held). */
static bool move_under_way(struct ss_sock *s)
{
	return ss_sock_state(s) == SS_SOCK_LATE &&
	       (s->late->rules.state != SS_LATE_QUIET && s->late->rules.state != SS_LATE_TCP);
}

/*
 * Waits in this thread (lock held, released while asleep) until s is no
 * longer LATE or stays on TCP with nothing held, within SRQSHIM_LINGER_MS;
 * beyond, the connection is reset (a peer that does not answer).
 */
static void move_finish(struct ss_sock *s)
{
	uint64_t end = ss_deadline_in(ss_cfg.linger_ms);
	int slice = 1;

	for (;;) {
		struct pollfd p;

		ss_move_step(s);
		if (ss_sock_state(s) != SS_SOCK_LATE ||
		    (s->late->rules.state == SS_LATE_TCP && !s->hold_len))
			return;
		if (ss_now_ms() >= end)
			break;
		p = (struct pollfd){.fd = s->tcp_fd, .events = (short)ss_move_events(s)};
		pthread_mutex_unlock(&s->lock);
		ss_real.poll(&p, 1, slice);
		slice = slice < 64 ? 2 * slice : 64;
		pthread_mutex_lock(&s->lock);
	}
	move_reset(s, "the peer did not answer in time");
}

int ss_move_pin(struct ss_sock *s)
{
	int st;

	pthread_mutex_lock(&s->lock);
	if (ss_sock_state(s) == SS_SOCK_LATE && s->late->rules.state != SS_LATE_TCP)
		move_settle(s, ss_lateio_event(s->late, SS_LATE_EV_PIN));
	if (ss_sock_state(s) == SS_SOCK_LATE)
		move_finish(s);
	st = ss_sock_state(s);
	pthread_mutex_unlock(&s->lock);
	/* Moved before the pin was told: back to TCP the usual way. */
	return st == SS_SOCK_UPGRADED || st == SS_SOCK_FALLBACK ? ss_down_now(s) : 0;
}

bool ss_move_shutdown(struct ss_sock *s, int how, int *ret)
{
	bool done = false;

	pthread_mutex_lock(&s->lock);
	/* No mark after our FIN: a quiet connection stays on TCP (late.c). */
	if (ss_sock_state(s) == SS_SOCK_LATE && s->late->rules.state == SS_LATE_QUIET)
		move_settle(s, ss_lateio_event(s->late, SS_LATE_EV_SHUT));
	if (ss_sock_state(s) == SS_SOCK_LATE)
		move_finish(s);
	/* On TCP for good, the peer's taken bytes still to read: the kernel's shutdown now. */
	if (ss_sock_state(s) == SS_SOCK_LATE) {
		if (how != SHUT_WR)
			atomic_store(&s->shut_rd, true);
		*ret = ss_real.shutdown(s->tcp_fd, how) ? -errno : 0;
		done = true;
	}
	pthread_mutex_unlock(&s->lock);
	return done;
}

bool ss_move_close(struct ss_sock *s)
{
	if (move_under_way(s) || s->hold_len) {
		/* Our end of stream follows what is held, wherever the move decides. */
		s->shut_wr_held = true;
		return true;
	}
	/* A mark of the peer's that no look found yet: passed, so that the close is a FIN. */
	if (ss_sock_state(s) == SS_SOCK_LATE && s->late->rules.state == SS_LATE_QUIET)
		ss_lateio_pass_lone_mark(s->late);
	move_plain(s, SS_REASON_LATER);
	return false;
}

/*
 * Zerocopy completions asked for (the mark set): a client's negotiation
 * ends first (under the lock, which also lets a server's decision under
 * way end: later ones see the mark and decline), then a connection that
 * a decision made LATE or upgraded is pinned or moves back to TCP.
 */
static void move_zerocopy(struct ss_sock *s)
{
	uint64_t end = 0;
	int st;

	pthread_mutex_lock(&s->lock);
	ss_client_settle(s, &end);
	st = ss_sock_state(s);
	pthread_mutex_unlock(&s->lock);
	if (st == SS_SOCK_LATE || st == SS_SOCK_UPGRADED)
		ss_move_pin(s);
}

void ss_move_urg_app(struct ss_sock *s, unsigned how)
{
	atomic_fetch_or(&s->urg_app, how);
	/* A signal handler's call inside a shim call that may hold this socket's lock: no wait. */
	if (ss_in_call)
		return;
	/* A client still asking: its answer first (LATER makes it LATE), then the pin. */
	if (ss_sock_state(s) == SS_SOCK_ASKING)
		ss_asking_finish(s);
	if (ss_sock_state(s) == SS_SOCK_LATE)
		ss_move_pin(s);
	if (how & SS_URG_ZEROCOPY)
		move_zerocopy(s);
}

static void move_pin_one(struct ss_sock *s)
{
	if (ss_sock_state(s) == SS_SOCK_LATE)
		ss_move_pin(s);
}

void ss_move_pin_all(void)
{
	/* A handler that interrupted a shim call may fork: that call may hold a socket's lock. */
	if (ss_in_call)
		return;
	ss_sock_for_each_held(move_pin_one);
}

void ss_move_free(struct ss_sock *s)
{
	if (s->late) {
		ss_lateio_free(s->late);
		free(s->late);
		s->late = NULL;
	}
}
