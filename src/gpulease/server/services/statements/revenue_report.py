"""The operator's revenue: the revenue account's entries and GPU time sold, per model per day."""

from __future__ import annotations

from datetime import date

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpulease.core.catalog import Catalog
from gpulease.core.money import format_credits
from gpulease.core.periods import Period, split_by_day
from gpulease.schemas.statements import (
    RevenueDay,
    RevenueLine,
    RevenueModel,
    RevenueModelDay,
    RevenuePublic,
    RevenueTotals,
)
from gpulease.server.orm import Instance, LedgerAccount, LedgerEntry, LedgerTransaction
from gpulease.server.services import ledger
from gpulease.server.services.statements.segments import TIME_KIND, segments_in
from gpulease.server.services.statements.sums import Sum, grouped, total


def revenue(session: Session, period: Period, catalog: Catalog) -> RevenuePublic:
    """Revenue (the revenue account's entries) and GPU time sold, per GPU model per day."""
    symbol = catalog.currency_symbol
    lines: dict[tuple[date, str | None, str], Sum] = {}
    for s in segments_in(session, period, None):
        for day, seconds in split_by_day(period, s.started_at, s.billed_seconds).items():
            lines.setdefault((day, s.gpu_model, TIME_KIND), Sum()).time(seconds, s.gpu_count)
    rows = session.execute(
        select(
            LedgerTransaction.kind,
            LedgerTransaction.created_at,
            LedgerEntry.amount,
            Instance.gpu_model,
        )
        .join(LedgerEntry, LedgerEntry.transaction_id == LedgerTransaction.id)
        .join(LedgerAccount, LedgerAccount.id == LedgerEntry.account_id)
        .outerjoin(Instance, Instance.id == LedgerTransaction.instance_id)
        .where(
            LedgerAccount.kind == ledger.REVENUE,
            LedgerTransaction.created_at >= period.begins,
            LedgerTransaction.created_at < period.ends,
        )
    ).all()
    for kind, posted, amount, model in rows:
        lines.setdefault((period.day_of(posted), model, kind), Sum()).money(kind, int(amount))

    def order(key: tuple[date, str | None, str]) -> tuple[date, str, str]:
        return key[0], key[1] or "", key[2]

    ordered = sorted(lines.items(), key=lambda item: order(item[0]))
    by_day = grouped((key[0], part) for key, part in ordered)
    by_model = grouped((key[1], part) for key, part in ordered)
    by_model_day = grouped(((key[0], key[1]), part) for key, part in ordered)
    return RevenuePublic(
        start=period.start,
        end=period.end,
        tz=period.tz,
        currency=catalog.currency_name,
        currency_symbol=symbol,
        totals=RevenueTotals.model_validate(total(ordered).revenue(symbol)),
        by_gpu_model=[
            RevenueModel.model_validate({"gpu_model": model, **part.revenue(symbol)})
            for model, part in sorted(by_model.items(), key=lambda item: item[0] or "")
        ],
        by_day=[
            RevenueDay.model_validate({"day": day, **by_day.get(day, Sum()).revenue(symbol)})
            for day in period.days()
        ],
        by_model_day=[
            RevenueModelDay.model_validate({"day": day, "gpu_model": model, **part.revenue(symbol)})
            for (day, model), part in by_model_day.items()
        ],
        lines=[
            RevenueLine(
                day=day,
                gpu_model=model,
                kind=kind,
                gpu_seconds=part.gpu_seconds,
                revenue_micro=sum(part.by_kind.values()),
                revenue=format_credits(sum(part.by_kind.values()), symbol),
            )
            for (day, model, kind), part in ordered
        ],
    )
