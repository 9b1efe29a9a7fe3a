#include "transport/srq.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>

#include "transport/log.h"
#include "transport/worker.h"

/* Largest send CQ made (rxe rounds entries + 1 up to a power of two); a QP reserves its send queue depth in one. */
#define SS_TXCQ_MAX 4095u

struct ss_srq *ss_srq_from_tag(int *tag)
{
	return (struct ss_srq *)((char *)tag - offsetof(struct ss_srq, cq_tag));
}

/* Posts a chain of blocks (linked by next), up to 16 receives per call. */
static int post_blocks(struct ss_srq *s, struct ss_blk *head)
{
	struct ibv_recv_wr wr[16], *bad;
	struct ibv_sge sge[16];
	int ret = 0;

	while (head) {
		uint32_t n = 0;

		for (; head && n < 16; head = head->next, n++) {
			sge[n] = (struct ibv_sge){.addr = (uintptr_t)head->addr,
						  .length = s->cfg.buf_size, .lkey = head->lkey};
			wr[n] = (struct ibv_recv_wr){.wr_id = (uintptr_t)head, .sg_list = &sge[n],
						     .num_sge = 1, .next = &wr[n + 1]};
		}
		wr[n - 1].next = NULL;
		ret = ibv_post_srq_recv(s->srq, wr, &bad);
		if (ret) {
			/* Never expected (the SRQ holds every block): those from bad on go back. */
			ss_log_error("ibv_post_srq_recv: %s", strerror(ret));
			for (struct ibv_recv_wr *w = bad; w; w = w->next, n--)
				ss_pool_put(&s->rx, (struct ss_blk *)(uintptr_t)w->wr_id);
			ret = -ret;
		}
		atomic_fetch_add_explicit(&s->posted, n, memory_order_relaxed);
	}
	return ret;
}

void ss_srq_repost(struct ss_srq *s, struct ss_blk *chain)
{
	post_blocks(s, chain);
}

/*
 * The SRQ limit: below it the progress thread grows the pool, or, once at
 * its bound, makes every connection copy its unread blocks out (unread
 * data under the per-connection watermark of several slow readers could
 * otherwise hold the whole pool and starve everyone else).
 */
static void arm_limit(struct ss_srq *s)
{
	struct ibv_srq_attr attr = {.srq_limit = s->cfg.initial / 4 ? s->cfg.initial / 4 : 1};
	int ret;

	ret = ibv_modify_srq(s->srq, &attr, IBV_SRQ_LIMIT);
	if (ret) {
		ss_log_warn("ibv_modify_srq(limit %u): %s", attr.srq_limit, strerror(ret));
		s->limit = 0;
		return;
	}
	s->limit = attr.srq_limit;
}

static int grow(struct ss_srq *s, uint32_t n)
{
	struct ss_blk *head;
	int got = ss_pool_grow(&s->rx, n);

	if (got <= 0)
		return got;
	ss_pool_get_many(&s->rx, &head, (uint32_t)got);
	post_blocks(s, head);
	return got;
}

int ss_srq_create(struct ss_worker *w, struct ss_devctx *dc, const struct ss_srq_cfg *cfg,
		  struct ss_srq **srq_p)
{
	struct ibv_device_attr da;
	struct ss_srq *s;
	int ret;

	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->cq_tag = SS_TAG_SRQ;
	s->dc = dc;
	s->w = w;
	s->cfg = *cfg;
	pthread_mutex_init(&s->poll_lock, NULL);
	if (ibv_query_device(dc->dev->ctx, &da)) {
		ret = -EIO;
		goto err_free;
	}
	s->max_cqe = (uint32_t)da.max_cqe;
	/* Every block of the pool may be posted, and complete, at once: the receive CQ holds them all. */
	if (s->cfg.max_blks > s->max_cqe)
		s->cfg.max_blks = s->max_cqe;
	if (s->cfg.max_blks > (uint32_t)da.max_srq_wr)
		s->cfg.max_blks = (uint32_t)da.max_srq_wr;
	if (s->cfg.initial > s->cfg.max_blks)
		s->cfg.initial = s->cfg.max_blks;
	struct ibv_srq_init_attr sa = {.attr = {.max_wr = s->cfg.max_blks, .max_sge = 1}};
	s->srq = ibv_create_srq(dc->pd, &sa);
	if (!s->srq) {
		ret = errno ? -errno : -ENOMEM;
		ss_log_error("ibv_create_srq(%u receives): %s", s->cfg.max_blks, strerror(-ret));
		goto err_free;
	}
	s->rcq = ibv_create_cq(dc->dev->ctx, (int)s->cfg.max_blks, &s->cq_tag, dc->ch, 0);
	if (!s->rcq) {
		ret = errno ? -errno : -ENOMEM;
		ss_log_error("ibv_create_cq(%u): %s", s->cfg.max_blks, strerror(-ret));
		goto err_destroy_srq;
	}
	ret = ss_pool_init(&s->rx, dc->pd, s->cfg.buf_size, s->cfg.initial, s->cfg.max_blks, 0);
	if (ret == 0 && grow(s, s->cfg.initial) <= 0)
		ret = -ENOMEM;
	if (ret)
		goto err_destroy_cq;
	if (ibv_req_notify_cq(s->rcq, 0) == 0)
		s->rcq_armed = 1;
	arm_limit(s);
	ss_log_info("%s: SRQ with %u receives of %u bytes (bound %u)", dc->dev->name,
		    s->cfg.initial, s->cfg.buf_size, s->cfg.max_blks);
	*srq_p = s;
	return 0;

err_destroy_cq:
	ss_pool_fini(&s->rx);
	ibv_destroy_cq(s->rcq);
err_destroy_srq:
	ibv_destroy_srq(s->srq);
err_free:
	free(s);
	return ret;
}

