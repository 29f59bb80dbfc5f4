"""Evaluation: generate on a dataset, score with its reward, report accuracy and pass@k.

`rlfleet eval` runs it in-process on a model folder or checkpoint; the controller
runs the same code against the rollout and reward services every
`controller.eval_every` steps.
"""
