/*
 * The HELLO family of messages exchanged on the TCP stream before an upgrade
 * (docs/protocol.md): codec only, no I/O. All multi-byte wire fields are big
 * endian (network order); structs in this header are in host order.
 */
#ifndef SS_HANDSHAKE_HELLO_H
#define SS_HANDSHAKE_HELLO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SS_HELLO_MAGIC     "\0SRQSHM\xa5"
#define SS_HELLO_MAGIC_LEN 8
#define SS_HELLO_HDR_LEN   16
#define SS_HELLO_MAX_LEN   512 /* no message of any version is longer */
#define SS_HELLO_VERSION   1   /* the highest version this build speaks */

enum ss_msg_type {
	SS_MSG_HELLO = 1,   /* client -> server: "upgrade?", with the client's QP */
	SS_MSG_ACK = 2,     /* server -> client: "seen, decision follows"; idempotent */
	SS_MSG_ACCEPT = 3,  /* server -> client: yes, with the server's QP, ready to receive */
	SS_MSG_DECLINE = 4, /* either way: no; both stay on TCP */
	SS_MSG_READY = 5,   /* client -> server: the client's QP is ready to receive */
	/* Live downgrade (docs/protocol.md, section 4), either way, after READY: */
	SS_MSG_SWITCH = 6, /* "my stream moves back to TCP; my RDMA stream ends with a switch" */
	SS_MSG_RETURN = 7, /* your bytes I received and never read; `count` stream bytes follow */
	/* The move when RDMA does not work (section 4), either way, after READY: */
	SS_MSG_LOST = 8, /* "my RDMA path is gone: my stream goes on over TCP from what you got" */
	/* Connections that start on TCP (section 5): */
	SS_MSG_LATER = 9, /* server -> client, to a HELLO with SS_CAP_LATE: "on TCP for now" */
};

/* The most stream bytes a RETURN may announce (more is malformed). */
#define SS_RETURN_MAX (64u << 20)

enum ss_recv_mode {
	SS_RECV_SRQ = 1,
	SS_RECV_RQ = 2,
};

/* Capability bits; unknown bits are ignored by receivers. */
enum {
	SS_CAP_DATA_V1 = 1u << 0, /* the data protocol of docs/protocol.md, version 1 */
	SS_CAP_SWITCH = 1u << 1,  /* the live downgrade of docs/protocol.md, section 4 */
	SS_CAP_LOST = 1u << 2,    /* its move when RDMA does not work (RETURN says `received`) */
	SS_CAP_LATE = 1u << 3,    /* may start on TCP and move at the urgent mark (section 5) */
};

/* A side's transport parameters, as carried in HELLO and ACCEPT. */
struct ss_params {
	uint32_t caps;
	uint8_t recv_mode; /* enum ss_recv_mode */
	uint8_t mtu;       /* enum ibv_mtu: 1 (256) .. 5 (4096) */
	uint16_t sq_depth;
	uint32_t qpn; /* 24 bits */
	uint32_t psn; /* 24 bits: the sender's initial send PSN */
	uint8_t gid[16];
	uint32_t buf_size; /* largest SEND the sender can receive */
	uint32_t window;   /* SENDs the peer may post before the first grant */
};

struct ss_msg {
	uint8_t version;         /* as sent: the sender's highest version */
	uint8_t type;            /* enum ss_msg_type */
	uint32_t nonce;          /* chosen by the client, echoed in every message of the exchange */
	struct ss_params params; /* HELLO and ACCEPT */
	uint16_t reason;         /* DECLINE: enum ss_reason */
	uint32_t count;          /* RETURN: the stream bytes that follow the message */
	bool has_received;       /* RETURN: `received` was sent (an optional extension) */
	uint64_t received;       /* RETURN: bytes of the peer's stream that came over RDMA in all */
};

enum ss_dec_result {
	SS_DEC_OK,          /* a whole message; *used_p bytes belong to it */
	SS_DEC_SHORT,       /* a valid prefix; *used_p is how many bytes to wait for */
	SS_DEC_FOREIGN,     /* not ours: the bytes differ from the magic */
	SS_DEC_MALFORMED,   /* our magic, but a bad length, type or field */
	SS_DEC_UNSUPPORTED, /* our magic, but a version or required extension we lack */
	SS_DEC__COUNT,
};

/* Returns a short, stable name for r. */
const char *ss_dec_result_str(enum ss_dec_result r);

/*
 * Decodes the message at the start of buf. On SS_DEC_OK fills *msg and sets
 * *used_p to the message's length; on SS_DEC_SHORT sets *used_p to the total
 * length needed so far. Never reads past buf + len. Pure.
 */
enum ss_dec_result ss_msg_decode(const void *buf, size_t len, struct ss_msg *msg, size_t *used_p);

/*
 * Encodes msg (its version field is ignored: SS_HELLO_VERSION is sent) into
 * buf. Returns the length written, or -EINVAL for a field that cannot be
 * sent, or -ENOSPC when len is too small.
 */
int ss_msg_encode(const struct ss_msg *msg, void *buf, size_t len);

#endif
