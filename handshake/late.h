/*
 * The move of a connection that started on TCP (docs/protocol.md, section 5):
 * when a side starts it, and the order of the urgent marks and handshake
 * messages that decide it. Pure: the caller does the I/O the actions name
 * and reports what it found as events. A caller holds the connection's lock
 * from an action to the event that answers it (SS_LATE_EV_YES or _NO).
 */
#ifndef SS_HANDSHAKE_LATE_H
#define SS_HANDSHAKE_LATE_H

#include <stdbool.h>
#include <stdint.h>

enum ss_late_state {
	SS_LATE_QUIET,         /* on TCP, no mark either way: reads look for the peer's lone mark */
	SS_LATE_MARKED,        /* our mark sent, the peer's not reached: reads stop at it */
	SS_LATE_C_PREPARE,     /* client, both marks: making its HELLO (or a DECLINE) */
	SS_LATE_C_WAIT_ANSWER, /* client: HELLO sent, waiting for ACCEPT or DECLINE */
	SS_LATE_C_CHECK,       /* client: checking the ACCEPT and making its QP ready */
	SS_LATE_S_WAIT_HELLO,  /* server, both marks: waiting for the client's HELLO or DECLINE */
	SS_LATE_S_DECIDE,      /* server: deciding on the HELLO */
	SS_LATE_S_WAIT_READY,  /* server: ACCEPT sent, waiting for READY (the commit point) */
	SS_LATE_RDMA,          /* moved: the stream goes on over the QP */
	SS_LATE_TCP,           /* on TCP for good: no mark is sent or looked for again */
	SS_LATE_BROKEN,        /* the peer broke the exchange: the connection is reset */
	SS_LATE__COUNT,
};

enum ss_late_event {
	SS_LATE_EV_MOVE,      /* this side wants to move (ss_late_ripe() said so) */
	SS_LATE_EV_PIN,       /* this side must stay on TCP (exec, fork, SCM_RIGHTS, ...) */
	SS_LATE_EV_SHUT,      /* the application shut this side's writing (FIN sent or held) */
	SS_LATE_EV_PEER_MARK, /* a read found the peer's mark at the head of the stream */
	SS_LATE_EV_PEER_EOF,  /* the peer's end of stream (or a reset) before what we wait for */
	SS_LATE_EV_HELLO,     /* handshake messages taken off the stream after both marks */
	SS_LATE_EV_ACCEPT,
	SS_LATE_EV_DECLINE,
	SS_LATE_EV_READY,
	SS_LATE_EV_OTHER,  /* any other message, or bytes that are none */
	SS_LATE_EV_QP_MSG, /* server: a first message came from the client's QP (proves READY) */
	SS_LATE_EV_YES,    /* the answer to SS_LATE_A_PREPARE, _DECIDE or _CHECK: done, go on */
	SS_LATE_EV_NO,     /* ... : cannot (the reason is passed) */
	SS_LATE_EV__COUNT,
};

/* What the caller must do, in this order, after a step. */
enum {
	SS_LATE_A_HOLD = 1u << 0,    /* stop writing application bytes to TCP: hold them */
	SS_LATE_A_MARK = 1u << 1,    /* send this side's one urgent byte */
	SS_LATE_A_PREPARE = 1u << 2, /* client: make a QP and send HELLO; answer YES or NO */
	SS_LATE_A_DECIDE = 1u << 3,  /* server: check the HELLO, make a QP; answer YES or NO */
	SS_LATE_A_ACCEPT = 1u << 4,  /* server: send ACCEPT */
	SS_LATE_A_CHECK = 1u << 5,   /* client: check the ACCEPT, QP to RTS; answer YES or NO */
	SS_LATE_A_READY = 1u << 6,   /* client: send READY */
	SS_LATE_A_DECLINE = 1u << 7, /* send DECLINE with the state's reason */
	SS_LATE_A_TCP = 1u << 8,     /* drop any QP; held bytes (then a held FIN) go to TCP */
	SS_LATE_A_RDMA = 1u << 9,    /* held bytes (then a held FIN) go over the QP */
	SS_LATE_A_DOWN = 1u << 10,   /* a pin came too late: move back to TCP (section 4) */
	SS_LATE_A_RESET = 1u << 11,  /* reset the connection (the peer broke the exchange) */
};

struct ss_late {
	enum ss_late_state state;
	bool client;     /* the connection's role, whichever side starts the move */
	bool pin;        /* a pin came while the move was under way */
	bool shut;       /* our writing is shut: a FIN is held behind the held bytes */
	uint16_t reason; /* enum ss_reason: why on TCP for good (NONE: it ended before moving) */
};

/* Returns a side's state at the start (QUIET) for the given role. */
struct ss_late ss_late_init(bool client);

/*
 * Applies ev (reason: the cause, for SS_LATE_EV_NO; else ignored) and returns
 * the actions (SS_LATE_A_*) it asks for; 0 when ev changes nothing. YES or NO
 * with no answer pending and any event once decided change nothing; a mark
 * or message where none can come breaks the connection (SS_LATE_A_RESET).
 * Pure.
 */
unsigned ss_late_step(struct ss_late *l, enum ss_late_event ev, uint16_t reason);

/* True while the application's writes must be held (the move is under way). */
bool ss_late_holds(const struct ss_late *l);

/* Returns a short, stable name for s. */
const char *ss_late_state_str(enum ss_late_state s);

/* What a connection has done so far, and the thresholds for moving it. */
struct ss_late_use {
	uint64_t age_ms;
	uint64_t bytes; /* both ways */
	uint64_t calls; /* reads and writes that moved bytes, both ways */
};

/*
 * True when a connection that has done `use` should start its move: it is at
 * least `min.age_ms` old and has carried `min.bytes` or made `min.calls`
 * (a threshold of 0 is met at once). Pure.
 */
bool ss_late_ripe(const struct ss_late_use *use, const struct ss_late_use *min);

#endif
