/* What the shim's files share: configuration, the transport module, the flows. */
#ifndef SS_SHIM_SHIM_H
#define SS_SHIM_SHIM_H

#include <stdatomic.h>
#include <spawn.h>
#include <stdbool.h>
#include <sys/socket.h>
#include <sys/un.h>

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

/* The transport module's operations and the process's worker, once loaded (loader.c). */
extern const struct ss_transport_ops *ss_tp;
extern _Atomic(struct ss_worker *) ss_w; /* set once, read anywhere */

/* Loads the transport module and starts the worker on first need. Returns 0 or a reason. */
enum ss_reason ss_tp_load(void);

/* In a forked child: the loader's lock is made anew. */
void ss_loader_after_fork(void);

/*
 * Opens the device of the local address of fd (s's TCP socket) and makes
 * its pools in a thread of its own, once per process (a server's first
 * LATER, a client's first connection that will soon move), so that a move
 * finds them made; not for a socket bound to TCP (ss_tcp_bound). Needs the
 * worker (warm.c).
 */
void ss_tp_warm(struct ss_sock *s, int fd);
/* Fork: the prepare handler waits for an opening under way (warm.c). */
void ss_warm_before_fork(void);
void ss_warm_after_fork_parent(void);
void ss_warm_after_fork(void);

/* The transport's settings from the options table. */
void ss_transport_cfg_fill(struct ss_transport_cfg *t);

/*
 * True in a child made by vfork (or posix_spawn) before it execs: it shares
 * our memory, so it must not change shim state (its fd table is its own).
 * A system call: for close and the dup family only.
 */
bool ss_in_vfork_child(void);

/* The real socket functions, for the handshake layer. */
extern const struct ss_hs_io ss_real_io;

/* Internal result of a data-path step: the socket changed state, dispatch again. */
#define SS_REDO 4096

/*
 * When the progress thread looks itself at a negotiation on the
 * application's own socket (ASKING, ACCEPTED: from now; LATE: from the age
 * of its first look) and then watches it: most applications call at once
 * and finish it alone, and a wake-up of that thread per connection costs
 * more than their call. At least SS_NUDGE_MS after from_ms, on a multiple
 * of it, so that the looks of the connections made meanwhile share one
 * wake-up.
 */
#define SS_NUDGE_MS 10
uint64_t ss_nudge_at(uint64_t from_ms);

/*
 * Part of a handshake message at a socket's head: a message is sent whole,
 * so part of one that waited SS_PARTIAL_MS for its rest is the peer's own
 * bytes that begin as ours do. *since_ms: when it was first seen (0: not
 * yet; set now). True once it has waited that long.
 */
#define SS_PARTIAL_MS 1000
bool ss_partial_lasted(uint64_t *since_ms);

/* Bytes a connection holds before its decision (writes beyond wait or fail with EAGAIN). */
#define SS_HOLD_MAX (64u << 10)
/* ... when it starts on TCP (asking.c): the hold grows to this as a socket buffer would. */
#define SS_ASKING_HOLD_MAX (4u << 20)

/* ---- fds and the readiness mirror (mirror.c) ---- */

/* Moves fd to a close-on-exec number above the application's. Returns it or -errno. */
int ss_private_fd(int fd);

/*
 * Grows the process's fd table to hold the private fds, before the shim
 * starts a thread: a table grown while threads share it waits for an RCU
 * grace period first (a stall of tens of ms of the first connection in
 * the guest). From ss_tp_load, before each start of the progress thread.
 */
void ss_private_table_grow(void);

/* A non-blocking close-on-exec eventfd of the shim's, above the application's fds when it can be
 * (ss_private_fd). Returns it or -1. */
int ss_private_eventfd(void);

/* Closes one of the shim's fds, forgotten first (shim/ownfd.h): needed for an
 * epoll or eventfd, whose identity any other shares. */
void ss_private_close(int fd);

/*
 * Puts the object of newfd on every name of s (keeping each name's flags,
 * re-making its epoll registrations) and closes newfd. Returns 0 or -errno.
 */
int ss_put_on_names(struct ss_sock *s, int newfd);

