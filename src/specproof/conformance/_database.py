"""The example database: what a run found, kept for every later run that shares it.

``certify`` and ``specproof fuzz`` hand Hypothesis an example database (docs/contract.md,
"the example database"): failing examples are saved there and replayed first
(``Phase.reuse``) by every later run, derandomized or not. ``open_database`` turns a
``--db`` value into an ``ExampleStore``:

- a directory (the default is ``examples/`` beside Hypothesis' own files) —
  ``DirectoryBasedExampleDatabase``;
- a Redis URL as redis-py reads it (``redis://HOST:PORT/N``, ``redis://:PASSWORD@HOST/N``,
  ``redis://[::1]:6379/0``, ``rediss://`` for TLS, ``unix://PATH``; a password is shown as ``***``)
  — the local default directory *and* a ``RedisExampleDatabase``
  (``MultiplexedDatabase``): what a run finds is saved locally first, so a Redis server that
  goes away loses nothing found so far;
- ``none`` — no database (the run remembers nothing; the reproduce line still works).

Each check reads and writes its own namespace (``ExampleStore.view``): the key names the
subjects (their specs and the engine case), the invariant, the tolerances and the profile,
so a failure is replayed only where it means the same thing. An entry that cannot be
decoded, or that is not a regular file (a FIFO, a symlink to ``/dev/zero``: never opened), is
skipped with a warning, never a crash or a hang; a shared server that fails marks the
store ``lost`` (a campaign stops on it) and the run goes on with the local directory.

A find is never lost in silence: Hypothesis' ``DirectoryBasedExampleDatabase.save`` swallows
``OSError`` (a read-only directory, a full disk, a file where a key directory should be), so
every save to the local directory is read back (``_Directory``); one that did not keep its
example is recorded in ``ExampleStore.unsaved`` naming the path, and the run's verdict says the
find was not kept (FAIL, reports.py). ``--db ''`` and a directory that cannot be written
(``/proc/...``) are usage errors before any work.

Covering examples (docs/contract.md, "covering examples"): a seeded run (a campaign round,
``--seed``) keeps, per engine case and rollback path, the smallest example that reached the
path (``_View.keep_covering``); a derandomized run replays those of the paths its own search
did not reach (``replay_only``), so a rare path any campaign found is checked by every gate.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import attrs
from hypothesis.database import (
    DirectoryBasedExampleDatabase,
    ExampleDatabase,
    InMemoryExampleDatabase,
    MultiplexedDatabase,
    ReadOnlyDatabase,
    choices_from_bytes,
)

from specproof.contract import UsageError

__all__ = [
    "ExampleStore",
    "check_key",
    "check_storage",
    "default_examples_dir",
    "derandomized_seed",
    "hypothesis_home",
    "open_database",
    "storage_dir",
    "replay_only",
]


@attrs.define(eq=False)
class ExampleStore:
    """An opened example database, the warnings it raised, and what was replayed from it."""

    spec: str  # what the user gave (a directory, or a redis:// URL), for reports and reproduce lines
    database: ExampleDatabase
    local: Path | None  # the directory every find is saved in first
    shared: str | None = None  # the redis:// URL, when there is one
    warnings: list[str] = attrs.Factory(list)
    unsaved: list[str] = attrs.Factory(list)  # saves the local directory did not keep: the path, and why
    failed_saves: int = 0  # saves the local directory did not keep (each one; ``unsaved`` holds each path once)
    lost: str | None = None  # the shared database stopped answering: why
    replay_covering: bool = True  # --db-replay all (False: failures only)
    replayed: Counter[str] = attrs.Factory(Counter)  # check id -> saved examples that failed again
    covering: Counter[str] = attrs.Factory(Counter)  # engine case -> covering examples replayed
    covering_saved: Counter[str] = attrs.Factory(Counter)  # engine case -> covering examples saved
    covered: dict[str, list[str]] = attrs.Factory(dict)  # engine case -> paths only the replayed ones reached
    republished: Counter[str] = attrs.Factory(Counter)  # check id -> records found only locally, saved to shared
    # check id -> saved examples handed to its searches before they found anything (its own, another
    # check's, covering ones): a failure of that check may need them, so its reproduce line names --db
    given_back: Counter[str] = attrs.Factory(Counter)
    local_database: Any = attrs.field(default=None, repr=False)  # the local directory's database
    shared_database: Any = attrs.field(default=None, repr=False)  # the shared (Redis) one, guarded; None without

    def view(self, key: str, *, check: str) -> ExampleDatabase:
        """The namespace of one check (``key`` from ``check_key``); undecodable entries are skipped."""
        return _View(self, key.encode(), check)

    def warn(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)

    def not_kept(self, message: str) -> None:
        if message not in self.unsaved:
            self.unsaved.append(message)

    def describe(self) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "local": str(self.local) if self.local else None,
            "shared": self.shared,
            "replay": "all" if self.replay_covering else "failures",
            "replayed": dict(self.replayed),
            "covering_replayed": dict(self.covering),
            "covering_saved": dict(self.covering_saved),
            "covering_paths": {case: list(paths) for case, paths in self.covered.items()},
            "republished": dict(self.republished),
            "warnings": list(self.warnings),
            "unsaved": list(self.unsaved),
            "lost": self.lost,
        }


def hypothesis_home() -> Path:
    """Where Hypothesis' files go by default: $SPECPROOF_HYPOTHESIS_DIR, else the user cache."""
    chosen = os.environ.get("SPECPROOF_HYPOTHESIS_DIR")
    if chosen:
        return Path(chosen)
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "specproof" / "hypothesis"


