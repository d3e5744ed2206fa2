"""Surrogates that forecast a candidate's speedup before it is measured."""
