"""Multi-node runs: a gang is N instances, one per node, that start all together or not at all.

Each member is an ordinary instance (its own GPUs, runner, billing segment and logs) that
carries its gang's id (rank 0's instance id), its rank and the gang's size. Only rank 0
stands in the scheduler's queue, asking for `size` nodes; when the policy places it, every
member takes its GPUs on its own node in one transaction (start_gang). The launcher gives
each member's runner the variables torchrun and SkyPilot expect (rank_env).
"""

from __future__ import annotations

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from gpulease.core.catalog import Catalog, parse_accelerators
from gpulease.core.errors import InvalidInput, Unavailable
from gpulease.schemas.instances import InstanceCreate
from gpulease.server.orm import Gpu, Instance, Node, Run, User
from gpulease.server.services import ledger
from gpulease.server.services.billing import plans
from gpulease.server.services.instances import lifecycle, opening
from gpulease.server.services.instances.states import QUEUED, RUNNING, STARTING, switch_status
from gpulease.server.settings import Settings

MAX_NODES = 64
# torchrun's rendezvous port on rank 0's node; per gang so that two gangs whose rank 0
# share a node do not collide.
MASTER_PORT_BASE, MASTER_PORT_SPAN = 29500, 10000


def open_gang(
    session: Session, owner: User, spec: InstanceCreate, *, catalog: Catalog, settings: Settings
) -> list[Instance]:
    """Create `spec.num_nodes` instances as one gang, all or nothing; rank 0 first. The
    members are named NAME, NAME-1, ... when spec names the gang."""
    size = spec.num_nodes
    if not 2 <= size <= MAX_NODES:
        raise InvalidInput(f"num_nodes must be from 1 to {MAX_NODES}")
    if spec.plan != plans.ON_DEMAND:  # a preempted or prepaid rank would leave its gang
        raise InvalidInput(f"a multi-node run takes the on_demand plan, not {spec.plan}")
    model, count = parse_accelerators(spec.gpu)
    if count < 1:
        raise InvalidInput("a multi-node run needs GPUs on each node; set accelerators")
    _check_enough_nodes(session, catalog.get(model).name, count, size)
    members: list[Instance] = []
    for rank in range(size):
        name = None if spec.name is None else (spec.name if rank == 0 else f"{spec.name}-{rank}")
        member = spec.model_copy(update={"name": name, "num_nodes": 1})
        members.append(
            opening.open_instance(session, owner, member, catalog=catalog, settings=settings)
        )
    session.flush()
    for rank, instance in enumerate(members):
        instance.gang_id = members[0].id
        instance.gang_rank = rank
        instance.gang_size = size
    session.flush()
    return members


def _check_enough_nodes(session: Session, model: str, count: int, size: int) -> None:
    per_node = (
        select(Gpu.node_id)
        .join(Node, Node.id == Gpu.node_id)
        .where(Gpu.model == model, Gpu.present.is_(True), Node.status == "ready")
        .group_by(Gpu.node_id)
        .having(func.count(Gpu.id) >= count)
        .subquery()
    )
    having = session.scalar(select(func.count()).select_from(per_node)) or 0
    if having < size:
        raise Unavailable(
            f"{size} nodes with {model} × {count} each are needed and {having} "
            f"{'has' if having == 1 else 'have'} that many; ask for num_nodes: {having} or "
            "fewer GPUs per node"
        )


def members(session: Session, gang_id: int) -> list[Instance]:
    """The gang's instances in rank order."""
    return list(
        session.scalars(
            select(Instance).where(Instance.gang_id == gang_id).order_by(Instance.gang_rank)
        )
    )


