"""Every code block of README.md and docs/*.md runs, and every docstring example of the package, so
the documentation cannot drift from the code.

The conventions a doc follows (docs/architecture.md, "Documentation is tested"):

* ```python blocks of one file run in order in one namespace, like a doctest session, in a fresh
  working directory. A top-level ``print(...)  # -> TEXT`` must print TEXT (``...`` stands for anything).
* ```console blocks: each ``$ stitchml ...`` line runs the command (through `stitchml.cli.main`, in this
  process) and must succeed; the lines after it, up to the next ``$``, are its expected output, matched
  as doctest matches (``...`` stands for anything). ```bash blocks hold commands only, run the same way.
* ```json blocks must parse; ```text blocks (layouts, diagrams) are not run.
* ``<!-- skip: REASON -->`` on the line before a block skips it: for what a CPU-only CI machine cannot do
  (a CUDA device, installing packages, the test suite itself). The reason is required.
"""
from __future__ import annotations

import ast
import contextlib
import doctest
import importlib
import io
import json
import pkgutil
from importlib.util import find_spec
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import stitchml
from stitchml.cli import main

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LANGUAGES = {"python", "console", "bash", "json", "text"}
_FENCE = re.compile(r"^```(\S*)\s*$")
_SKIP = re.compile(r"^<!--\s*skip:\s*(\S.*?)\s*-->$")
_CHECKER = doctest.OutputChecker()
_MATCH = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


@dataclass
class Block:
    path: Path
    line: int  # of the first line inside the fence, counting from 1
    language: str
    text: str
    skip: str | None  # the reason, when marked

    @property
    def where(self) -> str:
        return f"{self.path.name}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown file, with the skip marker on the line before each."""
    lines = path.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        start = i + 1
        end = next((j for j in range(start, len(lines)) if lines[j].startswith("```")), None)
        assert end is not None, f"{path.name}:{i + 1}: a code fence that is never closed"
        before = lines[i - 1].strip() if i else ""
        skip = _SKIP.match(before)
        assert not before.startswith("<!-- skip") or skip, f"{path.name}:{i}: a skip marker needs a reason"
        found.append(Block(path, start + 1, fence.group(1), "\n".join(lines[start:end]) + "\n",
                           skip.group(1) if skip else None))
        i = end + 1
    return found


def _matches(want: str, got: str) -> bool:
    return _CHECKER.check_output(want.strip() + "\n", got.strip() + "\n", _MATCH)


# -- python blocks ------------------------------------------------------------------------------
def _expected_output(block: Block, stmt: ast.stmt) -> str | None:
    """TEXT of a top-level `print(...)  # -> TEXT`, else None."""
    if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
            and isinstance(stmt.value.func, ast.Name) and stmt.value.func.id == "print"):
        return None
    last = block.text.splitlines()[stmt.end_lineno - 1]
    _, arrow, want = last.partition("# -> ")
    return want if arrow else None


def run_python(block: Block, namespace: dict) -> None:
    tree = ast.parse(block.text, filename=str(block.path))
    for stmt in tree.body:
        want = _expected_output(block, stmt)
        module = ast.Module(body=[stmt], type_ignores=[])
        ast.increment_lineno(module, block.line - 1)  # tracebacks point at the Markdown file's lines
        code = compile(module, str(block.path), "exec")
        if want is None:
            exec(code, namespace)
            continue
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(code, namespace)
        got = out.getvalue()
        assert _matches(want, got), f"{block.path.name}:{stmt.lineno}: printed {got.strip()!r}, the doc says {want!r}"


# -- console and bash blocks --------------------------------------------------------------------
def run_command(where: str, line: str) -> str:
    """Run one `stitchml ...` command line in this process; its standard output."""
    argv = shlex.split(line, comments=True)
    if argv[:1] == ["stitchml"]:
        args = argv[1:]
    elif argv[:3] in (["python", "-m", "stitchml"], ["python", "-m", "stitchml.cli"]):
        args = argv[3:]
    else:
        raise AssertionError(f"{where}: {line!r} is not a stitchml command; run it here or mark the block "
                             "<!-- skip: REASON -->")
    out, err = io.StringIO(), io.StringIO()
    threads = torch.get_num_threads()  # the demos set it
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(args)
    except SystemExit as e:
        code = e.code
    finally:
        torch.set_num_threads(threads)
    assert code == 0, f"{where}: {line!r} exited with {code}: {err.getvalue()}"
    return out.getvalue()


