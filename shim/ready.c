#include "shim/ready.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "shim/epoll.h"
#include "shim/real.h"
#include "shim/shim.h"

/* ---- the connection's hook ---- */

void ss_ready_conn(void *arg, unsigned ready)
{
	struct ss_sock *s = arg;
	int st;

	if (ready & SS_RDY_SENT) {
		ss_close_delivered(s);
		ready &= ~SS_RDY_SENT;
	}
	/* Shut for reading by the application: readable at its end, as TCP's. */
	if (atomic_load_explicit(&s->shut_rd, memory_order_relaxed))
		ready |= SS_RDY_IN | SS_RDY_RDHUP;
	/* Sequentially consistent, as the sleepers' count read after it (ss_ready_wake_pollers). */
	atomic_store(&s->rdy, ready & ~SS_RDY_EDGE);
	/*
	 * The peer moves the stream back to TCP (or its RDMA stream ended while
	 * ours is moving): the progress thread takes it on (down.c).
	 */
	st = ss_sock_state(s);
	if ((ready & SS_RDY_SWITCH) || st == SS_SOCK_FALLBACK)
		ss_bg_kick(s, ss_now_ms());
	/* Before the decision the shim's state says what shows, not the connection. */
	if (st != SS_SOCK_UPGRADED)
		return;
	if (atomic_load_explicit(&s->mirror_refs, memory_order_acquire) > 0)
		ss_mirror_show(s, ready);
	ss_epoll_notify(s, ready);
	ss_ready_wake_pollers();
}

uint32_t ss_ready_events(struct ss_sock *s)
{
	unsigned r = atomic_load(&s->rdy);
	uint32_t ev = 0;

	if (ss_sock_state(s) != SS_SOCK_UPGRADED)
		return 0;
	if (r & (SS_RDY_IN | SS_RDY_RDHUP))
		ev |= EPOLLIN | EPOLLRDNORM;
	if (r & SS_RDY_OUT)
		ev |= EPOLLOUT | EPOLLWRNORM;
	if (r & SS_RDY_RDHUP)
		ev |= EPOLLRDHUP;
	if (r & SS_RDY_HUP)
		ev |= EPOLLHUP;
	/* As TCP's pending error: shown until a read, a write or SO_ERROR reported it. */
	if ((r & SS_RDY_ERR) && !atomic_load_explicit(&s->reset_taken, memory_order_relaxed))
		ev |= EPOLLERR;
	return ev;
}

/* The first mirror reference: events flow to the progress thread, the mirror shows the truth.
 * s->lock held. */
static void ready_mirror_first(struct ss_sock *s)
{
	if (s->conn && !atomic_exchange(&s->mirror_events, true)) {
		ss_tp->worker_event_users(ss_w, 1);
		ss_tp->conn_resync(s->conn);
	}
}

void ss_ready_mirror_get_locked(struct ss_sock *s)
{
	if (atomic_fetch_add(&s->mirror_refs, 1) == 0)
		ready_mirror_first(s);
}

void ss_ready_mirror_get(struct ss_sock *s)
{
	if (atomic_fetch_add(&s->mirror_refs, 1) != 0)
		return;
	/*
	 * Under the socket's lock: a failing connect drops the connection
	 * (client_drop_conn) under it, on the progress thread; read without
	 * it, s->conn could be NULL or freed between the check and the use
	 * (UBSan saw the NULL in tests/e2e/nbconnect.sh, a refused connect
	 * polled while it failed).
	 */
	pthread_mutex_lock(&s->lock);
	ready_mirror_first(s);
	pthread_mutex_unlock(&s->lock);
}

void ss_ready_mirror_put(struct ss_sock *s)
{
	if (atomic_fetch_sub(&s->mirror_refs, 1) == 1 && atomic_exchange(&s->mirror_events, false))
		ss_tp->worker_event_users(ss_w, -1);
}

/* ---- threads asleep in poll or select ---- */

/*
 * Each thread that sleeps in poll or select (or a blocking call, which waits
 * as a poll of its fd) has a wake-up eventfd of its own: a shared one would
 * let one sleeper drain a wake-up meant for another, which then sleeps on
 * (two threads of one process, a reader and a writer, hung that way). A
 * readiness change writes the fd of every thread listed asleep, once per
 * sleep. The list's lock is a leaf.
 */
