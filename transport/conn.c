/*
 * A byte stream over one RC QP: a ring of send slots filled with registered
 * blocks from the device's send pool, received messages queued until the
 * application reads them, and the credit rules of credit.h. Every SEND
 * carries its kind and the credits it returns in the immediate data
 * (docs/protocol.md, part 2). Where receives come from is the backend's
 * business (struct backend below): a private receive queue with its own
 * buffers and CQs, or the worker's SRQ with shared pool and CQs (srq.h).
 */
#include "transport/conn.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stddef.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>

#include <infiniband/verbs.h>

#include "transport/credit.h"
#include "transport/log.h"
#include "transport/pool.h"
#include "transport/qp.h"
#include "transport/srq.h"
#include "transport/worker.h"

/* How long a peer whose TCP connection ended may still deliver over RDMA. */
#define SS_GONE_GRACE_MS 500
/* How long a QP on an SRQ may wait for its last-WQE event before it is destroyed anyway. */
#define SS_LAST_WQE_MS 100
/* Retry of a grant held back for want of receive capacity, or of a send pool that was dry. */
#define SS_RETRY_MS 2
/* How long MSG_MORE or TCP_CORK may hold a partial slot back (Linux TCP's cork timer). */
#define SS_CORK_MS 200

enum conn_state {
	ST_CREATED,   /* QP made, receives posted */
	ST_CONNECTED, /* QP in RTS; waiting for the commit point */
	ST_RUNNING,   /* data flows */
	ST_FAILED,    /* error: reads and writes report a reset */
	ST_DEAD,      /* destroyed by its owner; the worker frees it */
};

/* wr_id of sends: the kind in the top bits, the slot sequence below. */
#define WR_KIND_SHIFT 62

/* A received message: in a registered block, or copied out to the heap (heap set). */
struct rx_ent {
	struct ss_blk *blk;
	uint8_t *heap;
	uint32_t len;
	uint32_t off; /* bytes already read */
};

/* Where receives come from; see rq_backend and srq_backend. */
struct backend {
	/* Makes the CQs and the QP, and fills the receive side of *mine. */
	int (*setup)(struct ss_conn *c, const struct ss_transport_cfg *cfg, struct ss_params *mine);
	/* Posts the first receives; the QP is in RTR. */
	int (*post_initial)(struct ss_conn *c);
	/* A received block is free again. */
	void (*release)(struct ss_conn *c, struct ss_blk *b);
	/* Takes completions and re-arms events; lock held, may be dropped meanwhile. */
	void (*progress)(struct ss_conn *c);
	/* ss_conn_spin(), lock not held. */
	bool (*spin)(struct ss_conn *c, unsigned usec);
	/* Credits a grant may return now. */
	uint32_t (*grant_limit)(struct ss_conn *c);
	/* Posts what may go after an application call; lock held. */
	void (*push)(struct ss_conn *c);
	/* Destroys the QP and receive side; progress thread, at free. */
	void (*teardown)(struct ss_conn *c);
};

struct ss_conn {
	pthread_mutex_t lock;
	pthread_cond_t drained;
	struct ss_conn *next; /* worker lists: graveyard or timed */
	struct ss_worker *w;
	struct ss_devctx *dc;
	const struct backend *be;
	struct ss_conn_hooks hooks;
	uint32_t sq_depth, rx_window, ctrl_reserve;
	void *hooks_arg;
	int liveness_fd;
	int ep_tag; /* SS_TAG_LIVENESS: the progress loop finds us by this field */
	int cq_tag; /* SS_TAG_CONN: context of our own CQs (private RQ) */

	struct ibv_cq *cq;  /* receive completions */
	struct ibv_cq *scq; /* send completions */
	struct ibv_qp *qp;
	uint32_t psn;
	/* private RQ: our buffers and CQ events; the receive CQ is always armed, the send CQ only while someone waits */
	struct ss_pool rxp;
	unsigned unacked_events, unacked_sevents;
	/* SRQ: the shared side and our room in its send CQ */
	struct ss_srq *srq;
	struct ss_txcq *txcq;
	uint32_t hold_max; /* blocks held unread before copies go to the heap */
	uint32_t held;
	uint32_t seen; /* completions handed to us; spinners watch it (atomic) */
	bool last_wqe;
	bool tx_wait; /* counted in the SRQ's send waiters */
	struct ss_blk *rel; /* received blocks to repost at the next push */
	uint64_t free_at;

	uint32_t buf_size;
	struct ss_pool *txp;  /* the device's send blocks */
	uint32_t n_rxq;       /* the data window: the most messages the peer may have unread here */
	struct rx_ent *rxq;   /* ring of n_rxq, received data in order */
	uint32_t rxq_head, rxq_count;
	size_t rx_avail;

	uint32_t n_tx, tx_slot_size, max_inline;
	struct ss_blk **tx_blk;
	uint32_t *tx_len;
	uint32_t tx_done, tx_posted, tx_open; /* sequence numbers of slots */
	uint64_t hold_until;                   /* MSG_MORE: keep the partial last slot until then (0: no) */
	bool tx_starved;                       /* the send pool was dry */
	uint64_t retry_at;                     /* a withheld grant or a dry pool is retried then */

