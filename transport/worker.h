/* Internal to transport/: the worker (progress thread, devices) and its services. */
#ifndef SS_TRANSPORT_WORKER_H
#define SS_TRANSPORT_WORKER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "handshake/clock.h"
#include "transport/conn.h"
#include "transport/cq.h"
#include "transport/pool.h"
#include "transport/qpool.h"
#include "transport/timer.h"

struct ibv_pd;
struct ibv_comp_channel;
struct ibv_cq;
struct ibv_wc;

/* What an epoll event's data.ptr points at: the tag field of one of these. */
enum { SS_TAG_WAKE = 1, SS_TAG_CHANNEL, SS_TAG_ASYNC, SS_TAG_WATCH };
/* What a CQ's context points at: the tag of a device's CQ set (cq.h). */
enum { SS_TAG_CQS = 1 };

struct ss_srq;

/* A device opened for one local address, with its PD and completion channel. */
struct ss_devctx {
	struct ss_devctx *next;
	uint8_t key[16]; /* the local address (GID form) it was opened for */
	struct ss_device *dev;
	struct ibv_pd *pd;
	struct ibv_comp_channel *ch;
	uint8_t (*gids)[16]; /* every GID of the port, for the loopback check */
	size_t n_gids;
	atomic_int ep_tag;     /* SS_TAG_CHANNEL */
	bool ch_watched;       /* its channel is in the progress thread's set (the tasks lock) */
	atomic_bool port_down; /* its port went down, or the device failed: no new connection */
	atomic_int async_tag;  /* SS_TAG_ASYNC: the device's async events */
	int pools_ready;       /* txp and rq_cache made (the worker lock) */
	int qpool_started;     /* qpool started, in the first connection's mode (the worker lock) */
	struct ss_pool txp;    /* send blocks of every connection on the device */
	struct ss_cqs cqs;     /* the shared CQs of every connection on the device */
	/* SRQ mode's shared receive side, made on first need (under the worker lock), read
	 * anywhere */
	_Atomic(struct ss_srq *) srq;
	struct ss_qpool qpool;         /* ready QPs (qpool.h); started after the SRQ in srq mode */
	struct ss_pool_cache rq_cache; /* private receive pools of closed connections, kept */
};

/* An address recently found without a device (so not rescanned for a while). */
#define SS_NO_DEV_SLOTS 8
#define SS_NO_DEV_MS    10000
struct ss_no_dev {
	uint8_t key[16];
	enum ss_reason reason;
	uint64_t until_ms;
};

/* Lock order (all of the process's locks): docs/design.md, "Threads and locks". */
struct ss_worker {
	pthread_mutex_t lock;       /* devices and their pools: before the poll lock */
	pthread_mutex_t tasks_lock; /* timers, graveyard, deferred work, channel watching: a leaf */
	_Atomic(struct ss_devctx *) devs; /* added at the head under lock; walked without it */
	atomic_uint n_devs;               /* devices opened so far */
	atomic_int event_users;           /* who needs the progress thread to take CQ events */
	atomic_int sleepers; /* application threads asleep on the channels themselves */
	int epfd, evfd;
	atomic_int ep_tag; /* SS_TAG_WAKE, for evfd */
	pthread_t thread;
	struct ss_conn *graveyard; /* destroyed conns the thread frees */
	/*
	 * When the progress thread's current sleep ends on its own (ms, the one
	 * clock; UINT64_MAX: never); written under tasks_lock. A timer due no
	 * earlier needs no wake-up: the thread looks at the timers then.
	 */
	uint64_t sleep_until;
	struct ss_defer *deferred; /* work queued with ss_worker_defer() */
	int deferred_lazy;         /* of which queued without a wake-up */
	struct ss_timers timers;   /* deadlines of connections (and of the shim's work) */
	struct ss_no_dev no_dev[SS_NO_DEV_SLOTS];
	unsigned no_dev_next;
	_Atomic(struct ss_worker_stats *) pub; /* refreshed by the progress thread */
	uint64_t pub_next_ms;
};

/* Finds or opens the device for local (GID form). Returns 0 or -ENODEV with *reason_p. */
int ss_worker_devctx(struct ss_worker *w, const struct ss_dev_override *ovr,
		     const struct sockaddr *local, struct ss_devctx **dc_p,
		     enum ss_reason *reason_p);

/*
 * The device for local with its port up and its pools made (send pool;
 * SRQ side in SRQ mode; the QP pool started where SRQSHIM_QP_POOL asks for
 * one), for a connection. Returns 0, or -errno with *reason_p.
 */
int ss_worker_devctx_ready(struct ss_worker *w, const struct ss_transport_cfg *cfg,
			   const struct sockaddr *local, struct ss_devctx **dc_p,
			   enum ss_reason *reason_p);

/* True while the progress thread must take CQ events (ss_worker_event_users). */
static inline bool ss_worker_has_event_users(struct ss_worker *w)
{
	return atomic_load_explicit(&w->event_users, memory_order_acquire) > 0;
}

/* True while CQ events are needed by anyone: event users or sleepers (ss_worker_sleepers). */
static inline bool ss_worker_needs_events(struct ss_worker *w)
{
	return ss_worker_has_event_users(w) ||
	       atomic_load_explicit(&w->sleepers, memory_order_acquire) > 0;
}

/* Wakes the progress thread (to look at its timers again). */
void ss_worker_wake(struct ss_worker *w);

/* Hands c to the progress thread for freeing. */
void ss_worker_bury(struct ss_worker *w, struct ss_conn *c);

/* Entry points for the progress engine (conn.c). */
/* Completions of c's QP taken from a shared receive (recv) or send CQ, in CQ order; no lock of c
 * held. */
void ss_conn_on_wcs(struct ss_conn *c, const struct ibv_wc *wc, int n, bool recv);
void ss_conn_on_last_wqe(struct ss_conn *c);
/* The device's port went down (or the device failed): c fails now. Poll lock held, not c's. */
void ss_conn_on_port_down(struct ss_conn *c);
/* The shared pool is exhausted at its bound: c's unread blocks are copied out and reposted. */
void ss_conn_unpin(struct ss_conn *c);
/* 0: c may be freed now; else the time to free it anyway (waiting for its last-WQE event). */
uint64_t ss_conn_free_at(struct ss_conn *c);
/* The link of c in the graveyard. */
struct ss_conn **ss_conn_grave_next_p(struct ss_conn *c);
void ss_conn_free(struct ss_conn *c);

#endif
