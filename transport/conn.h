/*
 * One upgraded byte stream over an RC QP, and the worker that progresses it.
 * The transport knows verbs; it never sees a socket. The shim drives a
 * connection through this interface and learns about readiness changes
 * through a callback.
 */
#ifndef SS_TRANSPORT_CONN_H
#define SS_TRANSPORT_CONN_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "handshake/hello.h"
#include "handshake/negotiate.h"
#include "handshake/reason.h"
#include "transport/device.h"
#include "transport/timer.h"

struct ss_worker;
struct ss_conn;

/* Transport settings, from the shim's options table. */
struct ss_transport_cfg {
	struct ss_dev_override dev;
	uint8_t recv_mode;     /* enum ss_recv_mode */
	uint32_t sq_depth;     /* send work requests per QP, control reserve included */
	uint32_t rx_window;    /* the peer's send window: receives posted (private RQ), or
				  messages it may send unasked (SRQ) */
	uint32_t buf_size;     /* bytes per receive buffer and per SEND */
	uint32_t max_inline;   /* SENDs up to this size go inline */
	uint32_t ctrl_reserve; /* control messages in flight; receives and SQ slots kept for them */
	uint32_t srq_initial;  /* SRQ: receive blocks at first, and the growth step */
	uint32_t srq_max;      /* SRQ: bound of the receive pool, in blocks */
	uint32_t srq_hold;     /* SRQ: blocks a connection keeps unread before copying out */
	uint32_t tx_pool_max;  /* bound of the device's send pool, in blocks */
	uint32_t qp_pool;      /* ready QPs kept per device (qpool.h); 0: none */
	/* Tests only (tests/rdma_conn.c; 0 otherwise): the SRQ's re-arm after a low pool waits this
	 * long, so that its receives drain before the limit is armed. */
	uint32_t test_rearm_ms;
};

/* Readiness of a connection, as a TCP socket would show it. */
enum {
	SS_RDY_IN = 1u << 0,     /* a read would not block: data, end of stream or error */
	SS_RDY_OUT = 1u << 1,    /* a write would not block */
	SS_RDY_RDHUP = 1u << 2,  /* the peer ended its stream */
	SS_RDY_HUP = 1u << 3,    /* both directions are over (or the connection failed) */
	SS_RDY_ERR = 1u << 4,    /* the connection failed */
	SS_RDY_EDGE = 1u << 5,   /* new data arrived since the last report: edge for ET waiters */
	SS_RDY_SENT = 1u << 6,   /* lingering (ss_conn_linger): everything is delivered */
	SS_RDY_SWITCH = 1u << 7, /* the stream moves to TCP: the peer's switched, or the QP
				    broke (ss_conn_switch) */
};

/*
 * What the shim hears from a connection. Called with the connection's lock
 * held, by any thread: it may make system calls and arm worker timers (a
 * leaf lock), never call a connection function or take a lock held across
 * transport calls. After ss_conn_destroy() returns it is not called again.
 */
struct ss_conn_hooks {
	/* Readiness changed (or new data arrived: SS_RDY_EDGE). */
	void (*ready)(void *arg, unsigned ready);
};

/*
 * The worker's services for the shim's background work (negotiation,
 * fallback): everything they call back runs on the progress thread with
 * no transport lock held, so a callback may take the shim's locks (try,
 * never wait: the progress thread must not stall).
 */

/* An fd the progress thread watches, one shot: cb runs once fd shows one of the events. */
struct ss_watch {
	atomic_int tag; /* the progress loop's: set by ss_worker_watch() */
	int fd;
	bool added;
	void (*cb)(struct ss_watch *wt, unsigned revents);
};

/* Arms wt on fd for events (EPOLLIN, EPOLLOUT...), again after each callback. Returns 0 or
 * -errno. */
int ss_worker_watch(struct ss_worker *w, struct ss_watch *wt, int fd, unsigned events);

/* Stops watching (call before closing the fd). A callback already harvested may still run. */
void ss_worker_unwatch(struct ss_worker *w, struct ss_watch *wt);

/* Work the progress thread runs after every callback it has already harvested (frees). */
struct ss_defer {
	struct ss_defer *next;
	void (*fn)(struct ss_defer *d);
};

/* Queues d: the progress thread calls d->fn soon, never while one of its callbacks runs. */
void ss_worker_defer(struct ss_worker *w, struct ss_defer *d);

/*
 * As ss_worker_defer, for work that holds nothing but memory: the progress
 * thread is not woken for it, only once SS_DEFER_LAZY_MAX such works wait;
 * they run at its next pass.
 */
