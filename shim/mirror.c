/*
 * The application's fd and what it shows. While the shim carries a
 * connection, the application's fd number names one end of an AF_UNIX
 * socketpair, which can show readable, writable, both, neither or hang-up
 * exactly as the TCP socket would; the TCP socket itself sits on a private
 * close-on-exec fd. This file moves objects between fd numbers (keeping
 * each name's flags and the application's epoll registrations) and keeps
 * the socketpair showing the connection's readiness.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <stdatomic.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/select.h>
#include <unistd.h>

#include "shim/epoll.h"
#include "shim/ownfd.h"
#include "shim/real.h"
#include "shim/shim.h"
#include "transport/log.h"

/*
 * Where private fds start: at FD_SETSIZE (1024), above every number an
 * application that uses select() can have, or half way up a lower soft
 * limit of open files (at least 512). Not higher: the kernel sizes a
 * process's fd table by its highest number (8 bytes a number, zeroed),
 * so half a soft limit of 1,048,576 gave every shimmed process an 8 MiB
 * table. Asked once: setrlimit is not ours to see.
 */
static int mirror_private_base(void)
{
	static atomic_int base; /* 0: not asked yet */
	int b = atomic_load_explicit(&base, memory_order_relaxed);
	struct rlimit rl;

	if (b)
		return b;
	b = 512;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
	    rl.rlim_cur / 2 > (rlim_t)b)
		b = rl.rlim_cur / 2 < FD_SETSIZE ? (int)(rl.rlim_cur / 2) : FD_SETSIZE;
	atomic_store_explicit(&base, b, memory_order_relaxed);
	return b;
}

void ss_private_table_grow(void)
{
	/* Room for as many private fds as the numbers below them. */
	int fd = eventfd(0, EFD_CLOEXEC), top;

	if (fd < 0)
		return;
	top = ss_real.fcntl(fd, F_DUPFD_CLOEXEC, 2 * mirror_private_base() - 1);
	if (top >= 0)
		ss_real.close(top);
	ss_real.close(fd);
}

int ss_private_fd(int fd)
{
	/* Above the application's fds; below them if the limit was lowered since. */
	int nfd = ss_real.fcntl(fd, F_DUPFD_CLOEXEC, mirror_private_base());

	if (nfd < 0)
		nfd = ss_real.fcntl(fd, F_DUPFD_CLOEXEC, 3);
	if (nfd < 0)
		return -errno;
	ss_ownfd_add(nfd);
	return nfd;
}

int ss_private_eventfd(void)
{
	int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK), high;

	if (fd < 0)
		return -1;
	high = ss_private_fd(fd);
	if (high < 0)
		return fd; /* no number above the application's: this one */
	ss_real.close(fd);
	return high;
}

void ss_private_close(int fd)
{
	ss_ownfd_forget(fd);
	ss_real.close(fd);
}

int ss_put_on_names(struct ss_sock *s, int newfd)
{
	int ret = 0;

	/* The names share newfd's open file from here on: its flags, asked once. */
	int nfl = ss_real.fcntl(newfd, F_GETFL);

	pthread_mutex_lock(&s->fd_lock);
	for (int i = 0; i < s->n_fds; i++) {
		int fd = s->fds[i];
		int fdflags = ss_real.fcntl(fd, F_GETFD);
		int flflags = ss_real.fcntl(fd, F_GETFL);

		ss_epoll_drop_kernel(s, fd);
		if (ss_real.dup3(newfd, fd, fdflags & FD_CLOEXEC ? O_CLOEXEC : 0) < 0)
			ret = -errno;
		/* O_NONBLOCK lives in the open file: carry it over (when it differs). */
		if (flflags >= 0 && nfl >= 0 && (nfl & O_NONBLOCK) != (flflags & O_NONBLOCK)) {
			nfl = (nfl & ~O_NONBLOCK) | (flflags & O_NONBLOCK);
			ss_real.fcntl(fd, F_SETFL, nfl);
		}
		ss_epoll_readd_kernel(s, fd);
	}
	pthread_mutex_unlock(&s->fd_lock);
	/* newfd: our private TCP socket (ss_leave_pair), or our socketpair end, never remembered.
	 */
	ss_private_close(newfd);
	return ret;
}

/*
 * What fills the application's end so that it shows "not writable": more
 * than its smallest send buffer holds, so one send that takes less than
 * all of it has filled it.
 */
static const char mirror_junk[16384];

/* Fills the application's end app with junk; a send that took less than all of it has filled it. */
static void mirror_fill(int app)
{
	while (ss_real.send(app, mirror_junk, sizeof(mirror_junk), MSG_DONTWAIT | MSG_NOSIGNAL) ==
	       (ssize_t)sizeof(mirror_junk))
		;
}

static void mirror_drain(int fd)
{
	char buf[4096];

	while (ss_real.recv(fd, buf, sizeof(buf), MSG_DONTWAIT) > 0)
		;
}

