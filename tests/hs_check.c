/*
 * hs_check: the negotiation's races, as applications meet them. Every run
 * checks the bytes both ways (a request echoed back, a greeting when the
 * server speaks first), so a fallback that loses, adds or reorders a byte
 * fails it. Each side takes its status snapshot (status_snap.h), tagged
 * with its role, while its connection is open, for the caller to check the
 * outcome.
 *
 *   hs_check same ADDR PORT BYTES
 *       one process: a server thread accepts, then waits for the client
 *       thread's connect() to return before its first I/O
 *   hs_check server ADDR PORT BYTES LATE_MS [greet]
 *       sleeps LATE_MS after accept before its first I/O (greet: it writes
 *       a greeting first); a connection that ends before its request (a
 *       probe the client reset) is counted and the next one accepted
 *   hs_check late-accept ADDR PORT BYTES LATE_MS
 *       sleeps LATE_MS after a connection is pending before it accepts at
 *       all, then as server
 *   hs_check silent ADDR PORT 0
 *       accepts one connection and says nothing for 10 s
 *   hs_check fork ADDR PORT 0
 *       a thread connects while the main thread forks 0.5 s later; the
 *       child closes that socket and exits: it must not wait for a lock
 *       the parent's thread held at the fork (5 s at most)
 *   hs_check client ADDR PORT BYTES [nb] [greet]
 *       connects (nb: non-blocking connect, poll and non-blocking I/O),
 *       reads the greeting (greet; with nb, after poll says it is there,
 *       so no call on the socket comes before it), sends the request,
 *       reads the echo
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/status_snap.h"
#include "tools/prog.h"

#define GREETING_LEN 1000

static uint8_t pattern(uint64_t i, unsigned seed)
{
	return (uint8_t)((i + seed) * 2654435761u >> 13);
}

static void nap_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};

	while (nanosleep(&ts, &ts) != 0)
		;
}

/* Waits for fd to show ev (non-blocking I/O only). */
static void wait_for(int fd, short ev)
{
	struct pollfd p = {.fd = fd, .events = ev};

	if (poll(&p, 1, 60000) != 1)
		prog_die("poll");
}

static bool nonblocking(int fd)
{
	return fcntl(fd, F_GETFL) & O_NONBLOCK;
}

/* Reads exactly len bytes (fewer only at end of file or a reset: the count is returned). */
static size_t read_full(int fd, uint8_t *buf, size_t len)
{
	size_t got = 0;

	while (got < len) {
		ssize_t n = read(fd, buf + got, len - got);

		if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
			if (nonblocking(fd))
				wait_for(fd, POLLIN);
			continue;
		}
		if (n < 0 && errno == ECONNRESET)
			return got;
		if (n < 0)
			prog_die("read");
		if (n == 0)
			return got;
		got += (size_t)n;
	}
	return got;
}

static void check(const uint8_t *buf, size_t len, unsigned seed, const char *what)
{
	for (size_t i = 0; i < len; i++)
		if (buf[i] != pattern(i, seed)) {
			fprintf(stderr, "hs_check: %s: byte %zu differs\n", what, i);
			exit(1);
		}
}

static int listener(const char *addr, int port)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	int one = 1, l = socket(AF_INET, SOCK_STREAM, 0);

	if (l < 0 || inet_pton(AF_INET, addr, &sa.sin_addr) != 1)
		prog_die("socket");
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(l, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(l, 16) < 0)
		prog_die("bind/listen");
	return l;
}

/*
 * Serves one connection: greeting (greet), the request, its echo, the end.
 * Returns false for a connection that ended before its first request byte.
 */
