/*
 * many_check: N connections between one client process and one server
 * process, all streaming at once from client to server through one epoll
 * loop on each side. Every connection carries its own pseudo-random stream
 * that the server checks byte for byte; at end of file the server answers
 * "OK" or "BAD" and closes.
 *
 *   many_check server ADDR PORT N BYTES [slow]
 *   many_check client ADDR PORT N BYTES
 *
 * slow: the server leaves connection 0 unread until every other connection
 * has been checked to its end, then reads it; it fails if the others could
 * not finish while connection 0 sat unread. Figures go to stdout.
 *
 * The server half-closes each connection after its answer and closes them
 * all at the end, after its status snapshot (status_snap.h, tag "server"),
 * so the snapshot shows every connection with its counters.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tests/status_snap.h"
#include "tools/prog.h"

#define CHUNK 65536

struct peer {
	int fd;
	uint32_t idx;    /* the connection's number, sent first by the client */
	uint8_t hdr_got; /* bytes of the number read so far (server, at accept) */
	uint64_t state;  /* the byte generator */
	uint64_t done;   /* bytes generated or checked */
	bool finished;
	char answer[4];
	size_t answer_len;
};

static uint8_t next_byte(struct peer *p)
{
	p->state ^= p->state << 13;
	p->state ^= p->state >> 7;
	p->state ^= p->state << 17;
	return (uint8_t)(p->state >> 24);
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void nonblocking(int fd)
{
	if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) < 0)
		prog_die("fcntl");
}

static void watch(int ep, struct peer *p, uint32_t events, int op)
{
	struct epoll_event ev = {.events = events, .data.ptr = p};

	if (epoll_ctl(ep, op, p->fd, &ev) < 0)
		prog_die("epoll_ctl");
}

/* Reads what is there; returns true once the stream ended (and was answered). */
static bool serve(struct peer *p, uint64_t bytes, uint8_t *buf)
{
	for (;;) {
		ssize_t n = read(p->fd, buf, CHUNK);

		if (n < 0 && errno == EAGAIN)
			return false;
		if (n < 0)
			prog_die("read");
		if (n == 0) {
			const char *ans = p->done == bytes ? "OK" : "BAD";

			if (strcmp(ans, "OK") != 0)
				fprintf(stderr, "many_check: connection %u: %llu of %llu bytes\n",
					p->idx, (unsigned long long)p->done,
					(unsigned long long)bytes);
			if (write(p->fd, ans, strlen(ans)) < 0 || shutdown(p->fd, SHUT_WR) < 0)
				prog_die("write of the answer");
			p->finished = true;
			return true;
		}
		for (size_t i = 0; i < (size_t)n; i++, p->done++) {
			if (buf[i] != next_byte(p)) {
				fprintf(stderr, "many_check: connection %u: wrong byte at %llu\n",
					p->idx, (unsigned long long)p->done);
				exit(1);
			}
		}
	}
}

static int run_server(const char *addr, int port, int n, uint64_t bytes, bool slow)
{
	struct sockaddr_in sin = prog_address(addr, port);
	struct peer *peers = calloc((size_t)n, sizeof(*peers));
	uint8_t *buf = malloc(CHUNK);
	struct epoll_event evs[64];
	int l = socket(AF_INET, SOCK_STREAM, 0), one = 1, ep, left = n;
	struct peer *slow_peer = NULL;
	double t0 = 0, t_others = 0;

	if (!peers || !buf || l < 0)
		prog_die("setup");
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(l, (struct sockaddr *)&sin, sizeof(sin)) < 0 || listen(l, n) < 0)
		prog_die("listen");
	ep = epoll_create1(0);
	for (int i = 0; i < n; i++) {
		peers[i].fd = accept(l, NULL, NULL);
		if (peers[i].fd < 0)
			prog_die("accept");
		/* The connection's number arrives first: read it now (blocking). */
		while (peers[i].hdr_got < 4) {
			uint8_t b;

			if (read(peers[i].fd, &b, 1) != 1)
				prog_die("read of the connection number");
			peers[i].idx |= (uint32_t)b << (8 * peers[i].hdr_got++);
		}
		peers[i].state = 0x9e3779b97f4a7c15ull * (peers[i].idx + 1);
		nonblocking(peers[i].fd);
		if (slow && peers[i].idx == 0)
			slow_peer = &peers[i]; /* left unread for now */
		else
			watch(ep, &peers[i], EPOLLIN, EPOLL_CTL_ADD);
		if (i == 0)
			t0 = now_s();
	}
	while (left > (slow_peer ? 1 : 0)) {
		int k = epoll_wait(ep, evs, 64, 120000);

		if (k <= 0) {
			fprintf(stderr,
				"many_check: server: nothing for 120 s with %d streams left\n",
				left);
			return 1;
		}
		for (int i = 0; i < k; i++) {
			struct peer *p = evs[i].data.ptr;

			if (serve(p, bytes, buf)) {
				epoll_ctl(ep, EPOLL_CTL_DEL, p->fd, NULL);
				left--;
			}
		}
	}
	t_others = now_s();
	printf("many_check: server: %d connections checked, %llu bytes each, in %.2f s (%.1f "
	       "MB/s)\n",
	       n - (slow_peer ? 1 : 0), (unsigned long long)bytes, t_others - t0,
	       (double)bytes * (n - (slow_peer ? 1 : 0)) / (t_others - t0) / 1e6);
	if (slow_peer) {
		if (slow_peer->done != 0) {
			fprintf(stderr, "many_check: the slow connection was read early\n");
			return 1;
		}
		printf("many_check: server: the others finished while connection 0 sat unread; "
		       "reading it now\n");
		watch(ep, slow_peer, EPOLLIN, EPOLL_CTL_ADD);
		while (!slow_peer->finished) {
			int k = epoll_wait(ep, evs, 64, 120000);

			if (k <= 0) {
				fprintf(stderr,
					"many_check: server: the slow connection stalled\n");
				return 1;
			}
			serve(slow_peer, bytes, buf);
		}
		printf("many_check: server: connection 0 checked after %.2f s more\n",
		       now_s() - t_others);
	}
	/* The process's figures in the status are refreshed once a second. */
	sleep(2);
	status_snap("server");
	for (int i = 0; i < n; i++)
		close(peers[i].fd);
	return 0;
}

