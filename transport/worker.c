/*
 * The worker: devices opened on first need (or ahead of it: ss_worker_warm), and one progress
 * thread that waits on their completion channels, on the fds the shim asks it to watch
 * (ss_worker_watch) and on a wake-up eventfd, and runs timers. It alone takes CQ events, so it
 * alone frees connections (ss_worker_bury), which keeps frees and events apart.
 */
#include "transport/worker.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "handshake/gid.h"
#include "transport/log.h"
#include "transport/qpool.h"
#include "transport/srq.h"
#include "transport/sys.h"

static pthread_mutex_t worker_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ss_worker *the_worker;

void ss_worker_wake(struct ss_worker *w)
{
	uint64_t one = 1;

	if (write(w->evfd, &one, sizeof(one)) < 0) {
		/* A full counter still wakes the thread. */
	}
}

static void devctx_free(struct ss_devctx *dc)
{
	if (dc->ch)
		ibv_destroy_comp_channel(dc->ch);
	if (dc->pd)
		ibv_dealloc_pd(dc->pd);
	ss_device_close(dc->dev);
	free(dc->gids);
	free(dc);
}

/* Reads every GID of the chosen port: the loopback check accepts any of them. */
static int read_port_gids(struct ss_devctx *dc)
{
	struct ibv_port_attr pa;

	if (ibv_query_port(dc->dev->ctx, dc->dev->port, &pa))
		return -EIO;
	/* From here on, async events keep this true (PORT_ERR, PORT_ACTIVE). */
	atomic_init(&dc->port_down, pa.state != IBV_PORT_ACTIVE);
	dc->gids = calloc(pa.gid_tbl_len ? (size_t)pa.gid_tbl_len : 1, 16);
	if (!dc->gids)
		return -ENOMEM;
	/* The whole table in one call (asking entry by entry costs a system call each). */
	struct ibv_gid_entry *ents =
		calloc(pa.gid_tbl_len ? (size_t)pa.gid_tbl_len : 1, sizeof(*ents));
	ssize_t n = ents ? ibv_query_gid_table(dc->dev->ctx, ents, (size_t)pa.gid_tbl_len, 0) : -1;

	for (ssize_t i = 0; i < n; i++)
		if (ents[i].port_num == dc->dev->port)
			memcpy(dc->gids[dc->n_gids++], ents[i].gid.raw, 16);
	free(ents);
	if (n >= 0)
		return 0;
	for (int i = 0; i < pa.gid_tbl_len; i++) {
		union ibv_gid g;
		static const uint8_t zero[16];

		if (ibv_query_gid(dc->dev->ctx, dc->dev->port, i, &g) == 0 &&
		    memcmp(g.raw, zero, 16) != 0)
			memcpy(dc->gids[dc->n_gids++], g.raw, 16);
	}
	return 0;
}

static enum ss_reason reason_of(enum ss_sel_status st)
{
	switch (st) {
	case SS_SEL_LOOPBACK: return SS_REASON_LOOPBACK;
	case SS_SEL_OK: return SS_REASON_NONE;
	default: return SS_REASON_NO_DEVICE;
	}
}

int ss_worker_devctx(struct ss_worker *w, const struct ss_dev_override *ovr,
		     const struct sockaddr *local, struct ss_devctx **dc_p,
		     enum ss_reason *reason_p)
{
	struct epoll_event ev = {.events = EPOLLIN};
	enum ss_sel_status st = SS_SEL_NO_DEVICE;
	struct ss_devctx *dc;
	uint8_t key[16];
	int ret;

