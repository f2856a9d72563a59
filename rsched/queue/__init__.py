"""A queue: the task model, specs (validated before any I/O), a queue and its
partitions, and the operations on them."""
