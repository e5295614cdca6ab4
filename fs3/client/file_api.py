"""The synchronous Python API: ``fs3.connect(...)`` → :class:`Client`.

The goal is that code written for Python's built-in files and ``os`` functions
works unchanged against fs3: the same modes, the same positions, the same
exceptions (``OSError`` subclasses chosen by errno, e.g. ``FileNotFoundError``).

How it is built:

* Every call runs the asyncio core (:class:`~fs3.client.core.AsyncClient`) on
  the bridge loop (:mod:`fs3.client.bridge`): one bridge round trip per
  operation, except the meta calls of ``stat``/``lstat`` and ``open`` (with or
  without ``O_CREAT``) and the close of a file that has nothing to flush: with
  ``[client] sync_meta`` (the default, native transport) the calling thread
  makes those itself, on a connection of its own
  (:mod:`fs3.rpc.native.sync_client`), when every directory on the path is in
  the directory cache; no cross-thread hand-off, which on a busy host costs as
  much as the RPC. Anything else, and a retry after a retryable failure, goes
  through the bridge (the one retry policy, :meth:`MetaClient.call`).
  Consistency is the same on both paths: the directory cache is read from the
  caller's thread (single ``dict`` reads, see :meth:`AsyncClient.known_parent`)
  and written only on the loop, and the open handles and quiet-close queue the
  two paths share are thread-safe (:class:`AsyncClient`).
* Paths are resolved client-side, one ``Lookup`` per component (meta checks
  search permission on each), following symlinks like the kernel does.
* A file object is what the built-in ``open`` builds: a raw file
  (:class:`RawFile`, an ``io.RawIOBase`` with positioned reads/writes on the
  fs3 handle) wrapped in ``io.BufferedReader``/``BufferedWriter``/
  ``BufferedRandom`` and, in text mode, ``io.TextIOWrapper``. So ``readline``,
  iteration, ``peek``, ``read1``, buffering and text decoding behave exactly
  like Python's own, and the subclasses only add :meth:`fsync`.
* Errors: an :class:`~fs3.errors.FsError` becomes ``OSError(errno, strerror,
  filename)``, which Python maps to the right subclass automatically.
"""

from __future__ import annotations

import atexit
import errno as _errno
import functools
import io
import os
import stat as _stat
import threading
import weakref
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

from fs3 import config as _config
from fs3.client.bridge import Bridge
from fs3.client.core import AsyncClient, Caller, FileHandle
from fs3.errors import Code, FsError
from fs3.proto import meta_pb2
from fs3.rpc.native.sync_client import SyncPool

T = TypeVar("T")

DEFAULT_BUFFER_SIZE = 64 * 1024  # buffered objects; large reads/writes bypass the buffer

PathLike = str | bytes | os.PathLike[str] | os.PathLike[bytes]


def _fspath(path: PathLike) -> str | bytes:
    p = os.fspath(path)
    if isinstance(p, str) and "\x00" in p or isinstance(p, bytes) and b"\x00" in p:
        raise ValueError("embedded null byte")
    return p


def _oserror(e: FsError, filename: Any = None, filename2: Any = None) -> OSError:
    msg = os.strerror(e.errno) if e.errno else e.message
    if e.code != Code.POSIX:
        msg = f"{msg} [{e.code.name}: {e.message}]"  # keep the cause of non-POSIX failures
    if filename2 is not None:
        return OSError(e.errno, msg, filename, None, filename2)
    if filename is not None:
        return OSError(e.errno, msg, filename)
    return OSError(e.errno, msg)


def _current_umask() -> int:
    # os.umask is the only way to read it; set it straight back.
    old = os.umask(0o022)
    os.umask(old)
    return old


def _token_identity(token: str) -> Any:
    """The claims of a user token (unverified: servers check them), else None."""
    from fs3.security.tokens import peek

    c = peek(token)
    return c if c is not None and c.kind == "user" else None


