"""Filesystem operations (PROTOCOL.md §9.3) on open directories, by ``*at`` calls. Stdlib
only: the confined helper runs it under ``python -I -S``; callers map what it raises."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Final

from exec_server._os.linux import rename_exchange
from exec_server.fs.errors import FsRefusedError, os_error

__all__ = [
    "COPY_DIR_WITHOUT_RECURSIVE",
    "COPY_INTO_SELF",
    "COPY_UNSUPPORTED_TYPE",
    "READ_LIMIT",
    "Buffer",
    "check_for_read",
    "check_writable",
    "copy_file_at",
    "copy_tree_at",
    "list_directory",
    "lossy_name",
    "make_dirs",
    "match_old_file",
    "mkdir_unless_directory",
    "read_to_end",
    "remove_tree_at",
    "replace_file",
    "temp_name",
    "too_large_message",
    "write_all",
    "write_in_place",
]

#: ``fs/readFile`` refuses files larger than this (PROTOCOL.md §9.3).
READ_LIMIT: Final = 512 * 1024 * 1024

COPY_DIR_WITHOUT_RECURSIVE: Final = (
    "fs/copy requires recursive: true when sourcePath is a directory"
)
COPY_INTO_SELF: Final = "fs/copy cannot copy a directory to itself or one of its descendants"
COPY_UNSUPPORTED_TYPE: Final = "fs/copy only supports regular files, directories, and symlinks"

Buffer = bytes | bytearray | memoryview
#: Around a wait only another party ends (a FIFO's reader): the pool frees the thread's place.
Wait = Callable[[], AbstractContextManager[None]]

_CHUNK: Final = 1024 * 1024
_COPY_MAX: Final = 1 << 30
_O_TMPFILE: Final = getattr(os, "O_TMPFILE", 0)
_O_PATH: Final = getattr(os, "O_PATH", os.O_RDONLY)
_SUBDIR: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def too_large_message(limit: int) -> str:
    return f"file is too large to read: limit is {limit} bytes"


def check_for_read(fd: int, limit: int = READ_LIMIT, not_a_file: str | None = None) -> int | None:
    """``st_size`` of a regular file, else None; ``not_a_file``: the current client's rule."""
    st = os.fstat(fd)
    regular = stat.S_ISREG(st.st_mode)
    if not_a_file is not None and not regular:
        raise FsRefusedError(f"path `{not_a_file}` is not a file")
    if stat.S_ISDIR(st.st_mode):
        raise os_error(errno.EISDIR)
    if st.st_size > limit:
        raise FsRefusedError(too_large_message(limit))
    return st.st_size if regular else None


def read_to_end(fd: int, size: int | None, limit: int = READ_LIMIT) -> bytes:
    """Read ``fd`` to EOF (or what a FIFO has), at most ``limit`` bytes. Past ``size`` one
    buffer grows: separate chunks stayed resident in glibc's heap."""
    data = bytearray()
    if size:
        # A short read of size+1 means EOF: the bytes object is the only copy.
        first = os.read(fd, size + 1)
        if len(first) <= size:
            return first
        data += first
        del first
    while True:
        try:
            chunk = os.read(fd, _CHUNK)
        except BlockingIOError:
            break
        if not chunk:
            break
        if len(data) + len(chunk) > limit:
            raise FsRefusedError(too_large_message(limit))
        data += chunk
    return bytes(data)


def write_all(fd: int, data: Buffer | Iterable[Buffer]) -> None:
    pieces = (data,) if isinstance(data, bytes | bytearray | memoryview) else data
    for piece in pieces:
        view = memoryview(piece).cast("B")
        while view:
            view = view[os.write(fd, view) :]


