"""rules.relay: another process's traceback inside an exception (relayed), an exception that reports
another process's end, a peer's communication error: read from what the libraries really printed
(tests/fixtures/mlstack/corpus-*.log) and from the hooks' records, with property tests of the parsers."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from jobwarden.hooks.site import _jobwarden_hooks as hooks
from jobwarden.model import ranks_from
from jobwarden.observations import Frame, UncaughtException
from jobwarden.rules import mltext, relay

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "mlstack"
T = 1_700_000_000.0


def recorded(name: str) -> list[str]:
    return (FIXTURES / f"{name}.log").read_text().splitlines()


def message_after(lines: list[str], exception_line: str) -> str:
    """The message of a printed exception, continuation lines included (what the hooks' record holds)."""
    start = next(i for i, line in enumerate(lines) if line.startswith(exception_line))
    first = lines[start].partition(": ")[2]
    return "\n".join([first, *lines[start + 1 :]])


# --- relayed tracebacks in messages (the hooks' records) ------------------------------------------------


def test_a_dataloader_workers_traceback_inside_the_reraise() -> None:
    lines = recorded("corpus-dl-raises")
    message = message_after(lines, "ValueError: Caught ValueError")
    (found,) = relay.relayed_in([message])
    assert (found.traceback.exc_type, found.traceback.message) == (
        "ValueError",
        "corrupt record 9: expected 4 fields, got 3",
    )
    assert found.traceback.frames[0].function == "__getitem__"  # its own raise site, innermost first
    assert found.intro == "Caught ValueError in DataLoader worker process 0."
    assert found.rank is None  # a worker id is no rank


def test_torch_spawns_process_index_is_its_rank() -> None:
    lines = recorded("corpus-spawn-raises")
    (found,) = relay.relayed_in([message_after(lines, "torch.multiprocessing.spawn.ProcessRaisedException")])
    assert found.traceback.exc_type == "ValueError"
    assert (found.rank, found.traceback.frames[0].function) == (1, "_spawned")


def test_a_remote_traceback_chained_to_the_reraised_exception() -> None:
    # concurrent.futures, loky and multiprocessing.pool raise the worker's exception again in the parent,
    # from a _RemoteTraceback whose message is the worker's traceback between triple quotes
    for log in ("corpus-ppe-raises", "corpus-joblib-raises", "corpus-pool-raises"):
        lines = recorded(log)
        start = next(i for i, line in enumerate(lines) if line.endswith("RemoteTraceback: "))
        end = lines.index('"""', start + 2)
        (found,) = relay.relayed_in(["\n".join(lines[start + 1 : end + 1])])
        assert found.traceback.exc_type == "KeyError", log
        assert found.traceback.frames[0].function == "task", log


def test_no_traceback_in_a_plain_message() -> None:
    assert relay.relayed_in(["process 1 terminated with exit code 3", ""]) == []


# --- relayed tracebacks in printed output (no hooks) ----------------------------------------------------


def test_printed_relays_are_found_and_the_top_level_traceback_is_the_parents() -> None:
    for log, relayed_type, top in (
        ("corpus-dl-raises", "ValueError", "ValueError"),
        ("corpus-spawn-raises", "ValueError", "torch.multiprocessing.spawn.ProcessRaisedException"),
        ("corpus-ppe-raises", "KeyError", "KeyError"),
        ("corpus-pool-raises", "KeyError", "KeyError"),
    ):
        lines = recorded(log)
        (found,) = relay.relayed_in_lines(lines)
        assert found.traceback.exc_type == relayed_type, log
        printed = relay.top_level_traceback(lines)
        assert printed is not None and printed.exc_type == top, log
        assert printed != found.traceback, log
    assert relay.relayed_in_lines(recorded("corpus-subprocess-chain")) == []  # three tracebacks, none relayed


# --- who raised it: the hooks' record of what each process formatted -----------------------------------


def test_a_relayed_exception_belongs_to_the_process_that_formatted_it() -> None:
    lines = recorded("corpus-dl-raises")
    (found,) = relay.relayed_in([message_after(lines, "ValueError: Caught ValueError")])
    inner = found.traceback.frames[0]
    worker = UncaughtException(811, T, "ValueError", "corrupt record 9: expected 4 fields, got 3", (inner,))
    main_again = worker.__class__(
        800, T + 1, "ValueError", "corrupt record 9: expected 4 fields, got 3", (inner,)
    )
    other = UncaughtException(812, T - 5, "ValueError", "something else", (Frame("f", "/x.py", 3),))
    owner = relay.attribute(found, 800, T + 2, [other, worker, main_again])
    assert (owner.pid, owner.at, owner.frames[0].function) == (811, T, "__getitem__")
    unknown = relay.attribute(found, 800, T + 2, [])
    assert (unknown.pid, unknown.at) == (-1, T + 2)


# --- reports and reactions ----------------------------------------------------------------------------


def exc(kind: str, message: str, frames: tuple[Frame, ...] = ()) -> UncaughtException:
    return UncaughtException(1, T, kind, message, frames)


def test_what_speaks_of_another_process() -> None:
    assert relay.reports_on(exc("subprocess.CalledProcessError", "returned non-zero exit status 1.")) == (
        "exit status"
    )
    assert (
        relay.reports_on(exc("ray.exceptions.WorkerCrashedError", "The worker died unexpectedly")) == "worker"
    )
    assert relay.reports_on(exc("BrokenProcessPool", "")) == "process"  # its type's name
    spawn = Frame(
        "ProcessContext.join", "/v/lib/python3.11/site-packages/torch/multiprocessing/spawn.py", 211
    )
    assert relay.reports_on(exc("torch.X", "", (spawn,))) == "process"  # the library frame that raised it
    own = Frame("rank_raises", "/srv/train.py", 12)  # the user's own names mean nothing
    assert relay.reports_on(exc("ValueError", "bad batch shape (2, 3)", (own,))) is None
    assert relay.reports_on(exc("ValueError", "could not preprocess row 7")) is None


def test_a_peers_communication_error() -> None:
    gloo = recorded("corpus-gloo-ranks")[-1].partition("RuntimeError: ")[2]
    assert relay.peer_error(exc("RuntimeError", gloo)) is not None
    assert relay.peer_error(exc("BrokenPipeError", "[Errno 32] Broken pipe")) == "BrokenPipeError"
    assert relay.peer_error(exc("EOFError", "Ran out of input")) == "EOFError"
    assert relay.peer_error(exc("ValueError", "unparsable row 'row 500'")) is None


def test_a_report_that_names_a_process_and_its_exit_code() -> None:
    assert relay.named_ends(["process 1 terminated with exit code 3"]) == [(1, 3)]
    assert relay.named_ends(["worker process 0 is fine"]) == []


# --- property tests of the parsers of outside input -----------------------------------------------------

TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=300)
LINE_PIECES = st.sampled_from(
    [
        "Traceback (most recent call last):",
        "Original Traceback (most recent call last):",
        '"""',
        '  File "/srv/x.py", line 3, in f',
        "    raise ValueError('x')",
        "ValueError: x",
        "-- Process 1 terminated with the following error:",
        "",
        "The above exception was the direct cause of the following exception:",
        "[rank1]: Traceback (most recent call last):",
    ]
)


