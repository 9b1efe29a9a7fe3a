/*
 * Negotiation on both sides, the swap of the application's fd between the
 * TCP socket and our socketpair end, the readiness mirror, and the end of a
 * connection (docs/protocol.md, docs/design.md).
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <unistd.h>

#include "handshake/gid.h"
#include "handshake/negotiate.h"
#include "shim/real.h"
#include "shim/shim.h"
#include "shim/stats.h"
#include "transport/log.h"

const struct ss_transport_ops *ss_tp;
struct ss_worker *ss_w;

static ssize_t real_send(int fd, const void *b, size_t n, int f)
{
	return ss_real.send(fd, b, n, f);
}

static ssize_t real_recv(int fd, void *b, size_t n, int f)
{
	return ss_real.recv(fd, b, n, f);
}

static int real_poll(struct pollfd *p, nfds_t n, int t)
{
	return ss_real.poll(p, n, t);
}

const struct ss_hs_io ss_real_io = {real_send, real_recv, real_poll};

/* ---- the transport module ---- */

static pthread_mutex_t tp_lock = PTHREAD_MUTEX_INITIALIZER;
static enum ss_reason tp_failure; /* remembered: a failed load is not retried */

enum ss_reason ss_tp_load(void)
{
	char path[PATH_MAX];
	Dl_info info;
	void *h;
	enum ss_reason r = SS_REASON_NONE;

	if (__atomic_load_n(&ss_w, __ATOMIC_ACQUIRE))
		return SS_REASON_NONE;
	pthread_mutex_lock(&tp_lock);
	if (ss_w || tp_failure) {
		r = tp_failure;
		goto out;
	}
	if (!ss_tp) {
		/* The module lives beside libsrqshim.so. */
		if (!dladdr((void *)ss_tp_load, &info) || !info.dli_fname) {
			r = tp_failure = SS_REASON_NO_RDMA_CORE;
			goto out;
		}
		snprintf(path, sizeof(path), "%s", info.dli_fname);
		char *slash = strrchr(path, '/');
		snprintf(slash ? slash + 1 : path, sizeof(path) - (size_t)(slash ? slash + 1 - path : 0),
			 "libsrqshim-transport.so");
		h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
		if (!h) {
			ss_log_warn("cannot load the RDMA transport (%s): connections stay on TCP",
				    dlerror());
			r = tp_failure = SS_REASON_NO_RDMA_CORE;
			goto out;
		}
		const struct ss_transport_ops *ops = dlsym(h, SS_TRANSPORT_OPS_SYMBOL);
		if (!ops || ops->version != SS_TRANSPORT_OPS_VERSION) {
			ss_log_error("%s: not a matching transport module", path);
			r = tp_failure = SS_REASON_NO_RDMA_CORE;
			goto out;
		}
		ops->set_log_level(ss_cfg.log_level);
		ss_tp = ops;
	}
	struct ss_worker *w;
	if (ss_tp->worker_get(&w) != 0) {
		r = SS_REASON_RESOURCE;
		goto out;
	}
	if (__atomic_exchange_n(&ss_w, w, __ATOMIC_ACQ_REL) != w)
		ss_stats_worker_ready();
out:
	pthread_mutex_unlock(&tp_lock);
	return r;
}

static void transport_cfg(struct ss_transport_cfg *t)
{
	memset(t, 0, sizeof(*t));
	t->dev.device = ss_cfg.device[0] ? ss_cfg.device : NULL;
	t->dev.port = (unsigned)ss_cfg.port;
	t->dev.gid_index = ss_cfg.gid_index;
	t->recv_mode = ss_cfg.mode == SS_MODE_SRQ ? SS_RECV_SRQ : SS_RECV_RQ;
	t->sq_depth = (uint32_t)ss_cfg.sq_depth;
	t->rx_window = (uint32_t)(ss_cfg.mode == SS_MODE_SRQ ? ss_cfg.srq_window : ss_cfg.rq_depth);
	t->srq_initial = (uint32_t)ss_cfg.srq_pool;
	t->srq_max = (uint32_t)(ss_cfg.srq_pool_max > ss_cfg.srq_pool ? ss_cfg.srq_pool_max
								   : ss_cfg.srq_pool);
	t->srq_hold = (uint32_t)ss_cfg.srq_hold;
	t->tx_pool_max = (uint32_t)ss_cfg.tx_pool_max;
	t->buf_size = (uint32_t)ss_cfg.buf_size;
	t->max_inline = (uint32_t)ss_cfg.max_inline;
	t->ctrl_reserve = 2;
}

