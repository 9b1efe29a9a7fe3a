#include "handshake/negotiate.h"

#include "handshake/gid.h"

#include <string.h>

enum ss_reason ss_negotiate(const struct ss_params *local, const struct ss_msg *peer,
			    struct ss_agreement *agr_p)
{
	const struct ss_params *p = &peer->params;
	struct ss_agreement agr;

	if (peer->version < 1)
		return SS_REASON_VERSION;
	agr.caps = local->caps & p->caps;
	if (!(agr.caps & SS_CAP_DATA_V1))
		return SS_REASON_VERSION;
	if (p->buf_size < SS_MIN_BUF_SIZE || p->buf_size > SS_MAX_BUF_SIZE || p->window == 0 ||
	    p->sq_depth == 0)
		return SS_REASON_PARAMS;
	agr.mtu = p->mtu < local->mtu ? p->mtu : local->mtu;
	agr.max_send = p->buf_size;
	agr.send_window = p->window;
	agr.peer_recv_mode = p->recv_mode;
	*agr_p = agr;
	return SS_REASON_NONE;
}

enum ss_reason ss_check_peer_gid(const uint8_t gid[16], const struct sockaddr *tcp_peer,
				 const uint8_t (*local_gids)[16], size_t n_local)
{
	uint8_t want[16];

	if (ss_addr_to_gid(tcp_peer, want) < 0)
		return SS_REASON_GID_MISMATCH;
	if (!ss_addr_is_loopback(tcp_peer))
		return memcmp(gid, want, 16) == 0 ? SS_REASON_NONE : SS_REASON_GID_MISMATCH;
	for (size_t i = 0; i < n_local; i++)
		if (memcmp(gid, local_gids[i], 16) == 0)
			return SS_REASON_NONE;
	return SS_REASON_GID_MISMATCH;
}