static bool serve(int c, size_t bytes, bool greet)
{
	uint8_t *buf = malloc(bytes ? bytes : 1), g[GREETING_LEN];
	size_t got;

	if (!buf)
		prog_die("malloc");
	if (greet) {
		for (size_t i = 0; i < sizeof(g); i++)
			g[i] = pattern(i, 7);
		/* A probe that was reset may refuse the greeting: that is no failure here. */
		if (send(c, g, sizeof(g), MSG_NOSIGNAL) != (ssize_t)sizeof(g)) {
			free(buf);
			return false;
		}
	}
	got = read_full(c, buf, bytes);
	if (got == 0 && bytes) {
		free(buf);
		return false;
	}
	if (got != bytes) {
		fprintf(stderr, "hs_check: server: request cut at %zu of %zu bytes\n", got, bytes);
		exit(1);
	}
	check(buf, bytes, 1, "request");
	status_snap("server");
	prog_write_all(c, buf, bytes);
	if (read_full(c, buf, 1) != 0) {
		fprintf(stderr, "hs_check: server: bytes after the request\n");
		exit(1);
	}
	free(buf);
	return true;
}

static void run_server(const char *addr, int port, size_t bytes, int late_ms, int accept_late_ms,
		       bool greet)
{
	int l = listener(addr, port), probes = 0;

	printf("listening\n");
	fflush(stdout);
	if (accept_late_ms) {
		/* Late, counted from the client's connect. */
		struct pollfd p = {.fd = l, .events = POLLIN};

		if (poll(&p, 1, 60000) != 1)
			prog_die("poll (listener)");
		nap_ms(accept_late_ms);
	}
	for (;;) {
		int c = accept(l, NULL, NULL);

		if (c < 0)
			prog_die("accept");
		nap_ms(late_ms);
		if (serve(c, bytes, greet)) {
			close(c);
			break;
		}
		probes++;
		close(c);
	}
	printf("server: ok, %d probe connection(s) before the one that carried the request\n",
	       probes);
	close(l);
}

static int connect_to(const char *addr, int port, bool nb)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	int s = socket(AF_INET, SOCK_STREAM | (nb ? SOCK_NONBLOCK : 0), 0), err = 0;
	socklen_t len = sizeof(err);

	if (s < 0 || inet_pton(AF_INET, addr, &sa.sin_addr) != 1)
		prog_die("socket");
	if (connect(s, (struct sockaddr *)&sa, sizeof(sa)) == 0)
		return s;
	if (!nb || errno != EINPROGRESS)
		prog_die("connect");
	wait_for(s, POLLOUT);
	if (getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len) < 0 || err) {
		errno = err;
		prog_die("connect (SO_ERROR)");
	}
	return s;
}

static void run_client(const char *addr, int port, size_t bytes, bool nb, bool greet)
{
	uint8_t *buf = malloc(bytes ? bytes : 1), g[GREETING_LEN];
	int s = connect_to(addr, port, nb);

	if (!buf)
		prog_die("malloc");
	if (greet) {
		if (nb)
			wait_for(s, POLLIN);
		if (read_full(s, g, sizeof(g)) != sizeof(g)) {
			fprintf(stderr, "hs_check: client: greeting cut\n");
			exit(1);
		}
		check(g, sizeof(g), 7, "greeting");
	}
	for (size_t i = 0; i < bytes; i++)
		buf[i] = pattern(i, 1);
	prog_write_all(s, buf, bytes);
	memset(buf, 0, bytes);
	if (read_full(s, buf, bytes) != bytes) {
		fprintf(stderr, "hs_check: client: echo cut\n");
		exit(1);
	}
	check(buf, bytes, 1, "echo");
	status_snap("client");
	if (shutdown(s, SHUT_WR) < 0)
		prog_die("shutdown");
	if (read_full(s, buf, 1) != 0) {
		fprintf(stderr, "hs_check: client: bytes after the echo\n");
		exit(1);
	}
	close(s);
	free(buf);
	printf("client: ok, %zu bytes each way%s\n", bytes, greet ? " after a greeting" : "");
}

struct same_args {
	const char *addr;
	int port, l;
	size_t bytes;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool connected;
};