class Client:
    """A connected fs3 client with ``os``-like functions and ``open``.

    Create with :func:`fs3.connect`. Thread-safe (calls are serialised onto
    the bridge loop, which runs them concurrently). Close with :meth:`close`
    or use as a context manager.
    """

    def __init__(
        self, core: AsyncClient, bridge: Bridge, *, caller: Caller, owns_bridge: bool = True
    ) -> None:
        self._core = core
        self._bridge = bridge
        self.caller = caller
        self._owns_bridge = owns_bridge
        self.umask = _current_umask()
        self._closed = False
        self._lock = threading.Lock()
        self._files: weakref.WeakSet[Any] = weakref.WeakSet()  # open file objects (outermost)
        # meta calls from the caller's thread (see the module docstring); None: off
        cfg = core.config
        self._sync: SyncPool | None = None
        if cfg.client.sync_meta and cfg.rpc.transport == "native":
            # configured as the core's asyncio channels are (fs3.rpc.channel.ChannelPool)
            self._sync = SyncPool(None, core.credential)

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    def connect(
        cls,
        cluster_file: str | os.PathLike[str] | None = None,
        *,
        uid: int | None = None,
        gid: int | None = None,
        groups: tuple[int, ...] | None = None,
        transport: str | None = None,
        config: _config.ClientConfig | None = None,
        bridge: Bridge | None = None,
        token: str | None = None,
        token_file: str | None = None,
    ) -> Client:
        """Connect; ``uid``/``gid`` default to this process's, or to the user token's.

        The credential is ``token`` (or ``token_file``, ``$FS3_TOKEN``,
        ``$FS3_TOKEN_FILE``; ``fs3 admin user token NAME`` prints one), else the
        cluster secret beside the cluster file if this user may read it (the
        operator who ran ``fs3 cluster up``). A user token acts only as its own
        uid/gid/groups: servers refuse calls that claim another (``uid=0`` with a
        user token fails with ``PermissionError``).

        Raises the ``OSError`` subclass ``open`` would: ``FileNotFoundError``,
        ``PermissionError`` or ``IsADirectoryError`` for an unreadable cluster
        file, ``TimeoutError`` if no mgmtd leader answers within ``[client]
        connect_timeout_s``, plain ``OSError(EINVAL)`` for a missing or malformed
        cluster file name or content (see :meth:`AsyncClient.connect`).
        """
        own = bridge is None
        br = bridge or Bridge(event_loop=config.rpc.event_loop if config is not None else None)
        try:
            cred = None
            if token or token_file:
                from fs3.rpc.auth import credential_from

                cred = credential_from(
                    token=token,
                    token_file=token_file,
                    cluster_file=str(cluster_file) if cluster_file else None,
                )
            core = br.run(
                AsyncClient.connect(
                    cluster_file, config=config, transport=transport, credential=cred
                )
            )
        except FsError as e:
            if own:
                br.close()
            # The message already says what failed and where (file, addresses).
            raise OSError(e.errno, e.message) from None
        except BaseException:
            if own:
                br.close()
            raise
        me = Caller.current()
        claims = _token_identity(core.credential.token if core.credential else "")
        if claims is not None:  # a user token: its identity, not this process's
            me = Caller(claims.uid, claims.gid, tuple(claims.groups), me.pid)
            if groups is None and uid is None and gid is None:
                groups = tuple(claims.groups)
        caller = Caller(
            me.uid if uid is None else uid,
            me.gid if gid is None else gid,
            (me.groups if uid is None and gid is None else ()) if groups is None else tuple(groups),
            me.pid,
        )
        client = cls(core, br, caller=caller, owns_bridge=own)
        # Like built-in files flushed at exit: close sessions (reporting lengths)
        # while the bridge thread still runs, not from __del__ during teardown.
        ref = weakref.ref(client)
        atexit.register(_close_at_exit, ref)
        return client

    @property
    def core(self) -> AsyncClient:
        """The asyncio core (for code already on the bridge loop)."""
        return self._core

    @property
    def bridge(self) -> Bridge:
        return self._bridge

    def close(self) -> None:
        """Close open files' sessions, the connections and (if owned) the bridge."""
        with self._lock:
            if self._closed:
                return
        for f in list(
            self._files
        ):  # flush buffers and close sessions, as interpreter exit does for files
            try:
                f.close()
            except Exception:
                pass
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._bridge.run(self._core.close())
        finally:
            if self._sync is not None:
                self._sync.close()
            if self._owns_bridge:
                self._bridge.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, coro: Coroutine[Any, Any, T], filename: Any = None, filename2: Any = None) -> T:
        if self._closed:
            coro.close()
            raise ValueError("I/O operation on closed fs3 client")
        try:
            return self._bridge.run(coro)
        except FsError as e:
            raise _oserror(e, filename, filename2) from None

    # ------------------------------------------------------------------ this thread's meta calls

    @property
    def sync_meta(self) -> bool:
        """True if meta calls of stat/open are made from the calling thread."""
        return self._sync is not None

    def _meta_now(self, method: str, req: Any) -> Any:
        """``MetaService.<method>(req)`` from this thread; a retryable failure continues
        on the loop with the client's retry policy (same request, same request id)."""
        assert self._sync is not None
        try:
            return self._core.meta.call_now(method, req, self._sync)
        except FsError as e:
            if not e.retryable:
                raise
        return self._bridge.run(self._core.meta.call(method, req))

    def _now(self, fn: Callable[[], T], filename: Any = None) -> T:
        """:meth:`_run` for work done on this thread."""
        if self._closed:
            raise ValueError("I/O operation on closed fs3 client")
        try:
            return fn()
        except FsError as e:
            raise _oserror(e, filename) from None

    def _stat_now(self, p: str | bytes, follow: bool) -> meta_pb2.Attr | None:
        """``stat`` as one Lookup from this thread when the path's directories are
        cached; None: resolve on the loop (uncached directory, a symlink to follow,
        ``.``/``..``/trailing slash, the root)."""
        known = self._core.known_parent(self.caller, p)
        if known is None:
            return None
        parent, name = known
        r = self._meta_now(
            "Lookup", meta_pb2.LookupRequest(user=self.caller.to_proto(), parent=parent, name=name)
        )
        if follow and _stat.S_ISLNK(r.attr.mode):
            return None
        return self._core._overlay(r.attr)

    def _open_now(self, p: str | bytes, flags: int) -> FileHandle | None:
        """``open`` as one Create (``O_CREAT``) or one Lookup and one Open from this
        thread when the path's directories are cached; None: open on the loop (a
        symlink, a directory, uncached directories, paths ending in ``/``)."""
        core, caller = self._core, self.caller
        known = core.known_parent(caller, p)
        if known is None:
            return None
        parent, name = known
        req: Any
        if flags & os.O_CREAT:
            req = core.create_request(caller, parent, name, 0o666 & ~self.umask, flags)
            method = "Create"
        else:
            attr = self._meta_now(
                "Lookup", meta_pb2.LookupRequest(user=caller.to_proto(), parent=parent, name=name)
            ).attr
            if not _stat.S_ISREG(attr.mode):
                return None  # the loop path follows a symlink, refuses a directory
            req = core.open_request(caller, attr.inode, flags)
            method = "Open"
        refs = core.take_quiet_closes(req, caller)
        try:
            r = self._meta_now(method, req)
        except BaseException as e:
            core.requeue_quiet_closes(caller, refs)
            if isinstance(e, FsError) and e.errno == _errno.ELOOP and not flags & os.O_EXCL:
                return None  # a symlink in the last place: the loop path walks it
            raise
        if method == "Create":
            core._parent_changed(r)
        h = core.opened_now(caller, r, flags)
        if h is None:  # it needs storage work first (a truncate that shrank the file)
            h = self._bridge.run(core._opened(caller, r, flags))
        return h

    # ------------------------------------------------------------------ path helpers

    async def _resolve(self, path: str | bytes, follow: bool = True) -> meta_pb2.Attr:
        return await self._core.resolve(self.caller, path, follow=follow)

    async def _parent(self, path: str | bytes) -> tuple[meta_pb2.Attr, bytes]:
        return await self._core.resolve_parent(self.caller, path)

    # ------------------------------------------------------------------ open

    def open(
        self,
        path: PathLike,
        mode: str = "r",
        buffering: int = -1,
        encoding: str | None = None,
        errors: str | None = None,
        newline: str | None = None,
    ) -> Any:
        """Open a file like the built-in :func:`open` (modes r/w/x/a, +, b/t)."""
        p = _fspath(path)
        flags, readable, writable, append, binary = _parse_mode(
            mode, buffering, encoding, errors, newline
        )
        h = self._now(lambda: self._open_now(p, flags), p) if self._sync is not None else None
        if h is None:
            h = self._run(self._open_handle(p, flags), p)
        raw = RawFile(self, h, p, _raw_mode(flags, readable, writable, append), append=append)
        try:
            if buffering == 1 and binary:
                import warnings

                warnings.warn(
                    "line buffering (buffering=1) isn't supported in binary mode, the default buffer size will be used",
                    RuntimeWarning,
                    stacklevel=2,
                )
            line_buffering = buffering == 1 and not binary
            if buffering == 0:
                self._files.add(raw)
                return raw
            size = DEFAULT_BUFFER_SIZE if buffering in (-1, 1) else buffering
            buffered: io.BufferedIOBase
            if readable and writable:
                buffered = BufferedRandom(raw, size)
            elif writable:
                buffered = BufferedWriter(raw, size)
            else:
                buffered = BufferedReader(raw, size)
            if binary:
                self._files.add(buffered)
                return buffered
            text = TextIOWrapper(buffered, encoding, errors, newline, line_buffering)
            text.mode = mode  # type: ignore[misc]
            self._files.add(text)
            return text
        except BaseException:
            raw.close()
            raise

    async def _open_handle(self, p: str | bytes, flags: int) -> FileHandle:
        core, caller = self._core, self.caller
        pb = os.fsencode(p)
        trailing_slash = pb.endswith(b"/")
        for _ in range(8):
            if not flags & os.O_CREAT:
                attr = await core.resolve(caller, pb, follow=True)
                _refuse_dir(attr)
                return await core.open(caller, attr.inode, flags)
            parent, name = await core.resolve_parent(caller, pb)
            if name in (b".", b"..") or trailing_slash:
                try:
                    attr = await core.resolve(caller, pb, follow=True)
                except FsError as e:
                    if e.errno == _errno.ENOENT and trailing_slash:
                        raise FsError(e.code, "is a directory", errno=_errno.EISDIR) from None
                    raise
                if flags & os.O_EXCL:
                    raise FsError(4000, "exists", errno=_errno.EEXIST)
                _refuse_dir(attr)
                return await core.open(caller, attr.inode, flags & ~(os.O_CREAT | os.O_EXCL))
            # One Create RPC creates the file or opens an existing one (EEXIST with
            # O_EXCL, EISDIR for a directory); only a symlink (ELOOP) needs the walk below.
            try:
                h, _attr = await core.create(caller, parent.inode, name, 0o666 & ~self.umask, flags)
                return h
            except FsError as e:
                if e.errno != _errno.ELOOP or flags & os.O_EXCL:
                    raise
            try:
                existing = await core.lookup(caller, parent.inode, name)
            except FsError as e:
                if e.errno != _errno.ENOENT:
                    raise
                existing = None
            if existing is None:
                try:
                    h, _attr = await core.create(
                        caller, parent.inode, name, 0o666 & ~self.umask, flags
                    )
                    return h
                except FsError as e:
                    if e.errno == _errno.EEXIST and not flags & os.O_EXCL:
                        continue  # lost a race with another creator: open it instead
                    raise
            if flags & os.O_EXCL:
                raise FsError(4000, "exists", errno=_errno.EEXIST)
            if _stat.S_ISLNK(existing.mode):
                try:
                    attr = await core.resolve(caller, pb, follow=True)
                except FsError as e:
                    if e.errno != _errno.ENOENT:
                        raise
                    # Dangling symlink: create its target (as open(2) does).
                    target = await core.readlink(caller, existing.inode)
                    if not target.startswith(b"/"):
                        target = _join_dir(pb, target)
                    pb = target
                    continue
                _refuse_dir(attr)
                return await core.open(caller, attr.inode, flags & ~os.O_CREAT)
            _refuse_dir(existing)
            return await core.open(caller, existing.inode, flags & ~os.O_CREAT)
        raise FsError(4000, "too many levels of symbolic links", errno=_errno.ELOOP)

    # ------------------------------------------------------------------ metadata

    def stat(self, path: PathLike, *, follow_symlinks: bool = True) -> os.stat_result:
        p = _fspath(path)
        if self._sync is not None:
            attr = self._now(lambda: self._stat_now(p, follow_symlinks), p)
            if attr is not None:
                return _stat_result(attr)
        return _stat_result(self._run(self._resolve(p, follow_symlinks), p))

    def lstat(self, path: PathLike) -> os.stat_result:
        return self.stat(path, follow_symlinks=False)

    def exists(self, path: PathLike) -> bool:
        try:
            self.stat(path)
        except (OSError, ValueError):
            return False
        return True

    def lexists(self, path: PathLike) -> bool:
        try:
            self.lstat(path)
        except (OSError, ValueError):
            return False
        return True

    def isdir(self, path: PathLike) -> bool:
        try:
            return _stat.S_ISDIR(self.stat(path).st_mode)
        except (OSError, ValueError):
            return False

    def isfile(self, path: PathLike) -> bool:
        try:
            return _stat.S_ISREG(self.stat(path).st_mode)
        except (OSError, ValueError):
            return False

    def islink(self, path: PathLike) -> bool:
        try:
            return _stat.S_ISLNK(self.lstat(path).st_mode)
        except (OSError, ValueError):
            return False

    def getsize(self, path: PathLike) -> int:
        return self.stat(path).st_size

    def access(self, path: PathLike, mode: int) -> bool:
        p = _fspath(path)

        async def go() -> None:
            attr = await self._resolve(p)
            await self._core.access(self.caller, attr.inode, mode)

        try:
            self._run(go(), p)
        except OSError:
            return False
        return True

    def listdir(self, path: PathLike = "/") -> list[Any]:
        p = _fspath(path)

        async def go() -> list[meta_pb2.DirEntry]:
            attr = await self._resolve(p)
            if not _stat.S_ISDIR(attr.mode):
                raise FsError(4000, "not a directory", errno=_errno.ENOTDIR)
            return await self._core.readdir_all(self.caller, attr.inode)

        entries = self._run(go(), p)
        if isinstance(p, bytes):
            return [bytes(e.name) for e in entries]
        return [os.fsdecode(e.name) for e in entries]

    def scandir(self, path: PathLike = "/") -> ScandirIterator:
        p = _fspath(path)

        async def go() -> list[meta_pb2.DirEntry]:
            attr = await self._resolve(p)
            if not _stat.S_ISDIR(attr.mode):
                raise FsError(4000, "not a directory", errno=_errno.ENOTDIR)
            return await self._core.readdir_all(self.caller, attr.inode, with_attrs=True)

        entries = self._run(go(), p)
        return ScandirIterator([DirEntry(self, p, e) for e in entries])

    def walk(
        self, top: PathLike, topdown: bool = True
    ) -> Iterator[tuple[Any, list[Any], list[Any]]]:
        """Like :func:`os.walk` (errors are ignored, as os.walk does by default)."""
        p = _fspath(top)
        try:
            entries = list(self.scandir(p))
        except OSError:
            return
        dirs = [e.name for e in entries if e.is_dir(follow_symlinks=False)]
        files = [e.name for e in entries if not e.is_dir(follow_symlinks=False)]
        if topdown:
            yield p, dirs, files
        for d in dirs:
            sep: Any = b"/" if isinstance(p, bytes) else "/"
            yield from self.walk(
                p.rstrip(sep) + sep + d if p not in ("/", b"/") else sep + d, topdown
            )  # type: ignore[operator]
        if not topdown:
            yield p, dirs, files

    # ------------------------------------------------------------------ namespace changes

    def mkdir(self, path: PathLike, mode: int = 0o777) -> None:
        p = _fspath(path)

        async def go() -> None:
            parent, name = await self._parent(p)
            if name in (b".", b".."):
                await self._resolve(p)  # exists (or ENOENT/ENOTDIR on the way)
                raise FsError(4000, "exists", errno=_errno.EEXIST)
            await self._core.mkdir(self.caller, parent.inode, name, mode & ~self.umask & 0o7777)

        self._run(go(), p)

    def makedirs(self, path: PathLike, mode: int = 0o777, exist_ok: bool = False) -> None:
        p = _fspath(path)
        head, tail = os.path.split(p)
        if not tail:
            head, tail = os.path.split(head)
        if head and tail and not self.exists(head):
            try:
                self.makedirs(head, exist_ok=exist_ok)
            except FileExistsError:
                pass
            cdir: Any = b"." if isinstance(head, bytes) else "."
            if tail == cdir:
                return
        try:
            self.mkdir(p, mode)
        except OSError:
            if not exist_ok or not self.isdir(p):
                raise

    def rmdir(self, path: PathLike) -> None:
        p = _fspath(path)

        async def go() -> None:
            parent, name = await self._parent(p)
            if name == b".":
                await self._resolve(p)
                raise FsError(4000, "invalid argument", errno=_errno.EINVAL)
            if name == b"..":
                await self._resolve(p)
                raise FsError(4000, "directory not empty", errno=_errno.ENOTEMPTY)
            await self._core.rmdir(self.caller, parent.inode, name)

        self._run(go(), p)

    def unlink(self, path: PathLike) -> None:
        p = _fspath(path)

        async def go() -> None:
            parent, name = await self._parent(p)
            if name in (b".", b"..") or os.fsencode(p).endswith(b"/"):
                attr = await self._resolve(p)
                raise FsError(
                    4000,
                    "is a directory",
                    errno=_errno.EISDIR if _stat.S_ISDIR(attr.mode) else _errno.ENOTDIR,
                )
            await self._core.unlink(self.caller, parent.inode, name)

        self._run(go(), p)

    remove = unlink

    def rename(self, src: PathLike, dst: PathLike) -> None:
        s, d = _fspath(src), _fspath(dst)

        async def go() -> None:
            sp, sn = await self._parent(s)
            dp, dn = await self._parent(d)
            for n in (sn, dn):
                if n in (b".", b".."):
                    raise FsError(
                        4000,
                        "device or resource busy",
                        errno=_errno.EBUSY if n == b"." else _errno.EINVAL,
                    )
            if os.fsencode(s).endswith(b"/") or os.fsencode(d).endswith(b"/"):
                # A trailing slash requires directories (rename(2)).
                sa = await self._core.lookup(self.caller, sp.inode, sn)
                if not _stat.S_ISDIR(sa.mode):
                    raise FsError(4000, "not a directory", errno=_errno.ENOTDIR)
            await self._core.rename(self.caller, sp.inode, sn, dp.inode, dn)

        self._run(go(), s, d)

    replace = rename

    def symlink(self, src: PathLike, dst: PathLike, target_is_directory: bool = False) -> None:
        """Create symlink ``dst`` pointing at ``src`` (os.symlink argument order)."""
        s, d = _fspath(src), _fspath(dst)

        async def go() -> None:
            parent, name = await self._parent(d)
            if name in (b".", b".."):
                raise FsError(4000, "exists", errno=_errno.EEXIST)
            await self._core.symlink(self.caller, parent.inode, name, os.fsencode(s))

        self._run(go(), s, d)

    def readlink(self, path: PathLike) -> Any:
        p = _fspath(path)

        async def go() -> bytes:
            attr = await self._resolve(p, follow=False)
            if not _stat.S_ISLNK(attr.mode):
                raise FsError(4000, "invalid argument", errno=_errno.EINVAL)
            return await self._core.readlink(self.caller, attr.inode)

        t = self._run(go(), p)
        return t if isinstance(p, bytes) else os.fsdecode(t)

    def link(self, src: PathLike, dst: PathLike, *, follow_symlinks: bool = True) -> None:
        s, d = _fspath(src), _fspath(dst)

        async def go() -> None:
            attr = await self._resolve(s, follow_symlinks)
            parent, name = await self._parent(d)
            if name in (b".", b".."):
                raise FsError(4000, "exists", errno=_errno.EEXIST)
            await self._core.link(self.caller, attr.inode, parent.inode, name)

        self._run(go(), s, d)

    def chmod(self, path: PathLike, mode: int, *, follow_symlinks: bool = True) -> None:
        p = _fspath(path)
        if not follow_symlinks:
            raise NotImplementedError("chmod: follow_symlinks unavailable on this platform")

        async def go() -> None:
            attr = await self._resolve(p, follow_symlinks)
            await self._core.setattr(self.caller, attr.inode, mode=mode)

        self._run(go(), p)

    def chown(self, path: PathLike, uid: int, gid: int, *, follow_symlinks: bool = True) -> None:
        p = _fspath(path)

        async def go() -> None:
            attr = await self._resolve(p, follow_symlinks)
            await self._core.setattr(
                self.caller,
                attr.inode,
                uid=None if uid == -1 else uid,
                gid=None if gid == -1 else gid,
            )

        self._run(go(), p)

    def lchown(self, path: PathLike, uid: int, gid: int) -> None:
        self.chown(path, uid, gid, follow_symlinks=False)

    def utime(
        self,
        path: PathLike,
        times: tuple[float, float] | None = None,
        *,
        ns: tuple[int, int] | None = None,
        follow_symlinks: bool = True,
    ) -> None:
        p = _fspath(path)
        if times is not None and ns is not None:
            raise ValueError("utime: you may specify either 'times' or 'ns' but not both")
        kw: dict[str, Any] = {}
        if ns is not None:
            kw = {"atime_ns": int(ns[0]), "mtime_ns": int(ns[1])}
        elif times is not None:
            kw = {"atime_ns": _sec_to_ns(times[0]), "mtime_ns": _sec_to_ns(times[1])}
        else:
            kw = {"atime_now": True, "mtime_now": True}

        async def go() -> None:
            attr = await self._resolve(p, follow_symlinks)
            await self._core.setattr(self.caller, attr.inode, **kw)

        self._run(go(), p)

    def truncate(self, path: PathLike, length: int) -> None:
        p = _fspath(path)
        if length < 0:
            raise OSError(_errno.EINVAL, os.strerror(_errno.EINVAL), p)

        async def go() -> None:
            attr = await self._resolve(p)
            if _stat.S_ISDIR(attr.mode):
                raise FsError(4000, "is a directory", errno=_errno.EISDIR)
            await self._core.setattr(self.caller, attr.inode, size=length)

        self._run(go(), p)

    # ------------------------------------------------------------------ xattrs

    def getxattr(
        self, path: PathLike, attribute: str | bytes, *, follow_symlinks: bool = True
    ) -> bytes:
        p = _fspath(path)

        async def go() -> bytes:
            attr = await self._resolve(p, follow_symlinks)
            return await self._core.getxattr(self.caller, attr.inode, attribute)

        return self._run(go(), p)

    def setxattr(
        self,
        path: PathLike,
        attribute: str | bytes,
        value: bytes,
        flags: int = 0,
        *,
        follow_symlinks: bool = True,
    ) -> None:
        p = _fspath(path)

        async def go() -> None:
            attr = await self._resolve(p, follow_symlinks)
            await self._core.setxattr(self.caller, attr.inode, attribute, value, flags)

        self._run(go(), p)

    def listxattr(self, path: PathLike = "/", *, follow_symlinks: bool = True) -> list[str]:
        p = _fspath(path)

        async def go() -> list[bytes]:
            attr = await self._resolve(p, follow_symlinks)
            return await self._core.listxattr(self.caller, attr.inode)

        return [os.fsdecode(n) for n in self._run(go(), p)]

    def removexattr(
        self, path: PathLike, attribute: str | bytes, *, follow_symlinks: bool = True
    ) -> None:
        p = _fspath(path)

        async def go() -> None:
            attr = await self._resolve(p, follow_symlinks)
            await self._core.removexattr(self.caller, attr.inode, attribute)

        self._run(go(), p)

    # ------------------------------------------------------------------ file system

    def statvfs(self, path: PathLike = "/") -> os.statvfs_result:
        p = _fspath(path)

        async def go() -> meta_pb2.StatFsResponse:
            await self._resolve(p)
            return await self._core.statfs(self.caller)

        s = self._run(go(), p)
        bs = s.block_size or 4096
        return os.statvfs_result(
            (
                bs,
                bs,
                s.total_bytes // bs,
                s.free_bytes // bs,
                s.avail_bytes // bs,
                s.total_files,
                s.free_files,
                s.free_files,
                0,
                s.name_max or 255,
            )
        )

    statfs = statvfs

    def fsync(self, file: Any) -> None:
        """``os.fsync`` for an fs3 file object: data and length durable on return."""
        file.fsync()

    def fallocate(self, file: Any, mode: int, offset: int, length: int) -> None:
        """fallocate(2) on an fs3 file object (modes 0, KEEP_SIZE, PUNCH_HOLE|KEEP_SIZE, ZERO_RANGE).

        Buffered writes of ``file`` are flushed first. See AsyncClient.fallocate.
        """
        file.flush()
        raw = file
        while not isinstance(raw, RawFile):
            raw = getattr(raw, "buffer", None) or getattr(raw, "raw", None)
            if raw is None:
                raise TypeError("not an fs3 file object")
        raw.fallocate(mode, offset, length)

    def posix_fallocate(self, file: Any, offset: int, length: int) -> None:
        """``os.posix_fallocate``: allocate [offset, offset+length), growing the file if needed."""
        self.fallocate(file, 0, offset, length)


