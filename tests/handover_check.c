/*
 * handover_check: a connection that changes hands mid-stream, as servers
 * hand theirs to other code: an exec'd program (CGI; inetd, which forks
 * first and execs in the child, its copy closed or still open, or after
 * the server echoed all up to the client's end of stream and waited for
 * it through a nested epoll (inetd-shut: the handler then reads the end
 * from TCP and exits); posix_spawn
 * with the connection dup2'd onto the program's stdin and stdout; io_uring
 * (the server's own reads and writes go through a ring); or a child
 * that only holds it, the server echoing the rest), another
 * process (SCM_RIGHTS, by sendmsg or sendmmsg), stdio; or dprintf. The
 * client streams a pseudo-random pattern from a writer thread while a
 * reader thread checks the echo; the server echoes the first quarter
 * itself, then hands the connection over and the new owner echoes the
 * rest. Bytes are in flight both ways at the moment of the handover. Also
 * urgent data: TCP's MSG_OOB beside the stream.
 *
 *   handover_check client ADDR PORT BYTES
 *   handover_check server ADDR PORT BYTES exec|inetd|inetd-open|inetd-shut|spawn|uring|fork|
 *                  pass|passm|
 *                  stdio|dprintf
 *   handover_check oob-client ADDR PORT
 *   handover_check oob-server ADDR PORT
 *   handover_check idle-client ADDR PORT BYTES
 *   handover_check idle-server ADDR PORT BYTES
 *
 * idle-*: the client writes BYTES, shuts its side and sleeps 3 s outside any
 * socket call; the server reads one byte (its first I/O decides the upgrade),
 * prints "ready" and sleeps 1 s (the caller moves the connection back to
 * TCP meanwhile), then reads and checks the rest and answers "ok BYTES". The client's side of the
 * move is its shim's alone; with BYTES beyond the client's credits its end of stream still waits
 * behind unposted bytes when the move comes.
 *
 * Exit status 0: every byte (and the urgent byte) where it belongs.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <linux/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tools/prog.h"

static const char *self;

static unsigned long long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (unsigned long long)ts.tv_sec * 1000 + (unsigned long long)ts.tv_nsec / 1000000;
}

static uint8_t pattern(uint64_t i)
{
	uint64_t x = (i >> 3) * 0x9e3779b97f4a7c15ull;

	return (uint8_t)((x >> 29) ^ (x >> 41) ^ i);
}

static void fail(const char *what)
{
	fprintf(stderr, "handover_check: %s\n", what);
	exit(1);
}

/* ---- client ---- */

struct client {
	int fd;
	uint64_t bytes;
};

static void *client_writer(void *arg)
{
	struct client *c = arg;
	uint8_t buf[9000];
	uint64_t off = 0;
	unsigned seed = 7;

	while (off < c->bytes) {
		size_t n = 1 + (size_t)(rand_r(&seed) % sizeof(buf));

		if (n > c->bytes - off)
			n = (size_t)(c->bytes - off);
		for (size_t i = 0; i < n; i++)
			buf[i] = pattern(off + i);
		ssize_t w = write(c->fd, buf, n);

		if (w <= 0)
			prog_die("write");
		off += (uint64_t)w;
	}
	shutdown(c->fd, SHUT_WR);
	return NULL;
}

