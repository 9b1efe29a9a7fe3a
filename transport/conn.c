/*
 * A byte stream over one RC QP with a private receive queue: registered
 * receive buffers posted per connection, a ring of registered send slots,
 * and the credit rules of credit.h. Every SEND carries its kind and the
 * credits it returns in the immediate data (docs/protocol.md, part 2).
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
#include "transport/qp.h"
#include "transport/worker.h"

/* How long a peer whose TCP connection ended may still deliver over RDMA. */
#define SS_GONE_GRACE_MS 500

enum conn_state {
	ST_CREATED,   /* QP made, receives posted */
	ST_CONNECTED, /* QP in RTS; waiting for the commit point */
	ST_RUNNING,   /* data flows */
	ST_FAILED,    /* error: reads and writes report a reset */
	ST_DEAD,      /* destroyed by its owner; the worker frees it */
};

/* wr_id of sends: the kind in the top bits, the slot sequence below. */
#define WR_KIND_SHIFT 62

struct rx_ent {
	uint32_t slot;
	uint32_t len;
	uint32_t off; /* bytes already read */
};

struct ss_conn {
	pthread_mutex_t lock;
	pthread_cond_t drained;
	struct ss_conn *next; /* worker lists: graveyard or timed */
	struct ss_worker *w;
	struct ss_devctx *dc;
	struct ss_conn_hooks hooks;
	uint32_t sq_depth, rx_window, ctrl_reserve;
	void *hooks_arg;
	int liveness_fd;
	int ep_tag; /* SS_TAG_LIVENESS: the progress loop finds us by this field */

	struct ibv_cq *cq;  /* receive completions: always armed */
	struct ibv_cq *scq; /* send completions: armed only while someone waits for them */
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	uint8_t *mem;
	size_t mem_len;
	uint32_t psn;
	unsigned unacked_events, unacked_sevents;

	uint32_t buf_size;
	uint32_t n_rx; /* receive slots: data window plus control reserve */
	struct rx_ent *rxq; /* ring of n_rx, received data in order */
	uint32_t rxq_head, rxq_count;
	size_t rx_avail;

	uint8_t *tx_mem;
	uint32_t n_tx, tx_slot_size, max_inline;
	uint32_t *tx_len;
	uint32_t tx_done, tx_posted, tx_open; /* sequence numbers of slots */
	bool tx_hold;                          /* MSG_MORE: keep the partial last slot */

	struct ss_credit cr;
	enum conn_state st;
	bool eos_wanted, eos_posted, eos_done;
	bool draining; /* ss_conn_drain() waits */
	int spinners;  /* application threads polling the CQs in ss_conn_spin() */
	bool tcp_gone;
	uint64_t gone_deadline;
	bool timed; /* on the worker's timer list */
	unsigned last_ready;
	struct ss_conn_stats stats;
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
	return c->gone_deadline;
}

static uint8_t *rx_buf(struct ss_conn *c, uint32_t slot)
{
	return c->mem + (size_t)slot * c->buf_size;
}

static uint8_t *tx_buf(struct ss_conn *c, uint32_t seq)
{
	return c->tx_mem + (size_t)(seq % c->n_tx) * c->tx_slot_size;
}

static int post_recv(struct ss_conn *c, uint32_t slot)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)rx_buf(c, slot),
		.length = c->buf_size,
		.lkey = c->mr->lkey,
	};
	struct ibv_recv_wr wr = {.wr_id = slot, .sg_list = &sge, .num_sge = 1}, *bad;
	int ret = ibv_post_recv(c->qp, &wr, &bad);

	if (ret) {
		ss_log_error("QP %u: ibv_post_recv: %s", c->qp->qp_num, strerror(ret));
		return -ret;
	}
	return 0;
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

