"""The Chinese docs stay true: every section of the two tutorials has a heading in
docs/zh/transformer-tour.md with a module and a pytest node that exist, every cited name and
test exists, and every relative link (and anchor) of the Chinese pages resolves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOUR_PATH = ROOT / "docs" / "zh" / "transformer-tour.md"
TOUR = TOUR_PATH.read_text(encoding="utf-8")
README_ZH = ROOT / "README.zh-CN.md"
# The section headings of the two tutorials ("Transformer 架构详解" and the from-scratch GPT).
TUTORIAL_SECTIONS = ["为什么要 Transformer", "复杂度的代价", "Attention 的核心直觉",
                     "缩放点积注意力", "多头注意力", "位置编码：正弦 / 可学习 / RoPE / ALiBi",
                     "前馈网络", "残差与 LayerNorm：Post-LN 与 Pre-LN", "编码器-解码器", "GPT",
                     "从零手写迷你 GPT"]
NODE = re.compile(r"(tests/[\w/]+\.py)::(\w+)")
MODULE = re.compile(r"`((?:minitransformer|bench)/[\w/]+\.py)`")


def sections(text: str) -> dict[str, str]:
    """{heading without its number: body} of the ## sections."""
    parts = re.split(r"^## (?:\d+\. )?(.+)$", text, flags=re.M)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


def node_exists(path: str, name: str) -> bool:
    file = ROOT / path
    return file.exists() and re.search(rf"^def {name}\(", file.read_text(encoding="utf-8"),
                                       re.M) is not None


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


@pytest.mark.parametrize("title", TUTORIAL_SECTIONS)
def test_every_tutorial_section_has_a_module_and_a_test(title):
    found = sections(TOUR)
    assert title in found, f"no section {title!r} in {TOUR_PATH.name}: {list(found)}"
    body = found[title]
    modules = MODULE.findall(body)
    assert modules and all((ROOT / m).exists() for m in modules), (title, modules)
    nodes = NODE.findall(body)
    assert nodes and all(node_exists(p, n) for p, n in nodes), (title, nodes)


def test_every_cited_test_and_name_exists():
    for text in (TOUR, README_ZH.read_text(encoding="utf-8")):
        missing = [f"{p}::{n}" for p, n in NODE.findall(text) if not node_exists(p, n)]
        assert missing == []
    rows = re.findall(r"`(minitransformer/[\w/]+\.py)`: ((?:`\w+`(?:, )?)+)", TOUR)
    assert len(rows) > 15
    for path, names in rows:
        source = (ROOT / path).read_text(encoding="utf-8")
        for name in re.findall(r"`(\w+)`", names):
            assert re.search(rf"^(def|class) {name}\b", source, re.M), f"{path}: {name}"


@pytest.mark.parametrize("page", ["docs/zh/transformer-tour.md", "README.zh-CN.md"])
def test_links_and_anchors_resolve(page):
    path = ROOT / page
    links = re.findall(r"\]\(([^)\s]+)\)", path.read_text(encoding="utf-8"))
    assert links
    for link in links:
        if re.match(r"[a-z]+:", link):
            continue
        target, _, anchor = link.partition("#")
        file = (path.parent / target).resolve() if target else path
        assert file.exists(), f"{page}: {link}"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", file.read_text(encoding="utf-8"), re.M)
            assert anchor in {slug(h) for h in headings}, f"{page}: {link}"


def test_the_readmes_link_each_other():
    english = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert any("README.zh-CN.md" in line for line in english[:5])
    chinese = README_ZH.read_text(encoding="utf-8").splitlines()
    assert any("(README.md)" in line for line in chinese[:5])
