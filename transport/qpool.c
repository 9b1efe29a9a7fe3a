#include "transport/qpool.h"

#include <stddef.h>
#include <string.h>

#include <infiniband/verbs.h>

#include "transport/cq.h"
#include "transport/srq.h"
#include "transport/worker.h"

int ss_qpool_make(struct ss_devctx *dc, const struct ss_qp_caps *caps, void *context,
		  struct ibv_qp **qp_p, struct ss_cq **scq_p)
{
	struct ss_srq *srq = atomic_load_explicit(&dc->srq, memory_order_acquire);
	int ret;

	ret = ss_cqs_reserve(&dc->cqs, false, caps->sq_depth, scq_p);
	if (ret)
		return ret;
	ret = ss_qp_create_rc(dc->pd, (*scq_p)->cq, srq->rcq->cq, srq->srq, caps, context, qp_p);
	if (ret == 0) {
		ret = ss_qp_init(*qp_p, dc->dev);
		if (ret == 0)
			return 0;
		ibv_destroy_qp(*qp_p);
	}
	ss_cqs_unreserve(&dc->cqs, *scq_p, caps->sq_depth);
	return ret;
}

/*
 * Deferred work on the progress thread: makes one QP, then queues itself
 * again while the pool is short, so the thread's other work (timers, CQ
 * events) runs between two creations.
 */
static void qpool_refill(struct ss_defer *d)
{
	struct ss_qpool *p = (struct ss_qpool *)((char *)d - offsetof(struct ss_qpool, refill));
	struct ss_qpool_ent e;
	bool more;

	pthread_mutex_lock(&p->lock);
	more = p->n < p->want && !atomic_load(&p->dc->port_down);
	pthread_mutex_unlock(&p->lock);
	/* On failure connections make their own meanwhile; the next take tries again. */
	if (more && ss_qpool_make(p->dc, &p->caps, NULL, &e.qp, &e.scq) != 0)
		more = false;
	pthread_mutex_lock(&p->lock);
	if (more)
		p->ent[p->n++] = e; /* only this thread adds: there is room */
	more = more && p->n < p->want;
	p->queued = more;
	if (more)
		ss_worker_defer(p->w, &p->refill);
	pthread_mutex_unlock(&p->lock);
}

/* Queues a refill unless one is queued already; p->lock held. */
static void qpool_queue_locked(struct ss_qpool *p)
{
	if (p->queued || p->n >= p->want)
		return;
	p->queued = true;
	ss_worker_defer(p->w, &p->refill);
}

void ss_qpool_start(struct ss_qpool *p, struct ss_worker *w, struct ss_devctx *dc, int want,
		    const struct ss_qp_caps *caps)
{
	pthread_mutex_init(&p->lock, NULL);
	p->w = w;
	p->dc = dc;
	p->caps = *caps;
	p->want = want < SS_QPOOL_MAX ? want : SS_QPOOL_MAX;
	p->refill.fn = qpool_refill;
	pthread_mutex_lock(&p->lock);
	qpool_queue_locked(p);
	pthread_mutex_unlock(&p->lock);
}

bool ss_qpool_take(struct ss_qpool *p, const struct ss_qp_caps *caps, void *context,
		   struct ibv_qp **qp_p, struct ss_cq **scq_p)
{
	bool got;

	if (p->want == 0 || memcmp(caps, &p->caps, sizeof(*caps)) != 0)
		return false;
	pthread_mutex_lock(&p->lock);
	got = p->n > 0;
	if (got) {
		*qp_p = p->ent[--p->n].qp;
		*scq_p = p->ent[p->n].scq;
		p->taken++;
	} else {
		p->own++;
	}
	qpool_queue_locked(p);
	pthread_mutex_unlock(&p->lock);
	if (got)
		(*qp_p)->qp_context = context;
	return got;
}

void ss_qpool_get_stats(struct ss_qpool *p, uint32_t *ready, uint64_t *taken, uint64_t *own)
{
	if (p->want == 0)
		return;
	pthread_mutex_lock(&p->lock);
	*ready += (uint32_t)p->n;
	*taken += p->taken;
	*own += p->own;
	pthread_mutex_unlock(&p->lock);
}
