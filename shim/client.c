/*
 * The client side of the negotiation (docs/protocol.md, part 2 and
 * "Rules"). connect() returns as TCP's does: 0 once TCP has connected
 * (blocking), EINPROGRESS at once (non-blocking); the HELLO goes out as
 * soon as TCP is connected, and the answer is taken by whichever comes
 * first: an application call on the socket or the progress thread. Until
 * the decision, writes are held (SS_HOLD_MAX at most) and reads wait.
 *
 * Steps: connect (CONNECTING), probe (PROBING: HELLO sent), then one of
 * commit (ACCEPT: READY, the held bytes go over RDMA), give up on the same
 * connection (after an ACK or an ACCEPT we cannot use: DECLINE, the held
 * bytes go over TCP after it) or start over (no ACK: the probe connection
 * is aborted and a plain one made, RECONNECTING). Every fallback leaves
 * through ss_fallback().
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>

#include "shim/real.h"
#include "shim/shim.h"
#include "transport/log.h"

/*
 * The local address a connect to dst will get: the bound one, or the
 * kernel's route choice (a connected UDP socket sends nothing).
 */
static bool client_predict_local(struct ss_sock *s, const struct sockaddr *dst, socklen_t dlen,
				 struct sockaddr_storage *local)
{
	socklen_t len = sizeof(*local);
	int u;
	bool ok;

	if (s->bound_len) {
		const struct sockaddr_in *b = (const struct sockaddr_in *)&s->bound;
		const struct sockaddr_in6 *b6 = (const struct sockaddr_in6 *)&s->bound;
		if ((b->sin_family == AF_INET && b->sin_addr.s_addr != htonl(INADDR_ANY)) ||
		    (b6->sin6_family == AF_INET6 && !IN6_IS_ADDR_UNSPECIFIED(&b6->sin6_addr))) {
			memcpy(local, &s->bound, s->bound_len);
			return true;
		}
	}
	u = ss_real.socket(dst->sa_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (u < 0)
		return false;
	ok = ss_real.connect(u, dst, dlen) == 0 &&
	     ss_real.getsockname(u, (struct sockaddr *)local, &len) == 0;
	ss_real.close(u);
	return ok;
}

static bool client_same_ip(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
	if (a->ss_family != b->ss_family)
		return false;
	if (a->ss_family == AF_INET)
		return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
		       ((const struct sockaddr_in *)b)->sin_addr.s_addr;
	return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
		      &((const struct sockaddr_in6 *)b)->sin6_addr, 16) == 0;
}

static void client_drop_conn(struct ss_sock *s)
{
	/* Never upgraded: no application call can hold the connection. */
	ss_tp->conn_destroy(s->conn);
	s->conn = NULL;
}

void ss_client_record(struct ss_sock *s, enum ss_dest_state st)
{
	if (s->prober || st == SS_DEST_SHIMMED)
		ss_cache_record((const struct sockaddr *)&s->dst, st, s->prober);
	s->prober = false;
}

/*
 * The application gets tcp_fd as it is: its connect failed (the error
 * pending), or it was shut while connecting (shut_early; reset first when
 * bytes were held, ss_client_reset_lost_hold).
 */
static void client_connect_failed(struct ss_sock *s)
{
	if (s->conn)
		client_drop_conn(s);
	ss_client_record(s, SS_DEST_UNKNOWN);
	ss_tp->worker_unwatch(ss_w, &s->watch);
	free(s->hold);
	s->hold = NULL;
	s->hold_len = 0;
	ss_leave_pair(s, true);
	ss_become_plain(s, SS_REASON_NONE);
}

void ss_client_reset_lost_hold(struct ss_sock *s)
{
	struct sockaddr_storage peer;
	socklen_t len = sizeof(peer);
	struct sockaddr unspec = {.sa_family = AF_UNSPEC};

	if (!s->shut_early || !s->hold_len ||
	    ss_real.getpeername(s->tcp_fd, (struct sockaddr *)&peer, &len) != 0)
		return; /* nothing held, or the connect was aborted */
	/* Linux's disconnect: a reset to the peer, ECONNRESET pending here. */
	ss_real.connect(s->tcp_fd, &unspec, sizeof(unspec));
}

