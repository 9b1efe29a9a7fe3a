/*
 * A device's shared completion queues, for connections of both receive
 * modes: receive CQs and send CQs in which every QP (and the SRQ) reserves
 * room for all its work requests (a failed QP flushes every one of them),
 * the map from QP numbers to connections through which completions are
 * handed over, and the arming of CQ events on the device's completion
 * channel.
 *
 * Locking: the poll lock guards the CQ lists, the reservations and the
 * map; it is taken before any connection's lock and never while one is
 * held. Whoever holds it polls every CQ of the device and hands each
 * connection its completions in CQ order, one run of a QP's completions at
 * a time, under that connection's lock. A QP enters the map before it can
 * complete anything and leaves it only after it is destroyed and the CQs
 * are polled dry under the same lock, so a reused QP number never reaches
 * its predecessor's connection.
 */
#ifndef SS_TRANSPORT_CQ_H
#define SS_TRANSPORT_CQ_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "transport/qpmap.h"

struct ibv_cq;
struct ibv_qp;
struct ss_conn;
struct ss_devctx;
struct ss_worker;

/* One CQ of the set. */
struct ss_cq {
	struct ss_cq *next;
	struct ibv_cq *cq;
	uint32_t size, used; /* entries, and entries reserved */
	bool recv;           /* its completions are of receives */
	bool armed;          /* an event was asked for and has not come yet */
	unsigned unacked;    /* events taken and not yet acknowledged (in batches) */
};

struct ss_cqs {
	atomic_int tag; /* SS_TAG_CQS once ready: the context of every CQ here */
	struct ss_devctx *dc;
	struct ss_worker *w;
	pthread_mutex_t lock; /* the poll lock (its rank: docs/design.md, "Threads and locks") */
	struct ss_cq *rcqs, *scqs;
	struct ss_qpmap map;
	uint32_t max_cqe;
	atomic_int pollers; /* threads polling without events (the progress thread does not arm) */
	atomic_int
		tx_waiters; /* connections waiting for a send completion: send CQs raise events */
	atomic_uint found;  /* completions taken so far (any thread), for waiters to compare */
};

/* Prepares q for the device of dc. Returns 0 or -errno. */
int ss_cqs_init(struct ss_cqs *q, struct ss_worker *w, struct ss_devctx *dc);

/*
 * Reserves n entries in a receive (recv) or send CQ, making one when none
 * has room. Returns 0 and sets *cq_p, or -errno.
 */
int ss_cqs_reserve(struct ss_cqs *q, bool recv, uint32_t n, struct ss_cq **cq_p);

/* Gives a reservation back; accepts NULL. */
void ss_cqs_unreserve(struct ss_cqs *q, struct ss_cq *cq, uint32_t n);

/* Enters qp into the map for c. Returns 0 or -ENOMEM. */
int ss_cqs_attach(struct ss_cqs *q, struct ibv_qp *qp, struct ss_conn *c);

/*
 * Destroys qp, polls the CQs dry (its last completions reach its
 * connection) and removes it from the map. No connection lock held.
 * Returns ibv_destroy_qp's result (0, or an errno value: logged).
 */
int ss_cqs_detach(struct ss_cqs *q, struct ibv_qp *qp);

/*
 * Polls every CQ dry and hands the completions over; with rearm, arms the
 * CQs (unless application threads poll) and polls once more, so nothing
 * slips between the last poll and the arming. No connection lock held.
 * Returns the completions taken.
 */
int ss_cqs_progress(struct ss_cqs *q, bool rearm);

/*
 * As ss_cqs_progress(q, false), unless another thread polls already (it
 * hands out what comes to every connection): then returns -EBUSY.
 */
int ss_cqs_try_poll(struct ss_cqs *q);

/*
 * For a thread about to sleep until a CQ event: arms the receive CQs (and
 * the send CQs while connections wait for send completions), then polls.
 * Returns the completions that polling took (> 0: do not sleep).
 */
int ss_cqs_arm(struct ss_cqs *q);

/* An event of cq came (taken off the channel): it is no longer armed. No lock held. */
void ss_cqs_on_event(struct ss_cqs *q, struct ibv_cq *cq);

/* A connection starts (want) or stops waiting for a send completion. Any thread. */
void ss_cqs_want_tx(struct ss_cqs *q, bool want);

/* The progress thread was woken: arms the send CQs if someone waits for them. */
void ss_cqs_on_wake(struct ss_cqs *q);

/* Application threads polling tell the set (no events are needed meanwhile). */
void ss_cqs_poll_begin(struct ss_cqs *q);
void ss_cqs_poll_end(struct ss_cqs *q);

/* Calls fn on every connection in the map, under the poll lock (so before any connection lock). */
void ss_cqs_for_each_conn(struct ss_cqs *q, void (*fn)(struct ss_conn *c));

/* The set of a CQ context (the tag). */
struct ss_cqs *ss_cqs_from_tag(atomic_int *tag);

#endif
