/*
 * handshake/lateio.c on loopback TCP, no device: two applications stream to
 * each other while their connection moves (the QP is a buffer here), and
 * each must read exactly what the other wrote, in order, whichever side
 * moves when, whether it reads or not, declines, pins, shuts, or its peer's
 * mark comes between a read's peek and its take.
 */
#include <errno.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <sys/socket.h>
#include <unistd.h>

#include "handshake/lateio.h"
#include "handshake/urgread.h"
#include "tests/tcp_loop.h"

#define LIO_CHUNK  4096
#define LIO_ROUNDS 20000
#define LIO_BIG    300000

enum lio_want { WANT_RDMA, WANT_TCP };

struct lio_plan {
	bool small;       /* writes 1000 bytes, else LIO_BIG; LIO_CHUNK a round */
	bool lazy;        /* reads nothing until it has written everything */
	bool shut;        /* shuts its writing once everything is written */
	int move;         /* the round (from 1) it wants to move; 0 never */
	int pin;          /* the round it is pinned; 0 never */
	bool fail;        /* its PREPARE, DECIDE or CHECK fails */
	int mark_in_read; /* from this round, the peer marks inside our next read; 0 never */
};

struct lio_case {
	const char *what;
	struct lio_plan plan[2]; /* [0] the client, [1] the server */
	enum lio_want want;
};

struct lio_side {
	const struct lio_plan *plan;
	struct ss_lateio x;
	int fd;
	uint8_t *out; /* what the application writes */
	size_t written;
	uint8_t *in; /* what it read */
	size_t in_len;
	bool in_eof;
	uint8_t *hold; /* its writes held during the move */
	size_t hold_len;
	bool shut_asked, fin_sent;
	uint8_t *qp; /* what it sent over RDMA */
	size_t qp_len, qp_read;
	bool qp_eof;
};

static struct lio_side lio_sides[2];
static int lio_marker = -1; /* the side whose mark goes inside the other's next read */

static enum ss_reason lio_prepare(void *ctx, struct ss_params *mine)
{
	const struct lio_side *s = ctx;

	*mine = (struct ss_params){.caps = SS_CAP_DATA_V1,
				   .recv_mode = SS_RECV_SRQ,
				   .mtu = 3,
				   .sq_depth = 16,
				   .qpn = 0x100 + (uint32_t)(s - lio_sides),
				   .psn = 1,
				   .buf_size = 8192,
				   .window = 8};
	return s->plan->fail ? SS_REASON_RESOURCE : SS_REASON_NONE;
}

static enum ss_reason lio_decide(void *ctx, const struct ss_msg *hello, struct ss_params *mine)
{
	const struct lio_side *s = ctx;

	assert_int_equal(hello->params.qpn, 0x100);
	lio_prepare(ctx, mine);
	return s->plan->fail ? SS_REASON_GID_MISMATCH : SS_REASON_NONE;
}

static enum ss_reason lio_check(void *ctx, const struct ss_msg *accept)
{
	const struct lio_side *s = ctx;

	assert_int_equal(accept->params.qpn, 0x101);
	return s->plan->fail ? SS_REASON_PARAMS : SS_REASON_NONE;
}

static const struct ss_late_hooks lio_hooks = {lio_prepare, lio_decide, lio_check};

/* The forced timing: the other side marks between this read's peek and its take. */
static void lio_between(int fd)
{
	if (lio_marker >= 0 && lio_sides[lio_marker].fd != fd) {
		struct lio_side *m = &lio_sides[lio_marker];

		lio_marker = -1;
		assert_int_equal(ss_lateio_event(&m->x, SS_LATE_EV_MOVE), 0);
	}
}

/* Appends n bytes to a buffer of cap bytes; more than it can hold is a test failure. */
static void lio_append(uint8_t *buf, size_t *len, size_t cap, const uint8_t *b, size_t n)
{
	if (*len + n > cap)
		fail_msg("%zu bytes more than the %zu expected", *len + n - cap, cap);
	memcpy(buf + *len, b, n);
	*len += n;
}