	if (ss_addr_to_gid(local, key) < 0) {
		*reason_p = SS_REASON_NO_DEVICE;
		return -ENODEV;
	}
	pthread_mutex_lock(&w->lock);
	for (dc = atomic_load_explicit(&w->devs, memory_order_relaxed); dc; dc = dc->next)
		if (memcmp(dc->key, key, 16) == 0)
			goto found;
	/* An address that had no device a moment ago has none now: no rescan per connection. */
	for (unsigned i = 0; i < SS_NO_DEV_SLOTS; i++)
		if (w->no_dev[i].until_ms > ss_now_ms() && memcmp(w->no_dev[i].key, key, 16) == 0) {
			*reason_p = w->no_dev[i].reason;
			ret = -ENODEV;
			goto out;
		}
	dc = calloc(1, sizeof(*dc));
	if (!dc) {
		ret = -ENOMEM;
		*reason_p = SS_REASON_RESOURCE;
		goto out;
	}
	memcpy(dc->key, key, 16);
	/*
	 * Released: the progress thread reads a tag (acquire) when the kernel
	 * hands it the pointer, which only an epoll_ctl after this makes
	 * possible; the kernel's ordering is one a race detector cannot see.
	 */
	atomic_store_explicit(&dc->ep_tag, SS_TAG_CHANNEL, memory_order_release);
	atomic_store_explicit(&dc->async_tag, SS_TAG_ASYNC, memory_order_release);
	ret = ss_device_open_for_addr(local, ovr, &dc->dev, &st);
	if (ret) {
		ss_log_info("no RDMA device for this connection: %s", ss_sel_status_str(st));
		*reason_p = st == SS_SEL_OK ? SS_REASON_RESOURCE : reason_of(st);
		if (st != SS_SEL_OK) {
			struct ss_no_dev *nd = &w->no_dev[w->no_dev_next++ % SS_NO_DEV_SLOTS];
			memcpy(nd->key, key, 16);
			nd->reason = *reason_p;
			nd->until_ms = ss_now_ms() + SS_NO_DEV_MS;
		}
		free(dc);
		goto out;
	}
	*reason_p = SS_REASON_RESOURCE;
	dc->pd = ibv_alloc_pd(dc->dev->ctx);
	dc->ch = ibv_create_comp_channel(dc->dev->ctx);
	if (!dc->pd || !dc->ch) {
		ret = -errno ? -errno : -ENOMEM;
		ss_log_error("device %s: cannot make a PD or completion channel", dc->dev->name);
		devctx_free(dc);
		goto out;
	}
	ret = read_port_gids(dc);
	if (ret == 0)
		ret = ss_cqs_init(&dc->cqs, w, dc);
	if (ret == 0) {
		fcntl(dc->ch->fd, F_SETFL, fcntl(dc->ch->fd, F_GETFL) | O_NONBLOCK);
		ev.data.ptr = &dc->ep_tag;
		if (ss_sys_epoll_ctl(w->epfd, EPOLL_CTL_ADD, dc->ch->fd, &ev) < 0)
			ret = -errno;
		dc->ch_watched = ret == 0;
	}
	if (ret == 0) {
		/* SRQ limit and last-WQE events arrive here. */
		int afd = dc->dev->ctx->async_fd;

		fcntl(afd, F_SETFL, fcntl(afd, F_GETFL) | O_NONBLOCK);
		ev.data.ptr = &dc->async_tag;
		if (ss_sys_epoll_ctl(w->epfd, EPOLL_CTL_ADD, afd, &ev) < 0)
			ret = -errno;
	}
	if (ret) {
		devctx_free(dc);
		goto out;
	}
	ss_log_info("using %s port %u GID index %u", dc->dev->name, dc->dev->port,
		    dc->dev->gid_index);
	dc->next = atomic_load_explicit(&w->devs, memory_order_relaxed);
	/* Published whole: the progress thread walks the list without the lock. */
	atomic_store_explicit(&w->devs, dc, memory_order_release);
	atomic_fetch_add_explicit(&w->n_devs, 1, memory_order_release);
found:
	*dc_p = dc;
	*reason_p = SS_REASON_NONE;
	ret = 0;
out:
	pthread_mutex_unlock(&w->lock);
	return ret;
}

/* Send blocks per registration of the send pool. */
#define SS_TX_CHUNK 64

/*
 * Makes the device's send pool and, for SRQ mode, its SRQ side, on the
 * first connection that needs them. Returns 0 or -errno.
 */
