/*
 * The operator's channel into a process: `srqshim-ctl downgrade --pid PID
 * [--fd FD]` asks it to move upgraded connections back to TCP (down.c). A
 * datagram socket in the abstract namespace of the process's network
 * namespace, named "srqshim.PID", made with the worker and watched by the
 * progress thread. A request is one line, "downgrade FD" (FD -1: every
 * upgraded connection), or "handover SERIAL" (a forked child's exec asks
 * for the connection it inherited: inherit.c; the TCP socket follows in a
 * message "fd" with SCM_RIGHTS, or "error TEXT"); the answer, to the
 * sender's address, is "ok N" (N connections start their move) or "error
 * TEXT"; only the process's own
 * user and root are obeyed (SO_PASSCRED). Only the progress
 * thread reads the socket; the moves run there too (decide.c), as the
 * sockets' background work.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/un.h>
#include <unistd.h>

#include "shim/ctlchan.h"
#include "shim/real.h"
#include "shim/shim.h"
#include "transport/log.h"

static int ctlchan_fd = -1;
static struct ss_watch ctlchan_watch;
static int ctlchan_count; /* sockets asked by the request being answered (progress thread) */

/* Marks s for a downgrade by the progress thread; counts it, and one moving already. */
static void ctlchan_want(struct ss_sock *s)
{
	int st = ss_sock_state(s);

	if (st == SS_SOCK_FALLBACK && (s->peer_caps & SS_CAP_SWITCH))
		ctlchan_count++; /* the peer started the move (or the handshake's fallback runs) */
	if (st != SS_SOCK_UPGRADED || !(s->peer_caps & SS_CAP_SWITCH))
		return;
	atomic_store(&s->down_wanted, true);
	ss_bg_kick(s, ss_now_ms());
	ctlchan_count++;
}

int ss_send_fd(int sock, const struct sockaddr_un *to, socklen_t to_len, const char *text, int fd)
{
	union {
		struct cmsghdr h;
		char space[CMSG_SPACE(sizeof(int))];
	} u;
	struct iovec v = {(void *)text, strlen(text)};
	struct msghdr m = {
		.msg_name = (void *)to, .msg_namelen = to_len, .msg_iov = &v, .msg_iovlen = 1};

	if (fd >= 0) {
		struct cmsghdr *c;

		m.msg_control = &u;
		m.msg_controllen = sizeof(u);
		c = CMSG_FIRSTHDR(&m);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof(int));
	}
	if (sock < 0)
		return -EBADF;
	return ss_real.sendmsg(sock, &m, MSG_DONTWAIT | MSG_NOSIGNAL) < 0 ? -errno : 0;
}

int ss_ctlchan_send(const struct sockaddr_un *to, socklen_t to_len, const char *text, int fd)
{
	return ss_send_fd(ctlchan_fd, to, to_len, text, fd);
}

/*
 * "handover SERIAL": a forked child's exec asks for a connection it
 * inherited (inherit.c); the TCP socket goes to its address (from) once moved.
 */
static int ctlchan_handover(const char *arg, const struct sockaddr_un *from, socklen_t flen,
			    char *answer, size_t len)
{
	char *end;
	unsigned long long serial = strtoull(arg, &end, 10);
	struct ss_sock *s;

	if (end == arg || (*end && *end != '\n')) {
		snprintf(answer, len, "error bad serial");
		return -EINVAL;
	}
	ctlchan_count = 0;
	ss_test_delay(SS_TP_HANDOVER);
	s = ss_inherit_find(serial);
	if (s) {
		ctlchan_want(s);
		if (ctlchan_count)
			ss_inherit_heir(s, from, flen);
	}
	ss_sock_put(s);
	snprintf(answer, len, "ok %d", ctlchan_count);
	return 0;
}

