#include "transport/srq.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "transport/cq.h"
#include "transport/handoff.h"
#include "transport/log.h"
#include "transport/worker.h"

/* Posts a chain of blocks (linked by next), up to 16 receives per call. */
static int srq_post_blocks(struct ss_srq *s, struct ss_blk *head)
{
	struct ibv_recv_wr wr[16], *bad;
	struct ibv_sge sge[16];
	int ret = 0;

	while (head) {
		uint32_t n = 0;

		for (; head && n < 16; head = head->next, n++) {
			sge[n] = (struct ibv_sge){.addr = (uintptr_t)head->addr,
						  .length = s->cfg.buf_size,
						  .lkey = head->lkey};
			wr[n] = (struct ibv_recv_wr){.wr_id = (uintptr_t)head,
						     .sg_list = &sge[n],
						     .num_sge = 1,
						     .next = &wr[n + 1]};
		}
		wr[n - 1].next = NULL;
		/* Hand-offs after the last look at the chain (its next links) and before the
		 * post. */
		for (uint32_t i = 0; i < n; i++)
			ss_handoff_post((void *)(uintptr_t)wr[i].wr_id);
		/* Counted first: another thread may take a completion of one before the call
		 * returns.
		 */
		atomic_fetch_add_explicit(&s->posted, n, memory_order_seq_cst);
		ret = ibv_post_srq_recv(s->srq, wr, &bad);
		if (ret) {
			uint32_t back = 0;

			/* Never expected (the SRQ holds every block): those from bad on go back. */
			ss_log_error("ibv_post_srq_recv: %s", strerror(ret));
			for (struct ibv_recv_wr *w = bad; w; w = w->next, back++)
				ss_pool_put(&s->rx, (struct ss_blk *)(uintptr_t)w->wr_id);
			atomic_fetch_sub_explicit(&s->posted, back, memory_order_seq_cst);
			ret = -ret;
		}
	}
	return ret;
}

void ss_srq_repost(struct ss_srq *s, struct ss_blk *chain)
{
	srq_post_blocks(s, chain);
}

/*
 * The SRQ limit: below it the progress thread grows the pool, or, once at
 * its bound, makes every connection copy its unread blocks out (unread
 * data under the per-connection watermark of several slow readers could
 * otherwise hold the whole pool and starve everyone else).
 */
static void srq_arm_limit(struct ss_srq *s)
{
	struct ibv_srq_attr attr = {.srq_limit = s->low_mark};
	int ret;

	/* Without the event, the completions' own look (ss_srq_taken) still sees a low pool. */
	ret = ibv_modify_srq(s->srq, &attr, IBV_SRQ_LIMIT);
	if (ret)
		ss_log_warn("ibv_modify_srq(limit %u): %s", attr.srq_limit, strerror(ret));
}

static int srq_grow(struct ss_srq *s, uint32_t n)
{
	struct ss_blk *head;
	int got = ss_pool_grow(&s->rx, n);

	if (got <= 0)
		return got;
	ss_pool_get_many(&s->rx, &head, (uint32_t)got);
	srq_post_blocks(s, head);
	return got;
}

/* The pool is low: grows it, or at its bound has unread blocks copied out; re-arms the limit. */
static void srq_low(struct ss_srq *s)
{
	int got;

	got = srq_grow(s, s->cfg.initial);
	if (got > 0) {
		ss_log_info("SRQ low: pool grown by %d to %u blocks (bound %u)", got,
			    ss_pool_made(&s->rx), s->rx.max_blks);
	} else {
		/* At the bound: unread data leaves the pool (poll lock before connection locks). */
		ss_cqs_for_each_conn(&s->dc->cqs, ss_conn_unpin);
		s->unpins++;
	}
	if (s->cfg.test_rearm_ms)
		usleep(s->cfg.test_rearm_ms * 1000);
	srq_arm_limit(s);
}

/* Deferred work (progress thread): the low pool a completion saw, unless mended since. */
static void srq_low_deferred(struct ss_defer *d)
{
	struct ss_srq *s = (struct ss_srq *)((char *)d - offsetof(struct ss_srq, low));

	atomic_store(&s->low_queued, false);
	if (atomic_load(&s->posted) < s->low_mark)
		srq_low(s);
}

int ss_srq_create(struct ss_devctx *dc, const struct ss_srq_cfg *cfg, struct ss_srq **srq_p)
{
	struct ibv_device_attr da;
	struct ss_srq *s;
	int ret;

	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->dc = dc;
	s->cfg = *cfg;
	if (ibv_query_device(dc->dev->ctx, &da)) {
		ret = -EIO;
		goto err_free;
	}
	/* Every block of the pool may be posted, and complete, at once: the receive CQ holds them
	 * all. */
	if (s->cfg.max_blks > (uint32_t)da.max_cqe)
		s->cfg.max_blks = (uint32_t)da.max_cqe;
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
	ret = ss_cqs_reserve(&dc->cqs, true, s->cfg.max_blks, &s->rcq);
	if (ret)
		goto err_destroy_srq;
	ret = ss_pool_init(&s->rx, dc->pd, s->cfg.buf_size, s->cfg.initial, s->cfg.max_blks, 0);
	if (ret == 0 && srq_grow(s, s->cfg.initial) <= 0)
		ret = -ENOMEM;
	if (ret)
		goto err_unreserve;
	s->low_mark = s->cfg.initial / 4 ? s->cfg.initial / 4 : 1;
	s->low.fn = srq_low_deferred;
	srq_arm_limit(s);
	ss_log_info("%s: SRQ with %u receives of %u bytes (bound %u)", dc->dev->name,
		    s->cfg.initial, s->cfg.buf_size, s->cfg.max_blks);
	*srq_p = s;
	return 0;

err_unreserve:
	ss_pool_fini(&s->rx);
	ss_cqs_unreserve(&dc->cqs, s->rcq, s->cfg.max_blks);
err_destroy_srq:
	ibv_destroy_srq(s->srq);
err_free:
	free(s);
	return ret;
}

void ss_srq_taken(struct ss_srq *s, uint32_t n)
{
	/* seq_cst with low_queued: the deferred work clears it, then reads posted. */
	uint32_t posted = atomic_fetch_sub_explicit(&s->posted, n, memory_order_seq_cst) - n;
	uint32_t held = ss_pool_made(&s->rx) - posted;
	uint32_t peak = atomic_load_explicit(&s->peak_held, memory_order_relaxed);

	while (held > peak &&
	       !atomic_compare_exchange_weak_explicit(&s->peak_held, &peak, held,
						      memory_order_relaxed, memory_order_relaxed))
		;
	/*
	 * The device raises the limit event only for a receive taken across
	 * the limit: armed when the SRQ was below it already (it drained while
	 * the last event was handled), it never comes, and blocks kept by
	 * readers that do not read could hold the whole pool for good, with
	 * nothing posted (tests/e2e/many.sh's stress stalled so, its server
	 * in a blocking read of a connection whose first message could not
	 * land). So the completions that leave it low ask too. An event and
	 * a completion may both answer one dip: the pool then grows by two
	 * steps (within its bound), or the second unpin finds less to copy.
	 */
	if (posted < s->low_mark && !atomic_exchange(&s->low_queued, true))
		ss_worker_defer(s->dc->cqs.w, &s->low);
}

void ss_srq_on_limit(struct ss_srq *s)
{
	s->limit_events++;
	srq_low(s);
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
	st->peak_held = atomic_load_explicit(&s->peak_held, memory_order_relaxed);
	st->limit_events = s->limit_events;
	st->unpins = s->unpins;
}
