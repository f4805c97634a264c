#!/usr/bin/env bash
# A pause and a resume without an API key: `delta` against a scripted model on 127.0.0.1 that
# asks for your name, then greets you. Run from a checkout after the README's setup:
#   bash examples/demo.sh [NAME]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${DELTA_BIN:-$here/.venv/bin}
ws=$(mktemp -d)
url=$ws.url
"$bin/python" -W ignore::RuntimeWarning -m deltad.testing.fakellm --demo > "$url" &
fake=$!
trap 'kill $fake 2>/dev/null; rm -rf "$ws" "$url"' EXIT
for _ in $(seq 100); do [ -s "$url" ] && break; sleep 0.1; done
export OPENAI_BASE_URL=$(cat "$url") OPENAI_API_KEY=demo
unset DELTA_BASE_URL DELTA_API_KEY

echo "\$ delta run --agent examples/hello-agent --task 'Greet me' -w $ws"
code=0
"$bin/delta" run --agent "$here/examples/hello-agent" --task "Greet me" -w "$ws" || code=$?
echo "(exit $code: the run is waiting for an answer in $ws/.delta/interaction/)"
[ "$code" -eq 101 ]
echo
echo "\$ delta respond -w $ws ${1:-Ada}"
"$bin/delta" respond -w "$ws" "${1:-Ada}"
echo
echo "\$ delta run -w $ws"
"$bin/delta" run -w "$ws"