def write_in_place(
    dir_fd: int,
    name: str,
    data: Buffer,
    flags: int = 0,
    wait: Wait = contextlib.nullcontext,
) -> None:
    """Write ``name`` in place; ``O_NONBLOCK``: a FIFO without a reader is ``ENXIO`` at once."""
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | flags, 0o666,
                 dir_fd=dir_fd)
    try:
        if flags & os.O_NONBLOCK:
            os.set_blocking(fd, True)
        with wait():
            write_all(fd, data)
    finally:
        os.close(fd)


def check_writable(dir_fd: int, name: str) -> None:
    """Refuse what upstream's ``O_TRUNC`` open would: a rename needs only the directory."""
    if os.access(name, os.W_OK, dir_fd=dir_fd, effective_ids=True, follow_symlinks=False):
        return
    try:
        read_only = bool(os.fstatvfs(dir_fd).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    raise os_error(errno.EROFS if read_only else errno.EACCES)


def temp_name(name: str, token: str) -> str:
    """``.<name>.<token>.tmp``: the helper's server removes what a killed helper leaves."""
    return f".{os.fsencode(name)[:100].decode('utf-8', 'surrogateescape')}.{token}.tmp"


def replace_file(
    dir_fd: int,
    name: str,
    fill: Callable[[int], None],
    whole: Callable[[], Buffer],
    old: os.stat_result | None,
    token: str,
    *,
    unnamed: bool = True,
    pause: Callable[[str], None] | None = None,
) -> None:
    """Create ``name`` or replace the file ``old`` in one step, never leaving half a file; in
    place (upstream's way, with ``whole()``) where owner, attributes or a mount must stay."""
    tmp = temp_name(name, token)
    try:
        fd, named = _create_new(dir_fd, tmp, unnamed)
    except OSError as exc:
        if old is None or isinstance(exc, FileExistsError):
            raise
        # The directory takes no new entry (refused, no inode, /proc's ENOENT): report the
        # file's own error, never -32004 (the client would create the parent and retry).
        write_in_place(dir_fd, name, whole(), os.O_NOFOLLOW)
        return
    linked = named  # whether ``tmp`` names the new file (to remove on failure)
    try:
        try:
            fill(fd)
            faithful = old is None or match_old_file(fd, old, f"/proc/self/fd/{dir_fd}/{name}")
            if faithful and not named:
                if old is None and _link_unnamed(fd, dir_fd, name):
                    return  # a new file, named at once: no temp name ever existed
                if not _link_unnamed(fd, dir_fd, tmp):
                    raise os_error(errno.EEXIST)
                linked = True
        finally:
            os.close(fd)
        if faithful:
            if pause is not None:
                pause("linked")
            try:
                if old is None or not _exchange(dir_fd, tmp, name):
                    os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                linked = False
                return
            except OSError as exc:
                # A mount point (a container's /etc/hosts) cannot be replaced, only written.
                if exc.errno != errno.EBUSY or old is None:
                    raise
        # Keep the old file's owner and attributes (or mount) rather than atomicity.
        if linked:
            os.unlink(tmp, dir_fd=dir_fd)
            linked = False
        write_in_place(dir_fd, name, whole(), os.O_NOFOLLOW)
    except BaseException:
        if linked:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
        raise


#: ``rename_exchange`` cannot here (old kernel or libc, filesystem, the entry gone): rename.
_NO_EXCHANGE: Final = frozenset(
    {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EXDEV, errno.ENOENT}
)


def _exchange(dir_fd: int, tmp: str, name: str) -> bool:
    """Swap and unlink the old file (False where we cannot): a ``rename`` over a file makes
    ext4 write back inside the call (``auto_da_alloc``), a 1 KiB write ~3x upstream's."""
    src, dst = os.fsencode(tmp), os.fsencode(name)
    try:
        rename_exchange(dir_fd, src, dst)
    except OSError as exc:
        if exc.errno in _NO_EXCHANGE:
            return False
        raise OSError(exc.errno, exc.strerror, name) from None
    try:
        os.unlink(tmp, dir_fd=dir_fd)
    except IsADirectoryError:
        # A directory replaced the target since it was looked at: put it back.
        with contextlib.suppress(OSError):
            rename_exchange(dir_fd, src, dst)
        raise OSError(errno.EISDIR, os.strerror(errno.EISDIR), name) from None
    except FileNotFoundError:
        pass
    return True


def _create_new(dir_fd: int, tmp: str, unnamed: bool) -> tuple[int, bool]:
    """A new empty file, unnamed (``O_TMPFILE``) where it can be, and whether it is named."""
    if unnamed and _O_TMPFILE:
        with contextlib.suppress(OSError):
            flags = os.O_WRONLY | _O_TMPFILE | os.O_CLOEXEC
            return os.open(".", flags, 0o666, dir_fd=dir_fd), False
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    return os.open(tmp, flags, 0o666, dir_fd=dir_fd), True


def _link_unnamed(fd: int, dir_fd: int, name: str) -> bool:
    """Name ``fd`` via ``/proc``: ``AT_EMPTY_PATH`` needs a capability the helper lacks."""
    try:
        os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=dir_fd)
    except FileExistsError:
        return False
    return True