static int post_send(struct ss_conn *c, enum ss_msg_kind kind, uint32_t seq, bool want_more)
{
	uint32_t len = kind == SS_KIND_DATA ? c->tx_len[seq % c->n_tx] : 0;
	struct ibv_sge sge = {.addr = (uintptr_t)tx_buf(c, seq), .length = len, .lkey = c->mr->lkey};
	struct ibv_send_wr wr = {
		.wr_id = ((uint64_t)kind << WR_KIND_SHIFT) | seq,
		.sg_list = &sge,
		.num_sge = len ? 1 : 0,
		.opcode = IBV_WR_SEND_WITH_IMM,
		.send_flags = IBV_SEND_SIGNALED | (len && len <= c->max_inline ? IBV_SEND_INLINE : 0),
	}, *bad;
	int ret;

	wr.imm_data = htonl(ss_credit_on_post(&c->cr, kind, want_more));
	ret = ibv_post_send(c->qp, &wr, &bad);
	if (ret) {
		/* Never expected: slots and credits were checked. */
		ss_log_error("QP %u: ibv_post_send: %s", c->qp->qp_num, strerror(ret));
		fail(c, "post_send failed");
		return -ret;
	}
	if (kind == SS_KIND_DATA) {
		c->stats.tx_msgs++;
		c->stats.tx_bytes += len;
	}
	return 0;
}

static bool tx_pending(const struct ss_conn *c)
{
	return c->tx_posted != c->tx_open;
}

