/*
 * stream_check: a test program of the kind the shim must carry unmodified.
 * Both ends send a pseudo-random stream at the same time, in random write
 * sizes, and check every byte they read (random read sizes) against the
 * generator of the other end. The client then half-closes; the server reads
 * to end of file, answers with the hash of all it received, and closes; the
 * client checks that answer and its own end of file. Each end prints the
 * SHA-256 of all it sent and of all it received, for the caller to compare
 * across the two ends.
 *
 *   stream_check server ADDR PORT STYLE BYTES [HOLD]
 *   stream_check client ADDR PORT STYLE BYTES [HOLD]
 *
 * STYLE: block (a reader and a writer thread on blocking calls), epoll-lt,
 * epoll-et, poll, select (one thread, non-blocking fd), nbconnect (the
 * client connects without blocking, then as poll). Exit status 0: every
 * byte checked. HOLD: seconds the checked connection stays open before its
 * close, for a status reader to see its final state (default 0).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <linux/tcp.h> /* struct tcp_info with its byte counters */
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <unistd.h>

#include "sha256.h"
#include "tools/prog.h"

#define SEED_SERVER 0x5eed5eedull
#define SEED_CLIENT 0xc11e47ull
#define MAX_IO      65536

enum style { BLOCK, EPOLL_LT, EPOLL_ET, POLL, SELECT, NBCONNECT };

static const char *const style_names[] = {"block", "epoll-lt", "epoll-et",
					  "poll",  "select",   "nbconnect"};

struct stream {
	uint64_t state; /* the byte generator */
	uint64_t hash;
	uint64_t done;     /* bytes generated or checked */
	struct sha256 sha; /* of the same bytes, printed at the end */
};

__attribute__((format(printf, 1, 2))) static void fail(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "stream_check: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n");
	exit(1);
}

static uint8_t next_byte(struct stream *s)
{
	s->state = s->state * 6364136223846793005ull + 1442695040888963407ull;
	return (uint8_t)(s->state >> 56);
}

static void hash_bytes(struct stream *s, const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		s->hash = (s->hash ^ p[i]) * 1099511628211ull;
}

static uint64_t rnd_state = 88172645463325252ull;
static size_t rnd_size(void)
{
	rnd_state ^= rnd_state << 13;
	rnd_state ^= rnd_state >> 7;
	rnd_state ^= rnd_state << 17;
	/* Mostly small, sometimes large: both coalescing and splitting get exercised. */
	return rnd_state % 4 ? 1 + rnd_state % 2048 : 1 + rnd_state % MAX_IO;
}

struct endpoint {
	int fd;
	bool server;
	uint64_t bytes;
	struct stream out, in;
	uint8_t wbuf[MAX_IO];
	size_t wlen, woff; /* the chunk being written */
	bool sent_all, eof, answered;
	uint8_t answer[8];
	size_t answer_got;
};

static void init_endpoint(struct endpoint *e, int fd, bool server, uint64_t bytes)
{
	memset(e, 0, sizeof(*e));
	e->fd = fd;
	e->server = server;
	e->bytes = bytes;
	e->out.state = server ? SEED_SERVER : SEED_CLIENT;
	e->in.state = server ? SEED_CLIENT : SEED_SERVER;
	e->out.hash = e->in.hash = 1469598103934665603ull;
	sha256_init(&e->out.sha);
	sha256_init(&e->in.sha);
}

/* Makes the next chunk to write; false when all is sent. */
static bool fill_chunk(struct endpoint *e)
{
	if (e->woff < e->wlen)
		return true;
	if (e->out.done == e->bytes)
		return false;
	e->wlen = rnd_size();
	if (e->wlen > e->bytes - e->out.done)
		e->wlen = (size_t)(e->bytes - e->out.done);
	for (size_t i = 0; i < e->wlen; i++)
		e->wbuf[i] = next_byte(&e->out);
	hash_bytes(&e->out, e->wbuf, e->wlen);
	sha256_update(&e->out.sha, e->wbuf, e->wlen);
	e->out.done += e->wlen;
	e->woff = 0;
	return true;
}

/* Checks received bytes; the client also collects the 8-byte answer after the stream. */
static void take(struct endpoint *e, const uint8_t *p, size_t n)
{
	size_t stream = e->bytes - e->in.done < n ? (size_t)(e->bytes - e->in.done) : n;

	for (size_t i = 0; i < stream; i++) {
		uint8_t want = next_byte(&e->in);
		if (p[i] != want)
			fail("byte %llu differs (got 0x%x, want 0x%x)",
			     (unsigned long long)e->in.done, p[i], want);
		e->in.done++;
	}
	hash_bytes(&e->in, p, stream);
	sha256_update(&e->in.sha, p, stream);
	for (size_t i = stream; i < n; i++) {
		if (e->server || e->answer_got == 8)
			fail("%zu bytes after the end of the stream (at %llu)", n - i,
			     (unsigned long long)e->in.done);
		e->answer[e->answer_got++] = p[i];
	}
}

