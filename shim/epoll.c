/*
 * Shadows of the application's epoll instances (epoll.h). Locks: a
 * socket's fd_lock comes before an instance's lock (the connection's
 * readiness hook holds the connection's lock, takes fd_lock to walk the
 * socket's registrations and each instance's lock to queue them); neither
 * is held across a transport call or a blocking system call.
 *
 * A registration (struct ss_epreg) is in its socket's list and, while the
 * shadow answers it ("fast"), in its instance's list; each list holds a
 * reference, and the registration holds one on its socket.
 */
#include "shim/epoll.h"

#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "shim/ready.h"
#include "shim/real.h"
#include "shim/shim.h"
#include "transport/log.h"

/* The shim's own entries in an instance's kernel set carry this in their data. */
#define EP_MAGIC     0x5352514d00000000ull /* "SRQM" */
#define EP_MAGIC_MSK 0xffffffff00000000ull
enum { EP_WAKE = 1, EP_CHANNEL = 2 };
/* Most channels an instance watches (one per device). */
#define EP_MAX_CHANNELS 8
/* A kernel check for the other fds at least every this many calls that found events, */
#define EP_OS_EVERY 8
/* and every this many rounds of a spin. */
#define EP_OS_SPIN_EVERY 16

struct ss_epreg {
	struct ss_epreg *s_next;          /* the socket's list (fd_lock) */
	struct ss_epreg *e_next, *e_prev; /* the instance's list (its lock), fast only */
	struct ss_epreg *r_next;          /* the instance's ready list (its lock) */
	struct ss_ep *ep;                 /* NULL: an instance we did not make (named by epfd) */
	struct ss_sock *s;                /* a reference */
	atomic_int refs;
	int epfd, fd;
	struct epoll_event ev;
	uint32_t edge;    /* ET: events that rose since the last report */
	atomic_bool fast; /* the shadow answers it (not in the kernel set); set under the instance's
			     lock, read also under fd_lock alone */
	bool queued;      /* on the ready list */
	bool disabled;    /* EPOLLONESHOT fired; until EPOLL_CTL_MOD */
	bool mirror;      /* holds a mirror reference: the kernel answers it while upgraded */
};

struct ss_ep {
	pthread_mutex_t lock;
	atomic_int mem;  /* its memory: one for the instance while it lives, one per registration */
	atomic_int refs; /* names of the instance, and waits in progress */
	int epfd;        /* the number it was made on: for messages */
	/*
	 * The shim's own kernel calls on the instance go to this private
	 * duplicate (ep_kernel_ctl), closed when the last name is: the
	 * application may close the number it made it on while a dup lives,
	 * and another file may get that number. An instance for which none
	 * could be made is not ours (ss_epoll_created).
	 */
	int kfd;
	unsigned fork_gen;              /* ss_epoll_after_fork's visit */
	struct ss_epreg *regs;          /* fast registrations */
	struct ss_epreg *rhead, *rtail; /* ready list */
	int sleepers;
	int unarmed;       /* sleepers that found nothing fast (ep_wait_unarmed) */
	bool wake_pending; /* the wake-up fd is written and not drained yet */
	atomic_bool dead;  /* its last name was closed (set under lock) */
	bool kernel_only;  /* nested or polled: nothing answered in user space */
	int wake_fd;
	unsigned chan_gen; /* the worker's device count when its channels were added (0: none) */
	bool wake_added;
	unsigned found_calls;
	/* Registrations in the kernel set, ours or not (ep_count_kernel; closes go unseen). */
	atomic_int n_kernel;
	atomic_int blind_sleepers; /* threads in a kernel wait that no wake-up fd reaches */
};

/* ---- the table of instances, by fd number ---- */

static _Atomic(struct ss_ep *) *ep_table;
static int ep_table_len;
static pthread_mutex_t ep_table_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t ep_table_once = PTHREAD_ONCE_INIT;