#define SS_DEFER_LAZY_MAX 64
void ss_worker_defer_lazy(struct ss_worker *w, struct ss_defer *d);

/*
 * Arms t to fire at at (ms, the one clock) or earlier: an armed timer only
 * moves earlier, never later (transport/timer.h); t->fire runs on the
 * progress thread.
 */
void ss_worker_timer_arm(struct ss_worker *w, struct ss_timer *t, uint64_t at);

/* Disarms t. A callback already running is not waited for. */
void ss_worker_timer_cancel(struct ss_worker *w, struct ss_timer *t);

/*
 * Waiting in the application's own threads (the shim's epoll, poll and
 * select): a thread polls the worker's CQs itself while it spins, then
 * arms them and sleeps in the kernel on a set that holds the devices'
 * completion channels (the fds below), taking their events when it wakes.
 */

/* Polls every device's CQs once (skipping one another thread polls). Returns the completions
 * taken. */
int ss_worker_poll(struct ss_worker *w);

/*
 * The caller is about to sleep: arms every device's CQs, then polls once
 * more. Returns the completions that poll took (> 0: do not sleep).
 */
int ss_worker_arm(struct ss_worker *w);

/*
 * The completion channel fds of the devices opened so far, at most max;
 * returns their count. *gen_p: a number that changes when a device is
 * added (to know when to ask again).
 */
int ss_worker_event_fds(struct ss_worker *w, int *fds, int max, unsigned *gen_p);

/*
 * Every fd the worker keeps (its epoll set and wake-up eventfd; each
 * opened device's command and async fds and completion channel), at most
 * max; returns how many there are (more than max: ask again with room).
 * For the shim's close_range, which must leave them open.
 */
int ss_worker_own_fds(struct ss_worker *w, int *fds, int max);

/* A completion channel showed readable: takes its events (non-blocking) and what completed. */
void ss_worker_take_events(struct ss_worker *w);

/* delta = +1/-1: an application thread starts or stops polling (no CQ events are needed
 * meanwhile). */
void ss_worker_pollers(struct ss_worker *w, int delta);

/*
 * delta = +1/-1: something starts or stops needing the progress thread to
 * move connections on by itself (a thread asleep on the readiness mirror,
 * a registration the kernel answers, a drain): CQ events flow to it only
 * meanwhile. Any thread.
 */
void ss_worker_event_users(struct ss_worker *w, int delta);

/*
 * Application threads about to sleep (delta 1) on the devices' channels
 * themselves (ss_worker_event_fds), and after (-1): the CQs are armed for
 * them, and the progress thread leaves those events to them.
 */
void ss_worker_sleepers(struct ss_worker *w, int delta);

/* Connection statistics, for the status tool. */
struct ss_conn_stats {
	uint64_t tx_bytes, rx_bytes, tx_msgs, rx_msgs;
	uint64_t grants_sent, grants_received, requests_sent, requests_received;
	uint32_t tx_credits, to_return, sq_free;
	uint64_t copied_out; /* received messages copied out of the SRQ pool (slow reader) */
};

/* What a worker holds, for the status tool: summed over its devices. */
struct ss_worker_stats {
	char device[32];           /* the first device opened */
	uint64_t reg_bytes;        /* registered memory of the shared pools (not rq_kept's) */
	uint32_t tx_blocks;        /* send pool: blocks made */
	uint32_t srq_blocks;       /* SRQ receive pool: blocks made, */
	uint32_t srq_max;          /* its bound, */
	uint32_t srq_posted;       /* blocks posted on the SRQ now, */
	uint32_t srq_peak_held;    /* and the most held by connections at once */
	uint64_t srq_limit_events; /* SRQ limit events (each grew the pool unless at the bound; a
				      completion that sees it low does that too, uncounted) */
	uint32_t qp_ready;         /* ready QPs in the pool now (qpool.h) */
	uint32_t rq_kept;          /* private receive pools kept from closed connections (pool.h) */
	uint64_t qp_taken;         /* connections that took a ready QP, */
	uint64_t qp_own;           /* and those that found none and made their own */
};

/* Statistics snapshot of w. */
void ss_worker_get_stats(struct ss_worker *w, struct ss_worker_stats *st);

/*
 * Has the progress thread write w's statistics to *pub (shared memory the
 * status tool reads) now and about once a second. NULL stops it.
 */
void ss_worker_publish(struct ss_worker *w, struct ss_worker_stats *pub);