def storage_dir(arg: str | None, *, option: str = "--hypothesis-dir") -> Path:
    """``--hypothesis-dir`` (else $SPECPROOF_HYPOTHESIS_DIR, else the user cache), checked before any work."""
    chosen = arg or os.environ.get("SPECPROOF_HYPOTHESIS_DIR")
    if chosen:
        path = Path(chosen)
        if not path.parent.is_dir():
            raise UsageError(f"{option} {chosen!r}: the directory {str(path.parent)!r} does not exist")
        return path
    return hypothesis_home()


def default_examples_dir(home: Path | None = None) -> Path:
    """The default example database: ``examples/`` in Hypothesis' directory (as ``.hypothesis/examples``)."""
    return (home if home is not None else hypothesis_home()) / "examples"


def check_key(**parts: object) -> str:
    """A stable key for one check's namespace: every part that changes what a failure means."""
    text = json.dumps({"format": "specproof-db/1", **parts}, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def open_database(
    spec: str | None, *, default_dir: Path, option: str = "--db", replay: str = "all"
) -> ExampleStore | None:
    """Open ``--db`` (None: the default directory); a bad value is a ``UsageError`` before any work.

    ``option``: the flag the messages name (``--specproof-db`` in the pytest plugin);
    ``replay``: ``--db-replay`` (``all``, or ``failures``: no covering examples replayed)."""
    if replay not in ("all", "failures"):
        raise UsageError(f"{option}-replay {replay!r}: one of 'all', 'failures'")
    if spec is not None and not spec.strip():
        raise UsageError(f"{option} {spec!r}: empty; give a directory, a Redis URL (redis://HOST:PORT/N), or 'none'")
    if spec is not None and spec.strip().lower() == "none":
        return None
    store = _open(spec, default_dir=default_dir, option=option)
    store.replay_covering = replay == "all"
    return store


def _open(spec: str | None, *, default_dir: Path, option: str) -> ExampleStore:
    if spec is None or not is_shared(spec):
        path = Path(spec) if spec is not None else default_dir
        if path.exists() and not path.is_dir():
            raise UsageError(f"{option} {str(path)!r}: exists and is not a directory")
        if spec is not None and not path.parent.is_dir():
            raise UsageError(f"{option} {spec!r}: the directory {str(path.parent)!r} does not exist")
        _check_writable(path, option=option, default=spec is None)
        return _directory_store(str(path), path)
    shown = redacted(spec)
    try:
        from hypothesis.extra.redis import RedisExampleDatabase
    except ImportError:  # pragma: no cover - hypothesis[redis] is a dependency
        raise UsageError(f"{option} {shown!r}: the redis client is missing (pip install 'hypothesis[redis]')") from None
    try:
        client = shared_client(spec)
    except ValueError as exc:  # redis-py's own parser refused it
        raise UsageError(f"{option} {shown!r}: not a Redis URL: {exc} ({_SHARED_FORMS})") from None
    try:
        client.ping()
    except Exception as exc:
        raise SharedDatabaseSilent(
            f"{option} {shown!r}: the Redis server does not answer: {_failure(exc)}",
            lost=shared_database_failure(shown, exc),
        ) from None
    _check_writable(default_dir, option=option, default=True)  # (every find is saved there first)
    store = _directory_store(shown, default_dir)
    store.shared = shown
    store.shared_database = _Guarded(RedisExampleDatabase(client), store, shown)
    store.database = MultiplexedDatabase(store.local_database, store.shared_database)
    return store


_SHARED_SCHEMES = ("redis", "rediss", "unix")  # what redis-py's URL parser reads
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
_SHARED_FORMS = "e.g. redis://HOST:PORT/N, redis://:PASSWORD@HOST:PORT/N, redis://[::1]:6379/0, rediss://HOST:PORT/N"


def is_shared(spec: str) -> bool:
    """Whether ``--db`` names a shared (Redis) database: a URL (``SCHEME://...``, or ``redis:...``
    mistyped), which redis-py's parser then reads or refuses; anything else is a directory."""
    text = spec.strip()
    return bool(_URL.match(text)) or text.lower().startswith(("redis:", "rediss:"))


def redacted(spec: str) -> str:
    """The URL as reports, warnings and reproduce lines show it: a password replaced by ``***``."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(spec)
        if parts.password is None:
            return spec
    except ValueError:
        return spec
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


REDIS_TIMEOUT = 5.0  # seconds one Redis call may take before the server counts as gone (frozen, unreachable)


def shared_client(spec: str) -> Any:
    """A redis-py client for the URL ``spec``, read by redis-py's own parser (``Redis.from_url``:
    a password, an IPv6 host in brackets, TLS with ``rediss://``, a socket with ``unix://``; a bad
    URL is its ``ValueError``), whose every call ends within ``REDIS_TIMEOUT``.

    redis-py's defaults retry a timed-out call 10 times with backoff (a frozen server — SIGSTOP, a
    hung host — took 115 s to notice); here a timeout is never retried, and a dropped connection is
    reconnected once (a restarted server). A connection idle for 30 s is checked with a PING before
    it is used again (``health_check_interval``).
    """
    import redis
    from redis.backoff import NoBackoff
    from redis.connection import parse_url
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.retry import Retry

    if not any(parse_url(spec.strip()).get(where) for where in ("host", "path")):  # (its own ValueError first)
        raise ValueError("it names no host (redis-py would take localhost:6379 in silence)")
    return redis.Redis.from_url(
        spec.strip(),
        socket_connect_timeout=REDIS_TIMEOUT,
        socket_timeout=REDIS_TIMEOUT,
        retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        health_check_interval=30,
    )


class SharedDatabaseSilent(UsageError):
    """The shared database's server did not answer when it was opened. Before any work this is a usage
    error; in a campaign's worker, whose parent reached the server at start-up, it is the database going
    away (``lost``: the words ``shared_database_failure`` gives it)."""

    def __init__(self, message: str, *, lost: str) -> None:
        super().__init__(message)
        self.lost = lost


def shared_database_failure(spec: str, exc: BaseException) -> str:
    """The words a lost shared database is reported with: the server, and what the call said."""
    return f"the shared database {spec} stopped answering ({_failure(exc)})"


def _failure(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    if "imeout" in text:  # (redis-py's "Timeout reading from HOST:PORT")
        text += f"; no answer within {REDIS_TIMEOUT:g} s"
    return text


def _check_writable(path: Path, *, option: str, default: bool = False) -> None:
    """The directory can hold an example (``probe_directory``: nothing is created, nothing left);
    else a ``UsageError`` naming it. ``default``: the directory is the default one (``examples/`` in
    Hypothesis' directory, ``--hypothesis-dir``), not one ``option`` named. It is made (with its
    parents) when the first example is saved there."""
    try:
        probe_directory(path)
    except OSError as exc:
        what = (
            f"the example database {str(path)!r} (the default of {option}, in --hypothesis-dir)"
            if default
            else f"{option} {str(path)!r}"
        )
        raise UsageError(f"{what}: cannot be written ({_os_error(exc)})") from None


def probe_directory(path: Path) -> None:
    """Whether the directory ``path`` can be written, leaving nothing behind (a usage error found
    later must not leave empty folders): a probe file written in it and removed; where it does not
    exist yet, a probe directory made in its nearest existing ancestor (and a file in that), both
    removed. ``OSError`` when it cannot be."""
    existing = path
    while not existing.exists() and not existing.is_symlink() and existing.parent != existing:
        existing = existing.parent
    if existing == path:
        _probe(path)
        return
    if not existing.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(existing))
    made = tempfile.mkdtemp(dir=existing, prefix=".specproof-probe-")
    try:
        _probe(Path(made))
    finally:
        os.rmdir(made)


def _probe(directory: Path | None) -> None:
    """A probe file made (``tempfile.mkstemp``; None: the temporary directory), written and removed."""
    fd, probe = tempfile.mkstemp(dir=directory, prefix=".specproof-probe-")
    try:
        os.write(fd, b"specproof")
    finally:
        os.close(fd)
        os.unlink(probe)


def check_storage(storage: Path, *, option: str = "--hypothesis-dir") -> None:
    """Hypothesis' directory and its ``sessions/`` (where failing session histories are written, as
    files ``--replay-session`` replays) can be written: checked before any work (``UsageError``
    naming the path). Neither is created here (``probe_directory``): a usage error found later
    leaves no folder; each is made when something is first written there."""
    folder = storage / "sessions"
    try:
        probe_directory(folder)
    except OSError as exc:
        raise UsageError(
            f"{option} {str(storage)!r}: the session-history directory {str(folder)!r} cannot be written "
            f"({_os_error(exc)})"
        ) from None


def _os_error(exc: OSError) -> str:
    """An ``OSError`` in words: its errno's name and its message (``EROFS: Read-only file system``)."""
    name = errno.errorcode.get(exc.errno or 0)
    text = exc.strerror or str(exc)
    return f"{name}: {text}" if name else text


