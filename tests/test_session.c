/*
 * The handshake reader and writer (handshake/session.c) over a fake stream:
 * bytes arrive in scripted chunks, one chunk per wait, and the test checks
 * what each call returns and how many bytes it took off the stream. The
 * promise under test: a read takes exactly one whole message and never a
 * byte more; every other outcome takes nothing.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <sys/socket.h>

#include "handshake/session.h"

#define FAKE_MAX 2048

/* One fake TCP stream, read side and write side. */
static struct fake {
	uint8_t bytes[FAKE_MAX]; /* everything the peer will send, in order */
	size_t chunk_end[8]; /* arrival script: after wait k, bytes[0..chunk_end[k]) are there */
	int chunks;          /* entries of chunk_end */
	int arrived;         /* chunks that have arrived */
	size_t taken;        /* bytes consumed by non-peek receives */
	int closed;          /* the peer closes after the last chunk */
	int recv_errno;      /* nonzero: every receive fails with it */
	int recvs, peeks;    /* receive calls, and those that peeked */
	int poll_eintr;      /* polls left that fail with EINTR first */
	/* write side */
	uint8_t sent[FAKE_MAX];
	size_t sent_len;
	size_t send_step; /* at most this many bytes per send (0: all) */
	int send_again;   /* every other send says EAGAIN */
	int send_errno;   /* nonzero: every send fails with it */
	int sends;
} fk;

static size_t fake_avail(void)
{
	return fk.arrived ? fk.chunk_end[fk.arrived - 1] : 0;
}

static ssize_t fake_recv(int fd, void *buf, size_t len, int flags)
{
	size_t have = fake_avail() - fk.taken;

	(void)fd;
	fk.recvs++;
	fk.peeks += !!(flags & MSG_PEEK);
	if (fk.recv_errno) {
		errno = fk.recv_errno;
		return -1;
	}
	if (have == 0) {
		if (fk.closed && fk.arrived == fk.chunks)
			return 0;
		errno = EAGAIN;
		return -1;
	}
	if (len > have)
		len = have;
	memcpy(buf, fk.bytes + fk.taken, len);
	if (!(flags & MSG_PEEK))
		fk.taken += len;
	return (ssize_t)len;
}

static ssize_t fake_send(int fd, const void *buf, size_t len, int flags)
{
	(void)fd;
	(void)flags;
	fk.sends++;
	if (fk.send_errno) {
		errno = fk.send_errno;
		return -1;
	}
	if (fk.send_again && fk.sends % 2 == 0) {
		errno = EAGAIN;
		return -1;
	}
	if (fk.send_step && len > fk.send_step)
		len = fk.send_step;
	assert_true(fk.sent_len + len <= FAKE_MAX);
	memcpy(fk.sent + fk.sent_len, buf, len);
	fk.sent_len += len;
	return (ssize_t)len;
}

/* Every wait lets the next chunk arrive; with none left it sleeps 1 ms and times out. */
static int fake_poll(struct pollfd *fds, nfds_t n, int timeout)
{
	struct timespec ms = {0, 1000000};

	(void)timeout;
	if (fk.poll_eintr > 0) {
		fk.poll_eintr--;
		errno = EINTR;
		return -1;
	}
	if (fk.arrived < fk.chunks) {
		fk.arrived++;
		if (n)
			fds[0].revents = fds[0].events;
		return (int)n;
	}
	if (fk.send_errno == 0 && fk.send_again && n && (fds[0].events & POLLOUT)) {
		fds[0].revents = POLLOUT;
		return 1;
	}
	nanosleep(&ms, NULL);
	return 0;
}

static const struct ss_hs_io fake_io = {.send = fake_send, .recv = fake_recv, .poll = fake_poll};

static const struct ss_params some_params = {
	.caps = SS_CAP_DATA_V1,
	.recv_mode = SS_RECV_RQ,
	.mtu = 3,
	.sq_depth = 64,
	.qpn = 0x10203,
	.psn = 0x40506,
	.gid = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1},
	.buf_size = 8192,
	.window = 16,
};

/* Appends an encoded message to the script's bytes; returns its length. */
static size_t put_msg(size_t *end, uint8_t type, uint32_t nonce)
{
	struct ss_msg m = {.type = type, .nonce = nonce, .params = some_params};
	int n = ss_msg_encode(&m, fk.bytes + *end, FAKE_MAX - *end);

	assert_true(n > 0);
	*end += (size_t)n;
	return (size_t)n;
}

