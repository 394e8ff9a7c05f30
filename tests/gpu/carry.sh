#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Put into BUILD/carry what tests/gpu/device-run.sh needs on the GPU test machine, which has no
# package registry: the shared libraries the build links against (except glibc's and CUDA's, which
# are there) in BUILD/carry/lib, and xxhsum and fusermount3 in BUILD/carry/bin.
#   usage: tests/gpu/carry.sh [BUILD_DIR]      (then carry BUILD_DIR to the device machine)
set -euo pipefail
B=${1:-build}
mkdir -p "$B/carry/lib" "$B/carry/bin"
for bin in "$B/weightfs" "$B/weightfsctl" "$B/libweightfs.so" "$B"/tests/check_*; do
	[ -e "$bin" ] || continue
	ldd "$bin" 2>/dev/null | awk '$3 ~ /^\// { print $3 }' || true # static binaries: none
done | sort -u | while read -r lib; do
	case $(basename "$lib") in
	libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | ld-linux* | libcuda*) ;;
	*) cp -L "$lib" "$B/carry/lib/" ;;
	esac
done
cp -L "$(command -v xxhsum)" "$(command -v fusermount3)" "$B/carry/bin/"
echo "carry.sh: $(find "$B/carry/lib" -type f | wc -l) libraries, xxhsum and fusermount3 in $B/carry"