	struct ss_credit cr;
	enum conn_state st;
	bool eos_wanted, eos_posted, eos_done;
	bool draining; /* ss_conn_drain() waits */
	int spinners;  /* application threads polling the CQs in ss_conn_spin() */
	bool tcp_gone;
	uint64_t gone_deadline;
	bool timed; /* on the worker's timer list */
	uint64_t timer_at; /* when the worker calls ss_conn_on_timer() */
	unsigned last_ready;
	struct ss_conn_stats stats;
	struct ss_conn_stats *pub; /* where the counters go: stats, or the shim's shared memory */
};

uint64_t ss_now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

uint64_t ss_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

struct ss_conn **ss_conn_next_p(struct ss_conn *c)
{
	return &c->next;
}

uint64_t ss_conn_deadline(struct ss_conn *c)
{
	return __atomic_load_n(&c->timer_at, __ATOMIC_RELAXED);
}

static uint8_t *rx_data(const struct rx_ent *e)
{
	return e->heap ? e->heap : e->blk->addr;
}

static uint8_t *tx_buf(struct ss_conn *c, uint32_t seq)
{
	return c->tx_blk[seq % c->n_tx]->addr;
}

static void fail(struct ss_conn *c, const char *why)
{
	if (c->st == ST_FAILED || c->st == ST_DEAD)
		return;
	ss_log_info("QP %u: connection failed: %s", c->qp->qp_num, why);
	if (c->st != ST_CREATED) /* a QP still in RESET has nothing to flush */
		ss_qp_to_error(c->qp);
	c->st = ST_FAILED;
	pthread_cond_broadcast(&c->drained);
}

/* Asks the progress thread to call ss_conn_on_timer() at (or before) at. */
static void arm_timer(struct ss_conn *c, uint64_t at)
{
	if (c->timed && c->timer_at <= at)
		return;
	__atomic_store_n(&c->timer_at, at, __ATOMIC_RELAXED);
	if (!c->timed) {
		c->timed = true;
		ss_worker_arm_timer(c->w, c);
	} else {
		ss_worker_wake(c->w); /* it may sleep until a later time */
	}
}

static void arm_retry(struct ss_conn *c)
{
	if (c->retry_at)
		return;
	c->retry_at = ss_now_ms() + SS_RETRY_MS;
	arm_timer(c, c->retry_at);
}

static int post_send(struct ss_conn *c, enum ss_msg_kind kind, uint32_t seq, bool want_more)
{
	uint32_t len = kind == SS_KIND_DATA ? c->tx_len[seq % c->n_tx] : 0;
	struct ibv_sge sge = {0};
	struct ibv_send_wr wr = {
		.wr_id = ((uint64_t)kind << WR_KIND_SHIFT) | seq,
		.sg_list = &sge,
		.num_sge = len ? 1 : 0,
		.opcode = IBV_WR_SEND_WITH_IMM,
		.send_flags = IBV_SEND_SIGNALED | (len && len <= c->max_inline ? IBV_SEND_INLINE : 0),
	}, *bad;
	int ret;

	if (len)
		sge = (struct ibv_sge){.addr = (uintptr_t)tx_buf(c, seq), .length = len,
				       .lkey = c->tx_blk[seq % c->n_tx]->lkey};
	wr.imm_data = htonl(ss_credit_on_post(&c->cr, kind, want_more));
	ret = ibv_post_send(c->qp, &wr, &bad);
	if (ret) {
		/* Never expected: slots and credits were checked. */
		ss_log_error("QP %u: ibv_post_send: %s", c->qp->qp_num, strerror(ret));
		fail(c, "post_send failed");
		return -ret;
	}
	if (kind == SS_KIND_DATA) {
		c->pub->tx_msgs++;
		c->pub->tx_bytes += len;
	}
	return 0;
}

static bool tx_pending(const struct ss_conn *c)
{
	return c->tx_posted != c->tx_open;
}

/* Sends a grant only against what the backend can back; owed credits beyond wait for a retry. */
static void limit_grants(struct ss_conn *c)
{
	ss_credit_set_grant_limit(&c->cr, c->be->grant_limit(c));
	if (ss_credit_withheld(&c->cr))
		arm_retry(c);
}

static bool ctrl_now(struct ss_conn *c)
{
	return ss_credit_ctrl_due(&c->cr, tx_pending(c)) && ss_credit_can_send_ctrl(&c->cr);
}

/* Posts what the rules allow: control first (it never waits behind data). */
static void flush(struct ss_conn *c)
{
	if (c->st != ST_RUNNING)
		return;
	limit_grants(c);
	if (ctrl_now(c) && post_send(c, SS_KIND_CTRL, 0, tx_pending(c)) < 0)
		return;
	while (tx_pending(c) && ss_credit_can_send_data(&c->cr)) {
		bool last = c->tx_posted + 1 == c->tx_open;

		if (last && c->hold_until && c->tx_len[c->tx_posted % c->n_tx] < c->tx_slot_size)
			break;
		if (post_send(c, SS_KIND_DATA, c->tx_posted, !last) < 0)
			return;
		c->tx_posted++;
	}
	/* Out of credits with data waiting: the request may be due now. */
	if (ctrl_now(c) && post_send(c, SS_KIND_CTRL, 0, tx_pending(c)) < 0)
		return;
	if (c->eos_wanted && !c->eos_posted && !tx_pending(c) && ss_credit_can_send_ctrl(&c->cr)) {
		if (post_send(c, SS_KIND_EOS, 0, false) == 0)
			c->eos_posted = true;
	}
}

