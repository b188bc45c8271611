"""Files qkernels writes appear whole or not at all: each is written under a temporary name in the target's
directory, flushed to disk, then renamed over the target (os.replace: atomic on POSIX and Windows), and the
directory entry is flushed too. A crash at any point leaves the old file or the new one, plus at most a
`*.partial` leftover that the next write of that file removes."""
from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import Callable


def _fsync(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:          # platforms without directory handles (Windows): the rename is what there is
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def partial_name(path: Path) -> Path:
    return path.with_name(f"{path.name}.{os.getpid()}.partial")


def replace_atomically(path: Path, write: Callable[[Path], None]) -> Path:
    """write(tmp) writes the whole file at tmp; it then replaces `path` in one step. Returns path."""
    path = Path(path)
    for stale in path.parent.glob(f"{path.name}.*.partial"):
        stale.unlink(missing_ok=True)
    tmp = partial_name(path)
    try:
        write(tmp)
        _fsync(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    return path


def write_text_atomically(path: Path, text: str) -> Path:
    return replace_atomically(path, lambda tmp: tmp.write_text(text))


def file_digest(path: Path) -> str:
    """BLAKE2b (128-bit) of a file's bytes, hex: recorded beside a checkpoint's weights, checked on load."""
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


@contextlib.contextmanager
def locked(path: Path):
    """Exclusive between processes for the block (an advisory lock on `<path>.lock`; POSIX): a read-merge-write
    of a shared file (the autotune cache) loses nothing to a concurrent writer. Where there is no fcntl, no lock."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    path = Path(path)
    with open(path.with_name(path.name + ".lock"), "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
