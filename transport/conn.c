/*
 * A byte stream over one RC QP: a ring of send slots filled with registered
 * blocks from the device's send pool, received messages queued until the
 * application reads them, and the credit rules of credit.h. Every SEND
 * carries its kind and the credits it returns in the immediate data
 * (docs/protocol.md, part 3). Where receives come from is the backend's
 * business (struct backend in conn_int.h): a private receive queue with
 * its own buffers and CQs (conn_rq.c), or the worker's SRQ with shared
 * pool and CQs (conn_srq.c, srq.c).
 */
#include "transport/conn_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>

#include "transport/handoff.h"
#include "transport/log.h"
#include "transport/qp.h"
#include "transport/srq.h"
#include "transport/worker.h"

struct ss_conn **ss_conn_grave_next_p(struct ss_conn *c)
{
	return &c->grave_next;
}

void ss_conn_fail(struct ss_conn *c, const char *why)
{
	if (c->st == ST_FAILED || c->st == ST_DEAD)
		return;
	ss_log_info("QP %u: connection failed: %s", c->qp->qp_num, why);
	/* Not yet connected (INIT): no send to flush; its receives go with the QP. */
	if (c->st != ST_CREATED)
		ss_qp_to_error(c->qp);
	c->st = ST_FAILED;
	pthread_cond_broadcast(&c->drained);
}

/* Bytes of the slots from seq `from` up to `to`. */
static size_t conn_slot_bytes(const struct ss_conn *c, uint32_t from, uint32_t to)
{
	size_t n = 0;

	for (uint32_t s = from; s != to; s++)
		n += c->tx_len[s % c->n_tx];
	return n;
}

/* Copies the bytes of the slots from seq `from` up to tx_open into a malloc'd buffer. */
static ssize_t conn_copy_slots(struct ss_conn *c, uint32_t from, uint8_t **buf_p)
{
	size_t len = conn_slot_bytes(c, from, c->tx_open), off = 0;
	uint8_t *buf = NULL;

	if (len && !(buf = malloc(len)))
		return -ENOMEM;
	for (uint32_t s = from; s != c->tx_open; s++) {
		memcpy(buf + off, conn_tx_buf(c, s), c->tx_len[s % c->n_tx]);
		off += c->tx_len[s % c->n_tx];
	}
	*buf_p = buf;
	return (ssize_t)len;
}

/*
 * The QP broke (the device or its port is gone, or a transport error) on a
 * connection whose peer can move with us: the stream moves to TCP from what
 * the peer received (docs/protocol.md, section 4). Every byte not known
 * delivered (posted sends not completed yet, and the unposted) is copied
 * now, before their flushes free the blocks; the QP goes to the error state
 * and its receives drain (rx_final). Otherwise (not running, a peer that
 * cannot move or is gone, no memory) the connection fails.
 */
static void conn_lose(struct ss_conn *c, const char *why)
{
	ssize_t n;

	/* The peer's TCP end gone too (its process died): nobody to move with. */
	if (c->st != ST_RUNNING || !c->movable || c->tcp_gone ||
	    (n = conn_copy_slots(c, c->tx_done, &c->lost_buf)) < 0) {
		ss_conn_fail(c, why);
		return;
	}
	c->lost_len = (size_t)n;
	/* pub's counters run from the start: tx_bytes counts what was posted. */
	c->lost_from = c->pub->tx_bytes - conn_slot_bytes(c, c->tx_done, c->tx_posted);
	c->lost_ended = c->eos_wanted && !c->cr.switching;
	c->hold_until = 0;
	ss_log_info("QP %u: the RDMA path is lost (%s): the stream moves to TCP, %zu bytes from "
		    "offset %llu held",
		    c->qp->qp_num, why, c->lost_len, (unsigned long long)c->lost_from);
	ss_conn_fail(c, why);
	c->lost = true;
	c->lost_at = ss_now_ms();
}

/*
 * Asks the progress thread to call conn_on_timer() at (or before) at. The
 * timer fires for the earliest deadline asked (the worker never postpones
 * one; timer_due spares its lock); conn_on_timer() re-arms it for whatever
 * deadlines are still ahead.
 */
static void conn_arm_timer(struct ss_conn *c, uint64_t at)
{
	if (c->timer_due && c->timer_due <= at)
		return;
	c->timer_due = at;
	ss_worker_timer_arm(c->w, &c->timer, at);
}

static void conn_arm_retry(struct ss_conn *c)
{
	if (c->retry_at)
		return;
	c->retry_at = ss_now_ms() + SS_RETRY_MS;
	conn_arm_timer(c, c->retry_at);
}

/* Most data messages posted in one call. */
#define CONN_CHAIN 16

/*
 * Fills wr (and its sge) with message seq of kind, taking its send slot and
 * credit and putting the grants due in its immediate; conn_post posts it.
 */
static void conn_fill_wr(struct ss_conn *c, enum ss_msg_kind kind, uint32_t seq, bool want_more,
			 struct ibv_send_wr *wr, struct ibv_sge *sge)
{
	uint32_t len = kind == SS_KIND_DATA ? c->tx_len[seq % c->n_tx] : 0;

