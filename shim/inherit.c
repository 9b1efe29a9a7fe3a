/*
 * An upgraded connection that a forked child holds too (docs/protocol.md,
 * section 4, "A connection held by a forked child"). An inetd-style server
 * forks, the child puts the connection on its stdin and stdout and execs a
 * handler, and the parent closes its copy. The RDMA side is the parent's
 * (the child's copy is FOREIGN: never its verbs objects), and the child's
 * names are the application's end of the parent's socketpair.
 *
 * Parent: a close of the last name does not end the stream while another
 * process holds the application's end (our end shows no hang-up): the
 * connection is kept, with a reference, on the kept list, and the
 * progress thread looks at the pair every KEPT_LOOK_MS. When every holder
 * has closed, the stream ends as a close ends it. When the child asks
 * ("handover SERIAL" on the operator channel, from a datagram socket of
 * its own), the connection moves back to TCP (down.c), and at the end of
 * the move the TCP socket goes to that socket (SCM_RIGHTS). The end of any
 * move in a process that forked also sends it over our end of the pair,
 * for a child that asks later (not possible once the pair shows the end of
 * stream: our end is shut then).
 *
 * Child, at exec: for each FOREIGN connection whose name the new image
 * inherits, it asks the owner and takes the TCP socket from the answer (or
 * off the pair) and puts it on its names, so the new image gets a TCP
 * socket with the stream intact.
 *
 * Locks: inherit_lock guards the kept list and is a leaf (no other lock is
 * taken under it). A kept entry has no names, so no application call
 * reaches it: the progress thread (its looks, its move, its end) and, at
 * exit, the exiting thread after taking it off the list are the only ones
 * to lock it; the progress thread's ss_sock_finish may therefore take its
 * lock with a blocking call.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "shim/ctlchan.h"
#include "shim/real.h"
#include "shim/shim.h"
#include "transport/log.h"

/* How often the progress thread looks whether a kept connection's other holders closed. */
#define KEPT_LOOK_MS 100

static pthread_mutex_t inherit_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ss_sock *inherit_kept; /* the kept list (inherit_lock) */
/* This process forked while it had connections: a close looks for other holders. */
static atomic_bool inherit_forked;

void ss_inherit_forked(void)
{
	atomic_store(&inherit_forked, true);
}

/* Whether every other holder of the application's end has closed it (lock held). */
static bool inherit_pair_alone(struct ss_sock *s)
{
	struct pollfd p = {.fd = s->shim_fd, .events = POLLRDHUP};

	/* Our own full shutdown (the mirror showing a hang-up) hides theirs: alone then. */
	if (s->shim_fd < 0 || s->hup_shown)
		return true;
	return ss_real.poll(&p, 1, 0) != 0 && (p.revents & (POLLHUP | POLLERR | POLLNVAL));
}

bool ss_inherit_keep(struct ss_sock *s)
{
	bool keep;

	if (!atomic_load(&inherit_forked))
		return false;
	pthread_mutex_lock(&s->lock);
	keep = ss_sock_state(s) == SS_SOCK_UPGRADED && s->conn && !inherit_pair_alone(s) &&
	       ss_bg_start(s) == 0;
	pthread_mutex_unlock(&s->lock);
	if (!keep)
		return false;
	atomic_fetch_add(&s->refs, 1);
	pthread_mutex_lock(&inherit_lock);
	s->kept_next = inherit_kept;
	inherit_kept = s;
	pthread_mutex_unlock(&inherit_lock);
	atomic_store_explicit(&s->kept, true, memory_order_release);
	ss_log_info("a closed connection stays: another process holds it (a forked child)");
	ss_bg_kick(s, ss_deadline_in(KEPT_LOOK_MS));
	return true;
}

/* Takes s off the kept list; true when it was there (its reference is the caller's now). */
static bool inherit_unkeep(struct ss_sock *s)
{
	bool was = false;

	pthread_mutex_lock(&inherit_lock);
	for (struct ss_sock **p = &inherit_kept; *p; p = &(*p)->kept_next)
		if (*p == s) {
			*p = s->kept_next;
			was = true;
			break;
		}
	pthread_mutex_unlock(&inherit_lock);
	atomic_store_explicit(&s->kept, false, memory_order_release);
	return was;
}

