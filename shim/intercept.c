/*
 * The libc entry points. An fd the shim does not track costs one table
 * lookup and then the real call; everything else goes through its entry.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>

#include "shim/real.h"
#include "shim/shim.h"
#include "transport/log.h"

#define EXPORT __attribute__((visibility("default")))

/* glibc's fortified variants, which the headers declare only under _FORTIFY_SOURCE. */
ssize_t __read_chk(int fd, void *buf, size_t count, size_t buflen);
ssize_t __recv_chk(int fd, void *buf, size_t len, size_t buflen, int flags);
ssize_t __recvfrom_chk(int fd, void *buf, size_t len, size_t buflen, int flags,
		       struct sockaddr *addr, socklen_t *alen);

static inline void real_ready(void)
{
	if (__builtin_expect(!__atomic_load_n(&ss_real.close_range, __ATOMIC_ACQUIRE), 0))
		ss_real_init();
}

static inline ssize_t to_libc(ssize_t r)
{
	if (r < 0) {
		errno = (int)-r;
		return -1;
	}
	return r;
}

static size_t iov_total(const struct iovec *iov, int n)
{
	size_t t = 0;

	for (int i = 0; i < n; i++)
		t += iov[i].iov_len;
	return t;
}

/* Moves the iovec past n bytes. */
static void iov_advance(struct iovec *iov, int cnt, size_t n)
{
	for (int i = 0; i < cnt && n; i++) {
		size_t k = n < iov[i].iov_len ? n : iov[i].iov_len;

		iov[i].iov_base = (char *)iov[i].iov_base + k;
		iov[i].iov_len -= k;
		n -= k;
	}
}

static bool is_tcp(int domain, int type, int proto)
{
	return (domain == AF_INET || domain == AF_INET6) && (type & 0xf) == SOCK_STREAM &&
	       (proto == 0 || proto == IPPROTO_TCP);
}

/*
 * An fd never seen before (inherited over exec, made before we could see
 * it): a connected TCP socket is treated as an accepted one, at its first
 * I/O; anything else is marked as not ours.
 */
static struct ss_sock *classify(int fd)
{
	int domain = 0, type = 0, proto = 0, listening = 0;
	socklen_t len = sizeof(int);
	struct sockaddr_storage pa;
	socklen_t plen = sizeof(pa);

	if (ss_real.getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) != 0 ||
	    ss_real.getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 ||
	    ss_real.getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &len) != 0 ||
	    !is_tcp(domain, type, proto) ||
	    ss_real.getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || listening ||
	    ss_real.getpeername(fd, (struct sockaddr *)&pa, &plen) != 0) {
		ss_sock_mark_plain_fd(fd);
		return NULL;
	}
	if (ss_cfg.mode == SS_MODE_TCP) {
		ss_sock_mark_plain_fd(fd);
		return NULL;
	}
	return ss_sock_new(fd, domain, SS_SOCK_ACCEPTED);
}

/* The entry for an fd on the I/O path, classifying a never-seen fd. */
static inline struct ss_sock *io_get(int fd)
{
	struct ss_sock *s = ss_sock_get(fd);

	if (s || !ss_sock_unknown(fd))
		return s;
	return classify(fd);
}

static bool nonblocking(int fd)
{
	int fl = ss_real.fcntl(fd, F_GETFL);

	return fl >= 0 && (fl & O_NONBLOCK);
}

/*
 * Waits until the application's fd shows events: first by polling the
 * connection's completion queues from this thread (SRQSHIM_POLL_US), which
 * spares the hop through the progress thread, then by sleeping in a
 * blocking call on the application's socketpair end that ends when it
 * shows the event: a peek at the readable token (or end of file), or a
 * one-byte write that goes through once the junk that shows "not writable"
 * is gone (the byte is junk too, drained with the rest). Unlike poll(2),
 * these are restarted after a signal handler installed with SA_RESTART, and
 * they honour SO_RCVTIMEO and SO_SNDTIMEO, which the application's end
 * carries: a TCP read or write would do the same. Returns 0 (something
 * changed: the caller tries again), -EAGAIN (timeout) or -EINTR.
 */
