"""The mutation score as a pytest run, for a distributed test runner.

Each (generated mutant, seed) of `leaseproof mutants --generated` is one
test of the search alone (stress, for a lock mutant): a non-equivalent mutant
must be killed, an equivalent one (impl/mutants/generated/equivalent.py) must not be. `leaseproof mutants
--generated` runs the same work on one machine's cores; when it outgrows one
machine, pytest-xdist spreads these tests over processes or hosts (execnet
gateways), each worker with its own server and databases:

    pip install '.[test]'
    python -m pytest -m mutation -n auto tests/conformance/evidence/test_generated_mutants.py
    python -m pytest -m mutation --dist load --tx 4*popen --tx ssh=ci-2//python=python3 ...

A single seeded search can miss a mutant another seed kills; the command's
score counts a mutant killed by any check, this run reports each check on its
own (a seed that missed a killable mutant is a failing test: a weakness of the
search to fix, or to see in the score).
"""

from __future__ import annotations

import pytest

from leaseproof.conformance.evidence import score as ms
from leaseproof.impl.mutants.generated.equivalent import EQUIVALENT

pytestmark = pytest.mark.mutation

PLAN = ms.plan()
# The search's power, seed by seed (the fixed scenarios are not the search).
TASKS = [task for task in PLAN.tasks if task.check != ms.SCENARIOS]


@pytest.mark.parametrize("task", TASKS, ids=lambda t: f"{t.mutant}:{t.check}:{t.seed}")
def test_each_check_kills_each_non_equivalent_generated_mutant(delivery_dsn: str, task: ms.Task) -> None:
    result = ms.run_task(task, delivery_dsn, PLAN.budget)
    if task.mutant in EQUIVALENT:
        assert not result.killed, f"claimed equivalent ({EQUIVALENT[task.mutant]}), but killed: {result.detail}"
    else:
        assert result.killed, f"survived {result.examples} {task.check} programs"