int ss_srq_reserve_tx(struct ss_srq *s, uint32_t sq_depth, struct ss_txcq **txcq_p)
{
	struct ss_txcq *t;
	int ret = 0;

	pthread_mutex_lock(&s->poll_lock);
	for (t = s->txcqs; t; t = t->next)
		if (t->size - t->used >= sq_depth)
			goto found;
	/* A failed QP flushes its whole send queue: the CQ must hold every request. */
	t = calloc(1, sizeof(*t));
	if (!t) {
		ret = -ENOMEM;
		goto out;
	}
	t->size = s->max_cqe < SS_TXCQ_MAX ? s->max_cqe : SS_TXCQ_MAX;
	if (t->size < sq_depth) {
		free(t);
		ret = -EINVAL;
		goto out;
	}
	t->cq = ibv_create_cq(s->dc->dev->ctx, (int)t->size, &s->cq_tag, s->dc->ch, 0);
	if (!t->cq) {
		ret = errno ? -errno : -ENOMEM;
		ss_log_error("ibv_create_cq(%u): %s", t->size, strerror(-ret));
		free(t);
		goto out;
	}
	t->next = s->txcqs;
	s->txcqs = t;
found:
	t->used += sq_depth;
	*txcq_p = t;
out:
	pthread_mutex_unlock(&s->poll_lock);
	return ret;
}

void ss_srq_unreserve_tx(struct ss_srq *s, struct ss_txcq *txcq, uint32_t sq_depth)
{
	if (!txcq)
		return;
	pthread_mutex_lock(&s->poll_lock);
	txcq->used -= sq_depth;
	pthread_mutex_unlock(&s->poll_lock);
}

/* ---- the QP number map (poll lock held) ---- */

static uint32_t slot_of(const struct ss_srq *s, uint32_t qpn)
{
	return (qpn * 2654435761u) & (s->map_cap - 1);
}

static struct ss_conn *map_find(const struct ss_srq *s, uint32_t qpn)
{
	if (!s->map_cap)
		return NULL;
	for (uint32_t i = slot_of(s, qpn);; i = (i + 1) & (s->map_cap - 1)) {
		if (s->map_qpn[i] == qpn)
			return s->map_conn[i];
		if (s->map_qpn[i] == 0)
			return NULL;
	}
}

static void map_put(struct ss_srq *s, uint32_t qpn, struct ss_conn *c)
{
	uint32_t i = slot_of(s, qpn);

	while (s->map_qpn[i] != 0 && s->map_qpn[i] != qpn)
		i = (i + 1) & (s->map_cap - 1);
	if (s->map_qpn[i] == 0)
		s->map_n++;
	s->map_qpn[i] = qpn;
	s->map_conn[i] = c;
}

static int map_grow(struct ss_srq *s)
{
	uint32_t old_cap = s->map_cap, *old_qpn = s->map_qpn;
	struct ss_conn **old_conn = s->map_conn;
	uint32_t cap = old_cap ? old_cap * 2 : 64;

	s->map_qpn = calloc(cap, sizeof(*s->map_qpn));
	s->map_conn = calloc(cap, sizeof(*s->map_conn));
	if (!s->map_qpn || !s->map_conn) {
		free(s->map_qpn);
		free(s->map_conn);
		s->map_qpn = old_qpn;
		s->map_conn = old_conn;
		return -ENOMEM;
	}
	s->map_cap = cap;
	s->map_n = 0;
	for (uint32_t i = 0; i < old_cap; i++)
		if (old_qpn[i])
			map_put(s, old_qpn[i], old_conn[i]);
	free(old_qpn);
	free(old_conn);
	return 0;
}