/* The process's worker, created (device-less) on first need. Returns 0 or -errno. */
int ss_worker_get(struct ss_worker **worker_p);

/*
 * Opens the device of the local address local and makes its pools, as the
 * first connection on it would (ss_conn_create), ahead of that connection:
 * the caller's thread takes that time. Returns 0 or -errno.
 */
int ss_worker_warm(struct ss_worker *w, const struct ss_transport_cfg *cfg,
		   const struct sockaddr *local);

/*
 * Forgets the worker after fork in the child: the parent's verbs objects are
 * never touched or destroyed by the child; a new worker is made on need.
 */
void ss_worker_forget_after_fork(void);

/*
 * Creates a connection for a TCP connection whose local address is local:
 * picks the device, creates the QP and posts its receives, and fills *mine
 * with what our HELLO or ACCEPT must carry. Returns 0, or -errno with
 * *reason_p saying why the connection must stay on TCP.
 */
int ss_conn_create(struct ss_worker *w, const struct ss_transport_cfg *cfg,
		   const struct sockaddr *local, const struct ss_conn_hooks *hooks, void *hooks_arg,
		   struct ss_conn **conn_p, struct ss_params *mine, enum ss_reason *reason_p);

/*
 * The peer's TCP end is gone (end of file or reset): before the commit
 * point the connection fails; after it, a peer that did not end its stream
 * fails the connection after a short grace, so RDMA messages that the TCP
 * end overtook are still delivered.
 */
void ss_conn_peer_gone(struct ss_conn *c);

/* All GIDs of the connection's device port (for the loopback GID check). */
size_t ss_conn_local_gids(const struct ss_conn *c, uint8_t (*gids)[16], size_t max);

/*
 * Connects the QP to the peer (RTR, then RTS). After this our QP can receive
 * and send; data flows once ss_conn_start() is called. Returns 0 or -errno.
 */
int ss_conn_connect(struct ss_conn *c, const struct ss_params *peer,
		    const struct ss_agreement *agr);

/* The commit point: both QPs can receive (the peer said so). Data may now be sent. */
void ss_conn_start(struct ss_conn *c);

/*
 * Before the commit point (or after a failure): takes every byte that
 * ss_conn_send() accepted and never posted, oldest first, into a malloc'd
 * buffer the caller frees (*buf_p NULL when there are none). From then on
 * the connection takes no more data. Returns the count or -ENOMEM.
 */
ssize_t ss_conn_take_unsent(struct ss_conn *c, uint8_t **buf_p);

/* Our stream as ss_conn_switch() hands it back for TCP. */
struct ss_handback {
	uint8_t *buf;  /* malloc'd, the caller frees; NULL when len is 0 */
	size_t len;    /* its bytes: the stream from offset `from` on */
	uint64_t from; /* stream offset of buf's first byte */
	bool ended;    /* our stream had ended (shutdown): TCP's write side ends after buf */
	bool lost;     /* the QP broke: the peer's count of what it received says where TCP
			  resumes (buf may start before it); else from is exactly that */
};

/*
 * Moving back to TCP (docs/protocol.md, section 4), our stream leaves the QP.
 * Live (the QP works): every byte accepted and not yet posted goes into hb
 * for the caller to send over TCP; what was posted is followed by an end of
 * stream that says "switch". Lost (SS_RDY_SWITCH on a broken QP, or after
 * ss_conn_lose()): hb holds every byte not known delivered when the QP
 * broke, posted or not. From then on ss_conn_send() returns -EXDEV (for a
 * lost QP, from the moment it broke). A shutdown whose end of stream still waits for credits
 * becomes the switch, with its bytes taken back (hb->ended is set). Returns 0, -ECONNRESET after a
 * failure (or a second call), -ENOTCONN before the commit point, -EPIPE when the peer's TCP end is
 * gone (nobody to move with), or -ENOMEM.
 */
int ss_conn_switch(struct ss_conn *c, struct ss_handback *hb);

/*
 * The QP broke while a live move was under way (ours, or the peer's LOST
 * after ss_conn_lose()): hands over the copy of ss_conn_switch's lost case
 * (the bytes posted and not known delivered; the unposted went with the
 * live switch). Returns 0, -EAGAIN when the QP has not broken, or
 * -ECONNRESET when the copy was handed over already.
 */
int ss_conn_take_lost(struct ss_conn *c, struct ss_handback *hb);