	*wr = (struct ibv_send_wr){
		.wr_id = ((uint64_t)kind << WR_KIND_SHIFT) | seq,
		.sg_list = sge,
		.num_sge = len ? 1 : 0,
		.opcode = IBV_WR_SEND_WITH_IMM,
		.send_flags =
			IBV_SEND_SIGNALED | (len && len <= c->max_inline ? IBV_SEND_INLINE : 0),
	};
	*sge = len ? (struct ibv_sge){.addr = (uintptr_t)conn_tx_buf(c, seq),
				      .length = len,
				      .lkey = c->tx_blk[seq % c->n_tx]->lkey}
		   : (struct ibv_sge){0};
	wr->imm_data = htonl(ss_credit_on_post(&c->cr, kind, want_more));
	if (kind == SS_KIND_DATA) {
		c->pub->tx_msgs++;
		c->pub->tx_bytes += len;
	}
}

/* Posts n filled work requests in one call (one system call on rxe). Returns 0 or -errno. */
static int conn_post(struct ss_conn *c, struct ibv_send_wr *wr, int n)
{
	struct ibv_send_wr *bad;
	int ret;

	for (int i = 0; i + 1 < n; i++)
		wr[i].next = &wr[i + 1];
	ret = ibv_post_send(c->qp, wr, &bad);
	if (ret) {
		/* Never expected: slots and credits were checked. */
		ss_log_error("QP %u: ibv_post_send: %s", c->qp->qp_num, strerror(ret));
		ss_conn_fail(c, "post_send failed");
		return -ret;
	}
	return 0;
}

static int conn_post_send(struct ss_conn *c, enum ss_msg_kind kind, uint32_t seq, bool want_more)
{
	struct ibv_send_wr wr;
	struct ibv_sge sge;

	conn_fill_wr(c, kind, seq, want_more, &wr, &sge);
	return conn_post(c, &wr, 1);
}

/* Sends a grant only against what the backend can back; owed credits beyond wait for a retry. */
static void conn_limit_grants(struct ss_conn *c)
{
	ss_credit_set_grant_limit(&c->cr, c->be->grant_limit(c));
	if (ss_credit_withheld(&c->cr))
		conn_arm_retry(c);
}

static bool conn_ctrl_now(struct ss_conn *c)
{
	return ss_credit_ctrl_due(&c->cr, ss_conn_tx_pending(c)) && ss_credit_can_send_ctrl(&c->cr);
}

/* Posts what the rules allow: control first (it never waits behind data). */
void ss_conn_flush(struct ss_conn *c)
{
	if (c->st != ST_RUNNING)
		return;
	conn_limit_grants(c);
	if (conn_ctrl_now(c) && conn_post_send(c, SS_KIND_CTRL, 0, ss_conn_tx_pending(c)) < 0)
		return;
	/* Data messages go out in chains: one post (a system call on rxe) for up to CONN_CHAIN. */
	struct ibv_send_wr wr[CONN_CHAIN];
	struct ibv_sge sge[CONN_CHAIN];
	int n = 0;

	while (ss_conn_tx_pending(c) && ss_credit_can_send_data(&c->cr)) {
		bool last = c->tx_posted + 1 == c->tx_open;

		if (last && c->hold_until && c->tx_len[c->tx_posted % c->n_tx] < c->tx_slot_size)
			break;
		conn_fill_wr(c, SS_KIND_DATA, c->tx_posted, !last, &wr[n], &sge[n]);
		c->tx_posted++;
		if (++n == CONN_CHAIN) {
			if (conn_post(c, wr, n) < 0)
				return;
			n = 0;
		}
	}
	if (n && conn_post(c, wr, n) < 0)
		return;
	/* Out of credits with data waiting: the request may be due now. */
	if (conn_ctrl_now(c) && conn_post_send(c, SS_KIND_CTRL, 0, ss_conn_tx_pending(c)) < 0)
		return;
	if (c->eos_wanted && !c->eos_posted && !ss_conn_tx_pending(c) &&
	    ss_credit_can_send_ctrl(&c->cr)) {
		if (conn_post_send(c, SS_KIND_EOS, 0, false) == 0)
			c->eos_posted = true;
	}
}

static unsigned conn_compute_ready(const struct ss_conn *c)
{
	unsigned r = 0;

	switch (c->st) {
	case ST_CREATED:
	case ST_DEAD: return 0;
	case ST_CONNECTED:
		/* Before the commit point writes are taken (and held); nothing to read yet. */
		return ss_conn_tx_room(c) ? SS_RDY_OUT : 0;
	case ST_FAILED:
		/* Lost: no error, the stream goes on over TCP (reads and writes wait for it). */
		if (c->lost)
			return SS_RDY_IN | SS_RDY_OUT | SS_RDY_SWITCH;
		return SS_RDY_IN | SS_RDY_OUT | SS_RDY_HUP | SS_RDY_ERR | SS_RDY_RDHUP;
	case ST_RUNNING: break;
	}
	if (c->rx_avail || c->cr.eos_received)
		r |= SS_RDY_IN;
	if (c->cr.switch_received)
		r |= SS_RDY_SWITCH; /* not the end: the stream goes on over TCP */
	else if (c->cr.eos_received)
		r |= SS_RDY_RDHUP;
	/* As TCP's: writable once our end is shut too (a write fails at once, EPIPE). */
	if (c->eos_wanted || ss_conn_tx_room(c))
		r |= SS_RDY_OUT;
	if (c->cr.eos_received && c->eos_wanted && !c->cr.switch_received && !c->cr.switching)
		r |= SS_RDY_HUP;
	return r;
}

