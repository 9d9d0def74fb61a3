"""What a page cites exists: every script and file by path, every module, every `hstu-replay`
command, and every option of our tool's command lines.

A page is README.md, BENCHMARKS.md or any docs/**/*.md. Each is read independently of the code
that the citations name: paths against the disk, commands against the CLI's own parser
(`hstu_replay.cli.build_parser`, built from COMMAND_GROUPS), options against the parsers that take
them: the load-test option table, Locust's own parser (read in a child process, as importing locust
patches gevent), each `hstu-replay` command's argparse options, and each bench script's
`add_argument` flags (read from its source). Options of other programs (tritonserver,
perf_analyzer, pip, mkdocs, ...) are not ours to check: only command lines of `hstu-replay`,
`locust` and bench scripts, and code spans holding a bare option, are checked; a quoted value
(`--serve-args="--device cpu"`) is another command's line and is left out. A path below a folder
the repository ignores (.gitignore's `/name/`) is a place the reader makes, not a file cited.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", ROOT / "BENCHMARKS.md", *(ROOT / "docs").rglob("*.md")])
#: top-level folders whose files a page may cite by path from the repository root
CITED_FOLDERS = ("bench", "scripts", "hstu_replay", "tests", "locustfiles", "cpp", "deploy", "docs", "datasets")
PATH = re.compile(r"(?<![\w./-])((?:%s)/[\w./*-]*[\w*])" % "|".join(CITED_FOLDERS))
MODULE = re.compile(r"(?<![\w./-])((?:hstu_replay|bench)(?:\.\w+)+)")
OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*[a-z0-9])(?![\w-])")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
SPAN = re.compile(r"`([^`\n]+)`")
#: shell words that separate one command from the next on a line
SEPARATOR = re.compile(r"\s(?:&&|\|\||\||;|&)\s|;\s*$")
ENV_ASSIGNMENT = re.compile(r"^[A-Z_][A-Z0-9_]*=")
QUOTED = re.compile(r"\"[^\"]*\"|'[^']*'")
#: options of other programs that pages name on their own in prose, each with whose it is
OTHER_PROGRAMS_OPTIONS = {
    "--input-data": "perf_analyzer's: the trace `plan perf-analyzer` writes is its input",
    "--concurrency-range": "perf_analyzer's: how to replay that trace",
    "--request-count": "perf_analyzer's: how to replay that trace",
    "--grpc-use-ssl": "tritonserver's: what `server serve --tls-cert` turns on",
    "--grpc-restricted-protocol": "tritonserver's: what `server serve --require-header` turns on",
    "--http-restricted-api": "tritonserver's: what `server serve --require-header` turns on",
}
#: Locust's own command-line options, from its parser
READ_LOCUST = """
import json
from locust.argument_parser import get_parser
print(json.dumps(sorted(s for a in get_parser()._actions for s in a.option_strings)))
"""


@dataclass(frozen=True)
class Citation:
    page: str
    line: int
    text: str


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _fragments(text: str) -> list[tuple[int, str]]:
    """(line, command) for each command of a fenced block and each inline code span."""
    found = []
    for block in FENCE.finditer(text):
        first = _line_of(text, block.start(1))
        joined, start = "", None
        for number, line in enumerate(block.group(1).splitlines(), first):
            start = number if start is None else start
            line = re.sub(r"(^|\s)#.*$", "", line)
            if line.rstrip().endswith("\\"):
                joined += line.rstrip()[:-1] + " "
                continue
            found += [(start, part) for part in SEPARATOR.split(joined + line) if part.strip()]
            joined, start = "", None
    prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    found += [(_line_of(prose, span.start()), span.group(1)) for span in SPAN.finditer(prose)]
    return found


def _words(command: str) -> list[str]:
    words = command.split()
    while words and (ENV_ASSIGNMENT.match(words[0]) or words[0] in ("sudo", "exec")):
        words = words[1:]
    return words


@cache
def _cli() -> argparse.ArgumentParser:
    from hstu_replay.cli import build_parser

    return build_parser()


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next((dict(a.choices) for a in parser._actions if isinstance(a, argparse._SubParsersAction)), {})


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {flag for action in parser._actions for flag in action.option_strings}


@cache
def _locust_flags() -> frozenset[str]:
    done = subprocess.run([sys.executable, "-c", READ_LOCUST], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return frozenset(json.loads(done.stdout.splitlines()[-1]))


@cache
def _load_test_flags() -> frozenset[str]:
    from hstu_replay.loadtest.options import REGISTERED  # the option table and the web UI's access options

    return frozenset(o.flag for o in REGISTERED) | _locust_flags()


def _script_flags(script: Path) -> frozenset[str]:
    """The flags a bench script's parser declares: the `--x` literals of its add_argument calls."""
    tree = ast.parse(script.read_text())
    return frozenset(arg.value for node in ast.walk(tree)
                     if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument"
                     for arg in node.args if isinstance(arg, ast.Constant) and str(arg.value).startswith("-"))


@cache
def _every_flag() -> frozenset[str]:
    """Every option our tool has: a bare `--option` in a page must be one of these."""
    commands, todo = set(), [_cli()]
    while todo:
        parser = todo.pop()
        commands |= _flags(parser)
        todo += _subcommands(parser).values()
    scripts = set().union(*(_script_flags(p) for p in (ROOT / "bench").glob("*.py")))
    return frozenset(commands | scripts | set(OTHER_PROGRAMS_OPTIONS)) | _load_test_flags()


