/*
 * Publishing this process's statistics for srqshim-ctl (layout in
 * stats.h): the file is made at the first connection worth showing, slots
 * are handed out from an in-process free list, and the file is removed at
 * exit. Counters are written by the transport itself (ss_conn_publish).
 */
#include "shim/stats.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "handshake/clock.h"
#include "shim/real.h"
#include "shim/shim.h"
#include "transport/log.h"

static pthread_mutex_t pub_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ss_stats_head *head; /* NULL until made (or after fork) */
static struct ss_stats_conn *slots;
static size_t map_len;
static bool failed; /* tried and could not: do not retry per connection */
static char path[96];
static uint32_t *free_list, n_free;

/* The command line, arguments joined by spaces. */
static void read_command(char *buf, size_t len)
{
	int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
	ssize_t n = fd >= 0 ? read(fd, buf, len - 1) : -1;

	if (fd >= 0)
		ss_real.close(fd);
	if (n <= 0) {
		snprintf(buf, len, "?");
		return;
	}
	buf[n] = '\0';
	for (ssize_t i = 0; i < n - 1; i++)
		if (buf[i] == '\0')
			buf[i] = ' ';
}

/* Makes the file; pub_lock held. */
static int make_file(void)
{
	char dir[64];
	struct stat st;
	int fd;

	snprintf(dir, sizeof(dir), SS_STATS_DIR_FMT, (unsigned)getuid());
	if (mkdir(dir, 0700) < 0 && errno != EEXIST)
		goto err;
	/* Ours alone: a directory someone else made (or a link) is not used. */
	if (lstat(dir, &st) < 0 || !S_ISDIR(st.st_mode) || st.st_uid != getuid() ||
	    (st.st_mode & 0077)) {
		errno = EPERM;
		goto err;
	}
	snprintf(path, sizeof(path), "%s/%d.stats", dir, (int)getpid());
	/* A leftover of a killed process with our pid is overwritten. */
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		goto err;
	map_len = sizeof(*head) + (size_t)SS_STATS_SLOTS * sizeof(*slots);
	if (ftruncate(fd, (off_t)map_len) < 0) {
		ss_real.close(fd);
		goto err_unlink;
	}
	head = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ss_real.close(fd);
	if (head == MAP_FAILED) {
		head = NULL;
		goto err_unlink;
	}
	free_list = calloc(SS_STATS_SLOTS, sizeof(*free_list));
	if (!free_list) {
		munmap(head, map_len);
		head = NULL;
		goto err_unlink;
	}
	slots = (struct ss_stats_conn *)(head + 1);
	head->version = SS_STATS_VERSION;
	head->head_size = sizeof(*head);
	head->conn_size = sizeof(*slots);
	head->n_slots = SS_STATS_SLOTS;
	head->pid = (uint32_t)getpid();
	head->start_time = ss_stats_start_time(getpid());
	head->mode = (uint32_t)ss_cfg.mode;
	read_command(head->command, sizeof(head->command));
	/* The magic last: a reader never takes a half-made header for a valid one. */
	__atomic_thread_fence(__ATOMIC_RELEASE);
	memcpy(head->magic, SS_STATS_MAGIC, sizeof(head->magic));
	if (ss_w)
		ss_tp->worker_publish(ss_w, &head->worker);
	return 0;

err_unlink:
	unlink(path);
err:
	ss_log_warn("no statistics for srqshim-ctl: %s: %s", path[0] ? path : dir, strerror(errno));
	failed = true;
	return -1;
}

static void fill_addr(struct ss_stats_addr *a, const struct sockaddr_storage *ss)
{
	memset(a, 0, sizeof(*a));
	if (ss->ss_family == AF_INET) {
		const struct sockaddr_in *sin = (const struct sockaddr_in *)ss;
		a->family = AF_INET;
		a->port = ntohs(sin->sin_port);
		memcpy(a->addr, &sin->sin_addr, 4);
	} else if (ss->ss_family == AF_INET6) {
		const struct sockaddr_in6 *sin6 = (const struct sockaddr_in6 *)ss;
		a->family = AF_INET6;
		a->port = ntohs(sin6->sin6_port);
		memcpy(a->addr, &sin6->sin6_addr, 16);
	}
}

/* A wildcard address: a connect to it reaches this host, which getpeername names. */
static bool publish_is_any(const struct sockaddr *sa)
{
	if (sa->sa_family == AF_INET)
		return ((const struct sockaddr_in *)sa)->sin_addr.s_addr == htonl(INADDR_ANY);
	return sa->sa_family == AF_INET6 &&
	       IN6_IS_ADDR_UNSPECIFIED(&((const struct sockaddr_in6 *)sa)->sin6_addr);
}

