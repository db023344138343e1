"""The confined helper's requests, their framing, the verified resolution of their
paths and the guard; the operations themselves are :mod:`exec_server.fs.fdops`.

Stdlib only: imported by the zygote (``python -I -S``) and the one-shot helper. Every
directory opened is checked through ``/proc/self/fd`` to be where the server saw it (a
symlink swapped in since is refused); read-only holes and ``none`` carve-outs Landlock
cannot express are enforced on real locations (SANDBOX.md §1.7, §7).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import struct
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeGuard

from exec_server.exceptions import from_domain_error
from exec_server.fs import fdops, nofollow
from exec_server.fs.errors import (
    FsError,
    FsRefusedError,
    fs_error_from_os,
    os_error,
    translate_os_errors,
)
from exec_server.fs.fdops import READ_LIMIT, write_all
from exec_server.fs.walk import WalkOptions, walk

__all__ = [
    "FRAME", "MAX_DATA", "OPERATIONS", "WRITE_OPS", "OpError", "OpRequest", "encode_frame",
    "error_from_os", "execute", "metadata_fields", "no_follow", "read_frame",
]

#: a frame: header length, data length (big endian), the JSON header, the raw data.
FRAME = struct.Struct("!IQ")
_MAX_HEADER = 16 * 1024 * 1024
MAX_DATA = 2 * READ_LIMIT

_INVALID = -32600
_INTERNAL = -32603


#: Failure injection, set only in a zygote child started with ``--test-hooks``:
#: ``test_pause(stage)`` is called half way through writing a replacing file's
#: data (``"write"``) and once its temp file has its name (``"linked"``);
#: ``test_named_temp`` writes a named temp file, as where ``O_TMPFILE`` is missing.
test_pause: Callable[[str], None] | None = None
test_named_temp = False


class OpError(Exception):
    """A failure that travels back to the client as a JSON-RPC error (§9.1 code)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def error_from_os(exc: OSError) -> OpError:
    """Map an OS error as the direct route does (PROTOCOL.md §9.1, text §5.3)."""
    return _op_error(fs_error_from_os(exc))


def _op_error(exc: FsError) -> OpError:
    err = from_domain_error(exc)
    assert err is not None  # every FsError maps
    return OpError(err.code, err.message)


@dataclass(frozen=True, slots=True)
class OpRequest:
    """One operation from the frame header (or a §10.5 request); ``expect``/``dest_expect``:
    the real parents the server checked; ``tmp``: the server's token for a temp name."""

    op: str
    path: str
    expect: str | None = None
    dest: str | None = None
    dest_expect: str | None = None
    recursive: bool = True
    force: bool = True
    writable: tuple[str, ...] = ()
    read_only: tuple[str, ...] = ()
    denied: tuple[str, ...] = ()
    full_write: bool = False
    not_a_file: str | None = None
    tmp: str | None = None
    walk: WalkOptions | None = None
    #: the walk's root as spelled (a link there is followed only if asked)
    walk_root: str | None = None
    #: the plan's readable roots (None: everything); writable roots are readable too
    readable: tuple[str, ...] | None = None
    #: ``followSymlinks: false``: ``path`` is as spelled, no link followed
    no_follow: bool = False
    #: ``fs/open``'s mode: ``read`` or ``replace``
    mode: str = "read"

    @staticmethod
    def from_header(h: Mapping[str, object]) -> OpRequest:
        """Validate a decoded header; malformed input raises ``OpError(-32600)``."""

        def invalid(key: str) -> OpError:
            return OpError(_INVALID, f"fs sandbox request has an invalid `{key}`")

        def s(key: str) -> str | None:
            v = h.get(key)
            if v is None:
                return None
            if not _is_path(v):
                raise invalid(key)
            return v

        def paths(key: str, v: object) -> tuple[str, ...]:
            if not isinstance(v, list) or not all(isinstance(p, str) and p[:1] == "/" for p in v):
                raise invalid(key)
            return tuple(v)

        op, path, tmp = h.get("op"), h.get("path"), h.get("tmp")
        if not isinstance(op, str):
            raise OpError(_INVALID, "fs sandbox request has no operation")
        if tmp is not None and not (
            isinstance(tmp, str) and 0 < len(tmp) <= 64 and tmp.isascii() and tmp.isalnum()
        ):
            raise invalid("tmp")
        if not _is_path(path):
            raise invalid("path")
        w = h.get("walk") if op == "fs/walk" else None
        if op == "fs/walk" and not (
            isinstance(w, list)
            and len(w) == 6
            and _is_path(w[0])
            and all(type(v) is int and v >= 0 for v in w[1:4])
            and all(isinstance(v, bool) for v in w[4:])
        ):
            raise invalid("walk")
        plan = h.get("plan")
        readable = None
        if isinstance(plan, Mapping) and not plan.get("full_read", False):
            readable = paths("plan", plan.get("readable_roots") or [])
        return OpRequest(
            op=op,
            path=path,
            expect=s("expect"),
            dest=s("dest"),
            dest_expect=s("dest_expect"),
            recursive=bool(h.get("recursive", True)),
            force=bool(h.get("force", True)),
            writable=paths("writable", h.get("writable") or []),
            read_only=paths("read_only", h.get("read_only") or []),
            denied=paths("denied", h.get("denied") or []),
            full_write=bool(h.get("full_write", False)),
            not_a_file=s("not_a_file"),
            tmp=tmp,
            walk=WalkOptions(*w[1:]) if isinstance(w, list) else None,
            walk_root=w[0] if isinstance(w, list) else None,
            readable=readable,
            no_follow=bool(h.get("no_follow", False)),
            mode="replace" if h.get("mode") == "replace" else "read",
        )


