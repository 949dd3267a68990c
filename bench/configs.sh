#!/usr/bin/env bash
# The config corpus (tests/assets/configs: real DeepSpeed and accelerate files from public
# repositories) trained for one step each on the tiny example TOML, as a user would run them:
#   shardtrain launch --nproc N -- shardtrain train --config configs/zero_tiny.toml \
#       --deepspeed FILE | --accelerate-config FILE --set train.steps=1
# N is the world the file is written for: a DeepSpeed file's three batch sizes fix its data-
# parallel ranks (times its AutoTP size), else 1; an accelerate file's num_processes (1 for
# distributed_type NO). Each run has 120 s (STEP_TIMEOUT=N in the environment: N s). Prints one
# line per file (outcome, then the first line of shardtrain's error) and the counts. fp16
# autocast needs a CUDA device: on a CPU machine a file that asks for it is run again with
# precision.autocast = "bf16" and counted apart. model.vocab_size is 320 (the byte tokenizer's 257
# tokens padded to a multiple of 64, as the tensor-parallel check advises) so that the files
# asking for tensor parallelism can split it. A file that names BERT's own modules (its
# compression groups' "attention.self", accelerate's BertLayer wrap class) runs on the tiny BERT
# model (model.preset = "tiny-bert") instead of the tiny GPT-2: the model its repository trains
# with it.
# Usage: bash bench/configs.sh [FILE...]  (from the repository root, after a build; the files
# given, or the whole corpus)
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${SHARDTRAIN_BIN:-$root/build/shardtrain}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
world_of() {
  python3 - "$1" <<'PY'
import json, re, sys
path = sys.argv[1]
text = open(path).read()
if path.endswith(".json"):
    try:
        ds = json.loads(text)
    except ValueError:
        print(1); sys.exit()
    keys = ["train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"]
    tp = ds.get("tensor_parallel", {}).get("autotp_size", 1)
    tp = tp if isinstance(tp, int) else 1
    if all(isinstance(ds.get(k), (int, float)) for k in keys):
        per_rank = ds[keys[1]] * ds[keys[2]]
        print(int(ds[keys[0]] // per_rank) * tp if ds[keys[0]] % per_rank == 0 else 1)
    else:
        print(tp)
else:
    if re.search(r"^distributed_type:\s*['\"]?NO", text, re.M):
        print(1); sys.exit()
    m = re.search(r"^num_processes:\s*(\d+)", text, re.M)
    print(m.group(1) if m else 1)
PY
}
# An accelerate file naming a deepspeed_config_file by its path in the file's repository is run
# where that path leads: the two corpus files laid out as they are there (SOURCES.md).
as_in_its_repository() {
  python3 - "$1" "$root/tests/assets/configs" "$work/tree" <<'PY'
import os, re, sys
path, corpus, tree = sys.argv[1:]
name = os.path.basename(os.path.dirname(path)) + "/" + os.path.basename(path)
m = re.search(r"deepspeed_config_file:\s*['\"]?([^'\"\n]+)", open(path).read())
rows = {}
for line in open(os.path.join(corpus, "SOURCES.md")):
    cells = [c.strip() for c in line.split("|")]
    if len(cells) > 4 and "/" in cells[1]:
        rows[cells[1]] = (cells[2], cells[3])
if not m or name not in rows:
    print(path); sys.exit()
repo, own = rows[name]
wanted = os.path.normpath(os.path.join(os.path.dirname(own), m.group(1).strip()))
for other, (other_repo, other_path) in rows.items():
    if other_repo == repo and other_path == wanted:
        here = os.path.join(tree, os.path.dirname(own), os.path.basename(path))
        for source, target in ((path, here), (os.path.join(corpus, other), os.path.join(tree, wanted))):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            open(target, "w").write(open(source).read())
        print(here); sys.exit()
print(path)
PY
}
# A random-LTD file names blocks of a model of total_layer_num blocks: the tiny model gets that
# many (the same as ConfigCorpusTest).
layers_of() {
  python3 - "$1" <<'PY'
import json, sys
try:
    ltd = json.load(open(sys.argv[1]))["data_efficiency"]["data_routing"]["random_ltd"]
    print("--set model.n_layers=%d" % ltd["total_layer_num"])
except (ValueError, KeyError, TypeError):
    pass
PY
}
# The tiny BERT for a file that names BERT's modules.
model_of() {
  if grep -q -e 'attention\.self' -e 'BertLayer' "$1"; then echo '--set model.preset="tiny-bert"'; fi
}
declare -A count
files=("$@")
if [[ ${#files[@]} -eq 0 ]]; then
  files=("$root"/tests/assets/configs/deepspeed/*.json "$root"/tests/assets/configs/accelerate/*.yaml)
fi
for file in "${files[@]}"; do
  name="$(basename "$(dirname "$file")")/$(basename "$file")"
  flag=--deepspeed
  [[ "$file" == *.yaml ]] && flag=--accelerate-config
  n="$(world_of "$file")"
  [[ "$file" == *.yaml ]] && file="$(as_in_its_repository "$file")"
  # shellcheck disable=SC2207  # words on purpose: none or "--set model.n_layers=N"
  layers=($( [[ "$file" == *.json ]] && layers_of "$file") $(model_of "$file"))
  out="$work/out.txt"
  rm -rf "$work/run"
  timeout "${STEP_TIMEOUT:-120}" "$bin" launch --nproc "$n" -- "$bin" train --config "$root/configs/zero_tiny.toml" \
    "$flag" "$file" --set train.steps=1 --set train.sample_tokens=0 --set run.threads=1 --set model.vocab_size=320 \
    "${layers[@]}" --set "run.dir=\"$work/run\"" >"$out" 2>&1
  rc=$?
  if [[ $rc -ne 0 ]] && grep -q -e 'needs a CUDA device' -e 'autocast = "fp16" is not supported' "$out"; then
    # fp16 autocast needs CUDA: on a CPU machine the same file trains its step in bf16.
    rm -rf "$work/run"
    timeout "${STEP_TIMEOUT:-120}" "$bin" launch --nproc "$n" -- "$bin" train --config "$root/configs/zero_tiny.toml" \
      "$flag" "$file" --set train.steps=1 --set train.sample_tokens=0 --set run.threads=1 --set model.vocab_size=320 \
      "${layers[@]}" --set precision.autocast=bf16 --set "run.dir=\"$work/run\"" >"$out" 2>&1
    rc=$?
    [[ $rc -eq 0 ]] && rc=200
  fi
  if [[ $rc -eq 0 ]]; then
    outcome="trained"
  elif [[ $rc -eq 200 ]]; then
    outcome="trained-fp16-as-bf16"
  elif [[ $rc -eq 124 ]]; then
    outcome="timeout"
  else
    outcome="refused"
  fi
  count[$outcome]=$((${count[$outcome]:-0} + 1))
  reason="$(grep -m1 -E 'error|refus|not available|cannot' "$out" | sed -E 's#^.*/tests/assets/configs/##' | cut -c1-160)"
  printf '%s\t%s\tranks %s\t%s\n' "$outcome" "$name" "$n" "$reason"
done
for k in trained trained-fp16-as-bf16 refused timeout; do printf '%s: %s\n' "$k" "${count[$k]:-0}"; done