static int run_client(const char *addr, int port, uint64_t bytes)
{
	struct sockaddr_in sa = prog_address(addr, port);
	struct client c = {.bytes = bytes};
	struct tcp_info ti;
	socklen_t len = sizeof(ti);
	uint8_t buf[65536];
	uint64_t off = 0;
	pthread_t t;

	c.fd = socket(AF_INET, SOCK_STREAM, 0);
	if (c.fd < 0 || connect(c.fd, (struct sockaddr *)&sa, sizeof(sa)) != 0)
		prog_die("connect");
	pthread_create(&t, NULL, client_writer, &c);
	for (;;) {
		ssize_t n = read(c.fd, buf, sizeof(buf));

		if (n < 0)
			prog_die("read");
		if (n == 0) {
			printf("handover_check: client: eof_ms=%llu\n", now_ms());
			break;
		}
		for (ssize_t i = 0; i < n; i++)
			if (buf[i] != pattern(off + (uint64_t)i)) {
				fprintf(stderr, "handover_check: echo byte %llu differs\n",
					(unsigned long long)(off + (uint64_t)i));
				exit(1);
			}
		off += (uint64_t)n;
	}
	pthread_join(t, NULL);
	if (off != bytes) {
		fprintf(stderr, "handover_check: %llu of %llu bytes echoed\n",
			(unsigned long long)off, (unsigned long long)bytes);
		return 1;
	}
	memset(&ti, 0, sizeof(ti));
	getsockopt(c.fd, IPPROTO_TCP, TCP_INFO, &ti, &len);
	printf("handover_check: client: %llu bytes echoed and checked; tcp_bytes_received=%llu\n",
	       (unsigned long long)bytes, (unsigned long long)ti.tcpi_bytes_received);
	return 0;
}

/* ---- server ---- */

/* Echoes up to want bytes from in to out (to the end of the stream with want 0); returns the
 * count. */
static uint64_t echo_in_out(int in, int out, uint64_t want)
{
	uint8_t buf[4096];
	uint64_t done = 0;

	while (!want || done < want) {
		size_t ask =
			want && want - done < sizeof(buf) ? (size_t)(want - done) : sizeof(buf);
		ssize_t n = read(in, buf, ask);

		if (n < 0)
			prog_die("read");
		if (n == 0)
			break;
		for (ssize_t k = 0; k < n;) {
			ssize_t w = write(out, buf + k, (size_t)(n - k));

			if (w <= 0)
				prog_die("write");
			k += w;
		}
		done += (uint64_t)n;
	}
	return done;
}

static uint64_t echo_fd(int fd, uint64_t want)
{
	return echo_in_out(fd, fd, want);
}

/*
 * Waits for fd's end through an epoll instance nested in another, which
 * the kernel answers: under the shim the connection's readiness then
 * shows on the application's end of its socketpair (docs/design.md).
 */
static void wait_nested(int fd)
{
	struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP}, out;
	int inner = epoll_create1(0), outer = epoll_create1(0);

	if (inner < 0 || outer < 0 || epoll_ctl(inner, EPOLL_CTL_ADD, fd, &ev) != 0)
		prog_die("epoll");
	ev.events = EPOLLIN;
	if (epoll_ctl(outer, EPOLL_CTL_ADD, inner, &ev) != 0 ||
	    epoll_wait(outer, &out, 1, 5000) != 1)
		fail("the end of stream does not show through a nested epoll");
	close(outer);
	close(inner);
}

/*
 * Forks a child that goes on only once the parent opens the gate (*gate:
 * the parent's end of a pipe). Returns as fork does.
 */
static pid_t fork_gated(int *gate)
{
	int go[2];
	pid_t pid;
	char k;

	if (pipe(go) != 0)
		prog_die("pipe");
	pid = fork();
	if (pid < 0)
		prog_die("fork");
	if (pid == 0) {
		close(go[1]);
		if (read(go[0], &k, 1) != 1)
			_exit(3);
		close(go[0]);
		return 0;
	}
	close(go[0]);
	*gate = go[1];
	return pid;
}

static void gate_open(int gate)
{
	if (write(gate, "g", 1) != 1)
		prog_die("write");
	close(gate);
}

/*
 * inetd: a child puts the connection on its stdin and stdout and execs the
 * handler; the parent closes its copy before the child's exec (inetd), or
 * keeps it open until the handler is done (inetd-open). A pipe orders the
 * two.
 */