static void put_raw(size_t *end, const void *p, size_t n)
{
	memcpy(fk.bytes + *end, p, n);
	*end += n;
}

enum { APP_BYTES = 5 }; /* "GET /": the application's first bytes after a message */

struct read_case {
	const char *what;
	int script; /* which stream to build, see build_script() */
	enum ss_hs_read_result want;
	enum ss_dec_result want_dec; /* for SS_HSR_BAD */
	int want_taken_msg;          /* 1: exactly the message was taken; 0: nothing */
};

/* Builds stream number k into fk; returns the first message's length (0: none). */
static size_t build_script(int k)
{
	size_t end = 0, len = 0;
	static const uint8_t bad_type[] = {0, 'S', 'R', 'Q', 'S', 'H', 'M', 0xa5,
					   1, 99,  0,   16,  0,   0,   0,   1};

	memset(&fk, 0, sizeof(fk));
	switch (k) {
	case 0: /* a HELLO and the application's bytes behind it, at once */
		len = put_msg(&end, SS_MSG_HELLO, 7);
		put_raw(&end, "GET /", APP_BYTES);
		fk.chunk_end[fk.chunks++] = end;
		break;
	case 1: /* the same, in pieces: 1 byte, 10 bytes, the rest with the application's */
		len = put_msg(&end, SS_MSG_ACCEPT, 7);
		put_raw(&end, "GET /", APP_BYTES);
		fk.chunk_end[fk.chunks++] = 1;
		fk.chunk_end[fk.chunks++] = 11;
		fk.chunk_end[fk.chunks++] = end;
		break;
	case 2: /* two messages back to back: the first only */
		len = put_msg(&end, SS_MSG_ACK, 7);
		put_msg(&end, SS_MSG_DECLINE, 7);
		fk.chunk_end[fk.chunks++] = end;
		break;
	case 3: /* a plain client's request */
		put_raw(&end, "GET / HTTP/1.1\r\n", 16);
		fk.chunk_end[fk.chunks++] = end;
		break;
	case 4: /* a zero byte, then not our magic: foreign at the second byte */
		put_raw(&end, "\0X", 2);
		fk.chunk_end[fk.chunks++] = 1;
		fk.chunk_end[fk.chunks++] = end;
		break;
	case 5: /* our magic with a type nobody sends */
		put_raw(&end, bad_type, sizeof(bad_type));
		fk.chunk_end[fk.chunks++] = end;
		break;
	case 6: /* half a HELLO, then nothing until the deadline */
		put_msg(&end, SS_MSG_HELLO, 7);
		fk.chunk_end[fk.chunks++] = 20;
		break;
	case 7: /* nothing at all until the deadline */ break;
	case 8: /* the peer closes at once */ fk.closed = 1; break;
	case 9: /* the connection is reset */ fk.recv_errno = ECONNRESET; break;
	case 10: /* half a HELLO, then the peer closes: the half stays, as a stream byte would */
		put_msg(&end, SS_MSG_HELLO, 7);
		fk.chunk_end[fk.chunks++] = 20;
		fk.closed = 1;
		break;
	case 11: /* waits interrupted by signals go on */
		len = put_msg(&end, SS_MSG_READY, 7);
		fk.chunk_end[fk.chunks++] = end;
		fk.poll_eintr = 3;
		break;
	case 12: /* a LATER (a header alone) and the server's bytes behind it */
		len = put_msg(&end, SS_MSG_LATER, 7);
		put_raw(&end, "GET /", APP_BYTES);
		fk.chunk_end[fk.chunks++] = end;
		break;
	}
	return len;
}

static const struct read_case read_cases[] = {
	{"message then stream bytes", 0, SS_HSR_MSG, SS_DEC_OK, 1},
	{"message in three pieces", 1, SS_HSR_MSG, SS_DEC_OK, 1},
	{"two messages: one taken", 2, SS_HSR_MSG, SS_DEC_OK, 1},
	{"plain request", 3, SS_HSR_FOREIGN, SS_DEC_OK, 0},
	{"foreign at byte 2", 4, SS_HSR_FOREIGN, SS_DEC_OK, 0},
	{"malformed type", 5, SS_HSR_BAD, SS_DEC_MALFORMED, 0},
	{"partial at deadline", 6, SS_HSR_PARTIAL, SS_DEC_OK, 0},
	{"nothing at deadline", 7, SS_HSR_TIMEOUT, SS_DEC_OK, 0},
	{"closed before anything", 8, SS_HSR_EOF, SS_DEC_OK, 0},
	{"reset", 9, SS_HSR_ERROR, SS_DEC_OK, 0},
	{"partial then closed", 10, SS_HSR_PARTIAL, SS_DEC_OK, 0},
	{"EINTR in waits", 11, SS_HSR_MSG, SS_DEC_OK, 1},
};