/* Half-close after the last byte: the client at once, the server after the peer's EOF. */
static void after_send(struct endpoint *e)
{
	if (e->sent_all || e->woff < e->wlen || e->out.done < e->bytes)
		return;
	e->sent_all = true;
	if (!e->server && shutdown(e->fd, SHUT_WR) != 0)
		prog_die("shutdown");
}

static void server_answer(struct endpoint *e)
{
	uint8_t a[8];
	size_t off = 0;

	memcpy(a, &e->in.hash, 8);
	/* Blocking or not, 8 bytes go out; a short wait is fine here. */
	while (off < 8) {
		ssize_t n = write(e->fd, a + off, 8 - off);
		if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
			struct pollfd p = {e->fd, POLLOUT, 0};
			poll(&p, 1, 1000);
			continue;
		}
		if (n <= 0)
			prog_die("write answer");
		off += (size_t)n;
	}
	e->answered = true;
}

/* One non-blocking read; returns false at EOF. */
static bool read_some(struct endpoint *e)
{
	static uint8_t buf[MAX_IO];
	ssize_t n = read(e->fd, buf, rnd_size());

	if (n > 0) {
		take(e, buf, (size_t)n);
		return true;
	}
	if (n == 0) {
		e->eof = true;
		return false;
	}
	if (errno != EAGAIN && errno != EINTR)
		prog_die("read");
	return true;
}

static bool write_some(struct endpoint *e)
{
	if (!fill_chunk(e))
		return false;
	ssize_t n = write(e->fd, e->wbuf + e->woff, e->wlen - e->woff);
	if (n > 0)
		e->woff += (size_t)n;
	else if (n < 0 && errno != EAGAIN && errno != EINTR)
		prog_die("write");
	after_send(e);
	return n > 0;
}

static bool finished(const struct endpoint *e)
{
	if (e->server)
		return e->sent_all && e->eof && e->answered;
	return e->sent_all && e->eof;
}

static void check_end(const struct endpoint *e)
{
	if (e->in.done != e->bytes)
		fail("stream ended after %llu of %llu bytes", (unsigned long long)e->in.done,
		     (unsigned long long)e->bytes);
	if (!e->server) {
		uint64_t got;
		if (e->answer_got != 8)
			fail("answer has %zu of 8 bytes", e->answer_got);
		memcpy(&got, e->answer, 8);
		if (got != e->out.hash)
			fail("the server's hash 0x%llx is not ours 0x%llx", (unsigned long long)got,
			     (unsigned long long)e->out.hash);
	}
}

/* ---- the blocking style: a reader thread and a writer thread ---- */

static void *block_writer(void *arg)
{
	struct endpoint *e = arg;

	while (fill_chunk(e)) {
		while (e->woff < e->wlen) {
			ssize_t n = write(e->fd, e->wbuf + e->woff, e->wlen - e->woff);
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0)
				prog_die("write");
			e->woff += (size_t)n;
		}
	}
	after_send(e);
	return NULL;
}

static void run_block(struct endpoint *e)
{
	static uint8_t buf[MAX_IO];
	pthread_t w;

	pthread_create(&w, NULL, block_writer, e);
	for (;;) {
		ssize_t n = read(e->fd, buf, rnd_size());
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			prog_die("read");
		if (n == 0)
			break;
		take(e, buf, (size_t)n);
	}
	e->eof = true;
	pthread_join(w, NULL);
	if (e->server)
		server_answer(e);
}

/* ---- the event styles: one thread, non-blocking fd ---- */

static void run_events(struct endpoint *e, enum style st)
{
	int ep = -1;
	bool et = st == EPOLL_ET;

	fcntl(e->fd, F_SETFL, fcntl(e->fd, F_GETFL) | O_NONBLOCK);
	if (st == EPOLL_LT || st == EPOLL_ET) {
		struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP |
						   (et ? EPOLLET : 0)};
		ev.data.fd = e->fd;
		ep = epoll_create1(EPOLL_CLOEXEC);
		if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, e->fd, &ev) != 0)
			prog_die("epoll");
	}
	while (!finished(e)) {
		bool want_out = !e->sent_all;
		bool rd = false, wr = false;

		if (e->server && e->eof && e->sent_all && !e->answered) {
			server_answer(e);
			continue;
		}
		if (st == EPOLL_LT || st == EPOLL_ET) {
			struct epoll_event ev;
			if (!et) {
				struct epoll_event mod = {.events = EPOLLIN | EPOLLRDHUP |
								    (want_out ? EPOLLOUT : 0)};
				mod.data.fd = e->fd;
				epoll_ctl(ep, EPOLL_CTL_MOD, e->fd, &mod);
			}
			int n = epoll_wait(ep, &ev, 1, 30000);
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0)
				fail("epoll_wait: nothing for 30 s (%llu read, %llu written)",
				     (unsigned long long)e->in.done,
				     (unsigned long long)e->out.done);
			rd = ev.events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR);
			wr = ev.events & EPOLLOUT;
		} else if (st == SELECT) {
			fd_set r, w;
			struct timeval tv = {30, 0};
			FD_ZERO(&r);
			FD_ZERO(&w);
			FD_SET(e->fd, &r);
			if (want_out)
				FD_SET(e->fd, &w);
			int n = select(e->fd + 1, &r, &w, NULL, &tv);
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0)
				fail("select: nothing for 30 s (%llu read, %llu written)",
				     (unsigned long long)e->in.done,
				     (unsigned long long)e->out.done);
			rd = FD_ISSET(e->fd, &r);
			wr = FD_ISSET(e->fd, &w);
		} else {
			struct pollfd p = {e->fd, (short)(POLLIN | (want_out ? POLLOUT : 0)), 0};
			int n = poll(&p, 1, 30000);
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0)
				fail("poll: nothing for 30 s (%llu read, %llu written)",
				     (unsigned long long)e->in.done,
				     (unsigned long long)e->out.done);
			rd = p.revents & (POLLIN | POLLHUP | POLLERR);
			wr = p.revents & POLLOUT;
		}
		if (rd) {
			/* Edge-triggered: drain until EAGAIN, or the edge is lost. */
			do {
				errno = 0;
				if (!read_some(e))
					break;
			} while (et && errno != EAGAIN);
		}
		if (wr && want_out) {
			while (write_some(e) && et)
				;
		}
	}
	if (ep >= 0)
		close(ep);
}

