/*
 * The process's first device opened ahead of need: a thread of its own
 * opens it and makes its pools, once per process, so that the first move
 * to RDMA finds them made (docs/design.md, "The device ahead of the first
 * move").
 */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>

#include "shim/real.h"
#include "shim/shim.h"
#include "transport/log.h"

/* Asked for once per process (again in a forked child). */
static atomic_bool warm_asked;
/*
 * Held by the warming thread across the opening, and by a fork's prepare
 * handler: libibverbs holds a lock of its own while it lists the devices,
 * which a child forked meanwhile would find held for ever.
 */
static pthread_mutex_t warm_lock = PTHREAD_MUTEX_INITIALIZER;

struct warm_job {
	struct ss_worker *w;
	struct sockaddr_storage local;
};

static void *warm_main(void *arg)
{
	struct warm_job *job = arg;
	struct ss_transport_cfg t;
	int ret;

	ss_transport_cfg_fill(&t);
	pthread_mutex_lock(&warm_lock);
	ret = ss_tp->worker_warm(job->w, &t, (const struct sockaddr *)&job->local);
	pthread_mutex_unlock(&warm_lock);
	if (ret != 0)
		ss_log_info("the device ahead of the first move: not ready (a move will say why)");
	free(job);
	return NULL;
}

void ss_tp_warm(struct ss_sock *s, int fd)
{
	struct ss_worker *w = atomic_load_explicit(&ss_w, memory_order_acquire);
	socklen_t len = sizeof(struct sockaddr_storage);
	struct warm_job *job;
	sigset_t all, old;
	pthread_t th;
	int err;

	/* (A vfork child shares our memory: a thread made there would be the parent's.) */
	if (!w || atomic_load_explicit(&warm_asked, memory_order_relaxed) || ss_tcp_bound(s) ||
	    ss_in_vfork_child() || atomic_exchange(&warm_asked, true))
		return;
	job = malloc(sizeof(*job));
	if (!job || ss_real.getsockname(fd, (struct sockaddr *)&job->local, &len) != 0) {
		free(job);
		return;
	}
	job->w = w;
	/* Its own thread, not the progress thread's deferred work: that takes the CQs' events. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	err = pthread_create(&th, NULL, warm_main, job);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (err) {
		ss_log_info("the device ahead of the first move: no thread (%d)", err);
		free(job);
		return;
	}
	pthread_setname_np(th, "srqshim-warm");
	pthread_detach(th);
}

void ss_warm_before_fork(void)
{
	pthread_mutex_lock(&warm_lock);
}

void ss_warm_after_fork_parent(void)
{
	pthread_mutex_unlock(&warm_lock);
}

void ss_warm_after_fork(void)
{
	pthread_mutex_init(&warm_lock, NULL);
	/* The child's worker is new, and has no device yet. */
	atomic_store(&warm_asked, false);
}
