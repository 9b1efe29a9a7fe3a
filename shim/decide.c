/*
 * What both sides of a negotiation share (docs/protocol.md, "Rules"): the
 * connection and the agreement on it, the outcome, the background work the
 * progress thread does for a socket, and the TCP side of an upgraded
 * connection. The end of a connection is close.c's.
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stddef.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/random.h>

#include "handshake/gid.h"
#include "handshake/negotiate.h"
#include "shim/epoll.h"
#include "shim/ready.h"
#include "shim/real.h"
#include "shim/shim.h"
#include "shim/stats.h"
#include "transport/log.h"

static ssize_t decide_real_send(int fd, const void *b, size_t n, int f)
{
	return ss_real.send(fd, b, n, f);
}

static ssize_t decide_real_recv(int fd, void *b, size_t n, int f)
{
	return ss_real.recv(fd, b, n, f);
}

static int decide_real_poll(struct pollfd *p, nfds_t n, int t)
{
	return ss_real.poll(p, n, t);
}

static int decide_real_ioctl(int fd, unsigned long req, int *arg)
{
	return ss_real.ioctl(fd, req, arg);
}

const struct ss_hs_io ss_real_io = {decide_real_send, decide_real_recv, decide_real_poll,
				    decide_real_ioctl};

/*
 * Nonces: a counter through a 64-bit mix (splitmix64's finaliser) keyed by
 * a random seed read once per process (a forked child reads its own), so
 * that a connection costs no getrandom call.
 */
static _Atomic uint64_t nonce_seed; /* 0: not read yet */
static _Atomic uint64_t nonce_count;

uint32_t ss_new_nonce(void)
{
	uint64_t seed = atomic_load_explicit(&nonce_seed, memory_order_relaxed), x;

	if (seed == 0) {
		if (getrandom(&seed, sizeof(seed), GRND_NONBLOCK) != sizeof(seed))
			seed = ss_now_us() * 0x9E3779B97F4A7C15ull;
		seed |= 1;
		atomic_store_explicit(&nonce_seed, seed, memory_order_relaxed);
	}
	x = seed + atomic_fetch_add_explicit(&nonce_count, 1, memory_order_relaxed) *
			   0x9E3779B97F4A7C15ull;
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
	x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
	return (uint32_t)(x ^ (x >> 31));
}

void ss_nonce_after_fork(void)
{
	atomic_store_explicit(&nonce_seed, 0, memory_order_relaxed);
}

uint64_t ss_nudge_at(uint64_t from_ms)
{
	return (from_ms / SS_NUDGE_MS + 2) * SS_NUDGE_MS;
}

bool ss_partial_lasted(uint64_t *since_ms)
{
	uint64_t now = ss_now_ms();

	if (!*since_ms)
		*since_ms = now;
	return now - *since_ms >= SS_PARTIAL_MS;
}

uint64_t ss_deadline_in(int ms)
{
	return ss_now_ms() + (uint64_t)ms;
}

int ss_rtt_ms(int fd)
{
	struct tcp_info ti;
	socklen_t len = sizeof(ti);

	if (ss_real.getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0)
		return 0;
	return (int)(ti.tcpi_rtt / 1000);
}

bool ss_read_end_is_ours(struct ss_sock *s, int fd)
{
	struct tcp_info ti;
	socklen_t len = sizeof(ti);

	if (!atomic_load(&s->shut_rd) ||
	    ss_real.getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0)
		return false;
	/* The peer's FIN is in from CLOSE_WAIT on; before, the end is our SHUT_RD's. */
	return ti.tcpi_state == TCP_ESTABLISHED || ti.tcpi_state == TCP_FIN_WAIT1 ||
	       ti.tcpi_state == TCP_FIN_WAIT2;
}

int ss_send_msg(int fd, const struct ss_msg *m, int ms)
{
	return ss_hs_write(&ss_real_io, fd, m, ms);
}

static const struct ss_conn_hooks decide_hooks = {.ready = ss_ready_conn};

enum ss_reason ss_make_conn(struct ss_sock *s, int fd, const struct sockaddr_storage *local)
{
	struct ss_transport_cfg t;
	struct sockaddr_storage here;
	socklen_t len = sizeof(here);
	enum ss_reason r;

	if (!local) {
		if (ss_real.getsockname(fd, (struct sockaddr *)&here, &len) != 0)
			return SS_REASON_RESOURCE;
		local = &here;
	}
	r = ss_tp_load();
	if (r != SS_REASON_NONE)
		return r;
	ss_transport_cfg_fill(&t);
	if (ss_tp->conn_create(ss_w, &t, (const struct sockaddr *)local, &decide_hooks, s, &s->conn,
			       &s->mine, &r) != 0)
		return r != SS_REASON_NONE ? r : SS_REASON_RESOURCE;
	return SS_REASON_NONE;
}

