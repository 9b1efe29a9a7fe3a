#include "transport/cq.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>

#include "transport/log.h"
#include "transport/worker.h"

/* Largest CQ made for shared use (rxe rounds entries + 1 up to a power of two). */
#define SS_CQ_SHARED 4095u
/* CQ events are acknowledged in batches of this many (all of them before a CQ goes). */
#define SS_CQ_ACK_BATCH 64

struct ss_cqs *ss_cqs_from_tag(atomic_int *tag)
{
	return (struct ss_cqs *)((char *)tag - offsetof(struct ss_cqs, tag));
}

int ss_cqs_init(struct ss_cqs *q, struct ss_worker *w, struct ss_devctx *dc)
{
	struct ibv_device_attr da;

	memset(q, 0, sizeof(*q));
	q->w = w;
	q->dc = dc;
	if (ibv_query_device(dc->dev->ctx, &da))
		return -EIO;
	q->max_cqe = (uint32_t)da.max_cqe;
	pthread_mutex_init(&q->lock, NULL);
	/* Published last: a CQ context is read by the progress thread. */
	atomic_store_explicit(&q->tag, SS_TAG_CQS, memory_order_release);
	return 0;
}

int ss_cqs_reserve(struct ss_cqs *q, bool recv, uint32_t n, struct ss_cq **cq_p)
{
	struct ss_cq *cq, **list = recv ? &q->rcqs : &q->scqs;
	int ret = 0;

	pthread_mutex_lock(&q->lock);
	for (cq = *list; cq; cq = cq->next)
		if (cq->size - cq->used >= n)
			goto found;
	cq = calloc(1, sizeof(*cq));
	if (!cq) {
		ret = -ENOMEM;
		goto out;
	}
	cq->recv = recv;
	cq->size = n > SS_CQ_SHARED ? n : SS_CQ_SHARED;
	if (cq->size > q->max_cqe)
		cq->size = q->max_cqe;
	if (cq->size < n) {
		free(cq);
		ret = -EINVAL;
		goto out;
	}
	cq->cq = ibv_create_cq(q->dc->dev->ctx, (int)cq->size, &q->tag, q->dc->ch, 0);
	if (!cq->cq) {
		ret = errno ? -errno : -ENOMEM;
		ss_log_error("ibv_create_cq(%u): %s", cq->size, strerror(-ret));
		free(cq);
		goto out;
	}
	/* Armed when someone needs its events (cqs_arm_all), as the others. */
	cq->next = *list;
	*list = cq;
found:
	cq->used += n;
	*cq_p = cq;
out:
	pthread_mutex_unlock(&q->lock);
	return ret;
}

void ss_cqs_unreserve(struct ss_cqs *q, struct ss_cq *cq, uint32_t n)
{
	if (!cq)
		return;
	pthread_mutex_lock(&q->lock);
	cq->used -= n;
	pthread_mutex_unlock(&q->lock);
}

int ss_cqs_attach(struct ss_cqs *q, struct ibv_qp *qp, struct ss_conn *c)
{
	int ret;

	pthread_mutex_lock(&q->lock);
	ret = ss_qpmap_put(&q->map, qp->qp_num, c);
	pthread_mutex_unlock(&q->lock);
	return ret;
}

/* Hands completions polled from cq to their connections; poll lock held. */
static void cqs_dispatch(struct ss_cqs *q, struct ss_cq *cq, struct ibv_wc *wc, int n)
{
	/* Runs of one QP's completions go to its connection in one call, in order. */
	for (int i = 0; i < n;) {
		int j = i + 1;
		struct ss_conn *c;

		while (j < n && wc[j].qp_num == wc[i].qp_num)
			j++;
		c = ss_qpmap_find(&q->map, wc[i].qp_num);
		if (c)
			ss_conn_on_wcs(c, &wc[i], j - i, cq->recv);
		else
			ss_log_warn("completion for unknown QP %u", wc[i].qp_num);
		i = j;
	}
}

/* Polls cq dry; poll lock held. Returns the completions taken. */
static int cqs_poll_one(struct ss_cqs *q, struct ss_cq *cq)
{
	struct ibv_wc wc[32];
	int n, total = 0;

	do {
		n = ibv_poll_cq(cq->cq, 32, wc);
		if (n < 0) {
			ss_log_error("ibv_poll_cq: %d", n);
			return total;
		}
		cqs_dispatch(q, cq, wc, n);
		total += n;
	} while (n == 32);
	return total;
}

/* Polls every CQ dry; poll lock held. */
static int cqs_poll_all(struct ss_cqs *q)
{
	int n = 0;

	for (struct ss_cq *cq = q->rcqs; cq; cq = cq->next)
		n += cqs_poll_one(q, cq);
	for (struct ss_cq *cq = q->scqs; cq; cq = cq->next)
		n += cqs_poll_one(q, cq);
	if (n)
		atomic_fetch_add_explicit(&q->found, (unsigned)n, memory_order_release);
	return n;
}

