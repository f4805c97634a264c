"""Config problems as one line each: the full key path, a did-you-mean for a misspelt key at
any depth, and why a directory could not be made or written (tests/e2e/test_config_errors.py
runs the real `deltad check` and `deltad serve` over a table of bad configs)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from deltad import validation
from deltad.core.config import ConfigError, DaemonConfig, load_config


def _errors(tmp_path: Path, **settings: Any) -> list[str]:
    cfg = tmp_path / "deltad.yaml"
    cfg.write_text(yaml.safe_dump({"roots": [str(tmp_path)], **settings}))
    with pytest.raises(ConfigError) as e:
        load_config(cfg)
    return [p.removeprefix(f"{cfg}: ") for p in e.value.problems]


@pytest.mark.parametrize(
    ("settings", "line"),
    [
        ({"max_paralel_resumes": 1}, "max_paralel_resumes: unknown key; did you mean "),
        ({"roots": [{"path": "/x", "pollng": True}]}, "roots.0.pollng: unknown key; did you "),
        ({"http": {"lisen": "127.0.0.1:1"}}, "http.lisen: unknown key; did you mean 'listen'?"),
        (
            {"notify": {"webhooks": [{"url": "http://127.0.0.1:9/", "evnts": []}]}},
            "notify.webhooks.0.evnts: unknown key; did you mean 'events'?",
        ),
        ({"ha": {"leese": "/l"}}, "ha.leese: unknown key"),  # and `lease` is missing
        ({"zzz": 1}, "zzz: unknown key"),  # nothing close: no guess
        ({"ha": {}}, "ha.lease: required"),
        ({"executor": "nope"}, "executor: unknown executor 'nope'"),  # a whole-model check
        (
            {"follow_up": {"remind_after": 5}},
            "follow_up.remind_after: unknown key; did you mean 'remind_after_seconds'?",
        ),
        ({"follow_up": {"sla_seconds": 0}}, "follow_up.sla_seconds: Input should be greater"),
        ({"follow_up": {"escalate_to": ["ops"]}}, "follow_up: escalate_to needs escalate_after"),
    ],
)
def test_each_problem_names_its_full_key(
    tmp_path: Path, settings: dict[str, Any], line: str
) -> None:
    problems = _errors(tmp_path, **settings)
    assert any(p.startswith(line) for p in problems), problems
    assert all("\n" not in p and "(top level)" not in p for p in problems)


def test_a_guess_is_made_only_where_the_key_was_written(tmp_path: Path) -> None:
    # `polling` is a root's key: misspelt at the top level it is no guess for a root's
    [line] = _errors(tmp_path, pollng=True)
    assert line == "pollng: unknown key"


@pytest.mark.parametrize(
    ("path", "keys"),
    [
        ((), {"roots", "executor", "http", "ha"}),
        (("roots", 0), {"path", "polling", "backend"}),
        (("http",), {"listen", "tls_cert"}),
        (("notify", "webhooks", 3, "signing"), {"secret_file", "secret_env"}),
        (("executors", "slurm"), set()),  # a free-form map: the registry's model knows
        (("nope",), set()),
    ],
)
def test_the_keys_allowed_at_a_path(path: tuple[Any, ...], keys: set[str]) -> None:
    found = set(validation.keys_at(DaemonConfig, path))
    assert keys <= found and (found or not keys)


def test_a_key_that_is_not_printable_stays_one_line() -> None:
    with pytest.raises(ValidationError) as e:
        DaemonConfig.model_validate({"bad\nkey": 1})
    [line] = validation.problems(e.value, DaemonConfig)
    assert line == "bad\\nkey: unknown key"


def test_a_directory_that_exists_or_can_be_made_is_fine(tmp_path: Path) -> None:
    assert validation.dir_problem(tmp_path) is None
    assert validation.dir_problem(tmp_path / "a" / "b") is None


def test_a_file_in_the_way_is_named(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    assert validation.dir_problem(tmp_path / "f") == f"{tmp_path / 'f'} is not a directory"
    assert validation.dir_problem(tmp_path / "f" / "x") == (
        f"{tmp_path / 'f'} is not a directory (on the way to {tmp_path / 'f' / 'x'})"
    )


def test_a_directory_this_process_may_not_write_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.access

    def access(path: Any, mode: int, **kw: Any) -> bool:  # root may write anywhere: as if not
        return False if Path(path) == tmp_path else real(path, mode, **kw)

    monkeypatch.setattr(os, "access", access)
    uid = os.geteuid()
    assert validation.dir_problem(tmp_path) == f"{tmp_path} cannot be written by uid {uid}"
    assert validation.dir_problem(tmp_path / "new") == (
        f"{tmp_path / 'new'} cannot be made ({tmp_path} cannot be written) by uid {uid}"
    )
