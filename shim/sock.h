/* The shim's view of the application's TCP sockets: the fd table and its entries. */
#ifndef SS_SHIM_SOCK_H
#define SS_SHIM_SOCK_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include "handshake/reason.h"
#include "handshake/hello.h"
#include "shim/config.h"
#include "transport/conn.h"

/*
 * The life of a socket (docs/design.md, "Negotiation"). A client goes
 * FRESH -> CONNECTING -> PROBING -> UPGRADED, or from PROBING (or
 * RECONNECTING) through FALLBACK to PLAIN; a server ACCEPTED -> UPGRADED or
 * PLAIN, and UPGRADED -> FALLBACK -> PLAIN when the client declines after
 * all. From CONNECTING to FALLBACK the application's fd is our socketpair
 * end (the TCP socket is tcp_fd); in PLAIN it is the TCP socket again. A
 * client that starts on TCP (asking.c) goes FRESH -> ASKING -> PLAIN on its
 * own TCP socket, or from ASKING into the socketpair and RECONNECTING when
 * the server turns out plain; after LATER both sides may be LATE instead of
 * PLAIN, and go from there to UPGRADED (into the socketpair) or PLAIN.
 */
enum ss_sock_state {
	SS_SOCK_FRESH,        /* a TCP socket before connect: its bind and options are recorded */
	SS_SOCK_LISTEN,       /* listening; accepted sockets start in SS_SOCK_ACCEPTED */
	SS_SOCK_CONNECTING,   /* client: the TCP connect runs on tcp_fd */
	SS_SOCK_PROBING,      /* client: HELLO sent; writes held in hold, reads wait */
	SS_SOCK_RECONNECTING, /* client: the probe failed; a plain TCP connect runs on tcp_fd */
	SS_SOCK_ACCEPTED,     /* server side, undecided: the first I/O looks for a HELLO */
	SS_SOCK_UPGRADED,     /* conn carries the bytes */
	SS_SOCK_FALLBACK, /* plain, but held bytes still go to tcp_fd before it is handed back */
	SS_SOCK_PLAIN,    /* kernel TCP on the application's fd; reason says why */
	SS_SOCK_FOREIGN,  /* inherited over fork while upgraded or negotiating: not usable here */
	/* client that starts on TCP: HELLO sent (or due once connected), the answer not taken or
	 * the bytes held meanwhile not all sent; the application's fd is the TCP socket */
	SS_SOCK_ASKING,
	/* on TCP after LATER (either side; moving.c): the application's fd is the TCP socket,
	 * read by peek and take (the peer's urgent mark); the move to RDMA may start */
	SS_SOCK_LATE,
};

/* What must be taken off the head of the TCP stream before the application reads it. */
/*
 * What of TCP's own the application takes itself (ss_sock's urg_app):
 * urgent data (SO_OOBINLINE, a SIGURG owner), and the completions of
 * MSG_ZEROCOPY sends on the error queue (SO_ZEROCOPY), which an RDMA
 * stream never gives.
 */
enum { SS_URG_INLINE = 1, SS_URG_OWNER = 2, SS_URG_ZEROCOPY = 4 };

enum ss_strip {
	SS_STRIP_NONE,
	/* Handshake messages carrying our nonce (answers and give-ups that crossed). */
	SS_STRIP_NONCE,
	SS_STRIP_HELLO, /* server that wrote first: a late HELLO, answered with DECLINE */
};

struct ss_stats_conn;

struct ss_opt_rec {
	int level, name;
	socklen_t len;
	uint8_t val[32];
};

struct ss_epreg;
struct ss_down;
struct ss_lateio;
struct ss_heir;

/*
 * Locks, always taken in this order: lock (state; held across negotiation
 * and transport calls), then the connection's own lock, then fd_lock (a
 * leaf: the fd names and the readiness mirror; never held across a
 * transport call). The progress thread only ever tries lock (its callbacks
 * retry on the kick timer), so no application thread can stall it. The
 * process's whole lock order (shim and transport): docs/design.md, "Threads
 * and locks".
 */
