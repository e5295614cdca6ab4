"""``fs3 mount --cluster FILE MOUNTPOINT [--foreground] [-o opt,...] [--config FILE]``.

Lifecycle:

* Preflight in the calling process: the mount point must be a directory; a
  *stale* FUSE mount there (ENOTCONN: its daemon crashed) is cleared with
  ``fusermount3 -u -z`` and said so; a live mount is refused.
* Without ``--foreground`` the command forks, the child starts a new session
  and forks again (the daemon); the daemon connects to the cluster, mounts,
  checks that the mount answers, and only then tells the waiting command
  through a pipe, so ``fs3 mount`` exits 0 only when the mount is usable, or
  non-zero with the daemon's error. Forking happens before any thread exists
  (gRPC, asyncio.to_thread workers), which is the only safe order.
* The daemon runs on one asyncio loop (pyfuse3's asyncio mode, the client
  core, the USRBIO agent, background writes): see :func:`serve` for why.
* The daemon logs to a file and the command prints its path: ``[fuse] log_file``
  or ``/var/log/fs3/mount-<mountpoint>.log`` (root) or
  ``~/.local/state/fs3/mount-<mountpoint>.log``. With ``--foreground`` the
  log goes to stderr unless a log file is configured.
* SIGTERM/SIGINT/SIGHUP: write every buffer, report lengths, unmount, exit 0.
  ``fusermount3 -u`` ends the FUSE session; the daemon then closes its open
  files (reporting lengths) and exits.
* After mounting, the kernel side is tuned through sysfs: the mount's BDI
  ``read_ahead_kb`` (sequential reads arrive as 1 MiB requests instead of the
  default 128 KiB) and the connection's ``max_background`` (more readahead and
  async requests in flight).

* The daemon hosts the USRBIO agent of the mount (:mod:`fs3.usrbio.agent`,
  socket at ``fs3.usrbio.shm.agent_socket_path(MOUNTPOINT)``), its I/O served
  by :class:`fs3.fuse.ops.UsrbioBackend` through the same client core, on the
  same loop.

``-o`` options: keys of the ``[fuse]`` config section (``-o attr_timeout_s=5``),
``transport=auto|grpc|tcp|shm``, and anything else is handed to libfuse/the
kernel mount (``ro``, ``noatime``, ``max_read=N`` ...). The kernel-cache keys
(``attr_timeout_s``, ``entry_timeout_s``, ``dir_entry_timeout_s``,
``negative_timeout_s``) default to JuiceFS's mount defaults (1 s, 1 s, 1 s,
0); ``fs3 mount --help`` lists them (:func:`options_help`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import cast

from fs3 import config as _config
from fs3 import logs
from fs3.mounts import mount_fstype, mount_state

log = logging.getLogger("fs3.fuse")

FUSERMOUNT = "fusermount3"


class MountError(Exception):
    """A mount that cannot be made; the message says why and what to do."""


# ---------------------------------------------------------------------- mount state


def preflight(mountpoint: str, say: Callable[[str], None]) -> None:
    """Refuse unusable mount points; clear a stale mount from a crashed daemon."""
    if not os.path.exists("/dev/fuse"):
        raise MountError(
            "/dev/fuse does not exist: load the fuse module (modprobe fuse) or run the container "
            "with --device /dev/fuse --cap-add SYS_ADMIN"
        )
    state = mount_state(mountpoint)
    if state == "stale":
        exe = shutil.which(FUSERMOUNT)
        say(
            f"{mountpoint} is a stale FUSE mount (ENOTCONN: its daemon is gone); clearing it with {FUSERMOUNT} -u -z"
        )
        r = subprocess.run(
            [exe or FUSERMOUNT, "-u", "-z", mountpoint],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if mount_state(mountpoint) == "stale":
            raise MountError(
                f"{mountpoint} is a stale FUSE mount and `{FUSERMOUNT} -u -z` failed "
                f"({r.stderr.strip()}); clear it by hand (umount -l {mountpoint}) and retry"
            )
    elif state in ("mounted", "other"):
        raise MountError(
            f"{mountpoint} is already a mount point ({mount_fstype(mountpoint)}); "
            f"unmount it first ({FUSERMOUNT} -u {mountpoint})"
        )
    if not os.path.isdir(mountpoint):
        raise MountError(f"mount point {mountpoint} does not exist or is not a directory")


def default_log_path(mountpoint: str) -> str:
    """Where the daemon logs when ``[fuse] log_file`` is empty."""
    tag = mountpoint.strip("/").replace("/", "_") or "root"
    if os.geteuid() == 0:
        base = Path("/var/log/fs3")
    else:
        base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "fs3"
    return str(base / f"mount-{tag}.log")


# ---------------------------------------------------------------------- options


def parse_options(opts: Sequence[str], cfg: _config.ClientConfig) -> set[str]:
    """Apply fs3 keys from ``-o`` to ``cfg``; return the options meant for libfuse."""
    fuse_fields = {f.name: f for f in dataclasses.fields(_config.FuseSection)}
    passthrough: set[str] = set()
    for group in opts:
        for item in group.split(","):
            item = item.strip()
            if not item:
                continue
            key, eq, value = item.partition("=")
            if key in fuse_fields:
                cur = getattr(cfg.fuse, key)
                try:
                    if isinstance(cur, bool):
                        new: object = value.lower() in ("1", "true", "yes", "on") if eq else True
                    elif isinstance(cur, int):
                        new = int(value)
                    elif isinstance(cur, float):
                        new = float(value)
                    else:
                        new = value
                except ValueError:
                    raise MountError(f"-o {item}: expected a {type(cur).__name__}") from None
                setattr(cfg.fuse, key, new)
            elif key == "transport":
                cfg.transport.kind = value
            elif key == "default_permissions":
                continue  # always on (see fs3.fuse.ops)
            else:
                passthrough.add(item)
    try:
        cfg.fuse.validate()
        cfg.transport.validate()
    except _config.ConfigError as e:
        raise MountError(str(e)) from None
    return passthrough


def fuse_options(cfg: _config.ClientConfig, extra: set[str], cluster_file: str = "") -> set[str]:
    name = "fs3"
    if cluster_file:
        try:
            name = f"fs3:{_config.read_cluster_file(cluster_file).cluster_id}"
        except Exception:  # noqa: BLE001 - only a label in the mount table
            pass
    opts = {f"fsname={name}", "subtype=fs3", "default_permissions"}
    if cfg.fuse.allow_other:
        opts.add("allow_other")
    return opts | extra


# ---------------------------------------------------------------------- kernel tuning


def tune_kernel(mountpoint: str, cfg: _config.FuseSection) -> None:
    """Raise the mount's readahead and max_background through sysfs (best effort, logged)."""
    try:
        dev = os.stat(mountpoint).st_dev
    except OSError as e:
        log.warning("cannot stat %s to tune readahead: %s", mountpoint, e)
        return
    bdi = Path(f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb")
    if cfg.max_readahead_kb > 0:
        try:
            bdi.write_text(str(cfg.max_readahead_kb))
            log.info("readahead of %s set to %s KiB (%s)", mountpoint, bdi.read_text().strip(), bdi)
        except OSError as e:
            log.warning(
                "cannot set %s: %s (sequential reads stay at the default readahead)", bdi, e
            )
    conn = Path(f"/sys/fs/fuse/connections/{dev}")
    if not conn.exists() and os.geteuid() == 0 and Path("/sys/fs/fuse/connections").is_dir():
        # fusectl (the per-connection knobs) is not always mounted; mounting it is harmless.
        subprocess.run(
            ["mount", "-t", "fusectl", "fusectl", "/sys/fs/fuse/connections"],
            capture_output=True,
            timeout=10,
            check=False,
        )
    try:
        (conn / "max_background").write_text(str(cfg.max_background))
        (conn / "congestion_threshold").write_text(str(max(1, cfg.max_background * 3 // 4)))
        log.info(
            "fuse connection %s: max_background=%s",
            dev,
            (conn / "max_background").read_text().strip(),
        )
    except OSError as e:
        log.warning("cannot tune fuse connection %s: %s", conn, e)


# ---------------------------------------------------------------------- the daemon


def serve(
    cluster: str,
    mountpoint: str,
    cfg: _config.ClientConfig,
    extra: set[str],
    ready: Callable[[str], None],
) -> int:
    """Connect, mount, serve until unmounted or signalled; ``ready("ok"|"error: ...")`` once.

    Before that, ``ready("note: ...")`` may report progress the user should see
    at once (e.g. which mgmtd addresses the connect is waiting for).

    Everything runs on ONE asyncio loop in the main thread: pyfuse3 in its
    asyncio mode (``pyfuse3.asyncio.enable()``, pyfuse3 >= 3.2), the client
    core, the USRBIO agent (anyio) and the daemon's background tasks. pyfuse3
    used to run on trio and every handler crossed to the client's
    asyncio loop in a second thread (fs3.client.bridge): two schedulers, two
    cross-thread wake-ups and GIL hand-offs per request, 15-20 % of the
    daemon's CPU in profiles. Measured with one loop (2 cores, 3 storage
    nodes, shm, same cluster, median of 3): daemon CPU per 4 KiB O_DIRECT
    read 0.95 -> 0.81 ms, per create+close 4.97 -> 3.99 ms (4 FUSE requests),
    i.e. ~0.15-0.25 ms less per FUSE request; randread 800 -> 857 IOPS.
    """
    import pyfuse3
    import pyfuse3.asyncio

    from fs3.rpc import settings
    from fs3.rpc.loop import run as run_loop

    pyfuse3.asyncio.enable()
    settings.configure(cfg.rpc)
    code = [0]
    try:
        # pyfuse3's asyncio mode runs on uvloop too ([rpc] event_loop)
        run_loop(_serve_async(cluster, mountpoint, cfg, extra, ready, code), cfg.rpc.event_loop)
    except BaseException:  # noqa: BLE001 - the daemon reports, logs and exits with 1
        log.exception("FUSE main loop failed")
        ready("error: the FUSE main loop failed (see the log)")
        return 1
    return code[0]


class _Started:
    """``task_status`` for an anyio ``serve(task_status=...)`` run as a plain asyncio task."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    def started(self, value: object = None) -> None:
        self.event.set()


async def _serve_async(
    cluster: str,
    mountpoint: str,
    cfg: _config.ClientConfig,
    extra: set[str],
    ready: Callable[[str], None],
    code: list[int],
) -> None:
    import pyfuse3

    from fs3.errors import FsError
    from fs3.fuse.ops import Fs3Operations, FuseClient, UsrbioBackend
    from fs3.usrbio.agent import UsrbioAgent
    from fs3.usrbio.shm import agent_socket_path

    try:
        client = cast(
            FuseClient,
            await FuseClient.connect(cluster, config=cfg, on_wait=lambda m: ready(f"note: {m}")),
        )
    except (FsError, OSError) as e:
        ready(f"error: cannot connect to the cluster in {cluster}: {e}")
        code[0] = 1
        return
    ops = Fs3Operations(client, cfg.fuse)
    opts = fuse_options(cfg, extra, cluster)
    log.info(
        "mounting %s (cluster file %s, options %s, transport %s)",
        mountpoint,
        cluster,
        sorted(opts),
        cfg.transport.kind,
    )
    try:
        pyfuse3.init(ops, mountpoint, opts)
    except (RuntimeError, OSError) as e:
        ready(f"error: mounting {mountpoint} failed: {e} (see the log)")
        try:
            async with asyncio.timeout(30):
                await client.close()
        except Exception:  # noqa: BLE001
            log.exception("closing the client failed")
        code[0] = 1
        return
    ops.lowlevel.install_fallocate(ops.fallocate)
    loop = asyncio.get_running_loop()
    signalled: list[int] = []
    sigs = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    helpers: list[asyncio.Task[None]] = []

    async def drain() -> None:
        # Bounded: with the cluster unreachable, unmount after the client's deadline.
        try:
            async with asyncio.timeout(cfg.client.retry_deadline_s + 5):
                await ops.drain()
        except TimeoutError:
            log.warning("draining write buffers timed out; unmounting anyway")

    async def on_signal() -> None:
        log.info("signal %d: writing buffers and unmounting", signalled[0])
        await drain()
        try:
            pyfuse3.terminate()
        except asyncio.InvalidStateError:
            # pyfuse3's asyncio notify_closing() raced with the FUSE fd becoming
            # readable: the session's exit flag is set, so the worker that won the
            # race and the ones behind the read lock stop after this request.
            pass

    def signal_received(s: int) -> None:
        if signalled:
            return  # already shutting down
        signalled.append(s)
        helpers.append(loop.create_task(on_signal()))

    async def check_ready() -> None:
        try:
            await asyncio.to_thread(os.stat, mountpoint)
        except OSError as e:
            ready(f"error: the mount at {mountpoint} does not answer: {e}")
            return
        await asyncio.to_thread(tune_kernel, mountpoint, cfg.fuse)
        log.info("mounted %s", mountpoint)
        ready("ok")

    agent = UsrbioAgent(UsrbioBackend(ops))
    started = _Started()

    async def usrbio() -> None:
        # Runs beside the FUSE loop: a failing agent must not end the mount.
        try:
            await agent.serve(agent_socket_path(mountpoint), task_status=started)
        except Exception:
            log.exception("USRBIO agent stopped; the mount keeps working without it")

    agent_task: asyncio.Task[None] | None = None
    try:
        ops.start()
        agent_task = loop.create_task(usrbio(), name="usrbio-agent")
        started_wait = loop.create_task(started.event.wait())
        await asyncio.wait({agent_task, started_wait}, return_when=asyncio.FIRST_COMPLETED)
        started_wait.cancel()
        for s in sigs:
            loop.add_signal_handler(s, signal_received, s)
        helpers.append(loop.create_task(check_ready(), name="check-ready"))
        try:
            await pyfuse3.main(min_tasks=4, max_tasks=max(4, cfg.fuse.max_tasks))
        finally:
            for s in sigs:
                loop.remove_signal_handler(s)
            for t in helpers:
                t.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
        await drain()
        log.info(
            "FUSE session ended%s", f" (signal {signalled[0]})" if signalled else " (unmounted)"
        )
        # before the client's close, which a supervisor may cut short
        log.info(
            "stats: %s; transport %s: %s; read batches: %s",
            ops.stats,
            client.transport.kind,
            getattr(client.transport, "stats", {}),
            client.storage.read_batch_stats(),
        )
    except BaseException:
        log.exception("FUSE main loop failed")
        ready("error: the FUSE main loop failed (see the log)")
        code[0] = 1
    finally:
        # The agent and the background tasks (writes, flusher) stop before the unmount
        # and the client's close, as the trio nurseries used to cancel them.
        if agent_task is not None:
            agent_task.cancel()
            await asyncio.gather(agent_task, return_exceptions=True)
        await ops.stop()
        try:
            pyfuse3.close(unmount=True)
        except Exception:  # noqa: BLE001 - unmount is best effort at exit
            log.exception("unmount of %s failed", mountpoint)
        try:
            async with asyncio.timeout(60):
                await client.close()
        except BaseException:  # noqa: BLE001
            log.exception("closing the client failed")


def _setup_logging(cfg: _config.ClientConfig, path: str | None) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    logs.setup(cfg.log.level, path or "")


#: the kernel-cache options and what each allows (``fs3 mount --help``, README "Mount options")
CACHE_OPTIONS: tuple[tuple[str, str], ...] = (
    ("attr_timeout_s", "seconds the kernel may answer stat(2) from cached attributes"),
    ("entry_timeout_s", "seconds the kernel may resolve a file's name without asking fs3"),
    ("dir_entry_timeout_s", "the same for a directory's name"),
    ("negative_timeout_s", 'seconds the kernel may cache "no such entry" (0: never)'),
)


def options_help() -> str:
    """The ``-o`` keys with their defaults, for ``fs3 mount --help``."""
    d = _config.FuseSection()
    lines = [
        "kernel caches (JuiceFS's mount defaults; -o KEY=SECONDS):",
        *(f"  {k}={getattr(d, k):g}  {what}" for k, what in CACHE_OPTIONS),
        "  Listings are READDIRPLUS (each entry comes with its attributes, cached like a lookup's).",
        "  Consistency: close-to-open. An open(2) always asks the meta service, so a file",
        "  written and closed on another mount is read whole, with its new size and mtime,",
        "  after open; other changes made elsewhere (rename, unlink, chmod, a new file) show",
        "  within these timeouts. Changes made through this mount show at once on it.",
        "",
        "other -o keys ([fuse] section of the client config):",
    ]
    cache = {k for k, _ in CACHE_OPTIONS}
    for f in dataclasses.fields(_config.FuseSection):
        if f.name not in cache:
            lines.append(f"  {f.name}={getattr(d, f.name)!r}")
    lines += [
        "  transport=grpc|tcp|shm  the data transport ([transport] kind)",
        "anything else goes to libfuse/the kernel (ro, noatime, max_read=N ...);",
        "default_permissions is always on.",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="fs3 mount",
        description="Mount an fs3 cluster with FUSE.",
        epilog=options_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--cluster",
        default=os.environ.get("FS3_CLUSTER_FILE", ""),
        help="cluster file (mgmtd addresses)",
    )
    p.add_argument("mountpoint")
    p.add_argument("--foreground", "-f", action="store_true", help="do not detach; log to stderr")
    p.add_argument(
        "-o", dest="options", action="append", default=[], help="mount options, comma separated"
    )
    p.add_argument(
        "--config",
        default=None,
        help="client config file (TOML: [client], [transport], [fuse] ...)",
    )
    args = p.parse_args(argv)

    def err(msg: str) -> int:
        print(f"fs3 mount: {msg}", file=sys.stderr, flush=True)
        return 1

    try:
        cfg = _config.load(_config.ClientConfig, args.config)
    except _config.ConfigError as e:
        return err(str(e))
    cluster = args.cluster or cfg.cluster.cluster_file
    if not cluster:
        return err("no cluster file: pass --cluster FILE (or set FS3_CLUSTER_FILE)")
    if not os.path.isfile(cluster):
        return err(f"cluster file {cluster} does not exist")
    cluster = os.path.abspath(cluster)
    mountpoint = os.path.abspath(args.mountpoint)
    try:
        extra = parse_options(args.options, cfg)
        preflight(mountpoint, lambda m: print(f"fs3 mount: {m}", file=sys.stderr, flush=True))
    except MountError as e:
        return err(str(e))

    log_path = cfg.fuse.log_file or (None if args.foreground else default_log_path(mountpoint))
    if args.foreground:
        try:
            _setup_logging(cfg, log_path)
        except OSError as e:
            return err(f"cannot open log file {log_path}: {e}")
        if log_path:
            print(f"fs3 mount: logging to {log_path}", file=sys.stderr, flush=True)

        def ready_fg(msg: str) -> None:
            if msg.startswith("note: "):
                print(f"fs3 mount: {msg.removeprefix('note: ')}", file=sys.stderr, flush=True)
            elif msg != "ok":
                print(f"fs3 mount: {msg.removeprefix('error: ')}", file=sys.stderr, flush=True)

        return serve(cluster, mountpoint, cfg, extra, ready_fg)
    assert log_path is not None
    created = _new_paths(Path(log_path))
    try:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "a"):
            pass
    except OSError as e:
        return err(f"cannot open log file {log_path}: {e}")
    rc = _daemonize(cluster, mountpoint, cfg, extra, log_path)
    if rc != 0:
        _remove_new(created)
    return rc


def _log_tail(path: str, start: int, lines: int = 20) -> str:
    """The last ``lines`` lines this run appended to the log at ``path``."""
    try:
        with open(path, "rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip("\n").splitlines()[-lines:])


def _new_paths(log_path: Path) -> list[Path]:
    """The log file and the parent directories that do not exist yet (deepest first).

    A failed mount removes exactly these again: the command already printed the
    error (and the log's tail), so a log it created is no longer needed.
    """
    out: list[Path] = []
    p = log_path
    while not p.exists() and p != p.parent:
        out.append(p)
        p = p.parent
    return out


def _remove_new(paths: list[Path]) -> None:
    for p in paths:
        try:
            if p.is_dir():
                p.rmdir()  # only if empty: another mount may log there by now
            else:
                p.unlink()
        except OSError:
            return


def _daemonize(
    cluster: str, mountpoint: str, cfg: _config.ClientConfig, extra: set[str], log_path: str
) -> int:
    """Double fork; return only when the daemon reports the mount usable (0) or failed (1)."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        log_start = os.path.getsize(log_path)
    except OSError:
        log_start = 0
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid > 0:
        os.close(wfd)
        msg = ""
        with os.fdopen(rfd, "rb") as pipe:
            for raw in pipe:  # notes as they come (the user sees them at once), then the result
                line = raw.decode(errors="replace").strip()
                if line.startswith("note: "):
                    print(f"fs3 mount: {line.removeprefix('note: ')}", file=sys.stderr, flush=True)
                elif line:
                    msg = line
        os.waitpid(pid, 0)
        if msg.startswith("ok"):
            daemon_pid = msg.split()[1] if len(msg.split()) > 1 else "?"
            print(
                f"fs3 mount: {mountpoint} mounted (daemon pid {daemon_pid}); log: {log_path}",
                flush=True,
            )
            print(
                f"fs3 mount: unmount with `{FUSERMOUNT} -u {mountpoint}` or `kill {daemon_pid}`",
                flush=True,
            )
            return 0
        crashed = not msg or "see the log" in msg
        if not msg:
            msg = "error: the daemon exited before the mount was ready"
        print(f"fs3 mount: {msg.removeprefix('error: ')}", file=sys.stderr, flush=True)
        tail = _log_tail(log_path, log_start) if crashed else ""
        if tail:
            print(f"fs3 mount: the daemon's log ({log_path}) ends with:", file=sys.stderr)
            print(tail, file=sys.stderr, flush=True)
        return 1
    # first child
    try:
        os.close(rfd)
        os.setsid()
        if os.fork() > 0:
            os._exit(0)
        # the daemon
        os.chdir("/")
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        logfd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(logfd, 1)
        os.dup2(logfd, 2)
        os.close(devnull)
        os.close(logfd)
        _setup_logging(cfg, log_path)
        told = [False]

        def ready(msg: str) -> None:
            if msg.startswith("note: "):
                log.warning("%s", msg.removeprefix("note: "))
                if not told[0]:
                    with contextlib.suppress(OSError):
                        os.write(wfd, msg.encode() + b"\n")
                return
            if told[0]:
                if msg != "ok":
                    log.error("%s", msg)
                return
            told[0] = True
            if msg == "ok":
                msg = f"ok {os.getpid()}"
            else:
                log.error("%s", msg)
            try:
                os.write(wfd, msg.encode() + b"\n")
                os.close(wfd)
            except OSError:
                pass

        code = serve(cluster, mountpoint, cfg, extra, ready)
        if not told[0]:
            ready("error: the daemon stopped before the mount was ready")
        os._exit(code)
    except BaseException:  # noqa: BLE001 - a forked child must never return into the caller
        logging.getLogger("fs3.fuse").exception("daemon failed")
        os._exit(1)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
