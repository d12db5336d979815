"""The command's error policy: what is the user's mistake (exit 2), what is a bug in qkv (exit 1).

User errors are one line on stderr, never a traceback: bad arguments, bad input, files that are
missing, unreadable, damaged or on a full disk. Anything else is a bug in qkv; it gets a short
message saying so. QKV_DEBUG=1 shows the traceback of every exception instead.
"""
from __future__ import annotations

import argparse
import os
import sys


class CommandError(Exception):
    """A user error the command reports in one line (exit status 2)."""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are CommandErrors (one line, exit status 2)."""

    def error(self, message: str):
        raise CommandError(f"{self.prog}: {message}")


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
