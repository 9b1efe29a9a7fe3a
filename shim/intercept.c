/*
 * The libc entry points. An fd the shim does not track costs one table
 * lookup and then the real call; everything else goes through its entry.
 */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <spawn.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <linux/sockios.h>
#include <sys/syscall.h>

#include "shim/closerange.h"
#include "shim/epoll.h"
#include "shim/io.h"
#include "shim/mux.h"
#include "shim/ownfd.h"
#include "shim/real.h"
#include "shim/shim.h"
#include "shim/xfer.h"
#include "transport/log.h"

#define EXPORT __attribute__((visibility("default")))

/* glibc's fortified variants, which the headers declare only under _FORTIFY_SOURCE. */
ssize_t __read_chk(int fd, void *buf, size_t count, size_t buflen);
ssize_t __recv_chk(int fd, void *buf, size_t len, size_t buflen, int flags);
int __vdprintf_chk(int fd, int flag, const char *fmt, va_list ap);
int __dprintf_chk(int fd, int flag, const char *fmt, ...);
int __vasprintf_chk(char **out, int flag, const char *fmt, va_list ap);
ssize_t __recvfrom_chk(int fd, void *buf, size_t len, size_t buflen, int flags,
		       struct sockaddr *addr, socklen_t *alen);
/* By their symbols: <sys/sendfile.h> would rename sendfile to sendfile64 (64-bit offsets). */
ssize_t sendfile(int out, int in, off_t *offset, size_t count);
ssize_t sendfile64(int out, int in, off_t *offset, size_t count);

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
			ss_sock_put(ss_sock_new(fd, domain, SS_SOCK_FRESH,
						(type & SOCK_NONBLOCK) != 0));
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
	s = ss_sock_get(fd);
	/*
	 * A server loads the transport before it listens, not at its first
	 * accept: an accepted client's HELLO is acknowledged by the progress
	 * thread, and a module and a thread made then could outlast the
	 * client's wait. Loading first makes a server slower to start, never
	 * slower to answer.
	 */
	if (s && !ss_in_vfork_child())
		ss_tp_load();
	ret = ss_real.listen(fd, backlog);
	if (s) {
		if (ret == 0)
			ss_sock_set_state(s, SS_SOCK_LISTEN);
		ss_sock_put(s);
	}
	return ret;
}

/*
 * nb: the accepted socket's O_NONBLOCK (accept4's SOCK_NONBLOCK; accept's
 * are blocking). addr, got: the peer's address as accept gave it
 * (accept_addr), kept when there was room (not 0: addr and got are set) for
 * all of it, so that the status tool needs no getpeername.
 */
static int after_accept(int lfd, int fd, bool nb, const struct sockaddr *addr, socklen_t room,
			const socklen_t *got)
{
	struct ss_sock *l, *s;
	unsigned urg_app;
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
	/* As the kernel copies the options. */
	urg_app = atomic_load(&l->urg_app) & (SS_URG_INLINE | SS_URG_ZEROCOPY);
	ss_sock_put(l);
	/* SRQSHIM_MODE=tcp, or after an io_uring ring: nothing to decide, nothing to track. */
	if (ss_cfg.mode == SS_MODE_TCP || ss_ring_seen()) {
		ss_sock_mark_plain_fd(fd);
		return fd;
	}
	s = ss_sock_new(fd, domain, SS_SOCK_ACCEPTED, nb);
	if (s) {
		int err = errno;

		if (room && *got <= room && *got <= sizeof(s->dst)) {
			memcpy(&s->dst, addr, *got);
			s->dst_len = *got;
		}
		atomic_store(&s->urg_app, urg_app);
		ss_server_accepted(s, fd);
		ss_sock_put(s);
		errno = err;
	}
	return fd;
}

/*
 * The peer's address as accept gives it: into the application's buffer, or,
 * on a TCP listener of ours, into the shim's own when the application asks
 * for none (addr NULL), so that the status tool lists the connection
 * without a getpeername. room:
 * the buffer's size before the kernel writes *len (0: no buffer, as
 * accept(fd, addr, NULL) is, which keeps the kernel's EFAULT).
 */
struct accept_addr {
	struct sockaddr_storage own;
	socklen_t own_len;
	struct sockaddr *addr;
	socklen_t *len;
	socklen_t room;
};

static void accept_addr_init(struct accept_addr *a, int lfd, struct sockaddr *addr, socklen_t *len)
{
	struct ss_sock *l = addr ? NULL : ss_sock_get(lfd);
	/* Only a TCP listener of ours: another family's accept may fail on the address
	 * (AF_ALG's sockets have none). */
	bool own = l && ss_sock_state(l) == SS_SOCK_LISTEN;

	ss_sock_put(l);
	a->own_len = sizeof(a->own);
	a->addr = own ? (struct sockaddr *)&a->own : addr;
	a->len = own ? &a->own_len : len;
	a->room = a->addr && a->len ? *a->len : 0;
}