/* ---- fds ---- */

int ss_private_fd(int fd)
{
	struct rlimit rl;
	int base = 512, nfd;

	/* Above the application's fds: half way up the soft limit. */
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
	    rl.rlim_cur / 2 > (rlim_t)base)
		base = (int)(rl.rlim_cur / 2 > INT_MAX ? INT_MAX / 2 : rl.rlim_cur / 2);
	nfd = ss_real.fcntl(fd, F_DUPFD_CLOEXEC, base);
	if (nfd < 0)
		nfd = ss_real.fcntl(fd, F_DUPFD_CLOEXEC, 3);
	return nfd < 0 ? -errno : nfd;
}

/* Removes the application's epoll registrations of fd (before its object changes). */
static void epoll_drop(struct ss_sock *s, int fd)
{
	for (int i = 0; i < s->n_regs; i++)
		ss_real.epoll_ctl(s->regs[i].epfd, EPOLL_CTL_DEL, fd, NULL);
}

void ss_epoll_readd(struct ss_sock *s, int fd)
{
	for (int i = 0; i < s->n_regs;) {
		struct epoll_event ev = s->regs[i].ev;

		if (ss_real.epoll_ctl(s->regs[i].epfd, EPOLL_CTL_ADD, fd, &ev) < 0 &&
		    errno != EEXIST) {
			s->regs[i] = s->regs[--s->n_regs]; /* that epoll instance is gone */
			continue;
		}
		i++;
	}
}

/* Puts object newfd on every name of s (keeping each name's flags), closing newfd. */
static int put_on_names(struct ss_sock *s, int newfd)
{
	int ret = 0;

	pthread_mutex_lock(&s->fd_lock);
	for (int i = 0; i < s->n_fds; i++) {
		int fd = s->fds[i];
		int fdflags = ss_real.fcntl(fd, F_GETFD);
		int flflags = ss_real.fcntl(fd, F_GETFL);

		epoll_drop(s, fd);
		if (ss_real.dup3(newfd, fd, fdflags & FD_CLOEXEC ? O_CLOEXEC : 0) < 0)
			ret = -errno;
		/* O_NONBLOCK lives in the open file: carry it over. */
		int nfl = ss_real.fcntl(fd, F_GETFL);
		if (flflags >= 0 && nfl >= 0)
			ss_real.fcntl(fd, F_SETFL, (nfl & ~O_NONBLOCK) | (flflags & O_NONBLOCK));
		ss_epoll_readd(s, fd);
	}
	pthread_mutex_unlock(&s->fd_lock);
	ss_real.close(newfd);
	return ret;
}

/* ---- the readiness mirror ---- */

static void drain_fd(int fd)
{
	char buf[4096];

	while (ss_real.recv(fd, buf, sizeof(buf), MSG_DONTWAIT) > 0)
		;
}

/* Makes the application's fd show what the connection would show as TCP. */
static void mirror_ready(void *arg, unsigned r)
{
	static const char junk[4096];
	struct ss_sock *s = arg;

	pthread_mutex_lock(&s->fd_lock);
	if (!s->mirror_on || s->n_fds == 0)
		goto out;
	int app = s->fds[0];
	if (r & SS_RDY_IN) {
		/* One token shows readable; another per arrival gives ET waiters their edge. */
		if ((s->tokens == 0 || ((r & SS_RDY_EDGE) && s->tokens < 64)) && !s->rdhup_shown &&
		    ss_real.send(s->shim_fd, "r", 1, MSG_DONTWAIT | MSG_NOSIGNAL) == 1)
			s->tokens++;
	} else if (s->tokens) {
		char buf[64];
		while (s->tokens > 0) {
			ssize_t n = ss_real.recv(app, buf, (size_t)s->tokens, MSG_DONTWAIT);
			if (n <= 0)
				break;
			s->tokens -= (int)n;
		}
		s->tokens = 0;
	}
	if (r & SS_RDY_OUT) {
		if (s->junk) {
			drain_fd(s->shim_fd);
			s->junk = false;
		}
	} else if (!s->junk && !s->hup_shown) {
		while (ss_real.send(app, junk, sizeof(junk), MSG_DONTWAIT | MSG_NOSIGNAL) > 0)
			;
		s->junk = true;
	}
	if ((r & SS_RDY_RDHUP) && !s->rdhup_shown) {
		ss_real.shutdown(s->shim_fd, SHUT_WR);
		s->rdhup_shown = true;
	}
	if ((r & SS_RDY_HUP) && !s->hup_shown) {
		ss_real.shutdown(s->shim_fd, SHUT_RDWR);
		s->hup_shown = true;
	}
out:
	pthread_mutex_unlock(&s->fd_lock);
}

