"""The README is executed: every shell command and Python block in it runs here, and
the output it shows, the configuration it gives and the claims it makes are checked
against the code, so the README cannot drift from what torchdoctor does.

Commands run in a sandbox project (a small training script, a package, a notebook, an
evaluation script) made by the `sandbox` fixture; commands that name `examples/` run in
the repository. Only commands that CI itself runs or that never end (`make test`,
`mkdocs serve`, …) are not run here, each with its reason in NOT_RUN.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.gloo_race import run_past_gloo_exit_race
from torchdoctor.catalog import catalog
from torchdoctor.check.config import load_settings, tomllib

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BIN = Path(sys.executable).parent

# Commands the test does not run, and why (each still has to be in the README as written).
NOT_RUN = {
    "make demo": "CI runs it (.ci/run: `make demo`, then `make test`)",
    "make test": "this is the test suite itself",
    "make docs": "tests/test_docs.py builds the site with the same mkdocs command",
    "make bench": "takes an hour; benchmarks/README.md holds its last run",
    ".venv/bin/mkdocs serve": "a server that runs until stopped",
    "make fuzz": "runs for minutes; tests/robustness/test_campaign.py runs a short round of it",
}


@dataclass
class Block:
    lang: str
    body: str
    line: int  # README line of the opening fence
    section: str  # the `## ` heading it stands under


def readme_blocks() -> list[Block]:
    text = README.read_text(encoding="utf-8")
    blocks, section = [], ""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            section = line[3:].strip()
        fence = re.match(r"^(\s*)```(\w*)\s*$", line)
        if fence:
            indent, lang, start = fence.group(1), fence.group(2), i + 1
            body = []
            i += 1
            while i < len(lines) and lines[i].strip() != "```":
                body.append(lines[i][len(indent) :])
                i += 1
            blocks.append(Block(lang, "\n".join(body) + "\n", start, section))
        i += 1
    return blocks


BLOCKS = readme_blocks()


def _id(block: Block) -> str:
    return f"{block.lang}@{block.line}"


@dataclass
class Command:
    argv: str  # the shell command, comments removed
    shown: list[str]  # the output lines the README shows under it
    block: Block
    status_shown: bool = False  # a `$ echo $?` follows it
    status: int | None = None  # the exit status that `echo $?` shows


def console_commands() -> list[Command]:
    commands: list[Command] = []
    for block in BLOCKS:
        if block.lang != "console":
            continue
        current: Command | None = None
        for raw in block.body.splitlines():
            if raw.startswith("$ ") and raw[2:].strip() == "echo $?" and current is not None:
                current.status_shown = True  # the next line shown is the status before
            elif current is not None and current.status_shown and current.status is None:
                current.status = int(raw.strip())
            elif raw.startswith("$ "):
                current = Command(_strip_comment(raw[2:]), [], block)
                commands.append(current)
            elif current is not None and raw.strip() and not raw.lstrip().startswith("# "):
                current.shown.append(raw)
    return commands


def _strip_comment(command: str) -> str:
    """The command without its trailing `# comment` (a `#` inside quotes is kept)."""
    quote = ""
    for i, char in enumerate(command):
        if quote:
            quote = "" if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char == "#" and (i == 0 or command[i - 1].isspace()):
            return command[:i].strip()
    return command.strip()


COMMANDS = console_commands()


# -- the sandbox project ---------------------------------------------------------------
TRAIN = """\
import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1)
args = parser.parse_args()
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(args.epochs):
    x = torch.randn(4, 3, device=device)
    y = torch.randint(0, 2, (4,), device=device)
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
print("done", epoch)
"""
# src/train.py: the flake8 example's TD402 at line 12, column 9
SRC_TRAIN = (
    "import torch\n" + "\n" * 9 + "def load(path):\n    x = torch.load(path)\n    return x\n"
)
EVAL = """\
import torch
from torch import nn

