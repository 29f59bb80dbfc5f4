#!/usr/bin/env bash
# Builds .whl/: the Python packages the GPU image lacks (see ../shared/FACTS.md of the
# developers' workspace), for its Python 3.12 on x86-64, to carry to the device machine
# (`carry: [".whl"]`; bench/gpu_session.sh and bench/gsm8k_session.sh install them with
# pip --no-index --target /tmp/site). Run once in the repository root; .whl/ is ignored.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> "$(git rev-parse --git-common-dir)/info/exclude"
pkgs=(
  structlog pydantic pydantic-core annotated-types typing-inspection typing_extensions
  grpcio-health-checking==1.84.0 grpcio-reflection==1.84.0
  math-verify latex2sympy2_extended antlr4-python3-runtime==4.13.2
  gguf
  liger-kernel==0.8.5  # learner.fused_kernels (Triton kernels; the image has triton)
  cryptography cffi pycparser  # the weight group's sealed rendezvous (AES-GCM); may already be in the image
  trl==1.16.0 datasets dill multiprocess  # the TRL arm of bench/e2e_grpo.py and the GSM8K comparison
)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${pkgs[@]}"
ls -la .whl
du -sh .whl
