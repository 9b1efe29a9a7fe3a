/* The data path of tracked sockets (io.c), for the libc entry points. */
#ifndef SS_SHIM_IO_H
#define SS_SHIM_IO_H

#include <stdbool.h>
#include <sys/types.h>
#include <sys/uio.h>

struct ss_sock;

/* True for a TCP socket of the kind the shim may upgrade. */
bool ss_is_tcp(int domain, int type, int proto);

/* The entry for fd on the I/O path (a reference taken), classifying a never-seen fd. */
struct ss_sock *ss_io_get(int fd);

/* The bytes an iovec of n entries asks for (SIZE_MAX when more: never 0 by wrapping). */
size_t ss_iov_total(const struct iovec *iov, int n);

/*
 * A read-like call on fd. *handled false: fd is not (or no longer) ours and
 * the caller makes the real call; else the result, or -errno.
 */
ssize_t ss_io_recv(int fd, const struct iovec *iov, int n, int flags, bool *handled);

/*
 * A call that got err from fd but returns success (it moved something
 * before): the error is reported again by the next call, as the kernel
 * keeps a socket's pending error (only a reset is kept; others recur).
 */
void ss_io_error_back(int fd, int err);

/* True the first time the reset of s is reported (as TCP's pending error). */
bool ss_io_take_reset(struct ss_sock *s);

/* Untracks s when it is plain for good (its calls then cost one table read). */
void ss_io_forget_if_plain(struct ss_sock *s);

/* The application set SO_RCVTIMEO (out: SO_SNDTIMEO) on s: waits use the new value. */
void ss_io_timeo_changed(struct ss_sock *s, bool out);

/*
 * Whether the bytes of fd go through the shim (reading: also a plain
 * connection that still has handshake messages to take off its head).
 * A call that may not be split into reads and writes asks first.
 */
bool ss_io_ours(int fd, bool reading);

/*
 * Decides an accepted connection (s, its fd) as a write does, before the
 * write or a shutdown: the client's HELLO has a bounded time to come; none
 * in time: plain, and a late HELLO is taken out of the stream.
 */
void ss_io_decide_for_write(struct ss_sock *s, int fd);

/* A write-like call on fd; as ss_io_recv(). */
ssize_t ss_io_send(int fd, const struct iovec *iov, int n, int flags, bool *handled);

/*
 * The queue ioctls of an upgraded connection (FIONREAD/SIOCINQ, SIOCOUTQ,
 * SIOCOUTQNSD, SIOCATMARK): the count in *val, after a look at the CQs.
 * *handled false: not an upgraded connection, the caller makes the real
 * call. Returns 0.
 */
int ss_io_queue_ioctl(int fd, unsigned long req, int *val, bool *handled);

#endif