static size_t lio_bytes(const struct lio_side *s)
{
	return s->plan->small ? 1000 : LIO_BIG;
}

static bool lio_decided(const struct lio_side *s)
{
	return s->x.rules.state == SS_LATE_TCP || s->x.rules.state == SS_LATE_RDMA;
}

/* The application writes its next chunk where the connection says. */
static void lio_write(struct lio_side *s)
{
	size_t n = lio_bytes(s) - s->written;
	const uint8_t *b = s->out + s->written;
	ssize_t k;

	if (n > LIO_CHUNK)
		n = LIO_CHUNK;
	if (n == 0)
		return;
	if (ss_late_holds(&s->x.rules) || s->hold_len || s->x.rules.state == SS_LATE_RDMA) {
		lio_append(s->hold, &s->hold_len, lio_bytes(s), b, n);
		s->written += n;
		return;
	}
	k = send(s->fd, b, n, MSG_DONTWAIT);
	if (k < 0)
		assert_int_equal(errno, EAGAIN);
	else
		s->written += (size_t)k;
}

/* What was held goes where the move decided, then the held end of stream. */
static void lio_release(struct lio_side *s)
{
	if (s->x.rules.state == SS_LATE_RDMA) {
		lio_append(s->qp, &s->qp_len, lio_bytes(s), s->hold, s->hold_len);
		s->hold_len = 0;
		s->qp_eof = s->shut_asked;
		return;
	}
	if (s->x.rules.state != SS_LATE_TCP && s->x.rules.state != SS_LATE_QUIET)
		return;
	if (ss_lateio_owes(&s->x))
		return;
	while (s->hold_len) {
		ssize_t k = send(s->fd, s->hold, s->hold_len, MSG_DONTWAIT);

		if (k < 0) {
			assert_int_equal(errno, EAGAIN);
			return;
		}
		memmove(s->hold, s->hold + k, s->hold_len - (size_t)k);
		s->hold_len -= (size_t)k;
	}
	if (s->shut_asked && !s->fin_sent) {
		assert_int_equal(shutdown(s->fd, SHUT_WR), 0);
		s->fin_sent = true;
	}
}

/*
 * As the shim's blocked reader does before its read: a poll's showing
 * (ss_lateio_shown), so that reads take without a peek where the rules
 * allow; not while a case waits to put the peer's mark inside a read's
 * window (between a peek and its take).
 */
static unsigned lio_shown_reads;
static void lio_show(struct lio_side *s)
{
	struct pollfd p = {.fd = s->fd, .events = POLLIN | POLLPRI};
	uint32_t takes = ss_lateio_takes(&s->x);

	if (lio_marker >= 0 || poll(&p, 1, 0) <= 0)
		return;
	ss_lateio_shown(&s->x, takes, p.revents);
	lio_shown_reads += s->x.shown && s->x.rules.state == SS_LATE_QUIET;
}

/* Peeks of taken bytes with MSG_TRUNC made (a count, into no buffer). */
static unsigned lio_trunc_peeks;

