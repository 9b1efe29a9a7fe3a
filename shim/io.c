/*
 * The data path of the sockets the shim tracks: every read-like and
 * write-like call lands here and is dispatched by the socket's state
 * (shim/sock.h): undecided connections are decided or waited for, upgraded
 * ones go through their transport connection, plain ones go back to libc.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <linux/sockios.h>
#include <string.h>

#include "shim/io.h"
#include "shim/mux.h"
#include "shim/ready.h"
#include "shim/real.h"
#include "shim/shim.h"
#include "transport/log.h"

size_t ss_iov_total(const struct iovec *iov, int n)
{
	size_t t = 0;

	for (int i = 0; i < n; i++)
		t = iov[i].iov_len > SIZE_MAX - t ? SIZE_MAX : t + iov[i].iov_len;
	return t;
}

/* Moves the iovec past n bytes. */
static void io_iov_advance(struct iovec *iov, int cnt, size_t n)
{
	for (int i = 0; i < cnt && n; i++) {
		size_t k = n < iov[i].iov_len ? n : iov[i].iov_len;

		iov[i].iov_base = (char *)iov[i].iov_base + k;
		iov[i].iov_len -= k;
		n -= k;
	}
}

/*
 * A private copy of the caller's iovec that the call may advance: on the
 * stack up to 64 entries, else on the heap (up to IOV_MAX, as the kernel).
 */
struct io_vec {
	struct iovec small[64];
	struct iovec *v;
	int n;
};

static int io_vec_copy(struct io_vec *c, const struct iovec *iov, int n)
{
	if (n < 0 || n > IOV_MAX)
		return -EINVAL;
	c->v = n <= 64 ? c->small : malloc(sizeof(*iov) * (size_t)n);
	if (!c->v)
		return -ENOMEM;
	if (n)
		memcpy(c->v, iov, sizeof(*iov) * (size_t)n);
	c->n = n;
	return 0;
}

static void io_vec_free(struct io_vec *c)
{
	if (c->v != c->small)
		free(c->v);
}

/*
 * O_NONBLOCK of the open file behind fd: known from socket() and accept4()
 * (or asked once), then kept as the application sets it through us (fcntl
 * F_SETFL, ioctl FIONBIO: flags_changed in intercept.c), so that an I/O
 * call costs no system call for it.
 */
static bool io_nonblocking(struct ss_sock *s, int fd)
{
	int nb = atomic_load_explicit(&s->nonblock, memory_order_relaxed);

	if (nb < 0) {
		int fl = ss_real.fcntl(fd, F_GETFL);

		if (fl < 0)
			return false;
		nb = (fl & O_NONBLOCK) != 0;
		atomic_store_explicit(&s->nonblock, nb, memory_order_relaxed);
	}
	return nb > 0;
}

static bool io_would_wait(struct ss_sock *s, int fd, int flags)
{
	return !(flags & MSG_DONTWAIT) && !io_nonblocking(s, fd);
}

/*
 * Before a call that may not wait says EAGAIN: takes what the CQs hold
 * (no system call), as TCP's receive path would have done meanwhile.
 * True when something was taken (the caller tries once more).
 */
static bool io_poll_cqs(void)
{
	struct ss_worker *w = atomic_load_explicit(&ss_w, memory_order_acquire);

	return w && ss_tp->worker_poll(w) > 0;
}

/*
 * Takes an ASKING socket's answer if it is in. True while it is not: then
 * nothing on its TCP socket is the application's yet (FIONREAD would count
 * the answer's bytes), and a read shut meanwhile (*shut_rd) sees the end
 * at once, as TCP's after SHUT_RD with nothing queued. may_wait: the
 * caller waits in the kernel's poll next (io_wait_asking), which shows
 * an answer come since the last look found nothing (the write's, before
 * a read): then it does not look again first, unless the read is shut
 * (its end is said at once, after what the answer lets through).
 */
static bool io_asking_unanswered(struct ss_sock *s, bool may_wait, bool *shut_rd)
{
	bool asking;

	if (ss_sock_state(s) != SS_SOCK_ASKING)
		return false;
	pthread_mutex_lock(&s->lock);
	asking =
		((may_wait && s->looked_empty && !atomic_load(&s->shut_rd)) || ss_client_step(s)) &&
		ss_sock_state(s) == SS_SOCK_ASKING && !s->answered;
	*shut_rd = atomic_load(&s->shut_rd);
	pthread_mutex_unlock(&s->lock);
	return asking;
}

/*
 * Whether a read of s sees the end at once: shut (SHUT_RD) while nothing
 * of the stream is the application's yet (the answer not taken, or a
 * plain connection being made again), as TCP's read after SHUT_RD with
 * nothing queued. Takes an ASKING socket's answer if it is in (may_wait:
 * as io_asking_unanswered).
 */
static bool io_read_shut(struct ss_sock *s, bool may_wait)
{
	bool shut_rd = false;
	int st;

	if (io_asking_unanswered(s, may_wait, &shut_rd))
		return shut_rd;
	st = ss_sock_state(s);
	return atomic_load(&s->shut_rd) && (st == SS_SOCK_PROBING || st == SS_SOCK_RECONNECTING);
}

int ss_io_queue_ioctl(int fd, unsigned long req, int *val, bool *handled)
{
	struct ss_sock *s = ss_sock_get(fd);
	size_t unsent = 0, n = 0;
	bool shut_rd;

	if (s && req == FIONREAD && val && io_asking_unanswered(s, false, &shut_rd)) {
		*handled = true;
		ss_sock_put(s);
		*val = 0;
		return 0;
	}
	*handled = s && ss_sock_state(s) == SS_SOCK_UPGRADED;
	if (!*handled) {
		ss_sock_put(s);
		return 0;
	}
	if (!val) {
		ss_sock_put(s);
		return -EFAULT; /* as the kernel's put_user */
	}
	/* What the CQs hold first: the kernel's queues move on their own, ours when polled. */
	io_poll_cqs();
	if (req == FIONREAD) {
		n = ss_tp->conn_readable(s->conn);
	} else if (req != SIOCATMARK) { /* SIOCATMARK: no urgent data on an upgraded stream */
		n = ss_tp->conn_unacked(s->conn, &unsent);
		if (req == SIOCOUTQNSD)
			n = unsent;
	}
	ss_sock_put(s);
	*val = n > INT_MAX ? INT_MAX : (int)n;
	return 0;
}

