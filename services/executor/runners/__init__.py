"""Runners by name. A run's `runner` field picks one."""

from runwire.executor.runners.base import AttemptContext, Runner, RunnerError
from runwire.executor.runners.scripted import scripted

RUNNERS: dict[str, Runner] = {"scripted": scripted}

__all__ = ["RUNNERS", "AttemptContext", "Runner", "RunnerError"]
