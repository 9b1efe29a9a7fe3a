/* Negotiation decisions: pure functions over HELLO parameters. */
#ifndef SS_HANDSHAKE_NEGOTIATE_H
#define SS_HANDSHAKE_NEGOTIATE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "handshake/hello.h"
#include "handshake/reason.h"

/* Limits a peer's parameters must meet; below them the data path cannot work. */
#define SS_MIN_BUF_SIZE 256u
#define SS_MAX_BUF_SIZE (1u << 20)

/* What both sides agreed on, from one side's point of view. */
struct ss_agreement {
	uint32_t caps;          /* common capabilities */
	uint8_t mtu;            /* path MTU: the smaller of both (enum ibv_mtu) */
	uint32_t max_send;      /* largest SEND we may post: the peer's buffer size */
	uint32_t send_window;   /* SENDs we may post before the first grant */
	uint8_t peer_recv_mode; /* enum ss_recv_mode, for the status */
};

/*
 * Checks the peer's parameters against ours and computes the agreement.
 * Returns SS_REASON_NONE and fills *agr_p, or the reason to stay on TCP.
 */
enum ss_reason ss_negotiate(const struct ss_params *local, const struct ss_msg *peer,
			    struct ss_agreement *agr_p);

/*
 * Checks that the GID a peer announced may be used: it must equal the TCP
 * peer address in GID form, or, on a loopback connection, be one of this
 * host's own GIDs (local_gids, n_local entries of 16 bytes). Returns
 * SS_REASON_NONE or SS_REASON_GID_MISMATCH.
 */
enum ss_reason ss_check_peer_gid(const uint8_t gid[16], const struct sockaddr *tcp_peer,
				 const uint8_t (*local_gids)[16], size_t n_local);

#endif