/*
 * The peer says its RDMA path is gone: our QP goes to the error state and
 * the connection is lost as if ours broke (ss_conn_switch). Returns 0, or
 * -ECONNRESET when it failed instead (not running, or a peer that cannot
 * move).
 */
int ss_conn_lose(struct ss_conn *c);

/*
 * Once every byte the peer sent over RDMA is here (its end of stream, or the
 * switch of ss_conn_switch, came; or the QP is lost and its receives are
 * final): takes every byte not read yet, in order, into *buf_p (malloc'd,
 * the caller frees; NULL when none), under one hold of the connection's
 * lock, and the count of the peer's stream received over RDMA in all into
 * *received_p; from then on ss_conn_recv() returns -EXDEV. Returns the
 * count, -EAGAIN until then, -ECONNRESET after a failure, or -ENOMEM.
 */
ssize_t ss_conn_take_unread(struct ss_conn *c, uint8_t **buf_p, uint64_t *received_p);

/*
 * Copies up to the iovec's bytes into the send path. Returns the count taken
 * (short when the send buffer is full), -EAGAIN when nothing fits now,
 * -EPIPE after our own shutdown, -ECONNRESET after a failure. more: the
 * caller has more to send at once (MSG_MORE): hold a partial message.
 * -EXDEV after ss_conn_switch() or once the QP is lost.
 */
ssize_t ss_conn_send(struct ss_conn *c, const struct iovec *iov, int iovcnt, bool more);

/*
 * Copies received bytes into the iovec. Returns the count, 0 at end of
 * stream (or for an empty iovec while bytes are there), -EAGAIN when
 * nothing is there, -ECONNRESET after a failure, -EXDEV when the peer
 * moved its stream to TCP (or the QP is lost) and every byte that came
 * here was read.
 * peek: leave the bytes in place.
 */
ssize_t ss_conn_recv(struct ss_conn *c, const struct iovec *iov, int iovcnt, bool peek);

/* Bytes ss_conn_send() takes at once into an idle connection (all its send slots). */
size_t ss_conn_send_capacity(struct ss_conn *c);

/*
 * The application reads buf's len bytes (malloc'd; the connection frees it)
 * before anything the peer sent over RDMA: the peer's bytes that came over
 * TCP before the connection moved to RDMA. Call it before the application
 * reads from c. Returns 0, -EBUSY (one such buffer at a time) or -EINVAL;
 * buf is the connection's either way.
 */
int ss_conn_put_front(struct ss_conn *c, uint8_t *buf, size_t len);

/* Bytes readable now (FIONREAD). */
size_t ss_conn_readable(struct ss_conn *c);

/*
 * Bytes accepted and not yet acknowledged by the peer's side (SIOCOUTQ:
 * sent without a completion yet, or not sent); *unsent_p gets those not
 * yet sent (SIOCOUTQNSD).
 */
size_t ss_conn_unacked(struct ss_conn *c, size_t *unsent_p);

/* Ends our stream once everything accepted has been sent. Returns 0 or -errno. */
int ss_conn_shutdown_wr(struct ss_conn *c);

/* Current readiness (SS_RDY_* without EDGE). */
unsigned ss_conn_ready(struct ss_conn *c);

/* Calls the ready hook with the current readiness, changed or not. */
void ss_conn_resync(struct ss_conn *c);

/*
 * Waits up to timeout_ms (-1: no limit) until everything accepted has been
 * sent and acknowledged. Returns 0, -ETIMEDOUT, or -ECONNRESET. With 0 it
 * takes the CQs' completions once and says whether it is so (no warning).
 */
int ss_conn_drain(struct ss_conn *c, int timeout_ms);

/*
 * The application closed: what was sent and the end of stream (if shut)
 * are delivered in the background, without anyone waiting. The worker
 * takes the connection's CQ events until it is destroyed, and the hook
 * gets SS_RDY_SENT once everything is delivered or nothing is left to
 * deliver to (failed, peer gone), at once if that is so already.
 * ss_conn_drain(c, 0) moves it on without waiting.
 */
void ss_conn_linger(struct ss_conn *c);

/* Statistics snapshot. */
void ss_conn_get_stats(struct ss_conn *c, struct ss_conn_stats *st);

/*
 * Keeps the connection's counters in *pub from now on (shared memory the
 * status tool reads; updated with plain stores). NULL: back to private
 * memory. ss_conn_destroy() stops writing to it.
 */
void ss_conn_publish(struct ss_conn *c, struct ss_conn_stats *pub);

/* Releases the connection (no EOS: call shutdown and drain first). Accepts NULL. */
void ss_conn_destroy(struct ss_conn *c);