def run_console(block: Block) -> None:
    lines = block.text.splitlines()
    starts = [i for i, text in enumerate(lines) if text.startswith("$ ")]
    assert starts and starts[0] == 0, f"{block.where}: a console block starts with a `$ ` command"
    for i, first in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else len(lines)
        where = f"{block.path.name}:{block.line + first}"
        got = run_command(where, lines[first][2:])
        want = "\n".join(lines[first + 1:end])
        if want.strip():
            assert _matches(want, got), f"{where}: printed\n{got}\nthe doc says\n{want}"


def run_bash(block: Block) -> None:
    for i, line in enumerate(block.text.splitlines()):
        if line.strip() and not line.lstrip().startswith("#"):
            run_command(f"{block.path.name}:{block.line + i}", line)


@pytest.fixture
def one_thread():
    """With pytest -n 2 on two cores, more threads per worker only wait on each other."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_code_blocks_run(path, tmp_path, monkeypatch, one_thread):
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": f"doc:{path.name}"}
    for block in blocks(path):
        assert block.language in LANGUAGES, (f"{block.where}: a ```{block.language} block; label each block "
                                             f"with one of {sorted(LANGUAGES)}")
        if block.skip is not None or block.language == "text":
            continue
        if block.language == "python":
            run_python(block, namespace)
        elif block.language == "console":
            run_console(block)
        elif block.language == "bash":
            run_bash(block)
        else:
            json.loads(block.text)
    skipped = [b for b in blocks(path) if b.skip is not None]
    assert len(skipped) <= 3, f"{path.name}: {len(skipped)} blocks skipped; keep skips few"


def test_the_conventions_are_checked(tmp_path):
    """The runner fails on a wrong printed output, a non-stitchml command and an unlabelled fence."""
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- skip: needs CUDA -->\n```python\nraise SystemExit\n```\n\n```python\nx = 2\n"
                   "print(x + 1)  # -> 4\n```\n\n```bash\nls /\n```\n\n```\nplain\n```\n")
    found = blocks(doc)
    assert [(b.language, b.skip, b.line) for b in found] == [("python", "needs CUDA", 3), ("python", None, 7),
                                                              ("bash", None, 12), ("", None, 16)]
    with pytest.raises(AssertionError, match=r"doc.md:8: printed '3', the doc says '4'"):
        run_python(found[1], {})
    with pytest.raises(AssertionError, match="'ls /' is not a stitchml command"):
        run_bash(found[2])
    assert _matches("Function('main', ...)", "Function('main', (x: float32[2]) -> (y: float32[2]), 3 ops)")


# -- docstring examples -------------------------------------------------------------------------
# Modules whose examples their own test modules run already.
_ELSEWHERE = {"stitchml.optim", "stitchml.data", "stitchml.pipeline.commands", "stitchml.pipeline.device",
              "stitchml.pipeline.ml", "stitchml.pipeline.resources",
              "stitchml.graph_methods"}  # copies of the builders' docstrings, whose examples run in their modules


def _with_examples() -> list[str]:
    names = ["stitchml"] + [m.name for m in pkgutil.walk_packages(stitchml.__path__, "stitchml.")
                            if not m.name.endswith("__main__")]
    return sorted(n for n in names if n not in _ELSEWHERE and ">>>" in Path(find_spec(n).origin).read_text())


@pytest.mark.parametrize("name", _with_examples())
def test_docstring_examples(name, tmp_path, monkeypatch, one_thread):
    monkeypatch.chdir(tmp_path)
    failures, tried = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert tried and failures == 0, f"{name}: {failures} of {tried} docstring examples failed (doctest's report above)"


# -- the README's two set-up commands, which the docs run cannot run ----------------------------
def test_the_set_up_commands_are_true(capsys):
    tomllib = pytest.importorskip("tomllib")
    readme = (ROOT / "README.md").read_text()
    install = re.search(r'python -m pip install torch==(\S+) -e "\.\[(\w+)\]" && stitchml demo (\w+)', readme)
    assert install, "README: the set-up command is not where it was"
    pin, extra, demo = install.groups()
    ci = (ROOT / ".ci" / "run").read_text()
    assert f"torch=={pin}" in ci, f"README pins torch {pin}; .ci/run installs another"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["stitchml"] == "stitchml.cli:main"
    requirements = " ".join(project["optional-dependencies"][extra])
    assert "tqdm" in requirements and "scikit-learn" in requirements, f"the demos' imports are not in .[{extra}]"
    with pytest.raises(SystemExit) as exit_:
        main(["demo", demo, "--help"])
    assert exit_.value.code == 0 and "--threads" in capsys.readouterr().out
    stated = re.search(r"runs exactly `([^`]+)`", readme).group(1)
    assert "bash .ci/run" in readme and ci.strip().splitlines()[-1] == stated