struct ss_stats_conn *ss_stats_conn_open(int app_fd, int tcp_fd, const struct sockaddr *peer,
					 enum ss_stats_state st, unsigned reason)
{
	struct sockaddr_storage la = {0}, pa = {0};
	socklen_t ll = sizeof(la), pl = sizeof(pa);
	struct ss_stats_conn *c = NULL;
	uint32_t i;

	pthread_mutex_lock(&pub_lock);
	if (!head && (failed || make_file() < 0))
		goto out;
	if (n_free)
		i = free_list[--n_free];
	else if (head->slots_hwm < head->n_slots)
		i = head->slots_hwm;
	else
		goto out; /* more connections than slots: the rest are not shown */
	c = &slots[i];
	__atomic_store_n(&c->seq, c->seq + 1, __ATOMIC_RELEASE); /* odd: being rewritten */
	__atomic_thread_fence(__ATOMIC_RELEASE);
	ss_real.getsockname(tcp_fd, (struct sockaddr *)&la, &ll);
	/* A client's peer is the address it connected to: no system call for it. */
	if (peer && !publish_is_any(peer))
		memcpy(&pa, peer,
		       peer->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
						   : sizeof(struct sockaddr_in));
	else
		ss_real.getpeername(tcp_fd, (struct sockaddr *)&pa, &pl);
	fill_addr(&c->local, &la);
	fill_addr(&c->peer, &pa);
	c->fd = app_fd;
	c->state = st;
	c->reason = (uint16_t)reason;
	c->mode = c->peer_mode = 0;
	c->tx_window = c->rx_window = 0;
	c->moved_at = 0;
	memset(&c->st, 0, sizeof(c->st));
	__atomic_thread_fence(__ATOMIC_RELEASE);
	__atomic_store_n(&c->seq, c->seq + 1, __ATOMIC_RELEASE);
	if (i >= head->slots_hwm)
		__atomic_store_n(&head->slots_hwm, i + 1, __ATOMIC_RELEASE);
out:
	pthread_mutex_unlock(&pub_lock);
	return c;
}

void ss_stats_conn_set(struct ss_stats_conn *c, enum ss_stats_state st, unsigned reason, bool moved)
{
	pthread_mutex_lock(&pub_lock);
	__atomic_store_n(&c->seq, c->seq + 1, __ATOMIC_RELEASE); /* odd: being rewritten */
	__atomic_thread_fence(__ATOMIC_RELEASE);
	c->state = st;
	c->reason = (uint16_t)reason;
	c->moved_at = moved ? ss_wall_ms() : 0;
	__atomic_thread_fence(__ATOMIC_RELEASE);
	__atomic_store_n(&c->seq, c->seq + 1, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&pub_lock);
}

void ss_stats_conn_close(struct ss_stats_conn *c)
{
	if (!c)
		return;
	pthread_mutex_lock(&pub_lock);
	if (head && c >= slots && c < slots + head->n_slots) {
		__atomic_store_n(&c->state, SS_ST_FREE, __ATOMIC_RELEASE);
		free_list[n_free++] = (uint32_t)(c - slots);
	}
	pthread_mutex_unlock(&pub_lock);
}

uint32_t ss_stats_conn_index(const struct ss_stats_conn *c)
{
	return (uint32_t)(c - slots);
}

struct ss_stats_conn *ss_stats_conn_at(uint32_t i)
{
	return head && i < head->n_slots ? &slots[i] : NULL;
}

void ss_stats_worker_ready(void)
{
	pthread_mutex_lock(&pub_lock);
	if (head && ss_w)
		ss_tp->worker_publish(ss_w, &head->worker);
	pthread_mutex_unlock(&pub_lock);
}

void ss_stats_after_fork(void)
{
	/* The mapping stays (unused) so that no stale pointer faults; the child starts afresh. */
	pthread_mutex_init(&pub_lock, NULL);
	head = NULL;
	slots = NULL;
	failed = false;
	free(free_list);
	free_list = NULL;
	n_free = 0;
	path[0] = '\0';
}

void ss_stats_fini(void)
{
	pthread_mutex_lock(&pub_lock);
	if (head && path[0]) {
		if (ss_w)
			ss_tp->worker_publish(ss_w, NULL);
		unlink(path);
		path[0] = '\0';
	}
	pthread_mutex_unlock(&pub_lock);
}
