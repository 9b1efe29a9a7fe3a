/*
 * wait_check: the readiness rules of epoll, poll and select, as a TCP
 * program observes them. Each scenario makes fresh connected pairs (both
 * ends in this process), does what it names and prints what every wait
 * call returned, one line per call. tests/e2e/wait.sh runs it over kernel
 * TCP and under the shim and requires the same transcript: kernel TCP
 * defines the right answer.
 *
 *   wait_check ADDR PORT [SCENARIO...]
 *
 * With WC_STATUS=FILE and WC_CTL=srqshim-ctl set, the status of the first
 * pair (taken while it is open) goes to FILE, for the caller to check that
 * the shim carried the pairs.
 *
 * A wait that expects an event gets a long timeout (the event may still
 * be on its way); one that expects none gets a short one, so timing does
 * not enter the transcript.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tools/prog.h"

#define LONG_MS  3000 /* an event is expected */
#define SHORT_MS 150  /* none is */

/* How a timeout shows in the transcript. */
static const char *tmo_name(int ms)
{
	return ms < 0 ? "none" : ms >= LONG_MS ? "long" : ms ? "short" : "0";
}

static const char *wc_addr;
static int wc_port, wc_listener = -1;
static bool wc_status_taken;

static void out(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	fflush(stdout);
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* ---- connections ---- */

static void set_nonblock(int fd)
{
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

static void take_status(void)
{
	const char *file = getenv("WC_STATUS"), *ctl = getenv("WC_CTL");
	char cmd[1024];

	if (!file || !ctl || wc_status_taken)
		return;
	wc_status_taken = true;
	snprintf(cmd, sizeof(cmd), "'%s' status --json --pid %d > '%s'", ctl, (int)getpid(), file);
	if (system(cmd) != 0)
		fprintf(stderr, "wait_check: status failed\n");
}

/*
 * A connected pair (c: the connecting end, s: the accepted one), both
 * non-blocking, after one byte each way (under the shim: both upgraded).
 */
static void make_pair(int *c, int *s)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)wc_port)};
	char b = 'x';

	inet_pton(AF_INET, wc_addr, &sa.sin_addr);
	*c = socket(AF_INET, SOCK_STREAM, 0);
	if (*c < 0 || connect(*c, (struct sockaddr *)&sa, sizeof(sa)) != 0)
		prog_die("connect");
	*s = accept(wc_listener, NULL, NULL);
	if (*s < 0)
		prog_die("accept");
	if (write(*c, &b, 1) != 1 || read(*s, &b, 1) != 1 || write(*s, &b, 1) != 1 ||
	    read(*c, &b, 1) != 1)
		prog_die("first exchange");
	set_nonblock(*c);
	set_nonblock(*s);
	take_status();
}

static void put(int fd, size_t n)
{
	char buf[256];

	memset(buf, 'd', sizeof(buf));
	if (n > sizeof(buf) || write(fd, buf, n) != (ssize_t)n)
		prog_die("write");
}

/* Reads up to n bytes (non-blocking), printing what it got. */
static void take(const char *name, int fd, size_t n)
{
	char buf[256];
	ssize_t r = read(fd, buf, n < sizeof(buf) ? n : sizeof(buf));

	if (r < 0)
		out("  read %s: %s\n", name, strerror(errno));
	else
		out("  read %s: %zd\n", name, r);
}

/* Reads until the peer's n bytes are all here (waiting as long as LONG_MS). */
static void take_all(const char *name, int fd, size_t n)
{
	char buf[256];
	size_t got = 0;
	uint64_t end = now_ms() + LONG_MS;

	while (got < n && now_ms() < end) {
		ssize_t r = read(fd, buf, n - got < sizeof(buf) ? n - got : sizeof(buf));

		if (r > 0)
			got += (size_t)r;
		else if (r == 0)
			break;
		else
			usleep(1000);
	}
	out("  read %s: %zu of %zu\n", name, got, n);
}

/*
 * Waits, unrecorded, until fd shows the peer's end: over RDMA it may still
 * be on its way when a wait that finds something else ready returns.
 */
static void settle_eof(int fd)
{
	struct pollfd p = {.fd = fd, .events = POLLRDHUP};

	poll(&p, 1, LONG_MS);
}

/*
 * Waits, unrecorded, until fd is readable: the bytes a peer just wrote may
 * still be on their way over RDMA when a wait that finds another fd ready
 * returns (over TCP on loopback they are there when write returns).
 */
static void settle_in(int fd)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};

	poll(&p, 1, LONG_MS);
}

/* ---- printing what a wait returned ---- */

static const char *fd_names[1024];

static void name_fd(int fd, const char *name)
{
	if (fd >= 0 && fd < 1024)
		fd_names[fd] = name;
}

