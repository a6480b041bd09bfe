"""The Ray runtime's parts (the runtime itself: runtime/ray_runtime.py; docs/ray.md).

    placement.py    plan_placement (pure) and the placement group of train and engine bundles
    session.py      start_ray: attach to a cluster or start a local Ray, with the worker env
    train_group.py  TrainGroup: N TrainWorker actors, a gloo group, the trainer data-parallel
    engines.py      EngineGroup: M EngineWorker actors, each holding an HTTP engine server process
    health.py       HealthMonitor: polls the engines, restarts dead ones (use_fault_tolerance)
"""