int ss_enter_pair(struct ss_sock *s)
{
	static const int timeouts[] = {SO_RCVTIMEO, SO_SNDTIMEO};
	int sv[2], shim, ret;

	if (ss_real.fcntl(s->fds[0], F_GETFD) < 0)
		return -EBADF;
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		return -errno;
	if (s->tcp_fd < 0) {
		s->tcp_fd = ss_private_fd(s->fds[0]);
		if (s->tcp_fd < 0) {
			ret = s->tcp_fd;
			s->tcp_fd = -1;
			goto err_close;
		}
	}
	shim = ss_private_fd(sv[1]);
	ss_real.close(sv[1]);
	sv[1] = -1;
	if (shim < 0) {
		ret = shim;
		goto err_close;
	}
	/* A small buffer on the application's end: little junk shows "not writable". */
	int small = 1;
	ss_real.setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
	/* Blocking calls wait on the application's end: it takes over the socket's timeouts. */
	for (int i = 0; i < 2; i++) {
		struct timeval tv;
		socklen_t len = sizeof(tv);

		if (ss_real.getsockopt(s->tcp_fd, SOL_SOCKET, timeouts[i], &tv, &len) == 0 &&
		    (tv.tv_sec || tv.tv_usec))
			ss_real.setsockopt(sv[0], SOL_SOCKET, timeouts[i], &tv, len);
	}
	ss_real.fcntl(shim, F_SETFL, O_NONBLOCK);
	/* It shows nothing (junk fills the application's end) before the names see it. */
	mirror_fill(sv[0]);
	pthread_mutex_lock(&s->fd_lock);
	s->shim_fd = shim;
	s->tokens = 0;
	s->junk = true;
	s->rdhup_shown = s->hup_shown = false;
	s->mirror_on = true;
	pthread_mutex_unlock(&s->fd_lock);
	ret = ss_put_on_names(s, sv[0]);
	/*
	 * The TCP socket is ours now: the shim never blocks on it unasked
	 * (only now: until the names left it, its open file was theirs too).
	 */
	ss_real.fcntl(s->tcp_fd, F_SETFL, ss_real.fcntl(s->tcp_fd, F_GETFL) | O_NONBLOCK);
	return ret;

err_close:
	ss_real.close(sv[0]);
	if (sv[1] >= 0)
		ss_real.close(sv[1]);
	return ret;
}

int ss_leave_pair(struct ss_sock *s, bool failed)
{
	int tcp = s->tcp_fd, ret;

	/*
	 * A thread blocked writing into the application's end (to wait for
	 * "writable") must be out before the fd number names the TCP socket,
	 * or its byte would go there: the end is made writable while there
	 * are such writers, and no new one starts once mirror_on is off.
	 * Only for them: a wait in epoll, poll or select on the old end
	 * must not wake up before the TCP socket has the fd number (after a
	 * failed connect it would miss the socket's error). It wakes below,
	 * once the number is the socket's: a failed connect closes our end
	 * with the junk unread, so the old end shows writable, an error and
	 * the end, as the failed socket does; a live connection's old end is
	 * drained first (writable, then its end: the waiter looks again).
	 */
	pthread_mutex_lock(&s->fd_lock);
	s->mirror_on = false;
	while (s->wait_writers > 0) {
		if (s->shim_fd >= 0)
			mirror_drain(s->shim_fd);
		s->junk = false;
		pthread_mutex_unlock(&s->fd_lock);
		sched_yield();
		pthread_mutex_lock(&s->fd_lock);
	}
	pthread_mutex_unlock(&s->fd_lock);
	s->tcp_fd = -1;
	/* A forked child holding the application's end takes the socket from there (its exec). */
	if (!failed)
		ss_inherit_pass(s, tcp);
	/* The application's flags (O_NONBLOCK) come back from its names. */
	ret = ss_put_on_names(s, tcp);
	pthread_mutex_lock(&s->fd_lock);
	if (s->shim_fd >= 0 && !failed)
		mirror_drain(s->shim_fd);
	if (s->shim_fd >= 0)
		ss_private_close(s->shim_fd);
	s->shim_fd = -1;
	pthread_mutex_unlock(&s->fd_lock);
	return ret;
}

/* Makes the application's end show r; fd_lock held. */
static void mirror_apply(struct ss_sock *s, unsigned r)
{
	int app = s->fds[0];

	if (r & SS_RDY_IN) {
		/* One token shows readable; another per arrival gives ET waiters their edge. */
		if ((s->tokens == 0 || ((r & SS_RDY_EDGE) && s->tokens < 64)) && !s->rdhup_shown &&
		    ss_real.send(s->shim_fd, "r", 1, MSG_DONTWAIT | MSG_NOSIGNAL) == 1)
			s->tokens++;
	} else if (s->tokens) {
		char buf[64];
		while (s->tokens > 0) {
			ssize_t n = ss_real.recv(app, buf, (size_t)s->tokens, MSG_DONTWAIT);
			if (n <= 0)
				break;
			s->tokens -= (int)n;
		}
		s->tokens = 0;
	}
	if (r & SS_RDY_OUT) {
		if (s->junk) {
			mirror_drain(s->shim_fd);
			s->junk = false;
		}
	} else if (!s->junk && !s->hup_shown) {
		mirror_fill(app);
		s->junk = true;
	}
	if ((r & SS_RDY_RDHUP) && !s->rdhup_shown) {
		ss_real.shutdown(s->shim_fd, SHUT_WR);
		s->rdhup_shown = true;
	}
	if ((r & SS_RDY_HUP) && !s->hup_shown) {
		ss_real.shutdown(s->shim_fd, SHUT_RDWR);
		s->hup_shown = true;
	}
}

void ss_mirror_show(struct ss_sock *s, unsigned ready)
{
	pthread_mutex_lock(&s->fd_lock);
	if (s->mirror_on && s->n_fds > 0 && s->shim_fd >= 0)
		mirror_apply(s, ready);
	pthread_mutex_unlock(&s->fd_lock);
}
