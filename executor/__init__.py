"""Executor: applies a Plan to workers (backends arrive with their issues)."""