static int worker_devctx_pools(struct ss_worker *w, struct ss_devctx *dc,
			       const struct ss_transport_cfg *cfg)
{
	int ret = 0;

	pthread_mutex_lock(&w->lock);
	if (!dc->pools_ready) {
		ret = ss_pool_init(&dc->txp, dc->pd, cfg->buf_size, SS_TX_CHUNK, cfg->tx_pool_max,
				   0);
		if (ret)
			goto out;
		ss_pool_cache_init(&dc->rq_cache, cfg->qp_pool);
		dc->pools_ready = 1;
	}
	if (cfg->recv_mode == SS_RECV_SRQ &&
	    !atomic_load_explicit(&dc->srq, memory_order_relaxed)) {
		struct ss_srq *srq;
		struct ss_srq_cfg sc = {
			.buf_size = cfg->buf_size,
			.initial = cfg->srq_initial,
			.max_blks = cfg->srq_max,
			.test_rearm_ms = cfg->test_rearm_ms,
		};
		ret = ss_srq_create(dc, &sc, &srq);
		if (ret) /* (the pool's QPs go on the SRQ) */
			goto out;
		/* Published whole: the progress thread reads it without the lock. */
		atomic_store_explicit(&dc->srq, srq, memory_order_release);
	}
	if (cfg->qp_pool > 0 && !dc->qpool_started) {
		struct ss_qp_caps caps = ss_qpool_caps(cfg);

		ss_qpool_start(&dc->qpool, w, dc, (int)cfg->qp_pool, &caps);
		dc->qpool_started = 1;
	}
out:
	pthread_mutex_unlock(&w->lock);
	return ret;
}

int ss_worker_devctx_ready(struct ss_worker *w, const struct ss_transport_cfg *cfg,
			   const struct sockaddr *local, struct ss_devctx **dc_p,
			   enum ss_reason *reason_p)
{
	int ret = ss_worker_devctx(w, &cfg->dev, local, dc_p, reason_p);

	if (ret)
		return ret;
	if (atomic_load_explicit(&(*dc_p)->port_down, memory_order_acquire)) {
		*reason_p = SS_REASON_DEVICE_DOWN;
		return -ENETDOWN;
	}
	ret = worker_devctx_pools(w, *dc_p, cfg);
	*reason_p = ret ? SS_REASON_RESOURCE : SS_REASON_NONE;
	return ret;
}

int ss_worker_warm(struct ss_worker *w, const struct ss_transport_cfg *cfg,
		   const struct sockaddr *local)
{
	struct ss_devctx *dc;
	enum ss_reason r;

	return ss_worker_devctx_ready(w, cfg, local, &dc, &r);
}

/* Statistics snapshot of w; its lock held. */
static void worker_stats_locked(struct ss_worker *w, struct ss_worker_stats *st)
{
	memset(st, 0, sizeof(*st));
	for (struct ss_devctx *dc = atomic_load_explicit(&w->devs, memory_order_relaxed); dc;
	     dc = dc->next) {
		struct ss_srq *srq = atomic_load_explicit(&dc->srq, memory_order_acquire);

		snprintf(st->device, sizeof(st->device), "%.31s", dc->dev->name);
		if (dc->pools_ready) {
			pthread_mutex_lock(&dc->txp.lock);
			st->tx_blocks += ss_pool_made(&dc->txp);
			st->reg_bytes += dc->txp.reg_bytes;
			pthread_mutex_unlock(&dc->txp.lock);
			st->rq_kept += ss_pool_cache_count(&dc->rq_cache);
		}
		if (srq) {
			struct ss_srq_stats ss;

			ss_srq_get_stats(srq, &ss);
			st->srq_blocks += ss.pool_blks;
			st->srq_max += ss.pool_max;
			st->srq_posted += ss.posted;
			st->srq_peak_held += ss.peak_held;
			st->srq_limit_events += ss.limit_events;
			st->reg_bytes += ss.reg_bytes;
		}
		if (dc->qpool_started)
			ss_qpool_get_stats(&dc->qpool, &st->qp_ready, &st->qp_taken, &st->qp_own);
	}
}

void ss_worker_get_stats(struct ss_worker *w, struct ss_worker_stats *st)
{
	pthread_mutex_lock(&w->lock);
	worker_stats_locked(w, st);
	pthread_mutex_unlock(&w->lock);
}

void ss_worker_publish(struct ss_worker *w, struct ss_worker_stats *pub)
{
	atomic_store_explicit(&w->pub, pub, memory_order_release);
	ss_worker_wake(w);
}

/*
 * Refreshes the published statistics once a second; returns the epoll
 * timeout until the next. Never waits for the worker's lock: a device being
 * opened holds it for a long time (100-350 ms in the guest), and this
 * thread's other work must go on meanwhile; it tries again 10 ms later.
 */
