/*
 * The fd table (shim/sock.c) on its own: which names resolve to which
 * entry, what close, dup, "not ours" and a stale entry do to the slots, and
 * that an entry is freed once, after its last reference, whatever threads
 * hold it meanwhile. The rest of the shim is replaced by fakes that record
 * what the table asked of it (closed fds, statistics slots, epoll records).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <pthread.h>

#include "shim/real.h"
#include "shim/shim.h"
#include "shim/sock.h"
#include "shim/stats.h"
#include "shim/epoll.h"

/* The fakes. */
struct ss_real ss_real;
const struct ss_transport_ops *ss_tp;
_Atomic(struct ss_worker *) ss_w;

#define MAX_REC 4096
static struct {
	int closed[MAX_REC]; /* fds the table closed, in order */
	int n_closed;
	int slots_closed[MAX_REC]; /* statistics slots given back */
	int n_slots_closed;
	int epoll_gone; /* ss_epoll_sock_gone calls */
} rec;
static pthread_mutex_t rec_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ss_stats_conn fake_slots[8];

static int fake_close(int fd)
{
	pthread_mutex_lock(&rec_lock);
	if (rec.n_closed < MAX_REC)
		rec.closed[rec.n_closed++] = fd;
	pthread_mutex_unlock(&rec_lock);
	return 0;
}

/* The shim's private fds are closed through here (ss_private_close: forgotten, then closed). */
void ss_private_close(int fd)
{
	fake_close(fd);
}

void ss_stats_conn_close(struct ss_stats_conn *slot)
{
	if (slot && rec.n_slots_closed < MAX_REC)
		rec.slots_closed[rec.n_slots_closed++] = (int)(slot - fake_slots);
}

uint32_t ss_stats_conn_index(const struct ss_stats_conn *slot)
{
	return (uint32_t)(slot - fake_slots);
}

struct ss_stats_conn *ss_stats_conn_at(uint32_t i)
{
	return &fake_slots[i];
}

void ss_epoll_sock_gone(struct ss_sock *s)
{
	(void)s;
	rec.epoll_gone++;
}

/* No socket here ever starts a downgrade. */
void ss_down_free(struct ss_sock *s)
{
	assert_null(s->down);
}

/* Nor moves from TCP. */
void ss_move_free(struct ss_sock *s)
{
	assert_null(s->late);
}

static int times_closed(int fd)
{
	int n = 0;

	for (int i = 0; i < rec.n_closed; i++)
		n += rec.closed[i] == fd;
	return n;
}

static int setup(void **state)
{
	(void)state;
	memset(&rec, 0, sizeof(rec));
	ss_real.close = fake_close;
	return 0;
}

/* A fresh entry for fd whose free closes private_fd (its TCP socket), so the free is seen. */
static struct ss_sock *entry(int fd, int private_fd)
{
	struct ss_sock *s = ss_sock_new(fd, AF_INET, SS_SOCK_FRESH, -1);

	assert_non_null(s);
	s->tcp_fd = private_fd;
	return s;
}

static void test_unknown_and_out_of_range(void **state)
{
	(void)state;
	assert_true(ss_sock_unknown(40));
	assert_null(ss_sock_get(40));
	assert_null(ss_sock_get(-1));
	assert_null(ss_sock_get(ss_sock_table_size()));
	assert_null(ss_sock_new(ss_sock_table_size(), AF_INET, SS_SOCK_FRESH, -1));
	assert_false(ss_sock_unknown(-1));
}

static void test_get_takes_a_reference(void **state)
{
	struct ss_sock *s = entry(41, 1041), *g;

	(void)state;
	assert_int_equal(atomic_load(&s->refs), 2); /* the table's and ours */
	g = ss_sock_get(41);
	assert_ptr_equal(g, s);
	assert_int_equal(atomic_load(&s->refs), 3);
	ss_sock_put(g);
	ss_sock_put(s);
	assert_false(ss_sock_unknown(41));
	/* The last name closed: the caller gets the entry and puts the table's reference. */
	int ret = -1;
	g = ss_sock_remove_fd(41, &ret);
	assert_ptr_equal(g, s);
	assert_int_equal(ret, 0);
	assert_int_equal(times_closed(41), 1);
	assert_int_equal(times_closed(1041), 0);
	ss_sock_put(g);
	assert_int_equal(times_closed(1041), 1); /* freed: its TCP socket closed */
	assert_true(ss_sock_unknown(41));
}

