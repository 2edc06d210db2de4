"""`[tool.torchdoctor]` in pyproject.toml, merged with command-line flags."""

from __future__ import annotations

import difflib
import fnmatch
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchdoctor.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

# Rule groups a selector may name: `bugs` (on by default: the code is wrong) and
# `advice` (off by default: portability, performance and style notes).
GROUP_SELECTORS = ("BUGS", "ADVICE")

DEFAULT_EXCLUDE: tuple[str, ...] = (
    ".git",
    ".hg",
    ".svn",
    ".venv",
    "venv",
    ".tox",
    ".nox",
    "build",
    "dist",
    "__pycache__",
    "node_modules",
    ".torchdoctor_cache",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    ".ipynb_checkpoints",
)

KNOWN_KEYS = frozenset(
    {
        "select",
        "ignore",
        "extend-select",
        "extend-ignore",
        "exclude",
        "extend-exclude",
        "per-file-ignores",
        "target-version",
        "respect-gitignore",
        "force-exclude",
    }
)


@dataclass
class Settings:
    select: list[str] | None = None  # None: every rule that is on by default
    extend_select: list[str] = field(default_factory=list)
    ignore: list[str] = field(default_factory=list)
    per_file_ignores: dict[str, list[str]] = field(default_factory=dict)
    exclude: list[str] = field(default_factory=lambda: list(DEFAULT_EXCLUDE))
    extend_exclude: list[str] = field(default_factory=list)
    target_version: tuple[int, int] | None = None  # the torch version the code targets
    respect_gitignore: bool = True  # skip what git ignores while walking folders
    force_exclude: bool = False  # apply excludes to files named on the command line too
    root: Path = field(default_factory=Path.cwd)  # folder of the config file
    config_file: Path | None = None

    def enabled_codes(
        self, all_codes: Iterable[tuple[str, bool]], groups: Mapping[str, str] | None = None
    ) -> frozenset[str]:
        """Codes on for this run, given (code, on_by_default) for every rule and each
        rule's group (`bugs`, `advice`), which a selector may name instead of a prefix."""
        groups = groups or {}
        enabled = set()
        for code, default_on in all_codes:
            group = groups.get(code, "")
            if self.select is None:
                on = default_on
            else:
                on = any(matches(code, group, sel) for sel in self.select)
            on = on or any(matches(code, group, sel) for sel in self.extend_select)
            if on and not any(matches(code, group, sel) for sel in self.ignore):
                enabled.add(code)
        return frozenset(enabled)

    def ignored_for(self, path: Path) -> list[str]:
        """Selectors that `per-file-ignores` switches off for `path`."""
        rel = _relative(path, self.root)
        out: list[str] = []
        for pattern, codes in self.per_file_ignores.items():
            if _glob_match(rel, pattern) or _glob_match(path.name, pattern):
                out.extend(codes)
        return out

    def excluded_entry(self, path: Path) -> bool:
        """Whether an exclude glob matches this one file or folder found while walking.

        A glob with a `/` matches the path relative to the config root
        (`tests/fixtures`, `src/*_pb2.py`); a glob without one matches the entry's name
        (`build`, `*.pyi`). Only entries below a folder the user named are tested, so
        `torchdoctor check .venv/lib/python3.11/site-packages/torch` checks that tree.
        """
        rel = _relative(path, self.root)
        name = path.name
        for pattern in (*self.exclude, *self.extend_exclude):
            pattern = pattern.rstrip("/").removeprefix("./")
            if "/" in pattern:
                if fnmatch.fnmatchcase(rel, pattern):
                    return True
            elif fnmatch.fnmatchcase(name, pattern):
                return True
        return False

    def is_excluded(self, path: Path) -> bool:
        """Whether `path` or one of its folders (inside the config root) is excluded.

        Used for files named explicitly under `--force-exclude`.
        """
        absolute = Path(os.path.abspath(path))
        root = Path(os.path.abspath(self.root))
        candidates = [absolute]
        for parent in absolute.parents:
            if parent == root or root not in parent.parents:
                break
            candidates.append(parent)
        return any(self.excluded_entry(c) for c in candidates)


def matches(code: str, group: str, selector: str) -> bool:
    """A selector is ALL, a code prefix (`TD4`, `TD402`) or a group name (`ADVICE`)."""
    return selector == "ALL" or code.startswith(selector) or selector == group.upper()


def _relative(path: Path, root: Path) -> str:
    """`path` relative to `root` with forward slashes (no file system access: fast)."""
    absolute = os.path.abspath(path)
    base = os.path.abspath(root)
    if absolute == base:
        return "."
    if absolute.startswith(base.rstrip(os.sep) + os.sep):
        return Path(absolute[len(base.rstrip(os.sep)) + 1 :]).as_posix()
    return path.as_posix()


def _glob_match(rel: str, pattern: str) -> bool:
    pattern = pattern.removeprefix("./")
    if fnmatch.fnmatchcase(rel, pattern):
        return True
    # `tests/fixtures` also matches everything below it
    return rel.startswith(pattern.rstrip("/") + "/")


