/*
 * The live downgrade (docs/protocol.md, section 4): an upgraded connection
 * moves its byte stream back onto its own TCP connection, both directions,
 * and the application's fd becomes that TCP socket. Each side ends its RDMA
 * stream with a switch (what it had not posted goes on over TCP), sends
 * SWITCH on TCP, and once the peer's RDMA stream has ended, sends RETURN
 * with the bytes of the peer's stream it received and never read. The
 * peer's returned bytes are the first of our stream on TCP, followed by
 * what we had not posted and what the application writes meanwhile (the
 * FALLBACK state's hold); then the TCP socket goes back on the
 * application's fd (plain.c). All of it under the socket's lock, never
 * blocking: the progress thread moves it on, and so does any application
 * call that waits for it.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>

#include "handshake/move.h"
#include "shim/epoll.h"
#include "shim/ready.h"
#include "shim/real.h"
#include "shim/shim.h"
#include "transport/log.h"

/* While the peer's end of stream is awaited on the QP, the CQs are looked at this often. */
#define DOWN_POLL_MS 2

struct ss_down {
	uint8_t *out; /* ours for the TCP stream before the held bytes: SWITCH, RETURN, its bytes */
	size_t out_len, out_off;
	bool returned; /* our RETURN is in out */
	bool ended;    /* our stream had ended over RDMA (shutdown): TCP's write side ends too */
	bool failed;
	bool lost;       /* the QP broke: the peer's `received` says where our stream resumes */
	uint64_t from;   /* stream offset of the first byte put back in the hold */
	size_t from_len; /* how many were */
	uint8_t *in;     /* the peer's RETURN: the bytes of our stream it gave back */
	uint32_t in_len, in_got;
	bool in_hdr, in_done;
	bool in_counted; /* its RETURN said how much of our stream came over RDMA: */
	uint64_t in_received;
	unsigned events;  /* on tcp_fd, while waiting */
	uint64_t look_at; /* ms: the next look without an event (0: only at the deadline) */
	uint64_t deadline;
};

static int down_out_add(struct ss_down *d, const struct ss_msg *m, const uint8_t *tail,
			size_t tail_len)
{
	uint8_t hdr[SS_HELLO_MAX_LEN];
	int n = ss_msg_encode(m, hdr, sizeof(hdr));
	uint8_t *p;

	if (n < 0)
		return n;
	p = realloc(d->out, d->out_len + (size_t)n + tail_len);
	if (!p)
		return -ENOMEM;
	d->out = p;
	memcpy(p + d->out_len, hdr, (size_t)n);
	if (tail_len)
		memcpy(p + d->out_len + n, tail, tail_len);
	d->out_len += (size_t)n + tail_len;
	return 0;
}

int ss_down_begin(struct ss_sock *s)
{
	struct ss_handback hb;
	struct ss_down *d;
	int n;

	if (ss_sock_state(s) != SS_SOCK_UPGRADED || !s->conn)
		return -EINVAL;
	if (!(s->peer_caps & SS_CAP_SWITCH))
		return -EOPNOTSUPP;
	if (!(d = calloc(1, sizeof(*d))))
		return -ENOMEM;
	/*
	 * The RDMA stream ends first. A writer that meets the refusal
	 * (-EXDEV) takes the socket's lock, which is ours until the state
	 * below is set: it then finds the new state and dispatches again.
	 */
	n = ss_tp->conn_switch(s->conn, &hb);
	if (n < 0) {
		free(d);
		/* Before the commit point: later. Failed: the application sees the reset. */
		return n == -ENOTCONN ? -EAGAIN : n;
	}
	d->ended = hb.ended;
	d->lost = hb.lost;
	d->from = hb.from;
	d->from_len = hb.len;
	d->deadline = ss_deadline_in(ss_cfg.linger_ms);
	/*
	 * Not posted (live), or not known delivered (lost): the first of our
	 * bytes on TCP after what the peer gives back, less what the peer says
	 * it received (down_finish).
	 */
	if (hb.len && ss_hold_prepend(s, hb.buf, hb.len) != 0) {
		ss_log_error("fd %d: no room for %zu bytes to resend", s->fds[0], hb.len);
		d->failed = true;
	}
	free(hb.buf);
	if (ss_hold_reserve(s, SS_HOLD_MAX) != 0)
		d->failed = true;
	if (!d->failed &&
	    down_out_add(d,
			 &(struct ss_msg){.type = d->lost ? SS_MSG_LOST : SS_MSG_SWITCH,
					  .nonce = s->nonce},
			 NULL, 0))
		d->failed = true;
	/* Reads wait and writes are held from here: the FALLBACK state's rules. */
	s->down = d;
	ss_fallback_enter(s, d->lost ? SS_REASON_RDMA_LOST : SS_REASON_DOWNGRADED);
	ss_mirror_show(s, s->hold_len < s->hold_max ? SS_RDY_OUT : 0);
	ss_log_info("fd %d: moving back to TCP (%s), %zu bytes not known delivered over RDMA",
		    s->fds[0], d->lost ? "the RDMA path is lost" : "live", s->hold_len);
	ss_bg_kick(s, ss_now_ms());
	return 0;
}