static int serve_inetd(int fd, bool open_late)
{
	int gate, status;
	pid_t pid = fork_gated(&gate);

	if (pid == 0) {
		if (dup2(fd, 0) != 0 || dup2(fd, 1) != 1)
			_exit(4);
		close(fd);
		execl(self, "handover_check", "echo-fds", "0", "1", (char *)NULL);
		_exit(5);
	}
	if (!open_late)
		close(fd);
	gate_open(gate);
	if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status)) {
		fprintf(stderr, "handover_check: handler status %#x\n", status);
		fail("the exec'd handler failed");
	}
	if (open_late)
		close(fd);
	return 0;
}

/* Sends n bytes of buf through ring. */
static void ring_send_all(struct io_uring *ring, int fd, const uint8_t *buf, size_t n)
{
	for (size_t k = 0; k < n;) {
		struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
		struct io_uring_cqe *cqe;
		int res;

		io_uring_prep_send(sqe, fd, buf + k, n - k, 0);
		if (io_uring_submit_and_wait(ring, 1) < 0 || io_uring_wait_cqe(ring, &cqe) != 0)
			fail("io_uring send");
		res = cqe->res;
		io_uring_cqe_seen(ring, cqe);
		if (res <= 0)
			fail("io_uring send failed");
		k += (size_t)res;
	}
}

/*
 * uring: the server goes on with io_uring (its reads and writes then go
 * past libc): recv and send through a ring echo the rest.
 */
static int serve_uring(int fd)
{
	struct io_uring ring;
	uint8_t buf[4096];

	if (io_uring_queue_init(8, &ring, 0) != 0)
		fail("io_uring_queue_init");
	for (;;) {
		struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
		struct io_uring_cqe *cqe;
		int res;

		io_uring_prep_recv(sqe, fd, buf, sizeof(buf), 0);
		if (io_uring_submit_and_wait(&ring, 1) < 0 || io_uring_wait_cqe(&ring, &cqe) != 0)
			fail("io_uring recv");
		res = cqe->res;
		io_uring_cqe_seen(&ring, cqe);
		if (res < 0)
			fail("io_uring recv failed");
		if (res == 0)
			break;
		ring_send_all(&ring, fd, buf, (size_t)res);
	}
	io_uring_queue_exit(&ring);
	close(fd);
	return 0;
}

/*
 * spawn: posix_spawn of the handler with the connection dup2'd onto its
 * stdin and stdout by the file actions (the fd itself close-on-exec, so
 * only the file actions hand it over); the server closes its copy.
 */
static int serve_spawn(int fd)
{
	char *argv[] = {"handover_check", "echo-fds", "0", "1", NULL};
	posix_spawn_file_actions_t fa;
	int status;
	pid_t pid;

	fcntl(fd, F_SETFD, FD_CLOEXEC);
	if (posix_spawn_file_actions_init(&fa) != 0 ||
	    posix_spawn_file_actions_adddup2(&fa, fd, 0) != 0 ||
	    posix_spawn_file_actions_adddup2(&fa, fd, 1) != 0)
		prog_die("posix_spawn_file_actions");
	if ((errno = posix_spawn(&pid, self, &fa, NULL, argv, environ)) != 0)
		prog_die("posix_spawn");
	posix_spawn_file_actions_destroy(&fa);
	close(fd);
	if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status))
		fail("the spawned handler failed");
	return 0;
}

/*
 * fork: a child holds the connection without using it and exits 1.5 s
 * after the server, which echoes the rest itself, has closed its copy: the
 * end of stream comes with the child's exit (the client's eof_ms is not
 * before child_exit_ms), as TCP's FIN does, while the server still lives
 * (it stays 3 s longer).
 */
static int serve_fork(int fd, uint64_t rest)
{
	int gate, status;
	pid_t pid = fork_gated(&gate);

	if (pid == 0) {
		usleep(1500000);
		_exit(0);
	}
	if (echo_fd(fd, 0) != rest)
		fail("the stream ended early");
	close(fd);
	gate_open(gate);
	if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status))
		fail("the child failed");
	printf("handover_check: child_exit_ms=%llu\n", (unsigned long long)now_ms());
	fflush(stdout);
	/* Still here when the client sees its end of stream (the caller checks). */
	sleep(3);
	return 0;
}