/* The TCP connection of an upgraded socket became readable. */
static int tcp_event(void *arg, int fd)
{
	struct ss_sock *s = arg;
	struct ss_msg m;
	char buf[256];
	int ret = SS_TCP_IDLE;

	(void)s;
	for (;;) {
		switch (ss_hs_read(&ss_real_io, fd, &m, 0, NULL)) {
		case SS_HSR_MSG:
			if (m.type == SS_MSG_READY)
				ret = SS_TCP_COMMIT;
			continue; /* repeated ACKs and the like: skipped */
		case SS_HSR_EOF:
		case SS_HSR_ERROR:
			return SS_TCP_GONE;
		case SS_HSR_FOREIGN:
		case SS_HSR_BAD:
			/* Nothing else belongs on the TCP stream after an upgrade. */
			ss_log_warn("unexpected bytes on the TCP side of an upgraded connection");
			if (ss_real.recv(fd, buf, sizeof(buf), MSG_DONTWAIT) <= 0)
				return SS_TCP_GONE;
			continue;
		case SS_HSR_TIMEOUT:
			return ret;
		}
	}
}

static const struct ss_conn_hooks hooks = {.ready = mirror_ready, .tcp_event = tcp_event};

/*
 * The connection is upgraded: the TCP socket moves to a private fd, our
 * socketpair end onto the application's names. Returns 0 or -errno.
 */
static int swap_in_pair(struct ss_sock *s)
{
	int sv[2], tcp, shim, ret;

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		return -errno;
	tcp = ss_private_fd(s->fds[0]);
	shim = ss_private_fd(sv[1]);
	ss_real.close(sv[1]);
	if (tcp < 0 || shim < 0) {
		ret = tcp < 0 ? tcp : shim;
		goto err;
	}
	/* A small buffer on the application's end: little junk shows "not writable". */
	int small = 1;
	ss_real.setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
	/* Blocking calls wait on the application's end: it takes over the socket's timeouts. */
	static const int timeouts[] = {SO_RCVTIMEO, SO_SNDTIMEO};
	for (int i = 0; i < 2; i++) {
		struct timeval tv;
		socklen_t len = sizeof(tv);

		if (ss_real.getsockopt(tcp, SOL_SOCKET, timeouts[i], &tv, &len) == 0 &&
		    (tv.tv_sec || tv.tv_usec))
			ss_real.setsockopt(sv[0], SOL_SOCKET, timeouts[i], &tv, len);
	}
	ss_real.fcntl(shim, F_SETFL, O_NONBLOCK);
	s->tcp_fd = tcp;
	s->shim_fd = shim;
	ret = put_on_names(s, sv[0]);
	if (ret)
		return ret;
	pthread_mutex_lock(&s->fd_lock);
	s->mirror_on = true;
	pthread_mutex_unlock(&s->fd_lock);
	ss_tp->conn_resync(s->conn);
	return 0;
err:
	ss_real.close(sv[0]);
	if (tcp >= 0)
		ss_real.close(tcp);
	if (shim >= 0)
		ss_real.close(shim);
	return ret;
}

static void become_plain(struct ss_sock *s, enum ss_reason why)
{
	if (s->conn) {
		ss_tp->conn_destroy(s->conn);
		s->conn = NULL;
	}
	s->state = SS_SOCK_PLAIN;
	s->reason = why;
	ss_log_info("fd %d: TCP (%s)", s->fds[0], ss_reason_str(why));
}

static void become_upgraded(struct ss_sock *s, const struct ss_params *peer)
{
	uint8_t peer_mode = peer->recv_mode;

	s->state = SS_SOCK_UPGRADED;
	s->reason = SS_REASON_NONE;
	s->peer_mode = peer_mode;
	s->peer_window = peer->window;
	ss_log_info("fd %d: upgraded (peer %s)", s->fds[0],
		    peer_mode == SS_RECV_SRQ ? "srq" : "rq");
}

