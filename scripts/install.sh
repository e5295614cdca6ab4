#!/usr/bin/env bash
# Install everything fs3 needs on a fresh Debian machine (as root):
# system packages, then a virtual environment in .venv with fs3 and its tools.
#
# Quiet and quick when nothing changed: pip runs only when .venv is missing or
# broken, or when pyproject.toml, this script or the venv's Python changed
# (a hash of them is kept in .venv/.fs3-install-stamp-EXTRAS). pip's output goes to
# .venv/install.log and is shown only if the install fails.
set -euo pipefail
cd "$(dirname "$0")/.."
# podman, catatonit (its --init) and debootstrap: tests/deploy runs docker-compose.yml in
# containers built by scripts/build-image.sh.
PKGS="fuse3 libfuse3-dev pkg-config gcc python3-dev python3-venv fio sqlite3 iproute2 docker-compose git psmisc podman catatonit debootstrap"
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  # shellcheck disable=SC2086
  have=$(dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' $PKGS 2>/dev/null | awk '$1 == "ii" {print $2}' || true)
  need=""
  for p in $PKGS; do
    grep -qx "$p" <<<"$have" || need="$need $p"
  done
  if [ -n "$need" ]; then
    echo "fs3: installing system packages:$need"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq $need >/dev/null
  fi
fi
PY=${PYTHON:-python3}
if ! .venv/bin/python -c '' 2>/dev/null; then
  rm -rf .venv
  "$PY" -m venv .venv
fi
# FS3_EXTRAS names the optional extras: scripts/test.sh adds ckpt (torch, numpy) for the
# checkpoint tests; a plain install (scripts/up.sh) does without them.
EXTRAS=${FS3_EXTRAS:-dev}
STAMP=".venv/.fs3-install-stamp-$EXTRAS"
want=$({ cat pyproject.toml scripts/install.sh; echo "$EXTRAS"; .venv/bin/python -VV; pwd -P; } | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  exit 0
fi
echo "fs3: installing fs3 and its tools into .venv (first run, or pyproject.toml changed) ..."
rm -f "$STAMP"
# The editable install is a plain .pth entry for this directory (see
# [tool.setuptools] package-dir in pyproject.toml), so `import fs3` finds this
# package from any working directory, even next to another folder named fs3.
if ! { .venv/bin/python -m pip install -q --upgrade pip &&
  .venv/bin/python -m pip install -q -e ".[$EXTRAS]"; } >.venv/install.log 2>&1; then
  tail -n 40 .venv/install.log >&2
  echo "fs3: install failed (full output: .venv/install.log)" >&2
  exit 1
fi
echo "$want" >"$STAMP"
