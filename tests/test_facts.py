"""Each fact named once: the logit tolerance, the batch limit, the KV-cache page and the offload
chunk have one home each, and no other module of the package writes their value again where it
means them (a default of a parameter, a dataclass field, a keyword, an `Option`, a named constant,
a bound on a batch size). The C++ replay keeps its own default tolerance: it must equal Python's.

The scan reads the source (ast), so it also checks itself: planted literals are found, unrelated
8s and 32s are not."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from hstu_replay.cache_ledger import DEFAULT_OFFLOAD_CHUNK_TOKENS, DEFAULT_PAGE_TOKENS
from hstu_replay.interface import PUBLISHED_LIMITS
from hstu_replay.verify import DEFAULT_TOLERANCE

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "hstu_replay"


@dataclass(frozen=True)
class Fact:
    name: str
    value: float
    home: str  # the one module (relative to the package) that writes the value
    names: re.Pattern  # parameter, field, option or constant names whose default or value means it
    given: re.Pattern | None = None  # names whose argument in a call means it (None: `names`)
    anywhere: bool = False  # a value no other meaning shares: any literal of it counts

    def means(self, name: str, kind: str) -> bool:
        pattern = self.given if kind == "given" and self.given is not None else self.names
        return bool(pattern.search(name))


FACTS = (
    Fact("logit tolerance", DEFAULT_TOLERANCE, "verify.py", re.compile(r"tolerance", re.I), anywhere=True),
    # a batch size given in a call is data (NVIDIA's figures at batch 8); its default or maximum is the limit
    Fact("batch limit", PUBLISHED_LIMITS.max_batch, "interface.py",
         re.compile(r"(^|_)(max_)?batch(_size|_sizes)?$", re.I), given=re.compile(r"max_batch", re.I)),
    Fact("KV-cache page", DEFAULT_PAGE_TOKENS, "cache_ledger.py", re.compile(r"page_tokens$", re.I)),
    Fact("offload chunk", DEFAULT_OFFLOAD_CHUNK_TOKENS, "cache_ledger.py", re.compile(r"chunk_tokens$", re.I)),
)


def _constant(node: ast.AST | None) -> float | None:
    """The number a literal (or a negated one) writes; None for anything else (bools included)."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _constant(node.operand)
        return None if inner is None else -inner
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    return None


def _name(node: ast.AST) -> str:
    """The last name of `a`, `a.b` or a call's function; '' for anything else."""
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _flag_name(flag: object) -> str:
    return str(flag).lstrip("-").replace("-", "_") if isinstance(flag, str) else ""


def _signatures(trees: dict[str, ast.Module]) -> dict[str, list[list[str]]]:
    """Function name -> the positional parameter names of every def of that name in the package."""
    out: dict[str, list[list[str]]] = {}
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names = [a.arg for a in node.args.posonlyargs + node.args.args]
                if names and names[0] in ("self", "cls"):
                    names = names[1:]
                out.setdefault(node.name, []).append(names)
            elif isinstance(node, ast.ClassDef) and any("dataclass" in ast.unparse(d) for d in node.decorator_list):
                # a dataclass's fields are its constructor's positions
                fields = [s.target.id for s in node.body if isinstance(s, ast.AnnAssign)
                          and isinstance(s.target, ast.Name)]
                if fields:
                    out.setdefault(node.name, []).append(fields)
    return out


def _uses(tree: ast.Module, signatures: dict[str, list[list[str]]]):
    """(line, name, value node, kind) for every place a named value is written. Kind "default":
    defaults of parameters, class fields, `Option(flag, help, default)`, `X.add_to/but(default=...)`,
    constants assigned to a name; kind "given": keywords and positional arguments of a known signature."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            positional = args.posonlyargs + args.args
            for arg, default in zip(positional[len(positional) - len(args.defaults):], args.defaults):
                yield default.lineno, arg.arg, default, "default"
            for arg, default in zip(args.kwonlyargs, args.kw_defaults):
                if default is not None:
                    yield default.lineno, arg.arg, default, "default"
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            yield node.lineno, node.target.id, node.value, "default"
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    yield node.lineno, target.id, node.value, "default"
        elif isinstance(node, ast.Call):
            called = _name(node)
            for keyword in node.keywords:
                if keyword.arg is None:
                    continue
                if keyword.arg == "default" and called in ("add_to", "but") and isinstance(node.func, ast.Attribute):
                    # BATCH_SIZE.add_to(parser, default=8): that option's default for one command
                    yield keyword.lineno, _name(node.func.value), keyword.value, "default"
                else:
                    yield keyword.lineno, keyword.arg, keyword.value, "given"
            if called == "Option" and node.args:
                flag = node.args[0].value if isinstance(node.args[0], ast.Constant) else None
                default = node.args[2] if len(node.args) > 2 else next(
                    (k.value for k in node.keywords if k.arg == "default"), None)
                if default is not None:
                    yield node.lineno, _flag_name(flag), default, "default"
            shapes = signatures.get(called, [])
            for i, value in enumerate(node.args):
                names = {s[i] if i < len(s) else "" for s in shapes}
                if len(names) == 1 and "" not in names:  # every def of that name agrees on the position
                    yield value.lineno, names.pop(), value, "given"


def _batch_bounds(tree: ast.Module, fact: Fact):
    """Lines comparing something batch-like with the batch limit: `b <= 8`, `batch > 8` (the
    compared names, or the function it sits in, say batch)."""
    functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    enclosing = {}
    for function in functions:
        for inner in ast.walk(function):
            enclosing.setdefault(id(inner), []).append(function.name)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        if not any(_constant(o) == fact.value for o in operands):
            continue
        names = {_name(n) for n in ast.walk(node)} | set(enclosing.get(id(node), []))
        if any(fact.names.search(n) or "batch" in n.lower() for n in names if n):
            yield node.lineno


def scan(sources: dict[str, str]) -> list[str]:
    """`module:line fact value` for each fact's value written outside its home."""
    trees = {path: ast.parse(text, path) for path, text in sources.items()}
    signatures = _signatures(trees)
    found = []
    for path, tree in trees.items():
        for fact in FACTS:
            if path == fact.home:
                continue
            lines = set()
            if fact.anywhere:
                lines |= {n.lineno for n in ast.walk(tree) if _constant(n) == fact.value}
            lines |= {line for line, name, value, kind in _uses(tree, signatures)
                      if fact.means(name, kind) and _constant(value) == fact.value}
            if fact.name == "batch limit":
                lines |= set(_batch_bounds(tree, fact))
            found += [f"{path}:{line} {fact.name} {fact.value:g}" for line in sorted(lines)]
    return found