/* SO_RCVTIMEO (out: SO_SNDTIMEO) of s as the kernel has it: ms rounded up, at most INT_MAX; 0:
 * none. */
static int io_timeo_read(struct ss_sock *s, bool out)
{
	struct timeval tv = {0, 0};
	socklen_t len = sizeof(tv);
	int tfd = s->tcp_fd >= 0 ? s->tcp_fd : s->fds[0];
	long long ms;

	if (ss_real.getsockopt(tfd, SOL_SOCKET, out ? SO_SNDTIMEO : SO_RCVTIMEO, &tv, &len) != 0)
		return 0;
	ms = (long long)tv.tv_sec * 1000 + (tv.tv_usec + 999) / 1000;
	return ms > INT_MAX ? INT_MAX : (int)ms;
}

/*
 * The application set the timeout (after the kernel took it). Stored, not
 * forgotten: a wait that read the old value meanwhile cannot store that
 * over this one (io_timeout_ms stores only over "not known").
 */
void ss_io_timeo_changed(struct ss_sock *s, bool out)
{
	atomic_store_explicit(&s->timeo_ms[out], io_timeo_read(s, out), memory_order_relaxed);
}

/* SO_RCVTIMEO (out: SO_SNDTIMEO) in ms; -1: none. Asked once, then kept. */
static int io_timeout_ms(struct ss_sock *s, bool out)
{
	int ms = atomic_load_explicit(&s->timeo_ms[out], memory_order_relaxed);

	if (ms < 0) {
		int unknown = -1;

		ms = io_timeo_read(s, out);
		if (!atomic_compare_exchange_strong_explicit(&s->timeo_ms[out], &unknown, ms,
							     memory_order_relaxed,
							     memory_order_relaxed))
			ms = unknown; /* set meanwhile: the newer value */
	}
	return ms ? ms : -1;
}

/*
 * The signal handlers this thread had run when the application's call
 * began: a handler run since ends its waits (whichever of them it comes
 * between), as it would end the kernel's call.
 */
struct io_sig {
	unsigned any, no_restart;
};

static struct io_sig io_sig_now(void)
{
	return (struct io_sig){ss_sig_any(), ss_sig_no_restart()};
}

/*
 * A handler ran during a wait: as Linux's socket calls (signal(7)), one
 * without SA_RESTART ends it with EINTR; after SA_RESTART ones it goes on,
 * unless the socket has a timeout (timeo_ms >= 0), which the kernel never
 * restarts. Returns whether the wait ends.
 */
static bool io_sig_ends_wait(struct io_sig *sig, int timeo_ms)
{
	if (timeo_ms >= 0 || ss_sig_no_restart() != sig->no_restart)
		return true;
	sig->any = ss_sig_any(); /* only SA_RESTART handlers ran: the call goes on */
	return false;
}

/*
 * Waits as a blocking read (out: write) of an upgraded connection would,
 * in the wait engine that poll uses: the CQs polled by this thread, then
 * asleep on the completion channels; no hop through the progress thread.
 * Signals as Linux's socket calls take them (io_sig_ends_wait). Returns 0
 * (something changed: the caller tries again), -EAGAIN (timeout) or -EINTR.
 */
static int io_wait_upgraded(struct ss_sock *s, int fd, bool out, struct io_sig *sig)
{
	int timeo = io_timeout_ms(s, out);
	struct pollfd p = {.fd = fd, .events = out ? POLLOUT : POLLIN};
	bool handled;

	for (;;) {
		int r = ss_poll_since(&p, 1, timeo, NULL, sig->any, &handled);

		if (!handled || r > 0)
			return 0;
		if (r == 0)
			return -EAGAIN;
		if (r != -EINTR)
			return 0;
		if (io_sig_ends_wait(sig, timeo))
			return -EINTR;
	}
}

/* The longest slice of the kernel's poll in a wait that looks at the state between slices. */
#define IO_FIRST_SLICE_MAX_MS 256

/* The next slice of a wait that ends at end (us; UINT64_MAX: never): at most slice ms, 0 when over.
 */
static int io_slice_ms(uint64_t end, int slice)
{
	uint64_t now, left_ms;

	if (end == UINT64_MAX)
		return slice;
	now = ss_now_us();
	left_ms = now >= end ? 0 : (end - now + 999) / 1000;
	return left_ms < (uint64_t)slice ? (int)left_ms : slice;
}

/*
 * An ASKING client (asking.c), whose fd is its own TCP socket: the kernel's
 * poll for what the negotiation waits for (the connect's end, the answer,
 * room for the held bytes), in slices as io_wait_first_bytes (a
 * reconnect puts our socketpair on fd meanwhile), within SO_RCVTIMEO (out:
 * SO_SNDTIMEO). Returns 0 (look at the state again), -EAGAIN or -EINTR.
 */
static int io_wait_asking(struct ss_sock *s, int fd, bool out, struct io_sig *sig)
{
	int timeo = io_timeout_ms(s, out), slice = 1;
	uint64_t end = timeo < 0 ? UINT64_MAX : ss_now_us() + (uint64_t)timeo * 1000;
	/* The caller looked just before (io_read_shut, io_hold): the first slice waits at once. */
	bool look = false;

	while (ss_sock_state(s) == SS_SOCK_ASKING) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		int wait, r;

		pthread_mutex_lock(&s->lock);
		if (!look || ss_client_step(s))
			p.events = ss_asking_events(s);
		pthread_mutex_unlock(&s->lock);
		look = true;
		if (ss_sock_state(s) != SS_SOCK_ASKING)
			return 0;
		if ((wait = io_slice_ms(end, slice)) == 0)
			return -EAGAIN;
		r = ss_real.poll(&p, 1, wait);
		if (r < 0 && errno != EINTR)
			return -errno;
		if (r < 0 && ss_sig_any() != sig->any && io_sig_ends_wait(sig, timeo))
			return -EINTR;
		slice = slice < IO_FIRST_SLICE_MAX_MS ? 2 * slice : IO_FIRST_SLICE_MAX_MS;
	}
	return 0;
}

