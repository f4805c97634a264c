"""A real Prometheus scrapes a real deltad: Debian's `prometheus` on loopback, authenticated by
a metrics token through `authorization.credentials_file`, with the shipped alert rules loaded.
After an answer, the resume counter is read back through Prometheus' HTTP query API."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import httpx

from tests.support.daemon import Daemon, answer, paused_workspace, wait_for
from tests.support.inbox import http_url, make_token

from .. import prometheus

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "deltad-alerts.yml"


def test_prometheus_scrapes_deltad_and_sees_an_answer_resumed(tmp_path: Path) -> None:
    prometheus.binary()  # skipped (or failed in CI) before anything starts
    root = tmp_path / "root"
    root.mkdir()
    d = Daemon(tmp_path, [root], http={"listen": "127.0.0.1:0"}).start()
    try:
        target = urlsplit(http_url(d)).netloc
        token_file = tmp_path / "prom.token"
        token_file.write_text(make_token(d.state_dir, "prometheus", role="metrics") + "\n")
        token_file.chmod(0o600)
        prom_dir = tmp_path / "prom"
        prom_dir.mkdir()
        with prometheus.running(prom_dir, [target], token_file, [RULES]) as p:
            wait_for(lambda: p.value('up{job="deltad"}') == 1.0, "deltad scraped (up == 1)")
            assert p.value('deltad_ready{job="deltad"}') == 1.0
            assert p.value("sum(deltad_resumes_total)") is None  # nothing resumed yet
            ws = root / "ws1"
            paused_workspace(ws)
            answer(ws, "yes")
            d.wait_resumed(ws)
            wait_for(
                lambda: p.value('sum(deltad_resumes_total{result="succeeded"})') == 1.0,
                "the resume counted in Prometheus",
            )
            assert p.value('deltad_answers_total{channel="file"}') == 1.0
            assert p.value("deltad_answer_to_resume_seconds_count") == 1.0
            # The human side: the stub's question is text, asked moments before its answer.
            asked = 'deltad_question_asked_to_answered_seconds_bucket{kind="text",le="+Inf"}'
            assert p.value(asked) == 1.0
            assert (p.value('deltad_http_requests_total{route="/metrics",code="200"}') or 0) >= 1
            # The shipped rules were loaded and evaluate against real series.
            wait_for(lambda: _rules_ok(p.url), "every shipped rule evaluated, none failing")
    finally:
        d.stop()
        d.kill_children()


def _rules_ok(url: str) -> bool:
    r = httpx.get(f"{url}/api/v1/rules", timeout=10).json()
    rules = [rule for g in r["data"]["groups"] for rule in g["rules"]]
    names = {rule["name"] for rule in rules}
    assert {"DeltadAnswerNotResumed", "DeltadNoLeaseHolder"} <= names, names
    return all(rule["health"] == "ok" for rule in rules)