static uint32_t tx_free_slots(const struct ss_conn *c)
{
	return c->n_tx - (c->tx_open - c->tx_done);
}

static bool tx_room(const struct ss_conn *c)
{
	if (tx_pending(c) && c->tx_len[(c->tx_open - 1) % c->n_tx] < c->tx_slot_size)
		return true;
	return tx_free_slots(c) > 0 && !c->tx_starved;
}

static unsigned compute_ready(const struct ss_conn *c)
{
	unsigned r = 0;

	switch (c->st) {
	case ST_CREATED:
	case ST_DEAD:
		return 0;
	case ST_CONNECTED:
		/* Before the commit point writes are taken (and held); nothing to read yet. */
		return tx_room(c) ? SS_RDY_OUT : 0;
	case ST_FAILED:
		return SS_RDY_IN | SS_RDY_OUT | SS_RDY_HUP | SS_RDY_ERR | SS_RDY_RDHUP;
	case ST_RUNNING:
		break;
	}
	if (c->rx_avail || c->cr.eos_received)
		r |= SS_RDY_IN;
	if (c->cr.eos_received)
		r |= SS_RDY_RDHUP;
	if (!c->eos_wanted && tx_room(c))
		r |= SS_RDY_OUT;
	if (c->cr.eos_received && c->eos_wanted)
		r |= SS_RDY_HUP;
	return r;
}

static void report(struct ss_conn *c, bool edge)
{
	unsigned r = compute_ready(c);

	if (c->hooks.ready && (r != c->last_ready || edge))
		c->hooks.ready(c->hooks_arg, r | (edge ? SS_RDY_EDGE : 0));
	c->last_ready = r;
}

static void rx_push(struct ss_conn *c, struct ss_blk *b, uint32_t len)
{
	struct rx_ent *e = &c->rxq[(c->rxq_head + c->rxq_count) % c->n_rxq];

	*e = (struct rx_ent){.blk = b, .len = len};
	/* Above the watermark the bytes leave registered memory: a slow reader holds no pool. */
	if (c->srq && c->held >= c->hold_max && (e->heap = malloc(len)) != NULL) {
		memcpy(e->heap, b->addr, len);
		e->blk = NULL;
		c->be->release(c, b);
		c->pub->copied_out++;
	} else if (c->srq) {
		c->held++;
	}
	c->rxq_count++;
	c->rx_avail += len;
}

/* Frees the oldest queued message (read, or dropped at the end). */
static void rx_pop(struct ss_conn *c)
{
	struct rx_ent *e = &c->rxq[c->rxq_head];

	if (e->heap) {
		free(e->heap);
	} else {
		c->be->release(c, e->blk);
		if (c->srq)
			c->held--;
	}
	c->rxq_head = (c->rxq_head + 1) % c->n_rxq;
	c->rxq_count--;
}

static void bad_status(struct ss_conn *c, const struct ibv_wc *wc, bool recv)
{
	if (c->st != ST_FAILED && c->st != ST_DEAD)
		ss_log_info("QP %u: completion error %s (%s)", c->qp->qp_num,
			    ibv_wc_status_str(wc->status), recv ? "recv" : "send");
	fail(c, ibv_wc_status_str(wc->status));
}

/*
 * Handles one completion of our receive side (recv) or send queue; returns
 * true if it brought new readable data. Which queue comes from the CQ it
 * was polled from: an error completion's opcode is undefined.
 */
static bool on_completion(struct ss_conn *c, const struct ibv_wc *wc, bool recv)
{
	if (!recv) {
		enum ss_msg_kind kind = (enum ss_msg_kind)(wc->wr_id >> WR_KIND_SHIFT);

		/* Flushed or not, the slot and its block are free again. */
		ss_credit_on_send_done(&c->cr, kind);
		if (kind == SS_KIND_DATA) {
			/* One SQ: send completions come in order. */
			ss_pool_put(c->txp, c->tx_blk[c->tx_done % c->n_tx]);
			c->tx_blk[c->tx_done % c->n_tx] = NULL;
			c->tx_done++;
			if (c->tx_starved)
				c->tx_starved = false;
		} else if (kind == SS_KIND_EOS && wc->status == IBV_WC_SUCCESS) {
			c->eos_done = true;
		}
		if (wc->status != IBV_WC_SUCCESS)
			bad_status(c, wc, recv);
		return false;
	}

	struct ss_blk *b = (struct ss_blk *)(uintptr_t)wc->wr_id;
	if (wc->status != IBV_WC_SUCCESS) {
		bad_status(c, wc, recv); /* first: a failed connection does not repost */
		c->be->release(c, b);
		return false;
	}
	/* Any message from the peer proves its QP receives: the commit point has passed. */
	if (c->st == ST_CONNECTED)
		c->st = ST_RUNNING;
	int kind = (wc->wc_flags & IBV_WC_WITH_IMM) ? ss_credit_on_recv(&c->cr, ntohl(wc->imm_data))
						     : -EPROTO;
	if (kind < 0 || (kind != SS_KIND_DATA && wc->byte_len) ||
	    (kind == SS_KIND_DATA && wc->byte_len == 0) || c->st != ST_RUNNING) {
		if (c->st == ST_RUNNING)
			ss_log_error("QP %u: protocol error in a received message (imm 0x%x, %u bytes)",
				     c->qp->qp_num, ntohl(wc->imm_data), wc->byte_len);
		c->be->release(c, b);
		fail(c, "protocol error");
		return false;
	}
	if (kind != SS_KIND_DATA) {
		c->be->release(c, b);
		return kind == SS_KIND_EOS;
	}
	rx_push(c, b, wc->byte_len);
	c->pub->rx_msgs++;
	c->pub->rx_bytes += wc->byte_len;
	return true;
}

