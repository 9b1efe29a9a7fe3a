#include "transport/qpool.h"

#include <stddef.h>
#include <string.h>

#include <infiniband/verbs.h>

#include "transport/cq.h"
#include "transport/srq.h"
#include "transport/worker.h"

/* Gives back *e's CQ reservations (its receive one only if made). */
static void qpool_unreserve(struct ss_devctx *dc, const struct ss_qp_caps *caps,
			    struct ss_qpool_ent *e)
{
	ss_cqs_unreserve(&dc->cqs, e->scq, caps->sq_depth);
	ss_cqs_unreserve(&dc->cqs, e->rcq, caps->rq_depth);
}

/* Undoes a qpool_make that succeeded: destroys *e's QP, gives back its reservations. */
static void qpool_unmake(struct ss_devctx *dc, const struct ss_qp_caps *caps,
			 struct ss_qpool_ent *e)
{
	ibv_destroy_qp(e->qp);
	qpool_unreserve(dc, caps, e);
}

/*
 * Makes a QP of dc with caps (its CQ reservations, the QP on the SRQ when
 * caps.rq_depth is 0, context as its qp_context, INIT) into *e. Returns 0
 * or -errno, nothing left.
 */
static int qpool_make(struct ss_devctx *dc, const struct ss_qp_caps *caps, void *context,
		      struct ss_qpool_ent *e)
{
	struct ss_srq *srq = NULL;
	int ret;

	e->rcq = NULL;
	ret = ss_cqs_reserve(&dc->cqs, false, caps->sq_depth, &e->scq);
	if (ret)
		return ret;
	/* Each reservation holds every request of its queue: a CQ can never overflow. */
	if (caps->rq_depth)
		ret = ss_cqs_reserve(&dc->cqs, true, caps->rq_depth, &e->rcq);
	else
		srq = atomic_load_explicit(&dc->srq, memory_order_acquire);
	if (ret == 0)
		ret = ss_qp_create_rc(dc->pd, e->scq->cq, srq ? srq->rcq->cq : e->rcq->cq,
				      srq ? srq->srq : NULL, caps, context, &e->qp);
	if (ret == 0) {
		ret = ss_qp_init(e->qp, dc->dev);
		if (ret != 0)
			qpool_unmake(dc, caps, e);
		return ret;
	}
	qpool_unreserve(dc, caps, e);
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
	if (more && qpool_make(p->dc, &p->caps, NULL, &e) != 0)
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

/* Takes a ready QP made with caps into *e, context its qp_context; queues a refill. */
static bool qpool_take(struct ss_qpool *p, const struct ss_qp_caps *caps, void *context,
		       struct ss_qpool_ent *e)
{
	bool got;

	if (p->want == 0 || memcmp(caps, &p->caps, sizeof(*caps)) != 0)
		return false;
	pthread_mutex_lock(&p->lock);
	got = p->n > 0;
	if (got) {
		*e = p->ent[--p->n];
		p->taken++;
	} else {
		p->own++;
	}
	qpool_queue_locked(p);
	pthread_mutex_unlock(&p->lock);
	if (got)
		e->qp->qp_context = context;
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

int ss_qpool_get(struct ss_devctx *dc, const struct ss_qp_caps *caps, struct ss_conn *c,
		 struct ss_qpool_ent *e)
{
	int ret;

	if (!qpool_take(&dc->qpool, caps, c, e)) {
		ret = qpool_make(dc, caps, c, e);
		if (ret)
			return ret;
	}
	ret = ss_cqs_attach(&dc->cqs, e->qp, c);
	if (ret)
		qpool_unmake(dc, caps, e);
	return ret;
}
