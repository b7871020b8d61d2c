#!/usr/bin/env bash
# test.sh — set up, build, and run every test: the lit suite (IR and tools),
# the gtest units (compiler and runtime, through ctest) and pytest. Ends with
# one line "N passed, N failed[, N skipped]" and exits non-zero on any failure.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${ERNIE_BUILD_DIR:-$ROOT/build}"
VENV="${ERNIE_VENV:-$ROOT/.venv}"
export ERNIE_BUILD_DIR="$BUILD_DIR"

"$ROOT/scripts/setup.sh" || { echo "setup failed"; echo "0 passed, 1 failed"; exit 1; }

REPORTS="$BUILD_DIR/test-reports"
rm -rf "$REPORTS" && mkdir -p "$REPORTS"
status=0

echo "== lit =="
/usr/lib/llvm-22/bin/lit -sv \
  --xunit-xml-output="$REPORTS/lit.xml" "$BUILD_DIR/test" || status=1

echo "== gtest (ctest) =="
ctest --test-dir "$BUILD_DIR" --output-on-failure \
  --output-junit "$REPORTS/ctest.xml" || status=1

echo "== pytest =="
"$VENV/bin/python" -m pytest -q "$ROOT/python/tests" \
  --junitxml="$REPORTS/pytest.xml" || status=1

"$VENV/bin/python" "$ROOT/scripts/summarize_tests.py" "$REPORTS"/*.xml || status=1
exit $status