static void print_events(uint32_t ev)
{
	static const struct {
		uint32_t bit;
		const char *name;
	} bits[] = {{EPOLLIN, "IN"},       {EPOLLPRI, "PRI"}, {EPOLLOUT, "OUT"},
		    {EPOLLRDHUP, "RDHUP"}, {EPOLLHUP, "HUP"}, {EPOLLERR, "ERR"}};
	bool first = true;

	for (size_t i = 0; i < sizeof(bits) / sizeof(bits[0]); i++)
		if (ev & bits[i].bit) {
			out("%s%s", first ? "" : "|", bits[i].name);
			first = false;
		}
	ev &= ~(uint32_t)(EPOLLIN | EPOLLPRI | EPOLLOUT | EPOLLRDHUP | EPOLLHUP | EPOLLERR |
			  EPOLLRDNORM | EPOLLWRNORM);
	if (ev)
		out("%s0x%x", first ? "" : "|", ev);
}

/* epoll_wait on ep; the events' data is the fd. Sorted by name when several. */
static int ewait(int ep, int max, int timeout_ms)
{
	struct epoll_event ev[16];
	int n = epoll_wait(ep, ev, max, timeout_ms);

	out("  epoll_wait(max %d, %s) =", max, tmo_name(timeout_ms));
	if (n < 0) {
		out(" -1 %s\n", strerror(errno));
		return n;
	}
	out(" %d", n);
	for (int i = 0; i < n; i++) {
		for (int j = i + 1; j < n; j++)
			if (strcmp(fd_names[ev[j].data.fd], fd_names[ev[i].data.fd]) < 0) {
				struct epoll_event t = ev[i];

				ev[i] = ev[j];
				ev[j] = t;
			}
		out(" %s:", fd_names[ev[i].data.fd]);
		print_events(ev[i].events);
	}
	out("\n");
	return n;
}

static void ectl(int ep, int op, int fd, uint32_t events)
{
	struct epoll_event ev = {.events = events, .data.fd = fd};
	int r = epoll_ctl(ep, op, fd, &ev);

	if (r != 0)
		out("  epoll_ctl(%s) = -1 %s\n",
		    op == EPOLL_CTL_ADD   ? "ADD"
		    : op == EPOLL_CTL_MOD ? "MOD"
					  : "DEL",
		    strerror(errno));
}

static int pwait(struct pollfd *p, int n, int timeout_ms)
{
	int r = poll(p, (nfds_t)n, timeout_ms);

	out("  poll(%s) =", tmo_name(timeout_ms));
	if (r < 0) {
		out(" -1 %s\n", strerror(errno));
		return r;
	}
	out(" %d", r);
	for (int i = 0; i < n; i++)
		if (p[i].revents) {
			out(" %s:", fd_names[p[i].fd]);
			print_events((uint32_t)p[i].revents);
		}
	out("\n");
	return r;
}

static int swait(int *fds, int n, bool rd, bool wr, int timeout_ms)
{
	fd_set r, w;
	int maxfd = -1, got;
	struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};

	FD_ZERO(&r);
	FD_ZERO(&w);
	for (int i = 0; i < n; i++) {
		if (rd)
			FD_SET(fds[i], &r);
		if (wr)
			FD_SET(fds[i], &w);
		if (fds[i] > maxfd)
			maxfd = fds[i];
	}
	got = select(maxfd + 1, &r, &w, NULL, &tv);
	out("  select(%s) =", tmo_name(timeout_ms));
	if (got < 0) {
		out(" -1 %s\n", strerror(errno));
		return got;
	}
	out(" %d", got);
	for (int i = 0; i < n; i++) {
		if (FD_ISSET(fds[i], &r))
			out(" %s:r", fd_names[fds[i]]);
		if (FD_ISSET(fds[i], &w))
			out(" %s:w", fd_names[fds[i]]);
	}
	out("\n");
	return got;
}

/* ---- scenarios ---- */

static int pair_c, pair_s;

static void pair_open(void)
{
	make_pair(&pair_c, &pair_s);
	name_fd(pair_c, "C");
	name_fd(pair_s, "S");
}

static void pair_close(void)
{
	close(pair_c);
	close(pair_s);
}

static void sc_level(void)
{
	int ep = epoll_create1(0);

	pair_open();
	ectl(ep, EPOLL_CTL_ADD, pair_s, EPOLLIN);
	ewait(ep, 8, 0);
	put(pair_c, 10);
	ewait(ep, 8, LONG_MS);
	ewait(ep, 8, 0); /* still there: level */
	take_all("S", pair_s, 10);
	ewait(ep, 8, SHORT_MS);
	close(ep);
	pair_close();
}

static void sc_edge(void)
{
	int ep = epoll_create1(0);

	pair_open();
	ectl(ep, EPOLL_CTL_ADD, pair_s, EPOLLIN | EPOLLET);
	put(pair_c, 10);
	ewait(ep, 8, LONG_MS);
	ewait(ep, 8, SHORT_MS); /* no new edge */
	put(pair_c, 10);
	ewait(ep, 8, LONG_MS); /* new data: a new edge */
	take("S", pair_s, 5);
	ewait(ep, 8, SHORT_MS); /* reading is no edge */
	put(pair_c, 10);
	ewait(ep, 8, LONG_MS);
	take_all("S", pair_s, 25);
	close(ep);
	pair_close();
}