model = nn.Linear(3, 2)
torch.save(model.state_dict(), "weights.pt")
model.load_state_dict(torch.load("weights.pt", map_location="cpu"))
print(model(torch.randn(2, 3)).shape)
"""
NOTEBOOK = {
    "cells": [
        {
            "cell_type": "code",
            "execution_count": None,
            "metadata": {},
            "outputs": [],
            "source": ["import torch\n", 'state = torch.load("ckpt.pt")\n'],
        }
    ],
    "metadata": {},
    "nbformat": 4,
    "nbformat_minor": 5,
}


@pytest.fixture
def sandbox(tmp_path: Path) -> Path:
    """A fresh project for each command: `check --fix` must not change what the next sees."""
    root = tmp_path / "project"
    root.mkdir()
    (root / "train.py").write_text(TRAIN)
    (root / "eval.py").write_text(EVAL)
    (root / "src").mkdir()
    (root / "src" / "train.py").write_text(SRC_TRAIN)
    (root / "mypackage").mkdir()
    (root / "mypackage" / "__init__.py").write_text("")
    (root / "mypackage" / "train.py").write_text(TRAIN)
    (root / "notebooks").mkdir()
    (root / "notebooks" / "explore.ipynb").write_text(json.dumps(NOTEBOOK))
    return root


def _run(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("FORCE_COLOR", None)
    env["NO_COLOR"] = "1"
    return run_past_gloo_exit_race(  # the multi-GPU example runs a real gloo job
        lambda: subprocess.run(
            command,
            shell=True,
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            stdin=subprocess.DEVNULL,
        )
    )


def _squash(text: str) -> str:
    return " ".join(text.split())


def _shown_in(shown: list[str], output: str) -> bool:
    """The README's output appears in the real output: each shown entry (a line and the
    indented lines that continue it, folded for width; `...` for what is left out) in
    order, with anything between entries (an excerpt)."""
    entries: list[str] = []
    for line in shown:
        if entries and line.startswith((" ", "\t")) and not line.lstrip().startswith("..."):
            entries[-1] += " " + line
        else:
            entries.append(line)

    def entry_pattern(entry: str) -> str:
        parts = re.split(r"\.\.\.|…", entry)
        return ".*?".join(
            r"\s*".join(re.escape(word) for word in part.split()) for part in parts if part.strip()
        )

    pattern = ".*?".join(entry_pattern(e) for e in entries if entry_pattern(e))
    return re.search(pattern, _squash(output), re.S) is not None


@pytest.mark.parametrize(
    "command", COMMANDS, ids=[f"{c.block.line}:{c.argv[:40]}" for c in COMMANDS]
)
def test_every_console_command_runs_and_shows_what_the_readme_says(
    command: Command, sandbox: Path
) -> None:
    if command.argv in NOT_RUN:
        pytest.skip(NOT_RUN[command.argv])
    cwd = ROOT if "examples/" in command.argv else sandbox
    argv = command.argv
    if argv.startswith("python "):
        argv = f"{sys.executable} {argv.removeprefix('python ')}"
    result = _run(argv, cwd)
    output = result.stdout + result.stderr
    assert result.returncode != 2, f"usage or configuration error:\n{output}"
    if command.status is not None:
        assert result.returncode == command.status, output
    shows_traceback = any("Traceback" in line for line in command.shown) or "explain" in argv
    assert "Traceback (most recent call last)" not in output or shows_traceback, output
    if command.shown:
        assert _shown_in(command.shown, output), f"README shows {command.shown}\ngot:\n{output}"


def test_commands_not_run_here_are_in_the_readme() -> None:
    assert set(NOT_RUN) <= {c.argv for c in COMMANDS}, "NOT_RUN names a command the README lost"


# -- configuration blocks ----------------------------------------------------------------
def test_every_torchdoctor_config_block_loads_and_its_comments_are_true(tmp_path: Path) -> None:
    tables = [b for b in BLOCKS if b.lang == "toml" and "[tool.torchdoctor]" in b.body]
    assert tables, "the README shows the [tool.torchdoctor] table"
    for block in tables:
        config = tmp_path / "pyproject.toml"
        config.write_text(block.body)
        load_settings(config, list(catalog()))  # raises on an unknown key, code or value
        for line in block.body.splitlines():
            if "off by default" in line:
                named = re.findall(r'"([^"]+)"', line.split("#")[0])
                codes = [
                    code
                    for name in named
                    for code, info in catalog().items()
                    if code == name or info.group == name
                ]
                assert codes and all(not catalog()[c].default_enabled for c in codes), line


def test_other_data_blocks_parse() -> None:
    import yaml

    for block in BLOCKS:
        if block.lang == "toml":
            tomllib.loads(block.body)
        elif block.lang == "json":
            json.loads(block.body)
        elif block.lang == "yaml":
            yaml.safe_load(block.body)


# -- Python blocks -----------------------------------------------------------------------
@pytest.fixture
def namespace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """The names the README's Python blocks assume: a model, its data, optimizer, loop."""
    import types

    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = nn.Sequential(nn.Linear(3, 8))

        def forward(self, *args: Any, **batch: Any) -> Any:
            # model(x), model(batch_dict), or model(**batch) returning an output with .loss
            inputs = args[0] if args else batch["x"]
            out = self.encoder(inputs["x"] if isinstance(inputs, dict) else inputs)
            return out if args else types.SimpleNamespace(loss=out.sum())

    monkeypatch.chdir(tmp_path)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train_loader = [{"x": torch.randn(4, 3)} for _ in range(2)]

    def train(_model: Any = None) -> None:
        for batch in train_loader:
            model(batch).sum().backward()

    import torchdoctor as td

    hook = sys.excepthook
    yield {
        "td": td,  # the README's blocks start from `import torchdoctor as td`
        "loader": train_loader,
        "model": model,
        "opt": opt,
        "sched": torch.optim.lr_scheduler.StepLR(opt, 1),
        "scaler": torch.amp.GradScaler("cpu"),
        "epoch": 3,
        "train_loader": train_loader,
        "batch": {"x": torch.randn(4, 3)},
        "x": torch.randn(4, 3),
        "target": torch.zeros(4, dtype=torch.long),
        "criterion": nn.CrossEntropyLoss(),
        "train": train,
        "train_one_epoch": lambda model, loader: train(),
        "path": "last.pt",
    }
    sys.excepthook = hook


