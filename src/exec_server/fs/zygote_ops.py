"""The filesystem operations a confined helper performs, plus their framing.

Stdlib only: imported by the zygote (``python -I -S``, no site-packages) and by
the one-shot ``--codex-run-as-fs-helper`` mode. Both confined paths share this
one implementation of PROTOCOL.md §9.3's direct semantics.

Two resolution modes:

* ``strict`` (zygote children): the server already resolved every path to its
  *check path* (§10.3) and sends the real location it expects each parent
  directory to have. The child opens the parent (``O_PATH``), reads back the
  kernel's name for that open object (``/proc/self/fd``) and refuses to go on
  if it differs: a symlink swapped in after the server's check is detected,
  and everything afterwards is relative to that verified directory fd with
  ``O_NOFOLLOW`` on the final component. Read-only holes (``.git`` …) and
  ``none`` carve-outs that Landlock cannot express are enforced here against
  the verified real location (SANDBOX.md §1.7, §7).
* non-strict (one-shot helper): plain direct semantics on the given paths;
  confinement comes entirely from the wrapper (bwrap / launcher).

Errors are ``OpError(code, message)`` with PROTOCOL.md §9.1 codes.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import struct
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from exec_server.errno_text import os_error_text
from exec_server.exceptions import ExecServerError, wire_error
from exec_server.fs import nofollow
from exec_server.fs.errors import FsError
from exec_server.fs.exchange import exchange_into_place, match_old_file
from exec_server.fs.walk import WalkOptions, walk

__all__ = [
    "MAX_READ_BYTES",
    "OpError",
    "OpRequest",
    "encode_frame",
    "error_from_os",
    "execute",
    "prefault",
    "read_frame",
    "temp_name",
    "write_all",
]

#: fs/readFile refuses larger files (PROTOCOL.md §9.3).
MAX_READ_BYTES = 536_870_912
_FRAME = struct.Struct("!IQ")
_MAX_HEADER = 16 * 1024 * 1024
_MAX_DATA = 2 * MAX_READ_BYTES

_NOT_FOUND = -32004
_INVALID = -32600
_INTERNAL = -32603

_COPY_DIR_NEEDS_RECURSIVE = "fs/copy requires recursive: true when sourcePath is a directory"
_COPY_INTO_ITSELF = "fs/copy cannot copy a directory to itself or one of its descendants"
_COPY_UNSUPPORTED = "fs/copy only supports regular files, directories, and symlinks"
_COPY_SAME_FILE = "fs/copy source and destination are the same file"

_O_TMPFILE = getattr(os, "O_TMPFILE", 0)

#: Failure injection, set only in a zygote child started with ``--test-hooks``:
#: ``test_pause(stage)`` is called half way through writing a replacing file's
#: data (``"write"``) and once its temp file has its name (``"linked"``);
#: ``test_named_temp`` writes a named temp file, as where ``O_TMPFILE`` is missing.
test_pause: Callable[[str], None] | None = None
test_named_temp = False


class OpError(Exception):
    """A failure that travels back to the client as a JSON-RPC error."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def error_from_os(exc: OSError) -> OpError:
    """Map an OS error per PROTOCOL.md §9.1, with Rust-style text (§5.3)."""
    num = exc.errno
    if num is None:
        return OpError(_INTERNAL, str(exc))
    text = os_error_text(num)
    if num == errno.ENOENT:
        return OpError(_NOT_FOUND, text)
    if num in (errno.EACCES, errno.EPERM):
        return OpError(_INVALID, text)
    return OpError(_INTERNAL, text)


def _os(num: int) -> OSError:
    return OSError(num, os.strerror(num))


