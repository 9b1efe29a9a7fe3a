/*
 * nbconnect_check: non-blocking connect as a TCP program observes it,
 * waiting in epoll, poll or select style. One line per observation;
 * tests/e2e/nbconnect.sh runs it over kernel TCP and under the shim and
 * requires the same transcript.
 *
 *   nbconnect_check ADDR PORT DEADADDR
 *
 * Scenarios, each in the three styles:
 *   ok       a listener of this process accepts: writable, SO_ERROR 0, a
 *            byte each way
 *   refused  nothing listens on PORT+1: what connect returns, what the wait
 *            shows, SO_ERROR (ECONNREFUSED), SO_ERROR again (0)
 *   timeout  DEADADDR never answers, TCP_SYNCNT 1: nothing shown for
 *            300 ms, then the failure (ETIMEDOUT after about 3 s)
 *   shut     shutdown() while DEADADDR's connect is in progress (SHUT_RD,
 *            SHUT_WR, SHUT_RDWR by style): it aborts the connect, as
 *            Linux's does: what the wait shows, SO_ERROR, a write and a
 *            read after it
 *   self     one event loop serves its own connections: it listens,
 *            connects to itself 3 times, accepts, and each connection
 *            sends 1,000 bytes and gets them echoed, all non-blocking
 *
 *   nbconnect_check ADDR PORT DEADADDR shut-race AT_MS
 *
 * runs only shut-race, in the three styles: a connect whose SYN a full
 * accept queue dropped (it is sent again after a second, and then
 * connects), shut AT_MS after it began (SHUT_RD, SHUT_WR, SHUT_RDWR by
 * style); then the same observations as shut, and what the server's side
 * gets. tests/e2e/nbconnect.sh runs it over TCP with AT_MS 1500 (the
 * connect has ended: the shutdown applies to the connection) and under the
 * shim with AT_MS 500 and SRQSHIM_TEST_DELAYS=shut-connect=1000 (the shim
 * finds the connect running and shuts after it ended).
 *
 * ok and self take a status snapshot (status_snap.h) while their
 * connections are open, tagged "ok-STYLE" and "self-STYLE".
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "handshake/clock.h"
#include "tests/status_snap.h"
#include "tools/prog.h"

enum style { EPOLL, POLL, SELECT };
static const char *const style_name[] = {"epoll", "poll", "select"};

/* Waits up to ms for fd to show writable (or fail) in style st; the events as words. */
static const char *wait_out(enum style st, int fd, int ms)
{
	static char words[64];
	bool in = false, out = false, err = false, hup = false;
	int n;

	if (st == EPOLL) {
		int ep = epoll_create1(0);
		struct epoll_event ev = {.events = EPOLLOUT, .data.fd = fd};

		if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0)
			prog_die("epoll");
		n = epoll_wait(ep, &ev, 1, ms);
		close(ep);
		if (n > 0) {
			in = ev.events & EPOLLIN, out = ev.events & EPOLLOUT;
			err = ev.events & EPOLLERR, hup = ev.events & EPOLLHUP;
		}
	} else if (st == POLL) {
		struct pollfd p = {.fd = fd, .events = POLLOUT};

		n = poll(&p, 1, ms);
		if (n > 0) {
			in = p.revents & POLLIN, out = p.revents & POLLOUT;
			err = p.revents & POLLERR, hup = p.revents & POLLHUP;
		}
	} else {
		fd_set w;
		struct timeval tv = {ms / 1000, (ms % 1000) * 1000};

		FD_ZERO(&w);
		FD_SET(fd, &w);
		n = select(fd + 1, NULL, &w, NULL, &tv);
		if (n > 0)
			out = FD_ISSET(fd, &w);
	}
	if (n < 0)
		prog_die("wait");
	snprintf(words, sizeof(words), "%s%s%s%s%s", n == 0 ? "nothing" : "", in ? "IN " : "",
		 out ? "OUT " : "", err ? "ERR " : "", hup ? "HUP " : "");
	return words;
}

static const char *err_name(int e)
{
	static char buf[32];

	switch (e) {
	case 0: return "0";
	case EINPROGRESS: return "EINPROGRESS";
	case ECONNREFUSED: return "ECONNREFUSED";
	case ETIMEDOUT: return "ETIMEDOUT";
	case EHOSTUNREACH: return "EHOSTUNREACH";
	case ECONNRESET: return "ECONNRESET";
	case EPIPE: return "EPIPE";
	case ENOTCONN: return "ENOTCONN";
	case EAGAIN: return "EAGAIN";
	case ENETUNREACH: return "ENETUNREACH";
	default: snprintf(buf, sizeof(buf), "errno %d", e); return buf;
	}
}

static int so_error(int fd)
{
	int e = -1;
	socklen_t len = sizeof(e);

	if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len) != 0)
		prog_die("SO_ERROR");
	return e;
}

