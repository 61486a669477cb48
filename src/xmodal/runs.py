"""Run directories: safe checkpoint reads, atomic writes, a writer lock, stale-file cleanup.

Everything the trainer writes into a run directory goes through this module, so the
failure modes of a run directory have one home:

- :func:`load_checkpoint` reads with ``torch.load(..., weights_only=True)``: a file
  whose pickle names any Python callable (a code-execution payload) is refused, never
  run; corrupt, truncated and foreign files give one ``ValueError`` naming the file.
- :func:`atomic_save` / :func:`atomic_write_text` write a temporary file and
  ``os.replace`` it; a full disk raises ``OSError(ENOSPC, "no space left on device
  ...")`` naming the file, and the temporary file is removed.
- :class:`RunLock` (``DIR/.lock``): one writer per run directory. A second writer
  fails at once naming the run and the holder's pid. The lock is an ``flock`` on the
  file, released by the kernel when its process dies, so the lock of a dead process
  is simply taken over.
- :func:`remove_stale_temporaries`: ``.NAME.tmpPID`` files left by killed saves.
- :func:`check_run_dir` refuses an ``--out`` holding files that are not a run's own;
  :func:`clear_run_outputs` removes a previous run's files before a fresh run trains.
"""

from __future__ import annotations

import errno
import glob
import os
import pickle
import re
import shutil
import stat
import zipfile
from pathlib import Path
from typing import Any

import torch

LOCK_NAME = ".lock"
_TMP_PATTERNS = (".checkpoint.pt.tmp*", ".model.pt.tmp*", ".log.jsonl.tmp*", ".metrics.json.tmp*",
                 ".config.yaml.tmp*", ".*.png.tmp*", ".log.csv.tmp*", ".provenance.json.tmp*",
                 ".trackers.json.tmp*", ".per_query.npz.tmp*", ".encoders.json.tmp*")
#: Files of a run directory's own kind: what ``xmodal train`` (and ``xmodal report``, the
#: page of the run) write there. A fresh run removes them all before it trains.
RUN_FILES = ("config.yaml", "log.jsonl", "log.csv", "checkpoint.pt", "model.pt", "metrics.json",
             "per_query.npz", "provenance.json", "curves.png", "schedule.png", "retrieval_mass.png", "fn_fp.png",
             "report.html", "mlflow.db", "mlflow.db-journal", "mlflow.db-wal", "mlflow.db-shm",  # log_to: [mlflow]
             "trackers.json", "encoders.json")
#: Folders of a run directory's own kind (``train.log_to: [tensorboard, mlflow, wandb]``).
RUN_DIRS = ("tensorboard", "mlartifacts", "wandb")


class RunDirError(ValueError):
    """A run directory cannot be used (locked, not a directory, unreadable checkpoint)."""


class DivergedError(ValueError):
    """The training loss became NaN/inf."""


