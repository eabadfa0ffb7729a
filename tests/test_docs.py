"""Every example in README.md and docs/ runs, and every command-line transcript prints what it shows.

What a fenced block's info string means here:

- ``python``: run. The blocks of one page run in order in one interpreter (a subprocess of the
  Python running this test, so nothing leaks between pages or into pytest), started in a fresh
  temporary directory; a block sees the names the blocks above it defined.
- ``console``: each ``$ trainstatus ...`` line is run in that same directory, at that point of the
  page, and what it prints (stdout and stderr, in order) must be the lines under it. ``$ echo $?``
  prints the exit status of the command before it; a command not followed by one must exit 0.
- anything else (none, ``json``, ``text``, ``sh``) is shown, not run: install commands, output,
  file samples. Such a block that starts like Python or like a transcript is an error: tag it.

Markers, an HTML comment ending on the line right before the fence (neither GitHub nor the built
manual shows it; grep for them):

- ``<!-- no-run: why -->``: the block is not run (it needs ML-Agents, S3, a whole training run).
  ``NO_RUN`` below is their number, so each one is a deliberate change to this file.
- ``<!-- excerpt: examples/some_file.py -->``: the block is an abridged copy of that file, which
  tests/test_examples.py runs; every line of the block must be a line of the file, in order.
- ``<!-- setup:`` then Python lines, then ``-->``: run in the page's interpreter before the block.
  It stands in for what a reader has and the page does not show: a trainer's own functions, a
  status file for a transcript to print, a trainer holding the lock.

In command output only what must vary is normalised, in both the block and the output: times
(``2026-12-03 11:57:54.598 UTC``, ``20250601T120000.500000Z``) and process ids (``pid 4242``,
``process 81234``). The temporary directory is shown as ``/home/me/project``.

An error names the Markdown file and the line of the block (a Python traceback points at the
page's own line numbers).
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])

# The blocks marked no-run, README and docs together. Keep them few: each one is an example that
# can rot unseen.
NO_RUN = 9  # an S3 server, a GCS bucket and an Azure account; torch for the SB3, Lightning, Transformers, Accelerate and DCP pages, Ray for the Ray page, DeepSpeed for its page (their tests run those calls)

RUN_LANGUAGES = {"python", "console"}
SHOWN_LANGUAGES = {"", "json", "text", "sh"}
SHOWN_CWD = "/home/me/project"

_FENCE = re.compile(r"^```(\S*)\s*$")
_MARKER = re.compile(r"^<!-- (no-run|excerpt|setup):?(.*?)(-->)?$", re.S)


@dataclasses.dataclass
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    language: str
    body: list[str]
    markers: dict[str, str] = dataclasses.field(default_factory=dict)
    setup: str = ""
    setup_line: int = 0  # of the first line of setup code

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def parse(page: Path) -> list[Block]:
    """The fenced blocks of ``page`` with the markers written right before each."""
    lines = page.read_text(encoding="utf-8").split("\n")
    blocks: list[Block] = []
    pending: dict[str, str] = {}
    setup, setup_line = "", 0
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = _FENCE.match(line)
        if fence:
            start = i
            i += 1
            while i < len(lines) and lines[i] != "```":
                i += 1
            if i == len(lines):
                raise AssertionError(f"{page.relative_to(ROOT)}:{start + 1}: a fenced block is never closed")
            blocks.append(Block(page, start + 1, fence.group(1), lines[start + 1:i], pending, setup, setup_line))
            pending, setup, setup_line = {}, "", 0
        elif line.startswith("<!-- "):
            first = i
            while not lines[i].rstrip().endswith("-->"):
                i += 1
                if i == len(lines):
                    raise AssertionError(f"{page.relative_to(ROOT)}:{first + 1}: an HTML comment is never closed")
            text = "\n".join(lines[first:i + 1])
            marker = _MARKER.match(text)
            if marker is None:  # an ordinary comment
                pending, setup, setup_line = {}, "", 0
            elif marker.group(1) == "setup":
                setup = "\n".join(lines[first + 1:i])
                setup_line = first + 2
            else:
                pending[marker.group(1)] = marker.group(2).strip()
        elif line.strip():
            # A marker only applies to the block right below it.
            pending, setup, setup_line = {}, "", 0
        i += 1
    return blocks


def all_blocks() -> list[Block]:
    return [block for page in PAGES for block in parse(page)]


def _id(page: Path) -> str:
    return str(page.relative_to(ROOT))


# The interpreter each page runs in. It reads the page's steps as JSON on stdin and stops at the
# first that fails, saying where.
DRIVER = r'''
import json, os, re, subprocess, sys, traceback, warnings

from trainstatus import TrainingStatusWarning  # cheap: the store itself loads on first use

steps = json.load(sys.stdin)
# A warning an example does not mean to raise (a deprecation, say) is rot: an error. trainstatus's
# own warnings are what some examples show (a resume without a file): printed, on stderr.
warnings.simplefilter("error")
warnings.simplefilter("default", TrainingStatusWarning)

def normalise(text):
    text = re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC", "<time>", text)
    text = re.sub(r"\d{8}T\d{6}\.\d{6}Z", "<time>", text)
    text = re.sub(r"\b(pid|process) \d+", r"\1 <pid>", text)
    return text

cwd = os.getcwd()
script = os.path.join(os.path.dirname(sys.executable), "trainstatus")
command = [script] if os.path.exists(script) else [sys.executable, "-m", "trainstatus"]
# Unbuffered, so that stdout and stderr interleave as on a terminal; a fixed width for argparse.
env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="100")
namespace = {"__name__": "__docs__"}
for step in steps:
    where = step["where"]
    try:
        if step["kind"] == "python":
            code = "\n" * (step["line"] - 1) + step["code"]
            exec(compile(code, step["file"], "exec"), namespace)
            continue
        status = None
        for run in step["commands"]:
            here = f"{step['file']}:{run['line']}"
            if run["argv"] == ["echo", "$?"]:
                if status is None:
                    raise AssertionError(f"{here}: '$ echo $?' needs a command above it")
                if run["expected"].strip() != str(status):
                    raise AssertionError(f"{previous} exited {status}; the block shows {run['expected'].strip()!r} "
                                         f"under its '$ echo $?' ({here})")
                status = 0  # shown; echo itself exits 0
                continue
            if status not in (None, 0):
                raise AssertionError(f"{previous} exited {status}; show it with '$ echo $?' below it")
            done = subprocess.run(command + run["argv"][1:], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, env=env, timeout=60)
            status, previous = done.returncode, f"{here}: '$ {run['text']}'"
            got = done.stdout.replace(os.path.realpath(cwd), "SHOWN_CWD").replace(cwd, "SHOWN_CWD")
            want, have = normalise(run["expected"]).rstrip(), normalise(got).rstrip()
            if want != have:
                raise AssertionError(f"{previous} printed\n{have}\n-- but the block shows --\n{want}")
        if status not in (None, 0):
            raise AssertionError(f"{previous} exited {status}; show it with '$ echo $?' below it")
    except BaseException as exc:
        print(f"{where}: this {step['kind']} block failed (run in {cwd}):", file=sys.stderr)
        if step["kind"] == "console" and isinstance(exc, AssertionError):
            print(exc, file=sys.stderr)  # the driver's own frames would only hide the message
        else:
            traceback.print_exc()
        sys.exit(1)
'''.replace("SHOWN_CWD", SHOWN_CWD)


def steps_of(blocks: list[Block]) -> list[dict[str, object]]:
    """What the driver runs for these blocks, in order."""
    steps: list[dict[str, object]] = []
    for block in blocks:
        file = str(block.page.relative_to(ROOT))
        if block.setup:
            steps.append({"kind": "python", "where": f"{block.where} (its setup comment)", "file": file,
                          "line": block.setup_line, "code": block.setup})
        if block.language not in RUN_LANGUAGES or "no-run" in block.markers or "excerpt" in block.markers:
            continue
        if block.language == "python":
            steps.append({"kind": "python", "where": block.where, "file": file, "line": block.line + 1,
                          "code": "\n".join(block.body)})
            continue
        commands: list[dict[str, object]] = []
        for offset, text in enumerate(block.body):
            if text.startswith("$ "):
                argv = shlex.split(text[2:])
                if argv[0] != "trainstatus" and argv != ["echo", "$?"]:
                    raise AssertionError(f"{file}:{block.line + 1 + offset}: only 'trainstatus ...' and "
                                         f"'echo $?' run in a console block; mark the block no-run")
                commands.append({"line": block.line + 1 + offset, "text": text[2:], "argv": argv, "expected": ""})
            elif not commands:
                raise AssertionError(f"{file}:{block.line + 1 + offset}: a console block starts with a '$ ' line")
            else:
                commands[-1]["expected"] += text + "\n"
        steps.append({"kind": "console", "where": block.where, "file": file, "commands": commands})
    return steps


def run_steps(steps: list[dict[str, object]], folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", DRIVER], input=json.dumps(steps), cwd=folder,
                          capture_output=True, text=True, timeout=300)


# Pages with nothing to run get no test (test_every_block_is_run_or_shown_on_purpose covers them).
RUN_PAGES = [page for page in PAGES
             if any(b.language in RUN_LANGUAGES and not b.markers for b in parse(page))]


@pytest.mark.parametrize("page", RUN_PAGES, ids=_id)
def test_the_examples_of_the_page_run_and_print_what_they_show(page: Path, tmp_path: Path) -> None:
    steps = steps_of(parse(page))
    result = run_steps(steps, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_no_run_blocks_are_few_and_each_says_why() -> None:
    no_run = [block for block in all_blocks() if "no-run" in block.markers]
    listing = "\n".join(f"{block.where}: {block.markers['no-run']}" for block in no_run)
    assert len(no_run) == NO_RUN, (f"{len(no_run)} blocks are marked no-run, NO_RUN is {NO_RUN}: make a new one "
                                   f"run (a setup comment can stand in for what it needs), or change NO_RUN:\n{listing}")
    for block in no_run:
        assert block.markers["no-run"], f"{block.where}: say why the block cannot run: <!-- no-run: why -->"


def test_excerpts_are_lines_of_the_file_they_abridge() -> None:
    excerpts = [block for block in all_blocks() if "excerpt" in block.markers]
    assert excerpts, "no excerpt left: remove this test and the marker's documentation"
    for block in excerpts:
        source = ROOT / block.markers["excerpt"]
        assert source.is_file(), f"{block.where}: the excerpt's file {source} does not exist"
        remaining = iter(source.read_text(encoding="utf-8").split("\n"))
        for offset, line in enumerate(block.body):
            if line.strip() and not any(candidate == line for candidate in remaining):
                raise AssertionError(f"{block.where}: line {block.line + 1 + offset} ({line.strip()!r}) is not "
                                     f"in {block.markers['excerpt']} after the lines before it; copy it again")


def test_every_block_is_run_or_shown_on_purpose() -> None:
    for block in all_blocks():
        language = block.language
        assert language in RUN_LANGUAGES | SHOWN_LANGUAGES, (
            f"{block.where}: unknown info string {language!r}; use one of {sorted(RUN_LANGUAGES | SHOWN_LANGUAGES)}")
        first = next((line for line in block.body if line.strip()), "")
        if language in SHOWN_LANGUAGES:
            assert not first.startswith("$ trainstatus"), f"{block.where}: a transcript: make it ```console"
            assert not re.match(r"(from|import) trainstatus", first), f"{block.where}: Python: make it ```python"
        if block.markers.keys() & {"no-run", "excerpt"}:
            assert language in RUN_LANGUAGES, f"{block.where}: only python and console blocks take no-run/excerpt"


def _slug(heading: str) -> str:
    """The anchor GitHub and MkDocs give a heading (the two agree for the headings used here)."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", text))