# ---------------------------------------------------------------------- file objects


class RawFile(io.RawIOBase):
    """Unbuffered positioned I/O on an fs3 file handle (like ``io.FileIO``)."""

    def __init__(
        self, client: Client, handle: FileHandle, name: Any, mode: str, *, append: bool = False
    ) -> None:
        super().__init__()
        self._client = client
        self._h = handle
        self.name = name
        self.mode = mode
        self._append = append
        self._pos = 0
        self._blksize = int(handle.attr.blksize) or handle.chunk_size
        handle.readahead = handle.readable and client.core.config.client.readahead_chunks > 0
        if append:
            self._pos = self._run(client.core.file_length(handle))

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._client._run(coro, self.name)

    @property
    def handle(self) -> FileHandle:
        return self._h

    def readable(self) -> bool:
        self._checkClosed()
        return self._h.readable

    def writable(self) -> bool:
        self._checkClosed()
        return self._h.writable

    def seekable(self) -> bool:
        self._checkClosed()
        return True

    def fileno(self) -> int:
        raise io.UnsupportedOperation("fs3 files have no OS file descriptor")

    def isatty(self) -> bool:
        self._checkClosed()
        return False

    def readinto(self, b: Any) -> int:
        self._checkClosed()
        if not self._h.readable:
            raise io.UnsupportedOperation("File not open for reading")
        mv = memoryview(b).cast("B")
        n = self._run(self._client.core.readinto(self._h, self._pos, mv))
        self._pos += n
        return n

    def readall(self) -> bytes:
        self._checkClosed()
        if not self._h.readable:
            raise io.UnsupportedOperation("File not open for reading")
        size = self._run(self._client.core.file_length(self._h))
        out = bytearray()
        while True:
            want = max(size - self._pos, 0) + 1  # +1 detects growth, like FileIO
            buf = bytearray(want)
            n = self.readinto(buf)
            if not n:
                break
            out += buf[:n]
            size = max(size, self._pos)
        return bytes(out)

    def write(self, b: Any) -> int:
        self._checkClosed()
        if not self._h.writable:
            raise io.UnsupportedOperation("File not open for writing")
        mv = memoryview(b).cast("B")
        if self._append:
            # The length was fetched at open; since then this handle's own writes
            # extend it (appends from other clients are not atomic with ours anyway).
            self._pos = self._client.core.local_length(self._h)
        n = self._run(self._client.core.write(self._h, self._pos, mv, behind=True))
        self._pos += n
        return n

    def flush(self) -> None:
        """Wait for write-behind writes (their failures surface here)."""
        if self.closed or self._client._closed:
            return
        if self._client.core.write_behind.busy(self._h.inode) or self._h.error is not None:
            self._run(self._client.core.drain(self._h))

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._checkClosed()
        if isinstance(offset, float):
            raise TypeError("an integer is required")
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = self._run(self._client.core.file_length(self._h)) + offset
        else:
            raise ValueError(f"invalid whence ({whence}, should be 0, 1 or 2)")
        if pos < 0:
            raise OSError(_errno.EINVAL, os.strerror(_errno.EINVAL))
        self._pos = pos
        return pos

    def tell(self) -> int:
        self._checkClosed()
        return self._pos

    def truncate(self, size: int | None = None) -> int:
        self._checkClosed()
        if not self._h.writable:
            raise io.UnsupportedOperation("File not open for writing")
        if size is None:
            size = self._pos
        if size < 0:
            raise OSError(_errno.EINVAL, os.strerror(_errno.EINVAL))
        self._run(self._client.core.setattr(self._h.caller, self._h.inode, size=size, fh=self._h))
        return size

    def fsync(self) -> None:
        """Make data and length durable (``os.fsync`` for fs3 files)."""
        self._checkClosed()
        self._run(self._client.core.fsync(self._h))

    def fallocate(self, mode: int, offset: int, length: int) -> None:
        """fallocate(2) on this handle (see AsyncClient.fallocate)."""
        self._checkClosed()
        self._run(self._client.core.fallocate(self._h, mode, offset, length))

    def stat(self) -> os.stat_result:
        """``os.fstat`` of the open file."""
        self._checkClosed()
        return _stat_result(self._run(self._client.core.getattr(self._h.caller, self._h.inode)))

    def close(self) -> None:
        if self.closed:
            return
        try:
            super().close()
        finally:
            c = self._client
            if not c._closed and not (c.sync_meta and c.core.release_now(self._h)):
                self._run(c.core.release(self._h))

    def __repr__(self) -> str:
        return f"<fs3.RawFile name={self.name!r} mode={self.mode!r} closed={self.closed}>"


