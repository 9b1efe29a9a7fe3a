/*
 * Verbs smoke test on a real device: through the transport's device
 * selection, open the device, make a PD, a CQ with a completion channel, two
 * RC QPs connected to each other, and exchange SEND-with-immediate messages
 * both ways with every byte checked; once with receives on an SRQ, once on
 * each QP's own receive queue. Exits 77 (skip) when the host has no RDMA
 * device at all.
 */
#include <errno.h>
#include <ifaddrs.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>
#include <cmocka.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>

#include "shim/config.h"
#include "transport/device.h"
#include "transport/qp.h"

enum {
	N_MSGS = 24,     /* per direction */
	BUF_SIZE = 4096, /* receive buffer; larger than rxe's MTU of 1024 */
	N_RECV = 2 * N_MSGS,
	MAX_INLINE = 64,
};

/* Message sizes cycle through: empty, inline, one packet, several packets. */
static const uint32_t msg_sizes[] = {0, 1, 63, 64, 65, 1000, 1024, 1025, 3000, BUF_SIZE};

static struct ss_device *dev;

static uint8_t pattern_byte(int dir, int seq, size_t i)
{
	return (uint8_t)(dir * 131 + seq * 7 + i * 13 + (i >> 8));
}

static uint32_t msg_size(int seq)
{
	return msg_sizes[seq % (sizeof(msg_sizes) / sizeof(msg_sizes[0]))];
}

struct side {
	struct ibv_qp *qp;
	uint32_t psn;
	int dir;
};

struct rig {
	struct ibv_pd *pd;
	struct ibv_comp_channel *ch;
	struct ibv_cq *cq;
	struct ibv_srq *srq;
	struct ibv_mr *mr;
	uint8_t *mem; /* N_RECV receive buffers, then 2 send buffers */
	struct side s[2];
};

static void post_recv(struct rig *r, int slot)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)(r->mem + (size_t)slot * BUF_SIZE),
		.length = BUF_SIZE,
		.lkey = r->mr->lkey,
	};
	struct ibv_recv_wr *bad;
	struct ibv_recv_wr wr = {.wr_id = (uint64_t)slot, .sg_list = &sge, .num_sge = 1};

	if (r->srq)
		assert_int_equal(ibv_post_srq_recv(r->srq, &wr, &bad), 0);
	else /* private RQ: the first half of the slots for side 0, the rest for side 1 */
		assert_int_equal(ibv_post_recv(r->s[slot / N_MSGS].qp, &wr, &bad), 0);
}

/* Waits on the completion channel, then drains the CQ into wc; returns the count. */
static int wait_completions(struct rig *r, struct ibv_wc *wc, int max)
{
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	int n;

	for (;;) {
		n = ibv_poll_cq(r->cq, max, wc);
		assert_true(n >= 0);
		if (n > 0)
			return n;
		assert_int_equal(ibv_req_notify_cq(r->cq, 0), 0);
		n = ibv_poll_cq(r->cq, max, wc); /* closes the race with the re-arm */
		assert_true(n >= 0);
		if (n > 0)
			return n;
		struct pollfd pfd = {.fd = r->ch->fd, .events = POLLIN};
		int pr = poll(&pfd, 1, 60000);
		assert_int_equal(pr, 1); /* generous: the guest is slow */
		assert_int_equal(ibv_get_cq_event(r->ch, &ev_cq, &ev_ctx), 0);
		assert_ptr_equal(ev_cq, r->cq);
		ibv_ack_cq_events(ev_cq, 1);
	}
}