/*
 * Puts a fresh socketpair end on the application's names (s->shim_fd is
 * ours); the TCP socket they named moves to s->tcp_fd unless it is there
 * already. The mirror starts showing nothing. Returns 0 or -errno.
 */
int ss_enter_pair(struct ss_sock *s);

/*
 * Hands s->tcp_fd back to the application's names and closes our
 * socketpair end (waiters on the old object wake, then: with an error and
 * the end when the connect failed, else writable). Returns 0 or -errno.
 */
int ss_leave_pair(struct ss_sock *s, bool failed);

/* Makes the application's fd show ready (SS_RDY_*) as TCP would. Locks fd_lock. */
void ss_mirror_show(struct ss_sock *s, unsigned ready);

/* ---- negotiation, both sides (decide.c) ---- */

/* A fresh nonce for a HELLO. */
uint32_t ss_new_nonce(void);

/* In a forked child: its nonces come from a seed of its own. */
void ss_nonce_after_fork(void);

/* Milliseconds from now on the one clock. */
uint64_t ss_deadline_in(int ms);

/* The TCP round trip of fd, for raising waits on slow paths (0 if unknown). */
int ss_rtt_ms(int fd);

/*
 * Whether the end that one of our reads of TCP fd found is the
 * application's own shutdown(SHUT_RD) (s->shut_rd), not the peer's: after
 * SHUT_RD, Linux's TCP read gives 0 whenever nothing is queued, and the
 * peer's later bytes (a HELLO) still come. Such an end decides nothing.
 */
bool ss_read_end_is_ours(struct ss_sock *s, int fd);

/* Creates s->conn for the local address of TCP fd (or local), filling s->mine. Returns a reason. */
enum ss_reason ss_make_conn(struct ss_sock *s, int fd, const struct sockaddr_storage *local);

/* Checks the peer's HELLO or ACCEPT and connects our QP to it. Returns a reason. */
enum ss_reason ss_agree(struct ss_sock *s, int fd, const struct ss_msg *peer);

/* The connection runs over RDMA from now on (peer: its parameters, for the status). */
void ss_become_upgraded(struct ss_sock *s, const struct ss_params *peer);

/*
 * The commit point passed on our side (the client sent READY; a moved
 * server read it): the connection starts, the held bytes go over it, then
 * a held shutdown, and the socket is upgraded (peer: its parameters).
 */
void ss_start_upgraded(struct ss_sock *s, const struct ss_params *peer);

/* The connection stays on TCP, why says why; the caller moves the bytes (plain.c). */
void ss_become_plain(struct ss_sock *s, enum ss_reason why);

/*
 * A decided connection gets a slot in the published statistics, and so
 * does one on TCP that may move (LATE), from the progress thread's first
 * look at it (started-on-tcp); its move to RDMA shows it upgraded.
 */
void ss_publish(struct ss_sock *s);

/* Sends m on s->tcp_fd (or fd); gives up after ms. Returns 0 or -errno. */
int ss_send_msg(int fd, const struct ss_msg *m, int ms);

/* Starts the background work of s (watch of tcp_fd, kick timer). Returns 0 or -errno. */
int ss_bg_start(struct ss_sock *s);

/*
 * A negotiation on the application's own socket ended: the progress
 * thread's watch and kick of its private name (tcp_fd) stop, and the name
 * is closed (the application's names keep the socket). Lock held.
 */
void ss_bg_stop_private(struct ss_sock *s);

/*
 * Asks the progress thread to look at s again at (ms) at the latest: a look
 * asked for earlier is never postponed. This matters: when an application
 * thread holds s->lock as the watch fires, the progress thread asks for a
 * look 1 ms later, and only that look re-arms the (one-shot) watch; the
 * application thread's step, which kicks for its deadline, must not undo it.
 */
void ss_bg_kick(struct ss_sock *s, uint64_t at);

/*
 * The progress thread stops watching s and looks at it next at (ms): a
 * look asked for earlier is dropped, a kick asked for later may still
 * bring it forward (ss_bg_kick never postpones). Lock held.
 */
void ss_bg_rest(struct ss_sock *s, uint64_t at);

