#include "handshake/reason.h"

static const char *const reason_names[SS_REASON__COUNT] = {
	[SS_REASON_NONE] = "none",
	[SS_REASON_NO_RDMA_CORE] = "no-rdma-core",
	[SS_REASON_NO_DEVICE] = "no-device",
	[SS_REASON_PEER_PLAIN] = "peer-plain",
	[SS_REASON_PEER_DECLINED] = "peer-declined",
	[SS_REASON_VERSION] = "version-mismatch",
	[SS_REASON_PARAMS] = "parameter-mismatch",
	[SS_REASON_RESOURCE] = "resource-failure",
	[SS_REASON_TIMEOUT] = "timeout",
	[SS_REASON_POLICY] = "policy",
	[SS_REASON_MALFORMED] = "malformed-handshake",
	[SS_REASON_GID_MISMATCH] = "gid-mismatch",
	[SS_REASON_LOOPBACK] = "loopback-without-device",
	[SS_REASON_DEVICE_DOWN] = "device-down",
	[SS_REASON_DOWNGRADED] = "downgraded",
	[SS_REASON_RDMA_LOST] = "rdma-lost",
	[SS_REASON_LATER] = "started-on-tcp",
};

const char *ss_reason_str(unsigned r)
{
	return r < SS_REASON__COUNT ? reason_names[r] : "unknown";
}
