/*
 * Flow-control accounting: scripted sequences by table, then a simulation of
 * two peers that delivers completions in random orders (send and receive
 * completions unordered, as on real CQs) and checks that nothing is ever
 * posted without a slot and a credit, that no receiver is overrun, and that
 * every byte arrives.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "transport/credit.h"

enum op {
	END,
	POST_DATA,
	POST_CTRL,
	POST_EOS,
	POST_SWITCH, /* end of stream that moves the stream to TCP */
	DONE_DATA,
	DONE_CTRL,
	RECV,     /* arg: immediate data */
	CONSUMED, /* arg: count */
	LIMIT,    /* arg: grant limit (free receive capacity, SRQ mode) */
};

#define ANY -1

struct step {
	enum op op;
	uint32_t arg; /* RECV: immediate data; CONSUMED: count; posts: data still waiting */
	long want;    /* imm for posts, result for RECV; ANY: not checked */
	int can_data; /* after the step; ANY: not checked */
	int can_ctrl;
	int due; /* ss_credit_ctrl_due(c, true) */
};

struct script {
	const char *what;
	struct ss_credit_cfg cfg;
	struct step steps[16];
};

#define IMM(kind, grant) (((uint32_t)(kind) << SS_IMM_TYPE_SHIFT) | (grant))
#define D                SS_KIND_DATA
#define C                SS_KIND_CTRL
#define E                SS_KIND_EOS

