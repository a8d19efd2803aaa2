"""`thinkrl config`: the config a `thinkrl train` with the same arguments would run with, before it runs, and the
checks of the arguments the two commands share (command.py)."""