static int wait_app_fd(struct ss_sock *s, int fd, bool out)
{
	char b = 0;
	ssize_t n;

	if (ss_cfg.poll_us > 0 && ss_tp->conn_spin(s->conn, (unsigned)ss_cfg.poll_us))
		return 0;
	n = out ? ss_real.send(fd, &b, 1, MSG_NOSIGNAL) : ss_real.recv(fd, &b, 1, MSG_PEEK);
	if (n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
		return 0; /* shown, or our end shut down: the connection's state says what */
	return errno == EINTR ? -EINTR : -EAGAIN;
}

/* A connection that is plain for good needs no entry: its calls go straight to libc. */
static void forget_if_plain(struct ss_sock *s)
{
	if (s->state == SS_SOCK_PLAIN && !s->strip_hello)
		ss_sock_forget(s);
}

/* Decides an accepted connection at a read: waits as the read would. */
static int decide_for_read(struct ss_sock *s, int fd, int flags)
{
	int ret;

	pthread_mutex_lock(&s->lock);
	ret = ss_server_decide(s, fd, (flags & MSG_DONTWAIT) || nonblocking(fd) ? 0 : -1);
	pthread_mutex_unlock(&s->lock);
	forget_if_plain(s);
	return ret;
}

/* Decides an accepted connection at a write: the client's HELLO has a bounded time to come. */
static void decide_for_write(struct ss_sock *s, int fd)
{
	struct tcp_info ti;
	socklen_t len = sizeof(ti);
	int wait = ss_cfg.server_wait_ms;

	if (ss_real.getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) == 0)
		wait += 4 * (int)(ti.tcpi_rtt / 1000);
	pthread_mutex_lock(&s->lock);
	if (ss_server_decide(s, fd, wait) == -EAGAIN && s->state == SS_SOCK_ACCEPTED) {
		/* No HELLO in time: plain, and a late HELLO is taken out of the stream. */
		s->state = SS_SOCK_PLAIN;
		s->reason = SS_REASON_PEER_PLAIN;
		s->strip_hello = true;
	}
	pthread_mutex_unlock(&s->lock);
	forget_if_plain(s);
}

/* A plain connection whose server wrote first: remove a late HELLO before reading. */
static int strip_late_hello(struct ss_sock *s, int fd, int flags)
{
	struct ss_msg m;
	enum ss_hs_read_result r;
	int ret = 0;

	pthread_mutex_lock(&s->lock);
	if (s->strip_hello) {
		if (!(flags & MSG_DONTWAIT) && !nonblocking(fd)) {
			struct pollfd p = {.fd = fd, .events = POLLIN};
			if (ss_real.poll(&p, 1, -1) < 0) {
				ret = -errno;
				goto out;
			}
		}
		r = ss_hs_read(&ss_real_io, fd, &m, ss_now_ms() + 200, NULL);
		if (r == SS_HSR_TIMEOUT && ((flags & MSG_DONTWAIT) || nonblocking(fd))) {
			ret = -EAGAIN;
			goto out;
		}
		if (r == SS_HSR_MSG) {
			struct ss_msg d = {.type = SS_MSG_DECLINE, .nonce = m.nonce,
					   .reason = SS_REASON_TIMEOUT};
			ss_hs_write(&ss_real_io, fd, &d, ss_now_ms() + 1000);
		}
		s->strip_hello = false;
	}
out:
	pthread_mutex_unlock(&s->lock);
	forget_if_plain(s);
	return ret;
}

/* ---- the data path of an upgraded connection ---- */

