"""One module per rule, named `td<code>_<name>.py`; discovered automatically."""
