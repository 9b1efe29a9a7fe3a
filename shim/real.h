/* The libc functions the shim interposes, resolved with dlsym(RTLD_NEXT). */
#ifndef SS_SHIM_REAL_H
#define SS_SHIM_REAL_H

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

/* X(name, return type, parameter list) for every interposed function. */
#define SS_REAL_FUNCS(X)                                                                           \
	X(socket, int, (int, int, int))                                                            \
	X(bind, int, (int, const struct sockaddr *, socklen_t))                                    \
	X(listen, int, (int, int))                                                                 \
	X(connect, int, (int, const struct sockaddr *, socklen_t))                                 \
	X(accept, int, (int, struct sockaddr *, socklen_t *))                                      \
	X(accept4, int, (int, struct sockaddr *, socklen_t *, int))                                \
	X(read, ssize_t, (int, void *, size_t))                                                    \
	X(write, ssize_t, (int, const void *, size_t))                                             \
	X(readv, ssize_t, (int, const struct iovec *, int))                                        \
	X(writev, ssize_t, (int, const struct iovec *, int))                                       \
	X(recv, ssize_t, (int, void *, size_t, int))                                               \
	X(send, ssize_t, (int, const void *, size_t, int))                                         \
	X(recvfrom, ssize_t, (int, void *, size_t, int, struct sockaddr *, socklen_t *))           \
	X(sendto, ssize_t, (int, const void *, size_t, int, const struct sockaddr *, socklen_t))   \
	X(recvmsg, ssize_t, (int, struct msghdr *, int))                                           \
	X(sendmsg, ssize_t, (int, const struct msghdr *, int))                                     \
	X(sendmmsg, int, (int, struct mmsghdr *, unsigned, int))                                   \
	X(recvmmsg, int, (int, struct mmsghdr *, unsigned, int, struct timespec *))                \
	X(sendfile, ssize_t, (int, int, off_t *, size_t))                                          \
	X(splice, ssize_t, (int, loff_t *, int, loff_t *, size_t, unsigned))                       \
	X(close, int, (int))                                                                       \
	X(shutdown, int, (int, int))                                                               \
	X(dup, int, (int))                                                                         \
	X(dup2, int, (int, int))                                                                   \
	X(dup3, int, (int, int, int))                                                              \
	X(fcntl, int, (int, int, ...))                                                             \
	X(ioctl, int, (int, unsigned long, ...))                                                   \
	X(getsockopt, int, (int, int, int, void *, socklen_t *))                                   \
	X(setsockopt, int, (int, int, int, const void *, socklen_t))                               \
	X(epoll_ctl, int, (int, int, int, struct epoll_event *))                                   \
	X(poll, int, (struct pollfd *, nfds_t, int))                                               \
	X(getsockname, int, (int, struct sockaddr *, socklen_t *))                                 \
	X(getpeername, int, (int, struct sockaddr *, socklen_t *))                                 \
	X(close_range, int, (unsigned, unsigned, int))                                             \
	X(sigaction, int, (int, const struct sigaction *, struct sigaction *))                     \
	X(_exit, void, (int))                                                                      \
	X(_Exit, void, (int))                                                                      \
	X(execve, int, (const char *, char *const[], char *const[]))                               \
	X(execv, int, (const char *, char *const[]))                                               \
	X(execvp, int, (const char *, char *const[]))                                              \
	X(execvpe, int, (const char *, char *const[], char *const[]))                              \
	X(fexecve, int, (int, char *const[], char *const[]))                                       \
	X(posix_spawn, int,                                                                        \
	  (pid_t *, const char *, const posix_spawn_file_actions_t *, const posix_spawnattr_t *,   \
	   char *const[], char *const[]))                                                          \
	X(posix_spawnp, int,                                                                       \
	  (pid_t *, const char *, const posix_spawn_file_actions_t *, const posix_spawnattr_t *,   \
	   char *const[], char *const[]))                                                          \
	X(posix_spawn_file_actions_init, int, (posix_spawn_file_actions_t *))                      \
	X(posix_spawn_file_actions_destroy, int, (posix_spawn_file_actions_t *))                   \
	X(posix_spawn_file_actions_adddup2, int, (posix_spawn_file_actions_t *, int, int))         \
	X(fdopen, FILE *, (int, const char *))                                                     \
	X(vdprintf, int, (int, const char *, va_list))                                             \
	X(__vdprintf_chk, int, (int, int, const char *, va_list))                                  \
	X(epoll_create, int, (int))                                                                \
	X(epoll_create1, int, (int))                                                               \
	X(epoll_wait, int, (int, struct epoll_event *, int, int))                                  \
	X(epoll_pwait, int, (int, struct epoll_event *, int, int, const sigset_t *))               \
	X(ppoll, int, (struct pollfd *, nfds_t, const struct timespec *, const sigset_t *))        \
	X(select, int, (int, fd_set *, fd_set *, fd_set *, struct timeval *))                      \
	X(pselect, int,                                                                            \
	  (int, fd_set *, fd_set *, fd_set *, const struct timespec *, const sigset_t *))          \
	X(__read_chk, ssize_t, (int, void *, size_t, size_t))                                      \
	X(__recv_chk, ssize_t, (int, void *, size_t, size_t, int))                                 \
	X(__recvfrom_chk, ssize_t,                                                                 \
	  (int, void *, size_t, size_t, int, struct sockaddr *, socklen_t *))

#define SS_REAL_DECLARE(name, ret, args) ret(*name) args;
struct ss_real {
	SS_REAL_FUNCS(SS_REAL_DECLARE)
};
#undef SS_REAL_DECLARE

/* Resolved on first use; every entry is non-NULL afterwards (or the process aborts). */
extern struct ss_real ss_real;

/* Fills ss_real; safe to call more than once and from any thread. */
void ss_real_init(void);

#endif