/* clang-format off */
static const struct script scripts[] = {
	{"grant arrives before the send completions it covers",
	 {.sq_depth = 4, .ctrl_reserve = 1, .rx_window = 2, .tx_window = 2, .grant_threshold = 1},
	 {
		 {POST_DATA, 1, IMM(D, 0), 1, 1, 0},
		 {POST_DATA, 1, IMM(D, 0) | SS_IMM_HARD_REQ, 0, 1, 0}, /* out of credits: asks */
		 {RECV, IMM(C, 2), C, 1, 1, 0}, /* credits back, completions still out */
		 {POST_DATA, 0, IMM(D, 0), 0, 1, 0}, /* 1 credit left but the last slot is reserved */
		 {DONE_DATA, 0, ANY, 1, 1, 0},
		 {DONE_DATA, 0, ANY, 1, 1, 0},
		 {DONE_DATA, 0, ANY, 1, 1, 0},
		 {END},
	 }},
	{"send completions before the grant: slots free, still no credit",
	 {.sq_depth = 8, .ctrl_reserve = 2, .rx_window = 4, .tx_window = 2, .grant_threshold = 2},
	 {
		 {POST_DATA, 1, IMM(D, 0), 1, 1, 0},
		 {POST_DATA, 1, IMM(D, 0) | SS_IMM_HARD_REQ, 0, 1, 0},
		 {DONE_DATA, 0, ANY, 0, 1, 0},
		 {DONE_DATA, 0, ANY, 0, 1, 0}, /* all slots free, zero credits: no data */
		 {RECV, IMM(D, 1), D, 1, 1, 0},
		 {END},
	 }},
	{"hard request with a zero window: grant once something is consumed",
	 {.sq_depth = 4, .ctrl_reserve = 1, .rx_window = 2, .tx_window = 2, .grant_threshold = 2},
	 {
		 {RECV, IMM(D, 0), D, 1, 1, 0},
		 {RECV, IMM(D, 0) | SS_IMM_HARD_REQ, D, 1, 1, 0}, /* nothing consumed: not due */
		 {CONSUMED, 1, ANY, 1, 1, 1},                      /* one reposted: due at once */
		 {POST_CTRL, 0, IMM(C, 1), 1, 0, 0},
		 {CONSUMED, 1, ANY, 1, 0, 0}, /* one owed, below threshold, no request */
		 {DONE_CTRL, 0, ANY, 1, 1, 0},
		 {END},
	 }},
	{"pure grant when data slots are exhausted",
	 {.sq_depth = 3, .ctrl_reserve = 1, .rx_window = 2, .tx_window = 8, .grant_threshold = 2},
	 {
		 {POST_DATA, 0, IMM(D, 0), 1, 1, 0},
		 {POST_DATA, 0, IMM(D, 0), 0, 1, 0}, /* one slot left: reserved for control */
		 {RECV, IMM(D, 0), D, 0, 1, 0},
		 {RECV, IMM(D, 0), D, 0, 1, 0},
		 {CONSUMED, 2, ANY, 0, 1, 1},
		 {POST_CTRL, 0, IMM(C, 2), 0, 0, 0}, /* the grant took the reserved slot */
		 {DONE_DATA, 0, ANY, 0, 0, 0}, /* a slot, but it is the reserved one */
		 {DONE_CTRL, 0, ANY, 1, 1, 0},
		 {END},
	 }},
	{"out of credits: a pure hard request is due, once",
	 {.sq_depth = 4, .ctrl_reserve = 1, .rx_window = 4, .tx_window = 1, .grant_threshold = 4},
	 {
		 {POST_DATA, 0, IMM(D, 0), 0, 1, 1}, /* nothing more waited then; now it would */
		 {POST_CTRL, 1, IMM(C, 0) | SS_IMM_HARD_REQ, 0, 0, 0},
		 {DONE_CTRL, 0, ANY, 0, 1, 0}, /* asked already: not again before a grant */
		 {DONE_DATA, 0, ANY, 0, 1, 0},
		 {RECV, IMM(C, 1), C, 1, 1, 0},
		 {END},
	 }},
	{"end of stream: no data after it, control still flows",
	 {.sq_depth = 4, .ctrl_reserve = 2, .rx_window = 2, .tx_window = 2, .grant_threshold = 1},
	 {
		 {POST_EOS, 0, IMM(E, 0), 0, 1, 0},
		 {RECV, IMM(D, 0), D, 0, 1, 0},
		 {CONSUMED, 1, ANY, 0, 1, 1},
		 {POST_CTRL, 0, IMM(C, 1), 0, 0, 0},
		 {RECV, IMM(E, 0), E, 0, 0, 0},
		 {RECV, IMM(D, 0), -EPROTO, ANY, ANY, ANY}, /* data after the peer's EOS */
		 {END},
	 }},
	{"switch: an end of stream that says so; data after it is an error",
	 {.sq_depth = 4, .ctrl_reserve = 2, .rx_window = 2, .tx_window = 2, .grant_threshold = 1},
	 {
		 {POST_SWITCH, 0, IMM(E, 0) | SS_IMM_SWITCH, 0, 1, 0},
		 {RECV, IMM(D, 0), D, 0, 1, 0},
		 {RECV, IMM(E, 0) | SS_IMM_SWITCH, E, 0, 1, 0},
		 {RECV, IMM(D, 0), -EPROTO, ANY, ANY, ANY},
		 {END},
	 }},
	{"malformed control messages",
	 {.sq_depth = 4, .ctrl_reserve = 1, .rx_window = 2, .tx_window = 2, .grant_threshold = 1},
	 {
		 {RECV, IMM(3, 0), -EPROTO, 1, 1, 0},          /* unknown kind */
		 {RECV, IMM(C, 0) | 0x00100000, -EPROTO, 1, 1, 0}, /* reserved bit */
		 {RECV, IMM(C, 0) | SS_IMM_SWITCH, -EPROTO, 1, 1, 0}, /* switch on control */
		 {RECV, IMM(D, 0) | SS_IMM_SWITCH, -EPROTO, 1, 1, 0}, /* switch on data */
		 {RECV, IMM(C, 1), -EPROTO, 1, 1, 0}, /* grant beyond the window: nothing was sent */
		 {RECV, IMM(C, 0xffff), -EPROTO, 1, 1, 0},
		 {RECV, IMM(D, 0), D, 1, 1, 0},
		 {RECV, IMM(D, 0), D, 1, 1, 0},
		 {RECV, IMM(D, 0), -EPROTO, 1, 1, 0}, /* beyond our window */
		 {END},
	 }},
	{"running low asks softly",
	 {.sq_depth = 8, .ctrl_reserve = 1, .rx_window = 8, .tx_window = 4, .grant_threshold = 4},
	 {
		 {POST_DATA, 1, IMM(D, 0), 1, 1, 0},
		 {POST_DATA, 1, IMM(D, 0), 1, 1, 0},
		 {POST_DATA, 1, IMM(D, 0) | SS_IMM_SOFT_REQ, 1, 1, 0},
		 {END},
	 }},
	{"soft request lowers the threshold to half",
	 {.sq_depth = 4, .ctrl_reserve = 1, .rx_window = 8, .tx_window = 8, .grant_threshold = 4},
	 {
		 {RECV, IMM(D, 0), D, 1, 1, 0},
		 {RECV, IMM(D, 0) | SS_IMM_SOFT_REQ, D, 1, 1, 0},
		 {CONSUMED, 1, ANY, 1, 1, 0},
		 {CONSUMED, 1, ANY, 1, 1, 1},
		 {POST_DATA, 0, IMM(D, 2), 1, 1, 0}, /* piggybacked: nothing due after */
		 {END},
	 }},
	{"SRQ: grants only against free capacity; owed credits wait, a capped grant goes out",
	 {.sq_depth = 4, .ctrl_reserve = 1, .rx_window = 4, .tx_window = 4, .grant_threshold = 2},
	 {
		 {LIMIT, 0, 0, 1, 1, 0},
		 {RECV, IMM(D, 0), D, 1, 1, 0},
		 {RECV, IMM(D, 0) | SS_IMM_HARD_REQ, D, 1, 1, 0},
		 {CONSUMED, 2, ANY, 1, 1, 0}, /* owed 2, asked loudly, but no capacity: nothing due */
		 {LIMIT, 0, 1, 1, 1, 0},      /* withheld */
		 {LIMIT, 1, 1, 1, 1, 1},      /* room for one: the capped grant is due */
		 {POST_DATA, 0, IMM(D, 1), 1, 1, 0}, /* it rides on data; the limit is used up */
		 {LIMIT, 0xffffffffu, 0, 1, 1, 0},   /* one owed, below the threshold, nobody asks */
		 {CONSUMED, 1, ANY, 1, 1, 1},
		 {POST_CTRL, 0, IMM(C, 2), 1, 0, 0},
		 {END},
	 }},
	{"SRQ: a grant never exceeds the limit, even when the threshold is reached",
	 {.sq_depth = 4, .ctrl_reserve = 1, .rx_window = 8, .tx_window = 8, .grant_threshold = 2},
	 {
		 {RECV, IMM(D, 0), D, 1, 1, 0},
		 {RECV, IMM(D, 0), D, 1, 1, 0},
		 {RECV, IMM(D, 0), D, 1, 1, 0},
		 {CONSUMED, 3, ANY, 1, 1, 1},
		 {LIMIT, 2, 1, 1, 1, 1},
		 {POST_CTRL, 0, IMM(C, 2), 1, 0, 0},
		 {LIMIT, 0, 1, 1, 0, 0},
		 {END},
	 }},
};
/* clang-format on */

