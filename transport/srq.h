/*
 * SRQ mode's shared receive side, one per worker and device: an SRQ fed
 * from a registered receive pool that grows when it runs low (the SRQ
 * limit event, or a completion that sees it low) up to a bound, with its receive completions in one
 * CQ of the device's shared set (cq.h) that holds an entry for every block of the pool.
 */
#ifndef SS_TRANSPORT_SRQ_H
#define SS_TRANSPORT_SRQ_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "transport/conn.h"
#include "transport/pool.h"

struct ibv_srq;
struct ss_cq;
struct ss_devctx;

struct ss_srq_cfg {
	uint32_t buf_size;
	uint32_t initial;       /* receive blocks made at first, and the growth step */
	uint32_t max_blks;      /* bound of the receive pool */
	uint32_t test_rearm_ms; /* ss_transport_cfg's */
};

struct ss_srq_stats {
	uint32_t pool_blks, pool_max, peak_held, posted;
	uint64_t limit_events, reg_bytes;
	uint64_t unpins; /* low pools at the bound: unread blocks copied out */
};

struct ss_srq {
	struct ss_devctx *dc;
	struct ss_srq_cfg cfg;
	struct ibv_srq *srq;
	struct ss_cq *rcq; /* our reservation in the device's receive CQs */
	struct ss_pool rx;
	atomic_uint posted;    /* receives on the SRQ */
	uint32_t low_mark;     /* the SRQ limit it arms: below it the pool is low */
	atomic_uint peak_held; /* most blocks held by connections at once */
	struct ss_defer low;   /* the pool ran low, seen by a completion (ss_srq_taken) */
	atomic_bool low_queued;
	/* progress thread only */
	uint64_t limit_events;
	uint64_t unpins;
};

/* Makes the SRQ side of dc. Returns 0 and sets *srq_p, or -errno. */
int ss_srq_create(struct ss_devctx *dc, const struct ss_srq_cfg *cfg, struct ss_srq **srq_p);

/* Puts receive blocks back on the SRQ: a chain linked by next (NULL-terminated). */
void ss_srq_repost(struct ss_srq *s, struct ss_blk *chain);

/*
 * n receives of the SRQ completed (taken off it); any thread. Below the
 * low mark it queues what the limit event does, for the progress thread.
 */
void ss_srq_taken(struct ss_srq *s, uint32_t n);

/*
 * The SRQ limit event (progress thread): grows the pool, or at its bound
 * has every connection copy its unread blocks out; re-arms the limit.
 */
void ss_srq_on_limit(struct ss_srq *s);

/* Receive capacity a grant may still promise: posted receives plus room to grow. */
uint32_t ss_srq_free_capacity(struct ss_srq *s);

/* Statistics snapshot. */
void ss_srq_get_stats(struct ss_srq *s, struct ss_srq_stats *st);

#endif