static void ep_table_init(void)
{
	int len = ss_sock_table_size();
	void *m;

	if (len <= 0)
		return;
	m = mmap(NULL, (size_t)len * sizeof(*ep_table), PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (m == MAP_FAILED)
		return;
	ep_table = m;
	ep_table_len = len;
}

static bool ep_table_ready(void)
{
	pthread_once(&ep_table_once, ep_table_init);
	return ep_table != NULL;
}

/* The instance fd names, with a reference; NULL if none. */
static struct ss_ep *ep_get(int fd)
{
	struct ss_ep *e;

	if (fd < 0 || !ep_table_ready() || fd >= ep_table_len ||
	    !atomic_load_explicit(&ep_table[fd], memory_order_acquire))
		return NULL;
	pthread_mutex_lock(&ep_table_lock);
	e = atomic_load_explicit(&ep_table[fd], memory_order_relaxed);
	if (e)
		atomic_fetch_add(&e->refs, 1);
	pthread_mutex_unlock(&ep_table_lock);
	return e;
}

static void ep_mem_put(struct ss_ep *e);

static void epreg_put(struct ss_epreg *r)
{
	if (atomic_fetch_sub(&r->refs, 1) != 1)
		return;
	ss_sock_put(r->s);
	ep_mem_put(r->ep); /* r->ep stays readable (dead, maybe) as long as r lives */
	free(r);
}

/* Removes r from its instance's lists; the instance's lock held. */
static void ep_unlink_locked(struct ss_ep *e, struct ss_epreg *r)
{
	if (r->queued) {
		struct ss_epreg **pp = &e->rhead, *prev = NULL;

		for (; *pp && *pp != r; prev = *pp, pp = &(*pp)->r_next)
			;
		if (*pp) {
			*pp = r->r_next;
			if (e->rtail == r)
				e->rtail = prev;
		}
		r->queued = false;
	}
	if (r->e_prev)
		r->e_prev->e_next = r->e_next;
	else
		e->regs = r->e_next;
	if (r->e_next)
		r->e_next->e_prev = r->e_prev;
	r->e_next = r->e_prev = NULL;
}

/* The instance's last name closed: it is dead, its registrations leave their sockets. */
static void ep_free(struct ss_ep *e)
{
	struct ss_epreg *r, *list = NULL;

	/* Its registrations leave their sockets: collected first (never fd_lock under ours). */
	pthread_mutex_lock(&e->lock);
	atomic_store(&e->dead, true);
	while ((r = e->regs)) {
		ep_unlink_locked(e, r);
		r->fast = false;
		r->e_next = list;
		list = r;
	}
	pthread_mutex_unlock(&e->lock);
	while ((r = list)) {
		struct ss_sock *s = r->s;

		list = r->e_next;
		pthread_mutex_lock(&s->fd_lock);
		for (struct ss_epreg **pp = &s->epregs; *pp; pp = &(*pp)->s_next)
			if (*pp == r) {
				*pp = r->s_next;
				epreg_put(r); /* the socket list's */
				break;
			}
		pthread_mutex_unlock(&s->fd_lock);
		epreg_put(r); /* the instance list's */
	}
	if (e->wake_fd >= 0)
		ss_private_close(e->wake_fd);
	e->wake_fd = -1;
	/* After dead was set under the lock: nobody calls the kernel on kfd any more. */
	ss_private_close(e->kfd);
	ep_mem_put(e); /* the instance's: registrations still on sockets keep the memory */
}

static void ep_mem_put(struct ss_ep *e)
{
	if (e && atomic_fetch_sub(&e->mem, 1) == 1) {
		pthread_mutex_destroy(&e->lock);
		free(e);
	}
}

static void ep_put(struct ss_ep *e)
{
	if (e && atomic_fetch_sub(&e->refs, 1) == 1)
		ep_free(e);
}

void ss_epoll_created(int epfd)
{
	struct ss_ep *e, *old;
	int kfd;

	if (epfd < 0 || !ep_table_ready() || epfd >= ep_table_len)
		return;
	kfd = ss_private_fd(epfd);
	if (kfd < 0 || !(e = calloc(1, sizeof(*e)))) {
		/* The kernel answers it all, as an instance made before the shim loaded. */
		ss_log_warn("epoll %d: no memory or fd for the shim's own: answered by the kernel",
			    epfd);
		if (kfd >= 0)
			ss_private_close(kfd);
		e = NULL;
	} else {
		pthread_mutex_init(&e->lock, NULL);
		atomic_init(&e->refs, 1);
		atomic_init(&e->mem, 1);
		atomic_init(&e->dead, false);
		e->epfd = epfd;
		e->kfd = kfd;
		e->wake_fd = -1;
	}
	pthread_mutex_lock(&ep_table_lock);
	old = atomic_exchange(&ep_table[epfd], e);
	pthread_mutex_unlock(&ep_table_lock);
	ep_put(old); /* a stale entry whose fd was closed behind our back */
}

void ss_epoll_closed(int fd)
{
	struct ss_ep *e;

	if (fd < 0 || !ep_table_ready() || fd >= ep_table_len ||
	    !atomic_load_explicit(&ep_table[fd], memory_order_acquire))
		return;
	pthread_mutex_lock(&ep_table_lock);
	e = atomic_exchange(&ep_table[fd], NULL);
	pthread_mutex_unlock(&ep_table_lock);
	ep_put(e);
}

void ss_epoll_dup(int oldfd, int newfd)
{
	struct ss_ep *e = ep_get(oldfd), *old;

	if (!e)
		return;
	if (newfd < 0 || newfd >= ep_table_len) {
		ep_put(e);
		return;
	}
	pthread_mutex_lock(&ep_table_lock);
	old = atomic_exchange(&ep_table[newfd], e); /* our reference goes to the new name */
	pthread_mutex_unlock(&ep_table_lock);
	ep_put(old);
}

bool ss_epoll_is_ours(int fd)
{
	return fd >= 0 && ep_table && fd < ep_table_len &&
	       atomic_load_explicit(&ep_table[fd], memory_order_acquire) != NULL;
}

void ss_epoll_after_fork(void)
{
	static unsigned gen; /* the child is one thread here */

	gen++;
	pthread_mutex_init(&ep_table_lock, NULL);
	for (int fd = 0; ep_table && fd < ep_table_len; fd++) {
		struct ss_ep *e = atomic_load_explicit(&ep_table[fd], memory_order_relaxed);

		/* Once per instance, whichever of its names comes first. */
		if (!e || e->fork_gen == gen)
			continue;
		e->fork_gen = gen;
		pthread_mutex_init(&e->lock, NULL);
		/* The parent's sleepers are not here; its token may be taken by it. */
		e->sleepers = 0;
		e->unarmed = 0;
		e->wake_pending = false;
		atomic_store(&e->blind_sleepers, 0);
	}
}

/* ---- readiness into the ready list ---- */

/* Queues r at the tail; the instance's lock held. Returns true if it was not queued. */
static bool ep_queue_locked(struct ss_ep *e, struct ss_epreg *r)
{
	if (r->queued)
		return false;
	r->queued = true;
	r->r_next = NULL;
	if (e->rtail)
		e->rtail->r_next = r;
	else
		e->rhead = r;
	e->rtail = r;
	return true;
}

/* Wakes a thread asleep in the kernel on e; the instance's lock held. */
static void ep_wake_locked(struct ss_ep *e)
{
	uint64_t one = 1;

	if (e->sleepers && !e->wake_pending && e->wake_fd >= 0) {
		e->wake_pending = true;
		if (ss_real.write(e->wake_fd, &one, sizeof(one)) < 0) {
			/* A full counter still wakes it. */
		}
	}
}

/* What r would report now; the instance's lock held. */
static uint32_t ep_events_of(const struct ss_epreg *r)
{
	uint32_t want = r->ev.events | EPOLLERR | EPOLLHUP;

	return r->disabled ? 0 : ss_ready_events(r->s) & want;
}

void ss_epoll_notify(struct ss_sock *s, unsigned ready)
{
	pthread_mutex_lock(&s->fd_lock);
	for (struct ss_epreg *r = s->epregs; r; r = r->s_next) {
		struct ss_ep *e = r->ep;
		uint32_t now;

		if (!r->fast || !e)
			continue;
		pthread_mutex_lock(&e->lock);
		now = r->fast && !atomic_load(&e->dead) && !e->kernel_only ? ep_events_of(r) : 0;
		if (now && (r->ev.events & EPOLLET)) {
			/* An edge: new data, or an event that was not there before. */
			uint32_t rose = (ready & SS_RDY_EDGE) ? now : now & ~r->edge;

			if (rose && ep_queue_locked(e, r))
				ep_wake_locked(e);
			r->edge = now;
		} else if (now && ep_queue_locked(e, r)) {
			ep_wake_locked(e);
		} else if (!now) {
			r->edge = 0;
		}
		pthread_mutex_unlock(&e->lock);
	}
	pthread_mutex_unlock(&s->fd_lock);
}

/*
 * Moves up to max events off e's ready list into evs; the instance's lock
 * held. Level-triggered registrations that are still ready go to the tail
 * (so a short array takes turns), edge-triggered ones leave until the next
 * edge, one-shot ones are disabled until EPOLL_CTL_MOD.
 */
static int ep_harvest_locked(struct ss_ep *e, struct epoll_event *evs, int max)
{
	struct ss_epreg *stop = e->rtail;
	int n = 0;

	while (n < max && e->rhead) {
		struct ss_epreg *r = e->rhead;
		uint32_t now = ep_events_of(r);
		bool last = r == stop;

		e->rhead = r->r_next;
		if (!e->rhead)
			e->rtail = NULL;
		r->queued = false;
		if (now) {
			evs[n].events = now;
			evs[n].data = r->ev.data;
			n++;
			if (r->ev.events & EPOLLONESHOT)
				r->disabled = true;
			else if (!(r->ev.events & EPOLLET))
				ep_queue_locked(e, r);
		}
		if (last)
			break;
	}
	return n;
}

/* ---- registrations ---- */

/*
 * The registration of fd in the instance epfd names (e, ours, or NULL:
 * one we did not make) in s's list; fd_lock held. Ours are matched by
 * instance, so that a dup of the epoll fd finds what its first number
 * registered; the others by number.
 */
static struct ss_epreg *ep_find(struct ss_sock *s, struct ss_ep *e, int epfd, int fd)
{
	for (struct ss_epreg *r = s->epregs; r; r = r->s_next)
		if (r->fd == fd && (e ? r->ep == e : !r->ep && r->epfd == epfd))
			return r;
	return NULL;
}

/* Whether r's instance is one of ours that was closed (its kernel set went with it). */
static bool ep_stale(const struct ss_epreg *r)
{
	return r->ep && atomic_load(&r->ep->dead);
}

/*
 * The shim's own epoll_ctl of r's fd in r's instance: ours through its
 * private duplicate, under its lock so that it is not closed meanwhile
 * (ep_free); one we did not make by its number. Returns 0, -ESTALE (ours
 * was closed: nothing to do) or -errno.
 */
static int ep_kernel_ctl(struct ss_epreg *r, int op, struct epoll_event *ev)
{
	struct ss_ep *e = r->ep;
	int ret;

	if (!e)
		return ss_real.epoll_ctl(r->epfd, op, r->fd, ev) == 0 ? 0 : -errno;
	/*
	 * Dead for good: not even its lock (a forked child re-makes only the
	 * locks of live instances, ss_epoll_after_fork).
	 */
	if (atomic_load(&e->dead))
		return -ESTALE;
	pthread_mutex_lock(&e->lock);
	if (atomic_load(&e->dead))
		ret = -ESTALE;
	else
		ret = ss_real.epoll_ctl(e->kfd, op, r->fd, ev) == 0 ? 0 : -errno;
	pthread_mutex_unlock(&e->lock);
	return ret;
}

static int ep_mirror(struct ss_epreg *r, bool on);

/*
 * Drops s's registrations in instances that were closed: the kernel set
 * of a closed instance is gone, and a new instance may have its number.
 * Those answered in user space left with their instance (ep_free); those
 * the kernel answered are found here (ep_stale), before s's
 * registrations are looked at. fd_lock held; returns the change of s's
 * mirror references (ep_mirror_apply once unlocked).
 */
static int ep_sweep_stale(struct ss_sock *s)
{
	int mirror = 0;

	for (struct ss_epreg **pp = &s->epregs; *pp;) {
		struct ss_epreg *r = *pp;

		if (r->fast || !ep_stale(r)) {
			pp = &r->s_next;
			continue;
		}
		*pp = r->s_next;
		mirror += ep_mirror(r, false);
		epreg_put(r); /* the socket list's: the last one (r->ep, freed, is never read) */
	}
	return mirror;
}

/*
 * Whether the shadow of e may answer a registration with events ev for s.
 * Not while a thread sleeps in a kernel wait on e that our wake-up fd does
 * not reach (it began before the transport was loaded, or no wake-up fd
 * could be made): that one would never learn of the registration. That
 * count is read again under e->lock, where it grows (ep_make_fast).
 */
static bool ep_can_answer(struct ss_ep *e, struct ss_sock *s, uint32_t events)
{
	return e && !e->kernel_only && !atomic_load(&e->dead) && !(events & EPOLLEXCLUSIVE) &&
	       ss_sock_state(s) == SS_SOCK_UPGRADED &&
	       atomic_load_explicit(&e->blind_sleepers, memory_order_acquire) == 0;
}

/*
 * One registration more (+1) or fewer (-1) in e's kernel set: what a spin
 * must ask the kernel about now and then. The application's other fds are
 * counted at epoll_ctl (ss_epoll_count_kernel); a socket of ours answered
 * by the kernel (undecided, or not answerable in user space) is counted
 * here. Until 2026-12-02 those were not: an instance whose only kernel fds
 * were such sockets spun its whole budget before it saw them (a server's
 * accepted connection with its HELLO waiting, 1.7 ms per connection).
 */
static void ep_count_kernel(struct ss_ep *e, int delta)
{
	if (e)
		atomic_fetch_add_explicit(&e->n_kernel, delta, memory_order_relaxed);
}

/*
 * Makes r fast in e: out of the kernel set, into the shadow (queued if
 * ready). fd_lock held. False (nothing done) when a blind sleeper came
 * since ep_can_answer looked: the kernel goes on answering r.
 */
static bool ep_make_fast(struct ss_ep *e, struct ss_epreg *r, bool in_kernel)
{
	pthread_mutex_lock(&e->lock);
	if (atomic_load(&e->dead)) {
		/* Closed meanwhile (its cleanup may have passed r by): r stays as it is, stale. */
		pthread_mutex_unlock(&e->lock);
		return true;
	}
	if (atomic_load(&e->blind_sleepers) != 0) {
		pthread_mutex_unlock(&e->lock);
		return false;
	}
	if (in_kernel) {
		ss_real.epoll_ctl(e->kfd, EPOLL_CTL_DEL, r->fd, NULL);
		ep_count_kernel(e, -1);
	}
	r->fast = true;
	atomic_fetch_add(&r->refs, 1); /* the instance list's */
	r->e_prev = NULL;
	r->e_next = e->regs;
	if (e->regs)
		e->regs->e_prev = r;
	e->regs = r;
	r->edge = 0;
	/*
	 * A sleeper that found nothing fast slept unarmed (ss_epoll_wait): it
	 * must look again, ready or not, so that it arms the CQs for r. Each
	 * such sleeper sees the token: it stays until the last has looked
	 * (ep_take_wake_locked).
	 */
	if (ep_events_of(r))
		ep_queue_locked(e, r);
	ep_wake_locked(e);
	pthread_mutex_unlock(&e->lock);
	return true;
}

/* Takes r out of the shadow (the caller puts it in the kernel, or frees it). fd_lock held. */
static void ep_make_slow(struct ss_epreg *r)
{
	struct ss_ep *e = r->ep;

	pthread_mutex_lock(&e->lock);
	if (r->fast) {
		ep_unlink_locked(e, r);
		r->fast = false;
		pthread_mutex_unlock(&e->lock);
		epreg_put(r); /* the instance list's */
		return;
	}
	pthread_mutex_unlock(&e->lock);
}

/*
 * The kernel answers r while s is upgraded: the mirror must show the truth.
 * Returns the change of s's mirror references, which the caller applies
 * once fd_lock is released (ep_mirror_apply: it takes the connection's lock).
 */
static int ep_mirror(struct ss_epreg *r, bool on)
{
	if (on == r->mirror)
		return 0;
	r->mirror = on;
	return on ? 1 : -1;
}

static void ep_mirror_apply(struct ss_sock *s, int delta, bool sock_locked)
{
	for (; delta > 0; delta--)
		if (sock_locked)
			ss_ready_mirror_get_locked(s);
		else
			ss_ready_mirror_get(s);
	for (; delta < 0; delta++)
		ss_ready_mirror_put(s);
}

int ss_epoll_ctl(int epfd, int op, int fd, struct ss_sock *s, struct epoll_event *ev)
{
	struct ss_ep *e = ep_get(epfd);
	struct ss_epreg *r;
	int ret = 0, mirror = 0;
	int kfd = e ? e->kfd : epfd; /* the number is looked up once (ep_get) */

	if (epfd == fd) {
		ep_put(e);
		return -EINVAL;
	}
	if (op != EPOLL_CTL_DEL && !ev) {
		ep_put(e);
		return -EFAULT;
	}
	pthread_mutex_lock(&s->fd_lock);
	mirror += ep_sweep_stale(s);
	r = ep_find(s, e, epfd, fd);
	switch (op) {
	case EPOLL_CTL_ADD:
		if (r) {
			ret = -EEXIST;
			break;
		}
		if (!(r = calloc(1, sizeof(*r)))) {
			ret = -ENOMEM;
			break;
		}
		r->epfd = epfd;
		r->fd = fd;
		r->ev = *ev;
		r->ep = e;
		if (e)
			atomic_fetch_add(&e->mem, 1); /* dropped when r is freed */
		r->s = s;
		atomic_fetch_add(&s->refs, 1);
		atomic_init(&r->refs, 1); /* the socket list's */
		if (!ep_can_answer(e, s, ev->events) || !ep_make_fast(e, r, false)) {
			if (ss_real.epoll_ctl(kfd, op, fd, ev) != 0) {
				ret = -errno;
				epreg_put(r);
				break;
			}
			ep_count_kernel(e, 1);
			if (ss_sock_state(s) == SS_SOCK_UPGRADED)
				mirror += ep_mirror(r, true);
		}
		r->s_next = s->epregs;
		s->epregs = r;
		break;
	case EPOLL_CTL_MOD:
		if (!r) {
			ret = -ENOENT;
			break;
		}
		if (r->fast) {
			if (ev->events & EPOLLEXCLUSIVE) {
				ret = -EINVAL;
				break;
			}
			pthread_mutex_lock(&e->lock);
			r->ev = *ev;
			r->disabled = false;
			r->edge = 0;
			/* MOD looks again at what is ready now, as the kernel does. */
			if (ep_events_of(r) && ep_queue_locked(e, r))
				ep_wake_locked(e);
			pthread_mutex_unlock(&e->lock);
		} else if (ss_real.epoll_ctl(kfd, op, fd, ev) != 0) {
			ret = -errno;
		} else {
			r->ev = *ev;
		}
		break;
	case EPOLL_CTL_DEL:
		if (!r) {
			ret = -ENOENT;
			break;
		}
		if (r->fast)
			ep_make_slow(r);
		else if (ss_real.epoll_ctl(kfd, op, fd, NULL) != 0)
			ret = -errno;
		else
			ep_count_kernel(e, -1);
		mirror += ep_mirror(r, false);
		for (struct ss_epreg **pp = &s->epregs; *pp; pp = &(*pp)->s_next)
			if (*pp == r) {
				*pp = r->s_next;
				break;
			}
		epreg_put(r);
		break;
	default: ret = -EINVAL;
	}
	pthread_mutex_unlock(&s->fd_lock);
	ep_mirror_apply(s, mirror, false);
	ep_put(e);
	return ret;
}

void ss_epoll_upgraded(struct ss_sock *s)
{
	int mirror = 0;

	pthread_mutex_lock(&s->fd_lock);
	mirror += ep_sweep_stale(s);
	for (struct ss_epreg *r = s->epregs; r; r = r->s_next) {
		if (r->fast)
			continue;
		if (ep_can_answer(r->ep, s, r->ev.events) && ep_make_fast(r->ep, r, true))
			mirror += ep_mirror(r, false);
		else
			mirror += ep_mirror(r, true);
	}
	pthread_mutex_unlock(&s->fd_lock);
	ep_mirror_apply(s, mirror, true); /* ss_become_upgraded holds s->lock */
}

void ss_epoll_leaving(struct ss_sock *s)
{
	int mirror = 0;

	pthread_mutex_lock(&s->fd_lock);
	for (struct ss_epreg *r = s->epregs; r; r = r->s_next) {
		if (r->fast) {
			struct epoll_event ev = r->ev;

			/* Into the kernel set, on what the name is now; swaps carry it on. */
			ep_make_slow(r);
			if (ep_kernel_ctl(r, EPOLL_CTL_ADD, &ev) == 0)
				ep_count_kernel(r->ep, 1);
		}
		mirror += ep_mirror(r, false);
	}
	pthread_mutex_unlock(&s->fd_lock);
	ep_mirror_apply(s, mirror, false);
}

void ss_epoll_sock_gone(struct ss_sock *s)
{
	struct ss_epreg *r, *gone = NULL;
	int mirror = 0;

	pthread_mutex_lock(&s->fd_lock);
	while ((r = s->epregs)) {
		s->epregs = r->s_next;
		if (r->fast)
			ep_make_slow(r);
		mirror += ep_mirror(r, false);
		r->s_next = gone;
		gone = r;
	}
	pthread_mutex_unlock(&s->fd_lock);
	ep_mirror_apply(s, mirror, false);
	/* After: a registration holds a reference on s. */
	while ((r = gone)) {
		gone = r->s_next;
		epreg_put(r);
	}
}

void ss_epoll_drop_kernel(struct ss_sock *s, int fd)
{
	/* fd_lock held by the caller (ss_put_on_names). */
	for (struct ss_epreg *r = s->epregs; r; r = r->s_next)
		if (r->fd == fd && !r->fast)
			ep_kernel_ctl(r, EPOLL_CTL_DEL, NULL); /* not in a closed one of ours */
}

void ss_epoll_readd_kernel(struct ss_sock *s, int fd)
{
	/* fd_lock held by the caller (ss_put_on_names). */
	for (struct ss_epreg *r = s->epregs; r; r = r->s_next) {
		struct epoll_event ev = r->ev;
		int ret;

		if (r->fd != fd || r->fast)
			continue;
		/* Not into an instance of ours that was closed (-ESTALE). */
		ret = ep_kernel_ctl(r, EPOLL_CTL_ADD, &ev);
		if (ret < 0 && ret != -EEXIST && ret != -ESTALE)
			ss_log_debug("fd %d: cannot register it again in epoll %d", fd, r->epfd);
	}
}

void ss_epoll_to_kernel(int epfd)
{
	struct ss_ep *e = ep_get(epfd);
	struct ss_epreg *list = NULL, *r;

	if (!e)
		return;
	pthread_mutex_lock(&e->lock);
	if (e->kernel_only) {
		pthread_mutex_unlock(&e->lock);
		ep_put(e);
		return;
	}
	e->kernel_only = true;
	for (r = e->regs; r; r = r->e_next) {
		atomic_fetch_add(&r->refs, 1);
		r->r_next = list; /* borrowed: the ready list is emptied below */
		list = r;
	}
	e->rhead = e->rtail = NULL;
	for (r = e->regs; r; r = r->e_next)
		r->queued = false;
	pthread_mutex_unlock(&e->lock);
	ss_log_info("epoll %d is nested or polled: its upgraded sockets are answered by the kernel",
		    epfd);
	/* Into the kernel, each under its socket's fd_lock (which comes first). */
	while ((r = list)) {
		struct ss_sock *s = r->s;
		struct epoll_event ev = r->ev;

		list = r->r_next;
		int mirror = 0;

		pthread_mutex_lock(&s->fd_lock);
		if (r->fast) {
			ep_make_slow(r);
			if (ep_kernel_ctl(r, EPOLL_CTL_ADD, &ev) == 0) {
				ep_count_kernel(e, 1);
				if (ss_sock_state(s) == SS_SOCK_UPGRADED)
					mirror += ep_mirror(r, true);
			}
		}
		pthread_mutex_unlock(&s->fd_lock);
		ep_mirror_apply(s, mirror, false);
		epreg_put(r);
	}
	ep_put(e);
}

/* ---- waiting ---- */

/* Puts the wake-up fd and the devices' channels into e's kernel set (once each). */
static void ep_add_internal(struct ss_ep *e)
{
	struct ss_worker *w = atomic_load_explicit(&ss_w, memory_order_acquire);
	struct epoll_event ev = {.events = EPOLLIN};
	int fds[EP_MAX_CHANNELS], n;
	unsigned gen;

	if (!e->wake_added) {
		int fd = ss_private_eventfd();

		ev.data.u64 = EP_MAGIC | EP_WAKE;
		if (fd >= 0 && ss_real.epoll_ctl(e->kfd, EPOLL_CTL_ADD, fd, &ev) == 0) {
			e->wake_fd = fd;
			e->wake_added = true;
		} else if (fd >= 0) {
			ss_private_close(fd);
		}
	}
	if (!w)
		return;
	n = ss_tp->worker_event_fds(w, fds, EP_MAX_CHANNELS, &gen);
	if (gen == e->chan_gen)
		return;
	ev.data.u64 = EP_MAGIC | EP_CHANNEL;
	for (int i = 0; i < n; i++)
		if (ss_real.epoll_ctl(e->kfd, EPOLL_CTL_ADD, fds[i], &ev) != 0 && errno != EEXIST)
			ss_log_warn("epoll %d: cannot watch a completion channel: %s", e->epfd,
				    strerror(errno));
	e->chan_gen = gen;
}

/* A sleeper on e is awake; no longer to be woken through e's wake-up fd. */
static void ep_awake(struct ss_ep *e, bool unarmed)
{
	pthread_mutex_lock(&e->lock);
	e->sleepers--;
	e->unarmed -= unarmed;
	pthread_mutex_unlock(&e->lock);
}

/*
 * Takes the wake-up fd's token; the instance's lock held. Not while a
 * thread counted asleep without arming has not looked (ep_make_fast): the
 * kernel shows the token, level-triggered, to every thread that waits on
 * e until it is taken, and each of those must see it; the last of them
 * takes it (or the first that finds nothing fast, ep_wait_unarmed).
 */
static void ep_take_wake_locked(struct ss_ep *e)
{
	uint64_t v;

	if (e->unarmed > 0 || !e->wake_pending)
		return;
	e->wake_pending = false;
	if (ss_real.read(e->wake_fd, &v, sizeof(v)) < 0) {
		/* Drained by another sleeper. */
	}
}

/*
 * A thread cancelled asleep in epoll_wait (a cancellation point): it stops
 * counting as a sleeper and a poller, and its call's reference goes.
 */
struct ep_sleep {
	struct ss_ep *e;
	struct ss_wait *wt;
	bool unarmed;
};

static void ep_cancelled(void *arg)
{
	struct ep_sleep *sl = arg;

	ss_wait_end(sl->wt);
	ep_awake(sl->e, sl->unarmed);
	ep_put(sl->e);
}

static int ep_real_wait(struct ss_ep *e, struct epoll_event *evs, int max, int timeout_ms,
			const sigset_t *mask)
{
	return mask ? ss_real.epoll_pwait(e->kfd, evs, max, timeout_ms, mask)
		    : ss_real.epoll_wait(e->kfd, evs, max, timeout_ms);
}

static int ep_asleep(struct ss_ep *e, struct epoll_event *evs, int max, int timeout_ms,
		     const sigset_t *mask, struct ss_wait *asleep, bool unarmed)
{
	struct ep_sleep sl = {e, asleep, unarmed};
	int n;

	pthread_cleanup_push(ep_cancelled, &sl);
	n = ep_real_wait(e, evs, max, timeout_ms, mask);
	pthread_cleanup_pop(0);
	return n;
}

/*
 * Asks the kernel (timeout_ms; 0: no wait) and keeps the application's
 * events; the shim's own are taken care of. asleep: the caller's wait,
 * counted among e's sleepers and the worker's (ss_wait_arm); it stops
 * counting as soon as the kernel returns, before it takes CQ events, so
 * that those wake nobody (no wake-up write for itself) and arm nothing
 * for it; unarmed: it is counted among e's unarmed sleepers too.
 * Returns the application's events, or -errno.
 */
static int ep_kernel_wait(struct ss_ep *e, struct epoll_event *evs, int max, int timeout_ms,
			  const sigset_t *mask, bool *woken, struct ss_wait *asleep, bool unarmed)
{
	int n = asleep ? ep_asleep(e, evs, max, timeout_ms, mask, asleep, unarmed)
		       : ep_real_wait(e, evs, max, timeout_ms, mask);
	int err = errno, k = 0;

	if (asleep) {
		ss_wait_woke(asleep);
		ep_awake(e, unarmed);
	}
	if (n < 0)
		return -err;
	for (int i = 0; i < n; i++) {
		uint64_t d = evs[i].data.u64;

		if ((d & EP_MAGIC_MSK) != EP_MAGIC) {
			evs[k++] = evs[i];
			continue;
		}
		*woken = true;
		if ((d & ~EP_MAGIC_MSK) == EP_CHANNEL) {
			struct ss_worker *w = atomic_load_explicit(&ss_w, memory_order_acquire);

			if (w)
				ss_tp->worker_take_events(w);
		} else {
			pthread_mutex_lock(&e->lock);
			ep_take_wake_locked(e);
			pthread_mutex_unlock(&e->lock);
		}
	}
	return k;
}

/*
 * A blind sleeper cancelled in its kernel wait: it stops counting (else no
 * registration of e would become fast again), and its call's reference goes.
 */
static void ep_blind_cancelled(void *arg)
{
	struct ss_ep *e = arg;

	atomic_fetch_sub(&e->blind_sleepers, 1);
	ep_put(e);
}

/* ep_kernel_wait for a caller counted in e->blind_sleepers. */
static int ep_blind_wait(struct ss_ep *e, struct epoll_event *evs, int max, int timeout_ms,
			 const sigset_t *mask, bool *woken)
{
	int n;

	pthread_cleanup_push(ep_blind_cancelled, e);
	n = ep_kernel_wait(e, evs, max, timeout_ms, mask, woken, NULL, false);
	pthread_cleanup_pop(0);
	return n;
}

static int ep_harvest(struct ss_ep *e, struct epoll_event *evs, int max)
{
	int n;

	pthread_mutex_lock(&e->lock);
	n = ep_harvest_locked(e, evs, max);
	pthread_mutex_unlock(&e->lock);
	return n;
}

void ss_epoll_count_kernel(int epfd, int op)
{
	struct ss_ep *e = ep_get(epfd);

	if (e && op == EPOLL_CTL_ADD)
		atomic_fetch_add(&e->n_kernel, 1);
	else if (e && op == EPOLL_CTL_DEL && atomic_load(&e->n_kernel) > 0)
		atomic_fetch_sub(&e->n_kernel, 1);
	ep_put(e);
}

/*
 * While nothing of e is answered in user space (no fast registration: the
 * connections in it are undecided, on TCP, or mirrored), its wait is the
 * kernel's alone: no spin, no arming of the CQs, and a coarse clock
 * reading (no system call) for a timeout. It sleeps counted among e's
 * sleepers, so that a registration made fast meanwhile wakes it
 * (ep_make_fast). Returns true with the call's answer in *n (events, or
 * -errno); false when the engine must go on, for the time left in
 * *timeout_ms.
 */
static bool ep_wait_unarmed(struct ss_ep *e, struct epoll_event *evs, int max, int *timeout_ms,
			    const sigset_t *mask, int *n)
{
	/* Coarse: a system call spared per wait; read again only after a wake-up of ours. */
	uint64_t start = *timeout_ms > 0 ? ss_now_coarse_ms() : 0, whole = (uint64_t)*timeout_ms;
	struct ss_wait counted = {0}; /* neither a poller nor the worker's sleeper */
	unsigned sig_base = ss_sig_any();
	bool woken;

	for (;;) {
		bool blind;

		pthread_mutex_lock(&e->lock);
		if (e->regs) {
			pthread_mutex_unlock(&e->lock);
			return false;
		}
		/* A token left for unarmed sleepers, of a registration no longer fast. */
		ep_take_wake_locked(e);
		/* No wake-up fd (none could be made): nothing may become fast meanwhile. */
		blind = e->wake_fd < 0;
		if (blind) {
			atomic_fetch_add(&e->blind_sleepers, 1);
		} else {
			e->sleepers++;
			e->unarmed++;
		}
		pthread_mutex_unlock(&e->lock);
		woken = false;
		*n = blind ? ep_blind_wait(e, evs, max, *timeout_ms, mask, &woken)
			   : ep_kernel_wait(e, evs, max, *timeout_ms, mask, &woken, &counted, true);
		if (blind)
			atomic_fetch_sub(&e->blind_sleepers, 1);
		if (*n != 0 || !woken || *timeout_ms == 0)
			return true;
		if (ss_sig_any() != sig_base) {
			*n = -EINTR; /* a handler ran while our own entry woke it */
			return true;
		}
		if (*timeout_ms > 0) {
			/*
			 * Each coarse reading may be behind by the slack: the time
			 * left gets it added, so the call never ends before the
			 * application's timeout (at most two ticks after it).
			 */
			uint64_t spent = ss_now_coarse_ms() - start,
				 left = whole + ss_coarse_slack_ms();

			*timeout_ms = spent >= left            ? 0
				      : left - spent > INT_MAX ? INT_MAX
							       : (int)(left - spent);
		}
	}
}

int ss_epoll_wait(int epfd, struct epoll_event *evs, int max, int timeout_ms, const sigset_t *mask,
		  bool *handled)
{
	struct ss_ep *e = ep_get(epfd);
	struct ss_wait wt;
	enum ss_wait_next next;
	bool woken, blind;
	int n = 0, k;

	*handled = false;
	if (!e || max <= 0) {
		ep_put(e);
		return 0;
	}
	*handled = true;
	/*
	 * The kernel's alone; counted, so that no registration leaves its
	 * sight meanwhile. Under e->lock, where ep_make_fast reads the count:
	 * either it sees this sleeper, or this call sees the transport that
	 * the registration's upgrade loaded (once loaded, it stays: no lock).
	 */
	blind = e->kernel_only || !ss_wait_has_transport();
	if (blind) {
		pthread_mutex_lock(&e->lock);
		blind = e->kernel_only || !ss_wait_has_transport();
		if (blind)
			atomic_fetch_add(&e->blind_sleepers, 1);
		pthread_mutex_unlock(&e->lock);
	}
	if (blind) {
		ss_wait_begin(&wt, timeout_ms, ss_sig_any());
		do {
			/* Our own entries may still be in its set: they are taken care of. */
			woken = false;
			n = ep_blind_wait(e, evs, max, ss_wait_left_ms(&wt), mask, &woken);
		} while (n == 0 && woken && ss_wait_left_ms(&wt) != 0);
		atomic_fetch_sub(&e->blind_sleepers, 1);
		ep_put(e);
		return n;
	}
	ep_add_internal(e);
	if (ep_wait_unarmed(e, evs, max, &timeout_ms, mask, &n)) {
		ep_put(e);
		return n;
	}
	ss_wait_begin(&wt, timeout_ms, ss_sig_any());
	for (;;) {
		bool os = atomic_load_explicit(&e->n_kernel, memory_order_relaxed) > 0;

		n = ep_harvest(e, evs, max);
		/* The kernel's fds are asked now and then even while ours keep it busy. */
		if (os && n < max &&
		    (n ? ++e->found_calls % EP_OS_EVERY == 0 : wt.rounds % EP_OS_SPIN_EVERY == 0)) {
			k = ep_kernel_wait(e, evs + n, max - n, 0, NULL, &woken, NULL, false);
			n += k > 0 ? k : 0;
		}
		if (n > 0) {
			ss_wait_hit(&wt);
			break;
		}
		next = ss_wait_next(&wt);
		if (next == SS_WAIT_DONE || next == SS_WAIT_EINTR) {
			n = next == SS_WAIT_EINTR ? -EINTR : 0;
			break;
		}
		if (next == SS_WAIT_LOOK)
			continue;
		/*
		 * A device opened since this call began joins the set before we
		 * sleep on it: its channel is how its completions wake us. (A
		 * connection that moved from TCP made the process's first QP on
		 * the progress thread while this call slept; without this, the
		 * call slept on through every completion of it: 2026-12-06.)
		 */
		ep_add_internal(e);
		/* Asleep in the kernel: a new event of ours writes the wake-up fd. */
		pthread_mutex_lock(&e->lock);
		if (e->rhead) {
			pthread_mutex_unlock(&e->lock);
			continue;
		}
		e->sleepers++;
		pthread_mutex_unlock(&e->lock);
		if (ss_wait_arm(&wt)) {
			woken = false;
			k = ep_kernel_wait(e, evs, max, ss_wait_left_ms(&wt), mask, &woken, &wt,
					   false);
		} else {
			ss_wait_woke(&wt);
			ep_awake(e, false);
			k = 0; /* something came as we armed */
		}
		if (k < 0) {
			n = k; /* EINTR, as the kernel says */
			break;
		}
		if (k > 0) {
			n = k + ep_harvest(e, evs + k, max - k);
			ss_wait_hit(&wt);
			break;
		}
		ss_wait_resume(&wt);
	}
	ss_wait_end(&wt);
	ep_put(e);
	return n;
}
