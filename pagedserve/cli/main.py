"""The `pagedserve` command: `pagedserve up` starts the stack on this machine."""
from __future__ import annotations

import sys
from collections.abc import Sequence

USAGE = """usage: pagedserve COMMAND [ARGS]

commands:
  up         start the services on loopback and serve until Ctrl-C (pagedserve up --help)
  allocator  run the allocator alone (same flags as python -m allocator_service)
  generate   send one prompt to a running gateway, print the text (pagedserve generate --help)
  health     exit 0 when the service at HOST:PORT is SERVING (for container health checks)
"""


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command, rest = (args[0], args[1:]) if args else ("", [])
    if command == "up":
        from pagedserve.cli.up import up
        return up(rest)
    if command == "allocator":
        from allocator_service.__main__ import main as allocator_main
        allocator_main(rest)
        return 0
    if command == "health":
        from pagedserve.cli.health import main as health_main
        return health_main(rest)
    if command == "generate":
        from pagedserve.cli.generate import main as generate_main
        return generate_main(rest)
    print(USAGE, file=sys.stderr if command not in ("-h", "--help") else sys.stdout)
    return 0 if command in ("-h", "--help") else 2


if __name__ == "__main__":
    sys.exit(main())
