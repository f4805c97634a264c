"""Operating deltad, the pure parts and the HTTP side in-process: the health decisions (tables),
the failed-authentication rate limiter, the answer-channel label, the scrape-time gauges from a
fake source, the index's question counts, and /livez, /readyz, /metrics and the access log
through the real app with a fixed `Vitals`."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import structlog
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from deltad import health
from deltad.health import Check, Fixed, Health
from deltad.http.access import RateLimit, Said
from deltad.http.app import create_app
from deltad.inbox.config import HttpConfig
from deltad.inbox.feed import Feed, Index, View
from deltad.inbox.handlers import Context
from deltad.inbox.tokens import TokenStore
from deltad.metrics import CoreMetrics, Scraped, channel_of, gauges

READY = Health(ready=True, index_complete=True, unread=0, last_turn=100.0, workspaces=5)


# -- health ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("h", "now", "ok"),
    [
        (READY, 100.0, True),
        (READY, 110.0, True),  # exactly LIVE_WITHIN: still live
        (READY, 110.5, False),
        (Health(False, False, 0, None), 0.0, False),  # never turned
        (Health(False, False, 0, 50.0), 49.0, True),  # a clock read before the turn's
    ],
)
def test_live_is_a_recent_turn(h: Health, now: float, ok: bool) -> None:
    assert health.passing(health.live_checks(h, now)) is ok


@pytest.mark.parametrize(
    ("h", "failing"),
    [
        (READY, []),
        (Health(False, False, 0, 1.0, workspaces=3), ["ready", "index"]),
        (Health(True, False, 1200, 1.0, workspaces=5000), ["index"]),
        (Health(True, True, 0, 1.0, lease_held=True), []),
        (Health(True, True, 0, 1.0, lease_held=False), ["lease"]),
    ],
)
def test_ready_needs_the_walk_the_index_and_the_lease(h: Health, failing: list[str]) -> None:
    checks = health.ready_checks(h)
    assert [c.name for c in checks if not c.ok] == failing
    assert health.passing(checks) is (not failing)
    assert ("lease" in [c.name for c in checks]) is (h.lease_held is not None)


def test_the_index_check_says_how_many_are_left() -> None:
    [_, index] = health.ready_checks(Health(True, False, 1200, 1.0, workspaces=5000))
    assert index == Check("index", False, "1200 of 5000 workspaces still to read")
    assert health.document([index]) == {
        "status": "failing",
        "checks": [{"name": "index", "ok": False, "detail": index.detail}],
    }


# -- the failed-auth limiter -------------------------------------------------------------------
def test_one_line_per_source_per_period_with_the_count_held_back() -> None:
    limit = RateLimit(every=60.0, keys=2)
    assert limit.allow("10.0.0.1", 0.0) == Said(True, 0)
    assert limit.allow("10.0.0.1", 1.0) == Said(False)
    assert limit.allow("10.0.0.1", 59.0) == Said(False)
    assert limit.allow("10.0.0.2", 2.0) == Said(True, 0)  # another source: its own period
    assert limit.allow("10.0.0.1", 60.0) == Said(True, 2)  # the two held back, said now
    assert limit.allow("10.0.0.1", 61.0) == Said(False)


def test_the_limiter_forgets_the_least_recent_source_beyond_its_cap() -> None:
    limit = RateLimit(every=60.0, keys=2)
    for i, source in enumerate(["a", "b", "c"]):
        assert limit.allow(source, float(i)).log
    assert limit.allow("a", 3.0) == Said(True, 0)  # forgotten: said again (memory bounded)
    assert limit.allow("c", 4.0) == Said(False)


# -- labels ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "text", "channel"),
    [
        ("response.txt", "yes", "file"),
        ("response.json", '{"request_id": "q", "answer": "x", "channel": "http"}', "http"),
        ("response.json", '{"request_id": "q", "answer": "x", "channel": "link"}', "link"),
        ("response.json", '{"request_id": "q", "answer": "x"}', "file"),
        ("response.json", '{"channel": "/home/alice/secret"}', "other"),  # never as written
        ("response.json", '{"channel": 7}', "other"),
        ("response.json", "not json", "other"),
        ("response.json", "[1]", "file"),
    ],
)
def test_the_channel_label_is_one_of_a_few(name: str, text: str, channel: str) -> None:
    assert channel_of(name, text) == channel


# -- the gauges computed at scrape time --------------------------------------------------------
@dataclass
class FakeSource:
    h: Health = READY
    outbox: int | None = None
    states: dict[str, int] = field(default_factory=lambda: {"idle": 3, "waiting": 2})

    def health(self) -> Health:
        return self.h

    def workspaces_by_state(self) -> dict[str, int]:
        return self.states

    def questions(self) -> tuple[dict[str, int], float | None]:
        return {"choice": 1, "text": 1}, 1000.0

    def resumes(self) -> tuple[int, int]:
        return 1, 4

    def roots(self) -> list[tuple[str, str]]:
        return [("/srv/ws", "inotify")]

    def backends(self) -> list[tuple[str, int, bool]]:
        return [("inotify", 12, True), ("polling", 0, False)]

    def outbox_depth(self) -> int | None:
        return self.outbox

    def channel_outbox_depth(self) -> list[tuple[str, int]]:
        return [("email", self.outbox)] if self.outbox is not None else []


def _samples(source: FakeSource, mono: float = 103.0, wall: float = 1060.0) -> dict[str, float]:
    out = {}
    for family in gauges(source, mono, wall):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def test_gauges_from_the_counts_the_core_keeps() -> None:
    got = _samples(FakeSource())
    assert got == {
        "deltad_ready": 1.0,
        "deltad_index_complete": 1.0,
        "deltad_loop_last_turn_age_seconds": 3.0,
        "deltad_workspaces{state=idle}": 3.0,
        "deltad_workspaces{state=waiting}": 2.0,
        "deltad_requests_pending{input_type=choice}": 1.0,
        "deltad_requests_pending{input_type=text}": 1.0,
        "deltad_request_oldest_pending_age_seconds": 60.0,
        "deltad_resumes_running": 1.0,
        "deltad_resumes_queued": 4.0,
        "deltad_root_backend_info{backend=inotify,root=/srv/ws}": 1.0,
        "deltad_watches{backend=inotify}": 12.0,
        "deltad_watches{backend=polling}": 0.0,
        "deltad_watch_backend_healthy{backend=inotify}": 1.0,
        "deltad_watch_backend_healthy{backend=polling}": 0.0,
    }


def test_the_lease_and_the_outbox_appear_only_where_they_exist() -> None:
    h = Health(True, False, 7, 100.0, lease_held=True)
    got = _samples(FakeSource(h=h, outbox=3))
    assert got["deltad_ha_lease_held"] == 1.0 and got["deltad_webhook_outbox_depth"] == 3.0
    assert got["deltad_channel_outbox_depth{channel=email}"] == 3.0
    assert got["deltad_ready"] == 0.0  # the index is not complete yet


def test_the_core_exposition_parses_and_has_conventional_names() -> None:
    m = CoreMetrics()
    m.registry.register(Scraped(FakeSource()))
    m.answers.labels("http").inc()
    m.resume_started("fork", answered_at=10.0, now=10.003)  # a warm resume: 3 ms
    m.resume_ended("fork", failed=False, timed_out=False)
    m.resume_ended("fork", failed=True, timed_out=True)
    families = {f.name: f for f in text_string_to_metric_families(m.exposition().decode())}
    assert {
        "deltad_answers",
        "deltad_resumes",
        "deltad_answer_to_resume_seconds",
        "deltad_workspaces",
        "deltad_build_info",
    } <= set(families)
    resumes = {
        (s.labels["executor"], s.labels["result"]): s.value
        for s in families["deltad_resumes"].samples
        if s.name == "deltad_resumes_total"
    }
    assert resumes == {("fork", "succeeded"): 1.0, ("fork", "timed_out"): 1.0}
    [count] = [
        s.value
        for s in families["deltad_answer_to_resume_seconds"].samples
        if s.name.endswith("_count")
    ]
    assert count == 1.0
    within = {
        s.labels["le"]: s.value
        for s in families["deltad_answer_to_resume_seconds"].samples
        if s.name.endswith("_bucket")
    }
    assert (within["0.0025"], within["0.005"]) == (0.0, 1.0)  # told apart from 10 ms


def test_the_time_a_person_took_is_a_histogram_by_kind() -> None:
    m = CoreMetrics()
    m.answered("approval", asked_at=1000.0, answered_at=1000.0 + 20 * 60)  # 20 minutes
    m.answered("text", asked_at=1000.0, answered_at=1003.0)
    m.answered("text", asked_at=None, answered_at=1003.0)  # asked when, unknown: not counted
    families = {f.name: f for f in text_string_to_metric_families(m.exposition().decode())}
    samples = families["deltad_question_asked_to_answered_seconds"].samples
    counts = {s.labels["kind"]: s.value for s in samples if s.name.endswith("_count")}
    assert counts == {"approval": 1.0, "text": 1.0}
    within = {
        (s.labels["kind"], s.labels["le"]): s.value for s in samples if s.name.endswith("_bucket")
    }
    assert (within[("approval", "900.0")], within[("approval", "1800.0")]) == (0.0, 1.0)
    assert (within[("text", "1.0")], within[("text", "5.0")]) == (0.0, 1.0)


# -- the index's question counts (what deltad_requests_pending reads) -------------------------
def test_the_index_counts_open_questions_by_kind_as_they_come_and_go() -> None:
    index = Index()
    a, b = Path("/nonexistent/a"), Path("/nonexistent/b")
    index.put(View(a, "waiting", "r1", "WAITING_FOR_INPUT", "q1", "choice", 20.0))
    index.put(View(b, "waiting", "r2", "WAITING_FOR_INPUT", "q2", "text", 10.0))
    assert index.pending_summary() == ({"choice": 1, "text": 1}, 10.0)
    index.put(View(b, "running", "r2", "RUNNING"))  # answered: its question is gone
    assert index.pending_summary() == ({"choice": 1}, 20.0)
    index.remove(a)
    assert index.pending_summary() == ({}, None)


# -- the routes, in-process --------------------------------------------------------------------
@pytest.fixture
def app(tmp_path: Path) -> Iterator[tuple[TestClient, TokenStore, list[Health]]]:
    """The app with a `Vitals` the test sets (the last Health in the list)."""
    store = TokenStore(tmp_path / "state")
    said: list[Health] = [READY]

    class Settable:
        def health(self) -> Health:
            return said[-1]

        def core_metrics(self) -> bytes:
            return b"# TYPE deltad_core_probe gauge\ndeltad_core_probe 1.0\n"

    ctx = Context(
        Feed(), store, HttpConfig(), os.urandom(32), base_url="http://x", vitals=Settable()
    )
    with TestClient(create_app(ctx), client=("10.1.2.3", 5555)) as http:
        yield http, store, said


def test_readyz_is_503_until_the_index_is_complete(
    app: tuple[TestClient, TokenStore, list[Health]],
) -> None:
    http, _, said = app
    said.append(Health(True, False, 900, 1.0, workspaces=1000))
    r = http.get("/readyz")
    assert (r.status_code, r.json()) == (503, {"status": "failing"})
    verbose = http.get("/readyz", params={"verbose": ""}).json()["checks"]
    assert [c["name"] for c in verbose if not c["ok"]] == ["index"]
    assert http.get("/healthz").status_code == 503  # the old name: the same decision
    said.append(READY)
    assert (http.get("/readyz").status_code, http.get("/healthz").json()) == (
        200,
        {"status": "ok"},
    )


def test_livez_goes_by_the_last_turn(app: tuple[TestClient, TokenStore, list[Health]]) -> None:
    import time

    http, _, said = app
    said.append(Health(True, True, 0, time.monotonic()))
    assert http.get("/livez").status_code == 200
    said.append(Health(True, True, 0, time.monotonic() - 60))
    r = http.get("/livez", params={"verbose": "1"})
    assert r.status_code == 503 and r.json()["checks"][0]["name"] == "loop"


def test_metrics_needs_a_metrics_or_admin_token_and_a_metrics_token_nothing_else(
    app: tuple[TestClient, TokenStore, list[Health]],
) -> None:
    http, store, _ = app
    prom = {"Authorization": f"Bearer {store.add('prom', [], 'metrics')}"}
    reader = {"Authorization": f"Bearer {store.add('ro', [], 'reader')}"}
    admin = {"Authorization": f"Bearer {store.add('root', [], 'admin')}"}
    assert http.get("/metrics").status_code == 401
    assert http.get("/metrics", headers={"Authorization": "Bearer dlt_nope"}).status_code == 401
    assert http.get("/metrics", headers=reader).status_code == 403
    for who in (prom, admin):
        r = http.get("/metrics", headers=who)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        assert "deltad_core_probe 1.0" in r.text  # the core's part, as handed over
    assert 'deltad_http_requests_total{code="401",method="GET",route="/metrics"} 2.0' in r.text
    assert http.get("/v1/requests", headers=prom).status_code == 403
    assert http.post("/v1/session", json={"token": prom["Authorization"][7:]}).status_code == 403


def test_one_access_line_per_request_naming_the_route_and_token_never_the_secrets(
    app: tuple[TestClient, TokenStore, list[Health]],
) -> None:
    http, store, _ = app
    token = store.add("alice", [], "answerer")
    with structlog.testing.capture_logs() as logs:
        http.get("/v1/requests/q-secret-id", headers={"Authorization": f"Bearer {token}"})
        http.get("/v1/links/signed.link.token")
        for _ in range(3):
            http.get("/v1/requests", headers={"Authorization": "Bearer dlt_wrong"})
    lines = [e for e in logs if e["event"] == "http_request"]
    assert [(e["route"], e["token"]) for e in lines] == [
        ("/v1/requests/{request_id}", "alice"),
        ("/v1/links/{token}", None),
        ("/v1/requests", None),
        ("/v1/requests", None),
        ("/v1/requests", None),
    ]
    assert lines[0]["code"] == 404 and lines[2]["code"] == 401
    assert all(e["client"] == "10.1.2.3" and e["duration_ms"] >= 0 for e in lines)
    [failed] = [e for e in logs if e["event"] == "http_auth_failed"]  # three: one line
    assert (failed["client"], failed["suppressed"]) == ("10.1.2.3", 0)
    text = repr(logs)
    assert token not in text and "dlt_wrong" not in text
    assert "q-secret-id" not in text and "signed.link.token" not in text


def test_fixed_vitals_serve_what_they_hold() -> None:
    v = Fixed(READY, b"x 1\n")
    assert v.health() is READY and v.core_metrics() == b"x 1\n"


# -- the service's own vitals, in-process --------------------------------------------------------
@pytest.mark.linux_only  # the glance defers a read by the read lease (deltad/platform.py)
def test_the_services_vitals_follow_the_walk_the_reads_and_the_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deltad.clock import ManualClock
    from deltad.core.config import HaConfig, load_config
    from deltad.core.lease import Lease
    from deltad.core.service import Service
    from deltad.testing.stub import paused_workspace

    from .test_daemon_sweep import RecordingResumer

    monkeypatch.delenv("DELTAD_CONFIG", raising=False)
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    root = tmp_path / "root"
    for i in range(3):
        paused_workspace(root / f"ws{i}", input_type="text")
    config = load_config(None, (str(root),))
    config.state_dir = tmp_path / "state"
    config.state_dir.mkdir()
    config.executor = "fresh"  # not a fork server (a Python start): no resume is started here
    config.ha = HaConfig(lease=tmp_path / "lease")
    clock = ManualClock(wall=__import__("time").time())
    svc = Service(config, None, (), clock=clock, resumer=RecordingResumer(config))
    assert health.ready_checks(svc.vitals.health())[0].ok is False
    svc.life.lease = Lease(config.ha.lease)
    assert svc.lease.try_take(clock.monotonic())
    svc.life.start()
    try:
        h = svc.vitals.health()
        assert (h.ready, h.index_complete, h.unread, h.lease_held) == (True, False, 3, True)
        for _ in range(100):
            svc.turn()
            if svc.vitals.health().index_complete:
                break
        h = svc.vitals.health()
        assert health.passing(health.ready_checks(h)) and h.workspaces == 3
        assert h.last_turn == clock.monotonic()
        got = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(svc.vitals.core_metrics().decode())
            for s in f.samples
        }
        assert got[("deltad_requests_pending", (("input_type", "text"),))] == 3.0
        assert got[("deltad_workspaces", (("state", "waiting"),))] == 3.0
        assert got[("deltad_ha_lease_held", ())] == 1.0
        assert got[("deltad_reconcile_full_duration_seconds_count", (("reason", "startup"),))] == 1
        svc.lease.lost = True
        assert [c.name for c in health.ready_checks(svc.vitals.health()) if not c.ok] == ["lease"]
    finally:
        svc.life.close_backends()
        svc.lease.release()


def test_webhook_deliveries_are_counted_by_result_and_the_outbox_depth_follows(
    tmp_path: Path,
) -> None:
    """The inbox's worker counts; its report crosses (as the protocol's `deliveries` message)
    into the core's counter and depth."""
    import time

    from deltad import wire
    from deltad.inbox.config import Webhook
    from deltad.outbound.handoff import Handoff
    from deltad.outbound.notify import new_delivery, webhook_target
    from deltad.outbound.senders import WebhookSender, webhook_courier
    from tests.support.webhooks import Receiver

    counted = CoreMetrics().deliveries
    (tmp_path / "inbox").mkdir()
    with Receiver(answers=[500, 500, 204]) as receiver:
        hook = Webhook(url=receiver.url, backoff_seconds=0.01, max_attempts=2)
        box = Handoff(tmp_path / "inbox", tmp_path, [hook.url], [hook.outbox_max], None, counted)
        counts = {"sent": 0, "retry": 0, "dead": 0}

        def tally(result: str) -> None:
            counts[result] += 1
            report()

        def report() -> None:
            told = {**counts, "depth": worker.waiting()}
            box.report(wire.Deliveries(op="deliveries", target="webhook0", **told))

        target = webhook_target(hook, "webhook0")
        worker = webhook_courier(target, tmp_path / "inbox", tally=tally)  # no thread started

        def attempt() -> None:
            due = None
            while due is None:
                due = worker._next_due()  # waits for the backoff
            worker._attempt(due)

        def put(event_id: int) -> None:
            doc = {"id": event_id, "type": "run.status", "workspace": "/w"}
            box.put(new_delivery(doc, hook.url, time.time()))
            worker.take_new()
            report()

        put(1)
        assert box.depth == 1
        attempt()  # 500: a retry
        assert box.depth == 1
        attempt()  # 500 again: the second of max_attempts, dead
        assert box.depth == 0
        put(2)
        attempt()  # 204: delivered
        assert isinstance(worker.send, WebhookSender)
        worker.send.close()
        box.close()
    assert box.depth == 0
    by = {s.labels["result"]: s.value for s in counted.collect()[0].samples if "_total" in s.name}
    assert by == {"retry": 1.0, "dead": 1.0, "sent": 1.0}