/* Closing one name of a dup'ed socket leaves the entry to the other; the last close frees it. */
static void test_dup_names(void **state)
{
	struct ss_sock *s = entry(42, 1042), *g;
	int ret;

	(void)state;
	assert_int_equal(ss_sock_add_fd(s, 43), 0);
	assert_ptr_equal((g = ss_sock_get(43)), s);
	ss_sock_put(g);
	assert_null(ss_sock_remove_fd(42, &ret));
	assert_int_equal(times_closed(42), 1);
	assert_null(ss_sock_get(42));
	assert_ptr_equal((g = ss_sock_get(43)), s);
	ss_sock_put(g);
	ss_sock_put(s);
	assert_int_equal(times_closed(1042), 0);
	g = ss_sock_remove_fd(43, &ret);
	assert_ptr_equal(g, s);
	ss_sock_put(g);
	assert_int_equal(times_closed(1042), 1);
}

static void test_names_are_bounded(void **state)
{
	struct ss_sock *s = entry(44, -1), *g;

	(void)state;
	assert_int_equal(ss_sock_add_fd(s, 45), 0);
	assert_int_equal(ss_sock_add_fd(s, 46), 0);
	assert_int_equal(ss_sock_add_fd(s, 47), 0);
	assert_int_equal(ss_sock_add_fd(s, 48), -ENOSPC);
	assert_true(ss_sock_unknown(48));
	assert_int_equal(ss_sock_add_fd(s, -1), -EBADF);
	ss_sock_put(s);
	for (int fd = 44; fd <= 46; fd++)
		assert_null(ss_sock_remove_fd(fd, NULL));
	g = ss_sock_remove_fd(47, NULL);
	assert_ptr_equal(g, s);
	ss_sock_put(g);
	assert_int_equal(rec.n_closed, 0); /* no close_ret asked: the caller closes */
}

/* "Not ours" costs a table read: no entry, not unknown, and a later socket there is ours again. */
static void test_plain_mark(void **state)
{
	struct ss_sock *s;

	(void)state;
	ss_sock_mark_plain_fd(50);
	assert_false(ss_sock_unknown(50));
	assert_null(ss_sock_get(50));
	s = entry(50, -1);
	assert_ptr_equal(ss_sock_get(50), s);
	ss_sock_put(s);
	ss_sock_put(s);
	ss_sock_put(ss_sock_remove_fd(50, NULL));
	assert_true(ss_sock_unknown(50));
}

/* A socket decided plain for good: its names become "not ours"; the first keeps its statistics
 * slot. */
static void test_forget(void **state)
{
	struct ss_sock *s = entry(51, 1051);

	(void)state;
	s->stat = &fake_slots[3];
	assert_int_equal(ss_sock_add_fd(s, 52), 0);
	ss_sock_forget(s);
	assert_int_equal(rec.epoll_gone, 1);
	assert_null(ss_sock_get(51));
	assert_null(ss_sock_get(52));
	assert_false(ss_sock_unknown(51));
	assert_false(ss_sock_unknown(52));
	assert_int_equal(rec.n_slots_closed, 0);
	assert_int_equal(times_closed(1051), 0); /* the caller's reference keeps it */
	ss_sock_put(s);
	assert_int_equal(times_closed(1051), 1);
	/* Closing the names: plain fds, closed; the slot goes with the first name. */
	assert_null(ss_sock_remove_fd(52, NULL));
	assert_int_equal(rec.n_slots_closed, 0);
	assert_null(ss_sock_remove_fd(51, NULL));
	assert_int_equal(rec.n_slots_closed, 1);
	assert_int_equal(rec.slots_closed[0], 3);
	assert_true(ss_sock_unknown(51));
}

/* A number closed behind the shim's back and reused: the new entry replaces the stale one. */
static void test_stale_entry_replaced(void **state)
{
	struct ss_sock *a = entry(53, 1053), *b;

	(void)state;
	assert_int_equal(ss_sock_add_fd(a, 54), 0);
	b = entry(53, 2053);
	assert_ptr_equal(ss_sock_get(53), b);
	ss_sock_put(b);
	assert_int_equal(a->n_fds, 1); /* a lost the name */
	assert_int_equal(a->fds[0], 54);
	ss_sock_put(a);
	ss_sock_put(ss_sock_remove_fd(54, NULL));
	assert_int_equal(times_closed(1053), 1);
	ss_sock_put(b);
	ss_sock_put(ss_sock_remove_fd(53, NULL));
	assert_int_equal(times_closed(2053), 1);
}

