"""deploy/Dockerfile read with BuildKit's own parser, and its build context as Docker would send it.

`dockerfile` (a dev dependency) wraps BuildKit's Go parser. `build_context()` applies
deploy/Dockerfile.dockerignore to the checkout and `copied_tree()` lays out what the COPY
instructions put into the image, so a test can build and import the package from exactly
those files.
"""

from __future__ import annotations

import re
import shutil
from functools import cache
from pathlib import Path, PurePosixPath

import dockerfile

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "deploy" / "Dockerfile"
DOCKERIGNORE = REPO / "deploy" / "Dockerfile.dockerignore"
SKIP_DIRS = {".git", ".venv"}  # never part of the context (and huge to walk)


@cache
def instructions() -> tuple[dockerfile.Command, ...]:
    return dockerfile.parse_file(str(DOCKERFILE))


def entrypoint() -> list[str]:
    (cmd,) = [c for c in instructions() if c.cmd == "ENTRYPOINT"]
    assert cmd.json, "ENTRYPOINT must be in exec form, so the container's command becomes its arguments"
    return list(cmd.value)


def _pattern_regex(pattern: str) -> re.Pattern:
    """A .dockerignore pattern (Go filepath.Match plus `**`) as a regex over slash paths."""
    assert not set(pattern) & set("[]\\"), f"unsupported .dockerignore syntax in {pattern!r}"
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + r"\Z")


def _rules() -> list[tuple[bool, re.Pattern]]:
    rules = []
    for line in DOCKERIGNORE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keep = line.startswith("!")
        pattern = str(PurePosixPath(line.lstrip("!").strip().lstrip("/")))
        rules.append((keep, _pattern_regex(pattern)))
    return rules


def excluded(rel: str, rules: list[tuple[bool, re.Pattern]]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parent folders decides."""
    parts = rel.split("/")
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    verdict = False
    for keep, regex in rules:
        if any(regex.match(p) for p in prefixes):
            verdict = not keep
    return verdict


def build_context() -> set[str]:
    """Files of the checkout that `docker build -f deploy/Dockerfile .` sends (relative paths)."""
    rules = _rules()
    files = set()
    for path in REPO.rglob("*"):
        rel = path.relative_to(REPO)
        if rel.parts[0] in SKIP_DIRS or not path.is_file():
            continue
        if not excluded(rel.as_posix(), rules):
            files.add(rel.as_posix())
    return files


def copied_tree(dest: Path) -> Path:
    """Lays out under `dest` what the Dockerfile's COPY instructions put in its last WORKDIR
    before the first RUN after them (the source tree `pip install` sees). Returns that folder."""
    context = build_context()
    workdir = PurePosixPath("/")
    copies: list[tuple[PurePosixPath, list[str], str]] = []
    for cmd in instructions():
        if cmd.cmd == "WORKDIR":
            workdir = workdir / cmd.value[0]
        elif cmd.cmd in ("COPY", "ADD"):
            assert cmd.cmd == "COPY" and not any(f.startswith("--from") for f in cmd.flags), cmd.original
            *sources, target = cmd.value
            copies.append((workdir, sources, target))
    assert copies, "the Dockerfile copies nothing"
    for wd, sources, target in copies:
        target_dir = dest / str(PurePosixPath(wd) / target).lstrip("/")
        for source in sources:
            source = source.rstrip("/")
            if source in context:  # a file: into the folder `target/`, or renamed to `target`
                into_folder = target.endswith("/") or len(sources) > 1
                placed = {source: target_dir / PurePosixPath(source).name if into_folder else target_dir}
            else:  # a folder: its contents go into `target`
                placed = {f: target_dir / f[len(source) + 1 :] for f in context if f.startswith(source + "/")}
            assert placed, f"COPY {source}: not in the build context (see deploy/Dockerfile.dockerignore)"
            for rel, out in placed.items():
                out.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / rel, out)
    return dest / str(copies[0][0]).lstrip("/")
