/*
 * Readiness of upgraded sockets for the application's wait calls
 * (docs/design.md, "Readiness"). A connection tells its socket what it
 * shows; the socket passes that on to whoever can see it: the epoll
 * instances it is registered in (answered in user space, epoll.c), threads
 * in poll or select (mux.c), and the readiness mirror on the application's
 * fd when something waits on it in the kernel.
 */
#ifndef SS_SHIM_READY_H
#define SS_SHIM_READY_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/epoll.h>

struct ss_sock;

/* The connection's readiness hook (transport -> shim): called with the connection's lock held. */
void ss_ready_conn(void *arg, unsigned ready);

/*
 * What s shows now as epoll events (EPOLLIN, EPOLLOUT, EPOLLRDHUP,
 * EPOLLHUP, EPOLLERR), as a TCP socket would; 0 for a socket that is not
 * upgraded. No lock.
 */
uint32_t ss_ready_events(struct ss_sock *s);

/*
 * Something waits on the application's fd in the kernel (a blocking call,
 * a registration the kernel answers): the mirror must show the truth, and
 * the progress thread must take CQ events. get: from now on; put: no more.
 */
void ss_ready_mirror_get(struct ss_sock *s);        /* takes s->lock: never with it held */
void ss_ready_mirror_get_locked(struct ss_sock *s); /* s->lock held */
void ss_ready_mirror_put(struct ss_sock *s);

/*
 * Waits of the application (epoll, poll, select) share one engine: the
 * waiting thread polls the CQs itself, spinning for a budget that adapts to
 * how often spinning found work, then arms them and sleeps in the kernel.
 */
struct ss_wait {
	/*
	 * The clock is read only when the wait needs it (a spin, a sleep with
	 * a timeout, learning the budget): it may be a system call (a guest's
	 * HPET). Its first reading is the call's origin and fixes the deadline.
	 */
	uint64_t origin_us;   /* the first clock reading of the call */
	uint64_t deadline_us; /* UINT64_MAX: none, or not yet read */
	uint64_t spin_end_us;
	uint64_t now_us;   /* the last clock reading (read every 4th round of a spin) */
	int timeout_ms;    /* as the application gave it (-1: none) */
	int budget_us;     /* this spin's budget (0: sleep at once) */
	unsigned sig_seen; /* signal handlers run by this thread when the call began */
	bool clocked;      /* origin_us and deadline_us are set */
	bool fresh;        /* now_us was read by the step that chose to sleep */
	bool pollers;      /* counted in the worker's pollers */
	bool sleeper;      /* counted in the worker's sleepers (asleep on CQ events) */
	bool slept;        /* it slept in the kernel at least once */
	unsigned rounds;
};

/*
 * Begins a wait of timeout_ms (-1: none). sig_base: ss_sig_any() when the
 * application's call began; any handler run since ends the wait (EINTR).
 */
void ss_wait_begin(struct ss_wait *wt, int timeout_ms, unsigned sig_base);

/* After a sleep that brought the caller nothing: spins again, same deadline. */
void ss_wait_resume(struct ss_wait *wt);

/* What a wait does after a look that found nothing. */
enum ss_wait_next {
	SS_WAIT_LOOK,  /* look again (it spins, or its time is up: one last look) */
	SS_WAIT_SLEEP, /* arm (ss_wait_arm) and sleep in the kernel */
	SS_WAIT_DONE,  /* timed out */
	SS_WAIT_EINTR, /* a signal handler ran: EINTR */
};

/* One step of the wait after a look that found nothing (spins one round when it may). */
enum ss_wait_next ss_wait_next(struct ss_wait *wt);

/*
 * The wait found what it waited for: the budget learns how long that took,
 * spinning or asleep (a sleep that a spin of that length would have saved).
 */
void ss_wait_hit(struct ss_wait *wt);

/*
 * The wait is about to sleep in the kernel, on the channels too: counts
 * it among the worker's sleepers (whoever takes a CQ event arms the CQs
 * again while it sleeps: an event that made nothing ready for it must not
 * leave later completions without one) and arms the CQs. Returns false
 * when something came meanwhile (look again instead of sleeping).
 */
bool ss_wait_arm(struct ss_wait *wt);

/* The kernel sleep after ss_wait_arm is over: no longer a sleeper. */
void ss_wait_woke(struct ss_wait *wt);

/*
 * Milliseconds left to sleep: -1 for no limit, 0 for a timeout of 0; for a
 * timeout > 0, from the clock (the reading of the step that chose to sleep,
 * if it made one).
 */
int ss_wait_left_ms(struct ss_wait *wt);

/* The wait ends (whatever the outcome). */
void ss_wait_end(struct ss_wait *wt);

/* True when the CQs should be polled at all (a transport is loaded). */
bool ss_wait_has_transport(void);

/*
 * Threads asleep in poll or select: readiness changes wake them
 * (ss_ready_wake_pollers), each through its own eventfd
 * (ss_ready_poll_wake_fd, made on first use; -1 if none could be made).
 * A sleeper counts itself (ss_ready_poll_sleep(1)) before its last look,
 * and drains its fd when the kernel says it was written.
 */
void ss_ready_poll_sleep(int delta);
void ss_ready_wake_pollers(void);
int ss_ready_poll_wake_fd(void);
void ss_ready_poll_drain(void);

/* In a forked child: the parent's other threads sleep nowhere here. */
void ss_ready_after_fork(void);

#endif
