#!/usr/bin/env bash
# A small fleet of paused runs for `deltad serve` and its web page, without an API key: eleven
# workspaces under DIR, each waiting on a question (a choice, a deploy that needs two approvals,
# a yes/no with reminders, a date, four alike yes/no questions, a text, a number and a pipeline
# gate), asked by the scripted fake model (examples/fleet/fake-model.yaml). Everything is kept:
# the workspaces, and the fake model, left running for the daemon's resumes. From a checkout
# after the README's setup:
#   bash examples/fleet.sh DIR
#   bash examples/fleet.sh --owners alice,bob,carol DIR   (as root: the runs are theirs;
#                                                          users missing are made)
# It ends by printing the two commands that serve the fleet and make a token for its page.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${DELTA_BIN:-$here/.venv/bin}
usage="usage: bash examples/fleet.sh [--owners NAME,NAME,...] DIR"
owners=
while [ $# -gt 0 ]; do
  case $1 in
    --owners) owners=${2:?$usage}; shift 2 ;;
    --owners=*) owners=${1#--owners=}; shift ;;
    -h|--help) echo "$usage"; exit 0 ;;
    -*) echo "fleet.sh: unknown option $1; $usage" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ $# -eq 1 ] || { echo "$usage" >&2; exit 2; }
dir=$1
die() { echo "fleet.sh: $*" >&2; exit 2; }
[ -x "$bin/delta" ] || die "no $bin/delta: run the README's setup first (or set DELTA_BIN)"
if [ -n "$owners" ]; then
  [ "$(id -u)" -eq 0 ] || die "--owners runs each workspace as its owner: run it as root"
  IFS=, read -r -a who <<< "$owners"
else
  who=("$(id -un)")
fi
if [ -e "$dir" ] && [ -n "$(ls -A "$dir")" ]; then
  die "$dir is not empty: name a new directory"
fi
install -d -m 0755 "$dir"
dir=$(cd "$dir" && pwd)
for o in "${who[@]}"; do
  [[ $o =~ ^[a-z_][a-z0-9_-]*$ ]] || die "--owners: '$o' is not a user name"
  if ! id -u "$o" >/dev/null 2>&1; then
    useradd --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$o"
    echo "made the user $o"
  fi
  if [ "$o" != "$(id -un)" ]; then
    setpriv --reuid="$o" --regid="$(id -g "$o")" --init-groups test -x "$bin/delta" -a -x "$dir" \
      || die "$o cannot run $bin/delta or enter $dir: put both where every owner can"
  fi
done

# What every run reads: the agents, the pipeline, the fake model's script, in DIR/.fleet.
fleet=$dir/.fleet
install -d -m 0755 "$fleet" "$fleet/logs"
cp -r "$here/examples/hello-agent" "$here/examples/fleet/release-4eyes" "$fleet/"
cp "$here/examples/pipelines/review-gate.dot" "$fleet/"
sed -e "s/@EARLIEST@/$(date -u -d '+1 day' +%F)/" -e "s/@LATEST@/$(date -u -d '+60 days' +%F)/" \
  "$here/examples/fleet/fake-model.yaml" > "$fleet/fake-model.yaml"
chmod -R a+rX,go-w "$fleet"

# The fake model, in a session of its own so that it outlives this script; its pid in a file.
setsid --fork sh -c 'echo $$ > "$1"; shift; exec "$@"' sh "$fleet/fake-model.pid" \
  "$bin/python" -W ignore::RuntimeWarning -m deltad.testing.fakellm \
  --script "$fleet/fake-model.yaml" > "$fleet/fake-model.url" 2> "$fleet/fake-model.log" < /dev/null
for _ in $(seq 300); do [ -s "$fleet/fake-model.url" ] && break; sleep 0.1; done
url=$(cat "$fleet/fake-model.url")
[ -n "$url" ] || die "the fake model did not start: $(tail -1 "$fleet/fake-model.log")"

# One paused run: OWNER NAME then delta's arguments. Its output is in .fleet/logs/NAME.log.
ask() {
  local owner=$1 name=$2; shift 2
  local ws=$dir/$owner/$name
  install -d -m 0755 -o "$owner" -g "$(id -g "$owner")" "$dir/$owner" "$ws"
  local as=()
  [ "$owner" = "$(id -un)" ] || as=(setpriv --reuid="$owner" --regid="$(id -g "$owner")" --init-groups)
  local code=0
  (cd "$ws" && "${as[@]}" env -u DELTA_BASE_URL -u DELTA_API_KEY OPENAI_BASE_URL="$url" \
    OPENAI_API_KEY=fake "$bin/delta" run "$@" -w "$ws") > "$fleet/logs/$name.log" 2>&1 || code=$?
  echo "$code" > "$fleet/logs/$name.exit"
}
o1=${who[0]} o2=${who[1 % ${#who[@]}]} o3=${who[2 % ${#who[@]}]}
hello=$fleet/hello-agent
ask "$o1" release-channel --agent "$hello" --task "Pick the release channel for 1.4.0" &
ask "$o1" deploy-prod --agent "$fleet/release-4eyes" --task "Ship 1.4.0 to stable" &
ask "$o1" cost-report --agent "$hello" --task "Get the November cost report approved" &
ask "$o1" release-day --agent "$hello" --task "Choose the release day" &
wait
for i in 1 2 3 4; do ask "$o2" "web-$i" --agent "$hello" --task "Rotate the logs on web-$i" & done
ask "$o2" billing-migration --agent "$hello" --task "Find who owns the database migration" &
wait
ask "$o3" api-scale --agent "$hello" --task "Scale the API tier: how many replicas?" &
ask "$o3" release-note --agent "$hello" --pipeline "$fleet/review-gate.dot" &
wait

failed=0
for f in "$fleet"/logs/*.exit; do
  name=$(basename "$f" .exit)
  if [ "$(cat "$f")" != 101 ]; then
    echo "fleet.sh: $name did not pause (exit $(cat "$f")): $(tail -1 "$fleet/logs/$name.log")" >&2
    failed=1
  fi
done
[ "$failed" -eq 0 ] || exit 1

n=$(find "$dir" -mindepth 2 -maxdepth 2 -not -path "$fleet*" -type d | wc -l)
cat <<EOF
$n runs are waiting in $dir (owners: ${who[*]}).
The fake model they resume with is left running: $url (stop it: kill $(cat "$fleet/fake-model.pid")).

Serve them, with the fake model's address for the resumes:
  OPENAI_BASE_URL=$url OPENAI_API_KEY=fake $bin/deltad serve --root $dir --listen 127.0.0.1:8470
Then, in another terminal, a token to log in with at http://127.0.0.1:8470/ (bob and carol the
same way: the deploy needs two people of ops who do not own it):
  $bin/deltad token add alice --group ops
EOF
