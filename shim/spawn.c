/*
 * What a posix_spawn's program will hold besides the names without
 * close-on-exec: the sources of its file actions' dup2 (the usual way to
 * hand a connection to a program's stdin and stdout). glibc keeps file
 * actions opaque, so the shim notes each dup2 as it is added, and forgets
 * a set of actions when it is made or destroyed. handover.c asks at the
 * spawn. spawn_lock is a leaf.
 */
#include <pthread.h>
#include <spawn.h>

#include "shim/shim.h"
#include "transport/log.h"

/* Enough for any program's stdin, stdout and stderr several times over. */
#define SPAWN_DUPS 64

static pthread_mutex_t spawn_lock = PTHREAD_MUTEX_INITIALIZER;
static struct spawn_dup {
	const posix_spawn_file_actions_t *fa; /* NULL: a free slot */
	int fd;
} spawn_dups[SPAWN_DUPS];

void ss_spawn_note_dup(const posix_spawn_file_actions_t *fa, int fd)
{
	int i;

	pthread_mutex_lock(&spawn_lock);
	for (i = 0; i < SPAWN_DUPS && spawn_dups[i].fa; i++)
		;
	if (i < SPAWN_DUPS)
		spawn_dups[i] = (struct spawn_dup){fa, fd};
	pthread_mutex_unlock(&spawn_lock);
	if (i == SPAWN_DUPS)
		ss_log_warn("fd %d: too many spawn file actions to track; if it is an upgraded "
			    "connection, the spawned program cannot use it",
			    fd);
}

void ss_spawn_forget(const posix_spawn_file_actions_t *fa)
{
	pthread_mutex_lock(&spawn_lock);
	for (int i = 0; i < SPAWN_DUPS; i++)
		if (spawn_dups[i].fa == fa)
			spawn_dups[i].fa = NULL;
	pthread_mutex_unlock(&spawn_lock);
}

bool ss_spawn_dups(const posix_spawn_file_actions_t *fa, int fd)
{
	bool found = false;

	if (!fa)
		return false;
	pthread_mutex_lock(&spawn_lock);
	for (int i = 0; i < SPAWN_DUPS && !found; i++)
		found = spawn_dups[i].fa == fa && spawn_dups[i].fd == fd;
	pthread_mutex_unlock(&spawn_lock);
	return found;
}

void ss_spawn_after_fork(void)
{
	pthread_mutex_init(&spawn_lock, NULL);
}
