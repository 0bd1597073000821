"""The plan of an :func:`~imagenet_cog.evaluate` run on several GPUs, on one machine or more
(``evaluate --plan --nodes N --gpus-per-node G``).

The run's memory plan is made for ``N x G`` processes, as torchrun or srun would start them:
each process trains its own lockstep units, one after the other, and reads the stores of
their domains only. Each process's time is predicted from the steps measured on this
machine's device (:func:`~imagenet_cog._protocol.plan.predict` on its units alone: it compiles
its own shapes), its memory is the most its units hold at once, and the run's wall time is
its slowest process's.
"""

from __future__ import annotations

import dataclasses

from .plan import EvaluatePlan, _duration, predict

__all__ = ["ClusterPlan", "cluster_lines", "plan_processes"]


@dataclasses.dataclass
class ClusterPlan(EvaluatePlan):
    """An :class:`~imagenet_cog._protocol.plan.EvaluatePlan` of a run of several processes,
    made by :func:`~imagenet_cog.plan_evaluate` with ``nodes`` or ``gpus_per_node``.

    Attributes
    ----------
    cluster : dict
        :func:`plan_processes`: each process's units, memory and predicted time, and the
        run's wall time; its table follows the plan's.
    """

    cluster: dict = dataclasses.field(default_factory=dict)

    def table(self):
        """The plan, then each process's share and the wall time, as text."""
        return "\n".join([super().table(), "", *cluster_lines(self.cluster, self.device)])


def plan_processes(units, work, rates, store_bytes, protocol, nodes, gpus_per_node):
    """Per process of ``nodes x gpus_per_node``: its units, cells, memory and predicted time.

    ``units`` are the memory plan's (each with its rank), ``work`` their
    :func:`~imagenet_cog._protocol.plan.count_work`, ``store_bytes`` ``{domain: bytes}`` of
    the domains' stores.

    Returns
    -------
    dict
        ``{"nodes", "gpus_per_node", "processes": [{"rank", "node", "units", "cells",
        "device_gb", "host_gb", "bytes_to_read", "seconds"}], "wall_s", "gpu_hours",
        "slowest"}``.
    """
    world = nodes * gpus_per_node
    processes = []
    for rank in range(world):
        mine = [w for u, w in zip(units, work) if u.rank == rank]
        domains = {d for w in mine for d, _ in w["cells"]}
        to_read = sum(store_bytes.get(d, 0) for d in domains)
        # predict() writes each unit's seconds into it: the same numbers as the whole run's.
        seconds = predict(mine, rates, to_read, protocol) if mine else {"total": 0.0}
        processes.append(
            {
                "rank": rank,
                "node": rank // gpus_per_node,
                "units": len(mine),
                "cells": sum(len(w["cells"]) for w in mine),
                "device_gb": max((w["device_gb"] for w in mine), default=0.0),
                "host_gb": max((w["host_gb"] for w in mine), default=0.0),
                "bytes_to_read": to_read,
                "seconds": seconds["total"],
            }
        )
    slowest = max(processes, key=lambda p: p["seconds"])
    return {
        "nodes": nodes,
        "gpus_per_node": gpus_per_node,
        "processes": processes,
        "wall_s": slowest["seconds"],
        "gpu_hours": round(sum(p["seconds"] for p in processes) / 3600, 3),
        "slowest": slowest["rank"],
    }


def cluster_lines(cluster, device):
    """The per-process plan as lines of the plan's table."""
    nodes, gpus = cluster["nodes"], cluster["gpus_per_node"]
    world = nodes * gpus
    head = (
        f"On {nodes} node(s) x {gpus} GPU(s) ({world} processes, each with a device like "
        f"{device} here, where the step was measured):"
    )
    columns = (
        f"{'rank':>4}  {'node':>4}  {'units':>5}  {'cells':>5}  {'device GB':>9}  "
        f"{'host GB':>7}  {'reads GB':>8}  {'predicted':>10}"
    )
    lines = [head, columns]
    for p in cluster["processes"]:
        lines.append(
            f"{p['rank']:>4}  {p['node']:>4}  {p['units']:>5}  {p['cells']:>5}  "
            f"{p['device_gb']:>9.1f}  {p['host_gb']:>7.1f}  {p['bytes_to_read'] / 1e9:>8.2f}  "
            f"{_duration(p['seconds']):>10}"
        )
    idle = sum(p["units"] == 0 for p in cluster["processes"])
    lines.append(
        f"wall time: about {_duration(cluster['wall_s'])} (its slowest process, rank "
        f"{cluster['slowest']}); {cluster['gpu_hours']:.2f} GPU-hours in all"
        + (f"; {idle} process(es) with no cell to train" if idle else "")
    )
    return lines
