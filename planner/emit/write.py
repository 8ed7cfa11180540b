"""Atomic writes of a plan's files into a directory.

Every file is written to a temporary file in the target directory and moved into place
with os.replace, which is atomic on POSIX and Windows: a reader sees the old file or the
new one, never half of one. All targets are checked before anything is written, so a
refused overwrite leaves the directory untouched; all temporary files are complete
before the first one is moved, so a failed write leaves no target changed.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from planner.errors import UserError

EXECUTABLE = ("launch.sh",)


def _check_names(files: Mapping[str, str]) -> None:
    for name in files:
        if not name or name in (".", "..") or "/" in name or "\\" in name or name.startswith("."):
            raise ValueError(f"not a plain file name: {name!r}")


def write_files(directory: Path, files: Mapping[str, str], force: bool = False) -> list[Path]:
    """Write ``files`` (name -> text) into ``directory``, creating it if needed.

    Refuses (UserError) when any target exists and ``force`` is False, before writing
    any. Returns the paths written, in the order given.
    """
    _check_names(files)
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise UserError(f"--out {directory} is a file, not a directory")
    targets = [directory / name for name in files]
    existing = [p for p in targets if p.exists() or p.is_symlink()]
    if existing and not force:
        more = f" (and {len(existing) - 1} more)" if len(existing) > 1 else ""
        raise UserError(f"{existing[0]} already exists{more}; nothing written (pass --force to overwrite)")
    dirs = [p for p in existing if p.is_dir() and not p.is_symlink()]
    if dirs:
        raise UserError(f"{dirs[0]} is a directory; nothing written")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create --out {directory}: {e.strerror or e}") from e

    staged: list[tuple[str, Path]] = []
    try:
        for name, text in files.items():
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
            staged.append((tmp, directory / name))
            with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o755 if name in EXECUTABLE else 0o644)
        for tmp, target in staged:
            os.replace(tmp, target)
    except OSError as e:
        for tmp, _ in staged:
            if os.path.exists(tmp):
                os.unlink(tmp)
        raise UserError(f"cannot write to --out {directory}: {e.strerror or e}") from e
    _fsync_dir(directory)
    return targets


def _fsync_dir(directory: Path) -> None:
    """Make the renames durable where the platform allows it (POSIX)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
