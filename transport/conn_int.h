/*
 * Internal to transport/: the connection object shared by the stream core
 * (conn.c) and its two receive backends (conn_rq.c, conn_srq.c). Every
 * function here is called with the connection's lock held unless it says
 * otherwise.
 */
#ifndef SS_TRANSPORT_CONN_INT_H
#define SS_TRANSPORT_CONN_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include <infiniband/verbs.h>

#include "handshake/clock.h"
#include "transport/conn.h"
#include "transport/cq.h"
#include "transport/credit.h"
#include "transport/pool.h"
#include "transport/timer.h"

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
	bool front;   /* ss_conn_put_front's: no message of the peer's, no credit when read */
};

/*
 * Where receives come from; see ss_rq_backend and ss_srq_backend. Both
 * take their completions from the device's shared CQs (cq.h): the
 * backends differ only in where receives are posted and what backs a
 * credit.
 */
struct backend {
	/* Reserves CQ room, makes the QP and enters it into the map; fills the receive side of
	 * *mine. */
	int (*setup)(struct ss_conn *c, const struct ss_transport_cfg *cfg, struct ss_params *mine);
	/* Posts the first receives; the QP is in RTR. */
	int (*post_initial)(struct ss_conn *c);
	/* A received block is free again; lock held. */
	void (*release)(struct ss_conn *c, struct ss_blk *b);
	/* Blocks released since the last push go back where receives are posted; lock held. */
	void (*repost)(struct ss_conn *c);
	/* n receives of c completed: that many fewer are posted where its receives come from. */
	void (*received)(struct ss_conn *c, uint32_t n);
	/* Credits a grant may return now. */
	uint32_t (*grant_limit)(struct ss_conn *c);
	/*
	 * The QP is in the error state: no receive of the peer's can complete
	 * any more (every posted one completed or flushed; on an SRQ the
	 * last-WQE event, or its bound, since lost_at). Lock held.
	 */
	bool (*rx_final)(struct ss_conn *c);
	/* Destroys the QP (its last completions polled) and the receive side; progress thread, at
	 * free. */
	void (*teardown)(struct ss_conn *c);
	/*
	 * The QP's receives come from a queue it shares: in the error state it
	 * waits for the last-WQE-reached event (bounded) before it is destroyed.
	 */
	bool shared_receives;
};

struct ss_conn {
	pthread_mutex_t lock; /* its rank: docs/design.md, "Threads and locks" */
	pthread_cond_t drained;
	struct ss_conn *grave_next; /* the worker's graveyard (ss_worker_bury) */
	struct ss_worker *w;
	struct ss_devctx *dc;
	const struct backend *be;
	struct ss_conn_hooks hooks;
	uint32_t sq_depth, rx_window, ctrl_reserve;
	void *hooks_arg;

	struct ss_cqs *cqs; /* the device's shared CQs */
	struct ss_cq *rcq;  /* our receive completions' CQ (the SRQ's, or our reservation) */
	struct ss_cq *scq;  /* our reservation for send completions */
	struct ibv_qp *qp;
	uint32_t psn;
	/* private RQ: our buffers */
	struct ss_pool rxp;
	uint32_t n_rx;      /* receives reserved in rcq (private RQ) */
	uint32_t rq_posted; /* receives on our own queue not completed yet (private RQ) */
	/* SRQ: the shared side */
	struct ss_srq *srq;
	uint32_t hold_max; /* blocks held unread before copies go to the heap (UINT32_MAX: never) */
	uint32_t held;
	bool last_wqe;
	bool tx_wait;       /* counted in the CQ set's send waiters */
	struct ss_blk *rel; /* received blocks to repost at the next push */
	uint64_t free_at;

	uint32_t buf_size;
	struct ss_pool *txp; /* the device's send blocks */
	uint32_t n_rxq;      /* the data window: the most messages the peer may have unread here */
	struct rx_ent *rxq;  /* ring of n_rxq, received data in order */
	uint32_t rxq_head, rxq_count;
	size_t rx_avail;

	uint32_t n_tx, tx_slot_size, max_inline;
	struct ss_blk **tx_blk;
	uint32_t *tx_len;
	uint32_t tx_done, tx_posted, tx_open; /* sequence numbers of slots */
	uint64_t hold_until; /* MSG_MORE: keep the partial last slot until then (0: no) */
	bool tx_starved;     /* the send pool was dry */
	uint64_t retry_at;   /* a withheld grant or a dry pool is retried then */

	struct ss_credit cr;
	enum conn_state st;
	bool eos_wanted, eos_posted, eos_done;
	bool draining;  /* ss_conn_drain() waits */
	bool rx_taken;  /* ss_conn_take_unread(): the rest of the stream is elsewhere */
	bool lingering; /* closed: delivering in the background (ss_conn_linger), an event user */
	bool tcp_gone;
	uint64_t gone_deadline;
	/*
	 * When the QP breaks (device or port lost, a transport error) and the
	 * peer can move with us (SS_CAP_LOST): what we posted and do not know
	 * delivered, and all unposted, copied at that moment (later flushes free
	 * the blocks), from the stream offset lost_from on (ss_conn_switch).
	 */
	bool movable, lost;
	uint64_t lost_at, lost_from;
	uint8_t *lost_buf;
	size_t lost_len;
	bool lost_ended;
	bool lost_handed;      /* the copy went to the shim (conn_hand_lost) */
	struct ss_timer timer; /* one timer for all deadlines below (worker lock) */
	uint64_t timer_due;    /* the deadline it was last armed for, 0 after it fired */
	unsigned last_ready;
	struct ss_conn_stats stats;
	struct ss_conn_stats *pub; /* where the counters go: stats, or the shim's shared memory */
};

extern const struct backend ss_rq_backend;
extern const struct backend ss_srq_backend;

static inline bool ss_conn_tx_pending(const struct ss_conn *c)
{
	return c->tx_posted != c->tx_open;
}

static inline uint32_t ss_conn_tx_free_slots(const struct ss_conn *c)
{
	return c->n_tx - (c->tx_open - c->tx_done);
}

static inline bool ss_conn_tx_room(const struct ss_conn *c)
{
	if (ss_conn_tx_pending(c) && c->tx_len[(c->tx_open - 1) % c->n_tx] < c->tx_slot_size)
		return true;
	return ss_conn_tx_free_slots(c) > 0 && !c->tx_starved;
}

static inline uint8_t *conn_rx_data(const struct rx_ent *e)
{
	return e->heap ? e->heap : e->blk->addr;
}

static inline uint8_t *conn_tx_buf(struct ss_conn *c, uint32_t seq)
{
	return c->tx_blk[seq % c->n_tx]->addr;
}

/* The connection failed: its QP goes to the error state, waiters wake. */
void ss_conn_fail(struct ss_conn *c, const char *why);

/* Posts what the credit rules allow: control first (it never waits behind data). */
void ss_conn_flush(struct ss_conn *c);

/* Tells the shim the current readiness when it changed (or always, with edge). */
void ss_conn_report(struct ss_conn *c, bool edge);

/* Handles one completion; returns true if it brought new readable data. */
bool ss_conn_on_completion(struct ss_conn *c, const struct ibv_wc *wc, bool recv);

/* After completions were taken: post what may go, wake drains and report. */
void ss_conn_after_events(struct ss_conn *c, bool edge);

/* True when someone waits for a send completion (so its CQ must raise events). */
bool ss_conn_send_waiters(const struct ss_conn *c);

/* Posts what may go after an application call or completions; lock held. */
void ss_conn_push(struct ss_conn *c);

#endif
