"""`python -m draftsmith COMMAND`: the user-facing commands (the workflow's steps run as
`python -m draftsmith.steps.<rule>`)."""

from __future__ import annotations

import importlib
import sys

# command -> (module with a `main(argv) -> int`, what it does)
COMMANDS = {
    "init": ("draftsmith.init", "write a commented config.yaml for a new target model"),
    "plan": ("draftsmith.plan.cli", "print the run's plan: disk, rounds and GPU-hours, before anything runs"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    listed = "\n".join(f"  {name:<{width}}  {what}" for name, (_, what) in COMMANDS.items())
    return (
        f"usage: python -m draftsmith COMMAND [ARGS]\n\ncommands:\n{listed}\n\n"
        "`python -m draftsmith COMMAND --help` describes a command's arguments."
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if not argv or argv[0] not in COMMANDS:
        unknown = f"draftsmith: unknown command {argv[0]!r}\n" if argv else ""
        print(unknown + usage(), file=sys.stderr)
        return 2
    module, _ = COMMANDS[argv[0]]
    return int(importlib.import_module(module).main(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