/* A non-blocking connect to addr:port; prints what connect returned. */
static int nb_connect(const char *what, enum style st, const char *addr, int port, int syncnt)
{
	struct sockaddr_in sin = prog_address(addr, port);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0), r;

	if (fd < 0)
		prog_die("socket");
	if (syncnt)
		setsockopt(fd, IPPROTO_TCP, TCP_SYNCNT, &syncnt, sizeof(syncnt));
	r = connect(fd, (struct sockaddr *)&sin, sizeof(sin));
	printf("%s %s: connect %s\n", what, style_name[st], r == 0 ? "0" : err_name(errno));
	return fd;
}

/* The status snapshot of a scenario in a style, tagged "SCENARIO-STYLE". */
static void snap(const char *scenario, enum style st)
{
	char tag[32];

	snprintf(tag, sizeof(tag), "%s-%s", scenario, style_name[st]);
	status_snap(tag);
}

static void scenario_ok(enum style st, const char *addr, int port, int l)
{
	int c = nb_connect("ok", st, addr, port, 0), a;
	char b = 0;

	printf("ok %s: wait %s\n", style_name[st], wait_out(st, c, 5000));
	printf("ok %s: SO_ERROR %s\n", style_name[st], err_name(so_error(c)));
	a = accept(l, NULL, NULL);
	if (a < 0)
		prog_die("accept");
	if (write(c, "c", 1) != 1 || read(a, &b, 1) != 1 || write(a, "s", 1) != 1)
		prog_die("ok: exchange");
	for (int i = 0; i < 500 && read(c, &b, 1) != 1; i++) /* non-blocking: retry briefly */
		usleep(10000);
	printf("ok %s: the server got and sent a byte, the client read '%c'\n", style_name[st], b);
	snap("ok", st);
	close(a);
	close(c);
}

static void scenario_refused(enum style st, const char *addr, int port)
{
	int c = nb_connect("refused", st, addr, port + 1, 0);

	printf("refused %s: wait %s\n", style_name[st], wait_out(st, c, 5000));
	printf("refused %s: SO_ERROR %s\n", style_name[st], err_name(so_error(c)));
	printf("refused %s: SO_ERROR again %s\n", style_name[st], err_name(so_error(c)));
	close(c);
}

static void scenario_timeout(enum style st, const char *dead, int port)
{
	int c = nb_connect("timeout", st, dead, port, 1);

	printf("timeout %s: wait 300 ms %s\n", style_name[st], wait_out(st, c, 300));
	printf("timeout %s: wait %s\n", style_name[st], wait_out(st, c, 20000));
	printf("timeout %s: SO_ERROR %s\n", style_name[st], err_name(so_error(c)));
	close(c);
}

/*
 * shutdown(c) (SHUT_RD, _WR, _RDWR by style), then what the wait shows,
 * SO_ERROR, a write and a read.
 */
static void shut_and_look(const char *what, enum style st, int c)
{
	char b = 'x';
	ssize_t n;

	printf("%s %s: shutdown %s\n", what, style_name[st],
	       err_name(shutdown(c, SHUT_RD + (int)st) == 0 ? 0 : errno));
	printf("%s %s: wait %s\n", what, style_name[st], wait_out(st, c, 3000));
	printf("%s %s: SO_ERROR %s\n", what, style_name[st], err_name(so_error(c)));
	n = send(c, &b, 1, MSG_NOSIGNAL);
	printf("%s %s: send %s\n", what, style_name[st], n < 0 ? err_name(errno) : "1");
	n = recv(c, &b, 1, 0);
	printf("%s %s: recv %s\n", what, style_name[st], n < 0 ? err_name(errno) : n ? "1" : "0");
}

/* shutdown() of a connect still in progress. */
static void scenario_shut(enum style st, const char *dead, int port)
{
	int c = nb_connect("shut", st, dead, port, 1);

	shut_and_look("shut", st, c);
	close(c);
}

/*
 * The server's side of shut-race-held: every byte its connections bring
 * within 5 s (at most 64), read from each connection it accepts.
 */