def test_the_readme_links_go_to_pages_and_anchors_that_exist() -> None:
    # mkdocs build --strict checks the links inside docs/; README.md is outside it.
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)\s]+)\)", readme)
    assert links
    for link in links:
        if "://" in link:
            continue
        target, _, anchor = link.partition("#")
        path = ROOT / target
        assert path.is_file(), f"README.md links to {target}, which does not exist"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", path.read_text(encoding="utf-8"), re.M)
            assert anchor in {_slug(h) for h in headings}, f"README.md links to {link}: no such heading in {target}"


# -- the integration pages show the signatures the code has ---------------------------------------


def _signature(name: str, function: Any, method: bool) -> tuple[str, dict[str, str]]:
    """``name(a, b="x", *, c=None)`` as the pages write it, and each parameter's default as written."""
    import ast

    def default(node: Any) -> str:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return json.dumps(node.value)
        return ast.unparse(node)

    given = function.args
    positional = [p.arg for p in given.posonlyargs + given.args][1 if method else 0:]
    defaults = [None] * (len(positional) - len(given.defaults)) + [default(d) for d in given.defaults]
    parts = [p if d is None else f"{p}={d}" for p, d in zip(positional, defaults)]
    if given.vararg:
        parts.append(f"*{given.vararg.arg}")
    elif given.kwonlyargs:
        parts.append("*")
    keywords = [None if d is None else default(d) for d in given.kw_defaults]
    parts += [k.arg if d is None else f"{k.arg}={d}" for k, d in zip(given.kwonlyargs, keywords)]
    if given.kwarg:
        parts.append(f"**{given.kwarg.arg}")
    known = {p: d for p, d in [*zip(positional, defaults), *((k.arg, d) for k, d in zip(given.kwonlyargs, keywords))]
             if d is not None}
    return f"{name}({', '.join(parts)})", known