struct ready_sleeper {
	int fd;
	atomic_bool woken; /* written since its last drain */
	bool listed;       /* in ready_list (under ready_list_lock) */
	struct ready_sleeper *prev, *next;
};

static atomic_int ready_poll_sleepers; /* threads in the list */
static pthread_mutex_t ready_list_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ready_sleeper *ready_list;
static __thread struct ready_sleeper *ready_me;
static pthread_key_t ready_key;
static pthread_once_t ready_key_once = PTHREAD_ONCE_INIT;

/* Takes me off the sleepers' list if it is there. Under ready_list_lock. */
static void ready_unlist(struct ready_sleeper *me)
{
	if (!me->listed)
		return;
	if (me->prev)
		me->prev->next = me->next;
	else
		ready_list = me->next;
	if (me->next)
		me->next->prev = me->prev;
	me->listed = false;
	/* Sequentially consistent, as the readiness it looks at after counting (ss_ready_conn). */
	atomic_fetch_sub(&ready_poll_sleepers, 1);
}

/*
 * A thread that ends: its eventfd goes. It may still be listed when it
 * was cancelled asleep in ppoll (a cancellation point): unlisted first.
 */
static void ready_thread_gone(void *arg)
{
	struct ready_sleeper *me = arg;

	pthread_mutex_lock(&ready_list_lock);
	ready_unlist(me);
	pthread_mutex_unlock(&ready_list_lock);
	ready_me = NULL;
	ss_private_close(me->fd);
	free(me);
}

static void ready_key_init(void)
{
	pthread_key_create(&ready_key, ready_thread_gone);
}

int ss_ready_poll_wake_fd(void)
{
	int fd;

	if (ready_me)
		return ready_me->fd;
	pthread_once(&ready_key_once, ready_key_init);
	fd = ss_private_eventfd();
	if (fd < 0)
		return -1;
	ready_me = calloc(1, sizeof(*ready_me));
	if (!ready_me) {
		ss_private_close(fd);
		return -1;
	}
	ready_me->fd = fd;
	pthread_setspecific(ready_key, ready_me);
	return fd;
}

void ss_ready_poll_sleep(int delta)
{
	struct ready_sleeper *me = ready_me;

	if (!me)
		return; /* no wake-up fd: its sleep is bounded by nothing we could wake */
	pthread_mutex_lock(&ready_list_lock);
	if (delta > 0 && !me->listed) {
		me->prev = NULL;
		me->next = ready_list;
		if (ready_list)
			ready_list->prev = me;
		ready_list = me;
		me->listed = true;
		/* Sequentially consistent, as the readiness it looks at after counting
		 * (ss_ready_conn). */
		atomic_fetch_add(&ready_poll_sleepers, 1);
	} else if (delta < 0) {
		ready_unlist(me);
	}
	pthread_mutex_unlock(&ready_list_lock);
}

void ss_ready_wake_pollers(void)
{
	uint64_t one = 1;

	if (atomic_load(&ready_poll_sleepers) <= 0)
		return;
	pthread_mutex_lock(&ready_list_lock);
	for (struct ready_sleeper *t = ready_list; t; t = t->next)
		if (!atomic_exchange(&t->woken, true) &&
		    ss_real.write(t->fd, &one, sizeof(one)) < 0) {
			/* A full counter still wakes it. */
		}
	pthread_mutex_unlock(&ready_list_lock);
}

void ss_ready_poll_drain(void)
{
	uint64_t v;

	/*
	 * Read first, then allow the next write: a waker that finds the flag
	 * still set between the two skips its write, and its change is seen
	 * by the look the sleeper takes after draining. Clearing first would
	 * let a write land just before the read, which takes it, and leave the
	 * flag set with nothing to read: the thread never woken again.
	 */
	if (ready_me && ss_real.read(ready_me->fd, &v, sizeof(v)) < 0) {
		/* Nothing written: a spurious wake-up. */
	}
	if (ready_me)
		atomic_store(&ready_me->woken, false);
}

