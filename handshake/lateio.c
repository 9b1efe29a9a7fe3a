/* The move of a connection that started on TCP, over its TCP fd (lateio.h). */
#include "handshake/lateio.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "handshake/urgread.h"

/* Room made in the taken buffer before each read into it. */
#define LATEIO_TAKE_CHUNK 16384u
/*
 * The most taken bytes a connection keeps: beyond, taking stops until the
 * application reads, and TCP's window holds the peer back as it would.
 */
#define LATEIO_TAKE_MAX (4u << 20)

void ss_lateio_init(struct ss_lateio *x, const struct ss_hs_io *io, int fd, bool client,
		    uint32_t nonce, const struct ss_late_hooks *hooks, void *ctx)
{
	*x = (struct ss_lateio){.rules = ss_late_init(client),
				.io = io,
				.hooks = hooks,
				.ctx = ctx,
				.fd = fd,
				.nonce = nonce};
}

void ss_lateio_free(struct ss_lateio *x)
{
	free(x->taken);
	x->taken = NULL;
	x->taken_off = x->taken_len = x->taken_cap = 0;
}

bool ss_lateio_owes(const struct ss_lateio *x)
{
	return x->mark_owed || x->out_len > 0;
}

/* Puts a message of the move behind what is owed. Returns its length or -EINVAL (bad params). */
static int lateio_queue(struct ss_lateio *x, enum ss_msg_type type, const struct ss_params *p)
{
	struct ss_msg m = {.type = type, .nonce = x->nonce, .reason = x->rules.reason};
	int n;

	if (p)
		m.params = *p;
	/* Room for the two longest messages a side ever owes. */
	n = ss_msg_encode(&m, x->out + x->out_len, sizeof(x->out) - x->out_len);
	if (n > 0)
		x->out_len += (size_t)n;
	return n;
}

/*
 * Answers an action that needs a decision (PREPARE, DECIDE, CHECK) through
 * the hooks; a yes to PREPARE or DECIDE queues its HELLO or ACCEPT here.
 */
static unsigned lateio_decide(struct ss_lateio *x, unsigned acts, const struct ss_msg *peer)
{
	struct ss_params mine = {0};
	enum ss_reason r;

	if (acts & SS_LATE_A_PREPARE)
		r = x->hooks->prepare(x->ctx, &mine);
	else if (acts & SS_LATE_A_DECIDE)
		r = x->hooks->decide(x->ctx, peer, &mine);
	else
		r = x->hooks->check(x->ctx, peer);
	/* Parameters that cannot be sent are the hook's failure: a DECLINE goes instead. */
	if (r == SS_REASON_NONE && !(acts & SS_LATE_A_CHECK) &&
	    lateio_queue(x, acts & SS_LATE_A_PREPARE ? SS_MSG_HELLO : SS_MSG_ACCEPT, &mine) < 0)
		r = SS_REASON_PARAMS;
	if (r != SS_REASON_NONE)
		return ss_late_step(&x->rules, SS_LATE_EV_NO, (uint16_t)r);
	return ss_late_step(&x->rules, SS_LATE_EV_YES, 0);
}

/* Does what the rules asked; peer: the message that made them ask. */
static void lateio_act(struct ss_lateio *x, unsigned acts, const struct ss_msg *peer)
{
	if (acts & SS_LATE_A_MARK)
		x->mark_owed = true;
	if (acts & (SS_LATE_A_PREPARE | SS_LATE_A_DECIDE | SS_LATE_A_CHECK))
		lateio_act(x, lateio_decide(x, acts, peer), NULL); /* its ACCEPT is queued */
	if (acts & SS_LATE_A_READY)
		lateio_queue(x, SS_MSG_READY, NULL);
	if (acts & SS_LATE_A_DECLINE)
		lateio_queue(x, SS_MSG_DECLINE, NULL);
}

/* Sends our mark, then the messages behind it, as far as the socket takes them. */
static int lateio_flush(struct ss_lateio *x)
{
	const int f = MSG_DONTWAIT | MSG_NOSIGNAL;
	ssize_t n;

	if (x->mark_owed) {
		n = x->io->send(x->fd, "!", 1, f | MSG_OOB);
		if (n < 0)
			return errno == EAGAIN || errno == EINTR ? 0 : -errno;
		x->mark_owed = false;
	}
	while (x->out_len) {
		n = x->io->send(x->fd, x->out, x->out_len, f);
		if (n < 0)
			return errno == EAGAIN || errno == EINTR ? 0 : -errno;
		memmove(x->out, x->out + n, x->out_len - (size_t)n);
		x->out_len -= (size_t)n;
	}
	return 0;
}