static uint64_t deadline_in(int ms)
{
	return ss_now_ms() + (uint64_t)ms;
}

/* The TCP round trip, for raising waits on slow paths (0 if unknown). */
static int rtt_ms(int fd)
{
	struct tcp_info ti;
	socklen_t len = sizeof(ti);

	if (ss_real.getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0)
		return 0;
	return (int)(ti.tcpi_rtt / 1000);
}

/* Creates our connection for TCP fd and fills mine. Returns the reason it could not. */
static enum ss_reason make_conn_at(struct ss_sock *s, const struct sockaddr_storage *local,
				   struct ss_params *mine)
{
	struct ss_transport_cfg t;
	enum ss_reason r;

	if (ss_cfg.mode == SS_MODE_TCP)
		return SS_REASON_POLICY;
	r = ss_tp_load();
	if (r != SS_REASON_NONE)
		return r;
	transport_cfg(&t);
	if (ss_tp->conn_create(ss_w, &t, (const struct sockaddr *)local, &hooks, s, &s->conn, mine,
			       &r) != 0)
		return r != SS_REASON_NONE ? r : SS_REASON_RESOURCE;
	return SS_REASON_NONE;
}

static enum ss_reason make_conn(struct ss_sock *s, int fd, struct ss_params *mine)
{
	struct sockaddr_storage local;
	socklen_t len = sizeof(local);

	if (ss_real.getsockname(fd, (struct sockaddr *)&local, &len) != 0)
		return SS_REASON_RESOURCE;
	return make_conn_at(s, &local, mine);
}

/*
 * The local address a connect to dst will get: the bound one, or the
 * kernel's route choice (a connected UDP socket sends nothing).
 */
static bool predict_local(struct ss_sock *s, const struct sockaddr *dst, socklen_t dlen,
			  struct sockaddr_storage *local)
{
	socklen_t len = sizeof(*local);
	int u;
	bool ok;

	if (s->bound_len) {
		const struct sockaddr_in *b = (const struct sockaddr_in *)&s->bound;
		const struct sockaddr_in6 *b6 = (const struct sockaddr_in6 *)&s->bound;
		if ((b->sin_family == AF_INET && b->sin_addr.s_addr != htonl(INADDR_ANY)) ||
		    (b6->sin6_family == AF_INET6 && !IN6_IS_ADDR_UNSPECIFIED(&b6->sin6_addr))) {
			memcpy(local, &s->bound, s->bound_len);
			return true;
		}
	}
	u = ss_real.socket(dst->sa_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (u < 0)
		return false;
	ok = ss_real.connect(u, dst, dlen) == 0 &&
	     ss_real.getsockname(u, (struct sockaddr *)local, &len) == 0;
	ss_real.close(u);
	return ok;
}

static bool same_ip(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
	if (a->ss_family != b->ss_family)
		return false;
	if (a->ss_family == AF_INET)
		return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
		       ((const struct sockaddr_in *)b)->sin_addr.s_addr;
	return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
		      &((const struct sockaddr_in6 *)b)->sin6_addr, 16) == 0;
}

/* Checks the peer's ACCEPT or HELLO and connects our QP to it. */
static enum ss_reason agree(struct ss_sock *s, int fd, const struct ss_params *mine,
			    const struct ss_msg *peer)
{
	struct sockaddr_storage pa;
	socklen_t len = sizeof(pa);
	struct ss_agreement agr;
	uint8_t gids[64][16];
	size_t n;
	enum ss_reason r;

	r = ss_negotiate(mine, peer, &agr);
	if (r != SS_REASON_NONE)
		return r;
	if (ss_real.getpeername(fd, (struct sockaddr *)&pa, &len) != 0)
		return SS_REASON_RESOURCE;
	n = ss_tp->conn_local_gids(s->conn, gids, 64);
	r = ss_check_peer_gid(peer->params.gid, (struct sockaddr *)&pa, (const uint8_t(*)[16])gids,
			      n);
	if (r != SS_REASON_NONE)
		return r;
	if (ss_tp->conn_connect(s->conn, &peer->params, &agr) != 0)
		return SS_REASON_RESOURCE;
	return SS_REASON_NONE;
}

/* ---- client ---- */