def _is_path(v: object) -> TypeGuard[str]:
    return isinstance(v, str) and v.startswith("/") and "\x00" not in v


def encode_frame(header: bytes, data_len: int) -> bytes:
    return FRAME.pack(len(header), data_len) + header


def _read_exact(fd: int, size: int) -> bytearray:
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = os.readv(fd, [view[got:]])
        if n == 0:
            raise EOFError("truncated frame")
        got += n
    return buf


def read_frame(fd: int) -> tuple[bytes, bytearray]:
    hlen, dlen = FRAME.unpack(bytes(_read_exact(fd, FRAME.size)))
    if hlen > _MAX_HEADER or dlen > MAX_DATA:
        raise OpError(_INVALID, "fs sandbox frame too large")
    header = bytes(_read_exact(fd, hlen))
    return header, _read_exact(fd, dlen)


def _within(path: str, root: str) -> bool:
    return path == root or root == "/" or path.startswith(root + "/")


class _Guard:
    """Read-only holes and ``none`` carve-outs, enforced on real locations."""

    def __init__(self, req: OpRequest) -> None:
        #: (path, kind): 0 none, 1 read-only, 2 write
        self.rules: list[tuple[str, int]] = []
        if not req.read_only and not req.denied:
            return
        for kind, group in ((2, req.writable), (1, req.read_only), (0, req.denied)):
            for p in group:
                self.rules.append((p, kind))
                real = os.path.realpath(p)
                if real != p:
                    self.rules.append((real, kind))
        if req.full_write:
            self.rules.append(("/", 2))

    def _classify(self, path: str) -> int | None:
        best: tuple[int, int] | None = None  # (depth, -kind): deeper wins, then lower kind
        for root, kind in self.rules:
            if _within(path, root):
                key = (0 if root == "/" else root.count("/"), -kind)
                if best is None or key > best:
                    best = key
        return None if best is None else -best[1]

    def denies(self, path: str) -> bool:
        return self._classify(path) == 0

    def check(self, path: str, *, write: bool) -> None:
        kind = self._classify(path)
        if kind == 0:
            raise os_error(errno.EACCES)
        if write and kind == 1:
            raise os_error(errno.EROFS)

    def check_subtree(self, path: str) -> None:
        """Refuse removing a tree that contains a protected or denied path."""
        self.check(path, write=True)
        for root, kind in self.rules:
            if kind < 2 and root != path and _within(root, path) and os.path.lexists(root):
                raise os_error(errno.EROFS if kind == 1 else errno.EACCES)


def _fd_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


@dataclass(slots=True)
class _Target:

    dirfd: int
    name: str
    real_parent: str

    @property
    def real(self) -> str:
        if self.name == ".":
            return self.real_parent
        return self.real_parent.rstrip("/") + "/" + self.name


