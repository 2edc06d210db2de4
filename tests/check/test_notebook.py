"""Notebooks: code cells as one module, `cell N` locations, --fix writing the JSON back."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from tests.check.conftest import CLI, write
from torchdoctor.check.notebook import CELL_BREAK, cell_codes, read_notebook, write_notebook


def code_cell(source: list[str], outputs: list[Any] | None = None, count: int = 1) -> Any:
    return {
        "cell_type": "code",
        "execution_count": count,
        "id": f"cell-{count}",
        "metadata": {"scrolled": True},
        "outputs": outputs or [],
        "source": source,
    }


def notebook() -> dict[str, Any]:
    return {
        "cells": [
            {"cell_type": "markdown", "id": "md", "metadata": {}, "source": ["# Träining\n"]},
            code_cell(["%matplotlib inline\n", "import torch\n", "!pip install -q tqdm\n"]),
            code_cell(
                ["torch.load?\n", 'state = torch.load("ckpt.pt")\n', "print(state)"],
                outputs=[
                    {
                        "name": "stdout",
                        "output_type": "stream",
                        "text": ["{'w': tensor([1.])}\n"],
                    },
                    {
                        "data": {"image/png": "iVBORw0KGgo=", "text/plain": ["<Figure>"]},
                        "metadata": {"needs_background": "light"},
                        "output_type": "display_data",
                    },
                ],
                count=2,
            ),
            code_cell(["%%bash\n", 'x = torch.load("not python? not checked")\n'], count=3),
            code_cell(
                [
                    "for path in paths:\n",
                    "    %time w = torch.load(path)\n",
                    "    w = torch.load(path)\n",
                ],
                count=4,
            ),
            {"cell_type": "raw", "id": "raw", "metadata": {}, "source": "torch.load('raw')"},
        ],
        "metadata": {
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python", "version": "3.11.7"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def nbformat_text(data: dict[str, Any]) -> str:
    """How Jupyter writes a notebook (nbformat.writes: indent 1, sorted keys, raw UTF-8)."""
    return json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def test_virtual_module_keeps_line_numbers_and_blanks_ipython_syntax() -> None:
    nb = read_notebook(nbformat_text(notebook()))
    lines = nb.source.split("\n")
    # a cell's final newline gives it an empty last line, as in the cell itself
    assert lines[:5] == ["pass", "import torch", "pass", "", CELL_BREAK]
    assert lines[5:9] == ["pass", 'state = torch.load("ckpt.pt")', "print(state)", CELL_BREAK]
    assert lines[9:13] == ["", "", "", CELL_BREAK]  # the %%bash cell, blanked whole
    assert lines[13:18] == [
        "for path in paths:",
        "    pass",
        "    w = torch.load(path)",
        "",
        CELL_BREAK,
    ]
    # virtual line -> (cell number counting every cell, line in that cell)
    assert nb.cell_lines[6] == (3, 2)
    assert nb.cell_lines[15] == (5, 3)
    # unchanged code gives back each cell's exact source
    assert cell_codes(nb, nb.source) == [c.code for c in nb.cells]


def test_valid_python_cells_are_not_touched() -> None:
    data = notebook()
    data["cells"] = [code_cell(["total = (a\n", "         % b)\n"])]
    nb = read_notebook(json.dumps(data))
    assert nb.source == f"total = (a\n         % b)\n\n{CELL_BREAK}\n"


def test_findings_report_cell_and_line(td: CLI, project: Path) -> None:
    write(project / "train.ipynb", nbformat_text(notebook()))
    run = td("check", "--select", "TD402", "--no-cache", "train.ipynb")
    assert run.code == 1
    lines = run.out.splitlines()
    assert lines[0].startswith("train.ipynb:cell 3:2:9: TD402 ")
    assert lines[2] == '2 | state = torch.load("ckpt.pt")'
    assert any(line.startswith("train.ipynb:cell 5:3:9: TD402 ") for line in lines)
    assert "3 |     w = torch.load(path)" in lines
    items = json.loads(
        td("check", "--select", "TD402", "--no-cache", "--format", "json", "train.ipynb").out
    )
    assert [(i["cell"], i["line"], i["column"]) for i in items] == [(3, 2, 9), (5, 3, 9)]
    assert items[0]["fix"]["edits"][0]["location"] == {"row": 2, "column": 29}
    github = td("check", "--select", "TD402", "--no-cache", "--format", "github", "train.ipynb")
    assert github.out.splitlines()[0].startswith(
        "::warning file=train.ipynb,title=TD402::cell 3, line 2, column 9: `torch.load`"
    )


def test_fix_writes_only_the_changed_cells_back(td: CLI, project: Path) -> None:
    original = notebook()
    path = write(project / "train.ipynb", nbformat_text(original))
    before = path.read_text(encoding="utf-8")
    run = td("check", "--select", "TD402", "--no-cache", "--fix", "train.ipynb")
    assert run.code == 0, run.out
    assert "Fixed 2 findings." in run.out
    after = path.read_text(encoding="utf-8")

    expected = copy.deepcopy(original)
    expected["cells"][2]["source"][1] = 'state = torch.load("ckpt.pt", map_location="cpu")\n'
    expected["cells"][4]["source"][2] = '    w = torch.load(path, map_location="cpu")\n'
    assert json.loads(after) == expected  # outputs, metadata, magics, other cells intact
    # byte for byte the layout Jupyter writes: only the two fixed lines differ
    changed = [
        (a, b) for a, b in zip(before.splitlines(), after.splitlines(), strict=True) if a != b
    ]
    assert changed == [
        ('    "state = torch.load(\\"ckpt.pt\\")\\n",',
         '    "state = torch.load(\\"ckpt.pt\\", map_location=\\"cpu\\")\\n",'),
        ('    "    w = torch.load(path)\\n"',
         '    "    w = torch.load(path, map_location=\\"cpu\\")\\n"'),
    ]  # fmt: skip
    assert not list(project.glob(".train.ipynb.*"))  # no temp file left behind
    again = td("check", "--select", "TD402", "--no-cache", "train.ipynb")
    assert again.code == 0


def test_diff_shows_cells_and_writes_nothing(td: CLI, project: Path) -> None:
    path = write(project / "train.ipynb", nbformat_text(notebook()))
    before = path.read_bytes()
    run = td("check", "--select", "TD402", "--no-cache", "--diff", "train.ipynb")
    assert run.code == 1
    assert "--- a/train.ipynb:cell 3\n+++ b/train.ipynb:cell 3\n" in run.out
    assert '+state = torch.load("ckpt.pt", map_location="cpu")\n' in run.out
    assert "--- a/train.ipynb:cell 5\n" in run.out
    assert path.read_bytes() == before


def test_broken_notebook_is_td001_and_the_run_goes_on(td: CLI, project: Path) -> None:
    write(project / "broken.ipynb", '{"cells": [')
    write(project / "not_a_notebook.ipynb", "[1, 2]")
    write(project / "a.py", "import torch\ntorch.load('x')\n")
    run = td("check", "--select", "TD402", "--no-cache", "--format", "concise", ".")
    assert run.code == 1
    out = run.out.splitlines()
    assert out[0] == "a.py:2:1: " + out[0].split(": ", 1)[1]
    assert any(line.startswith("broken.ipynb:1:1: TD001 not valid notebook JSON") for line in out)
    assert any(line.startswith("not_a_notebook.ipynb:1:1: TD001 not a Jupyter") for line in out)


def test_syntax_error_in_a_cell_points_at_the_cell(td: CLI, project: Path) -> None:
    data = notebook()
    data["cells"][4]["source"] = ["def f(:\n", "    pass\n"]
    write(project / "nb.ipynb", json.dumps(data))
    run = td("check", "--no-cache", "--format", "concise", "nb.ipynb")
    assert "nb.ipynb:cell 5:1:7: TD001 SyntaxError" in run.out


def test_automagic_shell_lines_are_blanked() -> None:
    # IPython runs `ls -l`, `cd dir`, `pip install x` without their `%` (automagic)
    data = notebook()
    data["cells"] = [
        code_cell(["cd ../code\n", "ls -al /tmp/data/\n", "import torch\n", "rm -r {out}\n"]),
        code_cell(["ls = [1]\n", "cat = ls + [2]\n", "pwd\n"]),  # Python: kept
    ]
    nb = read_notebook(json.dumps(data))
    assert [c.lines for c in nb.cells] == [
        ["pass", "pass", "import torch", "pass", ""],
        ["ls = [1]", "cat = ls + [2]", "pwd", ""],
    ]
    assert nb.broken == []


def test_a_cell_that_is_not_python_is_left_out_and_the_others_checked(
    td: CLI, project: Path
) -> None:
    # Jupyter compiles each cell apart: a citation cell or an exercise's `lr = ` fails
    # alone, and the notebook's other cells still run (and are checked)
    data = notebook()
    data["cells"] = [
        code_cell(["import torch\n", 'state = torch.load("a.pt")\n'], count=1),
        code_cell(["@manual{Intro1,\n", " title={Molecular Fingerprints},\n", "}\n"], count=2),
        code_cell(["lr = \n"], count=3),
        code_cell(['w = torch.load("b.pt")\n'], count=4),
    ]
    nb = read_notebook(json.dumps(data))
    # what such a cell may bind is unknown after it (not unbound)
    assert [c.lines for c in nb.cells][1:3] == [
        ["title = object()", "", "", ""],
        ["lr = object()", ""],
    ]
    assert nb.broken == [
        (6, 9, "invalid syntax. Perhaps you forgot a comma?"),
        (10, 6, "invalid syntax"),
    ]
    path = write(project / "cells.ipynb", json.dumps(data, indent=1) + "\n")
    run = td("check", "--select", "TD402", "--no-cache", "--format", "concise", path.name)
    assert run.out.splitlines()[:4] == [
        "cells.ipynb:cell 1:2:9: TD402 `torch.load` without `map_location` restores tensors "
        "onto the device they were saved from; it fails on a machine without that GPU",
        "cells.ipynb:cell 2:2:9: TD001 SyntaxError: invalid syntax. Perhaps you forgot a comma?; "
        "the cell was not checked",
        "cells.ipynb:cell 3:1:6: TD001 SyntaxError: invalid syntax; the cell was not checked",
        "cells.ipynb:cell 4:1:5: TD402 `torch.load` without `map_location` restores tensors "
        "onto the device they were saved from; it fails on a machine without that GPU",
    ]
    # fixes go into the cells checked; the others come back as they were
    assert td("check", "--select", "TD402", "--no-cache", "--fix", path.name).code == 1
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    assert cells[1:3] == data["cells"][1:3]
    assert cells[3]["source"] == ['w = torch.load("b.pt", map_location="cpu")\n']


def test_a_left_out_cell_keeps_its_imports() -> None:
    # the modules a cell that does not parse imports stay modules; what else it binds or
    # uses the attributes of becomes unknown, but not a module imported before it
    data = notebook()
    data["cells"] = [
        code_cell(["import numpy as np\n"], count=1),
        code_cell(
            [
                "import torch\n",
                "from torch import nn as layers\n",
                "# TODO: build the model\n",
                "model = \n",
                "np.random.seed(0)\n",
                "net.cuda()\n",
                "import os; lr = \n",
            ],
            count=2,
        ),
    ]
    nb = read_notebook(json.dumps(data))
    assert nb.cells[1].lines == [
        "import torch",
        "from torch import nn as layers",
        "lr = model = net = os = object()",
        "",
        "",
        "",
        "",
        "",
    ]


def test_write_notebook_keeps_string_sources_and_minified_layout() -> None:
    data = {
        "cells": [{"cell_type": "code", "metadata": {}, "outputs": [], "source": "a = 1\nb = 2"}],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    nb = read_notebook(json.dumps(data))
    text = write_notebook(nb, nb.source.replace("b = 2", "b = 3"))
    assert json.loads(text)["cells"][0]["source"] == "a = 1\nb = 3"
    assert "\n" not in text  # written as compactly as it was read


def test_messages_cite_other_lines_as_cells(td: CLI, project: Path) -> None:
    data = notebook()
    data["cells"] = [
        code_cell(["from torch.utils.data import DataLoader\n"], count=1),
        code_cell(["loader = DataLoader(ds, batch_size=8)\n", "model.to(device)\n"], count=2),
        code_cell(["for x, y in loader:\n", "    x.to(device)\n", "    out = model(x)\n"], count=3),
    ]
    write(project / "loop.ipynb", nbformat_text(data))
    run = td("check", "--select", "TD102,TD112", "--no-cache", "--format", "concise", "loop.ipynb")
    td102, td112 = run.out.splitlines()[:2]
    assert td102.startswith("loop.ipynb:cell 3:2:5: TD102 ")
    assert td102.endswith("(a batch from `loader` (cell 2:1))")
    assert "(cell 2:1)" in td112 and "at cell 3:2 was dropped" in td112
    assert "moved to `device` at cell 2:2" in td112 and "line " not in td112


def test_python_cell_magics_blank_only_their_magic_line(td: CLI, project: Path) -> None:
    data = notebook()
    data["cells"] = [
        code_cell(["%%time\n", "import torch\n", 'state = torch.load("a.pt")\n'], count=1),
        code_cell(["%%capture out\n", "%pip list\n", 'w = torch.load("b.pt")\n'], count=2),
        code_cell(["%%bash\n", 'w = torch.load("shell, not python")\n'], count=3),
        code_cell(["%%writefile train.py\n", 'w = torch.load("file text")\n'], count=4),
    ]
    nb = read_notebook(json.dumps(data))
    assert [c.lines for c in nb.cells] == [
        ["", "import torch", 'state = torch.load("a.pt")', ""],
        ["", "pass", 'w = torch.load("b.pt")', ""],
        ["", "", ""],
        ["", "", ""],
    ]
    path = write(project / "magics.ipynb", json.dumps(data, indent=1) + "\n")
    run = td("check", "--select", "TD402", "--no-cache", "--format", "json", path.name)
    found = [(i["cell"], i["line"]) for i in json.loads(run.out)]
    assert found == [(1, 3), (2, 3)]
    # the fixes go into the bodies; the magic lines come back as they were
    assert td("check", "--select", "TD402", "--no-cache", "--fix", path.name).code == 0
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    assert cells[0]["source"] == [
        "%%time\n",
        "import torch\n",
        'state = torch.load("a.pt", map_location="cpu")\n',
    ]
    assert cells[1]["source"][:2] == ["%%capture out\n", "%pip list\n"]
    assert cells[2:] == data["cells"][2:]


def test_a_shell_line_continued_by_a_backslash_is_blanked_whole(td: CLI, project: Path) -> None:
    # IPython joins `!cmd \` and the lines it continues into one shell command
    data = notebook()
    data["cells"] = [
        code_cell(
            [
                "! wget https://example.org/key.pub && \\\n",
                "    apt-key add key.pub\n",
                "import torch\n",
                'state = torch.load("a.pt")\n',
            ],
            count=1,
        ),
    ]
    nb = read_notebook(json.dumps(data))
    assert nb.cells[0].lines == ["pass", "", "import torch", 'state = torch.load("a.pt")', ""]
    path = write(project / "shell.ipynb", json.dumps(data, indent=1) + "\n")
    run = td("check", "--select", "TD402", "--no-cache", "--format", "json", path.name)
    assert [(i["cell"], i["line"]) for i in json.loads(run.out)] == [(1, 4)]
    assert td("check", "--select", "TD402", "--no-cache", "--fix", path.name).code == 0
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    assert cells[0]["source"][:2] == data["cells"][0]["source"][:2]


def test_malformed_cells_are_warned_about_by_number(td: CLI, project: Path) -> None:
    data = notebook()
    data["cells"] = [
        code_cell(["import torch\n"], count=1),
        ["not", "a", "cell"],
        {"source": "torch.load('x')", "metadata": {}},
        {"cell_type": "code", "metadata": {}, "outputs": []},
        code_cell(5, count=5),  # type: ignore[arg-type]
        {"cell_type": "kode", "source": "x = 1"},
        code_cell(['state = torch.load("a.pt")\n'], count=7),
    ]
    path = write(project / "odd.ipynb", json.dumps(data))
    run = td("check", "--select", "TD402", "--no-cache", "--format", "json", path.name)
    assert run.code == 1
    # the good cells are still checked
    assert [(i["cell"], i["line"]) for i in json.loads(run.out)] == [(7, 1)]
    assert run.err.splitlines() == [
        f"torchdoctor: warning: {path.name}: cell 2 is a JSON list, not an object; not checked",
        f"torchdoctor: warning: {path.name}: cell 3 has no cell_type; not checked",
        f"torchdoctor: warning: {path.name}: cell 4 has no 'source'; not checked",
        f"torchdoctor: warning: {path.name}: cell 5 has a 'source' that is neither text "
        "nor a list of lines; not checked",
        f"torchdoctor: warning: {path.name}: cell 6 has an unknown cell_type 'kode'; not checked",
    ]
    # --fix leaves the malformed cells exactly as they were
    assert td("check", "--select", "TD402", "--no-cache", "--fix", path.name).code == 0
    written = json.loads(path.read_text(encoding="utf-8"))["cells"]
    assert written[1:6] == data["cells"][1:6]


def test_td402_quiet_on_files_an_earlier_cell_wrote(td: CLI, project: Path) -> None:
    """A notebook runs top to bottom in one session: what an earlier cell's checkpoint
    handler or torch.save wrote is read back on the same machine."""
    cells = [
        ["import torch\n", "from ignite.handlers import ModelCheckpoint, DiskSaver\n"],
        ["net = net.to(device)\n"],
        ['run_dir = "/tmp/runs/" + stamp\n', "saver = DiskSaver(dirname=run_dir)\n"],
        ['keeper = ModelCheckpoint("./checkpoints", "net", n_saved=2)\n'],
        ['torch.save(net.state_dict(), "weights/last.pt")\n'],
        ['best = torch.load(run_dir + "/model.pt")\n'],  # good: the handler's folder
        ['last_path = "checkpoints/net_model_3.pt"\n', "last = torch.load(last_path)\n"],  # good
        ['again = torch.load("weights/last.pt")\n'],  # good: torch.save above
        ['other = torch.load("weights/pretrained.pt")\n'],  # bad: not written here
        ['early = torch.load("later/model.pt")\n', 'torch.save(net, "later/model.pt")\n'],  # bad
        [
            "def train(model, epochs, save_path):\n",
            "    torch.save(model.state_dict(), save_path)\n",
        ],
        ['train(net, 3, "best.pt")\n', 'net.load_state_dict(torch.load("best.pt"))\n'],  # good
        ['train(net, 3, save_path="kw.pt")\n', 'kw = torch.load("kw.pt")\n'],  # good
        ['fetch(net, 3, "hub.pt")\n', 'hub = torch.load("hub.pt")\n'],  # bad: saves nothing
    ]
    data = notebook()
    data["cells"] = [code_cell(c, count=n + 1) for n, c in enumerate(cells)]
    write(project / "train.ipynb", nbformat_text(data))
    items = json.loads(
        td("check", "--select", "TD402", "--no-cache", "--format", "json", "train.ipynb").out
    )
    assert [(i["cell"], i["line"]) for i in items] == [(9, 1), (10, 1), (14, 2)]
