"""``fastgshare run`` as the GPU day starts it: the command's own parser and entry point
(:mod:`fastgshare_cli.run_command`), so its flags are checked and it runs exactly as
``fastgshare run`` does, but without :mod:`fastgshare_cli.main`, which imports every subcommand and
with them packages the lent GPU machine lacks (kubernetes, orjson, ...; it has no network to
install them).

    python3 bench/gpu/fastgshare_run.py [--request R] [--limit L] ... -- CMD [ARGS...]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from fastgshare_cli.run_command import add_parser, run_main  # noqa: E402 - the checkout's path is set just above


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fastgshare")
    add_parser(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    return run_main(parser.parse_args(["run", *(sys.argv[1:] if argv is None else argv)]))


if __name__ == "__main__":
    sys.exit(main())
