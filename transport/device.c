/* Device, port and GID selection: a pure chooser plus its verbs front end. */
#include "transport/device.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>

#include "handshake/gid.h"
#include "transport/log.h"

static const char *const sel_status_names[SS_SEL__COUNT] = {
	[SS_SEL_OK] = "ok",
	[SS_SEL_NO_DEVICE] = "no RDMA device",
	[SS_SEL_UNKNOWN_DEVICE] = "configured device not found",
	[SS_SEL_NO_PORT] = "no active port",
	[SS_SEL_NO_GID] = "no GID for the local address",
	[SS_SEL_BAD_GID_INDEX] = "configured GID index not in the table",
	[SS_SEL_LOOPBACK] = "loopback address needs a configured device",
	[SS_SEL_BAD_ADDRESS] = "not an IPv4 or IPv6 address",
};

const char *ss_sel_status_str(enum ss_sel_status status)
{
	if ((unsigned)status >= SS_SEL__COUNT)
		return "unknown";
	return sel_status_names[status];
}

static bool overridden_device(const struct ss_dev_override *ovr)
{
	return ovr && ovr->device && ovr->device[0];
}

/* Ranks a GID entry for the wanted GID; 0 means unusable. */
static int gid_rank(const struct ss_gid_desc *g, const uint8_t want[16], bool loopback,
		    bool want_v4)
{
	static const int type_rank[] = {
		[SS_GID_IB] = 1, [SS_GID_ROCE_V1] = 2, [SS_GID_ROCE_V2] = 3};
	int rank = type_rank[g->type];

	if (!loopback)
		return memcmp(g->raw, want, 16) == 0 ? rank : 0;
	/* Loopback on a configured device: any GID works, the address family's kind first. */
	return rank + (ss_gid_is_v4_mapped(g->raw) == want_v4 ? 3 : 0);
}

enum ss_sel_status ss_dev_select(const struct ss_dev_desc *devs, size_t n_devs,
				 const struct sockaddr *local, const struct ss_dev_override *ovr,
				 struct ss_dev_choice *choice_p)
{
	uint8_t want[16];
	bool loopback, dev_found = false, port_found = false;
	const struct ss_gid_desc *best = NULL;
	struct ss_dev_choice choice = {0};
	int best_rank = 0;

	if (!local || ss_addr_to_gid(local, want) < 0)
		return SS_SEL_BAD_ADDRESS;
	if (n_devs == 0)
		return SS_SEL_NO_DEVICE;
	loopback = ss_addr_is_loopback(local);
	if (loopback && !overridden_device(ovr))
		return SS_SEL_LOOPBACK;

	for (size_t d = 0; d < n_devs; d++) {
		if (overridden_device(ovr) && strcmp(devs[d].name, ovr->device) != 0)
			continue;
		dev_found = true;
		for (size_t p = 0; p < devs[d].n_ports; p++) {
			const struct ss_port_desc *port = &devs[d].ports[p];

			if (!port->active || (ovr && ovr->port && ovr->port != port->num))
				continue;
			port_found = true;
			for (size_t i = 0; i < port->n_gids; i++) {
				const struct ss_gid_desc *g = &port->gids[i];
				int rank;

				if (ovr && ovr->gid_index >= 0)
					rank = g->index == (unsigned)ovr->gid_index;
				else
					rank = gid_rank(g, want, loopback,
							ss_gid_is_v4_mapped(want));
				if (rank > best_rank) {
					best_rank = rank;
					best = g;
					choice.dev = d;
					choice.port = port->num;
				}
			}
		}
	}
	if (!dev_found)
		return overridden_device(ovr) ? SS_SEL_UNKNOWN_DEVICE : SS_SEL_NO_DEVICE;
	if (!port_found)
		return SS_SEL_NO_PORT;
	if (!best)
		return ovr && ovr->gid_index >= 0 ? SS_SEL_BAD_GID_INDEX : SS_SEL_NO_GID;

	choice.gid_index = best->index;
	choice.type = best->type;
	memcpy(choice.gid, best->raw, 16);
	*choice_p = choice;
	return SS_SEL_OK;
}

/* Everything read from one opened device, in the form ss_dev_select() takes. */
struct dev_scan {
	struct ibv_context *ctx;
	struct ss_port_desc *ports;
	struct ss_gid_desc *gids;
	int *mtus;
};

static void dev_scan_free(struct dev_scan *s)
{
	free(s->ports);
	free(s->gids);
	free(s->mtus);
	if (s->ctx)
		ibv_close_device(s->ctx);
	memset(s, 0, sizeof(*s));
}

static enum ss_gid_type gid_type_from_verbs(uint32_t t)
{
	switch (t) {
	case IBV_GID_TYPE_ROCE_V1: return SS_GID_ROCE_V1;
	case IBV_GID_TYPE_ROCE_V2: return SS_GID_ROCE_V2;
	default: return SS_GID_IB;
	}
}

