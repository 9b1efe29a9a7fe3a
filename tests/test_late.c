/*
 * The move of a connection that started on TCP (handshake/late.c): one side's
 * steps by table, then both sides together over every order in which their
 * marks, messages and triggers can meet, and the rule for when to move.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "handshake/late.h"
#include "handshake/reason.h"

#define EV(e) SS_LATE_EV_##e
#define A(a)  SS_LATE_A_##a
#define ST(s) SS_LATE_##s
#define NO_STEP                                                                                    \
	{                                                                                          \
		SS_LATE_EV__COUNT, 0, 0, 0                                                         \
	}

struct late_step {
	enum ss_late_event ev;
	uint16_t reason;
	unsigned want_acts;
	enum ss_late_state want_state;
};

struct late_case {
	const char *what;
	bool client;
	struct late_step steps[8]; /* ends at ev == SS_LATE_EV__COUNT */
	uint16_t want_reason;
};

/* clang-format off */
static const struct late_case late_cases[] = {
	{"client starts, server accepts", true, {
		{EV(MOVE), 0, A(HOLD) | A(MARK), ST(MARKED)},
		{EV(MOVE), 0, 0, ST(MARKED)},
		{EV(PEER_MARK), 0, A(PREPARE), ST(C_PREPARE)},
		{EV(YES), 0, 0, ST(C_WAIT_ANSWER)},
		{EV(ACCEPT), 0, A(CHECK), ST(C_CHECK)},
		{EV(YES), 0, A(READY) | A(RDMA), ST(RDMA)},
		{EV(PEER_EOF), 0, 0, ST(RDMA)}, NO_STEP}, SS_REASON_NONE},
	{"server answers the client's mark", false, {
		{EV(PEER_MARK), 0, A(HOLD) | A(MARK), ST(S_WAIT_HELLO)},
		{EV(HELLO), 0, A(DECIDE), ST(S_DECIDE)},
		{EV(YES), 0, A(ACCEPT), ST(S_WAIT_READY)},
		{EV(READY), 0, A(RDMA), ST(RDMA)}, NO_STEP}, SS_REASON_NONE},
	{"server starts; the client's first QP message proves READY", false, {
		{EV(MOVE), 0, A(HOLD) | A(MARK), ST(MARKED)},
		{EV(PEER_MARK), 0, 0, ST(S_WAIT_HELLO)},
		{EV(HELLO), 0, A(DECIDE), ST(S_DECIDE)},
		{EV(YES), 0, A(ACCEPT), ST(S_WAIT_READY)},
		{EV(QP_MSG), 0, A(RDMA), ST(RDMA)},
		{EV(READY), 0, 0, ST(RDMA)}, NO_STEP}, SS_REASON_NONE},
	{"client answers the server's mark, its HELLO right behind its own", true, {
		{EV(PEER_MARK), 0, A(HOLD) | A(MARK) | A(PREPARE), ST(C_PREPARE)}, NO_STEP}, 0},
	{"client cannot make a QP", true, {
		{EV(PEER_MARK), 0, A(HOLD) | A(MARK) | A(PREPARE), ST(C_PREPARE)},
		{EV(NO), SS_REASON_RESOURCE, A(DECLINE) | A(TCP), ST(TCP)},
		{EV(MOVE), 0, 0, ST(TCP)}, NO_STEP}, SS_REASON_RESOURCE},
	{"server declines the HELLO", false, {
		{EV(PEER_MARK), 0, A(HOLD) | A(MARK), ST(S_WAIT_HELLO)},
		{EV(HELLO), 0, A(DECIDE), ST(S_DECIDE)},
		{EV(NO), SS_REASON_GID_MISMATCH, A(DECLINE) | A(TCP), ST(TCP)}, NO_STEP},
		SS_REASON_GID_MISMATCH},
	{"client gets DECLINE", true, {
		{EV(MOVE), 0, A(HOLD) | A(MARK), ST(MARKED)},
		{EV(PEER_MARK), 0, A(PREPARE), ST(C_PREPARE)},
		{EV(YES), 0, 0, ST(C_WAIT_ANSWER)},
		{EV(DECLINE), 0, A(TCP), ST(TCP)}, NO_STEP}, SS_REASON_PEER_DECLINED},
	{"client finds the ACCEPT wrong", true, {
		{EV(PEER_MARK), 0, A(HOLD) | A(MARK) | A(PREPARE), ST(C_PREPARE)},
		{EV(YES), 0, 0, ST(C_WAIT_ANSWER)},
		{EV(ACCEPT), 0, A(CHECK), ST(C_CHECK)},
		{EV(NO), SS_REASON_PARAMS, A(DECLINE) | A(TCP), ST(TCP)}, NO_STEP}, SS_REASON_PARAMS},
	{"server gets DECLINE instead of READY", false, {
		{EV(PEER_MARK), 0, A(HOLD) | A(MARK), ST(S_WAIT_HELLO)},
		{EV(HELLO), 0, A(DECIDE), ST(S_DECIDE)},
		{EV(YES), 0, A(ACCEPT), ST(S_WAIT_READY)},
		{EV(DECLINE), 0, A(TCP), ST(TCP)}, NO_STEP}, SS_REASON_PEER_DECLINED},
	{"server gets DECLINE instead of HELLO", false, {
		{EV(MOVE), 0, A(HOLD) | A(MARK), ST(MARKED)},
		{EV(PEER_MARK), 0, 0, ST(S_WAIT_HELLO)},
		{EV(DECLINE), 0, A(TCP), ST(TCP)}, NO_STEP}, SS_REASON_PEER_DECLINED},
	{"client pinned on TCP: the marks, then DECLINE", true, {
		{EV(PIN), 0, A(HOLD) | A(MARK), ST(MARKED)},
		{EV(PEER_MARK), 0, A(DECLINE) | A(TCP), ST(TCP)}, NO_STEP}, SS_REASON_POLICY},
	{"server pinned on TCP: the marks, then DECLINE to the HELLO", false, {
		{EV(PIN), 0, A(HOLD) | A(MARK), ST(MARKED)},
		{EV(PEER_MARK), 0, 0, ST(S_WAIT_HELLO)},
		{EV(HELLO), 0, A(DECLINE) | A(TCP), ST(TCP)}, NO_STEP}, SS_REASON_POLICY},
	{"client pinned after its mark", true, {
		{EV(MOVE), 0, A(HOLD) | A(MARK), ST(MARKED)},
		{EV(PIN), 0, 0, ST(MARKED)},
		{EV(PEER_MARK), 0, A(DECLINE) | A(TCP), ST(TCP)}, NO_STEP}, SS_REASON_POLICY},
	{"client pinned while it waits for the answer", true, {
		{EV(PEER_MARK), 0, A(HOLD) | A(MARK) | A(PREPARE), ST(C_PREPARE)},
		{EV(YES), 0, 0, ST(C_WAIT_ANSWER)},
		{EV(PIN), 0, 0, ST(C_WAIT_ANSWER)},
		{EV(ACCEPT), 0, A(DECLINE) | A(TCP), ST(TCP)}, NO_STEP}, SS_REASON_POLICY},
	{"client pinned while it checks: moves, then back", true, {
		{EV(PEER_MARK), 0, A(HOLD) | A(MARK) | A(PREPARE), ST(C_PREPARE)},
		{EV(YES), 0, 0, ST(C_WAIT_ANSWER)},
		{EV(ACCEPT), 0, A(CHECK), ST(C_CHECK)},
		{EV(PIN), 0, 0, ST(C_CHECK)},
		{EV(YES), 0, A(READY) | A(RDMA) | A(DOWN), ST(RDMA)}, NO_STEP}, SS_REASON_NONE},
	{"server pinned after its ACCEPT: moves, then back", false, {
		{EV(PEER_MARK), 0, A(HOLD) | A(MARK), ST(S_WAIT_HELLO)},
		{EV(HELLO), 0, A(DECIDE), ST(S_DECIDE)},
		{EV(YES), 0, A(ACCEPT), ST(S_WAIT_READY)},
		{EV(PIN), 0, 0, ST(S_WAIT_READY)},
		{EV(READY), 0, A(RDMA) | A(DOWN), ST(RDMA)}, NO_STEP}, SS_REASON_NONE},
	{"shut before any mark: TCP for good, the peer's mark skipped", true, {
		{EV(SHUT), 0, A(TCP), ST(TCP)},
		{EV(PEER_MARK), 0, 0, ST(TCP)},
		{EV(MOVE), 0, 0, ST(TCP)}, NO_STEP}, SS_REASON_NONE},
	{"shut after the mark: the FIN is held; the peer's FIN ends the move", false, {
		{EV(MOVE), 0, A(HOLD) | A(MARK), ST(MARKED)},
		{EV(SHUT), 0, 0, ST(MARKED)},
		{EV(PEER_EOF), 0, A(TCP), ST(TCP)}, NO_STEP}, SS_REASON_NONE},
	{"the peer's FIN before any mark", true, {
		{EV(PEER_EOF), 0, A(TCP), ST(TCP)},
		{EV(MOVE), 0, 0, ST(TCP)}, NO_STEP}, SS_REASON_NONE},
	{"the peer's FIN while the client waits for the answer", true, {
		{EV(PEER_MARK), 0, A(HOLD) | A(MARK) | A(PREPARE), ST(C_PREPARE)},
		{EV(YES), 0, 0, ST(C_WAIT_ANSWER)},
		{EV(PEER_EOF), 0, A(TCP), ST(TCP)}, NO_STEP}, SS_REASON_NONE},
	{"the client's FIN instead of READY", false, {
		{EV(PEER_MARK), 0, A(HOLD) | A(MARK), ST(S_WAIT_HELLO)},
		{EV(HELLO), 0, A(DECIDE), ST(S_DECIDE)},
		{EV(YES), 0, A(ACCEPT), ST(S_WAIT_READY)},
		{EV(PEER_EOF), 0, A(TCP), ST(TCP)}, NO_STEP}, SS_REASON_NONE},
	{"other bytes where the HELLO must be", false, {
		{EV(PEER_MARK), 0, A(HOLD) | A(MARK), ST(S_WAIT_HELLO)},
		{EV(OTHER), 0, A(RESET), ST(BROKEN)},
		{EV(HELLO), 0, 0, ST(BROKEN)}, NO_STEP}, SS_REASON_NONE},
	{"a second mark from the peer", true, {
		{EV(PEER_MARK), 0, A(HOLD) | A(MARK) | A(PREPARE), ST(C_PREPARE)},
		{EV(YES), 0, 0, ST(C_WAIT_ANSWER)},
		{EV(PEER_MARK), 0, A(RESET), ST(BROKEN)}, NO_STEP}, SS_REASON_NONE},
	{"a message before any mark", false, {
		{EV(HELLO), 0, A(RESET), ST(BROKEN)}, NO_STEP}, SS_REASON_NONE},
	{"an answer with none pending", true, {
		{EV(YES), 0, 0, ST(QUIET)},
		{EV(MOVE), 0, A(HOLD) | A(MARK), ST(MARKED)},
		{EV(NO), SS_REASON_RESOURCE, 0, ST(MARKED)}, NO_STEP}, SS_REASON_NONE},
};
/* clang-format on */