/*
 * Sleeps until the application's fd (our socketpair end) shows what the
 * caller waits for: a blocking call on that end that ends when it does: a
 * peek at the readable token (or end of file), or a one-byte write that
 * goes through once the junk that shows "not writable" is gone (the byte
 * is junk too). Unlike poll(2), these are restarted after a signal handler
 * installed with SA_RESTART, and they honour SO_RCVTIMEO and SO_SNDTIMEO,
 * which the application's end carries: a TCP read or write would do the
 * same. An upgraded connection waits in user space instead
 * (io_wait_upgraded). Returns 0 (something changed: the caller tries
 * again), -EAGAIN (timeout) or -EINTR.
 */
static int io_wait_app_fd(struct ss_sock *s, int fd, bool out, struct io_sig *sig)
{
	bool up = ss_sock_state(s) == SS_SOCK_UPGRADED;
	/* Asleep in the kernel on the mirror (now, or once upgraded): it must show the truth. */
	bool mirrored = ss_sock_state(s) >= SS_SOCK_CONNECTING &&
			ss_sock_state(s) != SS_SOCK_ACCEPTED && ss_sock_state(s) != SS_SOCK_PLAIN &&
			ss_sock_state(s) != SS_SOCK_ASKING;
	char b = 0;
	ssize_t n;
	int err;

	if (up)
		return io_wait_upgraded(s, fd, out, sig);
	if (ss_sock_state(s) == SS_SOCK_ASKING)
		return io_wait_asking(s, fd, out, sig);
	if (mirrored)
		ss_ready_mirror_get(s);
	if (out) {
		/* Counted, so that the fd number is not handed to the TCP socket meanwhile. */
		pthread_mutex_lock(&s->fd_lock);
		if (!s->mirror_on) {
			pthread_mutex_unlock(&s->fd_lock);
			n = 0;
		} else {
			s->wait_writers++;
			pthread_mutex_unlock(&s->fd_lock);
			n = ss_real.send(fd, &b, 1, MSG_NOSIGNAL);
			err = errno;
			pthread_mutex_lock(&s->fd_lock);
			s->wait_writers--;
			pthread_mutex_unlock(&s->fd_lock);
			errno = err;
		}
	} else {
		n = ss_real.recv(fd, &b, 1, MSG_PEEK);
	}
	err = errno;
	if (mirrored)
		ss_ready_mirror_put(s);
	if (n >= 0 || (err != EAGAIN && err != EWOULDBLOCK && err != EINTR))
		return 0; /* shown, or our end shut down: the state says what */
	return err == EINTR ? -EINTR : -EAGAIN;
}

/*
 * A connection that is plain for good needs no entry: its calls go straight
 * to libc. Under the lock: the decision (and its statistics slot) may still
 * be under way on the progress thread.
 */
void ss_io_forget_if_plain(struct ss_sock *s)
{
	pthread_mutex_lock(&s->lock);
	if (ss_sock_state(s) == SS_SOCK_PLAIN && s->strip == SS_STRIP_NONE && !s->hold_len &&
	    !atomic_load(&s->plain_err))
		ss_sock_forget(s);
	pthread_mutex_unlock(&s->lock);
}

/* A call's wait in slices of the kernel's poll, as the call would wait. */
struct io_slices {
	struct ss_sock *s;
	struct io_sig *sig;
	int timeo;    /* SO_RCVTIMEO (a writer's: SO_SNDTIMEO), ms (-1: none) */
	uint64_t end; /* when it passes, us */
	int slice;    /* the next slice's length, ms */
};

static struct io_slices io_slices_begin(struct ss_sock *s, struct io_sig *sig, bool out)
{
	int timeo = io_timeout_ms(s, out);

	return (struct io_slices){s, sig, timeo,
				  timeo < 0 ? UINT64_MAX : ss_now_us() + (uint64_t)timeo * 1000, 1};
}

/*
 * One slice (doubling from 1 ms to IO_FIRST_SLICE_MAX_MS) of the wait for
 * fd to show events (0: time only). Returns what it showed (> 0), 0 (the slice
 * passed: look at the state again), -EAGAIN (the timeout passed), -EINTR (a signal
 * handler ran since the call began and ends the read, as the kernel's),
 * -EBADF (another thread closed fd meanwhile: its number may name another
 * file now; the kernel's read would go on with the old one, which a wait
 * by number cannot) or -errno.
 */
static int io_slice_wait(struct io_slices *sl, int fd, short events)
{
	struct pollfd p = {.fd = fd, .events = events};
	int wait = io_slice_ms(sl->end, sl->slice), r;
	struct ss_sock *now;

	if (wait == 0)
		return -EAGAIN;
	r = ss_real.poll(&p, 1, wait);
	/* Before the caller looks at fd again. */
	now = ss_sock_get(fd);
	ss_sock_put(now);
	if (now != sl->s)
		return -EBADF;
	if (r > 0)
		return p.revents;
	if (r < 0 && errno != EINTR)
		return -errno;
	if (ss_sig_any() != sl->sig->any && io_sig_ends_wait(sl->sig, sl->timeo))
		return -EINTR;
	sl->slice = sl->slice < IO_FIRST_SLICE_MAX_MS ? 2 * sl->slice : IO_FIRST_SLICE_MAX_MS;
	return 0;
}

/*
 * Waits, as the read would (SO_RCVTIMEO, SA_RESTART), unlocked, for the
 * client's first bytes (or its end) on an accepted connection. Another
 * thread's first I/O may decide meanwhile: it takes the HELLO off the TCP
 * socket and puts our socketpair end on fd, and nothing more comes on the
 * TCP socket, so a read or poll asleep on it would sleep for good (a
 * blocked call keeps the file it began with). Rule: the wait is the
 * kernel's poll in slices (doubling from 1 ms to IO_FIRST_SLICE_MAX_MS),
 * the state looked at between them; the client's bytes end a slice at
 * once. A signal handler run since the call began (seen by poll's EINTR
 * or between slices) ends the wait as it ends the kernel's recv. Returns 0
 * (look at the state again), -EAGAIN (timeout) or -EINTR.
 */
