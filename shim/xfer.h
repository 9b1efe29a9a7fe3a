/* sendfile, splice, sendmmsg and recvmmsg on sockets the shim carries (xfer.c). */
#ifndef SS_SHIM_XFER_H
#define SS_SHIM_XFER_H

#include <fcntl.h>
#include <stdbool.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>

/*
 * Each: *handled false when the fd is not the shim's (the caller makes the
 * real call); else the result, or -errno.
 */
ssize_t ss_xfer_sendfile(int out, int in, off_t *offset, size_t count, bool *handled);
ssize_t ss_xfer_splice(int in, loff_t *off_in, int out, loff_t *off_out, size_t len, unsigned flags,
		       bool *handled);
int ss_xfer_sendmmsg(int fd, struct mmsghdr *v, unsigned n, int flags, bool *handled);
int ss_xfer_recvmmsg(int fd, struct mmsghdr *v, unsigned n, int flags, struct timespec *timeout,
		     bool *handled);

#endif
