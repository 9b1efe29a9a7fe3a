/*
 * The private receive queue backend: each connection posts its own
 * registered buffers on its own receive queue, with its own receive and
 * send CQs; every credit it grants is a posted buffer.
 */
#include "transport/conn_int.h"

#include <errno.h>
#include <sched.h>
#include <stddef.h>
#include <string.h>

#include "transport/log.h"
#include "transport/qp.h"
#include "transport/worker.h"

static int rq_post(struct ss_conn *c, struct ss_blk *b)
{
	struct ibv_sge sge = {.addr = (uintptr_t)b->addr, .length = c->buf_size, .lkey = b->lkey};
	struct ibv_recv_wr wr = {.wr_id = (uintptr_t)b, .sg_list = &sge, .num_sge = 1}, *bad;
	int ret = ibv_post_recv(c->qp, &wr, &bad);

	if (ret) {
		ss_log_error("QP %u: ibv_post_recv: %s", c->qp->qp_num, strerror(ret));
		return -ret;
	}
	return 0;
}

static void rq_release(struct ss_conn *c, struct ss_blk *b)
{
	/* A failed QP would only flush it back: keep it. */
	if ((c->st == ST_RUNNING || c->st == ST_CONNECTED) && rq_post(c, b) == 0)
		return;
	ss_pool_put(&c->rxp, b);
}

static int rq_setup(struct ss_conn *c, const struct ss_transport_cfg *cfg, struct ss_params *mine)
{
	uint32_t n_rx = cfg->rx_window + cfg->ctrl_reserve;
	struct ss_qp_caps caps = {cfg->sq_depth, n_rx, cfg->max_inline};
	int ret;

	ret = ss_pool_init(&c->rxp, c->dc->pd, c->buf_size, n_rx, n_rx, 1);
	if (ret)
		goto err_fini;
	/* Each CQ holds every request of its queue: it can never overflow. */
	c->cq = ibv_create_cq(c->dc->dev->ctx, (int)n_rx, &c->cq_tag, c->dc->ch, 0);
	c->scq = ibv_create_cq(c->dc->dev->ctx, (int)cfg->sq_depth, &c->cq_tag, c->dc->ch, 0);
	if (!c->cq || !c->scq) {
		ret = errno ? -errno : -ENOMEM;
		ss_log_error("ibv_create_cq: %s", strerror(-ret));
		goto err_destroy_cq;
	}
	ret = ss_qp_create_rc(c->dc->pd, c->scq, c->cq, NULL, &caps, c, &c->qp);
	if (ret)
		goto err_destroy_cq;
	mine->recv_mode = SS_RECV_RQ;
	mine->window = cfg->rx_window;
	return 0;

err_destroy_cq:
	if (c->scq)
		ibv_destroy_cq(c->scq);
	if (c->cq)
		ibv_destroy_cq(c->cq);
err_fini:
	ss_pool_fini(&c->rxp);
	return ret;
}

static int rq_post_initial(struct ss_conn *c)
{
	struct ss_blk *b;
	int ret = 0;

	while (ret == 0 && (b = ss_pool_get(&c->rxp, 0)))
		ret = rq_post(c, b);
	if (ret == 0 && ibv_req_notify_cq(c->cq, 0) != 0)
		ret = -EIO;
	return ret;
}

/*
 * Polls one of our CQs dry; returns how many completions it took, and sets
 * *edge if new readable data came.
 */
static int rq_poll_dry(struct ss_conn *c, struct ibv_cq *cq, bool *edge)
{
	bool recv = cq == c->cq;
	struct ibv_wc wc[16];
	int n, total = 0;

	do {
		n = ibv_poll_cq(cq, 16, wc);
		if (n < 0) {
			ss_conn_fail(c, "poll_cq failed");
			return total;
		}
		for (int i = 0; i < n; i++)
			*edge |= ss_conn_on_completion(c, &wc[i], recv);
		total += n;
	} while (n == 16);
	return total;
}

/* Takes the send completions there are; arms their CQ when someone will wait for more. */
static void rq_reap_sends(struct ss_conn *c)
{
	bool edge = false;

	rq_poll_dry(c, c->scq, &edge);
	ss_conn_flush(c);
	if (ss_conn_send_waiters(c)) {
		if (ibv_req_notify_cq(c->scq, 0) != 0)
			ss_conn_fail(c, "req_notify_cq failed");
		rq_poll_dry(c, c->scq, &edge);
		ss_conn_flush(c);
	}
}