/* The application reads what there is. */
static void lio_read(struct lio_side *s, const struct lio_side *peer)
{
	uint8_t buf[LIO_CHUNK], peek[LIO_CHUNK];

	while (!s->in_eof) {
		enum ss_late_state was = s->x.rules.state;
		size_t got = 7, peeked = 0;
		int r = ss_lateio_read(&s->x, buf, 0, 0, true, &got), rp;
		ssize_t k;

		/* A read of nothing changes nothing; a peek shows what the read takes. */
		if (r != SS_LATEIO_BYTES || got != 0 || s->x.rules.state != was)
			fail_msg("a read of 0 bytes gave %d (%zu) in %s", r, got,
				 ss_late_state_str(s->x.rules.state));
		/* MSG_TRUNC counts and copies nothing (TCP's: the buffer may be NULL). */
		if (s->x.taken_len) {
			size_t counted = 0;

			r = ss_lateio_read(&s->x, NULL, 1, MSG_PEEK | MSG_TRUNC, true, &counted);
			assert_int_equal(r, SS_LATEIO_BYTES);
			assert_int_equal(counted, 1);
			lio_trunc_peeks++;
		}
		rp = ss_lateio_read(&s->x, peek, sizeof(peek), MSG_PEEK, true, &peeked);
		lio_show(s);
		r = ss_lateio_read(&s->x, buf, sizeof(buf), 0, true, &got);
		if (rp == SS_LATEIO_BYTES && r == SS_LATEIO_BYTES &&
		    memcmp(peek, buf, got < peeked ? got : peeked) != 0)
			fail_msg("a read took other bytes than its peek showed");

		assert_true(r >= 0);
		if (r == SS_LATEIO_WAIT)
			return;
		if (r == SS_LATEIO_BYTES) {
			lio_append(s->in, &s->in_len, lio_bytes(peer), buf, got);
			s->in_eof = got == 0;
			continue;
		}
		assert_int_not_equal(s->x.rules.state, SS_LATE_BROKEN);
		if (s->x.rules.state == SS_LATE_RDMA) {
			lio_append(s->in, &s->in_len, lio_bytes(peer), peer->qp + s->qp_read,
				   peer->qp_len - s->qp_read);
			s->qp_read = peer->qp_len;
			s->in_eof = peer->qp_eof;
			return;
		}
		k = recv(s->fd, buf, sizeof(buf), MSG_DONTWAIT);
		if (k < 0 && errno == EAGAIN)
			return;
		assert_true(k >= 0);
		lio_append(s->in, &s->in_len, lio_bytes(peer), buf, (size_t)k);
		s->in_eof = k == 0;
	}
}

static void lio_round(struct lio_side *s, struct lio_side *peer, int round)
{
	const struct lio_plan *p = s->plan;
	bool done = s->written == lio_bytes(s);

	if (round == p->move)
		assert_int_equal(ss_lateio_event(&s->x, SS_LATE_EV_MOVE), 0);
	if (round == p->pin)
		assert_int_equal(ss_lateio_event(&s->x, SS_LATE_EV_PIN), 0);
	if (round == p->mark_in_read)
		lio_marker = (int)(peer - lio_sides);
	lio_write(s);
	if (done && p->shut && !s->shut_asked) {
		s->shut_asked = true;
		if (!lio_decided(s))
			assert_int_equal(ss_lateio_event(&s->x, SS_LATE_EV_SHUT), 0);
	}
	assert_int_equal(ss_lateio_step(&s->x), 0);
	lio_release(s);
	if (!p->lazy || done)
		lio_read(s, peer);
}

/*
 * The client's close gives the server the end of stream, not a reset: a
 * mark of the server's that no read passed is unread data to the kernel,
 * which resets the connection at close instead (lateio_pass_mark).
 */
static void lio_close_check(const struct lio_case *c)
{
	struct pollfd p = {.fd = lio_sides[1].fd, .events = POLLIN};
	ssize_t n;
	char b;

	close(lio_sides[0].fd);
	lio_sides[0].fd = -1; /* closed: the caller's close of it does nothing */
	assert_int_equal(poll(&p, 1, 2000), 1);
	n = recv(lio_sides[1].fd, &b, 1, MSG_DONTWAIT);
	if (n != 0)
		fail_msg("%s: the client's close gave the server %s", c->what,
			 n < 0 ? strerror(errno) : "a byte");
}

/* Everything written was read, nothing is held or owed. */
static bool lio_quiet(const struct lio_side *s, const struct lio_side *peer)
{
	return s->written == lio_bytes(s) && !s->hold_len && !ss_lateio_owes(&s->x) &&
	       peer->in_len == lio_bytes(s) && (!s->plan->shut || peer->in_eof);
}

