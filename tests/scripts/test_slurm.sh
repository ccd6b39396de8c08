#!/usr/bin/env bash
# scripts/slurm/train.sbatch without a Slurm cluster: the script parses (bash -n, and shellcheck
# where it is installed); its #SBATCH lines are what sbatch reads (each `--key=value` or a
# flag, of known keys with valid values, all before the first command, where sbatch stops
# reading them); and, run as sbatch would run it (the SLURM_* variables of a 2-node job of 8
# tasks a node) with a stub srun that records its arguments and environment, it starts
# `srun --kill-on-bad-exit=1 --mpi=pmix` on a train_gpt command line that train_gpt accepts:
# the same line with --plan plans the 16-rank HSDP layout it asks for. Then: options that set
# the layout are kept as given, exit 3 (stopped by the time limit's signal) requeues the job,
# and a submission without a config, or outside Slurm, is one error line and exit 2.
#   bash tests/scripts/test_slurm.sh BUILD_DIR
# Skipped (exit 77) when BUILD_DIR/train_gpt is not built.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$(cd "${1:-$ROOT/build}" 2>/dev/null && pwd)" || { echo "SKIPPED: no build folder ${1:-}"; exit 77; }
[[ -x "$BUILD/train_gpt" ]] || { echo "SKIPPED: $BUILD/train_gpt is not built"; exit 77; }
source "$ROOT/tests/scripts/lib.sh"
script="$ROOT/scripts/slurm/train.sbatch"

# ---- the script parses -----------------------------------------------------------------------
check "bash -n parses it" bash -n "$script"
if command -v shellcheck >/dev/null; then
  check "shellcheck finds nothing" shellcheck "$script"
else
  echo "note: no shellcheck here, not run"
fi

# ---- the #SBATCH lines -----------------------------------------------------------------------
# sbatch reads #SBATCH lines up to the first line that is neither a comment nor blank
sbatch_lines() {
  awk '/^#SBATCH/ { print; next } /^#/ || /^[[:space:]]*$/ { next } { exit }' "$script"
}
sbatch_problems() {  # one line per #SBATCH line that sbatch would refuse or ignore
  grep -c '^#SBATCH' "$script" | grep -qx "$(sbatch_lines | wc -l)" ||
    echo "an #SBATCH line after the first command: sbatch ignores it"
  local line key value
  while IFS= read -r line; do
    if [[ "$line" =~ ^#SBATCH\ --([a-z-]+)(=([^[:space:]]+))?$ ]]; then
      key="${BASH_REMATCH[1]}" value="${BASH_REMATCH[3]}"
    else
      echo "'$line' is not '#SBATCH --key=value'"
      continue
    fi
    case "$key" in
      nodes | ntasks-per-node | cpus-per-task) [[ "$value" =~ ^[1-9][0-9]*$ ]] ;;
      gpus-per-node) [[ "$value" =~ ^([a-z0-9_]+:)?[1-9][0-9]*$ ]] ;;
      time) [[ "$value" =~ ^([0-9]+-)?[0-9]+(:[0-5][0-9]){0,2}$ ]] ;;
      signal) [[ "$value" =~ ^((R|B|RB):)?[A-Z0-9]+(@[0-9]+)?$ ]] ;;
      job-name | output | error | partition | account | mem | constraint | qos) [[ -n "$value" ]] ;;
      requeue | exclusive) [[ -z "$value" ]] ;;
      *) echo "'$line': --$key is not a key this check knows (add it to test_slurm.sh)"; continue ;;
    esac || echo "'$line': '$value' is not a valid value of --$key"
  done < <(grep '^#SBATCH' "$script")
}
sbatch_problems | sed 's/^/   /'
check "every #SBATCH line is a known --key=value before the first command" test -z "$(sbatch_problems)"
check "it asks for nodes, tasks per node and GPUs per node" \
  test "$(sbatch_lines | grep -cE '^#SBATCH --(nodes|ntasks-per-node|gpus-per-node)=')" -eq 3

