/*
 * Reading a TCP socket whose peer may cut its byte stream with TCP's
 * urgent mark (docs/design.md, "Planned: connections that start on TCP").
 * Linux's recv stops at a mark but a later recv skips it silently, so the
 * bytes are peeked first and only the bytes the peek saw are taken.
 * Callers serialise the reads of one socket (the peek and the take belong
 * together) and wait themselves (POLLIN | POLLPRI): nothing here blocks.
 */
#ifndef SS_HANDSHAKE_URGREAD_H
#define SS_HANDSHAKE_URGREAD_H
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "handshake/session.h"

/* What a read found. */
enum ss_urg_result {
	SS_URG_BYTES,   /* bytes before any mark (a count of 0: the peer's end of stream) */
	SS_URG_AT_MARK, /* the peer's mark is at the head: nothing was taken */
};

/* When a read asks where the peer's mark is (SIOCATMARK, a system call). */
enum ss_urg_look {
	SS_URG_LOOK_EMPTY, /* when the peek finds nothing or the end: a lone mark waits there */
	SS_URG_LOOK_EACH,  /* after each peek: this side sent its own mark, so the peer's
			      may come with bytes behind it */
	SS_URG_LOOK_END,   /* only at the end: a peek that finds nothing gives -EAGAIN
			      and a lone mark is the caller's to find (it shows POLLPRI) */
	SS_URG_LOOK_SHOWN, /* no peek, no look: the caller saw bytes or the end at the head
			      with no mark pending and nothing was taken since, so a mark
			      lies behind them and recv stops there (a mark at the head
			      would be passed and lost: lateio.h, ss_lateio_shown) */
};

/*
 * Reads at most len bytes of fd that come before the peer's mark into buf,
 * with io's functions. Without a switch under way (SS_URG_LOOK_EMPTY or
 * _END) the peer's mark comes alone. flags: MSG_PEEK only peeks; other
 * recv flags but MSG_WAITALL pass through. Returns an ss_urg_result (the
 * count in *got_p), -EAGAIN when nothing is there, or -errno.
 */
int ss_urg_recv(const struct ss_hs_io *io, int fd, void *buf, size_t len, int flags,
		enum ss_urg_look look, size_t *got_p);

/* Test only (tests/test_urgread.c): runs between the peek and the take. */
extern void (*ss_urg_between_hook)(int fd);
#endif
