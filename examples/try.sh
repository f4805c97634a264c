#!/usr/bin/env bash
# Try a question kind, an approval or a pipeline gate without an API key: the fake model runs a
# script from examples/fake-model/ on 127.0.0.1 and `delta run -i` asks you on this terminal.
# From a checkout after the README's setup:
#   bash examples/try.sh KIND [AGENT]
#   bash examples/try.sh KIND --continue WS   (a run that paused: continued with the fake model)
# KIND: text password confirmation yes_no choice number date approval pipeline-gate
# A run left waiting (no answer given here) keeps its workspace: answer it with the printed
# `delta respond` line, then continue it with the printed `--continue` line.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${DELTA_BIN:-$here/.venv/bin}
kinds=$(cd "$here/examples/fake-model" && for f in *.yaml; do printf '%s ' "${f%.yaml}"; done)
kind=${1:-}
if [ -z "$kind" ]; then
  echo "usage: bash examples/try.sh KIND [AGENT]   (KIND: ${kinds% })" >&2
  exit 2
fi
script=$here/examples/fake-model/$kind.yaml
if [ ! -f "$script" ]; then
  echo "try.sh: no kind '$kind'; the kinds: ${kinds% }" >&2
  exit 2
fi
keep=
if [ "${2:-}" = --continue ]; then
  ws=${3:-}
  [ -n "$ws" ] && [ -d "$ws/.delta" ] || { echo "try.sh: --continue needs a workspace" >&2; exit 2; }
  ws=$(cd "$ws" && pwd)
  keep=1
else
  ws=$(mktemp -d)
  touch "$ws/.made-by-try-sh"  # --continue removes it once the run is done, and only then
fi
url=$(mktemp)
"$bin/python" -W ignore::RuntimeWarning -m deltad.testing.fakellm --script "$script" > "$url" &
fake=$!
trap 'kill $fake 2>/dev/null; rm -f "$url"; [ -n "$keep" ] || rm -rf "$ws"' EXIT
for _ in $(seq 100); do [ -s "$url" ] && break; sleep 0.1; done
export OPENAI_BASE_URL=$(cat "$url") OPENAI_API_KEY=demo
unset DELTA_BASE_URL DELTA_API_KEY
agent=$here/examples/hello-agent
[ "$kind" = approval ] && agent=$here/examples/release-agent  # the agent that has a deploy tool
if [ -n "$keep" ]; then
  set -- run -i -w "$ws"
elif [ "$kind" = pipeline-gate ]; then
  set -- run -i --pipeline "$here/examples/pipelines/review-gate.dot" --agent "${2:-$agent}" -w "$ws"
else
  set -- run -i --agent "${2:-$agent}" --task "try $kind" -w "$ws"
fi
echo "\$ delta $*"
code=0
"$bin/delta" "$@" || code=$?
if [ "$code" -eq 101 ]; then
  keep=1  # waiting: the lines above name this workspace
  echo
  echo "try.sh: the run waits in $ws (kept). Answer it with the \`delta respond\` line above,"
  echo "then continue it with the fake model (\`delta run\` alone has no model to talk to):"
  echo "  bash examples/try.sh $kind --continue $ws"
elif [ -n "$keep" ] && [ -f "$ws/.made-by-try-sh" ]; then
  keep=  # continued to its end: the workspace try.sh made goes
fi
exit "$code"
