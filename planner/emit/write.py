"""Writing a plan's set of files into a directory (--out DIR): all of them or none.

The set is written, flushed and fsynced into a staging directory beside DIR (same parent,
so the same file system), then moved into place by rename(2), which POSIX makes atomic:

- DIR absent: the staging directory is renamed to DIR, so a reader sees no DIR or the
  whole new set.
- DIR an existing directory (empty, a previous --out overwritten with --force, or holding
  other files too): the set goes into it and DIR itself is kept (its mode, owner and inode:
  a private directory stays private, a shell inside it stays in it). The targets are
  replaced one by one by rename(2), each old file kept as a hard link in the staging
  directory until all are in place, and put back if one fails. When DIR holds a plan
  (plan.json), the files the planner writes for other plans (``owned``: another stack's
  ds_config.json, hostfile, ...) are removed with the same backup, so the directory never
  holds a mix of two plans.

Writers are serialised by an flock(2) on DIR's parent directory, held from the check for
existing files to the last rename: of two concurrent `plan --out DIR` without --force, the
second finds the first one's files and is refused. SIGINT, SIGTERM and SIGHUP are held
back (pthread_sigmask) while the set is staged, moved and cleaned up (milliseconds for a
plan's few KiB), so a signal lands before or after, and its default action (SIGTERM ends
the process) finds nothing half done; on any failure the staging directory and any directory this call created are
removed, so no .tmp file, no mixed set and no empty directory are left.

write_file writes one file (--plot, a calibration file) by the same rules: staged beside
the target, published by link(2), which refuses an existing file atomically, or with
--force by rename(2).
"""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path

from planner.errors import UserError

EXECUTABLE = ("launch.sh",)
_HELD_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


def _check_names(files: Mapping[str, str]) -> None:
    for name in files:
        if not name or name in (".", "..") or "/" in name or "\\" in name or name.startswith("."):
            raise ValueError(f"not a plain file name: {name!r}")


def _check_directory_name(directory: Path) -> None:
    """A name the plan's files can refer to: UTF-8 (launch.sh and plan.json name DIR)."""
    try:
        os.fsencode(directory).decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"--out {str(directory)!r} is not a UTF-8 name; give a directory name in UTF-8") from None


def write_files(directory: Path, files: Mapping[str, str], force: bool = False,
                owned: Collection[str] = ()) -> list[Path]:
    """Write ``files`` (name -> text) into ``directory``, all or none (module docstring).

    Refuses (UserError) when any target exists and ``force`` is False, before writing
    any. ``owned``: every name the caller writes for any plan; those not in ``files`` are
    removed from a directory that holds a plan. Returns the paths written, in the order given.
    """
    _check_names(files)
    directory = Path(directory)
    _check_directory_name(directory)
    if directory.exists() and not directory.is_dir():
        raise UserError(f"--out {directory} is a file, not a directory")
    with _signals_held(), _parents_made(directory.parent, "--out"):   # module docstring
        try:
            with _locked(directory.parent):
                stale = _stale_names(directory, files, owned)
                targets = _check_targets(directory, files, stale, force)
                staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", suffix=".tmp", dir=directory.parent))
                try:
                    _stage(staging, files)
                    _move_into_place(staging, directory, list(files), stale)
                finally:
                    shutil.rmtree(staging, ignore_errors=True)
                _fsync_dir(directory.parent)
        except OSError as e:
            raise UserError(f"cannot write to --out {directory}: {e.strerror or e}") from e
    return targets


PLAN_MARK = "plan.json"     # a directory holding it holds a plan's set (planner.emit.plan_files)


def _stale_names(directory: Path, files: Mapping[str, str], owned: Collection[str]) -> list[str]:
    """The files of another plan in ``directory`` that this set does not replace: names the
    planner writes (``owned``) beside a plan.json, not among ``files``."""
    if not directory.is_dir() or not (directory / PLAN_MARK).is_file():
        return []
    return [n for n in owned if n not in files and ((directory / n).is_file() or (directory / n).is_symlink())]


