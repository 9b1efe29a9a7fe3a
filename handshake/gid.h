/* How IP addresses name RoCE GIDs: the one place that knows the mapping. */
#ifndef SS_HANDSHAKE_GID_H
#define SS_HANDSHAKE_GID_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

/* Writes the GID that names addr on RoCE (IPv4-mapped for IPv4); -EAFNOSUPPORT else. */
int ss_addr_to_gid(const struct sockaddr *addr, uint8_t gid[16]);

/* True when gid is the IPv4-mapped form of an IPv4 address. */
bool ss_gid_is_v4_mapped(const uint8_t gid[16]);

/* True for 127.0.0.0/8, ::1 and ::ffff:127.0.0.0/104. */
bool ss_addr_is_loopback(const struct sockaddr *addr);

#endif