static void sc_edge_out(void)
{
	int ep = epoll_create1(0);

	pair_open();
	ectl(ep, EPOLL_CTL_ADD, pair_c, EPOLLIN | EPOLLOUT | EPOLLET);
	ewait(ep, 8, LONG_MS); /* writable at once */
	ewait(ep, 8, SHORT_MS);
	put(pair_s, 10);
	ewait(ep, 8, LONG_MS); /* the edge reports all that holds */
	take_all("C", pair_c, 10);
	close(ep);
	pair_close();
}

static void sc_oneshot(void)
{
	int ep = epoll_create1(0);

	pair_open();
	ectl(ep, EPOLL_CTL_ADD, pair_s, EPOLLIN | EPOLLONESHOT);
	put(pair_c, 10);
	ewait(ep, 8, LONG_MS);
	ewait(ep, 8, SHORT_MS);
	put(pair_c, 10);
	ewait(ep, 8, SHORT_MS); /* disabled until MOD */
	take_all("S", pair_s, 20);
	put(pair_c, 10);
	take_all("S", pair_s, 5);
	ectl(ep, EPOLL_CTL_MOD, pair_s, EPOLLIN | EPOLLONESHOT);
	ewait(ep, 8, LONG_MS); /* MOD looks again */
	ewait(ep, 8, SHORT_MS);
	close(ep);
	pair_close();
}

static void sc_mod(void)
{
	int ep = epoll_create1(0);

	pair_open();
	ectl(ep, EPOLL_CTL_ADD, pair_s, EPOLLOUT);
	ewait(ep, 8, LONG_MS);
	put(pair_c, 10);
	take_all("wait for S's data to arrive (C side reads nothing)", pair_c, 0);
	ectl(ep, EPOLL_CTL_MOD, pair_s, EPOLLIN);
	ewait(ep, 8, LONG_MS);
	ectl(ep, EPOLL_CTL_MOD, pair_s, EPOLLIN | EPOLLOUT);
	ewait(ep, 8, LONG_MS);
	ectl(ep, EPOLL_CTL_MOD, pair_s, EPOLLIN | EPOLLET);
	ewait(ep, 8, LONG_MS); /* MOD of an edge registration reports what holds */
	ewait(ep, 8, SHORT_MS);
	ectl(ep, EPOLL_CTL_DEL, pair_s, 0);
	ewait(ep, 8, SHORT_MS);
	ectl(ep, EPOLL_CTL_DEL, pair_s, 0);       /* ENOENT */
	ectl(ep, EPOLL_CTL_MOD, pair_s, EPOLLIN); /* ENOENT */
	ectl(ep, EPOLL_CTL_ADD, pair_s, EPOLLIN);
	ectl(ep, EPOLL_CTL_ADD, pair_s, EPOLLIN); /* EEXIST */
	ewait(ep, 8, LONG_MS);
	close(ep);
	pair_close();
}

static void sc_shutdown(void)
{
	int ep = epoll_create1(0);

	pair_open();
	ectl(ep, EPOLL_CTL_ADD, pair_s, EPOLLIN | EPOLLOUT | EPOLLRDHUP);
	ectl(ep, EPOLL_CTL_ADD, pair_c, EPOLLIN | EPOLLOUT | EPOLLRDHUP);
	ewait(ep, 8, LONG_MS);
	shutdown(pair_c, SHUT_WR);
	settle_eof(pair_s);
	ewait(ep, 8, LONG_MS);
	ewait(ep, 8, LONG_MS);
	take("S", pair_s, 10); /* end of file */
	shutdown(pair_s, SHUT_WR);
	settle_eof(pair_c);
	ewait(ep, 8, LONG_MS);
	ewait(ep, 8, LONG_MS);
	take("C", pair_c, 10);
	close(ep);
	pair_close();
}

/*
 * shutdown(SHUT_RD): readable at once with the end (IN, RDHUP, an edge);
 * a read finds the end; bytes the peer writes after it are still read
 * (Linux's TCP), then the end again.
 */
static void sc_shut_rd(void)
{
	int ep = epoll_create1(0);
	struct pollfd p = {.events = POLLIN | POLLRDHUP};

	pair_open();
	p.fd = pair_c;
	ectl(ep, EPOLL_CTL_ADD, pair_c, EPOLLIN | EPOLLRDHUP | EPOLLET);
	ewait(ep, 8, SHORT_MS);
	shutdown(pair_c, SHUT_RD);
	ewait(ep, 8, LONG_MS);
	ewait(ep, 8, SHORT_MS);
	pwait(&p, 1, LONG_MS);
	take("C", pair_c, 10);
	put(pair_s, 10);
	ewait(ep, 8, LONG_MS); /* the bytes' edge */
	take("C", pair_c, 10);
	take("C", pair_c, 10);
	close(ep);
	pair_close();
}

