#!/usr/bin/env bash
# Every function the shim's sources mark EXPORT is exported by the built
# library (shim/libsrqshim.map lists them; a name left out of the map is
# silently local, and the program's calls then go to libc past the shim).
#   exports.sh LIBSRQSHIM SHIM_SOURCE_DIR
set -euo pipefail
lib=$1 src=$2
want=$(grep -hoE '^EXPORT [^(]*[^a-zA-Z_0-9][a-zA-Z_0-9]+\(' "$src"/*.c | sed -E 's/.*[^a-zA-Z_0-9]([a-zA-Z_0-9]+)\($/\1/' | sort -u)
have=$(nm -D --defined-only "$lib" | awk '{print $3}' | sed 's/@.*//' | sort -u)
[ -n "$want" ] || { echo "exports: no EXPORT found under $src"; exit 1; }
missing=$(comm -23 <(echo "$want") <(echo "$have"))
[ -z "$missing" ] || { echo "exports: marked EXPORT but not exported by $lib:" $missing; exit 1; }
echo "exports: all $(echo "$want" | wc -l) EXPORT functions are exported"
