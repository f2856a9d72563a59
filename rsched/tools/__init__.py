"""Operator tools on top of the library: doctor, metrics, history, top, bench,
demo, the embedded server. Not the engine: nothing in the engine imports these."""