static void sc_peer_close(void)
{
	int ep = epoll_create1(0);
	struct linger lg = {.l_onoff = 1, .l_linger = 0};
	int c2, s2;

	pair_open();
	ectl(ep, EPOLL_CTL_ADD, pair_s, EPOLLIN | EPOLLRDHUP);
	put(pair_c, 10);
	close(pair_c); /* data, then end of file */
	ewait(ep, 8, LONG_MS);
	ewait(ep, 8, LONG_MS);
	take_all("S", pair_s, 10);
	take("S", pair_s, 10);
	close(pair_s);
	close(ep);

	/* An abortive close: the other end sees a reset. */
	ep = epoll_create1(0);
	make_pair(&c2, &s2);
	name_fd(c2, "C2");
	name_fd(s2, "S2");
	ectl(ep, EPOLL_CTL_ADD, s2, EPOLLIN | EPOLLOUT | EPOLLRDHUP);
	ewait(ep, 8, LONG_MS);
	setsockopt(c2, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	close(c2);
	/* Wait for the reset itself (the first report may be only its end of file). */
	for (int i = 0; i < 50; i++) {
		struct pollfd p = {.fd = s2, .events = POLLIN};

		if (poll(&p, 1, 100) == 1 && (p.revents & POLLHUP))
			break;
	}
	ewait(ep, 8, LONG_MS);
	take("S2", s2, 10);
	ewait(ep, 8, LONG_MS);
	take("S2", s2, 10);
	close(s2);
	close(ep);
}

/* maxevents below the ready count: the ready take turns. */
static void sc_rotation(void)
{
	int ep = epoll_create1(0), c[3], s[3];
	static const char *cn[3] = {"C1", "C2", "C3"}, *sn[3] = {"S1", "S2", "S3"};

	for (int i = 0; i < 3; i++) {
		make_pair(&c[i], &s[i]);
		name_fd(c[i], cn[i]);
		name_fd(s[i], sn[i]);
		ectl(ep, EPOLL_CTL_ADD, s[i], EPOLLIN);
	}
	for (int i = 0; i < 3; i++) {
		put(c[i], 10);
		settle_in(s[i]);
		ewait(ep, 8, LONG_MS);
	}
	for (int i = 0; i < 7; i++)
		ewait(ep, 1, 0);
	ewait(ep, 2, 0);
	ewait(ep, 2, 0);
	for (int i = 0; i < 3; i++) {
		take_all(sn[i], s[i], 10);
		close(c[i]);
		close(s[i]);
	}
	close(ep);
}

static void sc_two_instances(void)
{
	int ep1 = epoll_create1(0), ep2 = epoll_create1(0);

	pair_open();
	ectl(ep1, EPOLL_CTL_ADD, pair_s, EPOLLIN);
	ectl(ep2, EPOLL_CTL_ADD, pair_s, EPOLLIN | EPOLLET);
	put(pair_c, 10);
	ewait(ep1, 8, LONG_MS);
	ewait(ep2, 8, LONG_MS);
	ewait(ep1, 8, 0);
	ewait(ep2, 8, SHORT_MS);
	close(ep1);
	put(pair_c, 10);
	ewait(ep2, 8, LONG_MS);
	close(ep2);
	pair_close();
}

static void sc_close_dup(void)
{
	int ep = epoll_create1(0), d;

	pair_open();
	ectl(ep, EPOLL_CTL_ADD, pair_s, EPOLLIN);
	close(pair_s); /* its only name: the registration goes */
	put(pair_c, 10);
	ewait(ep, 8, SHORT_MS);
	ectl(ep, EPOLL_CTL_DEL, pair_s, 0); /* EBADF */
	close(pair_c);
	close(ep);

	/* A registration belongs to the open file: a dup keeps it alive. */
	ep = epoll_create1(0);
	pair_open();
	ectl(ep, EPOLL_CTL_ADD, pair_s, EPOLLIN);
	d = dup(pair_s);
	name_fd(d, "S'");
	close(pair_s);
	put(pair_c, 10);
	ewait(ep, 8, LONG_MS); /* reported under the first name's data */
	take_all("S'", d, 10);
	ewait(ep, 8, SHORT_MS);
	close(d);
	close(pair_c);
	close(ep);
}

/* A dup of the epoll fd names the same instance: its registrations, MOD, EEXIST, DEL. */
static void sc_dup_epoll(void)
{
	int ep = epoll_create1(0), ep2;

	pair_open();
	ectl(ep, EPOLL_CTL_ADD, pair_s, EPOLLIN);
	ep2 = dup(ep);
	put(pair_c, 10);
	ewait(ep2, 8, LONG_MS);
	ectl(ep2, EPOLL_CTL_MOD, pair_s, EPOLLIN | EPOLLET); /* found through the dup */
	ewait(ep, 8, LONG_MS);                               /* MOD looked again: one edge */
	ewait(ep, 8, SHORT_MS);
	ectl(ep2, EPOLL_CTL_ADD, pair_s, EPOLLIN); /* EEXIST */
	take_all("S", pair_s, 10);
	ectl(ep2, EPOLL_CTL_DEL, pair_s, 0);
	put(pair_c, 10);
	ewait(ep, 8, SHORT_MS); /* no longer registered */
	take_all("S", pair_s, 10);
	close(ep2);
	close(ep);
	pair_close();
}

static void sc_timeout(void)
{
	int ep = epoll_create1(0);
	uint64_t t0;

	pair_open();
	ectl(ep, EPOLL_CTL_ADD, pair_s, EPOLLIN);
	t0 = now_ms();
	ewait(ep, 8, 200);
	out("  epoll_wait slept at least 190 ms: %s\n", now_ms() - t0 >= 190 ? "yes" : "no");
	t0 = now_ms();
	{
		struct pollfd p = {.fd = pair_s, .events = POLLIN};

		pwait(&p, 1, 200);
	}
	out("  poll slept at least 190 ms: %s\n", now_ms() - t0 >= 190 ? "yes" : "no");
	t0 = now_ms();
	swait(&pair_s, 1, true, false, 200);
	out("  select slept at least 190 ms: %s\n", now_ms() - t0 >= 190 ? "yes" : "no");
	close(ep);
	pair_close();
}

static void on_alarm(int sig)
{
	(void)sig;
}

static void alarm_in(int ms)
{
	struct itimerval it = {.it_value = {.tv_sec = 0, .tv_usec = ms * 1000}};

	setitimer(ITIMER_REAL, &it, NULL);
}

static void sc_signals(void)
{
	struct sigaction sa = {.sa_handler = on_alarm}; /* no SA_RESTART */
	int ep = epoll_create1(0);
	sigset_t block, none;

	pair_open();
	sigaction(SIGALRM, &sa, NULL);
	ectl(ep, EPOLL_CTL_ADD, pair_s, EPOLLIN);
	alarm_in(100);
	ewait(ep, 8, -1);
	{
		struct pollfd p = {.fd = pair_s, .events = POLLIN};

		alarm_in(100);
		pwait(&p, 1, -1);
	}
	alarm_in(100);
	swait(&pair_s, 1, true, false, 60000);

	/* The signal blocked for the wait: it stays pending, the wait times out. */
	sigemptyset(&block);
	sigaddset(&block, SIGALRM);
	sigemptyset(&none);
	sigprocmask(SIG_BLOCK, &block, NULL);
	alarm_in(50);
	{
		struct epoll_event ev[4];
		int n = epoll_pwait(ep, ev, 4, 300, &block);

		out("  epoll_pwait(SIGALRM blocked, 300 ms) = %d\n", n);
		n = epoll_pwait(ep, ev, 4, 3000, &none); /* the mask lets it in: EINTR at once */
		out("  epoll_pwait(nothing blocked, pending signal) = %d %s\n", n,
		    n < 0 ? strerror(errno) : "");
	}
	alarm_in(50);
	{
		struct pollfd p = {.fd = pair_s, .events = POLLIN};
		struct timespec ts = {.tv_sec = 3};
		int n;

		usleep(100000);
		n = ppoll(&p, 1, &ts, &none);
		out("  ppoll(nothing blocked, pending signal) = %d %s\n", n,
		    n < 0 ? strerror(errno) : "");
	}
	alarm_in(50);
	{
		fd_set r;
		struct timespec ts = {.tv_sec = 3};
		int n;

		usleep(100000);
		FD_ZERO(&r);
		FD_SET(pair_s, &r);
		n = pselect(pair_s + 1, &r, NULL, NULL, &ts, &none);
		out("  pselect(nothing blocked, pending signal) = %d %s\n", n,
		    n < 0 ? strerror(errno) : "");
	}
	sigprocmask(SIG_UNBLOCK, &block, NULL);
	signal(SIGALRM, SIG_DFL);
	close(ep);
	pair_close();
}

static void sc_poll(void)
{
	struct pollfd p[2];

	pair_open();
	p[0] = (struct pollfd){.fd = pair_s, .events = POLLIN | POLLOUT | POLLRDHUP};
	p[1] = (struct pollfd){.fd = pair_c, .events = POLLIN};
	pwait(p, 2, LONG_MS);
	p[0].events = POLLIN;
	pwait(p, 2, SHORT_MS);
	put(pair_c, 10);
	pwait(p, 2, LONG_MS);
	shutdown(pair_c, SHUT_WR);
	take_all("S", pair_s, 10);
	pwait(p, 2, LONG_MS); /* the end of file */
	p[0].events = POLLIN | POLLOUT | POLLRDHUP;
	pwait(p, 2, LONG_MS);
	p[0].events = 0; /* errors and hang-ups are reported always */
	shutdown(pair_s, SHUT_WR);
	settle_eof(pair_c);
	pwait(p, 2, SHORT_MS);
	p[1].events = POLLIN | POLLOUT | POLLRDHUP;
	pwait(p, 2, LONG_MS);
	p[0].fd = -1; /* ignored */
	pwait(p, 2, LONG_MS);
	pair_close();
}

static void sc_select(void)
{
	int both[2];

	pair_open();
	both[0] = pair_s;
	both[1] = pair_c;
	swait(both, 2, true, true, LONG_MS);
	swait(both, 2, true, false, SHORT_MS);
	put(pair_c, 10);
	swait(both, 2, true, false, LONG_MS);
	take_all("S", pair_s, 10);
	swait(both, 2, true, false, SHORT_MS);
	shutdown(pair_c, SHUT_WR);
	settle_eof(pair_s);
	swait(both, 2, true, false, LONG_MS);
	swait(both, 2, true, true, LONG_MS);
	/* A closed number among upgraded ones: EBADF. */
	both[1] = dup(pair_c);
	close(both[1]);
	swait(both, 2, true, false, SHORT_MS);
	pair_close();
}

struct sleeper_args {
	int ep;
	int timeout_ms; /* 0: 10 s */
	char line[256];
};

static void *sleeper(void *arg)
{
	struct sleeper_args *a = arg;
	struct epoll_event ev[4];
	int ms = a->timeout_ms ? a->timeout_ms : 10000;
	int n = epoll_wait(a->ep, ev, 4, ms);

	snprintf(a->line, sizeof(a->line), "  thread's epoll_wait(max 4, %d ms) = %d%s%s\n", ms, n,
		 n == 1 ? " " : "", n == 1 ? fd_names[ev[0].data.fd] : "");
	return NULL;
}

/* poll-swap's other thread: the accepted socket's first I/O, then the client's bytes. */
struct swap_args {
	int c, s;
	uint64_t first_io_ms, put_ms; /* when the first I/O returned, when the bytes went */
};

static void *swap_first_io(void *arg)
{
	struct swap_args *a = arg;
	char junk;

	/* Under the shim: takes the HELLO and upgrades (server-pair delays the fd's change). */
	if (recv(a->s, &junk, 1, MSG_DONTWAIT) >= 0)
		prog_die("a byte from nowhere");
	a->first_io_ms = now_ms();
	usleep(300000);
	a->put_ms = now_ms();
	put(a->c, 10);
	return NULL;
}

/*
 * The application's own poll on an accepted socket S begins while another
 * thread's first I/O on it answers the client's HELLO (under the shim, run
 * with SRQSHIM_TEST_DELAYS=server-pair=300: the poll begins after the HELLO
 * was taken, before the upgrade puts another file on the fd); the client's
 * bytes after the upgrade must end it. mixed: the poll also watches an
 * upgraded pair's end (the shim answers the call itself then).
 */
static void poll_swap(bool mixed)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)wc_port)};
	struct swap_args a;
	struct pollfd p[2];
	uint64_t poll_ms, end_ms;
	pthread_t th;

	if (mixed) {
		pair_open();
		name_fd(pair_s, "T");
	}
	inet_pton(AF_INET, wc_addr, &sa.sin_addr);
	a.c = socket(AF_INET, SOCK_STREAM, 0);
	if (a.c < 0 || connect(a.c, (struct sockaddr *)&sa, sizeof(sa)) != 0)
		prog_die("connect");
	if ((a.s = accept(wc_listener, NULL, NULL)) < 0)
		prog_die("accept");
	name_fd(a.c, "C");
	name_fd(a.s, "S");
	usleep(300000); /* the HELLO is in */
	pthread_create(&th, NULL, swap_first_io, &a);
	usleep(100000);
	p[0] = (struct pollfd){.fd = a.s, .events = POLLIN};
	p[1] = (struct pollfd){.fd = mixed ? pair_s : -1, .events = POLLIN};
	poll_ms = now_ms();
	pwait(p, 2, LONG_MS);
	end_ms = now_ms();
	pthread_join(th, NULL);
	/* Under the delay, the window must have been hit: not in the transcript (TCP has none). */
	if (getenv("SRQSHIM_TEST_DELAYS") && (poll_ms >= a.first_io_ms || end_ms < a.put_ms))
		prog_die("poll-swap: the poll did not begin before the upgrade, or ended early");
	take_status(); /* (when run alone) */
	take_all("S", a.s, 10);
	close(a.c);
	close(a.s);
	if (mixed)
		pair_close();
}