static int ctlchan_request(const char *req, const struct sockaddr_un *from, socklen_t flen,
			   char *answer, size_t len)
{
	char *end;
	long fd;

	if (strncmp(req, "handover ", 9) == 0)
		return ctlchan_handover(req + 9, from, flen, answer, len);
	if (strncmp(req, "downgrade ", 10) != 0) {
		snprintf(answer, len, "error unknown request");
		return -EINVAL;
	}
	fd = strtol(req + 10, &end, 10);
	if (end == req + 10 || (*end && *end != '\n') || fd < -1 || fd > 0x7fffffff) {
		snprintf(answer, len, "error bad fd");
		return -EINVAL;
	}
	ctlchan_count = 0;
	if (fd < 0) {
		ss_sock_for_each_held(ctlchan_want);
	} else {
		struct ss_sock *s = ss_sock_get((int)fd);

		if (s)
			ctlchan_want(s);
		ss_sock_put(s);
	}
	snprintf(answer, len, "ok %d", ctlchan_count);
	return 0;
}

static void ctlchan_cb(struct ss_watch *wt, unsigned revents)
{
	(void)wt;
	(void)revents;
	for (;;) {
		struct sockaddr_un from;
		char req[64], answer[64];
		union {
			struct cmsghdr h;
			char space[CMSG_SPACE(sizeof(struct ucred))];
		} u;
		struct iovec v = {req, sizeof(req) - 1};
		struct msghdr m = {.msg_name = &from,
				   .msg_namelen = sizeof(from),
				   .msg_iov = &v,
				   .msg_iovlen = 1,
				   .msg_control = &u,
				   .msg_controllen = sizeof(u)};
		struct cmsghdr *c;
		struct ucred cred = {.uid = (uid_t)-1};
		ssize_t n = recvmsg(ctlchan_fd, &m, MSG_DONTWAIT);
		socklen_t flen;

		if (n < 0)
			return;
		req[n] = 0;
		flen = m.msg_namelen;
		c = CMSG_FIRSTHDR(&m);
		if (c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS)
			memcpy(&cred, CMSG_DATA(c), sizeof(cred));
		/* The process's own user and root only: the kernel vouches for the sender. */
		if (cred.uid != geteuid() && cred.uid != 0)
			snprintf(answer, sizeof(answer), "error not allowed");
		else
			ctlchan_request(req, &from, flen, answer, sizeof(answer));
		ss_log_info("operator: \"%.*s\": %s", (int)strcspn(req, "\n"), req, answer);
		if (flen > sizeof(sa_family_t))
			sendto(ctlchan_fd, answer, strlen(answer), MSG_DONTWAIT,
			       (struct sockaddr *)&from, flen);
	}
}

void ss_ctlchan_start(void)
{
	struct sockaddr_un a;
	socklen_t alen;
	int fd;

	if (ctlchan_fd >= 0 || !ss_w)
		return;
	alen = ss_ctlchan_addr((int)getpid(), &a);
	fd = ss_real.socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return;
	if (bind(fd, (struct sockaddr *)&a, alen) != 0) {
		ss_log_warn("no operator channel: %s", strerror(errno));
		ss_real.close(fd);
		return;
	}
	/* Above the application's fd numbers, as the shim's other private fds. */
	int pfd = ss_private_fd(fd);

	ss_real.close(fd);
	if (pfd < 0)
		return;
	fd = pfd;
	int on = 1;

	ss_real.setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &on, sizeof(on));
	ctlchan_watch.cb = ctlchan_cb;
	ctlchan_watch.fd = -1;
	if (ss_tp->worker_watch(ss_w, &ctlchan_watch, fd, EPOLLIN) != 0) {
		ss_private_close(fd);
		return;
	}
	ctlchan_fd = fd;
}

void ss_ctlchan_after_fork(void)
{
	/* The parent's name: the child makes its own with its worker. */
	if (ctlchan_fd >= 0)
		ss_private_close(ctlchan_fd);
	ctlchan_fd = -1;
}
