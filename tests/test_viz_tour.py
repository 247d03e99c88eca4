"""docs/transformer-tour.md stays true: every test, module and name it cites exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOUR = (ROOT / "docs" / "transformer-tour.md").read_text(encoding="utf-8")


def test_every_cited_test_exists():
    cited = set(re.findall(r"(tests/[\w/]+\.py)::(\w+)", TOUR))
    assert len(cited) > 30
    missing = [f"{path}::{name}" for path, name in sorted(cited)
               if not (ROOT / path).exists()
               or not re.search(rf"^def {name}\(", (ROOT / path).read_text(encoding="utf-8"),
                                re.M)]
    assert missing == []


def test_every_cited_module_and_name_exists():
    rows = re.findall(r"`(minitransformer/[\w/]+\.py)`: ((?:`\w+`(?:, )?)+)", TOUR)
    assert len(rows) > 10
    missing = []
    for path, names in rows:
        source = (ROOT / path).read_text(encoding="utf-8")
        for name in re.findall(r"`(\w+)`", names):
            if not re.search(rf"^(def|class) {name}\b", source, re.M):
                missing.append(f"{path}: {name}")
    assert missing == []
    for path in set(re.findall(r"`((?:minitransformer|bench)/[\w/]+\.py)`", TOUR)):
        assert (ROOT / path).exists(), path
