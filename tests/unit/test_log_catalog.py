"""deltad/logcatalog.py: which calls emit which events, read from source snippets; the page's
rows kept and regenerated; what the drift check says. (The check of the package against
docs/log-events.md parses the whole package: tests/unit_slow/test_log_catalog.py.)"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from deltad import logcatalog
from deltad.logcatalog import TO_WRITE, CatalogError, Emit, Entry


def _emits(source: str, effects: frozenset[str] = frozenset()) -> set[tuple[str, str, str, int]]:
    found = logcatalog.emits_in(textwrap.dedent(source), "deltad/m.py", effects)
    assert {e.module for e in found} <= {"deltad/m.py"}
    return {(e.event, e.level, e.logger, e.line) for e in found}


def test_level_methods_of_a_module_logger() -> None:
    source = """\
        import structlog
        log = structlog.get_logger("deltad.service")
        auth_log: object = structlog.get_logger("deltad.http.auth")

        def f(x):
            log.info("daemon_ready", workspaces=x)
            log.warning("resume_timeout")
            log.warn("old_spelling")
            log.exception("internal_error")
            log.debug(event="by_keyword")
            auth_log.error("http_auth_failed")
            log.bind(run_id=x).critical("bound_logger")
            structlog.get_logger("deltad.cli").warning("shared_root", problem=x)
    """
    assert _emits(source) == {
        ("daemon_ready", "info", "deltad.service", 6),
        ("resume_timeout", "warning", "deltad.service", 7),
        ("old_spelling", "warning", "deltad.service", 8),
        ("internal_error", "error", "deltad.service", 9),
        ("by_keyword", "debug", "deltad.service", 10),
        ("http_auth_failed", "error", "deltad.http.auth", 11),
        ("bound_logger", "critical", "deltad.service", 12),
        ("shared_root", "warning", "deltad.cli", 13),
    }


def test_calls_that_are_not_logging_are_not_events() -> None:
    source = """\
        import structlog, logging
        log = structlog.get_logger("deltad.x")
        std = logging.getLogger("uvicorn.error")

        def f(ctx, parser, t):
            ctx.warn("a_warning_to_a_person")
            parser.error("usage_error")
            t.exception()
            std.info("not_structlog")
            log.info
    """
    assert _emits(source) == set()


def test_a_method_handed_out_by_a_function_logs_at_each_level_it_may_be() -> None:
    source = """\
        import structlog
        log = structlog.get_logger("deltad.registry")

        def _say(quiet):
            if not quiet:
                say: object = log.info
                return say
            return log.debug if enabled() else None

        def seen(ws, quiet):
            if say := _say(quiet):
                say("workspace_discovered", workspace=ws)
            tell = log.warning
            tell("workspace_problem")
    """
    assert _emits(source) == {
        ("workspace_discovered", "info", "deltad.registry", 12),
        ("workspace_discovered", "debug", "deltad.registry", 12),
        ("workspace_problem", "warning", "deltad.registry", 14),
    }


def test_event_names_a_loop_takes_from_literals() -> None:
    source = """\
        import structlog
        log = structlog.get_logger("deltad.service")

        def refusals(ws):
            found = (("answer_refused", 1), ("answer_set_aside", 2))
            for event, n in found:
                log.warning(event, n=n)
            for name in ["first_name", "second_name"]:
                log.info(name)
    """
    assert _emits(source) == {
        ("answer_refused", "warning", "deltad.service", 7),
        ("answer_set_aside", "warning", "deltad.service", 7),
        ("first_name", "info", "deltad.service", 9),
        ("second_name", "info", "deltad.service", 9),
    }


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ('log.info(f"resume_{kind}")', "an event name the catalog cannot read"),
        ("log.info(names[0])", "an event name the catalog cannot read"),
        ("for e in make(): log.info(e)", "an event name the catalog cannot read"),
        ('log.info("Resume Started")', "is not snake_case"),
        ('passed_log.info("from_elsewhere")', "a logger the catalog cannot trace"),
        ('self.log.warning("on_an_attribute")', "a logger the catalog cannot trace"),
    ],
)
def test_an_emit_the_catalog_cannot_read_is_an_error_naming_its_line(body: str, why: str) -> None:
    source = f"""\
import structlog
log = structlog.get_logger("deltad.x")

def f(self, kind, names, passed_log):
    {body}
"""
    with pytest.raises(CatalogError, match=r"^deltad/m\.py:5") as e:
        logcatalog.emits_in(source, "deltad/m.py")
    assert why in str(e.value)


CORE = """\
from dataclasses import dataclass, field

