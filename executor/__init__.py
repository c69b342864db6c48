"""Executor: applies a Plan through a backend (DESIGN section 5).

- ``backend``: the Protocol every backend implements and the values it exchanges with the controller;
- ``controller``: per-GPU FIFO queues in plan order, elastic rules, faults, plan switches, records;
- ``queues``: the plan's timetable unrolled into per-GPU queue order; ``config``: elastic rules;
- ``sim`` (+ ``events``): the discrete-event backend; ``run``: N iterations of a plan on it;
- ``trace``: arrivals and departures through an online planner; ``drift``: injection, detection,
  replanning; ``faults``: failure specs; ``outputs`` / ``plots``: records, metrics and pictures.
"""
