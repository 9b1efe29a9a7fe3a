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

#include "shim/io.h"
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

/* ---- sockets ---- */

EXPORT int socket(int domain, int type, int proto)
{
	int fd;

	real_ready();
	fd = ss_real.socket(domain, type, proto);
	if (fd >= 0) {
		if (ss_is_tcp(domain, type, proto) && ss_cfg.mode != SS_MODE_TCP)
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
		ss_sock_set_state(s, SS_SOCK_LISTEN);
		ss_sock_put(s);
	}
	return ret;
}

static int after_accept(int lfd, int fd)
{
	struct ss_sock *l, *s;
	int domain;

	if (fd < 0)
		return fd;
	l = ss_sock_get(lfd);
	if (!l) {
		ss_sock_mark_plain_fd(fd);
		return fd;
	}
	/* Read before the reference goes: another thread may close the listener. */
	domain = l->domain;
	ss_sock_put(l);
	/* SRQSHIM_MODE=tcp: nothing to decide, nothing to track. */
	if (ss_cfg.mode == SS_MODE_TCP) {
		ss_sock_mark_plain_fd(fd);
		return fd;
	}
	s = ss_sock_new(fd, domain, SS_SOCK_ACCEPTED);
	if (s) {
		int err = errno;

		ss_server_accepted(s, fd);
		ss_sock_put(s);
		errno = err;
	}
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

/* connect() again on a socket whose connect the shim runs: what TCP would answer. */
static int connect_again(struct ss_sock *s)
{
	switch (ss_sock_state(s)) {
	case SS_SOCK_CONNECTING:
		return -EALREADY;
	case SS_SOCK_PROBING:
	case SS_SOCK_RECONNECTING:
	case SS_SOCK_UPGRADED:
	case SS_SOCK_FALLBACK:
	case SS_SOCK_FOREIGN:
		/* The first call after a connect in progress ended reports success. */
		if (!s->reported) {
			s->reported = true;
			return 0;
		}
		return -EISCONN;
	default:
		return 1; /* the kernel's answer */
	}
}

EXPORT int connect(int fd, const struct sockaddr *addr, socklen_t len)
{
	struct ss_sock *s;
	int ret;

	real_ready();
	s = ss_sock_get(fd);
	if (!s) {
		return ss_real.connect(fd, addr, len);
	}
	pthread_mutex_lock(&s->lock);
	if (ss_sock_state(s) == SS_SOCK_FRESH && addr &&
	    (addr->sa_family == AF_INET || addr->sa_family == AF_INET6)) {
		ss_in_call++;
		ret = ss_client_connect(s, fd, addr, len);
		ss_in_call--;
	} else if ((ret = connect_again(s)) == 1) {
		ret = ss_real.connect(fd, addr, len) ? -errno : 0;
	}
	pthread_mutex_unlock(&s->lock);
	ss_io_forget_if_plain(s);
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
	r = ss_io_recv(fd, &iov, 1, 0, &handled);
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
	r = ss_io_recv(fd, iov, n, 0, &handled);
	return handled ? to_libc(r) : ss_real.readv(fd, iov, n);
}

EXPORT ssize_t recv(int fd, void *buf, size_t len, int flags)
{
	struct iovec iov = {buf, len};
	bool handled;
	ssize_t r;

	real_ready();
	r = ss_io_recv(fd, &iov, 1, flags, &handled);
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
	r = ss_io_recv(fd, &iov, 1, flags, &handled);
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
	r = ss_io_recv(fd, msg->msg_iov, (int)msg->msg_iovlen, flags, &handled);
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
	r = ss_io_send(fd, &iov, 1, 0, &handled);
	return handled ? to_libc(r) : ss_real.write(fd, buf, count);
}

EXPORT ssize_t writev(int fd, const struct iovec *iov, int n)
{
	bool handled;
	ssize_t r;

	real_ready();
	r = ss_io_send(fd, iov, n, 0, &handled);
	return handled ? to_libc(r) : ss_real.writev(fd, iov, n);
}

EXPORT ssize_t send(int fd, const void *buf, size_t len, int flags)
{
	struct iovec iov = {(void *)buf, len};
	bool handled;
	ssize_t r;

	real_ready();
	r = ss_io_send(fd, &iov, 1, flags, &handled);
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
	r = ss_io_send(fd, &iov, 1, flags, &handled);
	return handled ? to_libc(r) : ss_real.sendto(fd, buf, len, flags, addr, alen);
}

EXPORT ssize_t sendmsg(int fd, const struct msghdr *msg, int flags)
{
	bool handled;
	ssize_t r;

	real_ready();
	r = ss_io_send(fd, msg->msg_iov, (int)msg->msg_iovlen, flags, &handled);
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
	if (!s || ss_sock_state(s) < SS_SOCK_CONNECTING || ss_sock_state(s) == SS_SOCK_PLAIN ||
	    ss_sock_state(s) == SS_SOCK_ACCEPTED) {
		ss_sock_put(s);
		return ss_real.shutdown(fd, how);
	}
	ret = 0;
	pthread_mutex_lock(&s->lock);
	if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR) {
		ret = -EINVAL;
	} else if (how == SHUT_RD) {
		/* Nothing to do: reads go on returning what arrives, as TCP's may. */
	} else if (ss_sock_state(s) == SS_SOCK_UPGRADED) {
		s->shut_wr = true;
		ret = ss_tp->conn_shutdown_wr(s->conn);
	} else if (ss_sock_state(s) == SS_SOCK_CONNECTING) {
		ret = -ENOTCONN;
	} else if (ss_sock_state(s) == SS_SOCK_PLAIN) {
		ret = ss_real.shutdown(fd, how) ? -errno : 0;
	} else {
		/* Undecided (or falling back): the end of the stream follows what is held. */
		s->shut_wr_held = true;
	}
	pthread_mutex_unlock(&s->lock);
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
		if (ss_sock_state(s) == SS_SOCK_UPGRADED) {
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
	if (s && ss_sock_state(s) == SS_SOCK_UPGRADED && level == SOL_SOCKET && name == SO_ERROR &&
	    val && len && *len >= sizeof(int)) {
		/* The TCP socket is fine; a failed connection reports its reset, once. */
		*(int *)val = (ss_tp->conn_ready(s->conn) & SS_RDY_ERR) && ss_io_take_reset(s)
				      ? ECONNRESET
				      : 0;
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
		pthread_mutex_lock(&s->lock);
		int st = ss_sock_state(s);
		/* Recorded for a plain reconnect, as long as one may happen. */
		if ((st == SS_SOCK_FRESH || st == SS_SOCK_CONNECTING || st == SS_SOCK_PROBING) &&
		    s->n_opts < 16 && len <= sizeof(s->opts[0].val)) {
			struct ss_opt_rec *o = &s->opts[s->n_opts++];
			o->level = level;
			o->name = name;
			o->len = len;
			memcpy(o->val, val, len);
		}
		if (level == IPPROTO_TCP && name == TCP_CORK && len >= sizeof(int)) {
			s->cork = *(const int *)val != 0;
			if (!s->cork && st == SS_SOCK_UPGRADED) {
				struct iovec none = {NULL, 0};
				ss_tp->conn_send(s->conn, &none, 0, false); /* flush what was held */
			}
		}
		pthread_mutex_unlock(&s->lock);
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