/* After completions were taken: post what may go, wake drains and report; lock held. */
/* Credit state for the status tool: plain stores, no lock a reader could wait on. */
static void publish(struct ss_conn *c)
{
	struct ss_conn_stats *p = c->pub;

	p->grants_sent = c->cr.grants_sent;
	p->grants_received = c->cr.grants_received;
	p->requests_sent = c->cr.requests_sent;
	p->requests_received = c->cr.requests_received;
	p->tx_credits = c->cr.tx_credits;
	p->to_return = c->cr.to_return;
	p->sq_free = c->cr.sq_free;
}

static void push(struct ss_conn *c)
{
	c->be->push(c);
	publish(c);
}

static void after_events(struct ss_conn *c, bool edge)
{
	push(c);
	if (c->tcp_gone && !c->cr.eos_received && c->st == ST_RUNNING && !c->gone_deadline) {
		/* Once: the grace counts from the TCP end, not from the last progress. */
		c->gone_deadline = ss_now_ms() + SS_GONE_GRACE_MS;
		arm_timer(c, c->gone_deadline);
	}
	if (c->eos_done || c->st == ST_FAILED || (!tx_pending(c) && c->tx_done == c->tx_posted))
		pthread_cond_broadcast(&c->drained);
	/* A spinning application thread consumes what comes and reports when it leaves. */
	if (!c->spinners)
		report(c, edge);
}

/* ---- private receive queue ---- */

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
			fail(c, "poll_cq failed");
			return total;
		}
		for (int i = 0; i < n; i++)
			*edge |= on_completion(c, &wc[i], recv);
		total += n;
	} while (n == 16);
	return total;
}

/*
 * Someone waits for send completions: a full ring, a drain, the end of
 * stream, or a control message with no capacity left. Otherwise they are
 * reaped on the way (no event, no wake-up per send).
 */
static bool send_waiters(const struct ss_conn *c)
{
	return !tx_room(c) || c->draining || (c->eos_wanted && !c->eos_done) ||
	       (ss_credit_ctrl_due(&c->cr, tx_pending(c)) && !ss_credit_can_send_ctrl(&c->cr)) ||
	       (tx_pending(c) && !ss_credit_can_send_data(&c->cr) && c->cr.tx_credits > 0);
}