EXPORT int accept(int fd, struct sockaddr *addr, socklen_t *len)
{
	struct accept_addr a;

	real_ready();
	accept_addr_init(&a, fd, addr, len);
	return after_accept(fd, ss_real.accept(fd, a.addr, a.len), false, a.addr, a.room, a.len);
}

EXPORT int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags)
{
	struct accept_addr a;

	real_ready();
	accept_addr_init(&a, fd, addr, len);
	return after_accept(fd, ss_real.accept4(fd, a.addr, a.len, flags),
			    (flags & SOCK_NONBLOCK) != 0, a.addr, a.room, a.len);
}

/* connect() again on a socket whose connect the shim runs: what TCP would answer. */
static int connect_again(struct ss_sock *s)
{
	switch (ss_sock_state(s)) {
	case SS_SOCK_CONNECTING: return -EALREADY;
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
	default: return 1; /* the kernel's answer */
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
	if (count == 0) /* a socket's read of nothing is 0 at once (a recv of nothing waits) */
		return ss_real.read(fd, buf, count);
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
	/* As read() of nothing; a bad iovec is the kernel's to refuse. */
	if (n <= 0 || !iov || ss_iov_total(iov, n) == 0)
		return ss_real.readv(fd, iov, n);
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
	/* A connection passed to another process moves back to TCP first (down.c). */
	if (msg->msg_controllen && msg->msg_control)
		ss_down_passed_fds(msg);
	r = ss_io_send(fd, msg->msg_iov, (int)msg->msg_iovlen, flags, &handled);
	return handled ? to_libc(r) : ss_real.sendmsg(fd, msg, flags);
}

/* ---- the end of the process image: accepted bytes are delivered first ---- */

EXPORT void _exit(int code)
{
	real_ready();
	ss_shim_leaving(true);
	ss_real._exit(code);
	__builtin_unreachable();
}

EXPORT void _Exit(int code)
{
	real_ready();
	ss_shim_leaving(true);
	ss_real._Exit(code);
	__builtin_unreachable();
}

/*
 * An exec: what was closed is delivered first, and each upgraded connection
 * whose fd the new image inherits moves back onto its TCP connection
 * (down.c), so that the new image gets a TCP socket with the stream intact.
 */
/* spawn: a posix_spawn with its file actions fa (or NULL); this process goes on. */
static void exec_prepare(bool spawn, const posix_spawn_file_actions_t *fa)
{
	if (!ss_in_call && !ss_in_vfork_child())
		ss_down_before_exec(fa);
	if (!spawn)
		ss_shim_leaving(false);
}

EXPORT int execve(const char *path, char *const argv[], char *const envp[])
{
	real_ready();
	exec_prepare(false, NULL);
	return ss_real.execve(path, argv, envp);
}

EXPORT int execv(const char *path, char *const argv[])
{
	real_ready();
	exec_prepare(false, NULL);
	return ss_real.execv(path, argv);
}

EXPORT int execvp(const char *file, char *const argv[])
{
	real_ready();
	exec_prepare(false, NULL);
	return ss_real.execvp(file, argv);
}

EXPORT int execvpe(const char *file, char *const argv[], char *const envp[])
{
	real_ready();
	exec_prepare(false, NULL);
	return ss_real.execvpe(file, argv, envp);
}

/* stdio reads and writes with glibc's own calls, past the shim: the connection moves first. */
EXPORT FILE *fdopen(int fd, const char *mode)
{
	real_ready();
	ss_down_fd(fd);
	return ss_real.fdopen(fd, mode);
}

/*
 * dprintf writes with glibc's own calls, past the shim: on a socket the
 * shim carries, the text is formatted here and written through the shim,
 * so the connection stays where it is. The fortified variants format with
 * glibc's fortified vasprintf, so their %n check holds there too (flag 0:
 * none, as plain vasprintf).
 */
static bool dprintf_fd_is_ours(int fd)
{
	struct ss_sock *s = ss_sock_get(fd);

	if (s)
		ss_sock_put(s);
	return s != NULL;
}

static int dprintf_through_shim(int fd, int flag, const char *fmt, va_list ap)
{
	char *text;
	int n;

	if ((n = __vasprintf_chk(&text, flag, fmt, ap)) < 0)
		return -1;
	for (int off = 0; off < n;) {
		ssize_t w = write(fd, text + off, (size_t)(n - off));

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			if (w == 0)
				errno = EIO;
			free(text);
			return -1;
		}
		off += (int)w;
	}
	free(text);
	return n;
}

EXPORT int vdprintf(int fd, const char *fmt, va_list ap)
{
	real_ready();
	return dprintf_fd_is_ours(fd) ? dprintf_through_shim(fd, 0, fmt, ap)
				      : ss_real.vdprintf(fd, fmt, ap);
}