enum ss_reason ss_agree(struct ss_sock *s, int fd, const struct ss_msg *peer)
{
	struct sockaddr_storage pa;
	socklen_t len = sizeof(pa);
	struct ss_agreement agr;
	uint8_t gids[64][16];
	size_t n;
	enum ss_reason r;

	r = ss_negotiate(&s->mine, peer, &agr);
	if (r != SS_REASON_NONE)
		return r;
	if (ss_real.getpeername(fd, (struct sockaddr *)&pa, &len) != 0)
		return SS_REASON_RESOURCE;
	n = ss_tp->conn_local_gids(s->conn, gids, 64);
	r = ss_check_peer_gid(peer->params.gid, (struct sockaddr *)&pa, (const uint8_t(*)[16])gids,
			      n);
	if (r != SS_REASON_NONE)
		return r;
	if (ss_tp->conn_connect(s->conn, &peer->params, &agr) != 0)
		return SS_REASON_RESOURCE;
	return SS_REASON_NONE;
}

void ss_become_upgraded(struct ss_sock *s, const struct ss_params *peer)
{
	s->reason = SS_REASON_NONE;
	s->peer_mode = peer->recv_mode;
	s->peer_caps = peer->caps;
	s->peer_window = peer->window;
	ss_sock_set_state(s, SS_SOCK_UPGRADED);
	ss_log_info("fd %d: upgraded (peer %s)", s->fds[0],
		    peer->recv_mode == SS_RECV_SRQ ? "srq" : "rq");
	ss_publish(s);
	/* Its epoll registrations move into the shadows that can answer them. */
	ss_epoll_upgraded(s);
	/* The TCP side: READY (or a crossing DECLINE) before the commit point, the peer's end
	 * after. */
	ss_bg_watch(s, EPOLLIN | EPOLLRDHUP);
}

void ss_start_upgraded(struct ss_sock *s, const struct ss_params *peer)
{
	ss_tp->conn_start(s->conn);
	ss_hold_to_conn(s);
	if (s->shut_wr_held)
		ss_tp->conn_shutdown_wr(s->conn);
	ss_become_upgraded(s, peer);
	ss_tp->conn_resync(s->conn);
}

void ss_become_plain(struct ss_sock *s, enum ss_reason why)
{
	s->reason = why;
	ss_sock_set_state(s, SS_SOCK_PLAIN);
	if (why != SS_REASON_NONE)
		ss_log_info("fd %d: TCP (%s)", s->fds[0], ss_reason_str(why));
	if (s->stat)
		/* Shown upgraded (it moves back), or on TCP while it might move (LATE). */
		ss_stats_conn_set(s->stat, SS_ST_TCP, why, s->stat->state == SS_ST_UPGRADED);
	else
		ss_publish(s);
}

void ss_publish(struct ss_sock *s)
{
	struct ss_stats_conn *st = s->stat;
	int state = ss_sock_state(s);
	bool up = state == SS_SOCK_UPGRADED;

	if ((!up && state != SS_SOCK_PLAIN && state != SS_SOCK_LATE) ||
	    (state == SS_SOCK_PLAIN && s->reason == SS_REASON_NONE))
		return;
	if (st && (!up || st->state == SS_ST_UPGRADED))
		return; /* shown as it is */
	/* A new slot needs a name to show; one shown already follows its move after a close. */
	if (!st && (s->n_fds == 0 ||
		    !(st = ss_stats_conn_open(s->fds[0], s->tcp_fd >= 0 ? s->tcp_fd : s->fds[0],
					      s->dst_len ? (const struct sockaddr *)&s->dst : NULL,
					      up ? SS_ST_UPGRADED : SS_ST_TCP, s->reason))))
		return;
	if (up) {
		st->mode = ss_cfg.mode == SS_MODE_SRQ ? SS_RECV_SRQ : SS_RECV_RQ;
		st->peer_mode = s->peer_mode;
		st->tx_window = s->peer_window;
		st->rx_window = (uint32_t)(ss_cfg.mode == SS_MODE_SRQ ? ss_cfg.srq_window
								      : ss_cfg.rq_depth);
		/* Moved to RDMA, shown on TCP (LATE) until now: the state last, so that no
		 * reader sees it upgraded without the fields above. */
		if (st->state != SS_ST_UPGRADED)
			ss_stats_conn_set(st, SS_ST_UPGRADED, SS_REASON_NONE, false);
		ss_tp->conn_publish(s->conn, &st->st);
	}
	s->stat = st;
}

