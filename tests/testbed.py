"""The weave-testbed topology and a candidate builder over its jobs: shared by the tests of the
plan's halves and of regrouping (tests/ is on sys.path under pytest).

Prices on weave-testbed: a training node (8 H800) is 42.24 $/h, a rollout node (8 H20) 14.80 $/h.
"""

from weave_rl.planner.model import PlanningModel
from weave_rl.planner.optimal import CandidateBuilder, _admissible
from weave_rl.topology.topology import load_topology

TESTBED = load_topology("weave-testbed")
TRAIN_NODE, ROLLOUT_NODE = 8 * 5.28, 8 * 1.85


def builder_for(jobs, k=5):
    model = PlanningModel(TESTBED, jobs)
    _, ids = _admissible(model)
    return model, CandidateBuilder(model, ids, k)