static int refresh_stats(struct ss_worker *w, uint64_t now)
{
	struct ss_worker_stats *pub = atomic_load_explicit(&w->pub, memory_order_acquire), st;

	if (!pub)
		return -1;
	if (now >= w->pub_next_ms) {
		if (pthread_mutex_trylock(&w->lock) != 0)
			return 10;
		worker_stats_locked(w, &st);
		pthread_mutex_unlock(&w->lock);
		*pub = st;
		w->pub_next_ms = now + 1000;
	}
	return (int)(w->pub_next_ms - now);
}

void ss_worker_bury(struct ss_worker *w, struct ss_conn *c)
{
	pthread_mutex_lock(&w->tasks_lock);
	*ss_conn_grave_next_p(c) = w->graveyard;
	w->graveyard = c;
	pthread_mutex_unlock(&w->tasks_lock);
	ss_worker_wake(w);
}

void ss_worker_timer_arm(struct ss_worker *w, struct ss_timer *t, uint64_t at)
{
	bool earliest;

	pthread_mutex_lock(&w->tasks_lock);
	if (ss_timers_arm(&w->timers, t, at) != 0)
		ss_log_error("no memory for a timer: a deadline is lost");
	earliest = ss_timers_next(&w->timers) == at && at < w->sleep_until;
	pthread_mutex_unlock(&w->tasks_lock);
	/* The thread sleeps until a later deadline: it must look again. */
	if (earliest)
		ss_worker_wake(w);
}

void ss_worker_timer_cancel(struct ss_worker *w, struct ss_timer *t)
{
	pthread_mutex_lock(&w->tasks_lock);
	ss_timers_cancel(&w->timers, t);
	pthread_mutex_unlock(&w->tasks_lock);
}

int ss_worker_watch(struct ss_worker *w, struct ss_watch *wt, int fd, unsigned events)
{
	struct epoll_event ev = {.events = events | EPOLLONESHOT, .data.ptr = &wt->tag};

	atomic_store_explicit(&wt->tag, SS_TAG_WATCH, memory_order_release);
	if (wt->added && wt->fd == fd && ss_sys_epoll_ctl(w->epfd, EPOLL_CTL_MOD, fd, &ev) == 0)
		return 0;
	if (wt->added && wt->fd != fd)
		ss_sys_epoll_ctl(w->epfd, EPOLL_CTL_DEL, wt->fd, NULL);
	wt->fd = fd;
	if (ss_sys_epoll_ctl(w->epfd, EPOLL_CTL_ADD, fd, &ev) != 0 &&
	    (errno != EEXIST || ss_sys_epoll_ctl(w->epfd, EPOLL_CTL_MOD, fd, &ev) != 0)) {
		wt->added = false;
		return -errno;
	}
	wt->added = true;
	return 0;
}

void ss_worker_unwatch(struct ss_worker *w, struct ss_watch *wt)
{
	if (wt->added)
		ss_sys_epoll_ctl(w->epfd, EPOLL_CTL_DEL, wt->fd, NULL);
	wt->added = false;
}

/* Queues d; returns whether the progress thread must be woken for it. */
static bool worker_queue_deferred(struct ss_worker *w, struct ss_defer *d, bool lazy)
{
	bool wake;

	pthread_mutex_lock(&w->tasks_lock);
	d->next = w->deferred;
	w->deferred = d;
	wake = !lazy || ++w->deferred_lazy >= SS_DEFER_LAZY_MAX;
	pthread_mutex_unlock(&w->tasks_lock);
	return wake;
}

void ss_worker_defer(struct ss_worker *w, struct ss_defer *d)
{
	if (worker_queue_deferred(w, d, false))
		ss_worker_wake(w);
}

void ss_worker_defer_lazy(struct ss_worker *w, struct ss_defer *d)
{
	if (worker_queue_deferred(w, d, true))
		ss_worker_wake(w);
}

/* Runs the deferred work (progress thread, between event batches). */
static void run_deferred(struct ss_worker *w)
{
	struct ss_defer *d, *next;

	pthread_mutex_lock(&w->tasks_lock);
	d = w->deferred;
	w->deferred = NULL;
	w->deferred_lazy = 0;
	pthread_mutex_unlock(&w->tasks_lock);
	for (; d; d = next) {
		next = d->next;
		d->fn(d);
	}
}

