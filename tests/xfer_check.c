/*
 * xfer_check: sendfile, splice, sendmmsg and recvmmsg on a connection,
 * printing what each call returned, so that a run over kernel TCP and one
 * under the shim can be compared line by line (tests/e2e/xfer.sh).
 *
 *   xfer_check server ADDR PORT FILE
 *       writes a 4 MiB + 123 byte pattern to FILE; accepts one connection
 *       and sends: FILE with sendfile from its offset (blocking), a part
 *       of it with sendfile at an explicit offset, three messages with one
 *       sendmmsg, 50,000 bytes through a pipe with splice, then FILE again
 *       with sendfile on a non-blocking socket (EAGAIN: poll, go on); and
 *       the calls TCP refuses (sendfile from a pipe, splice with an offset
 *       on the socket, splice to a regular file). First, a 100-byte head:
 *       the queue ioctls and MSG_TRUNC (surface_server, surface_client). Prints each result, the
 *       file offsets, and the SHA-256 of the stream it meant to send.
 *   xfer_check client ADDR PORT
 *       reads the whole stream by turns with recvmmsg (MSG_WAITFORONE),
 *       splice into a pipe and read, until the end; prints the byte count
 *       and the SHA-256 of what it received.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <linux/sockios.h>
#include <unistd.h>

#include "sha256.h"
#include "tools/prog.h"

#define FILE_SIZE (4 * 1024 * 1024 + 123)

static unsigned char pattern(long i)
{
	return (unsigned char)(i * 7 + i / 251);
}

static int make_file(const char *path, struct sha256 *expect)
{
	static unsigned char buf[FILE_SIZE];
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);

	if (fd < 0)
		prog_die("open");
	for (long i = 0; i < FILE_SIZE; i++)
		buf[i] = pattern(i);
	if (write(fd, buf, FILE_SIZE) != FILE_SIZE)
		prog_die("write file");
	lseek(fd, 0, SEEK_SET);
	sha256_update(expect, buf, FILE_SIZE);
	return fd;
}

/* The file's bytes [from, from + n) into the expected stream. */
static void expect_file(struct sha256 *expect, long from, long n)
{
	unsigned char b[4096];

	while (n > 0) {
		long k = n < (long)sizeof(b) ? n : (long)sizeof(b);

		for (long i = 0; i < k; i++)
			b[i] = pattern(from + i);
		sha256_update(expect, b, (size_t)k);
		from += k;
		n -= k;
	}
}

static void refused_calls(int c, int file)
{
	int p[2];
	loff_t off = 0;
	ssize_t r;

	if (pipe(p) != 0)
		prog_die("pipe");
	if (write(p[1], "x", 1) != 1)
		prog_die("write pipe");
	r = sendfile(c, p[0], NULL, 1);
	printf("sendfile from a pipe: %zd %s\n", r, r < 0 ? strerror(errno) : "");
	r = splice(p[0], NULL, c, &off, 1, 0);
	printf("splice with an offset on the socket: %zd %s\n", r, r < 0 ? strerror(errno) : "");
	r = splice(p[0], &off, c, NULL, 1, 0);
	printf("splice with an offset on the pipe: %zd %s\n", r, r < 0 ? strerror(errno) : "");
	r = splice(c, NULL, file, &off, 1, SPLICE_F_NONBLOCK);
	printf("splice from the socket to a file: %zd %s\n", r, r < 0 ? strerror(errno) : "");
	close(p[0]);
	close(p[1]);
}

/*
 * The queue ioctls and MSG_TRUNC, before the stream (issue 13): the server
 * sends a 100-byte head; its SIOCOUTQ and SIOCOUTQNSD fall to 0 once the
 * peer has it, SIOCATMARK is 0. The client waits for all 100 (FIONREAD),
 * discards 40 with MSG_TRUNC into a NULL buffer, counts the other 60 with
 * MSG_PEEK | MSG_TRUNC, reads the error queue (empty: EAGAIN, no stream
 * byte), reads them and checks them, then answers one byte.
 * Zero-length reads around it: a blocking recv first (it waits for the
 * head, then gives 0), once all is read a non-blocking recv (EAGAIN) and a
 * blocking read (0 at once).
 */