static void shut_race_server_bytes(const char *what, enum style st, int l)
{
	char got[65] = "", b[64];
	size_t len = 0;
	int conns[8], nc = 0;
	uint64_t end = ss_now_ms() + 5000;

	for (;;) {
		struct pollfd p[9];
		uint64_t now = ss_now_ms();
		int np = 0, left = now < end ? (int)(end - now) : 0;

		if (left <= 0 || len >= 5)
			break;
		p[np++] = (struct pollfd){.fd = l, .events = POLLIN};
		for (int i = 0; i < nc; i++)
			p[np++] = (struct pollfd){.fd = conns[i], .events = POLLIN};
		if (poll(p, (nfds_t)np, left) <= 0)
			continue;
		if ((p[0].revents & POLLIN) && nc < 8 && (conns[nc] = accept(l, NULL, NULL)) >= 0)
			nc++;
		for (int i = 1; i < np; i++) {
			ssize_t n;

			if (!p[i].revents)
				continue;
			n = recv(p[i].fd, b, sizeof(b) - 1 - len, MSG_DONTWAIT);
			if (n > 0) {
				memcpy(got + len, b, (size_t)n);
				len += (size_t)n;
			} else if (n == 0 || errno != EAGAIN) {
				/* ended: no more from it (a reset probe, or its end) */
				close(p[i].fd);
				conns[i - 1] = conns[--nc];
				break; /* the array changed: poll again */
			}
		}
	}
	got[len] = 0;
	printf("%s %s: the server got '%s'\n", what, style_name[st], got);
	for (int i = 0; i < nc; i++)
		close(conns[i]);
}

/*
 * shut-race: a shutdown that finds the connect running, the connect ending
 * before it shuts. held: the client wrote 5 bytes before the shutdown
 * (under the shim, held: TCP's write says EAGAIN then), and what the
 * server gets and the client's pending error are printed: the bytes must
 * reach the server, or the connection fail where the application sees it.
 */
static void scenario_shut_race(enum style st, const char *addr, int port, int at_ms, bool held)
{
	struct sockaddr_in sin = prog_address(addr, port);
	int l = socket(AF_INET, SOCK_STREAM, 0), one = 1, filler, c, a;
	const char *what = held ? "shut-race-held" : "shut-race";
	struct pollfd p;
	char b;
	ssize_t n;

	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (l < 0 || bind(l, (struct sockaddr *)&sin, sizeof(sin)) || listen(l, 0))
		prog_die("shut-race: listen");
	/* One connection fills the queue: the next SYN is dropped, and sent again after 1 s. */
	filler = socket(AF_INET, SOCK_STREAM, 0);
	if (filler < 0 || connect(filler, (struct sockaddr *)&sin, sizeof(sin)) != 0)
		prog_die("shut-race: filler");
	c = nb_connect(what, st, addr, port, 0);
	if (held && send(c, "hello", 5, MSG_NOSIGNAL) < 0 && errno != EAGAIN)
		prog_die("shut-race-held: send");
	usleep(200000);
	if ((a = accept(l, NULL, NULL)) < 0)
		prog_die("shut-race: accept the filler");
	close(a);
	close(filler);
	usleep((useconds_t)(at_ms - 200) * 1000);
	if (held) {
		shutdown(c, SHUT_RD + (int)st);
		shut_race_server_bytes(what, st, l);
		printf("%s %s: the client's SO_ERROR %s\n", what, style_name[st],
		       err_name(so_error(c)));
		close(c);
		close(l);
		return;
	}
	shut_and_look(what, st, c);
	p = (struct pollfd){.fd = l, .events = POLLIN};
	if (poll(&p, 1, 3000) != 1 || (a = accept(l, NULL, NULL)) < 0) {
		printf("shut-race %s: the server accepted nothing\n", style_name[st]);
	} else {
		p = (struct pollfd){.fd = a, .events = POLLIN};
		poll(&p, 1, 1000);
		n = recv(a, &b, 1, MSG_DONTWAIT);
		printf("shut-race %s: the server's read %s\n", style_name[st],
		       n < 0 ? err_name(errno)
		       : n   ? "1"
			     : "0");
		close(a);
	}
	close(c);
	close(l);
}

