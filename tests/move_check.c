/*
 * move_check: a connection that starts on TCP and moves to RDMA while it
 * carries an echo (docs/design.md, "Connections that start on TCP"). The
 * client sends ROUNDS messages of sizes that vary from 1 byte to 20 KB, each
 * of its own pattern, and checks each echo byte by byte; so a move that
 * loses, adds or reorders a byte (the peer's bytes before its mark, the
 * held writes, the marks and messages between) fails the run. Each side
 * takes its status snapshot (status_snap.h) before the end, for the caller
 * to check that both moved.
 *
 *   move_check server ADDR PORT STYLE
 *       STYLE block: blocking reads and writes; epoll: non-blocking, an
 *       epoll loop (level-triggered); lazy: blocking, asleep for 300 ms
 *       after its first echo (the client's move finds an application that
 *       does not read: the server's progress thread answers it); rdhup:
 *       asleep in epoll for EPOLLRDHUP alone from the accept on (the move
 *       runs on its progress thread, which makes the process's first QP
 *       meanwhile), then reads what came; inline: block, with SO_OOBINLINE
 *       on the accepted socket; inline-listener: the same set on the
 *       listener; owner: block, owning the socket's SIGURG (F_SETOWN), and
 *       prints how many came (none from a peer that sends no urgent byte:
 *       the shim's marks are not the application's)
 *   (the client's STYLE shut: a write of 7,920 bytes, another of 15,839
 *   0.1 s later (the first is held while LATER comes; the second starts
 *   the move), 1 s asleep, then shutdown(SHUT_WR): the end the rdhup
 *   server waits for)
 *   move_check client ADDR PORT STYLE ROUNDS
 *       STYLE block: blocking; poll: non-blocking with poll; burst:
 *       blocking, one echo, then 8 messages written before their echoes
 *       are read; inline: block, with SO_OOBINLINE right after connect
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <netinet/in.h>
#include <poll.h>
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

#define MOVE_MSG_MAX 20000
/* A run that hangs says where, with its status snapshot, before the caller's timeout. */
#define MOVE_STUCK_S 20
#define MOVE_BURST   8

static const char *move_role = "?";
static volatile sig_atomic_t move_sigurgs;
static volatile unsigned move_round;
static volatile const char *move_phase = "start";

static void move_stuck(int sig)
{
	char tag[32];

	(void)sig;
	fprintf(stderr, "move_check: %s stuck in round %u (%s)\n", move_role, move_round,
		(const char *)move_phase);
	snprintf(tag, sizeof(tag), "stuck-%s", move_role);
	status_snap(tag);
	_exit(3);
}

static uint8_t move_pattern(uint64_t i, unsigned seed)
{
	return (uint8_t)((i + seed) * 2654435761u >> 13);
}

static size_t move_size(unsigned round)
{
	return 1 + (round * 7919u) % MOVE_MSG_MAX;
}

static void move_wait(int fd, short ev)
{
	struct pollfd p = {.fd = fd, .events = ev};

	if (poll(&p, 1, 60000) != 1)
		prog_die("poll");
}

static void move_read_full(int fd, uint8_t *buf, size_t len)
{
	size_t got = 0;

	while (got < len) {
		ssize_t n = read(fd, buf + got, len - got);

		if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
			move_wait(fd, POLLIN);
			continue;
		}
		if (n <= 0) {
			char tag[32];

			fprintf(stderr, "move_check: %s after %zu of %zu bytes\n",
				n == 0 ? "end of stream" : strerror(errno), got, len);
			snprintf(tag, sizeof(tag), "failed-%s", move_role);
			status_snap(tag);
			exit(1);
		}
		got += (size_t)n;
	}
}

static void move_send_round(int fd, unsigned r, uint8_t *buf)
{
	size_t len = move_size(r);

	move_round = r;
	move_phase = "write";
	for (size_t i = 0; i < len; i++)
		buf[i] = move_pattern(i, r);
	prog_write_all(fd, buf, len);
}

static void move_check_round(int fd, unsigned r, uint8_t *buf)
{
	size_t len = move_size(r);

	move_round = r;
	move_phase = "read the echo";
	move_read_full(fd, buf, len);
	for (size_t i = 0; i < len; i++)
		if (buf[i] != move_pattern(i, r)) {
			fprintf(stderr, "move_check: round %u: byte %zu of %zu differs\n", r, i,
				len);
			exit(1);
		}
}