/* Sets the transport's log level (the module keeps its own copy). */
void ss_transport_set_log_level(int level);

/*
 * The transport as the shim sees it: libsrqshim.so loads the transport
 * module (and with it libibverbs) on first need and calls through this
 * table, so a process without TCP connections, or a host without
 * rdma-core, never loads verbs.
 */
struct ss_transport_ops {
	unsigned version; /* SS_TRANSPORT_OPS_VERSION */
	void (*set_log_level)(int level);
	int (*worker_get)(struct ss_worker **worker_p);
	int (*worker_warm)(struct ss_worker *w, const struct ss_transport_cfg *cfg,
			   const struct sockaddr *local);
	void (*worker_forget_after_fork)(void);
	int (*conn_create)(struct ss_worker *w, const struct ss_transport_cfg *cfg,
			   const struct sockaddr *local, const struct ss_conn_hooks *hooks,
			   void *hooks_arg, struct ss_conn **conn_p, struct ss_params *mine,
			   enum ss_reason *reason_p);
	void (*conn_peer_gone)(struct ss_conn *c);
	ssize_t (*conn_take_unsent)(struct ss_conn *c, uint8_t **buf_p);
	int (*conn_switch)(struct ss_conn *c, struct ss_handback *hb);
	int (*conn_lose)(struct ss_conn *c);
	int (*conn_take_lost)(struct ss_conn *c, struct ss_handback *hb);
	ssize_t (*conn_take_unread)(struct ss_conn *c, uint8_t **buf_p, uint64_t *received_p);
	int (*worker_watch)(struct ss_worker *w, struct ss_watch *wt, int fd, unsigned events);
	void (*worker_unwatch)(struct ss_worker *w, struct ss_watch *wt);
	void (*worker_defer)(struct ss_worker *w, struct ss_defer *d);
	void (*worker_defer_lazy)(struct ss_worker *w, struct ss_defer *d);
	void (*worker_timer_arm)(struct ss_worker *w, struct ss_timer *t, uint64_t at);
	void (*worker_timer_cancel)(struct ss_worker *w, struct ss_timer *t);
	int (*worker_poll)(struct ss_worker *w);
	int (*worker_arm)(struct ss_worker *w);
	int (*worker_event_fds)(struct ss_worker *w, int *fds, int max, unsigned *gen_p);
	int (*worker_own_fds)(struct ss_worker *w, int *fds, int max);
	void (*worker_take_events)(struct ss_worker *w);
	void (*worker_pollers)(struct ss_worker *w, int delta);
	void (*worker_event_users)(struct ss_worker *w, int delta);
	void (*worker_sleepers)(struct ss_worker *w, int delta);
	size_t (*conn_local_gids)(const struct ss_conn *c, uint8_t (*gids)[16], size_t max);
	int (*conn_connect)(struct ss_conn *c, const struct ss_params *peer,
			    const struct ss_agreement *agr);
	void (*conn_start)(struct ss_conn *c);
	ssize_t (*conn_send)(struct ss_conn *c, const struct iovec *iov, int iovcnt, bool more);
	ssize_t (*conn_recv)(struct ss_conn *c, const struct iovec *iov, int iovcnt, bool peek);
	size_t (*conn_readable)(struct ss_conn *c);
	size_t (*conn_unacked)(struct ss_conn *c, size_t *unsent_p);
	size_t (*conn_send_capacity)(struct ss_conn *c);
	int (*conn_put_front)(struct ss_conn *c, uint8_t *buf, size_t len);
	int (*conn_shutdown_wr)(struct ss_conn *c);
	unsigned (*conn_ready)(struct ss_conn *c);
	void (*conn_resync)(struct ss_conn *c);
	int (*conn_drain)(struct ss_conn *c, int timeout_ms);
	void (*conn_linger)(struct ss_conn *c);
	void (*conn_get_stats)(struct ss_conn *c, struct ss_conn_stats *st);
	void (*conn_destroy)(struct ss_conn *c);
	void (*worker_get_stats)(struct ss_worker *w, struct ss_worker_stats *st);
	void (*conn_publish)(struct ss_conn *c, struct ss_conn_stats *pub);
	void (*worker_publish)(struct ss_worker *w, struct ss_worker_stats *pub);
};

extern const struct ss_transport_ops ss_transport_ops;

#define SS_TRANSPORT_OPS_VERSION 18
#define SS_TRANSPORT_OPS_SYMBOL  "ss_transport_ops"

#endif
