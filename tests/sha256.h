/*
 * SHA-256 (FIPS 180-4) for the test programs: stream_check hashes every byte
 * it sends and receives, so the two ends of a bulk test compare digests that
 * owe nothing to the generator that checks the bytes one by one.
 */
#ifndef SRQSHIM_TESTS_SHA256_H
#define SRQSHIM_TESTS_SHA256_H

#include <stddef.h>
#include <stdint.h>

struct sha256 {
	uint32_t h[8];
	uint64_t len;      /* bytes hashed so far */
	uint8_t block[64]; /* the partial block */
};

void sha256_init(struct sha256 *s);
void sha256_update(struct sha256 *s, const void *data, size_t n);
/* Writes the digest as 64 lowercase hex digits and a NUL into hex. */
void sha256_hex(struct sha256 *s, char hex[65]);

#endif