static void lio_run(const struct lio_case *c)
{
	int fds[2], round;

	tcp_loop_pair(&fds[0], &fds[1]);
	for (int i = 0; i < 2; i++) {
		struct lio_side *s = &lio_sides[i];
		size_t n, peer_n = c->plan[1 - i].small ? 1000 : LIO_BIG;

		*s = (struct lio_side){.plan = &c->plan[i], .fd = fds[i]};
		n = lio_bytes(s);
		s->out = malloc(n + 1);
		s->in = malloc(peer_n + 1);
		s->hold = malloc(n + 1);
		s->qp = malloc(n + 1);
		assert_true(s->out && s->in && s->hold && s->qp);
		for (size_t k = 0; k < n; k++)
			s->out[k] = (uint8_t)(k * 131 + (k >> 8) * 7 + (unsigned)i * 89);
		ss_lateio_init(&s->x, &tcp_loop_io, fds[i], i == 0, 0xc0ffee, &lio_hooks, s);
	}
	lio_marker = -1;
	for (round = 1; round <= LIO_ROUNDS; round++) {
		lio_round(&lio_sides[0], &lio_sides[1], round);
		lio_round(&lio_sides[1], &lio_sides[0], round);
		if (lio_quiet(&lio_sides[0], &lio_sides[1]) &&
		    lio_quiet(&lio_sides[1], &lio_sides[0]))
			break;
	}
	for (int i = 0; i < 2; i++) {
		struct lio_side *s = &lio_sides[i], *peer = &lio_sides[1 - i];
		bool want_rdma = c->want == WANT_RDMA;

		if (round > LIO_ROUNDS)
			fail_msg("%s: side %d stuck in %s: wrote %zu of %zu, held %zu, peer read "
				 "%zu",
				 c->what, i, ss_late_state_str(s->x.rules.state), s->written,
				 lio_bytes(s), s->hold_len, peer->in_len);
		if (memcmp(peer->in, s->out, lio_bytes(s)) != 0)
			fail_msg("%s: side %d's bytes arrived changed", c->what, i);
		if ((s->x.rules.state == SS_LATE_RDMA) != want_rdma)
			fail_msg("%s: side %d ended in %s", c->what, i,
				 ss_late_state_str(s->x.rules.state));
		if (peer->in_eof != s->plan->shut)
			fail_msg("%s: side %d's end of stream %s", c->what, i,
				 s->plan->shut ? "lost" : "made up");
	}
	if (lio_marker >= 0)
		fail_msg("%s: no read had a window for the peer's mark", c->what);
	lio_close_check(c);
	for (int i = 0; i < 2; i++) {
		struct lio_side *s = &lio_sides[i];

		ss_lateio_free(&s->x);
		free(s->out);
		free(s->in);
		free(s->hold);
		free(s->qp);
		close(s->fd);
	}
}