def start_gang(
    session: Session,
    leader_id: int,
    node_ids: tuple[int, ...],
    free_ids: dict[tuple[int, str], list[int]],
) -> int:
    """Place the gang of queued rank 0 `leader_id` on `node_ids` (one per rank, distinct):
    each member takes its GPUs there and starts, all in one nested transaction, or none
    does. `free_ids` is the free GPU ids per (node, model); those taken leave it.
    Returns how many instances started."""
    gang = members(session, leader_id)
    if len(gang) != len(node_ids) or len(set(node_ids)) != len(node_ids):
        return 0
    if any(m.status != QUEUED for m in gang):
        return 0
    leader = gang[0]
    if ledger.balance(session, leader.owner_id, leader.team_id) <= 0:
        leader.status_message = "waiting: the wallet's balance is zero; add credit"
        return 0
    picks: list[list[int]] = []
    for member, node_id in zip(gang, node_ids, strict=True):
        ids = free_ids.get((node_id, member.gpu_model), [])
        if len(ids) < member.gpu_count:
            return 0
        picks.append(ids[: member.gpu_count])
    with session.begin_nested() as nested:
        for member, node_id, gpu_ids in zip(gang, node_ids, picks, strict=True):
            taken = session.execute(
                update(Gpu)
                .where(Gpu.id.in_(gpu_ids), Gpu.instance_id.is_(None))
                .values(instance_id=member.id)
                .execution_options(synchronize_session=False)
            ).rowcount  # type: ignore[attr-defined]
            if taken != len(gpu_ids):
                nested.rollback()  # another replica took one of them; next tick
                return 0
            member.node_id = node_id
            switch_status(session, member, STARTING, "")
    for member, node_id, gpu_ids in zip(gang, node_ids, picks, strict=True):
        ids = free_ids[(node_id, member.gpu_model)]
        del ids[: len(gpu_ids)]
    return len(gang)


def stop_broken(session: Session) -> int:
    """A gang runs together or not at all: once a member has ended other than by its run
    succeeding (its run failed, its runner or node died, it was stopped), the members still
    queued, starting or running are stopped, with the reason. Returns how many."""
    live = (QUEUED, STARTING, RUNNING)
    stopped = 0
    for gang_id in session.scalars(
        select(Instance.gang_id)
        .where(Instance.gang_id.is_not(None), Instance.status.in_(live))
        .distinct()
    ).all():
        assert gang_id is not None
        gang = members(session, gang_id)
        broken = next(
            (m for m in gang if m.status not in live and not _succeeded(session, m)), None
        )
        if broken is None:
            continue
        why = broken.status_reason or broken.status
        for member in gang:
            if member.status in live:
                lifecycle.stop_instance(
                    session, member, f"rank {broken.gang_rank} of its run ended: {why}"[:500]
                )
                stopped += 1
    return stopped


def _succeeded(session: Session, instance: Instance) -> bool:
    last = session.scalar(
        select(Run.status).where(Run.instance_id == instance.id).order_by(Run.id.desc()).limit(1)
    )
    return last == "succeeded"


def rank_env(session: Session, instance: Instance) -> dict[str, str]:
    """The variables torchrun and SkyPilot read in each rank of a multi-node run (MASTER_*,
    NODE_RANK, WORLD_SIZE, NNODES, SKYPILOT_*); {} for a one-node instance. Node addresses
    are what the backend reports as each node's host (on Ray its IP address)."""
    if instance.gang_id is None or instance.gang_rank is None:
        return {}
    gang = members(session, instance.gang_id)
    addresses = [m.node.hostname if m.node is not None else "" for m in gang]
    size = str(len(gang))
    return {
        "MASTER_ADDR": addresses[0],
        "MASTER_PORT": str(MASTER_PORT_BASE + instance.gang_id % MASTER_PORT_SPAN),
        "NODE_RANK": str(instance.gang_rank),
        "WORLD_SIZE": size,
        "NNODES": size,
        "SKYPILOT_NODE_RANK": str(instance.gang_rank),
        "SKYPILOT_NODE_IPS": "\n".join(addresses),
        "SKYPILOT_NUM_NODES": size,
        "SKYPILOT_NUM_GPUS_PER_NODE": str(instance.gpu_count),
        "SKYPILOT_TASK_ID": f"gpulease-gang-{instance.gang_id}",
    }