#: errors that mean "this process may not make the new file like the old one".
_CANNOT_MATCH: Final = frozenset(
    (errno.EPERM, errno.EACCES, errno.EINVAL, errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP)
)


def match_old_file(fd: int, old: os.stat_result, old_path: str) -> bool:
    """Make ``fd`` like ``old``; False where it cannot, so an edit never hands a file to
    another owner or drops an ACL. ``chown`` first: it clears set-ID bits."""
    new = os.fstat(fd)
    try:
        if new.st_gid != old.st_gid or new.st_uid != old.st_uid:
            os.fchown(fd, old.st_uid, old.st_gid)
        if _match_xattrs(fd, old_path):
            new = os.fstat(fd)  # an ACL written or removed changed the group bits
    except OSError as exc:
        if exc.errno not in _CANNOT_MATCH:
            raise
        return False
    mode = stat.S_IMODE(old.st_mode)
    if stat.S_IMODE(new.st_mode) != mode:
        os.fchmod(fd, mode)
    return True


def _match_xattrs(fd: int, old_path: str) -> bool:
    """Copy ``old_path``'s extended attributes onto ``fd``; True if any changed."""
    try:
        want = set(os.listxattr(old_path, follow_symlinks=False))
        have = set(os.listxattr(fd))
    except OSError as exc:
        if exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            return False  # a filesystem without extended attributes
        raise
    changed = False
    for key in have.difference(want):
        os.removexattr(fd, key)  # e.g. an access ACL made from the directory's default ACL
        changed = True
    for key in want:
        value = os.getxattr(old_path, key, follow_symlinks=False)
        if key not in have or os.getxattr(fd, key) != value:
            os.setxattr(fd, key, value)
            changed = True
    return changed


def mkdir_unless_directory(name: str, dir_fd: int) -> None:
    """Anything but a directory (or a link to one) is "File exists", as upstream's."""
    try:
        os.mkdir(name, 0o777, dir_fd=dir_fd)
    except FileExistsError:
        try:
            is_directory = stat.S_ISDIR(os.stat(name, dir_fd=dir_fd).st_mode)
        except OSError:
            is_directory = False
        if not is_directory:
            raise