static void drain_channel(struct ss_devctx *dc)
{
	struct ibv_cq *cq;
	void *ctx;

	/* Non-blocking channel: returns -1 once no event is left. */
	while (ibv_get_cq_event(dc->ch, &cq, &ctx) == 0)
		ss_cqs_on_event(ss_cqs_from_tag(ctx), cq);
}

/* ---- waiting in application threads ---- */

static struct ss_devctx *worker_first_dev(struct ss_worker *w)
{
	return atomic_load_explicit(&w->devs, memory_order_acquire);
}

int ss_worker_poll(struct ss_worker *w)
{
	int n = 0;

	for (struct ss_devctx *dc = worker_first_dev(w); dc; dc = dc->next) {
		int k = ss_cqs_try_poll(&dc->cqs);

		n += k > 0 ? k : 0;
	}
	return n;
}

int ss_worker_arm(struct ss_worker *w)
{
	int n = 0;

	for (struct ss_devctx *dc = worker_first_dev(w); dc; dc = dc->next)
		n += ss_cqs_arm(&dc->cqs);
	return n;
}

int ss_worker_event_fds(struct ss_worker *w, int *fds, int max, unsigned *gen_p)
{
	int n = 0;

	*gen_p = atomic_load_explicit(&w->n_devs, memory_order_acquire);
	for (struct ss_devctx *dc = worker_first_dev(w); dc && n < max; dc = dc->next)
		fds[n++] = dc->ch->fd;
	return n;
}

int ss_worker_own_fds(struct ss_worker *w, int *fds, int max)
{
	int n = 0;

#define OWN_FD(fd)                                                                                 \
	do {                                                                                       \
		if (n < max)                                                                       \
			fds[n] = (fd);                                                             \
		n++;                                                                               \
	} while (0)
	OWN_FD(w->epfd);
	OWN_FD(w->evfd);
	/* The list only grows, at its head: walked without the lock. */
	for (struct ss_devctx *dc = worker_first_dev(w); dc; dc = dc->next) {
		OWN_FD(dc->ch->fd);
		OWN_FD(dc->dev->ctx->cmd_fd);
		OWN_FD(dc->dev->ctx->async_fd);
	}
#undef OWN_FD
	return n;
}

void ss_worker_take_events(struct ss_worker *w)
{
	for (struct ss_devctx *dc = worker_first_dev(w); dc; dc = dc->next)
		drain_channel(dc);
}

void ss_worker_pollers(struct ss_worker *w, int delta)
{
	for (struct ss_devctx *dc = worker_first_dev(w); dc; dc = dc->next) {
		if (delta > 0)
			ss_cqs_poll_begin(&dc->cqs);
		else
			ss_cqs_poll_end(&dc->cqs);
	}
}

/*
 * The progress thread watches the channels only while it must take CQ
 * events: an application thread asleep on them takes its own, and a
 * second thread woken by the same event would only cost a thread hop and
 * the poll lock. The tasks lock orders a change against the other.
 */
static void worker_watch_channels(struct ss_worker *w, bool on)
{
	pthread_mutex_lock(&w->tasks_lock);
	for (struct ss_devctx *dc = worker_first_dev(w); dc; dc = dc->next) {
		struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &dc->ep_tag};

		if (dc->ch_watched != on &&
		    ss_sys_epoll_ctl(w->epfd, on ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, dc->ch->fd,
				     &ev) == 0)
			dc->ch_watched = on;
	}
	pthread_mutex_unlock(&w->tasks_lock);
}

void ss_worker_event_users(struct ss_worker *w, int delta)
{
	/*
	 * The first one has the progress thread watch the channels and arms
	 * what is not: events flow to the progress thread from now on.
	 */
	if (atomic_fetch_add(&w->event_users, delta) == 0 && delta > 0) {
		worker_watch_channels(w, true);
		for (struct ss_devctx *dc = worker_first_dev(w); dc; dc = dc->next)
			ss_cqs_progress(&dc->cqs, true);
	}
}

void ss_worker_sleepers(struct ss_worker *w, int delta)
{
	atomic_fetch_add(&w->sleepers, delta);
}