def _public_signatures(module: Path) -> dict[str, tuple[str, dict[str, str]]]:
    """Each public class (its constructor) and function of ``module``, read from its source: the
    integrations' libraries need not be installed."""
    import ast

    found = {}
    for node in ast.parse(module.read_text(encoding="utf-8")).body:
        if not isinstance(node, (ast.FunctionDef, ast.ClassDef)) or node.name.startswith("_"):
            continue
        if isinstance(node, ast.FunctionDef):
            found[node.name] = _signature(node.name, node, False)
        else:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    found[node.name] = _signature(node.name, item, True)
    return found


@pytest.mark.parametrize("integration", ["sb3", "lightning", "transformers"])
def test_an_integration_page_shows_each_signature_as_the_code_has_it(integration: str) -> None:
    """A `Name(...)` of the page whose every `name=value` is the code's default shows the
    signature: it must be the whole one, keyword-only options included (sb3.md once left
    status_path= out). Calls (`last_complete_checkpoint(args.output_dir)`, an option given another
    value) are not signatures."""
    page = (ROOT / "docs" / f"{integration}.md").read_text(encoding="utf-8")
    signatures = _public_signatures(ROOT / "src" / "trainstatus" / "integrations" / f"{integration}.py")
    checked = 0
    for mention in (" ".join(m.split()) for m in re.findall(r"`(\w+\([^`]*\))`", page)):
        name = mention.split("(", 1)[0]
        if name not in signatures:
            continue  # another library's name (ModelCheckpoint(...), PPO.load(...))
        full, defaults = signatures[name]
        given = [part.strip().partition("=") for part in mention[len(name) + 1:-1].split(",")]
        shown = [(key, value) for key, equals, value in given if equals]
        if shown and all(defaults.get(key.strip()) == value.strip() for key, value in shown):
            assert mention == full, f"docs/{integration}.md shows {mention}; the code has {full}"
            checked += 1
    assert checked >= 1, f"docs/{integration}.md shows no whole signature of {sorted(signatures)}"