/* Where the application's writes wait: from a mark until the decision. */
static const bool late_holds_in[SS_LATE__COUNT] = {
	[SS_LATE_MARKED] = true,        [SS_LATE_C_PREPARE] = true,
	[SS_LATE_C_WAIT_ANSWER] = true, [SS_LATE_C_CHECK] = true,
	[SS_LATE_S_WAIT_HELLO] = true,  [SS_LATE_S_DECIDE] = true,
	[SS_LATE_S_WAIT_READY] = true,
};

static void test_late_steps(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(late_cases) / sizeof(late_cases[0]); i++) {
		const struct late_case *c = &late_cases[i];
		struct ss_late l = ss_late_init(c->client);

		for (size_t k = 0; c->steps[k].ev != SS_LATE_EV__COUNT; k++) {
			const struct late_step *s = &c->steps[k];
			unsigned acts = ss_late_step(&l, s->ev, s->reason);

			if (acts != s->want_acts || l.state != s->want_state)
				fail_msg("%s, step %zu: actions %#x in %s, want %#x in %s", c->what,
					 k, acts, ss_late_state_str(l.state), s->want_acts,
					 ss_late_state_str(s->want_state));
			if (ss_late_holds(&l) != late_holds_in[l.state])
				fail_msg("%s, step %zu: holds wrong in %s", c->what, k,
					 ss_late_state_str(l.state));
		}
		if (l.reason != c->want_reason)
			fail_msg("%s: reason %s, want %s", c->what, ss_reason_str(l.reason),
				 ss_reason_str(c->want_reason));
	}
}

