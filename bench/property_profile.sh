#!/usr/bin/env bash
# A long profile of one property test (tests/test_property.py) split over processes, for a machine with many cores:
# PROCS processes, each EXAMPLES generated programs under its own seed (BASE_SEED + i), run in parallel. Each part's
# hypothesis statistics and result land in $OUT/property_profile.txt (default ./profile_out), with the total of
# passing and failing examples at the end. A failure prints its shrunk program there, as in a single run.
# Usage, from the repository root: bash bench/property_profile.sh TEST_FILTER PROCS EXAMPLES [BASE_SEED]
#   e.g. bash bench/property_profile.sh programs_on_every 14 715   (10,010 examples)
# PROFILE_LIMIT_S=N stops each part after N seconds (a part stopped so prints no statistics and counts as not passed).
set -u
OUT=${OUT:-profile_out}
mkdir -p "$OUT"
FILTER=$1 PROCS=$2 EXAMPLES=$3 BASE=${4:-20261127}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 THREADS=${THREADS:-1}  # one core per process: the processes fill the machine
PY=${PYTHON:-python3}
parts=$(mktemp -d)
for i in $(seq 0 $((PROCS - 1))); do
  # the project's addopts hide hypothesis's plugin (and with it --hypothesis-seed): replaced here
  ZG_PROPERTY_EXAMPLES=$EXAMPLES timeout "${PROFILE_LIMIT_S:-0}" $PY -m pytest -o addopts="-p no:anyio" -q -p no:cacheprovider \
    tests/test_property.py -k "$FILTER" --hypothesis-seed=$((BASE + i)) --hypothesis-show-statistics \
    >"$parts/$i.txt" 2>&1 &
done
wait
{
  for i in $(seq 0 $((PROCS - 1))); do
    echo "== seed $((BASE + i))"
    cat "$parts/$i.txt"
  done
  echo "== total over $PROCS seeds"
  # hypothesis prints "N passing examples, M failing examples" or (newer) "N passing, M failing, and K invalid"
  cat "$parts"/*.txt | grep -Eo "[0-9]+ passing( examples)?, [0-9]+ failing" | tr -d ',' |
    awk '{p += $1; f += $(NF - 1)} END {print p " passing examples, " f " failing examples (all phases)"}'
  echo "results: $(cat "$parts"/*.txt | grep -Ec '[0-9]+ passed') parts passed, $(cat "$parts"/*.txt | grep -Ec 'failed') failed"
} >"$OUT/property_profile.txt"
rm -rf "$parts"
tail -3 "$OUT/property_profile.txt"
