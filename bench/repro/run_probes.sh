#!/usr/bin/env bash
# Run probe files' starts as one background queue: bash bench/repro/run_probes.sh NAME[:K,K..] ...
# Each NAME is bench/repro/probes/NAME.yaml; every start (or the listed K) runs with one torch thread into
# bench/repro/runs/probe-NAME, its CPU time appended to cpu.log there; a start run trained once into
# bench/repro/runs/starts/start-K (grpo, train.steps=5, train.seed=K: what every shipped probe file's start
# is) is copied in instead of trained again, and start records committed in bench/repro/results/probes/NAME
# (bench/repro/collect_probe.py) are put back, so only the starts missing run. Start two queues for the two cores, then summarise each file
# with `thinkrl probe bench/repro/probes/NAME.yaml --output bench/repro/runs/probe-NAME`.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1
for item in "$@"; do
  name=${item%%:*}
  out=bench/repro/runs/probe-$name
  starts=$(.venv/bin/python -c "import yaml,sys; print(yaml.safe_load(open(sys.argv[1]))['probe']['starts'])" "bench/repro/probes/$name.yaml")
  ks=$([[ $item == *:* ]] && echo "${item#*:}" | tr , ' ' || seq 0 $((starts - 1)))
  mkdir -p "$out"
  for rec in bench/repro/results/probes/"$name"/start-*.json; do  # starts an earlier session committed
    [[ -f $rec && ! -e $out/$(basename "$rec") ]] && cp "$rec" "$out/"
  done
  for k in $ks; do
    shared=bench/repro/runs/starts/start-$k
    done=$(.venv/bin/python -c "import sys; from pathlib import Path; from thinkrl.study.grid import run_state; print(run_state(Path(sys.argv[1])))" "$shared")
    [[ $done == done && ! -e $out/start-$k ]] && cp -r "$shared" "$out/start-$k"
    /usr/bin/time -a -o "$out/cpu.log" -f "start $k user %U sys %S wall %e commit $(git rev-parse --short HEAD) threads 1" \
      .venv/bin/python -m thinkrl probe "bench/repro/probes/$name.yaml" --output "$out" --only-start "$k"
  done
done