/* Posts what the rules allow: control first (it never waits behind data). */
static void flush(struct ss_conn *c)
{
	if (c->st != ST_RUNNING)
		return;
	if (ss_credit_ctrl_due(&c->cr, tx_pending(c)) && ss_credit_can_send_ctrl(&c->cr) &&
	    post_send(c, SS_KIND_CTRL, 0, tx_pending(c)) < 0)
		return;
	while (tx_pending(c) && ss_credit_can_send_data(&c->cr)) {
		bool last = c->tx_posted + 1 == c->tx_open;

		if (last && c->tx_hold && c->tx_len[c->tx_posted % c->n_tx] < c->tx_slot_size)
			break;
		if (post_send(c, SS_KIND_DATA, c->tx_posted, !last) < 0)
			return;
		c->tx_posted++;
	}
	/* Out of credits with data waiting: the request may be due now. */
	if (ss_credit_ctrl_due(&c->cr, tx_pending(c)) && ss_credit_can_send_ctrl(&c->cr) &&
	    post_send(c, SS_KIND_CTRL, 0, tx_pending(c)) < 0)
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
	if (tx_free_slots(c) > 0)
		return true;
	return tx_pending(c) && c->tx_len[(c->tx_open - 1) % c->n_tx] < c->tx_slot_size;
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

/* Handles one completion; returns true if it brought new readable data. */
static bool on_completion(struct ss_conn *c, const struct ibv_wc *wc)
{
	if (wc->status != IBV_WC_SUCCESS) {
		if (c->st != ST_FAILED && c->st != ST_DEAD)
			ss_log_info("QP %u: completion error %s (%s)", c->qp->qp_num,
				    ibv_wc_status_str(wc->status), wc->opcode & IBV_WC_RECV ? "recv" : "send");
		fail(c, ibv_wc_status_str(wc->status));
		return false;
	}
	if (!(wc->opcode & IBV_WC_RECV)) {
		enum ss_msg_kind kind = (enum ss_msg_kind)(wc->wr_id >> WR_KIND_SHIFT);

		ss_credit_on_send_done(&c->cr, kind);
		if (kind == SS_KIND_DATA)
			c->tx_done++; /* one SQ: send completions come in order */
		else if (kind == SS_KIND_EOS)
			c->eos_done = true;
		return false;
	}

	uint32_t slot = (uint32_t)wc->wr_id;
	/* Any message from the peer proves its QP receives: the commit point has passed. */
	if (c->st == ST_CONNECTED)
		c->st = ST_RUNNING;
	int kind = (wc->wc_flags & IBV_WC_WITH_IMM) ? ss_credit_on_recv(&c->cr, ntohl(wc->imm_data))
						     : -EPROTO;
	if (kind < 0 || (kind != SS_KIND_DATA && wc->byte_len) ||
	    (kind == SS_KIND_DATA && wc->byte_len == 0)) {
		ss_log_error("QP %u: protocol error in a received message (imm 0x%x, %u bytes)",
			     c->qp->qp_num, ntohl(wc->imm_data), wc->byte_len);
		fail(c, "protocol error");
		return false;
	}
	if (kind != SS_KIND_DATA) {
		if (post_recv(c, slot) < 0)
			fail(c, "repost failed");
		return kind == SS_KIND_EOS;
	}
	c->rxq[(c->rxq_head + c->rxq_count) % c->n_rx] = (struct rx_ent){slot, wc->byte_len, 0};
	c->rxq_count++;
	c->rx_avail += wc->byte_len;
	c->stats.rx_msgs++;
	c->stats.rx_bytes += wc->byte_len;
	return true;
}

/* Polls one CQ dry; returns true if new readable data came. */
static bool poll_dry(struct ss_conn *c, struct ibv_cq *cq)
{
	struct ibv_wc wc[16];
	bool edge = false;
	int n;

	do {
		n = ibv_poll_cq(cq, 16, wc);
		if (n < 0) {
			fail(c, "poll_cq failed");
			return edge;
		}
		for (int i = 0; i < n; i++)
			edge |= on_completion(c, &wc[i]);
	} while (n == 16);
	return edge;
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
static void reap_sends(struct ss_conn *c)
{
	bool edge = poll_dry(c, c->scq);

	flush(c);
	if (send_waiters(c)) {
		if (ibv_req_notify_cq(c->scq, 0) != 0)
			fail(c, "req_notify_cq failed");
		edge |= poll_dry(c, c->scq);
		flush(c);
	}
	(void)edge; /* send completions bring no data */
}

/* Drains both CQs and re-arms them as needed; call with the lock held. */
static void progress(struct ss_conn *c)
{
	bool edge = false;

	if (c->st == ST_DEAD)
		return;
	edge |= poll_dry(c, c->scq);
	edge |= poll_dry(c, c->cq);
	/*
	 * Arm, then poll again: a completion between the two polls is not lost.
	 * While an application thread spins on the CQ it needs no events.
	 */
	if (!c->spinners) {
		if (ibv_req_notify_cq(c->cq, 0) != 0)
			fail(c, "req_notify_cq failed");
		edge |= poll_dry(c, c->cq);
	}
	reap_sends(c);
	if (c->tcp_gone && !c->cr.eos_received && c->st == ST_RUNNING && !c->gone_deadline) {
		/* Once: the grace counts from the TCP end, not from the last progress. */
		c->gone_deadline = ss_now_ms() + SS_GONE_GRACE_MS;
		c->timed = true;
		ss_worker_arm_timer(c->w, c);
	}
	if (c->eos_done || c->st == ST_FAILED || (!tx_pending(c) && c->tx_done == c->tx_posted))
		pthread_cond_broadcast(&c->drained);
	report(c, edge);
}

bool ss_conn_spin(struct ss_conn *c, unsigned usec)
{
	uint64_t end = ss_now_us() + usec;
	bool got = false;

	pthread_mutex_lock(&c->lock);
	c->spinners++;
	for (;;) {
		if (c->st != ST_RUNNING) {
			got = true;
			break;
		}
		/* No re-arming and no readiness report: the caller consumes what comes. */
		got = poll_dry(c, c->cq) | poll_dry(c, c->scq);
		if (got) {
			flush(c);
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
		if (poll_dry(c, c->cq)) {
			flush(c);
			got = true;
		}
		if (!got)
			report(c, false);
	}
	pthread_mutex_unlock(&c->lock);
	return got;
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
	progress(c);
	pthread_mutex_unlock(&c->lock);
}

void ss_conn_on_timer(struct ss_conn *c, uint64_t now_ms)
{
	pthread_mutex_lock(&c->lock);
	c->timed = false;
	if (c->st == ST_RUNNING) {
		progress(c);
		if (!c->cr.eos_received && now_ms >= c->gone_deadline) {
			ss_log_info("QP %u: gone peer: credits %u, owed %u, held %u, peer asked %d",
				    c->qp->qp_num, c->cr.tx_credits, c->cr.to_return,
				    c->cr.rx_outstanding, c->cr.peer_hard_req);
			fail(c, "peer gone without end of stream");
			report(c, false);
		}
	}
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
		progress(c);
	} else if (ev == SS_TCP_GONE) {
		c->tcp_gone = true;
		epoll_ctl(c->w->epfd, EPOLL_CTL_DEL, c->liveness_fd, NULL);
		if (c->st == ST_CREATED || c->st == ST_CONNECTED)
			fail(c, "peer gone during the handshake");
		progress(c);
	}
	pthread_mutex_unlock(&c->lock);
}

int ss_conn_create(struct ss_worker *w, const struct ss_transport_cfg *cfg,
		   const struct sockaddr *local, const struct ss_conn_hooks *hooks, void *hooks_arg,
		   struct ss_conn **conn_p, struct ss_params *mine, enum ss_reason *reason_p)
{
	struct ss_qp_caps caps;
	struct ss_conn *c;
	size_t rx_len, tx_len;
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
	c->hooks = *hooks;
	c->hooks_arg = hooks_arg;
	c->liveness_fd = -1;
	c->ep_tag = SS_TAG_LIVENESS;
	ret = ss_worker_devctx(w, &cfg->dev, local, &c->dc, reason_p);
	if (ret)
		goto err_free;
	*reason_p = SS_REASON_RESOURCE;

	c->sq_depth = cfg->sq_depth;
	c->rx_window = cfg->rx_window;
	c->ctrl_reserve = cfg->ctrl_reserve;
	c->buf_size = cfg->buf_size;
	c->n_rx = cfg->rx_window + cfg->ctrl_reserve;
	c->n_tx = cfg->sq_depth - cfg->ctrl_reserve;
	c->tx_slot_size = cfg->buf_size; /* lowered to the peer's buffer size on connect */
	c->max_inline = cfg->max_inline;
	rx_len = (size_t)c->n_rx * c->buf_size;
	tx_len = (size_t)c->n_tx * c->buf_size;
	c->mem_len = rx_len + tx_len;
	c->mem = aligned_alloc(4096, (c->mem_len + 4095) & ~(size_t)4095);
	c->rxq = calloc(c->n_rx, sizeof(*c->rxq));
	c->tx_len = calloc(c->n_tx, sizeof(*c->tx_len));
	if (!c->mem || !c->rxq || !c->tx_len) {
		ret = -ENOMEM;
		goto err_free;
	}
	c->tx_mem = c->mem + rx_len;
	/* Local write only: the peer reaches our memory through SENDs alone. */
	c->mr = ibv_reg_mr(c->dc->pd, c->mem, c->mem_len, IBV_ACCESS_LOCAL_WRITE);
	if (!c->mr) {
		ret = -errno;
		ss_log_error("ibv_reg_mr(%zu bytes): %s", c->mem_len, strerror(errno));
		goto err_free;
	}
	/* Each CQ holds every request of its queue: it can never overflow. */
	c->cq = ibv_create_cq(c->dc->dev->ctx, (int)c->n_rx, c, c->dc->ch, 0);
	c->scq = ibv_create_cq(c->dc->dev->ctx, (int)cfg->sq_depth, c, c->dc->ch, 0);
	if (!c->cq || !c->scq) {
		ret = -errno;
		ss_log_error("ibv_create_cq: %s", strerror(errno));
		goto err_destroy_cq;
	}
	caps = (struct ss_qp_caps){cfg->sq_depth, c->n_rx, cfg->max_inline};
	ret = ss_qp_create_rc(c->dc->pd, c->scq, c->cq, NULL, &caps, &c->qp);
	if (ret)
		goto err_destroy_cq;
	ret = ss_random_psn(&c->psn);
	if (ret)
		goto err_destroy_qp;

	memset(mine, 0, sizeof(*mine));
	mine->caps = SS_CAP_DATA_V1;
	mine->recv_mode = SS_RECV_RQ;
	mine->mtu = (uint8_t)c->dc->dev->active_mtu;
	mine->sq_depth = (uint16_t)cfg->sq_depth;
	mine->qpn = c->qp->qp_num;
	mine->psn = c->psn;
	memcpy(mine->gid, c->dc->dev->gid, 16);
	mine->buf_size = c->buf_size;
	mine->window = cfg->rx_window;
	c->st = ST_CREATED;
	*conn_p = c;
	*reason_p = SS_REASON_NONE;
	return 0;

err_destroy_qp:
	ibv_destroy_qp(c->qp);
err_destroy_cq:
	if (c->scq)
		ibv_destroy_cq(c->scq);
	if (c->cq)
		ibv_destroy_cq(c->cq);
	ibv_dereg_mr(c->mr);
err_free:
	free(c->mem);
	free(c->rxq);
	free(c->tx_len);
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
	for (uint32_t s = 0; s < c->n_rx && ret == 0; s++)
		ret = post_recv(c, s);
	if (ret)
		goto out;
	ret = ibv_req_notify_cq(c->cq, 0) ? -EIO : 0;
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
	progress(c); /* data may have arrived before we knew the peer was ready */
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
			} else if (tx_free_slots(c)) {
				seq = c->tx_open++;
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
	c->tx_hold = more && taken;
	reap_sends(c);
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
			struct rx_ent *e = &c->rxq[(c->rxq_head + idx) % c->n_rx];
			uint32_t off = e->off;
			size_t n = e->len - off < left ? e->len - off : left;

			memcpy(dst, rx_buf(c, e->slot) + off, n);
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
		/* Fully read buffers go back to the receive queue and their credits back to the peer. */
		while (c->rxq_count && c->rxq[c->rxq_head].off == c->rxq[c->rxq_head].len) {
			uint32_t slot = c->rxq[c->rxq_head].slot;

			c->rxq_head = (c->rxq_head + 1) % c->n_rx;
			c->rxq_count--;
			consumed++;
			if (c->st == ST_RUNNING && post_recv(c, slot) < 0)
				fail(c, "repost failed");
		}
		c->rx_avail -= copied;
		if (consumed && c->st == ST_RUNNING) {
			ss_credit_on_consumed(&c->cr, consumed);
			reap_sends(c);
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
		c->tx_hold = false;
		reap_sends(c);
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
	c->tx_hold = false;
	c->draining = true;
	reap_sends(c);
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
			progress(c);
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
	*st = c->stats;
	st->grants_sent = c->cr.grants_sent;
	st->grants_received = c->cr.grants_received;
	st->requests_sent = c->cr.requests_sent;
	st->requests_received = c->cr.requests_received;
	st->tx_credits = c->cr.tx_credits;
	st->to_return = c->cr.to_return;
	st->sq_free = c->cr.sq_free;
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
	if (c->st != ST_FAILED && c->st != ST_CREATED)
		ss_qp_to_error(c->qp);
	c->st = ST_DEAD;
	pthread_mutex_unlock(&c->lock);
	/* The progress thread frees it: it is the only one that takes CQ events. */
	ss_worker_bury(c->w, c);
}

void ss_conn_free(struct ss_conn *c)
{
	struct ibv_wc wc[16];

	while (ibv_poll_cq(c->cq, 16, wc) > 0 || ibv_poll_cq(c->scq, 16, wc) > 0)
		;
	if (c->unacked_events)
		ibv_ack_cq_events(c->cq, c->unacked_events);
	if (c->unacked_sevents)
		ibv_ack_cq_events(c->scq, c->unacked_sevents);
	ibv_destroy_qp(c->qp);
	ibv_destroy_cq(c->cq);
	ibv_destroy_cq(c->scq);
	ibv_dereg_mr(c->mr);
	free(c->mem);
	free(c->rxq);
	free(c->tx_len);
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
};