def write_file(path: Path, data: bytes, force: bool = False, what: str = "--out") -> Path:
    """Write one file (``--plot FILE``, ``plan calibrate --out FILE``, ``--calibration-out``)
    all or nothing; ``what`` names the option in messages.

    The bytes are written and fsynced into a temporary file beside the target, then
    published by link(2), which fails when the target exists (POSIX: EEXIST), so of two
    concurrent writers without ``force`` the second is refused, however close they run;
    with ``force`` by rename(2), which replaces the target atomically. A file system
    without hard links gets the target created with O_CREAT | O_EXCL, which refuses an
    existing file as atomically. SIGINT, SIGTERM and SIGHUP are held meanwhile (as for
    write_files), and the temporary file and any directory this call created are removed
    on every failure, so nothing half written and no .tmp file is left."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{what} {path} is a directory; name a file")
    with _signals_held(), _parents_made(path.parent, what):
        tmp: str | None = None
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            _write_synced(fd, data)
            os.chmod(tmp, 0o666 & ~_umask())
            if force:
                os.replace(tmp, path)
                tmp = None
            else:
                _publish_new(tmp, path, data)
            _fsync_dir(path.parent)
        except FileExistsError:
            raise UserError(f"{path} already exists; nothing written (pass --force to overwrite)") from None
        except OSError as e:
            raise UserError(f"cannot write {what} {path}: {e.strerror or e}") from e
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
    return path


def _write_synced(fd: int, data: bytes) -> None:
    """Write ``data`` to the open descriptor ``fd``, flush it to disk, and close it."""
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _publish_new(tmp: str, path: Path, data: bytes) -> None:
    """Give the staged file ``tmp`` the name ``path`` unless ``path`` exists (FileExistsError)."""
    try:
        os.link(tmp, path, follow_symlinks=False)
        return
    except FileExistsError:
        raise
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.EMLINK, errno.ENOSYS):
            raise
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)      # no hard links here
    try:
        _write_synced(fd, data)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise


def writable_target(path: Path, what: str) -> None:
    """Refuse (UserError) a file that cannot be created: its nearest existing directory is
    not writable (permissions, a read-only or immutable directory). Called before another
    output is written, so that a run does not write one output and fail on the next."""
    p = Path(path).parent
    while not p.exists() and p.parent != p:
        p = p.parent
    if not p.is_dir():
        raise UserError(f"cannot write {what} {path}: {p} is not a directory")
    if not os.access(p, os.W_OK | os.X_OK):
        raise UserError(f"cannot write {what} {path}: directory {p} is not writable; nothing written")


def _make_parents(parent: Path, what: str = "--out") -> list[Path]:
    """Create the missing parents of DIR; return those created (deepest last) for cleanup."""
    missing: list[Path] = []
    p = parent
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create {what} {parent}: {e.strerror or e}") from e
    return list(reversed(missing))


@contextlib.contextmanager
def _parents_made(parent: Path, what: str) -> Iterator[None]:
    """Create the missing parents of a target; remove those created (if still empty) when
    the block fails, so a failed write leaves no empty directory."""
    created = _make_parents(parent, what)
    try:
        yield
    except BaseException:
        for p in reversed(created):          # deepest first; only if still empty
            with contextlib.suppress(OSError):
                p.rmdir()
        raise


@contextlib.contextmanager
def _locked(parent: Path) -> Iterator[None]:
    """An exclusive flock on the parent directory (POSIX); a no-op where flock is missing."""
    try:
        import fcntl
    except ImportError:                  # Windows: no flock; renames are still atomic
        yield
        return
    fd = os.open(parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)                     # closing releases the lock


def _check_targets(directory: Path, files: Mapping[str, str], stale: list[str], force: bool) -> list[Path]:
    targets = [directory / name for name in files]
    existing = [p for p in targets if p.exists() or p.is_symlink()] + [directory / n for n in stale]
    if existing and not force:
        more = f" (and {len(existing) - 1} more)" if len(existing) > 1 else ""
        raise UserError(f"{existing[0]} already exists{more}; nothing written (pass --force to overwrite)")
    dirs = [p for p in existing if p.is_dir() and not p.is_symlink()]
    if dirs:
        raise UserError(f"{dirs[0]} is a directory; nothing written")
    return targets


def _stage(staging: Path, files: Mapping[str, str]) -> None:
    """Every file complete and on disk in the staging directory before any is moved."""
    for name, text in files.items():
        path = staging / name
        _write_synced(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), text.encode("utf-8"))
        os.chmod(path, 0o755 if name in EXECUTABLE else 0o644)
    os.chmod(staging, 0o777 & ~_umask())
    _fsync_dir(staging)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGINT/SIGTERM/SIGHUP back; they are delivered on exit.

    Blocking them with pthread_sigmask covers this thread only, and another thread (rich's
    progress bar refreshes in one) would still take the signal's default action mid-write.
    So, in the main thread, a handler that only records the signal is installed as well
    (CPython runs Python handlers in the main thread, whichever thread the signal hit), and
    the recorded signal is raised again once the old handlers are back."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    old_handlers = {sig: signal.signal(sig, lambda n, _f: caught.append(n)) for sig in _HELD_SIGNALS}
    old_mask = (signal.pthread_sigmask(signal.SIG_BLOCK, _HELD_SIGNALS)
                if hasattr(signal, "pthread_sigmask") else None)
    try:
        yield
    finally:
        if old_mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)   # a pending signal is recorded now
        for sig, handler in old_handlers.items():
            signal.signal(sig, handler)
        for signum in dict.fromkeys(caught):
            signal.raise_signal(signum)


def _move_into_place(staging: Path, directory: Path, names: list[str], stale: list[str]) -> None:
    if not (directory.exists() or directory.is_symlink()):
        os.rename(staging, directory)            # onto nothing: the whole set appears at once
    else:
        _replace_each(staging, directory, names, stale)     # into the directory, which is kept


def _replace_each(staging: Path, directory: Path, names: list[str], stale: list[str]) -> None:
    """Replace the targets one by one and remove the ``stale`` files, keeping each old file
    as a link in the staging directory (.old/NAME) until all are done; on a failure put
    every old one back."""
    backup = staging / ".old"
    backup.mkdir()
    done: list[tuple[str, bool]] = []        # (name, had an old file)
    try:
        for name in [*names, *stale]:
            target = directory / name
            had_old = target.exists() or target.is_symlink()
            if had_old:
                try:
                    os.link(target, backup / name, follow_symlinks=False)
                except OSError:                      # no hard links here: a copy will do
                    shutil.copy2(target, backup / name, follow_symlinks=False)
            if name in stale:
                os.unlink(target)
            else:
                os.replace(staging / name, target)
            done.append((name, had_old))
    except BaseException:
        for name, had_old in reversed(done):
            if had_old:
                os.replace(backup / name, directory / name)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(directory / name)
        raise
    _fsync_dir(directory)


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
