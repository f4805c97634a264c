"""The documentation is a contract: every shell block of README.md and docs/*.md runs as written
(tests/docrun.py: one bash session per page, a real `deltad`, the fake model on 127.0.0.1,
private /tmp, /srv and network) or says why it cannot (`<!-- not run: REASON -->`).

One page: `pytest tests/e2e/test_docs_contract.py -k quickstart` (or, outside pytest,
`python -m tests.docrun docs/quickstart.md`). The convention is in docs/writing-docs.md.

The runner is tested here too, on pages made for it: a test that cannot fail is a defect.
"""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

from tests import docblocks
from tests.docrun import run_page
from tests.users import need_root

REPO = Path(__file__).resolve().parents[2]
PAGES = docblocks.pages(REPO)

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(autouse=True)
def _root() -> None:
    need_root()  # namespaces of its own, a daemon that runs its inbox as another user


@pytest.mark.parametrize("page", PAGES, ids=[docblocks.page_id(REPO, p) for p in PAGES])
def test_page_runs_as_written(page: Path) -> None:
    outcome = run_page(REPO, page)
    print(outcome.summary())
    if outcome.failure is not None:
        pytest.fail(outcome.failure, pytrace=False)
    if not outcome.ran:
        pytest.skip(f"{outcome.page}: no block runs here ({len(outcome.not_run)} not run)")


# -- the runner, on pages made for it ---------------------------------------------------------


def _page(tmp_path: Path, text: str) -> tuple[Path, Path]:
    repo = tmp_path / "repo"
    (repo / "docs").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    page = repo / "docs" / "page.md"
    page.write_text(textwrap.dedent(text))
    return repo, page


def _failure(tmp_path: Path, text: str) -> str:
    repo, page = _page(tmp_path, text)
    outcome = run_page(repo, page)
    assert outcome.failure is not None, outcome.summary()
    return outcome.failure


SERVER = """\
    # A page

    <!-- run: background; ready: http://127.0.0.1:8470/ -->
    ```sh
    mkdir -p /srv/site && echo hello > /srv/site/index.html
    python3 -m http.server 8470 --bind 127.0.0.1 --directory /srv/site
    ```

    ```sh
    PAGE=index.html
    ```
    """


def test_blocks_share_a_session_and_a_server_runs_beside_them(tmp_path: Path) -> None:
    repo, page = _page(
        tmp_path,
        SERVER
        + """
    ```console
    $ curl -s http://127.0.0.1:8470/$PAGE
    hello
    $ ls /tmp
    ```
    """,
    )
    outcome = run_page(repo, page)
    assert outcome.failure is None, outcome.failure
    assert len(outcome.ran) == 3


def test_an_http_error_fails_the_block_at_its_line(tmp_path: Path) -> None:
    failure = _failure(
        tmp_path,
        SERVER
        + """
    ```sh
    echo about to ask
    curl -s http://127.0.0.1:8470/missing.html   # 200, says the page
    echo never
    ```
    """,
    )
    assert failure.startswith("docs/page.md:13: ```sh block")
    assert "docs/page.md:15: `curl -s http://127.0.0.1:8470/missing.html" in failure
    assert "exited 22" in failure and "4xx/5xx" in failure
    assert "about to ask" in failure and "never" not in failure.split("its output")[1]


def test_a_transcript_that_prints_otherwise_fails_with_a_diff(tmp_path: Path) -> None:
    failure = _failure(
        tmp_path,
        """\
        ```console
        $ printf 'run 20261121_080129_f97880 paused\\nHello Ada!\\n'
        run 20990101_000000_abcdef paused
        Hello Bob!
        ```
        """,
    )
    assert "docs/page.md:2: `$ printf" in failure
    assert "-Hello Bob!" in failure and "+Hello Ada!" in failure
    assert " run <RUN-ID> paused" in failure  # run ids are normalised: the same line


def test_a_failing_command_in_a_transcript_needs_its_status_read(tmp_path: Path) -> None:
    ok_repo, ok_page = _page(
        tmp_path,
        """\
        ```sh
        $ false
        $ echo $?
        1
        ```
        """,
    )
    assert run_page(ok_repo, ok_page).failure is None
    failure = _failure(
        tmp_path / "2",
        """\
        ```sh
        $ false
        $ echo next
        ```
        """,
    )
    assert "docs/page.md:2: `$ false` exited 1" in failure


def test_an_unset_placeholder_fails_and_later_blocks_are_counted(tmp_path: Path) -> None:
    failure = _failure(
        tmp_path,
        """\
        ```bash
        curl -s "http://127.0.0.1:8470/v1/requests/$REQUEST_ID"
        ```

        ```sh
        true
        ```
        """,
    )
    assert "REQUEST_ID: unbound variable" in failure
    assert "1 later block(s) of the page not run" in failure


def test_exit_status_and_interrupt_marks(tmp_path: Path) -> None:
    repo, page = _page(
        tmp_path,
        """\
        <!-- run: exit: 3 -->
        ```sh
        exit 3
        ```

        <!-- run: interrupt -->
        ```sh
        while :; do echo tick; sleep 0.1; done
        ```

        <!-- not run: shows what a reader on another machine types -->
        ```sh
        ssh elsewhere
        ```
        """,
    )
    outcome = run_page(repo, page)
    assert outcome.failure is None, outcome.failure
    assert [b.line for b in outcome.ran] == [2, 7]
    assert [why for _, why in outcome.not_run] == ["shows what a reader on another machine types"]


def test_a_stream_that_ignores_the_interrupt_is_killed(tmp_path: Path) -> None:
    """^C ignored (a trap, or a pipeline in a group of its own): killed after its grace, so a
    page never hangs on it nor leaves it writing behind."""
    repo, page = _page(
        tmp_path,
        """\
        <!-- run: interrupt -->
        ```sh
        trap '' INT; echo started; exec sleep 86401
        ```
        """,
    )
    outcome = run_page(repo, page)
    assert outcome.failure is None, outcome.failure
    assert [b.line for b in outcome.ran] == [2]
    assert not subprocess.run(["pgrep", "-f", "sleep 86401"], capture_output=True).stdout


def test_a_block_that_overruns_is_named(tmp_path: Path) -> None:
    failure = _failure(
        tmp_path,
        """\
        <!-- run: timeout: 1 -->
        ```sh
        echo waiting; read -r _ < <(tail -f /dev/null)
        ```
        """,
    )
    assert failure.startswith("docs/page.md:2: ```sh block")
    assert "did not finish within 1 s" in failure and "waiting" in failure
