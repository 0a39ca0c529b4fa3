#!/bin/bash
# Runs the unit and functional tests with stestr (parallel workers; each
# test module keeps its real servers, such as swtpm, for all its tests) and
# ends with a plain "N passed, N failed, N skipped" line.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
rm -rf .stestr
stestr init >/dev/null
# The long tests' seconds (tools/test-times.txt), so that stestr gives its
# workers even shares instead of handing the long classes out in turn.
python -m trusted_testing.test_times seed || echo "(test times not seeded)"
log=$(mktemp)
stestr run --concurrency "${TEST_CONCURRENCY:-2}" "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
summary=$(tail -40 "$log")
rm -f "$log"
passed=$(echo "$summary" | sed -n 's/^ - Passed: \([0-9]*\)/\1/p' | tail -1)
failed=$(echo "$summary" | sed -n 's/^ - Failed: \([0-9]*\)/\1/p' | tail -1)
skipped=$(echo "$summary" | sed -n 's/^ - Skipped: \([0-9]*\)/\1/p' | tail -1)
# stestr's trace above prints each skipped test with its reason.
echo "${passed:-0} passed, ${failed:-0} failed, ${skipped:-0} skipped"
if [ "$rc" -ne 0 ] || [ "${passed:-0}" = "0" ]; then
    exit 1
fi
