/*
 * The SRQ backend, the connection's side of it: a QP attached to the
 * worker's shared receive queue (srq.c). Its receive completions land in
 * the SRQ's CQ, its send completions in a reservation of its own; both
 * come from the device's shared CQs (cq.h).
 */
#include "transport/conn_int.h"

#include <stdatomic.h>

#include "transport/qp.h"
#include "transport/qpool.h"
#include "transport/srq.h"
#include "transport/worker.h"

static int srq_setup(struct ss_conn *c, const struct ss_transport_cfg *cfg, struct ss_params *mine)
{
	struct ss_qp_caps caps = ss_qpool_caps(cfg);
	struct ss_qpool_ent e;
	int ret;

	c->srq = atomic_load_explicit(&c->dc->srq, memory_order_acquire);
	c->hold_max = cfg->srq_hold;
	c->rcq = c->srq->rcq;
	ret = ss_qpool_get(c->dc, &caps, c, &e);
	if (ret)
		return ret;
	c->qp = e.qp;
	c->scq = e.scq;
	mine->recv_mode = SS_RECV_SRQ;
	mine->window = cfg->rx_window;
	mine->buf_size = c->srq->cfg.buf_size; /* the SRQ's blocks, whatever cfg says now */
	return 0;
}

static int srq_post_initial(struct ss_conn *c)
{
	(void)c; /* the SRQ is fed already: the initial window is not backed per connection */
	return 0;
}

static void srq_release(struct ss_conn *c, struct ss_blk *b)
{
	b->next = c->rel;
	c->rel = b;
}

static void srq_repost(struct ss_conn *c)
{
	/* Blocks freed since the last push go back in one post. */
	if (c->rel) {
		ss_srq_repost(c->srq, c->rel);
		c->rel = NULL;
	}
}

static void srq_received(struct ss_conn *c, uint32_t n)
{
	ss_srq_taken(c->srq, n);
}

static uint32_t srq_grant_limit(struct ss_conn *c)
{
	uint32_t cap = ss_srq_free_capacity(c->srq);
	uint32_t reserve = c->srq->cfg.initial / 8 + 1; /* kept for control messages */

	return cap > reserve ? cap - reserve : 0;
}

static bool srq_rx_final(struct ss_conn *c)
{
	/* The spec's signal that the QP takes no more from the SRQ, or its bound. */
	return c->last_wqe || ss_now_ms() >= c->lost_at + SS_LAST_WQE_MS;
}

static void srq_teardown(struct ss_conn *c)
{
	ss_cqs_detach(c->cqs, c->qp);
	ss_cqs_unreserve(c->cqs, c->scq, c->sq_depth);
}

const struct backend ss_srq_backend = {
	.setup = srq_setup,
	.post_initial = srq_post_initial,
	.release = srq_release,
	.repost = srq_repost,
	.received = srq_received,
	.grant_limit = srq_grant_limit,
	.rx_final = srq_rx_final,
	.teardown = srq_teardown,
	.shared_receives = true,
};
