"""`jobwarden completion bash|zsh|fish`: a script that completes the subcommands, each one's options, the
values an option takes (`--on-hang stop`, `--restart on-failure`, `ps --state failed,lost`), job ids and
names, and a job's run numbers (`explain JOB --run 2`). The commands, options and their choices are read
from the parser itself, so a new option completes without an edit here (values that argparse does not
check, as `--restart`, are listed in VALUES); the jobs are asked of `jobwarden _jobs` at each completion
(a single cheap query), a job's runs of `jobwarden _runs` (which finds the JOB in the words typed).

Install: `jobwarden completion bash > ~/.local/share/bash-completion/completions/jobwarden`, or
`source <(jobwarden completion zsh)` in ~/.zshrc, or
`jobwarden completion fish > ~/.config/fish/completions/jobwarden.fish`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator

from jobwarden.config import STATE_WORDS
from jobwarden.errors import UsageError

HELP = "print a shell completion script (bash, zsh or fish)"

SHELLS = ("bash", "zsh", "fish")
JOBS_COMMAND = "_jobs"  # hidden: prints the ids and names to complete, one a line
RUNS_COMMAND = "_runs"  # hidden: `_runs CMD WORD...` prints the run numbers of the JOB among the words
RUN_OPTION = "--run"
# the values of options that take a word argparse does not check itself (it has their metavar only)
VALUES = {
    "--restart": ("no", "on-failure", "always"),
    "--max-restarts": ("unlimited",),
    "--hang-timeout": ("off",),
    "--log-max": ("off",),
    "--engine": ("auto", "slurm", "ray", "container", "none"),
    "--state": STATE_WORDS,
}
LISTS = frozenset({"--state"})  # comma-separated: the word after the last comma completes


class Subcommand:
    def __init__(self, name: str, parser: argparse.ArgumentParser, help_text: str) -> None:
        self.name = name
        self.help = help_text
        self.options = sorted(
            opt for action in parser._actions for opt in action.option_strings if opt.startswith("--")
        )
        self.takes_job = any(action.dest == "job" for action in parser._actions)
        # each option's values: its choices, else VALUES'
        self.values = {
            opt: tuple(str(c) for c in action.choices) if action.choices else VALUES[opt]
            for action in parser._actions
            for opt in action.option_strings
            if opt.startswith("--") and (action.choices or opt in VALUES)
        }
        # a positional word with choices (`boot enable`)
        self.words = next(
            (
                tuple(str(c) for c in a.choices)
                for a in parser._actions
                if not a.option_strings and a.choices and not isinstance(a, argparse._SubParsersAction)
            ),
            (),
        )


def subcommands(parser: argparse.ArgumentParser) -> list[Subcommand]:
    """The visible subcommands of the whole parser, in their order."""
    found: list[Subcommand] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            found.extend(
                Subcommand(name, sub, helps[name])
                for name, sub in action.choices.items()
                if not name.startswith("_")
            )
    return found


def script(shell: str, parser: argparse.ArgumentParser) -> str:
    if shell not in SHELLS:
        raise UsageError(f"completion: unknown shell {shell!r}", f"use one of: {', '.join(SHELLS)}")
    commands = subcommands(parser)
    if shell == "fish":
        return "\n".join(_fish(commands)) + "\n"
    bash = "\n".join(_bash(commands)) + "\n"
    if shell == "zsh":  # zsh runs the bash function through its own bashcompinit
        return "#compdef jobwarden\nautoload -U +X bashcompinit && bashcompinit\n" + bash
    return bash


def _bash(commands: list[Subcommand]) -> Iterator[str]:
    names = " ".join(c.name for c in commands)
    with_jobs = "|".join(c.name for c in commands if c.takes_job)
    yield "# jobwarden completion for bash (jobwarden completion bash)"
    yield "_jobwarden() {"
    yield '    local cur="${COMP_WORDS[COMP_CWORD]}" cmd="" i'
    yield "    for ((i = 1; i < COMP_CWORD; i++)); do"
    yield '        case "${COMP_WORDS[i]}" in -*) ;; *) cmd="${COMP_WORDS[i]}"; break ;; esac'
    yield "    done"
    yield '    if [[ -z "$cmd" ]]; then'
    yield f'        COMPREPLY=($(compgen -W "{names}" -- "$cur")); return'
    yield "    fi"
    yield '    if [[ "$cmd" == run && " ${COMP_WORDS[*]:0:COMP_CWORD} " == *" -- "* ]]; then'
    yield '        COMPREPLY=($(compgen -c -- "$cur")); return  # the job\'s own command'
    yield "    fi"
    yield '    local prev="${COMP_WORDS[COMP_CWORD-1]}"'
    yield '    case "$cmd $prev" in'
    for c in commands:
        for option, values in sorted(c.values.items()):
            words = " ".join(values)
            if option in LISTS:  # `failed,lo` completes `lo` after what the commas hold
                yield (
                    f'        "{c.name} {option}") local done="" part="$cur"; [[ "$cur" == *,* ]] && '
                    'done="${cur%,*}," part="${cur##*,}"; '
                    f'COMPREPLY=($(compgen -P "$done" -W "{words}" -- "$part")); return ;;'
                )
            else:
                yield f'        "{c.name} {option}") COMPREPLY=($(compgen -W "{words}" -- "$cur")); return ;;'
        if RUN_OPTION in c.options:
            yield f'        "{c.name} {RUN_OPTION}") _jobwarden_runs "$cmd" "$i" "$cur"; return ;;'
    yield "    esac"
    yield '    if [[ "$cur" == -* ]]; then'
    yield '        case "$cmd" in'
    for c in commands:
        yield f'            {c.name}) COMPREPLY=($(compgen -W "{" ".join(c.options)}" -- "$cur")) ;;'
    yield "        esac"
    yield "        return"
    yield "    fi"
    yield '    case "$cmd" in'
    if with_jobs:
        yield f'        {with_jobs}) _jobwarden_jobs "$cur" ;;'
    yield f'        completion) COMPREPLY=($(compgen -W "{" ".join(SHELLS)}" -- "$cur")) ;;'
    for c in commands:
        if c.words:
            yield f'        {c.name}) COMPREPLY=($(compgen -W "{" ".join(c.words)}" -- "$cur")) ;;'
    yield "    esac"
    yield "}"
    yield from _bash_jobs()
    yield from _BASH_RUNS.replace("RUNS_COMMAND", RUNS_COMMAND).strip("\n").splitlines()
    yield "complete -F _jobwarden jobwarden"


def _bash_jobs() -> Iterator[str]:
    """The job ids and names that start with the word typed, each shell-quoted as one word. Names are data,
    never code: `compgen -W` would expand `$(...)` and backticks in them (bash(1), "compgen": the word list
    undergoes expansion) and split a name at its spaces. zsh runs this too, through bashcompinit, which
    unquotes each reply before it adds it."""
    yield from _BASH_JOBS.replace("JOBS_COMMAND", JOBS_COMMAND).strip("\n").splitlines()


_BASH_JOBS = r"""
_jobwarden_jobs() {
    local cur="$1" typed="$1" ref quoted
    [[ "$typed" == [\"\']* ]] && typed="${typed:1}"  # a word begun with a quote: what follows it
    while IFS= read -r ref; do
        printf -v quoted '%q' "$ref"
        if [[ "$ref" == "$typed"* || "$quoted" == "$cur"* ]]; then
            COMPREPLY+=("$quoted")
        fi
    done < <(jobwarden JOBS_COMMAND 2>/dev/null)
}
"""


# the words between the subcommand (at $2) and `--run`, by a loop: zsh's bashcompinit reads a slice
# ${COMP_WORDS[@]:i+1} as a modifier
_BASH_RUNS = r"""
_jobwarden_runs() {
    local words=() j
    for ((j = $2 + 1; j < COMP_CWORD - 1; j++)); do words+=("${COMP_WORDS[j]}"); done
    COMPREPLY=($(compgen -W "$(jobwarden RUNS_COMMAND "$1" "${words[@]}" 2>/dev/null)" -- "$3"))
}
"""


def _fish(commands: list[Subcommand]) -> Iterator[str]:
    yield "# jobwarden completion for fish (jobwarden completion fish)"
    yield "complete -c jobwarden -f"
    for c in commands:
        yield f"complete -c jobwarden -n __fish_use_subcommand -a {c.name} -d {_fish_quote(c.help)}"
    for c in commands:
        seen = f'"__fish_seen_subcommand_from {c.name}"'
        for option in c.options:
            values = c.values.get(option)
            if option == RUN_OPTION:
                runs = f"(jobwarden {RUNS_COMMAND} (commandline -opc)[2..-1] 2>/dev/null)"
                yield f'complete -c jobwarden -n {seen} -l {option[2:]} -x -a "{runs}"'
            elif values and option in LISTS:  # `failed,` then each word after it
                # evaluated at each completion: the token up to its last comma, times each value
                head = r"(string replace -r \'[^,]*$\' \'\' -- (commandline -ct))"
                yield f"complete -c jobwarden -n {seen} -l {option[2:]} -x -a '{head}{{{','.join(values)}}}'"
            elif values:
                yield f"complete -c jobwarden -n {seen} -l {option[2:]} -x -a {_fish_quote(' '.join(values))}"
            else:
                yield f"complete -c jobwarden -n {seen} -l {option[2:]}"
        if c.words:
            yield f"complete -c jobwarden -n {seen} -a {_fish_quote(' '.join(c.words))}"
        if c.takes_job:
            yield f'complete -c jobwarden -n {seen} -a "(jobwarden {JOBS_COMMAND} 2>/dev/null)"'
    yield f'complete -c jobwarden -n "__fish_seen_subcommand_from completion" -a "{" ".join(SHELLS)}"'


def _fish_quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("shell", metavar="SHELL", help="bash, zsh or fish")


def handle(args: argparse.Namespace) -> int:
    from jobwarden.cli.parser import build_parser

    sys.stdout.write(script(args.shell, build_parser()))
    return 0
