# The steps .ci/run is made of (sourced; tests/test_lanes.py runs them with stand-in jobs).
# It appends to the caller's failed array.

# step NAME COMMAND...: run it, say how long it took, note a failure
step() {
  local name=$1 started rc=0
  shift
  started=$(date +%s)
  echo "+ [$name] $*"
  "$@" || rc=$?
  echo "step $name: $(( $(date +%s) - started )) s$([ $rc = 0 ] || echo ", FAILED (exit $rc)")"
  [ $rc = 0 ] || failed+=("$name")
}

# job NAME: one lane of the main environment (pytest --lane NAME), or a stack lane (stack-seed, stack-top,
# .ci/stack_lane) or the vLLM lane (vllm, .ci/vllm_lane), each in its own environment
# The pytest lanes run with one OpenMP thread each: two tracks share two cores, and torch's second thread
# a lane mostly spent waiting at its barriers, taking the core the other track needed. vLLM's lane sets
# its own threads (.ci/vllm_lane).
job() {
  case $1 in
    stack-*) OMP_NUM_THREADS=${LANE_THREADS:-1} bash .ci/stack_lane "${1#stack-}" ;;
    vllm) bash .ci/vllm_lane ;;
    *) OMP_NUM_THREADS=${LANE_THREADS:-1} .venv/bin/python -m pytest -q -p no:cacheprovider --durations=15 --lane "$1" ;;  # --durations: the lane log names its slowest tests (for the pairing in .ci/run)
  esac
}

# together TRACK...: the tracks side by side, each a space-separated list of jobs run one after another;
# each job logged on its own (.ci-logs/lane-NAME.log), its last line and seconds printed after
together() {
  local track name started jobs=() pids=()
  started=$(date +%s)
  for track in "$@"; do
    ( for name in $track; do
        lane_started=$(date +%s); rc=0
        job "$name" > ".ci-logs/lane-$name.log" 2>&1 || rc=$?
        echo "$rc $(( $(date +%s) - lane_started ))" > ".ci-logs/lane-$name.result"
      done ) &
    pids+=($!)
    jobs+=($track)
  done
  # only this call's tracks: a bare wait would also wait for (and reap) the environments' install
  wait "${pids[@]}"
  for name in "${jobs[@]}"; do
    read -r rc seconds < ".ci-logs/lane-$name.result"
    tail -n 1 ".ci-logs/lane-$name.log"
    echo "lane $name: $seconds s$([ "$rc" = 0 ] || echo ", FAILED (exit $rc)")"
    if [ "$rc" != 0 ]; then
      tail -n 60 ".ci-logs/lane-$name.log" >&2
      failed+=("$name")
    fi
  done
  [ $# = 1 ] || echo "together ($(printf '%s | ' "$@" | sed 's/ | $//')): $(( $(date +%s) - started )) s"
}
