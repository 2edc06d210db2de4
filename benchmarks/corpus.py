"""Recreate the clean real-code corpus of benchmarks/corpus.txt from fetched git mirrors.

    .venv/bin/python benchmarks/corpus.py rebuild [--mirrors DIR] [--into DIR] [--force]

For each `owner/name commit` line of benchmarks/corpus.txt, writes every `.py` and
`.ipynb` file of that commit - tests included - into INTO/owner+name (default
/work/corpus, the folder `make bench` reads), taken from the mirror at
MIRRORS/owner+name/repo (default /work/.mirror: the search tool's `fetch` puts them there;
a `git clone --mirror` placed there works as well). A project already rebuilt at its
recorded commit is kept unless --force. Repositories not fetched yet are listed; the
command then exits 1. Nothing here touches the network, and the third-party files never
enter this repository.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # siblings, run as a script
import _mirror

HERE = Path(__file__).resolve().parent
CORPUS_LIST = HERE / "corpus.txt"
DEFAULT_INTO = Path("/work/corpus")
MARKER = ".corpus-commit"  # the commit a rebuilt project folder holds
SUFFIXES = (".py", ".ipynb")


def recorded(path: Path = CORPUS_LIST) -> list[tuple[str, str]]:
    """(owner/name, commit) of every repository of the corpus list."""
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2 or "/" not in parts[0] or len(parts[1]) != 40:
            raise ValueError(f"{path.name}:{number}: expected 'owner/name <40-hex commit>'")
        rows.append((parts[0], parts[1]))
    return rows


def rebuild_project(git_dir: Path, commit: str, target: Path) -> tuple[int, list[str]]:
    """Write the project's .py/.ipynb files at `commit` into `target`.

    Returns how many were written and the paths the mirror lacks (too large to fetch).
    """
    files = _mirror.tree_files(git_dir, commit, SUFFIXES)
    staged = target.with_name(target.name + ".part")
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir(parents=True)
    absent = []
    for start in range(0, len(files), 2000):
        chunk = files[start : start + 2000]
        contents = _mirror.blobs(git_dir, [blob for _, blob in chunk])
        for (path, _), data in zip(chunk, contents, strict=True):
            if data is None:
                absent.append(path)
                continue
            destination = staged / path
            destination.parent.mkdir(parents=True, exist_ok=True)
            destination.write_bytes(data)
    (staged / MARKER).write_text(commit + "\n", encoding="utf-8")
    _mirror.replace_dir(target, staged)
    return len(files) - len(absent), absent


def rebuild(mirrors: Path, into: Path, force: bool) -> int:
    into.mkdir(parents=True, exist_ok=True)
    missing = []
    for repo, commit in recorded():
        target = into / _mirror.folder_name(repo)
        marker = target / MARKER
        if not force and marker.exists() and marker.read_text().strip() == commit:
            print(f"  {repo}: up to date ({commit[:12]})")
            continue
        git_dir = _mirror.mirror_of(repo, mirrors)
        if git_dir is None:
            missing.append(repo)
            continue
        if not _mirror.has_commit(git_dir, commit):
            print(f"  {repo}: commit {commit[:12]} is not in {git_dir}", file=sys.stderr)
            missing.append(repo)
            continue
        count, absent = rebuild_project(git_dir, commit, target)
        print(f"  {repo}: {count} files at {commit[:12]}")
        if absent:
            # the fetched snapshot leaves out files of 4 MiB and more (large notebooks)
            shown = ", ".join(absent[:3]) + (", ..." if len(absent) > 3 else "")
            print(f"    {len(absent)} files are not in the mirror (too large?): {shown}")
    if missing:
        print(
            f"{len(missing)} repositories still to fetch into {mirrors}/owner+name/repo "
            "(the search tool's fetch, or git clone --mirror); then run again:",
            file=sys.stderr,
        )
        for repo in missing:
            print(f"  {repo}", file=sys.stderr)
        return 1
    print(f"corpus ready in {into}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    cmd = sub.add_parser("rebuild", help="write the corpus folders from the mirrors")
    cmd.add_argument("--mirrors", type=Path, default=_mirror.MIRRORS)
    cmd.add_argument("--into", type=Path, default=DEFAULT_INTO)
    cmd.add_argument("--force", action="store_true", help="rebuild projects already there")
    args = parser.parse_args(argv)
    try:
        return rebuild(args.mirrors, args.into, args.force)
    except (OSError, ValueError, _mirror.MirrorError) as exc:
        print(f"corpus rebuild: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