/* Takes the send completions there are; arms their CQ when someone will wait for more. */
static void rq_reap_sends(struct ss_conn *c)
{
	bool edge = false;

	rq_poll_dry(c, c->scq, &edge);
	flush(c);
	if (send_waiters(c)) {
		if (ibv_req_notify_cq(c->scq, 0) != 0)
			fail(c, "req_notify_cq failed");
		rq_poll_dry(c, c->scq, &edge);
		flush(c);
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
			fail(c, "req_notify_cq failed");
		rq_poll_dry(c, c->cq, &edge);
	}
	after_events(c, edge); /* reaps the sends */
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
			flush(c);
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
			fail(c, "req_notify_cq failed");
		if (rq_poll_dry(c, c->cq, &edge) > 0) {
			flush(c);
			got = true;
		}
		if (!got)
			report(c, false);
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

static const struct backend rq_backend = {
	.setup = rq_setup,
	.post_initial = rq_post_initial,
	.release = rq_release,
	.progress = rq_progress,
	.spin = rq_spin,
	.grant_limit = rq_grant_limit,
	.push = rq_reap_sends, /* takes its send completions on the way */
	.teardown = rq_teardown,
};

/* ---- shared receive queue ---- */

static int srq_setup(struct ss_conn *c, const struct ss_transport_cfg *cfg, struct ss_params *mine)
{
	struct ss_qp_caps caps = {cfg->sq_depth, 0, cfg->max_inline};
	int ret;

	c->srq = c->dc->srq;
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
	flush(c);
	wait = c->st == ST_RUNNING && send_waiters(c);
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
		after_events(c, false);
}

static bool srq_spin(struct ss_conn *c, unsigned usec)
{
	uint64_t end = ss_now_us() + usec;
	uint32_t seen = __atomic_load_n(&c->seen, __ATOMIC_ACQUIRE);
	bool got = false;

	pthread_mutex_lock(&c->lock);
	c->spinners++;
	pthread_mutex_unlock(&c->lock);
	ss_srq_spin_begin(c->srq);
	for (;;) {
		ss_srq_try_progress(c->srq);
		if (__atomic_load_n(&c->seen, __ATOMIC_ACQUIRE) != seen) {
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
	if (__atomic_load_n(&c->seen, __ATOMIC_ACQUIRE) != seen || c->st != ST_RUNNING)
		got = true;
	if (!got && !c->spinners)
		report(c, false);
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

static const struct backend srq_backend = {
	.setup = srq_setup,
	.post_initial = srq_post_initial,
	.release = srq_release,
	.progress = srq_progress,
	.spin = srq_spin,
	.grant_limit = srq_grant_limit,
	.push = srq_push,
	.teardown = srq_teardown,
};

/* ---- entry points of the progress thread ---- */

void ss_conn_on_wcs(struct ss_conn *c, const struct ibv_wc *wc, int n, bool recv)
{
	bool edge = false;

	pthread_mutex_lock(&c->lock);
	for (int i = 0; i < n; i++)
		edge |= on_completion(c, &wc[i], recv);
	__atomic_add_fetch(&c->seen, 1, __ATOMIC_RELEASE);
	if (c->st != ST_DEAD)
		after_events(c, edge);
	pthread_mutex_unlock(&c->lock);
}

bool ss_conn_spin(struct ss_conn *c, unsigned usec)
{
	return c->be->spin(c, usec);
}

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

void ss_conn_on_timer(struct ss_conn *c, uint64_t now_ms)
{
	pthread_mutex_lock(&c->lock);
	c->timed = false;
	if (c->retry_at && now_ms >= c->retry_at) {
		c->retry_at = 0;
		if (c->tx_starved && ss_pool_can_get(c->txp))
			c->tx_starved = false;
		if (c->tx_starved)
			arm_retry(c);
	}
	if (c->hold_until && now_ms >= c->hold_until)
		c->hold_until = 0;
	if (c->st == ST_RUNNING) {
		c->be->progress(c);
		if (c->st == ST_RUNNING && c->gone_deadline && !c->cr.eos_received &&
		    now_ms >= c->gone_deadline) {
			ss_log_info("QP %u: gone peer: credits %u, owed %u, held %u, peer asked %d",
				    c->qp->qp_num, c->cr.tx_credits, c->cr.to_return,
				    c->cr.rx_outstanding, c->cr.peer_hard_req);
			fail(c, "peer gone without end of stream");
			report(c, false);
		}
	}
	/* Still waiting for something: back on the list. */
	if (c->st != ST_DEAD && c->retry_at)
		arm_timer(c, c->retry_at);
	if (c->st != ST_DEAD && c->hold_until)
		arm_timer(c, c->hold_until);
	if (c->st == ST_RUNNING && c->gone_deadline > now_ms && !c->cr.eos_received)
		arm_timer(c, c->gone_deadline);
	pthread_mutex_unlock(&c->lock);
}

struct ss_conn *ss_conn_from_tag(int *tag)
{
	return (struct ss_conn *)((char *)tag - offsetof(struct ss_conn, ep_tag));
}

void ss_conn_on_liveness(struct ss_conn *c)
{
	pthread_mutex_lock(&c->lock);
	int ev = c->st != ST_DEAD && !c->tcp_gone && c->hooks.tcp_event
			 ? c->hooks.tcp_event(c->hooks_arg, c->liveness_fd)
			 : SS_TCP_IDLE;

	if (ev == SS_TCP_COMMIT && c->st == ST_CONNECTED) {
		c->st = ST_RUNNING;
		c->be->progress(c);
	} else if (ev == SS_TCP_GONE) {
		c->tcp_gone = true;
		epoll_ctl(c->w->epfd, EPOLL_CTL_DEL, c->liveness_fd, NULL);
		if (c->st == ST_CREATED || c->st == ST_CONNECTED)
			fail(c, "peer gone during the handshake");
		c->be->progress(c);
	}
	pthread_mutex_unlock(&c->lock);
}

void ss_conn_on_last_wqe(struct ss_conn *c)
{
	pthread_mutex_lock(&c->lock);
	c->last_wqe = true;
	pthread_mutex_unlock(&c->lock);
}

/* ---- the interface ---- */

int ss_conn_create(struct ss_worker *w, const struct ss_transport_cfg *cfg,
		   const struct sockaddr *local, const struct ss_conn_hooks *hooks, void *hooks_arg,
		   struct ss_conn **conn_p, struct ss_params *mine, enum ss_reason *reason_p)
{
	struct ss_conn *c;
	int ret;

	*reason_p = SS_REASON_RESOURCE;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	pthread_mutex_init(&c->lock, NULL);
	/* Its deadlines are on CLOCK_MONOTONIC, like every time here. */
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&c->drained, &ca);
	pthread_condattr_destroy(&ca);
	c->w = w;
	c->pub = &c->stats;
	c->hooks = *hooks;
	c->hooks_arg = hooks_arg;
	c->liveness_fd = -1;
	c->ep_tag = SS_TAG_LIVENESS;
	c->cq_tag = SS_TAG_CONN;
	ret = ss_worker_devctx(w, &cfg->dev, local, &c->dc, reason_p);
	if (ret)
		goto err_free;
	*reason_p = SS_REASON_RESOURCE;
	ret = ss_worker_devctx_pools(w, c->dc, cfg);
	if (ret)
		goto err_free;
	c->be = cfg->recv_mode == SS_RECV_SRQ ? &srq_backend : &rq_backend;
	c->txp = &c->dc->txp;
	c->sq_depth = cfg->sq_depth;
	c->rx_window = cfg->rx_window;
	c->ctrl_reserve = cfg->ctrl_reserve;
	c->buf_size = cfg->buf_size;
	c->n_rxq = cfg->rx_window;
	c->n_tx = cfg->sq_depth - cfg->ctrl_reserve;
	/* One send pool per device: its blocks set the largest SEND (lowered to the peer's buffers on connect). */
	c->tx_slot_size = cfg->buf_size < c->txp->blk_size ? cfg->buf_size : c->txp->blk_size;
	c->max_inline = cfg->max_inline;
	c->rxq = calloc(c->n_rxq, sizeof(*c->rxq));
	c->tx_len = calloc(c->n_tx, sizeof(*c->tx_len));
	c->tx_blk = calloc(c->n_tx, sizeof(*c->tx_blk));
	if (!c->rxq || !c->tx_len || !c->tx_blk) {
		ret = -ENOMEM;
		goto err_free;
	}
	memset(mine, 0, sizeof(*mine));
	ret = c->be->setup(c, cfg, mine);
	if (ret)
		goto err_free;
	ret = ss_random_psn(&c->psn);
	if (ret) {
		c->be->teardown(c);
		goto err_free;
	}
	mine->caps = SS_CAP_DATA_V1;
	mine->mtu = (uint8_t)c->dc->dev->active_mtu;
	mine->sq_depth = (uint16_t)cfg->sq_depth;
	mine->qpn = c->qp->qp_num;
	mine->psn = c->psn;
	memcpy(mine->gid, c->dc->dev->gid, 16);
	if (!mine->buf_size)
		mine->buf_size = c->buf_size;
	c->st = ST_CREATED;
	*conn_p = c;
	*reason_p = SS_REASON_NONE;
	return 0;

err_free:
	free(c->rxq);
	free(c->tx_len);
	free(c->tx_blk);
	free(c);
	return ret;
}

size_t ss_conn_local_gids(const struct ss_conn *c, uint8_t (*gids)[16], size_t max)
{
	size_t n = c->dc->n_gids < max ? c->dc->n_gids : max;

	memcpy(gids, c->dc->gids, n * 16);
	return n;
}

int ss_conn_watch_liveness(struct ss_conn *c, int fd)
{
	struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = &c->ep_tag};

	pthread_mutex_lock(&c->lock);
	c->liveness_fd = fd;
	pthread_mutex_unlock(&c->lock);
	if (epoll_ctl(c->w->epfd, EPOLL_CTL_ADD, fd, &ev) < 0)
		return -errno;
	return 0;
}

int ss_conn_connect(struct ss_conn *c, const struct ss_params *peer,
		    const struct ss_agreement *agr)
{
	struct ss_qp_peer qp_peer = {.qpn = peer->qpn, .psn = peer->psn, .mtu = agr->mtu};
	struct ss_credit_cfg ccfg = {
		.sq_depth = c->sq_depth,
		.ctrl_reserve = c->ctrl_reserve,
		.rx_window = c->rx_window,
		.tx_window = agr->send_window,
		.grant_threshold = (c->rx_window + 1) / 2,
	};
	int ret;

	memcpy(qp_peer.gid, peer->gid, 16);
	pthread_mutex_lock(&c->lock);
	ret = ss_credit_init(&c->cr, &ccfg);
	if (ret)
		goto out;
	if (agr->max_send < c->tx_slot_size)
		c->tx_slot_size = agr->max_send;
	/* Receives are posted before our side tells the peer it may send. */
	ret = ss_qp_connect(c->qp, c->dc->dev, &qp_peer, c->psn);
	if (ret)
		goto out;
	ret = c->be->post_initial(c);
	if (ret == 0)
		c->st = ST_CONNECTED;
out:
	pthread_mutex_unlock(&c->lock);
	return ret;
}

void ss_conn_start(struct ss_conn *c)
{
	pthread_mutex_lock(&c->lock);
	if (c->st == ST_CONNECTED)
		c->st = ST_RUNNING;
	c->be->progress(c); /* data may have arrived before we knew the peer was ready */
	pthread_mutex_unlock(&c->lock);
}

static int state_error(const struct ss_conn *c)
{
	if (c->st == ST_CONNECTED)
		return -EAGAIN; /* the peer has not said it is ready yet */
	return c->st == ST_FAILED ? -ECONNRESET : -ENOTCONN;
}


ssize_t ss_conn_send(struct ss_conn *c, const struct iovec *iov, int iovcnt, bool more)
{
	size_t taken = 0;
	ssize_t ret;

	pthread_mutex_lock(&c->lock);
	if (c->st != ST_RUNNING && c->st != ST_CONNECTED) {
		ret = state_error(c);
		goto out;
	}
	if (c->eos_wanted) {
		ret = -EPIPE;
		goto out;
	}
	for (int i = 0; i < iovcnt; i++) {
		const uint8_t *src = iov[i].iov_base;
		size_t left = iov[i].iov_len;

		while (left) {
			uint32_t seq, *len;

			if (tx_pending(c) && c->tx_len[(c->tx_open - 1) % c->n_tx] < c->tx_slot_size) {
				seq = c->tx_open - 1; /* coalesce into the unposted last slot */
			} else if (tx_free_slots(c) && !c->tx_starved) {
				struct ss_blk *b = ss_pool_get(c->txp, 1);

				if (!b) {
					/* The device's send pool is at its bound: retry shortly. */
					c->tx_starved = true;
					arm_retry(c);
					goto full;
				}
				seq = c->tx_open++;
				c->tx_blk[seq % c->n_tx] = b;
				c->tx_len[seq % c->n_tx] = 0;
			} else {
				goto full;
			}
			len = &c->tx_len[seq % c->n_tx];
			size_t n = c->tx_slot_size - *len < left ? c->tx_slot_size - *len : left;
			memcpy(tx_buf(c, seq) + *len, src, n);
			*len += (uint32_t)n;
			src += n;
			left -= n;
			taken += n;
		}
	}
full:
	if (!more || !taken) {
		c->hold_until = 0;
	} else if (!c->hold_until) {
		/* Held data goes out at the latest after the cork time, as TCP's does. */
		c->hold_until = ss_now_ms() + SS_CORK_MS;
		arm_timer(c, c->hold_until);
	}
	push(c);
	ret = taken ? (ssize_t)taken : -EAGAIN;
	report(c, false);
out:
	pthread_mutex_unlock(&c->lock);
	return ret;
}

ssize_t ss_conn_recv(struct ss_conn *c, const struct iovec *iov, int iovcnt, bool peek)
{
	size_t copied = 0;
	uint32_t idx = 0, consumed = 0;
	ssize_t ret;

	pthread_mutex_lock(&c->lock);
	/* A failed connection still hands out what it received (then EOF or reset). */
	if (c->st != ST_RUNNING && c->st != ST_FAILED) {
		ret = state_error(c);
		goto out;
	}
	for (int i = 0; i < iovcnt && idx < c->rxq_count; i++) {
		uint8_t *dst = iov[i].iov_base;
		size_t left = iov[i].iov_len;

		while (left && idx < c->rxq_count) {
			struct rx_ent *e = &c->rxq[(c->rxq_head + idx) % c->n_rxq];
			uint32_t off = e->off;
			size_t n = e->len - off < left ? e->len - off : left;

			memcpy(dst, rx_data(e) + off, n);
			dst += n;
			left -= n;
			copied += n;
			off += (uint32_t)n;
			if (!peek)
				e->off = off;
			if (off == e->len)
				idx++;
			if (peek && off < e->len)
				break;
		}
	}
	if (!peek) {
		/* Fully read messages give their buffers back, and their credits to the peer. */
		while (c->rxq_count && c->rxq[c->rxq_head].off == c->rxq[c->rxq_head].len) {
			rx_pop(c);
			consumed++;
		}
		c->rx_avail -= copied;
		if (consumed && c->st == ST_RUNNING) {
			ss_credit_on_consumed(&c->cr, consumed);
			push(c);
		}
	}
	if (copied)
		ret = (ssize_t)copied;
	else if (c->cr.eos_received)
		ret = 0; /* the peer ended its stream: what failed later (its QP gone) is no reset */
	else if (c->st == ST_FAILED)
		ret = -ECONNRESET;
	else
		ret = -EAGAIN;
	report(c, false);
out:
	pthread_mutex_unlock(&c->lock);
	return ret;
}

size_t ss_conn_readable(struct ss_conn *c)
{
	size_t n;

	pthread_mutex_lock(&c->lock);
	n = c->rx_avail;
	pthread_mutex_unlock(&c->lock);
	return n;
}

int ss_conn_shutdown_wr(struct ss_conn *c)
{
	int ret = 0;

	pthread_mutex_lock(&c->lock);
	if (c->st == ST_RUNNING || c->st == ST_CONNECTED) {
		c->eos_wanted = true;
		c->hold_until = 0;
		push(c);
		report(c, false);
	} else if (c->st != ST_FAILED) {
		ret = -ENOTCONN;
	}
	pthread_mutex_unlock(&c->lock);
	return ret;
}

unsigned ss_conn_ready(struct ss_conn *c)
{
	unsigned r;

	pthread_mutex_lock(&c->lock);
	r = compute_ready(c);
	pthread_mutex_unlock(&c->lock);
	return r;
}

void ss_conn_resync(struct ss_conn *c)
{
	pthread_mutex_lock(&c->lock);
	if (c->hooks.ready)
		c->hooks.ready(c->hooks_arg, compute_ready(c));
	c->last_ready = compute_ready(c);
	pthread_mutex_unlock(&c->lock);
}

int ss_conn_drain(struct ss_conn *c, int timeout_ms)
{
	uint64_t end = timeout_ms < 0 ? UINT64_MAX : ss_now_ms() + (uint64_t)timeout_ms;
	int ret = 0;

	pthread_mutex_lock(&c->lock);
	c->hold_until = 0;
	c->draining = true;
	push(c);
	/* A peer whose TCP end is gone has closed its QP too: nobody is left to deliver to. */
	while (c->st == ST_RUNNING && !c->tcp_gone &&
	       (tx_pending(c) || c->tx_done != c->tx_posted || (c->eos_wanted && !c->eos_done))) {
		uint64_t now = ss_now_ms(), until = now + 50 < end ? now + 50 : end;
		struct timespec ts = {(time_t)(until / 1000), (long)(until % 1000) * 1000000};

		if (now >= end) {
			ss_log_warn("QP %u: not delivered within the linger: %u slots unsent, %u "
				    "unacknowledged, end of stream %s (credits %u)",
				    c->qp->qp_num, c->tx_open - c->tx_posted, c->tx_posted - c->tx_done,
				    c->eos_done ? "acknowledged" : c->eos_posted ? "sent" : "unsent",
				    c->cr.tx_credits);
			ret = -ETIMEDOUT;
			break;
		}
		/* Waits in slices and polls at each: closing never depends on an event. */
		if (pthread_cond_timedwait(&c->drained, &c->lock, &ts) == ETIMEDOUT)
			c->be->progress(c);
	}
	if (c->st == ST_FAILED)
		ret = -ECONNRESET;
	c->draining = false;
	pthread_mutex_unlock(&c->lock);
	return ret;
}

void ss_conn_get_stats(struct ss_conn *c, struct ss_conn_stats *st)
{
	pthread_mutex_lock(&c->lock);
	publish(c);
	*st = *c->pub;
	pthread_mutex_unlock(&c->lock);
}

void ss_conn_publish(struct ss_conn *c, struct ss_conn_stats *pub)
{
	pthread_mutex_lock(&c->lock);
	if (!pub)
		pub = &c->stats;
	if (pub != c->pub) {
		*pub = *c->pub;
		c->pub = pub;
		publish(c);
	}
	pthread_mutex_unlock(&c->lock);
}

void ss_conn_destroy(struct ss_conn *c)
{
	if (!c)
		return;
	pthread_mutex_lock(&c->lock);
	if (c->liveness_fd >= 0 && !c->tcp_gone)
		epoll_ctl(c->w->epfd, EPOLL_CTL_DEL, c->liveness_fd, NULL);
	c->hooks.ready = NULL;
	c->hooks.tcp_event = NULL;
	c->pub = &c->stats; /* the shim's slot is gone after this returns */
	if (c->st != ST_FAILED && c->st != ST_CREATED)
		ss_qp_to_error(c->qp);
	/* On an SRQ the spec's order: error state, last-WQE event (bounded wait), drain, destroy. */
	c->free_at = c->srq && c->st != ST_CREATED ? ss_now_ms() + SS_LAST_WQE_MS : 0;
	if (c->tx_wait) {
		c->tx_wait = false;
		ss_srq_want_tx(c->srq, false);
	}
	c->st = ST_DEAD;
	pthread_mutex_unlock(&c->lock);
	/* The progress thread frees it: it is the only one that takes CQ events. */
	ss_worker_bury(c->w, c);
}

uint64_t ss_conn_free_at(struct ss_conn *c)
{
	uint64_t t;

	pthread_mutex_lock(&c->lock);
	t = c->last_wqe ? 0 : c->free_at;
	pthread_mutex_unlock(&c->lock);
	return t;
}

void ss_conn_free(struct ss_conn *c)
{
	c->be->teardown(c);
	/* Whatever is still held goes back: queued data, and send blocks never completed. */
	while (c->rxq_count)
		rx_pop(c);
	if (c->rel)
		ss_srq_repost(c->srq, c->rel);
	for (uint32_t s = c->tx_done; s != c->tx_open; s++)
		if (c->tx_blk[s % c->n_tx])
			ss_pool_put(c->txp, c->tx_blk[s % c->n_tx]);
	ss_pool_fini(&c->rxp); /* private RQ only; zeroed otherwise */
	free(c->rxq);
	free(c->tx_len);
	free(c->tx_blk);
	pthread_cond_destroy(&c->drained);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

void ss_transport_set_log_level(int level)
{
	ss_log_level = (enum ss_log_level)level;
}

__attribute__((visibility("default"))) const struct ss_transport_ops ss_transport_ops = {
	.version = SS_TRANSPORT_OPS_VERSION,
	.set_log_level = ss_transport_set_log_level,
	.worker_get = ss_worker_get,
	.worker_forget_after_fork = ss_worker_forget_after_fork,
	.conn_create = ss_conn_create,
	.conn_watch_liveness = ss_conn_watch_liveness,
	.conn_local_gids = ss_conn_local_gids,
	.conn_connect = ss_conn_connect,
	.conn_start = ss_conn_start,
	.conn_send = ss_conn_send,
	.conn_recv = ss_conn_recv,
	.conn_readable = ss_conn_readable,
	.conn_shutdown_wr = ss_conn_shutdown_wr,
	.conn_ready = ss_conn_ready,
	.conn_resync = ss_conn_resync,
	.conn_drain = ss_conn_drain,
	.conn_spin = ss_conn_spin,
	.conn_get_stats = ss_conn_get_stats,
	.conn_destroy = ss_conn_destroy,
	.worker_get_stats = ss_worker_get_stats,
	.conn_publish = ss_conn_publish,
	.worker_publish = ss_worker_publish,
};
