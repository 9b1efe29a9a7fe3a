/*
 * A client connection that starts on TCP (SRQSHIM_START=tcp; docs/design.md,
 * "Connections that start on TCP"). The application's fd stays its own TCP socket: no
 * QP, no socketpair. The HELLO (capability SS_CAP_LATE) goes out as soon
 * as TCP is connected; the application's writes are held until the
 * server's answer is taken off the head of the stream, and its reads wait
 * for it. LATER (or DECLINE, or an ACCEPT we decline) ends it: the held
 * bytes go to TCP, then the socket is plain. A server that turns out plain
 * (foreign bytes, its end, or silence until the deadline) gets the probe
 * connection aborted and a plain one made, as in client.c: our socketpair
 * goes on the application's fd first, so that RECONNECTING runs as there.
 *
 * Whoever comes first moves it on, under the socket's lock: the
 * application's calls on it (io.c), its close (close.c), or the progress
 * thread: SS_NUDGE_MS after the connect it looks itself, and from then on
 * watches a private name of the socket (tcp_fd) for the connect's end and
 * the answer. An application that calls meanwhile (the usual write, then a
 * wait for the reply) finishes it alone: no wake-up of that thread.
 */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include "shim/real.h"
#include "shim/shim.h"
#include "transport/log.h"

/* How often the progress thread looks for the answer of a socket shut for reading. */
#define ASKING_SHUT_LOOK_MS 5

/* The HELLO of a connection that starts on TCP: no QP is made for it. */
static struct ss_msg asking_hello(uint32_t nonce)
{
	return (struct ss_msg){
		.type = SS_MSG_HELLO,
		.nonce = nonce,
		.params =
			{
				.caps = SS_CAP_DATA_V1 | SS_CAP_LATE,
				.recv_mode = ss_cfg.mode == SS_MODE_RQ ? SS_RECV_RQ : SS_RECV_SRQ,
				.mtu = 1,
				.qpn = 1, /* the GSI QP's number: never an RC QP's */
				.buf_size = (uint32_t)ss_cfg.buf_size,
				.window = 1,
			},
	};
}

/* Part of an answer taken before the rest came: of no use once the socket leaves ASKING. */
static void asking_drop_part(struct ss_sock *s)
{
	free(s->answer_part);
	s->answer_part = NULL;
}

/* Plain from here: the application's fd is the TCP socket already. */
static void asking_plain(struct ss_sock *s, enum ss_reason why)
{
	asking_drop_part(s);
	free(s->hold);
	s->hold = NULL;
	s->hold_len = 0;
	/* LATER: on TCP for now; it may move once it is worth it (moving.c). */
	if (why == SS_REASON_LATER && ss_move_enter(s, s->tcp_fd, true, s->nonce) == SS_REASON_NONE)
		return;
	ss_bg_stop_private(s);
	ss_become_plain(s, why);
}

/*
 * Answered: the held bytes go to TCP (as much as it takes now), then a held
 * shutdown. Returns true while bytes are left.
 */
static bool asking_flush(struct ss_sock *s)
{
	int err = ss_hold_to_tcp(s);

	if (err == -EAGAIN) {
		/* The rest as the socket drains, whether or not the application calls. */
		ss_bg_watch(s, EPOLLOUT);
		return true;
	}
	if (err)
		/* The application is told, as by TCP: no warning of ours on its stderr. */
		ss_log_info("fd %d: %zu held bytes not sent: %s", s->fds[0], s->hold_len,
			    strerror(err));
	ss_flush_end(s, err);
	asking_plain(s, s->reason);
	return false;
}

/* The server is not ours to keep talking to: a plain connection replaces this one. */
static void asking_reconnect(struct ss_sock *s, enum ss_reason why)
{
	/*
	 * Our socketpair goes on the application's names first, unless it
	 * closed them (its bytes are delivered in the background).
	 */
	asking_drop_part(s);
	if (s->n_fds == 0 || ss_enter_pair(s) == 0) {
		ss_client_reconnect(s, why);
		return;
	}
	/*
	 * No socketpair (no fds left): the server saw our HELLO, so the stream
	 * cannot go on (and the bytes taken as no answer, at most a message
	 * header's 16, are gone from its head: docs/design.md).
	 */
	ss_log_error("fd %d: cannot reconnect after the server's plain answer: the connection "
		     "is shut",
		     s->fds[0]);
	ss_real.shutdown(s->tcp_fd, SHUT_RDWR);
	asking_plain(s, why);
}

/*
 * Takes the server's answer, if it is there: without a peek (ss_hs_take),
 * since bytes that are no answer end this connection anyway (a plain
 * connection replaces it), and part of an answer waits in answer_part
 * while the socket shows nothing more.
 */
