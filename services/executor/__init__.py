"""The executor: claims queued attempts, runs their runner, records the outcome."""
