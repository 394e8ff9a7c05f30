# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# Checks for the test scripts (tests/cli/*.sh): each check prints one line, "ok   NAME",
# "FAIL NAME" (with indented details) or "skip NAME", and counts it in $passed, $failed, $skipped;
# the script ends with its own "LABEL: N passed, N failed" line, which tests/run-tests reads.
# Source it after setting $work (a scratch directory: run keeps stderr there).

passed=0 failed=0 skipped=0
ok() {
	echo "ok   $1"
	passed=$((passed + 1))
}
# fail NAME [DETAIL...]
fail() {
	echo "FAIL $1"
	shift
	local line
	for line in "$@"; do
		printf '       %s\n' "$line"
	done
	failed=$((failed + 1))
}
# skip NAME: a check that could not run here (never counted as passed).
skip() {
	echo "skip $1"
	skipped=$((skipped + 1))
}
# verdict NAME STATUS [DETAIL...]: ok when STATUS (the $? of a check) is 0.
verdict() {
	local name=$1 status=$2
	shift 2
	if [ "$status" -eq 0 ]; then
		ok "$name"
	else
		fail "$name" "$@"
	fi
}

# run CMD...: its stdout in $out, stderr in $err, exit status in $rc.
out='' err='' rc=0
# shellcheck disable=SC2154 # $work: set by the script that sources this file
run() {
	out=$("$@" 2>"$work/stderr")
	rc=$?
	err=$(<"$work/stderr")
}

# expect NAME RC [STDOUT_REGEX [STDERR_REGEX]]: the last run exited RC and its output matches.
expect() {
	local name=$1 want=$2 out_re=${3:-} err_re=${4:-}
	if [ "$rc" -ne "$want" ]; then
		fail "$name" "exit $rc, want $want" "stdout: $out" "stderr: $err"
	elif [ -n "$out_re" ] && ! grep -Eq -- "$out_re" <<<"$out"; then
		fail "$name" "stdout does not match /$out_re/" "stdout: $out"
	elif [ -n "$err_re" ] && ! grep -Eq -- "$err_re" <<<"$err"; then
		fail "$name" "stderr does not match /$err_re/" "stderr: $err"
	else
		ok "$name"
	fi
}