class _FsyncMixin:
    def flush(self) -> None:
        """Write the buffer out and wait for write-behind writes (built-in flush semantics)."""
        super().flush()  # type: ignore[misc]
        self.raw.flush()  # type: ignore[attr-defined]

    def fsync(self) -> None:
        """Flush the buffer and make data and length durable."""
        self.flush()  # type: ignore[attr-defined]
        self.raw.fsync()  # type: ignore[attr-defined]

    def stat(self) -> os.stat_result:
        self.flush()  # type: ignore[attr-defined]
        return self.raw.stat()  # type: ignore[attr-defined, no-any-return]


class BufferedReader(_FsyncMixin, io.BufferedReader):
    pass


class BufferedWriter(_FsyncMixin, io.BufferedWriter):
    pass


class BufferedRandom(_FsyncMixin, io.BufferedRandom):
    pass


class TextIOWrapper(io.TextIOWrapper):
    def fsync(self) -> None:
        self.flush()
        self.buffer.fsync()  # type: ignore[attr-defined]


class DirEntry:
    """Like :class:`os.DirEntry` for fs3 (attributes fetched with the listing)."""

    def __init__(self, client: Client, parent: str | bytes, entry: meta_pb2.DirEntry) -> None:
        self._client = client
        self._entry = entry
        name = bytes(entry.name)
        self.name: Any
        self.path: Any
        if isinstance(parent, bytes):
            self.name = name
            self.path = parent + (b"" if parent.endswith(b"/") else b"/") + name
        else:
            sname = os.fsdecode(name)
            self.name = sname
            self.path = parent + ("" if parent.endswith("/") else "/") + sname
        self._stat: os.stat_result | None = None

    def inode(self) -> int:
        return int(self._entry.inode)

    def _type(self) -> int:
        return int(self._entry.type or (self._entry.attr.mode & 0o170000))

    def is_symlink(self) -> bool:
        return _stat.S_ISLNK(self._type())

    def is_dir(self, *, follow_symlinks: bool = True) -> bool:
        if follow_symlinks and self.is_symlink():
            return self._client.isdir(self.path)
        return _stat.S_ISDIR(self._type())

    def is_file(self, *, follow_symlinks: bool = True) -> bool:
        if follow_symlinks and self.is_symlink():
            return self._client.isfile(self.path)
        return _stat.S_ISREG(self._type())

    def stat(self, *, follow_symlinks: bool = True) -> os.stat_result:
        if follow_symlinks and self.is_symlink():
            return self._client.stat(self.path)
        if self._stat is None:
            if self._entry.HasField("attr"):
                self._stat = _stat_result(self._entry.attr)
            else:
                self._stat = self._client.lstat(self.path)
        return self._stat

    def __fspath__(self) -> Any:
        return self.path

    def __repr__(self) -> str:
        return f"<fs3.DirEntry {self.name!r}>"