@dataclass(frozen=True)
class Log:
    level: str
    event: str
    fields: dict = field(default_factory=dict)

def decide(v):
    return [Log("warning", "resume_backoff", {"n": 1}), Log(level="info", event="resume_busy")]
"""

SHELL = """\
import structlog
from . import core
log = structlog.get_logger("deltad.service")

def carry_out(effects):
    for e in effects:
        match e:
            case core.Log(level, event, fields):
                getattr(log, level)(event, **fields)
"""


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    package = tmp_path / "deltad"
    package.mkdir()
    for name, text in files.items():
        (package / name).write_text(text)
    return package


def test_a_cores_log_effects_are_events_of_the_shell_that_logs_them(tmp_path: Path) -> None:
    package = _package(tmp_path, {"core.py": CORE, "service.py": SHELL, "other.py": "x = 1\n"})
    found = logcatalog.emitted(package)
    assert set(found) == {
        Emit("resume_backoff", "warning", "deltad.service", "deltad/core.py", 10),
        Emit("resume_busy", "info", "deltad.service", "deltad/core.py", 10),
    }


def test_a_log_effect_nothing_logs_is_an_error(tmp_path: Path) -> None:
    package = _package(tmp_path, {"core.py": CORE})
    with pytest.raises(CatalogError, match="no `getattr"):
        logcatalog.emitted(package)


def test_a_log_effect_needs_literals() -> None:
    source = CORE.replace('Log("warning", "resume_backoff"', 'Log(level, "resume_backoff"')
    with pytest.raises(CatalogError, match="must be string literals"):
        logcatalog.emits_in(source, "deltad/core.py", frozenset({"Log"}))


EMITS = [
    Emit("resume_exited", "info", "deltad.resumer", "deltad/core/resumer.py", 1),
    Emit("workspace_discovered", "debug", "deltad.registry", "deltad/core/registry.py", 2),
    Emit("workspace_discovered", "info", "deltad.registry", "deltad/core/registry.py", 3),
    Emit("workspace_problem", "warning", "deltad.service", "deltad/core/decide.py", 4),
    Emit("workspace_problem", "warning", "deltad.registry", "deltad/core/registry.py", 5),
]


def test_rows_are_regenerated_from_the_code_and_keep_their_meanings() -> None:
    meanings = {"resume_exited": "A resume ended | with its code.", "gone_event": "old"}
    rows = logcatalog.entries(EMITS, meanings)
    assert rows == [
        Entry(
            "resume_exited",
            ("info",),
            ("deltad.resumer",),
            ("deltad/core/resumer.py",),
            "A resume ended | with its code.",
        ),
        Entry(
            "workspace_discovered",
            ("debug", "info"),
            ("deltad.registry",),
            ("deltad/core/registry.py",),
            TO_WRITE,
        ),
        Entry(
            "workspace_problem",
            ("warning",),
            ("deltad.registry", "deltad.service"),
            ("deltad/core/decide.py", "deltad/core/registry.py"),
            TO_WRITE,
        ),
    ]
    page = logcatalog.render(rows)
    assert "| `resume_exited` | info | deltad.resumer | deltad/core/resumer.py |" in page
    assert "deltad/core/decide.py<br>deltad/core/registry.py" in page
    assert logcatalog.read_page(page) == {
        "resume_exited": "A resume ended | with its code.",
        "workspace_discovered": TO_WRITE,
        "workspace_problem": TO_WRITE,
    }
    assert logcatalog.render(logcatalog.entries(EMITS, logcatalog.read_page(page))) == page


def test_a_row_that_cannot_be_read_is_an_error() -> None:
    with pytest.raises(CatalogError, match=r"log-events\.md:2: a row of 3 cells"):
        logcatalog.read_page("| event |\n| `x` | info | what |\n")


def test_drift_names_what_differs_and_the_command_that_fixes_it() -> None:
    page = {"resume_exited": "A resume ended.", "workspace_problem": TO_WRITE, "old_one": "x"}
    found = logcatalog.drift(EMITS, page)
    assert (found.missing, found.gone, found.unwritten) == (
        ["workspace_discovered"],
        ["old_one"],
        ["workspace_problem"],
    )
    said = found.explain()
    assert "not in docs/log-events.md: workspace_discovered" in said
    assert "emitted nowhere: old_one" in said
    assert "without a meaning: workspace_problem" in said
    assert "`python -m deltad.logcatalog`" in said
    assert not logcatalog.drift(EMITS[:1], {"resume_exited": "A resume ended."})