# -- the runner itself ---------------------------------------------------------------------------

def test_a_failing_block_names_its_file_and_line(tmp_path: Path) -> None:
    page = ROOT / "docs" / "_selftest.md"  # never written: parse() is given the text below
    text = ("# A page\n\n```python\nvalue = 1\n```\n\n```python\nassert value == 2, 'the example is wrong'\n```\n\n"
            "```console\n$ trainstatus get missing.json a b\n3\n```\n")
    blocks = _parse_text(page, text, tmp_path)
    python_fails = run_steps(steps_of(blocks[:2]), tmp_path)
    assert python_fails.returncode == 1
    assert "docs/_selftest.md:7: this python block failed" in python_fails.stderr
    assert 'File "docs/_selftest.md", line 8' in python_fails.stderr
    assert "the example is wrong" in python_fails.stderr
    console_fails = run_steps(steps_of(blocks[2:]), tmp_path)
    assert console_fails.returncode == 1
    assert "docs/_selftest.md:12: '$ trainstatus get missing.json a b' printed" in console_fails.stderr


def test_an_exit_status_the_block_does_not_show_fails(tmp_path: Path) -> None:
    (tmp_path / "s.json").write_text('{"a": {"b": 1}}')
    page = ROOT / "docs" / "_selftest.md"
    unshown = _parse_text(page, "```console\n$ trainstatus get s.json a c\ntrainstatus: error: a/c is not set in s.json\n```\n", tmp_path)
    result = run_steps(steps_of(unshown), tmp_path)
    assert "docs/_selftest.md:2: '$ trainstatus get s.json a c' exited 1; show it with '$ echo $?' below it" in result.stderr
    wrong = _parse_text(page, "```console\n$ trainstatus get s.json a c\ntrainstatus: error: a/c is not set in s.json\n"
                              "$ echo $?\n2\n```\n", tmp_path)
    result = run_steps(steps_of(wrong), tmp_path)
    assert "exited 1; the block shows '2' under its '$ echo $?' (docs/_selftest.md:4)" in result.stderr
    shown = _parse_text(page, "```console\n$ trainstatus get s.json a c\ntrainstatus: error: a/c is not set in s.json\n"
                              "$ echo $?\n1\n$ trainstatus get s.json a b\n1\n```\n", tmp_path)
    result = run_steps(steps_of(shown), tmp_path)
    assert result.returncode == 0, result.stderr


def _parse_text(page: Path, text: str, tmp_path: Path) -> list[Block]:
    """The blocks of ``text``, named as if they were on ``page``."""
    source = tmp_path / "page.md"
    source.write_text(text, encoding="utf-8")
    return [dataclasses.replace(block, page=page) for block in parse(source)]