EXPORT int dprintf(int fd, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vdprintf(fd, fmt, ap);
	va_end(ap);
	return n;
}

EXPORT int __vdprintf_chk(int fd, int flag, const char *fmt, va_list ap)
{
	real_ready();
	return dprintf_fd_is_ours(fd) ? dprintf_through_shim(fd, flag, fmt, ap)
				      : ss_real.__vdprintf_chk(fd, flag, fmt, ap);
}

EXPORT int __dprintf_chk(int fd, int flag, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = __vdprintf_chk(fd, flag, fmt, ap);
	va_end(ap);
	return n;
}

EXPORT int fexecve(int fd, char *const argv[], char *const envp[])
{
	real_ready();
	exec_prepare(false, NULL);
	return ss_real.fexecve(fd, argv, envp);
}

/*
 * posix_spawn: the program's connections move back to TCP first, as an
 * exec's (the names it inherits and the sources of its file actions'
 * dup2); this process goes on, so nothing of its own is delivered first.
 */
EXPORT int posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
		       const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
	real_ready();
	exec_prepare(true, fa);
	return ss_real.posix_spawn(pid, path, fa, attr, argv, envp);
}

EXPORT int posix_spawnp(pid_t *pid, const char *file, const posix_spawn_file_actions_t *fa,
			const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
	real_ready();
	exec_prepare(true, fa);
	return ss_real.posix_spawnp(pid, file, fa, attr, argv, envp);
}

EXPORT int posix_spawn_file_actions_init(posix_spawn_file_actions_t *fa)
{
	real_ready();
	ss_spawn_forget(fa);
	return ss_real.posix_spawn_file_actions_init(fa);
}

EXPORT int posix_spawn_file_actions_destroy(posix_spawn_file_actions_t *fa)
{
	real_ready();
	ss_spawn_forget(fa);
	return ss_real.posix_spawn_file_actions_destroy(fa);
}

EXPORT int posix_spawn_file_actions_adddup2(posix_spawn_file_actions_t *fa, int fd, int newfd)
{
	int r;

	real_ready();
	r = ss_real.posix_spawn_file_actions_adddup2(fa, fd, newfd);
	if (r == 0)
		ss_spawn_note_dup(fa, fd);
	return r;
}

/*
 * liburing's ring set-up (its reads and writes then go past libc): every
 * connection moves back to TCP first (docs/design.md). Resolved when first
 * called: a program without liburing never calls these.
 */
struct io_uring;
struct io_uring_params;
int io_uring_queue_init(unsigned entries, struct io_uring *ring, unsigned flags);
int io_uring_queue_init_params(unsigned entries, struct io_uring *ring, struct io_uring_params *p);
int io_uring_setup(unsigned entries, struct io_uring_params *p);

static void *ring_real(const char *name)
{
	void *f = dlsym(RTLD_NEXT, name);

	if (!f)
		errno = ENOSYS;
	return f;
}

EXPORT int io_uring_queue_init(unsigned entries, struct io_uring *ring, unsigned flags)
{
	int (*f)(unsigned, struct io_uring *, unsigned) = ring_real("io_uring_queue_init");

	real_ready();
	ss_down_before_ring();
	return f ? f(entries, ring, flags) : -ENOSYS;
}

EXPORT int io_uring_queue_init_params(unsigned entries, struct io_uring *ring,
				      struct io_uring_params *p)
{
	int (*f)(unsigned, struct io_uring *, struct io_uring_params *) =
		ring_real("io_uring_queue_init_params");

	real_ready();
	ss_down_before_ring();
	return f ? f(entries, ring, p) : -ENOSYS;
}

EXPORT int io_uring_setup(unsigned entries, struct io_uring_params *p)
{
	int (*f)(unsigned, struct io_uring_params *) = ring_real("io_uring_setup");

	real_ready();
	ss_down_before_ring();
	return f ? f(entries, p) : -ENOSYS;
}

enum exec_how { EXEC_PATH, EXEC_SEARCH, EXEC_ENV };

/*
 * The list forms: their arguments (first, then up to a NULL) into an array
 * on the stack, as glibc does, then the array form above; EXEC_ENV takes
 * the environment that follows the NULL.
 */
static int exec_list(enum exec_how how, const char *file, const char *first, va_list *ap)
{
	size_t n = 0;
	va_list cp;

	va_copy(cp, *ap);
	if (first)
		for (n = 1; va_arg(cp, char *); n++)
			;
	va_end(cp);
	char *argv[n + 1];
	argv[0] = (char *)first;
	for (size_t i = 1; i < n; i++)
		argv[i] = va_arg(*ap, char *);
	if (n)
		(void)va_arg(*ap, char *); /* the NULL */
	argv[n] = NULL;
	switch (how) {
	case EXEC_PATH: return execv(file, argv);
	case EXEC_SEARCH: return execvp(file, argv);
	default: return execve(file, argv, va_arg(*ap, char **));
	}
}

