/*
 * The transport as a loadable module: the one table of operations the shim
 * finds with dlsym (SS_TRANSPORT_OPS_SYMBOL).
 */
#include "transport/conn.h"
#include "transport/log.h"

void ss_transport_set_log_level(int level)
{
	ss_log_level = (enum ss_log_level)level;
}

__attribute__((visibility("default"))) const struct ss_transport_ops ss_transport_ops = {
	.version = SS_TRANSPORT_OPS_VERSION,
	.set_log_level = ss_transport_set_log_level,
	.worker_get = ss_worker_get,
	.worker_warm = ss_worker_warm,
	.worker_forget_after_fork = ss_worker_forget_after_fork,
	.conn_create = ss_conn_create,
	.conn_peer_gone = ss_conn_peer_gone,
	.conn_take_unsent = ss_conn_take_unsent,
	.conn_switch = ss_conn_switch,
	.conn_lose = ss_conn_lose,
	.conn_take_lost = ss_conn_take_lost,
	.conn_take_unread = ss_conn_take_unread,
	.conn_put_front = ss_conn_put_front,
	.worker_watch = ss_worker_watch,
	.worker_unwatch = ss_worker_unwatch,
	.worker_defer = ss_worker_defer,
	.worker_defer_lazy = ss_worker_defer_lazy,
	.worker_timer_arm = ss_worker_timer_arm,
	.worker_timer_cancel = ss_worker_timer_cancel,
	.worker_poll = ss_worker_poll,
	.worker_arm = ss_worker_arm,
	.worker_event_fds = ss_worker_event_fds,
	.worker_own_fds = ss_worker_own_fds,
	.worker_take_events = ss_worker_take_events,
	.worker_pollers = ss_worker_pollers,
	.worker_event_users = ss_worker_event_users,
	.worker_sleepers = ss_worker_sleepers,
	.conn_local_gids = ss_conn_local_gids,
	.conn_connect = ss_conn_connect,
	.conn_start = ss_conn_start,
	.conn_send = ss_conn_send,
	.conn_recv = ss_conn_recv,
	.conn_readable = ss_conn_readable,
	.conn_unacked = ss_conn_unacked,
	.conn_send_capacity = ss_conn_send_capacity,
	.conn_shutdown_wr = ss_conn_shutdown_wr,
	.conn_ready = ss_conn_ready,
	.conn_resync = ss_conn_resync,
	.conn_drain = ss_conn_drain,
	.conn_linger = ss_conn_linger,
	.conn_get_stats = ss_conn_get_stats,
	.conn_destroy = ss_conn_destroy,
	.worker_get_stats = ss_worker_get_stats,
	.conn_publish = ss_conn_publish,
	.worker_publish = ss_worker_publish,
};
