/*
 * The shim's own long-lived fds (ss_private_fd: private duplicates of TCP
 * sockets, socketpair ends, epoll duplicates, wake-up eventfds, the
 * operator's channel), remembered by number, so that the application's
 * close_range() and closefrom() can leave them open (intercept.c).
 *
 * Rule: an entry lives from ss_private_fd to ss_private_close, which
 * forgets the number before it closes the fd; every private fd is closed
 * that way, also the parent's in a forked child, and a private number the
 * application closes or puts its own file on is forgotten in that call.
 * So a number the application got back is never an entry, and no look at
 * the file (fstat) is needed when one is made.
 *
 * Storage: a flag per number in chunks of OWNFD_CHUNK, made on first need
 * and never freed, under a fixed table of OWNFD_CHUNKS chunk pointers. No
 * lock: a chunk is published with a compare-and-swap and flags are atomic,
 * so a close in a signal handler, or a fork at any moment, finds the
 * registry whole.
 */
#include <stdatomic.h>
#include <stdlib.h>

#include "shim/ownfd.h"
#include "transport/log.h"

#define OWNFD_CHUNK 1024
/* Numbers below 4,194,304: RLIMIT_NOFILE stops at fs.nr_open, 1,048,576 by default. */
#define OWNFD_CHUNKS 4096

typedef _Atomic unsigned char ownfd_flag;
static _Atomic(ownfd_flag *) ownfd_chunks[OWNFD_CHUNKS];

void ss_ownfd_add(int fd)
{
	size_t c = (size_t)fd / OWNFD_CHUNK;
	ownfd_flag *ch, *made;

	if (fd < 0)
		return;
	if (c >= OWNFD_CHUNKS) {
		ss_log_warn("fd %d: above the numbers the shim keeps from closefrom()", fd);
		return;
	}
	ch = atomic_load_explicit(&ownfd_chunks[c], memory_order_acquire);
	if (!ch) {
		if (!(made = calloc(OWNFD_CHUNK, sizeof(*made))))
			return;
		ch = NULL;
		if (atomic_compare_exchange_strong_explicit(&ownfd_chunks[c], &ch, made,
							    memory_order_acq_rel,
							    memory_order_acquire))
			ch = made;
		else
			free(made); /* another thread's is there: ch */
	}
	atomic_store_explicit(&ch[fd % OWNFD_CHUNK], 1, memory_order_release);
}

void ss_ownfd_forget(int fd)
{
	size_t c = (size_t)fd / OWNFD_CHUNK;
	ownfd_flag *ch;

	if (fd < 0 || c >= OWNFD_CHUNKS)
		return;
	ch = atomic_load_explicit(&ownfd_chunks[c], memory_order_acquire);
	if (ch)
		atomic_store_explicit(&ch[fd % OWNFD_CHUNK], 0, memory_order_release);
}

bool ss_ownfd_next(unsigned from, unsigned last, unsigned *fd_p)
{
	for (size_t fd = from; fd <= last && fd / OWNFD_CHUNK < OWNFD_CHUNKS; fd++) {
		ownfd_flag *ch =
			atomic_load_explicit(&ownfd_chunks[fd / OWNFD_CHUNK], memory_order_acquire);

		if (!ch) {
			fd |= OWNFD_CHUNK - 1; /* the next chunk */
			continue;
		}
		if (atomic_load_explicit(&ch[fd % OWNFD_CHUNK], memory_order_acquire)) {
			*fd_p = (unsigned)fd;
			return true;
		}
	}
	return false;
}
