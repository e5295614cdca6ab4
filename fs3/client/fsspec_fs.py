"""``fs3://`` for fsspec: pandas, pyarrow, dask, DCP's FsspecWriter ... on fs3 without a mount.

Registered through the ``fsspec.specs`` entry point (pyproject.toml), so once
fs3 is installed::

    import fsspec, pandas as pd
    with fsspec.open("fs3:///data/x.csv", "w", cluster_file="/etc/fs3/cluster") as f:
        f.write("a,b\\n1,2\\n")
    df = pd.read_csv("fs3:///data/x.csv", storage_options={"cluster_file": "/etc/fs3/cluster"})

URLs: everything after ``fs3://`` is an absolute path in the fs3 namespace;
``fs3:///data/x.csv`` and ``fs3://data/x.csv`` name the same file (the first
component is a directory, not a host: a cluster is named by its cluster file,
whose list of mgmtd addresses does not fit in a URL host).

Which cluster, first match wins:

1. ``client=``: an already connected :class:`fs3.client.file_api.Client`;
2. ``cluster_file=`` (storage option; fsspec also reads it from the
   environment variable ``FSSPEC_FS3_CLUSTER_FILE``);
3. ``[cluster] cluster_file`` of the client config (``config=``: a
   :class:`fs3.config.ClientConfig`), then ``$FS3_CLUSTER_FILE`` (see
   :func:`fs3.connect`).

Other storage options: ``uid``, ``gid`` (identity for permission checks),
``transport`` (``grpc`` | ``tcp`` | ``shm``), ``auto_mkdir`` (create missing
parent directories when writing a file; off by default, as in fsspec's
``LocalFileSystem``: a missing parent is a ``FileNotFoundError``).

One connection per cluster and identity serves every filesystem instance of a
process (fsspec makes an instance per thread); it is closed at exit, or by
:meth:`Fs3FileSystem.close_clients`. After a fork the child connects anew.

Files are :class:`Fs3File` (fsspec's buffered file): reads go through fsspec's
block caches (``cache_type``/``block_size``) with one positioned fs3 read per
block; writes go out a block at a time with the client's write-behind, and a
failed write surfaces at the next flush or at close. In a transaction
(``with fs.transaction:``) a file is written under a temporary name, fsync'd
and renamed over its name on commit. Errors are the built-in ``OSError``
subclasses (``FileNotFoundError``, ``IsADirectoryError``, ...).
"""

from __future__ import annotations

import datetime
import os
import stat as _stat
import threading
import uuid
from typing import Any

from fsspec.spec import AbstractBufferedFile, AbstractFileSystem
from fsspec.utils import stringify_path

from fs3.client.file_api import Client

COPY_BYTES = 8 << 20  # one read/write of cp_file (a few chunks: the client splits and overlaps)

_lock = threading.Lock()
_clients: dict[tuple[Any, ...], Client] = {}
_clients_pid = os.getpid()


def _shared_client(
    cluster_file: str | None, config: Any, uid: int | None, gid: int | None, transport: str | None
) -> Client:
    """The process's connection for these options (a fork's child starts with none)."""
    global _clients_pid
    key = (cluster_file, id(config) if config is not None else None, uid, gid, transport)
    with _lock:
        if _clients_pid != os.getpid():
            _clients.clear()  # the parent's bridge thread does not exist here
            _clients_pid = os.getpid()
        c = _clients.get(key)
        if c is None or c._closed:
            c = Client.connect(cluster_file, uid=uid, gid=gid, transport=transport, config=config)
            _clients[key] = c
        return c


