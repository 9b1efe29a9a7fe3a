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
 *   peer_check calls-server ADDR PORT | calls-client ADDR PORT
 *       what TCP does with time, as TCP does it: corked data (TCP_CORK,
 *       MSG_MORE) goes out after at most 200 ms even without an uncork;
 *       a read with SO_RCVTIMEO (set before connect) times out with EAGAIN;
 *       a read that signals interrupt goes on under SA_RESTART and fails
 *       with EINTR without it, or when the socket has SO_RCVTIMEO; writes to a peer that does not
 * read fail with EAGAIN under SO_SNDTIMEO, and every byte accepted arrives; a blocking sendmsg of
 * 300 iovecs takes every byte, and MSG_WAITALL and writev with 300 iovecs move all of them back
 *   peer_check reset-victim ADDR PORT
 *       connects, reads one byte, says "ready" and never reads again (the
 *       caller kills it: over TCP its unread bytes make that a reset)
 *   peer_check reset-survivor ADDR PORT write|read|soerror
 *       accepts, sends a byte and 10,000 more, says "ready", waits for
 *       SIGUSR1 (sent once the victim is dead), then checks what TCP gives
 *       after a reset: the first of a write, a read or SO_ERROR (by the
 *       order asked) reports ECONNRESET without SIGPIPE, then reads see
 *       the end of the stream, SO_ERROR is 0, and writes fail with EPIPE
 *       and SIGPIPE (none with MSG_NOSIGNAL)
 *   peer_check unread-server ADDR PORT | unread-client ADDR PORT
 *       the server reads one byte and closes, the rest unread, and lives
 *       3 s longer; the client writes until a write fails, which must be
 *       with ECONNRESET or EPIPE within 30 s (over TCP: the reset its
 *       unread bytes draw)
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "tools/prog.h"

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
			prog_die("write");
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
			prog_die("read");
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
		prog_die("address");
	return sa;
}

static int listen_on(struct sockaddr_in *sa)
{
	int one = 1, l = socket(AF_INET, SOCK_STREAM, 0);

	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(l, (struct sockaddr *)sa, sizeof(*sa)) != 0 || listen(l, 64) != 0)
		prog_die("bind/listen");
	return l;
}

static int connect_to(struct sockaddr_in *sa)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	if (fd < 0 || connect(fd, (struct sockaddr *)sa, sizeof(*sa)) != 0)
		prog_die("connect");
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
			prog_die("accept");
		write_all(fd, buf, bytes); /* before reading anything */
		while ((n = read(fd, buf + bytes, 4096)) > 0)
			h = fnv(h, buf + bytes, (size_t)n);
		if (n < 0)
			prog_die("read request");
		write_all(fd, &h, sizeof(h));
		if (close(fd) != 0) /* at once: the shim must still deliver */
			prog_die("close");
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
		prog_die("greeting cut short");
	for (uint64_t i = 0; i < bytes; i++)
		if (buf[i] != pattern(i)) {
			fprintf(stderr, "peer_check: greeting byte %llu differs\n",
				(unsigned long long)i);
			return 1;
		}
	write_all(fd, req, sizeof(req));
	if (shutdown(fd, SHUT_WR) != 0)
		prog_die("shutdown");
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

/*
 * Answers the client's commands: 'e': echoes the next 5 bytes; 'd': a byte
 * a second later; 'h': reads nothing for 1.5 s, then counts to EOF.
 */
#define IOVS    300 /* more iovecs than the shim keeps on the stack */
#define IOV_LEN 100

static int calls_server(int fd)
{
	static uint8_t buf[65536];
	char cmd;

	while (read_full(fd, (uint8_t *)&cmd, 1) == 1) {
		if (cmd == 'e') {
			if (read_full(fd, buf, 5) != 5)
				prog_die("echo");
			write_all(fd, buf, 5);
		} else if (cmd == 'v') {
			/* 300 iovecs each way, as one call each: MSG_WAITALL, writev. */
			struct iovec iov[IOVS];
			struct msghdr mh = {.msg_iov = iov, .msg_iovlen = IOVS};

			for (int i = 0; i < IOVS; i++)
				iov[i] = (struct iovec){buf + i * IOV_LEN, IOV_LEN};
			if (recvmsg(fd, &mh, MSG_WAITALL) != IOVS * IOV_LEN)
				prog_die("recvmsg MSG_WAITALL (300 iovecs)");
			if (writev(fd, iov, IOVS) != IOVS * IOV_LEN)
				prog_die("writev (300 iovecs)");
		} else if (cmd == 'd') {
			sleep(1);
			write_all(fd, "D", 1);
		} else if (cmd == 'h') {
			uint64_t count = 0;
			ssize_t n;

			usleep(1500000);
			while ((n = read(fd, buf, sizeof(buf))) > 0 || (n < 0 && errno == EINTR))
				count += n > 0 ? (uint64_t)n : 0;
			write_all(fd, &count, sizeof(count));
			break;
		}
	}
	close(fd);
	return 0;
}