class ScandirIterator:
    """What :meth:`Client.scandir` returns: an iterator and a context manager."""

    def __init__(self, entries: list[DirEntry]) -> None:
        self._it = iter(entries)

    def __iter__(self) -> ScandirIterator:
        return self

    def __next__(self) -> DirEntry:
        return next(self._it)

    def close(self) -> None:
        self._it = iter(())

    def __enter__(self) -> ScandirIterator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------- helpers


def _close_at_exit(ref: weakref.ReferenceType[Client]) -> None:
    client = ref()
    if client is not None and not client._closed:
        try:
            client.close()
        except Exception:  # exit must not hang or fail because a server is gone
            pass


def _refuse_dir(attr: meta_pb2.Attr) -> None:
    if _stat.S_ISDIR(attr.mode):
        raise FsError(4000, "is a directory", errno=_errno.EISDIR)


def _join_dir(path: bytes, rel: bytes) -> bytes:
    head = path.rstrip(b"/").rpartition(b"/")[0]
    return (head + b"/" + rel) if head or path.startswith(b"/") else rel


def _sec_to_ns(t: float) -> int:
    return int(round(t * 1_000_000_000))


def _ns(ts: Any) -> int:
    return int(ts.sec) * 1_000_000_000 + int(ts.nsec)


def _stat_result(a: meta_pb2.Attr) -> os.stat_result:
    at, mt, ct = _ns(a.atime), _ns(a.mtime), _ns(a.ctime)
    return os.stat_result(
        (a.mode, a.inode, 0, a.nlink, a.uid, a.gid, a.size, at // 10**9, mt // 10**9, ct // 10**9),
        {
            "st_atime": at / 1e9,
            "st_mtime": mt / 1e9,
            "st_ctime": ct / 1e9,
            "st_atime_ns": at,
            "st_mtime_ns": mt,
            "st_ctime_ns": ct,
            "st_blksize": int(a.blksize) or 4096,
            "st_blocks": int(a.blocks),
            "st_rdev": int(a.rdev),
        },
    )


def _parse_mode(
    mode: str, buffering: int, encoding: str | None, errors: str | None, newline: str | None
) -> tuple[int, bool, bool, bool, bool]:
    """Validate a built-in-style mode string; returns (flags, r, w, append, binary)."""
    if not isinstance(mode, str):
        raise TypeError(f"open() argument 'mode' must be str, not {type(mode).__name__}")
    modes = set(mode)
    if modes - set("axrwb+t") or len(mode) > len(modes):
        raise ValueError(f"invalid mode: '{mode}'")
    creating = "x" in modes
    reading = "r" in modes
    writing = "w" in modes
    appending = "a" in modes
    updating = "+" in modes
    text = "t" in modes
    binary = "b" in modes
    if text and binary:
        raise ValueError("can't have text and binary mode at once")
    if creating + reading + writing + appending > 1:
        raise ValueError("must have exactly one of create/read/write/append mode")
    if not (creating or reading or writing or appending):
        raise ValueError(
            "Must have exactly one of create/read/write/append mode and at most one plus"
        )
    if binary and encoding is not None:
        raise ValueError("binary mode doesn't take an encoding argument")
    if binary and errors is not None:
        raise ValueError("binary mode doesn't take an errors argument")
    if binary and newline is not None:
        raise ValueError("binary mode doesn't take a newline argument")
    if binary and buffering == 1:
        pass  # warned by open()
    if buffering == 0 and not binary:
        raise ValueError("can't have unbuffered text I/O")
    flags = 0
    if reading:
        flags = os.O_RDONLY
    if writing:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    if creating:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    if appending:
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
    readable = reading or updating
    writable = writing or creating or appending or updating
    if updating:
        flags = (flags & ~os.O_ACCMODE) | os.O_RDWR
    return flags, readable, writable, appending, binary


def _raw_mode(flags: int, readable: bool, writable: bool, append: bool) -> str:
    """The ``mode`` attribute FileIO would report."""
    if flags & os.O_EXCL:
        return "xb+" if readable else "xb"
    if append:
        return "ab+" if readable else "ab"
    if readable and writable:
        return "rb+"
    return "wb" if writable else "rb"


def wrap_errors(fn: Callable[..., T]) -> Callable[..., T]:
    """Decorator: FsError → OSError (for helpers outside :class:`Client`)."""

    @functools.wraps(fn)
    def inner(*a: Any, **kw: Any) -> T:
        try:
            return fn(*a, **kw)
        except FsError as e:
            raise _oserror(e) from None

    return inner