/*
 * Everything accepted, and the end of stream once asked for, is
 * acknowledged; or nobody is left to deliver to. Before the commit point
 * (ST_CONNECTED) what was written waits in the ring for the peer's READY:
 * not delivered (a close then must not drop it).
 */
static bool conn_delivered(const struct ss_conn *c)
{
	if (c->st == ST_FAILED || c->st == ST_DEAD || c->st == ST_CREATED || c->tcp_gone)
		return true;
	return !ss_conn_tx_pending(c) && c->tx_done == c->tx_posted &&
	       (!c->eos_wanted || c->eos_done);
}

void ss_conn_report(struct ss_conn *c, bool edge)
{
	unsigned r = conn_compute_ready(c);

	if (c->lingering && conn_delivered(c))
		r |= SS_RDY_SENT;

	if (c->hooks.ready && (r != c->last_ready || edge))
		c->hooks.ready(c->hooks_arg, r | (edge ? SS_RDY_EDGE : 0));
	c->last_ready = r;
}

static void conn_rx_push(struct ss_conn *c, struct ss_blk *b, uint32_t len)
{
	struct rx_ent *e = &c->rxq[(c->rxq_head + c->rxq_count) % c->n_rxq];

	*e = (struct rx_ent){.blk = b, .len = len};
	/* Above the watermark the bytes leave registered memory: a slow reader holds no pool. */
	if (c->held >= c->hold_max && (e->heap = malloc(len)) != NULL) {
		memcpy(e->heap, b->addr, len);
		e->blk = NULL;
		c->be->release(c, b);
		c->pub->copied_out++;
	} else {
		c->held++;
	}
	c->rxq_count++;
	c->rx_avail += len;
}

void ss_conn_unpin(struct ss_conn *c)
{
	pthread_mutex_lock(&c->lock);
	/* Only blocks of a shared pool are worth a copy: a private queue's are its own. */
	for (uint32_t i = 0; c->be->shared_receives && i < c->rxq_count; i++) {
		struct rx_ent *e = &c->rxq[(c->rxq_head + i) % c->n_rxq];

		if (!e->blk || !(e->heap = malloc(e->len)))
			continue;
		memcpy(e->heap, e->blk->addr, e->len);
		c->be->release(c, e->blk);
		e->blk = NULL;
		c->held--;
		c->pub->copied_out++;
	}
	if (c->st != ST_DEAD)
		ss_conn_push(c); /* the blocks go back on the SRQ */
	pthread_mutex_unlock(&c->lock);
}

/* Frees the oldest queued message (read, or dropped at the end). */
static void conn_rx_pop(struct ss_conn *c)
{
	struct rx_ent *e = &c->rxq[c->rxq_head];

	if (e->heap) {
		free(e->heap);
	} else {
		c->be->release(c, e->blk);
		c->held--;
	}
	c->rxq_head = (c->rxq_head + 1) % c->n_rxq;
	c->rxq_count--;
}

static void conn_bad_status(struct ss_conn *c, const struct ibv_wc *wc, bool recv)
{
	if (c->st != ST_FAILED && c->st != ST_DEAD)
		ss_log_info("QP %u: completion error %s (%s)", c->qp->qp_num,
			    ibv_wc_status_str(wc->status), recv ? "recv" : "send");
	conn_lose(c, ibv_wc_status_str(wc->status));
}

/*
 * Handles one completion of our receive side (recv) or send queue; returns
 * true if it brought new readable data. Which queue comes from the CQ it
 * was polled from: an error completion's opcode is undefined.
 */
bool ss_conn_on_completion(struct ss_conn *c, const struct ibv_wc *wc, bool recv)
{
	if (!recv) {
		enum ss_msg_kind kind = (enum ss_msg_kind)(wc->wr_id >> WR_KIND_SHIFT);

		/* First: a lost connection copies this send's bytes before its block goes. */
		if (wc->status != IBV_WC_SUCCESS)
			conn_bad_status(c, wc, recv);
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
		return false;
	}

	struct ss_blk *b = (struct ss_blk *)(uintptr_t)wc->wr_id;
	ss_handoff_complete(b);
	if (wc->status != IBV_WC_SUCCESS) {
		conn_bad_status(c, wc, recv); /* first: a failed connection does not repost */
		c->be->release(c, b);
		return false;
	}
	/* Any message from the peer proves its QP receives: the commit point has passed. */
	if (c->st == ST_CONNECTED)
		c->st = ST_RUNNING;
	int kind = (wc->wc_flags & IBV_WC_WITH_IMM) ? ss_credit_on_recv(&c->cr, ntohl(wc->imm_data))
						    : -EPROTO;
	/* A lost connection still takes what arrived before its QP broke. */
	if (kind < 0 || (kind != SS_KIND_DATA && wc->byte_len) ||
	    (kind == SS_KIND_DATA && wc->byte_len == 0) || (c->st != ST_RUNNING && !c->lost)) {
		if (c->st == ST_RUNNING || c->lost)
			ss_log_error(
				"QP %u: protocol error in a received message (imm 0x%x, %u bytes)",
				c->qp->qp_num, ntohl(wc->imm_data), wc->byte_len);
		c->be->release(c, b);
		ss_conn_fail(c, "protocol error");
		return false;
	}
	/* After the unread bytes were taken, the rest of the stream comes by TCP. */
	if (kind != SS_KIND_DATA || c->rx_taken) {
		c->be->release(c, b);
		return kind == SS_KIND_EOS;
	}
	conn_rx_push(c, b, wc->byte_len);
	c->pub->rx_msgs++;
	c->pub->rx_bytes += wc->byte_len;
	return true;
}

