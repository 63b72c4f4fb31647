#!/usr/bin/env bash
# Two ranks of a gloo group started the way plain cluster scripts do: RANK, WORLD_SIZE and MASTER_* set by
# the script, no launcher in between. Exits with the first failing rank's status, as `wait` gives it.
# usage: ranks.sh PYTHON PORT CORPUS_ARGS...   (runs `PYTHON corpus.py gloo-rank CORPUS_ARGS...` twice)
set -u
python=$1 port=$2
shift 2
here=$(dirname "$0")
export MASTER_ADDR=127.0.0.1 MASTER_PORT=$port WORLD_SIZE=2
pids=()
for rank in 0 1; do
    RANK=$rank "$python" "$here/corpus.py" gloo-rank "$@" &
    pids+=($!)
done
status=0
for pid in "${pids[@]}"; do
    wait "$pid" || { code=$?; [ "$status" -ne 0 ] || status=$code; }
done
exit "$status"