static void test_read_table(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(read_cases) / sizeof(read_cases[0]); i++) {
		const struct read_case *c = &read_cases[i];
		size_t len = build_script(c->script);
		struct ss_msg m = {0};
		enum ss_dec_result dec = SS_DEC_OK;
		enum ss_hs_read_result r = ss_hs_read(&fake_io, 3, &m, 40, &dec);

		print_message("%s\n", c->what);
		assert_int_equal(r, c->want);
		if (r == SS_HSR_BAD)
			assert_int_equal(dec, c->want_dec);
		assert_int_equal(fk.taken, c->want_taken_msg ? len : 0);
		if (r == SS_HSR_MSG)
			assert_int_equal(m.nonce, 7);
	}
}

/* After a message, the stream's own bytes come next, whole and in order. */
static void test_read_leaves_stream(void **state)
{
	struct ss_msg m;
	uint8_t app[16];

	(void)state;
	build_script(1);
	assert_int_equal(ss_hs_read(&fake_io, 3, &m, 1000, NULL), SS_HSR_MSG);
	assert_int_equal(m.type, SS_MSG_ACCEPT);
	assert_int_equal(fake_recv(3, app, sizeof(app), 0), APP_BYTES);
	assert_memory_equal(app, "GET /", APP_BYTES);

	build_script(2);
	assert_int_equal(ss_hs_read(&fake_io, 3, &m, 1000, NULL), SS_HSR_MSG);
	assert_int_equal(m.type, SS_MSG_ACK);
	assert_int_equal(ss_hs_read(&fake_io, 3, &m, 1000, NULL), SS_HSR_MSG);
	assert_int_equal(m.type, SS_MSG_DECLINE);
	assert_int_equal(fk.taken, fake_avail());
}

/* Peek takes nothing; consume takes exactly what peek reported. */
static void test_peek_consume(void **state)
{
	struct ss_msg m;
	size_t used = 0, len;

	(void)state;
	len = build_script(0);
	assert_int_equal(ss_hs_peek(&fake_io, 3, &m, 1000, NULL, &used), SS_HSR_MSG);
	assert_int_equal(used, len);
	assert_int_equal(fk.taken, 0);
	assert_int_equal(ss_hs_consume(&fake_io, 3, used), 0);
	assert_int_equal(fk.taken, len);
}

struct take_case {
	const char *what;
	int script;
	enum ss_hs_read_result want; /* what the call that ends it returns */
	uint8_t want_type;           /* for SS_HSR_MSG */
	int want_calls;              /* calls until then (one chunk arrives after each) */
	long want_taken;             /* bytes taken off the stream; -1: the message's length */
	int want_recvs;              /* receives in all */
};

/*
 * ss_hs_take over the same streams: no peek, a message taken whole and
 * never a byte more, its header first; a part kept across calls until the
 * rest comes; bytes that are no message may be taken (the reader drops
 * that stream).
 */
static const struct take_case take_cases[] = {
	{"HELLO then stream bytes: header, then the rest", 0, SS_HSR_MSG, SS_MSG_HELLO, 1, -1, 2},
	{"LATER then stream bytes: one receive", 12, SS_HSR_MSG, SS_MSG_LATER, 1, -1, 1},
	{"ACCEPT in three pieces, kept between calls", 1, SS_HSR_MSG, SS_MSG_ACCEPT, 3, -1, 6},
	{"two messages: the first only", 2, SS_HSR_MSG, SS_MSG_ACK, 1, -1, 1},
	{"plain request", 3, SS_HSR_FOREIGN, 0, 1, 16, 1},
	{"foreign at byte 2", 4, SS_HSR_FOREIGN, 0, 2, 2, 3},
	{"malformed type", 5, SS_HSR_BAD, 0, 1, 16, 1},
	{"closed before anything", 8, SS_HSR_EOF, 0, 1, 0, 1},
	{"reset", 9, SS_HSR_ERROR, 0, 1, 0, 1},
};

