"""The `reach` command line.

Its modules do not use `from __future__ import annotations`: typer reads every command's
annotations at each start, and string annotations are compiled one by one there (about 100 ms
of CPU for every `reach` command and every dispatcher started).
"""
