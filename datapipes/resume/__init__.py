"""The job state and the resume plan: one typed model of a Loader checkpoint, parsed once.

- :mod:`~datapipes.resume.model`: frozen records (:class:`JobSetup`,
  :class:`RankEntry`, :class:`DispatchRecord`, :class:`Plans`, :class:`Drops`,
  :class:`Remaining`, :class:`JobState`);
- :mod:`~datapipes.resume.schema` and :mod:`~datapipes.resume.parse`: a raw
  state checked (shapes, then fields against each other) and parsed, once;
- :mod:`~datapipes.resume.records`: states written out (the layout is there);
- :mod:`~datapipes.resume.graph_record`: the graph record a state carries, and raw
  states read for display;
- :mod:`~datapipes.resume.merge`: ranks' states merged into one, a state
  checked against the recipe;
- :mod:`~datapipes.resume.remaining`: what an epoch still owes, a taken-over
  rank's claimed work;
- :mod:`~datapipes.resume.plan`: (recipe, parsed state, new setup, listings)
  -> :class:`ResumePlan`, which the Loader carries out.

This package imports neither the Loader nor the takeover code.

May import: nodes, datapipes.pipe, datapipes.placement, datapipes.steps.
"""

from datapipes.resume.merge import merge_states
from datapipes.resume.model import (
    DispatchRecord,
    Drops,
    JobSetup,
    JobState,
    Plans,
    RankEntry,
    Remaining,
)
from datapipes.resume.parse import STATE_VERSION, parse_state
from datapipes.resume.plan import ResumePlan, resume_plan
from datapipes.resume.records import job_state, rank_state
from datapipes.resume.remaining import claimed_work, remaining_work

__all__ = [
    "STATE_VERSION",
    "DispatchRecord",
    "Drops",
    "JobSetup",
    "JobState",
    "Plans",
    "RankEntry",
    "Remaining",
    "ResumePlan",
    "claimed_work",
    "job_state",
    "merge_states",
    "parse_state",
    "rank_state",
    "remaining_work",
    "resume_plan",
]