static int io_wait_first_bytes(struct ss_sock *s, int fd, struct io_sig *sig)
{
	struct io_slices sl = io_slices_begin(s, sig, false);
	int r = 0;

	while (ss_sock_state(s) == SS_SOCK_ACCEPTED && r == 0) {
		if (sl.slice == 1)
			ss_test_delay(SS_TP_FIRST_READ);
		r = io_slice_wait(&sl, fd, POLLIN);
	}
	return r > 0 ? 0 : r;
}

/*
 * A LATE socket (moving.c), whose fd is its own TCP socket until a move
 * puts our socketpair there: what the reader (out: writer) and the move
 * wait for, in slices (the move may end by another thread's hand, and a
 * move's end changes the object under fd), as the call would wait.
 * Returns 0 (look again), -EAGAIN (timeout), -EINTR or -errno.
 */
static int io_wait_late(struct ss_sock *s, int fd, bool out)
{
	struct io_sig sig = io_sig_now();
	struct io_slices sl = io_slices_begin(s, &sig, out);
	bool pri = false;

	for (;;) {
		uint32_t takes = 0;
		short events = ss_move_wait_events(s, out, pri, &takes);
		int r;

		if (ss_sock_state(s) != SS_SOCK_LATE || events == SS_MOVE_NOW)
			return 0;
		if ((r = io_slice_wait(&sl, fd, events)) < 0)
			return r;
		/* Bytes and no mark: the read that follows needs no peek. */
		if (!out && r > 0)
			ss_move_shown(s, takes, (short)r);
		/* The peer's mark alone: looked for before the next slice (the call's reads and
		 * writes do not). */
		pri = (r & POLLPRI) && !(r & (out ? POLLOUT : POLLIN));
		if (r > 0 && !pri)
			return 0;
	}
}

/*
 * A read of a LATE socket: peeked and taken (moving.c), waiting as TCP's
 * read would, all of it with MSG_WAITALL. Returns the count, -SS_REDO when
 * the socket moved on (*took: the bytes taken before), or -errno.
 */
static ssize_t io_late_recv(struct ss_sock *s, int fd, const struct iovec *iov, int n, int flags,
			    size_t *took)
{
	struct io_vec local;
	size_t want = ss_iov_total(iov, n), got = 0;
	ssize_t r;

	*took = 0;
	/* Urgent data is the application's: the connection stays on TCP for good first. */
	if (flags & MSG_OOB) {
		ss_move_pin(s);
		return ss_sock_state(s) == SS_SOCK_LATE ? -EINVAL : -SS_REDO;
	}
	/*
	 * A blocking read waits first when only TCP can answer it: with the
	 * showing (ss_move_shown) the wait and the read cost what a peek and
	 * a take do when bytes are there, and save the peek that finds
	 * nothing when they are not (a reply a round trip away).
	 */
	if (want > 0 && !(flags & MSG_ERRQUEUE) && !s->lowat && io_would_wait(s, fd, flags) &&
	    ss_move_reads_tcp(s) && (r = io_wait_late(s, fd, false)) != 0)
		return r;
	if ((r = io_vec_copy(&local, iov, n)))
		return r;
	for (;;) {
		r = ss_move_recv(s, local.v, local.n, flags);
		if (r > 0) {
			got += (size_t)r;
			io_iov_advance(local.v, local.n, (size_t)r);
			if ((flags & (MSG_WAITALL | MSG_PEEK)) == MSG_WAITALL && got < want &&
			    io_would_wait(s, fd, flags))
				continue;
			break;
		}
		if (r == -EAGAIN && io_would_wait(s, fd, flags) &&
		    (r = io_wait_late(s, fd, false)) == 0)
			continue;
		break;
	}
	io_vec_free(&local);
	*took = got;
	/* What came before an error or a signal is the call's answer. */
	return got && r != -SS_REDO ? (ssize_t)got : r;
}

/* Decides an accepted connection at a read: waits as the read would. */
static int io_decide_for_read(struct ss_sock *s, int fd, int flags)
{
	bool wait = io_would_wait(s, fd, flags);
	int ret;

	if (wait) {
		struct io_sig sig = io_sig_now();

		ret = io_wait_first_bytes(s, fd, &sig);
		if (ret)
			return ret;
	}
	pthread_mutex_lock(&s->lock);
	/* The rest of a partial HELLO has a second to come (then the bytes are the client's). */
	ret = ss_server_decide(s, fd, wait ? SS_PARTIAL_MS : 0, wait);
	pthread_mutex_unlock(&s->lock);
	return ret;
}

void ss_io_decide_for_write(struct ss_sock *s, int fd)
{
	int wait = ss_cfg.server_wait_ms + 4 * ss_rtt_ms(fd);

	pthread_mutex_lock(&s->lock);
	if (ss_server_decide(s, fd, wait, false) == -EAGAIN &&
	    ss_sock_state(s) == SS_SOCK_ACCEPTED) {
		/* No HELLO in time: plain, and a late HELLO is taken out of the stream. */
		s->strip = SS_STRIP_HELLO;
		ss_bg_stop_private(s);
		ss_become_plain(s, SS_REASON_PEER_PLAIN);
	}
	pthread_mutex_unlock(&s->lock);
}

/*
 * A plain connection with handshake messages to take off its head before
 * reading. Returns 0 (the application's read goes to TCP), IO_STRIP_END
 * (shut for reading, nothing there: the end) or -errno. While a message
 * may still come and nothing is there, the read's answer is given here
 * (EAGAIN, or the end after SHUT_RD), from a look under the lock, not by
 * the kernel's read after it (a message that came in between would have
 * been the application's). A read that waits does so unlocked, in slices
 * (SO_RCVTIMEO, signals), so that the socket's other calls (a write, a
 * shutdown that ends this wait, close) go on meanwhile. Error-queue and
 * urgent reads are the kernel's: they never see the stream's head.
 */