static void sc_poll_swap(void)
{
	poll_swap(false);
}

static void sc_poll_swap_mixed(void)
{
	poll_swap(true);
}

/* One instance waited on by another thread: a new event reaches it asleep. */
static void sc_threads(void)
{
	struct sleeper_args a = {0};
	pthread_t th;

	pair_open();
	a.ep = epoll_create1(0);
	ectl(a.ep, EPOLL_CTL_ADD, pair_s, EPOLLIN);
	pthread_create(&th, NULL, sleeper, &a);
	usleep(300000); /* let it sleep */
	put(pair_c, 10);
	pthread_join(th, NULL);
	out("%s", a.line);
	take_all("S", pair_s, 10);
	close(a.ep);
	pair_close();
}

/*
 * dup-close-epoll when the process has no fd to spare: an instance made
 * with the last free number (under the shim: none left for its private
 * duplicate), a dup of it, the number closed and taken by a new instance
 * with a ready pipe of its own; the wait through the dup must not see it.
 */
static void sc_epoll_no_fd(void)
{
	int fill[4096], n = 0, p1[2], p2[2], ep, ep2, ep3;
	struct rlimit old, low;

	if (pipe(p1) != 0 || pipe(p2) != 0 || getrlimit(RLIMIT_NOFILE, &old) != 0)
		prog_die("pipe");
	name_fd(p1[0], "P1");
	name_fd(p2[0], "P2");
	/* The fds in use now, and room for this scenario's own. */
	low = old;
	low.rlim_cur = 3;
	while (n < 4096 && (fill[n] = dup(p1[1])) >= 0)
		low.rlim_cur = (rlim_t)fill[n++] + 1;
	for (int i = 0; i < n; i++)
		close(fill[i]);
	n = 0;
	if (setrlimit(RLIMIT_NOFILE, &low) != 0)
		prog_die("setrlimit");
	while (n < 4096 && (fill[n] = dup(p1[1])) >= 0)
		n++;
	close(fill[--n]);
	ep = epoll_create1(0);
	close(fill[--n]);
	ep2 = dup(ep);
	out("  epoll_create1 and dup with the last free fds: %s\n",
	    ep >= 0 && ep2 >= 0 ? "yes" : "no");
	ectl(ep, EPOLL_CTL_ADD, p1[0], EPOLLIN);
	close(ep);
	ep3 = epoll_create1(0);
	ectl(ep3, EPOLL_CTL_ADD, p2[0], EPOLLIN);
	if (write(p2[1], "x", 1) != 1 || write(p1[1], "y", 1) != 1)
		prog_die("write");
	ewait(ep2, 8, LONG_MS);
	ewait(ep3, 8, LONG_MS);
	close(ep2);
	close(ep3);
	while (n > 0)
		close(fill[--n]);
	setrlimit(RLIMIT_NOFILE, &old);
	close(p1[0]);
	close(p1[1]);
	close(p2[0]);
	close(p2[1]);
}

