"""User-facing errors: one clear line, exit code 2, never a traceback."""
from __future__ import annotations

import logging
import signal
import sys
from typing import Callable


class UserError(Exception):
    """A mistake the user can fix (missing file, bad YAML, wrong checkpoint...).

    The message is a single line that names the file and says how to fix it.
    """


def one_line(e: BaseException, limit: int = 160) -> str:
    """An exception's message on one line (whitespace collapsed), cut at `limit` with '...'; its type if empty."""
    text = " ".join(str(e).split())
    return (text[:limit] + "...") if len(text) > limit else (text or type(e).__name__)


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


class stop_on_sigterm:
    """SIGTERM behaves like Ctrl-C: training stops and last.pt stays resumable."""

    def __enter__(self):
        self._old = signal.getsignal(signal.SIGTERM)
        try:
            signal.signal(signal.SIGTERM, self._raise)
        except ValueError:  # not the main thread
            self._old = None
        return self

    @staticmethod
    def _raise(signum, frame):
        raise KeyboardInterrupt

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGTERM, self._old)
        return False