/* stdio's own reads and writes (glibc calls the kernel itself, past the shim). */
static uint64_t echo_stdio(int fd)
{
	FILE *in = fdopen(dup(fd), "r"), *out = fdopen(fd, "w");
	char buf[4096];
	uint64_t done = 0;
	size_t n;

	if (!in || !out)
		prog_die("fdopen");
	setvbuf(in, NULL, _IONBF, 0);
	while ((n = fread(buf, 1, sizeof(buf), in)) > 0) {
		if (fwrite(buf, 1, n, out) != n || fflush(out) != 0)
			prog_die("fwrite");
		done += n;
	}
	fclose(in);
	fclose(out);
	return done;
}

/* dprintf's writes (glibc's own, past the shim unless it takes dprintf itself). */
static uint64_t echo_dprintf(int fd)
{
	char buf[4096];
	uint64_t done = 0;
	ssize_t n;

	while ((n = read(fd, buf, sizeof(buf))) > 0) {
		for (ssize_t i = 0; i < n;) {
			/* A run without NUL as a string, a NUL as %c. */
			int len = (int)strnlen(buf + i, (size_t)(n - i));
			int w = len ? dprintf(fd, "%.*s", len, buf + i) : dprintf(fd, "%c", 0);

			if (w != (len ? len : 1))
				prog_die("dprintf");
			i += w;
		}
		done += (uint64_t)n;
	}
	if (n < 0)
		prog_die("read");
	return done;
}

/* A one-byte message with room for one fd (SCM_RIGHTS). */
struct fd_msg {
	char one;
	union {
		struct cmsghdr h;
		char space[CMSG_SPACE(sizeof(int))];
	} u;
	struct iovec v;
	struct msghdr m;
};

static void fd_msg_init(struct fd_msg *f)
{
	f->one = 'f';
	f->v = (struct iovec){&f->one, 1};
	f->m = (struct msghdr){.msg_iov = &f->v,
			       .msg_iovlen = 1,
			       .msg_control = &f->u,
			       .msg_controllen = sizeof(f->u)};
}

static int passed_fd(int unix_fd)
{
	struct fd_msg f;
	struct cmsghdr *c;
	int fd;

	fd_msg_init(&f);
	if (recvmsg(unix_fd, &f.m, 0) != 1 || !(c = CMSG_FIRSTHDR(&f.m)) ||
	    c->cmsg_type != SCM_RIGHTS)
		fail("no fd passed");
	memcpy(&fd, CMSG_DATA(c), sizeof(int));
	return fd;
}

/* Passes fd with sendmsg, or with sendmmsg (mm). */
static void pass_fd(int unix_fd, int fd, bool mm)
{
	struct fd_msg f;
	struct cmsghdr *c;

	fd_msg_init(&f);
	c = CMSG_FIRSTHDR(&f.m);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &fd, sizeof(int));
	if (mm) {
		struct mmsghdr v = {.msg_hdr = f.m};

		if (sendmmsg(unix_fd, &v, 1, 0) != 1 || v.msg_len != 1)
			prog_die("sendmmsg");
	} else if (sendmsg(unix_fd, &f.m, 0) != 1) {
		prog_die("sendmsg");
	}
}

