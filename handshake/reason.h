/* Why a connection is not (or no longer) upgraded: SMC-R-style fallback codes. */
#ifndef SS_HANDSHAKE_REASON_H
#define SS_HANDSHAKE_REASON_H

/* Values are part of the wire (DECLINE) and of the status output: append only. */
enum ss_reason {
	SS_REASON_NONE = 0,         /* upgraded, or not decided yet */
	SS_REASON_NO_RDMA_CORE = 1, /* libibverbs could not be loaded */
	SS_REASON_NO_DEVICE = 2,    /* no RDMA device or GID for the local address */
	SS_REASON_PEER_PLAIN = 3,   /* the peer answered without a HELLO: not shimmed */
	SS_REASON_PEER_DECLINED = 4,
	SS_REASON_VERSION = 5,       /* no common protocol version or required extension */
	SS_REASON_PARAMS = 6,        /* incompatible transport parameters */
	SS_REASON_RESOURCE = 7,      /* a verbs resource could not be created */
	SS_REASON_TIMEOUT = 8,       /* the peer did not finish the handshake in time */
	SS_REASON_POLICY = 9,        /* configuration says TCP for this connection */
	SS_REASON_MALFORMED = 10,    /* the peer sent a bad handshake message */
	SS_REASON_GID_MISMATCH = 11, /* the peer's GID is not its TCP address */
	SS_REASON_LOOPBACK = 12,     /* loopback connection and no device configured */
	SS_REASON_DEVICE_DOWN = 13,  /* the device's port is down (or the device failed) */
	SS_REASON_DOWNGRADED = 14,   /* upgraded, then moved back to TCP (docs/protocol.md, 4) */
	SS_REASON_RDMA_LOST = 15,    /* upgraded, then moved to TCP when the RDMA path broke */
	SS_REASON_LATER = 16,        /* started on TCP (SRQSHIM_START=tcp): the server said LATER */
	SS_REASON__COUNT,
};

/* Returns a short, stable, lower-case name for r ("unknown" if out of range). */
const char *ss_reason_str(unsigned r);

#endif