def package_sources() -> dict[str, str]:
    return {str(p.relative_to(PACKAGE)): p.read_text() for p in sorted(PACKAGE.rglob("*.py"))}


def test_every_fact_is_written_only_in_its_home():
    sources = package_sources()
    assert len(sources) > 100 and all(f.home in sources for f in FACTS)
    assert scan(sources) == []


PLANTED = '''
from dataclasses import dataclass

TOLERANCE = 0.0625                                  # 4: a tolerance constant
OFFLOAD_CHUNK_TOKENS = 1024                         # 5: the chunk again


def serve(page_tokens: int = 32, *, chunk_tokens=1024):   # 8: page, chunk defaults
    return within(0.0625)                           # 9: the tolerance, anywhere


@dataclass
class Cache:
    max_batch: int = 8                              # 14: a batch field
    page_tokens: int = 32                           # 15: a page field


def check(b, batch_size):
    if not 1 <= batch_size <= 8:                    # 19: a batch bound
        raise ValueError
    Option("--cache-page-tokens", "page size", 32, int)   # 21: an option's default
    BATCH_SIZE.add_to(parser, default=8)            # 22: an option's default for one command
    Limits(max_batch=8)                             # 23: a keyword
    serve(32)                                       # 24: a positional argument of a known signature


def _batches(sizes):
    return [b for b in sizes if b > 8]              # 28: a bound inside a batch function
'''

UNRELATED = '''
_MAX_DIMS = 32
NUM_TASKS = 8
WINDOW = 16 * 1024 * 1024


def split(rows, width: int = 32, tasks: int = 8, batches: int = 8, chunk: int = 256 * 1024):
    DUMP_BATCHES.add_to(parser, default=8)
    Figure(layers=3, batch_size=8, hit_ms=0.4)
    Option("--threads", "threads", 8, int)
    shape = (-1, 8)
    return [r >> 8 for r in rows[:32]], range(8), len(rows) > 8, width * 1024
'''


def test_the_scan_finds_planted_literals_and_leaves_unrelated_numbers_alone():
    found = scan({"planted.py": PLANTED, "verify.py": "DEFAULT_TOLERANCE = 0.0625\n", "unrelated.py": UNRELATED})
    lines = sorted({int(f.split(":")[1].split()[0]) for f in found if f.startswith("planted.py:")})
    assert lines == [4, 5, 8, 9, 14, 15, 19, 21, 22, 23, 24, 28], found
    assert [f for f in found if not f.startswith("planted.py:")] == []  # the home and the unrelated file


@pytest.mark.parametrize("line, fact", [
    ("    tolerance: float = 0.0625\n", "logit tolerance"),
    ("    page_tokens: int = 32\n", "KV-cache page"),
    ("    offload_chunk_tokens: int = 1024\n", "offload chunk"),
])
def test_a_literal_planted_in_a_real_module_fails_the_scan(line, fact):
    sources = package_sources()
    module = "loadtest/config.py"
    text = sources[module]
    anchor = "class CheckConfig:\n"
    sources[module] = text.replace(anchor, anchor + line, 1)
    assert any(f.startswith(f"{module}:") and fact in f for f in scan(sources))


def test_the_cpp_replay_default_tolerance_is_pythons():
    source = (ROOT / "cpp" / "replay" / "hstu_replay_dump.cpp").read_text()
    defaults = re.findall(r"double tolerance = ([0-9.eE+-]+);", source)
    usage = re.findall(r"\[--tolerance ([0-9.eE+-]+)\]", source)
    assert len(defaults) == 1 and len(usage) == 1, (defaults, usage)
    assert float(defaults[0]) == float(usage[0]) == DEFAULT_TOLERANCE