#define HEAD 100

/*
 * What the fd says it is, once the head went through (upgraded under the
 * shim): the socket options that name a TCP socket, its addresses'
 * families, fstat's file type and mode, and fcntl's flags.
 */
static void identity(const char *who, int c)
{
	int type = -1, domain = -1, proto = -1, acc = -1, fl = fcntl(c, F_GETFL),
	    fdfl = fcntl(c, F_GETFD);
	socklen_t len = sizeof(int);
	struct sockaddr_storage me, peer;
	socklen_t ml = sizeof(me), pl = sizeof(peer);
	struct stat st;

	if (getsockopt(c, SOL_SOCKET, SO_TYPE, &type, &len) ||
	    getsockopt(c, SOL_SOCKET, SO_DOMAIN, &domain, &len) ||
	    getsockopt(c, SOL_SOCKET, SO_PROTOCOL, &proto, &len) ||
	    getsockopt(c, SOL_SOCKET, SO_ACCEPTCONN, &acc, &len))
		prog_die("getsockopt");
	if (getsockname(c, (struct sockaddr *)&me, &ml) ||
	    getpeername(c, (struct sockaddr *)&peer, &pl) || fstat(c, &st))
		prog_die("getsockname, getpeername, fstat");
	printf("%s fd: SO_TYPE %d, SO_DOMAIN %d, SO_PROTOCOL %d, SO_ACCEPTCONN %d, families %d/%d, "
	       "fstat mode %o, F_GETFL %#x, F_GETFD %d\n",
	       who, type, domain, proto, acc, me.ss_family, peer.ss_family, (unsigned)st.st_mode,
	       (unsigned)(fl & (O_ACCMODE | O_NONBLOCK | O_APPEND)), fdfl);
}

static void surface_server(int c)
{
	char head[HEAD], ack;
	int q = -1, nsd = -1, mark = -1;

	for (int i = 0; i < HEAD; i++)
		head[i] = (char)('a' + i % 26);
	if (send(c, head, HEAD, 0) != HEAD)
		prog_die("send head");
	for (int i = 0; i < 5000 && (q != 0 || nsd != 0); i++) {
		if (ioctl(c, SIOCOUTQ, &q) || ioctl(c, SIOCOUTQNSD, &nsd))
			prog_die("SIOCOUTQ");
		usleep(1000);
	}
	if (ioctl(c, SIOCATMARK, &mark))
		prog_die("SIOCATMARK");
	printf("head sent: SIOCOUTQ %d, SIOCOUTQNSD %d once delivered, SIOCATMARK %d\n", q, nsd,
	       mark);
	if (recv(c, &ack, 1, MSG_WAITALL) != 1)
		prog_die("head ack");
	identity("server", c);
}

static void surface_client(int c)
{
	char back[HEAD];
	int avail = 0, mark = -1;
	ssize_t r0, r1, r2, r3, r4, r5, rq;
	int eq;
	int after0 = 0;

	r0 = recv(c, back, 0, 0);
	if (ioctl(c, FIONREAD, &after0)) /* it waited: bytes are there */
		prog_die("FIONREAD");
	for (int i = 0; i < 5000 && avail < HEAD; i++) {
		if (ioctl(c, FIONREAD, &avail))
			prog_die("FIONREAD");
		if (avail < HEAD)
			usleep(1000);
	}
	if (ioctl(c, SIOCATMARK, &mark))
		prog_die("SIOCATMARK");
	r1 = recv(c, NULL, 40, MSG_TRUNC);
	r2 = recv(c, NULL, 1000, MSG_TRUNC | MSG_PEEK);
	rq = recv(c, back, sizeof(back), MSG_ERRQUEUE);
	eq = rq < 0 ? errno : 0;
	r3 = recv(c, back, sizeof(back), 0);
	r4 = recv(c, back, 0, MSG_DONTWAIT);
	r5 = read(c, back, 0); /* unlike recv, a socket's read of nothing never waits */
	printf("head: zero-length recv %zd (then bytes there: %s), FIONREAD %d, SIOCATMARK %d, "
	       "MSG_TRUNC 40: %zd, MSG_TRUNC|MSG_PEEK 1000: %zd, MSG_ERRQUEUE %zd %s, "
	       "then read %zd, zero-length recv %zd %s, zero-length read %zd",
	       r0, after0 > 0 ? "yes" : "no", avail, mark, r1, r2, rq, eq ? strerror(eq) : "", r3,
	       r4, r4 < 0 ? strerror(errno) : "", r5);
	for (ssize_t i = 0; i < r3; i++)
		if (back[i] != (char)('a' + (40 + i) % 26)) {
			printf(", byte %zd differs", i);
			break;
		}
	printf("\n");
	if (send(c, "k", 1, 0) != 1)
		prog_die("head ack");
	identity("client", c);
}

