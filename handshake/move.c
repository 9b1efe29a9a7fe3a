/* Where a stream resumes on TCP after a move (docs/protocol.md, section 4). */
#include "handshake/move.h"

int64_t ss_move_skip(const struct ss_move_view *v)
{
	if (!v->counted)
		return v->lost ? -1 : 0; /* a live move's peer may predate the count */
	if (v->received < v->from || v->received - v->from > v->held)
		return -1;
	/* Live: everything posted arrived before our end of stream, nothing more. */
	if (!v->lost && v->received != v->from)
		return -1;
	return (int64_t)(v->received - v->from);
}
