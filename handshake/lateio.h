/*
 * The move of a connection that started on TCP, over its TCP fd
 * (docs/protocol.md, section 5): the urgent marks, the handshake messages
 * behind them, and the peer's bytes that came before its mark, taken off
 * TCP when the application has not read them (they are read first, after
 * the move too; at most 4 MiB). The rules are late.c's; the decisions
 * that need verbs are the caller's hooks. Nothing here blocks: a step does
 * what the socket takes and the caller waits (POLLIN | POLLPRI; POLLOUT
 * while ss_lateio_owes(); the application's read while ss_lateio_full())
 * and steps again. Callers serialise the calls on one connection.
 */
#ifndef SS_HANDSHAKE_LATEIO_H
#define SS_HANDSHAKE_LATEIO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "handshake/hello.h"
#include "handshake/late.h"
#include "handshake/reason.h"
#include "handshake/session.h"

/* The decisions that need a QP; each returns SS_REASON_NONE or why not. */
struct ss_late_hooks {
	/* client, both marks: make a QP, fill *mine for the HELLO */
	enum ss_reason (*prepare)(void *ctx, struct ss_params *mine);
	/* server: check the client's HELLO, make a QP ready to receive, fill *mine for ACCEPT */
	enum ss_reason (*decide)(void *ctx, const struct ss_msg *hello, struct ss_params *mine);
	/* client: check the server's ACCEPT and connect the QP to it */
	enum ss_reason (*check)(void *ctx, const struct ss_msg *accept);
};

struct ss_lateio {
	struct ss_late rules;
	const struct ss_hs_io *io;
	const struct ss_late_hooks *hooks;
	void *ctx;
	int fd;
	uint32_t nonce; /* the connection's first HELLO's: every message of the move carries it */
	bool mark_owed; /* our urgent byte waits for room in the socket */
	bool taken_eof; /* the peer's end of stream came behind the taken bytes */
	/*
	 * The peer's urgent byte was read out of band and no read has passed
	 * its place: Linux keeps its segment queued until one does, and resets
	 * the connection at close as for unread bytes (lateio_pass_mark).
	 */
	bool mark_unpassed;
	uint8_t out[2 * SS_HELLO_MAX_LEN]; /* messages behind our mark, not sent yet */
	size_t out_len;
	uint8_t *taken; /* the peer's bytes before its mark that the application has not read */
	size_t taken_off, taken_len, taken_cap;
	uint32_t takes; /* reads from fd that may have taken bytes (ss_lateio_shown) */
	bool shown;     /* the next read may take at once: ss_lateio_shown */
};

void ss_lateio_init(struct ss_lateio *x, const struct ss_hs_io *io, int fd, bool client,
		    uint32_t nonce, const struct ss_late_hooks *hooks, void *ctx);

/* Frees what x holds (not the fd). */
void ss_lateio_free(struct ss_lateio *x);

/*
 * This side wants to move (SS_LATE_EV_MOVE), must stay on TCP (_PIN), or
 * its application shut its writing (_SHUT; the caller sends the FIN when
 * the connection is not holding). Returns 0 or -errno.
 */
int ss_lateio_event(struct ss_lateio *x, enum ss_late_event ev);

/*
 * Moves the exchange on with what the socket has and takes: sends what is
 * owed, takes the peer's bytes up to its mark once one is on its way
 * (POLLPRI) or ours is sent, and reads the messages behind it. Returns 0,
 * -ECONNRESET when the peer broke the exchange (the caller resets the
 * connection), or -errno (the connection failed).
 */
int ss_lateio_step(struct ss_lateio *x);

/* True while our mark or messages wait for room (wait for POLLOUT). */
bool ss_lateio_owes(const struct ss_lateio *x);

/* True while the taken bytes are at their bound: taking waits for the application's read. */
bool ss_lateio_full(const struct ss_lateio *x);

/*
 * Before the close of a quiet connection: the peer's lone mark, if one
 * came, is read and passed (its unread urgent byte would make the close a
 * reset, and the peer's taken bytes would go with it). Bytes of the
 * peer's left unread stay so (a reset, as TCP's close gives).
 */
void ss_lateio_pass_lone_mark(struct ss_lateio *x);

/* What an application's read found. */
enum ss_lateio_read {
	SS_LATEIO_BYTES,   /* *got_p bytes (0: the peer's end of stream, or len was 0) */
	SS_LATEIO_WAIT,    /* nothing for the application now */
	SS_LATEIO_DECIDED, /* nothing taken is left and the move is decided: read its transport */
};

/* How many reads from its fd x made that may have taken bytes (for ss_lateio_shown). */
uint32_t ss_lateio_takes(const struct ss_lateio *x);

/*
 * What the application's wait on the fd saw: revents of a poll for POLLIN |
 * POLLPRI that began when ss_lateio_takes() said takes. Bytes (or the end)
 * with no mark pending (POLLIN without POLLPRI), and nothing taken since,
 * let the next read of a QUIET connection (our mark not sent: the peer's
 * comes alone) take with one recv, no peek: the bytes seen are still at
 * the head, any mark came behind them, and recv stops at a mark it meets
 * after a byte. A mark at the head shows POLLIN when the peer's end is
 * right behind it (a recv would pass the mark and read the end), hence
 * POLLPRI must be absent. Any read that may take voids it.
 */
void ss_lateio_shown(struct ss_lateio *x, uint32_t takes, short revents);

/*
 * The application reads at most len bytes (flags: MSG_PEEK; others pass to
 * recv). lone: when nothing is there, also look for the peer's lone mark
 * (a system call); without it, such a read says SS_LATEIO_WAIT and the
 * mark is found by a caller that saw POLLPRI and reads again with lone.
 * Returns an ss_lateio_read, -ECONNRESET as ss_lateio_step(), or -errno.
 */
int ss_lateio_read(struct ss_lateio *x, void *buf, size_t len, int flags, bool lone, size_t *got_p);

#endif