_RAISES = re.compile(r"^\s*#\s*([\w.]+(?:Error|Exception)):")


def _run_block(source: str, names: dict[str, Any]) -> None:
    """Run a block statement by statement; a comment that shows an exception right under a
    statement (`# torchdoctor.DeviceMismatchError: ...`) says that statement raises it."""
    lines = source.splitlines()
    for node in ast.parse(source).body:
        code = compile(ast.Module([node], []), "<README>", "exec")
        after = lines[node.end_lineno] if node.end_lineno and node.end_lineno < len(lines) else ""
        expected = _RAISES.match(after)
        if expected is None:
            exec(code, names)
            continue
        with pytest.raises(Exception) as raised:
            exec(code, names)
        assert expected.group(1).split(".")[-1] == type(raised.value).__name__


PYTHON_BLOCKS = [b for b in BLOCKS if b.lang == "python"]


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=[_id(b) for b in PYTHON_BLOCKS])
def test_every_python_block_runs(block: Block, namespace: dict[str, Any], tmp_path: Path) -> None:
    if block.section == "Suppressing findings":
        _check_noqa_block(block, tmp_path)
        return
    if "DeviceMismatchError" in block.body:  # the guard example: a model on another device
        namespace["model"].to("meta")
    _run_block(block.body, namespace)
    if "extras" in namespace:  # "load_checkpoint ... returns the extras": here, the epoch
        assert namespace["extras"] == {"epoch": namespace["epoch"]}


def _check_noqa_block(block: Block, tmp_path: Path) -> None:
    """The suppression examples: silent as written, and each comment is what silences."""
    from torchdoctor.cli import main

    source = "import torch\n" + block.body
    bare = re.sub(r"#.*", "", source)
    (tmp_path / "with_noqa.py").write_text(source)
    (tmp_path / "bare.py").write_text(bare)
    args = ["check", "--isolated", "--no-cache", "--select", "TD402"]
    assert main([*args, str(tmp_path / "with_noqa.py")]) == 0
    assert main([*args, str(tmp_path / "bare.py")]) == 1


# -- claims in the text --------------------------------------------------------------------
def _rule_codes(*args: str) -> set[str]:
    result = _run(f"torchdoctor rules --format json {' '.join(args)}", ROOT)
    return {entry["code"] for entry in json.loads(result.stdout)}


def test_rules_lists_every_check_rule_and_all_adds_the_other_codes() -> None:
    static = {code for code, info in catalog().items() if info.kind == "static"}
    assert _rule_codes() == static
    assert _rule_codes("--all") == set(catalog())
