#!/usr/bin/env bash
# README command 1: install everything fs3 needs (scripts/install.sh), start a local
# cluster on the embedded SQLite KV (2 mgmtd, 2 meta, 3 storage nodes x 2 targets,
# 3 replicas) and mount it with FUSE; prints the mount point.
#
#   bash scripts/up.sh [--dir DIR] [--mount MOUNTPOINT] [other `fs3 cluster up` options]
#
# Defaults: --dir /var/lib/fs3-local --mount /mnt/fs3. Running it again while the
# cluster is up only prints its status; a half-dead cluster is stopped and restarted
# from its data. Stop it with: .venv/bin/fs3 cluster down --dir /var/lib/fs3-local
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=/var/lib/fs3-local
MNT=/mnt/fs3
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) DIR=$2; shift 2 ;;
    --dir=*) DIR=${1#--dir=}; shift ;;
    --mount) MNT=$2; shift 2 ;;
    --mount=*) MNT=${1#--mount=}; shift ;;
    *) ARGS+=("$1"); shift ;;
  esac
done

bash scripts/install.sh
FS3=.venv/bin/fs3

# Running already? One status query (in one process) answers that and is printed if so.
show_if_healthy() {
  .venv/bin/python - "$DIR" "$MNT" 2>/dev/null <<'PY'
import sys
from pathlib import Path
from fs3.launcher import LocalCluster, render_status
s = LocalCluster(Path(sys.argv[1])).status()
ok = s["processes"] and all(p["alive"] for p in s["processes"]) and s["mount"] == sys.argv[2]
if ok:
    print("fs3 is already running in " + s["dir"])
    print(render_status(s))
sys.exit(0 if ok else 1)
PY
}

if [ -f "$DIR/state.json" ] && table=$(show_if_healthy); then
  printf '%s\n' "$table"
else
  if [ -f "$DIR/state.json" ]; then
    "$FS3" cluster down --dir "$DIR"   # stop what is left of an earlier run (data is kept)
  fi
  "$FS3" cluster up --dir "$DIR" --mount "$MNT" ${ARGS[@]+"${ARGS[@]}"}
fi
echo
echo "fs3 is mounted at $MNT   (cluster file: $DIR/fs3.cluster; stop: $FS3 cluster down --dir $DIR)"