/* Sends what is in out. Returns 0 when all went, -EAGAIN, or -errno. */
static int down_send(struct ss_sock *s, struct ss_down *d)
{
	while (d->out_off < d->out_len) {
		ssize_t n = ss_real.send(s->tcp_fd, d->out + d->out_off, d->out_len - d->out_off,
					 MSG_DONTWAIT | MSG_NOSIGNAL);

		if (n > 0) {
			d->out_off += (size_t)n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN) {
			d->events |= EPOLLOUT;
			return -EAGAIN;
		}
		return n < 0 ? -errno : -EPIPE;
	}
	return 0;
}

/*
 * A live move whose QP broke meanwhile (ours, or the peer's LOST) goes on
 * as a lost one: the bytes posted and not known delivered go before those
 * held, and our stream resumes where the peer's count says. The peer hears
 * LOST if our RETURN is not queued yet (it may be waiting for our end of
 * stream on the QP). After our RETURN a LOST would read as stream bytes:
 * none is sent. The peer's count still settles our side; a peer that waits
 * for an end of stream the break took away runs out of time and resets
 * (docs/protocol.md, section 4).
 */
static int down_check_lost(struct ss_sock *s, struct ss_down *d)
{
	struct ss_handback hb;
	int r;

	if (d->lost || (r = ss_tp->conn_take_lost(s->conn, &hb)) == -EAGAIN)
		return 0;
	if (r)
		return r;
	r = hb.len ? ss_hold_prepend(s, hb.buf, hb.len) : 0;
	free(hb.buf);
	if (r)
		return r;
	d->lost = true;
	d->from = hb.from;
	/* The peer can have received only from the copy: the unposted bytes
	 * the live switch took back were never sent over RDMA. */
	d->from_len = hb.len;
	s->reason = SS_REASON_RDMA_LOST;
	ss_log_info("fd %d: the RDMA path broke during the move: %zu more bytes to resend",
		    s->fds[0], hb.len);
	if (d->returned)
		return 0;
	return down_out_add(d, &(struct ss_msg){.type = SS_MSG_LOST, .nonce = s->nonce}, NULL, 0);
}

/*
 * Once the peer's RDMA stream has ended (every byte it sent that way is
 * here): RETURN with the bytes our application never read. Returns 0,
 * -EAGAIN while the end is not there yet, or -errno.
 */
static int down_build_return(struct ss_sock *s, struct ss_down *d)
{
	uint8_t *buf = NULL;
	uint64_t received = 0;
	ssize_t n;
	int r;

	n = ss_tp->conn_take_unread(s->conn, &buf, &received);
	if (n == -EAGAIN && ss_tp->worker_poll(ss_w) > 0)
		n = ss_tp->conn_take_unread(s->conn, &buf, &received);
	if (n == -EAGAIN) {
		d->look_at = ss_deadline_in(DOWN_POLL_MS);
		return -EAGAIN;
	}
	if (n < 0)
		return (int)n;
	ss_test_delay(SS_TP_DOWN_RETURN);
	/* A break that came while the unread bytes were taken: LOST goes before RETURN. */
	r = down_check_lost(s, d);
	if (r == 0 && (size_t)n > SS_RETURN_MAX)
		r = -EMSGSIZE;
	else if (r == 0)
		r = down_out_add(d,
				 &(struct ss_msg){.type = SS_MSG_RETURN,
						  .nonce = s->nonce,
						  .count = (uint32_t)n,
						  .has_received = true,
						  .received = received},
				 buf, (size_t)n);
	free(buf);
	if (r == 0)
		d->returned = true;
	return r;
}

/*
 * Reads the peer's SWITCH and RETURN, and the bytes after RETURN, never a
 * byte beyond them. Returns 0 once all is in, -EAGAIN, or -errno.
 */
static int down_read(struct ss_sock *s, struct ss_down *d)
{
	while (!d->in_done) {
		struct ss_msg m;
		size_t used;
		ssize_t n;

		if (d->in_hdr) {
			n = ss_real.recv(s->tcp_fd, d->in + d->in_got, d->in_len - d->in_got,
					 MSG_DONTWAIT);
			if (n > 0) {
				d->in_got += (uint32_t)n;
				d->in_done = d->in_got == d->in_len;
				continue;
			}
			if (n < 0 && errno == EINTR)
				continue;
			if (n < 0 && errno == EAGAIN) {
				d->events |= EPOLLIN;
				return -EAGAIN;
			}
			return n < 0 ? -errno : -EPIPE;
		}
		switch (ss_hs_peek(&ss_real_io, s->tcp_fd, &m, 0, NULL, &used)) {
		case SS_HSR_MSG:
			if (m.nonce != s->nonce || ss_hs_consume(&ss_real_io, s->tcp_fd, used) != 0)
				return -EPROTO;
			/* The peer's RDMA path broke: ours is no use either (down_check_lost). */
			if (m.type == SS_MSG_LOST && !d->lost)
				ss_tp->conn_lose(s->conn);
			if (m.type == SS_MSG_RETURN) {
				d->in_len = m.count;
				d->in = m.count ? malloc(m.count) : NULL;
				if (m.count && !d->in)
					return -ENOMEM;
				d->in_hdr = true;
				d->in_done = m.count == 0;
				d->in_counted = m.has_received;
				d->in_received = m.received;
			}
			continue; /* SWITCH, LOST, and repeated ACKs of the handshake: skipped */
		case SS_HSR_TIMEOUT: d->events |= EPOLLIN; return -EAGAIN;
		case SS_HSR_PARTIAL: d->look_at = ss_deadline_in(DOWN_POLL_MS); return -EAGAIN;
		default: return -EPROTO; /* its end, a reset, or bytes that are no message */
		}
	}
	return 0;
}