static void run_step(struct ss_credit *c, const struct step *s, size_t idx, const char *what)
{
	long got = ANY;

	switch (s->op) {
	case POST_DATA:
		assert_true(ss_credit_can_send_data(c));
		got = ss_credit_on_post(c, SS_KIND_DATA, s->arg);
		break;
	case POST_CTRL:
		assert_true(ss_credit_can_send_ctrl(c));
		got = ss_credit_on_post(c, SS_KIND_CTRL, s->arg);
		break;
	case POST_EOS:
		assert_true(ss_credit_can_send_ctrl(c));
		got = ss_credit_on_post(c, SS_KIND_EOS, false);
		break;
	case POST_SWITCH:
		assert_true(ss_credit_can_send_ctrl(c));
		c->switching = true;
		got = ss_credit_on_post(c, SS_KIND_EOS, false);
		break;
	case DONE_DATA: ss_credit_on_send_done(c, SS_KIND_DATA); break;
	case DONE_CTRL: ss_credit_on_send_done(c, SS_KIND_CTRL); break;
	case RECV:
		got = ss_credit_on_recv(c, s->arg);
		if (got == SS_KIND_EOS)
			assert_int_equal(c->switch_received, (s->arg & SS_IMM_SWITCH) != 0);
		break;
	case CONSUMED: ss_credit_on_consumed(c, s->arg); break;
	case LIMIT:
		ss_credit_set_grant_limit(c, s->arg);
		got = ss_credit_withheld(c);
		break;
	case END: break;
	}
	print_message("%s: step %zu -> %ld (data %d ctrl %d due %d)\n", what, idx, got,
		      ss_credit_can_send_data(c), ss_credit_can_send_ctrl(c),
		      ss_credit_ctrl_due(c, true));
	if (s->want != ANY)
		assert_int_equal(got, s->want);
	if (s->can_data != ANY)
		assert_int_equal(ss_credit_can_send_data(c), s->can_data);
	if (s->can_ctrl != ANY)
		assert_int_equal(ss_credit_can_send_ctrl(c), s->can_ctrl);
	if (s->due != ANY)
		assert_int_equal(ss_credit_ctrl_due(c, true), s->due);
}