/* Watches s->tcp_fd for events (EPOLLIN/EPOLLOUT) on the progress thread, once (re-armed by its
 * run). */
void ss_bg_watch(struct ss_sock *s, unsigned events);

/*
 * Upgraded: what arrived on the TCP side (READY, DECLINE before the commit
 * point, its end); lock held. Returns true to keep watching.
 */
bool ss_upgraded_tcp_event(struct ss_sock *s);

/* ---- the end of a socket (close.c) ---- */

/*
 * The last name of s was closed: what was accepted is delivered, then the
 * end of stream, in the background when it is not at once (s keeps a
 * reference until then, within SRQSHIM_LINGER_MS); SO_LINGER as TCP's
 * (a positive time waits only when may_block: not on the progress thread).
 */
void ss_sock_finish(struct ss_sock *s, bool may_block);

/* The progress thread moves a closed socket's delivery on (s->closing set). */
void ss_close_bg_step(struct ss_sock *s);

/* The connection of s says everything is delivered (its hook, connection lock held). */
void ss_close_delivered(struct ss_sock *s);

/* At exit: waits until every closed socket's bytes are delivered, within SRQSHIM_LINGER_MS. */
void ss_close_wait_all(void);

/*
 * The process image ends (exit, _exit, exec): what was accepted is
 * delivered first, bounded by SRQSHIM_LINGER_MS, as the kernel would for
 * TCP; close_open: the sockets still open are closed too (exit, _exit; an
 * exec keeps them). Not from a vfork child, nor from a signal handler that
 * interrupted a shim call (a lock may be held there).
 */
void ss_shim_leaving(bool close_open);

void ss_close_after_fork(void);

/* ---- client (client.c) ---- */

/* connect() of a FRESH socket that may be upgraded. Returns 0 or -errno as connect(2). */
int ss_client_connect(struct ss_sock *s, int fd, const struct sockaddr *addr, socklen_t len);

/*
 * Moves a client's negotiation on with what is there (lock held): the
 * connect's end, answers, deadlines. Returns true while it goes on.
 */
bool ss_client_step(struct ss_sock *s);

/*
 * Ends a client's negotiation, then its fallback's flush (or a move back
 * to TCP), by *end (0: SRQSHIM_LINGER_MS from the first need, written
 * back): steps, waiting on its TCP socket unlocked between them. Lock held
 * (close.c: a close, and an option that needs the kernel's socket).
 */
void ss_client_settle(struct ss_sock *s, uint64_t *end);

/*
 * The probe connection (tcp_fd, our socketpair on the application's fd) is
 * not ours to keep: abort it and connect a plain one (RECONNECTING).
 */
void ss_client_reconnect(struct ss_sock *s, enum ss_reason why);

/* ---- client that starts on TCP (asking.c) ---- */

/*
 * connect() when the connection starts on TCP (lock held; tcp_fd is a
 * private name of fd, the background work started). Returns 0 or -errno as
 * connect(2).
 */
int ss_asking_connect(struct ss_sock *s, int fd);

/* Moves an ASKING socket on with what is there (lock held). Returns true while it goes on. */
bool ss_asking_step(struct ss_sock *s);

/* What an ASKING socket waits for on its TCP socket: POLLOUT, POLLIN, or 0 (time only). */
short ss_asking_events(const struct ss_sock *s);

/*
 * Before a fork, an exec or an io_uring ring: every ASKING socket's answer
 * and held bytes, waited for here (within SRQSHIM_LINGER_MS), so that
 * another process or the ring gets a plain socket with nothing held
 * before its own bytes. Not from a signal handler inside a shim call.
 */
void ss_asking_finish_all(void);

/* The same for one socket, until it is answered or its own deadline passes (no lock held). */
void ss_asking_finish(struct ss_sock *s);

/* ---- a connection on TCP that may move to RDMA (moving.c) ---- */

/*
 * Whether s may start on TCP and move later: not where SRQSHIM_MOVE_AFTER_MS
 * is -1, nor where the application takes urgent data itself (urg_app).
 */
bool ss_move_allowed(const struct ss_sock *s);

