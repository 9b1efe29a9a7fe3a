/*
 * libFuzzer target for the HELLO decoder: it must never read out of bounds
 * (ASan), its results must be self-consistent, and any message it accepts
 * must encode back to a message that decodes to the same fields.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "handshake/hello.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* A private copy, so ASan sees reads past the end of the input. */
	uint8_t *buf = malloc(size ? size : 1);
	uint8_t again[SS_HELLO_MAX_LEN];
	struct ss_msg msg, msg2;
	size_t used = 0, used2 = 0;
	enum ss_dec_result r;

	memcpy(buf, data, size);
	r = ss_msg_decode(buf, size, &msg, &used);
	switch (r) {
	case SS_DEC_SHORT:
		if (used <= size || used > SS_HELLO_MAX_LEN)
			abort();
		break;
	case SS_DEC_OK: {
		if (used > size || used < SS_HELLO_HDR_LEN || used > SS_HELLO_MAX_LEN)
			abort();
		int n = ss_msg_encode(&msg, again, sizeof(again));
		if (n <= 0 || ss_msg_decode(again, (size_t)n, &msg2, &used2) != SS_DEC_OK ||
		    used2 != (size_t)n)
			abort();
		if (msg2.type != msg.type || msg2.nonce != msg.nonce || msg2.reason != msg.reason ||
		    memcmp(&msg2.params, &msg.params, sizeof(msg.params)) != 0)
			abort();
		break;
	}
	case SS_DEC_FOREIGN:
		if (size && memcmp(buf, SS_HELLO_MAGIC, size < 8 ? size : 8) == 0)
			abort();
		break;
	case SS_DEC_MALFORMED:
	case SS_DEC_UNSUPPORTED:
		if (size < SS_HELLO_HDR_LEN)
			abort();
		break;
	default: abort();
	}
	free(buf);
	return 0;
}
