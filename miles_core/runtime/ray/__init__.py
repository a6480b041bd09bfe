"""The Ray placement's parts (the placement itself: cluster.py; docs/ray.md).

    cluster.py      build_ray: placement group, train group, engine actors, the HTTPFleet over them
    placement.py    plan_placement (pure) and the placement group of train and engine bundles
    session.py      start_ray: attach to a cluster or start a local Ray, with the worker env
    train_group.py  TrainGroup: N TrainWorker actors (one trainer rank each) as one Trainer
    engines.py      EngineGroup: M EngineWorker actors, each holding an HTTP engine server process
"""