/* After completions were taken: post what may go, wake drains and report; lock held. */
/* Credit state for the status tool: plain stores, no lock a reader could wait on. */
static void conn_publish_credits(struct ss_conn *c)
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

void ss_conn_push(struct ss_conn *c)
{
	bool wait;

	c->be->repost(c);
	ss_conn_flush(c);
	/* Send completions raise events only while someone waits for one. */
	wait = c->st == ST_RUNNING && ss_conn_send_waiters(c);
	if (wait != c->tx_wait) {
		c->tx_wait = wait;
		ss_cqs_want_tx(c->cqs, wait);
	}
	conn_publish_credits(c);
}

/* Takes the device's completions with our lock dropped (the poll lock comes first). */
static void conn_progress(struct ss_conn *c)
{
	pthread_mutex_unlock(&c->lock);
	ss_cqs_progress(c->cqs, false);
	pthread_mutex_lock(&c->lock);
	if (c->st != ST_DEAD)
		ss_conn_after_events(c, false);
}

/*
 * The peer ended its stream, then its process let go of the whole
 * connection (its TCP end), and we still have bytes for it: nobody will
 * read them. TCP's answer, a reset: a writer waiting for credits wakes
 * with ECONNRESET; reads still give what arrived, then the end
 * (ss_conn_recv puts the end of stream before the failure). With nothing
 * of ours outstanding the connection stays, as TCP's does until its next
 * write draws the reset; the next write here queues its bytes and fails
 * the connection the same way. Not while the stream moves to TCP (down.c
 * owns that end).
 */
static void conn_check_closed_peer(struct ss_conn *c)
{
	if (c->tcp_gone && c->cr.eos_received && c->st == ST_RUNNING && !c->lost && !c->rx_taken &&
	    !c->cr.switching && !c->cr.switch_received &&
	    (ss_conn_tx_pending(c) || c->tx_posted != c->tx_done))
		ss_conn_fail(c,
			     "bytes for a peer that closed the connection after its end of stream");
}

void ss_conn_after_events(struct ss_conn *c, bool edge)
{
	ss_conn_push(c);
	if (c->tcp_gone && !c->cr.eos_received && c->st == ST_RUNNING && !c->gone_deadline) {
		/* Once: the grace counts from the TCP end, not from the last progress. */
		c->gone_deadline = ss_now_ms() + SS_GONE_GRACE_MS;
		conn_arm_timer(c, c->gone_deadline);
	}
	conn_check_closed_peer(c);
	if (c->eos_done || c->st == ST_FAILED ||
	    (!ss_conn_tx_pending(c) && c->tx_done == c->tx_posted))
		pthread_cond_broadcast(&c->drained);
	ss_conn_report(c, edge);
}

/*
 * Someone waits for send completions: a full ring, a drain, the end of
 * stream, or a control message with no capacity left. Otherwise they are
 * reaped on the way (no event, no wake-up per send).
 */
bool ss_conn_send_waiters(const struct ss_conn *c)
{
	return !ss_conn_tx_room(c) || c->draining || (c->eos_wanted && !c->eos_done) ||
	       (ss_credit_ctrl_due(&c->cr, ss_conn_tx_pending(c)) &&
		!ss_credit_can_send_ctrl(&c->cr)) ||
	       (ss_conn_tx_pending(c) && !ss_credit_can_send_data(&c->cr) && c->cr.tx_credits > 0);
}

/* ---- entry points of the progress thread ---- */

void ss_conn_on_wcs(struct ss_conn *c, const struct ibv_wc *wc, int n, bool recv)
{
	bool edge = false;

	pthread_mutex_lock(&c->lock);
	if (recv)
		c->be->received(c, (uint32_t)n);
	for (int i = 0; i < n; i++)
		edge |= ss_conn_on_completion(c, &wc[i], recv);
	if (c->st != ST_DEAD)
		ss_conn_after_events(c, edge);
	pthread_mutex_unlock(&c->lock);
}