/* clang-format off */
static const struct lio_case lio_cases[] = {
	{"the client moves", {{.move = 3}, {0}}, WANT_RDMA},
	{"the server moves", {{0}, {.move = 3}}, WANT_RDMA},
	{"both move in one round", {{.move = 3}, {.move = 3}}, WANT_RDMA},
	{"the client moves before any byte", {{.move = 1}, {0}}, WANT_RDMA},
	{"the client moves, the server reads nothing yet", {{.move = 3}, {.lazy = true}}, WANT_RDMA},
	{"the server moves, the client reads nothing yet", {{.lazy = true}, {.move = 3}}, WANT_RDMA},
	{"both read nothing yet, both move", {{.lazy = true, .move = 5}, {.lazy = true, .move = 9}},
	 WANT_RDMA},
	{"the server declines", {{.move = 3}, {.fail = true}}, WANT_TCP},
	{"the client cannot make its QP", {{.move = 3, .fail = true}, {0}}, WANT_TCP},
	{"the client finds the ACCEPT wrong", {{.fail = true}, {.move = 3}}, WANT_TCP},
	{"the server is pinned", {{0}, {.pin = 2}}, WANT_TCP},
	{"the client is pinned as the server moves", {{.pin = 2}, {.move = 2}}, WANT_TCP},
	{"both shut, the client moves", {{.move = 3, .shut = true}, {.shut = true}}, WANT_RDMA},
	{"the client shuts before the server moves", {{.small = true, .shut = true}, {.move = 5}},
	 WANT_TCP},
	{"the server's mark inside the client's read", {{.mark_in_read = 3}, {0}}, WANT_RDMA},
	{"the client's mark inside the server's read", {{0}, {.mark_in_read = 3}}, WANT_RDMA},
	{"the server's own mark inside the client's take after the client's",
	 {{.lazy = true, .move = 3, .mark_in_read = 3}, {.lazy = true}}, WANT_RDMA},
	{"the client's own mark inside the server's take after the server's",
	 {{.lazy = true}, {.lazy = true, .move = 3, .mark_in_read = 3}}, WANT_RDMA},
};
/* clang-format on */

static void test_lateio_cases(void **state)
{
	(void)state;
	ss_urg_between_hook = lio_between;
	for (size_t i = 0; i < sizeof(lio_cases) / sizeof(lio_cases[0]); i++)
		lio_run(&lio_cases[i]);
	/* The reads without a peek were made, among the others. */
	assert_true(lio_shown_reads > 0);
	assert_true(lio_trunc_peeks > 0);
}

/* What a wait on fd (POLLIN | POLLPRI, without waiting) shows x, as io.c's blocked reader. */
static void lio_wait_shows(struct ss_lateio *x, int fd)
{
	struct pollfd p = {.fd = fd, .events = POLLIN | POLLPRI};
	uint32_t takes = ss_lateio_takes(x);

	usleep(20000); /* loopback delivers inside send; the pause only makes that not matter */
	assert_int_equal(poll(&p, 1, 0), 1);
	ss_lateio_shown(x, takes, p.revents);
}

/*
 * The read without a peek (ss_lateio_shown), one rule at a time: bytes and
 * no mark allow it; a read since the wait began voids it; a pending mark
 * (POLLPRI) does not allow it, and is not lost.
 */
static void test_lateio_shown(void **state)
{
	static const struct lio_plan plain = {0};
	struct ss_lateio *a = &lio_sides[0].x, *b = &lio_sides[1].x;
	char buf[64];
	size_t got = 0;
	int fds[2];

	(void)state;
	ss_urg_between_hook = NULL;
	tcp_loop_pair(&fds[0], &fds[1]);
	for (int i = 0; i < 2; i++) {
		lio_sides[i] = (struct lio_side){.plan = &plain, .fd = fds[i]};
		ss_lateio_init(&lio_sides[i].x, &tcp_loop_io, fds[i], i == 0, 0xc0ffee, &lio_hooks,
			       &lio_sides[i]);
	}
	assert_int_equal(send(fds[1], "hello", 5, 0), 5);
	lio_wait_shows(a, fds[0]);
	assert_true(a->shown);
	assert_int_equal(ss_lateio_read(a, buf, sizeof(buf), 0, false, &got), SS_LATEIO_BYTES);
	assert_true(got == 5 && memcmp(buf, "hello", 5) == 0);
	assert_false(a->shown);

	assert_int_equal(send(fds[1], "xy", 2, 0), 2);
	{
		struct pollfd p = {.fd = fds[0], .events = POLLIN | POLLPRI};
		uint32_t takes = ss_lateio_takes(a);

		usleep(20000);
		assert_int_equal(poll(&p, 1, 0), 1);
		/* Another read between the wait and the showing: it no longer holds. */
		assert_int_equal(ss_lateio_read(a, buf, 1, 0, false, &got), SS_LATEIO_BYTES);
		ss_lateio_shown(a, takes, p.revents);
		assert_false(a->shown);
		assert_int_equal(ss_lateio_read(a, buf, sizeof(buf), 0, false, &got),
				 SS_LATEIO_BYTES);
		assert_true(got == 1 && buf[0] == 'y');
	}

	/*
	 * The peer's mark with its end right behind it (its application shut
	 * down as it moved): POLLIN shows (the end), and so does POLLPRI. A
	 * recv there would pass the mark and read the end.
	 */
	assert_int_equal(ss_lateio_event(b, SS_LATE_EV_MOVE), 0);
	assert_int_equal(ss_lateio_step(b), 0);
	assert_int_equal(shutdown(fds[1], SHUT_WR), 0);
	lio_wait_shows(a, fds[0]);
	if (a->shown)
		fail_msg("a pending mark allowed a read without a peek");
	(void)ss_lateio_read(a, buf, sizeof(buf), 0, false, &got);
	/* Found, it is answered with ours (docs/protocol.md, section 5, rule 3). */
	{
		struct pollfd p = {.fd = fds[1], .events = POLLPRI};

		usleep(20000);
		if (poll(&p, 1, 0) != 1 || !(p.revents & POLLPRI))
			fail_msg("the peer's mark was lost: not answered (%s)",
				 ss_late_state_str(a->rules.state));
	}
	for (int i = 0; i < 2; i++) {
		ss_lateio_free(&lio_sides[i].x);
		close(fds[i]);
	}
}