EXPORT int execl(const char *path, const char *arg, ...)
{
	va_list ap;
	int r;

	va_start(ap, arg);
	r = exec_list(EXEC_PATH, path, arg, &ap);
	va_end(ap);
	return r;
}

EXPORT int execlp(const char *file, const char *arg, ...)
{
	va_list ap;
	int r;

	va_start(ap, arg);
	r = exec_list(EXEC_SEARCH, file, arg, &ap);
	va_end(ap);
	return r;
}

EXPORT int execle(const char *path, const char *arg, ...)
{
	va_list ap;
	int r;

	va_start(ap, arg);
	r = exec_list(EXEC_ENV, path, arg, &ap);
	va_end(ap);
	return r;
}

/* ---- many messages, files and pipes (xfer.c) ---- */

EXPORT int sendmmsg(int fd, struct mmsghdr *v, unsigned n, int flags)
{
	bool handled;
	int r;

	real_ready();
	/* As sendmsg: connections passed to another process move back to TCP first. */
	for (unsigned i = 0; v && i < n; i++)
		if (v[i].msg_hdr.msg_controllen && v[i].msg_hdr.msg_control)
			ss_down_passed_fds(&v[i].msg_hdr);
	r = ss_xfer_sendmmsg(fd, v, n, flags, &handled);
	return handled ? (int)to_libc(r) : ss_real.sendmmsg(fd, v, n, flags);
}

EXPORT int recvmmsg(int fd, struct mmsghdr *v, unsigned n, int flags, struct timespec *timeout)
{
	bool handled;
	int r;

	real_ready();
	r = ss_xfer_recvmmsg(fd, v, n, flags, timeout, &handled);
	return handled ? (int)to_libc(r) : ss_real.recvmmsg(fd, v, n, flags, timeout);
}

EXPORT ssize_t sendfile(int out, int in, off_t *offset, size_t count)
{
	bool handled;
	ssize_t r;

	real_ready();
	r = ss_xfer_sendfile(out, in, offset, count, &handled);
	return handled ? to_libc(r) : ss_real.sendfile(out, in, offset, count);
}

/* The same call where off_t is 64 bits (every 64-bit target). */
EXPORT ssize_t sendfile64(int out, int in, off_t *offset, size_t count)
{
	return sendfile(out, in, offset, count);
}

EXPORT ssize_t splice(int in, loff_t *off_in, int out, loff_t *off_out, size_t len, unsigned flags)
{
	bool handled;
	ssize_t r;

	real_ready();
	r = ss_xfer_splice(in, off_in, out, off_out, len, flags, &handled);
	return handled ? to_libc(r) : ss_real.splice(in, off_in, out, off_out, len, flags);
}

/* ---- the end of a socket ---- */

/* The last name of s is gone: what was accepted is delivered, its registrations go. */
static void last_name_closed(struct ss_sock *s)
{
	int err = errno;

	/* Unless a forked child holds it too: it stays for that child (inherit.c). */
	if (!ss_inherit_keep(s))
		ss_sock_finish(s, true);
	ss_epoll_sock_gone(s);
	ss_sock_put(s);
	errno = err;
}

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
	/* One of our private numbers closed by the application (a close loop) is not ours now. */
	ss_ownfd_forget(fd);
	s = ss_sock_remove_fd(fd, &ret);
	if (s) {
		last_name_closed(s);
	} else if (ss_epoll_is_ours(fd)) {
		int err = errno;

		ss_epoll_closed(fd);
		errno = err;
	}
	return ret;
}

/*
 * The application's close_range and closefrom close what it owns and leave
 * the shim's own fds (ownfd.h) and the transport's open: a daemon's
 * closefrom(3) must not take the connections' private sockets or the
 * device with it. The range is closed in pieces around them.
 */
EXPORT int close_range(unsigned first, unsigned last, int flags)
{
	struct ss_kept kept;
	int ret, err;

	real_ready();
	/*
	 * Our fds are close-on-exec already; a vfork child's table is its own;
	 * flags the kernel does not know are its EINVAL before anything.
	 */
	if ((flags & CLOSE_RANGE_CLOEXEC) || (flags & ~(int)CLOSE_RANGE_UNSHARE) || first > last ||
	    ss_in_vfork_child())
		return ss_real.close_range(first, last, flags);
	ss_kept_fill(&kept);
	/*
	 * With UNSHARE only this thread's new table loses them: the names stay
	 * the process's. Unless it has one thread: then nothing is shared, and
	 * the kernel closes the only table.
	 */
	if (!(flags & CLOSE_RANGE_UNSHARE) || ss_kept_one_thread()) {
		int top = ss_sock_table_size();
		unsigned k = first;
		bool has = ss_kept_next(&kept, first, last, &k);

		for (unsigned fd = first; fd <= last && fd < (unsigned)top; fd++) {
			if (has && fd == k) {
				has = fd < last && ss_kept_next(&kept, fd + 1, last, &k);
				continue;
			}
			struct ss_sock *s = ss_sock_remove_fd((int)fd, NULL);

			if (s)
				last_name_closed(s);
			else
				ss_epoll_closed((int)fd);
		}
	}
	ret = ss_kept_close_range(&kept, first, last, flags);
	err = errno;
	ss_kept_free(&kept);
	errno = err;
	return ret;
}

