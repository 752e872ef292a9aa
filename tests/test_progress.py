"""Progress lines on stderr: shown on a terminal, silent in a pipe or when quiet, nested waits on lines of
their own."""

from __future__ import annotations

import io
import re

import pytest

from hvd_agents.runtime import progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _loud(monkeypatch):
    monkeypatch.delenv(progress.QUIET_ENV, raising=False)
    monkeypatch.setattr(progress, "_quiet", False)


def lines(stream: io.StringIO) -> list[str]:
    """What a terminal shows: each line as its last carriage return left it."""
    return [line.split("\r")[-1].rstrip() for line in stream.getvalue().split("\n")]


def test_a_wait_on_a_terminal_shows_a_line_that_ends_with_its_time() -> None:
    term = Terminal()
    with progress.waiting("building k.cpp (once)", stream=term):
        pass
    assert re.fullmatch(r"building k\.cpp \(once\) \.\.\. done in \d+\.\d s", lines(term)[0]), term.getvalue()
    assert lines(term)[1:] == [""]


def test_the_seconds_count_up_in_place(monkeypatch) -> None:
    monkeypatch.setattr(progress, "TICK_S", 0.01)
    term = Terminal()
    with progress.waiting("measuring", stream=term):
        while "measuring ... 0 s" not in term.getvalue():
            pass
    assert term.getvalue().count("\n") == 1 and lines(term)[0].startswith("measuring ... done in")


def test_nothing_is_written_to_a_pipe_or_when_quiet(monkeypatch) -> None:
    pipe = io.StringIO()
    with progress.waiting("loading", stream=pipe):
        pass
    term = Terminal()
    progress.set_quiet()
    with progress.waiting("loading", stream=term):
        pass
    progress.set_quiet(False)
    monkeypatch.setenv(progress.QUIET_ENV, "1")
    with progress.waiting("loading", stream=term):
        pass
    assert pipe.getvalue() == "" and term.getvalue() == ""


def test_a_nested_wait_ends_the_outer_line_and_the_outer_reports_on_its_own() -> None:
    term = Terminal()
    with progress.waiting("loading m", stream=term), progress.waiting("building k.cpp (once)", stream=term):
        pass
    shown = lines(term)
    assert shown[0] == "loading m ..."
    assert shown[1].startswith("building k.cpp (once) ... done in ")
    assert re.fullmatch(r"loading m: done in \d+\.\d s", shown[2]) and shown[3:] == [""]


def test_a_failed_wait_says_so_and_the_error_goes_on() -> None:
    term = Terminal()
    with pytest.raises(RuntimeError, match="no compiler"), progress.waiting("building k.cpp", stream=term):
        raise RuntimeError("no compiler")
    assert lines(term)[0].startswith("building k.cpp ... failed in ")


def test_end_line_hands_the_terminal_to_other_output() -> None:
    term = Terminal()
    with progress.waiting("loading m", stream=term):
        progress.end_line()
        term.write("a library's own bar\n")
    assert lines(term) == ["loading m ...", "a library's own bar", lines(term)[2], ""]
    assert lines(term)[2].startswith("loading m: done in ")


@pytest.mark.parametrize("argv", [["-q", "generate"], ["generate", "-q"], ["--quiet", "generate"]])
def test_the_command_line_quiet_option_turns_progress_off(argv) -> None:
    from hvd_agents.cli import main

    assert progress.enabled(Terminal())
    assert main([*argv, "--prompt", "hi", "--model", "/nonexistent/model.gguf"]) == 2  # fails before any load
    assert not progress.enabled(Terminal())


def test_analyze_keeps_its_own_quiet_option() -> None:
    from hvd_agents.cli import build_parser

    parser = build_parser()
    assert [parser.parse_args([*a, "analyze", "t.jsonl", *b]).quiet for a, b in
            (([], []), (["-q"], []), ([], ["-q"]), ([], ["--quiet"]))] == [False, True, True, True]