static void *same_server(void *arg)
{
	struct same_args *a = arg;
	int c = accept(a->l, NULL, NULL);

	if (c < 0)
		prog_die("accept");
	/* Its first I/O only once the client's connect() has returned. */
	pthread_mutex_lock(&a->lock);
	while (!a->connected)
		pthread_cond_wait(&a->cond, &a->lock);
	pthread_mutex_unlock(&a->lock);
	if (!serve(c, a->bytes, false)) {
		fprintf(stderr, "hs_check: same: the server's connection carried nothing\n");
		exit(1);
	}
	close(c);
	return NULL;
}

static void run_same(const char *addr, int port, size_t bytes)
{
	struct same_args a = {.addr = addr,
			      .port = port,
			      .bytes = bytes,
			      .lock = PTHREAD_MUTEX_INITIALIZER,
			      .cond = PTHREAD_COND_INITIALIZER};
	uint8_t *buf = malloc(bytes);
	pthread_t th;
	int s;

	a.l = listener(addr, port);
	pthread_create(&th, NULL, same_server, &a);
	s = connect_to(addr, port, false);
	pthread_mutex_lock(&a.lock);
	a.connected = true;
	pthread_cond_signal(&a.cond);
	pthread_mutex_unlock(&a.lock);
	for (size_t i = 0; i < bytes; i++)
		buf[i] = pattern(i, 1);
	prog_write_all(s, buf, bytes);
	memset(buf, 0, bytes);
	if (read_full(s, buf, bytes) != bytes) {
		fprintf(stderr, "hs_check: same: echo cut\n");
		exit(1);
	}
	check(buf, bytes, 1, "echo");
	shutdown(s, SHUT_WR);
	pthread_join(th, NULL);
	close(s);
	free(buf);
	printf("same: ok, %zu bytes each way\n", bytes);
}

static int fork_fd = -1;

static void *fork_connector(void *arg)
{
	struct sockaddr_in *sa = arg;

	fork_fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fork_fd < 0)
		prog_die("socket");
	/* In the handshake when the fork comes (the server answers nothing). */
	connect(fork_fd, (struct sockaddr *)sa, sizeof(*sa));
	return NULL;
}

static int run_fork(const char *addr, int port)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	pthread_t th;
	pid_t child;
	int status;

	if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1)
		prog_die("address");
	pthread_create(&th, NULL, fork_connector, &sa);
	nap_ms(500);
	child = fork();
	if (child == 0) {
		alarm(5); /* a lock never released would hang the child: SIGALRM ends it */
		close(fork_fd);
		_exit(0);
	}
	if (child < 0 || waitpid(child, &status, 0) != child)
		prog_die("fork");
	pthread_join(th, NULL);
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		fprintf(stderr, "hs_check: fork: the child hung closing the socket (status %d)\n",
			status);
		return 1;
	}
	printf("fork: ok, the child closed a socket its parent's thread was connecting\n");
	return 0;
}

int main(int argc, char **argv)
{
	bool nb = false, greet = false;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc < 5) {
		fprintf(stderr,
			"usage: hs_check same|server|late-accept|client ADDR PORT BYTES ...\n");
		return 2;
	}
	for (int i = 5; i < argc; i++) {
		nb |= strcmp(argv[i], "nb") == 0;
		greet |= strcmp(argv[i], "greet") == 0;
	}
	const char *addr = argv[2];
	int port = atoi(argv[3]);
	size_t bytes = strtoul(argv[4], NULL, 0);

	if (strcmp(argv[1], "same") == 0)
		run_same(addr, port, bytes);
	else if (strcmp(argv[1], "server") == 0 && argc >= 6)
		run_server(addr, port, bytes, atoi(argv[5]), 0, greet);
	else if (strcmp(argv[1], "late-accept") == 0 && argc >= 6)
		run_server(addr, port, bytes, 0, atoi(argv[5]), greet);
	else if (strcmp(argv[1], "client") == 0)
		run_client(addr, port, bytes, nb, greet);
	else if (strcmp(argv[1], "silent") == 0) {
		int l = listener(addr, port), c;

		printf("listening\n");
		c = accept(l, NULL, NULL);
		nap_ms(10000);
		close(c);
	} else if (strcmp(argv[1], "fork") == 0)
		return run_fork(addr, port);
	else
		return 2;
	return 0;
}
