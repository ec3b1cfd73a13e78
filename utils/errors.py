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
    except KeyboardInterrupt as e:  # an Interrupted carries the line on how to continue
        print(f"interrupted: {e}" if str(e) else "interrupted", file=sys.stderr)
        sys.exit(130)


class Interrupted(KeyboardInterrupt):
    """A Ctrl-C or SIGTERM that ended a run while it was already stopping or finishing (a second one, say); the
    message is the line on how to continue, which run_cli prints after 'interrupted: '."""


class stop_on_signals:
    """SIGTERM behaves like Ctrl-C (SIGINT): training stops and last.pt stays resumable.

    Both signals also set `requested`, which the training loop checks after every batch and epoch: Python
    drops an exception raised inside a finaliser (a `__del__` that garbage collection runs at that moment
    prints "Exception ignored in ..."), so a signal landing there would otherwise be lost and the run would
    carry on to the end."""

    requested = False

    def __enter__(self):
        stop_on_signals.requested = False
        self._old = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._old[sig] = signal.getsignal(sig)
                signal.signal(sig, self._raise)
            except ValueError:  # not the main thread
                self._old.pop(sig, None)
        return self

    @staticmethod
    def _raise(signum, frame):
        stop_on_signals.requested = True
        raise KeyboardInterrupt

    @staticmethod
    def check() -> None:
        """Raise the KeyboardInterrupt of a signal whose first one was swallowed."""
        if stop_on_signals.requested:
            raise KeyboardInterrupt

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)
        stop_on_signals.requested = False
        return False