/*
 * The peer's returned bytes go first, then ours from where the peer's
 * RDMA stream ended: what it received over RDMA is dropped from the front
 * of the hold (handshake/move.h says how much, or that the RETURN cannot
 * be true).
 */
static int down_finish(struct ss_sock *s, struct ss_down *d)
{
	int64_t skip = ss_move_skip(&(struct ss_move_view){.lost = d->lost,
							   .from = d->from,
							   .held = d->from_len,
							   .counted = d->in_counted,
							   .received = d->in_received});

	if (skip < 0) {
		ss_log_error("fd %d: the peer says it received %llu bytes over RDMA, we hold %zu "
			     "from %llu",
			     s->fds[0], (unsigned long long)d->in_received, d->from_len,
			     (unsigned long long)d->from);
		return -EPROTO;
	}
	ss_hold_drop_front(s, (size_t)skip);
	if (ss_hold_prepend(s, d->in, d->in_len) != 0)
		return -ENOMEM;
	s->shut_wr_held |= d->ended;
	ss_log_info("fd %d: the stream moved back to TCP (%u bytes given back by the peer, %llu of "
		    "ours resent, %zu to send)",
		    s->fds[0], d->in_len, (unsigned long long)(d->from_len - skip), s->hold_len);
	return 0;
}

static void down_free(struct ss_sock *s)
{
	free(s->down->out);
	free(s->down->in);
	free(s->down);
	s->down = NULL;
}

/*
 * The downgrade cannot finish (the peer vanished or broke the protocol, or
 * the time ran out): nothing can say which bytes arrived, so the TCP
 * connection is reset (connect with AF_UNSPEC sends the reset and keeps the
 * socket) and handed to the application, whose calls then fail.
 */
static void down_reset(struct ss_sock *s)
{
	struct sockaddr sa = {.sa_family = AF_UNSPEC};

	if (s->down)
		down_free(s);
	ss_real.connect(s->tcp_fd, &sa, sizeof(sa));
	free(s->hold);
	s->hold = NULL;
	s->hold_len = 0;
	s->shut_wr_held = false;
}

static void down_abort(struct ss_sock *s, int err)
{
	ss_log_error("fd %d: the move back to TCP failed (%s): the connection is reset", s->fds[0],
		     err == -ETIMEDOUT ? "no answer in time" : strerror(-err));
	down_reset(s);
}

int ss_down_step(struct ss_sock *s)
{
	struct ss_down *d = s->down;
	int r = d->failed ? -ECONNRESET : 0;

	d->events = 0;
	d->look_at = 0;
	if (r == 0 && ss_now_ms() >= d->deadline)
		r = -ETIMEDOUT;
	if (r == 0)
		r = down_check_lost(s, d);
	while (r == 0 && (r = down_send(s, d)) == 0 && !d->returned)
		r = down_build_return(s, d);
	if (r == 0 || r == -EAGAIN) {
		int rd = down_read(s, d);

		r = rd ? rd : r;
	}
	/* A LOST read just now turns the move before it ends. */
	if (r == 0 && d->returned && d->in_done && (r = down_check_lost(s, d)) == 0 &&
	    d->out_off == d->out_len)
		r = down_finish(s, d);
	else if (r == 0)
		r = -EAGAIN;
	if (r == -EAGAIN) {
		/* The deadline is looked at even when nothing else happens. */
		ss_bg_kick(s, d->look_at && d->look_at < d->deadline ? d->look_at : d->deadline);
		return r;
	}
	if (r)
		down_abort(s, r);
	else
		down_free(s);
	return 0;
}

unsigned ss_down_events(struct ss_sock *s)
{
	return s->down ? s->down->events : EPOLLOUT;
}

void ss_down_free(struct ss_sock *s)
{
	if (s->down)
		down_free(s);
}

void ss_down_give_up(struct ss_sock *s)
{
	if (s->down) {
		down_abort(s, -ETIMEDOUT);
	} else {
		ss_log_error(
			"fd %d: %zu bytes could not go to TCP in time: the connection is reset",
			s->fds[0], s->hold_len);
		down_reset(s);
	}
	ss_fallback_flush(s);
}