#define IO_STRIP_END 1
static int io_strip_for_read(struct ss_sock *s, int fd, int flags)
{
	struct io_sig sig = io_sig_now();
	struct io_slices sl = io_slices_begin(s, &sig, false);
	int ret;

	if (flags & (MSG_ERRQUEUE | MSG_OOB))
		return 0;
	for (;;) {
		bool pending;

		pthread_mutex_lock(&s->lock);
		ret = s->strip != SS_STRIP_NONE ? ss_strip(s, fd) : 0;
		pending = s->strip != SS_STRIP_NONE;
		pthread_mutex_unlock(&s->lock);
		if (!pending || (ret != 0 && ret != -EAGAIN))
			return ret;
		if (ret == 0 && atomic_load(&s->shut_rd))
			return IO_STRIP_END;
		if (!io_would_wait(s, fd, flags))
			return -EAGAIN;
		if (ret == -EAGAIN) {
			/* Part of a message: readable already, so the kernel would not wait. */
			ss_real.poll(NULL, 0, 1);
			continue;
		}
		ret = io_slice_wait(&sl, fd, POLLIN);
		if (ret < 0)
			return ret;
	}
}

/*
 * An undecided client, or one falling back: moves it on with what is there
 * and, if that changed nothing, waits as the call would (out: a write).
 * Returns 0 (look at the state again) or -errno.
 */
static int io_wait_decision(struct ss_sock *s, int fd, int flags, bool out)
{
	struct io_sig sig = io_sig_now();
	int st;

	pthread_mutex_lock(&s->lock);
	st = ss_sock_state(s);
	if (st == SS_SOCK_FALLBACK)
		ss_fallback_flush(s);
	else if (st != SS_SOCK_ASKING)
		ss_client_step(s); /* an ASKING socket's callers looked just before: io_read_shut,
				      io_hold */
	pthread_mutex_unlock(&s->lock);
	if (ss_sock_state(s) != st)
		return 0;
	if (!io_would_wait(s, fd, flags))
		return -EAGAIN;
	return io_wait_app_fd(s, fd, out, &sig);
}

/*
 * Writes while undecided (or falling back): held, up to hold_max. Returns
 * the count taken, -EAGAIN when the hold is full, or -SS_REDO when the
 * state changed under us.
 */
static ssize_t io_hold(struct ss_sock *s, const struct iovec *iov, int n, int st)
{
	ssize_t r = -SS_REDO;

	pthread_mutex_lock(&s->lock);
	/*
	 * Starting on TCP: the HELLO goes out first, and the answer may be in.
	 * The hold grows as a socket's buffer would, to SS_ASKING_HOLD_MAX:
	 * the fd is the TCP socket, which shows writable whatever we hold, so
	 * a write must not say EAGAIN before that bound.
	 */
	if (st == SS_SOCK_ASKING) {
		size_t want = s->hold_len + ss_iov_total(iov, n), max = s->hold_max;

		ss_client_step(s);
		while (max < want && max < SS_ASKING_HOLD_MAX)
			max *= 2;
		ss_hold_reserve(s, max < SS_ASKING_HOLD_MAX ? max : SS_ASKING_HOLD_MAX);
	}
	if (ss_sock_state(s) == st) {
		r = (ssize_t)ss_hold_append(s, iov, n);
		if (st == SS_SOCK_FALLBACK)
			ss_fallback_flush(s);
		else if (st == SS_SOCK_ASKING && s->answered)
			ss_client_step(s); /* answered: what is held goes to TCP */
		else if (s->hold_len >= s->hold_max)
			ss_mirror_show(s, 0); /* not writable until the decision */
		if (r == 0)
			r = -EAGAIN;
	}
	pthread_mutex_unlock(&s->lock);
	return r;
}

/* ---- the data path of an upgraded connection ---- */

/*
 * A failed connection reports its reset once, as TCP's pending error: to
 * whichever comes first of a read, a write or SO_ERROR. After that, reads
 * see the end of the stream and writes a broken pipe.
 */
bool ss_io_take_reset(struct ss_sock *s)
{
	return !atomic_exchange(&s->reset_taken, true);
}

/* A transport error while the socket changed state under us (fallback): dispatch again. */
static ssize_t io_up_result(struct ss_sock *s, ssize_t r)
{
	if (r == -EXDEV) {
		/* The peer moved the stream to TCP: so do we, then dispatch again (down.c). */
		int err = 0;

		pthread_mutex_lock(&s->lock);
		if (ss_sock_state(s) == SS_SOCK_UPGRADED)
			err = ss_down_begin(s);
		pthread_mutex_unlock(&s->lock);
		return err ? -ECONNRESET : -SS_REDO;
	}
	if (r < 0 && r != -EAGAIN && ss_sock_state(s) != SS_SOCK_UPGRADED &&
	    ss_sock_state(s) != SS_SOCK_FOREIGN)
		return -SS_REDO;
	return r;
}

static ssize_t io_up_recv(struct ss_sock *s, int fd, const struct iovec *iov, int n, int flags,
			  size_t *took);

/*
 * MSG_TRUNC, as TCP has it: up to want bytes are taken (with MSG_PEEK,
 * counted) but not copied; the caller's buffer is not touched (it may be
 * NULL). The first look waits as a recv would; the rest takes what is
 * there (all of want with MSG_WAITALL).
 */
static ssize_t io_up_recv_trunc(struct ss_sock *s, int fd, size_t want, int flags)
{
	size_t chunk = want < 65536 ? want : 65536, got = 0, len;
	uint8_t one, *scratch;
	ssize_t r;

	flags &= ~MSG_TRUNC;
	if ((flags & MSG_PEEK) || want == 0) {
		/* Counted, not taken (or nothing asked): one byte peeked waits as recv would. */
		struct iovec v = {&one, 1};
		size_t avail;

		r = io_up_recv(s, fd, &v, 1, flags | MSG_PEEK, NULL);
		if (r <= 0 || want == 0)
			return r < 0 ? r : 0;
		/* Never below what was seen: a reader elsewhere may have taken some since. */
		avail = ss_tp->conn_readable(s->conn);
		avail = avail > (size_t)r ? avail : (size_t)r;
		return (ssize_t)(avail < want ? avail : want);
	}
	if (!(scratch = malloc(chunk)))
		return -ENOMEM;
	/* Chunk by chunk; a short one (no more data, a signal, a timeout) ends the call. */
	do {
		len = want - got < chunk ? want - got : chunk;
		r = io_up_recv(s, fd, &(struct iovec){scratch, len}, 1,
			       got && !(flags & MSG_WAITALL) ? flags | MSG_DONTWAIT : flags, NULL);
		if (r > 0)
			got += (size_t)r;
	} while (r == (ssize_t)len && got < want);
	free(scratch);
	/* Bytes taken are the result; an error met after them is the next call's. */
	if (got && r < 0)
		ss_io_error_back(fd, (int)-r);
	return got ? (ssize_t)got : r;
}