@dataclass(frozen=True, slots=True)
class OpRequest:
    """One operation, decoded from the frame header (or a §10.5 helper request).

    ``expect`` / ``dest_expect`` are the real parent directories the server
    saw at check time (strict mode only). ``tmp`` is the server's token for the
    name of a writeFile's temp file (:func:`temp_name`; random when absent).
    """

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
    #: the walk's root as the caller spelled it (``path`` is its resolved check path):
    #: a root that is a link is not followed unless asked, and entries are named under it
    walk_root: str | None = None
    #: the helper plan's readable roots (None: everything); writable roots are readable too
    readable: tuple[str, ...] | None = None
    #: ``followSymlinks: false``: ``path`` is as the caller spelled it, no link followed
    no_follow: bool = False
    #: ``fs/open``'s mode: ``read`` or ``replace``
    mode: str = "read"

    @staticmethod
    def from_header(h: Mapping[str, object]) -> OpRequest:
        """Validate a decoded header; malformed input raises ``OpError(-32600)``."""

        def s(key: str, required: bool = False) -> str | None:
            v = h.get(key)
            if v is None and not required:
                return None
            if not isinstance(v, str) or not v.startswith("/") or "\x00" in v:
                raise OpError(_INVALID, f"fs sandbox request has an invalid `{key}`")
            return v

        def paths(key: str) -> tuple[str, ...]:
            v = h.get(key) or []
            if not isinstance(v, list) or not all(
                isinstance(p, str) and p.startswith("/") for p in v
            ):
                raise OpError(_INVALID, f"fs sandbox request has an invalid `{key}`")
            return tuple(v)

        op = h.get("op")
        if not isinstance(op, str):
            raise OpError(_INVALID, "fs sandbox request has no operation")
        tmp = h.get("tmp")
        if tmp is not None and not (
            isinstance(tmp, str) and 0 < len(tmp) <= 64 and tmp.isascii() and tmp.isalnum()
        ):
            raise OpError(_INVALID, "fs sandbox request has an invalid `tmp`")
        path = s("path", True)
        assert path is not None
        walk_options = None
        walk_root = None
        if op == "fs/walk":
            w = h.get("walk")
            if not (
                isinstance(w, list)
                and len(w) == 6
                and isinstance(w[0], str)
                and w[0].startswith("/")
                and "\x00" not in w[0]
                and all(type(v) is int and v >= 0 for v in w[1:4])
                and all(isinstance(v, bool) for v in w[4:])
            ):
                raise OpError(_INVALID, "fs sandbox request has an invalid `walk`")
            walk_root = w[0]
            walk_options = WalkOptions(*w[1:])
        readable = None
        plan = h.get("plan")
        if isinstance(plan, Mapping) and not plan.get("full_read", False):
            roots = plan.get("readable_roots") or []
            if not isinstance(roots, list) or not all(
                isinstance(p, str) and p.startswith("/") for p in roots
            ):
                raise OpError(_INVALID, "fs sandbox request has an invalid `plan`")
            readable = tuple(roots)
        return OpRequest(
            op=op,
            path=path,
            expect=s("expect"),
            dest=s("dest"),
            dest_expect=s("dest_expect"),
            recursive=bool(h.get("recursive", True)),
            force=bool(h.get("force", True)),
            writable=paths("writable"),
            read_only=paths("read_only"),
            denied=paths("denied"),
            full_write=bool(h.get("full_write", False)),
            not_a_file=s("not_a_file"),
            tmp=tmp,
            walk=walk_options,
            walk_root=walk_root,
            readable=readable,
            no_follow=bool(h.get("no_follow", False)),
            mode="replace" if h.get("mode") == "replace" else "read",
        )


# --------------------------------------------------------------------------- framing