static volatile sig_atomic_t n_signals;

static void on_alarm(int sig)
{
	(void)sig;
	n_signals++;
}

/* SIGALRM every 20 ms with (restart) or without SA_RESTART; 0: stop. */
static void alarms(int on, int restart)
{
	struct sigaction sa = {.sa_handler = on_alarm, .sa_flags = restart ? SA_RESTART : 0};
	struct itimerval it = {{0, on ? 20000 : 0}, {0, on ? 20000 : 0}};

	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGALRM, &sa, NULL) != 0 || setitimer(ITIMER_REAL, &it, NULL) != 0)
		prog_die("sigaction/setitimer");
}

static int check(int ok, const char *what)
{
	if (!ok)
		fprintf(stderr, "peer_check: calls-client: %s (errno %s)\n", what, strerror(errno));
	return ok;
}

static void set_timeout(int fd, int opt, long usec)
{
	struct timeval tv = {usec / 1000000, usec % 1000000};

	if (setsockopt(fd, SOL_SOCKET, opt, &tv, sizeof(tv)) != 0)
		prog_die("setsockopt");
}

static int calls_client(struct sockaddr_in *sa)
{
	static uint8_t buf[65536];
	int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1, zero = 0;
	uint64_t sent = 0, count = 0;
	ssize_t n;
	char c;

	/* SO_RCVTIMEO set before connect: the server sends nothing unasked. */
	set_timeout(fd, SO_RCVTIMEO, 200000);
	if (fd < 0 || connect(fd, (struct sockaddr *)sa, sizeof(*sa)) != 0)
		prog_die("connect");
	n = read(fd, &c, 1);
	if (!check(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK), "SO_RCVTIMEO: no EAGAIN"))
		return 1;
	set_timeout(fd, SO_RCVTIMEO, 0);

	/* Corked, then waiting for the answer without uncorking: the cork times out. */
	if (setsockopt(fd, IPPROTO_TCP, TCP_CORK, &one, sizeof(one)) != 0)
		prog_die("TCP_CORK");
	write_all(fd, "e", 1);
	write_all(fd, "hello", 5);
	if (!check(read_full(fd, buf, 5) == 5 && memcmp(buf, "hello", 5) == 0, "TCP_CORK: no echo"))
		return 1;
	if (setsockopt(fd, IPPROTO_TCP, TCP_CORK, &zero, sizeof(zero)) != 0)
		prog_die("TCP_CORK off");
	if (send(fd, "e", 1, MSG_MORE) != 1 || send(fd, "world", 5, MSG_MORE) != 5)
		prog_die("send MSG_MORE");
	if (!check(read_full(fd, buf, 5) == 5 && memcmp(buf, "world", 5) == 0, "MSG_MORE: no echo"))
		return 1;

	/* 300 iovecs: a blocking sendmsg takes all 30,000 bytes, a MSG_WAITALL receive gets them
	 * back. */
	{
		static uint8_t back[IOVS * IOV_LEN];
		struct iovec iov[IOVS];
		struct msghdr mh = {.msg_iov = iov, .msg_iovlen = IOVS};

		for (size_t i = 0; i < sizeof(back); i++)
			buf[i] = pattern(i);
		for (int i = 0; i < IOVS; i++)
			iov[i] = (struct iovec){buf + i * IOV_LEN, IOV_LEN};
		write_all(fd, "v", 1);
		n = sendmsg(fd, &mh, 0);
		if (!check(n == IOVS * IOV_LEN, "sendmsg of 300 iovecs: not every byte taken"))
			return 1;
		for (int i = 0; i < IOVS; i++)
			iov[i] = (struct iovec){back + i * IOV_LEN, IOV_LEN};
		n = recvmsg(fd, &mh, MSG_WAITALL);
		if (!check(n == IOVS * IOV_LEN && memcmp(back, buf, sizeof(back)) == 0,
			   "recvmsg MSG_WAITALL into 300 iovecs: wrong count or bytes"))
			return 1;
	}

	/* Signals every 20 ms during a one-second wait, with SA_RESTART: the read goes on. */
	alarms(1, 1);
	write_all(fd, "d", 1);
	n_signals = 0;
	n = read(fd, &c, 1);
	alarms(0, 1);
	if (!check(n == 1 && c == 'D', "SA_RESTART: the read did not go on") ||
	    !check(n_signals > 0, "SA_RESTART: no signal came during the read"))
		return 1;
	printf("peer_check: calls-client: SA_RESTART: the read went on through %d signals\n",
	       (int)n_signals);

	/* Without SA_RESTART the first signal ends the read with EINTR. */
	alarms(1, 0);
	write_all(fd, "d", 1);
	n = read(fd, &c, 1);
	alarms(0, 0);
	if (!check(n < 0 && errno == EINTR, "no SA_RESTART: the read did not fail with EINTR"))
		return 1;
	if (!check(read(fd, &c, 1) == 1 && c == 'D', "the answer after EINTR"))
		return 1;

	/* With SO_RCVTIMEO set, even SA_RESTART does not restart the read: EINTR (signal(7)). */
	set_timeout(fd, SO_RCVTIMEO, 5000000);
	alarms(1, 1);
	write_all(fd, "d", 1);
	n = read(fd, &c, 1);
	alarms(0, 1);
	if (!check(n < 0 && errno == EINTR,
		   "SO_RCVTIMEO and SA_RESTART: the read did not fail with EINTR"))
		return 1;
	set_timeout(fd, SO_RCVTIMEO, 0);
	if (!check(read(fd, &c, 1) == 1 && c == 'D', "the answer after EINTR (SO_RCVTIMEO)"))
		return 1;

	/* SO_SNDTIMEO: the server does not read for 1.5 s; writes end with EAGAIN. */
	write_all(fd, "h", 1);
	set_timeout(fd, SO_SNDTIMEO, 200000);
	for (;;) {
		for (size_t i = 0; i < sizeof(buf); i++)
			buf[i] = pattern(sent + i);
		n = write(fd, buf, sizeof(buf));
		if (n < 0)
			break;
		sent += (uint64_t)n;
		if (!check(sent < (1u << 30),
			   "SO_SNDTIMEO: 1 GiB written to a peer that does not read"))
			return 1;
	}
	if (!check(errno == EAGAIN || errno == EWOULDBLOCK, "SO_SNDTIMEO: no EAGAIN"))
		return 1;
	set_timeout(fd, SO_SNDTIMEO, 0);
	if (shutdown(fd, SHUT_WR) != 0)
		prog_die("shutdown");
	if (!check(read_full(fd, (uint8_t *)&count, 8) == 8 && count == sent,
		   "the server did not get every byte accepted"))
		return 1;
	printf("peer_check: calls-client: corks, SO_RCVTIMEO, EINTR and SO_SNDTIMEO (after %llu "
	       "bytes) as TCP\n",
	       (unsigned long long)sent);
	close(fd);
	return 0;
}

