#include "handshake/gid.h"

#include <errno.h>
#include <netinet/in.h>
#include <string.h>

static const uint8_t v4_mapped_prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

int ss_addr_to_gid(const struct sockaddr *addr, uint8_t gid[16])
{
	if (addr->sa_family == AF_INET) {
		memcpy(gid, v4_mapped_prefix, sizeof(v4_mapped_prefix));
		memcpy(gid + 12, &((const struct sockaddr_in *)addr)->sin_addr, 4);
		return 0;
	}
	if (addr->sa_family == AF_INET6) {
		memcpy(gid, &((const struct sockaddr_in6 *)addr)->sin6_addr, 16);
		return 0;
	}
	return -EAFNOSUPPORT;
}

bool ss_gid_is_v4_mapped(const uint8_t gid[16])
{
	return memcmp(gid, v4_mapped_prefix, sizeof(v4_mapped_prefix)) == 0;
}

bool ss_addr_is_loopback(const struct sockaddr *addr)
{
	static const uint8_t v6_loopback[16] = {[15] = 1};
	uint8_t gid[16];

	if (ss_addr_to_gid(addr, gid) < 0)
		return false;
	if (ss_gid_is_v4_mapped(gid))
		return gid[12] == 127;
	return memcmp(gid, v6_loopback, 16) == 0;
}
