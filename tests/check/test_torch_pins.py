"""The torch versions a project's dependency files allow (torch_pins.py, pin_files.py,
setup_requirements.py), and `check` reading them when no target version is set."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from torchdoctor.check.config import Settings
from torchdoctor.check.engine import RunOptions
from torchdoctor.check.pin_files import requirement_bounds
from torchdoctor.check.runner import run_check
from torchdoctor.check.setup_requirements import setup_py_requirements
from torchdoctor.check.torch_pins import PinsFinder, TorchCeiling

AMP = "import torch\nscaler = torch.cuda.amp.GradScaler()\n"


def _newest(requirement: str) -> tuple[int, int] | None:
    bounds = list(requirement_bounds(requirement, "x"))
    assert len(bounds) == 1
    return None if bounds[0] is None else bounds[0][0]


@pytest.mark.parametrize(
    ("requirement", "newest"),
    [
        ("torch>=1.10,<2", (1, 999)),
        ("torch<2.4", (2, 3)),
        ("torch<=2.4", (2, 4)),
        ("torch<2.4.1", (2, 4)),
        ("torch<2.4.0rc1", (2, 3)),
        ("torch==2.3.1+cu118", (2, 3)),
        ("torch==1.10.*", (1, 10)),
        ("torch~=2.5.0", (2, 5)),
        ("torch~=1.10", (1, 999)),
        ("Torch >= 1.9 ; python_version < '3.12'", None),
        ("torch", None),
        ("torch!=2.0.1", None),
        (
            "torch @ https://download.pytorch.org/whl/cu118/torch-2.0.1%2Bcu118-cp310-linux_x86_64.whl",
            (2, 0),
        ),
        ("torch @ git+https://github.com/pytorch/pytorch", None),
        ("torch >= 1.9 <2", None),  # not PEP 508: we cannot read it, so it may be any torch
    ],
)
def test_requirement_bounds(requirement: str, newest: tuple[int, int] | None) -> None:
    assert _newest(requirement) == newest


def test_other_packages_are_not_torch() -> None:
    assert list(requirement_bounds("torchvision<0.10", "x")) == []
    assert list(requirement_bounds("pytorch-lightning<1.5", "x")) == []


def test_ceiling_allows() -> None:
    assert TorchCeiling((1, 999)).allows_at_least(1, 10)
    assert not TorchCeiling((1, 999)).allows_at_least(2, 0)
    assert TorchCeiling((2, 4)).allows_at_least(2, 4)
    assert not TorchCeiling((2, 3)).allows_at_least(2, 4)


def _setup(body: str) -> tuple[list[str], list[str]] | None:
    return setup_py_requirements(textwrap.dedent(body))


def test_setup_py_literal_and_bound_lists() -> None:
    assert _setup('setup(install_requires=["torch<2"])') == (["torch<2"], [])
    found = _setup(
        """
        reqs = ["numpy"]
        reqs += ["torch<2"]
        reqs.append("tqdm")
        extras = {"dev": ["pytest"]}
        extras["all"] = sorted(set(d for ds in extras.values() for d in ds))
        setuptools.setup(install_requires=reqs, extras_require=extras)
        """
    )
    assert found is not None
    assert sorted(found[0]) == ["numpy", "pytest", "torch<2", "tqdm"]


def test_setup_py_read_from_requirements_files() -> None:
    assert _setup(
        """
        with open("requirements.txt") as f:
            reqs = f.read().splitlines()
        setup(install_requires=reqs)
        """
    ) == ([], ["requirements.txt"])
    assert _setup(
        """
        def load(name="requirements/base.txt"):
            return [line.strip() for line in open(name)]
        setup(install_requires=load())
        """
    ) == ([], ["requirements/base.txt"])


def test_setup_py_computed_versions() -> None:
    # a version we cannot know is any version; a function's list is read too
    assert _setup('setup(install_requires=[f"torch>={V}", f"numpy=={N}"])') == (
        ["torch>=*", "numpy==*"],
        [],
    )
    assert _setup('def main():\n    r = ["torch<2"]\n    setup(install_requires=r)') == (
        ["torch<2"],
        [],
    )


def test_setup_py_unknown() -> None:
    assert _setup("from deps import REQS\nsetup(install_requires=REQS)") is None
    assert _setup("setup(install_requires=compute())") is None
    assert _setup("setup(**config)") is None
    assert _setup("setup(name='x')") == ([], [])


def _project(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp_path


def _ceiling(root: Path, file: str = "pkg/a.py") -> tuple[int, int] | None:
    found = PinsFinder().ceiling_for(str(root / file))
    return None if found is None else found.newest


def test_setup_py_reads_requirements_file(tmp_path: Path) -> None:
    root = _project(
        tmp_path,
        {
            "setup.py": "setup(install_requires=open('requirements.txt').read().split())",
            "requirements.txt": "-r base.txt\n",
            "base.txt": "torch>=1.8,<1.13 --hash=sha256:abc\n",
            "pkg/a.py": "",
        },
    )
    assert _ceiling(root) == (1, 12)


def test_every_declaration_counts(tmp_path: Path) -> None:
    # a package that allows any newer torch, developed on a pinned one: any newer torch
    root = _project(
        tmp_path,
        {
            "pyproject.toml": '[project]\nname = "p"\ndependencies = ["torch>=2.0"]\n',
            "requirements-dev.txt": "torch==2.3.1\n",
            "pkg/a.py": "",
        },
    )
    assert _ceiling(root) is None
    (root / "pyproject.toml").write_text('[project]\nname = "p"\ndependencies = ["torch<2.5"]\n')
    assert _ceiling(root) == (2, 4)


@pytest.mark.parametrize(
    ("files", "newest"),
    [
        ({"pyproject.toml": '[tool.poetry.dependencies]\ntorch = "^1.10"\n'}, (1, 999)),
        ({"pyproject.toml": '[tool.poetry.dependencies]\ntorch = {version = "~2.2"}\n'}, (2, 2)),
        ({"pyproject.toml": '[tool.poetry.dependencies]\ntorch = {git = "https://x"}\n'}, None),
        ({"pyproject.toml": '[project.optional-dependencies]\ngpu = ["torch<2.1"]\n'}, (2, 0)),
        ({"setup.cfg": "[options]\ninstall_requires =\n    numpy\n    torch<=1.13.1\n"}, (1, 13)),
        ({"environment.yml": "dependencies:\n  - pytorch=1.10.0=py3.8_cuda11\n"}, (1, 10)),
        ({"environment.yml": "dependencies:\n  - pytorch>=1.8,<2\n"}, (1, 999)),
        ({"environment.yml": "dependencies:\n  - pip:\n    - torch==2.1.0\n"}, (2, 1)),
        ({"requirements.txt": "numpy\n"}, None),
        ({"setup.py": 'setup(install_requires=["torch<2", f"torch>={MIN}"])'}, None),
        ({"requirements.txt": "-r missing.txt\ntorch<2\n"}, (1, 999)),
        ({"setup.py": "setup(install_requires=get())", "requirements.txt": "torch<2"}, None),
    ],
)
def test_dependency_files(
    tmp_path: Path, files: dict[str, str], newest: tuple[int, int] | None
) -> None:
    assert _ceiling(_project(tmp_path, {**files, "pkg/a.py": ""})) == newest


def test_the_nearest_project_decides(tmp_path: Path) -> None:
    root = _project(
        tmp_path,
        {
            "setup.py": 'setup(install_requires=["torch<2"])',
            "pkg/a.py": "",
            "examples/new/requirements.txt": "torch>=2.4\n",
            "examples/new/b.py": "",
        },
    )
    assert _ceiling(root) == (1, 999)
    assert _ceiling(root, "examples/new/b.py") is None


def test_check_reads_the_pins_and_caches_by_them(tmp_path: Path) -> None:
    root = _project(tmp_path, {"setup.py": 'setup(install_requires=["torch<2"])', "a.py": AMP})
    settings = Settings(root=root)
    options = RunOptions(enabled=frozenset({"TD601"}))

    def codes(options: RunOptions = options) -> list[str]:
        results = run_check([root / "a.py"], settings, options, jobs=1)
        return [f.code for r in results for f in r.findings]

    assert codes() == []
    # the explicit setting wins over the pins
    assert codes(RunOptions(enabled=frozenset({"TD601"}), target_version=(2, 4))) == ["TD601"]
    (root / "setup.py").write_text('setup(install_requires=["torch>=1.10"])')
    assert codes() == ["TD601"]  # the cached result of the pinned project is not reused