@given(st.lists(st.one_of(LINE_PIECES, TEXT), max_size=40))
def test_the_parsers_take_any_output(lines: list[str]) -> None:
    for found in relay.relayed_in_lines(lines):
        assert found.traceback.exc_type
    relay.top_level_traceback(lines)
    for found in relay.relayed_in(["\n".join(lines)]):
        assert isinstance(found.traceback, mltext.PyTraceback)
    relay.named_ends(lines)


@given(TEXT, TEXT)
def test_reports_and_reactions_take_any_text(kind: str, message: str) -> None:
    e = exc(kind, message, (Frame(kind, message, 1),))
    relay.reports_on(e)
    relay.peer_error(e)


RANK_VALUES = st.one_of(st.none(), st.sampled_from(["0", "1", "3", "12", "-1", "x", "", "٣", " 2"]))
RANK_NAMES = (
    "RANK",
    "OMPI_COMM_WORLD_RANK",
    "PMI_RANK",
    "PMIX_RANK",
    "SLURM_PROCID",
    "LOCAL_RANK",
    "GROUP_RANK",
    "NODE_RANK",
    "LOCAL_WORLD_SIZE",
)


@given(st.fixed_dictionaries({name: RANK_VALUES for name in RANK_NAMES}))
def test_the_hooks_read_a_rank_as_the_shim_does(values: dict[str, str | None]) -> None:
    env = {k: v for k, v in values.items() if v is not None}
    ranks = ranks_from(env)
    shim = ranks.rank if ranks is not None else None
    hook = hooks.rank_of(env)
    assert hook == ("-" if shim is None else str(shim))


def test_ranks_from_every_convention() -> None:
    assert ranks_from({"RANK": "3", "SLURM_PROCID": "0"}) == (3, None, None)  # torchrun's rank under srun
    assert ranks_from({"SLURM_PROCID": "2"}) == (2, None, None)
    assert ranks_from({"OMPI_COMM_WORLD_RANK": "5"}) == (5, None, None)
    assert ranks_from({"PMI_RANK": "4"}) == (4, None, None)
    assert ranks_from({"LOCAL_RANK": "1", "NODE_RANK": "0", "WORLD_SIZE": "2"}) == (1, 1, 0)  # Lightning
    assert ranks_from({"LOCAL_RANK": "1", "GROUP_RANK": "2", "LOCAL_WORLD_SIZE": "4"}) == (9, 1, 2)
    assert ranks_from({"LOCAL_RANK": "1", "GROUP_RANK": "2"}) == (None, 1, 2)  # its node's size unknown
    assert ranks_from({"WORLD_SIZE": "2"}) is None


@given(st.text(max_size=9000), st.integers(min_value=200, max_value=5000))
def test_a_trimmed_message_keeps_its_end_within_the_limit(text: str, limit: int) -> None:
    trimmed = hooks.trim(text, limit)
    assert len(trimmed) <= max(limit, len(text) if len(text) <= limit else limit)
    if len(text) > limit:
        assert trimmed.endswith(text[-(limit // 2) :])
    else:
        assert trimmed == text