static void exchange(bool use_srq)
{
	struct rig r = {0};
	struct ss_qp_caps caps = {.sq_depth = 64, .rq_depth = N_MSGS, .max_inline = MAX_INLINE};
	size_t mem_len = (size_t)(N_RECV + 2) * BUF_SIZE;
	int got_recv[2] = {0, 0}, got_send = 0;
	uint64_t bytes_checked = 0;

	r.pd = ibv_alloc_pd(dev->ctx);
	assert_non_null(r.pd);
	r.ch = ibv_create_comp_channel(dev->ctx);
	assert_non_null(r.ch);
	r.cq = ibv_create_cq(dev->ctx, 4 * N_RECV, NULL, r.ch, 0);
	assert_non_null(r.cq);
	if (use_srq) {
		struct ibv_srq_init_attr sa = {.attr = {.max_wr = N_RECV, .max_sge = 1}};
		r.srq = ibv_create_srq(r.pd, &sa);
		assert_non_null(r.srq);
	}
	r.mem = aligned_alloc(4096, mem_len);
	assert_non_null(r.mem);
	memset(r.mem, 0, mem_len);
	/* Local write only: nothing here is exposed to the peer. */
	r.mr = ibv_reg_mr(r.pd, r.mem, mem_len, IBV_ACCESS_LOCAL_WRITE);
	assert_non_null(r.mr);

	for (int i = 0; i < 2; i++) {
		r.s[i].dir = i;
		assert_int_equal(ss_qp_create_rc(r.pd, r.cq, r.cq, r.srq, &caps, NULL, &r.s[i].qp),
				 0);
		assert_int_equal(ss_qp_init(r.s[i].qp, dev), 0);
		assert_int_equal(ss_random_psn(&r.s[i].psn), 0);
	}
	for (int slot = 0; slot < N_RECV; slot++)
		if (use_srq)
			post_recv(&r, slot);
	for (int i = 0; i < 2; i++) {
		struct ss_qp_peer peer = {
			.qpn = r.s[!i].qp->qp_num, .psn = r.s[!i].psn, .mtu = dev->active_mtu};
		memcpy(peer.gid, dev->gid, 16);
		assert_int_equal(ss_qp_connect(r.s[i].qp, dev, &peer, r.s[i].psn), 0);
	}
	if (!use_srq)
		for (int slot = 0; slot < N_RECV; slot++)
			post_recv(&r, slot);

	/* Alternate directions; each send waits for its own completion. */
	for (int seq = 0; seq < N_MSGS; seq++) {
		for (int dir = 0; dir < 2; dir++) {
			uint8_t *buf = r.mem + (size_t)(N_RECV + dir) * BUF_SIZE;
			uint32_t len = msg_size(seq + dir);
			struct ibv_sge sge = {
				.addr = (uintptr_t)buf, .length = len, .lkey = r.mr->lkey};
			struct ibv_send_wr *bad;
			struct ibv_send_wr wr = {
				.wr_id = (uint64_t)(dir << 16 | seq),
				.sg_list = &sge,
				.num_sge = len ? 1 : 0,
				.opcode = IBV_WR_SEND_WITH_IMM,
				.send_flags = IBV_SEND_SIGNALED |
					      (len <= MAX_INLINE ? IBV_SEND_INLINE : 0),
				.imm_data = htonl((uint32_t)(dir << 16 | seq)),
			};

			for (size_t i = 0; i < len; i++)
				buf[i] = pattern_byte(dir, seq, i);
			assert_int_equal(ibv_post_send(r.s[dir].qp, &wr, &bad), 0);

			/* Both the send and the peer's receive must complete, in either order. */
			int want_recv = got_recv[!dir] + 1, want_send = got_send + 1;
			while (got_recv[!dir] < want_recv || got_send < want_send) {
				struct ibv_wc wc[8];
				int n = wait_completions(&r, wc, 8);

				for (int k = 0; k < n; k++) {
					assert_int_equal(wc[k].status, IBV_WC_SUCCESS);
					if (wc[k].opcode == IBV_WC_SEND) {
						assert_int_equal(wc[k].wr_id, dir << 16 | seq);
						got_send++;
						continue;
					}
					assert_int_equal(wc[k].opcode, IBV_WC_RECV);
					assert_true(wc[k].wc_flags & IBV_WC_WITH_IMM);
					assert_int_equal(ntohl(wc[k].imm_data), dir << 16 | seq);
					assert_int_equal(wc[k].qp_num, r.s[!dir].qp->qp_num);
					assert_int_equal(wc[k].byte_len, len);
					const uint8_t *rb = r.mem + wc[k].wr_id * BUF_SIZE;
					for (size_t i = 0; i < len; i++)
						assert_int_equal(rb[i], pattern_byte(dir, seq, i));
					bytes_checked += len;
					got_recv[!dir]++;
				}
			}
		}
	}
	assert_int_equal(got_recv[0], N_MSGS);
	assert_int_equal(got_recv[1], N_MSGS);
	printf("rdma_smoke: %s: %d+%d SEND_WITH_IMM messages exchanged on QPs %u<->%u, %llu bytes "
	       "checked\n",
	       use_srq ? "SRQ" : "private RQ", N_MSGS, N_MSGS, r.s[0].qp->qp_num, r.s[1].qp->qp_num,
	       (unsigned long long)bytes_checked);

	for (int i = 0; i < 2; i++)
		assert_int_equal(ibv_destroy_qp(r.s[i].qp), 0);
	if (r.srq)
		assert_int_equal(ibv_destroy_srq(r.srq), 0);
	assert_int_equal(ibv_dereg_mr(r.mr), 0);
	free(r.mem);
	assert_int_equal(ibv_destroy_cq(r.cq), 0);
	assert_int_equal(ibv_destroy_comp_channel(r.ch), 0);
	assert_int_equal(ibv_dealloc_pd(r.pd), 0);
}

