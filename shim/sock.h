/* The shim's view of the application's TCP sockets: the fd table and its entries. */
#ifndef SS_SHIM_SOCK_H
#define SS_SHIM_SOCK_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include "handshake/reason.h"
#include "shim/config.h"
#include "transport/conn.h"

enum ss_sock_state {
	SS_SOCK_FRESH,    /* a TCP socket before connect: its bind and options are recorded */
	SS_SOCK_LISTEN,   /* listening; accepted sockets start in SS_SOCK_ACCEPTED */
	SS_SOCK_ACCEPTED, /* server side, undecided: the first I/O looks for a HELLO */
	SS_SOCK_PLAIN,    /* kernel TCP on the application's fd; reason says why */
	SS_SOCK_UPGRADED, /* the application's fd is our socketpair end; conn carries the bytes */
	SS_SOCK_FOREIGN,  /* an upgraded connection inherited over fork: not usable here */
};

struct ss_stats_conn;

struct ss_opt_rec {
	int level, name;
	socklen_t len;
	uint8_t val[32];
};

struct ss_epoll_reg {
	int epfd;
	struct epoll_event ev;
};

/*
 * Locks, always taken in this order: lock (state; held across negotiation
 * and transport calls), then the connection's own lock, then fd_lock (a
 * leaf: the fd names and the readiness mirror; never held across a
 * transport call).
 */
struct ss_sock {
	pthread_mutex_t lock;
	pthread_mutex_t fd_lock;
	int refs;   /* table references plus calls in progress */
	int fds[4]; /* application fd numbers naming this socket (dup) */
	int n_fds;
	int tcp_fd;  /* the TCP socket once moved to a private fd, else -1 */
	int shim_fd; /* our end of the socketpair, else -1 */
	int domain;
	enum ss_sock_state state;
	enum ss_reason reason;
	struct ss_conn *conn;
	uint8_t peer_mode; /* enum ss_recv_mode of the peer, when upgraded */
	uint32_t peer_window;
	struct ss_stats_conn *stat; /* our slot in the published statistics, or NULL */

	/* recorded for replay on a plain reconnect */
	struct sockaddr_storage bound;
	socklen_t bound_len;
	struct ss_opt_rec opts[16];
	int n_opts;
	bool cork;
	bool strip_hello; /* plain after our server wrote first: remove a late HELLO */

	/* epoll registrations of the application's fd, re-made after a swap */
	struct ss_epoll_reg regs[8];
	int n_regs;

	/* the readiness mirror (under fd_lock) */
	bool mirror_on;
	int tokens;
	bool junk, rdhup_shown, hup_shown;
	bool shut_wr;
};

/* Returns the entry for fd with a reference taken, or NULL for an fd that is not ours. */
struct ss_sock *ss_sock_get(int fd);

/* Drops a reference from ss_sock_get() or ss_sock_new(). */
void ss_sock_put(struct ss_sock *s);

/* A new entry for fd (replacing any), with one reference for the caller. NULL: no memory. */
struct ss_sock *ss_sock_new(int fd, int domain, enum ss_sock_state state);

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

/* In a forked child: statistics slots of plain connections are the parent's. */
void ss_sock_after_fork(void);

/* The fd table's size (the open-file limit at load). */
int ss_sock_table_size(void);

#endif