void ss_inherit_bg_step(struct ss_sock *s)
{
	int st = ss_sock_state(s);
	bool alone;

	if (st == SS_SOCK_FALLBACK) {
		ss_bg_kick(s, ss_deadline_in(KEPT_LOOK_MS)); /* a move runs: its end decides */
		return;
	}
	if (st == SS_SOCK_UPGRADED) {
		if (pthread_mutex_trylock(&s->lock) != 0) {
			ss_bg_kick(s, ss_deadline_in(1));
			return;
		}
		alone = inherit_pair_alone(s);
		pthread_mutex_unlock(&s->lock);
		if (!alone) {
			ss_bg_kick(s, ss_deadline_in(KEPT_LOOK_MS));
			return;
		}
	}
	/*
	 * Moved (its TCP socket went to the child that asked, or over the
	 * pair), or every holder closed: it ends here.
	 */
	if (!inherit_unkeep(s))
		return;
	if (st == SS_SOCK_UPGRADED)
		ss_sock_finish(s, false);
	ss_sock_put(s);
}

void ss_inherit_leaving(void)
{
	for (;;) {
		struct ss_sock *s;

		pthread_mutex_lock(&inherit_lock);
		s = inherit_kept;
		if (s)
			inherit_kept = s->kept_next;
		pthread_mutex_unlock(&inherit_lock);
		if (!s)
			return;
		/* Nobody carries it once this process is gone: its stream ends as a close's. */
		atomic_store_explicit(&s->kept, false, memory_order_release);
		ss_sock_finish(s, true);
		ss_sock_put(s);
	}
}

/* The entry with serial, kept or named (progress thread), with a reference; or NULL. */
static uint64_t inherit_wanted_serial;
static struct ss_sock *inherit_found;

static void inherit_match(struct ss_sock *s)
{
	if (!inherit_found && s->serial == inherit_wanted_serial && ss_sock_tryget(s))
		inherit_found = s;
}

struct ss_sock *ss_inherit_find(uint64_t serial)
{
	inherit_found = NULL;
	inherit_wanted_serial = serial;
	pthread_mutex_lock(&inherit_lock);
	for (struct ss_sock *s = inherit_kept; s && !inherit_found; s = s->kept_next)
		inherit_match(s);
	pthread_mutex_unlock(&inherit_lock);
	if (!inherit_found)
		ss_sock_for_each_held(inherit_match);
	return inherit_found;
}

/* Where a child that asked waits for the TCP socket: its datagram socket's address. */
struct ss_heir {
	struct sockaddr_un addr;
	socklen_t len;
};

void ss_inherit_heir(struct ss_sock *s, const struct sockaddr_un *from, socklen_t flen)
{
	struct ss_heir *h = malloc(sizeof(*h));

	if (!h || flen <= sizeof(sa_family_t) || flen > sizeof(h->addr)) {
		free(h);
		return;
	}
	memcpy(&h->addr, from, flen);
	h->len = flen;
	free(atomic_exchange(&s->heir, h)); /* the last to ask gets it */
}

void ss_inherit_refuse(struct ss_sock *s)
{
	struct ss_heir *h = atomic_exchange(&s->heir, NULL);

	if (h)
		ss_ctlchan_send(&h->addr, h->len, "error it cannot move", -1);
	free(h);
}

void ss_inherit_pass(struct ss_sock *s, int tcp)
{
	struct ss_heir *h = atomic_exchange(&s->heir, NULL);

	if (h) {
		int r = ss_ctlchan_send(&h->addr, h->len, "fd", tcp);

		if (r != 0)
			ss_log_error("a connection moved for a forked child's exec could not be "
				     "sent to it: %s",
				     strerror(-r));
		free(h);
	}
	if (!atomic_load(&inherit_forked) || s->shim_fd < 0)
		return;
	/*
	 * A child that asks only later finds it on the pair (unless the pair
	 * shows the end of stream already: our end is shut then, and the
	 * send fails; that child is told nothing moves and gives up).
	 */
	ss_send_fd(s->shim_fd, NULL, 0, "f", tcp);
}

/* ---- the child ---- */

/*
 * Asks owner to move its connection serial back to TCP, from a datagram
 * socket of its own (autobind), where the answer and then the TCP socket
 * come. Returns that socket, or -1.
 */
static int inherit_ask(int owner, uint64_t serial)
{
	struct sockaddr_un to, me = {.sun_family = AF_UNIX};
	socklen_t to_len = ss_ctlchan_addr(owner, &to);
	char req[64];
	int fd;

	fd = ss_real.socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	snprintf(req, sizeof(req), "handover %llu", (unsigned long long)serial);
	if (bind(fd, (struct sockaddr *)&me, sizeof(sa_family_t)) != 0 ||
	    ss_real.sendto(fd, req, strlen(req), 0, (struct sockaddr *)&to, to_len) < 0) {
		ss_log_warn("cannot ask process %d, which carries an inherited connection: %s",
			    owner, strerror(errno));
		ss_real.close(fd);
		return -1;
	}
	return fd;
}

