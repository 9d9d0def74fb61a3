"""Each fact named once: the logit tolerance, the batch limit, the hit-ratio range, the KV-cache page,
the offload chunk, the default pool, the default Triton address and ports and a history's tokens
(6 + 2h) have one home each, and no other module of the package writes their value again where it
means them (a default of a parameter, a dataclass field, a keyword, an `Option` or an argparse
argument, a named constant, a bound on a batch size or a hit ratio, the sum 6 + 2h). The C++ replay
keeps its own default tolerance: it must equal Python's.

The scan reads the source (ast), so it also checks itself: planted literals are found, unrelated
8s, 32s, 1s and 6 + 2s are not."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hstu_replay.arguments import HIT_RATIO_RANGE
from hstu_replay.cache_ledger import (
    DEFAULT_OFFLOAD_CHUNK_TOKENS, DEFAULT_PAGE_TOKENS, DEFAULT_POOL_TOKENS, PUBLISHED_POOL_PAGES,
)
from hstu_replay.interface import (
    DEFAULT_ADDRESS, DEFAULT_CACHE_METRICS_PORT, DEFAULT_GRPC_PORT, DEFAULT_HTTP_PORT, DEFAULT_METRICS_PORT,
    NUM_CONTEXT_TOKENS, PUBLISHED_LIMITS,
)
from hstu_replay.verify import DEFAULT_TOLERANCE

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "hstu_replay"


NOTHING = re.compile(r"(?!)")  # a fact no name means: only its `finder` sees it


@dataclass(frozen=True)
class Fact:
    name: str
    value: float | str
    home: str  # the one module (relative to the package) that writes the value
    names: re.Pattern  # parameter, field, option or constant names whose default or value means it
    given: re.Pattern | None = None  # names whose argument in a call means it (None: `names`)
    anywhere: bool = False  # a value no other meaning shares: any literal of it counts
    #: lines that state the fact without naming it (a bound, a sum): (tree, fact) -> line numbers
    finder: Callable[[ast.Module, Fact], Iterator[int]] | None = None

    def means(self, name: str, kind: str) -> bool:
        pattern = self.given if kind == "given" and self.given is not None else self.names
        return bool(pattern.search(name))


def _constant(node: ast.AST | None) -> float | str | None:
    """The number (or text) a literal, or a negated number, writes; None for anything else (bools included)."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _constant(node.operand)
        return -inner if isinstance(inner, (int, float)) else None
    if isinstance(node, ast.Constant) and type(node.value) in (int, float, str):
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
    `add_argument(flag, default=...)`, constants assigned to a name; kind "given": keywords and
    positional arguments of a known signature."""
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
                elif keyword.arg == "default" and called == "add_argument" and node.args:
                    # parser.add_argument("--http-port", default=8000): that argument's default
                    yield keyword.lineno, _flag_name(_constant(node.args[0])), keyword.value, "default"
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


def _enclosing(tree: ast.Module) -> dict[int, list[str]]:
    """id(node) -> the names of the functions it sits in."""
    enclosing: dict[int, list[str]] = {}
    for function in ast.walk(tree):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.walk(function):
                enclosing.setdefault(id(inner), []).append(function.name)
    return enclosing


def _compares(node: ast.AST, values: tuple) -> Iterator[ast.Compare]:
    """The comparisons in `node` with a literal of one of `values` among their operands."""
    for compare in ast.walk(node):
        if isinstance(compare, ast.Compare) and any(
                _constant(o) in values for o in (compare.left, *compare.comparators)):
            yield compare


def _batch_bounds(tree: ast.Module, fact: Fact) -> Iterator[int]:
    """Lines comparing something batch-like with the batch limit: `b <= 8`, `batch > 8` (the
    compared names, or the function it sits in, say batch)."""
    compares = list(_compares(tree, (fact.value,)))
    enclosing = _enclosing(tree) if compares else {}
    for node in compares:
        names = {_name(n) for n in ast.walk(node)} | set(enclosing.get(id(node), []))
        if any(fact.names.search(n) or "batch" in n.lower() for n in names if n):
            yield node.lineno


HIT_RATIO_WORDS = re.compile(r"hit[ _-]ratio", re.I)
ORDER = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)


def _hit_ratio_bounds(tree: ast.Module, fact: Fact) -> Iterator[int]:
    """Lines ordering a hit ratio against the top of its range (`0 <= hit_ratio <= 1`), or anything
    against it in the test of an `if` whose refusal speaks of a hit ratio
    (`if any(r > 1.0 ...): raise ...("--hit-ratios ...")`). A ratio tested for 0, or equal to 1, is
    logic, not the range."""
    def bounds(node: ast.AST) -> Iterator[ast.Compare]:
        return (c for c in _compares(node, (fact.value,)) if all(isinstance(op, ORDER) for op in c.ops))

    for node in bounds(tree):
        if any(HIT_RATIO_WORDS.search(_name(n)) for n in ast.walk(node)):
            yield node.lineno
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and any(
                isinstance(c, ast.Constant) and isinstance(c.value, str) and HIT_RATIO_WORDS.search(c.value)
                for statement in node.body if isinstance(statement, ast.Raise) for c in ast.walk(statement)):
            yield from (compare.lineno for compare in bounds(node.test))


def _context_sums(tree: ast.Module, fact: Fact) -> Iterator[int]:
    """Lines writing a history's tokens as a sum: 6 + 2 * h, NUM_CONTEXT_TOKENS + 2 * h (either order)."""
    def context(node: ast.AST) -> bool:
        return _constant(node) == fact.value or _name(node) == "NUM_CONTEXT_TOKENS"

    def doubled(node: ast.AST) -> bool:
        return (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult)
                and 2 in (_constant(node.left), _constant(node.right)))

    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and (
                (context(node.left) and doubled(node.right)) or (doubled(node.left) and context(node.right))):
            yield node.lineno


