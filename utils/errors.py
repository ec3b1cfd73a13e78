"""User-facing errors: one clear line, exit code 2, never a traceback."""
from __future__ import annotations

import logging
import sys
from typing import Callable


class UserError(Exception):
    """A mistake the user can fix (missing file, bad YAML, wrong checkpoint...).

    The message is a single line that names the file and says how to fix it.
    """


def setup_logging(level: int = logging.INFO) -> None:
    logging.basicConfig(level=level, format="%(message)s", stream=sys.stdout, force=True)


def run_cli(main: Callable[[], object]) -> None:
    """Run a CLI entry point; a UserError becomes `error: ...` on stderr and exit code 2."""
    setup_logging()
    try:
        main()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