/* Room for LATEIO_TAKE_CHUNK more taken bytes. Returns 0 or -ENOMEM. */
static int lateio_room(struct ss_lateio *x)
{
	size_t need = x->taken_len + LATEIO_TAKE_CHUNK;
	uint8_t *t;

	if (x->taken_off) {
		memmove(x->taken, x->taken + x->taken_off, x->taken_len);
		x->taken_off = 0;
	}
	if (need <= x->taken_cap)
		return 0;
	t = realloc(x->taken, need);
	if (!t)
		return -ENOMEM;
	x->taken = t;
	x->taken_cap = need;
	return 0;
}

/* A read from fd that may have taken bytes: what a wait saw before it no longer holds. */
static void lateio_took(struct ss_lateio *x)
{
	x->takes++;
	x->shown = false;
}

uint32_t ss_lateio_takes(const struct ss_lateio *x)
{
	return x->takes;
}

/*
 * On TCP for good before any read passed the peer's mark (our DECLINE was
 * the last message): one read passes it, so that a close sends a FIN and
 * not a reset. What comes behind the mark then is the peer's stream: a
 * byte of it taken here is the application's, first in line with the
 * taken ones (the end of stream too).
 */
static void lateio_pass_mark(struct ss_lateio *x)
{
	ssize_t n;

	x->mark_unpassed = false;
	if (lateio_room(x) < 0)
		return; /* no memory: the close may reset, as it would have */
	n = x->io->recv(x->fd, x->taken + x->taken_len, 1, MSG_DONTWAIT);
	lateio_took(x);
	if (n == 1)
		x->taken_len++;
	else if (n == 0)
		x->taken_eof = true;
}

static void lateio_event(struct ss_lateio *x, enum ss_late_event ev, const struct ss_msg *peer)
{
	lateio_act(x, ss_late_step(&x->rules, ev, 0), peer);
	if (x->rules.state == SS_LATE_TCP && x->mark_unpassed)
		lateio_pass_mark(x);
}

void ss_lateio_shown(struct ss_lateio *x, uint32_t takes, short revents)
{
	x->shown = (revents & POLLIN) && !(revents & POLLPRI) && takes == x->takes;
}

/*
 * The peer's mark is at the head: its urgent byte is read out of band, so
 * the socket stops showing POLLPRI while we wait for what comes behind it
 * (the mark stays where it is for reads and SIOCATMARK).
 */
static void lateio_found_mark(struct ss_lateio *x)
{
	char c;

	x->io->recv(x->fd, &c, 1, MSG_OOB | MSG_DONTWAIT);
	lateio_took(x);
	x->mark_unpassed = true;
	lateio_event(x, SS_LATE_EV_PEER_MARK, NULL);
}

bool ss_lateio_full(const struct ss_lateio *x)
{
	return x->taken_len >= LATEIO_TAKE_MAX;
}

/* Takes the peer's bytes off TCP up to its mark (or its end). Returns 0 or -errno. */
static int lateio_take(struct ss_lateio *x)
{
	while (!ss_lateio_full(x)) {
		size_t got = 0;
		int r = lateio_room(x);

		if (r < 0)
			return r; /* ours, not the peer's: nothing changes */
		r = ss_urg_recv(
			x->io, x->fd, x->taken + x->taken_len, x->taken_cap - x->taken_len, 0,
			x->rules.state == SS_LATE_MARKED ? SS_URG_LOOK_EACH : SS_URG_LOOK_EMPTY,
			&got);
		lateio_took(x);
		if (r == -EAGAIN)
			return 0;
		if (r == SS_URG_AT_MARK) {
			lateio_found_mark(x);
			return 0;
		}
		if (r < 0 || got == 0) {
			/* The peer's end (or a failed connection): the move ends on TCP. */
			x->taken_eof = r == 0;
			lateio_event(x, SS_LATE_EV_PEER_EOF, NULL);
			return r < 0 ? r : 0;
		}
		x->taken_len += got;
	}
	return 0;
}

/* True when the peer's lone mark is on its way to us (the socket shows POLLPRI). */
static bool lateio_mark_coming(const struct ss_lateio *x)
{
	struct pollfd p = {.fd = x->fd, .events = POLLPRI};

	return x->io->poll(&p, 1, 0) > 0 && (p.revents & POLLPRI);
}

void ss_lateio_pass_lone_mark(struct ss_lateio *x)
{
	char c;

	if (!lateio_mark_coming(x))
		return;
	x->io->recv(x->fd, &c, 1, MSG_OOB | MSG_DONTWAIT);
	if (x->io->recv(x->fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) < 0 && errno == EAGAIN)
		x->io->recv(x->fd, &c, 1, MSG_DONTWAIT);
}