struct ss_sock {
	pthread_mutex_t lock;
	pthread_mutex_t fd_lock;
	atomic_int refs; /* table references plus calls in progress */
	int fds[4];      /* application fd numbers naming this socket (dup) */
	int n_fds;
	int tcp_fd;  /* the TCP socket once moved to a private fd, else -1 */
	int shim_fd; /* our end of the socketpair, else -1 */
	int domain;
	atomic_int state; /* enum ss_sock_state; written under lock, read anywhere */
	enum ss_reason reason;
	struct ss_conn *conn; /* kept until the entry is freed once made (calls may hold it) */
	uint8_t peer_mode;    /* enum ss_recv_mode of the peer, when upgraded */
	uint32_t peer_window;
	struct ss_stats_conn *stat; /* our slot in the published statistics, or NULL */

	/* recorded for replay on a plain reconnect */
	struct sockaddr_storage bound;
	socklen_t bound_len;
	struct ss_opt_rec opts[16];
	int n_opts;
	atomic_int nonblock; /* O_NONBLOCK of its open file: -1 not known (ask), 0, 1 */
	/* SO_RCVTIMEO, SO_SNDTIMEO in ms: -1 not known (ask), 0 none; kept by setsockopt */
	atomic_int timeo_ms[2];
	bool cork;

	/* negotiation (under lock) */
	uint8_t strip;     /* enum ss_strip */
	bool acked;        /* client: the server acknowledged; server: we sent ACK */
	bool prober;       /* client: this connect probes its destination for the cache */
	bool dest_shimmed; /* client: the cache knew the destination as shimmed */
	bool reported;     /* client: connect() has reported the outcome of a connect in progress */
	bool shut_wr_held; /* shutdown(SHUT_WR) before the decision: applied after it */
	bool committed;    /* server: READY came (the client sends over RDMA from now on) */
	bool hello_sent;   /* ASKING: the HELLO is out */
	bool shut_early;   /* client: shut while its TCP connect ran: once connected, plain (no
			      HELLO; reset if bytes were held) */
	bool answered;     /* ASKING: the server's answer is taken; the hold goes to TCP */
	bool looked_empty; /* ASKING: the last look for the answer found nothing more there */
	bool rtt_waited;   /* ASKING: the HELLO's wait grew once by four round trips */
	/*
	 * The application takes urgent data itself (SS_URG_*: SO_OOBINLINE, a
	 * signal owner for SIGURG): never LATE, where the peer's mark is
	 * urgent data (moving.c). SS_URG_ZEROCOPY (SO_ZEROCOPY): never LATE
	 * nor upgraded. A listener's SS_URG_INLINE and SS_URG_ZEROCOPY go to
	 * the connections it accepts, as the kernel's options do.
	 */
	atomic_uint urg_app;
	/* When part of a message was first seen at the head (ACCEPTED: where the HELLO would be;
	 * PLAIN: a message to strip): ss_partial_lasted */
	uint64_t partial_ms;
	/* PLAIN: the connection's error that our own send of held bytes took: the application's */
	atomic_int plain_err; /* next read, write or SO_ERROR gets it, once (asking.c, plain.c) */
	atomic_bool reset_taken; /* the reset was reported once (read, write or SO_ERROR) */
	/*
	 * shutdown(SHUT_RD) by the application: its reads see the end once
	 * nothing is theirs, and it shows IN and RDHUP, as TCP's; applied to
	 * the TCP socket once plain. Set under the lock.
	 */
	atomic_bool shut_rd;
	/*
	 * server, ACCEPTED: a thread's call reads the HELLO off the TCP socket
	 * (set before the read; cleared when none is there) and answers it; an
	 * upgrade will put our socketpair end on the fd (a kernel wait begun on
	 * the socket would sleep on a file that gets nothing more: mux.c waits
	 * in slices). Set under the lock; meaningless once decided.
	 */
	atomic_bool answering;
	uint32_t nonce;
	uint64_t deadline; /* ms: the current wait of the negotiation ends then */
	/* The peer's address: a client's destination, or what accept gave (0: not known). */
	struct sockaddr_storage dst;
	socklen_t dst_len;
	struct ss_params mine;
	uint8_t *hold; /* bytes written before the decision, or going to tcp_fd first */
	struct ss_hs_part *answer_part; /* ASKING: part of the answer, taken before the rest came */
	size_t hold_len, hold_max;
	uint32_t peer_caps; /* the peer's capabilities (SS_CAP_*), when upgraded */
	/* LATE: the move's exchange over tcp_fd, and what the connection did so far (moving.c) */
	struct ss_lateio *late;
	uint64_t late_born_ms, late_bytes, late_calls;
	bool late_looked; /* the progress thread's first look is done (its watch armed) */
	bool lowat;       /* SO_RCVLOWAT above 1 was set: a blocking read looks before it waits */
	struct ss_params late_peer; /* the peer's HELLO (server) or ACCEPT (client) */
	/* FALLBACK: a live downgrade's TCP exchange to finish first (down.c) */
	struct ss_down *down;
	atomic_bool down_wanted; /* the operator asked for a downgrade (ctlchan.c) */

