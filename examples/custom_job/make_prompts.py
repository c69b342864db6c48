"""Regenerate prompts.jsonl: 256 digit strings (2 to 6 digits) with their largest digit."""

import json
import random
from pathlib import Path

rng = random.Random(21)
with (Path(__file__).parent / "prompts.jsonl").open("w") as f:
    for _ in range(256):
        s = "".join(rng.choice("0123456789") for _ in range(rng.randint(2, 6)))
        f.write(json.dumps({"prompt": s, "answer": max(map(int, s))}) + "\n")
