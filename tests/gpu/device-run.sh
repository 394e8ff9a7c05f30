#!/usr/bin/env bash
# Run on the GPU test machine (no package registry there: what it needs travels in build/carry/).
#   tests/gpu/device-run.sh bench        GPU unit tests; stage --bench from a weightfs mount (warm and
#                                        cold) and from the same file on the backing filesystem; the
#                                        Python package's CUDA tests; the torch comparison
#   tests/gpu/device-run.sh verify DIR   write the real-weights subset in DIR (a TF.js package dir)
#                                        through the mount, then stage every tensor to the GPU and
#                                        compare it with its file
# Prints results; writes nothing outside /tmp/wfs-gpu.
set -euo pipefail
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=$PWD/build/carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
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
build/weightfs "$work/store" "$mnt" -o nosync
mountpoint -q "$mnt"

case ${1:-bench} in
bench)
	echo "== GPU unit tests"
	WFS_TEST_GPU=1 build/tests/check_stage 2>&1 | tail -n 3
	echo "== 2 GiB file through the mount (and the same bytes natively)"
	head -c 2G /dev/urandom >"$work/native/big.bin"
	cp "$work/native/big.bin" "$mnt/big.bin"
	python3 -c "import os, sys; print('digest', os.getxattr(sys.argv[1], 'user.weightfs.digest').decode())" "$mnt/big.bin"
	for f in "$mnt/big.bin" "$work/native/big.bin"; do
		echo "== stage --bench (warm) $f"
		build/weightfsctl stage --bench -r 5 "$f"
	done
	for f in "$mnt/big.bin" "$work/native/big.bin"; do
		echo "== stage --bench --cold $f"
		build/weightfsctl stage --bench --cold -r 3 "$f"
	done
	echo "== the Python package's CUDA paths (plain directory and the mount)"
	mkdir -p "$work/plain"
	WEIGHTFS_LIB=$PWD/build/libweightfs.so PYTHONPATH=$PWD/lib/python \
		python3 tests/python/test_gpu.py --plain "$work/plain" --mnt "$mnt" 2>&1 | tail -n 8
	echo "== torch: from_file(...).to('cuda') vs weightfs.backload, file on the mount"
	(cd lib/python && WEIGHTFS_LIB=$PWD/../../build/libweightfs.so python3 -m weightfs.bench_stage "$mnt/big.bin" 5) || true
	echo "== daemon RSS: $(grep VmRSS /proc/"$(pgrep -f "weightfs $work/store" | head -n 1)"/status)"
	;;
verify)
	pkg=$2
	models=$(cat "$pkg/../models.txt")
	echo "== writing $(tr ',' '\n' <<<"$models" | wc -l) models through the mount"
	python3 tests/realweights/frozen_offload.py --root "$mnt/frozen-offload" --ranks 1 --package "$pkg" \
		--models "$models"
	echo "== staging every tensor to the GPU and comparing"
	build/weightfsctl stage ${WFS_STAGE_FLAGS:-} --verify "$mnt/frozen-offload/rank0"
	;;
*)
	echo "usage: $0 bench | verify PACKAGE_DIR" >&2
	exit 2
	;;
esac
