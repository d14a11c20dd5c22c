"""The recovery service: re-drives every run from Postgres, whatever crashed."""