static void rq_progress(struct ss_conn *c)
{
	bool edge = false;

	if (c->st == ST_DEAD)
		return;
	rq_poll_dry(c, c->scq, &edge);
	rq_poll_dry(c, c->cq, &edge);
	/*
	 * Arm, then poll again: a completion between the two polls is not lost.
	 * While an application thread spins on the CQ it needs no events.
	 */
	if (!c->spinners) {
		if (ibv_req_notify_cq(c->cq, 0) != 0)
			ss_conn_fail(c, "req_notify_cq failed");
		rq_poll_dry(c, c->cq, &edge);
	}
	ss_conn_after_events(c, edge); /* reaps the sends */
}

static bool rq_spin(struct ss_conn *c, unsigned usec)
{
	uint64_t end = ss_now_us() + usec;
	bool got = false, edge = false; /* edges are for the progress thread's reports */

	pthread_mutex_lock(&c->lock);
	c->spinners++;
	for (;;) {
		if (c->st != ST_RUNNING) {
			got = true;
			break;
		}
		/*
		 * No re-arming and no readiness report: the caller tries its call
		 * again after any completion. A pure grant or a send completion
		 * brings no data but may let queued data go: flush at once.
		 */
		if (rq_poll_dry(c, c->cq, &edge) + rq_poll_dry(c, c->scq, &edge) > 0) {
			ss_conn_flush(c);
			got = true;
			break;
		}
		if (ss_now_us() >= end)
			break;
		/* The lock is free between polls: other threads (and signal handlers) get in. */
		pthread_mutex_unlock(&c->lock);
		sched_yield();
		pthread_mutex_lock(&c->lock);
	}
	if (--c->spinners == 0 && c->st == ST_RUNNING) {
		/*
		 * The last spinner leaves: events must flow again (the progress
		 * thread skipped re-arming meanwhile), and nothing may slip in
		 * between the arming and the last poll.
		 */
		if (ibv_req_notify_cq(c->cq, 0) != 0)
			ss_conn_fail(c, "req_notify_cq failed");
		if (rq_poll_dry(c, c->cq, &edge) > 0) {
			ss_conn_flush(c);
			got = true;
		}
		if (!got)
			ss_conn_report(c, false);
	}
	pthread_mutex_unlock(&c->lock);
	return got;
}

static uint32_t rq_grant_limit(struct ss_conn *c)
{
	(void)c;
	return UINT32_MAX; /* every consumed buffer is posted again at once */
}

static void rq_teardown(struct ss_conn *c)
{
	struct ibv_wc wc[16];

	ibv_destroy_qp(c->qp);
	while (ibv_poll_cq(c->cq, 16, wc) > 0 || ibv_poll_cq(c->scq, 16, wc) > 0)
		;
	if (c->unacked_events)
		ibv_ack_cq_events(c->cq, c->unacked_events);
	if (c->unacked_sevents)
		ibv_ack_cq_events(c->scq, c->unacked_sevents);
	ibv_destroy_cq(c->cq);
	ibv_destroy_cq(c->scq);
}

const struct backend ss_rq_backend = {
	.setup = rq_setup,
	.post_initial = rq_post_initial,
	.release = rq_release,
	.progress = rq_progress,
	.spin = rq_spin,
	.grant_limit = rq_grant_limit,
	.push = rq_reap_sends, /* takes its send completions on the way */
	.teardown = rq_teardown,
};

void ss_conn_on_cq_event(struct ss_conn *c, struct ibv_cq *cq)
{
	pthread_mutex_lock(&c->lock);
	/* Acknowledged in batches; all of them before the CQs are destroyed. */
	if (cq == c->cq && ++c->unacked_events >= 64) {
		ibv_ack_cq_events(c->cq, c->unacked_events);
		c->unacked_events = 0;
	} else if (cq == c->scq && ++c->unacked_sevents >= 64) {
		ibv_ack_cq_events(c->scq, c->unacked_sevents);
		c->unacked_sevents = 0;
	}
	c->be->progress(c);
	pthread_mutex_unlock(&c->lock);
}

struct ss_conn *ss_conn_from_cq_tag(int *tag)
{
	return (struct ss_conn *)((char *)tag - offsetof(struct ss_conn, cq_tag));
}
