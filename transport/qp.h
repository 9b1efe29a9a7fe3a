/* RC queue pairs: creation and the INIT -> RTR -> RTS walk, errors as -errno. */
#ifndef SS_TRANSPORT_QP_H
#define SS_TRANSPORT_QP_H

#include <stdint.h>

struct ibv_pd;
struct ibv_cq;
struct ibv_srq;
struct ibv_qp;
struct ss_device;

struct ss_qp_caps {
	uint32_t sq_depth;   /* send work requests */
	uint32_t rq_depth;   /* receive work requests; ignored with an SRQ */
	uint32_t max_inline; /* bytes sent inline; 0 for none */
};

/* What the peer tells us of its QP (through the handshake). */
struct ss_qp_peer {
	uint32_t qpn;
	uint32_t psn; /* the peer's initial send PSN, 24 bits */
	uint8_t gid[16];
	int mtu; /* enum ibv_mtu */
};

/*
 * Creates an RC QP on pd, receiving from srq when it is non-NULL, else from
 * its own receive queue; context becomes its qp_context (async events). Returns 0 and sets *qp_p,
 * or -errno.
 */
int ss_qp_create_rc(struct ibv_pd *pd, struct ibv_cq *send_cq, struct ibv_cq *recv_cq,
		    struct ibv_srq *srq, const struct ss_qp_caps *caps, void *context,
		    struct ibv_qp **qp_p);

/* Moves a new qp to INIT on dev's port (receives may be posted from then on). Returns 0 or -errno.
 */
int ss_qp_init(struct ibv_qp *qp, const struct ss_device *dev);

/*
 * Moves qp from INIT through RTR to RTS towards peer, on dev's port and
 * GID, with local_psn as our initial send PSN. Returns 0 or -errno.
 */
int ss_qp_connect(struct ibv_qp *qp, const struct ss_device *dev, const struct ss_qp_peer *peer,
		  uint32_t local_psn);

/* Moves qp to the error state, flushing its work requests. Returns 0 or -errno. */
int ss_qp_to_error(struct ibv_qp *qp);

/* A random 24-bit PSN from the kernel's generator. Returns 0 or -errno. */
int ss_random_psn(uint32_t *psn_p);

#endif