static ssize_t up_recv(struct ss_sock *s, int fd, const struct iovec *iov, int n, int flags)
{
	bool peek = flags & MSG_PEEK, waitall = (flags & MSG_WAITALL) && !peek;
	size_t want = iov_total(iov, n), got = 0;
	struct iovec local[64];
	ssize_t r;

	if (s->state == SS_SOCK_FOREIGN)
		return -EBADF;
	if (n > 64)
		n = 64;
	memcpy(local, iov, sizeof(*iov) * (size_t)n);
	for (;;) {
		r = ss_tp->conn_recv(s->conn, local, n, peek);
		if (r > 0) {
			got += (size_t)r;
			if (!waitall || got == want)
				return (ssize_t)got;
			/* MSG_WAITALL: advance through the iovec and go on. */
			iov_advance(local, n, (size_t)r);
			continue;
		}
		if (r != -EAGAIN)
			return got ? (ssize_t)got : r;
		/* The O_NONBLOCK flag is looked up only when the call would block. */
		if ((flags & MSG_DONTWAIT) || nonblocking(fd))
			return got ? (ssize_t)got : -EAGAIN;
		int w = wait_app_fd(s, fd, false);
		if (w)
			return got ? (ssize_t)got : w;
	}
}

static ssize_t up_send(struct ss_sock *s, int fd, const struct iovec *iov, int n, int flags)
{
	bool more = (flags & MSG_MORE) || s->cork;
	size_t want = iov_total(iov, n), sent = 0;
	struct iovec local[64];
	ssize_t r;

	if (s->state == SS_SOCK_FOREIGN)
		return -EBADF;
	if (n > 64)
		n = 64;
	memcpy(local, iov, sizeof(*iov) * (size_t)n);
	while (sent < want) {
		r = ss_tp->conn_send(s->conn, local, n, more);
		if (r > 0) {
			sent += (size_t)r;
			iov_advance(local, n, (size_t)r);
			continue;
		}
		if (r == -EAGAIN && !(flags & MSG_DONTWAIT) && !nonblocking(fd)) {
			int w = wait_app_fd(s, fd, true);
			if (w == 0)
				continue;
			r = w;
		}
		if (sent)
			break;
		if (r == -EPIPE || r == -ECONNRESET) {
			if (!(flags & MSG_NOSIGNAL))
				raise(SIGPIPE);
			return -EPIPE;
		}
		return r;
	}
	return (ssize_t)sent;
}

typedef ssize_t (*up_io_fn)(struct ss_sock *s, int fd, const struct iovec *iov, int n, int flags);

/*
 * Hands an upgraded (or foreign) socket to fn and drops the caller's
 * reference; any other socket is left to the caller's real call.
 */
static ssize_t run_upgraded(struct ss_sock *s, int fd, const struct iovec *iov, int n, int flags,
			    bool *handled, up_io_fn fn)
{
	ssize_t r = 0;

	if (s->state == SS_SOCK_UPGRADED || s->state == SS_SOCK_FOREIGN) {
		*handled = true;
		ss_in_call++;
		r = fn(s, fd, iov, n, flags);
		ss_in_call--;
	}
	ss_sock_put(s);
	return r;
}

/* The one path of every read-like call. */
static ssize_t do_recv(int fd, const struct iovec *iov, int n, int flags, bool *handled)
{
	struct ss_sock *s = io_get(fd);
	int d = 0;

	*handled = false;
	if (!s)
		return 0;
	if (s->state == SS_SOCK_ACCEPTED)
		d = decide_for_read(s, fd, flags);
	if (d == 0 && s->state == SS_SOCK_PLAIN && s->strip_hello)
		d = strip_late_hello(s, fd, flags);
	if (d < 0) {
		/* Still undecided (would block) or the wait failed: as the read would. */
		*handled = true;
		ss_sock_put(s);
		return d;
	}
	return run_upgraded(s, fd, iov, n, flags, handled, up_recv);
}

static ssize_t do_send(int fd, const struct iovec *iov, int n, int flags, bool *handled)
{
	struct ss_sock *s = io_get(fd);

	*handled = false;
	if (!s)
		return 0;
	if (s->state == SS_SOCK_ACCEPTED)
		decide_for_write(s, fd);
	return run_upgraded(s, fd, iov, n, flags, handled, up_send);
}

/* ---- sockets ---- */

EXPORT int socket(int domain, int type, int proto)
{
	int fd;

	real_ready();
	fd = ss_real.socket(domain, type, proto);
	if (fd >= 0) {
		if (is_tcp(domain, type, proto) && ss_cfg.mode != SS_MODE_TCP)
			ss_sock_put(ss_sock_new(fd, domain, SS_SOCK_FRESH));
		else
			ss_sock_mark_plain_fd(fd);
	}
	return fd;
}

