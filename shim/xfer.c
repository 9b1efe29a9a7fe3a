/*
 * Calls that move bytes between a socket and something else, or many
 * messages at once: sendfile, splice, sendmmsg, recvmmsg. On a socket the
 * shim carries they are built on its own send and receive (io.c), with
 * the kernel's rules for TCP: what each returns, where a file's offset
 * ends, and that no byte is taken from a file or a pipe unless the socket
 * took it (docs/design.md, "The socket surface"). On any other fd they are
 * the real calls.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>

#include "shim/io.h"
#include "shim/real.h"
#include "shim/shim.h"
#include "shim/xfer.h"

#include "handshake/clock.h"

#define XFER_CHUNK    (128 * 1024)
#define XFER_RW_LIMIT 0x7ffff000L /* the most one read or write moves (Linux's MAX_RW_COUNT) */

static size_t xfer_min(size_t a, size_t b)
{
	return a < b ? a : b;
}

/* Whether a pipe end (or any fd) is in non-blocking mode. */
static bool xfer_fd_nonblocking(int fd)
{
	int fl = ss_real.fcntl(fd, F_GETFL);

	return fl >= 0 && (fl & O_NONBLOCK);
}

static bool xfer_is_pipe(int fd)
{
	struct stat st;

	return fstat(fd, &st) == 0 && S_ISFIFO(st.st_mode);
}

/* ---- sendfile ---- */

/*
 * Sends from in at pos onwards to the shim's socket out, up to count.
 * Returns what the socket took (the file's offset is the caller's), or
 * -errno when it took nothing; *rest_plain: the socket became plain
 * (fallback) before taking the rest, which the real call then sends.
 */
static ssize_t xfer_file_to_sock(int out, int in, off_t pos, size_t count, bool *rest_plain)
{
	size_t cap = xfer_min(count, XFER_CHUNK), done = 0;
	char *buf = malloc(cap ? cap : 1);
	ssize_t r = 0;

	*rest_plain = false;
	if (!buf)
		return -ENOMEM;
	while (done < count) {
		ssize_t n = pread(in, buf, xfer_min(cap, count - done), pos + (off_t)done);
		struct iovec iov;
		bool handled;

		if (n <= 0) {
			r = n < 0 ? -errno : 0;
			break;
		}
		iov = (struct iovec){buf, (size_t)n};
		r = ss_io_send(out, &iov, 1, 0, &handled);
		if (!handled) {
			*rest_plain = true;
			break;
		}
		if (r <= 0)
			break;
		done += (size_t)r;
		if (r < n)
			break; /* the socket is full (non-blocking) or the wait was cut short */
	}
	free(buf);
	return done ? (ssize_t)done : r;
}

/*
 * sendfile into a socket the shim carries: the bytes are read with pread
 * at the offset and the offset moves by what the socket took, so nothing
 * is skipped when it takes less than was read.
 */
ssize_t ss_xfer_sendfile(int out, int in, off_t *offset, size_t count, bool *handled)
{
	off_t pos;
	ssize_t r;
	bool rest_plain;

	*handled = ss_io_ours(out, false);
	if (!*handled)
		return 0;
	if (count > (size_t)XFER_RW_LIMIT)
		count = (size_t)XFER_RW_LIMIT;
	pos = offset ? *offset : lseek(in, 0, SEEK_CUR);
	if (pos < 0)
		return offset || errno == ESPIPE ? -EINVAL : -errno;
	r = xfer_file_to_sock(out, in, pos, count, &rest_plain);
	if (rest_plain) {
		/* Plain now: the kernel sends the rest, from where we stopped. */
		off_t at = pos + (r > 0 ? r : 0);
		ssize_t k = ss_real.sendfile(out, in, &at, count - (size_t)(r > 0 ? r : 0));

		if (k > 0)
			r = (r > 0 ? r : 0) + k;
		else if (r <= 0)
			r = k < 0 ? -errno : 0;
	}
	if (r > 0) {
		if (offset)
			*offset = pos + r;
		else
			lseek(in, pos + r, SEEK_SET);
	}
	return r;
}

/* ---- splice ---- */

/*
 * Waits until the pipe end fd shows events, unless the call may not wait.
 * Returns 0 or -errno (-EAGAIN: may not wait).
 */
static int xfer_pipe_wait(int fd, short events, bool nonblock)
{
	struct pollfd p = {.fd = fd, .events = events};

	if (nonblock)
		return -EAGAIN;
	if (ss_real.poll(&p, 1, -1) < 0)
		return -errno;
	return 0;
}

