"""Runners: the interface an attempt sees (`base`), how a process finds its runners
(`registry`), and the runners that ship with runwire."""
