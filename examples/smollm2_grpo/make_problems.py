"""Regenerate problems.jsonl (512) and heldout.jsonl (128): word problems "who has more?" with a numeric answer.

Each prompt opens with one solved example, so that the instruct model SmolLM2-135M answers with a
number from the start; whether it names the larger one is what GRPO has to teach it (the untrained
model picks one of the two numbers about half the time). Answers are checked by the built-in
``numeric`` reward (the last number of the response equals the answer).
"""

import json
import random
from pathlib import Path

NAMES = ["Tom", "Ana", "Li", "Sam", "Mia", "Raj", "Eva", "Ben", "Zoe", "Kai"]
ITEMS = ["apples", "books", "coins", "pens", "cards", "shells", "stamps", "marbles"]
EXAMPLE = "Ana has 3 pens, Ben has 8. Most: 8\n"


def write(name: str, rows: int, seed: int) -> None:
    rng = random.Random(seed)
    with (Path(__file__).parent / name).open("w") as f:
        for _ in range(rows):
            (x, y), item, (a, b) = rng.sample(NAMES, 2), rng.choice(ITEMS), rng.sample(range(1, 21), 2)
            prompt = f"{EXAMPLE}{x} has {a} {item}, {y} has {b}. Most:"
            f.write(json.dumps({"prompt": prompt, "answer": max(a, b)}) + "\n")


write("problems.jsonl", 512, seed=21)  # what the job trains on
write("heldout.jsonl", 128, seed=22)   # what its policy is evaluated on (greedy answers)