class Fs3FileSystem(AbstractFileSystem):
    """fsspec filesystem over the fs3 Python client API (see the module docstring)."""

    protocol = "fs3"
    root_marker = "/"
    sep = "/"

    def __init__(
        self,
        cluster_file: str | os.PathLike[str] | None = None,
        *,
        client: Client | None = None,
        config: Any = None,
        uid: int | None = None,
        gid: int | None = None,
        transport: str | None = None,
        auto_mkdir: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.auto_mkdir = auto_mkdir
        if client is None:
            cf = os.fspath(cluster_file) if cluster_file is not None else None
            client = _shared_client(cf, config, uid, gid, transport)
        self.client = client

    @classmethod
    def close_clients(cls) -> None:
        """Close the shared connections and forget cached instances (tests, long-lived apps)."""
        with _lock:
            clients = list(_clients.values())
            _clients.clear()
        cls.clear_instance_cache()
        for c in clients:
            c.close()

    # ------------------------------------------------------------------ paths

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = stringify_path(path)
        if path.startswith("fs3://"):
            path = path[len("fs3://") :]
        elif path.startswith("fs3:"):
            path = path[len("fs3:") :]
        path = "/" + path.lstrip("/")
        return path.rstrip("/") or "/"

    @staticmethod
    def _get_kwargs_from_urls(path: str) -> dict[str, Any]:
        return {}  # the URL names no cluster (see the module docstring)

    def _join(self, parent: str, name: str) -> str:
        return parent.rstrip("/") + "/" + name

    # ------------------------------------------------------------------ metadata

    def _info_from_stat(self, path: str, st: os.stat_result, link: bool = False) -> dict[str, Any]:
        mode = st.st_mode
        if _stat.S_ISDIR(mode):
            kind = "directory"
        elif _stat.S_ISREG(mode):
            kind = "file"
        else:
            kind = "other"
        return {
            "name": path,
            "size": 0 if kind == "directory" else st.st_size,
            "type": kind,
            "mode": mode,
            "nlink": st.st_nlink,
            "ino": st.st_ino,
            "uid": st.st_uid,
            "gid": st.st_gid,
            "mtime": st.st_mtime,
            "created": st.st_ctime,
            "islink": link,
        }

    def info(self, path: Any, **kwargs: Any) -> dict[str, Any]:
        """Like ``LocalFileSystem.info``: a symlink is described by its target (``islink`` set)."""
        p = self._strip_protocol(path)
        lst = self.client.lstat(p)
        if not _stat.S_ISLNK(lst.st_mode):
            return self._info_from_stat(p, lst)
        try:
            out = self._info_from_stat(p, self.client.stat(p), link=True)
        except FileNotFoundError:  # dangling: the link itself
            out = self._info_from_stat(p, lst, link=True)
        out["destination"] = self.client.readlink(p)
        return out

    def ls(self, path: Any, detail: bool = True, **kwargs: Any) -> list[Any]:
        p = self._strip_protocol(path)
        try:
            entries = list(self.client.scandir(p))
        except NotADirectoryError:
            infos = [self.info(p)]  # fsspec: ls of a file lists the file
        else:
            infos = []
            for e in entries:
                full = self._join(p, e.name)
                if e.is_symlink():
                    infos.append(self.info(full))
                else:
                    infos.append(self._info_from_stat(full, e.stat(follow_symlinks=False)))
            infos.sort(key=lambda i: i["name"])
        return infos if detail else [i["name"] for i in infos]

    def exists(self, path: Any, **kwargs: Any) -> bool:
        return self.client.exists(self._strip_protocol(path))

    def modified(self, path: Any) -> datetime.datetime:
        return datetime.datetime.fromtimestamp(self.info(path)["mtime"], tz=datetime.UTC)

    def created(self, path: Any) -> datetime.datetime:
        return datetime.datetime.fromtimestamp(self.info(path)["created"], tz=datetime.UTC)

    def chmod(self, path: Any, mode: int) -> None:
        self.client.chmod(self._strip_protocol(path), mode)

    # ------------------------------------------------------------------ namespace

    def mkdir(self, path: Any, create_parents: bool = True, **kwargs: Any) -> None:
        p = self._strip_protocol(path)
        if create_parents:
            if self.exists(p):
                raise FileExistsError(p)
            self.makedirs(p, exist_ok=True)
        else:
            self.client.mkdir(p)

    def makedirs(self, path: Any, exist_ok: bool = False) -> None:
        self.client.makedirs(self._strip_protocol(path), exist_ok=exist_ok)

    def rmdir(self, path: Any) -> None:
        self.client.rmdir(self._strip_protocol(path))

    def rm_file(self, path: Any) -> None:
        self.client.unlink(self._strip_protocol(path))

    def rm(
        self, path: Any, recursive: bool = False, maxdepth: int | None = None, **kwargs: Any
    ) -> None:
        """Remove files (globs allowed); directories need ``recursive=True`` unless empty."""
        paths = self.expand_path(path, recursive=recursive, maxdepth=maxdepth)
        for p in reversed(paths):  # children before their directory
            if self.client.isdir(p) and not self.client.islink(p):
                self.client.rmdir(p)
            else:
                self.client.unlink(p)

    def mv(
        self,
        path1: Any,
        path2: Any,
        recursive: bool = False,
        maxdepth: int | None = None,
        **kwargs: Any,
    ) -> None:
        """One atomic fs3 rename for a single path (like ``shutil.move``: into an existing dir).

        Lists and globs fall back to fsspec's copy-then-delete.
        """
        if not isinstance(path1, str) or not isinstance(path2, str) or _magic(path1):
            super().mv(path1, path2, recursive=recursive, maxdepth=maxdepth, **kwargs)
            return
        src, dst = self._strip_protocol(path1), self._strip_protocol(path2)
        if src != dst and self.client.isdir(dst):
            dst = self._join(dst, src.rsplit("/", 1)[-1])
        self.client.rename(src, dst)

    def cp_file(self, path1: Any, path2: Any, **kwargs: Any) -> None:
        src, dst = self._strip_protocol(path1), self._strip_protocol(path2)
        if self.client.isdir(src):
            self.makedirs(dst, exist_ok=True)
            return
        buf = bytearray(COPY_BYTES)
        mv = memoryview(buf)
        with (
            self.client.open(src, "rb", buffering=0) as fin,
            self.client.open(dst, "wb", buffering=0) as fout,
        ):
            while True:
                n = fin.readinto(mv)
                if not n:
                    break
                fout.write(mv[:n])
            fout.flush()  # write-behind failures surface here

    def touch(self, path: Any, truncate: bool = True, **kwargs: Any) -> None:
        p = self._strip_protocol(path)
        if truncate or not self.client.exists(p):
            with self.client.open(p, "wb"):
                pass
        else:
            self.client.utime(p)

    # ------------------------------------------------------------------ whole files

    def cat_file(
        self, path: Any, start: int | None = None, end: int | None = None, **kwargs: Any
    ) -> bytes:
        p = self._strip_protocol(path)
        with self.client.open(p, "rb", buffering=0) as f:
            if start is not None and start < 0 or end is not None and end < 0:
                size = f.seek(0, os.SEEK_END)
                start = size + start if start is not None and start < 0 else start
                end = size + end if end is not None and end < 0 else end
            start = max(start or 0, 0)
            if end is None:
                f.seek(start)
                return bytes(f.readall())
            return _read_range(f, start, max(end - start, 0))

    def pipe_file(self, path: Any, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        p = self._strip_protocol(path)
        self._parent_for_write(p)
        with self.client.open(p, "xb" if mode == "create" else "wb", buffering=0) as f:
            mv = memoryview(value).cast("B")
            while len(mv):
                n = f.write(mv)
                mv = mv[n:]
            f.flush()

    # ------------------------------------------------------------------ open

    def _parent_for_write(self, p: str) -> None:
        if self.auto_mkdir:
            self.client.makedirs(self._parent(p), exist_ok=True)

    def _open(
        self,
        path: str,
        mode: str = "rb",
        block_size: int | None = None,
        autocommit: bool = True,
        cache_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> Fs3File:
        if mode != "rb":
            self._parent_for_write(self._strip_protocol(path))
        return Fs3File(
            self,
            self._strip_protocol(path),
            mode,
            block_size=block_size,
            autocommit=autocommit,
            cache_options=cache_options,
            **kwargs,
        )


def _magic(path: str) -> bool:
    return any(c in path for c in "*?[")


def _read_range(raw: Any, start: int, length: int) -> bytes:
    """``length`` bytes at ``start`` of an fs3 raw file, fewer only at end of file."""
    buf = bytearray(length)
    mv = memoryview(buf)
    raw.seek(start)
    got = 0
    while got < length:
        n = raw.readinto(mv[got:])
        if not n:
            break
        got += n
    return bytes(mv[:got])


class Fs3File(AbstractBufferedFile):
    """An fs3 file for fsspec (modes ``rb``, ``wb``, ``ab``, ``xb``).

    The fs3 file is opened when this object is made, so a missing file, a
    directory or an existing file in ``xb`` fail at ``open`` with the right
    ``OSError``, as built-in files do.
    """

    DEFAULT_BLOCK_SIZE = 4 << 20  # several chunks per positioned read or write

    def __init__(
        self,
        fs: Fs3FileSystem,
        path: str,
        mode: str = "rb",
        block_size: int | None = None,
        autocommit: bool = True,
        cache_type: str = "readahead",
        cache_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if mode not in ("rb", "wb", "ab", "xb"):
            raise NotImplementedError(f"fs3 files open with rb, wb, ab or xb, not {mode!r}")
        client = fs.client
        self._target = path
        self._base = 0  # file offset of the first byte this object writes (ab: the old size)
        if mode == "rb":
            self._raw = client.open(path, "rb", buffering=0)
            size = self._raw.seek(0, os.SEEK_END)
            kwargs["size"] = size
        else:
            self._tmp = None if autocommit else _tmp_name(path)
            target = self._tmp or path
            if mode == "ab" and self._tmp is not None:
                raise ValueError("append is not supported in a transaction")
            if mode == "xb" and self._tmp is not None and client.lexists(path):
                raise FileExistsError(17, "File exists", path)  # the temp name can't tell
            self._raw = client.open(target, mode, buffering=0)
            if mode == "ab":
                self._base = self._raw.tell()
        try:
            super().__init__(
                fs,
                path,
                mode,
                block_size=block_size,
                autocommit=autocommit,
                cache_type=cache_type,
                cache_options=cache_options,
                **kwargs,
            )
        except BaseException:
            self._raw.close()
            raise
        self.loc = self._base

    # -- reads (called by fsspec's caches)
    def _fetch_range(self, start: int, end: int) -> bytes:
        return _read_range(self._raw, start, max(end - start, 0))

    # -- writes
    def _initiate_upload(self) -> None:
        pass  # the fs3 file was created (or opened for append) in __init__

    def _upload_chunk(self, final: bool = False) -> bool:
        data = self.buffer.getbuffer()
        self._raw.seek(self._base + self.offset)
        mv = memoryview(data).cast("B")
        while len(mv):
            n = self._raw.write(mv)
            mv = mv[n:]
        del mv, data  # release the BytesIO export before fsspec replaces the buffer
        if final:
            if self.autocommit:
                self._raw.flush()  # write-behind failures surface at close
            else:
                self._raw.fsync()  # durable before commit renames it into place
            self._raw.close()
        return True

    def commit(self) -> None:
        if self._tmp is not None:
            self.fs.client.rename(self._tmp, self._target)
            self._tmp = None

    def discard(self) -> None:
        if self._tmp is not None:
            try:
                self.fs.client.unlink(self._tmp)
            except FileNotFoundError:
                pass
            self._tmp = None

    def close(self) -> None:
        try:
            super().close()
        finally:
            if not self._raw.closed:
                self._raw.close()


def _tmp_name(path: str) -> str:
    head, _, name = path.rpartition("/")
    return f"{head}/.{name}.fs3tmp-{uuid.uuid4().hex[:12]}"