/*
 * From the shim's socket sock into the pipe pw: the bytes are peeked, as
 * many as the pipe takes are written, and only those are taken off the
 * stream.
 */
static ssize_t xfer_sock_to_pipe(int sock, int pw, size_t len, unsigned flags, bool *plain)
{
	bool nonblock = (flags & SPLICE_F_NONBLOCK) != 0;
	bool pipe_nb = xfer_fd_nonblocking(pw);
	size_t cap = xfer_min(len, XFER_CHUNK);
	char *buf = malloc(cap ? cap : 1);
	struct iovec iov = {buf, cap};
	ssize_t r, w;
	bool handled;

	if (!buf)
		return -ENOMEM;
	r = ss_io_recv(sock, &iov, 1, MSG_PEEK | (nonblock ? MSG_DONTWAIT : 0), &handled);
	*plain = !handled;
	if (r <= 0 || !handled) {
		free(buf);
		return r;
	}
	for (;;) {
		size_t want = (size_t)r;

		if (nonblock && !pipe_nb) {
			/* A blocking pipe that must not block: at most one page, and only with
			 * room. */
			struct pollfd p = {.fd = pw, .events = POLLOUT};

			if (ss_real.poll(&p, 1, 0) <= 0) {
				free(buf);
				return -EAGAIN;
			}
			want = xfer_min(want, PIPE_BUF);
		}
		w = ss_real.write(pw, buf, want);
		if (w > 0)
			break;
		if (w < 0 && errno == EAGAIN) {
			int e = xfer_pipe_wait(pw, POLLOUT, nonblock || pipe_nb);

			if (e == 0)
				continue;
			free(buf);
			return e;
		}
		free(buf);
		return -errno;
	}
	/* The pipe took w bytes: those come off the stream (they are there: peeked). */
	iov.iov_len = (size_t)w;
	r = ss_io_recv(sock, &iov, 1, MSG_DONTWAIT, &handled);
	free(buf);
	return r == w ? w : (r < 0 ? r : -EIO);
}

/*
 * From the pipe pr into the shim's socket sock: the pipe's bytes are
 * copied (tee) without being taken, sent, and only what the socket took
 * is then read off the pipe.
 */
static ssize_t xfer_pipe_to_sock(int pr, int sock, size_t len, unsigned flags, bool *plain)
{
	bool nonblock = (flags & SPLICE_F_NONBLOCK) != 0;
	size_t cap = xfer_min(len, XFER_CHUNK);
	int priv[2];
	char *buf;
	ssize_t n, r;
	struct iovec iov;
	bool handled;

	*plain = false;
	if (pipe2(priv, O_CLOEXEC | O_NONBLOCK) != 0)
		return -errno;
	buf = malloc(cap ? cap : 1);
	if (!buf) {
		n = -ENOMEM;
		goto out;
	}
	for (;;) {
		n = tee(pr, priv[1], cap, SPLICE_F_NONBLOCK);
		if (n >= 0)
			break; /* 0: no writer and nothing left, the end */
		if (errno != EAGAIN) {
			n = -errno;
			goto out;
		}
		n = xfer_pipe_wait(pr, POLLIN, nonblock || xfer_fd_nonblocking(pr));
		if (n)
			goto out;
	}
	if (n == 0)
		goto out;
	n = ss_real.read(priv[0], buf, (size_t)n);
	if (n <= 0) {
		n = n < 0 ? -errno : -EIO;
		goto out;
	}
	iov = (struct iovec){buf, (size_t)n};
	r = ss_io_send(sock, &iov, 1,
		       (nonblock ? MSG_DONTWAIT : 0) | (flags & SPLICE_F_MORE ? MSG_MORE : 0),
		       &handled);
	*plain = !handled;
	if (!handled)
		r = 0; /* plain now: nothing taken off the pipe, the real call does it all */
	if (r > 0 && ss_real.read(pr, buf, (size_t)r) != r)
		r = -EIO; /* another reader took them meanwhile: the pipe was shared */
	n = r;
out:
	free(buf);
	ss_real.close(priv[0]);
	ss_real.close(priv[1]);
	return n;
}