static int listen_on(const char *addr, int port)
{
	struct sockaddr_in sa = prog_address(addr, port);
	int one = 1, l = socket(AF_INET, SOCK_STREAM, 0);

	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (l < 0 || bind(l, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(l, 4) != 0)
		prog_die("listen");
	printf("handover_check: listening\n");
	fflush(stdout);
	return l;
}

static int run_server(const char *addr, int port, uint64_t bytes, const char *how)
{
	int sp[2] = {-1, -1}, l, fd, status;
	pid_t child = -1;

	/* The process the connection goes to exists before the connection does. */
	if (strcmp(how, "pass") == 0 || strcmp(how, "passm") == 0) {
		if (socketpair(AF_UNIX, SOCK_STREAM, 0, sp) != 0)
			prog_die("socketpair");
		child = fork();
		if (child == 0) {
			close(sp[0]);
			fd = passed_fd(sp[1]);
			echo_fd(fd, 0);
			_exit(0);
		}
		close(sp[1]);
	}
	l = listen_on(addr, port);
	fd = accept(l, NULL, NULL);
	if (fd < 0)
		prog_die("accept");
	close(l);
	if (echo_fd(fd, bytes / 4) != bytes / 4)
		fail("the stream ended early");
	if (strcmp(how, "exec") == 0) {
		char fdbuf[16];

		snprintf(fdbuf, sizeof(fdbuf), "%d", fd);
		fcntl(fd, F_SETFD, 0); /* inherited by the new image */
		execl(self, "handover_check", "echo-fd", fdbuf, (char *)NULL);
		prog_die("execl");
	}
	if (strcmp(how, "spawn") == 0)
		return serve_spawn(fd);
	if (strcmp(how, "uring") == 0)
		return serve_uring(fd);
	if (strcmp(how, "fork") == 0)
		return serve_fork(fd, bytes - bytes / 4);
	/* inetd-shut: the parent reads to the client's end of stream before the fork. */
	if (strcmp(how, "inetd-shut") == 0) {
		if (echo_fd(fd, 0) != bytes - bytes / 4)
			fail("the stream ended early");
		wait_nested(fd);
	}
	if (strncmp(how, "inetd", 5) == 0)
		return serve_inetd(fd, strcmp(how, "inetd-open") == 0);
	if (strcmp(how, "stdio") == 0) {
		echo_stdio(fd);
		return 0;
	}
	if (strcmp(how, "dprintf") == 0) {
		echo_dprintf(fd);
		close(fd);
		return 0;
	}
	pass_fd(sp[0], fd, strcmp(how, "passm") == 0);
	close(fd);
	if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status))
		fail("the process the connection was passed to failed");
	return 0;
}

/* ---- urgent data ---- */

static int run_oob_client(const char *addr, int port)
{
	struct sockaddr_in sa = prog_address(addr, port);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	char k;

	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0)
		prog_die("connect");
	/* Data first, answered: the connection carries a stream before the urgent byte. */
	if (write(fd, "abc", 3) != 3 || read(fd, &k, 1) != 1)
		prog_die("first exchange");
	if (send(fd, "!", 1, MSG_OOB) != 1)
		prog_die("send MSG_OOB");
	if (write(fd, "def", 3) != 3)
		prog_die("write");
	shutdown(fd, SHUT_WR);
	if (read(fd, &k, 1) != 0)
		fail("no end of stream from the server");
	printf("handover_check: oob-client: sent abc, urgent !, def\n");
	return 0;
}

static int run_oob_server(const char *addr, int port)
{
	int l = listen_on(addr, port), fd = accept(l, NULL, NULL);
	char buf[16], urgent = 0, none;
	size_t got = 0;
	ssize_t n;

	if (fd < 0)
		prog_die("accept");
	/* No urgent data yet: TCP says EINVAL. */
	n = recv(fd, &none, 1, MSG_OOB);
	printf("handover_check: oob-server: before: %zd %s\n", n, n < 0 ? strerror(errno) : "");
	while (got < 3 && (n = read(fd, buf + got, 3 - got)) > 0)
		got += (size_t)n;
	if (write(fd, "k", 1) != 1)
		prog_die("write");
	/* The urgent byte shows as POLLPRI, and is read apart from the stream. */
	struct pollfd p = {.fd = fd, .events = POLLPRI};
	int pr = poll(&p, 1, 10000);

	printf("handover_check: oob-server: poll %d, POLLPRI %d\n", pr, !!(p.revents & POLLPRI));
	n = recv(fd, &urgent, 1, MSG_OOB);
	printf("handover_check: oob-server: urgent %zd '%c'\n", n, n == 1 ? urgent : '-');
	while ((n = read(fd, buf + got, sizeof(buf) - 1 - got)) > 0)
		got += (size_t)n;
	buf[got] = 0;
	printf("handover_check: oob-server: inline \"%s\"\n", buf);
	close(fd);
	return 0;
}

