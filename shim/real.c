#include "shim/real.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>

struct ss_real ss_real;

void ss_real_init(void)
{
	static __thread int resolving; /* dlsym may call back into us */
	static const char *const names[] = {
#define SS_REAL_NAME(name, ret, args) #name,
		SS_REAL_FUNCS(SS_REAL_NAME)
#undef SS_REAL_NAME
	};
	void **slots = (void **)&ss_real;

	if (resolving || ss_real.__recvfrom_chk)
		return;
	resolving = 1;
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		void *f = dlsym(RTLD_NEXT, names[i]);

		if (!f) {
			static const char msg[] =
				"srqshim: error: cannot resolve a libc function\n";
			syscall(SYS_write, 2, msg, sizeof(msg) - 1);
			abort();
		}
		__atomic_store_n(&slots[i], f, __ATOMIC_RELEASE);
	}
	resolving = 0;
}
