#!/usr/bin/env bash
# A shell pipeline whose consumer fails: the producer then writes into a closed pipe.
# usage: pipeline.sh PYTHON CORPUS_ARGS...
set -o pipefail
python=$1
shift
here=$(dirname "$0")
"$python" "$here/corpus.py" produce "$@" | "$python" "$here/corpus.py" consume "$@"
