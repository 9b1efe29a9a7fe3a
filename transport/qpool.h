/*
 * Ready QPs (issue 11): QPs of one device made ahead of need, so that a
 * new connection only moves one to RTR and RTS. The progress thread keeps
 * up to `want` of them, in INIT, each with its CQ reservations: in SRQ
 * mode on the device's SRQ with a send CQ reservation; in private-RQ mode
 * with a receive queue of its own (no receive posted yet: the connection
 * posts its buffers) and a reservation in each CQ. A connection takes one
 * if the pool has one made with its capabilities, and asks for a refill;
 * else it makes its own, as before. Taken QPs are destroyed as any other;
 * the pool itself lives as long as its device context (the process).
 *
 * Locking: the pool's lock is never held across a verbs call; under it only the
 * leaf tasks_lock is taken (to queue a refill). ss_qpool_get may be called by
 * any thread; the refill runs on the
 * progress thread only (deferred work).
 */
#ifndef SS_TRANSPORT_QPOOL_H
#define SS_TRANSPORT_QPOOL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "transport/conn.h"
#include "transport/qp.h"

#define SS_QPOOL_MAX 16

/*
 * The capabilities of a QP under cfg, in its receive mode: the pool's, and
 * a connection's that asks it (rq_depth 0: on the SRQ).
 */
static inline struct ss_qp_caps ss_qpool_caps(const struct ss_transport_cfg *cfg)
{
	uint32_t rq_depth = cfg->recv_mode == SS_RECV_SRQ ? 0 : cfg->rx_window + cfg->ctrl_reserve;

	return (struct ss_qp_caps){cfg->sq_depth, rq_depth, cfg->max_inline};
}

struct ibv_qp;
struct ss_cq;
struct ss_devctx;
struct ss_worker;

struct ss_qpool {
	pthread_mutex_t lock;
	struct ss_qpool_ent {
		struct ibv_qp *qp;
		struct ss_cq *scq; /* its send CQ reservation (caps.sq_depth) */
		struct ss_cq *rcq; /* its receive CQ reservation (caps.rq_depth); NULL on the SRQ */
	} ent[SS_QPOOL_MAX];
	int n;
	int want;               /* 0: no pool */
	uint64_t taken, own;    /* takes that found a ready QP, and those that did not */
	struct ss_qp_caps caps; /* what its QPs were made with */
	bool queued;            /* a refill is queued or running */
	struct ss_defer refill;
	struct ss_devctx *dc;
	struct ss_worker *w;
};

/* Starts dc's pool of want QPs with caps (the SRQ exists); the first refill is queued. */
void ss_qpool_start(struct ss_qpool *p, struct ss_worker *w, struct ss_devctx *dc, int want,
		    const struct ss_qp_caps *caps);

/*
 * The QP of a new connection c of dc, made with caps: a ready one if the
 * pool has one (a refill is queued), else made here as the pool makes
 * them; c is its qp_context and it is entered in the device's QP map.
 * Fills *e (the QP and its CQ reservations). Returns 0 or -errno, nothing
 * left.
 */
int ss_qpool_get(struct ss_devctx *dc, const struct ss_qp_caps *caps, struct ss_conn *c,
		 struct ss_qpool_ent *e);

/* Adds the ready QPs now, the takes served and the takes that found none (statistics). */
void ss_qpool_get_stats(struct ss_qpool *p, uint32_t *ready, uint64_t *taken, uint64_t *own);

#endif