def make_dirs(
    path: str,
    open_dir: Callable[[str], int],
    *,
    real_of: Callable[[int, str], str] | None = None,
    check: Callable[[str], None] | None = None,
    nofollow: int = 0,
) -> tuple[int, str]:
    """Rust's ``create_dir_all`` by descriptors; ``path``'s ``O_PATH`` fd and real location."""
    missing: list[str] = []
    current = path
    while True:
        try:
            fd = open_dir(current)
            break
        except FileNotFoundError:
            parent, name = os.path.split(current)
            if parent == current:
                raise
            missing.append(name)
            current = parent
        except OSError as exc:
            # A file, or a link looping to itself, where the directory goes: "File exists".
            not_a_dir = exc.errno in (errno.ENOTDIR, errno.ELOOP)
            if not_a_dir and current == path and os.path.lexists(path):
                raise os_error(errno.EEXIST) from None
            raise
    try:
        real = current if real_of is None else real_of(fd, current)
        for name in reversed(missing):
            child_real = real.rstrip("/") + "/" + name
            if check is not None:
                check(child_real)
            mkdir_unless_directory(name, fd)
            child = os.open(name, _O_PATH | os.O_DIRECTORY | os.O_CLOEXEC | nofollow, dir_fd=fd)
            os.close(fd)
            fd, real = child, child_real
    except BaseException:
        os.close(fd)
        raise
    return fd, real


def lossy_name(name: str) -> str:
    """An entry name as upstream renders it: invalid UTF-8 becomes U+FFFD."""
    if name.isascii():
        return name
    return os.fsencode(name).decode("utf-8", "replace")


def list_directory(
    fd: int, hidden: Callable[[str], bool] | None = None
) -> list[tuple[str, bool, bool]]:
    """``(lossy name, is_directory, is_file)`` per entry, links followed, dangling skipped."""
    entries: list[tuple[str, bool, bool]] = []
    with os.scandir(fd) as it:
        for entry in it:
            if hidden is not None and hidden(entry.name):
                continue
            try:
                if entry.is_symlink():
                    mode = entry.stat().st_mode
                    is_dir, is_file = stat.S_ISDIR(mode), stat.S_ISREG(mode)
                else:
                    is_dir = entry.is_dir(follow_symlinks=False)
                    is_file = entry.is_file(follow_symlinks=False)
            except OSError:
                continue
            entries.append((lossy_name(entry.name), is_dir, is_file))
    return entries


def remove_tree_at(dir_fd: int, name: str) -> None:
    """Delete a tree of any depth by descriptors, never following a link."""
    # (descriptor, its name in the level above, its subdirectories still to do)
    levels: list[tuple[int, str, list[str]]] = []
    try:
        _descend(levels, dir_fd, name)
        while levels:
            fd, fd_name, dirs = levels[-1]
            if dirs:
                _descend(levels, fd, dirs.pop())
                continue
            levels.pop()
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.rmdir(fd_name, dir_fd=levels[-1][0] if levels else dir_fd)
    finally:
        for fd, _, _ in levels:
            os.close(fd)


def _descend(levels: list[tuple[int, str, list[str]]], dir_fd: int, name: str) -> None:
    """Push the directory ``name`` with its files unlinked (a non-directory is unlinked)."""
    try:
        fd = os.open(name, _SUBDIR, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    except OSError as exc:
        if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dir_fd)
        return
    try:
        levels.append((fd, name, _unlink_files(fd)))
    except BaseException:
        os.close(fd)
        raise


def _unlink_files(dir_fd: int) -> list[str]:
    """Unlink every non-directory in ``dir_fd``; return the subdirectories' names."""
    dirs: list[str] = []
    for name in os.listdir(dir_fd):
        try:
            os.unlink(name, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        except IsADirectoryError:  # Linux: unlinkat(2) of a directory
            dirs.append(name)
        except PermissionError:  # macOS says EPERM for a directory
            try:
                is_dir = stat.S_ISDIR(os.lstat(name, dir_fd=dir_fd).st_mode)
            except FileNotFoundError:
                continue
            if not is_dir:
                raise
            dirs.append(name)
    return dirs


def copy_file_at(
    src_dir: int,
    name: str,
    dst_dir: int,
    dst_name: str,
    *,
    dst_flags: int = 0,
    wait: Wait = contextlib.nullcontext,
) -> None:
    """Rust's ``std::fs::copy``, but a copy onto the file itself is refused, not truncated."""
    src_fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK,
                     dir_fd=src_dir)
    try:
        src_st = os.fstat(src_fd)
        perm = stat.S_IMODE(src_st.st_mode)
        dst_fd = os.open(
            dst_name,
            os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK | dst_flags,
            perm,
            dir_fd=dst_dir,
        )
        try:
            dst_st = os.fstat(dst_fd)
            if os.path.samestat(src_st, dst_st):
                raise FsRefusedError("fs/copy source and destination are the same file")
            if dst_st.st_size:
                os.ftruncate(dst_fd, 0)
            if stat.S_IMODE(dst_st.st_mode) != perm:
                os.fchmod(dst_fd, perm)
            if stat.S_ISREG(dst_st.st_mode):
                _copy_contents(src_fd, dst_fd)
            else:
                os.set_blocking(dst_fd, True)
                with wait():
                    _copy_contents(src_fd, dst_fd)
        finally:
            os.close(dst_fd)
    finally:
        os.close(src_fd)