static void test_take_table(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(take_cases) / sizeof(take_cases[0]); i++) {
		const struct take_case *c = &take_cases[i];
		size_t len = build_script(c->script);
		struct ss_hs_part *part = NULL;
		struct ss_msg m = {0};
		enum ss_hs_read_result r;
		int calls = 0;

		print_message("%s\n", c->what);
		fk.arrived = fk.chunks ? 1 : 0;
		for (;;) {
			r = ss_hs_take(&fake_io, 3, &part, &m, NULL);
			calls++;
			if (r != SS_HSR_TIMEOUT || fk.arrived == fk.chunks)
				break;
			assert_true(part != NULL || fk.taken == 0);
			fk.arrived++;
		}
		assert_int_equal(r, c->want);
		assert_int_equal(calls, c->want_calls);
		assert_int_equal(fk.taken, c->want_taken < 0 ? len : (size_t)c->want_taken);
		assert_int_equal(fk.recvs, c->want_recvs);
		assert_int_equal(fk.peeks, 0);
		assert_null(part);
		if (r == SS_HSR_MSG) {
			assert_int_equal(m.type, c->want_type);
			assert_int_equal(m.nonce, 7);
		}
	}
}

/* Nothing there, part of a message at the end of what came, or the end behind a part: the part
 * waits, nothing is lost. */
static void test_take_waits(void **state)
{
	struct ss_hs_part *part = NULL;
	struct ss_msg m;

	(void)state;
	build_script(7);
	assert_int_equal(ss_hs_take(&fake_io, 3, &part, &m, NULL), SS_HSR_TIMEOUT);
	assert_null(part);
	build_script(6);
	fk.arrived = 1;
	assert_int_equal(ss_hs_take(&fake_io, 3, &part, &m, NULL), SS_HSR_TIMEOUT);
	assert_non_null(part);
	assert_int_equal(part->got, 20);
	assert_memory_equal(part->buf, fk.bytes, 20);
	assert_int_equal(ss_hs_take(&fake_io, 3, &part, &m, NULL), SS_HSR_TIMEOUT);
	assert_int_equal(part->got, 20);
	free(part);
	/* The end behind a part (our own SHUT_RD shows one before more comes): the part stays. */
	part = NULL;
	build_script(10);
	fk.arrived = 1;
	assert_int_equal(ss_hs_take(&fake_io, 3, &part, &m, NULL), SS_HSR_EOF);
	assert_non_null(part);
	assert_int_equal(part->got, 20);
	assert_int_equal(fk.recvs, 3);
	free(part);
}

struct write_case {
	const char *what;
	size_t step;
	int again;
	int err;
	int want; /* 0, or the negative errno */
};

static const struct write_case write_cases[] = {
	{"one send", 0, 0, 0, 0},
	{"3 bytes at a time", 3, 0, 0, 0},
	{"EAGAIN between pieces", 7, 1, 0, 0},
	{"broken pipe", 0, 0, EPIPE, -EPIPE},
};

static void test_write_table(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(write_cases) / sizeof(write_cases[0]); i++) {
		const struct write_case *c = &write_cases[i];
		struct ss_msg m = {.type = SS_MSG_HELLO, .nonce = 9, .params = some_params};
		uint8_t want[SS_HELLO_MAX_LEN];
		int len = ss_msg_encode(&m, want, sizeof(want));

		print_message("%s\n", c->what);
		memset(&fk, 0, sizeof(fk));
		fk.send_step = c->step;
		fk.send_again = c->again;
		fk.send_errno = c->err;
		assert_int_equal(ss_hs_write(&fake_io, 3, &m, 1000), c->want);
		if (c->want == 0) {
			assert_int_equal(fk.sent_len, (size_t)len);
			assert_memory_equal(fk.sent, want, (size_t)len);
		}
	}
}

/* A peer that never reads: the write ends at its deadline with ETIMEDOUT. */
static void test_write_deadline(void **state)
{
	struct ss_msg m = {.type = SS_MSG_READY, .nonce = 9};

	(void)state;
	memset(&fk, 0, sizeof(fk));
	fk.send_errno = EAGAIN;
	assert_int_equal(ss_hs_write(&fake_io, 3, &m, 30), -ETIMEDOUT);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_read_table),     cmocka_unit_test(test_read_leaves_stream),
		cmocka_unit_test(test_peek_consume),   cmocka_unit_test(test_write_table),
		cmocka_unit_test(test_write_deadline), cmocka_unit_test(test_take_table),
		cmocka_unit_test(test_take_waits),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