EXPORT void closefrom(int lowfd)
{
	unsigned from = lowfd < 0 ? 0 : (unsigned)lowfd;
	struct ss_kept kept;
	struct rlimit rl;
	unsigned k;

	if (close_range(from, ~0U, 0) == 0)
		return;
	/* A kernel without close_range: one close per number, up to the limit. */
	ss_kept_fill(&kept);
	if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY ||
	    rl.rlim_cur > INT_MAX)
		rl.rlim_cur = INT_MAX;
	for (unsigned fd = from; fd < rl.rlim_cur; fd++)
		if (!ss_kept_next(&kept, fd, fd, &k))
			close((int)fd);
	ss_kept_free(&kept);
}

/* A client whose TCP connect still runs (lock held): CONNECTING, or ASKING before its HELLO. */
static bool shut_connect_runs(struct ss_sock *s)
{
	int st = ss_sock_state(s);

	return st == SS_SOCK_CONNECTING || (st == SS_SOCK_ASKING && !s->hello_sent);
}

/*
 * shutdown() while the TCP connect runs: Linux's aborts the connect
 * (ECONNRESET pending, the socket unconnected again), whatever how says.
 * So does ours, once a look finds the connect still running; the
 * negotiation then ends as after a failed connect (plain, the error the
 * application's). Lock held; true when that was the case.
 */
static bool shut_connecting(struct ss_sock *s, int how, int *ret)
{
	if (!shut_connect_runs(s))
		return false;
	ss_client_step(s); /* it may have ended meanwhile: then the HELLO goes out first */
	if (!shut_connect_runs(s))
		return false;
	/*
	 * Should the connect end before the shutdown below (the kernel does
	 * not wait for our lock), the shutdown applies to the connection, as
	 * TCP's in that order: the connection is the application's as it is,
	 * and no HELLO goes on it (its send would fail, or its answer be read
	 * past our own end of stream).
	 */
	s->shut_early = true;
	ss_test_delay(SS_TP_SHUT_CONNECT);
	*ret = ss_real.shutdown(s->tcp_fd, how) ? -errno : 0;
	ss_client_step(s);
	return true;
}

EXPORT int shutdown(int fd, int how)
{
	struct ss_sock *s;
	int ret, st;

	real_ready();
	s = ss_sock_get(fd);
	if (!s || ss_sock_state(s) < SS_SOCK_CONNECTING) {
		ss_sock_put(s);
		return ss_real.shutdown(fd, how);
	}
	ss_in_call++;
	/*
	 * An accepted connection is decided first, as a write decides it
	 * (waiting as long: SRQSHIM_SERVER_WAIT_MS and four round trips for the
	 * HELLO): its TCP socket must not be shut under a HELLO that may still
	 * come (our read of it would take the end for the client's), and an
	 * upgrade must still be answered.
	 */
	if (ss_sock_state(s) == SS_SOCK_ACCEPTED &&
	    (how == SHUT_RD || how == SHUT_WR || how == SHUT_RDWR))
		ss_io_decide_for_write(s, fd);
	ret = 0;
	/* On TCP and free to move: never from here on (a move under way ends first). */
	if (ss_sock_state(s) == SS_SOCK_LATE &&
	    (how == SHUT_RD || how == SHUT_WR || how == SHUT_RDWR) &&
	    ss_move_shutdown(s, how, &ret))
		goto out;
	if (ss_sock_state(s) == SS_SOCK_PLAIN) {
		/*
		 * Plain for good: no lock needed (a read waiting for the first
		 * bytes, io.c, is woken by this shutdown itself). Handshake
		 * messages may still be taken off its head: the read shut is
		 * known first, so that its end is not taken for the peer's.
		 */
		if (how == SHUT_RD || how == SHUT_RDWR)
			atomic_store(&s->shut_rd, true);
		ret = ss_real.shutdown(fd, how) ? -errno : 0;
		goto out;
	}
	pthread_mutex_lock(&s->lock);
	st = ss_sock_state(s); /* again, under the lock: it may have moved on */
	if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR) {
		ret = -EINVAL;
	} else if (shut_connecting(s, how, &ret)) {
		/* The connect is aborted: nothing else to shut. */
	} else if ((st = ss_sock_state(s)) == SS_SOCK_PLAIN) {
		ret = ss_real.shutdown(fd, how) ? -errno : 0;
	} else {
		/*
		 * Reading: reads see the end once nothing is theirs (io.c), TCP's
		 * once plain. It shows at once, as TCP's: upgraded, IN and RDHUP
		 * (ss_ready_conn); asking, whose fd is its TCP socket, the kernel's
		 * end (the answer read takes it for ours, not the server's).
		 */
		if (how != SHUT_WR && !atomic_exchange(&s->shut_rd, true)) {
			if (st == SS_SOCK_UPGRADED)
				ss_tp->conn_resync(s->conn);
			else if (st == SS_SOCK_ASKING)
				ss_real.shutdown(fd, SHUT_RD);
		}
		if (how != SHUT_RD && st == SS_SOCK_UPGRADED) {
			s->shut_wr = true;
			ret = ss_tp->conn_shutdown_wr(s->conn);
		} else if (how != SHUT_RD) {
			/* Undecided (or falling back): the end of the stream follows what is held.
			 */
			s->shut_wr_held = true;
		}
	}
	pthread_mutex_unlock(&s->lock);