/*
 * LATER is answered on fd, a name of the TCP socket (client: taken, and
 * what it held sent; server: about to be sent, after this): s becomes
 * LATE, unless it may not move (ss_move_allowed; shut; no fd or memory
 * left). nonce: the first HELLO's. Lock held. Returns SS_REASON_NONE when
 * s is LATE, else why not (SS_REASON_POLICY or SS_REASON_RESOURCE).
 */
enum ss_reason ss_move_enter(struct ss_sock *s, int fd, bool client, uint32_t nonce);

/* Undoes ss_move_enter (the server's LATER could not be sent): plain, why. Lock held. */
void ss_move_leave(struct ss_sock *s, enum ss_reason why);

/* Moves a LATE socket on with what is there, and starts its move when it is ripe (lock held). */
void ss_move_step(struct ss_sock *s);

/* The progress thread's look at a LATE socket: ss_move_step, its first without the poll for
 * the peer's lone mark (the watch armed after it reports one). Lock held. */
void ss_move_look(struct ss_sock *s);

/* What the move of a LATE socket waits for on tcp_fd (EPOLL*), for the progress thread. */
unsigned ss_move_events(struct ss_sock *s);

/*
 * What a blocked reader (out: writer) of a LATE socket polls its fd for
 * (POLL*; 0: time only), after moving the exchange on; pri: the last slice
 * showed POLLPRI alone, so the peer's lone mark is looked for first.
 * SS_MOVE_NOW: the call goes on at once (a reader: the move took the
 * peer's bytes off TCP for it; a writer: its bytes go to the hold, which has
 * room).
 * *takes_p: where the socket's reads stand as the poll begins, for
 * ss_move_shown.
 */
#define SS_MOVE_NOW ((short)-1)
short ss_move_wait_events(struct ss_sock *s, bool out, bool pri, uint32_t *takes_p);

/* True when what a read of s finds can only come from its TCP socket: LATE, QUIET, none taken. */
bool ss_move_reads_tcp(struct ss_sock *s);

/*
 * A blocked reader's poll (begun at takes) showed revents: bytes with no
 * mark pending let the next read take without a peek (ss_lateio_shown).
 */
void ss_move_shown(struct ss_sock *s, uint32_t takes, short revents);

/*
 * The application's read (send) of a LATE socket, without waiting. A read
 * that finds nothing does not look for the peer's lone mark (a system
 * call): the progress thread's watch finds it (from its first look), and
 * so does a wait that sees POLLPRI (ss_move_wait_events). Returns the
 * count, -EAGAIN, -SS_REDO (the socket moved on) or -errno.
 */
ssize_t ss_move_recv(struct ss_sock *s, const struct iovec *iov, int n, int flags);
ssize_t ss_move_send(struct ss_sock *s, const struct iovec *iov, int n, int flags);

/*
 * s must stay on TCP for good (exec, fork, SCM_RIGHTS, urgent data, a
 * ring): the peer is told, a move under way ends first (moved already: back
 * to TCP, ss_down_now). No lock held; waits, within SRQSHIM_LINGER_MS
 * (beyond, the connection is reset). Returns 0 or -errno as ss_down_now.
 */
int ss_move_pin(struct ss_sock *s);

/*
 * The application is about to take urgent data itself (SO_OOBINLINE, an
 * owner for SIGURG): s never moves (urg_app), and a LATE one is pinned
 * first, so that the marks of the pin are read by the shim before the
 * option or the owner could show them; a client still asking takes its
 * answer first. Zerocopy completions (SO_ZEROCOPY): the same, never
 * upgraded either, and an upgraded one moves back to TCP. how: SS_URG_*.
 * No lock held (from a signal handler that interrupted a shim call, only
 * the mark is set).
 */
void ss_move_urg_app(struct ss_sock *s, unsigned how);

/* ss_move_pin() for every LATE socket (before fork). */
void ss_move_pin_all(void);

/*
 * shutdown(how) of a LATE socket (no lock held): it never moves from here
 * on; a move under way ends first. Returns true when done here (*ret: 0
 * or -errno); false: the caller shuts the socket as its state now says.
 */