static void asking_answers(struct ss_sock *s)
{
	struct ss_msg m;

	for (;;) {
		enum ss_hs_read_result rr =
			ss_hs_take(&ss_real_io, s->tcp_fd, &s->answer_part, &m, NULL);
		bool ours = rr == SS_HSR_MSG && m.nonce == s->nonce;

		s->looked_empty = rr == SS_HSR_TIMEOUT;
		/* The end of our own SHUT_RD is no answer (its fd shows it at once, as TCP's). */
		if (rr == SS_HSR_TIMEOUT || (rr == SS_HSR_EOF && ss_read_end_is_ours(s, s->tcp_fd)))
			return;
		if (ours && m.type == SS_MSG_ACK) {
			/* A server that acknowledges (it ignores bit 3): the acknowledged wait. */
			s->deadline = ss_deadline_in(ss_cfg.acked_timeout_ms);
			continue;
		}
		if (ours && (m.type == SS_MSG_LATER || m.type == SS_MSG_DECLINE ||
			     m.type == SS_MSG_ACCEPT)) {
			ss_client_record(s, SS_DEST_SHIMMED);
			if (m.type == SS_MSG_ACCEPT) {
				/* A server that ignores the capability: it falls back on our word.
				 */
				struct ss_msg d = {.type = SS_MSG_DECLINE,
						   .nonce = s->nonce,
						   .reason = SS_REASON_POLICY};

				ss_send_msg(s->tcp_fd, &d, 1000);
			}
			s->reason =
				m.type == SS_MSG_LATER ? SS_REASON_LATER : SS_REASON_PEER_DECLINED;
			s->answered = true;
			asking_flush(s);
			return;
		}
		/* Its own bytes, its end, or a message that is not an answer: a plain server. */
		ss_log_info("fd %d: the server did not answer the HELLO: connecting again",
			    s->fds[0]);
		if (rr == SS_HSR_MSG || rr == SS_HSR_BAD) {
			ss_client_record(s, SS_DEST_UNKNOWN);
			asking_reconnect(s, SS_REASON_MALFORMED);
		} else {
			ss_client_record(s, SS_DEST_PLAIN);
			asking_reconnect(s, SS_REASON_PEER_PLAIN);
		}
		return;
	}
}

short ss_asking_events(const struct ss_sock *s)
{
	if (!s->hello_sent || s->answered)
		return POLLOUT;
	/*
	 * The end of our own SHUT_RD shows POLLIN always: the caller's slice
	 * is the wait (the progress thread's, ASKING_SHUT_LOOK_MS:
	 * ss_asking_step). Part of the answer is taken (answer_part): the
	 * socket shows POLLIN again when more comes.
	 */
	return atomic_load(&s->shut_rd) ? 0 : POLLIN;
}

/*
 * The HELLO, TCP being connected. Its wait is read off the coarse clock,
 * a tick's slack added (never shorter than asked, a tick longer at most);
 * the four round trips a slow path adds are asked for only if the wait
 * runs out (asking_rtt_grace).
 */
static void asking_send_hello(struct ss_sock *s)
{
	struct ss_msg hello;

	s->nonce = ss_new_nonce();
	hello = asking_hello(s->nonce);
	ss_test_delay(SS_TP_CLIENT_HELLO);
	ss_send_msg(s->tcp_fd, &hello, 0); /* an empty socket takes it whole */
	s->hello_sent = true;
	s->looked_empty = true; /* the answer is a round trip away */
	/* A destination seen shimmed answers once its server accepts: the longer wait. */
	s->deadline =
		ss_now_coarse_ms() + ss_coarse_slack_ms() +
		(uint64_t)(s->dest_shimmed ? ss_cfg.acked_timeout_ms : ss_cfg.hello_timeout_ms);
	ss_bg_kick(s, s->deadline);
}

/* The HELLO's wait ran out: once, it grows by four of the connection's round trips. */
static bool asking_rtt_grace(struct ss_sock *s)
{
	if (s->rtt_waited)
		return false;
	s->rtt_waited = true;
	s->deadline += 4 * (uint64_t)ss_rtt_ms(s->tcp_fd);
	return ss_before_ms(s->deadline);
}