void ss_ready_after_fork(void)
{
	struct ready_sleeper *me = ready_me;

	/* The other threads are the parent's; this one is not asleep. */
	pthread_mutex_init(&ready_list_lock, NULL);
	ready_list = NULL;
	atomic_store(&ready_poll_sleepers, 0);
	/*
	 * This thread's eventfd is the parent's thread's too (a fork copies
	 * the descriptor, not the counter): the child's wake-ups would land
	 * in the parent's sleeper, and the parent's drains take the child's.
	 * The child makes its own at its next wait.
	 */
	if (me) {
		ready_me = NULL;
		pthread_setspecific(ready_key, NULL);
		ss_private_close(me->fd);
		free(me);
	}
}

/* ---- the wait engine ---- */

/*
 * The spin budget of this thread's waits: twice the time the last wait
 * that found something took (spinning, or asleep until an event woke it:
 * a spin that long would have spared the sleep), at least 50 us; it halves
 * after a spin that found nothing, and is 0 (sleep at once) after a few of
 * those; then every 16th wait tries a short spin again. SRQSHIM_POLL_US is
 * its ceiling (0: never spin). A wait that finds something at its first
 * look, or later than the ceiling, teaches nothing.
 */
static __thread int wait_budget_us = -1;
static __thread unsigned wait_idle;

bool ss_wait_has_transport(void)
{
	return atomic_load_explicit(&ss_w, memory_order_acquire) != NULL;
}

/* Reads the clock; the call's first reading is its origin and fixes its deadline. */
static uint64_t wait_clock(struct ss_wait *wt)
{
	uint64_t now = ss_now_us();

	if (!wt->clocked) {
		wt->clocked = true;
		wt->origin_us = now;
		wt->deadline_us =
			wt->timeout_ms < 0 ? UINT64_MAX : now + (uint64_t)wt->timeout_ms * 1000;
	}
	wt->now_us = now;
	return now;
}

/* Starts a spin with the thread's budget: polls the CQs; the clock only when it spins. */
static void wait_spin_start(struct ss_wait *wt)
{
	int budget;

	if (wait_budget_us < 0)
		wait_budget_us = ss_cfg.poll_us < 100 ? ss_cfg.poll_us : 100;
	budget = wait_budget_us;
	if (budget == 0 && ss_cfg.poll_us > 0 && ++wait_idle % 16 == 0)
		budget = ss_cfg.poll_us < 50 ? ss_cfg.poll_us : 50;
	/*
	 * What the CQs hold first, even when something is ready already: a
	 * loop that always finds an event (end of file, level-triggered)
	 * must still see its grants and data arrive, as TCP's would.
	 */
	if (ss_wait_has_transport())
		ss_tp->worker_poll(atomic_load_explicit(&ss_w, memory_order_acquire));
	wt->rounds = 0;
	wt->fresh = false;
	wt->budget_us = wt->timeout_ms == 0 ? 0 : budget;
	if (wt->budget_us)
		wt->spin_end_us = wait_clock(wt) + (uint64_t)budget;
}

void ss_wait_begin(struct ss_wait *wt, int timeout_ms, unsigned sig_base)
{
	/*
	 * Once per call, never again at a resume: a handler that runs between
	 * two sleeps of one call ends it with EINTR, as it would the kernel's.
	 */
	wt->sig_seen = sig_base;
	wt->pollers = false;
	wt->sleeper = false;
	wt->slept = false;
	wt->timeout_ms = timeout_ms;
	/* A timeout of 0 is over at once, with no reading; others from the first one. */
	wt->clocked = false;
	wt->origin_us = wt->now_us = 0;
	wt->deadline_us = timeout_ms == 0 ? 0 : UINT64_MAX;
	wait_spin_start(wt);
}

void ss_wait_resume(struct ss_wait *wt)
{
	wait_spin_start(wt);
}

/*
 * One round of polling: takes what the CQs hold. Returns true while the
 * wait may go on spinning, false when it must sleep (budget spent, or no
 * transport), time out, or return EINTR (*eintr).
 */
