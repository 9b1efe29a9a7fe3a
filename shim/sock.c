/*
 * The fd table: one slot per possible fd, read without a lock on the path of
 * every call. A slot holds NULL (never seen), PLAIN_MARK (seen, not ours) or
 * an entry. Entries are reference counted; a striped lock makes "load the
 * slot and take a reference" atomic with respect to close.
 */
#include "shim/sock.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include "shim/epoll.h"
#include "shim/real.h"
#include "shim/shim.h"
#include "shim/stats.h"
#include "transport/log.h"

/*
 * Odd values are "seen, not ours": PLAIN_MARK, or a plain connection that
 * keeps a statistics slot ((slot + 1) << 1 | 1), freed with the entry.
 */
#define PLAIN_MARK ((struct ss_sock *)1)
#define N_STRIPES  64

static inline bool is_plain(const struct ss_sock *v)
{
	return ((uintptr_t)v & 1) != 0;
}

static struct ss_sock *plain_with_slot(struct ss_stats_conn *slot)
{
	return (struct ss_sock *)((((uintptr_t)ss_stats_conn_index(slot) + 1) << 1) | 1);
}

static void drop_plain(struct ss_sock *v)
{
	if (is_plain(v) && v != PLAIN_MARK)
		ss_stats_conn_close(ss_stats_conn_at((uint32_t)(((uintptr_t)v >> 1) - 1)));
}

/* Slots are read without a lock on every call: atomic pointers. */
static _Atomic(struct ss_sock *) *table;
static int table_len;
static atomic_int table_hwm; /* one past the highest fd ever given an entry */
static pthread_mutex_t stripes[N_STRIPES];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void table_init(void)
{
	struct rlimit rl;
	size_t len;

	if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_max == RLIM_INFINITY ||
	    rl.rlim_max > (1u << 22))
		rl.rlim_max = 1u << 22;
	if (rl.rlim_max < 65536)
		rl.rlim_max = 65536;
	len = (size_t)rl.rlim_max * sizeof(*table);
	/* Untouched pages cost nothing: the table is as long as the hard limit allows. */
	table = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
		     -1, 0);
	if (table == MAP_FAILED) {
		table = NULL;
		return;
	}
	table_len = (int)rl.rlim_max;
	for (int i = 0; i < N_STRIPES; i++)
		pthread_mutex_init(&stripes[i], NULL);
}

static void table_hwm_raise(int fd)
{
	int h = atomic_load_explicit(&table_hwm, memory_order_relaxed);

	while (fd >= h && !atomic_compare_exchange_weak(&table_hwm, &h, fd + 1))
		;
}

static inline bool table_ready(void)
{
	pthread_once(&table_once, table_init);
	return table != NULL;
}

int ss_sock_table_size(void)
{
	return table_ready() ? table_len : 0;
}

struct ss_sock *ss_sock_get(int fd)
{
	struct ss_sock *s;

	if (fd < 0 || !table_ready() || fd >= table_len)
		return NULL;
	s = atomic_load_explicit(&table[fd], memory_order_acquire);
	if (s == NULL || is_plain(s))
		return NULL;
	pthread_mutex_lock(&stripes[fd % N_STRIPES]);
	s = atomic_load_explicit(&table[fd], memory_order_relaxed);
	if (is_plain(s))
		s = NULL;
	if (s)
		atomic_fetch_add(&s->refs, 1);
	pthread_mutex_unlock(&stripes[fd % N_STRIPES]);
	return s;
}

bool ss_sock_tryget(struct ss_sock *s)
{
	int r = atomic_load(&s->refs);

	while (r > 0)
		if (atomic_compare_exchange_weak(&s->refs, &r, r + 1))
			return true;
	return false;
}

