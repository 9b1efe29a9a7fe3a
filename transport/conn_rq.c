/*
 * The private receive queue backend: each connection posts its own
 * registered buffers on its own receive queue; every credit it grants is a
 * posted buffer. Its completions come from the device's shared CQs, where
 * it reserves room for all its receives and sends.
 */
#include "transport/conn_int.h"

#include <errno.h>
#include <string.h>

#include "transport/handoff.h"
#include "transport/log.h"
#include "transport/qp.h"
#include "transport/qpool.h"
#include "transport/worker.h"

static int rq_post(struct ss_conn *c, struct ss_blk *b)
{
	struct ibv_sge sge = {.addr = (uintptr_t)b->addr, .length = c->buf_size, .lkey = b->lkey};
	struct ibv_recv_wr *bad;
	struct ibv_recv_wr wr = {.wr_id = (uintptr_t)b, .sg_list = &sge, .num_sge = 1};
	int ret;

	ss_handoff_post(b);
	ret = ibv_post_recv(c->qp, &wr, &bad);

	if (ret) {
		ss_log_error("QP %u: ibv_post_recv: %s", c->qp->qp_num, strerror(ret));
		return -ret;
	}
	c->rq_posted++;
	return 0;
}

static void rq_release(struct ss_conn *c, struct ss_blk *b)
{
	/* A failed QP would only flush it back: keep it. */
	if ((c->st == ST_RUNNING || c->st == ST_CONNECTED) && rq_post(c, b) == 0)
		return;
	ss_pool_put(&c->rxp, b);
}

static void rq_repost(struct ss_conn *c)
{
	(void)c; /* released blocks are posted at once */
}

static int rq_setup(struct ss_conn *c, const struct ss_transport_cfg *cfg, struct ss_params *mine)
{
	struct ss_qp_caps caps = ss_qpool_caps(cfg);
	struct ss_qpool_ent e;
	int ret;

	c->n_rx = caps.rq_depth;
	c->hold_max = UINT32_MAX; /* its buffers are its own: a slow reader holds no one else's */
	/* Its buffers may be a closed connection's, still registered (the device's cache). */
	(void)ss_pool_init(&c->rxp, c->dc->pd, c->buf_size, c->n_rx, c->n_rx, 0); /* no chunk yet */
	ss_pool_set_cache(&c->rxp, &c->dc->rq_cache);
	ret = ss_pool_grow(&c->rxp, c->n_rx);
	if (ret < 0)
		goto err_fini;
	ret = ss_qpool_get(c->dc, &caps, c, &e);
	if (ret)
		goto err_fini;
	c->qp = e.qp;
	c->scq = e.scq;
	c->rcq = e.rcq;
	mine->recv_mode = SS_RECV_RQ;
	mine->window = cfg->rx_window;
	return 0;

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
	return ret;
}

static void rq_received(struct ss_conn *c, uint32_t n)
{
	c->rq_posted -= n; /* rq_release posts each buffer again */
}

static bool rq_rx_final(struct ss_conn *c)
{
	return c->rq_posted == 0; /* the error state flushes every one */
}

static uint32_t rq_grant_limit(struct ss_conn *c)
{
	(void)c;
	return UINT32_MAX; /* every consumed buffer is posted again at once */
}

static void rq_teardown(struct ss_conn *c)
{
	/* A QP that could not be destroyed may still write into its buffers: never reused. */
	if (ss_cqs_detach(c->cqs, c->qp) != 0)
		ss_pool_set_cache(&c->rxp, NULL);
	ss_cqs_unreserve(c->cqs, c->rcq, c->n_rx);
	ss_cqs_unreserve(c->cqs, c->scq, c->sq_depth);
}

const struct backend ss_rq_backend = {
	.setup = rq_setup,
	.post_initial = rq_post_initial,
	.release = rq_release,
	.repost = rq_repost,
	.received = rq_received,
	.grant_limit = rq_grant_limit,
	.rx_final = rq_rx_final,
	.teardown = rq_teardown,
};