/*
 * A read of an upgraded socket. Returns the count, -SS_REDO when the socket
 * moved on (*took: the bytes taken before; with took NULL those bytes are
 * the answer), or -errno.
 */
static ssize_t io_up_recv(struct ss_sock *s, int fd, const struct iovec *iov, int n, int flags,
			  size_t *took)
{
	bool peek = flags & MSG_PEEK, waitall = (flags & MSG_WAITALL) && !peek, polled = false;
	bool shut;
	struct io_sig sig = io_sig_now();
	size_t want, got = 0;
	struct io_vec local;
	ssize_t r;

	if (took)
		*took = 0;
	if (ss_sock_state(s) == SS_SOCK_FOREIGN)
		return -EBADF;
	/* (Bytes it took before a move's end are its answer: see io_recv_goes_on.) */
	if (flags & MSG_TRUNC)
		return io_up_recv_trunc(s, fd, ss_iov_total(iov, n), flags);
	r = io_vec_copy(&local, iov, n);
	if (r)
		return r;
	want = ss_iov_total(local.v, local.n);
	for (;;) {
		r = io_up_result(s, ss_tp->conn_recv(s->conn, local.v, local.n, peek));
		if (r > 0) {
			got += (size_t)r;
			if (!waitall || got == want)
				break;
			/* MSG_WAITALL: advance through the iovec and go on. */
			io_iov_advance(local.v, local.n, (size_t)r);
			continue;
		}
		if (r != -EAGAIN)
			break;
		/*
		 * Shut for reading (shutdown SHUT_RD), or not to wait (the
		 * O_NONBLOCK flag looked up only now): what the CQs hold first,
		 * then the end (as TCP's with nothing queued), or EAGAIN.
		 */
		shut = atomic_load_explicit(&s->shut_rd, memory_order_relaxed);
		if (shut || !io_would_wait(s, fd, flags)) {
			if (!polled && io_poll_cqs()) {
				polled = true;
				continue;
			}
			r = shut ? 0 : r;
			break;
		}
		r = io_wait_app_fd(s, fd, false, &sig);
		if (r)
			break;
		if (ss_sock_state(s) != SS_SOCK_UPGRADED) {
			r = -SS_REDO;
			break;
		}
	}
	io_vec_free(&local);
	if (took)
		*took = got;
	/* Bytes already read are the result, whatever came after them but a move's end
	 * (counted in *took). */
	if (got && (r != -SS_REDO || !took))
		return (ssize_t)got;
	if (r == -ECONNRESET && !ss_io_take_reset(s))
		return 0;
	return r;
}

/* Sends from the caller's private iovec (advanced as bytes go); returns the count or -errno. */
static ssize_t io_up_send(struct ss_sock *s, int fd, struct io_vec *local, size_t want, int flags)
{
	bool more = (flags & MSG_MORE) || s->cork, polled = false;
	struct io_sig sig = io_sig_now();
	size_t sent = 0;
	ssize_t r = 0;

	if (ss_sock_state(s) == SS_SOCK_FOREIGN)
		return -EBADF;
	while (sent < want) {
		r = io_up_result(s, ss_tp->conn_send(s->conn, local->v, local->n, more));
		if (r > 0) {
			sent += (size_t)r;
			io_iov_advance(local->v, local->n, (size_t)r);
			continue;
		}
		if (r == -EAGAIN && io_would_wait(s, fd, flags)) {
			r = io_wait_app_fd(s, fd, true, &sig);
			if (r == 0 && ss_sock_state(s) != SS_SOCK_UPGRADED)
				r = -SS_REDO;
			if (r == 0)
				continue;
		} else if (r == -EAGAIN && !polled && io_poll_cqs()) {
			polled = true;
			continue;
		}
		break;
	}
	return sent ? (ssize_t)sent : r;
}

/* ---- dispatch by state ---- */

/*
 * An fd never seen before (inherited over exec, made before we could see
 * it): a connected TCP socket is treated as an accepted one, at its first
 * I/O; anything else is marked as not ours.
 */
static struct ss_sock *io_classify(int fd)
{
	int domain = 0, type = 0, proto = 0, listening = 0;
	socklen_t len = sizeof(int);
	struct sockaddr_storage pa;
	socklen_t plen = sizeof(pa);

	if (ss_real.getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) != 0 ||
	    ss_real.getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 ||
	    ss_real.getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &len) != 0 ||
	    !ss_is_tcp(domain, type, proto) ||
	    ss_real.getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || listening ||
	    ss_real.getpeername(fd, (struct sockaddr *)&pa, &plen) != 0 ||
	    ss_cfg.mode == SS_MODE_TCP || ss_ring_seen()) {
		ss_sock_mark_plain_fd(fd);
		return NULL;
	}
	return ss_sock_new(fd, domain, SS_SOCK_ACCEPTED, -1);
}

bool ss_is_tcp(int domain, int type, int proto)
{
	return (domain == AF_INET || domain == AF_INET6) && (type & 0xf) == SOCK_STREAM &&
	       (proto == 0 || proto == IPPROTO_TCP);
}

struct ss_sock *ss_io_get(int fd)
{
	struct ss_sock *s = ss_sock_get(fd);

	if (s || !ss_sock_unknown(fd))
		return s;
	return io_classify(fd);
}

void ss_io_error_back(int fd, int err)
{
	struct ss_sock *s;

	if (err != ECONNRESET)
		return;
	s = ss_sock_get(fd);
	if (s)
		atomic_store(&s->reset_taken, false);
	ss_sock_put(s);
}