/* Waits for a connect in progress on fd to finish. Returns 0 or -errno. */
static int finish_connect(int fd)
{
	struct pollfd p = {.fd = fd, .events = POLLOUT};
	int err = 0;
	socklen_t len = sizeof(err);

	for (;;) {
		int n = ss_real.poll(&p, 1, -1);
		if (n > 0)
			break;
		if (n < 0 && errno != EINTR)
			return -errno;
	}
	if (ss_real.getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
		return -errno;
	return -err;
}

/* connect(2) as the application asked for it, but waiting even on a non-blocking socket. */
static int connect_fully(int fd, const struct sockaddr *addr, socklen_t len)
{
	if (ss_real.connect(fd, addr, len) == 0)
		return 0;
	if (errno != EINPROGRESS && errno != EINTR)
		return -errno;
	return finish_connect(fd);
}

/*
 * The probe failed: abort it (no TIME_WAIT left behind) and connect a fresh
 * plain socket with the same bind and options onto the application's fd.
 */
static int reconnect_plain(struct ss_sock *s, int fd, const struct sockaddr *addr,
			   socklen_t alen)
{
	struct linger lg = {1, 0};
	int nfd, ret;

	if (s->conn) {
		ss_tp->conn_destroy(s->conn);
		s->conn = NULL;
	}
	ss_real.setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	nfd = ss_real.socket(s->domain, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (nfd < 0)
		return -errno;
	for (int i = 0; i < s->n_opts; i++)
		ss_real.setsockopt(nfd, s->opts[i].level, s->opts[i].name, s->opts[i].val,
				   s->opts[i].len);
	if (s->bound_len && ss_real.bind(nfd, (struct sockaddr *)&s->bound, s->bound_len) < 0) {
		ret = -errno;
		ss_real.close(nfd);
		return ret;
	}
	ret = connect_fully(nfd, addr, alen);
	if (ret) {
		ss_real.close(nfd);
		return ret;
	}
	return put_on_names(s, nfd);
}

/* A decided connection gets a slot in the published statistics. */
static void publish(struct ss_sock *s)
{
	struct ss_stats_conn *st;

	if (s->stat || (s->state != SS_SOCK_UPGRADED && s->state != SS_SOCK_PLAIN) ||
	    (s->state == SS_SOCK_PLAIN && s->reason == SS_REASON_NONE))
		return;
	st = ss_stats_conn_open(s->fds[0], s->tcp_fd >= 0 ? s->tcp_fd : s->fds[0],
				s->state == SS_SOCK_UPGRADED ? SS_ST_UPGRADED : SS_ST_TCP, s->reason);
	if (!st)
		return;
	if (s->state == SS_SOCK_UPGRADED) {
		st->mode = ss_cfg.mode == SS_MODE_SRQ ? SS_RECV_SRQ : SS_RECV_RQ;
		st->peer_mode = s->peer_mode;
		st->tx_window = s->peer_window;
		st->rx_window = (uint32_t)(ss_cfg.mode == SS_MODE_SRQ ? ss_cfg.srq_window
								 : ss_cfg.rq_depth);
		ss_tp->conn_publish(s->conn, &st->st);
	}
	s->stat = st;
}

static int client_connect(struct ss_sock *s, int fd, const struct sockaddr *addr, socklen_t alen);

int ss_client_connect(struct ss_sock *s, int fd, const struct sockaddr *addr, socklen_t alen)
{
	int ret = client_connect(s, fd, addr, alen);

	if (ret == 0)
		publish(s);
	return ret;
}

static int client_connect(struct ss_sock *s, int fd, const struct sockaddr *addr, socklen_t alen)
{
	struct ss_params mine;
	struct ss_msg hello = {.type = SS_MSG_HELLO}, m;
	struct sockaddr_storage predicted, local;
	socklen_t llen = sizeof(local);
	enum ss_dest_state dest = SS_DEST_UNKNOWN;
	enum ss_reason r;
	bool prober = false, acked = false;
	uint64_t deadline;
	int ret;

	if (ss_cfg.mode == SS_MODE_TCP || !ss_policy_allows(&ss_peers, addr)) {
		/* Never probed: a destination outside the policy sees no HELLO. */
		become_plain(s, SS_REASON_POLICY);
		return ss_real.connect(fd, addr, alen) == 0 ? 0 : -errno;
	}
	dest = ss_cache_begin(addr, &prober);
	if (dest == SS_DEST_PLAIN) {
		become_plain(s, SS_REASON_PEER_PLAIN);
		return ss_real.connect(fd, addr, alen) == 0 ? 0 : -errno;
	}
	/*
	 * Everything slow (loading verbs, opening the device, making the QP)
	 * happens before the SYN: a server that writes first waits only a
	 * short bound for our HELLO, counted from its accept.
	 */
	r = predict_local(s, addr, alen, &predicted) ? make_conn_at(s, &predicted, &mine)
						    : SS_REASON_RESOURCE;
	ret = connect_fully(fd, addr, alen);
	if (ret) {
		if (prober)
			ss_cache_record(addr, SS_DEST_UNKNOWN);
		become_plain(s, SS_REASON_NONE);
		return ret;
	}
	if (r == SS_REASON_NONE &&
	    (ss_real.getsockname(fd, (struct sockaddr *)&local, &llen) != 0 ||
	     !same_ip(&local, &predicted))) {
		/* The route changed under us: make the QP for the address we got. */
		ss_tp->conn_destroy(s->conn);
		s->conn = NULL;
		r = make_conn(s, fd, &mine);
	}
	if (r != SS_REASON_NONE) {
		if (prober)
			ss_cache_record(addr, SS_DEST_UNKNOWN);
		become_plain(s, r);
		return 0;
	}
	hello.params = mine;
	if (getrandom(&hello.nonce, sizeof(hello.nonce), 0) != sizeof(hello.nonce))
		hello.nonce = (uint32_t)ss_now_ms();
	deadline = deadline_in(ss_cfg.hello_timeout_ms + 4 * rtt_ms(fd));
	if (ss_hs_write(&ss_real_io, fd, &hello, deadline) != 0) {
		r = SS_REASON_PEER_PLAIN;
		goto plain_peer;
	}
	for (;;) {
		enum ss_hs_read_result rr = ss_hs_read(&ss_real_io, fd, &m, deadline, NULL);

		if (rr == SS_HSR_MSG && m.nonce == hello.nonce && m.type == SS_MSG_ACK) {
			if (!acked)
				deadline = deadline_in(ss_cfg.acked_timeout_ms);
			acked = true;
			continue;
		}
		if (rr == SS_HSR_MSG && m.nonce == hello.nonce && m.type == SS_MSG_DECLINE) {
			/* A shimmed server that said no: the connection goes on as plain TCP. */
			if (prober || dest == SS_DEST_UNKNOWN)
				ss_cache_record(addr, SS_DEST_SHIMMED);
			become_plain(s, SS_REASON_PEER_DECLINED);
			return 0;
		}
		if (rr == SS_HSR_MSG && m.nonce == hello.nonce && m.type == SS_MSG_ACCEPT) {
			ss_cache_record(addr, SS_DEST_SHIMMED);
			prober = false;
			r = agree(s, fd, &mine, &m);
			if (r != SS_REASON_NONE)
				break; /* the server waits for READY: drop this one */
			struct ss_msg ready = {.type = SS_MSG_READY, .nonce = hello.nonce};
			if (ss_hs_write(&ss_real_io, fd, &ready, deadline) != 0) {
				r = SS_REASON_TIMEOUT;
				break;
			}
			ss_tp->conn_start(s->conn);
			ret = swap_in_pair(s);
			if (ret) {
				r = SS_REASON_RESOURCE;
				break;
			}
			if (ss_tp->conn_watch_liveness(s->conn, s->tcp_fd) != 0)
				ss_log_warn("cannot watch the TCP side of fd %d", fd);
			become_upgraded(s, &m.params);
			return 0;
		}
		/* Silence, foreign bytes, EOF, or nonsense: the server does not speak HELLO. */
		r = rr == SS_HSR_TIMEOUT ? (acked ? SS_REASON_TIMEOUT : SS_REASON_PEER_PLAIN)
		    : rr == SS_HSR_MSG || rr == SS_HSR_BAD ? SS_REASON_MALFORMED
							   : SS_REASON_PEER_PLAIN;
		goto plain_peer;
	}
	/* We cannot use what the server accepted: start over on plain TCP. */
	ret = reconnect_plain(s, fd, addr, alen);
	become_plain(s, r);
	return ret;

plain_peer:
	/* Only a destination never seen shimmed is demoted. */
	if (prober && r == SS_REASON_PEER_PLAIN)
		ss_cache_record(addr, SS_DEST_PLAIN);
	else if (prober)
		ss_cache_record(addr, SS_DEST_UNKNOWN);
	ret = reconnect_plain(s, fd, addr, alen);
	become_plain(s, r);
	return ret;
}

/* ---- server ---- */

static void decline(int fd, const struct ss_msg *hello, enum ss_reason why)
{
	struct ss_msg d = {.type = SS_MSG_DECLINE, .nonce = hello->nonce, .reason = (uint16_t)why};

	ss_hs_write(&ss_real_io, fd, &d, deadline_in(1000));
}

static int server_decide(struct ss_sock *s, int fd, int wait_ms);

int ss_server_decide(struct ss_sock *s, int fd, int wait_ms)
{
	int ret = server_decide(s, fd, wait_ms);

	if (ret == 0)
		publish(s);
	return ret;
}

static int server_decide(struct ss_sock *s, int fd, int wait_ms)
{
	struct ss_params mine;
	struct ss_msg hello, m;
	enum ss_reason r;
	uint64_t deadline;

	if (s->state != SS_SOCK_ACCEPTED)
		return 0;
	if (wait_ms < 0) {
		/* Blocking: wait for the client's first bytes (or its end) without a bound. */
		struct pollfd p = {.fd = fd, .events = POLLIN};
		if (ss_real.poll(&p, 1, -1) < 0)
			return -errno;
		wait_ms = 1000; /* the rest of a partial HELLO */
	}
	deadline = deadline_in(wait_ms);
	enum ss_dec_result dec = SS_DEC_OK;
	switch (ss_hs_read(&ss_real_io, fd, &hello, deadline, &dec)) {
	case SS_HSR_TIMEOUT:
		return -EAGAIN;
	case SS_HSR_MSG:
		break;
	case SS_HSR_BAD:
		/* Our magic but nothing we can read: the bytes stay, for the application. */
		ss_log_warn("fd %d: %s handshake from the client: staying on TCP, bytes untouched",
			    fd, ss_dec_result_str(dec));
		become_plain(s, dec == SS_DEC_UNSUPPORTED ? SS_REASON_VERSION : SS_REASON_MALFORMED);
		return 0;
	default:
		/* Application bytes, end of file, or a handshake we cannot read: plain, untouched. */
		become_plain(s, SS_REASON_PEER_PLAIN);
		return 0;
	}
	if (hello.type != SS_MSG_HELLO) {
		become_plain(s, SS_REASON_MALFORMED);
		return 0;
	}
	/* Acknowledge at once: the client then waits longer for our decision. */
	m = (struct ss_msg){.type = SS_MSG_ACK, .nonce = hello.nonce};
	ss_hs_write(&ss_real_io, fd, &m, deadline_in(1000));

	r = make_conn(s, fd, &mine);
	if (r == SS_REASON_NONE)
		r = agree(s, fd, &mine, &hello);
	if (r != SS_REASON_NONE) {
		decline(fd, &hello, r);
		become_plain(s, r);
		return 0;
	}
	m = (struct ss_msg){.type = SS_MSG_ACCEPT, .nonce = hello.nonce, .params = mine};
	if (ss_hs_write(&ss_real_io, fd, &m, deadline_in(ss_cfg.acked_timeout_ms)) != 0 ||
	    swap_in_pair(s) != 0) {
		/* The client cannot be told any more: this connection is lost either way. */
		ss_log_error("fd %d: cannot complete the upgrade", fd);
		become_plain(s, SS_REASON_RESOURCE);
		return 0;
	}
	if (ss_tp->conn_watch_liveness(s->conn, s->tcp_fd) != 0)
		ss_log_warn("cannot watch the TCP side of fd %d", fd);
	become_upgraded(s, &hello.params);
	return 0;
}

/* ---- the end ---- */

void ss_sock_finish(struct ss_sock *s)
{
	pthread_mutex_lock(&s->lock);
	if (s->state == SS_SOCK_UPGRADED && s->conn) {
		/* What send() accepted is delivered before the end of stream, within the linger. */
		if (!s->shut_wr)
			ss_tp->conn_shutdown_wr(s->conn);
		ss_tp->conn_drain(s->conn, ss_cfg.linger_ms);
	}
	pthread_mutex_unlock(&s->lock);
}
