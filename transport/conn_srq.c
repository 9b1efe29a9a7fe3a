/*
 * The SRQ backend, the connection's side of it: a QP attached to the
 * worker's shared receive queue (srq.c), whose completions come from shared
 * CQs and are handed over by whoever polls them.
 */
#include "transport/conn_int.h"

#include <sched.h>
#include <stdatomic.h>

#include "transport/qp.h"
#include "transport/srq.h"
#include "transport/worker.h"

static int srq_setup(struct ss_conn *c, const struct ss_transport_cfg *cfg, struct ss_params *mine)
{
	struct ss_qp_caps caps = {cfg->sq_depth, 0, cfg->max_inline};
	int ret;

	c->srq = atomic_load_explicit(&c->dc->srq, memory_order_acquire);
	c->hold_max = cfg->srq_hold;
	ret = ss_srq_reserve_tx(c->srq, cfg->sq_depth, &c->txcq);
	if (ret)
		return ret;
	c->cq = c->srq->rcq;
	c->scq = c->txcq->cq;
	ret = ss_qp_create_rc(c->dc->pd, c->scq, c->cq, c->srq->srq, &caps, c, &c->qp);
	if (ret)
		goto err_unreserve;
	ret = ss_srq_attach(c->srq, c->qp, c);
	if (ret)
		goto err_destroy_qp;
	mine->recv_mode = SS_RECV_SRQ;
	mine->window = cfg->rx_window;
	mine->buf_size = c->srq->cfg.buf_size; /* the SRQ's blocks, whatever cfg says now */
	return 0;

err_destroy_qp:
	ibv_destroy_qp(c->qp);
err_unreserve:
	ss_srq_unreserve_tx(c->srq, c->txcq, cfg->sq_depth);
	return ret;
}

static int srq_post_initial(struct ss_conn *c)
{
	(void)c; /* the SRQ is fed already: the initial window is not backed per connection */
	return 0;
}

/* Posts what may go; completions come from the shared CQs, with events only when we wait for them. */
static void srq_push(struct ss_conn *c)
{
	bool wait;

	/* Blocks freed since the last push go back in one post. */
	if (c->rel) {
		ss_srq_repost(c->srq, c->rel);
		c->rel = NULL;
	}
	ss_conn_flush(c);
	wait = c->st == ST_RUNNING && ss_conn_send_waiters(c);
	if (wait != c->tx_wait) {
		c->tx_wait = wait;
		ss_srq_want_tx(c->srq, wait);
	}
}

static void srq_release(struct ss_conn *c, struct ss_blk *b)
{
	b->next = c->rel;
	c->rel = b;
}

static void srq_progress(struct ss_conn *c)
{
	/* Completions are the shared CQs' business: take them with our lock dropped. */
	pthread_mutex_unlock(&c->lock);
	ss_srq_progress(c->srq, 0);
	pthread_mutex_lock(&c->lock);
	if (c->st != ST_DEAD)
		ss_conn_after_events(c, false);
}

static bool srq_spin(struct ss_conn *c, unsigned usec)
{
	uint64_t end = ss_now_us() + usec;
	uint32_t seen = atomic_load_explicit(&c->seen, memory_order_acquire);
	bool got = false;

	pthread_mutex_lock(&c->lock);
	c->spinners++;
	pthread_mutex_unlock(&c->lock);
	ss_srq_spin_begin(c->srq);
	for (;;) {
		ss_srq_try_progress(c->srq);
		if (atomic_load_explicit(&c->seen, memory_order_acquire) != seen) {
			got = true;
			break;
		}
		if (ss_now_us() >= end)
			break;
		sched_yield();
	}
	pthread_mutex_lock(&c->lock);
	c->spinners--;
	pthread_mutex_unlock(&c->lock);
	ss_srq_spin_end(c->srq); /* re-arms and polls: may hand us more */
	pthread_mutex_lock(&c->lock);
	if (atomic_load_explicit(&c->seen, memory_order_acquire) != seen || c->st != ST_RUNNING)
		got = true;
	if (!got && !c->spinners)
		ss_conn_report(c, false);
	pthread_mutex_unlock(&c->lock);
	return got;
}

static uint32_t srq_grant_limit(struct ss_conn *c)
{
	uint32_t cap = ss_srq_free_capacity(c->srq);
	uint32_t reserve = c->srq->cfg.initial / 8 + 1; /* kept for control messages */

	return cap > reserve ? cap - reserve : 0;
}

static void srq_teardown(struct ss_conn *c)
{
	ss_srq_detach(c->srq, c->qp);
	ss_srq_unreserve_tx(c->srq, c->txcq, c->sq_depth);
}

const struct backend ss_srq_backend = {
	.setup = srq_setup,
	.post_initial = srq_post_initial,
	.release = srq_release,
	.progress = srq_progress,
	.spin = srq_spin,
	.grant_limit = srq_grant_limit,
	.push = srq_push,
	.teardown = srq_teardown,
};
