"""User-facing errors: one clear line, exit code 2, never a traceback."""
from __future__ import annotations

import contextlib
import io
import logging
import os
import signal
import sys
import threading
from typing import Callable, Iterator


class UserError(Exception):
    """A mistake the user can fix (missing file, bad YAML, wrong checkpoint...).

    The message is a single line that names the file and says how to fix it.
    """


def one_line(e: BaseException, limit: int = 160) -> str:
    """An exception's message on one line (whitespace collapsed), cut at `limit` with '...'; its type if empty."""
    text = " ".join(str(e).split())
    return (text[:limit] + "...") if len(text) > limit else (text or type(e).__name__)


def setup_logging(level: int = logging.INFO) -> None:
    """Messages as plain lines on stdout; under torchrun only rank 0's (RANK, set by torchrun), as YOLOv5: the other
    processes say warnings and errors alone."""
    rank = os.environ.get("RANK", "0")
    logging.basicConfig(level=level if rank in ("0", "-1") else max(level, logging.WARNING), format="%(message)s",
                        handlers=[StdoutHandler(sys.stdout)], force=True)


PIPE_EXIT = 128 + 13  # what a shell reports for a process ended by SIGPIPE


class OutputClosed(KeyboardInterrupt):
    """stdout's reader went away (`detect.py | head -1`). A KeyboardInterrupt, so a run stops as on Ctrl-C (a
    training keeps its resumable last.pt, open videos are closed) and no `except Exception` swallows it; run_cli
    then exits quietly with PIPE_EXIT, as Unix tools do."""

    happened = False


class StdoutHandler(logging.StreamHandler):
    """A StreamHandler whose stream's reader may go away: logging's own handler prints a '--- Logging error ---'
    traceback for every line after that and the command carries on to the end."""

    def handleError(self, record: logging.LogRecord) -> None:
        if not isinstance(sys.exc_info()[1], BrokenPipeError):
            super().handleError(record)
        elif threading.current_thread() is threading.main_thread():  # a thread's line is dropped; the main
            output_closed()  # thread's next one meets the same closed pipe and stops the command


def output_closed() -> None:
    """Point stdout (and stderr, when it is the same pipe) at the null device, so the lines still to come and the
    interpreter's last flush go nowhere instead of raising again, then raise OutputClosed."""
    OutputClosed.happened = True
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        out = os.fstat(1)
        for fd in (1, 2):
            with contextlib.suppress(OSError):
                st = os.fstat(fd)
                if fd == 1 or (st.st_dev, st.st_ino) == (out.st_dev, out.st_ino):
                    os.dup2(null, fd)
    except OSError:
        pass
    finally:
        os.close(null)
    raise OutputClosed


# the signals that stop a command as Ctrl-C does: SIGTERM (job schedulers, systemd, container stops, `timeout`) and
# SIGHUP (a closed terminal or ssh session) besides SIGINT
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, name))


def run_cli(main: Callable[[], object], restore_signals: bool = False) -> None:
    """Run a CLI entry point; a UserError becomes `error: ...` on stderr and exit code 2. The stop signals raise
    Ctrl-C's KeyboardInterrupt for the whole command (exit 130 with one line), and once a run has stopped, the ones
    that follow (`timeout` passes the group's SIGTERM on to the group: every process gets it twice) are let go
    while the command ends, its exit included. restore_signals: put the caller's handlers back at the end (a
    command run inside another Python process, as the tests do)."""
    setup_logging()
    OutputClosed.happened = False
    stops = StopSignals()  # the command's own: the first signal raises, later ones are noted
    old = _set_handlers(stops.handle)
    try:
        main()
    except BrokenPipeError:  # a print() or argparse's --help to a closed stdout, not through logging
        with contextlib.suppress(OutputClosed):
            output_closed()
        sys.exit(PIPE_EXIT)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt as e:  # an Interrupted carries the line on how to continue
        stops.stopped = True
        if OutputClosed.happened:  # the reader is gone: nothing to say, and no one to say it to
            sys.exit(PIPE_EXIT)
        print(f"interrupted: {e}" if str(e) else "interrupted", file=sys.stderr)
        sys.exit(130)
    except SystemExit:  # train.py's 130 after a run it stopped, here because its output was closed
        if OutputClosed.happened:
            sys.exit(PIPE_EXIT)
        raise
    finally:
        stops.stopped = True  # the command is ending: a signal from here on has nothing left to stop
        if restore_signals:
            for sig, handler in old.items():
                signal.signal(sig, handler)
        elif old:  # ignored, not handled: Python's handlers are undone as the interpreter shuts down
            _set_handlers(signal.SIG_IGN)