void ss_client_reconnect(struct ss_sock *s, enum ss_reason why)
{
	struct linger lg = {1, 0};
	int nfd;

	s->reason = why;
	if (s->conn)
		client_drop_conn(s);
	ss_tp->worker_unwatch(ss_w, &s->watch);
	/* No TIME_WAIT left behind: the server only ever sees a reset probe. */
	ss_real.setsockopt(s->tcp_fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	/*
	 * A wait still asleep on it (it was the application's own, asking.c)
	 * wakes and looks again; SHUT_RD sends nothing (a FIN would end the
	 * server's stream cleanly before the reset).
	 */
	if (s->hello_sent)
		ss_real.shutdown(s->tcp_fd, SHUT_RD);
	ss_private_close(s->tcp_fd);
	s->tcp_fd = -1;
	nfd = ss_real.socket(s->domain, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (nfd >= 0) {
		for (int i = 0; i < s->n_opts; i++)
			ss_real.setsockopt(nfd, s->opts[i].level, s->opts[i].name, s->opts[i].val,
					   s->opts[i].len);
		s->tcp_fd = ss_private_fd(nfd);
		ss_real.close(nfd);
	}
	if (s->tcp_fd < 0 ||
	    (s->bound_len &&
	     ss_real.bind(s->tcp_fd, (struct sockaddr *)&s->bound, s->bound_len) < 0) ||
	    (ss_real.connect(s->tcp_fd, (struct sockaddr *)&s->dst, s->dst_len) < 0 &&
	     errno != EINPROGRESS)) {
		/* The plain connect failed at once: the application sees a reset connection. */
		ss_log_warn("fd %d: cannot connect again after the probe: %s", s->fds[0],
			    strerror(errno));
		if (s->tcp_fd >= 0)
			ss_leave_pair(s, true);
		else
			ss_mirror_show(s, SS_RDY_HUP | SS_RDY_ERR); /* end of file, EPIPE */
		free(s->hold);
		s->hold = NULL;
		s->hold_len = 0;
		ss_become_plain(s, why);
		return;
	}
	ss_sock_set_state(s, SS_SOCK_RECONNECTING);
	ss_bg_watch(s, EPOLLOUT);
}

/*
 * TCP is connected: the HELLO goes out before any application byte. Not
 * where the application bound the socket to TCP meanwhile (ss_tcp_bound:
 * zerocopy completions asked for, an io_uring ring): plain, what it held
 * sent first. Returns whether it probes.
 */
static bool client_probe(struct ss_sock *s)
{
	struct ss_msg hello = {.type = SS_MSG_HELLO, .params = s->mine};

	if (ss_tcp_bound(s)) {
		client_drop_conn(s);
		ss_fallback(s, SS_REASON_POLICY);
		return false;
	}

	s->nonce = ss_new_nonce();
	hello.nonce = s->nonce;
	ss_test_delay(SS_TP_CLIENT_HELLO);
	/* An empty socket takes it whole; a failure shows as silence or an error later. */
	ss_send_msg(s->tcp_fd, &hello, 0);
	/*
	 * A destination seen shimmed answers once its server accepts, which
	 * may take long when many connect at once: it gets the longer wait.
	 */
	s->deadline = ss_deadline_in(
		(s->dest_shimmed ? ss_cfg.acked_timeout_ms : ss_cfg.hello_timeout_ms) +
		4 * ss_rtt_ms(s->tcp_fd));
	ss_sock_set_state(s, SS_SOCK_PROBING);
	ss_bg_kick(s, s->deadline);
	ss_bg_watch(s, EPOLLIN);
	ss_mirror_show(s, s->hold_len < s->hold_max ? SS_RDY_OUT : 0);
	return true;
}

/* ACCEPT: connect our QP, say READY, and move the held bytes over. Returns the reason it cannot. */
static enum ss_reason client_commit(struct ss_sock *s, const struct ss_msg *m)
{
	struct ss_msg ready = {.type = SS_MSG_READY, .nonce = s->nonce};
	enum ss_reason r;

	r = ss_agree(s, s->tcp_fd, m);
	/* The held bytes must fit the connection's send slots at once (the peer's buffers may be
	 * small). */
	if (r == SS_REASON_NONE && ss_tp->conn_send_capacity(s->conn) < s->hold_len)
		r = SS_REASON_PARAMS;
	ss_test_delay(SS_TP_CLIENT_READY);
	if (r != SS_REASON_NONE)
		return r;
	if (ss_send_msg(s->tcp_fd, &ready, 1000) != 0)
		ss_tp->conn_peer_gone(s->conn); /* the application sees the reset */
	ss_start_upgraded(s, &m->params);
	return SS_REASON_NONE;
}

/* After an ACK (or an ACCEPT we cannot use) the connection is kept: DECLINE, then TCP. */
static void client_decline(struct ss_sock *s, enum ss_reason why)
{
	struct ss_msg d = {.type = SS_MSG_DECLINE, .nonce = s->nonce, .reason = (uint16_t)why};

	ss_send_msg(s->tcp_fd, &d, 1000);
	if (s->conn)
		client_drop_conn(s);
	/* The server's answer may cross ours: it is taken off the stream before the application
	 * reads. */
	s->strip = SS_STRIP_NONCE;
	ss_fallback(s, why);
}

/* Takes the server's answers that are there; PROBING, lock held. */
static void client_answers(struct ss_sock *s)
{
	struct ss_msg m;
	enum ss_reason r;

	for (;;) {
		enum ss_hs_read_result rr = ss_hs_read(&ss_real_io, s->tcp_fd, &m, 0, NULL);

		if (rr == SS_HSR_MSG && m.nonce == s->nonce && m.type == SS_MSG_ACK) {
			if (!s->acked) {
				/* A shimmed server saw the HELLO: it answers at its first I/O. */
				s->acked = true;
				s->deadline = ss_deadline_in(ss_cfg.acked_timeout_ms);
				ss_bg_kick(s, s->deadline);
				ss_client_record(s, SS_DEST_SHIMMED);
			}
			continue;
		}
		if (rr == SS_HSR_MSG && m.nonce == s->nonce && m.type == SS_MSG_DECLINE) {
			/* A shimmed server said no: its bytes follow on this connection. */
			ss_client_record(s, SS_DEST_SHIMMED);
			client_drop_conn(s);
			ss_fallback(s, SS_REASON_PEER_DECLINED);
			return;
		}
		if (rr == SS_HSR_MSG && m.nonce == s->nonce && m.type == SS_MSG_ACCEPT) {
			ss_client_record(s, SS_DEST_SHIMMED);
			/* Bound to TCP since the HELLO (zerocopy completions, a ring): declined. */
			r = ss_tcp_bound(s) ? SS_REASON_POLICY : client_commit(s, &m);
			if (r != SS_REASON_NONE)
				client_decline(s, r);
			return;
		}
		if (rr == SS_HSR_TIMEOUT)
			return;
		if (rr == SS_HSR_PARTIAL) {
			/* Part of a message: it is looked at again shortly. */
			ss_bg_kick(s, ss_deadline_in(2));
			return;
		}
		if (s->acked) {
			/*
			 * A shimmed server acknowledged: it never sends anything but
			 * its answer before its application's bytes. Its end (or
			 * bytes that are not ours) reach the application on TCP.
			 */
			ss_log_warn("fd %d: the server broke off the handshake: staying on TCP",
				    s->fds[0]);
			client_drop_conn(s);
			ss_fallback(s, SS_REASON_MALFORMED);
			return;
		}
		/* Silence is the deadline's business; this is a server that does not speak
		 * HELLO. */
		r = rr == SS_HSR_MSG || rr == SS_HSR_BAD ? SS_REASON_MALFORMED
							 : SS_REASON_PEER_PLAIN;
		ss_client_record(s, r == SS_REASON_PEER_PLAIN ? SS_DEST_PLAIN : SS_DEST_UNKNOWN);
		ss_client_reconnect(s, r);
		return;
	}
}

/* Whether the connect on tcp_fd ended; *failed: it failed (its error stays pending). */
static bool client_connect_done(struct ss_sock *s, bool *failed)
{
	struct pollfd p = {.fd = s->tcp_fd, .events = POLLOUT};

	if (ss_real.poll(&p, 1, 0) <= 0)
		return false;
	*failed = (p.revents & (POLLERR | POLLHUP)) != 0;
	return true;
}

bool ss_client_step(struct ss_sock *s)
{
	bool failed = false;

	switch (ss_sock_state(s)) {
	case SS_SOCK_ASKING: return ss_asking_step(s);
	case SS_SOCK_CONNECTING:
		if (!client_connect_done(s, &failed))
			return true;
		/* Shut early: the application's as it is (no HELLO), reset if bytes were held. */
		if (failed || s->shut_early) {
			ss_client_reset_lost_hold(s);
			client_connect_failed(s);
			return false;
		}
		if (!client_probe(s))
			return false;
		/* The answer may be there already. */
		__attribute__((fallthrough));
	case SS_SOCK_PROBING:
		client_answers(s);
		if (ss_sock_state(s) != SS_SOCK_PROBING)
			return false;
		if (ss_now_ms() < s->deadline) {
			ss_bg_kick(s, s->deadline); /* the progress thread looks again then */
			return true;
		}
		if (!s->acked && !s->dest_shimmed && !s->prober &&
		    ss_cfg.acked_timeout_ms > ss_cfg.hello_timeout_ms &&
		    ss_cache_peek((const struct sockaddr *)&s->dst) == SS_DEST_SHIMMED) {
			/*
			 * Another probe of this destination, running when we
			 * began, found it shimmed: its server answers once it
			 * accepts. The acknowledged wait, then.
			 */
			s->dest_shimmed = true;
			s->deadline +=
				(uint64_t)(ss_cfg.acked_timeout_ms - ss_cfg.hello_timeout_ms);
			ss_bg_kick(s, s->deadline);
			return true;
		}
		if (s->acked) {
			/* A shimmed server whose application does no I/O: go on over TCP,
			 * lossless. */
			client_decline(s, SS_REASON_TIMEOUT);
		} else {
			/* Silence: a plain server waiting for us to speak, or one that never
			 * accepts. */
			ss_client_record(s, SS_DEST_PLAIN);
			ss_client_reconnect(s, SS_REASON_PEER_PLAIN);
		}
		return ss_sock_state(s) == SS_SOCK_RECONNECTING;
	case SS_SOCK_RECONNECTING:
		if (!client_connect_done(s, &failed))
			return true;
		if (failed) {
			client_connect_failed(s);
			return false;
		}
		ss_fallback(s, s->reason);
		return false;
	default: return false;
	}
}

/* Connects tcp_fd as the application asked; blocking: waits as connect(2) would. */
#define CLIENT_CONNECT_SLICE_MS 100

static int client_tcp_connect(struct ss_sock *s, int fd)
{
	int err = 0;
	socklen_t len = sizeof(err);

	if (ss_real.connect(s->tcp_fd, (struct sockaddr *)&s->dst, s->dst_len) == 0) {
		client_probe(s);
		return 0;
	}
	if (errno != EINPROGRESS) {
		err = errno;
		client_connect_failed(s);
		return -err;
	}
	if (ss_real.fcntl(fd, F_GETFL) & O_NONBLOCK) {
		ss_bg_watch(s, EPOLLOUT);
		return -EINPROGRESS;
	}
	while (ss_sock_state(s) == SS_SOCK_CONNECTING) {
		struct pollfd p = {.fd = s->tcp_fd, .events = POLLOUT};
		int n;

		pthread_mutex_unlock(&s->lock);
		/*
		 * In slices: another thread's shutdown may end the connect and
		 * close that private fd meanwhile (its number then names
		 * another file); the state is looked at between them.
		 */
		n = ss_real.poll(&p, 1, CLIENT_CONNECT_SLICE_MS);
		pthread_mutex_lock(&s->lock);
		if (n < 0 && errno == EINTR && ss_sock_state(s) == SS_SOCK_CONNECTING) {
			/* As TCP: the connect goes on in the background. */
			ss_bg_watch(s, EPOLLOUT);
			return -EINTR;
		}
		ss_client_step(s);
	}
	s->reported = true;
	if (ss_sock_state(s) == SS_SOCK_PLAIN && s->reason == SS_REASON_NONE && s->tcp_fd < 0) {
		/* It failed: the error is the connect's (and is consumed, as a blocking connect
		 * does). */
		if (ss_real.getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err)
			return -err;
	}
	return 0;
}

/* A connect that stays plain from the start: the kernel's, then the record of why. */
static int client_plain_connect(struct ss_sock *s, int fd, enum ss_reason why)
{
	int ret = ss_real.connect(fd, (struct sockaddr *)&s->dst, s->dst_len) == 0 ? 0 : -errno;

	ss_become_plain(s, why);
	return ret;
}

/*
 * Prepare: whether to try, and everything slow made before the SYN (loading
 * verbs, opening the device, making the QP), so a server that writes first
 * waits only a short bound for our HELLO, counted from its accept. Returns
 * SS_REASON_NONE with the connection made and the pair entered, or why the
 * connection stays on TCP (with nothing of a connection left behind).
 */
static enum ss_reason client_prepare(struct ss_sock *s, int fd, const struct sockaddr *addr,
				     socklen_t alen, struct sockaddr_storage *predicted, bool *ask)
{
	enum ss_dest_state dest;
	enum ss_reason r;

	if (ss_cfg.mode == SS_MODE_TCP || ss_tcp_bound(s) || !ss_policy_allows(&ss_peers, addr))
		return SS_REASON_POLICY; /* never probed: a destination outside the policy sees no
					    HELLO */
	/* Never moving: a HELLO buys nothing, and LATER would let the server mark. */
	if (ss_cfg.start == SS_START_TCP && !ss_move_allowed(s))
		return SS_REASON_POLICY;
	dest = ss_cache_begin(addr, &s->prober);
	if (dest == SS_DEST_PLAIN)
		return SS_REASON_PEER_PLAIN;
	s->dest_shimmed = dest == SS_DEST_SHIMMED;
	if (ss_cfg.start == SS_START_TCP) {
		/* Starting on TCP: nothing of an upgrade, only a private name to watch (asking.c).
		 */
		if (ss_bg_start(s) == 0 && (s->tcp_fd = ss_private_fd(fd)) >= 0) {
			*ask = true;
			return SS_REASON_NONE;
		}
		s->tcp_fd = -1;
		r = SS_REASON_RESOURCE;
	} else {
		r = client_predict_local(s, addr, alen, predicted) ? ss_make_conn(s, fd, predicted)
								   : SS_REASON_RESOURCE;
	}
	if (r == SS_REASON_NONE && (ss_bg_start(s) != 0 || ss_enter_pair(s) != 0))
		r = SS_REASON_RESOURCE;
	if (r == SS_REASON_NONE) {
		/* What is held must fit the connection's send slots at once when it commits. */
		s->hold_max = ss_tp->conn_send_capacity(s->conn);
		if (s->hold_max > SS_HOLD_MAX)
			s->hold_max = SS_HOLD_MAX;
		return r;
	}
	if (s->conn)
		client_drop_conn(s);
	ss_client_record(s, SS_DEST_UNKNOWN);
	return r;
}

int ss_client_connect(struct ss_sock *s, int fd, const struct sockaddr *addr, socklen_t alen)
{
	struct sockaddr_storage predicted, local;
	socklen_t llen = sizeof(local);
	enum ss_reason r;
	bool ask = false;
	int ret;

	memcpy(&s->dst, addr, alen < sizeof(s->dst) ? alen : sizeof(s->dst));
	s->dst_len = alen;
	r = client_prepare(s, fd, addr, alen, &predicted, &ask);
	if (ask)
		return ss_asking_connect(s, fd);
	if (r != SS_REASON_NONE) {
		/* The one way to TCP before the SYN. */
		if (s->tcp_fd >= 0 && ss_leave_pair(s, false) != 0)
			return -EBADF;
		return client_plain_connect(s, fd, r);
	}
	ss_sock_set_state(s, SS_SOCK_CONNECTING);
	ret = client_tcp_connect(s, fd);
	if (ret == 0 && s->conn && ss_sock_state(s) == SS_SOCK_PROBING &&
	    (ss_real.getsockname(s->tcp_fd, (struct sockaddr *)&local, &llen) != 0 ||
	     !client_same_ip(&local, &predicted)))
		ss_log_warn("fd %d: the route changed during connect: the upgrade may fail",
			    s->fds[0]);
	return ret;
}
