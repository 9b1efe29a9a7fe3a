/*
 * idle_echo: the program of the idle-connection benchmark (tools/membench).
 *
 *   idle_echo server ADDR PORT
 *       echoes every connection (epoll, non-blocking) until killed.
 *   idle_echo client ADDR PORT N SENDERS ROUNDS
 *       opens N connections and prints "ready N" with its RSS; waits for a
 *       line on stdin; then the first SENDERS connections take turns at
 *       64-byte echoes, 1 ms of sleep after each, ROUNDS each; prints
 *       "latency p50 P p99 Q" in microseconds and exits.
 *   idle_echo setup ADDR PORT N
 *       opens N connections one after the other, each with one 64-byte
 *       echo (so that a shimmed one is decided and upgraded), keeps them
 *       open, and prints "setup N seconds S"; then closes them all and
 *       prints "closed N seconds S" (the setup-rate benchmark, tools/bench).
 *   idle_echo churn ADDR PORT N
 *       N cycles of connect, one echo, close; after cycle 10 and after the
 *       last, waits 2 s (what closes in the background ends), prints
 *       "mark CYCLE fds F threads T rss_kib R" of its own and waits for a
 *       line on stdin (the caller looks at the server meanwhile); prints
 *       "done N seconds S longest L": S without those pauses, L the
 *       longest cycle (tests/e2e/churn.sh).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tools/prog.h"

__attribute__((noreturn)) static void run_server(const char *addr, int port)
{
	struct sockaddr_in sin = prog_address(addr, port);
	struct epoll_event ev = {.events = EPOLLIN}, evs[64];
	int l = socket(AF_INET, SOCK_STREAM, 0), one = 1, ep = epoll_create1(0);
	char buf[4096];

	if (l < 0 || ep < 0)
		prog_die("socket");
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(l, (struct sockaddr *)&sin, sizeof(sin)) < 0 || listen(l, 4096) < 0)
		prog_die("listen");
	ev.data.fd = l;
	epoll_ctl(ep, EPOLL_CTL_ADD, l, &ev);
	for (;;) {
		int k = epoll_wait(ep, evs, 64, -1);

		for (int i = 0; i < k; i++) {
			int fd = evs[i].data.fd;

			if (fd == l) {
				int c = accept4(l, NULL, NULL, SOCK_NONBLOCK);

				if (c < 0)
					continue;
				ev.data.fd = c;
				epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev);
				continue;
			}
			ssize_t n = read(fd, buf, sizeof(buf));
			if (n > 0) {
				/* Requests are 64 bytes: the answer fits the socket at once. */
				if (write(fd, buf, (size_t)n) != n)
					prog_die("write");
			} else if (n == 0 || errno != EAGAIN) {
				epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
				close(fd);
			}
		}
	}
}

static long rss_kib(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long v = -1;

	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "VmRSS: %ld", &v) == 1)
			break;
	if (f)
		fclose(f);
	return v;
}

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* One 64-byte echo on fd (blocking). */
static void echo_once(int fd)
{
	char req[64], resp[64];
	size_t got = 0;

	memset(req, 'x', sizeof(req));
	if (write(fd, req, sizeof(req)) != (ssize_t)sizeof(req))
		prog_die("write");
	while (got < sizeof(resp)) {
		ssize_t m = read(fd, resp + got, sizeof(resp) - got);

		if (m <= 0)
			prog_die("read");
		got += (size_t)m;
	}
}

static int run_setup(const char *addr, int port, int n)
{
	struct sockaddr_in sin = prog_address(addr, port);
	int *fds = calloc((size_t)n, sizeof(*fds));
	double t0 = now_us(), t1;

	if (!fds)
		prog_die("calloc");
	for (int i = 0; i < n; i++) {
		fds[i] = socket(AF_INET, SOCK_STREAM, 0);
		if (fds[i] < 0 || connect(fds[i], (struct sockaddr *)&sin, sizeof(sin)) < 0)
			prog_die("connect");
		echo_once(fds[i]);
	}
	t1 = now_us();
	printf("setup %d seconds %.3f\n", n, (t1 - t0) / 1e6);
	for (int i = 0; i < n; i++)
		close(fds[i]);
	printf("closed %d seconds %.3f\n", n, (now_us() - t1) / 1e6);
	return 0;
}

