/*
 * The shim's own long-lived fds (ss_private_fd: private duplicates of TCP
 * sockets, socketpair ends, epoll duplicates, wake-up eventfds, the
 * operator's channel), remembered by number with the identity of their
 * open file (device and inode), so that the application's close_range()
 * and closefrom() can leave them open (intercept.c).
 *
 * An entry counts only while the fd of that number still names the same
 * file (fstat at the look): a number the shim closed and the application
 * got back is the application's. Every epoll, eventfd, timerfd or
 * signalfd shares one anonymous inode, so the identity cannot tell those
 * apart: the shim forgets its own of that kind as it closes them
 * (ss_private_close); a socket's inode is its own. Memory stays bounded by
 * the highest number used. Storage: chunks of OWNFD_CHUNK entries, made on
 * first need, under one lock (a leaf: fstat, realloc and calloc are
 * called under it).
 */
#include <pthread.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "shim/ownfd.h"

#define OWNFD_CHUNK 1024

struct ownfd_ent {
	dev_t dev;
	ino_t ino; /* 0: no entry */
};

static pthread_mutex_t ownfd_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ownfd_ent **ownfd_chunks;
static size_t ownfd_n_chunks;

void ss_ownfd_add(int fd)
{
	struct stat st;
	size_t c = (size_t)fd / OWNFD_CHUNK;

	if (fd < 0 || fstat(fd, &st) != 0)
		return;
	pthread_mutex_lock(&ownfd_lock);
	if (c >= ownfd_n_chunks) {
		struct ownfd_ent **nc = realloc(ownfd_chunks, (c + 1) * sizeof(*nc));

		if (!nc)
			goto out;
		for (size_t i = ownfd_n_chunks; i <= c; i++)
			nc[i] = NULL;
		ownfd_chunks = nc;
		ownfd_n_chunks = c + 1;
	}
	if (!ownfd_chunks[c] && !(ownfd_chunks[c] = calloc(OWNFD_CHUNK, sizeof(struct ownfd_ent))))
		goto out;
	ownfd_chunks[c][fd % OWNFD_CHUNK] = (struct ownfd_ent){.dev = st.st_dev, .ino = st.st_ino};
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
		ownfd_chunks[c][fd % OWNFD_CHUNK].ino = 0;
	pthread_mutex_unlock(&ownfd_lock);
}

bool ss_ownfd_next(unsigned from, unsigned last, unsigned *fd_p)
{
	bool found = false;

	pthread_mutex_lock(&ownfd_lock);
	for (size_t fd = from; fd <= last && fd / OWNFD_CHUNK < ownfd_n_chunks && !found; fd++) {
		struct ownfd_ent *ch = ownfd_chunks[fd / OWNFD_CHUNK];
		struct stat st;

		if (!ch) {
			fd |= OWNFD_CHUNK - 1; /* the next chunk */
			continue;
		}
		struct ownfd_ent e = ch[fd % OWNFD_CHUNK];

		if (e.ino && fstat((int)fd, &st) == 0 && st.st_dev == e.dev && st.st_ino == e.ino) {
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