static volatile sig_atomic_t reset_pipes, reset_go;

static void reset_on_signal(int sig)
{
	if (sig == SIGPIPE)
		reset_pipes++;
	else
		reset_go = 1;
}

/* One call after the reset: its result and errno, and the SIGPIPEs it raised. */
static void reset_expect(const char *what, ssize_t got, int want, int want_errno, int pipes)
{
	int err = errno;

	if (got != want || (got < 0 && err != want_errno) || reset_pipes != pipes) {
		fprintf(stderr,
			"peer_check: reset: %s gave %zd (%s), %d SIGPIPE; want %d (%s), %d\n", what,
			got, got < 0 ? strerror(err) : "-", (int)reset_pipes, want,
			want < 0 ? strerror(want_errno) : "-", pipes);
		exit(1);
	}
	printf("peer_check: reset: %s: %zd%s%s\n", what, got, got < 0 ? " " : "",
	       got < 0 ? strerror(err) : "");
}

static int reset_survivor(struct sockaddr_in *sa, const char *order)
{
	static uint8_t buf[10000];
	struct sigaction act = {.sa_handler = reset_on_signal};
	sigset_t block, old;
	int l = listen_on(sa), fd, soerr = -1;
	socklen_t len = sizeof(soerr);
	char c = 'x';

	sigaction(SIGPIPE, &act, NULL);
	sigaction(SIGUSR1, &act, NULL);
	sigemptyset(&block);
	sigaddset(&block, SIGUSR1);
	sigprocmask(SIG_BLOCK, &block, &old);
	fd = accept(l, NULL, NULL);
	if (fd < 0)
		prog_die("accept");
	write_all(fd, &c, 1);
	write_all(fd, buf, sizeof(buf)); /* never read: a kill makes the victim's end reset */
	printf("peer_check: survivor ready\n");
	while (!reset_go)
		sigsuspend(&old);
	if (strcmp(order, "write") == 0) {
		reset_expect("first write", write(fd, &c, 1), -1, ECONNRESET, 0);
		reset_expect("second write", write(fd, &c, 1), -1, EPIPE, 1);
	} else if (strcmp(order, "read") == 0) {
		reset_expect("first read", read(fd, &c, 1), -1, ECONNRESET, 0);
		reset_expect("second read", read(fd, &c, 1), 0, 0, 0);
	} else {
		reset_expect("SO_ERROR",
			     getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) ? -1 : soerr,
			     ECONNRESET, 0, 0);
	}
	reset_expect("SO_ERROR after",
		     getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) ? -1 : soerr, 0, 0,
		     reset_pipes);
	reset_expect("read", read(fd, &c, 1), 0, 0, reset_pipes);
	int pipes = reset_pipes;
	reset_expect("send(MSG_NOSIGNAL)", send(fd, &c, 1, MSG_NOSIGNAL), -1, EPIPE, pipes);
	reset_expect("write", write(fd, &c, 1), -1, EPIPE, pipes + 1);
	close(fd);
	return 0;
}

