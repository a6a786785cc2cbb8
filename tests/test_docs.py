"""The documentation: the site builds with warnings as errors, its reference covers the code, the
places log messages point at exist, and every example in it runs.

Every fenced block of ``docs/`` and of the README is one of:

* ``python``: run in a fresh copy of the getting-started project (``docs/examples/proj.py``), then
  the app's configuration is checked as the scheduler would (settings, backend, jobs). A block
  that shows another library's configuration, for comparison, starts with ``# before: <library>``
  and is not run;
* ``sh``: each command is run (``celery -A proj ...`` against a RabbitMQ vhost of its own,
  ``python3 -m pytest ...`` collected, ``promtool`` run on the repository's rules) or, for the
  commands that set up a machine or run for minutes (``pip install``, the demo, the benchmarks,
  the RabbitMQ scripts), checked against what they accept: the extras, the options and
  sub-commands their ``--help`` lists;
* ``yaml``: parsed, and the container commands it names are run as ``sh`` ones;
* ``text``: output, logs and layouts, not examples;
* a MyST directive: ``literalinclude`` of a file under ``docs/examples/``, which a test here runs.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import tomllib
import yaml

import anarchon_celery
from anarchon_celery import docs
from anarchon_celery.cli import anarchon
from anarchon_celery.jobs import JOB_KEYS, REFUSED_KEYS
from anarchon_celery.settings import DEFAULTS

from .support import broker_control
from .support.django_beat import make_database
from .support.processes import wait_for_line

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
EXAMPLES = DOCS / "examples"
PAGES = sorted(DOCS.rglob("*.md"))
SOURCES = [*PAGES, ROOT / "README.md"]
#: The arguments of the documented build (contributing.md), but for the output folder.
BUILD = ["-W", "--keep-going", "-b", "html", "docs"]

pytestmark = pytest.mark.xdist_group("docs")


def run(
    command: list[str],
    *,
    cwd: Path = ROOT,
    env: dict[str, str] | None = None,
    timeout: float = 120,
    stdin: str | None = None,
) -> Any:
    """``command``'s completed process, its output as text."""
    return subprocess.run(
        command, cwd=cwd, env=env, input=stdin, capture_output=True, text=True, timeout=timeout, check=False
    )


# -- the blocks of the pages ----------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    source: Path
    line: int
    language: str
    text: str
    argument: str = ""

    def __str__(self) -> str:
        return f"{self.source.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown page, with their language (a MyST directive's is ``{name}``)."""
    found = []
    lines = path.read_text().splitlines()
    index = 0
    while index < len(lines):
        opening = re.match(r"^(`{3,}|:{3,})(\S*)\s*(.*)$", lines[index])
        if opening is None:
            index += 1
            continue
        fence, language, argument = opening.groups()
        start = index
        index += 1
        body = []
        while index < len(lines) and not lines[index].startswith(fence):
            body.append(lines[index])
            index += 1
        found.append(Block(path, start + 1, language, "\n".join(body) + "\n", argument))
        index += 1
    return found


ALL_BLOCKS = [block for source in SOURCES for block in blocks(source)]
LANGUAGES = {"python", "sh", "yaml", "text", "{literalinclude}", "{eval-rst}", "{toctree}"}


def of(language: str) -> list[Block]:
    return [block for block in ALL_BLOCKS if block.language == language]


def test_every_block_is_of_a_kind_the_suite_runs_or_knows_is_not_an_example() -> None:
    unknown = [
        f"{block} ({block.language or 'no language'})" for block in ALL_BLOCKS if block.language not in LANGUAGES
    ]
    assert not unknown, f"blocks the suite does not know how to run: {unknown}"
    assert len(of("python")) >= 10 and len(of("sh")) >= 8


# -- the site -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built as contributing.md says, warnings as errors."""
    out = tmp_path_factory.mktemp("site")
    done = run([sys.executable, "-m", "sphinx", *BUILD, str(out), "-q", "-d", str(out / ".doctrees")], timeout=300)
    assert done.returncode == 0, f"the documentation does not build:\n{done.stdout}\n{done.stderr}"
    assert not done.stderr.strip(), done.stderr
    return out


