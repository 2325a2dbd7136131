"""The `localcos` command line: one module per subcommand, all reading the settings layer."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from .. import __version__
from ..errors import LocalcosError
from . import bench, chat, demo, eval, generate, make_test_models, models, rpc_server, score, serve
from .options import EXIT_BAD_INPUT, EXIT_INTERRUPTED, Parser, fail

SUBCOMMANDS = (generate, chat, serve, score, eval, bench, models, rpc_server, demo, make_test_models)


def build_parser() -> Parser:
    parser = Parser(prog="localcos", description="Collaborative decoding of local GGUF models, made fast by speculation (CoS).")
    parser.add_argument("--version", action="version", version=f"localcos {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for module in SUBCOMMANDS:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return EXIT_BAD_INPUT
    try:
        return args.func(args)
    except LocalcosError as e:
        return fail(str(e))
    except KeyboardInterrupt:
        sys.stdout.flush()
        print("\ninterrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
