"""The cheap prefilters in analysis/names.py must keep every name the full word tests accept."""

from __future__ import annotations

import re
from pathlib import Path

from torchdoctor.check.analysis.grad_contexts import mentions_zeroing
from torchdoctor.check.analysis.names import (
    _EVAL_DATA_WORDS,
    _EVALISH_PIECES,
    _MODELISH_PIECES,
    EVAL_WORDS,
    _evalish_identifier,
    _lines_with,
    _modelish_word,
)
from torchdoctor.check.analysis.project_facts import build_project
from torchdoctor.check.analysis.unbound import _declares


def _identifiers() -> set[str]:
    names = set()
    for path in (Path(__file__).parent / "fixtures").rglob("*.py"):
        names |= set(re.findall(r"[A-Za-z_]\w*", path.read_text(encoding="utf-8")))
    for word in EVAL_WORDS | _EVAL_DATA_WORDS:
        names |= {word, word.upper(), f"run_{word}", f"{word.capitalize()}Loader", f"x{word}y"}
    names |= {"G", "d", "netD", "policy_net", "ResNet50", "model_ema", "MyEncoder", "critic2"}
    return names


def test_prefilters_keep_every_eval_and_model_name() -> None:
    names = _identifiers()
    joined = "\n".join(sorted(names))
    evalish = _lines_with(_EVALISH_PIECES, joined)
    modelish = _lines_with(_MODELISH_PIECES, joined) | (names & {"G", "D"})
    assert {n for n in names if _evalish_identifier(n)} <= evalish
    assert {n for n in names if _modelish_word(n)} <= modelish
    # and they do filter: most names are neither
    assert len(evalish | modelish) < len(names) / 2


def test_prefilter_on_names_whose_lower_case_is_longer() -> None:
    names = "İval\nx\nvalidate\nmodel_İ"  # "İ".lower() is two characters
    assert _lines_with(_EVALISH_PIECES, names) == {"İval", "validate"}
    assert _lines_with(_MODELISH_PIECES, names) == {"model_İ"}


def test_holds_answers_as_a_plain_substring_test() -> None:
    """FileContext.holds looks for word needles among the file's words first: it must
    answer exactly `needle in source`, for every trigger of every rule and odd needles."""
    import ast

    from torchdoctor.check.context import FileContext
    from torchdoctor.check.registry import rule_classes

    odd = '3d_conv = éval_x + model.to(dev)[0] # "cuda:0" x.cuda.amp\nnet2.forward(y)\n'
    sources = [odd, "x = 1\n"]
    sources += [
        p.read_text(encoding="utf-8") for p in (Path(__file__).parent / "fixtures").glob("*.py")
    ]
    needles = {t for rule in rule_classes() for t in rule.triggers}
    needles |= {"d_conv", "conv", "val", "éval", "3d", "[0]", "to(", "cuda:0", "amp\nnet", "2.f"}
    checked = 0
    for source in sources:
        # (holds reads only the text: the odd source need not parse)
        ctx = FileContext("x.py", source, ast.parse(""), build_project([]))
        for needle in needles:
            assert ctx.holds(needle) == (needle in source), (needle, source[:60])
            checked += needle in source
    assert checked > 100  # most answers above were yes: the test sees both kinds


def _fixture_texts() -> list[str]:
    return [
        p.read_text(encoding="utf-8") for p in (Path(__file__).parent / "fixtures").rglob("*.py")
    ]


# The single pattern `mentions_zeroing` was first written as; split for speed, it must
# answer the same on every text.
_ZEROING_AS_ONE = re.compile(
    r"zero_grad|\.grad\s*=\s*None|\.grad(?:\.data)?\.(?:zero_|fill_|mul_|detach_)|"
    r"_foreach_zero_|set_to_none|del\s+\S+\.grad\b"
)


def test_mentions_zeroing_answers_as_the_single_pattern() -> None:
    texts = [
        *_fixture_texts(),
        "p.grad = None",
        "p.grad   =None",
        "p.grad.data.zero_()",
        "p.grad.mul_(0)",
        "p.grad.detach_()",
        "del p.grad",
        "del\tlayer.weight.grad",
        "del p.gradient",
        "p.grad.add_(1)",
        "torch.zeros(3)",
        "torch._foreach_zero_(grads)",
        "opt.zero_grad(set_to_none=True)",
        "x = p.grad\n",
        "",
    ]
    assert any(not mentions_zeroing(t) and ".grad" in t for t in texts)
    for text in texts:
        assert mentions_zeroing(text) == bool(_ZEROING_AS_ONE.search(text)), text


_DECLARATION_AS_ONE = re.compile(r"(?:^|[;:])[ \t]*(?:global|nonlocal)[ \t]", re.MULTILINE)


def test_declares_answers_as_the_single_pattern() -> None:
    texts = [
        *_fixture_texts(),
        "def f():\n    global x\n",
        "global x",
        "if a: global x",
        "a = 1; nonlocal_thing = 2",
        "a = 1;\tnonlocal y",
        "# the global minimum\n",
        "x = 'global y'\n",
        "xglobal y",
        "b global x; c",
        "def f():\n    nonlocal\tn\n",
        "globally speaking",
        "",
    ]
    assert any(not _declares(t) and "global " in t for t in texts)
    for text in texts:
        assert _declares(text) == bool(_DECLARATION_AS_ONE.search(text)), text
