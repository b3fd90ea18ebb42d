"""A process running the meter is SIGKILLed in the middle of billing ticks, again and again;
after a restart the ledger matches the segments exactly: nothing lost, nothing repeated."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import textwrap
import time
from datetime import timedelta

from sqlalchemy import func, select

from gpulease.server.db import transaction, utcnow
from gpulease.server.orm import Instance, LedgerEntry, LedgerTransaction, UsageSegment
from gpulease.server.runtime import Runtime
from gpulease.server.services import metering, users

SEGMENTS = 200

METER = textwrap.dedent(
    """
    import sys, time
    from gpulease.server.db import make_engine, make_sessionmaker, transaction
    from gpulease.server.services import metering
    sessions = make_sessionmaker(make_engine(sys.argv[1]))
    print("ready", flush=True)
    while True:
        with transaction(sessions) as session:
            metering.charge_open_segments(session)
    """
)


def _open_segments(rt: Runtime) -> None:
    now = utcnow()
    with transaction(rt.sessions) as session:
        owner = users.create_user(session, "crashy", "password-123", signup_credit_micro=10**12)
        for i in range(SEGMENTS):
            instance = Instance(
                owner_id=owner.id,
                name=f"c{i}",
                gpu_model="T4",
                gpu_count=1 + i % 4,
                template="python",
                hourly_micro=250_000 * (1 + i % 4),
                status="running",
                desired_state="running",
                created_at=now,
                updated_at=now,
            )
            session.add(instance)
            session.flush()
            metering.open_segment(session, instance, now - timedelta(seconds=3600 + i * 37.3))


def test_killing_the_meter_mid_tick_loses_and_repeats_nothing(rt: Runtime) -> None:
    _open_segments(rt)
    url = rt.engine.url.render_as_string(hide_password=False)
    rng = random.Random(7)
    for _ in range(4):
        proc = subprocess.Popen(
            [sys.executable, "-c", METER, url],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(1.0, 2.5))  # ticks are running: a tick over 200 segments is long
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()
        proc.stderr.close()
    # restart: one clean tick brings every segment up to date
    with transaction(rt.sessions) as session:
        metering.charge_open_segments(session)
    with transaction(rt.sessions) as session:
        segments = session.scalars(select(UsageSegment)).all()
        assert len(segments) == SEGMENTS
        for seg in segments:
            posted = -session.scalar(
                select(func.coalesce(func.sum(LedgerEntry.amount), 0))
                .join(LedgerTransaction, LedgerTransaction.id == LedgerEntry.transaction_id)
                .where(LedgerTransaction.instance_id == seg.instance_id, LedgerEntry.amount < 0)
            )
            assert seg.billed_seconds >= 3600
            assert posted == seg.charged_micro == metering.segment_price(seg, seg.billed_seconds)
        unbalanced = session.execute(
            select(LedgerEntry.transaction_id)
            .group_by(LedgerEntry.transaction_id)
            .having(func.sum(LedgerEntry.amount) != 0)
        ).all()
        assert unbalanced == []
