"""Evaluation: the method of verify → measure. Inputs, the float64 reference and tolerances (``_verify``); the
timing method (``_measure``), timing as consumers call (``_consumer``) and racing (``_race``); the isolated
workers that run variants (``_worker``). The worker entry points that apply them to one variant are
``kernsearch.variants``."""