static void drain_async(struct ss_devctx *dc)
{
	struct ibv_async_event ev;

	while (ibv_get_async_event(dc->dev->ctx, &ev) == 0) {
		switch (ev.event_type) {
		case IBV_EVENT_SRQ_LIMIT_REACHED:
			if (atomic_load_explicit(&dc->srq, memory_order_acquire))
				ss_srq_on_limit(
					atomic_load_explicit(&dc->srq, memory_order_acquire));
			break;
		case IBV_EVENT_PORT_ERR:
		case IBV_EVENT_DEVICE_FATAL:
			if (ev.event_type == IBV_EVENT_PORT_ERR &&
			    ev.element.port_num != dc->dev->port)
				break;
			/* Its connections are lost now (not after the transport's retries): those
			 * that can move to TCP do, the others fail; new ones stay on TCP. */
			ss_log_warn("%s: %s: its connections move to TCP, new ones stay on TCP",
				    dc->dev->name, ibv_event_type_str(ev.event_type));
			atomic_store_explicit(&dc->port_down, true, memory_order_release);
			ss_cqs_for_each_conn(&dc->cqs, ss_conn_on_port_down);
			break;
		case IBV_EVENT_PORT_ACTIVE:
			if (ev.element.port_num == dc->dev->port &&
			    atomic_exchange(&dc->port_down, false))
				ss_log_warn("%s: port active again", dc->dev->name);
			break;
		case IBV_EVENT_QP_LAST_WQE_REACHED:
			if (ev.element.qp->qp_context)
				ss_conn_on_last_wqe(ev.element.qp->qp_context);
			break;
		default:
			ss_log_info("%s: async event %s", dc->dev->name,
				    ibv_event_type_str(ev.event_type));
			break;
		}
		ibv_ack_async_event(&ev);
	}
}

/* Runs timers due at now; returns the epoll timeout until the next one (-1: none). */
static int run_timers(struct ss_worker *w, uint64_t now)
{
	uint64_t next;
	struct ss_timer *t;

	for (;;) {
		/* One at a time: a callback may arm or cancel timers. */
		pthread_mutex_lock(&w->tasks_lock);
		t = ss_timers_pop_due(&w->timers, now);
		next = ss_timers_next(&w->timers);
		pthread_mutex_unlock(&w->tasks_lock);
		if (!t)
			break;
		t->fire(t, now);
	}
	return next == UINT64_MAX ? -1 : (int)(next - now);
}

/* Frees buried connections whose time has come; returns the epoll timeout until the next. */
static int free_graveyard(struct ss_worker *w, uint64_t now)
{
	struct ss_conn *c, *next, *keep = NULL;
	uint64_t first = UINT64_MAX;

	pthread_mutex_lock(&w->tasks_lock);
	c = w->graveyard;
	w->graveyard = NULL;
	pthread_mutex_unlock(&w->tasks_lock);
	for (; c; c = next) {
		uint64_t at = ss_conn_free_at(c);

		next = *ss_conn_grave_next_p(c);
		if (at > now) {
			*ss_conn_grave_next_p(c) = keep;
			keep = c;
			first = at < first ? at : first;
			continue;
		}
		ss_conn_free(c);
	}
	if (keep) {
		pthread_mutex_lock(&w->tasks_lock);
		for (c = keep; c; c = next) {
			next = *ss_conn_grave_next_p(c);
			*ss_conn_grave_next_p(c) = w->graveyard;
			w->graveyard = c;
		}
		pthread_mutex_unlock(&w->tasks_lock);
	}
	return first == UINT64_MAX ? -1 : (int)(first - now);
}

/*
 * Records when the coming sleep (timeout ms from now, -1: none) ends, so
 * that arming a timer due no earlier wakes nobody; a timer armed since the
 * timeout was computed shortens it. Returns the timeout to sleep.
 */
static int worker_sleep_until(struct ss_worker *w, uint64_t now, int timeout)
{
	uint64_t next;

	pthread_mutex_lock(&w->tasks_lock);
	next = ss_timers_next(&w->timers);
	if (next != UINT64_MAX && (timeout < 0 || next < now + (uint64_t)timeout))
		timeout = next > now ? (int)(next - now) : 0;
	w->sleep_until = timeout < 0 ? UINT64_MAX : now + (uint64_t)timeout;
	pthread_mutex_unlock(&w->tasks_lock);
	return timeout;
}