static void test_scripts(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(scripts) / sizeof(scripts[0]); i++) {
		struct ss_credit c;

		assert_int_equal(ss_credit_init(&c, &scripts[i].cfg), 0);
		for (size_t k = 0; scripts[i].steps[k].op != END; k++)
			run_step(&c, &scripts[i].steps[k], k, scripts[i].what);
	}
}

static void test_init_rejects_unworkable(void **state)
{
	/* clang-format off */
	static const struct ss_credit_cfg bad[] = {
		{.sq_depth = 4, .ctrl_reserve = 0, .rx_window = 2, .tx_window = 2, .grant_threshold = 1},
		{.sq_depth = 1, .ctrl_reserve = 1, .rx_window = 2, .tx_window = 2, .grant_threshold = 1},
		{.sq_depth = 4, .ctrl_reserve = 1, .rx_window = 0, .tx_window = 2, .grant_threshold = 1},
		{.sq_depth = 4, .ctrl_reserve = 1, .rx_window = 2, .tx_window = 0, .grant_threshold = 1},
		{.sq_depth = 4, .ctrl_reserve = 1, .rx_window = 2, .tx_window = 2, .grant_threshold = 3},
		{.sq_depth = 4, .ctrl_reserve = 1, .rx_window = 70000, .tx_window = 2,
		 .grant_threshold = 1},
	};
	/* clang-format on */
	struct ss_credit c;

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		assert_int_equal(ss_credit_init(&c, &bad[i]), -EINVAL);
}

/* ---- Simulation of two peers with unordered completion delivery ---- */

/*
 * The peers decide what to post with the rules under test (can_send,
 * ctrl_due); every decision is then checked against an independent model
 * that knows only what happened on the wire: send-queue slots used and
 * completed, data messages sent and credits granted back (as decoded from
 * the immediate data), receives posted and consumed at the receiver. The
 * model's rules: no post without a free send-queue slot (data leaving the
 * control reserve free), no data without a credit, no more control messages
 * in flight than the reserve, and no receiver overrun: a data message never
 * finds its receiver without a posted receive unless control receives are
 * waiting to be reposted (the moment RNR retry covers), and never brings the
 * receiver's ungranted data beyond its window.
 */

#define QMAX 4096

struct msg {
	uint32_t imm;
	uint32_t len;
};

struct queue {
	struct msg m[QMAX];
	size_t head, tail;
};

static void q_push(struct queue *q, struct msg m)
{
	assert_true(q->tail - q->head < QMAX);
	q->m[q->tail++ % QMAX] = m;
}

static struct msg q_pop(struct queue *q)
{
	return q->m[q->head++ % QMAX];
}

static struct msg q_peek(const struct queue *q)
{
	return q->m[q->head % QMAX];
}

static size_t q_len(const struct queue *q)
{
	return q->tail - q->head;
}

/* What the independent model knows of one peer. */
struct model {
	int64_t sq_free;       /* slots: sq_depth - posts + send completions */
	int64_t credits;       /* peer's window - data sent + grants received */
	int64_t ctrl_inflight; /* control posts - their completions */
	int64_t ungranted;     /* peer data received - credits granted back to it */
	int64_t posted;        /* receives posted here for the peer */
};

struct peer {
	struct ss_credit c;
	struct model m;
	uint64_t to_send, sent_bytes, recv_bytes;
	bool eos_posted;
	struct queue send_done;   /* our SENDs awaiting their send completion, in order */
	struct queue wire;        /* our SENDs on the way to the peer, in order */
	struct queue held;        /* peer data we received, not yet consumed */
	uint32_t ctrl_slots_busy; /* receives holding a control message not yet reposted */
};

static const struct ss_credit_cfg *sim_cfg;
static uint64_t rnd_state;

static uint32_t rnd(uint32_t n)
{
	rnd_state = rnd_state * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)(rnd_state >> 33) % n;
}

enum { MAX_MSG = 1000 };

static enum ss_msg_kind kind_of(uint32_t imm)
{
	return (enum ss_msg_kind)((imm & SS_IMM_TYPE_MASK) >> SS_IMM_TYPE_SHIFT);
}

