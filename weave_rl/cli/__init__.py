"""The ``weave`` command: parse, call one library function, render. ``app`` holds the Typer app;
no library module imports this package."""
