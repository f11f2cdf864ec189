"""The README and the docs/ pages stay true: every command line they show checks, in its dry-run form, against
the commands and config as they are now; the pages build as a site with mkdocs --strict (no broken link); and
the README stays a front door of at most 200 lines.

A documented line is checked without running anything: `shardbench <command> ...` (and `python -m harness <command>`)
through the command's own check with SHARDBENCH_CHECK_ONLY set (config/command_line.py); `shardbench train ...`
through the same override check, composition and rules as a real launch (with a GPU count a doc's GPU config
asks for); `make <target> ...` against the Makefile's targets, its ARGS through the command the target runs.
Lines that show bad input on purpose are the `$ `-prompted ones, followed by their error, and are skipped.
"""
from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest

from conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MAKEFILE = (REPO / "Makefile").read_text()
TARGETS = set(re.findall(r"^([a-z-]+):", MAKEFILE, re.M))


def command_lines(text: str):
    """The command lines in a page's code blocks (fenced or indented; continuations joined, comments dropped) and
    its prose's code spans."""
    out, block, fenced = [], [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced or line.startswith("    "):
            block.append(line.strip())
    # and the commands quoted in the prose, but for those with a placeholder (<dir>) or an ellipsis
    spans = [m for m in re.findall(r"`((?:shardbench|make|python -m harness )[^`]*)`", text) if not
             re.search(r"<[a-z_]+>|\.\.\.|[<>]", m)]
    for line in "\n".join(block).replace("\\\n", " ").splitlines() + spans:
        line = line.split(" # ", 1)[0].split("  #", 1)[0].strip()
        while re.match(r"^[A-Z_]+=\S*\s", line):  # VAR=value before the command
            line = line.split(None, 1)[1]
        if not line.startswith(("shardbench", "make ", "python -m harness ")):
            continue
        words = shlex.split(line)
        if words[:1] in (["shardbench"], ["make"]) or words[:3] == ["python", "-m", "harness"]:
            out.append(words)
    return out


DOCUMENTED = [(page.relative_to(REPO).as_posix(), words) for page in PAGES for words in command_lines(page.read_text())]


def make_command(words):
    """`make <target> [VAR=value ...]` as the command its recipe runs: (module, its args), or None."""
    target, assigns = words[1], dict(w.split("=", 1) for w in words[2:] if "=" in w)
    assert target in TARGETS, f"make {target}: no such target"
    recipe = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", MAKEFILE, re.M)
    module = re.search(r"-m harness ([\w-]+)", recipe.group(1)) if recipe else None
    if target == "sweep":
        assert (REPO / "conf" / "experiment" / f"{assigns['EXP']}.yaml").exists(), f"no experiment {assigns['EXP']}"
        return "train", [f"experiment={assigns['EXP']}", *shlex.split(assigns.get("ARGS", ""))]
    if module is None or "ARGS" not in assigns:
        return None
    return module.group(1), shlex.split(assigns["ARGS"])


def check_train(args, page):
    from harness.config import overrides, rules
    from harness.config.command_line import flag_problem
    from harness.config.compose import compose

    mistake = flag_problem(overrides.hydra_flags(), args) or overrides.problem(args)
    assert mistake is None, f"{page}: shardbench train {' '.join(args)}: {mistake}"
    plain = [a for a in args if not a.startswith("-") and "," not in a.split("=", 1)[-1]]
    if len(plain) < len(args) or any(a.startswith(("hydra/", "hydra.")) for a in args):
        return  # a multirun, a Hydra flag or Hydra's own settings: the override check above is what applies
    problems = [p for p in rules.problems(compose(plain), cuda_devices=lambda: 512)
                # a checkpoint the page's own `shardbench pretrain --out results/local/...` line writes first
                if not p.startswith("model.pretrained_path=results/local/")]
    assert not problems, f"{page}: shardbench train {' '.join(args)}: {problems}"


@pytest.mark.parametrize("page, words", DOCUMENTED, ids=[f"{p}: {' '.join(w)[:70]}" for p, w in DOCUMENTED])
def test_every_documented_command_line_checks(page, words, monkeypatch, capsys):
    from harness.config.command_line import CHECK_ONLY
    from harness import commands

    if words[0] == "make":
        found = make_command(words)
        if found is None:
            return
        name, args = found[0].replace("_", "-"), found[1]
    elif words[0] == "python":
        name, args = (words[3], words[4:]) if len(words) > 3 else ("--help", [])
    else:
        name, args = (words[1], words[2:]) if len(words) > 1 else ("--help", [])
    if name == "--help":
        return
    assert name in commands.commands(), f"{page}: shardbench {name}: no such command"
    if name == "train":
        return check_train(args, page)
    monkeypatch.setenv(CHECK_ONLY, "1")
    monkeypatch.setattr(sys, "argv", ["pytest"])
    code = commands.main([name, *args])
    out = capsys.readouterr()
    assert code == 0, f"{page}: shardbench {name} {' '.join(args)}: {(out.out + out.err).strip()[-400:]}"


def test_the_pages_hold_what_a_newcomer_looks_for():
    """The README is a front door (at most 200 lines) that links every docs page; the pages list every make
    target and every option of every config group (a newcomer finds small_llama there, which the examples use)."""
    from harness.config.compose import options

    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert all(f"docs/{page.name}" in readme for page in PAGES[1:] if page.name != "index.md")
    commands_page = (REPO / "docs" / "commands.md").read_text()
    targets = set(re.findall(r"^([a-z-]+):.*## ", MAKEFILE, re.M))
    assert set(re.findall(r"^\| `make ([a-z-]+)", commands_page, re.M)) == targets
    configuration = (REPO / "docs" / "configuration.md").read_text()
    for group in ("backend", "model", "workload", "parallelism", "data", "logger", "experiment"):
        row = re.search(rf"^\| `{group}` \|(.*)$", configuration, re.M)
        assert row, f"docs/configuration.md's config-group table has no row for {group}"
        missing = set(options(group)) - set(re.findall(r"`([a-z0-9_]+)`", row.group(1)))
        assert not missing, f"docs/configuration.md's {group} row lacks {sorted(missing)}"


def test_the_docs_build_as_a_site_with_no_broken_link(tmp_path):
    # make docs: mkdocs --strict fails on a link to a page that is not there
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir",
                           str(tmp_path / "site")], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "site" / "memory" / "index.html").exists()
