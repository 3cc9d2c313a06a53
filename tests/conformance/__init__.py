"""Conformance suites: one module per seam (GPU control, target, store, strategy), each run by
every implementation of that seam, in the manner of Optuna's storage tests (one parametrised
fixture over the backends, one set of behavioural tests they must all pass).

A package so that its module names (`conformance.test_store`) do not collide with the unit
tests of the same seam beside it (`tests/test_store.py`)."""