def _directory_store(spec: str, path: Path) -> ExampleStore:
    directory = _Directory(path)
    store = ExampleStore(spec=spec, database=directory, local=path, local_database=directory)
    directory.store = store
    return store


class _Directory(DirectoryBasedExampleDatabase):
    """Hypothesis' directory database, with every save read back and no entry but a regular file read.

    ``DirectoryBasedExampleDatabase.save`` swallows ``OSError``; here a save whose file does not
    hold the example afterwards is recorded on the store (``ExampleStore.unsaved``, naming the
    path and the error) and a partial file is removed. ``fetch`` looks at each entry with
    ``lstat`` before opening it: a FIFO, a device or a symlink is skipped with a warning.
    """

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.store: ExampleStore | None = None

    def save(self, key: bytes, value: bytes) -> None:
        kept = self.save_kept(key, value)
        if not kept and self.store is not None and key != self._metakeys_name:  # (not Hypothesis' key list)
            self.store.failed_saves += 1

    def save_kept(self, key: bytes, value: bytes) -> bool:
        """``save``, and whether the file holds the example afterwards (read back); a save that did
        not keep it is recorded on the store naming the path and the error that stopped it."""
        path = self._value_path(key, value)
        why = ""
        for _attempt in range(2):  # (a partial file left by an earlier run is removed, then written again)
            super().save(key, value)  # (saves the key under its meta-key first, through this method)
            try:
                if stat.S_ISREG(os.lstat(path).st_mode) and path.read_bytes() == value:
                    return True
                why = "the file does not hold the example"
            except OSError:
                why = ""
            why = self._why_not_saved(path) or why or "the file was not written"
            try:  # a partial (e.g. empty, disk full) file would be read as a bad entry later
                if path.is_file() and not path.is_symlink():
                    path.unlink()
                else:
                    break
            except OSError:
                break
        if self.store is not None:
            self.store.not_kept(f"the example database did not keep an example: {path}: {why}")
        return False

    @staticmethod
    def _why_not_saved(path: Path) -> str:
        """The error that stopped Hypothesis' save, which swallows it: its steps retraced (the key
        directory created, a temporary file made where it makes one, a file created in the key
        directory; each probe removed), the first ``OSError`` named with its errno; "" if none."""
        steps: list[tuple[str, Callable[[], object]]] = [
            (f"creating {path.parent}", lambda: path.parent.mkdir(parents=True, exist_ok=True)),
            (f"a temporary file in {tempfile.gettempdir()}", lambda: _probe(None)),
            (f"creating a file in {path.parent}", lambda: _probe(path.parent)),
        ]
        for what, step in steps:
            try:
                step()
            except OSError as exc:
                return f"{what}: {_os_error(exc)}"
        return ""

    def fetch(self, key: bytes) -> Iterable[bytes]:
        directory = self._key_path(key)
        try:
            names = sorted(os.listdir(directory)) if directory.is_dir() else []
        except OSError:
            return []
        values = []
        for name in names:
            entry = directory / name
            try:
                if not stat.S_ISREG(os.lstat(entry).st_mode):
                    if self.store is not None:
                        self.store.warn(f"skipped an example database entry that is not a regular file: {entry}")
                    continue
                values.append(entry.read_bytes())
            except OSError:
                continue  # (deleted in the meantime)
        return values


