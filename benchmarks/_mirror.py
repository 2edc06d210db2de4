"""Read files at recorded commits from fetched git mirrors (never from the network).

A mirror is a git directory at `MIRRORS/<owner>+<name>/repo` (bare, or a clone whose
`.git` is inside it). The search tool's `fetch` puts them there; any `git clone` placed at
the same path works as well. `TORCHDOCTOR_MIRRORS` points elsewhere.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

MIRRORS = Path(os.environ.get("TORCHDOCTOR_MIRRORS", "/work/.mirror"))


class MirrorError(Exception):
    """A recorded file cannot be read from its mirror: the message says why, in one line."""


def folder_name(repo: str) -> str:
    """`owner/name` -> `owner+name`, the folder of its mirror and of its rebuilt copy."""
    return repo.replace("/", "+", 1)


def mirror_of(repo: str, mirrors: Path = MIRRORS) -> Path | None:
    """The git directory of `repo`'s mirror, or None if it has not been fetched."""
    base = mirrors / folder_name(repo) / "repo"
    for candidate in (base / ".git", base):
        if (candidate / "HEAD").is_file() and (candidate / "objects").is_dir():
            return candidate
    return None


def _git(git_dir: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "--git-dir", str(git_dir), *args], capture_output=True)


def has_commit(git_dir: Path, commit: str) -> bool:
    return _git(git_dir, "cat-file", "-e", f"{commit}^{{commit}}").returncode == 0


def show(git_dir: Path, commit: str, path: str) -> bytes:
    """The bytes of `path` at `commit`; MirrorError if the commit or the file is absent."""
    done = _git(git_dir, "show", f"{commit}:{path}")
    if done.returncode == 0:
        return done.stdout
    if not has_commit(git_dir, commit):
        raise MirrorError(f"commit {commit[:12]} is not in the mirror (fetch a newer snapshot)")
    raise MirrorError(f"{path} does not exist at commit {commit[:12]}")


def tree_files(git_dir: Path, commit: str, suffixes: tuple[str, ...]) -> list[tuple[str, str]]:
    """(path, blob id) of every regular file at `commit` whose name ends with a suffix."""
    done = _git(git_dir, "ls-tree", "-r", "-z", commit)
    if done.returncode != 0:
        raise MirrorError(f"cannot list commit {commit[:12]}: {done.stderr.decode().strip()}")
    files = []
    for entry in done.stdout.decode("utf-8", "surrogateescape").split("\0"):
        if not entry:
            continue
        meta, path = entry.split("\t", 1)
        mode, kind, blob = meta.split()
        # 120000 symlinks and 160000 submodules are not files of this repository
        if kind == "blob" and mode in ("100644", "100755") and path.endswith(suffixes):
            files.append((path, blob))
    return files


def blobs(git_dir: Path, ids: list[str]) -> list[bytes | None]:
    """The contents of many blobs through one `git cat-file --batch` process.

    None for a blob the mirror lacks (snapshots leave out files of 4 MiB and more).
    """
    request = "".join(f"{blob}\n" for blob in ids).encode()
    done = subprocess.run(
        ["git", "--git-dir", str(git_dir), "cat-file", "--batch"],
        input=request,
        capture_output=True,
        check=True,
    )
    out, pos = done.stdout, 0
    contents: list[bytes | None] = []
    for _ in ids:
        header_end = out.index(b"\n", pos)
        header = out[pos:header_end].split()
        if header[-1] == b"missing":
            contents.append(None)
            pos = header_end + 1
            continue
        size = int(header[2])
        contents.append(out[header_end + 1 : header_end + 1 + size])
        pos = header_end + 1 + size + 1  # the content is followed by a newline
    return contents


def lines_of(data: bytes) -> list[str]:
    """A file's lines as the labels count them (split on "\\n", bytes kept exactly)."""
    return data.decode("utf-8", "surrogateescape").split("\n")


def line_sha1(text: str) -> str:
    """The label hash of one line: sha1 of its text without surrounding whitespace."""
    return hashlib.sha1(text.strip().encode("utf-8", "surrogateescape")).hexdigest()


def replace_dir(target: Path, staged: Path) -> None:
    """Swap a fully written `staged` folder in for `target` (a crash leaves one of them)."""
    old = target.with_name(target.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        target.rename(old)
    staged.rename(target)
    shutil.rmtree(old, ignore_errors=True)