/*
 * Both sides together. What one side puts on TCP reaches the other in order;
 * the model tries every order of deliveries and of each side's triggers (a
 * wish to move, a pin, a shut), and the answers to PREPARE, DECIDE and CHECK
 * are the scenario's. Whatever the order: no mark or message is ever taken
 * for application bytes, no side sends two marks, nobody is left holding,
 * both sides end on the same transport, and a pin is honoured.
 */
enum late_item { IT_MARK, IT_HELLO, IT_ACCEPT, IT_DECLINE, IT_READY, IT_EOF };

enum { TR_MOVE = 1, TR_PIN = 2, TR_SHUT = 4 };

enum late_outcome { OUT_RDMA, OUT_TCP, OUT_EITHER };

struct late_pair_case {
	const char *what;
	unsigned triggers[2]; /* [0] the client's, [1] the server's */
	bool prepare_ok, decide_ok, check_ok;
	enum late_outcome want;
};

struct late_side {
	struct ss_late l;
	unsigned fired; /* triggers fired so far */
	int marks;      /* urgent bytes sent */
	bool pin_honoured;
	bool fin_sent; /* a FIN on TCP */
};

struct late_world {
	const struct late_pair_case *c;
	struct late_side side[2];
	uint8_t q[2][16]; /* q[i]: on TCP toward side i */
	int head[2], len[2];
	const char *bad; /* the first rule broken */
};

