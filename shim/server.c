/*
 * The server side of the negotiation (docs/protocol.md, part 2 and
 * "Rules"). The decision is made at the first I/O of the process that
 * serves the connection (so a forking server upgrades in the child), but a
 * HELLO is acknowledged as soon as any process that has the connection
 * sees it: at accept() when it is there already, else by the first I/O or
 * by the progress thread after a nudge (ss_nudge_at), watching for it from
 * then on. An acknowledged client never drops the connection, however
 * long our application takes to do its first I/O. A HELLO that asks to
 * start on TCP (SS_CAP_LATE) is answered LATER the same way.
 */
#include <errno.h>
#include <string.h>
#include <sys/epoll.h>

#include "shim/real.h"
#include "shim/shim.h"
#include "transport/log.h"

enum server_look {
	SERVER_DONE,    /* acknowledged, or not a HELLO: the first I/O finds the same */
	SERVER_WAIT,    /* nothing there yet */
	SERVER_PARTIAL, /* part of a message: look again shortly */
};

/* Plain after the HELLO was taken: the client may be giving up at the same time. */
/* strip: what the client may still send with the HELLO's nonce (SS_STRIP_NONE: nothing). */
static void server_plain(struct ss_sock *s, int fd, const struct ss_msg *hello, enum ss_reason r,
			 enum ss_strip strip)
{
	struct ss_msg d = {.type = SS_MSG_DECLINE, .nonce = hello->nonce, .reason = (uint16_t)r};

	ss_send_msg(fd, &d, 1000);
	if (s->conn) {
		ss_tp->conn_destroy(s->conn); /* never upgraded: nobody else holds it */
		s->conn = NULL;
	}
	ss_bg_stop_private(s);
	s->nonce = hello->nonce;
	s->strip = (uint8_t)strip;
	ss_become_plain(s, r);
}

/*
 * A HELLO that asks to start on TCP (SS_CAP_LATE), taken off the stream:
 * LATER, before any byte of ours, and the connection is LATE. LATE comes
 * first: a client told LATER may mark its stream once it is worth it and
 * then holds its writes for our answering mark, so a connection that may
 * not move (SRQSHIM_MOVE_AFTER_MS=-1, urgent data of the application's)
 * or cannot (shut, no fd or memory) is told DECLINE instead, and both ends
 * stay plain. Any process that has the connection may answer it (no QP is
 * made).
 */
static void server_later(struct ss_sock *s, int fd, const struct ss_msg *hello)
{
	struct ss_msg m = {.type = SS_MSG_LATER, .nonce = hello->nonce};
	enum ss_reason r;

	ss_test_delay(SS_TP_SERVER_ACK);
	if ((r = ss_move_enter(s, fd, false, hello->nonce)) != SS_REASON_NONE) {
		server_plain(s, fd, hello, r,
			     SS_STRIP_NONE); /* a LATER client sends nothing more */
		return;
	}
	if (ss_send_msg(fd, &m, 1000) == 0) {
		/*
		 * On TCP for now; it may move once it is worth it (moving.c). A
		 * server opens its device at its first LATER, ahead of any move: it
		 * serves many connections, and a shimmed client has come.
		 */
		ss_tp_warm(s, fd);
		return;
	}
	ss_log_warn("fd %d: LATER not sent: the client will connect again", fd);
	ss_move_leave(s, SS_REASON_LATER);
}

/* Acknowledges the HELLO at the head of fd, if there is one (or answers LATER). */
static enum server_look server_ack_if_hello(struct ss_sock *s, int fd)
{
	struct ss_msg m;
	size_t used;

	switch (ss_hs_peek(&ss_real_io, fd, &m, 0, NULL, &used)) {
	case SS_HSR_MSG:
		if (m.type == SS_MSG_HELLO && (m.params.caps & SS_CAP_LATE)) {
			if (ss_hs_consume(&ss_real_io, fd, used) == 0)
				server_later(s, fd, &m);
		} else if (m.type == SS_MSG_HELLO && !s->acked) {
			struct ss_msg ack = {.type = SS_MSG_ACK, .nonce = m.nonce};

			ss_test_delay(SS_TP_SERVER_ACK);
			s->acked = ss_send_msg(fd, &ack, 1000) == 0;
		}
		return SERVER_DONE;
	case SS_HSR_TIMEOUT: return SERVER_WAIT;
	case SS_HSR_PARTIAL: return SERVER_PARTIAL;
	default: return SERVER_DONE;
	}
}

void ss_server_accepted(struct ss_sock *s, int fd)
{
	pthread_mutex_lock(&s->lock);
	if (ss_sock_state(s) != SS_SOCK_ACCEPTED || server_ack_if_hello(s, fd) == SERVER_DONE ||
	    ss_bg_start(s) != 0)
		goto out;
	/*
	 * Not there yet: the application's first I/O answers it, or else the
	 * progress thread, soon, through a private name of the connection
	 * (then it watches that name).
	 */
	s->tcp_fd = ss_private_fd(fd);
	if (s->tcp_fd < 0) {
		s->tcp_fd = -1;
		goto out;
	}
	ss_bg_kick(s, ss_nudge_at(ss_now_coarse_ms()));
out:
	pthread_mutex_unlock(&s->lock);
}

