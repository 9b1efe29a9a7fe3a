/*
 * The end of a socket (docs/design.md, "Closing"): close() returns at once,
 * as TCP's does, and what the application sent, then the end of the
 * stream, are delivered in the background within SRQSHIM_LINGER_MS;
 * SO_LINGER is honoured (a zero time: abortive; a positive one: close
 * waits up to that long); at exit the process waits for delivery, bounded.
 */
#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <unistd.h>

#include "shim/real.h"
#include "shim/shim.h"
#include "transport/log.h"

/* Sockets closed by the application whose bytes are still being delivered. */
static atomic_int close_lingering;

/*
 * SO_LINGER of s's TCP socket: -1 off, else its time in ms (0: abortive:
 * TCP's close sends a reset and drops what is unsent). Lock held.
 */
static int close_so_linger_ms(struct ss_sock *s)
{
	struct linger lg;
	socklen_t len = sizeof(lg);

	if (s->tcp_fd < 0 || ss_real.getsockopt(s->tcp_fd, SOL_SOCKET, SO_LINGER, &lg, &len) != 0 ||
	    !lg.l_onoff)
		return -1;
	return lg.l_linger > 600 ? 600000 : lg.l_linger * 1000;
}

/* The background delivery of s is over (delivered, failed, or its time is up): its reference
 * goes. */
static void close_bg_done(struct ss_sock *s)
{
	if (atomic_exchange(&s->closing, false)) {
		atomic_fetch_sub(&close_lingering, 1);
		ss_sock_put(s);
	}
}

/*
 * Whether what s accepted is delivered (moving it on without waiting).
 * Upgraded: the connection says. Falling back (the client declined after
 * all, before its READY): not until the held bytes are on TCP, which the
 * background work of that state does (decide_bg_run). Plain: the kernel
 * has them.
 */
static bool close_delivered_now(struct ss_sock *s)
{
	switch (ss_sock_state(s)) {
	case SS_SOCK_UPGRADED:
		/* Failed (reset) counts as over: nothing more can be delivered. */
		return ss_tp->conn_drain(s->conn, 0) != -ETIMEDOUT;
	/* Still negotiating (a close of ASKING hands it to the progress thread): not yet. */
	case SS_SOCK_CONNECTING:
	case SS_SOCK_PROBING:
	case SS_SOCK_RECONNECTING:
	case SS_SOCK_ASKING:
	case SS_SOCK_LATE:
	case SS_SOCK_FALLBACK: return false;
	default: return true;
	}
}

void ss_close_bg_step(struct ss_sock *s)
{
	uint64_t now = ss_now_ms(), end = s->close_deadline;
	int r = close_delivered_now(s) ? 0 : -ETIMEDOUT;

	if (r == -ETIMEDOUT && now < end) {
		/* Delivery never depends on an event alone: looked at every 50 ms too. */
		ss_bg_kick(s, now + 50 < end ? now + 50 : end);
		return;
	}
	if (r == -ETIMEDOUT)
		ss_log_warn("a closed connection: not delivered within SRQSHIM_LINGER_MS (%d ms): "
			    "it ends now",
			    ss_cfg.linger_ms);
	close_bg_done(s);
}

void ss_close_delivered(struct ss_sock *s)
{
	if (atomic_load_explicit(&s->closing, memory_order_acquire))
		ss_bg_kick(s, ss_now_ms());
}

/*
 * Hands the delivery of s (its connection c, or its negotiation when c is
 * NULL) over to the progress thread until end (ms); s keeps a reference.
 */
static void close_in_background(struct ss_sock *s, struct ss_conn *c, uint64_t end)
{
	pthread_mutex_lock(&s->lock);
	if (ss_bg_start(s) != 0) {
		pthread_mutex_unlock(&s->lock);
		if (c)
			ss_tp->conn_drain(c, (int)(end > ss_now_ms() ? end - ss_now_ms() : 0));
		return;
	}
	pthread_mutex_unlock(&s->lock);
	atomic_fetch_add(&s->refs, 1);
	atomic_fetch_add(&close_lingering, 1);
	s->close_deadline = end;
	atomic_store_explicit(&s->closing, true, memory_order_release);
	/* Its hook says when all is delivered (ss_close_delivered), at once if so already. */
	if (c)
		ss_tp->conn_linger(c);
	ss_bg_kick(s, ss_now_ms());
}

