/* What the shim's files share: configuration, the transport module, the flows. */
#ifndef SS_SHIM_SHIM_H
#define SS_SHIM_SHIM_H

#include <stdbool.h>
#include <sys/socket.h>

#include "handshake/policy.h"
#include "handshake/session.h"
#include "shim/config.h"
#include "shim/sock.h"
#include "transport/conn.h"

extern struct ss_config ss_cfg;
/* SRQSHIM_PEERS, parsed at load. */
extern struct ss_policy ss_peers;

/* Depth of shim calls on this thread: exit from a signal handler that
 * interrupted one must not wait for locks that thread may hold. */
extern __thread int ss_in_call;

/* The transport module's operations and the process's worker, once loaded. */
extern const struct ss_transport_ops *ss_tp;
extern struct ss_worker *ss_w;

/* Loads the transport module and starts the worker on first need. Returns 0 or a reason. */
enum ss_reason ss_tp_load(void);

/*
 * True in a child made by vfork (or posix_spawn) before it execs: it shares
 * our memory, so it must not change shim state (its fd table is its own).
 * A system call: for close and the dup family only.
 */
bool ss_in_vfork_child(void);

/* The real socket functions, for the handshake layer. */
extern const struct ss_hs_io ss_real_io;

/* Moves fd to a close-on-exec number above the application's. Returns it or -errno. */
int ss_private_fd(int fd);

/* Client: connect fd to addr and negotiate. Returns 0 or -errno as connect(2) would. */
int ss_client_connect(struct ss_sock *s, int fd, const struct sockaddr *addr, socklen_t len);

/*
 * Server: decide an accepted connection at its first I/O. wait_ms: how long
 * to wait for the client's first bytes (-1: as long as it takes). Returns 0
 * once decided (s->state is PLAIN or UPGRADED), -EAGAIN while undecided, or
 * -errno when waiting failed.
 */
int ss_server_decide(struct ss_sock *s, int fd, int wait_ms);

/* The last name of s was closed: deliver what was accepted, end the stream. */
void ss_sock_finish(struct ss_sock *s);

/* Re-makes the application's epoll registrations of fd after its object changed. */
void ss_epoll_readd(struct ss_sock *s, int fd);

/* Destination cache shared by the user's shimmed processes (cache.c). */
enum ss_dest_state {
	SS_DEST_UNKNOWN,
	SS_DEST_PLAIN,   /* answered a HELLO with silence or foreign bytes */
	SS_DEST_SHIMMED, /* answered a HELLO */
};

/*
 * Looks dst up. When it is unknown, either makes this caller its prober
 * (*prober_p true: call ss_cache_record() with the outcome) or waits, a
 * bounded time, for another prober's outcome.
 */
enum ss_dest_state ss_cache_begin(const struct sockaddr *dst, bool *prober_p);

/* Records what a probe of dst found (and ends this caller's probe). */
void ss_cache_record(const struct sockaddr *dst, enum ss_dest_state st);

#endif