bool ss_server_step(struct ss_sock *s)
{
	switch (s->acked || s->tcp_fd < 0 ? SERVER_DONE : server_ack_if_hello(s, s->tcp_fd)) {
	case SERVER_WAIT: return true;
	case SERVER_PARTIAL:
		/* Looked at again shortly, until it is the client's own bytes (its reads decide).
		 */
		if (!ss_partial_lasted(&s->partial_ms))
			ss_bg_kick(s, ss_deadline_in(2));
		return false;
	default:
		/* LATE (LATER answered) keeps its private name: moving.c watches it. */
		if (ss_sock_state(s) != SS_SOCK_LATE)
			ss_bg_stop_private(s);
		return false;
	}
}

/* The client's HELLO is taken: answer it. */
static void server_answer(struct ss_sock *s, int fd, const struct ss_msg *hello)
{
	struct ss_msg m;
	size_t used;
	enum ss_reason r;

	if (hello->params.caps & SS_CAP_LATE) {
		server_later(s, fd, hello);
		return;
	}
	/* A client that waited in vain for us has said so right behind its HELLO. */
	if (ss_hs_peek(&ss_real_io, fd, &m, 0, NULL, &used) == SS_HSR_MSG &&
	    m.nonce == hello->nonce && m.type == SS_MSG_DECLINE &&
	    ss_hs_consume(&ss_real_io, fd, used) == 0) {
		ss_bg_stop_private(s);
		ss_become_plain(s, SS_REASON_TIMEOUT);
		return;
	}
	if (!s->acked) {
		/* Acknowledge at once: the client then waits longer for our decision. */
		m = (struct ss_msg){.type = SS_MSG_ACK, .nonce = hello->nonce};
		ss_test_delay(SS_TP_SERVER_ACK);
		ss_send_msg(fd, &m, 1000);
		s->acked = true;
	}
	/*
	 * Accepted before an io_uring ring, whose I/O the shim cannot carry, or
	 * where the application takes zerocopy completions: declined.
	 */
	r = ss_tcp_bound(s) ? SS_REASON_POLICY : ss_make_conn(s, fd, NULL);
	if (r == SS_REASON_NONE)
		r = ss_agree(s, fd, hello);
	if (r == SS_REASON_NONE && ss_bg_start(s) != 0)
		r = SS_REASON_RESOURCE;
	if (r != SS_REASON_NONE) {
		server_plain(s, fd, hello, r, SS_STRIP_NONCE);
		return;
	}
	/* Our socketpair end goes on the application's fd before the client may send. */
	if (s->tcp_fd >= 0)
		ss_tp->worker_unwatch(ss_w, &s->watch);
	ss_test_delay(SS_TP_SERVER_PAIR);
	if (ss_enter_pair(s) != 0) {
		server_plain(s, fd, hello, SS_REASON_RESOURCE, SS_STRIP_NONCE);
		return;
	}
	s->nonce = hello->nonce;
	m = (struct ss_msg){.type = SS_MSG_ACCEPT, .nonce = hello->nonce, .params = s->mine};
	ss_test_delay(SS_TP_SERVER_ACCEPT);
	ss_become_upgraded(s, &hello->params);
	if (ss_send_msg(s->tcp_fd, &m, ss_cfg.acked_timeout_ms) != 0)
		ss_tp->conn_peer_gone(s->conn); /* the application sees the reset */
	ss_tp->conn_resync(s->conn);
}

int ss_server_decide(struct ss_sock *s, int fd, int wait_ms, bool bytes_there)
{
	struct ss_msg hello;
	enum ss_dec_result dec = SS_DEC_OK;

	if (ss_sock_state(s) != SS_SOCK_ACCEPTED)
		return 0;
	/*
	 * Before anything may be taken off the TCP socket: a poll that finds
	 * the mark waits in slices (mux.c), as an upgrade may change the file
	 * on the fd. Whatever the read finds but nothing, the state leaves
	 * ACCEPTED, and the mark means nothing more.
	 */
	atomic_store(&s->answering, true);
	/* Part of a message among the bytes there waits for its rest from now on. */
	if (bytes_there && !s->partial_ms)
		s->partial_ms = ss_now_ms();
	switch (ss_hs_read(&ss_real_io, fd, &hello, wait_ms, &dec)) {
	case SS_HSR_PARTIAL:
		/* A second for the rest, in this wait or over calls. */
		if (ss_partial_lasted(&s->partial_ms)) {
			/* The client's own first bytes (a plain client): plain, untouched. */
			ss_bg_stop_private(s);
			ss_become_plain(s, SS_REASON_PEER_PLAIN);
			return 0;
		}
		/* fall through */
	case SS_HSR_TIMEOUT: atomic_store(&s->answering, false); return -EAGAIN;
	case SS_HSR_MSG: s->partial_ms = 0; break;
	case SS_HSR_BAD:
		/* Our magic but nothing we can read: the bytes stay, for the application. */
		ss_log_warn("fd %d: %s handshake from the client: staying on TCP, bytes untouched",
			    fd, ss_dec_result_str(dec));
		ss_bg_stop_private(s);
		ss_become_plain(s, dec == SS_DEC_UNSUPPORTED ? SS_REASON_VERSION
							     : SS_REASON_MALFORMED);
		return 0;
	default:
		/* Application bytes, end of file, or a handshake we cannot read: plain,
		 * untouched. */
		ss_bg_stop_private(s);
		ss_become_plain(s, SS_REASON_PEER_PLAIN);
		return 0;
	}
	if (hello.type != SS_MSG_HELLO) {
		ss_bg_stop_private(s);
		ss_become_plain(s, SS_REASON_MALFORMED);
		return 0;
	}
	server_answer(s, fd, &hello);
	return 0;
}
