/*
 * The worker's own epoll set, through the kernel directly: inside a
 * preloaded process these libc names are the shim's (which answers the
 * application's epoll instances in user space), and the progress thread's
 * set is none of the application's business.
 */
#ifndef SS_TRANSPORT_SYS_H
#define SS_TRANSPORT_SYS_H

#include <sys/epoll.h>
#include <sys/syscall.h>
#include <unistd.h>

static inline int ss_sys_epoll_create(void)
{
	return (int)syscall(SYS_epoll_create1, EPOLL_CLOEXEC);
}

static inline int ss_sys_epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev)
{
	return (int)syscall(SYS_epoll_ctl, epfd, op, fd, ev);
}

static inline int ss_sys_epoll_wait(int epfd, struct epoll_event *evs, int max, int timeout_ms)
{
	return (int)syscall(SYS_epoll_pwait, epfd, evs, max, timeout_ms, NULL, 8);
}

#endif
