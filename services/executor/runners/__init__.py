"""Runners by name. A run's `runner` field picks one."""

from services.executor.runners.base import AttemptContext, Runner, RunnerError
from services.executor.runners.scripted import scripted

RUNNERS: dict[str, Runner] = {"scripted": scripted}

__all__ = ["RUNNERS", "AttemptContext", "Runner", "RunnerError"]
