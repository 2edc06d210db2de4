"""The knowledge base: every entry is valid, and its example messages classify to it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from torchdoctor.explain import kb
from torchdoctor.explain.explainer import CHECKLIST, explain

# The rule catalogue of shared/DESIGN.md (static and runtime codes).
KNOWN_CODES = {
    *(f"TD{n}" for n in range(101, 111)),
    "TD112",
    "TD120",
    *(f"TD{n}" for n in range(201, 215)),
    "TD301",
    "TD302",
    "TD303",
    "TD401",
    "TD402",
    "TD403",
    "TD404",
    "TD501",
    "TD502",
    *(f"TD{n}" for n in range(601, 607)),
    "TD217",  # non-finite-value (runtime/nonfinite.py)
}

ENTRIES = kb.entries()
EXAMPLES = [(entry.id, example) for entry in ENTRIES for example in entry.examples]


def test_at_least_forty_entries_covering_every_topic() -> None:
    assert len(ENTRIES) >= 40
    assert {entry.topic for entry in ENTRIES} == set(kb.TOPICS)


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.id)
def test_entry_is_complete(entry: kb.Entry) -> None:
    assert entry.examples, "every entry carries real example messages"
    assert entry.causes and entry.fixes
    assert set(entry.codes) <= KNOWN_CODES


@pytest.mark.parametrize(("entry_id", "message"), EXAMPLES)
def test_example_classifies_to_its_entry(entry_id: str, message: str) -> None:
    explanation = explain(message)
    assert explanation.known
    assert explanation.id == entry_id


def test_bad_entries_are_rejected() -> None:
    good = {
        "id": "x",
        "topic": "device",
        "title": "t",
        "summary": "s",
        "patterns": ["a"],
        "causes": [{"text": "c", "codes": ["TD101"]}],
        "fixes": [{"text": "f"}],
    }
    assert kb.parse_entry("x", good).id == "x"
    for broken in (
        {**good, "id": "y"},
        {**good, "topic": "weather"},
        {**good, "patterns": ["(unclosed"]},
        {**good, "causes": [{"text": "c", "codes": ["X1"]}]},
        {**good, "fixes": []},
    ):
        with pytest.raises(kb.KnowledgeBaseError):
            kb.parse_entry("x", broken)


def test_facts_from_the_new_cuda_wording() -> None:
    explanation = explain(
        "RuntimeError: Expected all tensors to be on the same device, but found at least two "
        "devices, cuda:0 and cpu! (when checking argument for argument mat1 in method "
        "wrapper_CUDA_addmm)"
    )
    assert explanation.id == "device-mismatch"
    assert explanation.code == "TD112"
    assert explanation.facts["devices"] == ["cuda:0", "cpu"]
    assert explanation.facts["op"] == "addmm"
    assert explanation.facts["argument"] == "mat1"


def test_direction_of_input_weight_message_ranks_the_causes() -> None:
    cpu_input = explain(
        "Input type (torch.FloatTensor) and weight type (torch.cuda.FloatTensor) should be the same"
    )
    gpu_input = explain(
        "Input type (torch.cuda.FloatTensor) and weight type (torch.FloatTensor) should be the same"
    )
    assert cpu_input.code == "TD112"
    assert gpu_input.code == "TD105"
    assert all("TD112" not in cause.codes for cause in gpu_input.causes)


def test_unknown_text_gives_the_checklist_not_a_guess() -> None:
    explanation = explain("ZeroDivisionError: division by zero")
    assert not explanation.known
    assert explanation.code is None and not explanation.causes
    report = str(explanation)
    assert "not in the knowledge base" in report
    assert all(item in report for item in CHECKLIST)
    assert explanation.as_dict()["checklist"] == list(CHECKLIST)


SITE = "/opt/venv/lib/python3.11/site-packages/torch/nn/modules"


def test_pasted_traceback_uses_the_last_exception_and_the_user_frame() -> None:
    text = "\n".join(
        [
            "Traceback (most recent call last):",
            '  File "/home/me/project/train.py", line 42, in <module>',
            "    loss = criterion(model(x), y)",
            f'  File "{SITE}/module.py", line 1518, in _wrapped_call_impl',
            "    return self._call_impl(*args, **kwargs)",
            f'  File "{SITE}/conv.py", line 456, in _conv_forward',
            "    return F.conv2d(input, weight, bias, self.stride,",
            "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
            "RuntimeError: Input type (torch.cuda.HalfTensor) and weight type "
            "(torch.cuda.FloatTensor) should be the same",
        ]
    )
    explanation = explain(text)
    assert explanation.id == "input-weight-dtype"
    assert explanation.frame is not None
    assert (explanation.frame.filename, explanation.frame.lineno) == (
        "/home/me/project/train.py",
        42,
    )
    assert explanation.frame.source == "loss = criterion(model(x), y)"


def test_chained_traceback_falls_back_to_the_earlier_exception() -> None:
    text = "\n".join(
        [
            "Traceback (most recent call last):",
            '  File "load.py", line 3, in <module>',
            "    state = torch.load(path)",
            "RuntimeError: Attempting to deserialize object on a CUDA device but "
            "torch.cuda.is_available() is False. If you are running on a CPU-only machine, "
            "please use torch.load with map_location=torch.device('cpu') to map your storages "
            "to the CPU.",
            "",
            "During handling of the above exception, another exception occurred:",
            "",
            "Traceback (most recent call last):",
            '  File "load.py", line 5, in <module>',
            '    raise SystemError("could not load the model")',
            "SystemError: could not load the model",
        ]
    )
    explanation = explain(text)
    assert explanation.id == "load-cuda-on-cpu-only"
    assert explanation.code == "TD402"


def test_text_explanations_never_import_torch() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from torchdoctor.cli import main\n"
        "rc = main(['explain', 'RuntimeError: Torch not compiled with CUDA enabled'])\n"
        "assert rc == 0, rc\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "TD101" in done.stdout
