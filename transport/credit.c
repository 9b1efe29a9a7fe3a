#include "transport/credit.h"

#include <errno.h>
#include <string.h>

int ss_credit_init(struct ss_credit *c, const struct ss_credit_cfg *cfg)
{
	if (cfg->ctrl_reserve == 0 || cfg->sq_depth <= cfg->ctrl_reserve || cfg->rx_window == 0 ||
	    cfg->tx_window == 0 || cfg->rx_window > SS_IMM_GRANT_MASK ||
	    cfg->grant_threshold == 0 || cfg->grant_threshold > cfg->rx_window)
		return -EINVAL;
	memset(c, 0, sizeof(*c));
	c->cfg = *cfg;
	c->sq_free = cfg->sq_depth;
	c->tx_credits = cfg->tx_window;
	c->grant_limit = UINT32_MAX;
	return 0;
}

bool ss_credit_can_send_data(const struct ss_credit *c)
{
	return !c->eos_sent && c->tx_credits > 0 && c->sq_free > c->cfg.ctrl_reserve;
}

bool ss_credit_can_send_ctrl(const struct ss_credit *c)
{
	return c->sq_free > 0 && c->ctrl_inflight < c->cfg.ctrl_reserve;
}

static uint32_t grantable(const struct ss_credit *c)
{
	return c->to_return < c->grant_limit ? c->to_return : c->grant_limit;
}

bool ss_credit_ctrl_due(const struct ss_credit *c, bool want_to_send)
{
	uint32_t g = grantable(c);

	/* A capped grant goes out once it is all that can be had (the threshold may never be
	 * reached). */
	if (g >= c->cfg.grant_threshold || (g > 0 && g == c->grant_limit))
		return true;
	if (c->peer_hard_req && g > 0)
		return true;
	if (c->peer_soft_req && g * 2 >= c->cfg.grant_threshold && g > 0)
		return true;
	/* Our data is stuck for lack of credits: ask once, loudly. */
	return want_to_send && !c->eos_sent && c->tx_credits == 0 && !c->hard_req_out;
}

uint32_t ss_credit_on_post(struct ss_credit *c, enum ss_msg_kind kind, bool want_more)
{
	uint32_t imm = (uint32_t)kind << SS_IMM_TYPE_SHIFT;

	c->sq_free--;
	if (kind == SS_KIND_DATA)
		c->tx_credits--;
	else
		c->ctrl_inflight++;
	if (kind == SS_KIND_EOS) {
		c->eos_sent = true;
		if (c->switching)
			imm |= SS_IMM_SWITCH;
	}

	uint32_t g = grantable(c);
	if (g > 0) {
		imm |= g;
		c->rx_outstanding -= g;
		c->to_return -= g;
		c->grant_limit -= c->grant_limit == UINT32_MAX ? 0 : g;
		c->peer_hard_req = false;
		c->peer_soft_req = false;
		c->grants_sent++;
	}
	/* Ask for credits: loudly when we are out, softly when running low. */
	if (want_more && !c->eos_sent && c->tx_credits == 0 && !c->hard_req_out) {
		imm |= SS_IMM_HARD_REQ;
		c->hard_req_out = true;
		c->requests_sent++;
	} else if (want_more && kind == SS_KIND_DATA && c->tx_credits <= c->cfg.tx_window / 4) {
		imm |= SS_IMM_SOFT_REQ;
	}
	return imm;
}

void ss_credit_on_send_done(struct ss_credit *c, enum ss_msg_kind kind)
{
	c->sq_free++;
	if (kind != SS_KIND_DATA)
		c->ctrl_inflight--;
}

int ss_credit_on_recv(struct ss_credit *c, uint32_t imm)
{
	uint32_t kind = (imm & SS_IMM_TYPE_MASK) >> SS_IMM_TYPE_SHIFT;
	uint32_t grant = imm & SS_IMM_GRANT_MASK;

	if (kind > SS_KIND_EOS || (imm & SS_IMM_RSVD_MASK) ||
	    ((imm & SS_IMM_SWITCH) && kind != SS_KIND_EOS))
		return -EPROTO;
	/* We can never hold more credits than the peer's window. */
	if (grant > c->cfg.tx_window - c->tx_credits)
		return -EPROTO;
	if (c->eos_received)
		/* After end of stream only pure control messages may follow. */
		if (kind != SS_KIND_CTRL)
			return -EPROTO;
	if (kind == SS_KIND_DATA) {
		if (c->rx_outstanding >= c->cfg.rx_window)
			return -EPROTO;
		c->rx_outstanding++;
	}
	if (kind == SS_KIND_EOS) {
		c->eos_received = true;
		c->switch_received = (imm & SS_IMM_SWITCH) != 0;
	}
	if (grant) {
		c->tx_credits += grant;
		c->hard_req_out = false;
		c->grants_received++;
	}
	if (imm & SS_IMM_HARD_REQ) {
		c->peer_hard_req = true;
		c->requests_received++;
	}
	if (imm & SS_IMM_SOFT_REQ)
		c->peer_soft_req = true;
	return (int)kind;
}

void ss_credit_set_grant_limit(struct ss_credit *c, uint32_t limit)
{
	c->grant_limit = limit;
}

bool ss_credit_withheld(const struct ss_credit *c)
{
	return c->to_return > c->grant_limit;
}

void ss_credit_on_consumed(struct ss_credit *c, uint32_t n)
{
	c->to_return += n;
}
