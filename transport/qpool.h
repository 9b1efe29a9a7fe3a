/*
 * Ready QPs (issue 11): SRQ-mode QPs of one device made ahead of need, so
 * that a new connection only moves one to RTR and RTS. The progress thread
 * keeps up to `want` of them: created on the device's SRQ with a send CQ
 * reservation of their own, and in INIT. A connection takes one if the
 * pool has one made with its capabilities, and asks for a refill; else it
 * makes its own, as before. Taken QPs are destroyed as any other; the pool
 * itself lives as long as its device context (the process).
 *
 * Locking: the pool's lock is never held across a verbs call; under it only the
 * leaf tasks_lock is taken (to queue a refill). ss_qpool_take may be called by
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

/* The capabilities of an SRQ-mode QP under cfg: the pool's, and a connection's that asks it. */
static inline struct ss_qp_caps ss_qpool_caps(const struct ss_transport_cfg *cfg)
{
	return (struct ss_qp_caps){cfg->sq_depth, 0, cfg->max_inline};
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
 * Takes a ready QP made with caps, with context as its qp_context, and its
 * send CQ reservation; queues a refill. Returns false when there is none.
 */
bool ss_qpool_take(struct ss_qpool *p, const struct ss_qp_caps *caps, void *context,
		   struct ibv_qp **qp_p, struct ss_cq **scq_p);

/*
 * Makes an SRQ-mode QP of dc as the pool does (a send CQ reservation, the
 * QP on the SRQ with context as its qp_context, INIT); also for a
 * connection that found the pool empty. Returns 0 or -errno, nothing left.
 */
int ss_qpool_make(struct ss_devctx *dc, const struct ss_qp_caps *caps, void *context,
		  struct ibv_qp **qp_p, struct ss_cq **scq_p);

/* Adds the ready QPs now, the takes served and the takes that found none (statistics). */
void ss_qpool_get_stats(struct ss_qpool *p, uint32_t *ready, uint64_t *taken, uint64_t *own);

#endif
