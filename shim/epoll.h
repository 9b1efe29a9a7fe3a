/*
 * The application's epoll instances (docs/design.md, "Readiness"). Each
 * instance the application makes gets a shadow: registrations of upgraded
 * sockets live there, not in the kernel, and a ready list of them is kept
 * by whichever thread takes their completions; epoll_wait answers from it
 * first, polls the CQs itself, asks the kernel about the other fds at a
 * bounded rate, and sleeps in the kernel on a set that also holds the
 * devices' completion channels and a wake-up fd. Registrations the shadow
 * cannot answer exactly (EPOLLEXCLUSIVE, an instance we did not make, or
 * one that is nested in another or polled) stay in the kernel, where the
 * readiness mirror answers them.
 */
#ifndef SS_SHIM_EPOLL_H
#define SS_SHIM_EPOLL_H

#include <signal.h>
#include <stdbool.h>
#include <sys/epoll.h>

struct ss_sock;

/* The application made epoll instance epfd. */
void ss_epoll_created(int epfd);

/* The application's fd is closed: when it named an instance, that name goes. */
void ss_epoll_closed(int fd);

/* newfd names what oldfd names (the dup family), when that is an instance. */
void ss_epoll_dup(int oldfd, int newfd);

/* True when fd names an instance the application made. */
bool ss_epoll_is_ours(int fd);

/*
 * An instance is nested in another, or polled with poll or select: from now
 * on it answers nothing in user space (its registrations move to the kernel).
 */
void ss_epoll_to_kernel(int epfd);

/* The application registered (ADD) or removed (DEL) one of its own fds in epfd's kernel set. */
void ss_epoll_count_kernel(int epfd, int op);

/* epoll_ctl for a tracked socket s; returns 0 or -errno as epoll_ctl(2). */
int ss_epoll_ctl(int epfd, int op, int fd, struct ss_sock *s, struct epoll_event *ev);

/*
 * epoll_wait/epoll_pwait/epoll_pwait2 on epfd. *handled false: not ours
 * (make the real call). Returns the events or -errno.
 */
int ss_epoll_wait(int epfd, struct epoll_event *evs, int max, int timeout_ms, const sigset_t *mask,
		  bool *handled);

/* The connection of s reports ready (SS_RDY_*, EDGE: new data): its registrations learn. */
void ss_epoll_notify(struct ss_sock *s, unsigned ready);

/* s is upgraded: its registrations move into the shadows that can answer them. */
void ss_epoll_upgraded(struct ss_sock *s);

/* s is no longer upgraded: its shadow registrations go back to the kernel (ss_put_on_names
 * re-adds). */
void ss_epoll_leaving(struct ss_sock *s);

/* The last name of s is closed: its registrations go. */
void ss_epoll_sock_gone(struct ss_sock *s);

/* The object behind fd (a name of s) changes: its kernel registrations go, then come back. */
void ss_epoll_drop_kernel(struct ss_sock *s, int fd);
void ss_epoll_readd_kernel(struct ss_sock *s, int fd);

/* In a forked child: the locks are made anew. */
void ss_epoll_after_fork(void);

#endif