static void conn_on_timer(struct ss_timer *t, uint64_t now_ms)
{
	struct ss_conn *c = (struct ss_conn *)((char *)t - offsetof(struct ss_conn, timer));

	pthread_mutex_lock(&c->lock);
	c->timer_due = 0;
	if (c->retry_at && now_ms >= c->retry_at) {
		c->retry_at = 0;
		if (c->tx_starved && ss_pool_can_get(c->txp))
			c->tx_starved = false;
		if (c->tx_starved)
			conn_arm_retry(c);
	}
	if (c->hold_until && now_ms >= c->hold_until)
		c->hold_until = 0;
	if (c->st == ST_RUNNING) {
		conn_progress(c);
		if (c->st == ST_RUNNING && c->gone_deadline && !c->cr.eos_received &&
		    now_ms >= c->gone_deadline) {
			ss_log_info("QP %u: gone peer: credits %u, owed %u, held %u, peer asked %d",
				    c->qp->qp_num, c->cr.tx_credits, c->cr.to_return,
				    c->cr.rx_outstanding, c->cr.peer_hard_req);
			ss_conn_fail(c, "peer gone without end of stream");
			ss_conn_report(c, false);
		}
	}
	/* Still waiting for something: back on the list. */
	if (c->st != ST_DEAD && c->retry_at)
		conn_arm_timer(c, c->retry_at);
	if (c->st != ST_DEAD && c->hold_until)
		conn_arm_timer(c, c->hold_until);
	if (c->st == ST_RUNNING && c->gone_deadline > now_ms && !c->cr.eos_received)
		conn_arm_timer(c, c->gone_deadline);
	pthread_mutex_unlock(&c->lock);
}

void ss_conn_peer_gone(struct ss_conn *c)
{
	pthread_mutex_lock(&c->lock);
	if (c->st != ST_DEAD && !c->tcp_gone) {
		c->tcp_gone = true;
		if (c->st == ST_CREATED || c->st == ST_CONNECTED)
			ss_conn_fail(c, "peer gone during the handshake");
		conn_progress(c);
	}
	pthread_mutex_unlock(&c->lock);
}

void ss_conn_on_port_down(struct ss_conn *c)
{
	pthread_mutex_lock(&c->lock);
	conn_lose(c, "the device's port is down");
	/* Not conn_progress: the caller holds the poll lock (ss_cqs_for_each_conn). */
	ss_conn_after_events(c, false);
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
	c->timer.fire = conn_on_timer;
	ret = ss_worker_devctx_ready(w, cfg, local, &c->dc, reason_p);
	if (ret)
		goto err_free;
	*reason_p = SS_REASON_RESOURCE;
	c->be = cfg->recv_mode == SS_RECV_SRQ ? &ss_srq_backend : &ss_rq_backend;
	c->cqs = &c->dc->cqs;
	c->txp = &c->dc->txp;
	c->sq_depth = cfg->sq_depth;
	c->rx_window = cfg->rx_window;
	c->ctrl_reserve = cfg->ctrl_reserve;
	c->buf_size = cfg->buf_size;
	c->n_rxq = cfg->rx_window + 1; /* the window, and the bytes of ss_conn_put_front */
	c->n_tx = cfg->sq_depth - cfg->ctrl_reserve;
	/* One send pool per device: its blocks set the largest SEND (lowered to the peer's buffers
	 * on connect). */
	c->tx_slot_size = cfg->buf_size < c->txp->blk_size ? cfg->buf_size : c->txp->blk_size;
	c->max_inline = cfg->max_inline;
	c->rxq = calloc(c->n_rxq, sizeof(*c->rxq));
	c->tx_len = calloc(c->n_tx, sizeof(*c->tx_len));
	c->tx_blk = calloc(c->n_tx, sizeof(*c->tx_blk));
	if (!c->rxq || !c->tx_len || !c->tx_blk) {
		ret = -ENOMEM;
		goto err_free;
	}
	/* Before the backend makes anything: nothing to undo when it fails. */
	ret = ss_random_psn(&c->psn);
	if (ret)
		goto err_free;
	memset(mine, 0, sizeof(*mine));
	ret = c->be->setup(c, cfg, mine);
	if (ret)
		goto err_free;
	mine->caps = SS_CAP_DATA_V1 | SS_CAP_SWITCH | SS_CAP_LOST;
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
	pthread_cond_destroy(&c->drained);
	pthread_mutex_destroy(&c->lock);
	free(c);
	return ret;
}

size_t ss_conn_local_gids(const struct ss_conn *c, uint8_t (*gids)[16], size_t max)
{
	size_t n = c->dc->n_gids < max ? c->dc->n_gids : max;

	memcpy(gids, c->dc->gids, n * 16);
	return n;
}

int ss_conn_connect(struct ss_conn *c, const struct ss_params *peer, const struct ss_agreement *agr)
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
	c->movable = agr->caps & SS_CAP_LOST;
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
	conn_progress(c); /* data may have arrived before we knew the peer was ready */
	pthread_mutex_unlock(&c->lock);
}

ssize_t ss_conn_take_unsent(struct ss_conn *c, uint8_t **buf_p)
{
	ssize_t ret;

	pthread_mutex_lock(&c->lock);
	ret = conn_copy_slots(c, c->tx_posted, buf_p);
	if (ret >= 0) {
		/* Whatever was not posted never will be: the stream goes on elsewhere. */
		c->hold_until = 0;
		ss_conn_fail(c, "stream handed back to TCP");
		ss_conn_report(c, false);
	}
	pthread_mutex_unlock(&c->lock);
	return ret;
}