static int reset_victim(struct sockaddr_in *sa)
{
	int fd = connect_to(sa);
	char c;

	if (read(fd, &c, 1) != 1)
		prog_die("read");
	printf("peer_check: victim ready\n");
	for (;;)
		pause();
	return 0;
}

/* Closes after one byte, the rest unread; the process stays 3 s longer. */
static int unread_server(struct sockaddr_in *sa)
{
	int l = listen_on(sa), fd = accept(l, NULL, NULL);
	char c;

	if (fd < 0 || read(fd, &c, 1) != 1)
		prog_die("accept");
	close(fd);
	printf("peer_check: unread-server: closed with bytes unread\n");
	sleep(3);
	return 0;
}

/* Writes until a write fails (within 30 s, else SIGALRM): says how. */
static int unread_client(struct sockaddr_in *sa)
{
	static char buf[65536];
	int fd = connect_to(sa);
	ssize_t n;

	signal(SIGPIPE, SIG_IGN);
	alarm(30);
	while ((n = write(fd, buf, sizeof(buf))) > 0)
		;
	if (n == 0 || (errno != ECONNRESET && errno != EPIPE)) {
		fprintf(stderr, "peer_check: unread-client: write gave %zd (%s)\n", n,
			strerror(errno));
		return 1;
	}
	printf("peer_check: unread-client: a write failed with a reset or a broken pipe\n");
	return 0;
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
				prog_die("accept");
			return hold(fd);
		}
		if (strcmp(argv[1], "hold-client") == 0)
			return hold(connect_to(&sa));
		if (strcmp(argv[1], "calls-server") == 0) {
			int l = listen_on(&sa), fd;
			fd = accept(l, NULL, NULL);
			if (fd < 0)
				prog_die("accept");
			return calls_server(fd);
		}
		if (strcmp(argv[1], "calls-client") == 0)
			return calls_client(&sa);
		if (strcmp(argv[1], "reset-survivor") == 0 && argc == 5)
			return reset_survivor(&sa, argv[4]);
		if (strcmp(argv[1], "reset-victim") == 0)
			return reset_victim(&sa);
		if (strcmp(argv[1], "unread-server") == 0)
			return unread_server(&sa);
		if (strcmp(argv[1], "unread-client") == 0)
			return unread_client(&sa);
	}
	fprintf(stderr, "usage: see the comment at the top of tests/peer_check.c\n");
	return 2;
}