static int move_client(const char *addr, int port, const char *style, unsigned rounds)
{
	struct sockaddr_in sa = prog_address(addr, port);
	static uint8_t buf[MOVE_MSG_MAX];
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	unsigned r = 0;

	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		prog_die("connect");
	if (strcmp(style, "inline") == 0 &&
	    setsockopt(fd, SOL_SOCKET, SO_OOBINLINE, &(int){1}, sizeof(int)) < 0)
		prog_die("SO_OOBINLINE");
	if (strcmp(style, "poll") == 0)
		fcntl(fd, F_SETFL, O_NONBLOCK);
	if (strcmp(style, "shut") == 0) {
		struct timespec tenth = {0, 100 * 1000000L}, second = {1, 0};

		move_send_round(fd, 1, buf);
		nanosleep(&tenth, NULL);
		move_send_round(fd, 2, buf);
		move_phase = "asleep before the shutdown";
		nanosleep(&second, NULL);
		rounds = 0;
	}
	if (strcmp(style, "burst") == 0 && rounds > MOVE_BURST) {
		move_send_round(fd, r, buf);
		move_check_round(fd, r++, buf);
		for (unsigned k = 0; k < MOVE_BURST; k++)
			move_send_round(fd, r + k, buf);
		for (unsigned k = 0; k < MOVE_BURST; k++)
			move_check_round(fd, r++, buf);
	}
	for (; r < rounds; r++) {
		move_send_round(fd, r, buf);
		move_check_round(fd, r, buf);
	}
	status_snap("client");
	if (shutdown(fd, SHUT_WR) < 0)
		prog_die("shutdown");
	/* The server's end follows ours: nothing more may come. */
	for (ssize_t n; (n = read(fd, buf, 1)) != 0;) {
		if (n > 0 || (errno != EAGAIN && errno != EINTR))
			prog_die("bytes after the echo");
		move_wait(fd, POLLIN);
	}
	close(fd);
	printf("client: %u rounds echoed ok\n", rounds);
	return 0;
}

/* Echoes what is there; returns false at the client's end. */
static bool move_echo_some(int fd, uint8_t *buf, uint64_t *total)
{
	ssize_t n = read(fd, buf, MOVE_MSG_MAX);

	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return true;
	if (n < 0)
		prog_die("server read");
	if (n == 0)
		return false;
	move_phase = "write the echo";
	prog_write_all(fd, buf, (size_t)n);
	move_phase = "wait";
	*total += (uint64_t)n;
	return true;
}

static void move_on_sigurg(int sig)
{
	(void)sig;
	move_sigurgs++;
}

static int move_server(const char *addr, int port, const char *style)
{
	struct sockaddr_in sa = prog_address(addr, port);
	static uint8_t buf[MOVE_MSG_MAX];
	int one = 1, l = socket(AF_INET, SOCK_STREAM, 0), fd;
	uint64_t total = 0;

	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (strcmp(style, "inline-listener") == 0 &&
	    setsockopt(l, SOL_SOCKET, SO_OOBINLINE, &one, sizeof(one)) < 0)
		prog_die("SO_OOBINLINE");
	if (l < 0 || bind(l, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(l, 4) < 0)
		prog_die("listen");
	fd = accept(l, NULL, NULL);
	if (fd < 0)
		prog_die("accept");
	if (strcmp(style, "inline") == 0 &&
	    setsockopt(fd, SOL_SOCKET, SO_OOBINLINE, &one, sizeof(one)) < 0)
		prog_die("SO_OOBINLINE");
	if (strcmp(style, "owner") == 0 &&
	    (signal(SIGURG, move_on_sigurg) == SIG_ERR || fcntl(fd, F_SETOWN, getpid()) < 0))
		prog_die("F_SETOWN");
	if (strcmp(style, "lazy") == 0) {
		struct timespec ts = {0, 300 * 1000000L};

		if (!move_echo_some(fd, buf, &total))
			prog_die("the client's end before its first message");
		nanosleep(&ts, NULL);
	}
	if (strcmp(style, "rdhup") == 0) {
		struct epoll_event ev = {.events = EPOLLRDHUP, .data.fd = fd};
		int ep = epoll_create1(0);

		move_phase = "epoll_wait for EPOLLRDHUP";
		if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0)
			prog_die("epoll");
		if (epoll_wait(ep, &ev, 1, 60000) != 1 || !(ev.events & EPOLLRDHUP))
			prog_die("epoll_wait: no EPOLLRDHUP");
		close(ep);
		printf("server: EPOLLRDHUP\n");
		status_snap("server");
		move_check_round(fd, 1, buf);
		move_check_round(fd, 2, buf);
		if (read(fd, buf, 1) != 0)
			prog_die("bytes after the client's end");
		close(fd);
		close(l);
		printf("server: %zu bytes ok, then the end\n", move_size(1) + move_size(2));
		return 0;
	}
	if (strcmp(style, "epoll") == 0) {
		struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
		int ep = epoll_create1(0);
		bool open = true;

		fcntl(fd, F_SETFL, O_NONBLOCK);
		if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0)
			prog_die("epoll");
		while (open) {
			if (epoll_wait(ep, &ev, 1, 60000) != 1)
				prog_die("epoll_wait");
			open = move_echo_some(fd, buf, &total);
		}
		close(ep);
	} else {
		while (move_echo_some(fd, buf, &total))
			;
	}
	status_snap("server");
	close(fd);
	close(l);
	printf("server: %llu bytes echoed ok\n", (unsigned long long)total);
	if (strcmp(style, "owner") == 0)
		printf("server: %d SIGURG\n", (int)move_sigurgs);
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc > 1)
		move_role = argv[1];
	signal(SIGALRM, move_stuck);
	alarm(MOVE_STUCK_S);
	if (argc == 5 && strcmp(argv[1], "server") == 0)
		return move_server(argv[2], atoi(argv[3]), argv[4]);
	if (argc == 6 && strcmp(argv[1], "client") == 0)
		return move_client(argv[2], atoi(argv[3]), argv[4], (unsigned)atoi(argv[5]));
	fprintf(stderr, "usage: move_check server ADDR PORT "
			"block|epoll|lazy|rdhup|inline|inline-listener|owner\n"
			"       move_check client ADDR PORT block|poll|burst|shut|inline ROUNDS\n");
	return 2;
}
