"""The facts the core decides from are frozen values in a module the shell imports, never the
reverse (deltad/core/facts.py): `decide` imports nothing of the code that looks at the disk
(`reconcile`), runs the loop (`service`, `lifecycle`) or acts (`resumer`, `tenancy`, the
stores), and the modules it does import touch no file, process or socket."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

import deltad
from deltad.core import decide, facts
from deltad.core.facts import Action, State, Verdict

SRC = Path(deltad.__file__).parent

# What the rules may read: the facts, the resume keys, the follow-up rule, the pacing, and the
# on-disk contract's types and pure judges (`protocol`). The configuration's type only, for
# `Rules.of` (under TYPE_CHECKING: nothing of config.py runs for `decide`).
PURE = {"deltad.core.facts", "deltad.core.backoff", "deltad.core.followplan", "deltad.pacing"}
TYPES_ONLY = {"deltad.core.config"}
# Modules that do I/O or keep the process's state: none may be imported by the pure ones.
OS = {"os", "io", "subprocess", "socket", "select", "fcntl", "pwd", "grp", "signal", "threading"}
OS |= {"shutil", "tempfile", "structlog", "time"}


def imports(path: Path) -> tuple[set[str], set[str]]:
    """The modules `path` imports at run time, and those it imports for types only."""
    tree = ast.parse(path.read_text(), str(path))
    typing_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only |= {id(n) for b in node.body for n in ast.walk(b)}
    run, types = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = {node.module}
        elif isinstance(node, ast.Import):
            names = {a.name for a in node.names}
        else:
            continue
        (types if id(node) in typing_only else run).update(names)
    return run, types


def module_path(name: str) -> Path:
    rel = Path(*name.split("."))
    candidate = SRC.parent / rel.with_suffix(".py")
    return candidate if candidate.exists() else SRC.parent / rel / "__init__.py"


def test_decide_imports_only_facts_and_pure_rules() -> None:
    run, types = imports(module_path("deltad.core.decide"))
    ours = {m for m in run if m.startswith("deltad.")}
    shell = {m for m in ours if m not in PURE and not m.startswith("deltad.protocol")}
    assert shell == set(), f"decide imports the shell: {sorted(shell)}"
    assert {m for m in types if m.startswith("deltad.")} <= TYPES_ONLY
    assert "deltad.core.reconcile" not in run | types


@pytest.mark.parametrize("name", sorted(PURE | {"deltad.core.decide"}))
def test_what_decide_reads_touches_no_file_process_or_socket(name: str) -> None:
    run, _ = imports(module_path(name))
    touches = {m for m in run if m.split(".")[0] in OS}
    assert touches == set(), f"{name} imports {sorted(touches)}"
    core = {m for m in run if m.startswith("deltad.core.")}
    assert core <= PURE, f"{name} imports {sorted(core - PURE)}"


def test_the_shell_imports_the_facts_it_makes() -> None:
    run, _ = imports(module_path("deltad.core.reconcile"))
    assert "deltad.core.facts" in run


def test_the_check_sees_an_import_of_the_shell(tmp_path: Path) -> None:
    """The check above can fail: an import of reconcile, at run time or for types, is seen."""
    mod = tmp_path / "m.py"
    mod.write_text(
        "from typing import TYPE_CHECKING\nimport os\nfrom deltad.core.reconcile import State\n"
        "if TYPE_CHECKING:\n    from deltad.core.service import Service\n"
    )
    run, types = imports(mod)
    assert {"os", "deltad.core.reconcile"} <= run and types == {"deltad.core.service"}


def test_a_verdict_is_made_once_with_its_final_values() -> None:
    v = Verdict(Action.NONE, State.WAITING, "r1", request_id="q1")
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.wake_at = 1.0  # type: ignore[misc]
    later = dataclasses.replace(v, wake_at=1.0)
    assert (v.wake_at, later.wake_at, later.request_id) == (None, 1.0, "q1")


def test_every_fact_is_frozen() -> None:
    kinds = [getattr(facts, n) for n in dir(facts) if dataclasses.is_dataclass(getattr(facts, n))]
    assert {k.__name__ for k in kinds} >= {"Verdict", "Exited", "Owner", "Facts", "Done"}
    assert all(k.__dataclass_params__.frozen for k in kinds)  # type: ignore[attr-defined]
    assert decide.Facts is facts.Facts and decide.Exited is facts.Exited


def test_a_verdict_copied_with_changes_is_the_one_replace_makes_and_stays_frozen() -> None:
    """`reconcile._with` copies a Verdict without its constructor (a look makes two): what
    it makes must be what `dataclasses.replace` makes, and a wrong name must still fail."""
    from deltad.core.reconcile import _with

    v = Verdict(Action.NONE, State.WAITING, "r", wake_at=3.0, problem="p")
    changes = {"wake_at": None, "channel": "slack", "request_id": "q"}
    copied, replaced = _with(v, **changes), dataclasses.replace(v, **changes)  # type: ignore[arg-type]
    assert copied == replaced and repr(copied) == repr(replaced) and hash(copied) == hash(replaced)
    assert type(copied) is Verdict and v.wake_at == 3.0  # the original is untouched
    with pytest.raises(dataclasses.FrozenInstanceError):
        copied.run_id = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        _with(v, no_such_field=1)
    assert {f.name for f in dataclasses.fields(Verdict)} == set(vars(copied))
