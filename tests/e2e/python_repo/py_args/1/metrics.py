"""A module of the model's own whose name tritium's pb_utils has a module of too: the model's wins."""

OWNER = "py_args"
