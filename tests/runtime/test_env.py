"""td.env_report() and `torchdoctor env`: the real CPU build and faked GPU machines."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import torchdoctor as td
from torchdoctor.cli import main
from torchdoctor.runtime import env as env_module
from torchdoctor.runtime.env import capability_supported, format_report

from .fakes import clear_device_env, fake_cuda

BLACKWELL = SimpleNamespace(
    name="NVIDIA GeForce RTX 5090", major=12, minor=0, total_memory=32 * 2**30
)
AMPERE = SimpleNamespace(name="NVIDIA A10G", major=8, minor=6, total_memory=24 * 2**30)
CU126_ARCHS = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]


@pytest.fixture(autouse=True)
def _plain_machine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clear_device_env(monkeypatch)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    # no NVIDIA driver unless a test writes one
    monkeypatch.setattr(env_module, "NVIDIA_DRIVER_FILE", tmp_path / "no-driver")
    monkeypatch.setattr(env_module.shutil, "which", lambda name: None)


def test_report_of_this_cpu_machine() -> None:
    report = td.env_report()
    assert report["python"]["version"] == platform.python_version()
    assert report["torch"]["version"] == torch.__version__
    assert report["torch"]["cuda"] == torch.version.cuda
    assert report["cuda"] == {"available": False, "device_count": 0, "arch_list": [], "devices": []}
    assert report["mps"]["available"] is False and report["xpu"]["available"] is False
    assert report["pick_device"] == "cpu"
    assert report["warnings"] == []
    json.dumps(report)  # the --json form must serialise as is


def test_capability_rules() -> None:
    assert capability_supported((8, 9), ["sm_80", "sm_86"])  # same major, newer minor
    assert not capability_supported((8, 0), ["sm_86"])  # older minor: no binary
    assert not capability_supported((12, 0), CU126_ARCHS)
    assert capability_supported((12, 0), ["sm_90", "compute_90"])  # PTX is JIT-compiled
    assert capability_supported((9, 0), ["sm_90a"])
    assert capability_supported((8, 6), []) is None


def test_gpu_the_wheel_has_no_kernels_for(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_cuda(monkeypatch, count=2, properties=[BLACKWELL, AMPERE], arch_list=CU126_ARCHS)
    report = td.env_report(free_memory=True)
    first, second = report["cuda"]["devices"]
    assert first["arch"] == "sm_120" and first["supported"] is False
    assert first["total_memory"] == 32 * 2**30 and first["free_memory"] == 20 * 2**30
    assert second["name"] == "NVIDIA A10G" and second["supported"] is True
    assert report["pick_device"] == "cuda:0"
    [warning] = report["warnings"]
    assert warning.startswith("cuda:0 (NVIDIA GeForce RTX 5090, sm_120) is not supported")
    text = format_report(report)
    assert "cuda:0  NVIDIA GeForce RTX 5090, sm_120 (capability 12.0), 32.0 GiB total" in text
    assert "NOT SUPPORTED by this build" in text and "torch         " in text
    assert "CUDA 12.6" in text


def test_free_memory_is_only_queried_on_request(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_cuda(monkeypatch, count=1)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i: pytest.fail("created a context"))
    assert td.env_report()["cuda"]["devices"][0]["free_memory"] is None


def test_cpu_wheel_on_a_gpu_machine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    driver = tmp_path / "version"
    driver.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22\n")
    monkeypatch.setattr(env_module, "NVIDIA_DRIVER_FILE", driver)
    monkeypatch.setattr(torch.version, "cuda", None)
    report = td.env_report()
    assert report["driver"] == "550.54.14"
    assert any("CPU-only torch build" in w for w in report["warnings"])


def test_driver_too_old_for_the_wheel(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    driver = tmp_path / "version"
    driver.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  470.82.01\n")
    monkeypatch.setattr(env_module, "NVIDIA_DRIVER_FILE", driver)
    monkeypatch.setattr(torch.version, "cuda", "12.6")  # CUDA wheel, and no usable GPU
    warnings = td.env_report()["warnings"]
    assert any("driver 470.82.01 is older than CUDA 12.6 needs (>= 525.60)" in w for w in warnings)
    assert any("no GPU is usable" in w for w in warnings)


def test_hidden_gpus_and_distributed_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.version, "cuda", "12.6")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("LOCAL_RANK", "0")
    report = td.env_report()
    assert report["env"]["CUDA_VISIBLE_DEVICES"] == "" and report["env"]["LOCAL_RANK"] == "0"
    assert "CUDA_VISIBLE_DEVICES='' hides every GPU from this process" in report["warnings"]
    assert "LOCAL_RANK is set but WORLD_SIZE is not: start with torchrun" in report["warnings"]


def test_bad_device_choice_is_reported_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHDOCTOR_DEVICE", "cuda:3")
    report = td.env_report()
    assert report["pick_device"].startswith("error: TORCHDOCTOR_DEVICE asks for 'cuda:3'")
    assert any(w.startswith("td.pick_device() fails here") for w in report["warnings"])


def test_broken_backend_probes_do_not_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_cuda(monkeypatch, count=1)

    def broken(index: int) -> None:
        raise RuntimeError("CUDA error: unknown error")

    monkeypatch.setattr(torch.cuda, "get_device_properties", broken)
    [device] = td.env_report()["cuda"]["devices"]
    assert device == {"index": 0, "device": "cuda:0", "error": "get_device_properties failed"}


def test_cli_text_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["env"]) == 0
    text = capsys.readouterr().out
    assert f"torch         {torch.__version__}" in text and "pick_device   cpu" in text
    assert main(["env", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["torch"]["version"] == torch.__version__ and report["warnings"] == []


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_cli_without_torch_is_a_one_line_error() -> None:
    result = run_python(
        "import sys; sys.modules['torch'] = None\n"
        "from torchdoctor.cli import main; raise SystemExit(main(['env']))"
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("torchdoctor: error: `torchdoctor env` needs PyTorch")


def test_command_module_does_not_import_torch() -> None:
    result = run_python(
        "import sys, torchdoctor.runtime.env_cli, torchdoctor.cli\n"
        "torchdoctor.cli.build_parser()\n"
        "print('torch' in sys.modules)"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_issue_block_builds_on_collect_env_and_adds_torchdoctors_checks(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch.utils.collect_env as collect_env

    monkeypatch.setattr(collect_env, "get_pretty_env_info", lambda: "PyTorch version: 9.9\n")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert main(["env", "--issue"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("<details><summary>") and lines[-1] == "</details>"
    assert "```text" in lines and lines.count("```") == 1
    assert "PyTorch version: 9.9" in out  # PyTorch's own report, not re-collected
    assert f"torchdoctor: {td.__version__}" in out
    assert "LOCAL_RANK=1" in out and "pick_device:" in out and "torchdoctor warnings:" in out


def test_issue_block_says_when_collect_env_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.utils.collect_env as collect_env

    def broken() -> str:
        raise OSError("pip is missing")

    monkeypatch.setattr(collect_env, "get_pretty_env_info", broken)
    assert "collect_env failed: OSError: pip is missing" in env_module.collect_env_text()


def test_json_and_issue_are_exclusive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["env", "--json", "--issue"])
    assert exit_info.value.code == 2
