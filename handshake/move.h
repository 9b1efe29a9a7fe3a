/*
 * The pure rule of a move back to TCP (docs/protocol.md, section 4): where
 * a side's stream resumes on TCP, from what it holds and what the peer
 * says it received over RDMA.
 */
#ifndef SS_HANDSHAKE_MOVE_H
#define SS_HANDSHAKE_MOVE_H

#include <stdbool.h>
#include <stdint.h>

/* What a side holds for TCP, and what the peer's RETURN said. */
struct ss_move_view {
	bool lost;         /* the QP broke (LOST), else the live move (SWITCH) */
	uint64_t from;     /* stream offset of the first byte held */
	uint64_t held;     /* bytes held from `from` on (taken back when the move began) */
	bool counted;      /* the RETURN carried `received` */
	uint64_t received; /* bytes of our stream the peer got over RDMA in all */
};

/*
 * How many of the held bytes the peer already has (to drop from the front
 * before sending on TCP), or -1 when the RETURN cannot be true: a count
 * below `from` (the peer lost bytes it acknowledged) or beyond what was
 * held, a live move whose count is not exactly `from`, or a lost move
 * without a count. Pure.
 */
int64_t ss_move_skip(const struct ss_move_view *v);

#endif