EXPORT int bind(int fd, const struct sockaddr *addr, socklen_t len)
{
	struct ss_sock *s;
	int ret;

	real_ready();
	ret = ss_real.bind(fd, addr, len);
	if (ret == 0 && (s = ss_sock_get(fd))) {
		if (len <= sizeof(s->bound)) {
			memcpy(&s->bound, addr, len);
			s->bound_len = len;
		}
		ss_sock_put(s);
	}
	return ret;
}

EXPORT int listen(int fd, int backlog)
{
	struct ss_sock *s;
	int ret;

	real_ready();
	ret = ss_real.listen(fd, backlog);
	if (ret == 0 && (s = ss_sock_get(fd))) {
		s->state = SS_SOCK_LISTEN;
		ss_sock_put(s);
	}
	return ret;
}

static int after_accept(int lfd, int fd)
{
	struct ss_sock *l;

	if (fd < 0)
		return fd;
	l = ss_sock_get(lfd);
	if (!l) {
		ss_sock_mark_plain_fd(fd);
		return fd;
	}
	ss_sock_put(l);
	/* SRQSHIM_MODE=tcp: nothing to decide, nothing to track. */
	if (ss_cfg.mode == SS_MODE_TCP)
		ss_sock_mark_plain_fd(fd);
	else
		ss_sock_put(ss_sock_new(fd, l->domain, SS_SOCK_ACCEPTED));
	return fd;
}

EXPORT int accept(int fd, struct sockaddr *addr, socklen_t *len)
{
	real_ready();
	return after_accept(fd, ss_real.accept(fd, addr, len));
}

EXPORT int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags)
{
	real_ready();
	return after_accept(fd, ss_real.accept4(fd, addr, len, flags));
}

EXPORT int connect(int fd, const struct sockaddr *addr, socklen_t len)
{
	struct ss_sock *s;
	int ret;

	real_ready();
	s = ss_sock_get(fd);
	if (!s || s->state != SS_SOCK_FRESH || !addr ||
	    (addr->sa_family != AF_INET && addr->sa_family != AF_INET6)) {
		ss_sock_put(s);
		return ss_real.connect(fd, addr, len);
	}
	pthread_mutex_lock(&s->lock);
	ret = s->state == SS_SOCK_FRESH ? ss_client_connect(s, fd, addr, len)
					: (ss_real.connect(fd, addr, len) ? -errno : 0);
	pthread_mutex_unlock(&s->lock);
	forget_if_plain(s);
	ss_sock_put(s);
	return (int)to_libc(ret);
}

/* ---- reads ---- */

EXPORT ssize_t read(int fd, void *buf, size_t count)
{
	struct iovec iov = {buf, count};
	bool handled;
	ssize_t r;

	if (__builtin_expect(!ss_real.read, 0)) {
		real_ready();
		if (!ss_real.read)
			return syscall(SYS_read, fd, buf, count);
	}
	r = do_recv(fd, &iov, 1, 0, &handled);
	return handled ? to_libc(r) : ss_real.read(fd, buf, count);
}

EXPORT ssize_t __read_chk(int fd, void *buf, size_t count, size_t buflen)
{
	if (count > buflen)
		abort(); /* as glibc's fortified check does */
	return read(fd, buf, count);
}

EXPORT ssize_t readv(int fd, const struct iovec *iov, int n)
{
	bool handled;
	ssize_t r;

	real_ready();
	r = do_recv(fd, iov, n, 0, &handled);
	return handled ? to_libc(r) : ss_real.readv(fd, iov, n);
}

EXPORT ssize_t recv(int fd, void *buf, size_t len, int flags)
{
	struct iovec iov = {buf, len};
	bool handled;
	ssize_t r;

	real_ready();
	r = do_recv(fd, &iov, 1, flags, &handled);
	return handled ? to_libc(r) : ss_real.recv(fd, buf, len, flags);
}