def _hstu_replay(words: list[str]) -> tuple[str | None, set[str]]:
    """A `hstu-replay ...` command line's problem (None when its command exists), and the options
    its command takes."""
    parser, path = _cli(), ["hstu-replay"]
    for word in words[1:]:
        choices = _subcommands(parser)
        if not choices or word.startswith(("-", "<", "[", "$", "{", ".")) or word in ("...", "COMMAND"):
            break
        if word not in choices:
            return f"`{' '.join(path)} {word}`: no such command (choices: {', '.join(sorted(choices))})", set()
        parser = choices[word]
        path.append(word)
    return None, _flags(parser) | _flags(_cli())


def _bench_script(words: list[str]) -> Path | None:
    """The bench script a `python -m bench.x` or `python bench/x.py` line runs, if any (not a
    placeholder such as `bench.<name>`)."""
    if any("<" in word for word in words[1:3]):
        return None
    if words[:2] == ["python", "-m"] and len(words) > 2 and words[2].startswith("bench."):
        return ROOT / (words[2].replace(".", "/") + ".py")
    if words[:1] == ["python"] and len(words) > 1 and words[1].startswith("bench/"):
        return ROOT / words[1]
    return None


def _command_problems(command: str) -> list[str]:
    words = _words(command)
    if not words:
        return []
    program, flags = words[0], None
    if program == "hstu-replay":
        problem, flags = _hstu_replay(words)
        if problem:
            return [problem]
    elif program == "locust":
        flags = _load_test_flags()
    elif (script := _bench_script(words)) is not None:
        if not script.is_file():
            return [f"`{' '.join(words[:3])}`: no such script {script.relative_to(ROOT)}"]
        flags = _script_flags(script)
    elif program.startswith("--") or program == "...":
        program, flags = "", _every_flag()
    if flags is None:
        return []  # another program's command line: its options are not ours
    whose = f" of `{program}`" if program else ""
    ours = QUOTED.sub("", " ".join(words))
    return [f"`{flag}`: no such option{whose}" for flag in OPTION.findall(ours) if flag not in flags]


@cache
def _ignored_folders() -> tuple[str, ...]:
    lines = (ROOT / ".gitignore").read_text().splitlines()
    return tuple(line.strip("/") + "/" for line in lines if line.startswith("/") and line.endswith("/"))


def _exists(cited: str) -> bool:
    """A path (or glob) on disk, or a path to a module followed by one of its names, or a place
    below an ignored folder."""
    cited = cited.split("::")[0].rstrip(".")
    if cited.startswith(_ignored_folders()):
        return True
    if "*" in cited:
        return any(ROOT.glob(cited))
    if (ROOT / cited).exists():
        return True
    stem, _, name = cited.rpartition(".")  # hstu_replay/loadtest/options.OPTIONS
    return bool(stem) and (ROOT / f"{stem}.py").is_file() and _defines(ROOT / f"{stem}.py", name)


def _defines(module: Path, name: str) -> bool:
    return re.search(rf"^\s*(?:def |class )?{re.escape(name)}\b", module.read_text(), re.M) is not None


def _module_exists(dotted: str) -> bool:
    parts = dotted.split(".")
    for size in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:size])
        rest = parts[size:]
        if base.is_dir() and not rest:
            return True
        if base.with_suffix(".py").is_file():
            return len(rest) <= 1 and (not rest or _defines(base.with_suffix(".py"), rest[0]))
        if (base / "__init__.py").is_file():
            return len(rest) == 1 and _defines(base / "__init__.py", rest[0])
    return False


def stale_citations(text: str, where: str) -> list[Citation]:
    """Each citation of the page `where` (its `text`) that names nothing real."""
    found = [Citation(where, _line_of(text, m.start()), f"{m.group(1)}: no such file")
             for m in PATH.finditer(text) if not _exists(m.group(1))]
    found += [Citation(where, _line_of(text, m.start()), f"{m.group(1)}: no such module")
              for m in MODULE.finditer(text) if not _module_exists(m.group(1))]
    found += [Citation(where, line, problem) for line, command in _fragments(text)
              for problem in _command_problems(command)]
    return sorted(set(found), key=lambda c: (c.line, c.text))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_script_module_command_and_option_a_page_cites_exists(page):
    stale = stale_citations(page.read_text(), page.relative_to(ROOT).as_posix())
    assert not stale, "\n" + "\n".join(f"{c.page}:{c.line}: {c.text}" for c in stale)


def test_the_check_finds_each_kind_of_stale_citation():
    page = """Measured by `python -m bench.client_cost --seconds 8 --no-such-flag`, then `bench/gone.sh`.

```bash
hstu-replay server serve --repository runs/repo --threads 1 &
hstu-replay server launch --repository runs/repo
hstu-replay nosuch run
locust -f locustfiles/hstu.py --headless -u 1 --hit-ratios 0,1 \\
    --no-such-load-option 3
python -m bench.gone --seconds 1
```

The ledger is `hstu_replay.cache_ledger.CacheLedger`; not `hstu_replay.plan.gone`, nor `--made-up`.
"""
    found = [(c.line, c.text) for c in stale_citations(page, "page.md")]
    assert found == [
        (1, "`--no-such-flag`: no such option of `python`"),
        (1, "bench/gone.sh: no such file"),
        (5, "`hstu-replay server launch`: no such command (choices: " + ", ".join(sorted(_choices("server"))) + ")"),
        (6, "`hstu-replay nosuch`: no such command (choices: " + ", ".join(sorted(_choices())) + ")"),
        (7, "`--no-such-load-option`: no such option of `locust`"),
        (9, "`python -m bench.gone`: no such script bench/gone.py"),
        (9, "bench.gone: no such module"),
        (12, "`--made-up`: no such option"),
        (12, "hstu_replay.plan.gone: no such module"),
    ]


def _choices(*path: str) -> set[str]:
    parser = _cli()
    for word in path:
        parser = _subcommands(parser)[word]
    return set(_subcommands(parser))