static bool ss_wait_spin(struct ss_wait *wt, bool *eintr)
{
	struct ss_worker *w = atomic_load_explicit(&ss_w, memory_order_acquire);
	uint64_t now;

	*eintr = false;
	if (!w)
		return false;
	if (!wt->pollers) {
		ss_tp->worker_pollers(w, 1);
		wt->pollers = true;
	}
	ss_tp->worker_poll(w);
	if (ss_sig_any() != wt->sig_seen) {
		/* A handler ran: the kernel's wait would have ended with EINTR. */
		*eintr = true;
		return false;
	}
	wt->rounds++;
	if (!wt->budget_us) {
		/*
		 * No spin: a sleep comes next. The clock for a deadline (a wait
		 * whose arming keeps finding something must still see it pass)
		 * or for the budget to learn from the sleep; the time left
		 * before the sleep is taken from this reading.
		 */
		if (wt->timeout_ms > 0 || (ss_cfg.poll_us && !wt->clocked)) {
			wait_clock(wt);
			wt->fresh = true;
		}
		return false;
	}
	/* The clock only every 4th round: it may be a system call (a guest's HPET). */
	if (wt->rounds % 4 == 0) {
		now = wait_clock(wt);
		if (now >= wt->deadline_us || now >= wt->spin_end_us) {
			/* A spin that ran its budget out before the deadline found nothing. */
			if (now < wt->deadline_us)
				wait_budget_us = wait_budget_us > 8 ? wait_budget_us / 2 : 0;
			wt->fresh = true;
			return false;
		}
	}
	/* The peer, and rxe's kernel work, need the other CPU now and then. */
	if (wt->rounds % 8 == 1)
		sched_yield();
	return true;
}

/* Whether the deadline has passed, by the last clock reading (the clock may be a system call). */
static bool wait_expired(const struct ss_wait *wt)
{
	return wt->now_us >= wt->deadline_us;
}

enum ss_wait_next ss_wait_next(struct ss_wait *wt)
{
	bool eintr;

	if (wait_expired(wt))
		return SS_WAIT_DONE;
	if (ss_wait_spin(wt, &eintr))
		return SS_WAIT_LOOK;
	if (eintr)
		return SS_WAIT_EINTR;
	return wait_expired(wt) ? SS_WAIT_LOOK : SS_WAIT_SLEEP;
}

void ss_wait_hit(struct ss_wait *wt)
{
	uint64_t took;
	int b;

	/* Nothing to learn without a spin to size, or without a reading before the find. */
	if ((!wt->rounds && !wt->slept) || !ss_cfg.poll_us || !wt->clocked)
		return;
	took = ss_now_us() - wt->origin_us;
	if (took > (uint64_t)ss_cfg.poll_us)
		return;
	b = 2 * (int)took > 50 ? 2 * (int)took : 50;
	wait_budget_us = b < ss_cfg.poll_us ? b : ss_cfg.poll_us;
}

bool ss_wait_arm(struct ss_wait *wt)
{
	struct ss_worker *w = atomic_load_explicit(&ss_w, memory_order_acquire);

	if (!w)
		return true;
	if (wt->pollers) {
		ss_tp->worker_pollers(w, -1);
		wt->pollers = false;
	}
	if (!wt->sleeper) {
		ss_tp->worker_sleepers(w, 1);
		wt->sleeper = true;
	}
	wt->slept = true;
	return ss_tp->worker_arm(w) == 0;
}

void ss_wait_woke(struct ss_wait *wt)
{
	if (wt->sleeper)
		ss_tp->worker_sleepers(atomic_load_explicit(&ss_w, memory_order_acquire), -1);
	wt->sleeper = false;
}

int ss_wait_left_ms(struct ss_wait *wt)
{
	uint64_t now;

	if (wt->timeout_ms <= 0)
		return wt->timeout_ms;
	/* The reading of the step that chose to sleep, if it made one: a sleep a little longer. */
	now = wt->fresh ? wt->now_us : wait_clock(wt);
	wt->fresh = false;
	return now >= wt->deadline_us ? 0 : (int)((wt->deadline_us - now + 999) / 1000);
}

void ss_wait_end(struct ss_wait *wt)
{
	ss_wait_woke(wt);
	if (wt->pollers)
		ss_tp->worker_pollers(atomic_load_explicit(&ss_w, memory_order_acquire), -1);
	wt->pollers = false;
}