EXPORT ssize_t __recv_chk(int fd, void *buf, size_t len, size_t buflen, int flags)
{
	if (len > buflen)
		abort();
	return recv(fd, buf, len, flags);
}

EXPORT ssize_t recvfrom(int fd, void *buf, size_t len, int flags, struct sockaddr *addr,
			socklen_t *alen)
{
	struct iovec iov = {buf, len};
	bool handled;
	ssize_t r;

	real_ready();
	r = do_recv(fd, &iov, 1, flags, &handled);
	if (!handled)
		return ss_real.recvfrom(fd, buf, len, flags, addr, alen);
	if (r >= 0 && alen)
		*alen = 0; /* as TCP: no source address */
	return to_libc(r);
}

EXPORT ssize_t __recvfrom_chk(int fd, void *buf, size_t len, size_t buflen, int flags,
			      struct sockaddr *addr, socklen_t *alen)
{
	if (len > buflen)
		abort();
	return recvfrom(fd, buf, len, flags, addr, alen);
}

EXPORT ssize_t recvmsg(int fd, struct msghdr *msg, int flags)
{
	bool handled;
	ssize_t r;

	real_ready();
	r = do_recv(fd, msg->msg_iov, (int)msg->msg_iovlen, flags, &handled);
	if (!handled)
		return ss_real.recvmsg(fd, msg, flags);
	if (r >= 0) {
		msg->msg_namelen = 0;
		msg->msg_controllen = 0;
		msg->msg_flags = 0;
	}
	return to_libc(r);
}

/* ---- writes ---- */

EXPORT ssize_t write(int fd, const void *buf, size_t count)
{
	struct iovec iov = {(void *)buf, count};
	bool handled;
	ssize_t r;

	if (__builtin_expect(!ss_real.write, 0)) {
		real_ready();
		if (!ss_real.write)
			return syscall(SYS_write, fd, buf, count);
	}
	r = do_send(fd, &iov, 1, 0, &handled);
	return handled ? to_libc(r) : ss_real.write(fd, buf, count);
}

EXPORT ssize_t writev(int fd, const struct iovec *iov, int n)
{
	bool handled;
	ssize_t r;

	real_ready();
	r = do_send(fd, iov, n, 0, &handled);
	return handled ? to_libc(r) : ss_real.writev(fd, iov, n);
}

EXPORT ssize_t send(int fd, const void *buf, size_t len, int flags)
{
	struct iovec iov = {(void *)buf, len};
	bool handled;
	ssize_t r;

	real_ready();
	r = do_send(fd, &iov, 1, flags, &handled);
	return handled ? to_libc(r) : ss_real.send(fd, buf, len, flags);
}

EXPORT ssize_t sendto(int fd, const void *buf, size_t len, int flags, const struct sockaddr *addr,
		      socklen_t alen)
{
	struct iovec iov = {(void *)buf, len};
	bool handled;
	ssize_t r;

	real_ready();
	/* A connected TCP socket ignores the address: so do we. */
	r = do_send(fd, &iov, 1, flags, &handled);
	return handled ? to_libc(r) : ss_real.sendto(fd, buf, len, flags, addr, alen);
}

EXPORT ssize_t sendmsg(int fd, const struct msghdr *msg, int flags)
{
	bool handled;
	ssize_t r;

	real_ready();
	r = do_send(fd, msg->msg_iov, (int)msg->msg_iovlen, flags, &handled);
	return handled ? to_libc(r) : ss_real.sendmsg(fd, msg, flags);
}

/* ---- the end of a socket ---- */

EXPORT int close(int fd)
{
	struct ss_sock *s;
	int ret = 0;

	if (__builtin_expect(!ss_real.close, 0)) {
		real_ready();
		if (!ss_real.close)
			return (int)syscall(SYS_close, fd);
	}
	if (ss_in_vfork_child())
		return ss_real.close(fd);
	s = ss_sock_remove_fd(fd, &ret);
	if (s) {
		int err = errno;
		ss_sock_finish(s);
		ss_sock_put(s);
		errno = err;
	}
	return ret;
}