/*
 * One message from fd (without waiting): the fd it carries (SCM_RIGHTS)
 * goes to *got. Returns the bytes read, 0 at the end, -1 with errno.
 */
static ssize_t inherit_recv(int fd, char *buf, size_t len, int *got)
{
	union {
		struct cmsghdr h;
		char space[CMSG_SPACE(sizeof(int))];
	} u;
	struct iovec v = {buf, len};
	struct msghdr m = {
		.msg_iov = &v, .msg_iovlen = 1, .msg_control = &u, .msg_controllen = sizeof(u)};
	ssize_t n = ss_real.recvmsg(fd, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
	struct cmsghdr *c = n > 0 ? CMSG_FIRSTHDR(&m) : NULL;

	if (c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
		memcpy(got, CMSG_DATA(c), sizeof(int));
	return n;
}

/*
 * Takes the TCP socket: from the owner's answers on ask (-1: none), or off
 * the application's end app (a move before we asked), until end (ms).
 * Returns it, or -1 (the owner says nothing moves, or the time is up).
 */
static int inherit_take(int app, int ask, uint64_t end)
{
	bool pair_open = true, coming = ask >= 0;

	for (;;) {
		char buf[64];
		int got = -1;
		ssize_t n;
		int64_t left;

		/* The mirror's tokens come before a socket on the pair: read past them. */
		while (pair_open && got < 0 && (n = inherit_recv(app, buf, sizeof(buf), &got)) != 0)
			if (n < 0 && errno != EINTR)
				break;
		if (got < 0 && pair_open && n == 0)
			pair_open = false;
		while (coming && got < 0 &&
		       (n = inherit_recv(ask, buf, sizeof(buf) - 1, &got)) > 0) {
			buf[n] = 0;
			/* "ok 0" or "error ...": nothing will come from the owner. */
			if (strcmp(buf, "ok 0") == 0 || strncmp(buf, "error", 5) == 0)
				coming = false;
		}
		if (got >= 0)
			return got;
		left = (int64_t)(end - ss_now_ms());
		if (!coming || left <= 0)
			return -1;
		struct pollfd p[2] = {{.fd = pair_open ? app : -1, .events = POLLIN},
				      {.fd = ask, .events = POLLIN}};

		ss_real.poll(p, 2, (int)left);
	}
}

static void inherit_exec_one(struct ss_sock *s)
{
	int ask, tcp;

	if (ss_sock_state(s) != SS_SOCK_FOREIGN || s->owner <= 0 || s->n_fds == 0 ||
	    !ss_image_inherits(s))
		return;
	ask = inherit_ask(s->owner, s->serial);
	tcp = inherit_take(s->fds[0], ask, ss_deadline_in(2 * ss_cfg.linger_ms));
	if (ask >= 0)
		ss_real.close(ask);
	if (tcp < 0) {
		/*
		 * Its stream is lost to the new program: an unconnected socket
		 * says so (reads ENOTCONN, writes EPIPE), where the pair's end
		 * would read the mirror's tokens as bytes.
		 */
		ss_log_error(
			"fd %d: the new program gets a socket that is not connected (process %d, "
			"which carries the connection, did not move it back to TCP in time)",
			s->fds[0], s->owner);
		tcp = ss_real.socket(s->domain, SOCK_STREAM, 0);
		if (tcp < 0)
			return;
	} else {
		ss_log_info("fd %d: an inherited connection moved back to TCP for the new program",
			    s->fds[0]);
	}
	ss_put_on_names(s, tcp);
	ss_sock_set_state(s, SS_SOCK_PLAIN);
	ss_sock_forget(s);
}

void ss_inherit_before_exec(void)
{
	ss_sock_for_each_held(inherit_exec_one);
}

void ss_inherit_after_fork(void)
{
	pthread_mutex_init(&inherit_lock, NULL);
	/* The parent's kept connections are the parent's: their private fds go here. */
	for (struct ss_sock *s = inherit_kept; s; s = s->kept_next) {
		if (s->tcp_fd >= 0)
			ss_private_close(s->tcp_fd);
		if (s->shim_fd >= 0)
			ss_private_close(s->shim_fd);
	}
	inherit_kept = NULL;
	atomic_store(&inherit_forked, false);
}