/* Posts a SEND the rules chose; the model checks it may go. */
static void post(struct peer *p, enum ss_msg_kind kind, uint32_t len, bool want_more)
{
	uint32_t limit = p->c.grant_limit, imm, grant;

	assert_true(p->m.sq_free > 0);
	if (kind == SS_KIND_DATA) {
		assert_true(p->m.sq_free > (int64_t)sim_cfg->ctrl_reserve);
		assert_true(p->m.credits > 0);
		p->m.credits--;
	} else {
		assert_true(p->m.ctrl_inflight < (int64_t)sim_cfg->ctrl_reserve);
		p->m.ctrl_inflight++;
	}
	p->m.sq_free--;
	imm = ss_credit_on_post(&p->c, kind, want_more);
	assert_int_equal(kind_of(imm), kind);
	grant = imm & SS_IMM_GRANT_MASK;
	/* A grant never returns more than the peer's data we hold ungranted, nor beyond the cap. */
	assert_true(grant <= limit);
	assert_true((int64_t)grant <= p->m.ungranted);
	p->m.ungranted -= grant;
	q_push(&p->send_done, (struct msg){imm, len});
	q_push(&p->wire, (struct msg){imm, len});
}

static bool peer_try_post(struct peer *p)
{
	bool want = p->to_send > 0;

	if (ss_credit_ctrl_due(&p->c, want) && ss_credit_can_send_ctrl(&p->c)) {
		post(p, SS_KIND_CTRL, 0, want);
		return true;
	}
	if (want && ss_credit_can_send_data(&p->c)) {
		uint32_t len = p->to_send < MAX_MSG ? (uint32_t)p->to_send : 1 + rnd(MAX_MSG);
		if (len > p->to_send)
			len = (uint32_t)p->to_send;
		p->to_send -= len;
		post(p, SS_KIND_DATA, len, p->to_send > 0);
		p->sent_bytes += len;
		return true;
	}
	if (!want && !p->eos_posted && ss_credit_can_send_ctrl(&p->c)) {
		post(p, SS_KIND_EOS, 0, false);
		p->eos_posted = true;
		return true;
	}
	return false;
}

/* The receiver p takes the next message off other's wire, if a receive is posted. */
static bool peer_try_recv(struct peer *p, struct peer *other)
{
	struct msg m;
	int kind;

	if (!q_len(&other->wire))
		return false;
	m = q_peek(&other->wire);
	if (p->m.posted == 0) {
		/*
		 * RNR: the sender retries. Only a control receive waiting for
		 * its repost may cause that; otherwise the sender overran us.
		 */
		assert_true(p->ctrl_slots_busy > 0);
		return false;
	}
	q_pop(&other->wire);
	p->m.posted--;
	p->m.credits += m.imm & SS_IMM_GRANT_MASK; /* the sender gives us credits for our data */
	if (kind_of(m.imm) == SS_KIND_DATA) {
		p->m.ungranted++;
		assert_true(p->m.ungranted <= (int64_t)sim_cfg->rx_window);
	}
	kind = ss_credit_on_recv(&p->c, m.imm);
	assert_true(kind >= 0);
	if (kind == SS_KIND_DATA)
		q_push(&p->held, m);
	else
		p->ctrl_slots_busy++; /* reposted by a later progress step */
	return true;
}

static bool peer_try_repost_ctrl(struct peer *p)
{
	if (!p->ctrl_slots_busy)
		return false;
	p->ctrl_slots_busy--;
	p->m.posted++;
	return true;
}

static bool peer_try_consume(struct peer *p)
{
	struct msg m;

	if (!q_len(&p->held))
		return false;
	m = q_pop(&p->held);
	p->recv_bytes += m.len;
	p->m.posted++;
	ss_credit_on_consumed(&p->c, 1);
	return true;
}

static bool peer_try_send_done(struct peer *p)
{
	/* A send completes once the peer has taken it off the wire. */
	if (q_len(&p->send_done) <= q_len(&p->wire))
		return false;
	struct msg m = q_pop(&p->send_done);
	p->m.sq_free++;
	if (kind_of(m.imm) != SS_KIND_DATA)
		p->m.ctrl_inflight--;
	ss_credit_on_send_done(&p->c, kind_of(m.imm));
	return true;
}

/*
 * capped: grant limits change at random (SRQ mode: free receive capacity
 * comes and goes); when nothing else can happen they are lifted, as the
 * retry timer does once capacity is back.
 */
