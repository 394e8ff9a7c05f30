#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Run on the GPU test machine (no package registry there: what it needs travels in build/carry/).
#   tests/gpu/device-run.sh bench        GPU unit tests; stage --bench from a weightfs mount (warm and
#                                        cold) and from the same file on the backing filesystem; the
#                                        Python package's CUDA tests; the torch comparison
#   tests/gpu/device-run.sh verify DIR   write the real-weights subset in DIR (a TF.js package dir)
#                                        through the mount, then stage every tensor to the GPU and
#                                        compare it with its file
# Prints results and closes with "gpu: N passed, N failed" (each step is one check: a failing step is
# reported and the next one runs). Writes nothing outside /tmp/wfs-gpu. What the machine lacks travels
# in build/carry/ (tests/gpu/carry.sh makes it: shared libraries, xxhsum, pytest; carry build/ there).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
export LD_LIBRARY_PATH=$PWD/build/carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=$PWD/build/carry/bin:$PATH
passed=0 failed=0 failures=()
# step NAME CMD...: run CMD, print its output, count it.
step() {
	local name=$1
	shift
	if "$@"; then
		passed=$((passed + 1))
	else
		echo "FAIL $name (exit $?)"
		failed=$((failed + 1))
		failures+=("$name")
	fi
}
# digest_matches MOUNTED_FILE SAME_BYTES_FILE: the daemon's digest is what xxhsum -H2 computes.
digest_matches() {
	local a b
	a=$(python3 -c 'import os, sys; print(os.getxattr(sys.argv[1], "user.weightfs.digest").decode())' "$1")
	b=$(xxhsum -H2 "$2" | cut -d' ' -f1)
	echo "digest $a, xxhsum -H2 $b"
	[ -n "$a" ] && [ "$a" = "$b" ]
}
# bench_stage FILE: torch.from_file(...).to('cuda') against weightfs.backload.
bench_stage() {
	WEIGHTFS_LIB=$PWD/build/libweightfs.so python3 tests/bench/bench_stage.py "$1" 5
}
summary() {
	[ ${#failures[@]} -eq 0 ] || echo "failing: ${failures[*]}"
	echo "gpu: $passed passed, $failed failed"
}
work=/tmp/wfs-gpu
mnt=$work/mnt
cleanup() {
	if mountpoint -q "$mnt" 2>/dev/null; then
		fusermount3 -u "$mnt" 2>/dev/null || umount "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true
	fi
}
trap cleanup EXIT
cleanup
rm -rf "$work"
mkdir -p "$work/store" "$mnt" "$work/native"
nvidia-smi -L || true
uname -r
build/weightfs "$work/store" "$mnt" -o nosync || { echo "gpu: mount failed"; exit 1; }
mountpoint -q "$mnt" || { echo "gpu: $mnt is not mounted"; exit 1; }

case ${1:-bench} in
bench)
	echo "== GPU unit tests"
	step check_stage env WFS_TEST_GPU=1 build/tests/check_stage
	echo "== 2 GiB file through the mount (and the same bytes natively)"
	head -c 2G /dev/urandom >"$work/native/big.bin"
	step "cp to the mount" cp "$work/native/big.bin" "$mnt/big.bin"
	step "digest = xxhsum -H2" digest_matches "$mnt/big.bin" "$work/native/big.bin"
	for f in "$mnt/big.bin" "$work/native/big.bin"; do
		echo "== stage --bench (warm) $f"
		step "stage --bench $f" build/weightfsctl stage --bench -r 5 "$f"
	done
	for f in "$mnt/big.bin" "$work/native/big.bin"; do
		echo "== stage --bench --cold $f"
		step "stage --bench --cold $f" build/weightfsctl stage --bench --cold -r 3 "$f"
	done
	echo "== the Python package's CUDA paths (plain directory and the mount)"
	mkdir -p "$work/plain"
	# A pytest module run as a script: it fails when a test failed or was skipped (no usable GPU).
	pypath=$PWD/lib/python
	python3 -c 'import pytest' 2>/dev/null || pypath+=:$PWD/build/carry/python # carry.sh's pytest
	step test_gpu.py env WEIGHTFS_LIB="$PWD/build/libweightfs.so" PYTHONPATH="$pypath" \
		python3 tests/python/test_gpu.py --plain "$work/plain" --mnt "$mnt"
	echo "== torch: from_file(...).to('cuda') vs weightfs.backload, file on the mount"
	step bench_stage bench_stage "$mnt/big.bin"
	echo "== daemon RSS: $(grep VmRSS /proc/"$(pgrep -f "weightfs $work/store" | head -n 1)"/status)"
	summary
	[ "$failed" -eq 0 ]
	;;
verify)
	pkg=$2
	models=$(cat "$pkg/../models.txt")
	echo "== writing $(tr ',' '\n' <<<"$models" | wc -l) models through the mount"
	step "offload through the mount" python3 tests/realweights/frozen_offload.py --root "$mnt/frozen-offload" \
		--ranks 1 --package "$pkg" --models "$models"
	echo "== staging every tensor to the GPU and comparing"
	# shellcheck disable=SC2086 # WFS_STAGE_FLAGS: words on purpose
	step "stage --verify" build/weightfsctl stage ${WFS_STAGE_FLAGS:-} --verify "$mnt/frozen-offload/rank0"
	summary
	[ "$failed" -eq 0 ]
	;;
*)
	echo "usage: $0 bench | verify PACKAGE_DIR" >&2
	exit 2
	;;
esac
