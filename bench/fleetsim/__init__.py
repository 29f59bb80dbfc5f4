"""The fleet simulator (issue 34): rollout replicas whose engine is a model of a GPU, a simulated
learner, the real reward service and the real controller, all over real gRPC. bench/fleet_sim.py
runs it; see the package's modules for the parts."""