bool ss_move_shutdown(struct ss_sock *s, int how, int *ret);

/*
 * The last name of a LATE socket is closed (lock held): true when a move
 * is under way, to end in the background; else it is plain now.
 */
bool ss_move_close(struct ss_sock *s);

/* Frees what a LATE socket holds for its move (the socket is being freed). */
void ss_move_free(struct ss_sock *s);

/* ---- server (server.c) ---- */

/* An accepted connection: acknowledge a HELLO now or as soon as it comes. */
void ss_server_accepted(struct ss_sock *s, int fd);

/*
 * Server: decide an accepted connection at its first I/O, lock held.
 * wait_ms: how long to wait for the client's first bytes; bytes_there:
 * some are there as it begins. Part of a message that waited
 * SS_PARTIAL_MS for its rest (in this wait or over calls) decides it
 * plain. Returns 0 once decided, -EAGAIN while undecided.
 */
int ss_server_decide(struct ss_sock *s, int fd, int wait_ms, bool bytes_there);

/* The background watch of an accepted, undecided connection (lock held). Returns true to keep
 * watching. */
bool ss_server_step(struct ss_sock *s);

/* ---- falling back to TCP (plain.c) ---- */

/*
 * Decided plain while our socketpair end is on the application's fd:
 * writes what is held (and what the connection took and never sent) to
 * tcp_fd, then hands tcp_fd back. Lock held. Returns 0 when done, -EAGAIN
 * while bytes still wait for room (the progress thread goes on), -errno.
 */
int ss_fallback(struct ss_sock *s, enum ss_reason why);

/* FALLBACK: writes more of the held bytes; hands tcp_fd back once all went. Lock held. */
int ss_fallback_flush(struct ss_sock *s);
/*
 * The end of a flush of held bytes to s's TCP socket (asking.c,
 * ss_fallback_flush): err, the error a send of it took (0: none), is kept
 * for the application (plain_err); then the held shutdowns. Lock held.
 */
void ss_flush_end(struct ss_sock *s, int err);

/*
 * Takes what the strip rule of s says off the head of the TCP stream on fd
 * (lock held), without waiting. Returns 0 (done, or nothing to strip
 * there yet: s->strip says which), -EAGAIN (a message is only partly
 * there; for at most a second, then the bytes are the peer's) or -errno.
 */
int ss_strip(struct ss_sock *s, int fd);

/* ---- the live downgrade (down.c; docs/protocol.md, section 4) ---- */

/*
 * Starts moving an upgraded connection back onto its TCP connection (lock
 * held): the socket goes to FALLBACK with the exchange of down.c to finish
 * before its held bytes. Returns 0, -EOPNOTSUPP when the peer cannot, or
 * -EINVAL when it is not upgraded.
 */
int ss_down_begin(struct ss_sock *s);

/*
 * Moves the exchange on (lock held; s->down set). Returns 0 once it is over
 * (the peer's returned bytes at the head of the hold, or the connection
 * reset after a failure: s->down is gone either way), -EAGAIN while it waits.
 */
int ss_down_step(struct ss_sock *s);

/* What the exchange waits for on tcp_fd (EPOLLIN, EPOLLOUT); lock held. */
unsigned ss_down_events(struct ss_sock *s);

/* Frees an unfinished exchange (the socket is being freed). */
void ss_down_free(struct ss_sock *s);

/*
 * FALLBACK that ran out of time (lock held): the connection is reset, what
 * is held is dropped, and the fd becomes the TCP socket.
 */
void ss_down_give_up(struct ss_sock *s);

/* ---- moves the caller waits for (handover.c) ---- */

/*
 * Moves s back to TCP and waits until its fd is the TCP socket (no lock
 * held): before an exec, an fd passed away, stdio, urgent data. Bounded by
 * twice SRQSHIM_LINGER_MS (the move, then its bytes to TCP); what cannot
 * finish resets the connection. Returns 0 when the fd is the TCP socket,
 * -EOPNOTSUPP when the peer cannot move, or -errno.
 */
int ss_down_now(struct ss_sock *s);

