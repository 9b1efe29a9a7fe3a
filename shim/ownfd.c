/*
 * The shim's own long-lived fds (ss_private_fd: private duplicates of TCP
 * sockets, socketpair ends, epoll duplicates, wake-up eventfds, the
 * operator's channel), remembered by number, so that the application's
 * close_range() and closefrom() can leave them open (intercept.c).
 *
 * Rule: an entry lives from ss_private_fd to ss_private_close, which
 * forgets the number before it closes the fd; every private fd is closed
 * that way, also the parent's in a forked child. So a number the
 * application got back after the shim closed it is never an entry, and no
 * look at the file (fstat) is needed when one is made. Memory stays
 * bounded by the highest number used. Storage: chunks of OWNFD_CHUNK
 * flags, made on first need, under one lock (a leaf: realloc and calloc
 * are called under it).
 */
#include <pthread.h>
#include <stdlib.h>

#include "shim/ownfd.h"

#define OWNFD_CHUNK 1024

static pthread_mutex_t ownfd_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned char **ownfd_chunks; /* 1: the shim's */
static size_t ownfd_n_chunks;

void ss_ownfd_add(int fd)
{
	size_t c = (size_t)fd / OWNFD_CHUNK;

	if (fd < 0)
		return;
	pthread_mutex_lock(&ownfd_lock);
	if (c >= ownfd_n_chunks) {
		unsigned char **nc = realloc(ownfd_chunks, (c + 1) * sizeof(*nc));

		if (!nc)
			goto out;
		for (size_t i = ownfd_n_chunks; i <= c; i++)
			nc[i] = NULL;
		ownfd_chunks = nc;
		ownfd_n_chunks = c + 1;
	}
	if (!ownfd_chunks[c] && !(ownfd_chunks[c] = calloc(OWNFD_CHUNK, 1)))
		goto out;
	ownfd_chunks[c][fd % OWNFD_CHUNK] = 1;
out:
	pthread_mutex_unlock(&ownfd_lock);
}

void ss_ownfd_forget(int fd)
{
	size_t c = (size_t)fd / OWNFD_CHUNK;

	if (fd < 0)
		return;
	pthread_mutex_lock(&ownfd_lock);
	if (c < ownfd_n_chunks && ownfd_chunks[c])
		ownfd_chunks[c][fd % OWNFD_CHUNK] = 0;
	pthread_mutex_unlock(&ownfd_lock);
}

bool ss_ownfd_next(unsigned from, unsigned last, unsigned *fd_p)
{
	bool found = false;

	pthread_mutex_lock(&ownfd_lock);
	for (size_t fd = from; fd <= last && fd / OWNFD_CHUNK < ownfd_n_chunks && !found; fd++) {
		unsigned char *ch = ownfd_chunks[fd / OWNFD_CHUNK];

		if (!ch) {
			fd |= OWNFD_CHUNK - 1; /* the next chunk */
			continue;
		}
		if (ch[fd % OWNFD_CHUNK]) {
			*fd_p = (unsigned)fd;
			found = true;
		}
	}
	pthread_mutex_unlock(&ownfd_lock);
	return found;
}

void ss_ownfd_after_fork(void)
{
	pthread_mutex_init(&ownfd_lock, NULL);
}