/* Reads the next message of the exchange, if it is there. */
static void lateio_read_msg(struct ss_lateio *x)
{
	static const enum ss_late_event ev_of[] = {
		[SS_MSG_HELLO] = SS_LATE_EV_HELLO,     [SS_MSG_ACCEPT] = SS_LATE_EV_ACCEPT,
		[SS_MSG_DECLINE] = SS_LATE_EV_DECLINE, [SS_MSG_READY] = SS_LATE_EV_READY,
		[SS_MSG_ACK] = SS_LATE_EV_OTHER,       [SS_MSG_SWITCH] = SS_LATE_EV_OTHER,
		[SS_MSG_RETURN] = SS_LATE_EV_OTHER,    [SS_MSG_LOST] = SS_LATE_EV_OTHER,
		[SS_MSG_LATER] = SS_LATE_EV_OTHER,
	};
	struct ss_msg m;
	enum ss_hs_read_result rr = ss_hs_read(x->io, x->fd, &m, 0, NULL);

	lateio_took(x);
	switch (rr) {
	case SS_HSR_MSG:
		x->mark_unpassed = false; /* its read began at the mark */
		lateio_event(x, m.nonce == x->nonce ? ev_of[m.type] : SS_LATE_EV_OTHER, &m);
		return;
	case SS_HSR_FOREIGN:
	case SS_HSR_BAD: lateio_event(x, SS_LATE_EV_OTHER, NULL); return;
	case SS_HSR_EOF:
	case SS_HSR_ERROR: lateio_event(x, SS_LATE_EV_PEER_EOF, NULL); return;
	default: return; /* not there yet */
	}
}

int ss_lateio_step(struct ss_lateio *x)
{
	for (;;) {
		enum ss_late_state was = x->rules.state;
		int r = lateio_flush(x);

		if (r < 0)
			return r;
		switch (was) {
		case SS_LATE_QUIET:
			if (!lateio_mark_coming(x))
				return 0;
			r = lateio_take(x);
			break;
		case SS_LATE_MARKED: r = lateio_take(x); break;
		case SS_LATE_C_WAIT_ANSWER:
		case SS_LATE_S_WAIT_HELLO:
		case SS_LATE_S_WAIT_READY: lateio_read_msg(x); break;
		case SS_LATE_BROKEN: return -ECONNRESET;
		default: return 0; /* decided; flushed above */
		}
		if (r < 0)
			return r;
		if (x->rules.state == SS_LATE_BROKEN)
			return -ECONNRESET;
		if (x->rules.state == was)
			return lateio_flush(x);
	}
}

int ss_lateio_event(struct ss_lateio *x, enum ss_late_event ev)
{
	lateio_event(x, ev, NULL);
	return lateio_flush(x);
}

/* The application's read of taken bytes. */
static size_t lateio_give(struct ss_lateio *x, void *buf, size_t len, int flags)
{
	size_t n = len < x->taken_len ? len : x->taken_len;

	/* MSG_TRUNC: counted, not copied (TCP's; the buffer may be NULL). */
	if (!(flags & MSG_TRUNC))
		memcpy(buf, x->taken + x->taken_off, n);
	if (!(flags & MSG_PEEK)) {
		x->taken_off += n;
		x->taken_len -= n;
	}
	return n;
}

int ss_lateio_read(struct ss_lateio *x, void *buf, size_t len, int flags, bool lone, size_t *got_p)
{
	enum ss_late_state st = x->rules.state;
	int r;

	if (len == 0 || x->taken_len || x->taken_eof) {
		/* A read of 0 bytes is answered 0, as TCP's, and looks at nothing. */
		*got_p = x->taken_len ? lateio_give(x, buf, len, flags) : 0;
		return SS_LATEIO_BYTES;
	}
	if (st == SS_LATE_QUIET || st == SS_LATE_MARKED) {
		/* Our own mark not sent: the peer's comes alone, so a showing holds (lateio.h). */
		bool shown = st == SS_LATE_QUIET && x->shown && !(flags & MSG_PEEK);

		r = ss_urg_recv(x->io, x->fd, buf, len, flags,
				st == SS_LATE_MARKED ? SS_URG_LOOK_EACH
				: shown              ? SS_URG_LOOK_SHOWN
				: lone               ? SS_URG_LOOK_EMPTY
						     : SS_URG_LOOK_END,
				got_p);
		if (!(flags & MSG_PEEK))
			lateio_took(x);
		if (r == SS_URG_BYTES && *got_p == 0 && !(flags & MSG_PEEK))
			lateio_event(x, SS_LATE_EV_PEER_EOF, NULL);
		if (r != SS_URG_AT_MARK)
			return r == -EAGAIN        ? SS_LATEIO_WAIT
			       : r == SS_URG_BYTES ? SS_LATEIO_BYTES
						   : r;
		lateio_found_mark(x);
	}
	r = ss_lateio_step(x);
	if (r < 0)
		return r;
	st = x->rules.state;
	return st == SS_LATE_RDMA || st == SS_LATE_TCP ? SS_LATEIO_DECIDED : SS_LATEIO_WAIT;
}
