#!/usr/bin/env bash
# expect-exit.sh CODE CMD ARGS... — runs CMD and fails unless it exits with
# exactly CODE (so a crash, an abort or a signal never passes for an error).
# CMD's stderr is passed through for FileCheck.
want=$1
shift
"$@"
got=$?
if [ "$got" -ne "$want" ]; then
  echo "expect-exit: '$*' exited with $got, expected $want" >&2
  exit 1
fi
exit 0