class _Guarded(ExampleDatabase):
    """A shared database whose failures do not fail the run: the store is marked ``lost`` instead."""

    def __init__(self, inner: ExampleDatabase, store: ExampleStore, spec: str) -> None:
        super().__init__()
        self.inner, self.store, self.spec = inner, store, spec

    def _failed(self, exc: BaseException) -> None:
        if self.store.lost is None:
            self.store.lost = shared_database_failure(self.spec, exc)
            self.store.warn(self.store.lost + "; what was found is kept in " + str(self.store.local))

    def fetch(self, key: bytes) -> Iterable[bytes]:
        if self.store.lost is not None:
            return []
        try:
            return list(self.inner.fetch(key))
        except Exception as exc:
            self._failed(exc)
            return []

    def save(self, key: bytes, value: bytes) -> None:
        if self.store.lost is None:
            try:
                self.inner.save(key, value)
            except Exception as exc:
                self._failed(exc)

    def delete(self, key: bytes, value: bytes) -> None:
        if self.store.lost is None:
            try:
                self.inner.delete(key, value)
            except Exception as exc:
                self._failed(exc)


class _View(ExampleDatabase):
    """One check's namespace in the store; entries that do not decode are skipped with a warning.

    A view serves one Hypothesis run: the entries it gives back before the run saves anything (the
    replay phase, before a failure is found) are counted in ``ExampleStore.given_back``.
    """

    def __init__(self, store: ExampleStore, prefix: bytes, check: str) -> None:
        super().__init__()
        self.store, self.prefix, self.check = store, prefix + b":", check
        self.saved = False

    def fetch(self, key: bytes) -> Iterable[bytes]:
        try:
            values = list(self.store.database.fetch(self.prefix + key))
        except Exception as exc:
            self.store.warn(f"{self.check}: the example database could not be read ({type(exc).__name__}: {exc})")
            return []
        good = []
        for value in values:
            if choices_from_bytes(value) is None:
                self.store.warn(f"{self.check}: skipped an example database entry that does not decode")
                continue
            good.append(value)
        if good and not self.saved:
            self.store.given_back[self.check] += len(good)
        return good

    def save(self, key: bytes, value: bytes) -> None:
        self.save_kept(key, value)

    def save_kept(self, key: bytes, value: bytes) -> bool:
        """``save``, and whether the local directory kept the example (read back; a shared database
        is not read back: what goes wrong there marks the store ``lost``)."""
        self.saved = True
        failed = self.store.failed_saves
        try:
            self.store.database.save(self.prefix + key, value)
        except Exception as exc:
            self.store.warn(f"{self.check}: a failing example could not be saved ({type(exc).__name__}: {exc})")
            self.store.failed_saves += 1
            return False
        return self.store.failed_saves == failed

    def delete(self, key: bytes, value: bytes) -> None:
        try:
            self.store.database.delete(self.prefix + key, value)
        except Exception as exc:
            self.store.warn(f"{self.check}: an example database entry could not be deleted ({exc})")

    # ---- raw records (session histories): bytes under the check's own namespace ----------

    def records(self, name: bytes) -> list[bytes]:
        """The records saved under ``name``; with a shared database, one found only in the local
        directory (saved while the server was away, or before it was flushed) is saved to the
        shared one too, so every machine sharing it replays it (``ExampleStore.republished``),
        and one found only in the shared one is kept in the local directory."""
        store, key = self.store, self.prefix + name
        try:
            if store.shared_database is None:
                return list(store.database.fetch(key))
            local = list(store.local_database.fetch(key))
            shared = list(store.shared_database.fetch(key))
        except Exception as exc:
            store.warn(f"{self.check}: the example database could not be read ({type(exc).__name__}: {exc})")
            return []
        for value in local:
            if value not in shared and store.lost is None:
                store.shared_database.save(key, value)  # (a failure marks the store lost, as any shared save)
                if store.lost is None:
                    store.republished[self.check] += 1
        for value in shared:
            if value not in local:  # kept locally too (read back): a server that goes away later loses nothing
                store.local_database.save(key, value)
        return list(dict.fromkeys([*local, *shared]))

    # ---- covering examples: per rollback path, the smallest example that reached it -------

    def covering(self, paths: Iterable[str]) -> list[bytes]:
        """The saved covering examples of these paths (each once, smallest first; bad ones skipped)."""
        found: set[bytes] = set()
        for path in paths:
            found.update(self.fetch(_COVERING + path.encode()))
        return sorted(found, key=shortlex)

    def keep_covering(self, path: str, value: bytes) -> bool:
        """Keep ``value`` as the path's covering example if it is smaller than the saved one(s).

        One entry per path, the shortlex-smallest (Hypothesis' order of simplicity), so what a
        gate replays stays bounded however long campaigns run; True when ``value`` was saved and
        kept (read back: a save the directory did not keep is not counted, ``ExampleStore.unsaved``).
        """
        key = _COVERING + path.encode()
        saved = self.fetch(key)
        best = min([*saved, value], key=shortlex)
        for old in saved:
            if old != best:
                self.delete(key, old)
        if best == value and value not in saved:
            return self.save_kept(key, value)
        return False


