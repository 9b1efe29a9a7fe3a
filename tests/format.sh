#!/usr/bin/env bash
# Every C file of the tree follows .clang-format (kernel-like, 100 columns).
# The check uses Debian 12's clang-format (14, installed by tools/setup);
# another major version lays out some constructs differently, so it fails
# here, naming its version, rather than pass unchecked. Tables laid out by
# hand are fenced with "clang-format off/on" comments. To fix a failure:
# clang-format -i FILE.
set -u
top=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$top" || exit 1
command -v clang-format > /dev/null || { echo "format: clang-format is not installed (tools/setup installs it)" >&2; exit 1; }
ver=$(clang-format --version | sed -n 's/.*version \([0-9]*\)\..*/\1/p')
[ "$ver" = 14 ] || { echo "format: clang-format $ver; the tree is laid out with clang-format 14" >&2; exit 1; }
mapfile -t files < <(find shim transport handshake tools tests -name '*.[ch]' | sort)
[ ${#files[@]} -gt 50 ] || { echo "format: found only ${#files[@]} C files under $top" >&2; exit 1; }
bad=$(clang-format --dry-run "${files[@]}" 2>&1 | sed -n 's/^\([^:]*\):[0-9]*:[0-9]*: warning:.*/\1/p' | sort -u)
if [ -n "$bad" ]; then
	echo "format: not laid out as .clang-format says (clang-format -i to fix):" >&2
	echo "$bad" >&2
	exit 1
fi
echo "format: ${#files[@]} files follow .clang-format"