	/* a connection a forked child holds too (inherit.c) */
	uint64_t serial;           /* unique in its process: how a child names it to its owner */
	int owner;                 /* FOREIGN: the pid of the process that carries it */
	atomic_bool kept;          /* closed here, kept while a child holds its name: a reference */
	struct ss_sock *kept_next; /* the kept list (inherit.c's lock) */
	_Atomic(struct ss_heir *) heir; /* a child's exec waits for the TCP socket there */

	/* background work on the progress thread (when bg is set; ss_w's services) */
	bool bg;
	struct ss_watch watch; /* on tcp_fd */
	struct ss_timer kick;  /* deadlines, and retries of a busy lock */
	struct ss_defer grave; /* the free, after any callback already harvested */
	/* closed by the application, its bytes still on their way (close.c): a reference */
	atomic_bool closing;
	uint64_t close_deadline; /* ms; written before closing is set */

	/* the application's epoll registrations of its names (epoll.c; fd_lock) */
	struct ss_epreg *epregs;
	atomic_uint rdy; /* what the connection shows (SS_RDY_*), for the application's waits */
	atomic_int mirror_refs;    /* waits the kernel answers: the mirror must show the truth */
	atomic_bool mirror_events; /* counted in the worker's event users for them */

	/* the readiness mirror (under fd_lock) */
	bool mirror_on; /* our socketpair end is on the application's names */
	int tokens;
	bool junk, rdhup_shown, hup_shown;
	/* Threads blocked writing into the application's end (see ss_leave_pair). */
	int wait_writers;
	bool shut_wr;
};

/* Returns the entry for fd with a reference taken, or NULL for an fd that is not ours. */
struct ss_sock *ss_sock_get(int fd);

/* Takes a reference unless the entry is already being freed (background callbacks). */
bool ss_sock_tryget(struct ss_sock *s);

static inline int ss_sock_state(struct ss_sock *s)
{
	return atomic_load_explicit(&s->state, memory_order_acquire);
}

static inline void ss_sock_set_state(struct ss_sock *s, int st)
{
	atomic_store_explicit(&s->state, st, memory_order_release);
}

/* Drops a reference from ss_sock_get() or ss_sock_new(). */
void ss_sock_put(struct ss_sock *s);

/*
 * A new entry for fd (replacing any), with one reference for the caller.
 * nonblock: its open file's O_NONBLOCK, -1 when not known (asked at need).
 * SS_SOCK_FRESH (made by socket() just now): no SO_RCVTIMEO/SO_SNDTIMEO.
 * NULL: no memory.
 */
struct ss_sock *ss_sock_new(int fd, int domain, enum ss_sock_state state, int nonblock);

/* fd names s too (dup). Returns 0 or -ENOSPC. */
int ss_sock_add_fd(struct ss_sock *s, int fd);

/*
 * Forgets fd and, when close_ret is non-NULL, closes it (real close, its
 * result in *close_ret). Returns the entry if fd was its last name (the
 * caller ends the connection and puts it), else NULL.
 */
struct ss_sock *ss_sock_remove_fd(int fd, int *close_ret);

/*
 * A connection decided plain for good: its names become "not ours", so
 * their calls cost one table read from now on. The caller's reference stays.
 */
void ss_sock_forget(struct ss_sock *s);

/* Marks fd as seen and not ours (costs nothing on later calls). */
void ss_sock_mark_plain_fd(int fd);

/* True when fd was never seen: the caller may classify it. */
bool ss_sock_unknown(int fd);

/* Calls fn on every entry (fork handling); the table is not locked against changes. */
void ss_sock_for_each(void (*fn)(struct ss_sock *s));

/* As ss_sock_for_each, each entry with a reference held during fn (any thread, no lock held). */
void ss_sock_for_each_held(void (*fn)(struct ss_sock *s));

/*
 * In a forked child: every lock of the table and its entries is made anew
 * (a parent thread may have held one), and statistics slots of plain
 * connections are the parent's.
 */
void ss_sock_after_fork(void);

/* The fd table's size (the open-file limit at load). */
int ss_sock_table_size(void);

#endif