_COVERING = b"specproof-covering."  # + path: the record name of a path's covering example


def shortlex(value: bytes) -> tuple[int, bytes]:
    """Hypothesis' order of simplicity on saved choice sequences: shorter first, then bytewise."""
    return (len(value), value)


def replay_only(key: bytes, entries: Iterable[bytes]) -> ExampleDatabase:
    """A database for Phase.reuse that replays ``entries`` under ``key`` and changes nothing.

    Hypothesis deletes a replayed entry that does not fail; a covering example is not meant to
    fail, so it is handed over in a ``ReadOnlyDatabase`` (saving and deleting are no-ops; its
    namespace in the store is untouched). Hypothesis sorts what it fetches (shortlex), so the
    in-memory set's order does not matter.
    """
    entries_db = InMemoryExampleDatabase()
    for entry in entries:
        entries_db.save(key, entry)
    return ReadOnlyDatabase(entries_db)


def derandomized_seed(test: Any) -> int:
    """The seed Hypothesis' ``derandomize=True`` uses for a ``@given`` test (its function digest).

    ``derandomize=True`` implies ``database=None`` in Hypothesis; seeding with this instead keeps
    the derandomized examples and lets the database be replayed first.
    """
    from hypothesis.internal.compat import int_from_bytes
    from hypothesis.internal.reflection import function_digest

    return int_from_bytes(function_digest(test.hypothesis.inner_test))
