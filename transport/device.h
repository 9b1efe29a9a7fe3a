/* Device, port and GID selection for a TCP connection's local address. */
#ifndef SS_TRANSPORT_DEVICE_H
#define SS_TRANSPORT_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

struct ibv_context;

enum ss_gid_type {
	SS_GID_IB,
	SS_GID_ROCE_V1,
	SS_GID_ROCE_V2,
};

/* What selection needs to know of one GID table entry. */
struct ss_gid_desc {
	uint8_t raw[16];
	uint16_t index;
	enum ss_gid_type type;
};

struct ss_port_desc {
	uint8_t num;
	bool active;
	const struct ss_gid_desc *gids;
	size_t n_gids;
};

struct ss_dev_desc {
	const char *name;
	const struct ss_port_desc *ports;
	size_t n_ports;
};

/* Explicit choices by the user (SRQSHIM_DEVICE, _PORT, _GID_INDEX). */
struct ss_dev_override {
	const char *device; /* NULL or "": any device */
	unsigned port;      /* 0: any active port */
	int gid_index;      /* < 0: the GID of the local address */
};

struct ss_dev_choice {
	size_t dev; /* index into the array given to ss_dev_select() */
	uint8_t port;
	uint16_t gid_index;
	uint8_t gid[16];
	enum ss_gid_type type;
};

enum ss_sel_status {
	SS_SEL_OK,
	SS_SEL_NO_DEVICE,      /* no RDMA device on this host */
	SS_SEL_UNKNOWN_DEVICE, /* the configured device does not exist */
	SS_SEL_NO_PORT,        /* no active port (or the configured one is absent or down) */
	SS_SEL_NO_GID,         /* no GID equals the local address */
	SS_SEL_BAD_GID_INDEX,  /* the configured GID index is not in the port's table */
	SS_SEL_LOOPBACK,       /* loopback address and no device configured */
	SS_SEL_BAD_ADDRESS,    /* not an IPv4 or IPv6 address */
	SS_SEL__COUNT,
};

/* Returns a short, stable, human-readable name for status. */
const char *ss_sel_status_str(enum ss_sel_status status);

/*
 * Picks device, port and GID for a connection whose local address is local.
 * Without overrides: the active port whose GID table holds the address itself
 * (IPv4 as its IPv4-mapped form), RoCE v2 preferred over v1 for equal GIDs.
 * Loopback addresses only with a configured device (rxe cannot bind lo).
 * Pure: no I/O. Returns SS_SEL_OK and fills *choice_p, or a failure status.
 */
enum ss_sel_status ss_dev_select(const struct ss_dev_desc *devs, size_t n_devs,
				 const struct sockaddr *local, const struct ss_dev_override *ovr,
				 struct ss_dev_choice *choice_p);

/* An opened device with the port and GID chosen for one local address. */
struct ss_device {
	struct ibv_context *ctx;
	char name[64];
	uint8_t port;
	uint16_t gid_index;
	uint8_t gid[16];
	enum ss_gid_type gid_type;
	int active_mtu; /* enum ibv_mtu */
};

/*
 * Enumerates the host's RDMA devices, selects as ss_dev_select() does and
 * opens the chosen one. Returns 0 and sets *dev_p, or -ENODEV (with *status_p
 * saying why) or another -errno on a verbs failure. status_p may be NULL.
 */
int ss_device_open_for_addr(const struct sockaddr *local, const struct ss_dev_override *ovr,
			    struct ss_device **dev_p, enum ss_sel_status *status_p);

/* Closes a device opened by ss_device_open_for_addr(); accepts NULL. */
void ss_device_close(struct ss_device *dev);

#endif