def test_the_pages_question_before_its_login_is_no_failed_login(
    app: tuple[TestClient, TokenStore, list[Health]],
) -> None:
    """The page asks `GET /v1/session` before it shows its login: with no credential at all
    that is `{"signed_in": false}`, neither an `http_auth_failed` line nor a counted 401; a
    credential that does not check out is still both."""
    http, store, _ = app
    prom = {"Authorization": f"Bearer {store.add('prom', [], 'metrics')}"}
    with structlog.testing.capture_logs() as logs:
        r = http.get("/v1/session")
    assert (r.status_code, r.json()) == (200, {"signed_in": False})
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == []
    token = store.add("alice", [], "answerer")
    me = http.get("/v1/session", headers={"Authorization": f"Bearer {token}"}).json()
    assert me["signed_in"] is True and me["name"] == "alice"
    http.cookies.set("deltad_session", "gone")
    stale = http.get("/v1/session")
    assert stale.status_code == 401 and stale.json()["code"] == "unauthorized"
    http.cookies.clear()
    text = http.get("/metrics", headers=prom).text
    assert 'deltad_http_requests_total{code="200",method="GET",route="/v1/session"} 2.0' in text
    assert 'deltad_http_requests_total{code="401",method="GET",route="/v1/session"} 1.0' in text
    # The document says it: anonymous too, and either answer.
    op = http.get("/openapi.json").json()["paths"]["/v1/session"]["get"]
    assert {} in op["security"] and {"bearer": []} in op["security"]
    ok = op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    either = http.get("/openapi.json").json()["components"]["schemas"][ok.rsplit("/", 1)[1]]
    assert {s["$ref"].rsplit("/", 1)[1] for s in either["anyOf"]} == {"SessionOut", "SignedOut"}