/* ---- background work: the progress thread moves a socket on ---- */

/* Runs what the socket's state needs; lock held. Returns the events to watch next (0: none). */
static unsigned decide_bg_run(struct ss_sock *s)
{
	int st = ss_sock_state(s);

	switch (st) {
	case SS_SOCK_CONNECTING:
	case SS_SOCK_RECONNECTING:
	case SS_SOCK_PROBING:
	case SS_SOCK_ASKING: ss_client_step(s); break;
	case SS_SOCK_ACCEPTED:
		if (ss_server_step(s))
			return EPOLLIN;
		break; /* LATE now, or decided */
	case SS_SOCK_UPGRADED: {
		/* Asked by the operator, or the peer's stream switched on the QP. */
		bool asked = atomic_exchange(&s->down_wanted, false);
		int r = asked || (atomic_load(&s->rdy) & SS_RDY_SWITCH) ? ss_down_begin(s)
									: -EINVAL;

		if (r == 0) {
			ss_fallback_flush(s); /* now in FALLBACK: its exchange starts at once */
			break;
		}
		if (r == -EAGAIN && asked) {
			/* Before the commit point: asked again shortly. */
			atomic_store(&s->down_wanted, true);
			ss_bg_kick(s, ss_deadline_in(10));
		} else if (asked) {
			ss_inherit_refuse(s); /* a child waiting for it learns at once */
		}
		return ss_upgraded_tcp_event(s) ? EPOLLIN | EPOLLRDHUP : 0;
	}
	case SS_SOCK_FALLBACK: ss_fallback_flush(s); break;
	case SS_SOCK_LATE:
		/* Its first look (or a later one): shown on TCP from here on (started-on-tcp). */
		ss_publish(s);
		ss_move_look(s);
		break;
	default: return 0;
	}
	/* Just on TCP: watched only from its first look (moving.c, ss_move_enter). */
	if (st != SS_SOCK_LATE && ss_sock_state(s) == SS_SOCK_LATE)
		return 0;
	switch (ss_sock_state(s)) {
	case SS_SOCK_CONNECTING:
	case SS_SOCK_RECONNECTING: return EPOLLOUT;
	case SS_SOCK_PROBING: return EPOLLIN;
	case SS_SOCK_ASKING: return (unsigned)ss_asking_events(s);
	case SS_SOCK_UPGRADED: return EPOLLIN | EPOLLRDHUP;
	case SS_SOCK_FALLBACK: return ss_down_events(s);
	case SS_SOCK_LATE: return ss_move_events(s);
	default: return 0;
	}
}

/* A callback of the progress thread: runs the socket's work unless an application thread is at
 * it. */
static void decide_bg_enter(struct ss_sock *s)
{
	int st = ss_sock_state(s);
	/* Plain (or not yet connecting): nothing for the state's work; a stale kick or event. */
	bool work = st >= SS_SOCK_CONNECTING && st != SS_SOCK_PLAIN && st != SS_SOCK_FOREIGN;

	if (!work && !atomic_load_explicit(&s->closing, memory_order_acquire) &&
	    !atomic_load_explicit(&s->kept, memory_order_acquire))
		return;
	if (!ss_sock_tryget(s))
		return; /* being freed */
	if (work) {
		unsigned events;

		/* A late look: the application's calls meanwhile move the socket on alone. */
		if (st == SS_SOCK_ASKING)
			ss_test_delay(SS_TP_CLIENT_LOOK);
		if (pthread_mutex_trylock(&s->lock) != 0) {
			/* An application call has it and moves it on itself; look again shortly. */
			ss_bg_kick(s, ss_deadline_in(1));
			ss_sock_put(s);
			return;
		}
		events = decide_bg_run(s);
		if (events && s->tcp_fd >= 0)
			ss_bg_watch(s, events);
		pthread_mutex_unlock(&s->lock);
	}
	/* Closed by the application: its bytes are delivered from here (close.c). */
	if (atomic_load_explicit(&s->closing, memory_order_acquire))
		ss_close_bg_step(s);
	/* Closed here, held by a forked child too (inherit.c). */
	if (atomic_load_explicit(&s->kept, memory_order_acquire))
		ss_inherit_bg_step(s);
	ss_sock_put(s);
}

static void decide_watch_cb(struct ss_watch *wt, unsigned revents)
{
	(void)revents;
	decide_bg_enter((struct ss_sock *)((char *)wt - offsetof(struct ss_sock, watch)));
}

