/* Which destinations a client offers an upgrade to (SRQSHIM_PEERS). */
#ifndef SS_HANDSHAKE_POLICY_H
#define SS_HANDSHAKE_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#define SS_POLICY_MAX 16

struct ss_policy_rule {
	uint8_t addr[16]; /* IPv4 as IPv4-mapped */
	uint8_t prefix;   /* bits of addr that must match, 0..128 */
	uint16_t port;    /* host order; 0: any */
};

/* An empty policy allows every destination. */
struct ss_policy {
	struct ss_policy_rule rules[SS_POLICY_MAX];
	size_t n;
};

/*
 * Parses a comma-separated list of ADDR[/PREFIX][:PORT] (IPv4) or
 * [ADDR][/PREFIX][:PORT] (IPv6, in brackets); "" allows all. Returns 0, or
 * -EINVAL with a message in err (*p untouched).
 */
int ss_policy_parse(const char *spec, struct ss_policy *p, char *err, size_t errlen);

/* True when the policy lets a client send a HELLO to dst. */
bool ss_policy_allows(const struct ss_policy *p, const struct sockaddr *dst);

#endif
