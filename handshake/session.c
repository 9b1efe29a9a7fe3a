#include "handshake/session.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/*
 * A call's wait: wait_ms from the moment it first has to wait (0: never).
 * The clock (a system call in some guests) is read only then: a message
 * that goes or comes whole costs no reading.
 */
struct hs_wait {
	int ms;
	uint64_t end; /* 0 until the first wait */
};

static int remaining(struct hs_wait *w)
{
	uint64_t now;

	if (w->ms <= 0)
		return 0;
	now = ss_now_ms();
	if (w->end == 0)
		w->end = now + (uint64_t)w->ms;
	return w->end > now ? (int)(w->end - now) : 0;
}

/* Waits for events on fd within w: 1 ready, 0 timed out, -errno. */
static int wait_fd(const struct ss_hs_io *io, int fd, short events, struct hs_wait *w)
{
	for (;;) {
		struct pollfd p = {.fd = fd, .events = events};
		int n = io->poll(&p, 1, remaining(w));

		if (n > 0)
			return 1;
		if (n == 0)
			return 0;
		if (errno != EINTR)
			return -errno;
	}
}

int ss_hs_write(const struct ss_hs_io *io, int fd, const struct ss_msg *m, int wait_ms)
{
	struct hs_wait w = {.ms = wait_ms};
	uint8_t buf[SS_HELLO_MAX_LEN];
	int len = ss_msg_encode(m, buf, sizeof(buf));
	size_t off = 0;

	if (len < 0)
		return len;
	while (off < (size_t)len) {
		ssize_t n = io->send(fd, buf + off, (size_t)len - off, MSG_DONTWAIT | MSG_NOSIGNAL);

		if (n > 0) {
			off += (size_t)n;
			continue;
		}
		if (n < 0 && errno != EAGAIN && errno != EINTR)
			return -errno;
		int r = wait_fd(io, fd, POLLOUT, &w);
		if (r == 0)
			return -ETIMEDOUT;
		if (r < 0)
			return r;
	}
	return 0;
}

/*
 * What bytes the decoder did not take for a message (or a valid prefix)
 * are: foreign, or ours but unreadable (*dec_p, may be NULL, says why).
 */
static enum ss_hs_read_result hs_no_message(enum ss_dec_result d, enum ss_dec_result *dec_p)
{
	if (d == SS_DEC_FOREIGN)
		return SS_HSR_FOREIGN;
	if (dec_p)
		*dec_p = d;
	return SS_HSR_BAD;
}

enum ss_hs_read_result ss_hs_peek(const struct ss_hs_io *io, int fd, struct ss_msg *m, int wait_ms,
				  enum ss_dec_result *dec_p, size_t *used_p)
{
	struct hs_wait w = {.ms = wait_ms};
	uint8_t buf[SS_HELLO_MAX_LEN];
	size_t last_len = 0;

	for (;;) {
		ssize_t n = io->recv(fd, buf, sizeof(buf), MSG_PEEK | MSG_DONTWAIT);
		size_t used;

		if (n == 0)
			return SS_HSR_EOF;
		if (n < 0 && errno != EAGAIN && errno != EINTR)
			return SS_HSR_ERROR;
		if (n > 0) {
			enum ss_dec_result r = ss_msg_decode(buf, (size_t)n, m, &used);

			if (r == SS_DEC_FOREIGN || r == SS_DEC_MALFORMED || r == SS_DEC_UNSUPPORTED)
				return hs_no_message(r, dec_p);
			if (r == SS_DEC_OK) {
				*used_p = used;
				return SS_HSR_MSG;
			}
		}
		/* Nothing, or a partial message: wait for more bytes. */
		if (remaining(&w) == 0)
			return n > 0 ? SS_HSR_PARTIAL : SS_HSR_TIMEOUT;
		if (n <= 0) {
			int r = wait_fd(io, fd, POLLIN, &w);
			if (r < 0)
				return SS_HSR_ERROR;
			continue;
		}
		/* Readable already: poll would not wait; nap briefly for the rest. */
		if ((size_t)n == last_len)
			io->poll(NULL, 0, 1);
		last_len = (size_t)n;
	}
}

int ss_hs_consume(const struct ss_hs_io *io, int fd, size_t used)
{
	uint8_t buf[SS_HELLO_MAX_LEN];

	/* Exactly this message: what follows belongs to the stream. */
	return io->recv(fd, buf, used, MSG_DONTWAIT) == (ssize_t)used ? 0 : -EIO;
}

enum ss_hs_read_result ss_hs_read(const struct ss_hs_io *io, int fd, struct ss_msg *m, int wait_ms,
				  enum ss_dec_result *dec_p)
{
	size_t used;
	enum ss_hs_read_result r = ss_hs_peek(io, fd, m, wait_ms, dec_p, &used);

	if (r == SS_HSR_MSG && ss_hs_consume(io, fd, used) != 0)
		return SS_HSR_ERROR;
	return r;
}

enum ss_hs_read_result ss_hs_take(const struct ss_hs_io *io, int fd, struct ss_hs_part **part_p,
				  struct ss_msg *m, enum ss_dec_result *dec_p)
{
	uint8_t mine[SS_HELLO_MAX_LEN];
	struct ss_hs_part *p = *part_p;
	uint8_t *buf = p ? p->buf : mine;
	size_t got = p ? p->got : 0, want;
	enum ss_hs_read_result r;

	for (;;) {
		/* Nothing yet is a valid prefix: the header is wanted first. */
		enum ss_dec_result d = ss_msg_decode(buf, got, m, &want);
		ssize_t n;

		if (d == SS_DEC_OK) {
			r = SS_HSR_MSG;
			break;
		}
		if (d != SS_DEC_SHORT) {
			r = hs_no_message(d, dec_p);
			break;
		}
		n = io->recv(fd, buf + got, want - got, MSG_DONTWAIT);
		if (n > 0) {
			got += (size_t)n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno != EAGAIN) {
			r = SS_HSR_ERROR;
			break;
		}
		/*
		 * Nothing more now, or the end (which the reader's own SHUT_RD
		 * shows before more bytes come): what came of the message
		 * waits for the rest.
		 */
		if (got && !p) {
			if (!(p = malloc(sizeof(*p))))
				return SS_HSR_ERROR;
			memcpy(p->buf, mine, got);
		}
		if (p)
			p->got = (uint16_t)got;
		*part_p = p;
		return n == 0 ? SS_HSR_EOF : SS_HSR_TIMEOUT;
	}
	free(p);
	*part_p = NULL;
	return r;
}
