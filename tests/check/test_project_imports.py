"""Which file an import in another file can name (cross-file call facts use it)."""

from __future__ import annotations

import pytest

from torchdoctor.check.project import may_name

PATHS = frozenset(
    {
        "repo/examples/a/client.py",
        "repo/examples/b/main.py",
        "repo/examples/b/utils.py",
        "repo/examples/c/utils.py",
        "repo/pkg/__init__.py",
        "repo/pkg/engine.py",
        "repo/pkg/models/__init__.py",
        "repo/pkg/models/net.py",
        "repo/scripts/train.py",
    }
)


@pytest.mark.parametrize(
    ("importer", "target", "definer", "named"),
    [
        # a script's own folder comes first: b's utils, never c's or a's client
        ("repo/examples/b/main.py", "utils.test", "repo/examples/b/utils.py", True),
        ("repo/examples/b/main.py", "utils.test", "repo/examples/c/utils.py", False),
        ("repo/examples/b/main.py", "utils.test", "repo/examples/a/client.py", False),
        # absolute imports of a package module, and re-exports through its __init__
        ("repo/scripts/train.py", "pkg.engine.fit", "repo/pkg/engine.py", True),
        ("repo/scripts/train.py", "pkg.fit", "repo/pkg/engine.py", True),
        ("repo/scripts/train.py", "pkg.models.Net", "repo/pkg/models/net.py", True),
        ("repo/scripts/train.py", "pkg.models.Net", "repo/pkg/engine.py", False),
        # relative imports resolve exactly
        ("repo/pkg/engine.py", ".models.Net", "repo/pkg/models/net.py", True),
        ("repo/pkg/models/net.py", "..engine.fit", "repo/pkg/engine.py", True),
        ("repo/pkg/models/net.py", ".engine.fit", "repo/pkg/engine.py", False),
        ("repo/pkg/engine.py", ".fit", "repo/pkg/__init__.py", True),
        # nothing to resolve against: the fact is kept
        ("repo/scripts/train.py", "", "repo/pkg/engine.py", True),
    ],
)
def test_may_name(importer: str, target: str, definer: str, named: bool) -> None:
    assert may_name(importer, target, definer, PATHS) is named
