/* Reads that never cross a peer's urgent mark (urgread.h). */
#include "handshake/urgread.h"

#include <errno.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

void (*ss_urg_between_hook)(int fd);

/* 1 when the peer's mark is at the head of fd's stream, 0 when not, -errno. */
static int urg_at_mark(const struct ss_hs_io *io, int fd)
{
	int at = 0;

	return io->ioctl(fd, SIOCATMARK, &at) < 0 ? -errno : at != 0;
}

int ss_urg_recv(const struct ss_hs_io *io, int fd, void *buf, size_t len, int flags,
		enum ss_urg_look look, size_t *got_p)
{
	int pass = flags & ~(MSG_PEEK | MSG_WAITALL | MSG_DONTWAIT);
	ssize_t n;
	int at;

	if (look == SS_URG_LOOK_SHOWN && !(flags & MSG_PEEK)) {
		n = io->recv(fd, buf, len, pass | MSG_DONTWAIT);
		if (n < 0)
			return -errno;
		*got_p = (size_t)n;
		return SS_URG_BYTES;
	}
	n = io->recv(fd, buf, len, pass | MSG_PEEK | MSG_DONTWAIT);

	if (n < 0 && errno != EAGAIN)
		return -errno;
	/*
	 * A peek at the mark gives what lies behind it (a handshake, when the
	 * peer answers our own mark), nothing at a lone mark, and leaves the
	 * mark in place either way: asked after the peek, the mark's place
	 * decides. A mark that came after the peek lies behind its bytes.
	 */
	if (n < 0 && look == SS_URG_LOOK_END)
		return -EAGAIN;
	if (n <= 0 || look == SS_URG_LOOK_EACH) {
		at = urg_at_mark(io, fd);
		if (at < 0)
			return at;
		if (at)
			return SS_URG_AT_MARK;
		if (n < 0)
			return -EAGAIN;
	}
	if (n > 0 && !(flags & MSG_PEEK)) {
		if (ss_urg_between_hook)
			ss_urg_between_hook(fd);
		/* What the peek saw, from the same head: it has bytes before any mark, so it stops
		 * there. */
		n = io->recv(fd, buf, (size_t)n, pass | MSG_DONTWAIT);
		if (n < 0)
			return -errno;
	}
	*got_p = (size_t)n;
	return SS_URG_BYTES;
}
