"""README.zh-CN.md's commands run as written on a fresh clone: every ``minitransformer`` line
of its bash blocks, in order, in an empty folder. Training lines get the debug preset and a
few steps appended (flags given later win), so the whole page runs in well under a minute;
everything else runs exactly as printed."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from minitransformer.cli import main
from minitransformer.data import load_text

README = Path(__file__).resolve().parent.parent / "README.zh-CN.md"
QUICK = ["--preset", "debug", "--max_iters", "6", "--eval_interval", "3", "--eval_iters", "2",
         "--sample_tokens", "0", "--quiet"]
SKIP = ("serve",)  # a server runs until stopped
PAIRS = [("I love the mountain.", "我爱山。"), ("You see the river.", "你看见河。"),
         ("We want apples.", "我们想要苹果。"), ("They love cats.", "他们爱猫。")]


def commands(text: str) -> list[list[str]]:
    """The minitransformer command lines of the bash blocks, comments removed."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.splitlines():
            argv = shlex.split(line, comments=True)
            if argv and argv[0] == "minitransformer" and argv[1] not in SKIP:
                out.append(argv[1:])
    return out


def test_readme_commands_run_as_written(tmp_path, monkeypatch, capsys):
    cmds = commands(README.read_text(encoding="utf-8"))
    verbs = {argv[0] for argv in cmds}
    assert {"train", "sample", "evaluate", "attention", "explain"} <= verbs
    assert any("从前有座山" in argv for argv in cmds)
    monkeypatch.chdir(tmp_path)
    # the reader's own files that the page's examples name
    (tmp_path / "my_text.txt").write_text(load_text("tang")[:20_000], encoding="utf-8")
    poems = load_text("tang")[:20_000].split("\n\n")
    (tmp_path / "notes.jsonl").write_text(
        "".join(json.dumps({"id": i, "content": p}, ensure_ascii=False) + "\n"
                for i, p in enumerate(poems)), encoding="utf-8")
    pairs = [f"p{i}\t{en}\t{zh}" for i, (en, zh) in enumerate(PAIRS * 8)]
    (tmp_path / "my_pairs.tsv").write_text("ref\ten\tzh\n" + "\n".join(pairs) + "\n",
                                           encoding="utf-8")
    for argv in cmds:
        if argv[0] == "train":
            argv = [*argv, *QUICK]
        code = main(argv)
        out, err = capsys.readouterr()
        assert code == 0, (argv, err)
    assert any(tmp_path.glob("*.html")) and any(tmp_path.glob("*.png"))


def test_readme_python_snippet_runs(tmp_path):
    import subprocess
    import sys

    text = README.read_text(encoding="utf-8")
    snippet = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    assert main(["train", "--data", "sayings", "--out", str(tmp_path / "runs" / "sayings"),
                 *QUICK]) == 0
    proc = subprocess.run([sys.executable, "-c", snippet], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("从前有座山")
