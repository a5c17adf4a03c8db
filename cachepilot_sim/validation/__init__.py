"""Validation against real serving engines: ground-truth folders, their metrics and converters."""