static void sock_free(struct ss_sock *s)
{
	if (s->conn) {
		if (ss_log_level >= SS_LOG_INFO) {
			struct ss_conn_stats st;

			ss_tp->conn_get_stats(s->conn, &st);
			ss_log_info(
				"connection done: sent %llu B in %llu messages, received %llu B "
				"in %llu, grants %llu/%llu and credit requests %llu/%llu "
				"(sent/received), copied out %llu",
				(unsigned long long)st.tx_bytes, (unsigned long long)st.tx_msgs,
				(unsigned long long)st.rx_bytes, (unsigned long long)st.rx_msgs,
				(unsigned long long)st.grants_sent,
				(unsigned long long)st.grants_received,
				(unsigned long long)st.requests_sent,
				(unsigned long long)st.requests_received,
				(unsigned long long)st.copied_out);
		}
		ss_tp->conn_destroy(s->conn);
		/*
		 * The connection's hook may have armed the kick after the last
		 * put cancelled it (a closed socket's delivery reported by a
		 * thread that took the completion): it can no longer run, so
		 * cancel once more (this runs on the progress thread, where the
		 * timer callbacks run).
		 */
		if (s->bg && ss_w)
			ss_tp->worker_timer_cancel(ss_w, &s->kick);
	}
	ss_stats_conn_close(s->stat);
	if (s->tcp_fd >= 0)
		ss_private_close(s->tcp_fd);
	if (s->shim_fd >= 0)
		ss_private_close(s->shim_fd);
	free(s->hold);
	free(s->answer_part);
	ss_down_free(s);
	ss_move_free(s);
	free(atomic_exchange(&s->heir, NULL));
	pthread_mutex_destroy(&s->lock);
	pthread_mutex_destroy(&s->fd_lock);
	free(s);
}

static void sock_free_deferred(struct ss_defer *d)
{
	sock_free((struct ss_sock *)((char *)d - offsetof(struct ss_sock, grave)));
}

void ss_sock_put(struct ss_sock *s)
{
	if (!s || atomic_fetch_sub(&s->refs, 1) != 1)
		return;
	if (s->bg && ss_w) {
		/*
		 * The progress thread may hold a callback of ours already
		 * harvested: it frees the entry after that (the callback's
		 * ss_sock_tryget fails meanwhile).
		 */
		ss_tp->worker_timer_cancel(ss_w, &s->kick);
		ss_tp->worker_unwatch(ss_w, &s->watch);
		s->grave.fn = sock_free_deferred;
		/*
		 * An entry that holds no fd and no connection waits for the
		 * thread's next pass (its status slot goes now; no callback
		 * that can still run reaches it).
		 */
		if (s->tcp_fd < 0 && s->shim_fd < 0 && !s->conn) {
			ss_stats_conn_close(s->stat);
			s->stat = NULL;
			ss_tp->worker_defer_lazy(ss_w, &s->grave);
		} else
			ss_tp->worker_defer(ss_w, &s->grave);
		return;
	}
	sock_free(s);
}

static struct ss_sock *slot_swap(int fd, struct ss_sock *v)
{
	struct ss_sock *old;

	pthread_mutex_lock(&stripes[fd % N_STRIPES]);
	old = atomic_exchange_explicit(&table[fd], v, memory_order_acq_rel);
	pthread_mutex_unlock(&stripes[fd % N_STRIPES]);
	if (is_plain(old)) {
		drop_plain(old);
		return NULL;
	}
	return old;
}

/* Each entry's serial (a forked child names its parent's connections by it). */
static atomic_uint_least64_t sock_serial = 1;

struct ss_sock *ss_sock_new(int fd, int domain, enum ss_sock_state state, int nonblock)
{
	struct ss_sock *s, *old;

	if (fd < 0 || !table_ready() || fd >= table_len)
		return NULL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	pthread_mutex_init(&s->lock, NULL);
	pthread_mutex_init(&s->fd_lock, NULL);
	atomic_init(&s->refs, 2); /* the table's and the caller's */
	s->fds[0] = fd;
	s->n_fds = 1;
	s->tcp_fd = -1;
	atomic_init(&s->nonblock, nonblock);
	/* A socket socket() just made has no timeouts; an accepted one has its listener's. */
	atomic_init(&s->timeo_ms[0], state == SS_SOCK_FRESH ? 0 : -1);
	atomic_init(&s->timeo_ms[1], state == SS_SOCK_FRESH ? 0 : -1);
	atomic_init(&s->closing, false);
	s->shim_fd = -1;
	s->serial = atomic_fetch_add_explicit(&sock_serial, 1, memory_order_relaxed);
	s->domain = domain;
	atomic_init(&s->state, (int)state);
	table_hwm_raise(fd);
	old = slot_swap(fd, s);
	if (old) {
		/* A stale entry (its fd was closed behind our back): forget it. */
		pthread_mutex_lock(&old->fd_lock);
		for (int i = 0; i < old->n_fds; i++)
			if (old->fds[i] == fd)
				old->fds[i] = old->fds[--old->n_fds];
		pthread_mutex_unlock(&old->fd_lock);
		ss_sock_put(old);
	}
	return s;
}

