#!/usr/bin/env bash
# The reproduction study of docs/results.md on a 2-core machine: two launcher processes side by
# side (one fairseq run each, 1 thread), seed by seed, so that an interrupted study has whole
# seeds done. Finished runs (train.done, eval.json) are skipped, so rerunning resumes.
#   scripts/run_bible_study.sh [SEED...]        (default: 1 2 3)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
SWEEP=slurm/bible_study.yaml
DATA=${FAIRSEQ_TYING_STUDY_DATA:-work/study/data}
export OMP_NUM_THREADS=1 PYTHONWARNINGS=ignore
mkdir -p work/study  # the shard logs

"$PY" -m fairseq_tying.data.prepare --corpus bible --src es --tgt en \
  --subword sentencepiece --vocab-size 4000 --out "$DATA"

shard() {  # shard A|B SEED: the two halves of one seed's 15 runs
  local s=$2
  if [ "$1" = A ]; then
    set -- --only "*.dot.s$s" --only "*.l2norm.s$s" --only "*.none.sqnorm.s$s"
  else
    set -- --only "*.distance.s$s" --only "*.cosine.s$s" --only "*.decoder.sqnorm.s$s" \
           --only "*.three_way.sqnorm.s$s"
  fi
  "$PY" -m fairseq_tying.launch "$SWEEP" --local "$@"
}

for s in ${*:-1 2 3}; do
  shard A "$s" > "work/study/shardA.s$s.log" 2>&1 &
  a=$!
  shard B "$s" > "work/study/shardB.s$s.log" 2>&1 &
  b=$!
  wait "$a" && wait "$b" || { echo "seed $s failed: see work/study/shard*.s$s.log" >&2; exit 1; }
  echo "seed $s done"
done