bool ss_io_ours(int fd, bool reading)
{
	struct ss_sock *s = ss_io_get(fd);
	int st = s ? ss_sock_state(s) : SS_SOCK_FRESH;
	bool ours = st >= SS_SOCK_CONNECTING &&
		    (st != SS_SOCK_PLAIN || (reading && s->strip != SS_STRIP_NONE) ||
		     atomic_load(&s->plain_err));

	if (st == SS_SOCK_PLAIN && !ours)
		ss_io_forget_if_plain(s);
	ss_sock_put(s);
	return ours;
}

/*
 * The error our flush of held bytes took from a plain socket, for a read:
 * after the bytes queued before it, as the kernel's pending error.
 */
static ssize_t io_plain_err_for_read(struct ss_sock *s, int fd)
{
	char b;

	if (!atomic_load(&s->plain_err) || ss_real.recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) > 0)
		return 0;
	return -atomic_exchange(&s->plain_err, 0);
}

/*
 * What a read has taken before its socket moved on (a move's end, to RDMA
 * or back to TCP), and the rest of its iovec (a private copy once bytes
 * came).
 */
struct io_recv_rest {
	const struct iovec *iov;
	int n;
	size_t done;
	bool copied;
	struct io_vec copy;
};

/*
 * A read whose socket moved on after it took `took` bytes: counted. Rule:
 * the call goes on in the new state when it has no byte yet, or with
 * MSG_WAITALL (not a peek, a socket the call may wait on) while it wants
 * more, as TCP's read waits for all it asks; else those bytes are its
 * answer (false).
 */
static bool io_recv_goes_on(struct ss_sock *s, int fd, struct io_recv_rest *rr, size_t took,
			    int flags)
{
	if (rr->done + took == 0)
		return true;
	if ((flags & (MSG_WAITALL | MSG_PEEK)) != MSG_WAITALL || !io_would_wait(s, fd, flags)) {
		rr->done += took;
		return false;
	}
	if (!rr->copied) {
		if (io_vec_copy(&rr->copy, rr->iov, rr->n) != 0) {
			rr->done += took;
			return false;
		}
		rr->copied = true;
		rr->iov = rr->copy.v;
	}
	io_iov_advance(rr->copy.v, rr->copy.n, took);
	rr->done += took;
	return ss_iov_total(rr->iov, rr->n) > 0;
}

/*
 * The rest of a MSG_WAITALL read that a move back to TCP cut: the kernel's.
 * An error of the connection it meets (after the bytes already taken) is
 * the next call's, as the kernel's pending error would be; others (a
 * signal, a timeout, a bad buffer) end the call with those bytes.
 */
static ssize_t io_plain_rest(struct ss_sock *s, int fd, const struct io_recv_rest *rr, int flags)
{
	struct msghdr m = {.msg_iov = (struct iovec *)rr->iov, .msg_iovlen = (size_t)rr->n};
	ssize_t r;
	int none = 0;

	if (atomic_load(&s->plain_err))
		return 0;
	r = ss_real.recvmsg(fd, &m, flags);
	if (r < 0 && (errno == ECONNRESET || errno == ETIMEDOUT || errno == EHOSTUNREACH ||
		      errno == ENETUNREACH || errno == ECONNABORTED || errno == EPIPE))
		atomic_compare_exchange_strong(&s->plain_err, &none, errno);
	return r < 0 ? 0 : r;
}

/* The answer of a read that took rr->done bytes before r (more bytes, or what ended it). */
static ssize_t io_recv_answer(int fd, const struct io_recv_rest *rr, ssize_t r)
{
	if (rr->done == 0)
		return r;
	/* A reset met after bytes is the next call's. */
	if (r < 0 && r != -SS_REDO)
		ss_io_error_back(fd, (int)-r);
	return (ssize_t)rr->done + (r > 0 ? r : 0);
}

ssize_t ss_io_recv(int fd, const struct iovec *iov, int n, int flags, bool *handled)
{
	struct ss_sock *s = ss_io_get(fd);
	struct io_recv_rest rr = {.iov = iov, .n = n};
	size_t took = 0;
	ssize_t r = 0;
	int st;

	*handled = false;
	if (!s)
		return 0;
	ss_in_call++;
	for (;;) {
		switch ((st = ss_sock_state(s))) {
		case SS_SOCK_ACCEPTED:
			r = io_decide_for_read(s, fd, flags);
			if (r == 0)
				continue;
			break;
		case SS_SOCK_CONNECTING:
		case SS_SOCK_PROBING:
		case SS_SOCK_RECONNECTING:
		case SS_SOCK_FALLBACK:
		case SS_SOCK_ASKING:
			if (io_read_shut(s, io_would_wait(s, fd, flags))) {
				r = 0; /* the end, as TCP's read after SHUT_RD */
				break;
			}
			/* Answered by this look (PLAIN now): the server's bytes are there to read.
			 */
			if (ss_sock_state(s) != st)
				continue;
			r = io_wait_decision(s, fd, flags, false);
			if (r == 0)
				continue;
			break;
		case SS_SOCK_LATE:
			/* The error queue is the kernel's alone: no stream byte, no mark. */
			if (flags & MSG_ERRQUEUE)
				goto not_ours;
			r = io_late_recv(s, fd, rr.iov, rr.n, flags, &took);
			if (r == -SS_REDO && io_recv_goes_on(s, fd, &rr, took, flags))
				continue;
			break;
		case SS_SOCK_UPGRADED:
		case SS_SOCK_FOREIGN:
			/* No urgent data is ever pending on an upgraded stream: TCP's answer. */
			if (flags & MSG_OOB) {
				r = -EINVAL;
				break;
			}
			/* Nor anything in its error queue (it never waits): not a stream byte. */
			if ((flags & MSG_ERRQUEUE) && st == SS_SOCK_UPGRADED) {
				r = -EAGAIN;
				break;
			}
			r = io_up_recv(s, fd, rr.iov, rr.n, flags, &took);
			if (r == -SS_REDO && io_recv_goes_on(s, fd, &rr, took, flags))
				continue;
			break;
		case SS_SOCK_PLAIN:
			if (rr.done) {
				r = io_plain_rest(s, fd, &rr, flags);
				break;
			}
			if ((r = io_plain_err_for_read(s, fd)))
				break;
			r = s->strip != SS_STRIP_NONE ? io_strip_for_read(s, fd, flags) : 0;
			if (r == 0) {
				ss_io_forget_if_plain(s);
				goto not_ours;
			}
			if (r == IO_STRIP_END)
				r = 0;
			break;
		default:
			/* Not a state a move ends in: bytes taken are still the answer. */
			if (!rr.done)
				goto not_ours;
			r = 0;
		}
		break;
	}
	*handled = true;
	r = io_recv_answer(fd, &rr, r);
not_ours:
	if (rr.copied)
		io_vec_free(&rr.copy);
	ss_in_call--;
	ss_sock_put(s);
	return r;
}

