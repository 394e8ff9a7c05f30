#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# shellcheck source-path=SCRIPTDIR/..
# The Python package's tests against a real weightfs mount (torch on the CPU).
#
#   test_python.sh BUILD_DIR package [-o MOUNT_OPTS]     unit tests under pytest: test_names.py (no
#                                                       mount: names, tables, pip install), test_package.py
#                                                       around a remount
#   test_python.sh BUILD_DIR multirank [-o MOUNT_OPTS]   4 ranks on real weights: test_multirank.py
#   test_python.sh BUILD_DIR direct [-o MOUNT_OPTS]      the direct path: test_direct.py (mounts itself,
#                                                       MOUNT_OPTS as its --mount-opts)
#
# All are pytest modules (tests/python/conftest.py). package and multirank mount a fresh store, run
# the module's --phase first, unmount, mount the same store again (a new daemon, as after a trainer
# restart) and run --phase remount; then check that the daemon exits 0 and STORE/tmp is empty.
# WFS_MULTIRANK_ARGS adds arguments to test_multirank.py (e.g. "--models=all" for the whole package).
#
# Interpreter: $WFS_PYTHON, else the first of python3 and /usr/bin/python3 that imports torch, numpy
# and pytest (Debian's python3-torch and python3-pytest install into the system python; a pyenv python3
# on PATH may lack them). With none, the run is reported as one failure (never as passed).
# libweightfs.so: BUILD's, unless it is built with a sanitizer, which python cannot load: then
# build/libweightfs.so. One test by name: python3 -m pytest tests/python/test_package.py -k NAME
# (tests/python/conftest.py mounts a store itself then; docs/testing.md).
# Prints one line per check and "python-<what>: N passed, N failed, N skipped"; exit 0 only when none
# failed.
set -euo pipefail

prog=${0##*/}
usage() { echo "usage: $prog BUILD_DIR package|multirank|direct [-o MOUNT_OPTS]" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
tests=$(dirname "$here")
repo=$(dirname "$tests")
# shellcheck source=lib/mount.sh disable=SC1091
. "$tests/lib/mount.sh"

[ $# -ge 2 ] || usage
build=$1
what=$2
shift 2
case $what in package | multirank | direct) ;; *) usage ;; esac
opts=()
mount_opts= # the -o values, comma-separated (test_direct.py's --mount-opts)
while [ $# -gt 0 ]; do
	case $1 in
	-o) [ $# -ge 2 ] || usage; opts+=(-o "$2"); mount_opts+=${mount_opts:+,}$2; shift ;;
	*) usage ;;
	esac
	shift
done
label=python-$what
passed=0
failed=0
skipped=0
pass() { passed=$((passed + 1)); echo "ok    $1"; }
fail() { failed=$((failed + 1)); echo "FAIL  $1"; }
# Add the counts of a "label: N passed, N failed[, N skipped]" line from FILE; a run without one is
# one failure.
count() {
	local line
	line=$(grep -E '^[^ ]+: [0-9]+ passed, [0-9]+ failed(, [0-9]+ skipped)?$' "$1" | tail -n 1 || true)
	if [[ ! $line =~ ([0-9]+)\ passed,\ ([0-9]+)\ failed(,\ ([0-9]+)\ skipped)? ]]; then
		fail "$2: no summary line (crashed?): $(tail -n 1 "$1")"
		return
	fi
	passed=$((passed + BASH_REMATCH[1]))
	failed=$((failed + BASH_REMATCH[2]))
	skipped=$((skipped + ${BASH_REMATCH[4]:-0}))
}
# pytest LABEL FILE [ARGS...]: the tests of tests/python/FILE under pytest, one line each; the closing
# "LABEL: N passed, N failed, N skipped" line (conftest.py) is counted.
pytest() {
	local label=$1 file=$2 out
	shift 2
	out=$(mktemp)
	# The file first and OPTION=VALUE: pytest reads conftest.py's options only once it has found the
	# file (an option's separate value before it is taken for a path).
	"$py" -m pytest "$here/$file" -p no:cacheprovider -v -rfEs --tb=short --label="$label" --build="$build" \
		"$@" 2>&1 | tee "$out" || true
	count "$out" "$file"
	rm -f "$out"
}
finish() {
	echo "$label: $passed passed, $failed failed, $skipped skipped"
	[ "$failed" -eq 0 ]
	exit $?
}

py=
for cand in ${WFS_PYTHON:-} python3 /usr/bin/python3; do
	if command -v "$cand" >/dev/null && "$cand" -c 'import torch, numpy, pytest' 2>/dev/null; then
		py=$cand
		break
	fi
done
if [ -z "$py" ]; then
	fail "python: no python3 with torch, numpy and pytest (install python3-torch python3-numpy python3-pytest: .ci/setup-debian)"
	finish
fi
lib=$(wfs_python_lib "$build")
if [ ! -f "$lib" ]; then
	fail "python: $lib is missing (make all)"
	finish
fi
export WEIGHTFS_LIB=$lib
export PYTHONPATH=$repo/lib/python${PYTHONPATH:+:$PYTHONPATH}
export PYTHONDONTWRITEBYTECODE=1

if [ "$what" = direct ]; then # mounts and remounts by itself (allow_other, nobody, damage)
	mode=auto
	case ,$mount_opts, in *,passthrough=off,*) mode=off ;; esac
	pytest "${label}[$mode]" test_direct.py --mount-opts="$mount_opts"
	finish
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/wfs-$label.XXXXXX")
store=$work/store
mnt=$work/mnt
# shellcheck disable=SC2317 # called from the EXIT trap
cleanup() {
	wfs_umount "$mnt" >/dev/null 2>&1 || true
	if ! mountpoint -q "$mnt" 2>/dev/null; then rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

plain=$work/plain # a plain directory on the store's filesystem (ext4 here: user xattrs, no claims)

if ! wfs_mount "$build" "$store" "$mnt" "${opts[@]}"; then
	fail "mount: $build/weightfs did not mount $mnt"
	finish
fi

if [ "$what" = package ]; then
	# No mount needed: names and tables against the C library, and the package installed by pip.
	pytest python-names test_names.py
	args=(--mnt="$mnt" --store="$store" --plain="$plain" --state="$work/state.json")
	pytest "python-package[first]" test_package.py "${args[@]}" --phase=first
	if wfs_umount "$mnt" && wfs_mount "$build" "$store" "$mnt" "${opts[@]}"; then
		pass "remount: the same store mounted again by a new daemon"
		pytest "python-package[remount]" test_package.py "${args[@]}" --phase=remount
	else
		fail "remount: unmount and mount again failed"
	fi
else
	# Phase first: 4 ranks offload and map on the mount and in a plain directory; remount: after a
	# remount (a new daemon, the trainer's restart), the ranks offload again: skips and claims, no
	# object bytes written.
	args=(--mnt="$mnt" --store="$store" --plain="$work/plain-ranks" --state="$work/state.json")
	read -r -a extra <<<"${WFS_MULTIRANK_ARGS:-}"
	pytest "${label}[first]" test_multirank.py "${args[@]}" "${extra[@]}" --phase=first
	if wfs_umount "$mnt" && wfs_mount "$build" "$store" "$mnt" "${opts[@]}"; then
		pass "remount: the same store mounted again by a new daemon (the restart)"
		pytest "${label}[remount]" test_multirank.py "${args[@]}" "${extra[@]}" --phase=remount
	else
		fail "remount: unmount and mount again failed"
	fi
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
