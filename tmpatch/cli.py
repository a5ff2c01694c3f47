"""The ``tmpatch`` command (console script, and ``python -m tmpatch``).

A thin layer on the public API: ``status`` prints :func:`tmpatch.status`
after applying in this process, ``run`` starts a command with ``TMPATCH=1``
and the bootstrap directory on PYTHONPATH, ``audit`` hands over to
:mod:`tmpatch.audit.cli`.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import textwrap
from typing import Any, Dict, Optional, Sequence

import tmpatch
from tmpatch import __version__
from tmpatch.bootstrap import DIRECTORY
from tmpatch.control import env, settings
from tmpatch.runtime import policies

DESCRIPTION = """\
tmpatch repairs torchmetrics in place, at run time (host-device syncs, wrong
devices, lost autograd graphs), on the releases whose code it recognises.
Nothing changes on disk: patches live in the processes that apply them."""

EXIT_CODES = """\
exit status:
  0  success
  1  a requested patch could not be applied (status), or a sync was found (audit)
  2  usage error: unknown option or patch name, no command, audit not installed
  run: the command's own exit status (127: command not found, 126: cannot run it)"""


def _environment_help() -> str:
    """Every variable of :data:`tmpatch.control.settings.SETTINGS`, with its form and help line."""
    lines = ["environment (read at start-up by every Python process; tmpatch run sets them):"]
    for setting in settings.SETTINGS:
        lines.append(f"  {setting.variable}={setting.placeholder}")
        lines += textwrap.wrap(setting.doc, 79, initial_indent=" " * 6, subsequent_indent=" " * 6)
    lines.append("  An empty or malformed value, or a misspelt TMPATCH_* name, is one warning each;")
    lines.append("  the rest applies.")
    return "\n".join(lines)


EXAMPLES = """\
examples:
  tmpatch status                         what tmpatch does to the installed torchmetrics
  tmpatch status -v                      the same, each patch whole: targets, defect, upstream issue
  tmpatch status --json                  the same, as JSON
  tmpatch run -- python train.py         run a program patched, children included
  tmpatch run --exclude gather_autograd -- torchrun --nproc_per_node=8 train.py
  TMPATCH=1 python train.py              the same as tmpatch run, through tmpatch.pth
  tmpatch audit --help                   find the host-device syncs of metrics"""


def _fill(*paragraphs: str) -> str:
    return "\n\n".join(textwrap.fill(paragraph, 79) for paragraph in paragraphs)


class UsageError(Exception):
    """Bad command-line input: exit status 2."""


def _names(value: Optional[str], option: str) -> Optional[tuple]:
    """Parse and check ``--patches``/``--exclude`` (comma-separated)."""
    from tmpatch.control import selection  # here: tmpatch run and --help start without it

    try:
        return selection.names(value, option)
    except (TypeError, ValueError) as exc:
        raise UsageError(str(exc)) from None


def _option(setting: "settings.Setting") -> str:
    return "--" + setting.name.replace("_", "-")


def _add_selection(parser: argparse.ArgumentParser) -> None:
    for name, what in (("patches", "only these patches, comma-separated (default: all"),
                       ("exclude", "all patches but these, comma-separated (default: none")):
        setting = settings.BY_NAME[name]
        parser.add_argument(_option(setting), metavar="NAMES", help=f"{what}, or ${setting.variable})")


def _run_settings_variables() -> list:
    return [setting.variable for setting in settings.SETTINGS if setting.kind != settings.SWITCH]


def build_parser() -> argparse.ArgumentParser:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="tmpatch", description=DESCRIPTION, formatter_class=formatter,
        epilog="\n\n".join([EXAMPLES, _environment_help(), EXIT_CODES]),
    )
    parser.add_argument("--version", action="version", version=f"tmpatch {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    status = commands.add_parser(
        "status", formatter_class=formatter,
        help="apply to the installed torchmetrics and show what happened to each patch",
        description=_fill(
            "Import torchmetrics, apply tmpatch in this process (nothing is changed on disk) and print one "
            "row per patch: patch, state, release, target, reason (a table that fits 120 columns: long "
            "targets are clipped). With -v (--wide), each patch whole: every target, the defect, the upstream "
            "issue, what changes for the user, the releases it was written for, and the policies in effect.",
            "states: applied; partial (applied to the targets whose code is recognised; the reason names those "
            "left alone); not-needed (this release has the upstream fix); mismatch (code not recognised, "
            "left alone); unsupported (release outside the patch's range); excluded; failed.",
        ),
        epilog=_fill("exit status: 0 every requested patch is applied or not needed; 1 one could not be "
                     "applied whole (partial, mismatch, unsupported, failed) or torchmetrics cannot be imported; "
                     "2 usage error."),
    )
    _add_selection(status)
    status.add_argument("--json", action="store_true", help="print the rows as a JSON list")
    status.add_argument("-v", "--verbose", "--wide", dest="wide", action="store_true",
                        help="each patch whole: every target, the defect, the upstream issue, what changes "
                             "for the user, the policies in effect")

    run = commands.add_parser(
        "run", formatter_class=formatter, usage="tmpatch run [OPTIONS] -- COMMAND [ARGS...]",
        help="run COMMAND with tmpatch applied in it and in every Python process it starts",
        description=_fill(
            "Run COMMAND with TMPATCH=1 and tmpatch's bootstrap directory first on PYTHONPATH: every Python "
            "process it starts (DataLoader workers, torchrun ranks, subprocesses) applies tmpatch when it "
            "imports torchmetrics. An existing sitecustomize still runs. The options below set the companion "
            f"variables ({', '.join(_run_settings_variables())}); those already in the environment are kept "
            "otherwise.",
        ),
        epilog="exit status: the command's own; 127 command not found; 126 cannot run it; 2 usage error",
    )
    _add_selection(run)
    for setting in settings.SETTINGS:
        if setting.kind == settings.FLAG:
            run.add_argument(_option(setting), action="store_true", help=setting.doc)
        elif setting.kind == settings.FLAG_OR_NAMES:
            run.add_argument(_option(setting), nargs="?", const=True, default=None, metavar="NAMES",
                             help=f"{setting.doc} (NAMES: only those patches, comma-separated)")
        elif setting.kind == settings.CHOICE:
            run.add_argument(_option(setting), choices=setting.choices, help=setting.doc)
    run.add_argument("argv", nargs=argparse.REMAINDER, metavar="COMMAND [ARGS...]", help="the command to run")

    commands.add_parser(
        "audit", add_help=False,
        help="report the host-device syncs of metric calls (tmpatch audit --help for its options)",
    )
    return parser