def encode_frame(header: bytes, data_len: int) -> bytes:
    """Frame prefix: header length, data length (big endian), then the header."""
    return _FRAME.pack(len(header), data_len) + header


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """Write everything with ``write(2)`` (``send`` is denied by the seccomp filter)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


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
    """Read one frame (header bytes, data) from a blocking fd."""
    hlen, dlen = _FRAME.unpack(bytes(_read_exact(fd, _FRAME.size)))
    if hlen > _MAX_HEADER or dlen > _MAX_DATA:
        raise OpError(_INVALID, "fs sandbox frame too large")
    header = bytes(_read_exact(fd, hlen))
    return header, _read_exact(fd, dlen)


# --------------------------------------------------------------------------- guard


def _within(path: str, root: str) -> bool:
    return path == root or root == "/" or path.startswith(root + "/")


def _depth(path: str) -> int:
    return 0 if path == "/" else path.count("/")


@dataclass(slots=True)
class _Guard:
    """Read-only holes and ``none`` carve-outs, enforced on real locations."""

    rules: list[tuple[str, int]] = field(default_factory=list)  # (path, 0 none/1 ro/2 write)

    @staticmethod
    def build(req: OpRequest) -> _Guard:
        rules: list[tuple[str, int]] = []
        if not req.read_only and not req.denied:
            return _Guard(rules)
        for kind, group in ((2, req.writable), (1, req.read_only), (0, req.denied)):
            for p in group:
                rules.append((p, kind))
                real = os.path.realpath(p)
                if real != p:
                    rules.append((real, kind))
        if req.full_write:
            rules.append(("/", 2))
        return _Guard(rules)

    def _classify(self, path: str) -> int | None:
        best: tuple[int, int] | None = None  # (depth, -kind): deeper wins, then lower kind
        for root, kind in self.rules:
            if _within(path, root):
                key = (_depth(root), -kind)
                if best is None or key > best:
                    best = key
        return None if best is None else -best[1]

    def denies(self, path: str) -> bool:
        """Whether ``path`` lies under a ``none`` carve-out."""
        return self._classify(path) == 0

    def check(self, path: str, *, write: bool) -> None:
        kind = self._classify(path)
        if kind == 0:
            raise _os(errno.EACCES)
        if write and kind == 1:
            raise _os(errno.EROFS)

    def check_subtree(self, path: str) -> None:
        """Refuse removing a tree that contains a protected or denied path."""
        self.check(path, write=True)
        for root, kind in self.rules:
            if kind < 2 and root != path and _within(root, path) and os.path.lexists(root):
                raise _os(errno.EROFS if kind == 1 else errno.EACCES)


# --------------------------------------------------------------------------- resolution


def _fd_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


@dataclass(slots=True)
class _Target:
    """A final component ``name`` inside the open directory ``dirfd``."""

    dirfd: int
    name: str
    real_parent: str

    @property
    def real(self) -> str:
        if self.name == ".":
            return self.real_parent
        return self.real_parent.rstrip("/") + "/" + self.name

    def close(self) -> None:
        os.close(self.dirfd)


class _Ctx:
    """Per-request resolution state: strictness, guard, fds to close."""

    def __init__(self, req: OpRequest, *, strict: bool) -> None:
        self.req = req
        self.strict = strict
        self.guard = _Guard.build(req)
        self.nofollow = os.O_NOFOLLOW if strict else 0

    def changed(self, path: str) -> OpError:
        return OpError(_INTERNAL, f"{path} changed while the sandboxed operation was running")

    def open_dir(self, path: str, expect: str | None) -> int:
        """Open an existing directory (``O_PATH``), verifying its real location."""
        fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        if self.strict:
            real = _fd_path(fd)
            if real != (expect if expect is not None else path):
                os.close(fd)
                raise self.changed(path)
        return fd

    def target(self, path: str, expect: str | None) -> _Target:
        if path == "/":
            return _Target(self.open_dir("/", "/"), ".", "/")
        parent, name = os.path.split(path)
        fd = self.open_dir(parent, expect)
        return _Target(fd, name, _fd_path(fd) if self.strict else parent)


def _final_symlink(c: _Ctx, t: _Target) -> OSError | OpError:
    """The error for a read that meets a symlink as the final component of a resolved path.

    The server resolved the path (PROTOCOL.md §10.3), following every link it
    could, so a link still there is dangling or a loop (``exists`` saw nothing
    behind it), or was swapped in since. Following it is safe for the answer
    only when that answer is a failure: a dangling link is ``ENOENT``
    (``-32004``, as the direct path and upstream say: the client depends on
    it), a loop ``ELOOP``. A link that resolves now is not followed (what it
    points to was never checked): the path changed under us.
    """
    try:
        os.stat(t.name, dir_fd=t.dirfd)
    except OSError as exc:
        return exc
    return c.changed(c.req.path)


def _open_final(c: _Ctx, t: _Target, flags: int) -> int:
    """``openat`` of a read's final component; a final symlink is :func:`_final_symlink`'s."""
    try:
        return os.open(t.name, flags | c.nofollow, dir_fd=t.dirfd)
    except OSError as exc:
        if not c.strict or exc.errno not in (errno.ELOOP, errno.ENOTDIR):
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


def _iter_chunks(fd: int) -> Iterator[bytes]:
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return
        yield chunk


def _read_all(fd: int, size_hint: int) -> bytes:
    """Read to EOF; one read of the expected size avoids a copy in the common case."""
    first = os.read(fd, size_hint + 1) if size_hint > 0 else b""
    if 0 < len(first) <= size_hint:
        return first
    chunks = [first]
    total = len(first)
    while True:
        try:
            chunk = os.read(fd, 1 << 20)
        except BlockingIOError:
            break
        if not chunk:
            break
        total += len(chunk)
        if total > MAX_READ_BYTES:
            raise OpError(_INVALID, f"file is too large to read: limit is {MAX_READ_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


# --------------------------------------------------------------------------- operations


def _read_file(c: _Ctx) -> tuple[dict[str, object], bytes]:
    t = c.target(c.req.path, c.req.expect)
    try:
        c.guard.check(t.real, write=False)
        # O_NONBLOCK: a FIFO without a writer must not hang the helper.
        fd = _open_final(c, t, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    finally:
        t.close()
    try:
        st = os.fstat(fd)
        if c.req.not_a_file is not None and not stat.S_ISREG(st.st_mode):
            # The current client's rule: a directory, FIFO or device is not a file.
            raise OpError(_INVALID, f"path `{c.req.not_a_file}` is not a file")
        if stat.S_ISDIR(st.st_mode):
            raise _os(errno.EISDIR)
        if st.st_size > MAX_READ_BYTES:
            raise OpError(_INVALID, f"file is too large to read: limit is {MAX_READ_BYTES} bytes")
        data = _read_all(fd, st.st_size if stat.S_ISREG(st.st_mode) else 0)
    finally:
        os.close(fd)
    return {}, data


def _write_file(c: _Ctx, data: bytes | bytearray) -> tuple[dict[str, object], bytes]:
    """Create or atomically replace (temp file + rename in the same directory)."""
    t = c.target(c.req.path, c.req.expect)
    try:
        c.guard.check(t.real, write=True)
        try:
            old: os.stat_result | None = os.stat(
                t.name, dir_fd=t.dirfd, follow_symlinks=not c.strict
            )
        except FileNotFoundError:
            old = None
        if old is not None and stat.S_ISLNK(old.st_mode):
            raise _os(errno.ELOOP)
        if old is not None and stat.S_ISDIR(old.st_mode):
            raise _os(errno.EISDIR)
        if (old is not None and not stat.S_ISREG(old.st_mode)) or not c.strict:
            _write_in_place(t, data, c.nofollow | os.O_NONBLOCK)
        else:
            if old is not None:
                _check_writable(t)
            _write_atomic(t, data, old, c.req.tmp)
    finally:
        t.close()
    return {}, b""


def _check_writable(t: _Target) -> None:
    """Refuse to replace a file this helper may not write (as ``ops._check_writable``):
    the rename needs only the directory's permission, and the helper runs without
    capabilities, so a 0444 file was replaced where upstream's helper gets
    ``EACCES`` from its open."""
    if os.access(t.name, os.W_OK, dir_fd=t.dirfd, effective_ids=True, follow_symlinks=False):
        return
    try:
        read_only = bool(os.fstatvfs(t.dirfd).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    raise _os(errno.EROFS if read_only else errno.EACCES)


def _write_in_place(t: _Target, data: bytes | bytearray, extra: int) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | extra
    fd = os.open(t.name, flags, 0o666, dir_fd=t.dirfd)
    try:
        if extra & os.O_NONBLOCK:
            # Non-blocking only for the open (a FIFO without a reader is ENXIO,
            # not a hang); the writes wait for the reader (EAGAIN after 64 KiB).
            os.set_blocking(fd, True)
        write_all(fd, data)
    finally:
        os.close(fd)


def temp_name(name: str, token: str) -> str:
    """The name of the temp file that replaces ``name``: ``.<name>.<token>.tmp``.

    The server picks ``token`` (the request's ``tmp``) so that it can remove what a
    killed helper leaves at that name (``fs/zygote.py``).
    """
    return f".{os.fsencode(name)[:100].decode('utf-8', 'surrogateescape')}.{token}.tmp"


def _open_unnamed(t: _Target) -> int | None:
    """An unnamed file (``O_TMPFILE``) in the target's directory, or None where there
    is none (a filesystem without it, or one this process may not create in)."""
    if not _O_TMPFILE or test_named_temp:
        return None
    try:
        return os.open(".", os.O_WRONLY | _O_TMPFILE | os.O_CLOEXEC, 0o666, dir_fd=t.dirfd)
    except OSError:
        return None  # the named temp file below says what is wrong, as before


def _link_unnamed(fd: int, t: _Target, name: str) -> bool:
    """Give the unnamed file ``fd`` the name ``name`` in the target's directory;
    False if that name is taken.

    Through ``/proc/self/fd`` (``linkat(AT_SYMLINK_FOLLOW)``, which ``os.link``
    makes with a directory fd): ``AT_EMPTY_PATH`` would need
    ``CAP_DAC_READ_SEARCH``, which the helper never has.
    """
    try:
        os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=t.dirfd)
    except FileExistsError:
        return False
    return True


def _write_data(fd: int, data: bytes | bytearray) -> None:
    if test_pause is None:
        write_all(fd, data)
        return
    half = len(data) // 2
    with memoryview(data) as view:
        write_all(fd, view[:half])
        test_pause("write")
        write_all(fd, view[half:])


def _write_atomic(
    t: _Target, data: bytes | bytearray, old: os.stat_result | None, token: str | None
) -> None:
    """Write ``data`` to a new file and put it in place of ``t`` in one step.

    The new file is unnamed (``O_TMPFILE``) while its data is written: a helper
    killed then (the caller went away, the timeout, a crash) leaves nothing
    behind, the kernel frees the file. It gets a name only when complete: the
    target's own if there is no file there, else ``.<name>.<token>.tmp``, swapped
    or renamed over the target at once. A helper killed in that last step leaves
    the temp name, which the server (knowing ``token``) removes once the helper
    is dead. Where no unnamed file can be made, a named temp file as before.
    """
    tmp = temp_name(t.name, token if token is not None else os.urandom(6).hex())
    fd = _open_unnamed(t)
    named = fd is None
    if fd is None:
        try:
            fd = os.open(
                tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666, dir_fd=t.dirfd
            )
        except FileExistsError:
            raise
        except OSError:
            if old is None:
                raise
            # No new entry here, the file itself may be writable (as fs/ops.py).
            _write_in_place(t, data, os.O_NOFOLLOW)
            return
    linked = named  # whether ``tmp`` names our file (to remove on failure)
    try:
        try:
            _write_data(fd, data)
            # The old file by path without following its name: through our directory fd.
            old_path = f"/proc/self/fd/{t.dirfd}/{t.name}"
            faithful = old is None or match_old_file(fd, old, old_path)
            if faithful and not named:
                if old is None and _link_unnamed(fd, t, t.name):
                    return  # a new file, named at once: no temp name ever existed
                if not _link_unnamed(fd, t, tmp):
                    raise _os(errno.EEXIST)
                linked = True
        finally:
            os.close(fd)
        if not faithful:
            # The helper may not chown (no capabilities) or set every attribute:
            # keep the old file's, not atomicity.
            if linked:
                os.unlink(tmp, dir_fd=t.dirfd)
                linked = False
            _write_in_place(t, data, os.O_NOFOLLOW)
            return
        if test_pause is not None:
            test_pause("linked")
        # Swap over an existing file (no ext4 writeback inside rename), else rename.
        try:
            if old is None or not exchange_into_place(tmp, t.name, t.dirfd):
                os.rename(tmp, t.name, src_dir_fd=t.dirfd, dst_dir_fd=t.dirfd)
            linked = False
        except OSError as exc:
            if exc.errno != errno.EBUSY or old is None:
                raise
            os.unlink(tmp, dir_fd=t.dirfd)  # a mount point: written, not replaced
            linked = False
            _write_in_place(t, data, os.O_NOFOLLOW)
    except BaseException:
        if linked:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=t.dirfd)
        raise


def _mkdir_unless_directory(name: str, dir_fd: int) -> None:
    """``mkdir`` ``name`` in ``dir_fd`` unless a directory, or a link to one, is there.

    Anything else there is "File exists", as upstream's ``create_dir_all`` says
    and the direct path answers: a file, or a link leading nowhere or to itself
    (not the error the caller's open of it would give: "Not a directory" under
    ``O_NOFOLLOW``, or a link loop). A link to a directory is left to the
    caller's open, which follows it or, in strict mode, refuses it.
    """
    try:
        os.mkdir(name, 0o777, dir_fd=dir_fd)
    except FileExistsError:
        try:
            is_directory = stat.S_ISDIR(os.stat(name, dir_fd=dir_fd).st_mode)
        except OSError:
            is_directory = False
        if not is_directory:
            raise


def _make_dirs(c: _Ctx, path: str, expect: str | None) -> tuple[int, str]:
    """``mkdir -p`` by directory fds; returns an ``O_PATH`` fd of ``path`` and its real path."""
    missing: list[str] = []
    cur = path
    cur_expect = expect
    while True:
        try:
            fd = c.open_dir(cur, cur_expect if c.strict else None)
            break
        except FileNotFoundError:
            if cur == "/":
                raise
            cur, name = os.path.split(cur)
            missing.append(name)
            cur_expect = cur if cur_expect is not None else None
        except OSError as exc:
            # A file, or a link looping to itself, where the directory goes: "File
            # exists", as upstream's create_dir_all says.
            if exc.errno in (errno.ENOTDIR, errno.ELOOP) and cur == path and os.path.lexists(path):
                raise _os(errno.EEXIST) from None
            raise
    real = _fd_path(fd) if c.strict else cur
    try:
        for name in reversed(missing):
            child_real = real.rstrip("/") + "/" + name
            c.guard.check(child_real, write=True)
            _mkdir_unless_directory(name, fd)
            nfd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC | c.nofollow, dir_fd=fd)
            os.close(fd)
            fd, real = nfd, child_real
    except BaseException:
        os.close(fd)
        raise
    return fd, real


def _create_directory(c: _Ctx) -> tuple[dict[str, object], bytes]:
    if c.req.recursive:
        # The expectation for ``path`` itself: in strict mode the check path is
        # canonical in its existing prefix, so every existing ancestor must
        # resolve to itself.
        fd, _ = _make_dirs(c, c.req.path, c.req.path if c.strict else None)
        os.close(fd)
        return {}, b""
    t = c.target(c.req.path, c.req.expect)
    try:
        c.guard.check(t.real, write=True)
        os.mkdir(t.name, 0o777, dir_fd=t.dirfd)
    finally:
        t.close()
    return {}, b""


def _get_metadata(c: _Ctx) -> tuple[dict[str, object], bytes]:
    t = c.target(c.req.path, c.req.expect)
    try:
        c.guard.check(t.real, write=False)
        lst = os.stat(t.name, dir_fd=t.dirfd, follow_symlinks=False)
        if stat.S_ISLNK(lst.st_mode):
            if c.strict:
                raise _final_symlink(c, t)
            st = os.stat(t.name, dir_fd=t.dirfd)
        else:
            st = lst
    finally:
        t.close()
    return {
        "isDirectory": stat.S_ISDIR(st.st_mode),
        "isFile": stat.S_ISREG(st.st_mode),
        "isSymlink": stat.S_ISLNK(lst.st_mode),
        "size": st.st_size,
        "createdAtMs": 0,
        "modifiedAtMs": st.st_mtime_ns // 1_000_000,
    }, b""


def _lossy(name: str) -> str:
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _read_directory(c: _Ctx) -> tuple[dict[str, object], bytes]:
    t = c.target(c.req.path, c.req.expect)
    try:
        c.guard.check(t.real, write=False)
        fd = _open_final(c, t, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    finally:
        t.close()
    real = t.real
    entries: list[dict[str, object]] = []
    try:
        with os.scandir(fd) as it:
            for entry in it:
                if c.guard.rules:
                    try:
                        c.guard.check(real.rstrip("/") + "/" + entry.name, write=False)
                    except OSError:
                        continue
                try:
                    st = os.stat(entry.name, dir_fd=fd)
                except OSError:
                    continue  # dangling symlinks etc. are skipped (§9.3)
                entries.append(
                    {
                        "fileName": _lossy(entry.name),
                        "isDirectory": stat.S_ISDIR(st.st_mode),
                        "isFile": stat.S_ISREG(st.st_mode),
                    }
                )
    finally:
        os.close(fd)
    return {"entries": entries}, b""


def _remove(c: _Ctx) -> tuple[dict[str, object], bytes]:
    try:
        t = c.target(c.req.path, c.req.expect)
    except FileNotFoundError:
        if c.req.force:
            return {}, b""
        raise
    try:
        try:
            st = os.stat(t.name, dir_fd=t.dirfd, follow_symlinks=False)
        except FileNotFoundError:
            if c.req.force:
                return {}, b""
            raise
        if stat.S_ISDIR(st.st_mode):
            if c.req.recursive:
                c.guard.check_subtree(t.real)
                shutil.rmtree(t.name, dir_fd=t.dirfd)
            else:
                c.guard.check(t.real, write=True)
                os.rmdir(t.name, dir_fd=t.dirfd)
        else:
            c.guard.check(t.real, write=True)
            os.unlink(t.name, dir_fd=t.dirfd)
    finally:
        t.close()
    return {}, b""


def _copy_file_fd(src_dir: int, name: str, dst_dir: int, dst_name: str, nofollow: int) -> None:
    """One regular file, as the direct path copies it (``ops._copy_file_at``).

    The destination is opened without ``O_TRUNC`` and compared with the source
    first, so a copy onto the file itself (or a hard link of it) cannot
    truncate it. ``O_NONBLOCK`` on the open: a FIFO destination without a
    reader is ``ENXIO`` at once instead of holding the helper (and the
    client's connection) until the helper times out.
    """
    sfd = os.open(name, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=src_dir)
    try:
        src_st = os.fstat(sfd)
        perm = stat.S_IMODE(src_st.st_mode)
        dfd = os.open(
            dst_name,
            os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK | nofollow,
            perm,
            dir_fd=dst_dir,
        )
        try:
            dst_st = os.fstat(dfd)
            if os.path.samestat(src_st, dst_st):
                raise OpError(_INVALID, _COPY_SAME_FILE)
            if dst_st.st_size:
                os.ftruncate(dfd, 0)
            if stat.S_IMODE(dst_st.st_mode) != perm:
                os.fchmod(dfd, perm)
            if not stat.S_ISREG(dst_st.st_mode):
                # A FIFO with a reader (or a device): written like the direct
                # path and `cp`, waiting for the reader rather than failing
                # once the pipe is full.
                os.set_blocking(dfd, True)
            _copy_contents(sfd, dfd)
        finally:
            os.close(dfd)
    finally:
        os.close(sfd)


def _copy_contents(sfd: int, dfd: int) -> None:
    """Copy from both files' offsets to EOF, in the kernel when it can."""
    try:
        while os.copy_file_range(sfd, dfd, 1 << 30):
            pass
        return
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
            raise
    try:
        os.lseek(sfd, os.lseek(dfd, 0, os.SEEK_CUR), os.SEEK_SET)
    except OSError as exc:
        # A FIFO destination: copy_file_range refused it before copying anything.
        if exc.errno != errno.ESPIPE:
            raise
    for chunk in _iter_chunks(sfd):
        write_all(dfd, chunk)


def _copy_tree(c: _Ctx, src_fd: int, src_real: str, dst_fd: int, dst_real: str) -> None:
    with os.scandir(src_fd) as it:
        names = [e.name for e in it]
    for name in names:
        s_real = src_real.rstrip("/") + "/" + name
        d_real = dst_real.rstrip("/") + "/" + name
        try:
            st = os.stat(name, dir_fd=src_fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if c.guard.rules:
            try:
                c.guard.check(s_real, write=False)
            except OSError:
                continue  # carved-out (`none`) entries are never read
        if stat.S_ISDIR(st.st_mode):
            c.guard.check(d_real, write=True)
            _mkdir_unless_directory(name, dst_fd)
            sub_src = os.open(
                name, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=src_fd
            )
            try:
                sub_dst = os.open(
                    name, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=dst_fd
                )
                try:
                    _copy_tree(c, sub_src, s_real, sub_dst, d_real)
                finally:
                    os.close(sub_dst)
            finally:
                os.close(sub_src)
        elif stat.S_ISREG(st.st_mode):
            c.guard.check(d_real, write=True)
            _copy_file_fd(src_fd, name, dst_fd, name, os.O_NOFOLLOW)
        elif stat.S_ISLNK(st.st_mode):
            c.guard.check(d_real, write=True)
            os.symlink(os.readlink(name, dir_fd=src_fd), name, dir_fd=dst_fd)
        # FIFOs, sockets and devices are skipped silently (§9.3).


def _copy(c: _Ctx) -> tuple[dict[str, object], bytes]:
    dest = c.req.dest
    if dest is None:
        raise OpError(_INVALID, "fs/copy requires destinationPath")
    s = c.target(c.req.path, c.req.expect)
    try:
        c.guard.check(s.real, write=False)
        st = os.stat(s.name, dir_fd=s.dirfd, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            if not c.req.recursive:
                raise OpError(_INVALID, _COPY_DIR_NEEDS_RECURSIVE)
            src_real = s.real if c.strict else os.path.realpath(c.req.path)
            dst_real = dest if c.strict else os.path.realpath(dest)
            if _within(dst_real, src_real):
                raise OpError(_INVALID, _COPY_INTO_ITSELF)
            src_fd = os.open(
                s.name, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=s.dirfd
            )
            try:
                dpath_fd, d_real = _make_dirs(c, dest, dest if c.strict else None)
                try:
                    dst_fd = os.open(
                        ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dpath_fd
                    )
                finally:
                    os.close(dpath_fd)
                try:
                    _copy_tree(c, src_fd, src_real, dst_fd, d_real)
                finally:
                    os.close(dst_fd)
            finally:
                os.close(src_fd)
            return {}, b""
        if not (stat.S_ISLNK(st.st_mode) or stat.S_ISREG(st.st_mode)):
            raise OpError(_INVALID, _COPY_UNSUPPORTED)
        d = c.target(dest, c.req.dest_expect)
        try:
            c.guard.check(d.real, write=True)
            if stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(s.name, dir_fd=s.dirfd), d.name, dir_fd=d.dirfd)
            else:
                _copy_file_fd(s.dirfd, s.name, d.dirfd, d.name, c.nofollow)
        finally:
            d.close()
    finally:
        s.close()
    return {}, b""


def _canonicalize(c: _Ctx) -> tuple[dict[str, object], bytes]:
    if c.strict:
        t = c.target(c.req.path, c.req.expect)
        try:
            fd = os.open(t.name, os.O_PATH | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=t.dirfd)
            try:
                if stat.S_ISLNK(os.fstat(fd).st_mode):
                    raise _final_symlink(c, t)
                real = _fd_path(fd)
            finally:
                os.close(fd)
        finally:
            t.close()
    else:
        real = os.path.realpath(c.req.path, strict=True)
    c.guard.check(real, write=False)
    return {"path": real}, b""


def _walk(c: _Ctx) -> tuple[dict[str, object], bytes]:
    """``fs/walk`` in the confined child: the directories are listed under Landlock,
    and what the plan does not let the caller read (outside the readable roots,
    ``none`` carve-outs) is left out, so a link leading out of the roots is absent
    rather than an error, as upstream's helper shows it."""
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


_NO_FOLLOW_WRITES = frozenset({"fs/writeFile", "fs/createDirectory", "fs/remove"})


def _no_follow(c: _Ctx, data: bytes | bytearray) -> tuple[dict[str, object], bytes]:
    """A ``followSymlinks: false`` call: the server's own no-follow code, run here under
    Landlock and without capabilities; the path as spelled has no link in it, so the
    guard (read-only holes, ``none`` carve-outs) judges the real location."""
    req = c.req
    c.guard.check(req.path, write=req.op in _NO_FOLLOW_WRITES)
    try:
        if req.op == "fs/getMetadata":
            st = nofollow.lstat(req.path)
            return {
                "isDirectory": stat.S_ISDIR(st.st_mode),
                "isFile": stat.S_ISREG(st.st_mode),
                "isSymlink": False,
                "size": st.st_size,
                "createdAtMs": 0,
                "modifiedAtMs": st.st_mtime_ns // 1_000_000,
            }, b""
        if req.op == "fs/readFile":
            fd, size = nofollow.open_regular(req.path)
            try:
                if size > MAX_READ_BYTES:
                    raise OpError(
                        _INVALID, f"file is too large to read: limit is {MAX_READ_BYTES} bytes"
                    )
                return {}, _read_all(fd, size)
            finally:
                os.close(fd)
        if req.op == "fs/writeFile":
            nofollow.write_file(req.path, data)
        elif req.op == "fs/createDirectory":
            nofollow.create_directory(req.path, recursive=req.recursive)
        elif req.op == "fs/remove":
            nofollow.remove(req.path, recursive=req.recursive, force=req.force)
        else:
            raise OpError(_INVALID, f"{req.op} does not take followSymlinks")
    except (ExecServerError, FsError) as exc:
        err = wire_error(exc)
        assert err is not None  # both kinds map
        raise OpError(err.code, err.message) from exc
    return {}, b""


def _open(c: _Ctx) -> tuple[dict[str, object], bytes]:
    """``fs/open`` in the confined child: the descriptor is opened here, under Landlock
    and without capabilities, and handed to the server (``passed_fd``, sent over the
    reply socket by ``zygote_main``), which then reads and writes it directly."""
    replace = c.req.mode == "replace"
    t = c.target(c.req.path, c.req.expect)
    try:
        c.guard.check(t.real, write=replace)
        if replace:
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NONBLOCK
        else:
            flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK
        fd = _open_final(c, t, flags)
    finally:
        t.close()
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
    "fs/createDirectory": _create_directory,
    "fs/getMetadata": _get_metadata,
    "fs/readDirectory": _read_directory,
    "fs/remove": _remove,
    "fs/copy": _copy,
    "fs/canonicalize": _canonicalize,
}


def prefault(req: OpRequest) -> None:
    """Exercise request set-up without touching the filesystem (pre-forked children)."""
    _Ctx(req, strict=True)


def execute(
    req: OpRequest, data: bytes | bytearray, *, strict: bool
) -> tuple[dict[str, object], bytes]:
    """Run one operation; returns (result fields, raw payload for readFile).

    Raises:
        OpError: every failure, already mapped to a JSON-RPC code and text.
    """
    c = _Ctx(req, strict=strict)
    try:
        if req.no_follow:
            return _no_follow(c, data)
        if req.op == "fs/writeFile":
            return _write_file(c, data)
        fn = _OPS.get(req.op)
        if fn is None:
            raise OpError(_INVALID, f"unknown fs sandbox operation `{req.op}`")
        return fn(c)
    except OSError as exc:
        raise error_from_os(exc) from exc
