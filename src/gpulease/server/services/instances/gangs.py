"""Multi-node runs: a gang is N instances, one per node, that start all together or not at all.

Each member is an ordinary instance (its own GPUs, runner, billing segment and logs) that
carries its gang's id (rank 0's instance id), its rank and the gang's size. Only rank 0
stands in the scheduler's queue, asking for `size` nodes; when the policy places it, every
member takes its GPUs on its own node in one transaction (start_gang). The launcher gives
each member's runner the variables torchrun and SkyPilot expect (rank_env). Stopping,
starting or releasing any member does it to the whole gang (lifecycle.py): a start queues
rank 0 again for all the nodes, and each member goes back to its last node when it can.

With a job fabric (GPULEASE_FABRIC_CIDR, docs/ray.md) each member also gets an address in
that range when its gang is placed: its runner puts it on a macvlan in the instance's
network namespace (runner/netns.py), reachable from its gang's other ranks only, and the
rank variables name those addresses instead of the nodes'. An address is held until no
rank of its gang is live any more: a rank still running allows its ended peers' addresses,
so they must not go to another gang meanwhile.
"""

from __future__ import annotations

import ipaddress

from sqlalchemy import Select, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpulease.core.catalog import Catalog, parse_accelerators
from gpulease.core.errors import Conflict, InvalidInput
from gpulease.schemas.instances import InstanceCreate
from gpulease.schemas.runner import FabricLink
from gpulease.server.orm import Gpu, Instance, Run, User
from gpulease.server.services import ledger
from gpulease.server.services.billing import plans
from gpulease.server.services.instances import lifecycle, opening
from gpulease.server.services.instances.states import (
    ACTIVE,
    QUEUED,
    RUNNING,
    STARTING,
    STOPPING,
    switch_status,
)
from gpulease.server.settings import Settings

MAX_NODES = 64
# torchrun's rendezvous port on rank 0's node; per gang so that two gangs whose rank 0
# share a node do not collide.
MASTER_PORT_BASE, MASTER_PORT_SPAN = 29500, 10000
# The fabric interface's name in every rank's namespace; Gloo and NCCL are told to use it.
FABRIC_INTERFACE = "fabric0"
# A rank's fabric address stays taken while any rank of its gang is in one of these.
_HOLDS_FABRIC = (QUEUED, STARTING, RUNNING, STOPPING)


def fabric_range(settings: Settings) -> ipaddress.IPv4Network | None:
    """The job fabric's range, or None when there is none: unset, or jobs run unsandboxed
    (in the node's own network, where node addresses are what ranks reach)."""
    if settings.fabric_cidr is None or settings.unsandboxed_single_user:
        return None
    return ipaddress.IPv4Network(settings.fabric_cidr)


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
    fabric = fabric_range(settings)
    if fabric is not None and size > _capacity(fabric):
        raise InvalidInput(
            f"the job fabric {fabric} holds {_capacity(fabric)} ranks and this run has "
            f"{size}; ask for num_nodes: {_capacity(fabric)} or fewer"
        )
    lifecycle.check_enough_nodes(session, catalog.get(model).name, count, size)
    ranks: list[Instance] = []
    for rank in range(size):
        name = None if spec.name is None else (spec.name if rank == 0 else f"{spec.name}-{rank}")
        member = spec.model_copy(update={"name": name, "num_nodes": 1})
        ranks.append(
            opening.open_instance(session, owner, member, catalog=catalog, settings=settings)
        )
    session.flush()
    # each rank passed the wallet's check alone; the run starts all its ranks at once
    lifecycle.check_can_start(session, catalog, ranks[0], settings.min_start_minutes, ranks=size)
    for rank, instance in enumerate(ranks):
        instance.gang_id = ranks[0].id
        instance.gang_rank = rank
        instance.gang_size = size
        if rank and not instance.status_message:
            instance.status_message = lifecycle.waiting_with_leader(ranks[0])
    session.flush()
    return ranks


members = lifecycle.gang_members  # the gang's instances in rank order


def start_gang(
    session: Session,
    leader_id: int,
    node_ids: tuple[int, ...],
    free_ids: dict[tuple[int, str], list[int]],
    fabric: ipaddress.IPv4Network | None = None,
) -> int:
    """Place the gang of queued rank 0 `leader_id` on `node_ids` (one per rank, distinct):
    each member takes its GPUs there (and an address of `fabric` when given) and starts,
    all in one nested transaction, or none does. A member goes back to the node it last
    ran on when that node is one of them (its workspace is there). `free_ids` is the free
    GPU ids per (node, model); those taken leave it. Returns how many instances started."""
    gang = members(session, leader_id)
    if len(gang) != len(node_ids) or len(set(node_ids)) != len(node_ids):
        return 0
    node_ids = _homes_first(gang, node_ids)
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
    addresses: list[str | None] = [None] * len(gang)
    if fabric is not None:
        free = free_fabric_addresses(session, fabric, len(gang))
        if len(free) < len(gang):
            leader.status_message = (
                f"waiting: the job fabric {fabric} has {_capacity(fabric)} addresses and "
                f"{_capacity(fabric) - len(free)} are held by live multi-node runs; it "
                "starts when one ends (or ask the operator for a wider GPULEASE_FABRIC_CIDR)"
            )
            return 0
        addresses = list(free)
    try:
        placed = _take(session, gang, node_ids, picks, addresses)
    except IntegrityError:  # another replica gave one of the addresses meanwhile
        return 0
    if not placed:
        return 0
    for member, node_id, gpu_ids in zip(gang, node_ids, picks, strict=True):
        ids = free_ids[(node_id, member.gpu_model)]
        del ids[: len(gpu_ids)]
    return len(gang)