bool ss_asking_step(struct ss_sock *s)
{
	if (ss_sock_state(s) != SS_SOCK_ASKING)
		return false;
	if (s->answered)
		return asking_flush(s);
	if (!s->hello_sent) {
		struct pollfd p = {.fd = s->tcp_fd, .events = POLLOUT};

		if (ss_real.poll(&p, 1, 0) <= 0)
			return true;
		if ((p.revents & (POLLERR | POLLHUP)) || s->shut_early) {
			ss_client_reset_lost_hold(s);
			/*
			 * The connect failed (its error stays pending for the
			 * application), or it was shut while connecting.
			 */
			ss_client_record(s, SS_DEST_UNKNOWN);
			asking_plain(s, SS_REASON_NONE);
			return false;
		}
		asking_send_hello(s);
		/* Its answer is a round trip away: looked for at the next call, the watch or the
		 * nudge. */
		if (!atomic_load(&s->shut_rd))
			return true;
	}
	asking_answers(s);
	if (ss_sock_state(s) != SS_SOCK_ASKING)
		return ss_sock_state(s) == SS_SOCK_RECONNECTING;
	if (s->answered)
		return true;
	if (ss_before_ms(s->deadline) || asking_rtt_grace(s)) {
		/* A nudge that came first did not keep the deadline (a kick only moves earlier). */
		ss_bg_kick(s, s->deadline);
		if (atomic_load(&s->shut_rd))
			ss_bg_kick(s, ss_deadline_in(ASKING_SHUT_LOOK_MS)); /* no POLLIN to watch */
		return true;
	}
	/* Silence: a plain server waiting for us to speak, or one that never accepts. */
	ss_log_info("fd %d: no answer to the HELLO in time: connecting again", s->fds[0]);
	ss_client_record(s, SS_DEST_PLAIN);
	asking_reconnect(s, SS_REASON_PEER_PLAIN);
	return ss_sock_state(s) == SS_SOCK_RECONNECTING;
}

int ss_asking_connect(struct ss_sock *s, int fd)
{
	int err, ret;

	s->hold_max = SS_HOLD_MAX;
	ss_sock_set_state(s, SS_SOCK_ASKING);
	/*
	 * The application's own socket: a blocking connect waits in the
	 * kernel, as TCP's, without our lock (another thread's shutdown or
	 * close, or a signal handler's call, must not wait for it); the calls
	 * meanwhile find ASKING with its connect not ended.
	 */
	pthread_mutex_unlock(&s->lock);
	ret = ss_real.connect(fd, (struct sockaddr *)&s->dst, s->dst_len);
	err = errno;
	pthread_mutex_lock(&s->lock);
	if (ret == 0) {
		/*
		 * Connected: the HELLO at once, and no look for its answer yet
		 * (it is a round trip away): the application's next call, or
		 * the nudge.
		 */
		s->reported = true;
		if (ss_sock_state(s) == SS_SOCK_ASKING && !s->hello_sent && !s->shut_early)
			asking_send_hello(s);
		else if (!ss_asking_step(s))
			return 0;
		ss_bg_kick(s, ss_nudge_at(ss_now_coarse_ms()));
		return 0;
	}
	if (err == EINPROGRESS || err == EINTR) {
		/* It goes on in the background: the application's next call, or the nudge. */
		ss_bg_kick(s, ss_nudge_at(ss_now_coarse_ms()));
		return -err;
	}
	if (ss_sock_state(s) == SS_SOCK_ASKING) {
		ss_client_record(s, SS_DEST_UNKNOWN);
		asking_plain(s, SS_REASON_NONE);
	}
	return -err;
}

/*
 * Ends s's negotiation if it is ASKING, in the caller's thread: the answer
 * and the held bytes, waited for in slices (the progress thread may finish
 * it meanwhile) until end (ms).
 */
static void asking_finish_until(struct ss_sock *s, uint64_t end)
{
	pthread_mutex_lock(&s->lock);
	while (ss_sock_state(s) == SS_SOCK_ASKING && ss_asking_step(s) && ss_now_ms() < end) {
		struct pollfd p = {.fd = s->tcp_fd, .events = ss_asking_events(s)};

		pthread_mutex_unlock(&s->lock);
		ss_real.poll(&p, 1, 10);
		pthread_mutex_lock(&s->lock);
	}
	pthread_mutex_unlock(&s->lock);
}

void ss_asking_finish(struct ss_sock *s)
{
	asking_finish_until(s, UINT64_MAX); /* the asking's own deadline ends it */
}

static uint64_t asking_finish_end; /* ss_asking_finish_all's, for its callback */
static void asking_finish_one(struct ss_sock *s)
{
	asking_finish_until(s, asking_finish_end);
}

void ss_asking_finish_all(void)
{
	/* A handler that interrupted a shim call may fork: that call may hold a socket's lock. */
	if (ss_in_call)
		return;
	asking_finish_end = ss_deadline_in(ss_cfg.linger_ms);
	ss_sock_for_each_held(asking_finish_one);
}