EXPORT int close_range(unsigned first, unsigned last, int flags)
{
	real_ready();
	if (!(flags & CLOSE_RANGE_CLOEXEC) && !ss_in_vfork_child()) {
		int top = ss_sock_table_size();
		for (unsigned fd = first; fd <= last && fd < (unsigned)top; fd++) {
			struct ss_sock *s = ss_sock_remove_fd((int)fd, NULL);
			if (s) {
				ss_sock_finish(s);
				ss_sock_put(s);
			}
		}
	}
	return ss_real.close_range(first, last, flags);
}

EXPORT int shutdown(int fd, int how)
{
	struct ss_sock *s;
	int ret;

	real_ready();
	s = ss_sock_get(fd);
	if (!s || s->state != SS_SOCK_UPGRADED) {
		ss_sock_put(s);
		return ss_real.shutdown(fd, how);
	}
	ret = 0;
	if (how == SHUT_WR || how == SHUT_RDWR) {
		s->shut_wr = true;
		ret = ss_tp->conn_shutdown_wr(s->conn);
	} else if (how != SHUT_RD) {
		ret = -EINVAL;
	}
	ss_sock_put(s);
	return (int)to_libc(ret);
}

/* ---- the dup family ---- */

static int after_dup(int oldfd, int newfd)
{
	struct ss_sock *s;

	if (newfd < 0 || ss_in_vfork_child())
		return newfd;
	s = ss_sock_get(oldfd);
	if (s) {
		if (ss_sock_add_fd(s, newfd) != 0)
			ss_log_warn("fd %d: too many duplicates to track", oldfd);
		ss_sock_put(s);
	} else {
		ss_sock_mark_plain_fd(newfd);
	}
	return newfd;
}

/* dup2/dup3 onto a tracked fd closes that name first, as the kernel would. */
static void forget_target(int oldfd, int newfd)
{
	struct ss_sock *t;

	if (oldfd == newfd || ss_in_vfork_child())
		return;
	t = ss_sock_remove_fd(newfd, NULL);
	if (t) {
		ss_sock_finish(t);
		ss_sock_put(t);
	}
}

EXPORT int dup(int fd)
{
	real_ready();
	return after_dup(fd, ss_real.dup(fd));
}

EXPORT int dup2(int oldfd, int newfd)
{
	real_ready();
	forget_target(oldfd, newfd);
	return after_dup(oldfd, ss_real.dup2(oldfd, newfd));
}

EXPORT int dup3(int oldfd, int newfd, int flags)
{
	real_ready();
	forget_target(oldfd, newfd);
	return after_dup(oldfd, ss_real.dup3(oldfd, newfd, flags));
}

EXPORT int fcntl(int fd, int cmd, ...)
{
	va_list ap;
	long arg;

	real_ready();
	va_start(ap, cmd);
	arg = va_arg(ap, long);
	va_end(ap);
	if (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC)
		return after_dup(fd, ss_real.fcntl(fd, cmd, arg));
	return ss_real.fcntl(fd, cmd, arg);
}

EXPORT int fcntl64(int fd, int cmd, ...)
{
	va_list ap;
	long arg;

	va_start(ap, cmd);
	arg = va_arg(ap, long);
	va_end(ap);
	return fcntl(fd, cmd, arg);
}

EXPORT int ioctl(int fd, unsigned long req, ...)
{
	struct ss_sock *s;
	va_list ap;
	void *arg;

	real_ready();
	va_start(ap, req);
	arg = va_arg(ap, void *);
	va_end(ap);
	if (req == FIONREAD && (s = ss_sock_get(fd))) {
		if (s->state == SS_SOCK_UPGRADED) {
			*(int *)arg = (int)ss_tp->conn_readable(s->conn);
			ss_sock_put(s);
			return 0;
		}
		ss_sock_put(s);
	}
	return ss_real.ioctl(fd, req, arg);
}

/* ---- options and names: answered by the TCP socket ---- */

/* The fd that answers for fd: its TCP socket once upgraded. */
static int tcp_of(int fd, struct ss_sock **s_p)
{
	struct ss_sock *s = ss_sock_get(fd);

	*s_p = s;
	return s && s->tcp_fd >= 0 ? s->tcp_fd : fd;
}