/* One loop: its listener, 3 connections to itself, each echoing 1,000 bytes. */
static void scenario_self(enum style st, const char *addr, int port)
{
	enum { N = 3, LEN = 1000 };
	struct sockaddr_in sin = prog_address(addr, port);
	int l = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0), one = 1;
	int cli[N], srv[N], n_srv = 0, sent[N] = {0}, got[N] = {0}, echoed[N] = {0}, done = 0;
	char buf[LEN];

	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(l, (struct sockaddr *)&sin, sizeof(sin)) || listen(l, 16))
		prog_die("self: listen");
	for (int i = 0; i < N; i++) {
		cli[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
		if (connect(cli[i], (struct sockaddr *)&sin, sizeof(sin)) != 0 &&
		    errno != EINPROGRESS)
			prog_die("self: connect");
	}
	memset(buf, 'e', sizeof(buf));
	for (int round = 0; done < N; round++) {
		struct pollfd p[1 + 2 * N];
		int k = 0;

		if (round > 20000)
			prog_die("self: the loop made no progress");
		/* The loop's wait: every fd, in the style asked (poll's answer drives all
		 * three). */
		p[k++] = (struct pollfd){.fd = l, .events = POLLIN};
		for (int i = 0; i < N; i++)
			p[k++] = (struct pollfd){.fd = cli[i],
						 .events = POLLIN | (sent[i] < LEN ? POLLOUT : 0)};
		for (int i = 0; i < n_srv; i++)
			p[k++] = (struct pollfd){.fd = srv[i], .events = POLLIN};
		if (st == POLL) {
			if (poll(p, (nfds_t)k, 5000) <= 0)
				prog_die("self: poll");
		} else if (st == SELECT) {
			fd_set r, w;
			int maxfd = 0;
			struct timeval tv = {5, 0};

			FD_ZERO(&r);
			FD_ZERO(&w);
			for (int i = 0; i < k; i++) {
				if (p[i].events & POLLIN)
					FD_SET(p[i].fd, &r);
				if (p[i].events & POLLOUT)
					FD_SET(p[i].fd, &w);
				maxfd = p[i].fd > maxfd ? p[i].fd : maxfd;
			}
			if (select(maxfd + 1, &r, &w, NULL, &tv) <= 0)
				prog_die("self: select");
			for (int i = 0; i < k; i++)
				p[i].revents = (short)((FD_ISSET(p[i].fd, &r) ? POLLIN : 0) |
						       (FD_ISSET(p[i].fd, &w) ? POLLOUT : 0));
		} else {
			int ep = epoll_create1(0), m;
			struct epoll_event ev[1 + 2 * N];

			for (int i = 0; i < k; i++) {
				struct epoll_event e = {.events = (unsigned)p[i].events,
							.data.u32 = (unsigned)i};
				epoll_ctl(ep, EPOLL_CTL_ADD, p[i].fd, &e);
				p[i].revents = 0;
			}
			m = epoll_wait(ep, ev, k, 5000);
			close(ep);
			if (m <= 0)
				prog_die("self: epoll_wait");
			for (int i = 0; i < m; i++)
				p[ev[i].data.u32].revents = (short)ev[i].events;
		}
		if ((p[0].revents & POLLIN) && n_srv < N) {
			int a = accept4(l, NULL, NULL, SOCK_NONBLOCK);

			if (a >= 0)
				srv[n_srv++] = a;
		}
		for (int i = 0; i < N; i++) {
			short re = p[1 + i].revents;
			ssize_t r;

			if ((re & POLLOUT) && sent[i] < LEN &&
			    (r = write(cli[i], buf, (size_t)(LEN - sent[i]))) > 0)
				sent[i] += (int)r;
			if ((re & POLLIN) && (r = read(cli[i], buf, sizeof(buf))) > 0) {
				got[i] += (int)r;
				if (got[i] == LEN)
					done++;
			}
		}
		for (int i = 0; i < n_srv; i++) {
			ssize_t r;

			if ((p[1 + N + i].revents & POLLIN) &&
			    (r = read(srv[i], buf, sizeof(buf))) > 0) {
				if (write(srv[i], buf, (size_t)r) != r)
					prog_die("self: echo");
				echoed[i] += (int)r;
			}
		}
	}
	printf("self %s: %d connections to itself, each echoed %d bytes\n", style_name[st], N,
	       got[0] == LEN && got[1] == LEN && got[2] == LEN ? LEN : -1);
	snap("self", st);
	for (int i = 0; i < N; i++) {
		close(cli[i]);
		close(srv[i]);
	}
	close(l);
}

int main(int argc, char **argv)
{
	const char *addr, *dead;
	int port, l, one = 1;
	struct sockaddr_in sin;

	if (argc != 4 && !(argc == 6 && (strcmp(argv[4], "shut-race") == 0 ||
					 strcmp(argv[4], "shut-race-held") == 0))) {
		fprintf(stderr, "usage: nbconnect_check ADDR PORT DEADADDR "
				"[shut-race|shut-race-held AT_MS]\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	addr = argv[1];
	port = atoi(argv[2]);
	dead = argv[3];
	if (argc == 6) {
		for (int st = EPOLL; st <= SELECT; st++)
			scenario_shut_race((enum style)st, addr, port + st, atoi(argv[5]),
					   strcmp(argv[4], "shut-race-held") == 0);
		return 0;
	}
	sin = prog_address(addr, port);
	l = socket(AF_INET, SOCK_STREAM, 0);
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (l < 0 || bind(l, (struct sockaddr *)&sin, sizeof(sin)) || listen(l, 16))
		prog_die("listen");
	for (int st = EPOLL; st <= SELECT; st++) {
		scenario_ok((enum style)st, addr, port, l);
		scenario_refused((enum style)st, addr, port);
		scenario_self((enum style)st, addr, port + 2 + st);
		scenario_timeout((enum style)st, dead, port);
		scenario_shut((enum style)st, dead, port);
	}
	close(l);
	return 0;
}
