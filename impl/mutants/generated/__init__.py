"""Generated mutants of the bundled PostgreSQL machines.

`sql` rewrites one site of one statement; `catalogue` applies it to every
named statement (`SQL_*`) each machine runs, and builds the mutant classes
and adapters.
"""
