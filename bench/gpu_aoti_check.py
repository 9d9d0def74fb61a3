"""Why AOTInductor packages crash at load on a machine: compile and load a tiny package in one process.

    python -m bench.gpu_aoti_check --out runs/aoti-check        # every variant, each in its own process
    python -m bench.gpu_aoti_check --variant cuda                # one variant, in this process

Each variant exports a one-layer Linear + SiLU (static shapes), compiles it with
`aoti_compile_and_package` where it runs (same torch on both sides), loads it with the loader
`server serve` uses (`AOTIModelPackageLoader`) and compares one call with eager. Variants run at
once, each in its own process and inductor cache. A variant that dies is reported with its signal
and the last lines of Python's faulthandler dump; with `--backtrace`, a crashing variant runs
again under cuda-gdb for a native backtrace. Also reported: where the compiler finds libstdc++,
and whether each package's library carries its own copy of the C++ runtime's locale code.
Prints one JSON line per variant and writes `aoti_check.json` under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hstu_replay.inspection import mapped_paths

#: variant -> (device, inductor options or "fix": `aoti.runtime_link_options(force=True)`)
VARIANTS: dict[str, tuple[str, dict | str]] = {
    "cpu": ("cpu", {}),
    "cuda": ("cuda", {}),
    "cpu-shared-libstdcxx": ("cpu", "fix"),
    "cuda-shared-libstdcxx": ("cuda", "fix"),
}


def run_variant(name: str) -> dict:
    import torch

    from hstu_replay.server.aoti import runtime_link_options

    device, options = VARIANTS[name]
    if options == "fix":
        options = runtime_link_options(force=True)
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.SiLU()).to(device).eval()
    x = torch.randn(8, 64, device=device)
    folder = Path(tempfile.mkdtemp(prefix=f"aoti-{name}-"))
    started = time.perf_counter()
    with torch.no_grad():
        program = torch.export.export(module, (x,))
        path = torch._inductor.aoti_compile_and_package(program, package_path=str(folder / "model.pt2"),
                                                        inductor_configs=options)
    compiled = time.perf_counter() - started
    print(f"[{name}] compiled in {compiled:.1f} s: {path}", file=sys.stderr, flush=True)
    print(json.dumps({"variant": name, "library": library_facts(path)}), flush=True)
    loader = torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, -1)
    print(f"[{name}] loaded", file=sys.stderr, flush=True)
    with torch.no_grad():
        got = loader.run([x])[0]
        want = module(x)
    diff = float((got - want).abs().max())
    shutil.rmtree(folder, ignore_errors=True)
    return {"variant": name, "ok": diff < 1e-3, "max_abs_diff": diff, "compile_s": round(compiled, 1)}


def library_facts(package: str) -> dict:
    """The package's shared library: what it links, and whether it defines libstdc++'s locale itself."""
    import zipfile

    with zipfile.ZipFile(package) as archive, tempfile.TemporaryDirectory() as folder:
        names = [n for n in archive.namelist() if n.endswith(".so")]
        facts = {}
        for name in names:
            target = archive.extract(name, folder)
            needed = subprocess.run(["readelf", "-d", target], capture_output=True, text=True).stdout
            symbols = subprocess.run(["nm", "-D", "--defined-only", target], capture_output=True, text=True).stdout
            facts[Path(name).name] = {
                "needed": [line.split("[")[1].rstrip("]") for line in needed.splitlines() if "(NEEDED)" in line],
                "defines_std_locale": sum("_ZNSt6locale" in line for line in symbols.splitlines()),
                "bytes": os.path.getsize(target)}
        return facts


def environment() -> dict:
    import torch

    gcc = shutil.which("gcc") or shutil.which("cc")
    version = subprocess.run([gcc, "--version"], capture_output=True, text=True).stdout.splitlines()[0] if gcc else None
    found = subprocess.run([gcc, "-print-file-name=libstdc++.so"], capture_output=True, text=True).stdout.strip() \
        if gcc else None
    return {"libstdcxx_for_linking": found, "libstdcxx_link_exists": bool(found and os.path.exists(found)),
            "libstdcxx_loaded": sorted(path for path in mapped_paths() if "libstdc++" in path),
            "python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
            "torch_compiler": torch.__config__.show().split("GCC")[1].split("\n")[0].strip() if "GCC" in
            torch.__config__.show() else None, "gcc": version, "kernel": platform.release(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def child_command(name: str) -> list[str]:
    return [sys.executable, "-X", "faulthandler", "-m", "bench.gpu_aoti_check", "--variant", name]


def start_child(name: str) -> subprocess.Popen:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=tempfile.mkdtemp(prefix=f"inductor-{name}-"))
    return subprocess.Popen(child_command(name), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def finish_child(name: str, child: subprocess.Popen, started: float, timeout: float, backtrace: bool) -> dict:
    command = child_command(name)
    try:
        stdout, stderr = child.communicate(timeout=max(1.0, timeout - (time.perf_counter() - started)))
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        return {"variant": name, "ok": False, "error": f"timed out after {timeout:.0f} s"}
    result = {"variant": name, "exit": child.returncode, "seconds": round(time.perf_counter() - started, 1)}
    lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    for line in lines:
        result |= line
    if child.returncode != 0 or "ok" not in result:
        result |= {"ok": False, "stderr_tail": stderr.splitlines()[-12:]}
        gdb = shutil.which("cuda-gdb")
        if backtrace and child.returncode < 0 and gdb:
            trace = subprocess.run([gdb, "-batch", "-ex", "set pagination off", "-ex", "run", "-ex", "bt 40",
                                    "--args", *command], capture_output=True, text=True, timeout=timeout)
            result["backtrace"] = [line for line in trace.stdout.splitlines() if line.startswith("#")][:40]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=sorted(VARIANTS), help="run one variant in this process")
    parser.add_argument("--out", help="folder for aoti_check.json")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds per variant (default 240)")
    parser.add_argument("--backtrace", action="store_true", help="re-run a crashing variant under cuda-gdb")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="variants to run (default all)")
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(run_variant(args.variant)), flush=True)
        return 0
    report = {"environment": environment(), "variants": []}
    print(json.dumps(report["environment"]), flush=True)
    names = args.variants.split(",")
    for name in names:
        if name not in VARIANTS:
            print(f"--variants: unknown {name!r} (known: {', '.join(VARIANTS)})", file=sys.stderr)
            return 2
    started = time.perf_counter()
    children = {name: start_child(name) for name in names}
    for name, child in children.items():
        result = finish_child(name, child, started, args.timeout, args.backtrace)
        report["variants"].append(result)
        print(json.dumps(result), flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        Path(args.out, "aoti_check.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0 if all(v.get("ok") for v in report["variants"]) else 1


if __name__ == "__main__":
    sys.exit(main())