def _port(name: str) -> re.Pattern:
    return re.compile(rf"(^|_){name}_port$", re.I)


FACTS = (
    Fact("logit tolerance", DEFAULT_TOLERANCE, "verify.py", re.compile(r"tolerance", re.I), anywhere=True),
    # a batch size given in a call is data (NVIDIA's figures at batch 8); its default or maximum is the limit
    Fact("batch limit", PUBLISHED_LIMITS.max_batch, "interface.py",
         re.compile(r"(^|_)(max_)?batch(_size|_sizes)?$", re.I), given=re.compile(r"max_batch", re.I),
         finder=_batch_bounds),
    # a hit ratio given or defaulted is data (0.5, 1.0); only a bound of its range restates the fact
    Fact("hit-ratio range", HIT_RATIO_RANGE[1], "arguments.py", NOTHING, finder=_hit_ratio_bounds),
    Fact("KV-cache page", DEFAULT_PAGE_TOKENS, "cache_ledger.py", re.compile(r"page_tokens$", re.I)),
    Fact("offload chunk", DEFAULT_OFFLOAD_CHUNK_TOKENS, "cache_ledger.py", re.compile(r"chunk_tokens$", re.I)),
    Fact("default pool", DEFAULT_POOL_TOKENS, "cache_ledger.py", NOTHING, anywhere=True),
    Fact("published pool pages", PUBLISHED_POOL_PAGES, "cache_ledger.py", NOTHING, anywhere=True),
    Fact("default address", DEFAULT_ADDRESS, "interface.py", NOTHING, anywhere=True),
    Fact("HTTP port", DEFAULT_HTTP_PORT, "interface.py", _port("http")),
    Fact("gRPC port", DEFAULT_GRPC_PORT, "interface.py", _port("grpc")),
    Fact("metrics port", DEFAULT_METRICS_PORT, "interface.py", _port("metrics")),
    Fact("cache-metrics port", DEFAULT_CACHE_METRICS_PORT, "interface.py", _port("cache_metrics")),
    Fact("history tokens", NUM_CONTEXT_TOKENS, "interface.py", NOTHING, finder=_context_sums),
)


def scan(sources: dict[str, str]) -> list[str]:
    """`module:line fact value` for each fact's value written outside its home."""
    trees = {path: ast.parse(text, path) for path, text in sources.items()}
    signatures = _signatures(trees)
    found = []
    for path, tree in trees.items():
        literals = [(n.lineno, _constant(n)) for n in ast.walk(tree) if isinstance(n, (ast.Constant, ast.UnaryOp))]
        uses = [(line, name, _constant(value), kind) for line, name, value, kind in _uses(tree, signatures)]
        for fact in FACTS:
            if path == fact.home:
                continue
            lines = set()
            if fact.anywhere:
                lines |= {line for line, value in literals if value == fact.value}
            lines |= {line for line, name, value, kind in uses if value == fact.value and fact.means(name, kind)}
            if fact.finder is not None:
                lines |= set(fact.finder(tree, fact))
            found += [f"{path}:{line} {fact.name} {fact.value}" for line in sorted(lines)]
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


