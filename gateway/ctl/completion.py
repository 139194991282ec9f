"""Shell completion written from an argparse parser (pure): `yuzu-gw-ctl completion bash|zsh`
and `yuzu-gw completion bash|zsh` print a script that completes the parser's commands and
options, so the completion cannot drift from the parser it was generated from.

    eval "$(yuzu-gw-ctl completion bash)"     # or: ... > /etc/bash_completion.d/yuzu-gw-ctl
    eval "$(yuzu-gw-ctl completion zsh)"      # zsh, through its bashcompinit

The script walks the words typed so far down the command tree, skipping an option's value,
and offers the subcommands and options of where it stands; after an option that takes a file
(`type=Path`) it offers file names.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

import attrs

__all__ = ["SHELLS", "Level", "levels", "script"]

SHELLS = ("bash", "zsh")


@attrs.frozen
class Level:
    """One command of the tree: where it is, and what may follow it."""

    path: tuple[str, ...]
    commands: tuple[str, ...]
    options: tuple[str, ...]
    valued: tuple[str, ...]  # options that take a value (the next word)
    files: tuple[str, ...]  # of those, the ones whose value is a file


def levels(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[Level]:
    commands: list[str] = []
    options: list[str] = []
    valued: list[str] = []
    files: list[str] = []
    children: list[tuple[str, argparse.ArgumentParser]] = []
    # argparse has no public walk of its actions; shtab and argcomplete read them the same way.
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                commands.append(name)
                children.append((name, sub))
            continue
        if not action.option_strings or action.help == argparse.SUPPRESS:
            continue
        options.extend(action.option_strings)
        if action.nargs != 0:
            valued.extend(action.option_strings)
            if action.type is Path:
                files.extend(action.option_strings)
    yield Level(path, tuple(commands), tuple(options), tuple(valued), tuple(files))
    for name, sub in children:
        yield from levels(sub, (*path, name))


def _function_name(prog: str) -> str:
    return "_" + re.sub(r"\W", "_", prog) + "_complete"


def _words(items: tuple[str, ...]) -> str:
    return " ".join(items)


def script(parser: argparse.ArgumentParser, prog: str, shell: str) -> str:
    if shell not in SHELLS:
        raise ValueError(f"no completion for {shell!r}: one of {', '.join(SHELLS)}")
    tree = list(levels(parser))
    name = _function_name(prog)
    paths = " | ".join(f'"/{"/".join(level.path)}"' for level in tree if level.path)
    # A case pattern; '' (the empty word) when there is nothing to match.
    valued = " | ".join(sorted({o for level in tree for o in level.valued})) or "''"
    files = " | ".join(sorted({o for level in tree for o in level.files})) or "''"
    cases = "\n".join(
        f'        "/{"/".join(level.path)}") words="{_words(level.commands + level.options)}" ;;'
        for level in tree
    )
    lines = [
        f'# {shell} completion for {prog}, generated from its parser: eval "$({prog} completion'
        f' {shell})"',
    ]
    if shell == "zsh":
        lines.append("autoload -U +X bashcompinit && bashcompinit")
    lines += [
        f"{name}() {{",
        "    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}",
        '    local path="" word words i',
        f"    case $prev in {files})",
        '        COMPREPLY=($(compgen -f -- "$cur")); return ;;',
        "    esac",
        "    for ((i = 1; i < COMP_CWORD; i++)); do",
        "        word=${COMP_WORDS[i]}",
        "        case $word in",
        f"            {valued}) ((i++)); continue ;;",
        "        esac",
        '        case "$path/$word" in',
        f'            {paths}) path="$path/$word" ;;',
        "        esac",
        "    done",
        '    case "/${path#/}" in',
        cases,
        '        *) words="" ;;',
        "    esac",
        '    COMPREPLY=($(compgen -W "$words" -- "$cur"))',
        "}",
        f"complete -o default -F {name} {prog}",
    ]
    return "\n".join(lines) + "\n"
