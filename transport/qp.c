#include "transport/qp.h"

#include <errno.h>
#include <string.h>
#include <sys/random.h>

#include <infiniband/verbs.h>

#include "transport/device.h"
#include "transport/log.h"

/*
 * RC timing chosen for rxe under software emulation, where a round trip can
 * take milliseconds: local ACK timeout 4.096 us * 2^16 = 268 ms, 7 retries,
 * RNR retry 7 (retry without limit: RNR naks absorb momentary receive
 * exhaustion), RNR timer 20 (10.24 ms). A short RNR timer (12, 0.64 ms)
 * let 64 QPs bursting into a small SRQ lock both CPUs of the test guest
 * in rxe's requester tasklet (Linux 6.1 soft lockup); with grants issued
 * only against free receive capacity, RNR happens in bursts of new
 * connections only, so a longer wait costs little.
 */
enum {
	SS_QP_TIMEOUT = 16,
	SS_QP_RETRY_CNT = 7,
	SS_QP_RNR_RETRY = 7,
	SS_QP_MIN_RNR_TIMER = 20,
};

int ss_qp_create_rc(struct ibv_pd *pd, struct ibv_cq *send_cq, struct ibv_cq *recv_cq,
		    struct ibv_srq *srq, const struct ss_qp_caps *caps, void *context,
		    struct ibv_qp **qp_p)
{
	struct ibv_qp_init_attr attr = {
		.qp_context = context,
		.send_cq = send_cq,
		.recv_cq = recv_cq,
		.srq = srq,
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 0,
		.cap =
			{
				.max_send_wr = caps->sq_depth,
				.max_recv_wr = srq ? 0 : caps->rq_depth,
				.max_send_sge = 1,
				.max_recv_sge = srq ? 0 : 1,
				.max_inline_data = caps->max_inline,
			},
	};
	struct ibv_qp *qp;

	qp = ibv_create_qp(pd, &attr);
	if (!qp) {
		int err = errno ? errno : ENOMEM;
		ss_log_error("ibv_create_qp(sq %u, rq %u, inline %u): %s", caps->sq_depth,
			     srq ? 0 : caps->rq_depth, caps->max_inline, strerror(err));
		return -err;
	}
	*qp_p = qp;
	return 0;
}

static int modify(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask, const char *what)
{
	int ret = ibv_modify_qp(qp, attr, mask); /* positive errno on failure */

	if (ret) {
		ss_log_error("QP %u to %s: %s", qp->qp_num, what, strerror(ret));
		return -ret;
	}
	return 0;
}

int ss_qp_init(struct ibv_qp *qp, const struct ss_device *dev)
{
	struct ibv_qp_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IBV_QPS_INIT;
	attr.port_num = dev->port;
	attr.pkey_index = 0;
	attr.qp_access_flags = 0; /* SEND only: no remote access to our memory */
	return modify(qp, &attr,
		      IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, "INIT");
}

int ss_qp_connect(struct ibv_qp *qp, const struct ss_device *dev, const struct ss_qp_peer *peer,
		  uint32_t local_psn)
{
	struct ibv_qp_attr attr;
	int ret;

	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IBV_QPS_RTR;
	attr.path_mtu = peer->mtu < dev->active_mtu ? peer->mtu : dev->active_mtu;
	attr.dest_qp_num = peer->qpn;
	attr.rq_psn = peer->psn & 0xffffff;
	attr.max_dest_rd_atomic = 0;
	attr.min_rnr_timer = SS_QP_MIN_RNR_TIMER;
	attr.ah_attr.is_global = 1;
	attr.ah_attr.port_num = dev->port;
	memcpy(attr.ah_attr.grh.dgid.raw, peer->gid, 16);
	attr.ah_attr.grh.sgid_index = dev->gid_index;
	attr.ah_attr.grh.hop_limit = 64;
	ret = modify(qp, &attr,
		     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			     IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
		     "RTR");
	if (ret)
		return ret;

	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IBV_QPS_RTS;
	attr.timeout = SS_QP_TIMEOUT;
	attr.retry_cnt = SS_QP_RETRY_CNT;
	attr.rnr_retry = SS_QP_RNR_RETRY;
	attr.sq_psn = local_psn & 0xffffff;
	attr.max_rd_atomic = 0;
	return modify(qp, &attr,
		      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			      IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC,
		      "RTS");
}

int ss_qp_to_error(struct ibv_qp *qp)
{
	struct ibv_qp_attr attr = {.qp_state = IBV_QPS_ERR};

	return modify(qp, &attr, IBV_QP_STATE, "ERR");
}

int ss_random_psn(uint32_t *psn_p)
{
	uint32_t v;

	if (getrandom(&v, sizeof(v), 0) != sizeof(v))
		return -errno;
	*psn_p = v & 0xffffff;
	return 0;
}