def _set_handlers(handler) -> dict:
    """`handler` for every stop signal (in the main thread; elsewhere nothing changes); the handlers it replaced."""
    old = {}
    for sig in STOP_SIGNALS:
        try:
            old[sig] = signal.signal(sig, handler)
        except ValueError:  # not the main thread
            return {}
    return old


class Interrupted(KeyboardInterrupt):
    """A Ctrl-C or SIGTERM that ended a run while it was already stopping or finishing (a second one, say); the
    message is the line on how to continue, which run_cli prints after 'interrupted: '."""


class StopSignals:
    """One run's stop signals: SIGTERM and SIGHUP behave like Ctrl-C (SIGINT), so training stops and last.pt stays
    resumable. Each command (run_cli), run (train.train), search (--evolve) and loader worker owns one, and the run's
    is handed to its Trainer (`t.stops`).

    `requested`: a signal arrived; the training loop checks it after every batch and epoch (check()): Python drops an
    exception raised inside a finaliser (a `__del__` that garbage collection runs at that moment prints "Exception
    ignored in ..."), so a signal landing there would otherwise be lost and the run would carry on to the end.
    `stopped`: the run has stopped on a signal and said how to go on; later ones are let go (here and in the
    command's, which learns it as the block ends), as `timeout` sends its SIGTERM twice and the second may land after
    that line. The object whose handler is installed is the active one (active()): a file write, which no run hands
    anything to, asks it whether a stop is on its way."""

    def __init__(self) -> None:
        self.requested = False
        self.stopped = False
        self.deferring = False
        self._old: dict = {}

    @staticmethod
    def active() -> StopSignals | None:
        """The object whose handler the stop signals have now (None outside every run and command)."""
        owner = getattr(signal.getsignal(signal.SIGINT), "__self__", None)
        return owner if isinstance(owner, StopSignals) else None

    def install(self) -> StopSignals:
        """Its handler for every stop signal (in the main thread); the ones it replaced are put back by __exit__."""
        self._old = _set_handlers(self.handle)
        return self

    __enter__ = install

    def handle(self, signum, frame) -> None:
        """The first raises; one that follows while its KeyboardInterrupt is on its way (`timeout` sends two) is only
        noted: raised, it could land in a finaliser the unwinding runs ("Exception ignored in" a tqdm bar's close)."""
        again, self.requested = self.requested, True
        if not (again or self.deferring or self.stopped):
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """A stop signal meanwhile waits for the end of the block, where it is raised. For file writes: torch.save
        calls back into Python to write, and a KeyboardInterrupt raised in that callback, with a second one in its
        clean-up (`timeout` sends SIGTERM twice), left its zip writer to be finished at teardown on a closed file,
        which aborted the process."""
        if self.deferring or threading.current_thread() is not threading.main_thread():
            yield  # nested: the outer block raises; signals only reach the main thread
            return
        before, self.deferring = self.requested, True
        try:
            yield
        finally:
            self.deferring = False
        arrived = self.requested and not before  # one from before is the training loop's to check
        if arrived and StopSignals.active() is self:
            raise KeyboardInterrupt

    def check(self) -> None:
        """Raise the KeyboardInterrupt of a signal whose first one was swallowed."""
        if self.requested:
            raise KeyboardInterrupt

    def __exit__(self, exc_type, *exc) -> bool:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old = {}
        if self.requested or (exc_type is not None and issubclass(exc_type, KeyboardInterrupt)):
            self.stopped = True
        outer = StopSignals.active()  # the command's or the search's: after a stop, it lets later signals go too
        if self.stopped and outer is not None:
            outer.stopped = True
        self.requested = False
        return False


@contextlib.contextmanager
def stops_deferred() -> Iterator[None]:
    """StopSignals.deferred of the active object (a plain block outside every run and command)."""
    stops = StopSignals.active()
    with stops.deferred() if stops is not None else contextlib.nullcontext():
        yield


@contextlib.contextmanager
def quiet(loggers: tuple[str, ...], level: int) -> Iterator[None]:
    """A library's progress kept out of our one-line-per-step log for the block: stdout swallowed, `loggers` raised
    to `level` (each set back after)."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
        for name in loggers:
            lg = logging.getLogger(name)
            stack.callback(lg.setLevel, lg.level)
            lg.setLevel(level)
        yield
