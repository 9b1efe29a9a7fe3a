/*
 * The application's signal handlers run through ours, which only counts
 * them (per thread) before calling the application's: a wait that spins in
 * user space (epoll, poll, select, a blocking read polling the CQs) learns
 * that a handler ran, and returns EINTR (or goes on, under SA_RESTART) as
 * the kernel's wait would have. sigaction() and signal() report the
 * application's own handlers, never ours.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>

#include "shim/real.h"
#include "shim/shim.h"

#define EXPORT __attribute__((visibility("default")))

/* What the application installed, per signal; handler NULL: not ours to wrap. */
static struct sigaction sig_app[NSIG];
static pthread_mutex_t sig_lock = PTHREAD_MUTEX_INITIALIZER;

static __thread unsigned sig_any __attribute__((tls_model("initial-exec")));
static __thread unsigned sig_no_restart __attribute__((tls_model("initial-exec")));

unsigned ss_sig_any(void)
{
	return __atomic_load_n(&sig_any, __ATOMIC_RELAXED);
}

unsigned ss_sig_no_restart(void)
{
	return __atomic_load_n(&sig_no_restart, __ATOMIC_RELAXED);
}

static void sig_trampoline(int sig, siginfo_t *info, void *uc)
{
	struct sigaction *a = &sig_app[sig];
	int flags = a->sa_flags;
	void (*h)(int) = a->sa_handler;
	void (*ha)(int, siginfo_t *, void *) = a->sa_sigaction;

	__atomic_store_n(&sig_any, sig_any + 1, __ATOMIC_RELAXED);
	if (!(flags & SA_RESTART))
		__atomic_store_n(&sig_no_restart, sig_no_restart + 1, __ATOMIC_RELAXED);
	if (flags & SA_RESETHAND)
		a->sa_handler = SIG_DFL; /* the kernel reset ours: so is theirs */
	if (flags & SA_SIGINFO)
		ha(sig, info, uc);
	else if (h != SIG_DFL && h != SIG_IGN)
		h(sig);
}

/* Whether act installs a handler we wrap (not SIG_DFL, SIG_IGN, or a signal that cannot be
 * caught). */
static bool sig_wrapped(int sig, const struct sigaction *act)
{
	if (sig <= 0 || sig >= NSIG || sig == SIGKILL || sig == SIGSTOP)
		return false;
	if (act->sa_flags & SA_SIGINFO)
		return act->sa_sigaction != NULL;
	return act->sa_handler != SIG_DFL && act->sa_handler != SIG_IGN;
}

EXPORT int sigaction(int sig, const struct sigaction *act, struct sigaction *old)
{
	struct sigaction mine, prev;
	int ret;

	ss_real_init();
	if (sig <= 0 || sig >= NSIG || sig == SIGKILL || sig == SIGSTOP)
		return ss_real.sigaction(sig, act, old);
	pthread_mutex_lock(&sig_lock);
	if (act && sig_wrapped(sig, act)) {
		mine = *act;
		mine.sa_flags |= SA_SIGINFO;
		mine.sa_sigaction = sig_trampoline;
		sig_app[sig] = *act; /* before the kernel can deliver */
		ret = ss_real.sigaction(sig, &mine, &prev);
	} else {
		ret = ss_real.sigaction(sig, act, &prev);
	}
	if (ret == 0 && old) {
		/* The application sees its own handler, never ours. */
		if (prev.sa_sigaction == sig_trampoline)
			*old = sig_app[sig];
		else
			*old = prev;
		if (prev.sa_sigaction == sig_trampoline && act && !sig_wrapped(sig, act))
			old->sa_flags = sig_app[sig].sa_flags;
	}
	pthread_mutex_unlock(&sig_lock);
	return ret;
}

/* signal(): BSD semantics, as glibc's (SA_RESTART, the handler stays). */
EXPORT sighandler_t signal(int sig, sighandler_t handler)
{
	struct sigaction act = {.sa_handler = handler, .sa_flags = SA_RESTART}, old;

	sigemptyset(&act.sa_mask);
	if (sigaction(sig, &act, &old) != 0)
		return SIG_ERR;
	return old.sa_handler;
}

sighandler_t bsd_signal(int sig, sighandler_t handler);
EXPORT sighandler_t bsd_signal(int sig, sighandler_t handler)
{
	return signal(sig, handler);
}

/* sysv_signal(): the handler is reset on delivery and the signal not blocked in it. */
EXPORT sighandler_t sysv_signal(int sig, sighandler_t handler)
{
	struct sigaction act = {.sa_handler = handler, .sa_flags = SA_RESETHAND | SA_NODEFER}, old;

	sigemptyset(&act.sa_mask);
	if (sigaction(sig, &act, &old) != 0)
		return SIG_ERR;
	return old.sa_handler;
}

void ss_signal_after_fork(void)
{
	pthread_mutex_init(&sig_lock, NULL);
}