static void simulate(uint64_t seed, const struct ss_credit_cfg *cfg, uint64_t bytes_each,
		     uint32_t slow_reader_pct, bool capped)
{
	static struct peer pr[2];

	rnd_state = seed;
	sim_cfg = cfg;
	memset(pr, 0, sizeof(pr));
	for (int i = 0; i < 2; i++) {
		assert_int_equal(ss_credit_init(&pr[i].c, cfg), 0);
		pr[i].to_send = bytes_each;
		pr[i].m = (struct model){.sq_free = cfg->sq_depth,
					 .credits = cfg->tx_window,
					 .posted = cfg->rx_window + cfg->ctrl_reserve};
	}
	for (uint64_t steps = 0;; steps++) {
		bool progressed = false;
		/* Try actions in a random order until one makes progress. */
		for (int attempt = 0; attempt < 40 && !progressed; attempt++) {
			int who = (int)rnd(2);
			struct peer *p = &pr[who], *o = &pr[!who];

			switch (rnd(capped ? 6 : 5)) {
			case 0: progressed = peer_try_post(p); break;
			case 1: progressed = peer_try_recv(p, o); break;
			case 2:
				if (rnd(100) >= slow_reader_pct || who == 1)
					progressed = peer_try_consume(p);
				break;
			case 3: progressed = peer_try_send_done(p); break;
			case 4: progressed = peer_try_repost_ctrl(p); break;
			case 5:
				ss_credit_set_grant_limit(&p->c,
							  rnd(4) ? (uint32_t)rnd(3) : UINT32_MAX);
				break;
			}
		}
		if (!progressed) {
			/* Exhaustive check: is anything at all possible? */
			for (int who = 0; who < 2 && !progressed; who++) {
				struct peer *p = &pr[who], *o = &pr[!who];
				progressed = peer_try_post(p) || peer_try_recv(p, o) ||
					     peer_try_consume(p) || peer_try_send_done(p) ||
					     peer_try_repost_ctrl(p);
			}
		}
		for (int who = 0; who < 2 && !progressed; who++)
			if (pr[who].c.grant_limit != UINT32_MAX) {
				ss_credit_set_grant_limit(&pr[who].c, UINT32_MAX);
				progressed = true;
			}
		if (!progressed)
			break;
		assert_true(steps < 50000000);
	}
	for (int i = 0; i < 2; i++) {
		/* Nothing left anywhere: every byte crossed, both ends saw EOS. */
		assert_int_equal(pr[i].to_send, 0);
		assert_true(pr[i].eos_posted);
		assert_true(pr[!i].c.eos_received);
		assert_int_equal(pr[!i].recv_bytes, pr[i].sent_bytes);
		assert_int_equal(pr[i].sent_bytes, bytes_each);
		assert_int_equal(pr[i].m.sq_free, cfg->sq_depth);
		assert_int_equal(q_len(&pr[i].wire), 0);
	}
}

static void test_simulated_orders(void **state)
{
	/* clang-format off */
	static const struct ss_credit_cfg cfgs[] = {
		{.sq_depth = 2, .ctrl_reserve = 1, .rx_window = 1, .tx_window = 1, .grant_threshold = 1},
		{.sq_depth = 4, .ctrl_reserve = 1, .rx_window = 2, .tx_window = 2, .grant_threshold = 2},
		{.sq_depth = 8, .ctrl_reserve = 2, .rx_window = 4, .tx_window = 4, .grant_threshold = 2},
		{.sq_depth = 16, .ctrl_reserve = 2, .rx_window = 8, .tx_window = 8, .grant_threshold = 4},
		{.sq_depth = 64, .ctrl_reserve = 4, .rx_window = 64, .tx_window = 64,
		 .grant_threshold = 32},
		{.sq_depth = 3, .ctrl_reserve = 2, .rx_window = 16, .tx_window = 16, .grant_threshold = 16},
	};
	/* clang-format on */

	(void)state;
	for (size_t i = 0; i < sizeof(cfgs) / sizeof(cfgs[0]); i++)
		for (uint64_t seed = 1; seed <= 40; seed++)
			simulate(seed * 7919 + i, &cfgs[i], 20000 + seed * 1000, seed % 3 ? 0 : 90,
				 seed % 2 == 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_scripts),
		cmocka_unit_test(test_init_rejects_unworkable),
		cmocka_unit_test(test_simulated_orders),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
