"""The transition gates: importing this module registers every job's facts provider.

``ControlStore.facts`` imports it before evaluating a transition, so a gate applies
whichever entry point (CLI, tests, library) asks for the transition. Each data job
registers its provider in its own module (``reshard.jobs.backfill.backfill_facts``);
verify and cleanup register theirs the same way.
"""

from reshard.jobs import backfill  # noqa: F401  (registers backfill_facts)
from reshard.jobs import cleanup  # noqa: F401  (registers cleanup_facts)
from reshard.jobs import verify  # noqa: F401  (registers verify_facts)
