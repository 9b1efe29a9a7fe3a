/*
 * SRQ mode's shared receive side, one per worker and device: an SRQ fed
 * from a registered receive pool that grows on the SRQ limit event, one
 * receive CQ, send CQs whose capacity is reserved per QP, and the map from
 * QP numbers to connections through which completions are dispatched.
 *
 * Locking: the poll lock is taken before any connection's lock, never while
 * one is held. Whoever holds it polls the shared CQs and hands each
 * connection its completions in CQ order (so one QP's receives stay in
 * stream order). QPs enter the map before they can complete anything and
 * leave it only after they are destroyed and the CQs polled dry under the
 * same lock, so a reused QP number never reaches its predecessor's
 * connection.
 */
#ifndef SS_TRANSPORT_SRQ_H
#define SS_TRANSPORT_SRQ_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "transport/pool.h"

struct ibv_cq;
struct ibv_qp;
struct ibv_srq;
struct ss_conn;
struct ss_devctx;
struct ss_worker;

struct ss_srq_cfg {
	uint32_t buf_size;
	uint32_t initial;   /* receive blocks made at first, and the growth step */
	uint32_t max_blks;  /* bound of the receive pool */
};

/* A shared send CQ; QPs reserve room for their whole send queue in it. */
struct ss_txcq {
	struct ss_txcq *next;
	struct ibv_cq *cq;
	uint32_t size, used;
	unsigned unacked;
	int armed;
};

struct ss_srq_stats {
	uint32_t pool_blks, pool_max, peak_held, posted;
	uint64_t limit_events, reg_bytes;
};

struct ss_srq {
	int cq_tag; /* SS_TAG_SRQ: the context of its CQs */
	struct ss_devctx *dc;
	struct ss_worker *w;
	struct ss_srq_cfg cfg;
	pthread_mutex_t poll_lock;
	atomic_int spinners;   /* application threads polling */
	atomic_int tx_waiters; /* connections waiting for a send completion: the send CQs raise events */
	struct ibv_srq *srq;
	struct ss_pool rx;
	atomic_uint posted; /* receives on the SRQ */
	uint32_t limit;  /* the SRQ limit last armed (0: not armed) */
	uint32_t max_cqe;
	struct ibv_cq *rcq;
	unsigned rcq_unacked;
	int rcq_armed;
	struct ss_txcq *txcqs;
	/* QP number -> connection, open addressing; under the poll lock */
	uint32_t *map_qpn;
	struct ss_conn **map_conn;
	uint32_t map_cap, map_n;
	uint32_t peak_held; /* most blocks held by connections at once */
	uint64_t limit_events;
	uint64_t unpins; /* limit events at the bound: unread blocks copied out */
};

/* Makes the SRQ side of dc. Returns 0 and sets *srq_p, or -errno. */
int ss_srq_create(struct ss_worker *w, struct ss_devctx *dc, const struct ss_srq_cfg *cfg,
		  struct ss_srq **srq_p);

/*
 * Reserves room for sq_depth completions in a send CQ (making a new CQ when
 * none has room). Returns 0 and sets *txcq_p, or -errno.
 */
int ss_srq_reserve_tx(struct ss_srq *s, uint32_t sq_depth, struct ss_txcq **txcq_p);

/* Gives back a reservation; accepts a NULL txcq. */
void ss_srq_unreserve_tx(struct ss_srq *s, struct ss_txcq *txcq, uint32_t sq_depth);

/* Enters qp (attached to the SRQ) into the map for c. Returns 0 or -ENOMEM. */
int ss_srq_attach(struct ss_srq *s, struct ibv_qp *qp, struct ss_conn *c);

/*
 * Destroys qp, polls the shared CQs dry (its last completions reach its
 * connection) and removes it from the map. Progress thread only.
 */
void ss_srq_detach(struct ss_srq *s, struct ibv_qp *qp);

/* Puts receive blocks back on the SRQ: a chain linked by next (NULL-terminated). */
void ss_srq_repost(struct ss_srq *s, struct ss_blk *chain);

/*
 * Polls the shared CQs dry and dispatches to the connections; with rearm,
 * arms the CQs that fired (unless application threads spin) and polls once
 * more, so nothing slips between the last poll and the arming. Call with no
 * connection lock held.
 */
void ss_srq_progress(struct ss_srq *s, int rearm);

/*
 * ss_srq_progress(s, 0) unless another thread polls already (it hands out
 * what comes to every connection): returns false then. For spinners, which
 * would otherwise queue up on the poll lock.
 */
bool ss_srq_try_progress(struct ss_srq *s);

/*
 * A connection starts (want) or stops waiting for a send completion (full
 * ring, drain, end of stream, a control message without room): while any
 * waits, the send CQs raise events. Otherwise sends are reaped on the way,
 * with no event per send. Any thread, any lock.
 */
void ss_srq_want_tx(struct ss_srq *s, bool want);

/* The progress thread was woken: arms the send CQs if someone wants them. */
void ss_srq_on_wake(struct ss_srq *s);

/* A completion event on cq (progress thread). */
void ss_srq_on_cq_event(struct ss_srq *s, struct ibv_cq *cq);

/* The SRQ limit event: grows the pool (up to its bound) and re-arms the limit. */
void ss_srq_on_limit(struct ss_srq *s);

/* Application threads polling the CQs themselves tell the SRQ (no events meanwhile). */
void ss_srq_spin_begin(struct ss_srq *s);
void ss_srq_spin_end(struct ss_srq *s);

/* Receive capacity a grant may still promise: posted receives plus room to grow. */
uint32_t ss_srq_free_capacity(struct ss_srq *s);

/* Statistics snapshot. */
void ss_srq_get_stats(struct ss_srq *s, struct ss_srq_stats *st);

struct ss_srq *ss_srq_from_tag(int *tag);

#endif