def load_checkpoint(path: str | os.PathLike, *, map_location: Any = "cpu") -> dict:
    """Read a checkpoint written by ``xmodal train`` without executing code from it.

    Args:
        path: the ``.pt`` file.
        map_location: as ``torch.load``.

    Returns:
        The checkpoint dict (tensors, numbers, strings, lists and dicts only).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: the file names a Python object other than tensors and plain
            containers (refused: unpickling it could run code), is corrupt or truncated,
            or is not an xmodal checkpoint. The message names the file.

    >>> import tempfile, torch
    >>> d = tempfile.mkdtemp()
    >>> atomic_save({"model": {"w": torch.ones(2)}}, f"{d}/model.pt")
    >>> load_checkpoint(f"{d}/model.pt")["model"]["w"]
    tensor([1., 1.])
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"path: {p} does not exist")
    _check_zip_entries(p)
    try:
        obj = torch.load(p, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        msg = str(exc)
        found = re.search(r"Unsupported global: (?:GLOBAL )?([\w.]+)|unsupported GLOBAL ([\w.]+)", msg)
        if found:
            what = found.group(1) or found.group(2)
            raise RunDirError(f"{p}: refused to load: it contains a Python object ({what}) that could run "
                              f"code when unpickled; xmodal only reads weights-only checkpoints") from None
        if "Weights only load failed" in msg and not _looks_pickled(p):
            raise RunDirError(f"{p}: not a readable checkpoint (not a torch file)") from None
        if "Weights only load failed" in msg:  # a pickle instruction the weights-only reader refuses
            raise RunDirError(f"{p}: refused to load: it is a pickle that a weights-only read refuses "
                              f"because loading it could run code; xmodal only reads weights-only "
                              f"checkpoints") from None
        raise RunDirError(f"{p}: not a readable checkpoint (corrupt or not a torch file)") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError, KeyError, IndexError,
            AttributeError, TypeError) as exc:
        why = "empty or truncated" if isinstance(exc, EOFError) else "corrupt or truncated"
        raise RunDirError(f"{p}: not a readable checkpoint ({why})") from None
    if not isinstance(obj, dict) or "model" not in obj:
        raise RunDirError(f"{p}: not an xmodal checkpoint (no 'model' entry)")
    return obj


def _looks_pickled(p: Path) -> bool:
    """A torch zip archive or a raw pickle (protocol 2+ opcode ``PROTO``): only then can a
    weights-only refusal mean "this could run code"; random bytes or a ``.npy`` are simply
    not torch files."""
    with open(p, "rb") as f:
        head = f.read(2)
    return zipfile.is_zipfile(p) or (len(head) == 2 and head[0] == 0x80 and 2 <= head[1] <= 5)


def _check_zip_entries(p: Path) -> None:
    """Refuse a zip checkpoint with compressed entries or entries larger than the file
    (torch writes every entry stored, uncompressed): nothing is inflated into memory."""
    if not zipfile.is_zipfile(p):
        return
    try:
        with zipfile.ZipFile(p) as z:
            infos = z.infolist()
    except (zipfile.BadZipFile, OSError, ValueError):
        raise RunDirError(f"{p}: not a readable checkpoint (corrupt or truncated)") from None
    size = p.stat().st_size
    for info in infos:
        if info.compress_type != zipfile.ZIP_STORED or info.file_size > size:
            raise RunDirError(f"{p}: not a checkpoint written by torch (entry {info.filename} is "
                              f"compressed or larger than the file); refused")


def _no_space(path: Path) -> OSError:
    return OSError(errno.ENOSPC, f"no space left on device while writing {path}")


def _write_failed(exc: BaseException, path: Path) -> OSError | None:
    """The ``OSError`` to raise for a failed write, or None to re-raise ``exc``."""
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return _no_space(path)
    if isinstance(exc, OSError) and exc.errno is None and "requested and" in str(exc):
        # numpy's tofile (np.save of a large array) reports a short write as
        # OSError("N requested and M written"), without an errno.
        try:
            full = shutil.disk_usage(path.parent).free < (1 << 20)
        except OSError:
            full = False
        return _no_space(path) if full else OSError(errno.EIO, f"failed writing {path}: {exc}")
    if isinstance(exc, RuntimeError):
        # torch's zip writer reports ENOSPC as "[enforce fail at inline_container.cc] unexpected
        # pos N vs M" (or "file write failed"), FAISS as "write error ... (No space left on device)".
        # Called before the temporary file is removed, so a full disk still shows as full.
        text = str(exc)
        try:
            full = shutil.disk_usage(path.parent).free < (1 << 20)
        except OSError:
            full = False
        if full or "No space left" in text:
            return _no_space(path)
        if "write" in text.lower() or "unexpected pos" in text:
            return OSError(errno.EIO, f"failed writing {path}: {text.splitlines()[0]}")
    return None


def _tmp(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


def atomic_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` to a temporary file in the same directory, then ``os.replace``:
    a kill mid-write never leaves a truncated checkpoint behind.

    Raises:
        OSError: ``ENOSPC`` "no space left on device while writing PATH" on a full disk.
    """
    path = Path(path)
    tmp = _tmp(path)
    try:
        tmp.unlink(missing_ok=True)  # never write through a link planted under this name
        torch.save(obj, tmp)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as exc:
        err = _write_failed(exc, path)  # before the unlink frees the partial file's space
        tmp.unlink(missing_ok=True)
        if err is None:
            raise
        raise err from None


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and ``os.replace``."""
    path = Path(path)
    tmp = _tmp(path)
    try:
        tmp.unlink(missing_ok=True)
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as exc:
        err = _write_failed(exc, path)
        tmp.unlink(missing_ok=True)
        if err is None:
            raise
        raise err from None


def atomic_write(path: str | os.PathLike, write: Any) -> None:
    """``write(tmp)`` to a temporary file beside ``path``, then ``os.replace`` it over ``path``.

    The temporary name is removed first (a link planted there is never written through)
    and on any failure; a full disk raises ``OSError(ENOSPC, "no space left on device
    while writing PATH")`` whether ``write`` reported it as ``OSError`` or ``RuntimeError``.
    """
    path = Path(path)
    tmp = _tmp(path)
    try:
        tmp.unlink(missing_ok=True)
        write(tmp)
        os.replace(tmp, path)
    except BaseException as exc:
        err = _write_failed(exc, path) if isinstance(exc, (OSError, RuntimeError)) else None
        tmp.unlink(missing_ok=True)
        if err is None:
            raise
        raise err from None


def atomic_save_npy(path: str | os.PathLike, array: Any) -> None:
    """``np.save`` of ``array`` (no pickle) through :func:`atomic_write`; the name is kept as given
    (a file object is written, so numpy appends no second ``.npy`` to the temporary name)."""
    import numpy as np

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            np.save(f, np.asarray(array), allow_pickle=False)

    atomic_write(path, write)


def remove_stale_temporaries(out: str | os.PathLike, names: tuple[str, ...] | None = None) -> list[Path]:
    """Delete ``.checkpoint.pt.tmp*`` (and log/model/metrics) temporaries of killed saves; with
    ``names``, the ``.NAME.tmp*`` temporaries of those file names instead (an index folder's).

    Call with the run's :class:`RunLock` held: no other writer can own them then.
    """
    removed = []
    for pattern in _TMP_PATTERNS if names is None else tuple(f".{glob.escape(n)}.tmp*" for n in names):
        for p in Path(out).glob(pattern):
            p.unlink(missing_ok=True)
            removed.append(p)
    return removed


def prepare_run_dir(out: str | os.PathLike) -> Path:
    """Create ``out`` (a directory); a path that is a file raises ``RunDirError``."""
    p = Path(out)
    if p.exists() and not p.is_dir():
        raise RunDirError(f"out: {p} exists and is not a directory")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise RunDirError(f"out: a parent of {p} is a file, not a directory") from None
    except NotADirectoryError:
        raise RunDirError(f"out: a parent of {p} is a file, not a directory") from None
    return p


def _is_run_entry(p: Path) -> bool:
    if p.name == LOCK_NAME or any(p.match(pat) for pat in _TMP_PATTERNS):
        return not p.is_symlink()
    if p.is_symlink():
        return False
    if p.name in RUN_DIRS:
        return p.is_dir()
    return p.name in RUN_FILES and p.is_file()


def check_run_dir(out: str | os.PathLike) -> Path:
    """Refuse an ``out`` holding anything but a run's own files (``RUN_FILES``), or links.

    ``xmodal train`` rewrites and removes the files of its kind in ``out``; a folder holding
    the user's other files (data, a config, notes) is refused, never written into.

    Raises:
        RunDirError: naming ``out`` and up to three of the foreign entries.
    """
    p = Path(out)
    if not p.is_dir():
        return p
    if (p / LOCK_NAME).is_symlink():
        raise RunDirError(f"out: {p / LOCK_NAME} is a symbolic link; refused (xmodal never writes "
                          f"through a link it did not create): remove it")
    foreign = sorted(e.name for e in p.iterdir() if not _is_run_entry(e))
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise RunDirError(f"out: {p} holds files that are not an xmodal run's ({shown}); xmodal train "
                          f"only writes into a new, empty or run directory")
    return p


def clear_run_outputs(out: str | os.PathLike) -> list[Path]:
    """Remove every file of a run's kind (``RUN_FILES``, ``RUN_DIRS``) from ``out``: a fresh
    run starts from nothing, so a run that dies early never leaves the previous run's
    ``model.pt`` / ``metrics.json`` to be served under its new config. Call with the lock held."""
    removed = []
    for name in RUN_FILES:
        f = Path(out) / name
        if f.is_file() or f.is_symlink():
            f.unlink()
            removed.append(f)
    for name in RUN_DIRS:
        d = Path(out) / name
        if d.is_dir() and not d.is_symlink():
            shutil.rmtree(d)
            removed.append(d)
    return removed


def _pid_of(path: Path) -> str:
    try:
        return path.read_text().strip() or "unknown"
    except OSError:
        return "unknown"


class RunLock:
    """Exclusive writer lock of a run directory (``DIR/.lock`` holding the writer's pid).

    Usable as a context manager. A second :meth:`acquire` (another process, or another
    open in this one) raises :class:`RunDirError` at once, naming the run and the pid.

    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> with RunLock(d):
    ...     RunLock(d).acquire()
    Traceback (most recent call last):
    ...
    xmodal.runs.RunDirError: out: run directory ... is in use by process ... (lock file .../.lock)
    """

    def __init__(self, out: str | os.PathLike) -> None:
        self.out = Path(out)
        self.path = self.out / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> "RunLock":
        import fcntl

        try:  # O_NOFOLLOW: a .lock that is a link is refused, never written through
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP or self.path.is_symlink():
                raise RunDirError(f"out: {self.path} is a symbolic link; refused (xmodal never writes "
                                  f"through a link it did not create): remove it") from None
            raise RunDirError(f"out: cannot open the lock file {self.path} ({exc.strerror or exc})") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise RunDirError(f"out: {self.path} is not a regular file; refused")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise
            raise RunDirError(f"out: run directory {self.out} is in use by process {_pid_of(self.path)} "
                              f"(lock file {self.path})") from None
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        except OSError as exc:
            os.close(fd)
            if exc.errno == errno.ENOSPC:
                raise _no_space(self.path) from None
            raise
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock; the file stays (unlinking would race)
            self._fd = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()
