/*
 * The transport module (libsrqshim-transport.so, and with it libibverbs),
 * loaded beside libsrqshim.so on first need, and the process's worker.
 */
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "shim/shim.h"
#include "shim/stats.h"
#include "transport/log.h"

const struct ss_transport_ops *ss_tp;
_Atomic(struct ss_worker *) ss_w;

static pthread_mutex_t tp_lock = PTHREAD_MUTEX_INITIALIZER;
static enum ss_reason tp_failure; /* remembered: a failed load is not retried */

void ss_loader_after_fork(void)
{
	pthread_mutex_init(&tp_lock, NULL);
}

enum ss_reason ss_tp_load(void)
{
	char path[PATH_MAX];
	Dl_info info;
	void *h;
	enum ss_reason r = SS_REASON_NONE;

	if (atomic_load_explicit(&ss_w, memory_order_acquire))
		return SS_REASON_NONE;
	pthread_mutex_lock(&tp_lock);
	if (ss_w || tp_failure) {
		r = tp_failure;
		goto out;
	}
	if (!ss_tp) {
		ss_test_delay(SS_TP_LOAD);
		/* The module lives beside libsrqshim.so. */
		if (!dladdr((void *)ss_tp_load, &info) || !info.dli_fname) {
			r = tp_failure = SS_REASON_NO_RDMA_CORE;
			goto out;
		}
		snprintf(path, sizeof(path), "%s", info.dli_fname);
		char *slash = strrchr(path, '/');
		snprintf(slash ? slash + 1 : path,
			 sizeof(path) - (size_t)(slash ? slash + 1 - path : 0),
			 "libsrqshim-transport.so");
		h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
		if (!h) {
			ss_log_warn("cannot load the RDMA transport (%s): connections stay on TCP",
				    dlerror());
			r = tp_failure = SS_REASON_NO_RDMA_CORE;
			goto out;
		}
		const struct ss_transport_ops *ops = dlsym(h, SS_TRANSPORT_OPS_SYMBOL);
		if (!ops || ops->version != SS_TRANSPORT_OPS_VERSION) {
			ss_log_error("%s: not a matching transport module", path);
			r = tp_failure = SS_REASON_NO_RDMA_CORE;
			goto out;
		}
		ops->set_log_level(ss_cfg.log_level);
		ss_tp = ops;
	}
	struct ss_worker *w;
	ss_private_table_grow(); /* before the progress thread */
	if (ss_tp->worker_get(&w) != 0) {
		r = SS_REASON_RESOURCE;
		goto out;
	}
	if (atomic_exchange(&ss_w, w) != w) {
		ss_stats_worker_ready();
		ss_ctlchan_start();
	}
out:
	pthread_mutex_unlock(&tp_lock);
	return r;
}

void ss_transport_cfg_fill(struct ss_transport_cfg *t)
{
	memset(t, 0, sizeof(*t));
	t->dev.device = ss_cfg.device[0] ? ss_cfg.device : NULL;
	t->dev.port = (unsigned)ss_cfg.port;
	t->dev.gid_index = ss_cfg.gid_index;
	t->recv_mode = ss_cfg.mode == SS_MODE_SRQ ? SS_RECV_SRQ : SS_RECV_RQ;
	t->sq_depth = (uint32_t)ss_cfg.sq_depth;
	t->rx_window = (uint32_t)(ss_cfg.mode == SS_MODE_SRQ ? ss_cfg.srq_window : ss_cfg.rq_depth);
	t->srq_initial = (uint32_t)ss_cfg.srq_pool;
	t->srq_max = (uint32_t)(ss_cfg.srq_pool_max > ss_cfg.srq_pool ? ss_cfg.srq_pool_max
								      : ss_cfg.srq_pool);
	t->srq_hold = (uint32_t)ss_cfg.srq_hold;
	t->tx_pool_max = (uint32_t)ss_cfg.tx_pool_max;
	t->qp_pool = (uint32_t)ss_cfg.qp_pool;
	t->buf_size = (uint32_t)ss_cfg.buf_size;
	t->max_inline = (uint32_t)ss_cfg.max_inline;
	t->ctrl_reserve = 2;
}
