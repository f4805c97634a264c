#!/usr/bin/env bash
# Try a question kind, an approval or a pipeline gate without an API key: the fake model runs a
# script from examples/fake-model/ on 127.0.0.1 and `delta run -i` asks you on this terminal.
# From a checkout after the README's setup:
#   bash examples/try.sh KIND [AGENT]
# KIND: text password confirmation yes_no choice number date approval pipeline-gate
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${DELTA_BIN:-$here/.venv/bin}
kind=${1:?usage: bash examples/try.sh KIND [AGENT]   (KIND: a file in examples/fake-model/)}
script=$here/examples/fake-model/$kind.yaml
[ -f "$script" ] || { echo "try.sh: no script $script" >&2; exit 2; }
ws=$(mktemp -d)
url=$ws.url
"$bin/python" -W ignore::RuntimeWarning -m deltad.testing.fakellm --script "$script" > "$url" &
fake=$!
trap 'kill $fake 2>/dev/null; rm -rf "$ws" "$url"' EXIT
for _ in $(seq 100); do [ -s "$url" ] && break; sleep 0.1; done
export OPENAI_BASE_URL=$(cat "$url") OPENAI_API_KEY=demo
unset DELTA_BASE_URL DELTA_API_KEY
if [ "$kind" = pipeline-gate ]; then
  set -- run -i --pipeline "$here/examples/pipelines/review-gate.dot" \
    --agent "${2:-$here/examples/hello-agent}" -w "$ws"
else
  set -- run -i --agent "${2:-$here/examples/hello-agent}" --task "try $kind" -w "$ws"
fi
echo "\$ delta $*"
"$bin/delta" "$@"
