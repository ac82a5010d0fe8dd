"""Human-readable renderings of command results (the ``--json`` forms are the contract)."""

from __future__ import annotations

from typing import Any

TABLE_ROWS_SHOWN = 25


def _num(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def format_forecast(forecast: dict[str, Any]) -> list[str]:
    lines = [
        f"forecast ({forecast.get('status', 'ok')}), capacity {forecast.get('capacity_blocks')}"
        f" blocks x {forecast.get('instances')} instance(s), block size"
        f" {forecast.get('block_size')} tokens",
        f"  hit ratio (intent-aware)   {_num(forecast.get('hit_ratio'))}",
        f"  hit ratio (single class)   {_num(forecast.get('hit_ratio_single_class'))}",
        f"  upper bound                {_num(forecast.get('upper_bound'))}",
        f"  characteristic time        {_num(forecast.get('characteristic_time_s'), 1)} s",
        f"  arrival rate per instance  {_num(forecast.get('lambda_per_s'))} conversations/s",
        "  moments (blocks)           "
        f"A_R {_num(forecast.get('A_R'))}  A_H_hash {_num(forecast.get('A_H_hash'))}  "
        f"E_B {_num(forecast.get('E_B'))}  E_M {_num(forecast.get('E_M'))}",
    ]
    observed = forecast.get("observed_hit_ratio")
    if observed is not None:
        lines.append(f"  observed hit ratio         {_num(observed)}")
    return lines


def format_table(table: dict[str, Any]) -> list[str]:
    states, defaults = table["states"], table["defaults"]
    header = ("intent", "turn", "p_continue", "median_s", "convs", "delays")
    lines = [
        f"priority table v{table['version']}: {len(states)} states from"
        f" {table['window_conversations']} conversations"
        f" (defaults p={defaults['p_continue']}, median={defaults['median_reuse_s']} s)",
        "  {:<34} {:>4} {:>10} {:>9} {:>7} {:>7}".format(*header),
    ]
    busiest = sorted(states, key=lambda s: (-s["conversations"], s["intent"], s["turn"]))
    for state in busiest[:TABLE_ROWS_SHOWN]:
        lines.append(
            f"  {state['intent']:<34} {state['turn']:>4} {state['p_continue']:>10.3f}"
            f" {state['median_reuse_s']:>9.1f} {state['conversations']:>7}"
            f" {state['delay_samples']:>7}"
        )
    if len(states) > TABLE_ROWS_SHOWN:
        lines.append(f"  ... {len(states) - TABLE_ROWS_SHOWN} more states (--json prints all)")
    return lines


REJECTIONS_SHOWN = 10


def format_events(events: dict[str, Any]) -> list[str]:
    reasons = ", ".join(f"{k} {v}" for k, v in events.get("rejected_by_reason", {}).items())
    lines = [
        f"events: processed {events['processed']}, rejected {events['rejected']}"
        + (f" ({reasons})" if reasons else "")
        + f", duplicates {events['duplicates']}"
    ]
    kept = events.get("rejections", [])
    for rejection in kept[:REJECTIONS_SHOWN]:
        field = f" (field {rejection['field']})" if rejection["field"] else ""
        lines.append(f"  line {rejection['position']}: {rejection['reason']}{field}")
    if events["rejected"] > REJECTIONS_SHOWN and kept:
        lines.append(f"  ... the first {len(kept)} with their lines: --json")
    return lines


def format_replay_report(result: dict[str, Any]) -> str:
    return "\n".join(
        [
            *format_forecast(result["forecast"]),
            "",
            *format_table(result["table"]),
            "",
            *format_events(result["events"]),
        ]
    )
