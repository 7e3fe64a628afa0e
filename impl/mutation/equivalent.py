"""Generated mutants that no program can tell from the bundled implementation.

Each entry names a mutant (`impl/mutation/catalogue.py`) and says why it is
equivalent: which constraint, trigger, earlier statement or later check makes
the changed site unable to change any outcome or persisted field. The
mutation score leaves them out of its denominator, and reports an entry
here that a check kills as a false claim.
"""

from __future__ import annotations

EQUIVALENT: dict[str, str] = {}