/* ss_down_now() for fd when it names an upgraded (or moving) connection; 0 otherwise. */
int ss_down_fd(int fd);

/* Every upgraded connection among the fds a message passes (SCM_RIGHTS) moves first. */
void ss_down_passed_fds(const struct msghdr *msg);

/*
 * Every upgraded connection whose fd survives an exec moves first (all at
 * once); fa: a posix_spawn's file actions (their dup2 sources count as
 * inherited), or NULL.
 */
void ss_down_before_exec(const posix_spawn_file_actions_t *fa);

/*
 * An io_uring ring is set up (its I/O goes past libc): every upgraded
 * connection moves back to TCP (waited for), and from then on new ones
 * stay there (ss_ring_seen).
 */
void ss_down_before_ring(void);
bool ss_ring_seen(void);
/*
 * Whether what the application does keeps s on TCP: an io_uring ring in
 * the process, or the completions of zerocopy sends that it takes from s's
 * error queue (SO_ZEROCOPY), which an RDMA stream never gives. Every
 * decision to send a HELLO, to upgrade or to move asks it.
 */
static inline bool ss_tcp_bound(struct ss_sock *s)
{
	return ss_ring_seen() || (atomic_load(&s->urg_app) & SS_URG_ZEROCOPY);
}

/* Whether a name of s survives the exec (or posix_spawn) being prepared. */
bool ss_image_inherits(struct ss_sock *s);

/* ---- what a posix_spawn's program holds (spawn.c) ---- */

/* A dup2 of fd was added to fa. */
void ss_spawn_note_dup(const posix_spawn_file_actions_t *fa, int fd);

/* fa is made or destroyed: its notes go. */
void ss_spawn_forget(const posix_spawn_file_actions_t *fa);

/* Whether fa dup2s fd (false for NULL). */
bool ss_spawn_dups(const posix_spawn_file_actions_t *fa, int fd);

void ss_spawn_after_fork(void);

/* ---- a connection a forked child holds too (inherit.c) ---- */

/* This process is about to fork (before it: a close racing the fork sees it). */
void ss_inherit_forked(void);

/*
 * The last name of s was closed here: true when another process still
 * holds the application's end, and s is kept (with a reference) until it
 * closes it or asks for the connection.
 */
bool ss_inherit_keep(struct ss_sock *s);

/* The progress thread's look at a kept connection (s->kept set). */
void ss_inherit_bg_step(struct ss_sock *s);

/* At exit: the kept connections end, as a close ends them. */
void ss_inherit_leaving(void);

/* The connection with serial, kept or named, with a reference; or NULL (progress thread). */
struct ss_sock *ss_inherit_find(uint64_t serial);

/*
 * The end of a move: the TCP socket tcp goes to the child that asked for it
 * (its address), and over the pair to any other holder (lock held).
 */
void ss_inherit_pass(struct ss_sock *s, int tcp);

/* A child at from (its address) asked for s, whose move starts (progress thread). */
void ss_inherit_heir(struct ss_sock *s, const struct sockaddr_un *from, socklen_t flen);

/* The move a child asked for cannot start: it is told so (any thread). */
void ss_inherit_refuse(struct ss_sock *s);

/* In a forked child's exec: inherited connections of the owner come back as TCP sockets. */
void ss_inherit_before_exec(void);

void ss_inherit_after_fork(void);

/* ---- the operator's channel (ctlchan.c) ---- */

/* Opens the process's channel for srqshim-ctl, watched by the progress thread (once). */
void ss_ctlchan_start(void);

/* In a forked child: the parent's channel is closed; the child's worker opens its own. */
void ss_ctlchan_after_fork(void);

/*
 * Sends text, with fd (SCM_RIGHTS) unless -1, on sock to to (NULL: its
 * peer), without waiting. Returns 0 or -errno.
 */
int ss_send_fd(int sock, const struct sockaddr_un *to, socklen_t to_len, const char *text, int fd);

/* ss_send_fd from the channel (a forked child's answers). */
int ss_ctlchan_send(const struct sockaddr_un *to, socklen_t to_len, const char *text, int fd);

