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
 * ("handover SERIAL" on the operator channel), the connection moves back
 * to TCP (down.c), and at the end of any move the TCP socket goes over
 * our end of the pair (SCM_RIGHTS) before that end closes.
 *
 * Child, at exec: for each FOREIGN connection whose name the new image
 * inherits, it asks the owner, then takes the TCP socket off the pair and
 * puts it on its names, so the new image gets a TCP socket with the
 * stream intact.
 *
 * Locks: inherit_lock guards the kept list and is a leaf (no other lock is
 * taken under it). The kept list's entries are touched by the progress
 * thread only; the application's threads no longer name them.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "shim/real.h"
#include "shim/shim.h"
#include "transport/log.h"

/* How often the progress thread looks whether a kept connection's other holders closed. */
#define KEPT_LOOK_MS 100
/* How long a child waits for its owner's answer before it waits on the pair alone. */
#define ASK_ANSWER_MS 1000

static pthread_mutex_t inherit_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ss_sock *inherit_kept; /* the kept list (inherit_lock) */
/* This process forked while it had connections: a close looks for other holders. */
static atomic_bool inherit_forked;

void ss_inherit_forked(void)
{
	atomic_store_explicit(&inherit_forked, true, memory_order_relaxed);
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

	if (!atomic_load_explicit(&inherit_forked, memory_order_relaxed))
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
	/* Moved (its TCP socket went over the pair), or every holder closed: it ends here. */
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

/* A one-byte message with room for one fd. */
struct inherit_fd_msg {
	char one;
	union {
		struct cmsghdr h;
		char space[CMSG_SPACE(sizeof(int))];
	} u;
	struct iovec v;
	struct msghdr m;
};

static void inherit_fd_msg_init(struct inherit_fd_msg *f)
{
	f->one = 'f';
	f->v = (struct iovec){&f->one, 1};
	f->m = (struct msghdr){.msg_iov = &f->v,
			       .msg_iovlen = 1,
			       .msg_control = &f->u,
			       .msg_controllen = sizeof(f->u)};
}

void ss_inherit_pass(struct ss_sock *s, int tcp)
{
	struct inherit_fd_msg f;
	struct cmsghdr *c;

	if (!atomic_load_explicit(&inherit_forked, memory_order_relaxed) || s->shim_fd < 0)
		return;
	inherit_fd_msg_init(&f);
	c = CMSG_FIRSTHDR(&f.m);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &tcp, sizeof(int));
	/* Unread unless a child takes it at its exec; freed with the pair otherwise. */
	ss_real.sendmsg(s->shim_fd, &f.m, MSG_DONTWAIT | MSG_NOSIGNAL);
}

/* ---- the child ---- */

/*
 * Asks owner to move its connection serial back to TCP. Returns the count
 * its operator channel says starts moving (0: none), or -1: no answer.
 */
static int inherit_ask(int owner, uint64_t serial)
{
	struct sockaddr_un to = {.sun_family = AF_UNIX}, me = {.sun_family = AF_UNIX};
	char req[64], answer[64];
	int fd, len, n = -1;

	fd = ss_real.socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	/* An address of our own (autobind) for the answer. */
	if (bind(fd, (struct sockaddr *)&me, sizeof(sa_family_t)) != 0)
		goto out;
	len = snprintf(to.sun_path + 1, sizeof(to.sun_path) - 1, "srqshim.%d", owner);
	snprintf(req, sizeof(req), "handover %llu", (unsigned long long)serial);
	if (ss_real.sendto(fd, req, strlen(req), 0, (struct sockaddr *)&to,
			   (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)len)) <
	    0) {
		ss_log_warn("no answer from process %d, which carries an inherited connection: %s",
			    owner, strerror(errno));
		goto out;
	}
	struct pollfd p = {.fd = fd, .events = POLLIN};
	ssize_t got;

	if (ss_real.poll(&p, 1, ASK_ANSWER_MS) == 1 &&
	    (got = ss_real.recv(fd, answer, sizeof(answer) - 1, 0)) > 0) {
		answer[got] = 0;
		if (sscanf(answer, "ok %d", &n) != 1)
			n = 0;
	}
out:
	ss_real.close(fd);
	return n;
}

/*
 * Takes the TCP socket off the application's end app, waiting until end
 * (ms) for it. Returns it, or -1 (the pair ended without one, or the time
 * is up).
 */
static int inherit_take(int app, uint64_t end)
{
	for (;;) {
		struct inherit_fd_msg f;
		char buf[64];
		struct cmsghdr *c;
		ssize_t n;

		inherit_fd_msg_init(&f);
		/* The mirror's tokens come before it: read past them. */
		f.v = (struct iovec){buf, sizeof(buf)};
		n = ss_real.recvmsg(app, &f.m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
		c = n > 0 ? CMSG_FIRSTHDR(&f.m) : NULL;
		if (c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
			int fd;

			memcpy(&fd, CMSG_DATA(c), sizeof(int));
			return fd;
		}
		if (n > 0 || (n < 0 && errno == EINTR))
			continue;
		if (n == 0 || errno != EAGAIN || ss_now_ms() >= end)
			return -1;
		struct pollfd p = {.fd = app, .events = POLLIN};

		ss_real.poll(&p, 1, (int)(end - ss_now_ms()));
	}
}

static void inherit_exec_one(struct ss_sock *s)
{
	int asked, tcp;

	if (ss_sock_state(s) != SS_SOCK_FOREIGN || s->owner <= 0 || s->n_fds == 0 ||
	    !ss_image_inherits(s))
		return;
	asked = inherit_ask(s->owner, s->serial);
	/* None moving: only a TCP socket already there (a move that ran before) is taken. */
	tcp = inherit_take(s->fds[0], asked == 0 ? 0 : ss_deadline_in(2 * ss_cfg.linger_ms));
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
	/* The parent's kept connections are the parent's. */
	inherit_kept = NULL;
	atomic_store_explicit(&inherit_forked, false, memory_order_relaxed);
}