/* A non-blocking connect to the listener, named C; not ended yet, as a rule. */
static int connect_nb(void)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)wc_port)};
	int c;

	inet_pton(AF_INET, wc_addr, &sa.sin_addr);
	c = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	if (c < 0 || (connect(c, (struct sockaddr *)&sa, sizeof(sa)) != 0 && errno != EINPROGRESS))
		prog_die("connect");
	name_fd(c, "C");
	return c;
}

/*
 * The number an instance was made on is closed while a dup of it lives,
 * and a new instance takes that number: the dup goes on as the instance
 * (a wait with nothing ready sleeps its timeout; a registration made
 * before the connection upgraded still reports), and the new instance
 * has nothing of it.
 */
static void sc_dup_close_epoll(void)
{
	int ep = epoll_create1(0), ep2, ep3, c, s;
	char junk;

	c = connect_nb();
	ectl(ep, EPOLL_CTL_ADD, c, EPOLLIN); /* before the upgrade: in the kernel set */
	ep2 = dup(ep);
	close(ep);
	ep3 = epoll_create1(0); /* the lowest number: ep's */
	out("  the new instance took the closed number: %s\n", ep3 == ep ? "yes" : "no");
	if ((s = accept(wc_listener, NULL, NULL)) < 0)
		prog_die("accept");
	name_fd(s, "S");
	if (recv(s, &junk, 1, MSG_DONTWAIT) >= 0) /* the server's first I/O: it answers now */
		prog_die("a byte from nowhere");
	usleep(600000); /* the connection upgrades meanwhile */
	ewait(ep2, 8, SHORT_MS);
	put(s, 10);
	ewait(ep2, 8, LONG_MS);
	ewait(ep3, 8, SHORT_MS);
	take_all("C", c, 10);
	ectl(ep2, EPOLL_CTL_ADD, s, EPOLLIN); /* an upgraded one, after the close */
	put(c, 10);
	ewait(ep2, 8, LONG_MS);
	take_all("S", s, 10);
	ewait(ep2, 8, SHORT_MS);
	ewait(ep3, 8, SHORT_MS);
	close(ep3);
	close(ep2);
	close(c);
	close(s);
}

