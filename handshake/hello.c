/* HELLO codec: the wire layout of docs/protocol.md, checked on every field. */
#include "handshake/hello.h"

#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <endian.h>
#include <string.h>

/* Wire layout; every multi-byte field big endian. */
struct wire_hdr {
	uint8_t magic[SS_HELLO_MAGIC_LEN];
	uint8_t version;
	uint8_t type;
	uint16_t length; /* of the whole message, header included */
	uint32_t nonce;
};
static_assert(sizeof(struct wire_hdr) == SS_HELLO_HDR_LEN, "wire header is 16 bytes");

struct wire_params {
	uint32_t caps;
	uint8_t recv_mode;
	uint8_t mtu;
	uint16_t sq_depth;
	uint32_t qpn;
	uint32_t psn;
	uint8_t gid[16];
	uint32_t buf_size;
	uint32_t window;
	uint8_t reserved[8]; /* zero when sent, ignored when received */
};
static_assert(sizeof(struct wire_params) == 48, "wire params are 48 bytes");

struct wire_decline {
	uint16_t reason;
	uint16_t reserved;
};
static_assert(sizeof(struct wire_decline) == 4, "wire decline body is 4 bytes");

struct wire_return {
	uint32_t count; /* stream bytes after the message */
	uint32_t reserved;
};
static_assert(sizeof(struct wire_return) == 8, "wire return body is 8 bytes");

/* Extension records after the fixed body: type, length, value. */
struct wire_ext {
	uint16_t type;   /* bit 15 set: the receiver must understand it */
	uint16_t length; /* of the value */
};
static_assert(sizeof(struct wire_ext) == 4, "extension header is 4 bytes");
#define SS_EXT_CRITICAL 0x8000u
/* RETURN's count of the stream received over RDMA (u64); optional: older peers skip it. */
#define SS_EXT_RECEIVED 1u

static const char *const dec_names[SS_DEC__COUNT] = {
	[SS_DEC_OK] = "ok",
	[SS_DEC_SHORT] = "incomplete",
	[SS_DEC_FOREIGN] = "not a HELLO",
	[SS_DEC_MALFORMED] = "malformed",
	[SS_DEC_UNSUPPORTED] = "unsupported version or extension",
};

const char *ss_dec_result_str(enum ss_dec_result r)
{
	return (unsigned)r < SS_DEC__COUNT ? dec_names[r] : "unknown";
}

/* Fixed body length of each type, or -1 for a type this version does not know. */
static int body_len(uint8_t type)
{
	switch (type) {
	case SS_MSG_HELLO:
	case SS_MSG_ACCEPT: return (int)sizeof(struct wire_params);
	case SS_MSG_DECLINE: return (int)sizeof(struct wire_decline);
	case SS_MSG_RETURN: return (int)sizeof(struct wire_return);
	case SS_MSG_ACK:
	case SS_MSG_READY:
	case SS_MSG_SWITCH:
	case SS_MSG_LOST:
	case SS_MSG_LATER: return 0;
	default: return -1;
	}
}

static int params_valid(const struct ss_params *p)
{
	return (p->recv_mode == SS_RECV_SRQ || p->recv_mode == SS_RECV_RQ) && p->mtu >= 1 &&
	       p->mtu <= 5 && p->qpn != 0 && p->qpn <= 0xffffff && p->psn <= 0xffffff;
}

static void params_from_wire(struct ss_params *p, const struct wire_params *w)
{
	p->caps = ntohl(w->caps);
	p->recv_mode = w->recv_mode;
	p->mtu = w->mtu;
	p->sq_depth = ntohs(w->sq_depth);
	p->qpn = ntohl(w->qpn);
	p->psn = ntohl(w->psn);
	memcpy(p->gid, w->gid, 16);
	p->buf_size = ntohl(w->buf_size);
	p->window = ntohl(w->window);
}

enum ss_dec_result ss_msg_decode(const void *buf, size_t len, struct ss_msg *msg, size_t *used_p)
{
	const uint8_t *b = buf;
	struct wire_hdr h;
	struct ss_msg m;
	size_t total, off;
	int blen;

	if (memcmp(b, SS_HELLO_MAGIC, len < SS_HELLO_MAGIC_LEN ? len : SS_HELLO_MAGIC_LEN) != 0)
		return SS_DEC_FOREIGN;
	if (len < SS_HELLO_HDR_LEN) {
		*used_p = SS_HELLO_HDR_LEN;
		return SS_DEC_SHORT;
	}
	memcpy(&h, b, sizeof(h));
	total = ntohs(h.length);
	/* Version 0 never existed; later versions keep version 1's layout as a prefix. */
	if (h.version == 0)
		return SS_DEC_UNSUPPORTED;
	blen = body_len(h.type);
	if (blen < 0 || total < SS_HELLO_HDR_LEN + (size_t)blen || total > SS_HELLO_MAX_LEN)
		return SS_DEC_MALFORMED;
	if (len < total) {
		*used_p = total;
		return SS_DEC_SHORT;
	}