/* ---- a move while the client's application makes no socket call ---- */

static int run_idle_client(const char *addr, int port, uint64_t bytes)
{
	struct sockaddr_in sa = prog_address(addr, port);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	char answer[64];
	uint8_t *buf = malloc(bytes);
	size_t got = 0;
	ssize_t n;

	if (!buf || fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0)
		prog_die("connect");
	for (uint64_t i = 0; i < bytes; i++)
		buf[i] = pattern(i);
	if (write(fd, buf, bytes) != (ssize_t)bytes)
		prog_die("write");
	shutdown(fd, SHUT_WR);
	sleep(3);
	while ((n = read(fd, answer + got, sizeof(answer) - 1 - got)) > 0)
		got += (size_t)n;
	if (n < 0)
		prog_die("read");
	answer[got] = 0;
	printf("handover_check: idle-client: the server said \"%s\"\n", answer);
	return strncmp(answer, "ok ", 3) != 0;
}

static int run_idle_server(const char *addr, int port, uint64_t bytes)
{
	int l = listen_on(addr, port), fd = accept(l, NULL, NULL);
	uint8_t buf[4096];
	uint64_t off = 0;
	ssize_t n;

	if (fd < 0)
		prog_die("accept");
	if (read(fd, buf, 1) != 1 || buf[0] != pattern(0))
		fail("no first byte");
	off = 1;
	printf("handover_check: idle-server: ready\n");
	fflush(stdout);
	sleep(1);
	while ((n = read(fd, buf, sizeof(buf))) > 0) {
		for (ssize_t i = 0; i < n; i++)
			if (buf[i] != pattern(off + (uint64_t)i))
				fail("a byte differs");
		off += (uint64_t)n;
	}
	if (n < 0)
		prog_die("read");
	if (off != bytes)
		fail("bytes missing");
	n = snprintf((char *)buf, sizeof(buf), "ok %llu", (unsigned long long)off);
	if (write(fd, buf, (size_t)n) != n)
		prog_die("write");
	close(fd);
	return 0;
}

int main(int argc, char **argv)
{
	self = "/proc/self/exe";
	if (argc == 3 && strcmp(argv[1], "echo-fd") == 0) {
		echo_fd(atoi(argv[2]), 0);
		return 0;
	}
	if (argc == 4 && strcmp(argv[1], "echo-fds") == 0) {
		echo_in_out(atoi(argv[2]), atoi(argv[3]), 0);
		return 0;
	}
	if (argc == 5 && strcmp(argv[1], "client") == 0)
		return run_client(argv[2], atoi(argv[3]), strtoull(argv[4], NULL, 0));
	if (argc == 6 && strcmp(argv[1], "server") == 0)
		return run_server(argv[2], atoi(argv[3]), strtoull(argv[4], NULL, 0), argv[5]);
	if (argc == 4 && strcmp(argv[1], "oob-client") == 0)
		return run_oob_client(argv[2], atoi(argv[3]));
	if (argc == 4 && strcmp(argv[1], "oob-server") == 0)
		return run_oob_server(argv[2], atoi(argv[3]));
	if (argc == 5 && strcmp(argv[1], "idle-client") == 0)
		return run_idle_client(argv[2], atoi(argv[3]), strtoull(argv[4], NULL, 0));
	if (argc == 5 && strcmp(argv[1], "idle-server") == 0)
		return run_idle_server(argv[2], atoi(argv[3]), strtoull(argv[4], NULL, 0));
	fprintf(stderr, "usage: see the comment at the top of tests/handover_check.c\n");
	return 2;
}