/*
 * A thread asleep in epoll_wait for input on a connection whose
 * non-blocking connect has not ended: under the shim, negotiating (the
 * kernel answers for its socketpair end), then upgraded in the background
 * while the thread sleeps, with nothing to read. The peer's bytes after
 * that must wake it.
 */
static void sc_upgrade_asleep(void)
{
	struct sleeper_args a = {0};
	pthread_t th;
	int c, s;

	c = connect_nb();
	a.ep = epoll_create1(0);
	ectl(a.ep, EPOLL_CTL_ADD, c, EPOLLIN);
	pthread_create(&th, NULL, sleeper, &a);
	if ((s = accept(wc_listener, NULL, NULL)) < 0)
		prog_die("accept");
	name_fd(s, "S");
	usleep(600000); /* it sleeps; the negotiation ends meanwhile */
	put(s, 10);
	pthread_join(th, NULL);
	out("%s", a.line);
	take_all("C", c, 10);
	close(a.ep);
	close(c);
	close(s);
}

/*
 * Two threads asleep on one instance while its only connection's connect
 * has not ended; the connection upgrades in the background; the first
 * thread's wait ends before the peer writes, the second's gets it.
 */
static void sc_two_asleep(void)
{
	struct sleeper_args a = {.timeout_ms = 1200}, b = {.timeout_ms = 3000};
	pthread_t ta, tb;
	char junk;
	int c, s;

	c = connect_nb();
	a.ep = b.ep = epoll_create1(0);
	ectl(a.ep, EPOLL_CTL_ADD, c, EPOLLIN);
	pthread_create(&ta, NULL, sleeper, &a);
	usleep(300000);
	pthread_create(&tb, NULL, sleeper, &b);
	usleep(350000);
	if ((s = accept(wc_listener, NULL, NULL)) < 0)
		prog_die("accept");
	name_fd(s, "S");
	/* The server's first I/O (EAGAIN): under the shim it answers the HELLO now. */
	if (recv(s, &junk, 1, MSG_DONTWAIT) >= 0)
		prog_die("a byte from nowhere");
	usleep(1150000); /* the first thread's wait ends meanwhile */
	put(s, 10);
	pthread_join(ta, NULL);
	pthread_join(tb, NULL);
	out("%s%s", a.line, b.line);
	take_all("C", c, 10);
	close(a.ep);
	close(c);
	close(s);
}