struct late_tally {
	unsigned ends, rdma, tcp;
	char bad[200];
};

static void late_push(struct late_world *w, int to, enum late_item it)
{
	if (w->len[to] >= (int)sizeof(w->q[to]))
		w->bad = w->bad ? w->bad : "too many items on TCP";
	else
		w->q[to][w->len[to]++] = (uint8_t)it;
}

/* Does what the actions ask, in order, answering PREPARE, DECIDE and CHECK at once. */
static void late_act(struct late_world *w, int i, unsigned acts)
{
	struct late_side *s = &w->side[i];
	const struct late_pair_case *c = w->c;

	if (acts & SS_LATE_A_MARK) {
		s->marks++;
		late_push(w, 1 - i, IT_MARK);
	}
	if (acts & SS_LATE_A_PREPARE) {
		if (c->prepare_ok)
			late_push(w, 1 - i, IT_HELLO);
		late_act(w, i,
			 ss_late_step(&s->l, c->prepare_ok ? SS_LATE_EV_YES : SS_LATE_EV_NO,
				      SS_REASON_RESOURCE));
	}
	if (acts & SS_LATE_A_DECIDE)
		late_act(w, i,
			 ss_late_step(&s->l, c->decide_ok ? SS_LATE_EV_YES : SS_LATE_EV_NO,
				      SS_REASON_RESOURCE));
	if (acts & SS_LATE_A_ACCEPT)
		late_push(w, 1 - i, IT_ACCEPT);
	if (acts & SS_LATE_A_CHECK)
		late_act(w, i,
			 ss_late_step(&s->l, c->check_ok ? SS_LATE_EV_YES : SS_LATE_EV_NO,
				      SS_REASON_PARAMS));
	if (acts & SS_LATE_A_READY)
		late_push(w, 1 - i, IT_READY);
	if (acts & SS_LATE_A_DECLINE)
		late_push(w, 1 - i, IT_DECLINE);
	if ((acts & SS_LATE_A_TCP) && s->l.shut && !s->fin_sent) {
		s->fin_sent = true;
		late_push(w, 1 - i, IT_EOF);
	}
	if (acts & SS_LATE_A_DOWN)
		s->pin_honoured = true;
	if (acts & SS_LATE_A_RESET)
		w->bad = w->bad ? w->bad : "a side reset the connection";
}