/*
 * A write that found the stream over: the reset itself the first time (as
 * TCP's pending error, no signal), EPIPE and SIGPIPE (unless asked not to)
 * afterwards and after our own shutdown.
 */
static ssize_t io_broken_pipe(struct ss_sock *s, ssize_t r, int flags)
{
	if (r != -EPIPE && r != -ECONNRESET)
		return r;
	if (r == -ECONNRESET && ss_io_take_reset(s))
		return -ECONNRESET;
	if (!(flags & MSG_NOSIGNAL))
		raise(SIGPIPE);
	return -EPIPE;
}

ssize_t ss_io_send(int fd, const struct iovec *iov, int n, int flags, bool *handled)
{
	struct ss_sock *s = ss_io_get(fd);
	struct io_vec local;
	size_t want, sent = 0;
	ssize_t r = 0;
	int st;

	*handled = false;
	if (!s)
		return 0;
	/* Urgent data is TCP's alone: the connection moves back to TCP first (down.c). */
	if ((flags & MSG_OOB) &&
	    (ss_sock_state(s) == SS_SOCK_UPGRADED || ss_sock_state(s) == SS_SOCK_FALLBACK))
		ss_down_now(s);
	else if ((flags & MSG_OOB) && ss_sock_state(s) == SS_SOCK_LATE)
		ss_move_pin(s); /* it stays on TCP for good, then sends it there */
	if (ss_sock_state(s) < SS_SOCK_CONNECTING || ss_sock_state(s) == SS_SOCK_PLAIN) {
		/* Not (or no longer) ours: libc's call, unless an error is ours to report. */
		if (ss_sock_state(s) == SS_SOCK_PLAIN && (r = atomic_exchange(&s->plain_err, 0))) {
			*handled = true;
			ss_sock_put(s);
			return -r; /* as the kernel's pending error: no signal */
		}
		if (ss_sock_state(s) == SS_SOCK_PLAIN)
			ss_io_forget_if_plain(s);
		ss_sock_put(s);
		return 0;
	}
	*handled = true;
	r = io_vec_copy(&local, iov, n);
	if (r) {
		ss_sock_put(s);
		return r;
	}
	want = ss_iov_total(local.v, local.n);
	ss_in_call++;
	while (sent < want || (want == 0 && r == 0)) {
		switch ((st = ss_sock_state(s))) {
		case SS_SOCK_ACCEPTED: ss_io_decide_for_write(s, fd); continue;
		case SS_SOCK_CONNECTING:
			/* As TCP: a write waits for the connect (EAGAIN when it may not wait). */
			r = io_wait_decision(s, fd, flags, true);
			if (r == 0)
				continue;
			break;
		case SS_SOCK_PROBING:
		case SS_SOCK_RECONNECTING:
		case SS_SOCK_FALLBACK:
		case SS_SOCK_ASKING:
			r = io_hold(s, local.v, local.n, st);
			if (r > 0) {
				sent += (size_t)r;
				io_iov_advance(local.v, local.n, (size_t)r);
				if (!io_would_wait(s, fd, flags))
					break;
				continue;
			}
			if (r == -SS_REDO)
				continue;
			if (r == -EAGAIN) {
				r = io_wait_decision(s, fd, flags, true);
				if (r == 0)
					continue;
			}
			break;
		case SS_SOCK_LATE:
			r = ss_move_send(s, local.v, local.n, flags);
			if (r > 0) {
				sent += (size_t)r;
				io_iov_advance(local.v, local.n, (size_t)r);
				if (sent < want && io_would_wait(s, fd, flags))
					continue;
				break;
			}
			if (r == -SS_REDO || (r == -EAGAIN && io_would_wait(s, fd, flags) &&
					      !(r = io_wait_late(s, fd, true))))
				continue;
			break;
		case SS_SOCK_UPGRADED:
		case SS_SOCK_FOREIGN:
			r = io_up_send(s, fd, &local, want - sent, flags);
			if (r == -SS_REDO)
				continue;
			if (r > 0) {
				sent += (size_t)r;
				if (sent < want && io_would_wait(s, fd, flags))
					continue;
			}
			break;
		case SS_SOCK_PLAIN: {
			/* Fell back meanwhile: the rest goes to the TCP socket now on fd, as
			 * libc's. */
			struct msghdr mh = {.msg_iov = local.v, .msg_iovlen = (size_t)local.n};

			/* Our flush of the held bytes took the connection's error: it is this
			 * call's (no signal), unless bytes went; then the next call's. */
			if (!sent && (r = -atomic_exchange(&s->plain_err, 0)))
				break;
			if (atomic_load(&s->plain_err))
				break;
			/* Bytes went already: the count is the answer, with no signal. */
			r = ss_real.sendmsg(fd, &mh, sent ? flags | MSG_NOSIGNAL : flags);
			if (r < 0) {
				r = -errno;
				/* After bytes went, the error the call took is the next call's. */
				if (sent && r != -EAGAIN && r != -EPIPE && r != -EINTR)
					atomic_store(&s->plain_err, (int)-r);
				goto out; /* the kernel's errno and signal, as they are */
			}
			sent += (size_t)r;
			break;
		}
		default: r = -EBADF; break;
		}
		break;
	}
	if (!sent)
		r = io_broken_pipe(s, r, flags);
out:
	io_vec_free(&local);
	ss_in_call--;
	ss_sock_put(s);
	return sent ? (ssize_t)sent : r;
}
