#include "handshake/policy.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "handshake/gid.h"

/* Parses one rule from [s, end). Returns 0 or -EINVAL. */
static int parse_rule(const char *s, const char *end, struct ss_policy_rule *r)
{
	char buf[80], *addr, *slash, *port = NULL;
	size_t len = (size_t)(end - s);
	bool v6;
	long v;
	char *e;

	if (len == 0 || len >= sizeof(buf))
		return -EINVAL;
	memcpy(buf, s, len);
	buf[len] = '\0';
	addr = buf;
	v6 = buf[0] == '[';
	if (v6) {
		char *close = strchr(buf, ']');
		if (!close)
			return -EINVAL;
		*close = '\0';
		addr = buf + 1;
		if (close[1] == '/')
			slash = close + 1;
		else
			slash = NULL;
		port = strchr(close + 1, ':');
	} else {
		port = strchr(buf, ':');
		slash = strchr(buf, '/');
	}
	if (port)
		*port++ = '\0';
	if (slash)
		*slash++ = '\0';

	memset(r, 0, sizeof(*r));
	if (v6) {
		if (inet_pton(AF_INET6, addr, r->addr) != 1)
			return -EINVAL;
		r->prefix = 128;
	} else {
		struct sockaddr_in sin = {.sin_family = AF_INET};
		if (inet_pton(AF_INET, addr, &sin.sin_addr) != 1)
			return -EINVAL;
		ss_addr_to_gid((struct sockaddr *)&sin, r->addr);
		r->prefix = 128;
	}
	if (slash) {
		v = strtol(slash, &e, 10);
		if (e == slash || *e || v < 0 || v > (v6 ? 128 : 32))
			return -EINVAL;
		r->prefix = (uint8_t)(v6 ? v : 96 + v);
	}
	if (port) {
		v = strtol(port, &e, 10);
		if (e == port || *e || v < 1 || v > 65535)
			return -EINVAL;
		r->port = (uint16_t)v;
	}
	return 0;
}

int ss_policy_parse(const char *spec, struct ss_policy *p, char *err, size_t errlen)
{
	struct ss_policy out = {0};
	const char *s = spec;

	while (*s) {
		const char *end = strchr(s, ',');

		if (!end)
			end = s + strlen(s);
		if (out.n == SS_POLICY_MAX) {
			snprintf(err, errlen, "more than %d entries", SS_POLICY_MAX);
			return -EINVAL;
		}
		if (parse_rule(s, end, &out.rules[out.n]) < 0) {
			snprintf(err, errlen,
				 "'%.*s' is not ADDR[/PREFIX][:PORT] or [IPV6][/PREFIX][:PORT]",
				 (int)(end - s), s);
			return -EINVAL;
		}
		out.n++;
		s = *end ? end + 1 : end;
	}
	*p = out;
	return 0;
}

static bool prefix_match(const uint8_t *a, const uint8_t *b, unsigned bits)
{
	unsigned bytes = bits / 8, rest = bits % 8;

	if (memcmp(a, b, bytes) != 0)
		return false;
	return rest == 0 || ((a[bytes] ^ b[bytes]) & (uint8_t)(0xff << (8 - rest))) == 0;
}

bool ss_policy_allows(const struct ss_policy *p, const struct sockaddr *dst)
{
	uint8_t gid[16];
	uint16_t port;

	if (p->n == 0)
		return true;
	if (ss_addr_to_gid(dst, gid) < 0)
		return false;
	port = ntohs(dst->sa_family == AF_INET ? ((const struct sockaddr_in *)dst)->sin_port
					       : ((const struct sockaddr_in6 *)dst)->sin6_port);
	for (size_t i = 0; i < p->n; i++)
		if (prefix_match(p->rules[i].addr, gid, p->rules[i].prefix) &&
		    (p->rules[i].port == 0 || p->rules[i].port == port))
			return true;
	return false;
}
