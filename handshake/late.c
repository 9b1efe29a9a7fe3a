/* The move of a connection that started on TCP: docs/protocol.md, section 5. */
#include "handshake/late.h"

#include "handshake/reason.h"

static const char *const late_state_names[SS_LATE__COUNT] = {
	[SS_LATE_QUIET] = "tcp-quiet",
	[SS_LATE_MARKED] = "marked",
	[SS_LATE_C_PREPARE] = "client-prepare",
	[SS_LATE_C_WAIT_ANSWER] = "client-wait-answer",
	[SS_LATE_C_CHECK] = "client-check",
	[SS_LATE_S_WAIT_HELLO] = "server-wait-hello",
	[SS_LATE_S_DECIDE] = "server-decide",
	[SS_LATE_S_WAIT_READY] = "server-wait-ready",
	[SS_LATE_RDMA] = "rdma",
	[SS_LATE_TCP] = "tcp",
	[SS_LATE_BROKEN] = "broken",
};

const char *ss_late_state_str(enum ss_late_state s)
{
	return (unsigned)s < SS_LATE__COUNT ? late_state_names[s] : "unknown";
}

struct ss_late ss_late_init(bool client)
{
	return (struct ss_late){.state = SS_LATE_QUIET, .client = client};
}

bool ss_late_holds(const struct ss_late *l)
{
	return l->state != SS_LATE_QUIET && l->state < SS_LATE_RDMA;
}

bool ss_late_ripe(const struct ss_late_use *use, const struct ss_late_use *min)
{
	return use->age_ms >= min->age_ms && (use->bytes >= min->bytes || use->calls >= min->calls);
}

/* On TCP for good, held bytes released there. */
static unsigned late_to_tcp(struct ss_late *l, uint16_t reason)
{
	l->state = SS_LATE_TCP;
	l->reason = reason;
	return SS_LATE_A_TCP;
}

/* As late_to_tcp(), telling the peer first. */
static unsigned late_decline(struct ss_late *l, uint16_t reason)
{
	return SS_LATE_A_DECLINE | late_to_tcp(l, reason);
}

/* Both marks are on the stream: the exchange of section 2 in the connection's roles. */
static unsigned late_both_marks(struct ss_late *l)
{
	if (!l->client) {
		l->state = SS_LATE_S_WAIT_HELLO;
		return 0;
	}
	if (l->pin)
		return late_decline(l, SS_REASON_POLICY);
	l->state = SS_LATE_C_PREPARE;
	return SS_LATE_A_PREPARE;
}

/* Events that mean the same in every state before the exchange ends. */
static unsigned late_common(struct ss_late *l, enum ss_late_event ev)
{
	switch (ev) {
	case SS_LATE_EV_PIN: l->pin = true; return 0;
	case SS_LATE_EV_SHUT: l->shut = true; return 0;
	case SS_LATE_EV_PEER_EOF: return late_to_tcp(l, SS_REASON_NONE);
	case SS_LATE_EV_MOVE:
	case SS_LATE_EV_YES:
	case SS_LATE_EV_NO: return 0; /* one mark only; no answer is pending */
	default: l->state = SS_LATE_BROKEN; return SS_LATE_A_RESET;
	}
}

static unsigned late_quiet(struct ss_late *l, enum ss_late_event ev)
{
	switch (ev) {
	case SS_LATE_EV_PIN:
	case SS_LATE_EV_MOVE:
		/* A pin is told to the peer by the same marks, then a DECLINE. */
		l->pin = ev == SS_LATE_EV_PIN;
		l->state = SS_LATE_MARKED;
		return SS_LATE_A_HOLD | SS_LATE_A_MARK;
	case SS_LATE_EV_SHUT:
		/* No mark can follow our FIN; the peer, if marked, reads the FIN and stays too. */
		l->shut = true;
		return late_to_tcp(l, SS_REASON_NONE);
	case SS_LATE_EV_PEER_MARK: return SS_LATE_A_HOLD | SS_LATE_A_MARK | late_both_marks(l);
	default: return late_common(l, ev);
	}
}

static unsigned late_client(struct ss_late *l, enum ss_late_event ev, uint16_t reason)
{
	switch (l->state) {
	case SS_LATE_C_PREPARE:
		if (ev == SS_LATE_EV_YES) {
			l->state = SS_LATE_C_WAIT_ANSWER;
			return 0;
		}
		if (ev == SS_LATE_EV_NO)
			return late_decline(l, reason);
		break;
	case SS_LATE_C_WAIT_ANSWER:
		if (ev == SS_LATE_EV_ACCEPT && l->pin)
			return late_decline(l, SS_REASON_POLICY);
		if (ev == SS_LATE_EV_ACCEPT) {
			l->state = SS_LATE_C_CHECK;
			return SS_LATE_A_CHECK;
		}
		if (ev == SS_LATE_EV_DECLINE)
			return late_to_tcp(l, SS_REASON_PEER_DECLINED);
		break;
	default:
		if (ev == SS_LATE_EV_YES) {
			l->state = SS_LATE_RDMA;
			return SS_LATE_A_READY | SS_LATE_A_RDMA | (l->pin ? SS_LATE_A_DOWN : 0);
		}
		if (ev == SS_LATE_EV_NO)
			return late_decline(l, reason);
		break;
	}
	return late_common(l, ev);
}

static unsigned late_server(struct ss_late *l, enum ss_late_event ev, uint16_t reason)
{
	switch (l->state) {
	case SS_LATE_S_WAIT_HELLO:
		if (ev == SS_LATE_EV_HELLO && l->pin)
			return late_decline(l, SS_REASON_POLICY);
		if (ev == SS_LATE_EV_HELLO) {
			l->state = SS_LATE_S_DECIDE;
			return SS_LATE_A_DECIDE;
		}
		if (ev == SS_LATE_EV_DECLINE)
			return late_to_tcp(l, SS_REASON_PEER_DECLINED);
		break;
	case SS_LATE_S_DECIDE:
		if (ev == SS_LATE_EV_YES) {
			l->state = SS_LATE_S_WAIT_READY;
			return SS_LATE_A_ACCEPT;
		}
		if (ev == SS_LATE_EV_NO)
			return late_decline(l, reason);
		break;
	default:
		/* After ACCEPT the client may already send over the QP: a pin waits for READY. */
		if (ev == SS_LATE_EV_READY || ev == SS_LATE_EV_QP_MSG) {
			l->state = SS_LATE_RDMA;
			return SS_LATE_A_RDMA | (l->pin ? SS_LATE_A_DOWN : 0);
		}
		if (ev == SS_LATE_EV_DECLINE)
			return late_to_tcp(l, SS_REASON_PEER_DECLINED);
		break;
	}
	return late_common(l, ev);
}

unsigned ss_late_step(struct ss_late *l, enum ss_late_event ev, uint16_t reason)
{
	switch (l->state) {
	case SS_LATE_QUIET: return late_quiet(l, ev);
	case SS_LATE_MARKED:
		if (ev == SS_LATE_EV_PEER_MARK)
			return late_both_marks(l);
		return late_common(l, ev);
	case SS_LATE_C_PREPARE:
	case SS_LATE_C_WAIT_ANSWER:
	case SS_LATE_C_CHECK: return late_client(l, ev, reason);
	case SS_LATE_S_WAIT_HELLO:
	case SS_LATE_S_DECIDE:
	case SS_LATE_S_WAIT_READY: return late_server(l, ev, reason);
	default: return 0; /* RDMA, TCP, BROKEN: decided; the peer's later bytes are data */
	}
}
