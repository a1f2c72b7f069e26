#!/usr/bin/env bash
# The GPU measurements of BENCHMARKS.md ("GPU end to end"), one named step each, every step's output kept in
# DIR/<step>.log, so that a machine lent for a short while runs exactly what is missing, in a few calls. The
# order is issue 20's priority: its solve, throughput (bfloat16) and collection (compiled bfloat16 policy) targets
# first.
#
#   bash benchmarks/gpu_suite.sh DIR                # every step, in order
#   bash benchmarks/gpu_suite.sh DIR solve_a2c tf32 # the steps named
#   bash benchmarks/gpu_suite.sh --list             # the steps
#
# Run from the repository root, on a machine with a CUDA GPU, with rlstruct installed in the python on PATH
# (PYTHON=... to pick another). STEP_TIMEOUT (seconds, default 600) bounds each step; a step that fails or times
# out is reported and the next one runs.
set -u -o pipefail

PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}

declare -A STEPS=(
  # Issue 66, item 1: launch to solved with the compile cache; seed 0 of each algorithm launches cold (an empty
  # cache), seeds 1 and 2 warm (the same graphs from the cache): the table's warm-up column holds both.
  [warm_launch]="RLSTRUCT_COMPILE_CACHE=DIR/compile-cache $PY benchmarks/gpu_training.py --algos ppo a2c --skip-throughput --solve-configs wide --seeds 0 1 2 --time-limit 45 --json DIR/warm_launch.json"
  # Issue 66, item 5: --deterministic, two runs of one seed bit for bit, and its cost in env steps/s against the default.
  [deterministic]="$PY benchmarks/gpu_deterministic.py --rounds 2 --n-envs 4096 --json DIR/deterministic.json; $PY benchmarks/gpu_deterministic.py --algos ppo --rounds 1 --n-envs 262144 --json DIR/deterministic_wide.json"
  # Issue 66, item 4: DQN on the fast path (its replay buffer on the GPU, captured acquisitions and evaluations, the
  # compiled update) solving CartPole-v1 beside PQN, 3 seeds each, a fresh process a run; each algorithm's seed 0
  # compiles cold, seeds 1 and 2 load the compile cache; 30 s at most a run.
  [solve_dqn]="RLSTRUCT_COMPILE_CACHE=DIR/compile-cache $PY benchmarks/gpu_training.py --algos dqn pqn --skip-throughput --solve-configs default --seeds 0 1 2 --time-limit 30 --json DIR/solve_dqn.json"
  # Issue 66, item 2: MinAtar Breakout's auto-reset step compiled whole (MinAtarEnv(compile=True)) beside the eager
  # step and gymnax, at 4,096, 65,536 and 2^20 envs, the step alone and with the MinAtar CNN acting: 18 fresh
  # processes, buffers of 16 steps, half a second of rollouts each. The notes give each row's first step (the
  # compiled rows': the compile; the CNN rows load the step's graphs from inductor's cache).
  [minatar_compiled]="$PY benchmarks/minatar_speed.py --game Breakout --device cuda --envs 4096 65536 1048576 --policies none cnn --steps 16 --seconds 0.5 --rounds 1 --skip torch into adapter reference graph"
  # Two fast-path runs in one process, a fresh process per variant: which flag leaves what the second run's graphs
  # touch (docs/benchmarks/gpu-end-to-end.md, "On an H200, with the counter-based draws").
  [two_runs]="$PY benchmarks/gpu_two_runs.py; $PY benchmarks/gpu_two_runs.py --log2-envs 18 20 --autocast bfloat16 --only all no_compile_update no_cuda_graph"
  # Issue 66, item 2's check: the compiled MinAtar step's bits on the GPU; its six cases failed on the first GPU run
  # (H200, torch 2.11, 2026-11-28) with their messages lost: run first, every line kept.
  [compile_tests]="$PY -m pytest -q -p no:cacheprovider -m cuda --show-capture=no tests/envs/test_minatar_torch_compile.py"
  # Issue 77: IMPALA's learner on the GPU, its actors in CPU worker processes, then in the GPU process.
  [impala]="for b in cpu cuda; do t=\$SECONDS; $PY -m rlstruct.algos.impala --env CartPole-v1 --learner-device cuda --batcher-device \$b --max-env-steps 200000 --no-progress --no-tensorboard --logdir DIR/impala-\$b; echo \"actors on \$b: \$((SECONDS - t)) s from launch\"; done"
  # Issue 77: MinAtar Breakout to 10 with the learners on the GPU and the envs in CPU worker processes, IMPALA's preset
  # (lag 2, two actor processes) beside PPO's over two workers; 300 s at most a run (IMPALA took 144 s on the H200).
  [impala_minatar]="for a in impala=impala-minatar-5m ppo=ppo-minatar-5m; do t=\$SECONDS; timeout -k 20 300 $PY -m rlstruct.algos train \${a%%=*} --preset \${a#*=} --env MinAtar/Breakout-v1 --n-processes 2 --target-return 10 --stop-at-reward-threshold --learner-device cuda --evaluation-device cuda --no-progress --no-tensorboard --logdir DIR/minatar-\${a%%=*}; echo \"\${a%%=*}: \$((SECONDS - t)) s from launch\"; done"
  # Eight xdist workers where pytest-xdist is installed (the H100's 16 cores ran them in ~4 minutes), else serially.
  [cuda_tests]="$PY -m pytest -q -p no:cacheprovider -m cuda --show-capture=no \$($PY -c 'import xdist; print(\"-n 8\")' 2>/dev/null) rlstruct agents batchers algos tests"
  [solve_a2c]="$PY benchmarks/gpu_training.py --algos a2c --skip-throughput --time-limit 45 --json DIR/solve_a2c.json"
  [solve_ppo]="$PY benchmarks/gpu_training.py --algos ppo --skip-throughput --time-limit 45 --json DIR/solve_ppo.json"
  [throughput]="$PY benchmarks/gpu_training.py --skip-solve --iterations 20 --json DIR/throughput.json"
  [tf32]="$PY benchmarks/gpu_training.py --skip-solve --iterations 20 --log2-envs 18 20 --matmul-precision high --json DIR/tf32.json"
  [bf16]="$PY benchmarks/gpu_training.py --skip-solve --iterations 20 --log2-envs 18 20 --autocast bfloat16 --json DIR/bf16.json"
  [bf16_compiled_policy]="$PY benchmarks/gpu_training.py --skip-solve --iterations 20 --log2-envs 18 20 --autocast bfloat16 --compile-policy --json DIR/bf16_compiled_policy.json"
  [collection]="$PY benchmarks/batchers.py --device cuda --skip-processes --sizes 1048576 --iters 5 --rounds 2"
  [collection_fast]="$PY benchmarks/batchers.py --device cuda --skip-processes --sizes 1048576 --iters 5 --rounds 2 --physics-dtype float32 --matmul-precision high"
  [collection_bf16]="$PY benchmarks/batchers.py --device cuda --skip-processes --sizes 1048576 --iters 5 --rounds 2 --physics-dtype float32 --policy-dtype bfloat16"
  [collection_compiled]="$PY benchmarks/batchers.py --device cuda --skip-processes --sizes 1048576 --iters 5 --rounds 2 --physics-dtype float32 --policy-dtype bfloat16 --compile-policy"
  [envs]="$PY benchmarks/envs.py --device cuda --sizes 16384 262144 1048576 --float32"
  [ecosystem]="$PY benchmarks/ecosystem.py --gymnax-sizes 1024 16384 65536 --skip b d"
  [locomotion]="$PY benchmarks/locomotion.py --device cuda --mjx-sizes 1024 4096 16384 --torch-sizes 1024 4096"
  [cpu_scaling]="$PY benchmarks/cpu_scaling.py --workers 1 2 4 8 --rounds 1"
  # Atari learning (issue 33): the ppo-atari and dqn-atari presets' seeds with the learner on the GPU.
  [atari_ppo]="$PY benchmarks/learning.py --presets ppo-atari --seeds 0,1 --extra '--learner-device cuda --torch-threads 8' --json DIR/atari_ppo.json"
  [atari_dqn]="$PY benchmarks/learning.py --presets dqn-atari --seeds 0,1 --extra '--learner-device cuda --torch-threads 8' --json DIR/atari_dqn.json"
  # MinAtar (issue 42): the torch games at 2^20 envs in the CUDA-graph batcher, beside gymnax on the same GPU.
  # Populations (issue 74): ten PPO seeds as one process on the GPU, time from launch, beside seed 0 alone.
  [populations]="for e in CartPole-v1 MinAtar/Breakout-v1; do for a in seeds=0,1,2,3,4,5,6,7,8,9 seed=0; do t=\$SECONDS; $PY -m rlstruct.algos.ppo --env \$e --\${a%%=*} \${a#*=} --max-env-steps 500000 --no-cuda-graph --learner-device cuda --batcher-device cuda --evaluation-device cuda --no-progress --no-tensorboard --logdir DIR/pop-\${e//\//-}-\${a//,/}; echo \"\$e \$a: \$((SECONDS - t)) s from launch\"; done; done"
  [minatar]="for g in Breakout Asterix Freeway; do $PY benchmarks/minatar_speed.py --game \$g --device cuda --envs 65536 --rounds 1 --skip reference adapter; done"
)
ORDER=(compile_tests warm_launch deterministic solve_dqn minatar_compiled two_runs cuda_tests solve_a2c solve_ppo bf16 collection_compiled throughput tf32 bf16_compiled_policy collection_bf16
       collection collection_fast envs ecosystem locomotion cpu_scaling atari_ppo atari_dqn populations impala impala_minatar minatar)

if [[ ${1:-} == --list || $# -eq 0 ]]; then
  for s in "${ORDER[@]}"; do printf '%-16s %s\n' "$s" "${STEPS[$s]}"; done
  [[ $# -eq 0 ]] && { echo "usage: bash benchmarks/gpu_suite.sh DIR [STEP ...]" >&2; exit 2; }
  exit 0
fi
DIR=$1; shift
mkdir -p "$DIR"
selected=("$@")
[[ ${#selected[@]} -eq 0 ]] && selected=("${ORDER[@]}")
for s in "${selected[@]}"; do
  [[ -n ${STEPS[$s]+x} ]] || { echo "unknown step $s (bash benchmarks/gpu_suite.sh --list)" >&2; exit 2; }
done

status=0
for s in "${selected[@]}"; do
  cmd=${STEPS[$s]//DIR/$DIR}
  echo "=== $s: $cmd"
  start=$(date +%s)
  timeout "${STEP_TIMEOUT:-600}" bash -c "$cmd" 2>&1 | tee "$DIR/$s.log"
  rc=$?
  echo "=== $s: exit $rc after $(( $(date +%s) - start )) s"
  [[ $rc -eq 0 ]] || status=1
done
exit $status
