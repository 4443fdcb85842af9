"""Statements sent on every job made short enough for psycopg to convert them once."""

import re


def compact(text: str) -> str:
    """``text`` without its ``--`` comments and runs of blanks (for a statement with no
    ``--`` and no run of blanks inside a literal). psycopg converts a query of at most
    4,096 bytes once (``MAX_CACHED_STATEMENT_LENGTH``) and a longer one on every run: with
    its comments the claim is 7,100 bytes, and its conversion (a regex split of the
    text) cost some 5 % of a worker's CPU in the W1 drain; FINISH, 4,400 bytes, cost
    more (yappi, W1: a fifth of a worker's CPU in psycopg's _query2pg_nocache)."""
    return re.sub(r"\s+", " ", re.sub(r"--[^\n]*", "", text)).strip()
