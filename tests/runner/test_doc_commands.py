"""The commands the README and docs/ tell users to type are ones the runner and tox take: every
``python -m nanopatch ...`` line in their shell examples parses as the runner parses it (no
script is run, nothing trains), names a script that exists (``train.py`` is the reader's own,
as the README says), and every ``tox -e ENV`` names an env of tox.ini. The options table of
docs/runner.md lists every option."""

from __future__ import annotations

import configparser
import re
import shlex
from pathlib import Path

import pytest

from nanopatch.engine import config
from nanopatch.runner import cli

from conftest import REPO_ROOT

README = REPO_ROOT / "README.md"
PAGES = [README, *sorted((REPO_ROOT / "docs").glob("*.md"))]

#: the script the README's commands stand for: the reader's own
PLACEHOLDER = "train.py"


def code_lines(page: Path) -> list[tuple[int, str]]:
    """Lines of the page's fenced code blocks, a line continued with ``\\`` joined to the next,
    a leading ``$`` prompt dropped."""
    found, fence, pending = [], None, None
    for number, line in enumerate(page.read_text().splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            fence = None if fence else stripped
            continue
        if not fence:
            continue
        if pending is not None:
            line = pending[1] + " " + stripped
            number = pending[0]
            pending = None
        if line.rstrip().endswith("\\"):
            pending = (number, line.rstrip()[:-1])
            continue
        found.append((number, re.sub(r"^\s*\$\s+", "", line)))
    return found


def runner_commands(page: Path) -> list[tuple[int, list[str]]]:
    """The argument lists of the page's ``python -m nanopatch`` commands (after ``-m
    nanopatch``), inside ``$(...)`` too; a synopsis line (``[options]``, ``[N]``) is not one."""
    commands = []
    for number, line in code_lines(page):
        for text in re.findall(r"\$\((python -m nanopatch[^)]*)\)", line) or [line]:
            try:
                words = shlex.split(text, comments=True)
            except ValueError:
                continue
            while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):  # VAR=value before the command
                words = words[1:]
            if words[:3] != ["python", "-m", "nanopatch"] or any(w.startswith("[") for w in words):
                continue
            commands.append((number, words[3:]))
    return commands


COMMANDS = [
    pytest.param(args, id=f"{page.relative_to(REPO_ROOT)}:{number}")
    for page in PAGES
    for number, args in runner_commands(page)
]


def test_the_readme_gives_the_three_runner_commands():
    commands = [args for _, args in runner_commands(README)]
    assert [PLACEHOLDER, "--epochs", "10"] in commands
    assert ["--compare", PLACEHOLDER] in commands
    assert ["--verify", PLACEHOLDER] in commands


@pytest.mark.parametrize("args", COMMANDS)
def test_every_runner_command_parses(args, capsys):
    parser = cli.build_parser()
    try:
        _, opts, kind, target, _ = cli.parse(parser, args)
    except SystemExit as exc:
        pytest.fail(f"python -m nanopatch {shlex.join(args)}: usage error {exc.code}: {capsys.readouterr().err}")
    if opts.info or opts.init:
        return
    assert target is not None, f"python -m nanopatch {shlex.join(args)}: no script"
    if kind == "script" and target != PLACEHOLDER:
        assert (REPO_ROOT / target).is_file(), f"{target} is not in the repository"


def test_a_bad_command_does_not_parse():
    """The check above can fail: an unknown option and options that do not go together are
    usage errors (exit status 2), as under ``python -m nanopatch``."""
    for args in (
        ["--no-such-option", PLACEHOLDER],
        ["--verify", "--compare", PLACEHOLDER],
        ["--plot", "x.png", "t.py"],
    ):
        with pytest.raises(SystemExit) as raised:
            cli.parse(cli.build_parser(), args)
        assert raised.value.code == 2, args


def tox_envs() -> set[str]:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(REPO_ROOT / "tox.ini")
    listed = {env.strip() for env in parser["tox"]["env_list"].split(",")}
    return listed | {section.split(":", 1)[1] for section in parser.sections() if section.startswith("testenv:")}


def test_every_tox_env_the_docs_name_exists():
    envs = tox_envs()
    named = {
        (page.name, match)
        for page in PAGES
        for _, line in code_lines(page)
        for match in re.findall(r"\btox -e ([\w-]+)", line)
    }
    named |= {(page.name, match) for page in PAGES for match in re.findall(r"`tox -e ([\w-]+)", page.read_text())}
    assert {"demo"} <= {env for _, env in named}
    missing = sorted((page, env) for page, env in named if env not in envs)
    assert not missing, f"tox envs the docs name that tox.ini lacks: {missing}"


def test_the_readme_set_up_is_what_a_user_types():
    """The README's set-up is ``pip install tox`` and tox's commands, nothing else: tox.ini
    provisions the rest (tox-uv) itself."""
    block = next(
        lines for lines in re.findall(r"```bash\n(.*?)```", README.read_text(), re.S) if "tox -e demo" in lines
    )
    commands = [shlex.split(line, comments=True) for line in block.splitlines()]
    assert [c for c in commands if c] == [["pip", "install", "tox"], ["tox", "-e", "demo"], ["tox"]]
    requires = configparser.ConfigParser(interpolation=None)
    requires.read(REPO_ROOT / "tox.ini")
    assert "tox-uv" in requires["tox"]["requires"]


def test_the_options_table_is_the_option_table():
    """docs/runner.md's options table is config.TABLE's, row for row: an option added, removed or
    reworded there shows here (``print(config.markdown_table())`` gives the new table)."""
    text = (REPO_ROOT / "docs" / "runner.md").read_text()
    section = re.search(r"^## Options\n(.*?)(?:^## |\Z)", text, re.S | re.M)
    assert section, "docs/runner.md has no Options section"
    table = "\n".join(line for line in section.group(1).splitlines() if line.startswith("|"))
    assert table == config.markdown_table()
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `(\w+)`.*$", table, re.M)}
    assert list(rows) == list(config.OPTIONS)
    for name, row in rows.items():
        assert config.env_name(name) in row, f"{name}: its row does not name {config.env_name(name)}"
