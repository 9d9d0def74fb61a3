"""Every command block of the README and the guides, run as a reader runs it, against the reference target.

Each `bash` block is one entry of `PLAN`: run (its text as a shell script, in a workspace of its
page's own, after the rewrites below) or skipped with the reason a test cannot run it here. A
block with no entry, or an entry whose block is gone, fails the quick loop: a guide's new command
is decided on, never silently left out.

What a run changes, and nothing else:
- placeholders of the reader's own hosts (`triton-host:8001`, `triton:8001`, `MASTER_HOST`) name
  the reference server on this machine, serving the quick start's model on `server serve`'s own
  ports (127.0.0.1:8001, HTTP 8000, metrics 8002 and 8003);
- the quick start's workspace starts with the suite's compiled small model (its `server export` then
  finds it current; compiling is tested apart), and the other pages' workspaces with the quick
  start's model, store and dumps;
- optional parts written `[--flag value]` are left out;
- a server the guide leaves running in a terminal (`hstu-replay server serve` or `fleet serve`
  without `&`) is started in the background and awaited; everything a block started is stopped
  after it;
- each entry's `edits` (guide text -> what runs), each with its reason;
- `tests/docs/guide_wrap.py`: Locust runs and capacity steps shortened, every headless run's report
  read (a stage with a failed or mismatched request fails the block), the web UI asked for its
  page and stopped.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from hstu_replay.process import ServerProcess

ROOT = Path(__file__).resolve().parents[2]
PAGES = ("README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs" / "guides").glob("*.md")))
BLOCK_TIMEOUT_S = 900.0
STOP_GRACE_S = 60.0
SERVE_READY_S = 300.0


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # of its opening fence
    text: str

    @property
    def first(self) -> str:
        return next(line for line in self.text.splitlines() if line.strip())


@dataclass(frozen=True)
class Run:
    why: str = ""  # the reason for the edits, where there are any
    edits: tuple[tuple[str, str], ...] = ()  # (guide text, what runs instead)
    server: bool = False  # it talks to a server it does not start (the reader's own: here the reference server)
    own_ports: bool = False  # it serves on `server serve`'s own ports itself (the shared server steps aside)
    seeds: tuple[str, ...] = ("model_repository", "store", "dumps")  # the quick start's runs/ it builds on


@dataclass(frozen=True)
class Skip:
    reason: str


QUICK_START = "hstu-replay data synth --out runs/raw --users 16"
GATEWAY_FLEET = ("hstu-replay fleet serve --servers 2 --repository runs/model_repository --gateway hash "
                 "--routing-header x-hstu-route --base-port 9000 --gateway-grpc-port 9100 --gateway-http-port 9101")
SHORT_CAPACITY = (("--users-steps 1,2,4,8,16", "--users-steps 1,4"),)
CPU_THRESHOLDS = (("--max-p99-ms 0:300,1.0:120 --min-speedup 1.0:1.5", "--max-p99-ms 0:60000,1.0:60000 --min-speedup 1.0:0.1"),)

#: (page, the start of the block's first line) -> how the block runs
PLAN: dict[tuple[str, str], Run | Skip] = {
    ("README.md", "bash scripts/demo.sh"): Run(
        "the demo alone (the second command is this suite); its outputs in the workspace, not the checkout, "
        "and the quick start's compiled model",
        edits=(("bash scripts/demo.sh", f"OUT=$PWD/runs/demo REPO=$PWD/runs/model_repository bash {ROOT}/scripts/demo.sh"),
               ("bash scripts/test.sh", "true")), seeds=(), own_ports=True),
    ("README.md", "git clone <this repository>"): Skip(
        "installs into the reader's own clone and venv; tests/test_wheel.py installs this tree into a fresh venv "
        "and runs a sweep from it"),
    ("README.md", "pip wheel --no-deps"): Skip(
        "tests/test_wheel.py builds this wheel (pip wheel --no-deps) and installs it into a fresh venv"),
    ("README.md", QUICK_START): Run(seeds=(), own_ports=True),
    ("README.md", "locust -f locustfiles/hstu.py --headless -u 4 -r 4 --host grpc://triton-host:8001"): Run(server=True),
    ("docs/guides/capacity.md", "hstu-replay capacity run"): Run(
        "two user steps of the guide's five", edits=SHORT_CAPACITY, server=True),
    ("docs/guides/ci.md", "locust -f locustfiles/hstu.py --headless --only-summary"): Run(
        "the guide's latency goals are a GPU server's; on this CPU they would judge the machine",
        edits=CPU_THRESHOLDS, server=True),
    ("docs/guides/data.md", "hstu-replay data synth --out runs/raw --users 200"): Run(seeds=()),
    ("docs/guides/data.md", "hstu-replay data synth --out runs/raw27k"): Skip(
        "writes ~24 GB of synthetic KuaiRand-27K; docs/benchmarks/data-preparation.md measures this command"),
    ("docs/guides/distributed.md", "locust -f locustfiles/hstu.py --master"): Run(
        "the master waits for its workers, so it is started first, in the background; the worker line runs "
        "twice, as the guide says",
        edits=(("--report-dir runs/dist", "--report-dir runs/dist &"),
               ("--master-host MASTER_HOST", "--master-host MASTER_HOST & locust -f locustfiles/hstu.py --worker "
                                             "--master-host MASTER_HOST & wait %1")),
        server=True),
    ("docs/guides/fleet.md", "locust -f locustfiles/hstu.py --headless -u 8 -r 8 \\"): Skip(
        "three servers at the reader's own addresses (10.0.0.x); the same options run against a local fleet "
        "in tests/loadtest/test_fleet.py"),
    ("docs/guides/fleet.md", "locust -f locustfiles/hstu.py --headless -u 8 -r 8 --host grpc://127.0.0.1:9100"): Run(
        "the fleet and gateway it runs against, the command of the block below, started first",
        edits=(("locust -f locustfiles/hstu.py --headless -u 8 -r 8 --host grpc://127.0.0.1:9100",
                f"{GATEWAY_FLEET}\nlocust -f locustfiles/hstu.py --headless -u 8 -r 8 --host grpc://127.0.0.1:9100"),)),
    ("docs/guides/fleet.md", "hstu-replay server export --repository runs/model_repository      # once"): Run(
        "the compiled model comes from the quick start", edits=(("hstu-replay server export", "true"),)),
    ("docs/guides/fleet.md", "hstu-replay fleet serve --servers 2 --repository runs/model_repository --gateway"): Skip(
        "the same command is started (and awaited serving) by the run of the gateway block above"),
    ("docs/guides/fleet.md", "hstu-replay fleet gateway-config"): Run(),
    ("docs/guides/load-test.md", "locust -f locustfiles/hstu.py "): Run(server=True),
    ("docs/guides/natural-replay.md", "hstu-replay plan cache-curve"): Run(
        "the log's own pace (--time-scale 144) would send next to nothing in a shortened stage: back to back instead",
        edits=(("--time-scale 144", "--time-scale 0"),), server=True),
    ("docs/guides/nvidia-flows.md", "hstu-replay flow l0"): Run(
        "the compiled model comes from the quick start (the flow's export, compiling, runs in tests/flow/test_l0.py)",
        edits=(("hstu-replay flow l0 --out runs/l0", "hstu-replay flow l0 --export-from runs/model_repository "
                                                      "--out runs/l0"),)),
    ("docs/guides/nvidia-flows.md", "hstu-replay protocol run"): Run(server=True),
    ("docs/guides/nvidia-flows.md", "hstu-replay cpp-replay build"): Run(),
    ("docs/guides/own-triton.md", "locust -f locustfiles/hstu.py --headless -u 4 -r 4 --host grpc://triton-host"): Run(
        server=True),
    ("docs/guides/own-triton.md", "hstu-replay server serve --repository runs/model_repository --tls-cert"): Skip(
        "needs the reader's certificate and secret (and `...` for their other options); tests/loadtest/test_tls.py "
        "runs these servers and runs with a test certificate"),
    ("docs/guides/reference-server.md", "hstu-replay server export --repository runs/model_repository --config small"):
        Run("the compiled model comes from the quick start", edits=(("hstu-replay server export", "true"),),
            own_ports=True),
    ("docs/guides/reference-server.md", "hstu-replay server serve --engine batched --config kuairand-1k"): Skip(
        "needs a CUDA GPU"),
    ("docs/guides/reference-server.md", "hstu-replay server serve --engine batched --frontend python-backend"): Skip(
        "needs a CUDA GPU"),
    ("docs/guides/reference-server.md", "hstu-replay server serve --frontend cpp-backend --config kuairand-1k"): Skip(
        "its first command needs a CUDA GPU; the second (CI's case) runs in tests/server/test_cpp_backend.py"),
    ("docs/guides/reference-server.md", "cmake -S cpp/backend"): Skip(
        "tests/server/test_cpp_backend.py builds the backend with these CMake arguments (hstu_replay/cmake_build.py)"),
    ("docs/guides/reference-server.md", "hstu-replay server serve --engine batched --config small"): Skip(
        "its bench needs a CUDA GPU; tests/server/test_serve_host_tier.py serves this host tier"),
    ("docs/guides/web-ui.md", "locust -f locustfiles/hstu.py"): Run(server=True),
}


def blocks() -> list[Block]:
    found = []
    for page in PAGES:
        lines = (ROOT / page).read_text().splitlines()
        start = None
        for i, line in enumerate(lines):
            if start is None and line.strip() == "```bash":
                start = i
            elif start is not None and line.strip() == "```":
                found.append(Block(page, start + 1, "\n".join(lines[start + 1:i])))
                start = None
    return found


def entry(block: Block) -> tuple[tuple[str, str], Run | Skip]:
    matches = [(key, how) for key, how in PLAN.items() if key[0] == block.page and block.first.startswith(key[1])]
    assert matches, f"{block.page}:{block.line}: no PLAN entry for the block starting {block.first!r}"
    return max(matches, key=lambda m: len(m[0][1]))  # the most specific


def test_every_block_is_decided_on():
    used = [entry(block)[0] for block in blocks()]
    assert len(used) == len(set(used)), "an entry matches more than one block"
    assert set(PLAN) == set(used), f"entries whose block is gone: {set(PLAN) - set(used)}"
    for how in PLAN.values():
        assert not isinstance(how, Run) or not how.edits or how.why, "edits without a reason"


def script(block: Block, run: Run) -> str:
    """The block as the shell runs it (see the module's docstring)."""
    text = block.text
    for old, new in run.edits:
        assert old in text, f"{block.page}:{block.line}: the edit's text {old!r} is no longer in the guide"
        text = text.replace(old, new)
    text = text.replace("\\\n", " ")
    text = re.sub(r" \[[^\]\n]*\]", "", text)
    text = re.sub(r"(grpc://)?\b(triton-host|triton):8001\b", "grpc://127.0.0.1:8001", text)
    text = text.replace("MASTER_HOST", "127.0.0.1")
    lines = []
    for line in text.splitlines():
        command = line.split(" #")[0].rstrip()
        if re.match(r"hstu-replay (server|fleet) serve\b", command) and not command.endswith("&"):
            line = f"guide_serve {command}"
        lines.append(line)
    return PRELUDE + "\n".join(lines) + "\n"


PRELUDE = f"""set -eo pipefail
locust() {{ {sys.executable} -m tests.docs.guide_wrap locust "$@"; }}
hstu-replay() {{ {sys.executable} -m tests.docs.guide_wrap hstu-replay "$@"; }}
served=0
guide_serve() {{  # a server the reader leaves running in a terminal of its own
    served=$((served + 1)); local log="runs/guide-serve-$served.log"
    "$@" >"$log" 2>&1 &
    local pid=$! waited=0
    until grep -q "serving" "$log"; do
        if ! kill -0 $pid 2>/dev/null || [ $waited -ge {int(SERVE_READY_S)} ]; then cat "$log"; return 1; fi
        sleep 1; waited=$((waited + 1))
    done
}}
mkdir -p runs
"""


def stop_session(process: subprocess.Popen) -> None:
    """Everything the block started (its own session) asked to stop, then killed."""
    for sig, wait in ((signal.SIGINT, STOP_GRACE_S), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(process.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.25)


class Workspaces:
    """One folder per page, seeded from the quick start's; the reference server on its default
    ports while a block needs one it does not start."""

    def __init__(self, root: Path, compiled: Path):
        self.root = root
        self.compiled = compiled  # the suite's compiled small model (tests/conftest.py)
        self.server: ServerProcess | None = None

    @property
    def quick_start(self) -> Path:
        return self.root / "README.md"

    def of(self, block: Block, run: Run) -> Path:
        folder = self.root / block.page.replace("/", "_")
        if not folder.exists():
            (folder / "runs").mkdir(parents=True)
            for name in ("locustfiles", "bench", "cpp"):
                (folder / name).symlink_to(ROOT / name)
            if folder == self.quick_start:  # `server export` then finds it current (compiling is tested apart)
                shutil.copytree(self.compiled, folder / "runs" / "model_repository")
        for seed in run.seeds:
            target = folder / "runs" / seed
            if not target.exists():
                shutil.copytree(self.quick_start / "runs" / seed, target)
        return folder

    def serve(self, run: Run) -> None:
        """The shared server up where `run` needs it, stopped (its ports free) where the block takes them."""
        wanted = run.server and not run.own_ports
        if wanted and self.server is None:
            from hstu_replay.process import Ports

            self.server = ServerProcess.serve(self.quick_start / "runs" / "model_repository",
                                              self.root / "server.log", Ports(8000, 8001, 8002, 8003))
            self.server.start()
            self.server.wait_ready()
        elif run.own_ports and self.server is not None:
            teardown = self.server.stop()
            self.server = None
            assert teardown.clean, f"the shared server left {teardown.left}"


@pytest.fixture(scope="module")
def workspaces(tmp_path_factory, compiled_repository):
    spaces = Workspaces(tmp_path_factory.mktemp("guides"), compiled_repository)
    yield spaces
    spaces.serve(Run(own_ports=True))


def runnable() -> list[Block]:
    """Every block that runs, the quick start first (the others build on what it made)."""
    ordered = sorted(blocks(), key=lambda b: not b.first.startswith(QUICK_START))
    return [b for b in ordered if isinstance(entry(b)[1], Run)]


@pytest.mark.integration
@pytest.mark.parametrize("block", runnable(), ids=lambda b: f"{b.page}:{b.line}")
def test_the_guide_command_runs(block, workspaces):
    run = entry(block)[1]
    assert isinstance(run, Run)
    if block.page != "README.md" or not block.first.startswith(QUICK_START):
        assert (workspaces.quick_start / "runs" / "model_repository").exists(), "the quick start did not run"
    folder = workspaces.of(block, run)
    workspaces.serve(run)
    (folder / "block.sh").write_text(script(block, run))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    with (folder / "block.log").open("w") as log:
        process = subprocess.Popen(["bash", str(folder / "block.sh")], cwd=folder, env=env, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = process.wait(BLOCK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            stop_session(process)
    output = (folder / "block.log").read_text()
    assert code == 0, f"{block.page}:{block.line} exit {code}:\n{output[-6000:]}"