out:
	ss_in_call--;
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
		ss_epoll_dup(oldfd, newfd);
	}
	return newfd;
}

/* dup2/dup3 onto a tracked fd closes that name first, as the kernel would. */
static void forget_target(int oldfd, int newfd)
{
	struct ss_sock *t;

	if (oldfd == newfd || ss_in_vfork_child())
		return;
	ss_ownfd_forget(newfd); /* a private number the application puts its file on is its own */
	t = ss_sock_remove_fd(newfd, NULL);
	if (t)
		last_name_closed(t);
	else
		ss_epoll_closed(newfd);
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

/*
 * The application set its open file's O_NONBLOCK (nb: 0 or 1) or tried to
 * (ret < 0: what the socket remembers goes, to be asked again).
 */
static void flags_changed(int fd, int ret, int nb)
{
	struct ss_sock *s = ss_sock_get(fd);

	if (s)
		atomic_store_explicit(&s->nonblock, ret < 0 ? -1 : nb, memory_order_relaxed);
	ss_sock_put(s);
}

/*
 * Whether a socket call makes the application take urgent data (or
 * zerocopy completions) itself: then the socket never moves, and a LATE
 * one is pinned before the call (an upgraded one, for zerocopy, moves
 * back: ss_move_urg_app).
 */
static void urg_app_before(int fd, unsigned how)
{
	struct ss_sock *s = how ? ss_sock_get(fd) : NULL;

	if (s)
		ss_move_urg_app(s, how);
	ss_sock_put(s);
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
	/* An owner gets SIGURG for the peer's urgent byte: the peer's mark must never be one. */
	urg_app_before(fd,
		       cmd == F_SETOWN || cmd == F_SETOWN_EX || cmd == F_SETSIG ? SS_URG_OWNER : 0);
	if (cmd == F_SETFL) {
		int ret = ss_real.fcntl(fd, cmd, arg);

		flags_changed(fd, ret, (arg & O_NONBLOCK) != 0);
		return ret;
	}
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
	va_list ap;
	void *arg;

	real_ready();
	va_start(ap, req);
	arg = va_arg(ap, void *);
	va_end(ap);
	if (req == FIONREAD || req == SIOCOUTQ || req == SIOCOUTQNSD || req == SIOCATMARK) {
		bool handled;
		int r = ss_io_queue_ioctl(fd, req, (int *)arg, &handled);

		if (handled)
			return (int)to_libc(r);
	}
	urg_app_before(fd, req == FIOSETOWN || req == SIOCSPGRP ? SS_URG_OWNER : 0);
	if (req == FIONBIO) {
		int ret = ss_real.ioctl(fd, req, arg);

		flags_changed(fd, arg ? ret : -1, arg && *(int *)arg != 0);
		return ret;
	}
	return ss_real.ioctl(fd, req, arg);
}

/* ---- options and names: answered by the TCP socket ---- */

/* The fd that answers for fd: its TCP socket once upgraded. */
static int tcp_of(int fd, struct ss_sock **s_p)
{
	struct ss_sock *s = ss_sock_get(fd);

	*s_p = s;
	/*
	 * An accepted connection not yet decided: the application's fd still
	 * names the TCP socket, and tcp_fd is only the progress thread's
	 * watch, which it may close at any moment (use it, and a
	 * getsockname right after accept could fail with EBADF).
	 */
	if (!s || ss_sock_state(s) == SS_SOCK_ACCEPTED || ss_sock_state(s) == SS_SOCK_ASKING)
		return fd;
	return s->tcp_fd >= 0 ? s->tcp_fd : fd;
}

EXPORT int getsockopt(int fd, int level, int name, void *val, socklen_t *len)
{
	struct ss_sock *s;
	int tfd = tcp_of(fd, &s), ret;
	bool so_error =
		s && level == SOL_SOCKET && name == SO_ERROR && val && len && *len >= sizeof(int);
	int err = -1; /* -1: the kernel answers */

	real_ready();
	if (so_error && ss_sock_state(s) == SS_SOCK_UPGRADED)
		/* The TCP socket is fine; a failed connection reports its reset, once. */
		err = (ss_tp->conn_ready(s->conn) & SS_RDY_ERR) && ss_io_take_reset(s) ? ECONNRESET
										       : 0;
	else if (so_error && ss_sock_state(s) == SS_SOCK_PLAIN)
		/* The error our own send took (asking.c): reported once, as the kernel's. */
		err = atomic_exchange(&s->plain_err, 0) ?: -1;
	if (err >= 0) {
		*(int *)val = err;
		*len = sizeof(int);
		ss_sock_put(s);
		return 0;
	}
	ret = ss_real.getsockopt(tfd, level, name, val, len);
	ss_sock_put(s);
	return ret;
}

/*
 * What of TCP's own an option turned on makes the application's
 * (SS_URG_*): urgent bytes in the stream (the peer's mark must never be
 * there), zerocopy completions on the error queue (TCP's alone).
 */
static unsigned option_urg_app(int level, int name, const void *val, socklen_t len)
{
	if (level != SOL_SOCKET || !val || len < sizeof(int) || *(const int *)val == 0)
		return 0;
	if (name == SO_OOBINLINE)
		return SS_URG_INLINE;
	return name == SO_ZEROCOPY ? SS_URG_ZEROCOPY : 0;
}

EXPORT int setsockopt(int fd, int level, int name, const void *val, socklen_t len)
{
	unsigned urg = option_urg_app(level, name, val, len);
	struct ss_sock *s;
	int tfd, ret;

	real_ready();
	urg_app_before(fd, urg);
	tfd = tcp_of(fd, &s);
	/* Zerocopy completions that an upgraded connection cannot give (it could not move back). */
	if (s && ss_sock_state(s) == SS_SOCK_UPGRADED && urg == SS_URG_ZEROCOPY) {
		ss_sock_put(s);
		errno = EOPNOTSUPP;
		return -1;
	}
	ret = ss_real.setsockopt(tfd, level, name, val, len);
	if (ret == 0 && s) {
		pthread_mutex_lock(&s->lock);
		int st = ss_sock_state(s);
		/* Recorded for a plain reconnect, as long as one may happen. */
		if ((st == SS_SOCK_FRESH || st == SS_SOCK_CONNECTING || st == SS_SOCK_PROBING ||
		     st == SS_SOCK_ASKING) &&
		    s->n_opts < 16 && len <= sizeof(s->opts[0].val)) {
			struct ss_opt_rec *o = &s->opts[s->n_opts++];
			o->level = level;
			o->name = name;
			o->len = len;
			memcpy(o->val, val, len);
		}
		if (level == SOL_SOCKET && name == SO_RCVLOWAT && len >= sizeof(int))
			s->lowat = *(const int *)val > 1;
		if (level == IPPROTO_TCP && name == TCP_CORK && len >= sizeof(int)) {
			s->cork = *(const int *)val != 0;
			if (!s->cork && st == SS_SOCK_UPGRADED) {
				struct iovec none = {NULL, 0};
				ss_tp->conn_send(s->conn, &none, 0,
						 false); /* flush what was held */
			}
		}
		pthread_mutex_unlock(&s->lock);
		if (level == SOL_SOCKET && (name == SO_RCVTIMEO || name == SO_SNDTIMEO)) {
			/* The application's fd itself keeps its own timeouts and flags. */
			if (tfd != fd)
				ss_real.setsockopt(fd, level, name, val, len);
			ss_io_timeo_changed(s, name == SO_SNDTIMEO);
		}
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

/* ---- epoll: instances answered in user space (epoll.c) ---- */

/* A timespec as whole milliseconds, rounded up (-1 for none). */
static int ms_of_ts(const struct timespec *ts)
{
	long long ms;

	if (!ts)
		return -1;
	ms = (long long)ts->tv_sec * 1000 + (ts->tv_nsec + 999999) / 1000000;
	return ms > INT_MAX ? INT_MAX : (int)ms;
}

EXPORT int epoll_create(int size)
{
	int fd;

	real_ready();
	fd = ss_real.epoll_create(size);
	ss_epoll_created(fd);
	return fd;
}

EXPORT int epoll_create1(int flags)
{
	int fd;

	real_ready();
	fd = ss_real.epoll_create1(flags);
	ss_epoll_created(fd);
	return fd;
}

EXPORT int epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev)
{
	struct ss_sock *s;
	int ret;

	real_ready();
	s = ss_sock_get(fd);
	if (!s) {
		/* An instance nested in another cannot be answered in user space any more. */
		if (op == EPOLL_CTL_ADD && ss_epoll_is_ours(fd))
			ss_epoll_to_kernel(fd);
		ret = ss_real.epoll_ctl(epfd, op, fd, ev);
		if (ret == 0)
			ss_epoll_count_kernel(epfd, op);
		return ret;
	}
	ret = ss_epoll_ctl(epfd, op, fd, s, ev);
	ss_sock_put(s);
	return (int)to_libc(ret);
}

EXPORT int epoll_wait(int epfd, struct epoll_event *evs, int max, int timeout)
{
	bool handled;
	int n;

	real_ready();
	n = ss_epoll_wait(epfd, evs, max, timeout, NULL, &handled);
	return handled ? (int)to_libc(n) : ss_real.epoll_wait(epfd, evs, max, timeout);
}

EXPORT int epoll_pwait(int epfd, struct epoll_event *evs, int max, int timeout,
		       const sigset_t *mask)
{
	bool handled;
	int n;

	real_ready();
	n = ss_epoll_wait(epfd, evs, max, timeout, mask, &handled);
	return handled ? (int)to_libc(n) : ss_real.epoll_pwait(epfd, evs, max, timeout, mask);
}

EXPORT int epoll_pwait2(int epfd, struct epoll_event *evs, int max, const struct timespec *ts,
			const sigset_t *mask)
{
	static int (*real_pwait2)(int, struct epoll_event *, int, const struct timespec *,
				  const sigset_t *);
	int timeout = ms_of_ts(ts), n;
	bool handled;

	real_ready();
	n = ss_epoll_wait(epfd, evs, max, timeout, mask, &handled);
	if (handled)
		return (int)to_libc(n);
	if (!real_pwait2)
		real_pwait2 = dlsym(RTLD_NEXT, "epoll_pwait2");
	if (!real_pwait2)
		return ss_real.epoll_pwait(epfd, evs, max, timeout, mask);
	return real_pwait2(epfd, evs, max, ts, mask);
}

/* ---- poll and select (mux.c) ---- */

EXPORT int poll(struct pollfd *fds, nfds_t n, int timeout)
{
	bool handled;
	int r;

	real_ready();
	r = ss_poll(fds, n, timeout, NULL, &handled);
	return handled ? (int)to_libc(r) : ss_real.poll(fds, n, timeout);
}

int __poll_chk(struct pollfd *fds, nfds_t n, int timeout, size_t fdslen);
EXPORT int __poll_chk(struct pollfd *fds, nfds_t n, int timeout, size_t fdslen)
{
	if (fdslen / sizeof(*fds) < n)
		abort(); /* as glibc's fortified check does */
	return poll(fds, n, timeout);
}

EXPORT int ppoll(struct pollfd *fds, nfds_t n, const struct timespec *ts, const sigset_t *mask)
{
	bool handled;
	int r;

	real_ready();
	r = ss_poll(fds, n, ms_of_ts(ts), mask, &handled);
	return handled ? (int)to_libc(r) : ss_real.ppoll(fds, n, ts, mask);
}

int __ppoll_chk(struct pollfd *fds, nfds_t n, const struct timespec *ts, const sigset_t *mask,
		size_t fdslen);
EXPORT int __ppoll_chk(struct pollfd *fds, nfds_t n, const struct timespec *ts,
		       const sigset_t *mask, size_t fdslen)
{
	if (fdslen / sizeof(*fds) < n)
		abort();
	return ppoll(fds, n, ts, mask);
}

EXPORT int select(int nfds, fd_set *rd, fd_set *wr, fd_set *ex, struct timeval *tv)
{
	int timeout = -1, r;
	uint64_t start = 0;
	bool handled;

	real_ready();
	if (tv) {
		long long ms = (long long)tv->tv_sec * 1000 + (tv->tv_usec + 999) / 1000;

		timeout = ms > INT_MAX ? INT_MAX : (int)ms;
		start = ss_now_us();
	}
	r = ss_select(nfds, rd, wr, ex, timeout, NULL, &handled);
	if (!handled)
		return ss_real.select(nfds, rd, wr, ex, tv);
	if (tv) {
		/* As Linux: the time not slept is left in *tv. */
		uint64_t spent = ss_now_us() - start,
			 total = (uint64_t)tv->tv_sec * 1000000 + (uint64_t)tv->tv_usec;
		uint64_t left = spent < total ? total - spent : 0;

		tv->tv_sec = (time_t)(left / 1000000);
		tv->tv_usec = (suseconds_t)(left % 1000000);
	}
	return (int)to_libc(r);
}

EXPORT int pselect(int nfds, fd_set *rd, fd_set *wr, fd_set *ex, const struct timespec *ts,
		   const sigset_t *mask)
{
	bool handled;
	int r;

	real_ready();
	r = ss_select(nfds, rd, wr, ex, ms_of_ts(ts), mask, &handled);
	return handled ? (int)to_libc(r) : ss_real.pselect(nfds, rd, wr, ex, ts, mask);
}
