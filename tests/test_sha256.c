/* The test programs' SHA-256 against the FIPS 180-4 examples and sha256sum. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "sha256.h"

static const struct {
	const char *input;
	size_t repeat; /* the input this many times, fed in pieces of 7 bytes */
	const char *digest;
} sha256_cases[] = {
	{"", 1, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
	{"abc", 1, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
	{"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", 1,
	 "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
	{"a", 1000000, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"},
	/* 55, 56 and 64 bytes: the padding's edges (sha256sum gave these) */
	{"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", 1,
	 "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318"},
	{"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", 1,
	 "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a"},
	{"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", 1,
	 "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb"},
};

static void test_sha256_vectors(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(sha256_cases) / sizeof(sha256_cases[0]); i++) {
		struct sha256 s;
		char hex[65];
		static char whole[1 << 20];
		size_t len = strlen(sha256_cases[i].input), total = 0;

		for (size_t r = 0; r < sha256_cases[i].repeat; r++, total += len)
			memcpy(whole + total, sha256_cases[i].input, len);
		sha256_init(&s);
		for (size_t off = 0; off < total; off += 7)
			sha256_update(&s, whole + off, total - off < 7 ? total - off : 7);
		sha256_hex(&s, hex);
		assert_string_equal(hex, sha256_cases[i].digest);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {cmocka_unit_test(test_sha256_vectors)};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
