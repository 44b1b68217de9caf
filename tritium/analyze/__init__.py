"""``tritium analyze``: search a model's configuration space for the best setting under constraints."""