/*
 * Arms the CQs whose events someone needs; poll lock held. CQ events are
 * needed only by a thread that sleeps until one (force: the caller is
 * about to), or while the progress thread must move connections on by
 * itself (ss_worker_event_users), or application threads sleep on the
 * channels (ss_worker_sleepers); receive CQs for data and grants, send CQs
 * while a connection waits for a send completion. Otherwise nothing is
 * armed, and completions raise no event, no system call, no wake-up.
 */
static void cqs_arm_all(struct ss_cqs *q, bool force)
{
	if (!force && !ss_worker_needs_events(q->w))
		return;
	for (struct ss_cq *cq = q->rcqs; cq; cq = cq->next)
		if (!cq->armed && ibv_req_notify_cq(cq->cq, 0) == 0)
			cq->armed = true;
	if (!atomic_load_explicit(&q->tx_waiters, memory_order_acquire))
		return;
	for (struct ss_cq *cq = q->scqs; cq; cq = cq->next)
		if (!cq->armed && ibv_req_notify_cq(cq->cq, 0) == 0)
			cq->armed = true;
}

int ss_cqs_detach(struct ss_cqs *q, struct ibv_qp *qp)
{
	uint32_t qpn = qp->qp_num;
	int ret;

	pthread_mutex_lock(&q->lock);
	ret = ibv_destroy_qp(qp);
	if (ret)
		ss_log_error("ibv_destroy_qp(%u): %s", qpn, strerror(ret));
	/* Its last completions (flushed sends, receives) still reach its connection. */
	cqs_poll_all(q);
	ss_qpmap_del(&q->map, qpn);
	pthread_mutex_unlock(&q->lock);
	return ret;
}

int ss_cqs_progress(struct ss_cqs *q, bool rearm)
{
	int n;

	pthread_mutex_lock(&q->lock);
	n = cqs_poll_all(q);
	if (rearm && !atomic_load_explicit(&q->pollers, memory_order_acquire)) {
		cqs_arm_all(q, false);
		n += cqs_poll_all(q);
	}
	pthread_mutex_unlock(&q->lock);
	return n;
}

int ss_cqs_try_poll(struct ss_cqs *q)
{
	int n;

	if (pthread_mutex_trylock(&q->lock) != 0)
		return -EBUSY;
	n = cqs_poll_all(q);
	pthread_mutex_unlock(&q->lock);
	return n;
}

int ss_cqs_arm(struct ss_cqs *q)
{
	int n;

	pthread_mutex_lock(&q->lock);
	cqs_arm_all(q, true);
	n = cqs_poll_all(q);
	pthread_mutex_unlock(&q->lock);
	return n;
}

/* The CQ of the set that is ibcq; poll lock held. */
static struct ss_cq *cqs_find(struct ss_cqs *q, struct ibv_cq *ibcq)
{
	for (struct ss_cq *cq = q->rcqs; cq; cq = cq->next)
		if (cq->cq == ibcq)
			return cq;
	for (struct ss_cq *cq = q->scqs; cq; cq = cq->next)
		if (cq->cq == ibcq)
			return cq;
	return NULL;
}

void ss_cqs_on_event(struct ss_cqs *q, struct ibv_cq *ibcq)
{
	struct ss_cq *cq;

	pthread_mutex_lock(&q->lock);
	cq = cqs_find(q, ibcq);
	if (cq) {
		cq->armed = false;
		/* The one batcher of CQ event acknowledgements. */
		if (++cq->unacked >= SS_CQ_ACK_BATCH) {
			ibv_ack_cq_events(ibcq, cq->unacked);
			cq->unacked = 0;
		}
	}
	pthread_mutex_unlock(&q->lock);
	ss_cqs_progress(q, true);
}

void ss_cqs_for_each_conn(struct ss_cqs *q, void (*fn)(struct ss_conn *c))
{
	pthread_mutex_lock(&q->lock);
	for (uint32_t i = 0; i < q->map.cap; i++)
		if (q->map.qpn[i])
			fn(q->map.val[i]);
	pthread_mutex_unlock(&q->lock);
}

void ss_cqs_want_tx(struct ss_cqs *q, bool want)
{
	/* The first waiter wakes the progress thread, which arms the send CQs. */
	if (!want)
		atomic_fetch_sub(&q->tx_waiters, 1);
	else if (atomic_fetch_add(&q->tx_waiters, 1) == 0)
		ss_worker_wake(q->w);
}

void ss_cqs_on_wake(struct ss_cqs *q)
{
	bool unarmed = false;

	if (!atomic_load_explicit(&q->tx_waiters, memory_order_acquire))
		return;
	pthread_mutex_lock(&q->lock);
	for (struct ss_cq *cq = q->scqs; cq; cq = cq->next)
		unarmed |= !cq->armed;
	pthread_mutex_unlock(&q->lock);
	if (unarmed)
		ss_cqs_progress(q, true);
}

void ss_cqs_poll_begin(struct ss_cqs *q)
{
	atomic_fetch_add(&q->pollers, 1);
}

void ss_cqs_poll_end(struct ss_cqs *q)
{
	/* The last poller leaves: events must flow again, with nothing lost between. */
	if (atomic_fetch_sub(&q->pollers, 1) == 1)
		ss_cqs_progress(q, true);
}
