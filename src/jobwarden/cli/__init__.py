"""The command-line frontend: parse, call control, render."""