def _homes_first(gang: list[Instance], node_ids: tuple[int, ...]) -> tuple[int, ...]:
    """node_ids in rank order: each rank on its last node where that is one of them, the
    other ranks on the rest in the policy's order (each has the GPUs: the ranks are alike)."""
    homes: list[int | None] = []
    for member in gang:
        home = member.last_node_id
        homes.append(home if home in node_ids and home not in homes else None)
    rest = [n for n in node_ids if n not in homes]
    return tuple(rest.pop(0) if home is None else home for home in homes)


def _take(
    session: Session,
    gang: list[Instance],
    node_ids: tuple[int, ...],
    picks: list[list[int]],
    addresses: list[str | None],
) -> bool:
    """Every member takes its GPUs and address and starts, in one nested transaction; False
    (and nothing changed) when another replica took one of the GPUs first, or a member was
    stopped or released since the tick read it."""
    with session.begin_nested() as nested:
        for member, node_id, gpu_ids, address in zip(gang, node_ids, picks, addresses, strict=True):
            taken = session.execute(
                update(Gpu)
                .where(Gpu.id.in_(gpu_ids), Gpu.instance_id.is_(None))
                .values(instance_id=member.id)
                .execution_options(synchronize_session=False)
            ).rowcount  # type: ignore[attr-defined]
            if taken != len(gpu_ids):
                nested.rollback()  # another replica took one of them; next tick
                return False
            member.node_id = node_id
            member.fabric_address = address
            try:
                switch_status(session, member, STARTING, "")
            except Conflict:  # a rank was stopped or released since the tick read it
                nested.rollback()
                return False
        session.flush()  # a fabric address given twice fails here, inside the savepoint
    return True


def _capacity(fabric: ipaddress.IPv4Network) -> int:
    return fabric.num_addresses - 2  # neither the network's address nor its broadcast


def free_fabric_addresses(
    session: Session, fabric: ipaddress.IPv4Network, wanted: int
) -> list[str]:
    """Up to `wanted` addresses of fabric that nobody holds, lowest first. First every
    address whose gang has no live rank any more is given back."""
    holding = select(Instance.gang_id).where(
        Instance.gang_id.is_not(None), Instance.status.in_(_HOLDS_FABRIC)
    )
    session.execute(
        update(Instance)
        .where(
            Instance.fabric_address.is_not(None),
            (Instance.gang_id.is_(None)) | Instance.gang_id.not_in(holding),
        )
        .values(fabric_address=None)
        .execution_options(synchronize_session="fetch")
    )
    held = set(
        session.scalars(select(Instance.fabric_address).where(Instance.fabric_address.is_not(None)))
    )
    free: list[str] = []
    for host in fabric.hosts():
        if len(free) == wanted:
            break
        if str(host) not in held:
            free.append(str(host))
    return free


# A member still taking part in its run (asked to run, not yet to stop): stop_broken stops
# these once their gang is broken.
_LIVE_MEMBER = (Instance.gang_id.is_not(None), Instance.status.in_(ACTIVE))


def live_member_ids() -> Select[int]:
    """The members of multi-node runs that are queued, starting or running (those of the
    gangs stop_broken looks at): asked whether there is any before it runs."""
    return select(Instance.id).where(*_LIVE_MEMBER)


def stop_broken(session: Session) -> int:
    """A gang runs together or not at all: once a member has ended other than by its run
    succeeding (its run failed, its runner or node died, it was stopped), the members still
    queued, starting or running are stopped, with the reason. Returns how many."""
    stopped = 0
    for gang_id in session.scalars(select(Instance.gang_id).where(*_LIVE_MEMBER).distinct()).all():
        assert gang_id is not None
        gang = members(session, gang_id)
        broken = next(
            (m for m in gang if m.status not in ACTIVE and not _succeeded(session, m)), None
        )
        if broken is None:
            continue
        why = broken.status_reason or broken.status
        for member in gang:
            if member.status in ACTIVE:
                lifecycle.stop_one(
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
    NODE_RANK, WORLD_SIZE, NNODES, SKYPILOT_*); {} for a one-node instance. The addresses
    are the ranks' fabric addresses when the gang has them (with GLOO_SOCKET_IFNAME and
    NCCL_SOCKET_IFNAME naming the fabric interface), else what the backend reports as each
    node's host (on Ray its IP address)."""
    if instance.gang_id is None or instance.gang_rank is None:
        return {}
    gang = members(session, instance.gang_id)
    fabric = _on_fabric(gang)
    if fabric:
        addresses = [m.fabric_address or "" for m in gang]
    else:
        addresses = [m.node.hostname if m.node is not None else "" for m in gang]
    size = str(len(gang))
    env = {
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
    if fabric:  # Gloo and NCCL announce the address of this interface, not slirp's
        env["GLOO_SOCKET_IFNAME"] = env["NCCL_SOCKET_IFNAME"] = FABRIC_INTERFACE
    return env


def _on_fabric(gang: list[Instance]) -> bool:
    return bool(gang) and all(m.fabric_address is not None for m in gang)


def fabric_link(session: Session, instance: Instance, settings: Settings) -> FabricLink | None:
    """What the rank's runner puts on the fabric: its address and its peers'; None for an
    instance without one (a one-node instance, or no fabric)."""
    if instance.gang_id is None or instance.fabric_address is None:
        return None
    gang = members(session, instance.gang_id)
    if not _on_fabric(gang):
        return None
    fabric = fabric_range(settings)
    prefix = fabric.prefixlen if fabric is not None else 32
    return FabricLink(
        address=f"{instance.fabric_address}/{prefix}",
        peers=tuple(str(m.fabric_address) for m in gang if m.id != instance.id),
        interface=FABRIC_INTERFACE,
    )