/* The hold starts with p's n bytes from now on (lock held). Returns 0 or -ENOMEM. */
int ss_hold_prepend(struct ss_sock *s, const uint8_t *p, size_t n);

/* The hold's first n bytes (at most hold_len) are dropped (lock held). */
void ss_hold_drop_front(struct ss_sock *s, size_t n);

/*
 * Puts s in FALLBACK for why (lock held): reads wait, writes are held, its
 * epoll registrations go back to the kernel and threads asleep on it look
 * again. The caller fills the hold; ss_fallback_flush() hands tcp_fd back.
 */
void ss_fallback_enter(struct ss_sock *s, enum ss_reason why);

/*
 * Raises the hold's bound to at least max, growing a hold already made
 * (lock held). Returns 0 or -ENOMEM (the bound stays).
 */
int ss_hold_reserve(struct ss_sock *s, size_t max);

/*
 * The held bytes go to s->tcp_fd, as much as it takes now (lock held).
 * Returns 0 when all went (or the socket took nothing and said nothing),
 * -EAGAIN while bytes wait for room, or the errno of the send that failed
 * (what is left stays held).
 */
int ss_hold_to_tcp(struct ss_sock *s);

/*
 * The held bytes go over s->conn (started; lock held), all of them: a dry
 * send pool is waited for, the CQs polled meanwhile, for at most
 * SS_HOLD_TO_CONN_MS; beyond, or on an error, the connection is reset
 * (logged) rather than a byte lost. The hold is empty after.
 */
#define SS_HOLD_TO_CONN_MS 1000
void ss_hold_to_conn(struct ss_sock *s);

/* Appends to the held bytes; returns the count taken (short when full). */
size_t ss_hold_append(struct ss_sock *s, const struct iovec *iov, int n);

/* ---- the destination cache (cache.c) ---- */

enum ss_dest_state {
	SS_DEST_UNKNOWN,
	SS_DEST_PLAIN,   /* answered a HELLO with silence or foreign bytes */
	SS_DEST_SHIMMED, /* answered a HELLO */
};

/*
 * Looks dst up. When it is unknown and nobody probes it, makes this caller
 * its prober (*prober_p true: call ss_cache_record() with the outcome).
 * Never waits: while another probe runs, the answer is "unknown" and the
 * caller probes too (ss_cache_peek tells it the other probe's outcome).
 */
enum ss_dest_state ss_cache_begin(const struct sockaddr *dst, bool *prober_p);

/* What is known of dst now, without taking a probe. */
enum ss_dest_state ss_cache_peek(const struct sockaddr *dst);

/*
 * Records what a connection to dst found (prober: the caller probes it, and
 * its probe ends). SS_DEST_SHIMMED that this process knows already is not
 * written again.
 */
void ss_cache_record(const struct sockaddr *dst, enum ss_dest_state st, bool prober);

/* Ends this connect's probe of the destination in the cache. */
void ss_client_record(struct ss_sock *s, enum ss_dest_state st);

/*
 * A connect shut early (shut_early) that ended before the shutdown, with
 * bytes held meanwhile: they cannot go behind the shutdown, so the
 * connection is reset (Linux's disconnect: ECONNRESET for the application,
 * a reset for the peer), as when the shutdown aborts the connect; never
 * ended without them. Lock held.
 */
void ss_client_reset_lost_hold(struct ss_sock *s);

/* In a forked child: the cache's lock is made anew. */
void ss_cache_after_fork(void);

/* ---- signals (signal.c) ---- */

/* Handlers run by this thread so far; of those, handlers without SA_RESTART. */
unsigned ss_sig_any(void);
unsigned ss_sig_no_restart(void);

/* In a forked child: the lock is made anew. */
void ss_signal_after_fork(void);

/* ---- test hooks (SRQSHIM_TEST_DELAYS, testdelay.c) ---- */

/* Reads SRQSHIM_TEST_DELAYS (checked by the options table) at load. */
void ss_test_delays_load(void);

/* Sleeps as SRQSHIM_TEST_DELAYS says for point p (nothing when unset). */
void ss_test_delay(enum ss_test_point p);

#endif