int ss_conn_lose(struct ss_conn *c)
{
	int ret;

	pthread_mutex_lock(&c->lock);
	conn_lose(c, "the peer's RDMA path is lost");
	ret = c->lost ? 0 : -ECONNRESET;
	if (c->st != ST_DEAD)
		ss_conn_report(c, false);
	pthread_mutex_unlock(&c->lock);
	return ret;
}

/*
 * The slots written and not posted are empty again, their blocks back in
 * the pool: their bytes went to the shim, which sends them over TCP. Lock
 * held.
 */
static void conn_drop_unposted(struct ss_conn *c)
{
	while (c->tx_open != c->tx_posted) {
		c->tx_open--;
		ss_pool_put(c->txp, c->tx_blk[c->tx_open % c->n_tx]);
		c->tx_blk[c->tx_open % c->n_tx] = NULL;
	}
}

/* Hands the copy made when the QP broke to the caller, once; lock held. */
static int conn_hand_lost(struct ss_conn *c, struct ss_handback *hb)
{
	if (c->lost_handed)
		return -ECONNRESET;
	*hb = (struct ss_handback){.buf = c->lost_buf,
				   .len = c->lost_len,
				   .from = c->lost_from,
				   .ended = c->lost_ended,
				   .lost = true};
	c->lost_buf = NULL;
	c->lost_handed = true;
	c->cr.switching = true;
	conn_drop_unposted(c); /* never posted now */
	return 0;
}

int ss_conn_take_lost(struct ss_conn *c, struct ss_handback *hb)
{
	int ret;

	*hb = (struct ss_handback){0};
	pthread_mutex_lock(&c->lock);
	ret = c->lost ? conn_hand_lost(c, hb) : -EAGAIN;
	pthread_mutex_unlock(&c->lock);
	return ret;
}

int ss_conn_switch(struct ss_conn *c, struct ss_handback *hb)
{
	ssize_t n;
	int ret = 0;

	*hb = (struct ss_handback){0};
	pthread_mutex_lock(&c->lock);
	if (c->lost) {
		ret = conn_hand_lost(c, hb);
		goto out;
	}
	if (c->st != ST_RUNNING) {
		ret = c->st == ST_FAILED ? -ECONNRESET : -ENOTCONN;
		goto out;
	}
	if (c->tcp_gone) {
		ret = -EPIPE; /* the peer's process is gone: nobody to move with */
		goto out;
	}
	/* Everything posted reaches the peer before our end of stream: ours resumes after it. */
	hb->from = c->pub->tx_bytes;
	if (c->eos_posted) {
		/* Our stream ended over RDMA already (shutdown): nothing of ours follows. */
		hb->ended = !c->cr.switching;
		goto out;
	}
	/* A shutdown whose end of stream still waits (for credits) becomes the switch. */
	hb->ended = c->eos_wanted;
	n = conn_copy_slots(c, c->tx_posted, &hb->buf);
	if (n < 0) {
		ret = (int)n;
		goto out;
	}
	hb->len = (size_t)n;
	/* What was not posted goes on over TCP. */
	conn_drop_unposted(c);
	c->hold_until = 0;
	c->cr.switching = true;
	c->eos_wanted = true;
	ss_conn_push(c);
	ss_conn_report(c, false);
out:
	pthread_mutex_unlock(&c->lock);
	return ret;
}

ssize_t ss_conn_take_unread(struct ss_conn *c, uint8_t **buf_p, uint64_t *received_p)
{
	size_t off = 0;
	uint8_t *buf = NULL;
	ssize_t ret;

	pthread_mutex_lock(&c->lock);
	/* Every byte the peer sent over RDMA is here: its end came, or the QP can take no more. */
	if (!c->cr.eos_received && !(c->lost && c->be->rx_final(c))) {
		ret = c->lost || (c->st != ST_FAILED && c->st != ST_DEAD) ? -EAGAIN : -ECONNRESET;
		goto out;
	}
	/*
	 * Lost: what the device completed for us is taken before the count is
	 * read, also a batch another thread polled and has not handed us yet
	 * (it hands it over under the poll lock, which this waits for).
	 */
	if (c->lost && !c->cr.eos_received)
		conn_progress(c);
	if (c->rx_avail && !(buf = malloc(c->rx_avail))) {
		ret = -ENOMEM;
		goto out;
	}
	while (c->rxq_count) {
		struct rx_ent *e = &c->rxq[c->rxq_head];

		memcpy(buf + off, conn_rx_data(e) + e->off, e->len - e->off);
		off += e->len - e->off;
		conn_rx_pop(c);
	}
	c->rx_avail = 0;
	c->rx_taken = true;
	c->be->repost(c); /* the blocks go back where receives are posted */
	ss_conn_report(c, false);
	*buf_p = buf;
	*received_p = c->pub->rx_bytes;
	ret = (ssize_t)off;
out:
	pthread_mutex_unlock(&c->lock);
	return ret;
}