static void late_fire(struct late_world *w, int i, unsigned tr)
{
	struct late_side *s = &w->side[i];
	static const enum ss_late_event ev_of[] = {[TR_MOVE] = SS_LATE_EV_MOVE,
						   [TR_PIN] = SS_LATE_EV_PIN,
						   [TR_SHUT] = SS_LATE_EV_SHUT};
	bool was_rdma = s->l.state == SS_LATE_RDMA, was_tcp = s->l.state == SS_LATE_TCP;

	s->fired |= tr;
	if (tr == TR_PIN && was_rdma)
		s->pin_honoured = true; /* the live move back of section 4 */
	if (tr == TR_SHUT && was_tcp && !s->fin_sent) {
		s->fin_sent = true;
		late_push(w, 1 - i, IT_EOF);
		return;
	}
	late_act(w, i, ss_late_step(&s->l, ev_of[tr], 0));
}

/* The next item on TCP reaches side i. */
static void late_deliver(struct late_world *w, int i)
{
	static const enum ss_late_event ev_of[] = {
		[IT_MARK] = SS_LATE_EV_PEER_MARK, [IT_HELLO] = SS_LATE_EV_HELLO,
		[IT_ACCEPT] = SS_LATE_EV_ACCEPT,  [IT_DECLINE] = SS_LATE_EV_DECLINE,
		[IT_READY] = SS_LATE_EV_READY,    [IT_EOF] = SS_LATE_EV_PEER_EOF};
	struct late_side *s = &w->side[i];
	enum late_item it = w->q[i][w->head[i]++];

	if (s->l.state == SS_LATE_TCP || s->l.state == SS_LATE_RDMA) {
		/* Decided: a mark is skipped by the kernel, a FIN is a FIN; a message would be
		 * data. */
		if (it != IT_MARK && it != IT_EOF)
			w->bad = w->bad ? w->bad : "a handshake message read as application bytes";
		if (it == IT_MARK && s->l.state == SS_LATE_RDMA)
			w->bad = w->bad ? w->bad : "a mark after the move";
		return;
	}
	/* A side that has not marked reads a mark as lone (urgread.c): nothing may be behind it. */
	if (it == IT_MARK && s->l.state == SS_LATE_QUIET && w->head[i] < w->len[i])
		w->bad = w->bad ? w->bad : "a mark with bytes behind it reached a side not marked";
	late_act(w, i, ss_late_step(&s->l, ev_of[it], 0));
}

static void late_check_end(const struct late_world *w, struct late_tally *t)
{
	const char *bad = w->bad;
	bool rdma[2];

	for (int i = 0; i < 2 && !bad; i++) {
		const struct late_side *s = &w->side[i];

		rdma[i] = s->l.state == SS_LATE_RDMA;
		if (s->marks > 1)
			bad = "two marks from one side";
		else if (ss_late_holds(&s->l))
			bad = "a side left holding its writes";
		else if ((s->fired & TR_PIN) && !rdma[i] && s->l.state != SS_LATE_TCP)
			bad = "a pinned side neither on TCP nor moved";
		else if ((s->fired & TR_PIN) && rdma[i] && !s->pin_honoured)
			bad = "a pinned side moved and stayed on RDMA";
		else if ((s->fired & TR_SHUT) && s->l.state == SS_LATE_TCP && !s->fin_sent)
			bad = "a FIN lost";
	}
	if (!bad && rdma[0] != rdma[1])
		bad = "the sides ended on different transports";
	if (!bad && w->c->want != OUT_EITHER && rdma[0] != (w->c->want == OUT_RDMA))
		bad = w->c->want == OUT_RDMA ? "ended on TCP" : "ended on RDMA";
	t->ends++;
	t->rdma += !bad && rdma[0];
	t->tcp += !bad && !rdma[0];
	if (bad && !t->bad[0])
		snprintf(t->bad, sizeof(t->bad), "%s (client %s, server %s)", bad,
			 ss_late_state_str(w->side[0].l.state),
			 ss_late_state_str(w->side[1].l.state));
}

/* Every next step from w, depth first. */
static void late_explore(const struct late_world *w, struct late_tally *t)
{
	bool any = false;

	if (w->bad) {
		late_check_end(w, t);
		return;
	}
	for (int i = 0; i < 2; i++) {
		if (w->head[i] < w->len[i]) {
			struct late_world n = *w;

			any = true;
			late_deliver(&n, i);
			late_explore(&n, t);
		}
		for (unsigned tr = TR_MOVE; tr <= TR_SHUT; tr <<= 1) {
			if ((w->c->triggers[i] & tr) && !(w->side[i].fired & tr)) {
				struct late_world n = *w;

				any = true;
				late_fire(&n, i, tr);
				late_explore(&n, t);
			}
		}
	}
	if (!any)
		late_check_end(w, t);
}