/* A thread asleep in poll on S, cancelled there (poll is a cancellation point). */
static void *poll_sleeper(void *arg)
{
	struct pollfd p = {.fd = pair_s, .events = POLLIN};

	(void)arg;
	poll(&p, 1, 10000);
	return NULL;
}

/* A poller cancelled asleep: the next change wakes the living only, and poll goes on working. */
static void sc_cancel(void)
{
	struct pollfd p = {.fd = -1, .events = POLLIN};
	pthread_t th;
	void *res;

	pair_open();
	pthread_create(&th, NULL, poll_sleeper, NULL);
	usleep(300000); /* let it sleep */
	pthread_cancel(th);
	pthread_join(th, &res);
	out("  thread %s\n", res == PTHREAD_CANCELED ? "cancelled" : "not cancelled");
	put(pair_c, 10);
	p.fd = pair_s;
	pwait(&p, 1, LONG_MS);
	take_all("S", pair_s, 10);
	pair_close();
}

/* fork: the child ends at once; the parent's instance goes on as before. */
static void sc_fork(void)
{
	int ep = epoll_create1(0), st;
	pid_t pid;

	pair_open();
	ectl(ep, EPOLL_CTL_ADD, pair_s, EPOLLIN);
	pid = fork();
	if (pid == 0)
		_exit(0);
	waitpid(pid, &st, 0);
	put(pair_c, 10);
	ewait(ep, 8, LONG_MS);
	take_all("S", pair_s, 10);
	ewait(ep, 8, SHORT_MS);
	close(ep);
	pair_close();
}

static const struct {
	const char *name;
	void (*run)(void);
} scenarios[] = {
	{"level", sc_level},
	{"edge", sc_edge},
	{"edge-out", sc_edge_out},
	{"oneshot", sc_oneshot},
	{"mod", sc_mod},
	{"shutdown", sc_shutdown},
	{"shut-rd", sc_shut_rd},
	{"peer-close", sc_peer_close},
	{"rotation", sc_rotation},
	{"two-instances", sc_two_instances},
	{"close-dup", sc_close_dup},
	{"dup-epoll", sc_dup_epoll},
	{"dup-close-epoll", sc_dup_close_epoll},
	{"epoll-no-fd", sc_epoll_no_fd},
	{"timeout", sc_timeout},
	{"signals", sc_signals},
	{"poll", sc_poll},
	{"poll-swap", sc_poll_swap},
	{"poll-swap-mixed", sc_poll_swap_mixed},
	{"select", sc_select},
	{"threads", sc_threads},
	{"upgrade-asleep", sc_upgrade_asleep},
	{"two-asleep", sc_two_asleep},
	{"cancel", sc_cancel},
	{"fork", sc_fork},
};

int main(int argc, char **argv)
{
	struct sockaddr_in sa = {.sin_family = AF_INET};
	int one = 1;

	if (argc < 3) {
		fprintf(stderr, "usage: wait_check ADDR PORT [SCENARIO...]\n");
		return 2;
	}
	wc_addr = argv[1];
	wc_port = atoi(argv[2]);
	sa.sin_port = htons((uint16_t)wc_port);
	inet_pton(AF_INET, wc_addr, &sa.sin_addr);
	wc_listener = socket(AF_INET, SOCK_STREAM, 0);
	setsockopt(wc_listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (wc_listener < 0 || bind(wc_listener, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
	    listen(wc_listener, 16) != 0)
		prog_die("listen");
	for (size_t i = 0; i < sizeof(scenarios) / sizeof(scenarios[0]); i++) {
		bool want = argc == 3;

		for (int j = 3; j < argc; j++)
			want |= strcmp(argv[j], scenarios[i].name) == 0;
		if (!want)
			continue;
		out("%s\n", scenarios[i].name);
		scenarios[i].run();
	}
	close(wc_listener);
	return 0;
}
