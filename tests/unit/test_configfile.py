"""The config file's parser (control.configfile): what it accepts, each refusal naming the line and the key,
and, for any text at all, a UserConfig or a one-line UsageError, never another exception."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobwarden.control.configfile import (
    RUN_KEYS,
    UserConfig,
    config_path,
    defaults_for,
    load_config,
    parse_config,
)
from jobwarden.errors import UsageError

PATH = Path("/home/u/.config/jobwarden/config.toml")


def test_the_path_follows_xdg_config_home_then_home() -> None:
    assert config_path({"XDG_CONFIG_HOME": "/x", "HOME": "/h"}) == Path("/x/jobwarden/config.toml")
    assert config_path({"HOME": "/h"}) == Path("/h/.config/jobwarden/config.toml")


def test_values_are_read_as_the_flags_would_give_them() -> None:
    text = (
        "[run]\n"
        'hang_timeout = "30m"\n'
        "timeout = 3600\n"
        "max_restarts = 5\n"
        "no_py_hooks = true\n"
        'keep_running = ["tensorboard", "jupyter"]\n'
        'log_max = "4G"\n'
        "\n"
        "[web]\n"
        'url = "https://gpu-box.example:8765/"\n'
    )
    config = parse_config(text, PATH)
    assert config.run == {
        "hang_timeout": "30m",
        "timeout": "3600",
        "max_restarts": "5",
        "no_py_hooks": True,
        "keep_running": ["tensorboard", "jupyter"],
        "log_max": "4G",
    }
    assert config.web_url == "https://gpu-box.example:8765"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[run]\n\n# a comment\nrestart = "sometimes"\n', "line 4: restart: bad --restart 'sometimes'"),
        ('[run]\nmem_limit = "512"\n', "line 2: mem_limit: --mem-limit 512 is only 512B"),
        ("[run]\nno_py_hooks = 1\n", "line 2: no_py_hooks: 1 is not true or false"),
        ("[run]\nnotify = 3\n", "line 2: notify: 3 is not a string (quote it)"),
        ('[run]\nnotify = "ftp://x/y"\n', "line 2: notify: --notify 'ftp://x/y': not an http(s) URL"),
        ('[web]\nurl = "http://h:1/?token=abc"\n', "line 2: web.url: the address must not carry the token"),
        ("[web]\nport = 1\n", "line 2: web.port: unknown key"),
        ('restart = "no"\n', "line 1: restart: unknown key"),
        ("[run]\nkeep_running = [1]\n", "line 2: keep_running: [1] is not a string or a list of strings"),
    ],
)
def test_a_bad_value_names_its_line_and_key(text: str, message: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_config(text, PATH)
    assert caught.value.message.startswith(f"config file {PATH} ")
    assert message in caught.value.message


def test_a_flag_given_overrides_the_file_and_a_linked_pair_goes_whole() -> None:
    config = UserConfig(PATH, {"restart": "always", "max_restarts": "9", "hang_timeout": "30m"})
    assert defaults_for(config, set()) == config.run
    assert defaults_for(config, {"hang_timeout"}) == {"restart": "always", "max_restarts": "9"}
    assert defaults_for(config, {"max_restarts"}) == {"hang_timeout": "30m"}


def test_a_missing_file_costs_no_toml_parser(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from jobwarden.control.configfile import load_config\n"
        f"assert load_config({{'XDG_CONFIG_HOME': {str(tmp_path)!r}}}) is None\n"
        "assert 'tomllib' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_file_that_is_not_a_regular_file_or_not_utf8_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "jobwarden" / "config.toml"
    path.mkdir(parents=True)
    with pytest.raises(UsageError, match="not a regular file"):
        load_config({"XDG_CONFIG_HOME": str(tmp_path)})
    path.rmdir()
    path.write_bytes(b"[run]\nnotify = '\xff'\n")
    path.chmod(0o600)
    with pytest.raises(UsageError, match="not UTF-8 text"):
        load_config({"XDG_CONFIG_HOME": str(tmp_path)})


def test_a_fifo_at_the_path_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    """open() of a FIFO with no writer blocks forever: the check runs in a child with a deadline, so that
    the old behaviour fails the test instead of hanging it."""
    import subprocess
    import sys

    path = tmp_path / "jobwarden" / "config.toml"
    path.parent.mkdir()
    os.mkfifo(path, 0o600)
    code = (
        "from jobwarden.control.configfile import load_config\n"
        "from jobwarden.errors import UsageError\n"
        "try:\n"
        f"    load_config({{'XDG_CONFIG_HOME': {str(tmp_path)!r}}})\n"
        "except UsageError as err:\n"
        "    print(err.message)\n"
    )
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("load_config() blocked in open() on a FIFO")
    assert f"config file {path}: not a regular file (a FIFO)" in done.stdout, done.stderr


_TEXT = st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=20)  # what TOML strings hold
_VALUES = st.one_of(
    _TEXT,
    st.integers(-5, 10**12),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.lists(_TEXT, max_size=3),
)


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return repr(value)


@given(st.dictionaries(st.sampled_from([*RUN_KEYS, "other", "hang-timeout"]), _VALUES, max_size=6))
def test_any_run_table_parses_or_is_one_usage_error(values: dict[str, object]) -> None:
    text = "[run]\n" + "".join(f"{key} = {_toml(value)}\n" for key, value in values.items())
    try:
        config = parse_config(text, PATH)
    except UsageError as err:
        assert err.message.startswith(f"config file {PATH}") and "\n" not in err.message
        named = re.match(rf"config file {re.escape(str(PATH))} line (\d+): ([\w-]+): ", err.message)
        assert named, err.message  # the line and the key are named
        line, key = int(named.group(1)), named.group(2)
        assert key in values and text.splitlines()[line - 1].startswith(f"{key} = ")
    else:
        assert set(config.run) == set(values)


@given(st.text(max_size=200))
def test_any_text_at_all_parses_or_is_one_usage_error(text: str) -> None:
    try:
        parse_config(text, PATH)
    except UsageError as err:
        assert err.message.startswith(f"config file {PATH}")