# ---- run as sbatch would, with a stub srun ----------------------------------------------------
mkdir -p "$tmp/bin"
cat >"$tmp/bin/srun" <<'STUB'
#!/usr/bin/env bash
printf '%s\n' "$@" >"$STUB_OUT/srun.args"
env | grep '^SLURM_' | sort >"$STUB_OUT/srun.env"
exit "${STUB_RC:-0}"
STUB
printf '#!/bin/sh\necho "$*" >"$STUB_OUT/scontrol.args"\n' >"$tmp/bin/scontrol"
chmod +x "$tmp/bin/srun" "$tmp/bin/scontrol"
slurm_env=(SLURM_JOB_ID=4242 SLURM_JOB_NUM_NODES=2 SLURM_NNODES=2 SLURM_NTASKS=16 SLURM_NTASKS_PER_NODE=8
  SLURM_GPUS_PER_NODE=8 SLURM_JOB_NODELIST='gpu[01-02]' SLURM_SUBMIT_DIR="$ROOT")
submit() {  # submit OUTDIR [ARGS...]: the script in OUTDIR as a job's batch step; its exit code
  local out="$1"
  shift
  mkdir -p "$out"
  (cd "$tmp" && env "${slurm_env[@]}" PATH="$tmp/bin:$PATH" STUB_OUT="$out" NDT_BUILD_DIR="$BUILD" \
    bash "$script" "$@") >"$out/log" 2>&1
}
# the train_gpt command srun was given (after srun's own options), with --plan for 16 ranks
plan_of() {  # plan_of OUTDIR: exit code of the plan, its output in OUTDIR/plan
  local -a a
  mapfile -t a <"$1/srun.args"
  local i=0
  while [[ $i -lt ${#a[@]} && "${a[$i]}" == --* ]]; do i=$((i + 1)); done
  (cd "$ROOT" && "${a[@]:$i}" --plan --plan.world 16) >"$1/plan" 2>&1
}

submit "$tmp/job" configs/gpt2_124m.ini --train.micro_batch_size 32
check "a job's batch step exits 0 when srun does" test $? -eq 0
sed 's/^/   | /' "$tmp/job/log"
sed 's/^/   srun arg: /' "$tmp/job/srun.args" 2>/dev/null
check "srun --kill-on-bad-exit=1" grep -qx -- '--kill-on-bad-exit=1' "$tmp/job/srun.args"
check "srun --mpi=pmix" grep -qx -- '--mpi=pmix' "$tmp/job/srun.args"
check "srun starts the build's train_gpt" grep -qx "$BUILD/train_gpt" "$tmp/job/srun.args"
check "the ranks see Slurm's variables" grep -qx "SLURM_NTASKS_PER_NODE=8" "$tmp/job/srun.env"
check "it resumes from the latest checkpoint" grep -qxF -- "--checkpoint.resume" "$tmp/job/srun.args"
plan_of "$tmp/job"
check "train_gpt accepts the command line (--plan exits 0)" test $? -eq 0
head -3 "$tmp/job/plan" | sed 's/^/   | /'
check "...and plans HSDP: a replica per node, FSDP in each" \
  grep -q '^plan: dp_replicate 2 x dp_shard 8 x cp 1 x tp 1 = 16 ranks (HSDP)' "$tmp/job/plan"
check "...with the option given to the script" grep -q '^batch: 32 sequences' "$tmp/job/plan"

submit "$tmp/fsdp" configs/gpt2_124m.ini --parallel.dp_shard_size 16
plan_of "$tmp/fsdp"
check "a layout given as an option is kept (FSDP over 16 ranks)" \
  grep -q '^plan: dp_replicate 1 x dp_shard 16 x cp 1 x tp 1 = 16 ranks (FSDP)' "$tmp/fsdp/plan"

STUB_RC=3 submit "$tmp/stopped" configs/gpt2_124m.ini
check "exit 3 (stopped by the time limit's signal) is the job's exit code" test $? -eq 3
check "...and requeues the job" grep -qx "requeue 4242" "$tmp/stopped/scontrol.args"
STUB_RC=1 submit "$tmp/failed" configs/gpt2_124m.ini
check "another failure ends the job without a requeue" test $? -eq 1 -a ! -e "$tmp/failed/scontrol.args"

submit "$tmp/noconfig" configs/no_such.ini
check "a missing config: exit 2" test $? -eq 2
check "...one error line, naming it" \
  test "$(grep -c 'error: .*no_such.ini' "$tmp/noconfig/log")" -eq 1 -a ! -e "$tmp/noconfig/srun.args"
(cd "$ROOT" && env -u SLURM_JOB_ID bash "$script" configs/gpt2_124m.ini) >"$tmp/outside.log" 2>&1
check "outside a Slurm job: exit 2 and the error" \
  test $? -eq 2 -a "$(grep -c 'error: not inside a Slurm job' "$tmp/outside.log")" -eq 1
exit $status