def ratios(text, hit_ratio):
    if not 0.0 <= hit_ratio <= 1.0:                 # 32: a hit-ratio bound, by name
        raise ValueError
    if any(r > 1.0 for r in text):                  # 34: a bound whose refusal names a hit ratio
        raise ConfigError("--hit-ratios: use 0..1")
    return 6 + 2 * len(text), 2 * hit_ratio + NUM_CONTEXT_TOKENS   # 36: history tokens, twice


ADDRESS = "127.0.0.1:8001"                          # 39: the default address
POOL = 3_276_800                                    # 40: the default pool
PAGES = 102_400                                     # 41: its pages


@dataclass
class Serve:
    http_port: int = 8000                           # 46: the four default ports
    grpc_port: int = 8001                           # 47
    metrics_port: int = 8002                        # 48
    cache_metrics_port: int = 8003                  # 49


def wait(parser):
    parser.add_argument("--http-port", type=int, default=8000)   # 53: an argparse default
    Option("--grpc-port", "the gateway's gRPC port", 8001)       # 54: an option's default
    Serve(grpc_port=8001)                                        # 55: a keyword
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


def fractions(share, hit_ratio, error_ratio, target, port: int = 8000, base: int = 8001):
    if hit_ratio == 1 or hit_ratio > 0 or target < 1.0:   # logic on a ratio, not its range
        share = 1.0
    if error_ratio > 1.0 or share > 1:
        raise ConfigError("--slo-error-ratio: use 0..1")
    Server(http_port=0, grpc_port=port, metrics_port=base)
    return 6 + 3 * share, 2 * share + 7, 6 * 2, "127.0.0.1:8002", "http://127.0.0.1:8001", 8001, 8003
'''


def test_the_scan_finds_planted_literals_and_leaves_unrelated_numbers_alone():
    found = scan({"planted.py": PLANTED, "verify.py": "DEFAULT_TOLERANCE = 0.0625\n", "unrelated.py": UNRELATED})
    lines = sorted({int(f.split(":")[1].split()[0]) for f in found if f.startswith("planted.py:")})
    assert lines == [4, 5, 8, 9, 14, 15, 19, 21, 22, 23, 24, 28,
                     32, 34, 36, 39, 40, 41, 46, 47, 48, 49, 53, 54, 55], found
    assert sum(f.startswith("planted.py:36 history tokens") for f in found) == 1  # one line, however many sums
    assert [f for f in found if not f.startswith("planted.py:")] == []  # the home and the unrelated file


@pytest.mark.parametrize("line, fact", [
    ("    tolerance: float = 0.0625\n", "logit tolerance"),
    ("    page_tokens: int = 32\n", "KV-cache page"),
    ("    offload_chunk_tokens: int = 1024\n", "offload chunk"),
    ("    fits: bool = 1 <= batch_size <= 8\n", "batch limit"),
    ("    in_range: bool = 0.0 <= hit_ratio <= 1.0\n", "hit-ratio range"),
    ("    url: str = \"127.0.0.1:8001\"\n", "default address"),
    ("    budget_tokens: int = 3_276_800\n", "default pool"),
    ("    pool_pages: int = 102_400\n", "published pool pages"),
    ("    http_port: int = 8000\n", "HTTP port"),
    ("    grpc_port: int = 8001\n", "gRPC port"),
    ("    metrics_port: int = 8002\n", "metrics port"),
    ("    cache_metrics_port: int = 8003\n", "cache-metrics port"),
    ("    tokens: int = 6 + 2 * 4096\n", "history tokens"),
])
def test_a_literal_planted_in_a_real_module_fails_the_scan(line, fact):
    module = "loadtest/config.py"
    text = (PACKAGE / module).read_text()
    anchor = "class CheckConfig:\n"
    assert scan({module: text}) == []
    assert any(f.startswith(f"{module}:") and fact in f for f in scan({module: text.replace(anchor, anchor + line, 1)}))


def test_the_cpp_replay_default_tolerance_is_pythons():
    source = (ROOT / "cpp" / "replay" / "hstu_replay_dump.cpp").read_text()
    defaults = re.findall(r"double tolerance = ([0-9.eE+-]+);", source)
    usage = re.findall(r"\[--tolerance ([0-9.eE+-]+)\]", source)
    assert len(defaults) == 1 and len(usage) == 1, (defaults, usage)
    assert float(defaults[0]) == float(usage[0]) == DEFAULT_TOLERANCE