/* Opens dev and reads its ports and GID table into *s; returns 0 or -errno. */
static int dev_scan(struct ibv_device *dev, struct dev_scan *s, struct ss_dev_desc *desc)
{
	struct ibv_device_attr attr;
	struct ibv_gid_entry *entries = NULL;
	size_t max_gids = 0;
	ssize_t n;
	int ret;

	memset(s, 0, sizeof(*s));
	s->ctx = ibv_open_device(dev);
	if (!s->ctx)
		return -(errno ? errno : ENODEV);
	ret = ibv_query_device(s->ctx, &attr);
	if (ret) {
		ret = -ret;
		goto err_free;
	}
	s->ports = calloc(attr.phys_port_cnt, sizeof(*s->ports));
	s->mtus = calloc(attr.phys_port_cnt, sizeof(*s->mtus));
	if (!s->ports || !s->mtus) {
		ret = -ENOMEM;
		goto err_free;
	}
	for (uint8_t p = 0; p < attr.phys_port_cnt; p++) {
		struct ibv_port_attr pa;

		s->ports[p].num = p + 1;
		if (ibv_query_port(s->ctx, p + 1, &pa) == 0) {
			s->ports[p].active = pa.state == IBV_PORT_ACTIVE;
			s->mtus[p] = pa.active_mtu;
			max_gids += pa.gid_tbl_len;
		}
	}
	entries = calloc(max_gids ? max_gids : 1, sizeof(*entries));
	s->gids = calloc(max_gids ? max_gids : 1, sizeof(*s->gids));
	if (!entries || !s->gids) {
		ret = -ENOMEM;
		goto err_free;
	}
	n = max_gids ? ibv_query_gid_table(s->ctx, entries, max_gids, 0) : 0;
	if (n < 0) {
		ret = (int)n;
		goto err_free;
	}
	/* Group the entries by port: each port's slice of s->gids is contiguous. */
	size_t used = 0;
	for (uint8_t p = 0; p < attr.phys_port_cnt; p++) {
		s->ports[p].gids = s->gids + used;
		for (ssize_t i = 0; i < n; i++) {
			if (entries[i].port_num != (uint32_t)p + 1)
				continue;
			memcpy(s->gids[used].raw, entries[i].gid.raw, 16);
			s->gids[used].index = (uint16_t)entries[i].gid_index;
			s->gids[used].type = gid_type_from_verbs(entries[i].gid_type);
			used++;
			s->ports[p].n_gids++;
		}
	}
	free(entries);
	desc->name = ibv_get_device_name(dev);
	desc->ports = s->ports;
	desc->n_ports = attr.phys_port_cnt;
	return 0;

err_free:
	free(entries);
	dev_scan_free(s);
	return ret;
}

int ss_device_open_for_addr(const struct sockaddr *local, const struct ss_dev_override *ovr,
			    struct ss_device **dev_p, enum ss_sel_status *status_p)
{
	struct ibv_device **list;
	struct dev_scan *scans = NULL;
	struct ss_dev_desc *descs = NULL;
	struct ss_dev_choice choice;
	enum ss_sel_status status = SS_SEL_NO_DEVICE;
	struct ss_device *dev;
	size_t n_descs = 0;
	int n_list = 0, ret = -ENODEV;

	list = ibv_get_device_list(&n_list);
	if (!list) {
		/* No verbs kernel support at all reads as "no device". */
		n_list = 0;
	}
	if (n_list > 0) {
		scans = calloc((size_t)n_list, sizeof(*scans));
		descs = calloc((size_t)n_list, sizeof(*descs));
		if (!scans || !descs) {
			ret = -ENOMEM;
			goto out;
		}
	}
	for (int i = 0; i < n_list; i++) {
		int err = dev_scan(list[i], &scans[n_descs], &descs[n_descs]);

		if (err < 0) {
			ss_log_debug("device %s: cannot query: %s", ibv_get_device_name(list[i]),
				     strerror(-err));
			continue;
		}
		n_descs++;
	}

	status = ss_dev_select(descs, n_descs, local, ovr, &choice);
	if (status != SS_SEL_OK) {
		ret = -ENODEV;
		goto out;
	}
	dev = calloc(1, sizeof(*dev));
	if (!dev) {
		ret = -ENOMEM;
		goto out;
	}
	dev->ctx = scans[choice.dev].ctx;
	scans[choice.dev].ctx = NULL; /* kept open: ownership moves to dev */
	snprintf(dev->name, sizeof(dev->name), "%s", descs[choice.dev].name);
	dev->port = choice.port;
	dev->gid_index = choice.gid_index;
	memcpy(dev->gid, choice.gid, 16);
	dev->gid_type = choice.type;
	dev->active_mtu = scans[choice.dev].mtus[choice.port - 1];
	*dev_p = dev;
	ret = 0;
out:
	for (size_t i = 0; i < n_descs; i++)
		dev_scan_free(&scans[i]);
	free(scans);
	free(descs);
	if (list)
		ibv_free_device_list(list);
	if (status_p)
		*status_p = status;
	return ret;
}

void ss_device_close(struct ss_device *dev)
{
	if (!dev)
		return;
	ibv_close_device(dev->ctx);
	free(dev);
}