/* Removes qpn; later entries of its probe run move up (no tombstones). */
static void map_del(struct ss_srq *s, uint32_t qpn)
{
	uint32_t mask = s->map_cap - 1, i, j;

	if (!s->map_cap)
		return;
	for (i = slot_of(s, qpn); s->map_qpn[i] != qpn; i = (i + 1) & mask)
		if (s->map_qpn[i] == 0)
			return;
	s->map_qpn[i] = 0;
	s->map_n--;
	for (j = (i + 1) & mask; s->map_qpn[j]; j = (j + 1) & mask) {
		uint32_t home = slot_of(s, s->map_qpn[j]);

		/* Move j into the hole at i unless its home lies cyclically in (i, j]. */
		if ((j > i && (home <= i || home > j)) || (j < i && home <= i && home > j)) {
			s->map_qpn[i] = s->map_qpn[j];
			s->map_conn[i] = s->map_conn[j];
			s->map_qpn[j] = 0;
			i = j;
		}
	}
}

int ss_srq_attach(struct ss_srq *s, struct ibv_qp *qp, struct ss_conn *c)
{
	int ret = 0;

	pthread_mutex_lock(&s->poll_lock);
	if ((s->map_n + 1) * 2 > s->map_cap)
		ret = map_grow(s);
	if (ret == 0)
		map_put(s, qp->qp_num, c);
	pthread_mutex_unlock(&s->poll_lock);
	return ret;
}

/* ---- polling ---- */

/* Hands completions polled from the receive CQ (recv) or a send CQ to their connections. */
static void dispatch(struct ss_srq *s, struct ibv_wc *wc, int n, bool recv)
{
	uint32_t rx_done = recv ? (uint32_t)n : 0;

	if (rx_done) {
		uint32_t held = ss_pool_made(&s->rx) -
				(atomic_fetch_sub_explicit(&s->posted, rx_done, memory_order_relaxed) - rx_done);

		if (held > s->peak_held)
			s->peak_held = held;
	}
	/* Runs of one QP's completions go to its connection in one call, in order. */
	for (int i = 0; i < n;) {
		int j = i + 1;
		struct ss_conn *c;

		while (j < n && wc[j].qp_num == wc[i].qp_num)
			j++;
		c = map_find(s, wc[i].qp_num);
		if (c) {
			ss_conn_on_wcs(c, &wc[i], j - i, recv);
		} else {
			/* Cannot happen while the map rules hold; a receive block still goes back. */
			for (int k = i; k < j && recv; k++) {
				struct ss_blk *b = (struct ss_blk *)(uintptr_t)wc[k].wr_id;

				b->next = NULL;
				ss_srq_repost(s, b);
			}
			ss_log_warn("completion for unknown QP %u", wc[i].qp_num);
		}
		i = j;
	}
}

static int poll_dry(struct ss_srq *s, struct ibv_cq *cq)
{
	struct ibv_wc wc[32];
	int n, total = 0;

	do {
		n = ibv_poll_cq(cq, 32, wc);
		if (n < 0) {
			ss_log_error("ibv_poll_cq: %d", n);
			return total;
		}
		dispatch(s, wc, n, cq == s->rcq);
		total += n;
	} while (n == 32);
	return total;
}

static int poll_all(struct ss_srq *s)
{
	int n = poll_dry(s, s->rcq);

	for (struct ss_txcq *t = s->txcqs; t; t = t->next)
		n += poll_dry(s, t->cq);
	return n;
}

static void arm(struct ss_srq *s)
{
	if (!s->rcq_armed && ibv_req_notify_cq(s->rcq, 0) == 0)
		s->rcq_armed = 1;
	if (!atomic_load_explicit(&s->tx_waiters, memory_order_acquire))
		return;
	for (struct ss_txcq *t = s->txcqs; t; t = t->next)
		if (!t->armed && ibv_req_notify_cq(t->cq, 0) == 0)
			t->armed = 1;
}

void ss_srq_progress(struct ss_srq *s, int rearm)
{
	pthread_mutex_lock(&s->poll_lock);
	poll_all(s);
	if (rearm && !atomic_load_explicit(&s->spinners, memory_order_acquire)) {
		arm(s);
		poll_all(s);
	}
	pthread_mutex_unlock(&s->poll_lock);
}