/*
 * A pinned client whose application reads nothing more (it forks and
 * closes, say): the pin's exchange alone, then the client's close. The
 * server's mark was read out of band and its DECLINE is the last message,
 * so no read passed that mark but the pin's own (lateio_pass_mark): without
 * it, the close would reset the connection (the server's read would get
 * ECONNRESET where TCP gives the end of stream).
 */
static void test_lateio_pin_then_close(void **state)
{
	static const struct lio_plan plain = {0};
	struct ss_lateio *a = &lio_sides[0].x, *b = &lio_sides[1].x;
	struct pollfd p;
	int fds[2], i;
	char c;

	(void)state;
	ss_urg_between_hook = NULL;
	tcp_loop_pair(&fds[0], &fds[1]);
	for (i = 0; i < 2; i++) {
		lio_sides[i] = (struct lio_side){.plan = &plain, .fd = fds[i]};
		ss_lateio_init(&lio_sides[i].x, &tcp_loop_io, fds[i], i == 0, 0xc0ffee, &lio_hooks,
			       &lio_sides[i]);
	}
	assert_int_equal(ss_lateio_event(a, SS_LATE_EV_PIN), 0);
	for (i = 0; i < 200 && (a->rules.state != SS_LATE_TCP || b->rules.state != SS_LATE_TCP);
	     i++) {
		usleep(1000);
		assert_int_equal(ss_lateio_step(b), 0);
		assert_int_equal(ss_lateio_step(a), 0);
	}
	if (a->rules.state != SS_LATE_TCP || b->rules.state != SS_LATE_TCP)
		fail_msg("the pin did not end on TCP: client %s, server %s",
			 ss_late_state_str(a->rules.state), ss_late_state_str(b->rules.state));
	close(fds[0]);
	p = (struct pollfd){.fd = fds[1], .events = POLLIN};
	assert_int_equal(poll(&p, 1, 2000), 1);
	errno = 0;
	if (recv(fds[1], &c, 1, MSG_DONTWAIT) != 0)
		fail_msg("the pinned client's close gave the server %s, not the end of stream",
			 errno ? strerror(errno) : "a byte");
	for (i = 0; i < 2; i++)
		ss_lateio_free(&lio_sides[i].x);
	close(fds[1]);
}

int main(void)
{
	const struct CMUnitTest tests[] = {cmocka_unit_test(test_lateio_cases),
					   cmocka_unit_test(test_lateio_shown),
					   cmocka_unit_test(test_lateio_pin_then_close)};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