static int run_server(const char *addr, int port, const char *path)
{
	struct sockaddr_in sin = prog_address(addr, port);
	int l = socket(AF_INET, SOCK_STREAM, 0), one = 1, c, file, p[2];
	struct sha256 expect;
	char hex[65];
	long total = 0;
	off_t off;
	ssize_t r;

	sha256_init(&expect);
	file = make_file(path, &expect);
	total += FILE_SIZE;
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(l, (struct sockaddr *)&sin, sizeof(sin)) || listen(l, 8))
		prog_die("listen");
	printf("listening\n");
	fflush(stdout);
	c = accept(l, NULL, NULL);
	if (c < 0)
		prog_die("accept");
	surface_server(c);

	/* 1. From the file's offset, blocking: everything, and the offset moves. */
	for (long sent = 0; sent < FILE_SIZE; sent += r) {
		r = sendfile(c, file, NULL, (size_t)(FILE_SIZE - sent));
		if (r <= 0)
			prog_die("sendfile");
	}
	printf("sendfile from the offset: file offset now %ld\n", (long)lseek(file, 0, SEEK_CUR));

	/* 2. At an explicit offset: the file's own offset stays. */
	off = 1000;
	r = sendfile(c, file, &off, 70000);
	printf("sendfile at 1000, 70000: %zd, offset %ld, file offset %ld\n", r, (long)off,
	       (long)lseek(file, 0, SEEK_CUR));
	if (r > 0) {
		expect_file(&expect, 1000, r);
		total += r;
	}

	/* 3. Three messages in one sendmmsg. */
	{
		static char a[10], b[20000], d[5];
		struct iovec iov[3] = {{a, sizeof(a)}, {b, sizeof(b)}, {d, sizeof(d)}};
		struct mmsghdr m[3];
		int k;

		memset(a, 'a', sizeof(a));
		memset(b, 'b', sizeof(b));
		memset(d, 'd', sizeof(d));
		memset(m, 0, sizeof(m));
		for (int i = 0; i < 3; i++) {
			m[i].msg_hdr.msg_iov = &iov[i];
			m[i].msg_hdr.msg_iovlen = 1;
		}
		k = sendmmsg(c, m, 3, 0);
		printf("sendmmsg of 3: %d (%u %u %u)\n", k, m[0].msg_len, m[1].msg_len,
		       m[2].msg_len);
		for (int i = 0; i < k; i++) {
			sha256_update(&expect, iov[i].iov_base, m[i].msg_len);
			total += m[i].msg_len;
		}
	}

	/* 4. Through a pipe. */
	{
		static unsigned char b[50000];
		long moved = 0;

		if (pipe(p) != 0)
			prog_die("pipe");
		for (size_t i = 0; i < sizeof(b); i++)
			b[i] = (unsigned char)(i * 13);
		if (write(p[1], b, sizeof(b)) != (ssize_t)sizeof(b))
			prog_die("write pipe");
		while (moved < (long)sizeof(b)) {
			r = splice(p[0], NULL, c, NULL, sizeof(b) - (size_t)moved, SPLICE_F_MORE);
			if (r <= 0)
				prog_die("splice to the socket");
			moved += r;
		}
		printf("splice from a pipe: %ld\n", moved);
		sha256_update(&expect, b, sizeof(b));
		total += moved;
		close(p[0]);
		close(p[1]);
	}

	/* 5. The file again, non-blocking: partial sends keep the offset true. */
	{
		long sent = 0, eagain = 0;

		fcntl(c, F_SETFL, O_NONBLOCK);
		lseek(file, 0, SEEK_SET);
		while (sent < FILE_SIZE) {
			r = sendfile(c, file, NULL, (size_t)(FILE_SIZE - sent));
			if (r > 0) {
				sent += r;
				if (lseek(file, 0, SEEK_CUR) != sent)
					prog_die("the file offset is not what was sent");
				continue;
			}
			if (r < 0 && errno == EAGAIN) {
				struct pollfd pf = {.fd = c, .events = POLLOUT};

				eagain++;
				poll(&pf, 1, -1);
				continue;
			}
			prog_die("non-blocking sendfile");
		}
		printf("non-blocking sendfile: all %ld bytes, file offset %ld%s\n", sent,
		       (long)lseek(file, 0, SEEK_CUR), eagain ? ", after EAGAIN" : "");
		expect_file(&expect, 0, FILE_SIZE);
		total += FILE_SIZE;
		fcntl(c, F_SETFL, 0);
	}

	refused_calls(c, file);
	shutdown(c, SHUT_WR);
	/* Until the client has read everything and closed. */
	{
		char b[16];

		while (read(c, b, sizeof(b)) > 0)
			;
	}
	sha256_hex(&expect, hex);
	printf("server sent %ld sha256=%s\n", total, hex);
	close(c);
	unlink(path);
	return 0;
}

