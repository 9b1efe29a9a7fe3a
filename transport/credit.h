/*
 * Flow control of one connection, pure (no verbs). A SEND needs a free
 * send-queue slot (given back by its send completion) and, for data, a
 * credit for a receive the peer posted (given back by the peer's grants).
 * The two are counted apart: grants can arrive before the send completions
 * of the messages they answer (completions of different queues are not
 * ordered), and a grant never makes a send-queue slot free.
 *
 * Control messages (pure grants, credit requests, end of stream) use
 * reserved capacity on both sides: the peer posts ctrl_reserve receives
 * beyond the data window and reposts them at once, and ctrl_reserve of our
 * send-queue slots are kept back from data, so a grant never waits behind
 * data. At most ctrl_reserve control messages are in flight (sent, not
 * completed); RNR retry covers the moment between the peer's receive
 * completion and its repost.
 */
#ifndef SS_TRANSPORT_CREDIT_H
#define SS_TRANSPORT_CREDIT_H

#include <stdbool.h>
#include <stdint.h>

/* Immediate data of every SEND, host order (sent big endian). */
#define SS_IMM_TYPE_SHIFT 30
#define SS_IMM_TYPE_MASK  (3u << SS_IMM_TYPE_SHIFT)
#define SS_IMM_HARD_REQ   (1u << 29)  /* answer with a grant now */
#define SS_IMM_SOFT_REQ   (1u << 28)  /* a grant is welcome with your next data */
#define SS_IMM_SWITCH     (1u << 27)  /* on end of stream only: the stream goes on over TCP */
#define SS_IMM_RSVD_MASK  0x07ff0000u /* zero when sent; set: protocol error */
#define SS_IMM_GRANT_MASK 0x0000ffffu /* data credits given back */

enum ss_msg_kind {
	SS_KIND_DATA = 0, /* stream bytes; costs a data credit */
	SS_KIND_CTRL = 1, /* pure grant and/or request; no payload */
	SS_KIND_EOS = 2,  /* end of stream; no payload; sent after all data */
};

struct ss_credit_cfg {
	uint32_t sq_depth;        /* our send queue */
	uint32_t ctrl_reserve;    /* control messages in flight, at most; SQ slots kept back */
	uint32_t rx_window;       /* data receives we posted for the peer (our HELLO window) */
	uint32_t tx_window;       /* data receives the peer posted for us (its HELLO window) */
	uint32_t grant_threshold; /* grant without being asked once this many are owed */
};

struct ss_credit {
	struct ss_credit_cfg cfg;
	/* sending side */
	uint32_t sq_free;       /* send-queue slots free */
	uint32_t tx_credits;    /* data SENDs we may post */
	uint32_t ctrl_inflight; /* control SENDs posted, not completed */
	bool hard_req_out;      /* we asked for a grant and have had none since */
	bool eos_sent;
	bool switching; /* our end of stream is a switch to TCP (set before it is posted) */
	/* receiving side */
	uint32_t rx_outstanding; /* data SENDs of the peer we hold or have not granted back */
	uint32_t to_return;      /* of those, freed and reposted: owed to the peer */
	bool peer_hard_req;      /* the peer asked for a grant at once */
	bool peer_soft_req;
	bool eos_received;
	bool switch_received; /* the peer's end of stream was a switch to TCP */
	uint32_t grant_limit; /* credits a grant may return now (SRQ mode: free receive capacity) */
	/* statistics */
	uint64_t grants_sent, grants_received, requests_sent, requests_received;
};

/* Fills c for a new connection. Returns 0, or -EINVAL for a config that cannot work. */
int ss_credit_init(struct ss_credit *c, const struct ss_credit_cfg *cfg);

/* True when a data SEND may be posted now. */
bool ss_credit_can_send_data(const struct ss_credit *c);

/* True when a control SEND may be posted now. */
bool ss_credit_can_send_ctrl(const struct ss_credit *c);

/*
 * True when a pure control message should go out now: owed credits that
 * reached the threshold (half of it after a soft request), a hard request
 * from the peer with anything owed, or our own need for a hard request (data waiting, no credit,
 * none asked). want_to_send says whether data is waiting.
 */
bool ss_credit_ctrl_due(const struct ss_credit *c, bool want_to_send);

/*
 * Accounts a SEND of kind about to be posted and returns its immediate data
 * (host order) with every owed credit attached. Call only when the matching
 * can_send is true. want_more: data still waits after this one.
 */
uint32_t ss_credit_on_post(struct ss_credit *c, enum ss_msg_kind kind, bool want_more);

/* A send completion of kind arrived: its slot is free again. */
void ss_credit_on_send_done(struct ss_credit *c, enum ss_msg_kind kind);

/*
 * A receive completion with immediate data imm (host order) arrived.
 * Returns its kind, or -EPROTO for a message the protocol forbids (bad
 * bits, a grant beyond the window, data after end of stream, data beyond
 * our window): the connection must fail.
 */
int ss_credit_on_recv(struct ss_credit *c, uint32_t imm);

/*
 * Credits returned from now on are capped at limit (SRQ mode: grants only
 * against free receive capacity; the rest stays owed). Starts unlimited.
 */
void ss_credit_set_grant_limit(struct ss_credit *c, uint32_t limit);

/* True when credits are owed but the grant limit holds them back. */
bool ss_credit_withheld(const struct ss_credit *c);

/* n data receives were consumed by the application and reposted. */
void ss_credit_on_consumed(struct ss_credit *c, uint32_t n);

#endif