class _Ctx:

    def __init__(self, req: OpRequest, data: bytes | bytearray) -> None:
        self.req = req
        self.data = data
        self.guard = _Guard(req)

    def changed(self, path: str) -> OpError:
        return OpError(_INTERNAL, f"{path} changed while the sandboxed operation was running")

    def open_dir(self, path: str, expect: str | None) -> int:
        """Open an existing directory (``O_PATH``), verifying its real location."""
        fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        if _fd_path(fd) != (expect if expect is not None else path):
            os.close(fd)
            raise self.changed(path)
        return fd

    @contextlib.contextmanager
    def checked(
        self, *, write: bool | None, path: str | None = None, expect: str | None = None
    ) -> Iterator[_Target]:
        """The request's path (or ``path``) in its verified parent, its real location
        checked by the guard (``write=None``: by the caller)."""
        if path is None:
            path, expect = self.req.path, self.req.expect
        if path == "/":
            t = _Target(self.open_dir("/", "/"), ".", "/")
        else:
            parent, name = os.path.split(path)
            fd = self.open_dir(parent, expect)
            t = _Target(fd, name, _fd_path(fd))
        try:
            if write is not None:
                self.guard.check(t.real, write=write)
            yield t
        finally:
            os.close(t.dirfd)


def _final_symlink(c: _Ctx, t: _Target) -> OSError | OpError:
    """A read met a final symlink the server could not follow (§10.3): dangling is
    ``ENOENT`` (-32004, which clients depend on), a loop ``ELOOP``; one that resolves now
    was swapped in since (never checked): the path changed under us."""
    try:
        os.stat(t.name, dir_fd=t.dirfd)
    except OSError as exc:
        return exc
    return c.changed(c.req.path)


def _open_final(c: _Ctx, t: _Target, flags: int) -> int:
    """``openat`` of a read's final component; a final symlink is :func:`_final_symlink`'s."""
    try:
        return os.open(t.name, flags | os.O_NOFOLLOW, dir_fd=t.dirfd)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        # O_NOFOLLOW refuses a final link with ELOOP, or ENOTDIR with
        # O_DIRECTORY; the same numbers for anything else are re-raised.
        try:
            is_link = stat.S_ISLNK(os.stat(t.name, dir_fd=t.dirfd, follow_symlinks=False).st_mode)
        except OSError:
            raise exc from None
        if not is_link:
            raise
        raise _final_symlink(c, t) from None


