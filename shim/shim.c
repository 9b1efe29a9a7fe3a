/* libsrqshim.so: load-time set-up, fork handling and the linger at exit. */
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "shim/epoll.h"
#include "shim/real.h"
#include "shim/ready.h"
#include "shim/shim.h"
#include "shim/stats.h"
#include "transport/log.h"

struct ss_config ss_cfg;
static atomic_int ss_pid; /* this process, updated in a forked child */

bool ss_in_vfork_child(void)
{
	return getpid() != atomic_load_explicit(&ss_pid, memory_order_relaxed);
}
struct ss_policy ss_peers;
__thread int ss_in_call;

static void report_bad_option(const char *msg, void *arg)
{
	(void)arg;
	ss_log_error("%s", msg);
}

/*
 * In a forked child: connections the parent carries or negotiates are the
 * parent's. The child closes its copies of our private fds at once (the
 * parent's death must still show as the TCP end), never touches the
 * parent's verbs objects or its progress thread's epoll set, and forgets
 * the background work (the parent's thread does it).
 */
static int fork_parent; /* in after_fork_child: the pid that forked us */

static void forget_connection(struct ss_sock *s)
{
	int st = ss_sock_state(s);

	s->bg = false;
	s->watch.added = false;
	s->kick.pos = 0;
	/* The parent's worker counts its mirrored sockets as event users, not ours. */
	atomic_store(&s->mirror_events, false);
	if (st == SS_SOCK_FRESH || st == SS_SOCK_LISTEN || st == SS_SOCK_PLAIN)
		return;
	if (s->tcp_fd >= 0)
		ss_private_close(s->tcp_fd);
	if (s->shim_fd >= 0)
		ss_private_close(s->shim_fd);
	s->tcp_fd = s->shim_fd = -1;
	if (st == SS_SOCK_LATE) {
		/* Pinned to TCP before the fork (or reset): the child's as a plain socket. */
		ss_move_free(s);
		free(s->hold);
		s->hold = NULL;
		s->hold_len = 0;
		ss_sock_set_state(s, SS_SOCK_PLAIN);
		return;
	}
	if (st == SS_SOCK_ACCEPTED) {
		/* Undecided: the child decides on its own at its first I/O (nobody answers yet). */
		atomic_store(&s->answering, false);
		return;
	}
	s->conn = NULL; /* its verbs objects are the parent's: never destroyed here */
	free(s->hold);
	s->hold = NULL;
	s->hold_len = 0;
	if (st != SS_SOCK_FOREIGN)
		s->owner = fork_parent; /* the carrier, which a child's exec asks (inherit.c) */
	ss_sock_set_state(s, SS_SOCK_FOREIGN);
}

/* Every entry: its statistics slot is in the parent's file. */
static void forget_stats(struct ss_sock *s)
{
	s->stat = NULL;
}

/* Before fork(): connections starting on TCP finish first (a child must not write before our
 * held bytes, nor read our answer); then the inheritance's mark. */
static void before_fork(void)
{
	ss_asking_finish_all();
	ss_move_pin_all();
	ss_inherit_forked();
	/* Last: it holds its lock until the fork is done (after_fork_parent, ss_warm_after_fork).
	 */
	ss_warm_before_fork();
}

static void after_fork_parent(void)
{
	ss_warm_after_fork_parent();
}

/*
 * The child of a fork: every lock of the shim is made anew first (a parent
 * thread may have held any of them, in a negotiation or a close), then
 * what belongs to the parent is forgotten.
 */
static void after_fork_child(void)
{
	fork_parent = atomic_load_explicit(&ss_pid, memory_order_relaxed);
	atomic_store_explicit(&ss_pid, getpid(), memory_order_relaxed);
	ss_sock_after_fork();
	ss_loader_after_fork();
	ss_warm_after_fork();
	ss_cache_after_fork();
	ss_stats_after_fork();
	ss_ready_after_fork();
	ss_epoll_after_fork();
	ss_signal_after_fork();
	ss_close_after_fork();
	ss_ctlchan_after_fork();
	ss_inherit_after_fork();
	ss_spawn_after_fork();
	ss_nonce_after_fork();
	ss_sock_for_each(forget_connection);
	ss_sock_for_each(forget_stats);
	if (ss_tp)
		ss_tp->worker_forget_after_fork();
	ss_w = NULL;
}

static void finish_at_exit(struct ss_sock *s)
{
	ss_sock_finish(s, true);
}

/* Runs once at load: options (bad values reported, defaults kept), fork handler. */
__attribute__((constructor)) static void ss_shim_init(void)
{
	/* Errors in the log level itself must still be reported: log at the default first. */
	ss_log_level = SS_LOG_ERROR;
	ss_config_load(&ss_cfg, ss_config_getenv, NULL, report_bad_option, NULL);
	ss_log_level = (enum ss_log_level)ss_cfg.log_level;
	char err[8];
	ss_policy_parse(ss_cfg.peers, &ss_peers, err, sizeof(err)); /* checked by the table */
	ss_test_delays_load();
	ss_real_init();
	atomic_store_explicit(&ss_pid, getpid(), memory_order_relaxed);
	pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

void ss_shim_leaving(bool close_open)
{
	if (ss_in_call || ss_in_vfork_child())
		return;
	if (close_open) {
		ss_sock_for_each(finish_at_exit);
		ss_inherit_leaving();
	}
	ss_close_wait_all();
}

/* At exit, accepted bytes still get their bounded linger. */
__attribute__((destructor)) static void ss_shim_fini(void)
{
	ss_shim_leaving(true);
	if (ss_w && ss_log_level >= SS_LOG_INFO) {
		struct ss_worker_stats st;

		ss_tp->worker_get_stats(ss_w, &st);
		ss_log_info(
			"at exit: registered %llu KiB; SRQ pool %u blocks (bound %u), %u posted, "
			"at most %u held at once, %llu limit events",
			(unsigned long long)(st.reg_bytes >> 10), st.srq_blocks, st.srq_max,
			st.srq_posted, st.srq_peak_held, (unsigned long long)st.srq_limit_events);
	}
	ss_stats_fini();
}