def find_config(start: Path) -> Path | None:
    """The nearest pyproject.toml with a [tool.torchdoctor] table, walking up."""
    here = Path(os.path.abspath(start))
    if here.is_file():
        here = here.parent
    for folder in (here, *here.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            try:
                data = candidate.read_bytes()
            except OSError:
                continue  # an unrelated unreadable pyproject further up is not ours to judge
            if b"torchdoctor" not in data:
                continue
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                if b"tool.torchdoctor" in data:
                    return candidate  # ours, but not UTF-8: load_settings says so
                continue
            try:
                data = tomllib.loads(text)
            except tomllib.TOMLDecodeError:
                if "tool.torchdoctor" in text:
                    return candidate  # ours, but broken: load_settings says where
                continue
            if "torchdoctor" in data.get("tool", {}):
                return candidate
    return None


def load_settings(
    config_file: Path | None,
    known_codes: Sequence[str],
    names: dict[str, str] | None = None,
) -> Settings:
    """Settings from a pyproject.toml's [tool.torchdoctor] table (or defaults).

    `names` (rule name -> code) only makes the message for an unknown code better.
    """
    settings = Settings()
    if config_file is None:
        return settings
    try:
        data = tomllib.loads(config_file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read {config_file}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        line = config_file.read_bytes()[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"cannot read {config_file}: not UTF-8 (line {line}: byte "
            f"{exc.object[exc.start : exc.start + 1]!r}); TOML files must be UTF-8",
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{config_file} is not valid TOML: {exc}") from exc
    table = data.get("tool", {}).get("torchdoctor", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{config_file}: [tool.torchdoctor] must be a table")
    settings.root = config_file.parent
    settings.config_file = config_file
    apply_table(settings, table, known_codes, where=str(config_file), names=names)
    return settings


def apply_table(
    settings: Settings,
    table: dict[str, Any],
    known_codes: Sequence[str],
    where: str,
    names: dict[str, str] | None = None,
) -> None:
    unknown = sorted(set(table) - KNOWN_KEYS)
    if unknown:
        named = ", ".join(key + did_you_mean(key, KNOWN_KEYS) for key in unknown)
        raise ConfigError(
            f"{where}: unknown key(s) in [tool.torchdoctor]: {named}",
            fix=f"known keys: {', '.join(sorted(KNOWN_KEYS))}",
        )

    def codes(key: str) -> list[str]:
        value = table[key]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where}: '{key}' must be a list of rule codes")
        return validate_selectors(value, known_codes, f"{where}: '{key}'", names)

    def globs(key: str) -> list[str]:
        value = table[key]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where}: '{key}' must be a list of glob patterns")
        return list(value)

    if "select" in table:
        settings.select = codes("select")
    if "extend-select" in table:
        settings.extend_select += codes("extend-select")
    for key in ("ignore", "extend-ignore"):
        if key in table:
            settings.ignore += codes(key)
    if "exclude" in table:
        settings.exclude = globs("exclude")
    if "extend-exclude" in table:
        settings.extend_exclude += globs("extend-exclude")
    if "per-file-ignores" in table:
        pfi = table["per-file-ignores"]
        if not isinstance(pfi, dict):
            raise ConfigError(f"{where}: 'per-file-ignores' must be a table of glob = [codes]")
        for pattern, value in pfi.items():
            if isinstance(value, str):
                value = [value]
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"{where}: per-file-ignores '{pattern}' must list rule codes")
            settings.per_file_ignores[pattern] = validate_selectors(
                value, known_codes, f"{where}: per-file-ignores '{pattern}'", names
            )
    if "target-version" in table:
        settings.target_version = parse_torch_version(str(table["target-version"]), where)
    for key in ("respect-gitignore", "force-exclude"):
        if key in table:
            if not isinstance(table[key], bool):
                raise ConfigError(f"{where}: '{key}' must be true or false")
            setattr(settings, key.replace("-", "_"), table[key])


def parse_torch_version(text: str, where: str = "target-version") -> tuple[int, int]:
    parts = text.strip().split(".")
    try:
        major, minor = int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        raise ConfigError(
            f"{where}: target-version {text!r} is not a torch version",
            fix='write it like "2.4"',
        ) from None
    return major, minor


def did_you_mean(word: str, known: Iterable[str], names: dict[str, str] | None = None) -> str:
    """` (did you mean 'x'?)` for the closest of `known` (or of rule `names`), or ''.

    `names` maps rule names to codes: `select = ["load-without-map-location"]` suggests
    its code, since selectors are codes.
    """
    if names and word.lower() in names:
        return f" (did you mean {names[word.lower()]!r}, the code of {word.lower()!r}?)"
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    if not close and names:
        close_names = difflib.get_close_matches(word.lower(), list(names), n=1, cutoff=0.6)
        if close_names:
            name = close_names[0]
            return f" (did you mean {names[name]!r}, the code of {name!r}?)"
    return f" (did you mean {close[0]!r}?)" if close else ""


def validate_selectors(
    selectors: Sequence[str],
    known_codes: Sequence[str],
    where: str,
    names: dict[str, str] | None = None,
) -> list[str]:
    """Each selector must be ALL, a group (`bugs`, `advice`) or a prefix of a known code.

    `names` (rule name -> code) only improves the message for a selector that is not.
    """
    out = []
    for raw in selectors:
        sel = raw.strip().upper()
        if not sel:
            continue
        if sel not in ("ALL", *GROUP_SELECTORS) and not any(
            code.startswith(sel) for code in known_codes
        ):
            hint = did_you_mean(sel, known_codes, names) or did_you_mean(raw.strip(), [], names)
            raise ConfigError(
                f"{where}: unknown rule code, prefix or group {raw!r}{hint}",
                fix="`torchdoctor rules` lists every code and its group (bugs, advice)",
            )
        out.append(sel)
    return out
