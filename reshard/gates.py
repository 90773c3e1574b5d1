"""The transition gates: importing this module registers every job's facts provider.

``ControlStore.facts`` imports it before evaluating a transition, so a gate applies
whichever entry point (CLI, tests, library) asks for the transition. Each data job
registers its provider in its own module (``reshard.backfill.backfill_facts``);
verify and cleanup add theirs here with one import line.
"""

from . import backfill  # noqa: F401  (registers backfill_facts)