/* The end of a close's bounded work (SRQSHIM_LINGER_MS from the first need of it): a close
 * with nothing to deliver reads no clock. */
static uint64_t close_end(uint64_t *end)
{
	if (*end == 0)
		*end = ss_deadline_in(ss_cfg.linger_ms);
	return *end;
}

void ss_client_settle(struct ss_sock *s, uint64_t *end)
{
	while (ss_client_step(s) && ss_now_ms() < close_end(end)) {
		struct pollfd p = {.fd = s->tcp_fd,
				   .events =
					   ss_sock_state(s) == SS_SOCK_PROBING ? POLLIN : POLLOUT};
		uint64_t until = s->deadline && s->deadline < *end ? s->deadline : *end;
		uint64_t now = ss_now_ms();

		pthread_mutex_unlock(&s->lock);
		ss_real.poll(&p, 1, until > now ? (int)(until - now) : 0);
		pthread_mutex_lock(&s->lock);
	}
	while (ss_sock_state(s) == SS_SOCK_FALLBACK && ss_fallback_flush(s) == -EAGAIN &&
	       ss_now_ms() < close_end(end)) {
		/* A move back to TCP waits for its TCP side, or looks at the CQs every 2 ms. */
		struct pollfd p = {.fd = s->tcp_fd,
				   .events = (short)(s->down ? ss_down_events(s) : POLLOUT)};
		int left = (int)(*end - ss_now_ms());

		pthread_mutex_unlock(&s->lock);
		ss_real.poll(&p, 1, p.events == POLLOUT || left < 2 ? left : 2);
		pthread_mutex_lock(&s->lock);
	}
}

void ss_sock_finish(struct ss_sock *s, bool may_block)
{
	uint64_t end = 0;
	struct ss_conn *c = NULL;
	bool shut = false;
	int linger = -1;

	pthread_mutex_lock(&s->lock);
	if (ss_sock_state(s) == SS_SOCK_LATE && ss_move_close(s)) {
		/* A move under way: it ends in the background, then what it held is delivered. */
		pthread_mutex_unlock(&s->lock);
		close_in_background(s, NULL, close_end(&end));
		return;
	}
	if (ss_sock_state(s) == SS_SOCK_ASKING) {
		/*
		 * Starting on TCP: close returns at once, as TCP's; the answer and
		 * then the held bytes are the progress thread's (their socket lives
		 * on as tcp_fd), within SRQSHIM_LINGER_MS.
		 */
		pthread_mutex_unlock(&s->lock);
		close_in_background(s, NULL, close_end(&end));
		return;
	}
	/* A negotiation in progress ends first: its held bytes go wherever it decides. */
	ss_client_settle(s, &end);
	/*
	 * An abortive close: no end of stream; the TCP socket's close resets
	 * the peer's, which fails the peer's connection with ECONNRESET.
	 */
	if (ss_sock_state(s) == SS_SOCK_UPGRADED && s->conn) {
		linger = close_so_linger_ms(s);
		if (linger != 0) {
			/* Stays until the entry is freed: the caller holds a reference. */
			c = s->conn;
			shut = !s->shut_wr;
			s->shut_wr = true;
		}
	}
	pthread_mutex_unlock(&s->lock);
	if (!c)
		return;
	/* Without our lock, which the progress thread needs to see the peer's READY or its end. */
	if (shut)
		ss_tp->conn_shutdown_wr(c);
	/*
	 * SO_LINGER with a time: close waits up to that long, as TCP's; what
	 * is not delivered by then gets the background's own time after it.
	 */
	if (linger > 0 && may_block) {
		ss_tp->conn_drain(c, linger);
		end = 0; /* the background's time counts from here */
	}
	if (!close_delivered_now(s))
		close_in_background(s, c, close_end(&end));
}

void ss_close_wait_all(void)
{
	uint64_t end = ss_deadline_in(ss_cfg.linger_ms);

	/* The progress thread delivers; this thread helps by polling the CQs. */
	while (atomic_load(&close_lingering) > 0 && ss_now_ms() < end) {
		struct ss_worker *w = atomic_load_explicit(&ss_w, memory_order_acquire);

		if (w)
			ss_tp->worker_poll(w);
		usleep(1000);
	}
}

void ss_close_after_fork(void)
{
	/* The parent's background closes are the parent's (the child has no progress thread). */
	atomic_store(&close_lingering, 0);
}
