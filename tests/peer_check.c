/*
 * peer_check: server-first protocols and peers that vanish.
 *
 *   peer_check greet-server ADDR PORT BYTES CONNS
 *       for each of CONNS connections: write a BYTES greeting at once, read
 *       the request to end of file, answer with its hash, close at once
 *       (write-then-close: every byte must still arrive)
 *   peer_check greet-client ADDR PORT BYTES
 *       read and check the greeting, send a request, half-close, check the
 *       answer and the end of file
 *   peer_check hold-server ADDR PORT | hold-client ADDR PORT
 *       exchange a byte every 50 ms until the peer is gone; print how long
 *       after the last byte the end (EOF or ECONNRESET) was seen; exit 0
 *       when it was seen, 1 otherwise
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static void die(const char *what)
{
	fprintf(stderr, "peer_check: %s: %s\n", what, strerror(errno));
	exit(2);
}

static uint8_t pattern(uint64_t i)
{
	return (uint8_t)(i * 2654435761u >> 13);
}

static uint64_t fnv(uint64_t h, const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		h = (h ^ p[i]) * 1099511628211ull;
	return h;
}

static void write_all(int fd, const void *buf, size_t len)
{
	const uint8_t *p = buf;

	while (len) {
		ssize_t n = write(fd, p, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			die("write");
		p += n;
		len -= (size_t)n;
	}
}

static size_t read_full(int fd, uint8_t *buf, size_t len)
{
	size_t got = 0;

	while (got < len) {
		ssize_t n = read(fd, buf + got, len - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			die("read");
		if (n == 0)
			break;
		got += (size_t)n;
	}
	return got;
}

static struct sockaddr_in addr_of(const char *ip, const char *port)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(port))};

	if (inet_pton(AF_INET, ip, &sa.sin_addr) != 1)
		die("address");
	return sa;
}

static int listen_on(struct sockaddr_in *sa)
{
	int one = 1, l = socket(AF_INET, SOCK_STREAM, 0);

	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(l, (struct sockaddr *)sa, sizeof(*sa)) != 0 || listen(l, 64) != 0)
		die("bind/listen");
	return l;
}

static int connect_to(struct sockaddr_in *sa)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	if (fd < 0 || connect(fd, (struct sockaddr *)sa, sizeof(*sa)) != 0)
		die("connect");
	return fd;
}

static int greet_server(struct sockaddr_in *sa, size_t bytes, int conns)
{
	uint8_t *buf = malloc(bytes > 65536 ? bytes : 65536);
	int l = listen_on(sa);

	for (uint64_t i = 0; i < bytes; i++)
		buf[i] = pattern(i);
	for (int c = 0; c < conns; c++) {
		int fd = accept(l, NULL, NULL);
		uint64_t h = 1469598103934665603ull;
		ssize_t n;

		if (fd < 0)
			die("accept");
		write_all(fd, buf, bytes); /* before reading anything */
		while ((n = read(fd, buf + bytes, 4096)) > 0)
			h = fnv(h, buf + bytes, (size_t)n);
		if (n < 0)
			die("read request");
		write_all(fd, &h, sizeof(h));
		if (close(fd) != 0) /* at once: the shim must still deliver */
			die("close");
		for (uint64_t i = 0; i < bytes; i++)
			buf[i] = pattern(i);
	}
	printf("peer_check: greet-server: %d connections served\n", conns);
	return 0;
}

static int greet_client(struct sockaddr_in *sa, size_t bytes)
{
	uint8_t *buf = malloc(bytes + 16);
	const char req[] = "request: what the client says after the greeting";
	uint64_t h = fnv(1469598103934665603ull, (const uint8_t *)req, sizeof(req)), got;
	int fd = connect_to(sa);

	if (read_full(fd, buf, bytes) != bytes)
		die("greeting cut short");
	for (uint64_t i = 0; i < bytes; i++)
		if (buf[i] != pattern(i)) {
			fprintf(stderr, "peer_check: greeting byte %llu differs\n",
				(unsigned long long)i);
			return 1;
		}
	write_all(fd, req, sizeof(req));
	if (shutdown(fd, SHUT_WR) != 0)
		die("shutdown");
	if (read_full(fd, (uint8_t *)&got, 8) != 8 || got != h) {
		fprintf(stderr, "peer_check: wrong answer\n");
		return 1;
	}
	if (read_full(fd, buf, 1) != 0) {
		fprintf(stderr, "peer_check: bytes after the answer\n");
		return 1;
	}
	close(fd);
	printf("peer_check: greet-client: %zu-byte greeting and answer checked\n", bytes);
	return 0;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Trades a byte every 50 ms until the peer is gone. */
static int hold(int fd)
{
	double last = now_s();
	char c = 'x';

	signal(SIGPIPE, SIG_IGN);
	fcntl(fd, F_SETFL, O_NONBLOCK);
	for (;;) {
		struct pollfd p = {fd, POLLIN, 0};
		poll(&p, 1, 50);
		ssize_t n = read(fd, &c, 1);
		if (n > 0) {
			last = now_s();
		} else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
			printf("peer_check: hold: %s %.2f s after the last byte\n",
			       n == 0 ? "end of file" : strerror(errno), now_s() - last);
			return 0;
		}
		if (write(fd, "x", 1) < 0 && errno != EAGAIN) {
			printf("peer_check: hold: write: %s %.2f s after the last byte\n",
			       strerror(errno), now_s() - last);
			return 0;
		}
		if (now_s() - last > 60) {
			fprintf(stderr, "peer_check: hold: no end seen in 60 s\n");
			return 1;
		}
	}
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc >= 4) {
		struct sockaddr_in sa = addr_of(argv[2], argv[3]);

		if (strcmp(argv[1], "greet-server") == 0 && argc == 6)
			return greet_server(&sa, strtoull(argv[4], NULL, 0), atoi(argv[5]));
		if (strcmp(argv[1], "greet-client") == 0 && argc == 5)
			return greet_client(&sa, strtoull(argv[4], NULL, 0));
		if (strcmp(argv[1], "hold-server") == 0) {
			int l = listen_on(&sa), fd;
			printf("peer_check: listening\n");
			fd = accept(l, NULL, NULL);
			if (fd < 0)
				die("accept");
			return hold(fd);
		}
		if (strcmp(argv[1], "hold-client") == 0)
			return hold(connect_to(&sa));
	}
	fprintf(stderr, "usage: see the comment at the top of tests/peer_check.c\n");
	return 2;
}
