"""OS error texts in upstream's wording (its static musl build), not glibc's."""

from __future__ import annotations

import errno
import os

import pytest

from exec_server.errno_text import os_error_text
from exec_server.exceptions import os_error_message


@pytest.mark.parametrize(
    ("number", "text"),
    [
        # The same in both C libraries.
        (errno.ENOENT, "No such file or directory"),
        (errno.EACCES, "Permission denied"),
        (errno.EEXIST, "File exists"),
        (errno.ENOTEMPTY, "Directory not empty"),
        (errno.EROFS, "Read-only file system"),
        # musl's own wording (seen in codex 0.163.0's replies and binary).
        (errno.EIO, "I/O error"),
        (errno.ELOOP, "Symbolic link loop"),
        (errno.EMFILE, "No file descriptors available"),
        (errno.ENAMETOOLONG, "Filename too long"),
        (errno.EBUSY, "Resource busy"),
        (errno.ENOMEM, "Out of memory"),
        (errno.EOPNOTSUPP, "Not supported"),
        (errno.EXDEV, "Cross-device link"),
        (errno.EDQUOT, "Quota exceeded"),
        (errno.EAGAIN, "Resource temporarily unavailable"),
    ],
)
def test_musl_wording(number: int, text: str) -> None:
    assert os_error_text(number) == f"{text} (os error {number})"
    assert os_error_message(OSError(number, os.strerror(number))) == f"{text} (os error {number})"


def test_errors_musl_does_not_know_read_as_there() -> None:
    assert os_error_text(0) == "No error information (os error 0)"
    assert os_error_text(4095) == "No error information (os error 4095)"
