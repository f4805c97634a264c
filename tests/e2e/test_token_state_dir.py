"""`deltad token add|list|revoke --config F` work on the state dir the daemon started with F
uses, and say which file they wrote (a token made in the wrong place used to be "not valid"
with no hint why)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.support.daemon import DELTAD, Daemon
from tests.support.inbox import client, http_url


def _deltad(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("STATE_DIRECTORY", "XDG_STATE_HOME")}
    return subprocess.run(
        [DELTAD, *args], env={**base, **(env or {})}, capture_output=True, text=True, timeout=60
    )


def test_a_token_added_with_the_config_is_accepted_by_the_daemon(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    d = Daemon(tmp_path, [root], http={"listen": "127.0.0.1:0"}).start()
    try:
        url = http_url(d)
        config = str(d.config_path)
        added = _deltad("token", "add", "alice", "--config", config)
        assert added.returncode == 0, added.stderr
        tokens = d.state_dir / "inbox" / "tokens.json"
        assert f"written to {tokens}" in added.stdout
        assert added.stderr == ""  # the config names state_dir: nothing to warn about
        token = added.stdout.strip().splitlines()[-1]
        with client(url, token) as http:
            assert http.get("/v1/requests").status_code == 200
        listed = _deltad("token", "list", "--config", config)
        assert listed.stdout.split("\t")[0] == "alice"
        assert f"tokens in {tokens}" in listed.stderr
        revoked = _deltad("token", "revoke", "alice", "--config", config)
        assert revoked.stdout.strip() == f"token alice revoked in {tokens}"
        with client(url, token) as http:
            assert http.get("/v1/requests").status_code == 401
    finally:
        d.stop()


def test_a_config_without_state_dir_says_which_directory_it_used(tmp_path: Path) -> None:
    config = tmp_path / "deltad.yaml"
    config.write_text(f"roots: [{tmp_path}]\n")
    xdg = tmp_path / "xdg"
    out = _deltad("token", "add", "bob", "--config", str(config), env={"XDG_STATE_HOME": str(xdg)})
    assert out.returncode == 0, out.stderr
    assert f"written to {xdg / 'deltad' / 'inbox' / 'tokens.json'}" in out.stdout
    assert (xdg / "deltad" / "inbox" / "tokens.json").is_file()
    [note] = out.stderr.splitlines()
    assert "sets no state_dir" in note and "/var/lib/deltad" in note and str(xdg) in note
    # Under the unit, StateDirectory= exports $STATE_DIRECTORY: the daemon's own default.
    unit = tmp_path / "unit-state"
    out = _deltad(
        "token", "add", "carol", "--config", str(config), env={"STATE_DIRECTORY": str(unit)}
    )
    assert out.returncode == 0 and out.stderr == ""
    assert f"written to {unit / 'inbox' / 'tokens.json'}" in out.stdout
