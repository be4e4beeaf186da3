"""The one run catalog: which runs a folder holds and what they are called.

``lld-monitor analyze DIR`` (the triage), the dashboard's run picker and the triage's verdicts
all list runs through ``catalog(root)``, so a folder gives the same runs under the same names
everywhere. An entry is:

- an lld_monitor run folder at any depth (``runlog.find_runs``), or a folder that claims to be
  one (its ``meta.json``: a run summary, a half-written run; its reader says what is amiss);
- each entry directly in a folder that reads as one run: an output folder (TRL's, TensorBoard's,
  a checkpoint), a W&B run folder, a loose log file (``LOG_SUFFIXES``: listed even when it does
  not read, so that its error shows; ``MAYBE_LOG_SUFFIXES``: only when its content is a known
  format);
- the runs of a sub-folder that is not one run but holds runs (``wandb/`` of several W&B runs,
  a sweep's sub-folder), to ``MAX_DEPTH`` levels; a link to a listed run (``latest-run``) is not
  listed twice;
- for a file that holds several runs (runs appended to one log, a W&B export of several runs),
  one entry per run, named ``NAME [RUN]``.

Names are paths relative to ``root`` with ``/``. No torch; nothing is analysed here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lld_monitor.importers.formats import LOG_SUFFIXES, MAYBE_LOG_SUFFIXES

#: Entries that are never runs: caches, and W&B's own debug logs beside its run folders.
NOT_RUNS = frozenset(
    {"__pycache__", "node_modules", "site-packages", "debug.log", "debug-internal.log"}
    | {"debug-core.log"}
)
# LOG_SUFFIXES: suffixes of loose files taken for runs (listed as unreadable when they do not
# read); MAYBE_LOG_SUFFIXES: taken only when their content is a known log format (a console log,
# a terminal capture in markdown, a TSV export), so a README, a notes file or a library's debug
# log is not listed. Each format declares its own (``Format.suffixes``, ``maybe_suffixes``).
#: How deep sub-folders that hold runs are searched (our run folders: at any depth).
MAX_DEPTH = 4
#: At most this many entries are listed (the rest are named in the problems).
MAX_ENTRIES = 1000


@dataclass(frozen=True)
class CatalogEntry:
    """One run of a folder: its name, where it is, which of the file's runs, what kind."""

    name: str  # path relative to the root ("/"), + " [RUN]" for one of several runs in a file
    path: Path
    run: str | None = None  # one of the runs the file holds (``load.runs_in_file``), or None
    kind: str = "foreign"  # "run": an lld_monitor run folder; "foreign": any other log


def catalog(root: Path) -> tuple[list[CatalogEntry], list[str]]:
    """The runs under folder ``root`` (sorted by name) and the problems met while looking."""
    problems: list[str] = []
    paths = candidates(root)
    if len(paths) > MAX_ENTRIES:
        problems.append(
            f"listed the first {MAX_ENTRIES} of {len(paths)} runs; pass a sub-folder for the rest"
        )
        paths = paths[:MAX_ENTRIES]
    out: list[CatalogEntry] = []
    for path in paths:
        out += entries_of(path, entry_name(path, root))
    return sorted(out, key=lambda e: e.name), problems


def entries_of(path: Path, name: str) -> list[CatalogEntry]:
    """The runs of one path called ``name``: an lld_monitor run folder (kind "run"), any other
    log, or one entry per run of a file that holds several (``NAME [RUN]``)."""
    from lld_monitor.importers.load import runs_in_file

    if path.is_dir():
        return [CatalogEntry(name, path, None, "run" if is_our_run(path) else "foreign")]
    inner = runs_in_file(path) if path.is_file() else []
    if len(inner) > 1:
        return [CatalogEntry(f"{name} [{r}]", path, r) for r in inner]
    return [CatalogEntry(name, path)]


def is_our_run(path: Path) -> bool:
    """An lld_monitor run folder, or one that claims to be (its ``meta.json``: a summary, a
    half-written run; its reader says what is amiss)."""
    from lld_monitor.runlog import META_FILE, is_run_dir

    return is_run_dir(path) or (path / META_FILE).is_file()


def candidates(root: Path) -> list[Path]:
    """The paths of the runs under ``root`` (before a file is split into its runs), sorted."""
    from lld_monitor.runlog import find_runs

    found: dict[Path, Path] = {}
    for run in find_runs(root):
        found.setdefault(run.resolve(), run)
    _entries(root, found, depth=0)
    return sorted(found.values())


def is_folder_of_runs(path: Path) -> bool:
    """True for a folder that is not itself one run but holds runs: the folder of a night's
    sweep, of several output folders, of log files, a ``wandb/`` folder of several runs."""
    if not path.is_dir() or _one_run_folder(path):
        return False
    return bool(candidates(path))


def _one_run_folder(path: Path) -> bool:
    """A folder that is one run (its reader says so, or says what is amiss with it)."""
    from lld_monitor.importers.formats import _is_run_dir
    from lld_monitor.importers.wandb_run import is_wandb_run_dir

    if _is_run_dir(path) or is_wandb_run_dir(path):
        return True
    if any((path / f).is_file() for f in ("trainer_state.json", "meta.json", "steps.jsonl")):
        return True  # one run (a broken run folder too: its analysis says what is amiss)
    if any(path.glob("checkpoint-*/trainer_state.json")):
        return True  # a TRL output folder of checkpoints: one run, read from its latest
    return any("tfevents" in p.name for p in path.iterdir() if p.is_file())


def _entries(folder: Path, found: dict[Path, Path], depth: int) -> None:
    """Add each entry of ``folder`` that reads as one run; search sub-folders that hold runs."""
    from lld_monitor.importers.base import ImportFormatError
    from lld_monitor.importers.formats import detect

    covered = list(found)
    try:  # (a link after the folders: wandb/latest-run is listed under its run's own name)
        entries = sorted(folder.iterdir(), key=lambda p: (p.is_symlink(), p.name))
    except OSError:
        return
    for entry in entries:
        if entry.name.startswith(".") or entry.name in NOT_RUNS:
            continue
        try:
            real = entry.resolve()
        except (OSError, RuntimeError):
            continue
        if real in found or any(r.is_relative_to(real) for r in covered):
            continue  # a listed run, or a folder around one (its runs are listed)
        if entry.is_dir():
            try:
                detect(entry, complete=False)  # (an output folder, a W&B run, TensorBoard)
                found[real] = entry
            except ImportFormatError:
                if depth + 1 < MAX_DEPTH and not _one_run_folder(entry):
                    _entries(entry, found, depth + 1)  # (a folder of runs: its runs)
            continue
        suffix = entry.suffix.lower()
        if suffix not in LOG_SUFFIXES:
            if suffix not in MAYBE_LOG_SUFFIXES:
                continue
            try:
                detect(entry, complete=False)
            except ImportFormatError:
                continue
        found[real] = entry


def entry_name(path: Path, root: Path, run: str | None = None) -> str:
    """A run's name: its path relative to ``root`` with "/" (its own name when outside), and
    `` [RUN]`` for one of the runs a file holds (as ``entries_of`` names them)."""
    try:
        rel = path.relative_to(root).as_posix()
    except ValueError:
        rel = path.name
    rel = rel if rel != "." else path.name
    return rel if run is None else f"{rel} [{run}]"
