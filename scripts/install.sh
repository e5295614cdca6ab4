#!/usr/bin/env bash
# Install everything fs3 needs on a fresh Debian machine (as root):
# system packages, then a virtual environment in .venv with fs3 and its tools.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  need=""
  for p in fuse3 libfuse3-dev pkg-config gcc python3-dev python3-venv fio sqlite3 iproute2 docker-compose git psmisc; do
    dpkg -s "$p" >/dev/null 2>&1 || need="$need $p"
  done
  if [ -n "$need" ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq $need >/dev/null
  fi
fi
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
# The ckpt extra (torch, numpy: fs3.ckpt and its tests) only when missing: re-runs stay fast.
extras=dev
.venv/bin/python -c 'import torch, numpy' >/dev/null 2>&1 || extras=dev,ckpt
.venv/bin/python -m pip install -q -e ".[$extras]"