EXPORT int getsockopt(int fd, int level, int name, void *val, socklen_t *len)
{
	struct ss_sock *s;
	int tfd = tcp_of(fd, &s), ret;

	real_ready();
	if (s && s->state == SS_SOCK_UPGRADED && level == SOL_SOCKET && name == SO_ERROR && val &&
	    len && *len >= sizeof(int)) {
		/* The TCP socket is fine; a failed connection reports its reset. */
		*(int *)val = (ss_tp->conn_ready(s->conn) & SS_RDY_ERR) ? ECONNRESET : 0;
		*len = sizeof(int);
		ss_sock_put(s);
		return 0;
	}
	ret = ss_real.getsockopt(tfd, level, name, val, len);
	ss_sock_put(s);
	return ret;
}

EXPORT int setsockopt(int fd, int level, int name, const void *val, socklen_t len)
{
	struct ss_sock *s;
	int tfd, ret;

	real_ready();
	tfd = tcp_of(fd, &s);
	ret = ss_real.setsockopt(tfd, level, name, val, len);
	if (ret == 0 && s) {
		if (s->state == SS_SOCK_FRESH && s->n_opts < 16 && len <= sizeof(s->opts[0].val)) {
			struct ss_opt_rec *o = &s->opts[s->n_opts++];
			o->level = level;
			o->name = name;
			o->len = len;
			memcpy(o->val, val, len);
		}
		if (level == IPPROTO_TCP && name == TCP_CORK && len >= sizeof(int)) {
			s->cork = *(const int *)val != 0;
			if (!s->cork && s->state == SS_SOCK_UPGRADED) {
				struct iovec none = {NULL, 0};
				ss_tp->conn_send(s->conn, &none, 0, false); /* flush what was held */
			}
		}
		/* The application's fd itself keeps its own timeouts and flags. */
		if (tfd != fd && level == SOL_SOCKET && (name == SO_RCVTIMEO || name == SO_SNDTIMEO))
			ss_real.setsockopt(fd, level, name, val, len);
	}
	ss_sock_put(s);
	return ret;
}

/* getsockname and getpeername: asked of the TCP socket. */
static int name_of(int fd, bool peer, struct sockaddr *addr, socklen_t *len)
{
	struct ss_sock *s;
	int tfd, ret;

	real_ready();
	tfd = tcp_of(fd, &s);
	ret = peer ? ss_real.getpeername(tfd, addr, len) : ss_real.getsockname(tfd, addr, len);
	ss_sock_put(s);
	return ret;
}

EXPORT int getsockname(int fd, struct sockaddr *addr, socklen_t *len)
{
	return name_of(fd, false, addr, len);
}

EXPORT int getpeername(int fd, struct sockaddr *addr, socklen_t *len)
{
	return name_of(fd, true, addr, len);
}

/* ---- epoll: the registry of the application's registrations ---- */

EXPORT int epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev)
{
	struct ss_sock *s;
	int ret;

	real_ready();
	ret = ss_real.epoll_ctl(epfd, op, fd, ev);
	if (ret != 0 || !(s = ss_sock_get(fd)))
		return ret;
	pthread_mutex_lock(&s->fd_lock);
	int i;
	for (i = 0; i < s->n_regs && s->regs[i].epfd != epfd; i++)
		;
	if (op == EPOLL_CTL_DEL) {
		if (i < s->n_regs)
			s->regs[i] = s->regs[--s->n_regs];
	} else if (i < s->n_regs) {
		s->regs[i].ev = *ev;
	} else if (s->n_regs < (int)(sizeof(s->regs) / sizeof(s->regs[0]))) {
		s->regs[s->n_regs].epfd = epfd;
		s->regs[s->n_regs].ev = *ev;
		s->n_regs++;
	} else {
		ss_log_warn("fd %d: registered in too many epoll instances to track", fd);
	}
	pthread_mutex_unlock(&s->fd_lock);
	ss_sock_put(s);
	return ret;
}
