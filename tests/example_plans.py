"""The committed example plans (``plans/``) and the inputs each was planned from: shared by the tests
that check them and the ones that simulate them."""

from pathlib import Path

PLANS = Path(__file__).resolve().parent.parent / "plans"
INPUTS = PLANS / "inputs"
EXAMPLES = {  # plan file -> (topology file or preset, jobs file)
    "micro-a.yaml": (INPUTS / "micro-a.topology.yaml", INPUTS / "micro-a.jobs.yaml"),
    "micro-b.yaml": (INPUTS / "micro-b.topology.yaml", INPUTS / "micro-b.jobs.yaml"),
    "micro-c.yaml": (INPUTS / "micro-c.topology.yaml", INPUTS / "micro-c.jobs.yaml"),
    "seed-a100-32.yaml": ("a100-32", INPUTS / "seed.jobs.yaml"),
    "mixed-20.yaml": ("weave-testbed", INPUTS / "mixed-20.jobs.yaml"),
    "spatial.yaml": (INPUTS / "spatial.topology.yaml", INPUTS / "spatial.jobs.yaml"),
}
