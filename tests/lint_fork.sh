#!/usr/bin/env bash
# The fork rule, checked on the sources: every process-wide lock of the shim
# and the transport (a file-scope pthread_mutex_t) is made anew in its file's
# *_after_fork function, and every such function is called in the child (the
# shim's after_fork_child, or the transport's ops table). A lock a parent
# thread held at the fork would otherwise stay held in the child for ever.
# What it does not see (the review's list; kept by hand, docs/design.md
# "Process model"): locks inside structures (each owner's after_fork resets
# its own), pthread_once controls, and per-thread state of the forking
# thread (ss_ready_after_fork drops its wake-up eventfd). A call is found
# by its name at the start of a line of after_fork_child, not by parsing C.
set -u
top=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$top" || exit 1
bad=0

# The body of FILE's *_after_fork function(s).
after_fork_body() {
	awk '/^[a-z].*_after_fork\(void\)$/ { on = 1 } on { print } on && /^}/ { on = 0 }' "$1"
}

for f in shim/*.c transport/*.c; do
	for lock in $(sed -n 's/^static pthread_mutex_t \([a-z_]*\).*/\1/p' "$f"); do
		if ! after_fork_body "$f" | grep -q "pthread_mutex_init(&$lock\b"; then
			echo "$f: lock '$lock' is not made anew in an *_after_fork function of its file"
			bad=1
		fi
	done
	for fn in $(sed -n 's/^void \(ss_[a-z_]*_after_fork\)(void)$/\1/p' "$f"); do
		case $f in
		shim/*) grep -q "^	$fn();" shim/shim.c ;;
		transport/*) grep -q "= $fn,$" transport/module.c ;;
		esac || {
			echo "$f: $fn is never called in the child of a fork"
			bad=1
		}
	done
done
[ $bad = 0 ] && echo "every process-wide lock is made anew after fork"
exit $bad