static int run_client(const char *addr, int port)
{
	struct sockaddr_in sin = prog_address(addr, port);
	int c = socket(AF_INET, SOCK_STREAM, 0), p[2];
	static char buf[4][3000], pb[7000];
	struct sha256 got;
	char hex[65];
	long total = 0;
	bool end = false;

	sha256_init(&got);
	if (c < 0 || connect(c, (struct sockaddr *)&sin, sizeof(sin)) != 0)
		prog_die("connect");
	surface_client(c);
	if (pipe(p) != 0)
		prog_die("pipe");
	for (int turn = 0; !end; turn++) {
		if (turn % 2 == 0) {
			struct iovec iov[4];
			struct mmsghdr m[4];
			int k;

			memset(m, 0, sizeof(m));
			for (int i = 0; i < 4; i++) {
				iov[i] = (struct iovec){buf[i], sizeof(buf[i])};
				m[i].msg_hdr.msg_iov = &iov[i];
				m[i].msg_hdr.msg_iovlen = 1;
			}
			k = recvmmsg(c, m, 4, MSG_WAITFORONE, NULL);
			if (k < 0)
				prog_die("recvmmsg");
			for (int i = 0; i < k; i++) {
				if (m[i].msg_len == 0)
					end = true;
				sha256_update(&got, buf[i], m[i].msg_len);
				total += m[i].msg_len;
			}
		} else {
			ssize_t r = splice(c, NULL, p[1], NULL, sizeof(pb), 0), k;

			if (r < 0)
				prog_die("splice from the socket");
			if (r == 0)
				end = true;
			for (ssize_t left = r; left > 0; left -= k) {
				k = read(p[0], pb, (size_t)left);
				if (k <= 0)
					prog_die("read pipe");
				sha256_update(&got, pb, (size_t)k);
				total += k;
			}
		}
	}
	sha256_hex(&got, hex);
	printf("client received %ld sha256=%s\n", total, hex);
	close(c);
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 5 && strcmp(argv[1], "server") == 0)
		return run_server(argv[2], atoi(argv[3]), argv[4]);
	if (argc == 4 && strcmp(argv[1], "client") == 0)
		return run_client(argv[2], atoi(argv[3]));
	fprintf(stderr, "usage: xfer_check server ADDR PORT FILE | client ADDR PORT\n");
	return 2;
}