static struct ss_sock *visited[8];
static int n_visited;

static void visit(struct ss_sock *s)
{
	visited[n_visited++] = s;
}

/* Every entry once, under its first name; plain marks are not entries. */
static void test_for_each(void **state)
{
	struct ss_sock *a = entry(55, -1), *b = entry(57, -1);

	(void)state;
	assert_int_equal(ss_sock_add_fd(a, 56), 0);
	ss_sock_mark_plain_fd(58);
	n_visited = 0;
	ss_sock_for_each(visit);
	assert_int_equal(n_visited, 2);
	assert_ptr_equal(visited[0], a);
	assert_ptr_equal(visited[1], b);
	ss_sock_put(a);
	ss_sock_put(b);
	ss_sock_put(ss_sock_remove_fd(55, NULL));
	ss_sock_put(ss_sock_remove_fd(56, NULL));
	ss_sock_put(ss_sock_remove_fd(57, NULL));
	ss_sock_remove_fd(58, NULL);
}

/* In a forked child, a plain name's statistics slot is the parent's: not given back there. */
static void test_after_fork_drops_parent_slots(void **state)
{
	struct ss_sock *s = entry(59, -1);

	(void)state;
	s->stat = &fake_slots[5];
	ss_sock_forget(s);
	ss_sock_put(s);
	ss_sock_after_fork();
	assert_null(ss_sock_remove_fd(59, NULL));
	assert_int_equal(rec.n_slots_closed, 0);
}

/* Readers racing the last close: the entry is freed exactly once, after the last of them. */
enum { RACE_FD = 60, RACE_ROUNDS = 2000, RACE_THREADS = 3 };
static atomic_bool race_stop;
static atomic_int race_bad; /* an entry got under RACE_FD that does not name it */

static void *race_reader(void *arg)
{
	long got = 0;

	(void)arg;
	while (!atomic_load(&race_stop)) {
		struct ss_sock *s = ss_sock_get(RACE_FD);

		if (s) {
			pthread_mutex_lock(&s->fd_lock);
			if (s->n_fds > 1 || (s->n_fds == 1 && s->fds[0] != RACE_FD))
				atomic_fetch_add(&race_bad, 1);
			pthread_mutex_unlock(&s->fd_lock);
			got++;
			ss_sock_put(s);
		}
	}
	return (void *)got;
}

static void test_close_races_readers(void **state)
{
	pthread_t t[RACE_THREADS];

	(void)state;
	atomic_store(&race_stop, false);
	for (int i = 0; i < RACE_THREADS; i++)
		assert_int_equal(pthread_create(&t[i], NULL, race_reader, NULL), 0);
	for (int r = 0; r < RACE_ROUNDS; r++) {
		struct ss_sock *s = entry(RACE_FD, 10000 + r);

		ss_sock_put(s);
		ss_sock_put(ss_sock_remove_fd(RACE_FD, NULL));
	}
	atomic_store(&race_stop, true);
	for (int i = 0; i < RACE_THREADS; i++)
		pthread_join(t[i], NULL);
	assert_int_equal(atomic_load(&race_bad), 0);
	assert_int_equal(rec.n_closed, RACE_ROUNDS);
	for (int r = 0; r < RACE_ROUNDS; r++)
		assert_int_equal(times_closed(10000 + r), 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_unknown_and_out_of_range, setup),
		cmocka_unit_test_setup(test_get_takes_a_reference, setup),
		cmocka_unit_test_setup(test_dup_names, setup),
		cmocka_unit_test_setup(test_names_are_bounded, setup),
		cmocka_unit_test_setup(test_plain_mark, setup),
		cmocka_unit_test_setup(test_forget, setup),
		cmocka_unit_test_setup(test_stale_entry_replaced, setup),
		cmocka_unit_test_setup(test_for_each, setup),
		cmocka_unit_test_setup(test_after_fork_drops_parent_slots, setup),
		cmocka_unit_test_setup(test_close_races_readers, setup),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
