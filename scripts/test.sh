#!/usr/bin/env bash
# Install what is needed, then run the whole test suite (this is what CI runs).
# Extra arguments go to pytest, e.g. scripts/test.sh -m "not fault".
set -uo pipefail
cd "$(dirname "$0")/.."
FS3_EXTRAS=dev,ckpt bash scripts/install.sh || { echo "install failed" >&2; exit 1; }
.venv/bin/python -m pytest -p no:cacheprovider tests "$@"
rc=$?
# pytest exits 5 when nothing was collected: that is a failure for CI.
if [ "$rc" = 5 ]; then echo "no tests were collected" >&2; exit 1; fi
exit "$rc"