static void *progress_main(void *arg)
{
	struct ss_worker *w = arg;
	struct epoll_event evs[64];
	int timeout = -1;

	for (;;) {
		int n = ss_sys_epoll_wait(w->epfd, evs, 64, timeout);

		for (int i = 0; i < n; i++) {
			atomic_int *tag = evs[i].data.ptr;

			switch (atomic_load_explicit(tag, memory_order_acquire)) {
			case SS_TAG_WAKE: {
				uint64_t v;
				if (read(w->evfd, &v, sizeof(v)) < 0) {
					/* Nothing to read: another wake-up took it. */
				}
				/* Devices are only ever added, at the head. */
				for (struct ss_devctx *dc =
					     atomic_load_explicit(&w->devs, memory_order_acquire);
				     dc; dc = dc->next)
					ss_cqs_on_wake(&dc->cqs);
				break;
			}
			case SS_TAG_CHANNEL:
				/*
				 * Nobody needs us to take CQ events: the sleepers take
				 * theirs. Look again after unwatching: an event user that
				 * came meanwhile had the channels watched before we
				 * unwatched them (the worker's lock orders the two).
				 */
				if (!ss_worker_has_event_users(w)) {
					worker_watch_channels(w, false);
					if (!ss_worker_has_event_users(w))
						break;
					worker_watch_channels(w, true);
				}
				drain_channel(
					(struct ss_devctx *)((char *)tag -
							     offsetof(struct ss_devctx, ep_tag)));
				break;
			case SS_TAG_ASYNC:
				drain_async((
					struct ss_devctx *)((char *)tag -
							    offsetof(struct ss_devctx, async_tag)));
				break;
			case SS_TAG_WATCH: {
				struct ss_watch *wt = (struct ss_watch *)tag;

				wt->cb(wt, evs[i].events);
				break;
			}
			}
		}
		run_deferred(w);
		/*
		 * One clock reading per pass for all three: it may be a system
		 * call (a guest's HPET clock), and the thread passes here at
		 * every wake-up. A timer armed by a callback of this pass is
		 * due later than now (its callers read the clock afresh).
		 */
		uint64_t now = ss_now_ms();
		int t_free = free_graveyard(w, now), t_pub = refresh_stats(w, now);

		timeout = run_timers(w, now);
		if (t_free >= 0 && (timeout < 0 || t_free < timeout))
			timeout = t_free;
		if (t_pub >= 0 && (timeout < 0 || t_pub < timeout))
			timeout = t_pub;
		timeout = worker_sleep_until(w, now, timeout);
	}
	return NULL;
}

int ss_worker_get(struct ss_worker **worker_p)
{
	struct epoll_event ev = {.events = EPOLLIN};
	struct ss_worker *w;
	sigset_t all, old;
	int ret = 0;

	pthread_mutex_lock(&worker_lock);
	if (the_worker)
		goto out;
	w = calloc(1, sizeof(*w));
	if (!w) {
		ret = -ENOMEM;
		goto out_unlock;
	}
	pthread_mutex_init(&w->lock, NULL);
	pthread_mutex_init(&w->tasks_lock, NULL);
	w->sleep_until = UINT64_MAX; /* the first sleep has no end */
	atomic_store_explicit(&w->ep_tag, SS_TAG_WAKE, memory_order_release);
	w->epfd = ss_sys_epoll_create();
	w->evfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	ev.data.ptr = &w->ep_tag;
	if (w->epfd < 0 || w->evfd < 0 ||
	    ss_sys_epoll_ctl(w->epfd, EPOLL_CTL_ADD, w->evfd, &ev) < 0) {
		ret = -errno;
		goto err_close;
	}
	/* The progress thread takes no signal: they are the application's. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	ret = -pthread_create(&w->thread, NULL, progress_main, w);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (ret)
		goto err_close;
	/* Named, so that tools and people can find it in /proc/PID/task. */
	pthread_setname_np(w->thread, "srqshim-prog");
	pthread_detach(w->thread);
	the_worker = w;
out:
	*worker_p = the_worker;
	goto out_unlock;
err_close:
	ss_log_error("cannot start the progress thread: %s", strerror(-ret));
	if (w->epfd >= 0)
		close(w->epfd);
	if (w->evfd >= 0)
		close(w->evfd);
	free(w);
out_unlock:
	pthread_mutex_unlock(&worker_lock);
	return ret;
}

void ss_worker_forget_after_fork(void)
{
	/* The parent's worker, its thread (absent here) and its verbs objects stay untouched. */
	pthread_mutex_init(&worker_lock, NULL);
	the_worker = NULL;
}
