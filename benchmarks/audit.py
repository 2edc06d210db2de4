"""Precision on code torchdoctor was never tuned on: judged random samples of its findings.

    .venv/bin/python benchmarks/audit.py [--write] [--sample TSV]

The clean corpus (precision.py) is where the rules were tuned, so its share of false alarms
flatters them. Each sample here is independent: findings drawn at random (one per distinct
finding) from what the default rules of main reported on the whole repositories of the
real-bug corpus (benchmarks/.work/bugs-context/, made by `bugs.py rebuild --context`), each
read in its code and given one verdict (worth-fixing, intended, false-alarm, unsure) with its
reason. A sample's `# drawn from ...` line says when and how it was drawn:
benchmarks/bugs-audit.tsv (the first, 120 findings at c3b9b51) and bugs-audit-2.tsv (96
findings at daec40d, none of them in the first).

This script checks the sampled repositories again with today's torchdoctor and counts, per
verdict, how many sampled findings it still reports: false alarms should go, worth-fixing
findings must stay. A new finding is not judged here (the sample is fixed); precision.py
and the bug-repository diff cover those. `--write` puts the table into README.md.
"""

from __future__ import annotations

import argparse
import collections
import csv
import datetime
import sys
from pathlib import Path

from _readme import write_section
from _recall import check_json

HERE = Path(__file__).resolve().parent
SAMPLE = HERE / "bugs-audit.tsv"
CONTEXT = HERE / ".work" / "bugs-context"
VERDICTS = ("worth-fixing", "intended", "false-alarm", "unsure")

Key = tuple[str, str, int, int, str]  # folder, file, cell (0: not a notebook), line, code


def drawn_from(path: Path) -> str:
    """The sample's `# drawn from ...` line (how it was drawn), or ""."""
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if line.startswith("# drawn from "):
                return line[2:].strip()
    return ""


def read_sample(path: Path = SAMPLE) -> dict[Key, str]:
    """Each sampled finding and its verdict."""
    sample: dict[Key, str] = {}
    with path.open(encoding="utf-8") as handle:
        for row in csv.reader(handle, delimiter="\t"):
            if not row or row[0].startswith("#"):
                continue
            folder, file, cell, line, code, verdict = row[:6]
            if verdict not in VERDICTS:
                raise ValueError(f"{path.name}: unknown verdict {verdict!r} in {row[:5]}")
            sample[(folder, file, int(cell or 0), int(line), code)] = verdict
    return sample


def findings(folder: Path) -> set[Key]:
    """The default rules' findings on one repository, as sample keys."""
    root = folder.resolve()
    return {
        (
            folder.name,
            Path(f["filename"]).resolve().relative_to(root).as_posix(),
            f.get("cell") or 0,
            f["line"],
            f["code"],
        )
        for f in check_json(folder)
    }


def measure(sample: dict[Key, str]) -> dict[str, tuple[int, int]]:
    """verdict -> (sampled, still reported)."""
    folders = sorted({key[0] for key in sample})
    missing = [name for name in folders if not (CONTEXT / name).is_dir()]
    if missing:
        raise SystemExit(
            f"{len(missing)} repositories are not built (first: {missing[0]}); "
            "run `benchmarks/bugs.py rebuild --context` first"
        )
    reported: set[Key] = set()
    for number, name in enumerate(folders, 1):
        print(f"[{number}/{len(folders)}] {name}", file=sys.stderr)
        reported |= findings(CONTEXT / name)
    sampled = collections.Counter(sample.values())
    kept = collections.Counter(verdict for key, verdict in sample.items() if key in reported)
    return {verdict: (sampled[verdict], kept[verdict]) for verdict in VERDICTS}


def report(counts: dict[str, tuple[int, int]], path: Path = SAMPLE, origin: str = "") -> str:
    total = sum(n for n, _ in counts.values())
    kept_total = sum(k for _, k in counts.values())
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    drawn = f"{origin}; " if origin else ""
    lines = [
        f"Measured {when} by `benchmarks/audit.py` on the {total} sampled findings of "
        f"benchmarks/{path.name} ({drawn}see the script's docstring). "
        "Default rules, each sampled repository checked whole.",
        "",
        "| verdict at sampling | sampled | still reported | gone |",
        "|---|---:|---:|---:|",
    ]
    for verdict, (n, kept) in counts.items():
        lines.append(f"| {verdict} | {n} | {kept} | {n - kept} |")
    lines.append(f"| **all** | {total} | {kept_total} | {total - kept_total} |")
    worth, _ = counts["worth-fixing"]
    alarms, alarms_kept = counts["false-alarm"]
    lines += [
        "",
        f"At sampling, {worth} of {total} ({worth / total:.0%}) were worth fixing and "
        f"{alarms} ({alarms / total:.0%}) false alarms; {alarms - alarms_kept} of those false "
        "alarms are gone now.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write the table into README.md")
    parser.add_argument("--sample", type=Path, default=SAMPLE, help="the judged sample (TSV)")
    args = parser.parse_args(argv)
    try:
        sample = read_sample(args.sample)
    except (OSError, ValueError) as exc:  # a missing file, a short row, a bad number
        raise SystemExit(f"audit: {args.sample}: {exc}") from None
    text = report(measure(sample), args.sample, drawn_from(args.sample))
    print(text)
    if args.write:
        if args.sample.resolve() == SAMPLE:
            write_section("bugs-audit", text, heading="Precision on code we never tuned on")
        else:
            heading = f"Precision on code we never tuned on: {args.sample.stem}"
            write_section(args.sample.stem, text, heading=heading)


if __name__ == "__main__":
    main()