# -- commands --------------------------------------------------------------
def _say(message: str) -> None:
    print(f"tmpatch: {message}", file=sys.stderr)


def _import_targets() -> None:
    """Import the modules the patches target (those torchmetrics imports lazily too), so
    that every row of the table is final rather than ``pending``."""
    from tmpatch import patches as catalogue

    for name in catalogue.NAMES:
        for target in catalogue.load(name).targets:
            try:
                importlib.import_module(target.module)
            except Exception:  # noqa: BLE001 - absent in this release: the row says so
                pass


def _status(args: argparse.Namespace) -> int:
    from tmpatch.control import selection

    patches = _names(args.patches, "--patches")
    exclude = _names(args.exclude, "--exclude")
    found = env.read(valid_names=selection.valid_names())
    env.announce(found.problems, _say)
    if args.patches is None:
        patches = found.options.get("patches")
    if args.exclude is None:
        exclude = found.options.get("exclude")
    try:
        importlib.import_module("torchmetrics")  # the point of the command
    except Exception as exc:  # noqa: BLE001
        print(f"tmpatch status: cannot import torchmetrics ({type(exc).__name__}: {exc})", file=sys.stderr)
        return 1
    _import_targets()
    report = tmpatch.apply(patches, exclude=exclude)
    if args.json:
        print(json.dumps(report.to_dict(details=args.wide), indent=2))
    elif args.wide:
        print(report.details())
        print("\npolicies: " + ", ".join(f"{name}={value}" for name, value in policies.current.items()))
    else:
        print(report)
    return 1 if report.problems() else 0


def run_environ(base: Optional[dict] = None, options: Optional[dict] = None) -> dict:
    """The environment for ``tmpatch run``: ``base`` (default ``os.environ``)
    with ``TMPATCH=1``, the companion variables for ``options``, and the
    bootstrap directory first on PYTHONPATH (once)."""
    environ = dict(os.environ if base is None else base)
    environ[env.SWITCH] = "1"
    environ.update(env.to_environ(options or {}))
    entries = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != DIRECTORY]
    environ["PYTHONPATH"] = os.pathsep.join([DIRECTORY] + entries)
    return environ


def _run(args: argparse.Namespace) -> int:
    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise UsageError("run: no command given; usage: tmpatch run [OPTIONS] -- COMMAND [ARGS...]")
    options: Dict[str, Any] = {"patches": _names(args.patches, "--patches"),
                               "exclude": _names(args.exclude, "--exclude")}
    for setting in settings.SETTINGS:
        if setting.kind == settings.FLAG:
            options[setting.name] = True if getattr(args, setting.name) else None
        elif setting.kind == settings.FLAG_OR_NAMES:
            value = getattr(args, setting.name)
            options[setting.name] = value if value is None or value is True else _names(value, _option(setting))
        elif setting.kind == settings.CHOICE:
            options[setting.name] = getattr(args, setting.name)
    environ = run_environ(options=options)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        if os.name == "posix":
            os.execvpe(argv[0], argv, environ)  # does not return
        return subprocess.call(argv, env=environ)
    except FileNotFoundError:
        print(f"tmpatch run: command not found: {argv[0]}", file=sys.stderr)
        return 127
    except OSError as exc:
        print(f"tmpatch run: cannot run {argv[0]}: {exc.strerror or exc}", file=sys.stderr)
        return 126


def _audit(argv: Sequence[str]) -> int:
    try:
        module = importlib.import_module("tmpatch.audit.cli")
    except ModuleNotFoundError as exc:
        if exc.name not in ("tmpatch.audit", "tmpatch.audit.cli"):
            raise
        print("tmpatch audit: not available in this installation (module tmpatch.audit.cli not found)",
              file=sys.stderr)
        return 2
    result = module.main(list(argv))
    return 0 if result is None else int(result)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line; returns the exit status (a reader that closes the pipe early,
    ``tmpatch audit | head``, ends it quietly)."""
    try:
        return _main(argv)
    except BrokenPipeError:
        # stdout is gone: point it at devnull so the interpreter's final flush is silent too
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


def _main(argv: Optional[Sequence[str]]) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "audit":  # its own options, parsed by tmpatch.audit.cli
        return _audit(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)  # exits 2 on a usage error, 0 on --help
    try:
        if args.command == "status":
            return _status(args)
        if args.command == "run":
            return _run(args)
        parser.print_help()
        return 2
    except UsageError as exc:
        parser.exit(2, f"tmpatch: error: {exc}\n")
    return 2  # pragma: no cover - parser.exit raises


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
