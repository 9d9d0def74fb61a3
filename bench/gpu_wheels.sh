#!/usr/bin/env bash
# The Python packages the GPU machine lacks, as cp312 wheels to carry there (it reaches no registry).
#   bash bench/gpu_wheels.sh [DIR]             here: rebuild DIR (default .whl) from the package index
#   bash bench/gpu_wheels.sh --install [DIR]   there: install DIR's wheels into the running python3's own
#                                              environment (bench/gpu_session.sh's `wheels` step)
# What goes: nvidia-pytriton 0.7.0 (tritonserver and its Python backend), numpy 1.26.4 (the backend stub
# handed corrupted INT64 inputs to models under the image's numpy 2.5), protobuf 6.33.6, tritonclient,
# locust, gevent, orjson, hpack (the gRPC transport) and whatever of their dependencies the image lacks
# (its package list: the device notes' KINDS.md). nvidia-pytriton is trimmed to fit the 64 MiB a call carries: only the
# Python 3.12 backend stub stays, libpython3.13 goes, and ICU's 29 MB data library becomes a stub of the
# same name and symbol (tritonserver starts and serves with it); numpy goes without its tests.
# Not with pip's --target: PyTriton takes a folder outside site-packages for an editable install and
# looks for its libraries elsewhere (the backend stub then misses libcudart).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --install ]; then
    DIR=${2:-.whl}
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade "$DIR"/*.whl
    echo "installed $(ls "$DIR"/*.whl | wc -l) wheels into $(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    exit 0
fi
DIR=${1:-.whl}
PACKAGES=(nvidia-pytriton==0.7.0 numpy==1.26.4 protobuf==6.33.6 "tritonclient[grpc,http]==2.73.0" locust==2.47.0
          gevent==26.9.0 orjson==3.13.0 hpack==4.2.0)
# already in the image (KINDS.md's list); numpy and protobuf are carried for their versions
IMAGE="aiohappyeyeballs aiohttp aiosignal annotated-doc attrs certifi charset-normalizer click frozenlist grpcio h11
idna iniconfig jinja2 markdown-it-py markupsafe mdurl ml-dtypes msgpack multidict mypy-extensions packaging pluggy
propcache psutil pygments pytest requests rich shellingham typer typing-extensions typing-inspect urllib3 werkzeug
wrapt yarl zipp"
PLATFORMS=()
for p in manylinux_2_35 manylinux_2_34 manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 \
         manylinux1; do PLATFORMS+=(--platform "${p}_x86_64"); done
rm -rf "$DIR" && mkdir -p "$DIR"
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
    "${PLATFORMS[@]}" -d "$DIR" "${PACKAGES[@]}"
for wheel in "$DIR"/*.whl; do
    name=$(basename "$wheel" | cut -d- -f1 | tr '[:upper:]_.' '[:lower:]--')
    if echo " $IMAGE " | tr '\n' ' ' | grep -q " $name "; then rm "$wheel"; fi
done
STUB=$(mktemp -d)
trap 'rm -rf "$STUB"' EXIT
echo 'const char icudt70_dat[32] = {0};' >"$STUB/icudata.c"
python3 - "$STUB" "$DIR"/nvidia_pytriton-*.whl "$DIR"/numpy-*.whl <<'PY'
import base64, hashlib, subprocess, sys, zipfile
from pathlib import Path

stub = Path(sys.argv[1])


def dropped(name):
    return ("libpython3-" in name or ("python_backend_stubs/" in name and "/3.12/" not in name)
            or (name.startswith("numpy/") and "/tests/" in name))


def icu_stub(soname):
    subprocess.run(["gcc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(stub / soname),
                    str(stub / "icudata.c")], check=True)
    return (stub / soname).read_bytes()


for wheel in map(Path, sys.argv[2:]):
    trimmed = wheel.with_suffix(".trimmed")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(trimmed, "w", zipfile.ZIP_DEFLATED) as out:
        record = next(n for n in src.namelist() if n.endswith(".dist-info/RECORD"))
        lines = []
        for info in src.infolist():
            name = info.filename
            if dropped(name) or name == record:
                continue
            data = icu_stub(Path(name).name) if "libicudata" in name else src.read(name)
            out.writestr(info, data, zipfile.ZIP_DEFLATED)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            lines.append(f"{name},sha256={digest},{len(data)}")
        out.writestr(record, "\n".join(lines + [f"{record},,"]) + "\n")
    trimmed.replace(wheel)
PY
du -sh "$DIR"; ls "$DIR"