/* Writes what fits; returns true once everything is written and half-closed. */
static bool feed(struct peer *p, uint64_t bytes, uint8_t *buf)
{
	while (p->done < bytes) {
		size_t len = bytes - p->done < CHUNK ? (size_t)(bytes - p->done) : CHUNK;
		uint64_t save_state = p->state;

		for (size_t i = 0; i < len; i++)
			buf[i] = next_byte(p);
		ssize_t n = write(p->fd, buf, len);
		if (n < 0 && errno == EAGAIN) {
			p->state = save_state; /* regenerate the same bytes next time */
			return false;
		}
		if (n < 0)
			prog_die("write");
		/* A short write: rewind the generator to just after what went out. */
		p->state = save_state;
		for (ssize_t i = 0; i < n; i++)
			next_byte(p);
		p->done += (uint64_t)n;
	}
	if (shutdown(p->fd, SHUT_WR) < 0)
		prog_die("shutdown");
	return true;
}

static int run_client(const char *addr, int port, int n, uint64_t bytes)
{
	struct sockaddr_in sin = prog_address(addr, port);
	struct peer *peers = calloc((size_t)n, sizeof(*peers));
	uint8_t *buf = malloc(CHUNK);
	struct epoll_event evs[64];
	int ep = epoll_create1(0), writing = n, answered = 0, bad = 0;

	if (!peers || !buf)
		prog_die("setup");
	for (int i = 0; i < n; i++) {
		uint8_t hdr[4] = {(uint8_t)i, (uint8_t)(i >> 8), (uint8_t)(i >> 16),
				  (uint8_t)(i >> 24)};

		peers[i].fd = socket(AF_INET, SOCK_STREAM, 0);
		if (peers[i].fd < 0 ||
		    connect(peers[i].fd, (struct sockaddr *)&sin, sizeof(sin)) < 0)
			prog_die("connect");
		if (write(peers[i].fd, hdr, 4) != 4)
			prog_die("write of the connection number");
		peers[i].idx = (uint32_t)i;
		peers[i].state = 0x9e3779b97f4a7c15ull * ((uint64_t)i + 1);
		nonblocking(peers[i].fd);
		watch(ep, &peers[i], EPOLLOUT, EPOLL_CTL_ADD);
	}
	while (answered < n) {
		int k = epoll_wait(ep, evs, 64, 120000);

		if (k <= 0) {
			fprintf(stderr,
				"many_check: client: nothing for 120 s (%d writing, %d answered)\n",
				writing, answered);
			return 1;
		}
		for (int i = 0; i < k; i++) {
			struct peer *p = evs[i].data.ptr;

			if (!p->finished) {
				if (feed(p, bytes, buf)) {
					p->finished = true;
					writing--;
					watch(ep, p, EPOLLIN, EPOLL_CTL_MOD);
				}
				continue;
			}
			ssize_t r = read(p->fd, p->answer + p->answer_len,
					 sizeof(p->answer) - 1 - p->answer_len);
			if (r < 0 && errno == EAGAIN)
				continue;
			if (r > 0) {
				p->answer_len += (size_t)r;
				continue;
			}
			/* End of file (or an error): the answer is complete. */
			if (strcmp(p->answer, "OK") != 0) {
				fprintf(stderr, "many_check: connection %u: answer \"%s\"\n",
					p->idx, p->answer);
				bad++;
			}
			epoll_ctl(ep, EPOLL_CTL_DEL, p->fd, NULL);
			close(p->fd);
			answered++;
		}
	}
	printf("many_check: client: %d connections, %d answered OK\n", n, n - bad);
	return bad ? 1 : 0;
}

int main(int argc, char **argv)
{
	if (argc < 6) {
		fprintf(stderr, "usage: many_check server|client ADDR PORT N BYTES [slow]\n");
		return 2;
	}
	int port = atoi(argv[3]), n = atoi(argv[4]);
	uint64_t bytes = strtoull(argv[5], NULL, 0);

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (n < 1 || n > 100000)
		return 2;
	if (strcmp(argv[1], "server") == 0)
		return run_server(argv[2], port, n, bytes,
				  argc > 6 && strcmp(argv[6], "slow") == 0);
	return run_client(argv[2], port, n, bytes);
}