bool ss_srq_try_progress(struct ss_srq *s)
{
	if (pthread_mutex_trylock(&s->poll_lock) != 0)
		return false;
	poll_all(s);
	pthread_mutex_unlock(&s->poll_lock);
	return true;
}

void ss_srq_want_tx(struct ss_srq *s, bool want)
{
	/* The first waiter wakes the progress thread, which arms the send CQs. */
	if (!want)
		atomic_fetch_sub(&s->tx_waiters, 1);
	else if (atomic_fetch_add(&s->tx_waiters, 1) == 0)
		ss_worker_wake(s->w);
}

void ss_srq_on_wake(struct ss_srq *s)
{
	int unarmed = 0;

	if (!atomic_load_explicit(&s->tx_waiters, memory_order_acquire))
		return;
	pthread_mutex_lock(&s->poll_lock);
	for (struct ss_txcq *t = s->txcqs; t; t = t->next)
		unarmed |= !t->armed;
	pthread_mutex_unlock(&s->poll_lock);
	if (unarmed)
		ss_srq_progress(s, 1);
}

void ss_srq_on_cq_event(struct ss_srq *s, struct ibv_cq *cq)
{
	pthread_mutex_lock(&s->poll_lock);
	/* Events are acknowledged in batches; all of them before a CQ is destroyed. */
	if (cq == s->rcq) {
		s->rcq_armed = 0;
		if (++s->rcq_unacked >= 64) {
			ibv_ack_cq_events(cq, s->rcq_unacked);
			s->rcq_unacked = 0;
		}
	}
	for (struct ss_txcq *t = s->txcqs; t; t = t->next)
		if (t->cq == cq) {
			t->armed = 0;
			if (++t->unacked >= 64) {
				ibv_ack_cq_events(cq, t->unacked);
				t->unacked = 0;
			}
		}
	pthread_mutex_unlock(&s->poll_lock);
	ss_srq_progress(s, 1);
}

void ss_srq_on_limit(struct ss_srq *s)
{
	int got;

	s->limit_events++;
	got = grow(s, s->cfg.initial);
	if (got > 0) {
		ss_log_info("SRQ limit reached: pool grown by %d to %u blocks (bound %u)", got,
			    ss_pool_made(&s->rx), s->rx.max_blks);
	} else {
		/* At the bound: unread data leaves the pool (poll lock before connection locks). */
		pthread_mutex_lock(&s->poll_lock);
		for (uint32_t i = 0; i < s->map_cap; i++)
			if (s->map_qpn[i])
				ss_conn_unpin(s->map_conn[i]);
		pthread_mutex_unlock(&s->poll_lock);
		s->unpins++;
	}
	arm_limit(s);
}

void ss_srq_spin_begin(struct ss_srq *s)
{
	atomic_fetch_add(&s->spinners, 1);
}

void ss_srq_spin_end(struct ss_srq *s)
{
	/* The last spinner leaves: events must flow again, with nothing lost between. */
	if (atomic_fetch_sub(&s->spinners, 1) == 1)
		ss_srq_progress(s, 1);
}

void ss_srq_detach(struct ss_srq *s, struct ibv_qp *qp)
{
	uint32_t qpn = qp->qp_num;
	int ret;

	pthread_mutex_lock(&s->poll_lock);
	ret = ibv_destroy_qp(qp);
	if (ret)
		ss_log_error("ibv_destroy_qp(%u): %s", qpn, strerror(ret));
	/* Its last completions (flushed sends, receives) still reach its connection. */
	poll_all(s);
	map_del(s, qpn);
	pthread_mutex_unlock(&s->poll_lock);
}

uint32_t ss_srq_free_capacity(struct ss_srq *s)
{
	uint32_t posted = atomic_load_explicit(&s->posted, memory_order_relaxed);
	uint32_t room = s->rx.max_blks - ss_pool_made(&s->rx);

	return posted + room;
}

void ss_srq_get_stats(struct ss_srq *s, struct ss_srq_stats *st)
{
	pthread_mutex_lock(&s->rx.lock);
	st->pool_blks = ss_pool_made(&s->rx);
	st->pool_max = s->rx.max_blks;
	st->reg_bytes = s->rx.reg_bytes;
	pthread_mutex_unlock(&s->rx.lock);
	st->posted = atomic_load_explicit(&s->posted, memory_order_relaxed);
	st->peak_held = s->peak_held;
	st->limit_events = s->limit_events;
}