static int conn_state_error(const struct ss_conn *c)
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
		ret = c->lost ? -EXDEV : conn_state_error(c);
		goto out;
	}
	if (c->eos_wanted) {
		ret = c->cr.switching ? -EXDEV : -EPIPE;
		goto out;
	}
	for (int i = 0; i < iovcnt; i++) {
		const uint8_t *src = iov[i].iov_base;
		size_t left = iov[i].iov_len;

		while (left) {
			uint32_t seq, *len;

			if (ss_conn_tx_pending(c) &&
			    c->tx_len[(c->tx_open - 1) % c->n_tx] < c->tx_slot_size) {
				seq = c->tx_open - 1; /* coalesce into the unposted last slot */
			} else if (ss_conn_tx_free_slots(c) && !c->tx_starved) {
				struct ss_blk *b = ss_pool_get(c->txp, 1);

				if (!b) {
					/* The device's send pool is at its bound: retry shortly. */
					c->tx_starved = true;
					conn_arm_retry(c);
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
			memcpy(conn_tx_buf(c, seq) + *len, src, n);
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
		conn_arm_timer(c, c->hold_until);
	}
	ss_conn_push(c);
	conn_check_closed_peer(c);
	ret = taken ? (ssize_t)taken : -EAGAIN;
	ss_conn_report(c, false);
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
		ret = conn_state_error(c);
		goto out;
	}
	if (c->rx_taken) {
		ret = -EXDEV; /* the unread bytes went back to the peer: the rest is on TCP */
		goto out;
	}
	for (int i = 0; i < iovcnt && idx < c->rxq_count; i++) {
		uint8_t *dst = iov[i].iov_base;
		size_t left = iov[i].iov_len;

		while (left && idx < c->rxq_count) {
			struct rx_ent *e = &c->rxq[(c->rxq_head + idx) % c->n_rxq];
			uint32_t off = e->off;
			size_t n = e->len - off < left ? e->len - off : left;

			memcpy(dst, conn_rx_data(e) + off, n);
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
			consumed += !c->rxq[c->rxq_head].front;
			conn_rx_pop(c);
		}
		c->rx_avail -= copied;
		/* Lost: its blocks still go back (an SRQ's to the shared queue). */
		if (consumed && (c->st == ST_RUNNING || c->lost)) {
			ss_credit_on_consumed(&c->cr, consumed);
			ss_conn_push(c);
		}
	}
	if (copied)
		ret = (ssize_t)copied;
	else if (c->rx_avail)
		ret = 0; /* nothing asked, bytes there: TCP's answer to a zero-length read */
	else if (c->rx_taken || c->cr.switch_received)
		ret = -EXDEV; /* the rest of the stream is on TCP */
	else if (c->cr.eos_received)
		ret = 0; /* the peer ended its stream: what failed later is no reset */
	else if (c->lost)
		ret = -EXDEV; /* the rest comes over TCP */
	else if (c->st == ST_FAILED)
		ret = -ECONNRESET;
	else
		ret = -EAGAIN;
	ss_conn_report(c, false);
out:
	pthread_mutex_unlock(&c->lock);
	return ret;
}

int ss_conn_put_front(struct ss_conn *c, uint8_t *buf, size_t len)
{
	int ret = 0;

	if (!len || len > UINT32_MAX) {
		free(buf);
		return len ? -EINVAL : 0;
	}
	pthread_mutex_lock(&c->lock);
	if (c->rxq_count == c->n_rxq) {
		ret = -EBUSY; /* one such entry at a time */
		free(buf);
		goto out;
	}
	c->rxq_head = (c->rxq_head + c->n_rxq - 1) % c->n_rxq;
	c->rxq[c->rxq_head] = (struct rx_ent){.heap = buf, .len = (uint32_t)len, .front = true};
	c->rxq_count++;
	c->rx_avail += len;
	ss_conn_report(c, true);
out:
	pthread_mutex_unlock(&c->lock);
	return ret;
}

size_t ss_conn_send_capacity(struct ss_conn *c)
{
	size_t n;

	pthread_mutex_lock(&c->lock);
	n = (size_t)c->n_tx * c->tx_slot_size;
	pthread_mutex_unlock(&c->lock);
	return n;
}

size_t ss_conn_readable(struct ss_conn *c)
{
	size_t n;

	pthread_mutex_lock(&c->lock);
	n = c->rx_avail;
	pthread_mutex_unlock(&c->lock);
	return n;
}

size_t ss_conn_unacked(struct ss_conn *c, size_t *unsent_p)
{
	size_t n = 0, unsent = 0;

	pthread_mutex_lock(&c->lock);
	for (uint32_t s = c->tx_done; s != c->tx_open; s++) {
		n += c->tx_len[s % c->n_tx];
		if (s - c->tx_posted < c->tx_open - c->tx_posted)
			unsent += c->tx_len[s % c->n_tx];
	}
	pthread_mutex_unlock(&c->lock);
	*unsent_p = unsent;
	return n;
}

int ss_conn_shutdown_wr(struct ss_conn *c)
{
	int ret = 0;

	pthread_mutex_lock(&c->lock);
	if (c->st == ST_RUNNING || c->st == ST_CONNECTED) {
		c->eos_wanted = true;
		c->hold_until = 0;
		ss_conn_push(c);
		ss_conn_report(c, false);
	} else if (c->lost && !c->lost_handed) {
		c->lost_ended = true; /* our stream ends on TCP after what is held */
	} else if (c->lost) {
		ret = -EXDEV;
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
	r = conn_compute_ready(c);
	pthread_mutex_unlock(&c->lock);
	return r;
}

void ss_conn_resync(struct ss_conn *c)
{
	pthread_mutex_lock(&c->lock);
	if (c->hooks.ready)
		c->hooks.ready(c->hooks_arg, conn_compute_ready(c));
	c->last_ready = conn_compute_ready(c);
	pthread_mutex_unlock(&c->lock);
}

int ss_conn_drain(struct ss_conn *c, int timeout_ms)
{
	uint64_t end = timeout_ms < 0 ? UINT64_MAX : ss_now_ms() + (uint64_t)timeout_ms;
	int ret = 0;

	/* The progress thread moves the connection on meanwhile (and wakes us). */
	ss_worker_event_users(c->w, 1);
	pthread_mutex_lock(&c->lock);
	c->hold_until = 0;
	c->draining = true;
	ss_conn_push(c);
	if (timeout_ms == 0)
		conn_progress(c);
	/* A peer whose TCP end is gone has closed its QP too: nobody is left to deliver to. */
	while (!conn_delivered(c)) {
		uint64_t now = ss_now_ms(), until = now + 50 < end ? now + 50 : end;
		struct timespec ts = {(time_t)(until / 1000), (long)(until % 1000) * 1000000};

		if (now >= end) {
			/* A look without a wait (timeout 0) is no linger that ran out. */
			if (timeout_ms != 0)
				ss_log_warn(
					"QP %u: not delivered within the linger: %u slots unsent, "
					"%u unacknowledged, end of stream %s (credits %u)",
					c->qp->qp_num, c->tx_open - c->tx_posted,
					c->tx_posted - c->tx_done,
					c->eos_done     ? "acknowledged"
					: c->eos_posted ? "sent"
							: "unsent",
					c->cr.tx_credits);
			ret = -ETIMEDOUT;
			break;
		}
		/* Waits in slices and polls at each: closing never depends on an event. */
		if (pthread_cond_timedwait(&c->drained, &c->lock, &ts) == ETIMEDOUT)
			conn_progress(c);
	}
	if (c->st == ST_FAILED)
		ret = -ECONNRESET;
	c->draining = false;
	pthread_mutex_unlock(&c->lock);
	ss_worker_event_users(c->w, -1);
	return ret;
}

void ss_conn_linger(struct ss_conn *c)
{
	bool was;

	/* An event user first: the events that deliver the rest reach the progress thread. */
	ss_worker_event_users(c->w, 1);
	pthread_mutex_lock(&c->lock);
	was = c->lingering || c->st == ST_DEAD;
	if (!was) {
		c->lingering = true;
		c->hold_until = 0;
		ss_conn_push(c);
		ss_conn_report(c, false);
	}
	pthread_mutex_unlock(&c->lock);
	if (was)
		ss_worker_event_users(c->w, -1);
}

void ss_conn_get_stats(struct ss_conn *c, struct ss_conn_stats *st)
{
	pthread_mutex_lock(&c->lock);
	conn_publish_credits(c);
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
		conn_publish_credits(c);
	}
	pthread_mutex_unlock(&c->lock);
}

void ss_conn_destroy(struct ss_conn *c)
{
	bool lingered;

	if (!c)
		return;
	pthread_mutex_lock(&c->lock);
	c->hooks.ready = NULL;
	c->pub = &c->stats; /* the shim's slot is gone after this returns */
	if (c->st != ST_FAILED && c->st != ST_CREATED)
		ss_qp_to_error(c->qp);
	/* On an SRQ the spec's order: error state, last-WQE event (bounded wait), drain,
	 * destroy. */
	c->free_at =
		c->be->shared_receives && c->st != ST_CREATED ? ss_now_ms() + SS_LAST_WQE_MS : 0;
	if (c->tx_wait) {
		c->tx_wait = false;
		ss_cqs_want_tx(c->cqs, false);
	}
	c->st = ST_DEAD;
	lingered = c->lingering;
	c->lingering = false;
	pthread_mutex_unlock(&c->lock);
	if (lingered)
		ss_worker_event_users(c->w, -1);
	/* A timer callback already running sees ST_DEAD and does not re-arm. */
	ss_worker_timer_cancel(c->w, &c->timer);
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
		conn_rx_pop(c);
	c->be->repost(c);
	for (uint32_t s = c->tx_done; s != c->tx_open; s++)
		if (c->tx_blk[s % c->n_tx])
			ss_pool_put(c->txp, c->tx_blk[s % c->n_tx]);
	ss_pool_fini(&c->rxp); /* private RQ only; zeroed otherwise */
	free(c->lost_buf);
	free(c->rxq);
	free(c->tx_len);
	free(c->tx_blk);
	pthread_cond_destroy(&c->drained);
	pthread_mutex_destroy(&c->lock);
	free(c);
}