class _Ids(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.ids.update(value for name, value in attrs if name == "id" and value)


def ids_of(page: Path) -> set[str]:
    parser = _Ids()
    parser.feed(page.read_text())
    return parser.ids


def test_the_site_has_a_page_for_every_source(site: Path) -> None:
    for page in PAGES:
        if page.parent == EXAMPLES:
            continue
        built = site / page.relative_to(DOCS).with_suffix(".html")
        assert built.exists(), f"{page} was not built"


def test_every_place_a_message_points_at_exists_in_the_site(site: Path) -> None:
    refs = docs.all_refs()
    assert len(refs) >= 10
    for ref in refs:
        page = site / f"{ref.page}.html"
        assert page.exists(), f"{ref}: no page {ref.page}"
        assert ref.anchor in ids_of(page), f"{ref}: no anchor #{ref.anchor} on {ref.page}.html"
        assert str(ref) == f"docs/{ref.page}.md#{ref.anchor}" and (DOCS / f"{ref.page}.md").exists()


def test_no_message_points_at_the_readme() -> None:
    """Log messages and errors name a page and an anchor of the documentation (anarchon_celery.docs),
    never a README heading, which moves at any edit."""
    offenders = []
    for path in (ROOT / "anarchon_celery").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and "README" in node.value:
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not offenders


def test_messages_use_the_places_of_the_documentation() -> None:
    """Each place is used by some message (a place nobody points at is a stale entry)."""
    package = "\n".join(path.read_text() for path in (ROOT / "anarchon_celery").rglob("*.py") if path.name != "docs.py")
    names = [name for name, value in vars(docs).items() if isinstance(value, docs.DocRef)]
    unused = [name for name in names if f"docs.{name}" not in package]
    assert not unused


# -- the reference against the code ---------------------------------------------------------------


def headings(page: str) -> list[str]:
    return re.findall(r"^## `([\w-]+)`", (DOCS / page).read_text(), re.M)


def test_every_setting_is_in_the_reference_with_its_default(site: Path) -> None:
    text = (DOCS / "reference/settings.md").read_text()
    assert sorted(headings("reference/settings.md")) == sorted(DEFAULTS)
    sections = re.split(r"^## ", text, flags=re.M)
    for name, default in DEFAULTS.items():
        section = next(part for part in sections if part.startswith(f"`{name}`"))
        stated = re.search(r"^Default: (.*)$", section, re.M)
        assert stated, f"{name}: no default stated"
        if default is None:
            assert stated.group(1).startswith("none"), name
        else:
            assert stated.group(1).startswith(f"`{default}`"), f"{name}: the reference says {stated.group(1)}"
    ids = ids_of(site / "reference/settings.html")
    assert all(name.replace("_", "-") in ids for name in DEFAULTS)


def test_every_job_key_and_every_refused_key_is_in_the_reference() -> None:
    documented = set(headings("reference/job-keys.md"))
    decorator = {
        name
        for name, parameter in inspect.signature(anarchon_celery.cron).parameters.items()
        if parameter.kind is not inspect.Parameter.VAR_KEYWORD and name != "spec"
    }
    assert documented == set(JOB_KEYS) | decorator
    refused = (DOCS / "reference/job-keys.md").read_text().split("(refused-keys)=", 1)[1]
    for key in REFUSED_KEYS:
        assert f"`{key}`" in refused, key


def test_every_command_and_option_is_in_the_reference(site: Path) -> None:
    text = (site / "reference/commands.html").read_text()
    ids = ids_of(site / "reference/commands.html")
    assert anarchon.commands
    for name, command in anarchon.commands.items():  # type: ignore[attr-defined]
        assert any(identifier.endswith(f"anarchon-{name}") for identifier in ids), f"no section for {name}"
        for parameter in command.params:
            for option in parameter.opts:
                if option.startswith("-"):
                    assert option in text, f"{name} {option}"


def test_the_python_api_is_in_the_reference(site: Path) -> None:
    ids = ids_of(site / "reference/api.html")
    missing = [
        name
        for name in anarchon_celery.__all__
        if f"anarchon_celery.{name}" not in ids and f"anarchon_celery.backends.base.{name}" not in ids
    ]
    assert not missing


# -- python blocks --------------------------------------------------------------------------------


PYTHON = [block for block in of("python") if not block.text.startswith("# before:")]


@pytest.mark.parametrize("block", PYTHON, ids=str)
def test_python_blocks_run(block: Block) -> None:
    """In a process of its own: Celery registers a project's tasks for every app of a process."""
    if block.source.name == "README.md":
        assert block.text == (EXAMPLES / "proj.py").read_text(), "the README's project is docs/examples/proj.py"
    done = run([sys.executable, "-m", "tests.support.doc_blocks", str(block)], stdin=block.text)
    assert done.returncode == 0, f"{block}:\n{done.stdout}\n{done.stderr}"
    assert done.stdout.strip().endswith("configuration checked"), done.stdout


def test_blocks_of_other_libraries_say_which() -> None:
    shown = [block for block in of("python") if block.text.startswith("# before:")]
    for block in shown:
        library = block.text.splitlines()[0].removeprefix("# before:").strip()
        assert library in {"celery beat", "celery-redbeat", "django-celery-beat"}, f"{block}: {library}"


def test_included_files_are_examples_run_here() -> None:
    assert of("{literalinclude}")
    for block in of("{literalinclude}"):
        path = (block.source.parent / block.argument).resolve()
        assert path.parent == EXAMPLES, f"{block}: include a file of docs/examples"
        assert path.name in RUN_EXAMPLES, f"{block}: {path.name} is not run by the suite"


# -- shell commands -------------------------------------------------------------------------------


def commands(text: str) -> list[list[str]]:
    """The commands of a shell block: one per line, split at ``&&`` and ``;``, comments dropped."""
    found = []
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        command: list[str] = []
        for word in words:
            if word in ("&&", ";"):
                found.append(command)
                command = []
            elif word.endswith(";"):
                found.append([*command, word[:-1]])
                command = []
            else:
                command.append(word)
        if command:
            found.append(command)
    return [command for command in found if command]


def documented_commands() -> list[tuple[str, list[str]]]:
    """Every command of the shell and YAML blocks, once each, sorted: they run in this order, in one
    vhost (the ``docs`` group runs on one worker), so that ``anarchon add JOB`` comes before the
    ``edit`` and ``remove`` of that job."""
    seen: dict[str, tuple[str, list[str]]] = {}
    for block in of("sh"):
        for command in commands(block.text):
            seen.setdefault(shlex.join(command), (str(block), command))
    for block in of("yaml"):
        for document in yaml.safe_load_all(block.text):
            for container in _containers(document):
                command = container["command"]
                seen.setdefault(shlex.join(command), (str(block), command))
    return sorted(seen.values(), key=lambda pair: shlex.join(pair[1]))


def _containers(document: Any) -> Iterator[dict[str, Any]]:
    if isinstance(document, dict):
        if "command" in document and "image" in document:
            yield document
        for value in document.values():
            yield from _containers(value)
    elif isinstance(document, list):
        for value in document:
            yield from _containers(value)


SHELL = documented_commands()
CELERY = [(where, command) for where, command in SHELL if command[0] == "celery"]
OTHER = [(where, command) for where, command in SHELL if command[0] != "celery"]


def test_yaml_blocks_parse() -> None:
    for block in of("yaml"):
        assert list(yaml.safe_load_all(block.text)), str(block)


@pytest.fixture(scope="module")
def vhost() -> Iterator[str]:
    """A RabbitMQ vhost of its own for the documented project: its queues go with it."""
    broker_control.need_rabbitmqctl()
    name = f"anarchon-docs-{uuid.uuid4().hex[:8]}"
    assert broker_control.rabbitmqctl("add_vhost", name)
    try:
        assert broker_control.rabbitmqctl("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
        yield broker_control.url_with(vhost=name)
    finally:
        broker_control.rabbitmqctl("delete_vhost", name)


def _environment(vhost: str) -> dict[str, str]:
    # Celery reads CELERY_BROKER_URL before the broker the app names (celery.app.utils.Settings.broker_url).
    return dict(os.environ, CELERY_BROKER_URL=vhost, PYTHONPATH=str(ROOT))


#: What shows that a long-running command started, by sub-command.
_STARTED = {"beat": "anarchon jobs ->", "worker": "[queues]"}


@pytest.mark.broker
@pytest.mark.processes
@pytest.mark.parametrize("where,command", CELERY, ids=[shlex.join(command) for _, command in CELERY])
def test_celery_commands_run(where: str, command: list[str], vhost: str, tmp_path: Path) -> None:
    assert command[1] == "-A" and (EXAMPLES / f"{command[2]}.py").exists(), f"{where}: -A names a docs/examples project"
    env = dict(_environment(vhost), PROJ_DB=str(tmp_path / "anarchon.db"))  # proj_sqlite's store
    long_running = next((word for word in command[3:] if word in _STARTED), None)
    if "import-django-celery-beat" in command:  # from a django-celery-beat database, made in its directory
        pytest.importorskip("django_celery_beat", reason="needs django-celery-beat (the test extra)")
        make_database(tmp_path, {"ENGINE": "django.db.backends.sqlite3", "NAME": str(tmp_path / "db.sqlite3")})
        env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{EXAMPLES}"
        done = run(command, cwd=tmp_path, env=env)
        assert done.returncode == 0, f"{where}: {shlex.join(command)}\n{done.stdout}\n{done.stderr}"
        return
    if long_running is None or "anarchon" in command:
        done = run(command, cwd=EXAMPLES, env=env)
        assert done.returncode == 0, f"{where}: {shlex.join(command)}\n{done.stdout}\n{done.stderr}"
        return
    log = tmp_path / "out.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(command, cwd=EXAMPLES, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for_line(log, _STARTED[long_running], proc, timeout=60)
        if long_running == "beat" or "-B" in command:
            _wait_for_instance(vhost, proc, log)  # a scheduler runs (under a worker too: -B)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(3)  # it keeps running
        assert proc.poll() is None, f"{where}: {shlex.join(command)} stopped:\n{log.read_text()}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    output = log.read_text()
    assert code == 0, f"{where}: exit status {code}\n{output}"
    assert not re.search(r"ERROR|CRITICAL|Traceback", output), output


def _wait_for_instance(vhost: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> None:
    """Until the project's scheduler is connected: each instance binds a queue of its own to the
    deployment's exchange of instances, which is there while one is (the vhost is the test's)."""
    name = vhost.rsplit("/", 1)[1]
    deadline = time.monotonic() + timeout
    while True:
        listed = broker_control.run_rabbitmqctl("-q", "list_exchanges", "-p", name, "name").stdout
        if "proj.cron.anarchon.instances" in listed.split():
            return
        assert proc.poll() is None, f"exited with {proc.returncode}:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"no scheduler instance connected in {timeout} s:\n{log.read_text()}"
        time.sleep(0.5)


@pytest.mark.parametrize("where,command", OTHER, ids=[shlex.join(command) for _, command in OTHER])
def test_other_commands_are_what_the_repository_accepts(where: str, command: list[str]) -> None:
    while "=" in command[0] and not command[0].startswith("-"):  # VAR=value before the command
        name = command[0].split("=", 1)[0]
        assert name in {"ANARCHON_TEST_RABBITMQ"}, f"{where}: {name}"
        command = command[1:]
    if command[:3] == ["python3", "-m", "pip"]:
        _check_pip(where, command[3:])
    elif command[:3] == ["python3", "-m", "pytest"]:
        done = run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", *command[3:]], timeout=300)
        # 5: none collected, as when -k names a backend yet to be added (extending.md)
        assert done.returncode in (0, 5), f"{where}: {shlex.join(command)}\n{done.stdout}\n{done.stderr}"
    elif command[:3] == ["python3", "-m", "tox"]:
        assert command[3] == "-e"
        environments = re.findall(r"^\[testenv:([\w-]+)\]", (ROOT / "tox.ini").read_text(), re.M)
        assert set(command[4].split(",")) <= set(environments), f"{where}: {command[4]}"
    elif command[:3] == ["python3", "-m", "sphinx"]:
        assert command[3:-1] == BUILD, f"{where}: the suite builds the site with {BUILD}"
    elif command[0] == "python3" and command[1].endswith(".py"):
        _check_against_help(where, [sys.executable, command[1]], command[2:])
    elif command[0].startswith("scripts/"):
        _check_against_help(where, [str(ROOT / command[0])], command[1:])
    elif command[0] == "promtool":  # Prometheus' (the CI installs it): run on the repository's rules
        if shutil.which("promtool") is None and not os.environ.get("CI"):
            pytest.skip("no promtool here (apt-get install prometheus)")
        done = run(command)
        assert done.returncode == 0, f"{where}: {shlex.join(command)}\n{done.stdout}\n{done.stderr}"
    else:
        pytest.fail(f"{where}: the suite does not know how to run {shlex.join(command)}")


def _check_pip(where: str, arguments: list[str]) -> None:
    assert arguments[0] == "install", where
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    targets = [word for word in arguments[1:] if not word.startswith("-")]
    assert targets, where
    for target in targets:
        match = re.fullmatch(r"\.(?:\[([\w,]+)\])?", target)
        assert match, f"{where}: install {target!r}: the repository installs from ."
        wanted = set(match.group(1).split(",")) if match.group(1) else set()
        assert wanted <= extras, f"{where}: no extra {wanted - extras}"


def _check_against_help(where: str, program: list[str], arguments: list[str]) -> None:
    """Each option of the command is one the program's --help lists, and its sub-command one of its choices."""
    done = run([*program, "--help"], timeout=60)
    assert done.returncode == 0, f"{where}: {done.stderr}"
    for word in arguments:
        if word.startswith("--"):
            assert re.search(rf"(?<![\w-]){re.escape(word.split('=')[0])}(?![\w-])", done.stdout), f"{where}: {word}"
    choices = re.search(r"\{([\w,-]+)\}", done.stdout)
    if choices and arguments:
        assert arguments[0] in choices.group(1).split(","), f"{where}: {arguments[0]} is not one of {choices.group(1)}"


# -- the example files ----------------------------------------------------------------------------

#: The files under docs/examples and how the suite runs each.
RUN_EXAMPLES = {
    "proj.py": "imported by every python block, and run by the celery commands",
    "proj_postgres.py": "run by `celery -A proj_postgres anarchon schema`",
    "proj_sqlite.py": "run by `celery -A proj_sqlite anarchon backfill ...`",
    "inspect_runs.py": "test_inspect_runs",
}


def test_every_example_file_is_run() -> None:
    assert {path.name for path in EXAMPLES.glob("*.py")} == set(RUN_EXAMPLES)
    assert any(command[2] == "proj_postgres" for _, command in CELERY)
    assert any(command[2] == "proj_sqlite" for _, command in CELERY)
    assert any(command[2] == "proj" for _, command in CELERY)


@pytest.mark.broker
def test_inspect_runs(vhost: str) -> None:
    done = run([sys.executable, "inspect_runs.py"], cwd=EXAMPLES, env=_environment(vhost))
    assert done.returncode == 0, done.stderr
    last = done.stdout.strip().splitlines()[-1].split()
    assert len(last) == 3 and last[1] == last[2]  # the latest run, and the run sent now: its run id is its task id