/* How many entries a /proc/self directory has. */
static int count_dir(const char *path)
{
	char cmd[128];
	int n = -1;
	FILE *f;

	snprintf(cmd, sizeof(cmd), "ls %s | wc -l", path);
	f = popen(cmd, "r");
	if (f && fscanf(f, "%d", &n) != 1)
		n = -1;
	if (f)
		pclose(f);
	return n;
}

static void churn_mark(int cycle)
{
	char line[16];
	struct timespec settle = {2, 0};
	char fdpath[64], taskpath[64];

	nanosleep(&settle, NULL);
	snprintf(fdpath, sizeof(fdpath), "/proc/%d/fd", (int)getpid());
	snprintf(taskpath, sizeof(taskpath), "/proc/%d/task", (int)getpid());
	printf("mark %d fds %d threads %d rss_kib %ld\n", cycle, count_dir(fdpath),
	       count_dir(taskpath), rss_kib());
	if (!fgets(line, sizeof(line), stdin))
		exit(2);
}

static int run_churn(const char *addr, int port, int n)
{
	struct sockaddr_in sin = prog_address(addr, port);
	double t0 = now_us(), paused = 0, longest = 0;

	for (int i = 1; i <= n; i++) {
		double c0 = now_us();
		int fd = socket(AF_INET, SOCK_STREAM, 0);

		if (fd < 0 || connect(fd, (struct sockaddr *)&sin, sizeof(sin)) < 0)
			prog_die("connect");
		echo_once(fd);
		if (close(fd) != 0)
			prog_die("close");
		if (now_us() - c0 > longest)
			longest = now_us() - c0;
		if (i == 10 || i == n) {
			double m0 = now_us();

			churn_mark(i);
			paused += now_us() - m0;
		}
		if (i % 10 == 0)
			printf("at %d seconds %.3f\n", i, (now_us() - t0 - paused) / 1e6);
	}
	printf("done %d seconds %.3f longest %.3f\n", n, (now_us() - t0 - paused) / 1e6,
	       longest / 1e6);
	return 0;
}

static int run_client(const char *addr, int port, int n, int senders, int rounds)
{
	struct sockaddr_in sin = prog_address(addr, port);
	int *fds = calloc((size_t)n, sizeof(*fds));
	double *lat = calloc((size_t)senders * (size_t)rounds, sizeof(*lat));
	struct timespec ms = {0, 1000000};
	char line[16];
	size_t k = 0;

	if (!fds || !lat)
		prog_die("calloc");
	for (int i = 0; i < n; i++) {
		fds[i] = socket(AF_INET, SOCK_STREAM, 0);
		if (fds[i] < 0 || connect(fds[i], (struct sockaddr *)&sin, sizeof(sin)) < 0)
			prog_die("connect");
	}
	printf("ready %d rss_kib %ld\n", n, rss_kib());
	fflush(stdout);
	if (!fgets(line, sizeof(line), stdin))
		return 2;
	for (int r = 0; r < rounds; r++) {
		for (int s = 0; s < senders && s < n; s++) {
			double t0 = now_us();

			echo_once(fds[s]);
			lat[k++] = now_us() - t0;
			nanosleep(&ms, NULL);
		}
	}
	qsort(lat, k, sizeof(*lat), cmp_double);
	printf("latency p50 %.1f p99 %.1f samples %zu\n", lat[k / 2], lat[k * 99 / 100], k);
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 4 && strcmp(argv[1], "server") == 0)
		run_server(argv[2], atoi(argv[3]));
	if (argc == 7 && strcmp(argv[1], "client") == 0)
		return run_client(argv[2], atoi(argv[3]), atoi(argv[4]), atoi(argv[5]),
				  atoi(argv[6]));
	if (argc == 5 && strcmp(argv[1], "setup") == 0)
		return run_setup(argv[2], atoi(argv[3]), atoi(argv[4]));
	if (argc == 5 && strcmp(argv[1], "churn") == 0)
		return run_churn(argv[2], atoi(argv[3]), atoi(argv[4]));
	fprintf(stderr, "usage: idle_echo server ADDR PORT | client ADDR PORT N SENDERS ROUNDS | "
			"setup ADDR PORT N | churn ADDR PORT N\n");
	return 2;
}