int ss_sock_add_fd(struct ss_sock *s, int fd)
{
	struct ss_sock *old;

	if (fd < 0 || fd >= table_len)
		return -EBADF;
	pthread_mutex_lock(&s->fd_lock);
	if (s->n_fds == (int)(sizeof(s->fds) / sizeof(s->fds[0]))) {
		pthread_mutex_unlock(&s->fd_lock);
		return -ENOSPC;
	}
	s->fds[s->n_fds++] = fd;
	atomic_fetch_add(&s->refs, 1);
	pthread_mutex_unlock(&s->fd_lock);
	table_hwm_raise(fd);
	old = slot_swap(fd, s);
	ss_sock_put(old);
	return 0;
}

struct ss_sock *ss_sock_remove_fd(int fd, int *close_ret)
{
	struct ss_sock *s;
	bool last;

	if (fd < 0 || !table_ready() || fd >= table_len)
		return NULL;
	s = slot_swap(fd, NULL);
	if (!s) {
		if (close_ret)
			*close_ret = ss_real.close(fd);
		return NULL;
	}
	/* Closed under fd_lock, so the readiness mirror never uses a recycled number. */
	pthread_mutex_lock(&s->fd_lock);
	for (int i = 0; i < s->n_fds; i++)
		if (s->fds[i] == fd) {
			s->fds[i] = s->fds[--s->n_fds];
			break;
		}
	if (close_ret)
		*close_ret = ss_real.close(fd);
	last = s->n_fds == 0;
	pthread_mutex_unlock(&s->fd_lock);
	if (last)
		return s; /* the caller puts the table's reference */
	ss_sock_put(s);
	return NULL;
}

void ss_sock_mark_plain_fd(int fd)
{
	if (fd >= 0 && table_ready() && fd < table_len)
		ss_sock_put(slot_swap(fd, PLAIN_MARK));
}

bool ss_sock_unknown(int fd)
{
	return fd >= 0 && table_ready() && fd < table_len &&
	       atomic_load_explicit(&table[fd], memory_order_acquire) == NULL;
}

void ss_sock_for_each(void (*fn)(struct ss_sock *s))
{
	if (!table_ready())
		return;
	for (int fd = 0; fd < table_hwm; fd++) {
		struct ss_sock *s = atomic_load_explicit(&table[fd], memory_order_acquire);

		/* An entry with several names is visited under its first name only. */
		if (s && !is_plain(s) && s->fds[0] == fd)
			fn(s);
	}
}

void ss_sock_for_each_held(void (*fn)(struct ss_sock *s))
{
	if (!table_ready())
		return;
	for (int fd = 0; fd < table_hwm; fd++) {
		struct ss_sock *s = ss_sock_get(fd);

		if (s && s->fds[0] == fd)
			fn(s);
		ss_sock_put(s);
	}
}

void ss_sock_after_fork(void)
{
	if (!table_ready())
		return;
	/* A parent thread may have held any of these at the fork: none is held in the child. */
	for (int i = 0; i < N_STRIPES; i++)
		pthread_mutex_init(&stripes[i], NULL);
	for (int fd = 0; fd < table_hwm; fd++) {
		struct ss_sock *s = atomic_load_explicit(&table[fd], memory_order_relaxed);

		if (is_plain(s)) {
			atomic_store_explicit(&table[fd], PLAIN_MARK, memory_order_relaxed);
		} else if (s && s->fds[0] == fd) {
			pthread_mutex_init(&s->lock, NULL);
			pthread_mutex_init(&s->fd_lock, NULL);
		}
	}
}

void ss_sock_forget(struct ss_sock *s)
{
	int fds[4], n;

	/* Its registrations stay in the kernel; the records of them go. */
	ss_epoll_sock_gone(s);

	pthread_mutex_lock(&s->fd_lock);
	n = s->n_fds;
	memcpy(fds, s->fds, sizeof(fds));
	s->n_fds = 0;
	pthread_mutex_unlock(&s->fd_lock);
	for (int i = 0; i < n; i++) {
		/* The first name keeps the statistics slot until it is closed. */
		struct ss_sock *old = slot_swap(fds[i], i == 0 && s->stat ? plain_with_slot(s->stat)
									  : PLAIN_MARK);

		if (i == 0)
			s->stat = NULL;

		if (old == s)
			ss_sock_put(s); /* that name's reference */
		else
			ss_sock_put(old);
	}
}
