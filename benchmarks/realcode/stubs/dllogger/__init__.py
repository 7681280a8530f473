"""Stand-in for NVIDIA's dllogger, used only by benchmarks/realcode.py's import probe.

dllogger is installed from its own repository, not from a package registry, so this machine has
none; NVIDIA's example projects import it at start-up only to log metrics. Every call here
accepts its arguments and writes nothing; a probe result that loaded it is labelled
"stub: dllogger".
"""

import enum


class Verbosity(enum.IntEnum):
    OFF = -1
    DEFAULT = 0
    VERBOSE = 1


class Backend:
    """Accepts a backend's settings; logs nothing."""

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs


class StdOutBackend(Backend):
    pass


class JSONStreamBackend(Backend):
    pass


class Logger:
    def __init__(self, backends=()):
        self.backends = list(backends)

    def log(self, step, data, verbosity=Verbosity.DEFAULT):
        pass

    def metadata(self, metric, metadata):
        pass

    def flush(self):
        pass


_logger = Logger()


def init(backends=()):
    global _logger
    _logger = Logger(backends)


def log(step, data, verbosity=Verbosity.DEFAULT):
    _logger.log(step, data, verbosity)


def metadata(metric, metadata):
    _logger.metadata(metric, metadata)


def flush():
    _logger.flush()