static void decide_kick_cb(struct ss_timer *t, uint64_t now_ms)
{
	(void)now_ms;
	decide_bg_enter((struct ss_sock *)((char *)t - offsetof(struct ss_sock, kick)));
}

int ss_bg_start(struct ss_sock *s)
{
	enum ss_reason r;

	if (s->bg)
		return 0;
	r = ss_tp_load();
	if (r != SS_REASON_NONE)
		return -ENOSYS;
	s->watch.cb = decide_watch_cb;
	s->watch.fd = -1;
	s->kick.fire = decide_kick_cb;
	s->bg = true;
	return 0;
}

void ss_bg_stop_private(struct ss_sock *s)
{
	if (s->tcp_fd < 0)
		return;
	ss_tp->worker_unwatch(ss_w, &s->watch);
	ss_tp->worker_timer_cancel(ss_w, &s->kick);
	ss_private_close(s->tcp_fd);
	s->tcp_fd = -1;
}

void ss_bg_kick(struct ss_sock *s, uint64_t at)
{
	if (s->bg)
		ss_tp->worker_timer_arm(ss_w, &s->kick, at);
}

void ss_bg_rest(struct ss_sock *s, uint64_t at)
{
	if (!s->bg)
		return;
	ss_tp->worker_unwatch(ss_w, &s->watch);
	ss_tp->worker_timer_cancel(ss_w, &s->kick);
	ss_bg_kick(s, at);
}

void ss_bg_watch(struct ss_sock *s, unsigned events)
{
	if (s->bg && s->tcp_fd >= 0 && ss_tp->worker_watch(ss_w, &s->watch, s->tcp_fd, events) != 0)
		ss_log_warn("fd %d: cannot watch its TCP side: %s", s->fds[0], strerror(errno));
}

/* ---- the TCP side of an upgraded connection ---- */

bool ss_upgraded_tcp_event(struct ss_sock *s)
{
	struct ss_msg m;
	char buf[256];
	size_t used;

	for (;;) {
		enum ss_hs_read_result r = ss_hs_peek(&ss_real_io, s->tcp_fd, &m, 0, NULL, &used);

		switch (r) {
		case SS_HSR_MSG:
			/* After READY (ours, or the client's before any of the server's). */
			if (m.nonce == s->nonce &&
			    (m.type == SS_MSG_SWITCH || m.type == SS_MSG_RETURN ||
			     m.type == SS_MSG_LOST)) {
				/*
				 * The peer moves the stream back to TCP (its RDMA path is
				 * gone: so is ours); down.c reads the rest.
				 */
				if ((m.type == SS_MSG_LOST && ss_tp->conn_lose(s->conn) != 0) ||
				    ss_down_begin(s) != 0)
					ss_tp->conn_peer_gone(s->conn);
				return false;
			}
			if (ss_hs_consume(&ss_real_io, s->tcp_fd, used) != 0) {
				ss_tp->conn_peer_gone(s->conn);
				return false;
			}
			if (m.nonce != s->nonce)
				continue;
			if (m.type == SS_MSG_READY && !s->committed) {
				s->committed = true;
				ss_tp->conn_start(s->conn);
			} else if (m.type == SS_MSG_DECLINE && !s->committed) {
				/* The client gave up before it saw our ACCEPT: its bytes follow on
				 * TCP. */
				ss_fallback(s, m.reason < SS_REASON__COUNT
						       ? (enum ss_reason)m.reason
						       : SS_REASON_PEER_DECLINED);
				return false;
			}
			continue; /* repeated ACKs and the like: skipped */
		case SS_HSR_EOF:
		case SS_HSR_ERROR:
			ss_log_info("fd %d: the TCP side of an upgraded connection ended (%s): so "
				    "does the connection",
				    s->fds[0],
				    r == SS_HSR_ERROR ? strerror(errno) : "end of stream");
			ss_tp->conn_peer_gone(s->conn);
			return false;
		case SS_HSR_FOREIGN:
		case SS_HSR_BAD:
			/* Nothing else belongs on the TCP stream after an upgrade. */
			ss_log_warn(
				"fd %d: unexpected bytes on the TCP side of an upgraded connection",
				s->fds[0]);
			if (ss_real.recv(s->tcp_fd, buf, sizeof(buf), MSG_DONTWAIT) <= 0) {
				ss_tp->conn_peer_gone(s->conn);
				return false;
			}
			continue;
		case SS_HSR_TIMEOUT: return true;
		case SS_HSR_PARTIAL:
			/* Part of a message: look again shortly (the fd would show readable at
			 * once). */
			ss_bg_kick(s, ss_deadline_in(2));
			return false;
		}
	}
}
