#!/usr/bin/env python3
"""Run the health checks of running podman containers, as Docker's daemon does.

podman schedules health checks with systemd timers. Where systemd is not PID 1
(minimal VMs, CI sandboxes, containers) nothing runs them: a container with a
health check stays "starting" for ever, and docker-compose's
``depends_on: condition: service_healthy`` never starts what depends on it.
This loop is that timer: every running container that has a health check gets
``podman healthcheck run`` (which records the result and the failing streak in
the container's state, where the Docker-compatible API reports it).

Timing: a container still "starting" is checked every ``--start-interval``
seconds (1 s, like Docker's ``start_interval``), then at its own ``interval``.
Failed checks count towards the container's ``retries`` unless they fall in its
``start_period`` (deploy/compose.local.yml sets one), as with Docker. Checks of
different containers run concurrently, at most one per container.

    python3 scripts/podman-healthchecks.py [--until-pid PID]

Stops on SIGTERM/SIGINT, or once PID (e.g. the ``podman system service``) has exited.
Uses the podman on PATH and its environment (``CONTAINERS_CONF`` included).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

POLL_S = 0.5


def running_with_healthcheck() -> dict[str, tuple[float, str]]:
    """{container id: (interval seconds, health status)} of running containers with a check."""
    ids = subprocess.run(
        ["podman", "ps", "-q", "--no-trunc"], capture_output=True, text=True, timeout=30
    ).stdout.split()
    if not ids:
        return {}
    r = subprocess.run(
        ["podman", "inspect", "--type", "container", *ids],
        capture_output=True,
        text=True,
        timeout=30,
    )
    try:
        infos = json.loads(r.stdout or "[]")
    except json.JSONDecodeError:
        return {}  # a container went away between ps and inspect: next round
    out: dict[str, tuple[float, str]] = {}
    for info in infos:
        hc = (info.get("Config") or {}).get("Healthcheck") or {}
        test = hc.get("Test") or []
        if not test or test[0] == "NONE" or not (info.get("State") or {}).get("Running"):
            continue
        interval = (hc.get("Interval") or 30_000_000_000) / 1e9
        health = (info.get("State") or {}).get("Health") or {}
        out[info["Id"]] = (interval, str(health.get("Status") or "starting"))
    return out


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--until-pid", type=int, help="exit once this process has exited")
    ap.add_argument(
        "--start-interval",
        type=float,
        default=1.0,
        help="seconds between checks of a container that is still starting",
    )
    args = ap.parse_args()
    stop = False

    def on_signal(_sig: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    last: dict[str, float] = {}
    running: dict[str, subprocess.Popen[bytes]] = {}
    while not stop and (args.until_pid is None or pid_alive(args.until_pid)):
        for cid, proc in list(running.items()):
            if proc.poll() is not None:
                del running[cid]
        try:
            containers = running_with_healthcheck()
        except (OSError, subprocess.TimeoutExpired) as e:
            print(f"podman-healthchecks: {e}", file=sys.stderr, flush=True)
            containers = {}
        now = time.monotonic()
        for cid, (interval, status) in containers.items():
            every = min(interval, args.start_interval) if status == "starting" else interval
            if cid in running or now - last.get(cid, 0.0) < every:
                continue
            last[cid] = now
            running[cid] = subprocess.Popen(
                ["podman", "healthcheck", "run", cid],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        for cid in list(last):
            if cid not in containers and cid not in running:
                del last[cid]
        time.sleep(POLL_S)
    for proc in running.values():
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
