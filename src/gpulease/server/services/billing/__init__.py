"""Billing rules beyond the meter: plans, off-peak windows, vouchers, caps, teams, storage."""