	memset(&m, 0, sizeof(m));
	m.version = h.version;
	m.type = h.type;
	m.nonce = ntohl(h.nonce);
	off = SS_HELLO_HDR_LEN;
	if (h.type == SS_MSG_HELLO || h.type == SS_MSG_ACCEPT) {
		struct wire_params w;

		memcpy(&w, b + off, sizeof(w));
		params_from_wire(&m.params, &w);
		if (!params_valid(&m.params))
			return SS_DEC_MALFORMED;
	} else if (h.type == SS_MSG_DECLINE) {
		struct wire_decline w;

		memcpy(&w, b + off, sizeof(w));
		m.reason = ntohs(w.reason);
	} else if (h.type == SS_MSG_RETURN) {
		struct wire_return w;

		memcpy(&w, b + off, sizeof(w));
		m.count = ntohl(w.count);
		if (m.count > SS_RETURN_MAX)
			return SS_DEC_MALFORMED;
	}
	off += (size_t)blen;

	/* Extensions: none is known yet; skip the optional, refuse the critical. */
	while (off < total) {
		struct wire_ext e;

		if (total - off < sizeof(e))
			return SS_DEC_MALFORMED;
		memcpy(&e, b + off, sizeof(e));
		off += sizeof(e);
		if (ntohs(e.length) > total - off)
			return SS_DEC_MALFORMED;
		if (ntohs(e.type) & SS_EXT_CRITICAL)
			return SS_DEC_UNSUPPORTED;
		if (h.type == SS_MSG_RETURN && ntohs(e.type) == SS_EXT_RECEIVED) {
			uint64_t v;

			if (ntohs(e.length) != sizeof(v))
				return SS_DEC_MALFORMED;
			memcpy(&v, b + off, sizeof(v));
			m.received = be64toh(v);
			m.has_received = true;
		}
		off += ntohs(e.length);
	}
	*msg = m;
	*used_p = total;
	return SS_DEC_OK;
}

int ss_msg_encode(const struct ss_msg *msg, void *buf, size_t len)
{
	int blen = body_len(msg->type);
	struct wire_hdr h;
	size_t total;

	if (blen < 0)
		return -EINVAL;
	total = SS_HELLO_HDR_LEN + (size_t)blen;
	if (msg->type == SS_MSG_RETURN && msg->has_received)
		total += sizeof(struct wire_ext) + sizeof(uint64_t);
	if (len < total)
		return -ENOSPC;

	memcpy(h.magic, SS_HELLO_MAGIC, SS_HELLO_MAGIC_LEN);
	h.version = SS_HELLO_VERSION;
	h.type = msg->type;
	h.length = htons((uint16_t)total);
	h.nonce = htonl(msg->nonce);
	memcpy(buf, &h, sizeof(h));

	if (msg->type == SS_MSG_HELLO || msg->type == SS_MSG_ACCEPT) {
		const struct ss_params *p = &msg->params;
		struct wire_params w = {
			.caps = htonl(p->caps),
			.recv_mode = p->recv_mode,
			.mtu = p->mtu,
			.sq_depth = htons(p->sq_depth),
			.qpn = htonl(p->qpn),
			.psn = htonl(p->psn),
			.buf_size = htonl(p->buf_size),
			.window = htonl(p->window),
		};

		if (!params_valid(p))
			return -EINVAL;
		memcpy(w.gid, p->gid, 16);
		memcpy((uint8_t *)buf + SS_HELLO_HDR_LEN, &w, sizeof(w));
	} else if (msg->type == SS_MSG_DECLINE) {
		struct wire_decline w = {.reason = htons(msg->reason)};

		memcpy((uint8_t *)buf + SS_HELLO_HDR_LEN, &w, sizeof(w));
	} else if (msg->type == SS_MSG_RETURN) {
		struct wire_return w = {.count = htonl(msg->count)};

		if (msg->count > SS_RETURN_MAX)
			return -EINVAL;
		memcpy((uint8_t *)buf + SS_HELLO_HDR_LEN, &w, sizeof(w));
		if (msg->has_received) {
			struct wire_ext e = {.type = htons(SS_EXT_RECEIVED),
					     .length = htons(sizeof(uint64_t))};
			uint64_t v = htobe64(msg->received);
			uint8_t *at = (uint8_t *)buf + SS_HELLO_HDR_LEN + sizeof(w);

			memcpy(at, &e, sizeof(e));
			memcpy(at + sizeof(e), &v, sizeof(v));
		}
	}
	return (int)total;
}