def _read_file(c: _Ctx) -> tuple[dict[str, object], bytes]:
    with c.checked(write=False) as t:
        # O_NONBLOCK: a FIFO without a writer must not hang the helper.
        fd = _open_final(c, t, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        size = fdops.check_for_read(fd, READ_LIMIT, c.req.not_a_file)
        return {}, fdops.read_to_end(fd, size, READ_LIMIT)
    finally:
        os.close(fd)


def _write_file(c: _Ctx) -> tuple[dict[str, object], bytes]:
    """Create or atomically replace (:func:`fdops.replace_file`); what is not a regular
    file (a FIFO, a device) is written in place."""
    data = c.data
    with c.checked(write=True) as t:
        try:
            old: os.stat_result | None = os.stat(t.name, dir_fd=t.dirfd, follow_symlinks=False)
        except FileNotFoundError:
            old = None
        if old is not None and stat.S_ISLNK(old.st_mode):
            raise os_error(errno.ELOOP)
        if old is not None and stat.S_ISDIR(old.st_mode):
            raise os_error(errno.EISDIR)
        if old is not None and not stat.S_ISREG(old.st_mode):
            fdops.write_in_place(t.dirfd, t.name, data, os.O_NOFOLLOW | os.O_NONBLOCK)
            return {}, b""
        if old is not None:
            fdops.check_writable(t.dirfd, t.name)
        fdops.replace_file(
            t.dirfd,
            t.name,
            lambda fd: _write_data(fd, data),
            lambda: data,
            old,
            c.req.tmp if c.req.tmp is not None else os.urandom(6).hex(),
            unnamed=not test_named_temp,
            pause=test_pause,
        )
    return {}, b""


def _write_data(fd: int, data: bytes | bytearray) -> None:
    if test_pause is None:
        write_all(fd, data)
        return
    half = len(data) // 2
    with memoryview(data) as view:
        write_all(fd, view[:half])
        test_pause("write")
        write_all(fd, view[half:])


def _make_dirs(c: _Ctx, path: str) -> tuple[int, str]:
    """``mkdir -p`` by directory fds, each existing one verified (the check path is
    canonical in its existing prefix), each new one checked by the guard."""
    return fdops.make_dirs(
        path,
        lambda p: c.open_dir(p, p),
        real_of=lambda fd, _: _fd_path(fd),
        check=lambda real: c.guard.check(real, write=True),
        nofollow=os.O_NOFOLLOW,
    )


def _create_directory(c: _Ctx) -> tuple[dict[str, object], bytes]:
    if c.req.recursive:
        fd, _ = _make_dirs(c, c.req.path)
        os.close(fd)
        return {}, b""
    with c.checked(write=True) as t:
        os.mkdir(t.name, 0o777, dir_fd=t.dirfd)
    return {}, b""


def _get_metadata(c: _Ctx) -> tuple[dict[str, object], bytes]:
    with c.checked(write=False) as t:
        st = os.stat(t.name, dir_fd=t.dirfd, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            raise _final_symlink(c, t)
    return metadata_fields(st), b""


def _read_directory(c: _Ctx) -> tuple[dict[str, object], bytes]:
    with c.checked(write=False) as t:
        fd = _open_final(c, t, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    real = t.real.rstrip("/")
    guard = c.guard
    try:
        listed = fdops.list_directory(
            fd, (lambda name: guard.denies(f"{real}/{name}")) if guard.rules else None
        )
    finally:
        os.close(fd)
    entries = [
        {"fileName": name, "isDirectory": is_dir, "isFile": is_file}
        for name, is_dir, is_file in listed
    ]
    return {"entries": entries}, b""


def _remove(c: _Ctx) -> tuple[dict[str, object], bytes]:
    """With ``force``, a missing path or parent is no error (a removal racing us is)."""
    found = False
    try:
        with c.checked(write=None) as t:
            st = os.stat(t.name, dir_fd=t.dirfd, follow_symlinks=False)
            found = True
            if stat.S_ISDIR(st.st_mode) and c.req.recursive:
                c.guard.check_subtree(t.real)
                fdops.remove_tree_at(t.dirfd, t.name)
            else:
                c.guard.check(t.real, write=True)
                if stat.S_ISDIR(st.st_mode):
                    os.rmdir(t.name, dir_fd=t.dirfd)
                else:
                    os.unlink(t.name, dir_fd=t.dirfd)
    except FileNotFoundError:
        if found or not c.req.force:
            raise
    return {}, b""


def _copy(c: _Ctx) -> tuple[dict[str, object], bytes]:
    dest = c.req.dest
    if dest is None:
        raise OpError(_INVALID, "fs/copy requires destinationPath")
    with c.checked(write=False) as s:
        st = os.stat(s.name, dir_fd=s.dirfd, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            if not c.req.recursive:
                raise OpError(_INVALID, fdops.COPY_DIR_WITHOUT_RECURSIVE)
            if _within(dest, s.real):
                raise OpError(_INVALID, fdops.COPY_INTO_SELF)
            _copy_tree(c, s, dest)
            return {}, b""
        if not (stat.S_ISLNK(st.st_mode) or stat.S_ISREG(st.st_mode)):
            raise OpError(_INVALID, fdops.COPY_UNSUPPORTED_TYPE)
        with c.checked(write=True, path=dest, expect=c.req.dest_expect) as d:
            if stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(s.name, dir_fd=s.dirfd), d.name, dir_fd=d.dirfd)
            else:
                fdops.copy_file_at(s.dirfd, s.name, d.dirfd, d.name, dst_flags=os.O_NOFOLLOW)
    return {}, b""


def _copy_tree(c: _Ctx, s: _Target, dest: str) -> None:
    """The directory ``s`` into ``dest`` (made as needed); carved-out (``none``) entries
    are never read, protected destinations never written."""
    guard = c.guard
    src_fd = os.open(
        s.name, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=s.dirfd
    )
    try:
        dst_fd, dst_real = _make_dirs(c, dest)
        try:
            fdops.copy_tree_at(
                src_fd,
                dst_fd,
                dst_nofollow=os.O_NOFOLLOW,
                src_real=s.real,
                dst_real=dst_real,
                skip=guard.denies if guard.rules else None,
                check_write=(lambda real: guard.check(real, write=True)) if guard.rules else None,
            )
        finally:
            os.close(dst_fd)
    finally:
        os.close(src_fd)


def _canonicalize(c: _Ctx) -> tuple[dict[str, object], bytes]:
    with c.checked(write=None) as t:
        fd = os.open(t.name, os.O_PATH | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=t.dirfd)
        try:
            if stat.S_ISLNK(os.fstat(fd).st_mode):
                raise _final_symlink(c, t)
            real = _fd_path(fd)
        finally:
            os.close(fd)
    c.guard.check(real, write=False)
    return {"path": real}, b""


def _walk(c: _Ctx) -> tuple[dict[str, object], bytes]:
    """What the plan does not let the caller read is absent, not an error (as upstream's)."""
    options = c.req.walk
    if options is None:
        raise OpError(_INVALID, "fs sandbox request has an invalid `walk`")
    readable = None if c.req.readable is None else c.req.readable + c.req.writable
    guard = c.guard

    def visible(real: str) -> bool:
        if readable is not None and not any(_within(real, root) for root in readable):
            return False
        return not guard.denies(real)

    outcome = walk(c.req.walk_root or c.req.path, options, visible)
    return {
        "entries": outcome.entries,
        "errors": outcome.errors,
        "truncated": outcome.truncated,
    }, b""


def metadata_fields(st: os.stat_result) -> dict[str, object]:
    """getMetadata's answer of a path that is no link (``createdAtMs`` is 0, as upstream's)."""
    return {
        "isDirectory": stat.S_ISDIR(st.st_mode),
        "isFile": stat.S_ISREG(st.st_mode),
        "isSymlink": False,
        "size": st.st_size,
        "createdAtMs": 0,
        "modifiedAtMs": st.st_mtime_ns // 1_000_000,
    }


WRITE_OPS = frozenset({"fs/writeFile", "fs/createDirectory", "fs/remove"})


def no_follow(
    op: str, path: str, data: bytes | bytearray | memoryview, *, recursive: bool, force: bool
) -> tuple[dict[str, object], bytes]:
    """A ``followSymlinks: false`` call (:mod:`exec_server.fs.nofollow`), run by the
    server's worker and by the confined child alike; raises as the direct path does."""
    if op == "fs/getMetadata":
        return metadata_fields(nofollow.lstat(path)), b""
    if op == "fs/readFile":
        fd, size = nofollow.open_regular(path)
        try:
            if size > READ_LIMIT:
                raise FsRefusedError(fdops.too_large_message(READ_LIMIT))
            with translate_os_errors():
                return {}, fdops.read_to_end(fd, size, READ_LIMIT)
        finally:
            os.close(fd)
    if op == "fs/writeFile":
        nofollow.write_file(path, data)
    elif op == "fs/createDirectory":
        nofollow.create_directory(path, recursive=recursive)
    elif op == "fs/remove":
        nofollow.remove(path, recursive=recursive, force=force)
    else:
        raise FsRefusedError(f"{op} does not take followSymlinks")
    return {}, b""


def _open(c: _Ctx) -> tuple[dict[str, object], bytes]:
    """``fs/open``: the descriptor is opened here, confined, and passed to the server."""
    replace = c.req.mode == "replace"
    if replace:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NONBLOCK
    else:
        flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK
    with c.checked(write=replace) as t:
        fd = _open_final(c, t, flags)
    try:
        if not replace and not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OpError(_INVALID, f"path `{c.req.not_a_file or c.req.path}` is not a file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return {"passed_fd": fd}, b""


_OPS = {
    "fs/open": _open,
    "fs/walk": _walk,
    "fs/readFile": _read_file,
    "fs/writeFile": _write_file,
    "fs/createDirectory": _create_directory,
    "fs/getMetadata": _get_metadata,
    "fs/readDirectory": _read_directory,
    "fs/remove": _remove,
    "fs/copy": _copy,
    "fs/canonicalize": _canonicalize,
}
#: what a request may ask for (``fs/open`` only of a zygote child: it passes an fd back).
OPERATIONS = frozenset(_OPS)


def prefault(req: OpRequest) -> None:
    """Exercise request set-up without touching the filesystem (pre-forked children)."""
    _Ctx(req, b"")


def execute(req: OpRequest, data: bytes | bytearray) -> tuple[dict[str, object], bytes]:
    """Run one operation: (result fields, raw payload); every failure is an ``OpError``."""
    c = _Ctx(req, data)
    try:
        if req.no_follow:
            # The path as spelled has no link in it: the guard judges its real location.
            c.guard.check(req.path, write=req.op in WRITE_OPS)
            return no_follow(req.op, req.path, data, recursive=req.recursive, force=req.force)
        fn = _OPS.get(req.op)
        if fn is None:
            raise OpError(_INVALID, f"unknown fs sandbox operation `{req.op}`")
        return fn(c)
    except OSError as exc:
        raise error_from_os(exc) from exc
    except FsError as exc:
        raise _op_error(exc) from exc