/* clang-format off */
static const struct late_pair_case late_pair_cases[] = {
	{"the client moves", {TR_MOVE, 0}, true, true, true, OUT_RDMA},
	{"the server moves", {0, TR_MOVE}, true, true, true, OUT_RDMA},
	{"both move, in any order", {TR_MOVE, TR_MOVE}, true, true, true, OUT_RDMA},
	{"the client cannot make its QP", {TR_MOVE, TR_MOVE}, false, true, true, OUT_TCP},
	{"the server declines", {TR_MOVE, TR_MOVE}, true, false, true, OUT_TCP},
	{"the client finds the ACCEPT wrong", {0, TR_MOVE}, true, true, false, OUT_TCP},
	{"the client is pinned", {TR_PIN, 0}, true, true, true, OUT_TCP},
	{"the server is pinned", {0, TR_PIN}, true, true, true, OUT_TCP},
	{"both are pinned", {TR_PIN, TR_PIN}, true, true, true, OUT_TCP},
	{"the client moves, the server is pinned", {TR_MOVE, TR_PIN}, true, true, true, OUT_EITHER},
	{"the server moves, the client is pinned", {TR_PIN, TR_MOVE}, true, true, true, OUT_EITHER},
	{"the client moves and shuts", {TR_MOVE | TR_SHUT, 0}, true, true, true, OUT_EITHER},
	{"the server moves, the client shuts", {TR_SHUT, TR_MOVE}, true, true, true, OUT_EITHER},
	{"both move and shut", {TR_MOVE | TR_SHUT, TR_MOVE | TR_SHUT}, true, true, true,
	 OUT_EITHER},
	{"the client moves, the server pins and shuts", {TR_MOVE, TR_PIN | TR_SHUT}, true, true,
	 true, OUT_EITHER},
	{"everything, the server declining", {TR_MOVE | TR_PIN | TR_SHUT, TR_MOVE | TR_SHUT},
	 true, false, true, OUT_TCP},
};
/* clang-format on */

static void test_late_pairs(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(late_pair_cases) / sizeof(late_pair_cases[0]); i++) {
		const struct late_pair_case *c = &late_pair_cases[i];
		struct late_world w = {.c = c};
		struct late_tally t = {0};

		w.side[0].l = ss_late_init(true);
		w.side[1].l = ss_late_init(false);
		late_explore(&w, &t);
		if (t.bad[0])
			fail_msg("%s: %s", c->what, t.bad);
		/* Each case must reach the outcomes it names, over at least one order. */
		if ((c->want != OUT_TCP && t.rdma == 0) || (c->want != OUT_RDMA && t.tcp == 0))
			fail_msg("%s: %u orders, %u on RDMA, %u on TCP", c->what, t.ends, t.rdma,
				 t.tcp);
	}
}

struct ripe_case {
	const char *what;
	struct ss_late_use use, min;
	bool want;
};

/* clang-format off */
static const struct ripe_case ripe_cases[] = {
	{"thresholds 0: at once", {0, 0, 0}, {0, 0, 0}, true},
	{"young, busy", {99, 1 << 20, 500}, {100, 65536, 64}, false},
	{"old, idle", {60000, 0, 0}, {100, 65536, 64}, false},
	{"old enough, enough bytes", {100, 65536, 1}, {100, 65536, 64}, true},
	{"old enough, enough calls", {100, 10, 64}, {100, 65536, 64}, true},
	{"old enough, just short of both", {100, 65535, 63}, {100, 65536, 64}, false},
};
/* clang-format on */

static void test_late_ripe(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(ripe_cases) / sizeof(ripe_cases[0]); i++) {
		const struct ripe_case *c = &ripe_cases[i];

		if (ss_late_ripe(&c->use, &c->min) != c->want)
			fail_msg("%s: %d, want %d", c->what, !c->want, c->want);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_late_steps),
		cmocka_unit_test(test_late_pairs),
		cmocka_unit_test(test_late_ripe),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