static void run(struct endpoint *e, enum style st, const char *name)
{
	struct tcp_info ti;
	socklen_t len = sizeof(ti);
	char sent[65], received[65];

	if (st == BLOCK)
		run_block(e);
	else
		run_events(e, st);
	check_end(e);
	/* What the kernel's TCP carried: the handshake only, when upgraded. */
	memset(&ti, 0, sizeof(ti));
	getsockopt(e->fd, IPPROTO_TCP, TCP_INFO, &ti, &len);
	printf("stream_check: %s %s: %llu bytes each way checked, half-close answered; "
	       "tcp_bytes_acked=%llu tcp_bytes_received=%llu\n",
	       e->server ? "server" : "client", name, (unsigned long long)e->bytes,
	       (unsigned long long)ti.tcpi_bytes_acked, (unsigned long long)ti.tcpi_bytes_received);
	sha256_hex(&e->out.sha, sent);
	sha256_hex(&e->in.sha, received);
	printf("stream_check: %s sent_sha256=%s received_sha256=%s\n",
	       e->server ? "server" : "client", sent, received);
}

static int connect_to(struct sockaddr_in *sa, enum style st)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	if (fd < 0)
		prog_die("socket");
	if (st != NBCONNECT) {
		if (connect(fd, (struct sockaddr *)sa, sizeof(*sa)) != 0)
			prog_die("connect");
		return fd;
	}
	fcntl(fd, F_SETFL, O_NONBLOCK);
	if (connect(fd, (struct sockaddr *)sa, sizeof(*sa)) != 0) {
		if (errno != EINPROGRESS)
			prog_die("connect");
		struct pollfd p = {fd, POLLOUT, 0};
		if (poll(&p, 1, 60000) != 1)
			prog_die("connect: not writable in 60 s");
		int err = 0;
		socklen_t len = sizeof(err);
		getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
		if (err) {
			errno = err;
			prog_die("connect");
		}
	}
	return fd;
}

int main(int argc, char **argv)
{
	static struct endpoint e;
	struct sockaddr_in sa = {.sin_family = AF_INET};
	enum style st = BLOCK;
	int fd;

	if (argc != 6 && argc != 7) {
		fprintf(stderr, "usage: stream_check server|client ADDR PORT STYLE BYTES [HOLD]\n");
		return 2;
	}
	if (inet_pton(AF_INET, argv[2], &sa.sin_addr) != 1)
		prog_die("address");
	sa.sin_port = htons((uint16_t)atoi(argv[3]));
	for (unsigned i = 0; i < sizeof(style_names) / sizeof(style_names[0]); i++)
		if (strcmp(argv[4], style_names[i]) == 0)
			st = (enum style)i;
	if (strcmp(argv[4], style_names[st]) != 0) {
		fprintf(stderr, "stream_check: unknown style %s\n", argv[4]);
		return 2;
	}
	uint64_t bytes = strtoull(argv[5], NULL, 0);

	if (strcmp(argv[1], "server") == 0) {
		int one = 1, l = socket(AF_INET, SOCK_STREAM, 0);
		setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(l, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(l, 8) != 0)
			prog_die("bind/listen");
		printf("stream_check: listening\n");
		fflush(stdout);
		fd = accept(l, NULL, NULL);
		if (fd < 0)
			prog_die("accept");
		close(l);
		init_endpoint(&e, fd, true, bytes);
		run(&e, st == NBCONNECT ? POLL : st, style_names[st]);
	} else {
		fd = connect_to(&sa, st);
		init_endpoint(&e, fd, false, bytes);
		run(&e, st == NBCONNECT ? POLL : st, style_names[st]);
	}
	if (argc == 7)
		sleep((unsigned)atoi(argv[6]));
	if (close(fd) != 0)
		prog_die("close");
	return 0;
}
