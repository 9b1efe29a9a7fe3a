/*
 * Handshake messages over a TCP fd: write one, or look at the next bytes and
 * take exactly one message off the stream (never a byte more, never a byte
 * of a foreign stream). The caller passes the real socket functions, so
 * this layer knows nothing of interposition.
 */
#ifndef SS_HANDSHAKE_SESSION_H
#define SS_HANDSHAKE_SESSION_H

#include <poll.h>
#include <stdint.h>
#include <sys/types.h>

#include "handshake/clock.h"
#include "handshake/hello.h"

struct ss_hs_io {
	ssize_t (*send)(int fd, const void *buf, size_t len, int flags);
	ssize_t (*recv)(int fd, void *buf, size_t len, int flags);
	int (*poll)(struct pollfd *fds, nfds_t n, int timeout);
	int (*ioctl)(int fd, unsigned long req, int *arg); /* SIOCATMARK (urgread.c) */
};

enum ss_hs_read_result {
	SS_HSR_MSG,     /* a whole message was taken off the stream into *m */
	SS_HSR_FOREIGN, /* the next bytes are not a handshake message; nothing taken */
	SS_HSR_BAD,     /* our magic, but malformed or unsupported; nothing taken */
	SS_HSR_EOF,     /* the peer closed before any message */
	SS_HSR_TIMEOUT, /* the wait passed first, with nothing there */
	SS_HSR_PARTIAL, /* the wait passed first, part of a message there (it stays) */
	SS_HSR_ERROR,   /* the connection failed (reset, ...) */
};

/*
 * wait_ms: how long a call may wait, from the moment it first has to; 0
 * means "do not wait". The clock is read only when the call waits.
 */

/* Writes m completely within wait_ms. Returns 0, -ETIMEDOUT or -errno. */
int ss_hs_write(const struct ss_hs_io *io, int fd, const struct ss_msg *m, int wait_ms);

/*
 * Waits up to wait_ms for the next bytes of fd and classifies them;
 * on SS_HSR_MSG the message is consumed. *dec_p (may be NULL) receives the
 * decoder's verdict for SS_HSR_BAD.
 */
enum ss_hs_read_result ss_hs_read(const struct ss_hs_io *io, int fd, struct ss_msg *m, int wait_ms,
				  enum ss_dec_result *dec_p);

/* As ss_hs_read(), but consumes nothing: *used_p is the message's length on SS_HSR_MSG. */
enum ss_hs_read_result ss_hs_peek(const struct ss_hs_io *io, int fd, struct ss_msg *m, int wait_ms,
				  enum ss_dec_result *dec_p, size_t *used_p);

/* Takes the used bytes of a message ss_hs_peek() found off the stream. Returns 0 or -EIO. */
int ss_hs_consume(const struct ss_hs_io *io, int fd, size_t used);

/* The bytes of a message ss_hs_take() took before the rest of it came. */
struct ss_hs_part {
	uint16_t got;
	uint8_t buf[SS_HELLO_MAX_LEN];
};

/*
 * Takes the next message off fd without a peek and never waits: for a
 * reader whose stream is dropped unless its next bytes are a message (a
 * client's probe, shim/asking.c), so that bytes taken of another stream
 * harm nothing. The header first (SS_HELLO_HDR_LEN bytes), then exactly
 * the rest its length gives, so never a byte past the message: one recv
 * for a message of a header alone (ACK, LATER), where ss_hs_read() makes
 * a peek and a take. What a call took of a message not whole yet waits in
 * *part_p (allocated then; freed once the message is whole, the bytes are
 * no message or the connection failed; the caller frees one it drops with
 * free()). Returns SS_HSR_MSG, SS_HSR_TIMEOUT (nothing more is there now,
 * whether or not a part waits), SS_HSR_EOF (the end, a part kept: after
 * the reader's own SHUT_RD more bytes may come), SS_HSR_FOREIGN or
 * SS_HSR_BAD (the bytes it took are no message; *dec_p as ss_hs_read()),
 * or SS_HSR_ERROR.
 */
enum ss_hs_read_result ss_hs_take(const struct ss_hs_io *io, int fd, struct ss_hs_part **part_p,
				  struct ss_msg *m, enum ss_dec_result *dec_p);

#endif