static void test_srq_exchange(void **state)
{
	(void)state;
	exchange(true);
}

static void test_private_rq_exchange(void **state)
{
	(void)state;
	exchange(false);
}

/*
 * Finds a device through the transport's selection: the configured device (so
 * loopback works), else the first local address with an RDMA GID. Returns 0,
 * 77 when the host has no RDMA device, 1 when devices exist but none fits.
 */
static int find_device(void)
{
	struct ss_config cfg;
	struct ss_dev_override ovr;
	struct ifaddrs *ifa_list;
	enum ss_sel_status status = SS_SEL_NO_DEVICE;
	char text[INET6_ADDRSTRLEN];

	ss_config_load(&cfg, ss_config_getenv, NULL, NULL, NULL);
	ovr = (struct ss_dev_override){cfg.device, (unsigned)cfg.port, cfg.gid_index};
	if (getifaddrs(&ifa_list) != 0) {
		perror("getifaddrs");
		return 1;
	}
	for (struct ifaddrs *ifa = ifa_list; ifa; ifa = ifa->ifa_next) {
		const struct sockaddr *a = ifa->ifa_addr;

		if (!a || (a->sa_family != AF_INET && a->sa_family != AF_INET6))
			continue;
		if (ss_device_open_for_addr(a, &ovr, &dev, &status) == 0) {
			const void *ip =
				a->sa_family == AF_INET
					? (const void *)&((const struct sockaddr_in *)a)->sin_addr
					: (const void *)&((const struct sockaddr_in6 *)a)
						  ->sin6_addr;
			inet_ntop(a->sa_family, ip, text, sizeof(text));
			printf("rdma_smoke: address %s (%s) -> device %s port %u GID index %u "
			       "(%s), "
			       "MTU %d\n",
			       text, ifa->ifa_name, dev->name, dev->port, dev->gid_index,
			       dev->gid_type == SS_GID_ROCE_V2 ? "RoCE v2" : "RoCE v1/IB",
			       128 << dev->active_mtu);
			break;
		}
		if (status == SS_SEL_NO_DEVICE)
			break;
	}
	freeifaddrs(ifa_list);
	if (dev)
		return 0;
	if (status == SS_SEL_NO_DEVICE) {
		printf("rdma_smoke: no RDMA device on this host; skipping\n");
		return 77;
	}
	fprintf(stderr, "rdma_smoke: RDMA devices exist but none serves a local address: %s\n",
		ss_sel_status_str(status));
	return 1;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_srq_exchange),
		cmocka_unit_test(test_private_rq_exchange),
	};
	int ret = find_device();

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (ret)
		return ret;
	ret = cmocka_run_group_tests(tests, NULL, NULL);
	ss_device_close(dev);
	return ret;
}