ssize_t ss_xfer_splice(int in, loff_t *off_in, int out, loff_t *off_out, size_t len, unsigned flags,
		       bool *handled)
{
	bool in_ours = ss_io_ours(in, true), out_ours = !in_ours && ss_io_ours(out, false),
	     plain = false;
	ssize_t r;

	*handled = in_ours || out_ours;
	if (!*handled)
		return 0;
	/* The other end must be a pipe; no offset on a pipe (ESPIPE) nor on a socket (EINVAL). */
	if (!xfer_is_pipe(in_ours ? out : in))
		return -EINVAL;
	if (in_ours ? off_out : off_in)
		return -ESPIPE;
	if (in_ours ? off_in : off_out)
		return -EINVAL;
	if (len > (size_t)XFER_RW_LIMIT)
		len = (size_t)XFER_RW_LIMIT;
	if (len == 0)
		return 0;
	r = in_ours ? xfer_sock_to_pipe(in, out, len, flags, &plain)
		    : xfer_pipe_to_sock(in, out, len, flags, &plain);
	if (plain) {
		/* The socket fell back to TCP meanwhile, nothing moved: the kernel does it. */
		r = ss_real.splice(in, off_in, out, off_out, len, flags);
		return r < 0 ? -errno : r;
	}
	return r;
}

/* ---- many messages in one call ---- */

/*
 * sendmmsg on a socket the shim carries, as the kernel does it for TCP: the
 * messages in order, each as sendmsg; it stops at an error or after a
 * message sent only in part; the error only when no message was sent.
 */
int ss_xfer_sendmmsg(int fd, struct mmsghdr *v, unsigned n, int flags, bool *handled)
{
	unsigned i;
	ssize_t r = 0;

	*handled = ss_io_ours(fd, false);
	if (!*handled)
		return 0;
	for (i = 0; i < n; i++) {
		struct msghdr *m = &v[i].msg_hdr;
		size_t want = 0;
		bool h;

		for (size_t k = 0; k < m->msg_iovlen; k++)
			want += m->msg_iov[k].iov_len;
		r = ss_io_send(fd, m->msg_iov, (int)m->msg_iovlen, flags, &h);
		if (!h) {
			r = ss_real.sendmsg(fd, m, flags);
			r = r < 0 ? -errno : r;
		}
		if (r < 0)
			break;
		v[i].msg_len = (unsigned)r;
		if ((size_t)r < want) {
			i++;
			break;
		}
	}
	return i ? (int)i : (int)r;
}

/*
 * recvmmsg, as the kernel does it for TCP: each message is a recvmsg;
 * MSG_WAITFORONE makes every one after the first not wait; the timeout is
 * looked at after each message (and what is left of it written back); the
 * error only when no message was received.
 */
int ss_xfer_recvmmsg(int fd, struct mmsghdr *v, unsigned n, int flags, struct timespec *timeout,
		     bool *handled)
{
	uint64_t end_us = 0; /* the one clock (handshake/clock.h), to the microsecond */
	unsigned i;
	ssize_t r = 0;

	*handled = ss_io_ours(fd, true);
	if (!*handled)
		return 0;
	if (timeout) {
		if (timeout->tv_sec < 0 || timeout->tv_nsec < 0 || timeout->tv_nsec >= 1000000000L)
			return -EINVAL;
		end_us = ss_now_us() + (uint64_t)timeout->tv_sec * 1000000 +
			 ((uint64_t)timeout->tv_nsec + 999) / 1000;
	}
	for (i = 0; i < n; i++) {
		struct msghdr *m = &v[i].msg_hdr;
		int f = flags & ~MSG_WAITFORONE;
		bool h;

		if ((flags & MSG_WAITFORONE) && i > 0)
			f |= MSG_DONTWAIT;
		r = ss_io_recv(fd, m->msg_iov, (int)m->msg_iovlen, f, &h);
		if (!h) {
			r = ss_real.recvmsg(fd, m, f);
			r = r < 0 ? -errno : r;
		} else if (r >= 0) {
			m->msg_namelen = 0;
			m->msg_controllen = 0;
			m->msg_flags = 0;
		}
		if (r < 0) {
			/* For the next call, as the kernel's sk_err. */
			if (i > 0)
				ss_io_error_back(fd, (int)-r);
			break;
		}
		v[i].msg_len = (unsigned)r;
		if (timeout) {
			uint64_t now_us = ss_now_us();

			if (now_us >= end_us) {
				timeout->tv_sec = timeout->tv_nsec = 0;
				i++;
				break;
			}
			timeout->tv_sec = (time_t)((end_us - now_us) / 1000000);
			timeout->tv_nsec = (long)((end_us - now_us) % 1000000) * 1000;
		}
	}
	return i ? (int)i : (int)r;
}