def _copy_contents(src_fd: int, dst_fd: int) -> None:
    """Copy from both files' offsets to EOF, in the kernel when it can."""
    try:
        while os.copy_file_range(src_fd, dst_fd, _COPY_MAX):
            pass
        return
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
            raise
    try:
        os.lseek(src_fd, os.lseek(dst_fd, 0, os.SEEK_CUR), os.SEEK_SET)
    except OSError as exc:
        # A FIFO destination: copy_file_range refused it before copying anything.
        if exc.errno != errno.ESPIPE:
            raise
    while chunk := os.read(src_fd, _CHUNK):
        write_all(dst_fd, chunk)


def copy_tree_at(
    src_fd: int,
    dst_fd: int,
    *,
    dst_nofollow: int = 0,
    src_real: str = "",
    dst_real: str = "",
    skip: Callable[[str], bool] | None = None,
    check_write: Callable[[str], None] | None = None,
    wait: Wait = contextlib.nullcontext,
) -> None:
    """Merge ``src_fd`` into ``dst_fd`` as upstream (§9.3); ``skip`` sees real locations."""
    named = skip is not None or check_write is not None
    # (source fd, destination fd, their real locations, names still to copy)
    levels: list[tuple[int, int, str, str, list[str]]] = [
        (src_fd, dst_fd, src_real, dst_real, os.listdir(src_fd)[::-1])
    ]
    try:
        while levels:
            s_fd, d_fd, s_dir, d_dir, names = levels[-1]
            if not names:
                levels.pop()
                if levels:  # the descriptors of a level below the top: ours
                    os.close(s_fd)
                    os.close(d_fd)
                continue
            name = names.pop()
            s_real = d_real = ""
            if named:
                s_real = s_dir.rstrip("/") + "/" + name
                d_real = d_dir.rstrip("/") + "/" + name
                if skip is not None and skip(s_real):
                    continue  # carved-out entries are never read
            try:
                mode = os.stat(name, dir_fd=s_fd, follow_symlinks=False).st_mode
            except FileNotFoundError:
                continue
            if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
                continue
            if check_write is not None:
                check_write(d_real)
            if stat.S_ISREG(mode):
                copy_file_at(s_fd, name, d_fd, name, dst_flags=dst_nofollow, wait=wait)
            elif stat.S_ISLNK(mode):
                os.symlink(os.readlink(name, dir_fd=s_fd), name, dir_fd=d_fd)
            else:
                mkdir_unless_directory(name, d_fd)
                sub_src = os.open(name, _SUBDIR, dir_fd=s_fd)
                sub_dst = -1
                try:
                    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | dst_nofollow
                    sub_dst = os.open(name, flags, dir_fd=d_fd)
                    listed = os.listdir(sub_src)[::-1]
                except BaseException:
                    os.close(sub_src)
                    if sub_dst != -1:
                        os.close(sub_dst)
                    raise
                levels.append((sub_src, sub_dst, s_real, d_real, listed))
    finally:
        for s_fd, d_fd, *_ in levels[1:]:
            os.close(s_fd)
            os.close(d_fd)
