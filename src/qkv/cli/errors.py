"""The command's error policy: what is the user's mistake (exit 2), what is a bug in qkv (exit 1).

User errors are one line on stderr, never a traceback: bad arguments, bad input, files that are
missing, unreadable, damaged or on a full disk. Anything else is a bug in qkv; it gets a short
message saying so. QKV_DEBUG=1 shows the traceback of every exception instead.
"""
from __future__ import annotations

import argparse
import difflib
import os
import re
import sys


class CommandError(Exception):
    """A user error the command reports in one line (exit status 2)."""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are CommandErrors (one line, exit status 2) that name the subcommand
    (``sample: …``, not ``qkv sample: …`` after ``qkv: error:``) and suggest the flag or choice meant."""

    given: list[str] = []  # the strings it last parsed

    def parse_known_args(self, args=None, namespace=None):
        """argparse's, and the namespace says which parser took the last subcommand (``innermost_parser``)."""
        self.given = list(sys.argv[1:] if args is None else args)
        namespace, extras = super().parse_known_args(args, namespace)
        if not hasattr(namespace, "innermost_parser"):  # a subcommand's parser returns first and sets it
            namespace.innermost_parser = self
        return namespace, extras

    def error(self, message: str):
        where = self.prog.removeprefix("qkv").strip()
        hints = flag_hints(self.given, self.flags()) + choice_hints(message)
        hint = f" ({'; '.join(hints)})" if hints else ""
        raise CommandError(f"{where + ': ' if where else ''}{message}{hint}")

    def flags(self) -> list[str]:
        """Every option string of this parser, as its usage line shows them."""
        return sorted(set(re.findall(r"(?<![\w-])--?[A-Za-z][\w-]*", self.format_usage())) | {"--help"})


def close_match(word: str, choices) -> str | None:
    """The one of ``choices`` closest to ``word`` (difflib), if any is close."""
    found = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return found[0] if found else None


def flag_hints(given: list[str], flags: list[str]) -> list[str]:
    """"--promt: did you mean --prompt?" for each flag in ``given`` that is not one of ``flags`` (nor the
    start of exactly one, which argparse takes as that flag) but is close to one."""
    hints = []
    for word in dict.fromkeys(w.split("=", 1)[0] for w in given if w.startswith("--") and w != "--"):
        if word in flags or len([f for f in flags if f.startswith(word)]) == 1:
            continue
        match = close_match(word, flags)
        if match:
            hints.append(f"{word}: did you mean {match}?")
    return hints


def choice_hints(message: str) -> list[str]:
    """"did you mean 'sample'?" for argparse's "invalid choice: 'smaple' (choose from …)"."""
    bad = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
    if not bad:
        return []
    match = close_match(bad[1], [c.strip().strip("'") for c in bad[2].split(",")])
    return [f"did you mean {match!r}?"] if match else []


# ValueError/TypeError: the library's input checks (RunLocked, Diverged, CatalogError are ValueErrors);
# OSError: the filesystem and the network (FileNotFoundError, PermissionError, DiskFullError, a taken port).
USER_ERRORS = (CommandError, ValueError, TypeError, OSError)


def debugging() -> bool:
    """True when QKV_DEBUG asks for tracebacks."""
    return os.environ.get("QKV_DEBUG", "") not in ("", "0")


def missing_package(e: BaseException) -> str | None:
    """The name of a third-party package that is not installed, if that is what ``e`` says."""
    if isinstance(e, ModuleNotFoundError) and e.name and e.name.split(".")[0] not in ("qkv", "benchmarks"):
        return e.name.split(".")[0]
    return None


def first_line(e: BaseException) -> str:
    """The first line of an exception's message, or its type's name when it has none."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def report(e: Exception) -> int:
    """Print one line for ``e`` on stderr and return the exit status: 2 user error, 1 bug in qkv."""
    package = missing_package(e)
    if package:
        print(f"qkv: error: this command needs the Python package {package!r}, which is not installed",
              file=sys.stderr)
        return 2
    if isinstance(e, USER_ERRORS):
        print(f"qkv: error: {first_line(e)}", file=sys.stderr)
        return 2
    print(f"qkv: internal error (a bug in qkv, please report it): {type(e).__name__}: {first_line(e)}; "
          "set QKV_DEBUG=1 to see the traceback", file=sys.stderr)
    return 1
